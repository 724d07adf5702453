/* What the EXS tests between processes share (exs_peers.c, exs_place.c): forking a child
 * and a child's own start of the library. */
#ifndef EXS_PROCS_H
#define EXS_PROCS_H

#include "../../../../examples/c/exs_common.h"

#include <sys/wait.h>

/* Run fn(arg) in a forked child, which exits with its result. */
static inline pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0)
        exit(fn(arg));
    return pid;
}

/* A child starts its own library (the parent's is not inherited) and an event queue. */
static inline exs_qhandle_t child_init(void)
{
    XCHECK(exs_init(EXS_VERSION));
    exs_qhandle_t cq = exs_qcreate(64);
    XCHECK(cq);
    return cq;
}

#endif
