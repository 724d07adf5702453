/* SHMEM_THREAD_MULTIPLE: four threads per PE issue puts and atomics at once, then take
 * from one semaphore at once. */
#include "common.h"
#include <pthread.h>
#include <shmemx.h>

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

static shmemx_sem_t mine_sem;

static void *take(void *arg) {
    (void)arg;
    for (int i = 0; i < ITERS; i++) shmemx_sem_wait(mine_sem, 1);
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

    /* Every thread of the owner takes ITERS ones of one semaphore at once, from the left
     * neighbour's THREADS x ITERS posts: all posted before the threads start (so their
     * takes race), then posted while they wait. Each post is taken once, by one thread. */
    mine_sem = shmemx_sem_alloc(SHMEMX_SEM_INTEGER);
    CHECK(mine_sem != SHMEMX_SEM_NULL, "sem alloc");
    static uint64_t mine_h;
    mine_h = mine_sem;
    uint64_t *all = shmem_malloc((size_t)n * sizeof *all);
    shmem_uint64_fcollect(SHMEM_TEAM_WORLD, all, &mine_h, 1);
    for (int round = 0; round < 2; round++) {
        if (round == 0) {
            for (int i = 0; i < THREADS * ITERS; i++) shmemx_sem_post(all[(me + 1) % n], 1);
            shmem_barrier_all();
        }
        for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, take, NULL);
        if (round == 1)
            for (int i = 0; i < THREADS * ITERS; i++) shmemx_sem_post(all[(me + 1) % n], 1);
        for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        shmem_barrier_all();
        CHECK(shmemx_sem_value(mine_sem) == 0, "round %d: semaphore left at %zu", round,
              shmemx_sem_value(mine_sem));
        CHECK(shmemx_sem_try(mine_sem, 1) == 0, "round %d: a post taken twice or not at all", round);
        shmem_barrier_all(); /* checked before the next round's posts */
    }
    shmemx_sem_free(mine_sem);
    shmem_free(all);
    return test_end("threads");
}
