/* Atomics: every operation on 32- and 64-bit, signed, unsigned and real types, on the heap
 * and on globals; contended from every PE; fetching _nbi forms; the deprecated names. */
#include "common.h"

static long g_counter;
static int g_int;
static uint32_t g_bits32;
static uint64_t g_bits64;
static double g_dbl;

#define ITERS 2000

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    long *h_counter = shmem_calloc(1, sizeof(long));
    int *h_int = shmem_calloc(1, sizeof(int));
    g_counter = 0;
    g_int = 0;
    shmem_barrier_all();

    /* Contended: every PE adds ITERS times into PE 0's words, heap and global. */
    long seen_max = -1;
    for (int i = 0; i < ITERS; i++) {
        long old = shmem_long_atomic_fetch_add(h_counter, 1, 0);
        CHECK(old >= 0 && old < (long)ITERS * n, "fetch_add old %ld", old);
        if (old > seen_max) seen_max = old;
        shmem_long_atomic_inc(&g_counter, 0);
        shmem_int_atomic_add(&g_int, 2, 0);
        shmem_int_atomic_fetch_inc(h_int, 0);
    }
    shmem_barrier_all();
    if (me == 0) {
        CHECK(*h_counter == (long)ITERS * n, "heap counter %ld", *h_counter);
        CHECK(g_counter == (long)ITERS * n, "global counter %ld", g_counter);
        CHECK(g_int == 2 * ITERS * n, "global int %d", g_int);
        CHECK(*h_int == ITERS * n, "heap int %d", *h_int);
    }
    CHECK(shmem_long_atomic_fetch(&g_counter, 0) == (long)ITERS * n, "fetch");
    shmem_barrier_all();

    /* compare_swap: exactly one PE wins each round. */
    static int winners;
    for (int round = 0; round < 5; round++) {
        shmem_barrier_all();
        int prev = shmem_int_atomic_compare_swap(&g_int, 2 * ITERS * n + round, 2 * ITERS * n + round + 1, 0);
        if (prev == 2 * ITERS * n + round) shmem_int_atomic_inc(&winners, 0);
        shmem_barrier_all();
    }
    if (me == 0) CHECK(winners == 5, "cswap winners %d", winners);

    /* swap and set and fetch on reals; bitwise on unsigned. */
    shmem_barrier_all();
    if (me == 0) { g_dbl = 0; g_bits32 = 0; g_bits64 = 0; }
    shmem_barrier_all();
    shmem_uint32_atomic_or(&g_bits32, 1u << me, 0);
    shmem_uint64_atomic_fetch_xor(&g_bits64, (uint64_t)1 << (me + 32), 0);
    shmem_barrier_all();
    uint32_t all = n >= 32 ? 0xffffffffu : ((1u << n) - 1);
    CHECK(shmem_uint32_atomic_fetch(&g_bits32, 0) == all, "or: %x", g_bits32);
    CHECK(shmem_uint64_atomic_fetch(&g_bits64, 0) == (uint64_t)all << 32, "xor");
    shmem_barrier_all();
    uint32_t before = shmem_uint32_atomic_fetch_and(&g_bits32, ~(1u << me), 0);
    CHECK((before & (1u << me)) != 0, "fetch_and saw my bit");
    shmem_barrier_all();
    CHECK(shmem_uint32_atomic_fetch(&g_bits32, 0) == 0, "and cleared");
    if (me == n - 1) shmem_double_atomic_set(&g_dbl, 2.5, 0);
    shmem_barrier_all();
    CHECK(shmem_double_atomic_fetch(&g_dbl, 0) == 2.5, "double set/fetch");
    shmem_barrier_all();
    double was = shmem_double_atomic_swap(&g_dbl, (double)me, 0);
    CHECK(was == 2.5 || (was >= 0 && was < n), "double swap old %f", was);
    shmem_barrier_all();

    /* Fetching _nbi: results land by quiet. */
    static long nbi_target;
    long fetched[4] = {-1, -1, -1, -1};
    shmem_barrier_all();
    shmem_long_atomic_fetch_add_nbi(&fetched[0], &nbi_target, 10, (me + 1) % n);
    shmem_long_atomic_fetch_inc_nbi(&fetched[1], &nbi_target, (me + 1) % n);
    shmem_quiet();
    shmem_barrier_all();
    CHECK(nbi_target == 11, "nbi target %ld", nbi_target);
    CHECK(fetched[0] >= 0 && fetched[1] >= 10, "nbi fetched %ld %ld", fetched[0], fetched[1]);
    shmem_long_atomic_fetch_nbi(&fetched[2], &nbi_target, (me + 1) % n);
    shmem_long_atomic_swap_nbi(&fetched[3], &nbi_target, 7, me);
    shmem_quiet();
    shmem_barrier_all();
    CHECK(fetched[2] == 11 || fetched[2] == 7, "fetch_nbi %ld", fetched[2]);
    CHECK(fetched[3] == 11, "swap_nbi %ld", fetched[3]);

    /* Deprecated names still work. */
    static long dep;
    shmem_barrier_all();
    long o = shmem_long_fadd(&dep, 3, 0);
    shmem_long_finc(&dep, 0);
    shmem_long_add(&dep, 1, 0);
    shmem_long_inc(&dep, 0);
    CHECK(o >= 0, "fadd");
    shmem_barrier_all();
    if (me == 0) CHECK(dep == 6L * n, "deprecated ops: %ld", dep);
    CHECK(shmem_long_fetch(&dep, 0) == 6L * n, "deprecated fetch");
    shmem_barrier_all();
    CHECK(shmem_long_cswap(&dep, -1, 0, 0) == 6L * n, "deprecated cswap returns old");
    shmem_free(h_counter);
    shmem_free(h_int);
    return test_end("amo");
}
