/* Helpers shared by the C examples: checks that exit nonzero with the library's reason,
 * a request finisher, a data pattern, and a watchdog so a hang fails instead of blocking. */
#ifndef COURIER_EXAMPLE_COMMON_H
#define COURIER_EXAMPLE_COMMON_H

#include <courier.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        courier_status_t s_ = (call);                                                \
        if (s_ < 0) {                                                                \
            fprintf(stderr, "[%d] %s:%d: %s: %s (%s)\n", (int)getpid(), __FILE__,    \
                    __LINE__, #call, courier_status_string(s_),                      \
                    courier_last_error_detail());                                    \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define EXPECT(cond)                                                                 \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "[%d] %s:%d: expected %s\n", (int)getpid(), __FILE__,    \
                    __LINE__, #cond);                                                \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* Wait for an operation that may have completed at once (COURIER_OK, no request) or
 * started (COURIER_INPROGRESS, a request to wait on and free). Returns the final status. */
static inline courier_status_t finish(courier_status_t s, courier_request_t **req)
{
    /* `req` is a pointer so `finish(op(..., &r), &r)` reads r after op wrote it (C leaves
     * the order of argument evaluation open). */
    if (s == COURIER_INPROGRESS) {
        s = courier_request_wait(*req);
        courier_request_free(*req);
    }
    return s;
}

static inline void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed);
}

static inline int verify(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31u + seed))
            return 0;
    return 1;
}

/* A context with the given features; COURIER_TLS and other variables come from the
 * environment. */
static inline courier_context_t *make_context(uint64_t features, const char *name)
{
    courier_context_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = COURIER_CONTEXT_FIELD_FEATURES | COURIER_CONTEXT_FIELD_NAME;
    p.features = features;
    p.name = name;
    courier_context_t *ctx = NULL;
    CHECK(courier_context_create(&p, &ctx));
    return ctx;
}

static inline courier_worker_t *make_worker(courier_context_t *ctx)
{
    courier_worker_params_t p = {.field_mask = COURIER_WORKER_FIELD_THREAD_MODE,
                                 .thread_mode = COURIER_THREAD_MODE_SINGLE};
    courier_worker_t *w = NULL;
    CHECK(courier_worker_create(ctx, &p, &w));
    return w;
}

/* Exit status of a child: 0 only for a clean exit 0. */
static inline int child_status(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    fprintf(stderr, "child killed by signal %d\n", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    return 1;
}

static inline void watchdog(unsigned seconds)
{
    signal(SIGALRM, SIG_DFL);
    alarm(seconds);
}

static inline void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        EXPECT(k > 0);
        c += k;
        n -= (size_t)k;
    }
}

static inline void read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        EXPECT(k > 0);
        c += k;
        n -= (size_t)k;
    }
}

/* Tell the process at the other end of `fd` where `w` is (its worker address, length
 * first), then close `fd`. */
static inline void send_address(courier_worker_t *w, int fd)
{
    void *addr = NULL;
    size_t len = 0;
    CHECK(courier_worker_address(w, &addr, &len));
    write_all(fd, &len, sizeof(len));
    write_all(fd, addr, len);
    courier_buffer_free(addr);
    close(fd);
}

/* Read a worker address that send_address wrote to `fd`, close `fd`, and return a
 * connected endpoint from `w` to that worker. */
static inline courier_ep_t *connect_to(courier_worker_t *w, int fd)
{
    size_t len = 0;
    read_all(fd, &len, sizeof(len));
    EXPECT(len > 0 && len < (1u << 20));
    void *addr = malloc(len);
    EXPECT(addr != NULL);
    read_all(fd, addr, len);
    close(fd);
    courier_ep_params_t p = {.field_mask = COURIER_EP_FIELD_REMOTE_ADDRESS, .address = addr, .address_length = len};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &p, &ep));
    free(addr);
    CHECK(courier_ep_wait_connected(ep, 10000));
    return ep;
}

/* Run `parent(write_fd, child_pid)` here and `child(read_fd)` in a forked process, joined
 * by a pipe (the parent tells the child where to connect). Prints "<name>: OK" when the
 * parent side succeeds; returns its exit code. A watchdog ends a run that hangs. */
static inline int run_two_processes(const char *name, unsigned timeout_s, int (*parent)(int, pid_t),
                                    int (*child)(int))
{
    watchdog(timeout_s);
    int fds[2];
    EXPECT(pipe(fds) == 0);
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        exit(child(fds[0]));
    }
    close(fds[0]);
    int rc = parent(fds[1], pid);
    if (rc == 0)
        printf("%s: OK\n", name);
    return rc;
}

#endif
