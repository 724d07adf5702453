// The header from C++: typed calls, teams, a complex reduction.
#include <shmem.h>
#include <cstdio>

static long counter;

int main() {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    shmem_long_atomic_add(&counter, me + 1, 0);
    shmem_barrier_all();
    static double _Complex a, b;
    a = 2.0;
    shmem_complexd_sum_reduce(SHMEM_TEAM_WORLD, &b, &a, 1);
    int bad = 0;
    if (me == 0 && counter != (long)n * (n + 1) / 2) bad++;
    if (__real__ b != 2.0 * n) bad++;
    static int total, mine;
    mine = bad;
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, &total, &mine, 1);
    if (me == 0) std::printf("cxx: %d PEs, %s\n", n, total ? "FAILED" : "passed");
    shmem_finalize();
    return total ? 1 : 0;
}
