/* OpenSHMEM micro-benchmarks, built unchanged against Courier and against Open MPI's OSHMEM
 * (OpenSHMEM 1.4: no teams, no signals there, so collectives use the active-set forms and
 * put-with-signal is measured only where SHMEM_SIGNAL_SET exists).
 *
 *   shmem_bench TEST [SIZE]
 * TEST: put_lat get_lat put_bw put_nbi_bw get_bw get_nbi_bw fadd_lat add_rate inc_rate
 *       swap_lat cswap_lat fadd_heap fadd_global sig_lat putflag_lat barrier bcast reduce
 *       alltoall
 * Prints one line on PE 0: "TEST SIZE VALUE UNIT" (us for latency, MB/s for bandwidth,
 * Mops/s for rates). Point-to-point tests run between PE 0 and PE 1 while the others wait
 * in a barrier; fadd_heap and fadd_global are contended (every PE but 0 fetch-adds PE 0's
 * counter, as the NIC-memory seed's benchmark does); collectives involve every PE. */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long pSync[SHMEM_REDUCE_SYNC_SIZE];
static long pSync2[SHMEM_REDUCE_SYNC_SIZE];
static long pWrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE + (1 << 17)];
static int g_counter;
static long flag;
static long lsrc[1 << 17], ldst[1 << 17];
static double rate, rsum;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int iters_for(size_t size, int base) {
    int it = base;
    if (size >= 65536) it = base / 10;
    if (size >= 1048576) it = base / 50;
    return it < 20 ? 20 : it;
}

