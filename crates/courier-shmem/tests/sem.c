/* shmemx semaphores and the semaphore-signalling put: handles exchanged between PEs,
 * integer and boolean semaphores posted locally and remotely, waits and tries of N, many
 * producers into one semaphore, the blocking and _nbi signalling puts with their data
 * checked on arrival, slot exhaustion and reuse. */
#include <shmemx.h>
#include <stdint.h>

#include "common.h"

#define ROUNDS 50
#define BIG 70000

static shmemx_sem_t ring_sem;       /* mine: the left neighbour signals it */
static shmemx_sem_t handles[1024];  /* every PE's ring semaphore, gathered */
static shmemx_sem_t gather_sem;     /* PE 0's: everyone posts to it */
static shmemx_sem_t bool_sem;

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;
    CHECK(n <= 1024, "too many PEs for this test");

    /* Allocation is local; a handle names its owner. */
    ring_sem = shmemx_sem_alloc(SHMEMX_SEM_INTEGER | SHMEMX_SEM_SPRODUCER | SHMEMX_SEM_SCONSUMER);
    CHECK(ring_sem != SHMEMX_SEM_NULL, "alloc");
    CHECK(shmemx_sem_pe(ring_sem) == me, "owner %d", shmemx_sem_pe(ring_sem));
    CHECK(shmemx_sem_value(ring_sem) == 0, "starts at 0");
    bool_sem = shmemx_sem_alloc(SHMEMX_SEM_BOOLEAN);
    CHECK(bool_sem != SHMEMX_SEM_NULL && bool_sem != ring_sem, "boolean alloc");
    shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)handles, (uint64_t *)&ring_sem, 1);
    CHECK(handles[me] == ring_sem, "gathered");
    if (me == 0) gather_sem = shmemx_sem_alloc(0);
    shmem_uint64_broadcast(SHMEM_TEAM_WORLD, (uint64_t *)&gather_sem, (uint64_t *)&gather_sem, 1, 0);
    CHECK(shmemx_sem_pe(gather_sem) == 0, "broadcast handle");

    /* Local post and take: counts, try of more than there is, wait of N. */
    shmemx_sem_post(ring_sem, 5);
    CHECK(shmemx_sem_value(ring_sem) == 5, "value %zu", shmemx_sem_value(ring_sem));
    CHECK(shmemx_sem_try(ring_sem, 6) == 0, "try 6 of 5");
    CHECK(shmemx_sem_try(ring_sem, 2) == 1, "try 2 of 5");
    shmemx_sem_wait(ring_sem, 3);
    CHECK(shmemx_sem_value(ring_sem) == 0, "emptied");
    shmem_barrier_all();

    /* The signalling put around the ring: data, then the post, ROUNDS times; each round
     * this PE waits for its left neighbour's payload and checks it. */
    long *buf = shmem_malloc(ROUNDS * 64 * sizeof(long));
    long src[64];
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < 64; i++) src[i] = (long)me * 1000000 + r * 100 + i;
        shmemx_putmem_signal_sem(buf + r * 64, src, sizeof src, handles[right], 1);
        shmemx_sem_wait(ring_sem, 1);
        for (int i = 0; i < 64; i++)
            CHECK(buf[r * 64 + i] == (long)left * 1000000 + r * 100 + i,
                  "round %d [%d] = %ld", r, i, buf[r * 64 + i]);
    }
    shmem_barrier_all();

    /* The _nbi form: every round's source is its own buffer, kept until shmem_quiet; the
     * consumer takes all ROUNDS posts at once. */
    static long nbi_src[ROUNDS][64];
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < 64; i++) nbi_src[r][i] = -((long)me * 1000000 + r * 100 + i);
        shmemx_putmem_signal_sem_nbi(buf + r * 64, nbi_src[r], 64 * sizeof(long), handles[right], 1);
    }
    shmemx_sem_wait(ring_sem, ROUNDS);
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < 64; i++)
            CHECK(buf[r * 64 + i] == -((long)left * 1000000 + r * 100 + i), "nbi round %d [%d]", r, i);
    shmem_quiet();
    shmem_barrier_all();

    /* A large payload (past any inline size) with a post of 3. */
    size_t big = 1 << 20;
    char *dst = shmem_malloc(big);
    char *bsrc = malloc(big);
    for (size_t i = 0; i < big; i++) bsrc[i] = (char)(i * 7 + me);
    shmemx_putmem_signal_sem(dst, bsrc, big, handles[right], 3);
    shmemx_sem_wait(ring_sem, 3);
    size_t bad = 0;
    for (size_t i = 0; i < big; i++) bad += dst[i] != (char)(i * 7 + left);
    CHECK(bad == 0, "%zu bytes of the large payload wrong", bad);
    free(bsrc);
    shmem_barrier_all();

    /* Many producers: every PE posts 2 to PE 0's semaphore, plus bare posts around the
     * ring. */
    if (me != 0) shmemx_sem_post(gather_sem, 2);
    if (me == 0) {
        shmemx_sem_wait(gather_sem, 2 * (n - 1));
        CHECK(shmemx_sem_try(gather_sem, 1) == 0, "nothing more");
    }
    shmemx_sem_post(handles[right], 1);
    shmemx_sem_wait(ring_sem, 1);
    shmem_barrier_all();

    /* A boolean semaphore: posts from everyone (twice each) leave it at 1; one wait takes
     * it; a try then fails. The post is ordered after a plain put to the owner. */
    static long plain;
    shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)handles, (uint64_t *)&bool_sem, 1);
    shmem_long_p(&plain, 4242, right);
    shmemx_sem_post(handles[right], 1);
    shmemx_sem_post(handles[right], 1);
    shmem_barrier_all();
    CHECK(plain == 4242, "the put before the post");
    CHECK(shmemx_sem_value(bool_sem) == 1, "boolean value %zu", shmemx_sem_value(bool_sem));
    shmemx_sem_wait(bool_sem, 1);
    CHECK(shmemx_sem_try(bool_sem, 1) == 0, "boolean taken whole");
    shmem_barrier_all();

    /* Exhaustion and reuse: all slots taken gives NULL; a freed slot comes back. */
    static shmemx_sem_t many[SHMEMX_SEM_MAX];
    int got = 0;
    while (got < SHMEMX_SEM_MAX && (many[got] = shmemx_sem_alloc(0)) != SHMEMX_SEM_NULL) got++;
    CHECK(got == SHMEMX_SEM_MAX - 2 - (me == 0), "got %d", got);
    CHECK(shmemx_sem_alloc(SHMEMX_SEM_BOOLEAN) == SHMEMX_SEM_NULL, "exhausted");
    shmemx_sem_free(many[got / 2]);
    shmemx_sem_t again = shmemx_sem_alloc(0);
    CHECK(again != SHMEMX_SEM_NULL && again != many[got / 2], "a new handle for a freed slot");
    CHECK(shmemx_sem_value(again) == 0, "a reused slot starts at 0");
    shmemx_sem_free(again);
    for (int i = 0; i < got; i++)
        if (i != got / 2) shmemx_sem_free(many[i]);

    /* The owner counts what it took beside the count of posts: a slot that counted many
     * of both starts again at 0 when reused (the slot is the handle's low 24 bits, and a
     * freed slot is the lowest free one). */
    shmem_barrier_all();
    shmemx_sem_t was = ring_sem;
    shmemx_sem_free(ring_sem);
    ring_sem = shmemx_sem_alloc(SHMEMX_SEM_INTEGER);
    CHECK((ring_sem & 0xffffff) == (was & 0xffffff) && ring_sem != was, "the ring's slot again");
    CHECK(shmemx_sem_value(ring_sem) == 0, "a reused, counted slot at %zu", shmemx_sem_value(ring_sem));
    shmemx_sem_post(ring_sem, 2);
    CHECK(shmemx_sem_value(ring_sem) == 2 && shmemx_sem_try(ring_sem, 3) == 0, "2 after a post of 2");
    shmemx_sem_wait(ring_sem, 2);
    CHECK(shmemx_sem_value(ring_sem) == 0, "taken");

    shmemx_sem_free(ring_sem);
    shmemx_sem_free(bool_sem);
    if (me == 0) shmemx_sem_free(gather_sem);
    shmem_free(dst);
    shmem_free(buf);
    return test_end("sem");
}
