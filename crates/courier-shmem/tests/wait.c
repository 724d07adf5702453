/* Point-to-point synchronization: wait_until and test with their _all/_any/_some and
 * vector forms, status masks, the deprecated shmem_wait; waits that sleep (more PEs than
 * cores still finish: SHMEM_WAIT is left at its default). */
#include "common.h"

static long flags[16];
static int iflag;

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;
    shmem_barrier_all();

    /* Each PE sets flag[me] at its right neighbour after a short delay. */
    shmem_long_p(&flags[me], 1, right);
    shmem_long_wait_until(&flags[left], SHMEM_CMP_EQ, 1);
    CHECK(shmem_long_test(&flags[left], SHMEM_CMP_EQ, 1) == 1, "test after wait");
    CHECK(shmem_long_test(&flags[left], SHMEM_CMP_GT, 1) == 0, "test false");
    shmem_barrier_all();

    /* All PEs write their flag at PE 0, which waits for all, any, some. */
    for (int i = 0; i < 16; i++) flags[i] = 0;
    shmem_barrier_all();
    shmem_long_atomic_set(&flags[me], 5 + me, 0);
    if (me == 0) {
        shmem_long_wait_until_all(flags, n, NULL, SHMEM_CMP_GE, 5);
        for (int pe = 0; pe < n; pe++) CHECK(flags[pe] == 5 + pe, "all: %ld", flags[pe]);
        size_t i = shmem_long_wait_until_any(flags, n, NULL, SHMEM_CMP_EQ, 5 + n - 1);
        CHECK(i == (size_t)n - 1, "any: %zu", i);
        size_t idx[16];
        size_t k = shmem_long_wait_until_some(flags, n, idx, NULL, SHMEM_CMP_GE, 5);
        CHECK(k == (size_t)n, "some: %zu", k);
        long want[16];
        for (int pe = 0; pe < n; pe++) want[pe] = 5 + pe;
        shmem_long_wait_until_all_vector(flags, n, NULL, SHMEM_CMP_EQ, want);
        CHECK(shmem_long_test_all_vector(flags, n, NULL, SHMEM_CMP_EQ, want) == 1, "test_all_vector");
        int status[16] = {0};
        status[0] = 1; /* excluded */
        want[0] = -99;
        CHECK(shmem_long_test_all_vector(flags, n, status, SHMEM_CMP_EQ, want) == 1, "status excludes 0");
        for (int pe = 0; pe < n; pe++) status[pe] = 1;
        CHECK(shmem_long_wait_until_any(flags, n, status, SHMEM_CMP_EQ, 0) == SIZE_MAX, "all excluded: any");
        CHECK(shmem_long_test_some(flags, n, idx, NULL, SHMEM_CMP_LT, 0) == 0, "test_some none");
        CHECK(shmem_long_test_any(flags, n, NULL, SHMEM_CMP_EQ, 5) == 0, "test_any index 0");
    }
    shmem_barrier_all();

    /* Deprecated shmem_int_wait: waits while the value equals the argument. */
    if (me == 0) {
        for (int pe = 1; pe < n; pe++) shmem_int_p(&iflag, 3, pe);
    } else {
        shmem_int_wait(&iflag, 0);
        CHECK(iflag == 3, "shmem_int_wait: %d", iflag);
    }
    shmem_barrier_all();
    return test_end("wait");
}
