/* Error cases: each mode makes one mistake, which must end the job with a message naming
 * the call, the argument and why (tests/run.sh checks the exit status and the message).
 *   errors pe | nonsym | before_init | team | cmp | align | sigop | free | semowner | semfreed |
 *          semover | reducecount | alltoallscount
 * and two that are no mistake: `exit` and `exit0`, where PE 0 calls shmem_global_exit(3)
 * (or 0) while the others wait in a barrier that never completes: the job must end with
 * that status. */
#include <shmem.h>
#include <shmemx.h>
#include <stdio.h>
#include <string.h>

static long target;

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "before_init") == 0) {
        printf("%d\n", shmem_my_pe());
        return 0;
    }
    shmem_init();
    int n = shmem_n_pes();
    long local = 1;
    if (strcmp(mode, "pe") == 0) {
        shmem_long_p(&target, 1, n);
    } else if (strcmp(mode, "nonsym") == 0) {
        shmem_long_put(&local, &target, 1, 0);
    } else if (strcmp(mode, "team") == 0) {
        shmem_team_t bogus = (shmem_team_t)&local;
        shmem_team_sync(bogus);
    } else if (strcmp(mode, "cmp") == 0) {
        shmem_long_wait_until(&target, 42, 0);
    } else if (strcmp(mode, "align") == 0) {
        static long pair[2];
        shmem_long_atomic_inc((long *)((char *)pair + 4), 0);
    } else if (strcmp(mode, "sigop") == 0) {
        static uint64_t sig;
        shmem_putmem_signal(&target, &local, 8, &sig, 1, 7, 0);
    } else if (strcmp(mode, "free") == 0) {
        shmem_free(&target);
    } else if (strcmp(mode, "semowner") == 0) {
        /* Only the owner waits on a semaphore: PE 1 waits on PE 0's. */
        static shmemx_sem_t s;
        if (shmem_my_pe() == 0) s = shmemx_sem_alloc(0);
        shmem_uint64_broadcast(SHMEM_TEAM_WORLD, (uint64_t *)&s, (uint64_t *)&s, 1, 0);
        if (shmem_my_pe() == 1) shmemx_sem_wait(s, 1);
        shmem_barrier_all();
    } else if (strcmp(mode, "semfreed") == 0) {
        shmemx_sem_t s = shmemx_sem_alloc(SHMEMX_SEM_BOOLEAN);
        shmemx_sem_free(s);
        shmemx_sem_try(s, 1);
    } else if (strcmp(mode, "semover") == 0) {
        /* Peers' posts take an integer semaphore past its maximum (each post is under it,
         * their sum is not): its owner's wait, which finds enough there, says so. */
        static shmemx_sem_t s;
        if (shmem_my_pe() == 0) s = shmemx_sem_alloc(SHMEMX_SEM_INTEGER);
        shmem_uint64_broadcast(SHMEM_TEAM_WORLD, (uint64_t *)&s, (uint64_t *)&s, 1, 0);
        if (shmem_my_pe() == 1) {
            shmemx_sem_post(s, 40000);
            shmemx_sem_post(s, 40000);
        }
        shmem_barrier_all();
        if (shmem_my_pe() == 0) shmemx_sem_wait(s, 1);
        shmem_barrier_all();
    } else if (strcmp(mode, "reducecount") == 0) {
        /* 2^61 + 1 longs: their size in bytes wraps to 8. */
        shmem_long_sum_reduce(SHMEM_TEAM_WORLD, &target, &target, ((size_t)1 << 61) + 1);
    } else if (strcmp(mode, "alltoallscount") == 0) {
        /* 2 PEs: 2^61 longs, whose span in bytes wraps to 0. */
        shmem_long_alltoalls(SHMEM_TEAM_WORLD, &target, &target, 1, 1, (size_t)1 << 60);
    } else if (strcmp(mode, "exit") == 0 || strcmp(mode, "exit0") == 0) {
        if (shmem_my_pe() == 0) shmem_global_exit(mode[4] ? 0 : 3);
        shmem_barrier_all();
        return 1; /* the exit did not end this PE */
    }
    shmem_finalize();
    return 0; /* reaching here is the failure: the mistake went unnoticed */
}
