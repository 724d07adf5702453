/* Contended fetch-add, the NIC-memory seed's benchmark: PE 0 allocates one int counter in
 * the symmetric heap, the global data segment, or with the NIC-memory hint; every other PE
 * fetch-adds 1 to it ITERS times; the sum, minimum and maximum rates of those PEs are
 * gathered with reductions, and the final counter is checked: (npes - 1) * ITERS. Beside
 * the seed's sum of per-PE rates, the aggregate rate: all fetch-adds over the time from the
 * first fetching PE's start to the last one's end (CLOCK_MONOTONIC, one host). When PEs
 * outnumber CPUs the sum adds rates measured over different time slices and is not a
 * throughput; the aggregate stays one.
 *
 * Plain OpenSHMEM 1.4 (the active-set reductions, shmemx_malloc_with_hint), so that the
 * same source builds against Courier and against Open MPI's OSHMEM:
 *   fadd -m heap|global|nic [-i ITERS]
 * Output (PE 0): FADD mem=M npes=N iters=I total_mops=S min_mops=A max_mops=B agg_mops=G
 *                check=ok */
#include <float.h>
#include <shmem.h>
#include <shmemx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int global_counter;
static long psync[SHMEM_REDUCE_SYNC_SIZE];
static double pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
static double rate, sum_rate, min_rate, max_rate;
static double t_start, t_end, first_start, last_end;
static int final_value;

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void reduce(double *dst, double *src, int op) {
    int npes = shmem_n_pes();
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) psync[i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();
    if (op == 0) shmem_double_sum_to_all(dst, src, 1, 0, 0, npes, pwrk, psync);
    else if (op == 1) shmem_double_max_to_all(dst, src, 1, 0, 0, npes, pwrk, psync);
    else shmem_double_min_to_all(dst, src, 1, 0, 0, npes, pwrk, psync);
    shmem_barrier_all();
}

int main(int argc, char **argv) {
    const char *mem = "heap";
    long iters = 100000;
    int c;
    while ((c = getopt(argc, argv, "m:i:")) != -1) {
        if (c == 'm') mem = optarg;
        else if (c == 'i') iters = atol(optarg);
        else {
            fprintf(stderr, "usage: %s [-m heap|global|nic] [-i ITERS]\n", argv[0]);
            return 2;
        }
    }
    shmem_init();
    int me = shmem_my_pe(), npes = shmem_n_pes();
    int *counter;
    if (strcmp(mem, "heap") == 0) counter = shmem_malloc(sizeof(int));
    else if (strcmp(mem, "global") == 0) counter = &global_counter;
    else if (strcmp(mem, "nic") == 0) counter = shmemx_malloc_with_hint(sizeof(int), SHMEM_HINT_DEVICE_NIC_MEM);
    else {
        if (me == 0) fprintf(stderr, "fadd: -m heap|global|nic\n");
        shmem_finalize();
        return 2;
    }
    if (!counter) {
        if (me == 0) fprintf(stderr, "fadd: allocating the counter failed\n");
        shmem_finalize();
        return 1;
    }
    shmem_int_atomic_set(counter, 0, 0);
    shmem_barrier_all();
    rate = 0;
    if (me != 0) {
        t_start = wall();
        for (long i = 0; i < iters; i++) (void)shmem_int_atomic_fetch_add(counter, 1, 0);
        t_end = wall();
        rate = iters / (t_end - t_start);
    } else {
        t_start = DBL_MAX; /* the root fetches nothing: out of the first start and last end */
        t_end = -DBL_MAX;
    }
    shmem_barrier_all();
    reduce(&sum_rate, &rate, 0);
    reduce(&max_rate, &rate, 1);
    if (me == 0) rate = DBL_MAX; /* the root does not count in the minimum */
    reduce(&min_rate, &rate, 2);
    reduce(&first_start, &t_start, 2);
    reduce(&last_end, &t_end, 1);
    double agg = npes > 1 ? (double)(npes - 1) * iters / (last_end - first_start) : 0;
    if (me == 0) final_value = shmem_int_atomic_fetch(counter, 0);
    shmem_barrier_all();
    final_value = shmem_int_g(&final_value, 0);
    long want = (long)(npes - 1) * iters;
    int ok = final_value == want;
    if (me == 0) {
        printf("FADD mem=%s npes=%d iters=%ld total_mops=%.4f min_mops=%.4f max_mops=%.4f agg_mops=%.4f "
               "check=%s\n",
               mem, npes, iters, sum_rate / 1e6, npes > 1 ? min_rate / 1e6 : 0, max_rate / 1e6, agg / 1e6,
               ok ? "ok" : "FAILED");
        if (!ok) fprintf(stderr, "fadd: the counter is %d, expected %ld\n", final_value, want);
    }
    shmem_barrier_all();
    if (strcmp(mem, "global") != 0) shmem_free(counter);
    shmem_finalize();
    return ok ? 0 : 1;
}
