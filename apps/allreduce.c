/* Dissemination all-reduce (see allreduce.h): every PE contributes SIZE doubles, ITERS
 * times. The results of the warm-up calls and of the last timed call are checked against
 * the sums computed serially from every PE's input (integer-valued doubles, so the sums
 * are exact in any order); the timed calls in between are not, to time the reduction
 * alone. */
#include "allreduce.h"

/* PE p's element i in call k: an integer, small enough that every sum is exact. */
static double input(int p, long k, size_t i) { return (double)((p * 131 + k * 17 + (long)i * 3) % 1021); }

int main(int argc, char **argv) {
    shmem_init();
    struct opts o = parse_opts(argc, argv, 1, 1000, "doubles per PE");
    int me = shmem_my_pe(), npes = shmem_n_pes();
    size_t n = (size_t)o.size;
    struct allreduce a;
    if (allreduce_init(&a, o.variant, n)) {
        shmem_finalize();
        return 2;
    }
    double *in = malloc(n * sizeof(double)), *out = malloc(n * sizeof(double));
    long errors = 0;
    double t0 = 0;
    long total = o.warmup + o.iters;
    for (long k = 1; k <= total; k++) {
        if (k == o.warmup + 1) {
            shmem_barrier_all();
            t0 = now_us();
        }
        for (size_t i = 0; i < n; i++) in[i] = input(me, k, i);
        allreduce_sum(&a, in, out, n);
        if (k > o.warmup && k < total) continue;
        if (k == total) maybe_corrupt(&o, &out[0]);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int p = 0; p < npes; p++) want += input(p, k, i);
            if (out[i] != want) {
                if (errors < 5)
                    fprintf(stderr, "PE %d: call %ld element %zu: %g, expected %g\n", me, k, i, out[i], want);
                errors++;
            }
        }
    }
    double us = max_over_pes((now_us() - t0) / o.iters);
    allreduce_free(&a);
    free(in);
    free(out);
    return finish("allreduce", &o, us, errors, "");
}
