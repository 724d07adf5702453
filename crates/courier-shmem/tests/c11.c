/* The C11 type-generic interfaces, with and without a context. */
#include "common.h"

static int gi;
static long gl[4];
static double gd;
static unsigned long gu;

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes(), right = (me + 1) % n;
    long src[4] = {me, me + 1, me + 2, me + 3};
    shmem_put(gl, src, 4, right);
    shmem_barrier_all();
    CHECK(gl[3] == (me + n - 1) % n + 3, "generic put %ld", gl[3]);
    shmem_put(SHMEM_CTX_DEFAULT, gl, src, 2, right);
    shmem_p(&gd, 1.5, right);
    shmem_barrier_all();
    CHECK(shmem_g(&gd, right) == 1.5, "generic p/g");
    shmem_atomic_add(&gi, 2, 0);
    shmem_atomic_fetch_inc(SHMEM_CTX_DEFAULT, &gi, 0);
    shmem_atomic_or(&gu, 1UL << me, 0);
    shmem_barrier_all();
    CHECK(shmem_atomic_fetch(&gi, 0) == 3 * n, "generic atomics %d", shmem_atomic_fetch(&gi, 0));
    static long s, one = 1;
    shmem_sum_reduce(SHMEM_TEAM_WORLD, &s, &one, 1);
    CHECK(s == n, "generic reduce %ld", s);
    shmem_sync(SHMEM_TEAM_WORLD);
    static long flag;
    shmem_p(&flag, 1L, right);
    shmem_wait_until(&flag, SHMEM_CMP_EQ, 1L);
    CHECK(shmem_test(&flag, SHMEM_CMP_EQ, 1L) == 1, "generic wait/test");
    return test_end("c11");
}
