/* Halo exchange for an n x n grid split into blocks of whole rows (PE p owns rows
 * [row0, row0 + rows)), in the three variants; used by spmv.c and cg.c.
 *
 * A PE sends its first row to the PE above and its last row to the PE below; they land in
 * receive slots [parity][side] (side 0: the row above ours, side 1: the row below). The
 * parity alternates between exchanges: a neighbour can start exchange c + 2 only after it
 * has our rows of exchange c + 1, which we send after we have finished with exchange c, so
 * no slot is overwritten while it is read.
 *
 *   halo_begin(h, x)   send x's boundary rows
 *   ... compute the rows that need no halo ...
 *   halo_end(h, &above, &below)   wait for the neighbours' rows (NULL at the grid's edge)
 *   ... compute the first and last rows ...
 *
 *   barrier  blocking puts; halo_end is shmem_barrier_all (which completes them);
 *   flag     blocking puts, shmem_quiet, then a flag put to each neighbour; halo_end waits
 *            for both flags;
 *   signal   shmemx_putmem_signal_sem to each neighbour's slot semaphore; halo_end waits on
 *            ours. */
#ifndef APPS_HALO_H
#define APPS_HALO_H

#include "common.h"

struct halo {
    enum variant variant;
    int n;          /* grid side */
    int rows, row0; /* this PE's block */
    int up, down;   /* neighbour PEs, or -1 */
    double *recv;   /* symmetric: [2][2][n] */
    uint64_t *flags; /* symmetric: [2][2] */
    shmemx_sem_t *mine; /* symmetric: ours, [parity][side] */
    shmemx_sem_t *all; /* symmetric: every PE's `mine` */
    long calls;
};

/* The rows of PE p: as even a split of n rows as can be. */
static inline void halo_split(int n, int npes, int p, int *rows, int *row0) {
    int base = n / npes, extra = n % npes;
    *rows = base + (p < extra);
    *row0 = p * base + (p < extra ? p : extra);
}

/* Collective. Returns 0, or -1 (with a message) when some PE would own no row. */
static inline int halo_init(struct halo *h, enum variant v, int n) {
    int me = shmem_my_pe(), npes = shmem_n_pes();
    if (n < npes) {
        if (me == 0) fprintf(stderr, "halo: a %d x %d grid cannot be split over %d PEs\n", n, n, npes);
        return -1;
    }
    memset(h, 0, sizeof *h);
    h->variant = v;
    h->n = n;
    halo_split(n, npes, me, &h->rows, &h->row0);
    h->up = me > 0 ? me - 1 : -1;
    h->down = me < npes - 1 ? me + 1 : -1;
    h->recv = sym_alloc(4 * (size_t)n * sizeof(double));
    h->flags = sym_alloc(4 * sizeof(uint64_t));
    h->mine = sym_alloc(4 * sizeof(shmemx_sem_t));
    h->all = sym_alloc((size_t)npes * 4 * sizeof(shmemx_sem_t));
    if (v == V_SIGNAL) {
        for (int i = 0; i < 4; i++)
            h->mine[i] = sem_alloc_or_die(SHMEMX_SEM_BOOLEAN | SHMEMX_SEM_SPRODUCER | SHMEMX_SEM_SCONSUMER);
        shmem_barrier_all();
        shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)h->all, (uint64_t *)h->mine, 4);
    }
    shmem_barrier_all();
    return 0;
}

static double *halo_slot(struct halo *h, int par, int side) {
    return h->recv + ((size_t)par * 2 + side) * h->n;
}

