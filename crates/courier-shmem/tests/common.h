/* Helpers for Courier's OpenSHMEM tests: every failed check prints where and what, and
 * the test exits 1 at the end (or at once with FATAL). */
#ifndef SHMEM_TEST_COMMON_H
#define SHMEM_TEST_COMMON_H
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_errors;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "PE %d: %s:%d: check failed: %s: ", shmem_my_pe(), \
                    __FILE__, __LINE__, #cond);                              \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            test_errors++;                                                   \
        }                                                                    \
    } while (0)

/* End the test: every PE reports, then exit 1 if any check failed anywhere. */
static int test_end(const char *name) {
    static int total;
    static int mine;
    mine = test_errors;
    shmem_barrier_all();
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, &total, &mine, 1);
    if (shmem_my_pe() == 0)
        printf("%s: %d PEs, %s\n", name, shmem_n_pes(), total ? "FAILED" : "passed");
    shmem_finalize();
    return total ? 1 : 0;
}
#endif
