/* Tree broadcast: PE 0 sends SIZE bytes down a binomial tree, ITERS times, every PE
 * checking every broadcast it receives against the root's pattern (a serial computation).
 *
 * The tree: PE p's parent is p with its highest bit cleared; its children are p + 2^j for
 * every 2^j > p (with p + 2^j < npes), served largest subtree first.
 *
 * Variants (-v):
 *   barrier  level by level: the PEs that have the data put it to their children at level
 *            l, then everyone meets in shmem_barrier_all (log2 N barriers per broadcast);
 *   flag     a PE waits for its flag, puts the data to each child, shmem_quiet, then puts
 *            each child's flag (the broadcast's number);
 *   signal   a PE waits on its semaphore, then shmemx_putmem_signal_sem to each child.
 * Two receive buffers alternate between broadcasts; in the flag and signal variants a child
 * tells its parent when it is done with one (a flag put, a semaphore post), so that a fast
 * parent never overwrites a buffer its child still reads. */
#include "common.h"

#define MAXLOG 24 /* up to 2^24 PEs */

static uint64_t flag[2];            /* flag variant: the broadcast that arrived in buf[b] */
static uint64_t acks[MAXLOG];       /* flag variant: child j's last finished broadcast */
static shmemx_sem_t my_sems[2 + MAXLOG]; /* signal variant: data[2], then ack[j] */
static shmemx_sem_t *all_sems;      /* every PE's my_sems */

static uint64_t pattern(long k, size_t i) { return (uint64_t)k * 1000003u + i * 7u + 1; }

static int highest_bit(int p) { /* -1 for 0 */
    int b = -1;
    while (p) { p >>= 1; b++; }
    return b;
}

int main(int argc, char **argv) {
    shmem_init();
    struct opts o = parse_opts(argc, argv, 8, 1000, "bytes broadcast (a multiple of 8)");
    int me = shmem_my_pe(), npes = shmem_n_pes();
    size_t words = (size_t)(o.size + 7) / 8;
    o.size = (long)(words * 8);
    uint64_t *buf = sym_alloc(2 * words * sizeof(uint64_t));
    int hb = highest_bit(me);
    int parent = me ? me - (1 << hb) : -1;
    int my_index = hb; /* this PE is child number hb of its parent */
    int children[MAXLOG], nchild = 0, child_index[MAXLOG];
    for (int j = MAXLOG - 1; j > hb; j--)
        if ((long)me + (1L << j) < npes) {
            children[nchild] = me + (1 << j);
            child_index[nchild++] = j;
        }
    if (o.variant == V_SIGNAL) {
        for (int i = 0; i < 2 + MAXLOG; i++)
            my_sems[i] = sem_alloc_or_die(SHMEMX_SEM_INTEGER | SHMEMX_SEM_SPRODUCER | SHMEMX_SEM_SCONSUMER);
        all_sems = sym_alloc((size_t)npes * (2 + MAXLOG) * sizeof(shmemx_sem_t));
        shmem_barrier_all();
        shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)all_sems, (uint64_t *)my_sems, 2 + MAXLOG);
    }
    long errors = 0;
    shmem_barrier_all();
    double t0 = 0;
    long total = o.warmup + o.iters;
    for (long k = 1; k <= total; k++) {
        if (k == o.warmup + 1) {
            shmem_barrier_all();
            t0 = now_us();
        }
        int b = (int)(k % 2);
        uint64_t *mine = buf + b * words;
        if (me == 0)
            for (size_t i = 0; i < words; i++) mine[i] = pattern(k, i);
        switch (o.variant) {
        case V_BARRIER:
            for (int l = 0; (1L << l) < npes; l++) {
                if (me < (1 << l) && me + (1 << l) < npes)
                    shmem_putmem(mine, mine, words * 8, me + (1 << l));
                shmem_barrier_all();
            }
            break;
        case V_FLAG:
            if (me) shmem_uint64_wait_until(&flag[b], SHMEM_CMP_GE, (uint64_t)k);
            /* Each child must be done with this buffer's previous broadcast (k - 2). */
            for (int c = 0; c < nchild; c++)
                if (k > 2) shmem_uint64_wait_until(&acks[child_index[c]], SHMEM_CMP_GE, (uint64_t)(k - 2));
            for (int c = 0; c < nchild; c++) shmem_putmem(mine, mine, words * 8, children[c]);
            if (nchild) shmem_quiet();
            for (int c = 0; c < nchild; c++) shmem_uint64_p(&flag[b], (uint64_t)k, children[c]);
            break;
        case V_SIGNAL:
            if (me) shmemx_sem_wait(my_sems[b], 1);
            for (int c = 0; c < nchild; c++)
                if (k > 2) shmemx_sem_wait(my_sems[2 + child_index[c]], 1);
            for (int c = 0; c < nchild; c++)
                shmemx_putmem_signal_sem(mine, mine, words * 8,
                                         all_sems[(size_t)children[c] * (2 + MAXLOG) + b], 1);
            break;
        }
        if (me) {
            if (k == total && o.corrupt && me == npes - 1) mine[0] ^= 1;
            for (size_t i = 0; i < words; i++)
                if (mine[i] != pattern(k, i)) {
                    if (errors < 5)
                        fprintf(stderr, "PE %d: broadcast %ld word %zu: %llu, expected %llu\n", me,
                                k, i, (unsigned long long)mine[i], (unsigned long long)pattern(k, i));
                    errors++;
                }
            /* Done with buf[b]: the parent may fill it again. */
            if (o.variant == V_FLAG)
                shmem_uint64_p(&acks[my_index], (uint64_t)k, parent);
            else if (o.variant == V_SIGNAL && k + 2 <= total)
                shmemx_sem_post(all_sems[(size_t)parent * (2 + MAXLOG) + 2 + my_index], 1);
        }
    }
    double us = (now_us() - t0) / o.iters;
    shmem_quiet();
    us = max_over_pes(us);
    if (o.variant == V_SIGNAL) {
        for (int i = 0; i < 2 + MAXLOG; i++) shmemx_sem_free(my_sems[i]);
    }
    return finish("bcast", &o, us, errors, "");
}
