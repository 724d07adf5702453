/* Dissemination all-reduce (sum of doubles) over all PEs, in the three variants; used by
 * allreduce.c and cg.c. The number of PEs must be a power of two (dissemination adds each
 * contribution exactly once only then).
 *
 * Round r (r = 0 .. log2(N) - 1): send the partial sum to PE me + 2^r, receive the partial
 * of PE me - 2^r into slot [parity][r], add it. Two parities alternate between calls; a PE
 * cannot start call c + 2 before every PE has entered call c + 1 (it needs everyone's
 * contribution to c + 1), so no slot is overwritten while it is read. Nobody acknowledges
 * anything: the algorithm itself gives the flow control.
 *
 *   barrier  put the partial, shmem_barrier_all, add (a barrier per round);
 *   flag     put the partial, shmem_quiet, put the flag [parity][r] = call number, wait
 *            for our own flag to reach it;
 *   signal   shmemx_putmem_signal_sem into the partner's semaphore [parity][r], wait on
 *            ours. */
#ifndef APPS_ALLREDUCE_H
#define APPS_ALLREDUCE_H

#include "common.h"

#define AR_MAXROUNDS 24

struct allreduce {
    enum variant variant;
    int rounds;
    size_t max_n;   /* the longest vector */
    double *slots;  /* symmetric: [2][rounds][max_n] */
    double *part;   /* the running partial sum (private) */
    uint64_t *flags; /* symmetric: [2][rounds] */
    shmemx_sem_t *mine; /* symmetric: ours, [2][rounds] (AR_MAXROUNDS each) */
    shmemx_sem_t *all; /* symmetric: every PE's `mine` */
    long calls;
};

/* Collective: set up for vectors of up to max_n doubles. Returns 0, or -1 (with a message)
 * when the number of PEs is not a power of two. */
static inline int allreduce_init(struct allreduce *a, enum variant v, size_t max_n) {
    int npes = shmem_n_pes();
    if (npes & (npes - 1)) {
        if (shmem_my_pe() == 0)
            fprintf(stderr, "dissemination all-reduce: %d PEs is not a power of two\n", npes);
        return -1;
    }
    memset(a, 0, sizeof *a);
    a->variant = v;
    while ((1 << a->rounds) < npes) a->rounds++;
    a->max_n = max_n;
    int r2 = a->rounds ? a->rounds : 1;
    a->slots = sym_alloc(2 * (size_t)r2 * max_n * sizeof(double));
    a->flags = sym_alloc(2 * (size_t)r2 * sizeof(uint64_t));
    a->part = malloc(max_n * sizeof(double));
    a->mine = sym_alloc(2 * AR_MAXROUNDS * sizeof(shmemx_sem_t));
    a->all = sym_alloc((size_t)npes * 2 * AR_MAXROUNDS * sizeof(shmemx_sem_t));
    if (v == V_SIGNAL) {
        for (int i = 0; i < 2 * a->rounds; i++)
            a->mine[i] = sem_alloc_or_die(SHMEMX_SEM_BOOLEAN | SHMEMX_SEM_SPRODUCER | SHMEMX_SEM_SCONSUMER);
        shmem_barrier_all();
        shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)a->all, (uint64_t *)a->mine, 2 * AR_MAXROUNDS);
    }
    shmem_barrier_all();
    return 0;
}

/* Collective: out[i] = the sum over PEs of in[i], i < n (n <= max_n; in and out may be the
 * same private buffer). */
static inline void allreduce_sum(struct allreduce *a, const double *in, double *out, size_t n) {
    int me = shmem_my_pe(), npes = shmem_n_pes();
    long c = ++a->calls;
    int par = (int)(c % 2);
    double *part = a->part;
    memcpy(part, in, n * sizeof(double));
    for (int r = 0; r < a->rounds; r++) {
        int to = (me + (1 << r)) % npes;
        size_t slot = ((size_t)par * a->rounds + r);
        double *dst = a->slots + slot * a->max_n;
        switch (a->variant) {
        case V_BARRIER:
            shmem_putmem(dst, part, n * sizeof(double), to);
            shmem_barrier_all();
            break;
        case V_FLAG:
            shmem_putmem(dst, part, n * sizeof(double), to);
            shmem_quiet();
            shmem_uint64_p(&a->flags[slot], (uint64_t)c, to);
            shmem_uint64_wait_until(&a->flags[slot], SHMEM_CMP_GE, (uint64_t)c);
            break;
        case V_SIGNAL:
            shmemx_putmem_signal_sem(dst, part, n * sizeof(double),
                                     a->all[(size_t)to * 2 * AR_MAXROUNDS + slot], 1);
            shmemx_sem_wait(a->mine[slot], 1);
            break;
        }
        for (size_t i = 0; i < n; i++) part[i] += dst[i];
    }
    memcpy(out, part, n * sizeof(double));
}

/* Collective: release what allreduce_init took. */
static inline void allreduce_free(struct allreduce *a) {
    shmem_barrier_all();
    if (a->variant == V_SIGNAL)
        for (int i = 0; i < 2 * a->rounds; i++) shmemx_sem_free(a->mine[i]);
    shmem_free(a->all);
    shmem_free(a->mine);
    shmem_free(a->flags);
    shmem_free(a->slots);
    free(a->part);
}

#endif
