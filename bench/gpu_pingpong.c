/*
 * What one small copy to or from the GPU costs when two processes (or two threads of one
 * process) take turns, with no communication library in between: the ceiling under
 * `courier perf -m cuda` latency. The driver is loaded at run time (no CUDA headers).
 *
 *   cc -O2 -o gpu_pingpong bench/gpu_pingpong.c -ldl -lpthread
 *   ./gpu_pingpong MODE OP [ITERS]
 *     MODE: proc (two processes) | thread (two threads of one process, its primary
 *           context, a stream each) | one (one side alone, copies back to back)
 *     OP:   h2d | d2h | d2d | none   (8 bytes, from or to page-locked host memory)
 *
 * The two sides hand a turn back and forth through a word in shared memory, each making
 * one copy (and waiting for it) in its turn. Prints the time per turn in microseconds:
 * what one way of a ping-pong costs with one such copy in it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*fn_init)(unsigned);
typedef int (*fn_dev_get)(int *, int);
typedef int (*fn_ctx_retain)(void **, int);
typedef int (*fn_ctx_set)(void *);
typedef int (*fn_mem_alloc)(uint64_t *, size_t);
typedef int (*fn_host_alloc)(void **, size_t, unsigned);
typedef int (*fn_stream_create)(void **, unsigned);
typedef int (*fn_stream_sync)(void *);
typedef int (*fn_htod)(uint64_t, const void *, size_t, void *);
typedef int (*fn_dtoh)(void *, uint64_t, size_t, void *);
typedef int (*fn_dtod)(uint64_t, uint64_t, size_t, void *);

static fn_init cu_init;
static fn_dev_get cu_dev_get;
static fn_ctx_retain cu_ctx_retain;
static fn_ctx_set cu_ctx_set;
static fn_mem_alloc cu_mem_alloc;
static fn_host_alloc cu_host_alloc;
static fn_stream_create cu_stream_create;
static fn_stream_sync cu_stream_sync;
static fn_htod cu_htod;
static fn_dtoh cu_dtoh;
static fn_dtod cu_dtod;

static void *sym(void *h, const char *n)
{
    void *p = dlsym(h, n);
    if (!p) {
        fprintf(stderr, "missing %s\n", n);
        exit(2);
    }
    return p;
}

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    cu_init = (fn_init)sym(h, "cuInit");
    cu_dev_get = (fn_dev_get)sym(h, "cuDeviceGet");
    cu_ctx_retain = (fn_ctx_retain)sym(h, "cuDevicePrimaryCtxRetain");
    cu_ctx_set = (fn_ctx_set)sym(h, "cuCtxSetCurrent");
    cu_mem_alloc = (fn_mem_alloc)sym(h, "cuMemAlloc_v2");
    cu_host_alloc = (fn_host_alloc)sym(h, "cuMemHostAlloc");
    cu_stream_create = (fn_stream_create)sym(h, "cuStreamCreate");
    cu_stream_sync = (fn_stream_sync)sym(h, "cuStreamSynchronize");
    cu_htod = (fn_htod)sym(h, "cuMemcpyHtoDAsync_v2");
    cu_dtoh = (fn_dtoh)sym(h, "cuMemcpyDtoHAsync_v2");
    cu_dtod = (fn_dtod)sym(h, "cuMemcpyDtoDAsync_v2");
}

#define CK(x)                                                                                \
    do {                                                                                     \
        int rc_ = (x);                                                                       \
        if (rc_) {                                                                           \
            fprintf(stderr, "%s failed: %d\n", #x, rc_);                                    \
            exit(3);                                                                         \
        }                                                                                    \
    } while (0)

static const char *op;
static long iters = 20000;
static _Atomic long *turn;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One side of `sides`: the primary context, its own buffers and stream; it copies in
 * turns `me`, `me + sides`, ... (every turn when alone). The time a turn takes, in us. */
static double side(int me, int sides)
{
    CK(cu_init(0));
    int dev;
    void *ctx, *stream, *host;
    uint64_t d1, d2;
    CK(cu_dev_get(&dev, 0));
    CK(cu_ctx_retain(&ctx, dev));
    CK(cu_ctx_set(ctx));
    CK(cu_mem_alloc(&d1, 4096));
    CK(cu_mem_alloc(&d2, 4096));
    CK(cu_host_alloc(&host, 4096, 1));
    CK(cu_stream_create(&stream, 1));
    double start = 0;
    for (long i = me; i < sides * iters; i += sides) {
        while (atomic_load_explicit(turn, memory_order_acquire) != i)
            ;
        if (i == sides * (iters / 10) + me)
            start = now(); /* after a tenth of the turns, as warm-up */
        if (!strcmp(op, "h2d"))
            CK(cu_htod(d1, host, 8, stream));
        else if (!strcmp(op, "d2h"))
            CK(cu_dtoh(host, d1, 8, stream));
        else if (!strcmp(op, "d2d"))
            CK(cu_dtod(d2, d1, 8, stream));
        if (strcmp(op, "none"))
            CK(cu_stream_sync(stream));
        atomic_store_explicit(turn, i + 1, memory_order_release);
    }
    return (now() - start) / ((double)sides * (iters - iters / 10)) * 1e6;
}

static void *thread_side(void *arg)
{
    double *us = arg;
    *us = side(1, 2);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s proc|thread|one h2d|d2h|d2d|none [iters]\n", argv[0]);
        return 2;
    }
    op = argv[2];
    if (argc > 3)
        iters = atol(argv[3]);
    turn = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    load();
    double us;
    if (!strcmp(argv[1], "proc")) {
        pid_t kid = fork();
        if (kid == 0) {
            side(1, 2);
            _exit(0);
        }
        us = side(0, 2);
        waitpid(kid, NULL, 0);
    } else if (!strcmp(argv[1], "thread")) {
        pthread_t t;
        double other;
        pthread_create(&t, NULL, thread_side, &other);
        us = side(0, 2);
        pthread_join(t, NULL);
    } else {
        us = side(0, 1); /* alone, copying back to back: no hand-over */
    }
    printf("%s %s: %.3f us a turn\n", argv[1], op, us);
    return 0;
}
