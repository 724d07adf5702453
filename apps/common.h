/* Shared by the applications: the synchronization variant, options, timing, the result
 * line and the exit status.
 *
 * Every program prints one line from PE 0:
 *   RESULT app=NAME variant=V npes=N size=S iters=I us=T [extra...] check=ok|FAILED
 * where T is the time per operation (or per iteration), the slowest PE's; and exits 1 on
 * any PE when its answer differs from the serial computation. */
#ifndef APPS_COMMON_H
#define APPS_COMMON_H

#include <shmem.h>
#include <shmemx.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How a producer tells a consumer that its data is there. */
enum variant {
    V_BARRIER, /* put, then a global barrier: everyone waits for everyone */
    V_FLAG,    /* put, shmem_quiet, then a flag put the consumer waits on ("memput + strict flag") */
    V_SIGNAL,  /* a put that signals a semaphore at the target (shmemx_putmem_signal_sem) */
};

static const char *variant_names[] = {"barrier", "flag", "signal"};

struct opts {
    enum variant variant;
    long size;  /* the problem size; its meaning is the program's */
    int iters;  /* timed repetitions */
    int warmup; /* untimed ones before */
    int corrupt; /* -x: the last PE spoils one result before the check (the check must fail) */
};

static inline void usage(const char *prog, const char *size_help) {
    fprintf(stderr,
            "usage: %s [-v barrier|flag|signal] [-n SIZE] [-i ITERS] [-w WARMUP] [-x]\n"
            "  -n: %s\n  -x: spoil one result on the last PE (to see the check fail)\n",
            prog, size_help);
    exit(2);
}

static inline struct opts parse_opts(int argc, char **argv, long size, int iters, const char *size_help) {
    struct opts o = {V_SIGNAL, size, iters, -1, 0};
    int c;
    while ((c = getopt(argc, argv, "v:n:i:w:xh")) != -1) {
        switch (c) {
        case 'v': {
            int found = 0;
            for (int v = 0; v < 3; v++)
                if (strcmp(optarg, variant_names[v]) == 0) {
                    o.variant = (enum variant)v;
                    found = 1;
                }
            if (!found) usage(argv[0], size_help);
            break;
        }
        case 'n':
            o.size = strtol(optarg, NULL, 0);
            if (o.size <= 0) usage(argv[0], size_help);
            break;
        case 'i':
            o.iters = atoi(optarg);
            if (o.iters <= 0) usage(argv[0], size_help);
            break;
        case 'x':
            o.corrupt = 1;
            break;
        case 'w':
            o.warmup = atoi(optarg);
            if (o.warmup < 0) usage(argv[0], size_help);
            break;
        default:
            usage(argv[0], size_help);
        }
    }
    if (o.warmup < 0) o.warmup = o.iters / 10 > 0 ? o.iters / 10 : 1;
    return o;
}

/* With -x, on the last PE: spoil *v (once) so that the check must catch it. */
static inline void maybe_corrupt(const struct opts *o, double *v) {
    static int done;
    if (o->corrupt && !done && shmem_my_pe() == shmem_n_pes() - 1) {
        *v += 1;
        done = 1;
    }
}

static inline double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* The largest value over all PEs. */
static inline double max_over_pes(double v) {
    static double in, out;
    in = v;
    shmem_barrier_all();
    shmem_double_max_reduce(SHMEM_TEAM_WORLD, &out, &in, 1);
    return out;
}

/* The sum over all PEs. */
static inline long sum_over_pes(long v) {
    static long in, out;
    in = v;
    shmem_barrier_all();
    shmem_long_sum_reduce(SHMEM_TEAM_WORLD, &out, &in, 1);
    return out;
}

/* Print the result line (PE 0), finalize, and return the exit status: 1 if any PE found
 * an error. `extra` is more "key=value" text, or "". */
static inline int finish(const char *app, const struct opts *o, double us_per_op, long my_errors,
                  const char *extra) {
    long errors = sum_over_pes(my_errors);
    if (shmem_my_pe() == 0)
        printf("RESULT app=%s variant=%s npes=%d size=%ld iters=%d us=%.3f%s%s check=%s\n", app,
               variant_names[o->variant], shmem_n_pes(), o->size, o->iters, us_per_op,
               *extra ? " " : "", extra, errors ? "FAILED" : "ok");
    if (errors && shmem_my_pe() == 0)
        fprintf(stderr, "%s: %ld wrong values (see above)\n", app, errors);
    /* Out before anyone can exit: the launcher ends the job at the first failed exit. */
    fflush(stdout);
    fflush(stderr);
    shmem_finalize();
    return errors ? 1 : 0;
}

/* Symmetric allocation that ends the job when the heap is too small. */
static void *sym_alloc(size_t bytes) {
    void *p = shmem_calloc(1, bytes);
    if (!p && bytes) {
        fprintf(stderr, "PE %d: shmem_calloc(%zu) failed (raise SHMEM_SYMMETRIC_SIZE)\n",
                shmem_my_pe(), bytes);
        shmem_global_exit(2);
    }
    return p;
}

/* A semaphore of this PE, or the end of the job. */
static inline shmemx_sem_t sem_alloc_or_die(int flags) {
    shmemx_sem_t s = shmemx_sem_alloc(flags);
    if (s == SHMEMX_SEM_NULL) {
        fprintf(stderr, "PE %d: shmemx_sem_alloc: no semaphore left\n", shmem_my_pe());
        shmem_global_exit(2);
    }
    return s;
}

#endif
