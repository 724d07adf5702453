/* Conjugate gradient on the 2-D Poisson matrix (the 5-point stencil: 4 on the diagonal, -1
 * for the four neighbours) of an n x n grid, right-hand side all ones, x0 = 0, ITERS
 * iterations. Each iteration is one distributed product (halo.h: the halo exchange in the
 * chosen variant) and two all-reduces of one double (allreduce.h, same variant). The
 * number of PEs must be a power of two (the all-reduce's).
 *
 * The check: PE 0 runs the same iterations serially on the whole grid; every PE compares
 * its block of x with the serial x (they differ only by the order of the sums in the dot
 * products: 1e-9 of the largest entry is allowed), and PE 0 the residual norms. */
#include <math.h>

#include "allreduce.h"
#include "halo.h"

static double dot_local(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ITERS iterations of CG on this PE's block; returns ||r|| at the end. x: the block. */
static double cg(struct halo *h, struct allreduce *a, int iters, double *x) {
    size_t cells = (size_t)h->rows * h->n;
    double *r = malloc(cells * sizeof(double)), *p = malloc(cells * sizeof(double));
    double *q = malloc(cells * sizeof(double));
    for (size_t i = 0; i < cells; i++) {
        x[i] = 0;
        r[i] = 1; /* b - A x0 = b */
        p[i] = 1;
    }
    double rr = dot_local(r, r, cells), d;
    allreduce_sum(a, &rr, &rr, 1);
    for (int it = 0; it < iters && rr > 0; it++) {
        spmv(h, 5, p, q);
        d = dot_local(p, q, cells);
        allreduce_sum(a, &d, &d, 1);
        double alpha = rr / d;
        for (size_t i = 0; i < cells; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * q[i];
        }
        double rr_new = dot_local(r, r, cells);
        allreduce_sum(a, &rr_new, &rr_new, 1);
        double beta = rr_new / rr;
        rr = rr_new;
        for (size_t i = 0; i < cells; i++) p[i] = r[i] + beta * p[i];
    }
    free(r);
    free(p);
    free(q);
    return sqrt(rr);
}

/* The same on one process: the whole grid. */
static double cg_serial(int n, int iters, double *x) {
    size_t cells = (size_t)n * n;
    double *r = malloc(cells * sizeof(double)), *p = malloc(cells * sizeof(double));
    double *q = malloc(cells * sizeof(double));
    for (size_t i = 0; i < cells; i++) {
        x[i] = 0;
        r[i] = 1;
        p[i] = 1;
    }
    double rr = dot_local(r, r, cells);
    for (int it = 0; it < iters && rr > 0; it++) {
        stencil_rows(5, n, n, p, NULL, NULL, q, 0, n);
        double alpha = rr / dot_local(p, q, cells);
        for (size_t i = 0; i < cells; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * q[i];
        }
        double rr_new = dot_local(r, r, cells);
        double beta = rr_new / rr;
        rr = rr_new;
        for (size_t i = 0; i < cells; i++) p[i] = r[i] + beta * p[i];
    }
    free(r);
    free(p);
    free(q);
    return sqrt(rr);
}

int main(int argc, char **argv) {
    shmem_init();
    struct opts o = parse_opts(argc, argv, 128, 50, "grid side n (an n x n grid)");
    int me = shmem_my_pe(), npes = shmem_n_pes();
    int n = (int)o.size;
    struct halo h;
    struct allreduce a;
    if (halo_init(&h, o.variant, n) || allreduce_init(&a, o.variant, 1)) {
        shmem_finalize();
        return 2;
    }
    double *x = malloc((size_t)h.rows * n * sizeof(double));
    /* Warm-up: a short solve. */
    cg(&h, &a, o.warmup, x);
    shmem_barrier_all();
    double t0 = now_us();
    double res = cg(&h, &a, o.iters, x);
    double us = max_over_pes((now_us() - t0) / o.iters);
    maybe_corrupt(&o, &x[0]);

    /* The check: the serial solution, in the symmetric heap of PE 0, read by everyone. */
    double *serial = sym_alloc((size_t)n * n * sizeof(double));
    static double serial_res, xmax;
    if (me == 0) {
        serial_res = cg_serial(n, o.iters, serial);
        xmax = 0;
        for (size_t i = 0; i < (size_t)n * n; i++) xmax = fmax(xmax, fabs(serial[i]));
    }
    shmem_barrier_all();
    double *want = malloc((size_t)h.rows * n * sizeof(double));
    shmem_getmem(want, serial + (size_t)h.row0 * n, (size_t)h.rows * n * sizeof(double), 0);
    double wmax = shmem_double_g(&xmax, 0), wres = shmem_double_g(&serial_res, 0);
    long errors = 0;
    for (size_t i = 0; i < (size_t)h.rows * n; i++)
        if (!(fabs(x[i] - want[i]) <= 1e-9 * wmax)) {
            if (errors < 5)
                fprintf(stderr, "PE %d: x[%zu] (row %zu) = %.17g, serial %.17g\n", me, i,
                        h.row0 + i / n, x[i], want[i]);
            errors++;
        }
    if (me == 0 && !(fabs(res - wres) <= 1e-6 * wres + 1e-12)) {
        fprintf(stderr, "residual %.17g, serial %.17g\n", res, wres);
        errors++;
    }
    char extra[64];
    snprintf(extra, sizeof extra, "residual=%.3e", res);
    shmem_barrier_all();
    shmem_free(serial);
    halo_free(&h);
    allreduce_free(&a);
    free(want);
    free(x);
    (void)npes;
    return finish("cg", &o, us, errors, extra);
}