/* Send x's first row up and its last row down (x: rows x n, this PE's block). */
static inline void halo_begin(struct halo *h, const double *x) {
    long c = ++h->calls;
    int par = (int)(c % 2), n = h->n;
    const double *first = x, *last = x + (size_t)(h->rows - 1) * n;
    /* Our first row is the upper neighbour's "below" (side 1); our last, the lower one's
     * "above" (side 0). */
    switch (h->variant) {
    case V_BARRIER:
    case V_FLAG:
        if (h->up >= 0) shmem_putmem(halo_slot(h, par, 1), first, n * sizeof(double), h->up);
        if (h->down >= 0) shmem_putmem(halo_slot(h, par, 0), last, n * sizeof(double), h->down);
        if (h->variant == V_FLAG) {
            shmem_quiet();
            if (h->up >= 0) shmem_uint64_p(&h->flags[par * 2 + 1], (uint64_t)c, h->up);
            if (h->down >= 0) shmem_uint64_p(&h->flags[par * 2 + 0], (uint64_t)c, h->down);
        }
        break;
    case V_SIGNAL:
        if (h->up >= 0)
            shmemx_putmem_signal_sem(halo_slot(h, par, 1), first, n * sizeof(double),
                                     h->all[(size_t)h->up * 4 + par * 2 + 1], 1);
        if (h->down >= 0)
            shmemx_putmem_signal_sem(halo_slot(h, par, 0), last, n * sizeof(double),
                                     h->all[(size_t)h->down * 4 + par * 2 + 0], 1);
        break;
    }
}

/* Wait for the neighbours' rows of this exchange. */
static inline void halo_end(struct halo *h, const double **above, const double **below) {
    long c = h->calls;
    int par = (int)(c % 2);
    switch (h->variant) {
    case V_BARRIER:
        shmem_barrier_all();
        break;
    case V_FLAG:
        if (h->up >= 0) shmem_uint64_wait_until(&h->flags[par * 2 + 0], SHMEM_CMP_GE, (uint64_t)c);
        if (h->down >= 0) shmem_uint64_wait_until(&h->flags[par * 2 + 1], SHMEM_CMP_GE, (uint64_t)c);
        break;
    case V_SIGNAL:
        if (h->up >= 0) shmemx_sem_wait(h->mine[par * 2 + 0], 1);
        if (h->down >= 0) shmemx_sem_wait(h->mine[par * 2 + 1], 1);
        break;
    }
    *above = h->up >= 0 ? halo_slot(h, par, 0) : NULL;
    *below = h->down >= 0 ? halo_slot(h, par, 1) : NULL;
}

/* Collective: release what halo_init took. */
static inline void halo_free(struct halo *h) {
    shmem_barrier_all();
    if (h->variant == V_SIGNAL)
        for (int i = 0; i < 4; i++) shmemx_sem_free(h->mine[i]);
    shmem_free(h->all);
    shmem_free(h->mine);
    shmem_free(h->flags);
    shmem_free(h->recv);
}

/* y = A x on rows [from, to) of this PE's block, for a stencil on the grid: `points` is 5
 * (4 on the diagonal, -1 for the four neighbours: the 2-D Poisson matrix) or 9 (8 and -1
 * for the eight around). Points outside the grid count as 0. above/below: the halo rows
 * (NULL at the grid's edge). */
static inline void stencil_rows(int points, int n, int rows, const double *x, const double *above,
                         const double *below, double *y, int from, int to) {
    double diag = points == 9 ? 8.0 : 4.0;
    for (int i = from; i < to; i++) {
        const double *u = i > 0 ? x + (size_t)(i - 1) * n : above;
        const double *m = x + (size_t)i * n;
        const double *d = i < rows - 1 ? x + (size_t)(i + 1) * n : below;
        double *out = y + (size_t)i * n;
        for (int j = 0; j < n; j++) {
            double s = diag * m[j];
            if (j > 0) s -= m[j - 1];
            if (j < n - 1) s -= m[j + 1];
            if (u) s -= u[j];
            if (d) s -= d[j];
            if (points == 9) {
                if (u && j > 0) s -= u[j - 1];
                if (u && j < n - 1) s -= u[j + 1];
                if (d && j > 0) s -= d[j - 1];
                if (d && j < n - 1) s -= d[j + 1];
            }
            out[j] = s;
        }
    }
}

/* One distributed y = A x: the exchange around the rows that need no halo. */
static inline void spmv(struct halo *h, int points, const double *x, double *y) {
    const double *above, *below;
    halo_begin(h, x);
    if (h->rows > 2) stencil_rows(points, h->n, h->rows, x, NULL, NULL, y, 1, h->rows - 1);
    halo_end(h, &above, &below);
    stencil_rows(points, h->n, h->rows, x, above, below, y, 0, 1);
    if (h->rows > 1) stencil_rows(points, h->n, h->rows, x, above, below, y, h->rows - 1, h->rows);
}

#endif