int main(int argc, char **argv) {
    const char *test = argc > 1 ? argv[1] : "put_lat";
    size_t size = argc > 2 ? strtoul(argv[2], NULL, 0) : 8;
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) pSync[i] = pSync2[i] = SHMEM_SYNC_VALUE;
    size_t cap = size < 8 ? 8 : size;
    char *buf = shmem_malloc(cap * 64);
    char *src = malloc(cap * 64);
    memset(src, 1, cap * 64);
    int *h_counter = shmem_malloc(sizeof(int));
    uint64_t *sig = shmem_malloc(sizeof(uint64_t));
    *h_counter = 0;
    *sig = 0;
    shmem_barrier_all();
    double value = 0;
    const char *unit = "us";
    int iters = iters_for(size, 20000);
    int warm = iters / 10;
    double t0 = 0;

    if (!strcmp(test, "put_lat") || !strcmp(test, "get_lat")) {
        int put = test[0] == 'p';
        if (me == 0) {
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = now();
                if (put) { shmem_putmem(buf, src, size, 1); shmem_quiet(); }
                else shmem_getmem(src, buf, size, 1);
            }
            value = (now() - t0) * 1e6 / iters;
        }
    } else if (!strcmp(test, "put_bw") || !strcmp(test, "put_nbi_bw") || !strcmp(test, "get_bw") || !strcmp(test, "get_nbi_bw")) {
        int put = test[0] == 'p', nbi = strstr(test, "nbi") != NULL;
        int window = 64;
        iters = iters_for(size, 2000);
        unit = "MB/s";
        if (me == 0) {
            for (int i = 0; i < iters + 2; i++) {
                if (i == 2) t0 = now();
                for (int w = 0; w < window; w++) {
                    char *r = buf + (size_t)w * cap, *l = src + (size_t)w * cap;
                    if (put) { if (nbi) shmem_putmem_nbi(r, l, size, 1); else shmem_putmem(r, l, size, 1); }
                    else { if (nbi) shmem_getmem_nbi(l, r, size, 1); else shmem_getmem(l, r, size, 1); }
                }
                shmem_quiet();
            }
            value = (double)size * window * iters / (now() - t0) / 1e6;
        }
    } else if (!strcmp(test, "fadd_lat") || !strcmp(test, "swap_lat") || !strcmp(test, "cswap_lat")) {
        if (me == 0) {
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = now();
                if (test[0] == 'f') shmem_int_atomic_fetch_add(h_counter, 1, 1);
                else if (test[0] == 's') shmem_int_atomic_swap(h_counter, i, 1);
                else shmem_int_atomic_compare_swap(h_counter, i, i + 1, 1);
            }
            value = (now() - t0) * 1e6 / iters;
        }
    } else if (!strcmp(test, "add_rate") || !strcmp(test, "inc_rate")) {
        unit = "Mops/s";
        iters *= 5;
        if (me == 0) {
            t0 = now();
            for (int i = 0; i < iters; i++) {
                if (test[0] == 'a') shmem_int_atomic_add(h_counter, 1, 1);
                else shmem_int_atomic_inc(h_counter, 1);
            }
            shmem_quiet();
            value = iters / (now() - t0) / 1e6;
        }
    } else if (!strcmp(test, "fadd_heap") || !strcmp(test, "fadd_global")) {
        int *target = test[5] == 'h' ? h_counter : &g_counter;
        unit = "Mops/s";
        rate = 0;
        shmem_barrier_all();
        if (me != 0 || n == 1) {
            t0 = now();
            for (int i = 0; i < iters; i++) shmem_int_atomic_fetch_add(target, 1, 0);
            rate = iters / (now() - t0);
        }
        shmem_barrier_all();
        shmem_double_sum_to_all(&rsum, &rate, 1, 0, 0, n, (double *)pWrk, pSync);
        value = rsum / 1e6;
        if (me == 0 && *target != iters * (n == 1 ? 1 : n - 1)) {
            fprintf(stderr, "%s: counter %d, expected %d\n", test, *target, iters * (n == 1 ? 1 : n - 1));
            value = -1;
        }
    } else if (!strcmp(test, "sig_lat") || !strcmp(test, "putflag_lat")) {
        /* One-way latency of data + notification: a ping-pong, halved. */
        int sigput = test[0] == 's';
#if !defined(SHMEM_SIGNAL_SET)
        if (sigput) { if (me == 0) printf("%s %zu n/a us\n", test, size); shmem_finalize(); return 0; }
#endif
        iters = iters_for(size, 10000);
        warm = iters / 10;
        if (me < 2 && n >= 2) {
            int peer = 1 - me;
            for (int i = 1; i <= iters + warm; i++) {
                if (i == warm + 1) t0 = now();
                if (me == 0) {
#if defined(SHMEM_SIGNAL_SET)
                    if (sigput) { shmem_putmem_signal(buf, src, size, sig, i, SHMEM_SIGNAL_SET, peer); shmem_signal_wait_until(sig, SHMEM_CMP_EQ, i); } else
#endif
                    { shmem_putmem(buf, src, size, peer); shmem_fence(); shmem_long_atomic_set(&flag, i, peer); shmem_long_wait_until(&flag, SHMEM_CMP_EQ, i); }
                } else {
#if defined(SHMEM_SIGNAL_SET)
                    if (sigput) { shmem_signal_wait_until(sig, SHMEM_CMP_EQ, i); shmem_putmem_signal(buf, src, size, sig, i, SHMEM_SIGNAL_SET, peer); } else
#endif
                    { shmem_long_wait_until(&flag, SHMEM_CMP_EQ, i); shmem_putmem(buf, src, size, peer); shmem_fence(); shmem_long_atomic_set(&flag, i, peer); }
                }
            }
            value = (now() - t0) * 1e6 / iters / 2;
        }
    } else if (!strcmp(test, "barrier")) {
        iters = 20000;
        for (int i = 0; i < iters + 100; i++) {
            if (i == 100) t0 = now();
            shmem_barrier_all();
        }
        value = (now() - t0) * 1e6 / iters;
    } else if (!strcmp(test, "bcast") || !strcmp(test, "reduce") || !strcmp(test, "alltoall")) {
        size_t nelem = size / 8 ? size / 8 : 1;
        if (nelem * (size_t)n > (1 << 17)) nelem = (1 << 17) / n;
        iters = iters_for(size, 20000);
        for (int i = 0; i < iters + 10; i++) {
            if (i == 10) t0 = now();
            long *ps = (i % 2) ? pSync : pSync2;
            if (test[0] == 'b') shmem_broadcast64(ldst, lsrc, nelem, 0, 0, 0, n, ps);
            else if (test[0] == 'r') shmem_long_sum_to_all(ldst, lsrc, nelem, 0, 0, n, pWrk, ps);
            else shmem_alltoall64(ldst, lsrc, nelem / n ? nelem / n : 1, 0, 0, n, ps);
            shmem_barrier_all();
        }
        value = (now() - t0) * 1e6 / iters;
    } else {
        if (me == 0) fprintf(stderr, "unknown test %s\n", test);
        shmem_finalize();
        return 2;
    }
    shmem_barrier_all();
    if (me == 0) { printf("%s %zu %.4f %s\n", test, size, value, unit); fflush(stdout); }
    shmem_finalize();
    return 0;
}
