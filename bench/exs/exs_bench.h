/* Shared by exs-blast and exs-pingpong: options, sockets of each kind (Courier, kernel TCP
 * loopback, kernel Unix), CPU time, and two processes joined by a pipe. One binary runs
 * over every kind: only the socket call differs; every other call is an exs_ call. */
#ifndef EXS_BENCH_H
#define EXS_BENCH_H

#include <exs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIE(...)                                                                     \
    do {                                                                             \
        fprintf(stderr, "[%d] ", (int)getpid());                                     \
        fprintf(stderr, __VA_ARGS__);                                                \
        fprintf(stderr, "\n");                                                       \
        exit(1);                                                                     \
    } while (0)

#define X(call)                                                                      \
    do {                                                                             \
        if ((long)(call) < 0)                                                        \
            DIE("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, strerror(errno),     \
                exs_last_error_detail());                                            \
    } while (0)

/* courier: EXS sockets (COURIER_TLS picks shm or tcp); tcp, unix: kernel sockets. */
enum over { OVER_COURIER, OVER_TCP, OVER_UNIX };

static inline enum over parse_over(const char *s)
{
    if (strcmp(s, "courier") == 0)
        return OVER_COURIER;
    if (strcmp(s, "tcp") == 0)
        return OVER_TCP;
    if (strcmp(s, "unix") == 0)
        return OVER_UNIX;
    DIE("-k %s: courier, tcp or unix", s);
}

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* This process's user and system CPU seconds (every thread). */
static inline void cpu_s(double *user, double *sys)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    *user = (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec * 1e-6;
    *sys = (double)r.ru_stime.tv_sec + (double)r.ru_stime.tv_usec * 1e-6;
}

static inline void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof(s), &s) != 0)
        DIE("sched_setaffinity %d: %s", cpu, strerror(errno));
}

static inline exs_event_t next_ev(exs_qhandle_t q)
{
    exs_event_t ev;
    struct timespec t = {60, 0};
    if (exs_qdequeue(q, &ev, 1, &t) != 1)
        DIE("no event in 60 s");
    if (ev.exs_evt_result < 0)
        DIE("event type %d failed: %s", ev.exs_evt_type, strerror(ev.exs_evt_errno));
    return ev;
}

static inline int listen_on(enum over o, struct sockaddr_storage *ss, socklen_t *len)
{
    int fd;
    memset(ss, 0, sizeof(*ss));
    if (o == OVER_UNIX) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un *un = (struct sockaddr_un *)ss;
        un->sun_family = AF_UNIX;
        snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "exs-bench-%d", (int)getpid());
        *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(un->sun_path + 1));
    } else {
        fd = o == OVER_COURIER ? exs_socket(AF_INET, SOCK_STREAM, 0)
                               : socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        *len = sizeof(*in);
    }
    X(fd);
    X(exs_bind(fd, (struct sockaddr *)ss, *len));
    X(exs_listen(fd, 4));
    if (o != OVER_UNIX) {
        socklen_t l = sizeof(*ss);
        X(exs_getsockname(fd, (struct sockaddr *)ss, &l));
        *len = l;
    }
    return fd;
}

static inline int connect_to(enum over o, exs_qhandle_t q, const struct sockaddr_storage *ss, socklen_t len)
{
    int fd = o == OVER_COURIER ? exs_socket(AF_INET, SOCK_STREAM, 0)
                               : socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    X(fd);
    if (o == OVER_TCP) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    X(exs_connect(fd, (const struct sockaddr *)ss, len, q, NULL));
    next_ev(q);
    return fd;
}

static inline int accept_on(int lfd, exs_qhandle_t q, enum over o)
{
    X(exs_accept(lfd, NULL, NULL, q, NULL));
    int fd = (int)next_ev(q).exs_evt_result;
    if (o == OVER_TCP) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

static inline void pipe_write(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n)
        DIE("pipe write");
}

static inline void pipe_read(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = read(fd, c, n);
        if (k <= 0)
            DIE("pipe read");
        c += k;
        n -= (size_t)k;
    }
}

static inline const char *over_name(enum over o)
{
    if (o == OVER_TCP)
        return "kernel-tcp";
    if (o == OVER_UNIX)
        return "kernel-unix";
    const char *tls = getenv("COURIER_TLS");
    return (tls && strcmp(tls, "tcp") == 0) ? "courier-tcp" : "courier-shm";
}

/* Exit status of a child: 0 only for a clean exit 0. */
static inline int reap(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

#endif
