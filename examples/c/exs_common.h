/* Helpers shared by the EXS examples and tests: checks with errno and the library's
 * sentence, waiting for one event, and making the listening socket of each kind (an EXS
 * socket over Courier, or a kernel socket from socket(2) driven through the same calls). */
#ifndef COURIER_EXS_COMMON_H
#define COURIER_EXS_COMMON_H

#include "common.h"

#include <exs.h>

#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/un.h>

#define XCHECK(call)                                                                 \
    do {                                                                             \
        long r_ = (long)(call);                                                      \
        if (r_ < 0) {                                                                \
            fprintf(stderr, "[%d] %s:%d: %s: %s (%s)\n", (int)getpid(), __FILE__,    \
                    __LINE__, #call, strerror(errno), exs_last_error_detail());      \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* The call fails with errno `e`. */
#define XFAILS(call, e)                                                              \
    do {                                                                             \
        errno = 0;                                                                   \
        long r_ = (long)(call);                                                      \
        if (r_ != -1 || errno != (e)) {                                              \
            fprintf(stderr, "[%d] %s:%d: %s: returned %ld errno %d (%s), expected %s\n", \
                    (int)getpid(), __FILE__, __LINE__, #call, r_, errno,             \
                    strerror(errno), #e);                                            \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* The next event of `q` (waits up to 60 s). */
static inline exs_event_t next_event(exs_qhandle_t q)
{
    exs_event_t ev;
    struct timespec t = {60, 0};
    int n = exs_qdequeue(q, &ev, 1, &t);
    if (n != 1) {
        fprintf(stderr, "[%d] no event in 60 s (%d: %s)\n", (int)getpid(), n,
                n < 0 ? exs_last_error_detail() : "timeout");
        exit(1);
    }
    return ev;
}

/* The next event, which must be of `type`, for `ahandle`, and succeed. */
static inline exs_event_t expect_event(exs_qhandle_t q, int type, void *ahandle)
{
    exs_event_t ev = next_event(q);
    if (ev.exs_evt_type != type || ev.exs_evt_ahandle != ahandle || ev.exs_evt_result < 0) {
        fprintf(stderr, "[%d] event type %d ahandle %p result %zd (%s); expected type %d ahandle %p\n",
                (int)getpid(), ev.exs_evt_type, ev.exs_evt_ahandle, ev.exs_evt_result,
                ev.exs_evt_result < 0 ? strerror(ev.exs_evt_errno) : "ok", type, ahandle);
        exit(1);
    }
    return ev;
}

/* Which sockets a run uses: EXS sockets over Courier, or kernel sockets from socket(2)
 * (TCP loopback for SOCK_STREAM, a Unix socket for SOCK_SEQPACKET, which TCP lacks). */
enum sock_kind { OVER_COURIER, OVER_KERNEL };

static inline const char *kind_name(enum sock_kind k)
{
    return k == OVER_COURIER ? "courier" : "kernel";
}

/* A listening socket of `type` over `kind`; its address goes to *ss / *sslen. */
static inline int listen_socket(enum sock_kind kind, int type, struct sockaddr_storage *ss,
                                socklen_t *sslen)
{
    int fd;
    memset(ss, 0, sizeof(*ss));
    if (kind == OVER_KERNEL && type == SOCK_SEQPACKET) {
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        XCHECK(fd);
        struct sockaddr_un *un = (struct sockaddr_un *)ss;
        un->sun_family = AF_UNIX;
        /* Abstract name: nothing to clean up. */
        snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "exs-%d-%ld", (int)getpid(),
                 (long)random());
        *sslen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(un->sun_path + 1));
    } else {
        fd = kind == OVER_COURIER ? exs_socket(AF_INET, type, 0)
                                  : socket(AF_INET, type | SOCK_CLOEXEC, 0);
        XCHECK(fd);
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        in->sin_port = 0;
        *sslen = sizeof(*in);
    }
    XCHECK(exs_bind(fd, (struct sockaddr *)ss, *sslen));
    XCHECK(exs_listen(fd, 8));
    if (ss->ss_family == AF_INET) {
        socklen_t l = sizeof(*ss);
        XCHECK(exs_getsockname(fd, (struct sockaddr *)ss, &l));
        *sslen = l;
    }
    return fd;
}

/* A socket to connect with, of the same kind as the listener's address. */
static inline int client_socket(enum sock_kind kind, int type, const struct sockaddr_storage *ss)
{
    int fd;
    if (kind == OVER_COURIER)
        fd = exs_socket(AF_INET, type, 0);
    else
        fd = socket(ss->ss_family, type | SOCK_CLOEXEC, 0);
    XCHECK(fd);
    return fd;
}

/* The transport a connected socket uses ("shm", "tcp", "kernel"). */
static inline const char *transport_of(int fd, char *buf, socklen_t cap)
{
    XCHECK(exs_getsockopt(fd, SOL_EXS, EXS_SO_TRANSPORT, buf, &cap));
    return buf;
}

/* The transport COURIER_TLS makes us expect between two processes of this host. */
static inline const char *expected_transport(enum sock_kind kind)
{
    if (kind == OVER_KERNEL)
        return "kernel";
    const char *tls = getenv("COURIER_TLS");
    return (tls && strcmp(tls, "tcp") == 0) ? "tcp" : "shm";
}

#endif
