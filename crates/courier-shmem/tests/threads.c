/* SHMEM_THREAD_MULTIPLE: four threads per PE issue puts and atomics at once. */
#include "common.h"
#include <pthread.h>

#define THREADS 4
#define ITERS 500
static long counter;
static long cells[THREADS * 64];

static void *work(void *arg) {
    int t = (int)(long)arg, me = shmem_my_pe(), n = shmem_n_pes();
    for (int i = 0; i < ITERS; i++) {
        shmem_long_atomic_inc(&counter, i % n);
        shmem_long_p(&cells[t * 64 + me], i, (me + 1) % n);
    }
    shmem_quiet();
    return NULL;
}

int main(void) {
    int provided;
    shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided);
    int me = shmem_my_pe(), n = shmem_n_pes();
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    shmem_barrier_all();
    static long total, mine;
    mine = counter;
    shmem_long_sum_reduce(SHMEM_TEAM_WORLD, &total, &mine, 1);
    CHECK(total == (long)THREADS * ITERS * n, "increments %ld", total);
    for (int t = 0; t < THREADS; t++) CHECK(cells[t * 64 + (me + n - 1) % n] == ITERS - 1, "cell %d", t);
    return test_end("threads");
}
