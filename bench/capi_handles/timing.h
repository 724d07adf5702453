/* What hot.c and calls.c share: a monotonic clock in nanoseconds and the comparison
 * that sorts timed blocks for their median. */
#ifndef CAPI_HANDLES_TIMING_H
#define CAPI_HANDLES_TIMING_H

#include <stdint.h>
#include <time.h>

#define BLOCKS 5

static inline double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
