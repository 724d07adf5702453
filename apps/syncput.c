/* One-way latency of a synchronizing put against payload size, the signaling-put seed's
 * microbenchmark: PE 0 and PE 1 ping-pong SIZE bytes ITERS times, each side waiting until
 * the other's data is there before answering; one-way latency = round trip / 2. Every
 * message's payload is checked on arrival (its first and last words carry the iteration).
 *
 *   -m flag        put, shmem_quiet, then a flag put the consumer waits on
 *                  ("memput + strict flag": about 1.5 round trips one way, in the seed)
 *   -m fenceflag   put, shmem_fence, then the flag put (ordering only, no completion)
 *   -m signal      shmem_putmem_signal, the consumer in shmem_signal_wait_until
 *   -m sem         shmemx_putmem_signal_sem, the consumer in shmemx_sem_wait
 *                  (the seed's claim for both: about half a round trip)
 * Sizes: -s MIN -S MAX (powers of two between). Output, PE 0, one line a size:
 *   SYNCPUT mode=M npes=2 size=S iters=I one_way_us=T check=ok */
#include "common.h"

static uint64_t flag, sig;

int main(int argc, char **argv) {
    shmem_init();
    const char *mode = "signal";
    long smin = 1, smax = 65536;
    int iters = 1000, c;
    while ((c = getopt(argc, argv, "m:s:S:i:")) != -1) {
        switch (c) {
        case 'm': mode = optarg; break;
        case 's': smin = atol(optarg); break;
        case 'S': smax = atol(optarg); break;
        case 'i': iters = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-m flag|fenceflag|signal|sem] [-s MIN] [-S MAX] [-i ITERS]\n", argv[0]);
            return 2;
        }
    }
    int m = strcmp(mode, "flag") == 0 ? 0 : strcmp(mode, "fenceflag") == 0 ? 1
          : strcmp(mode, "signal") == 0 ? 2 : strcmp(mode, "sem") == 0 ? 3 : -1;
    int me = shmem_my_pe();
    if (m < 0 || shmem_n_pes() != 2 || smin < 1 || smax < smin) {
        if (me == 0) fprintf(stderr, "syncput: 2 PEs; -m flag|fenceflag|signal|sem; 1 <= MIN <= MAX\n");
        shmem_finalize();
        return 2;
    }
    int peer = 1 - me;
    static shmemx_sem_t sems[2];
    static shmemx_sem_t mysem;
    mysem = sem_alloc_or_die(SHMEMX_SEM_INTEGER | SHMEMX_SEM_SPRODUCER | SHMEMX_SEM_SCONSUMER);
    shmem_barrier_all();
    shmem_uint64_fcollect(SHMEM_TEAM_WORLD, (uint64_t *)sems, (uint64_t *)&mysem, 1);
    unsigned char *dst = sym_alloc((size_t)smax < 16 ? 16 : (size_t)smax);
    unsigned char *src = malloc((size_t)smax < 16 ? 16 : (size_t)smax);
    long errors = 0;
    uint64_t seq = 0; /* messages received so far, the same count on both sides */
    for (long size = smin; size <= smax; size *= 2) {
        int warm = iters / 10 + 1;
        double t0 = 0;
        for (int i = 0; i < warm + iters; i++) {
            if (i == warm) {
                shmem_barrier_all();
                t0 = now_us();
            }
            for (int turn = 0; turn < 2; turn++) {
                int sender = turn; /* PE 0 sends first, PE 1 answers */
                seq++;
                if (me == sender) {
                    unsigned char tag = (unsigned char)(seq * 31 + 7);
                    src[0] = tag;
                    src[size - 1] = tag;
                    switch (m) {
                    case 0:
                        shmem_putmem(dst, src, (size_t)size, peer);
                        shmem_quiet();
                        shmem_uint64_p(&flag, seq, peer);
                        break;
                    case 1:
                        shmem_putmem(dst, src, (size_t)size, peer);
                        shmem_fence();
                        shmem_uint64_p(&flag, seq, peer);
                        break;
                    case 2:
                        shmem_putmem_signal(dst, src, (size_t)size, &sig, seq, SHMEM_SIGNAL_SET, peer);
                        break;
                    case 3:
                        shmemx_putmem_signal_sem(dst, src, (size_t)size, sems[peer], 1);
                        break;
                    }
                } else {
                    switch (m) {
                    case 0:
                    case 1: shmem_uint64_wait_until(&flag, SHMEM_CMP_GE, seq); break;
                    case 2: shmem_signal_wait_until(&sig, SHMEM_CMP_GE, seq); break;
                    case 3: shmemx_sem_wait(mysem, 1); break;
                    }
                    unsigned char tag = (unsigned char)(seq * 31 + 7);
                    if (dst[0] != tag || dst[size - 1] != tag) {
                        if (errors < 5)
                            fprintf(stderr, "PE %d: size %ld message %llu: got %u/%u, expected %u\n", me,
                                    size, (unsigned long long)seq, dst[0], dst[size - 1], tag);
                        errors++;
                    }
                }
            }
        }
        double one_way = (now_us() - t0) / iters / 2;
        one_way = max_over_pes(one_way);
        long bad = sum_over_pes(errors);
        if (me == 0)
            printf("SYNCPUT mode=%s npes=2 size=%ld iters=%d one_way_us=%.3f check=%s\n", mode, size,
                   iters, one_way, bad ? "FAILED" : "ok");
        fflush(stdout);
    }
    shmem_barrier_all();
    shmemx_sem_free(mysem);
    long bad = sum_over_pes(errors);
    shmem_finalize();
    return bad ? 1 : 0;
}
