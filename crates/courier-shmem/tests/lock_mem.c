/* Locks, contexts, memory management and queries: set/test/clear_lock guarding a
 * read-modify-write that is not atomic; many contexts; malloc, calloc, align, realloc,
 * with hints (the NIC hint falls back to host memory); shmem_ptr, accessibility, info;
 * a heap too small for a request returns NULL on every PE. */
#include "common.h"
#include <shmemx.h>
#include <stdint.h>

static long lock;
static long guarded;

int main(void) {
    int provided = -1;
    CHECK(shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) == 0, "init_thread");
    int me = shmem_my_pe(), n = shmem_n_pes();
    CHECK(provided == SHMEM_THREAD_MULTIPLE, "provided %d", provided);
    int q;
    shmem_query_thread(&q);
    CHECK(q == provided, "query_thread %d", q);

    /* A get, a pause and a put under the lock: without mutual exclusion updates get lost. */
    for (int i = 0; i < 100; i++) {
        shmem_set_lock(&lock);
        long v = shmem_long_g(&guarded, 0);
        shmem_long_p(&guarded, v + 1, 0);
        shmem_quiet();
        shmem_clear_lock(&lock);
    }
    int won = 0;
    for (int i = 0; i < 20; i++) {
        if (shmem_test_lock(&lock) == 0) {
            long v = shmem_long_g(&guarded, 0);
            shmem_long_p(&guarded, v + 1, 0);
            won++;
            shmem_clear_lock(&lock);
        }
    }
    static int wins;
    shmem_int_atomic_add(&wins, won, 0);
    shmem_barrier_all();
    if (me == 0) CHECK(guarded == 100L * n + wins, "lock: %ld of %ld", guarded, 100L * n + wins);

    /* Many contexts. */
    shmem_ctx_t ctx[32];
    for (int i = 0; i < 32; i++) CHECK(shmem_ctx_create(0, &ctx[i]) == 0, "ctx %d", i);
    static long slots[32];
    for (int i = 0; i < 32; i++) shmem_ctx_long_atomic_add(ctx[i], &slots[i], i, 0);
    for (int i = 0; i < 32; i++) { shmem_ctx_quiet(ctx[i]); shmem_ctx_destroy(ctx[i]); }
    CHECK(shmem_ctx_create(1L << 20, &ctx[0]) != 0, "unknown option bits refused");
    shmem_barrier_all();
    if (me == 0) CHECK(slots[31] == 31L * n, "ctx atomics %ld", slots[31]);

    /* Memory management. */
    char *a = shmem_malloc(100), *b = shmem_align(4096, 10);
    CHECK(a && b && ((uintptr_t)b % 4096) == 0, "malloc/align");
    int *c = shmem_calloc(1000, sizeof(int));
    int zero = 1;
    for (int i = 0; i < 1000; i++) zero &= c[i] == 0;
    CHECK(zero, "calloc zeroes");
    strcpy(a, "kept across realloc");
    a = shmem_realloc(a, 1 << 20);
    CHECK(a && strcmp(a, "kept across realloc") == 0, "realloc keeps contents");
    a[(1 << 20) - 1] = 'z';
    shmem_barrier_all();
    CHECK(shmem_char_g(&a[(1 << 20) - 1], (me + 1) % n) == 'z', "realloc'd block is symmetric");
    long *nic = shmem_malloc_with_hints(64, SHMEM_HINT_DEVICE_NIC_MEM);
    long *spec = shmem_malloc_with_hints(64, SHMEM_MALLOC_ATOMICS_REMOTE);
    CHECK(nic && spec, "malloc_with_hints");
    *nic = 0;
    shmem_barrier_all();
    shmem_long_atomic_inc(nic, 0);
    shmem_barrier_all();
    if (me == 0) CHECK(*nic == n, "atomics on a NIC-hinted block: %ld", *nic);
    CHECK(shmem_malloc(0) == NULL, "malloc(0)");
    void *huge = shmem_malloc((size_t)1 << 40);
    CHECK(huge == NULL, "a request larger than the heap returns NULL");

    /* Queries. */
    CHECK(shmem_addr_accessible(a, (me + 1) % n) == 1, "heap accessible");
    CHECK(shmem_addr_accessible(&lock, (me + 1) % n) == 1, "global accessible");
    int local;
    CHECK(shmem_addr_accessible(&local, 0) == 0, "stack not accessible");
    CHECK(shmem_pe_accessible(n - 1) == 1 && shmem_pe_accessible(n) == 0, "pe_accessible");
    CHECK(shmem_ptr(a, me) == a, "shmem_ptr to self");
    CHECK(shmem_ptr(&local, me) == NULL, "shmem_ptr of a non-symmetric address");
    int maj, min;
    char name[SHMEM_MAX_NAME_LEN];
    shmem_info_get_version(&maj, &min);
    shmem_info_get_name(name);
    CHECK(maj == 1 && min == 5 && strstr(name, "Courier"), "info %d.%d %s", maj, min, name);
    shmem_free(a); shmem_free(b); shmem_free(c); shmem_free(nic); shmem_free(spec);
    return test_end("lock_mem");
}
