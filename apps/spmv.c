/* Sparse matrix-vector product y = A x with A the 9-point stencil on an n x n grid (8 on
 * the diagonal, -1 for each of the eight neighbours), rows of the grid split in blocks over
 * the PEs, the halo rows exchanged in the chosen variant (see halo.h) while the rows that
 * need no halo are computed. x changes every iteration; the warm-up products and the last
 * timed one are checked against y computed serially from the whole x. */
#include "halo.h"

/* x of iteration k at grid point (i, j): integers, so y is exact. */
static double xval(long k, long i, long j) { return (double)((i * 7 + j * 3 + k) % 11 - 5); }

int main(int argc, char **argv) {
    shmem_init();
    struct opts o = parse_opts(argc, argv, 256, 200, "grid side n (an n x n grid)");
    int me = shmem_my_pe();
    int n = (int)o.size;
    struct halo h;
    if (halo_init(&h, o.variant, n)) {
        shmem_finalize();
        return 2;
    }
    size_t cells = (size_t)h.rows * n;
    double *x = malloc(cells * sizeof(double)), *y = malloc(cells * sizeof(double));
    long errors = 0;
    double t0 = 0;
    long total = o.warmup + o.iters;
    for (long k = 1; k <= total; k++) {
        if (k == o.warmup + 1) {
            shmem_barrier_all();
            t0 = now_us();
        }
        for (int i = 0; i < h.rows; i++)
            for (int j = 0; j < n; j++) x[(size_t)i * n + j] = xval(k, h.row0 + i, j);
        spmv(&h, 9, x, y);
        if (k > o.warmup && k < total) continue;
        if (k == total) maybe_corrupt(&o, &y[0]);
        /* The serial product, point by point from the global x. */
        for (int i = 0; i < h.rows; i++)
            for (int j = 0; j < n; j++) {
                long gi = h.row0 + i;
                double want = 0;
                for (int di = -1; di <= 1; di++)
                    for (int dj = -1; dj <= 1; dj++) {
                        long a = gi + di, b = j + dj;
                        if (a < 0 || a >= n || b < 0 || b >= n) continue;
                        want += (di == 0 && dj == 0 ? 8.0 : -1.0) * xval(k, a, b);
                    }
                if (y[(size_t)i * n + j] != want) {
                    if (errors < 5)
                        fprintf(stderr, "PE %d: product %ld at (%ld, %d): %g, expected %g\n", me, k,
                                gi, j, y[(size_t)i * n + j], want);
                    errors++;
                }
            }
    }
    double us = max_over_pes((now_us() - t0) / o.iters);
    halo_free(&h);
    free(x);
    free(y);
    return finish("spmv", &o, us, errors, "");
}
