/* EXS in one process: every call's argument checks and error numbers, queues (depth,
 * reservations, EAGAIN, EBUSY, the pollable descriptor, the wait modes), registrations
 * (EFAULT, EBUSY, stale handles), exs_fcntl, and descriptors (an EXS descriptor closed
 * behind the library's back and reused by socket(2) is a kernel socket). A Courier
 * connection inside the process and a kernel socketpair carry the data cases here; the
 * two-process cases are in exs_peers.c. */
#include "../../../../examples/c/exs_common.h"

#include <limits.h>
#include <poll.h>

static struct timespec zero = {0, 0};

static void before_init(void)
{
    char b[8];
    XFAILS(exs_socket(AF_INET, SOCK_STREAM, 0), EINVAL);
    XFAILS(exs_qcreate(4), EINVAL);
    EXPECT(exs_mregister(b, sizeof(b), 0) == EXS_MHANDLE_INVALID && errno == EINVAL);
    XFAILS(exs_init(EXS_VERSION + 1), EINVAL);
    EXPECT(strlen(exs_last_error_detail()) > 0);
}

static void queues(void)
{
    XFAILS(exs_qcreate(0), EINVAL);
    XFAILS(exs_qcreate(-3), EINVAL);
    XFAILS(exs_qcreate(1 << 21), EINVAL);
    exs_qhandle_t q = exs_qcreate(3);
    XCHECK(q);
    exs_event_t ev[4];
    EXPECT(exs_qdequeue(q, ev, 4, &zero) == 0);
    EXPECT(exs_qdequeue(q, ev, 0, NULL) == 0);
    XFAILS(exs_qdequeue(q, NULL, 1, &zero), EFAULT);
    XFAILS(exs_qdequeue(q, ev, -4, &zero), EINVAL); /* more than the depth */
    struct timespec bad = {0, 2000000000};
    XFAILS(exs_qdequeue(q, ev, 1, &bad), EINVAL);
    XFAILS(exs_qdequeue(q + 1000, ev, 1, &zero), EINVAL);
    /* A short timeout on an empty queue: 0 events, after about that long. */
    struct timespec ten_ms = {0, 10000000};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    EXPECT(exs_qdequeue(q, ev, 1, &ten_ms) == 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    EXPECT((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) >= 9000000L);
    long v = -1;
    XCHECK(exs_qstatus(q, EXS_QATTR_DEPTH, &v));
    EXPECT(v == 3);
    XCHECK(exs_qstatus(q, EXS_QATTR_EVENTS, &v));
    EXPECT(v == 0);
    XFAILS(exs_qstatus(q, 99, &v), EINVAL);
    XFAILS(exs_qstatus(q, EXS_QATTR_DEPTH, NULL), EFAULT);
    XCHECK(exs_qmodify(q, EXS_QATTR_DEPTH, 5));
    XCHECK(exs_qstatus(q, EXS_QATTR_DEPTH, &v));
    EXPECT(v == 5);
    XFAILS(exs_qmodify(q, EXS_QATTR_DEPTH, 0), EINVAL);
    XFAILS(exs_qmodify(q, EXS_QATTR_WAIT, 9), EINVAL);
    XFAILS(exs_qmodify(q, EXS_QATTR_EVENTS, 1), EINVAL);
    for (long w = EXS_WAIT_DEFAULT; w <= EXS_WAIT_ADAPTIVE; w++) {
        XCHECK(exs_qmodify(q, EXS_QATTR_WAIT, w));
        XCHECK(exs_qstatus(q, EXS_QATTR_WAIT, &v));
        EXPECT(v == w);
        EXPECT(exs_qdequeue(q, ev, 1, &ten_ms) == 0);
    }
    XCHECK(exs_qdelete(q));
    XFAILS(exs_qdelete(q), EINVAL);
    XFAILS(exs_qstatus(q, EXS_QATTR_DEPTH, &v), EINVAL);
}

static void registrations(void)
{
    static char buf[4096];
    EXPECT(exs_mregister(NULL, 10, 0) == EXS_MHANDLE_INVALID && errno == EINVAL);
    EXPECT(exs_mregister(buf, 0, 0) == EXS_MHANDLE_INVALID && errno == EINVAL);
    EXPECT(exs_mregister(buf, 10, 0x40) == EXS_MHANDLE_INVALID && errno == EINVAL);
    exs_mhandle_t a = exs_mregister(buf, sizeof(buf), EXS_MREG_READ | EXS_MREG_WRITE);
    exs_mhandle_t b = exs_mregister(buf + 100, 100, 0);
    EXPECT(a != EXS_MHANDLE_INVALID && b != EXS_MHANDLE_INVALID && a != b);
    XCHECK(exs_mderegister(b));
    XFAILS(exs_mderegister(b), EINVAL);
    XFAILS(exs_mderegister(12345678), EINVAL);
    /* A new registration never gets a handle used before. */
    exs_mhandle_t c = exs_mregister(buf + 100, 100, 0);
    EXPECT(c != b && c != a);
    XCHECK(exs_mderegister(c));
    XCHECK(exs_mderegister(a));
}

static void sockets(void)
{
    XFAILS(exs_socket(AF_UNIX, SOCK_STREAM, 0), EAFNOSUPPORT);
    XFAILS(exs_socket(AF_INET, SOCK_DGRAM, 0), EPROTONOSUPPORT);
    XFAILS(exs_socket(AF_INET, SOCK_STREAM, 6), EPROTONOSUPPORT);
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    XCHECK(fd);
    int ty = 0;
    socklen_t l = sizeof(ty);
    XCHECK(exs_getsockopt(fd, SOL_SOCKET, SO_TYPE, &ty, &l));
    EXPECT(ty == SOCK_SEQPACKET);
    char t[16];
    EXPECT(strcmp(transport_of(fd, t, sizeof(t)), "none") == 0);
    XFAILS(exs_getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &ty, &l), ENOPROTOOPT);
    XFAILS(exs_listen(fd, 4), EDESTADDRREQ);
    exs_qhandle_t q = exs_qcreate(4);
    static char buf[64];
    exs_mhandle_t mh = exs_mregister(buf, sizeof(buf), 0);
    XFAILS(exs_send(fd, buf, 8, 0, q, NULL, mh), ENOTCONN);
    XFAILS(exs_recv(fd, buf, 8, 0, q, NULL, mh), ENOTCONN);
    long ev = -1;
    XCHECK(exs_qstatus(q, EXS_QATTR_RESERVED, &ev));
    EXPECT(ev == 0); /* refused operations give their slot back */
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    XFAILS(exs_bind(fd, (struct sockaddr *)&in, 4), EINVAL);
    XCHECK(exs_bind(fd, (struct sockaddr *)&in, sizeof(in)));
    XFAILS(exs_bind(fd, (struct sockaddr *)&in, sizeof(in)), EINVAL);
    XCHECK(exs_listen(fd, 4));
    struct sockaddr_in got;
    l = sizeof(got);
    XCHECK(exs_getsockname(fd, (struct sockaddr *)&got, &l));
    EXPECT(got.sin_port != 0 && l == sizeof(got));
    int acc = 0;
    l = sizeof(acc);
    XCHECK(exs_getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l));
    EXPECT(acc == 1);
    /* A pending accept ends with ECANCELED at close; then the CLOSE event. */
    XCHECK(exs_accept(fd, NULL, NULL, q, (void *)1));
    XCHECK(exs_close(fd, q, (void *)2));
    exs_event_t e = next_event(q);
    EXPECT(e.exs_evt_type == EXS_EVT_ACCEPT && e.exs_evt_result == -ECANCELED &&
           e.exs_evt_errno == ECANCELED && e.exs_evt_ahandle == (void *)1);
    expect_event(q, EXS_EVT_CLOSE, (void *)2);
    XFAILS(exs_close(fd, q, NULL), EBADF); /* now a closed kernel descriptor */

    /* Not a socket at all. */
    int p[2];
    EXPECT(pipe(p) == 0);
    XFAILS(exs_send(p[0], buf, 8, 0, q, NULL, mh), ENOTSOCK);
    XFAILS(exs_recv(p[0], buf, 8, 0, q, NULL, mh), ENOTSOCK);
    close(p[0]);
    close(p[1]);
    XFAILS(exs_recv(p[0], buf, 8, 0, q, NULL, mh), EBADF);

    /* EXS descriptors live above the numbers socket(2) hands out. One closed behind the
     * library's back whose number comes back as a kernel socket (here forced with dup2)
     * is that kernel socket, not the old EXS one. */
    int e1 = exs_socket(AF_INET, SOCK_STREAM, 0);
    XCHECK(e1);
    EXPECT(e1 >= 64);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT(k >= 0 && k < e1);
    close(e1);
    EXPECT(dup2(k, e1) == e1);
    close(k);
    EXPECT(strcmp(transport_of(e1, t, sizeof(t)), "kernel") == 0);
    /* A send on it goes to the kernel, which refuses an unconnected TCP socket. */
    XCHECK(exs_send(e1, buf, 8, 0, q, (void *)3, mh));
    exs_event_t ke = next_event(q);
    EXPECT(ke.exs_evt_ahandle == (void *)3 && ke.exs_evt_result < 0);
    EXPECT(ke.exs_evt_errno == EPIPE || ke.exs_evt_errno == ENOTCONN);
    close(e1);
    XCHECK(exs_mderegister(mh));
    XCHECK(exs_qdelete(q));
}

static void fcntls(void)
{
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    XCHECK(fd);
    struct {
        int cmd;
        long good, bad;
    } cases[] = {
        {EXS_F_SMALL_MAX, 4096, (1L << 20) + 1}, {EXS_F_INLINE_MAX, 64, -1},
        {EXS_F_RCVBUF, 1 << 20, 0},              {EXS_F_NO_RCVBUF, 1, 2},
        {EXS_F_ADV_CREDITS, 8, 0},               {EXS_F_SMALL_SLOTS, 16, 0},
        {EXS_F_SPLIT_MIN, 0, -1},                {EXS_F_SPLIT_MIN, 1 << 20, (1L << 40) + 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        XCHECK(exs_fcntl(fd, cases[i].cmd, cases[i].good));
        EXPECT(exs_fcntl(fd, cases[i].cmd | EXS_F_GET, 0) == cases[i].good);
        XFAILS(exs_fcntl(fd, cases[i].cmd, cases[i].bad), EINVAL);
        EXPECT(exs_fcntl(fd, cases[i].cmd | EXS_F_GET, 0) == cases[i].good);
    }
    XFAILS(exs_fcntl(fd, 77, 0), EINVAL);
    XCHECK(exs_fcntl(-1, EXS_F_BUSY_POLL, 1));
    EXPECT(exs_fcntl(-1, EXS_F_BUSY_POLL | EXS_F_GET, 0) == 1);
    XCHECK(exs_fcntl(-1, EXS_F_BUSY_POLL, 0));
    XFAILS(exs_fcntl(-1, EXS_F_BUSY_POLL, 2), EINVAL);
    XCHECK(exs_fcntl(-1, EXS_F_CPU, 0));
    EXPECT(exs_fcntl(-1, EXS_F_CPU | EXS_F_GET, 0) == 0);
    XCHECK(exs_fcntl(-1, EXS_F_CPU, -1));
    XFAILS(exs_fcntl(-1, EXS_F_CPU, 5000), EINVAL);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    XFAILS(exs_fcntl(k, EXS_F_SMALL_MAX, 10), EOPNOTSUPP);
    close(k);
    XCHECK(exs_close(fd, EXS_QHANDLE_INVALID, NULL));
}

/* A connection inside this process (Courier's self or shm path): the queue-full,
 * EFAULT, EBUSY and pollable-descriptor cases. */
static void connected(void)
{
    exs_qhandle_t q = exs_qcreate(16);
    XCHECK(q);
    struct sockaddr_storage ss;
    socklen_t sl;
    int lfd = listen_socket(OVER_COURIER, SOCK_SEQPACKET, &ss, &sl);
    int c = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    XCHECK(exs_connect(c, (struct sockaddr *)&ss, sl, q, (void *)1));
    XCHECK(exs_accept(lfd, NULL, NULL, q, (void *)2));
    int s = -1;
    for (int i = 0; i < 2; i++) {
        exs_event_t e = next_event(q);
        EXPECT(e.exs_evt_result >= 0);
        if (e.exs_evt_type == EXS_EVT_ACCEPT)
            s = (int)e.exs_evt_result;
    }
    EXPECT(s >= 0);
    XFAILS(exs_fcntl(c, EXS_F_SMALL_MAX, 100), EISCONN);
    XCHECK(exs_fcntl(c, EXS_F_INLINE_MAX, 100)); /* allowed any time */
    XCHECK(exs_fcntl(c, EXS_F_SPLIT_MIN, 512 * 1024));
    EXPECT(exs_fcntl(c, EXS_F_SPLIT_MIN | EXS_F_GET, 0) == 512 * 1024);
    static unsigned char whole[1 << 17];
    unsigned char *buf = whole + 4096;
    exs_mhandle_t mh = exs_mregister(buf, 1 << 16, 0);
    /* EFAULT: outside the registration (before it, across its end, NULL). */
    XFAILS(exs_send(c, buf - 1, 8, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_send(c, buf + (1 << 16) - 4, 8, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_recv(c, NULL, 8, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_send(c, buf, 8, 0, q, NULL, mh + 999), EINVAL);
    XFAILS(exs_send(c, buf, 8, 0, q + 999, NULL, mh), EINVAL);
    XFAILS(exs_recv(c, buf, 8, MSG_PEEK, q, NULL, mh), EOPNOTSUPP);
    XFAILS(exs_send(c, buf, 8, MSG_OOB, q, NULL, mh), EOPNOTSUPP);

    /* A zero-length receive with no registration advertises one of the library's own,
     * made now, its handle taken between two of ours: we can neither deregister nor use
     * that one, and it goes on working. */
    exs_mhandle_t before = exs_mregister(buf, 16, 0);
    XCHECK(exs_recv(s, NULL, 0, 0, q, (void *)40, EXS_MHANDLE_INVALID));
    exs_mhandle_t after = exs_mregister(buf, 16, 0);
    EXPECT(before != EXS_MHANDLE_INVALID && after > before + 1);
    for (exs_mhandle_t h = before + 1; h < after; h++) {
        XFAILS(exs_mderegister(h), EINVAL);
        XFAILS(exs_send(c, buf, 1, 0, q, NULL, h), EINVAL);
        XFAILS(exs_recv(s, buf, 1, 0, q, NULL, h), EINVAL);
    }
    XCHECK(exs_mderegister(before));
    XCHECK(exs_mderegister(after));
    for (int i = 0; i < 2; i++) { /* a small message (eager), then a big one (direct) */
        size_t n = i ? 30000 : 30;
        if (i)
            XCHECK(exs_recv(s, NULL, 0, 0, q, (void *)40, EXS_MHANDLE_INVALID));
        XCHECK(exs_send(c, buf + 100, n, 0, q, (void *)41, mh));
        for (int seen = 0; seen != 3;) {
            exs_event_t x = next_event(q);
            if (x.exs_evt_ahandle == (void *)41) {
                EXPECT(x.exs_evt_type == EXS_EVT_SEND && (size_t)x.exs_evt_result == n);
                seen |= 1;
            } else {
                EXPECT(x.exs_evt_type == EXS_EVT_RECV && x.exs_evt_ahandle == (void *)40);
                EXPECT(x.exs_evt_result == 0 && x.exs_evt_flags == MSG_TRUNC);
                seen |= 2;
            }
        }
    }
    fill(buf + 100, 50, 8);
    XCHECK(exs_recv(s, buf + 40000, 100, 0, q, (void *)42, mh));
    XCHECK(exs_send(c, buf + 100, 50, 0, q, (void *)43, mh));
    for (int seen = 0; seen != 3;) {
        exs_event_t x = next_event(q);
        EXPECT(x.exs_evt_result == 50);
        seen |= x.exs_evt_ahandle == (void *)43 ? 1 : 2;
    }
    EXPECT(verify(buf + 40000, 50, 8));

    /* exs_recvmsg over two iovecs stages through a registration of the library's own, its
     * handle taken between two of ours: while the receive is pending we can neither
     * deregister nor use it (EINVAL, as for a handle never made), and it goes on working. */
    exs_mhandle_t b2 = exs_mregister(buf, 16, 0);
    struct iovec iov[2] = {{buf + 50000, 20}, {buf + 50100, 30}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    XCHECK(exs_recvmsg(s, &msg, 0, q, (void *)44, mh));
    exs_mhandle_t a2 = exs_mregister(buf, 16, 0);
    EXPECT(b2 != EXS_MHANDLE_INVALID && a2 > b2 + 1);
    for (exs_mhandle_t h = b2 + 1; h < a2; h++) {
        XFAILS(exs_mderegister(h), EINVAL);
        XFAILS(exs_send(c, buf, 1, 0, q, NULL, h), EINVAL);
        XFAILS(exs_recv(s, buf, 1, 0, q, NULL, h), EINVAL);
    }
    XCHECK(exs_mderegister(b2));
    XCHECK(exs_mderegister(a2));
    unsigned char expect[50];
    fill(expect, 50, 9);
    memcpy(buf + 100, expect, 50);
    XCHECK(exs_send(c, buf + 100, 50, 0, q, (void *)45, mh));
    for (int seen = 0; seen != 3;) {
        exs_event_t x = next_event(q);
        EXPECT(x.exs_evt_result == 50);
        if (x.exs_evt_ahandle == (void *)45) {
            EXPECT(x.exs_evt_type == EXS_EVT_SEND);
            seen |= 1;
        } else {
            EXPECT(x.exs_evt_type == EXS_EVT_RECVMSG && x.exs_evt_ahandle == (void *)44);
            seen |= 2;
        }
    }
    EXPECT(memcmp(buf + 50000, expect, 20) == 0 && memcmp(buf + 50100, expect + 20, 30) == 0);

    /* A queue of depth 2: two receives hold both slots; a third is EAGAIN. */
    exs_qhandle_t small = exs_qcreate(2);
    XCHECK(exs_recv(s, buf, 100, 0, small, (void *)10, mh));
    XCHECK(exs_recv(s, buf + 100, 100, 0, small, (void *)11, mh));
    XFAILS(exs_recv(s, buf + 200, 100, 0, small, (void *)12, mh), EAGAIN);
    long v;
    XCHECK(exs_qstatus(small, EXS_QATTR_RESERVED, &v));
    EXPECT(v == 2);
    XFAILS(exs_qdelete(small), EBUSY);
    XFAILS(exs_qmodify(small, EXS_QATTR_DEPTH, 1), EBUSY);
    XFAILS(exs_mderegister(mh), EBUSY);

    /* The pollable descriptor: not readable while empty, readable once an event waits. */
    int qfd = exs_qfd(small);
    XCHECK(qfd);
    XCHECK(exs_qstatus(small, EXS_QATTR_FD, &v));
    EXPECT(v == qfd);
    struct pollfd pfd = {.fd = qfd, .events = POLLIN};
    EXPECT(poll(&pfd, 1, 0) == 0);
    fill(buf + 1000, 50, 3);
    XCHECK(exs_send(c, buf + 1000, 50, 0, q, (void *)20, mh));
    EXPECT(poll(&pfd, 1, 30000) == 1 && (pfd.revents & POLLIN));
    exs_event_t e;
    EXPECT(exs_qdequeue(small, &e, 1, &zero) == 1);
    EXPECT(e.exs_evt_type == EXS_EVT_RECV && e.exs_evt_result == 50 && e.exs_evt_ahandle == (void *)10);
    EXPECT(verify(buf, 50, 3));
    EXPECT(poll(&pfd, 1, 0) == 0); /* empty again */
    expect_event(q, EXS_EVT_SEND, (void *)20);

    /* Wait for several at once: n < 0. Two sends of which the second fills receive 11. */
    XCHECK(exs_recv(s, buf + 200, 100, 0, small, (void *)12, mh));
    XCHECK(exs_send(c, buf + 1000, 60, 0, q, (void *)21, mh));
    XCHECK(exs_send(c, buf + 1000, 70, 0, q, (void *)22, mh));
    exs_event_t two[2];
    struct timespec t = {30, 0};
    EXPECT(exs_qdequeue(small, two, -2, &t) == 2);
    EXPECT(two[0].exs_evt_ahandle == (void *)11 && two[0].exs_evt_result == 60);
    EXPECT(two[1].exs_evt_ahandle == (void *)12 && two[1].exs_evt_result == 70);
    expect_event(q, EXS_EVT_SEND, (void *)21);
    expect_event(q, EXS_EVT_SEND, (void *)22);

    /* Close with receives pending: ECANCELED for them, then CLOSE; the peer sees the end. */
    XCHECK(exs_recv(s, buf, 100, 0, small, (void *)13, mh));
    XCHECK(exs_recv(c, buf + 2000, 100, 0, q, (void *)23, mh));
    XCHECK(exs_close(s, q, (void *)30));
    for (int seen = 0; seen != 3;) {
        exs_event_t x = next_event(q);
        if (x.exs_evt_type == EXS_EVT_CLOSE) {
            EXPECT(x.exs_evt_ahandle == (void *)30);
            seen |= 1;
        } else {
            EXPECT(x.exs_evt_type == EXS_EVT_RECV && x.exs_evt_ahandle == (void *)23);
            EXPECT(x.exs_evt_result == 0); /* end of stream for the client */
            seen |= 2;
        }
    }
    e = next_event(small);
    EXPECT(e.exs_evt_ahandle == (void *)13 && e.exs_evt_result == -ECANCELED);
    /* Sending to a peer that closed: EPIPE. */
    XFAILS(exs_send(c, buf, 8, 0, q, NULL, mh), EPIPE);
    XCHECK(exs_qdelete(small));
    XCHECK(exs_close(c, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    XCHECK(exs_qdelete(q));
}

/* A kernel socketpair through the same calls: both types, contents checked. */
static void kernel_pair(int type)
{
    int sv[2];
    EXPECT(socketpair(AF_UNIX, type, 0, sv) == 0);
    exs_qhandle_t q = exs_qcreate(8);
    static unsigned char buf[1 << 16];
    exs_mhandle_t mh = exs_mregister(buf, sizeof(buf), 0);
    fill(buf, 5000, 9);
    XCHECK(exs_recv(sv[1], buf + 10000, type == SOCK_STREAM ? 5000 : 100, MSG_WAITALL, q, (void *)1, mh));
    XCHECK(exs_send(sv[0], buf, 5000, 0, q, (void *)2, mh));
    for (int seen = 0; seen != 3;) {
        exs_event_t e = next_event(q);
        if (e.exs_evt_type == EXS_EVT_SEND) {
            EXPECT(e.exs_evt_result == 5000);
            seen |= 1;
        } else if (type == SOCK_STREAM) {
            EXPECT(e.exs_evt_result == 5000 && e.exs_evt_flags == 0);
            seen |= 2;
        } else {
            EXPECT(e.exs_evt_result == 100 && (e.exs_evt_flags & MSG_TRUNC));
            seen |= 2;
        }
    }
    EXPECT(memcmp(buf + 10000, buf, type == SOCK_STREAM ? 5000 : 100) == 0);
    char t[16];
    EXPECT(strcmp(transport_of(sv[0], t, sizeof(t)), "kernel") == 0);
    /* exs_close of a kernel socket: its pending receive ends with ECANCELED. */
    XCHECK(exs_recv(sv[1], buf, 10, 0, q, (void *)3, mh));
    XCHECK(exs_close(sv[1], q, (void *)4));
    exs_event_t e = next_event(q);
    EXPECT(e.exs_evt_ahandle == (void *)3 && e.exs_evt_result == -ECANCELED);
    expect_event(q, EXS_EVT_CLOSE, (void *)4);
    /* The other end sees the end of the stream. */
    XCHECK(exs_recv(sv[0], buf, 10, 0, q, (void *)5, mh));
    EXPECT(expect_event(q, EXS_EVT_RECV, (void *)5).exs_evt_result == 0);
    XCHECK(exs_close(sv[0], EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    XCHECK(exs_qdelete(q));
}

/* exs_shutdown, exs_sendmsg and exs_recvmsg: their argument checks (the data cases, over
 * Courier and kernel sockets between processes, are in exs_peers.c). */
static void shutdown_and_msg_errors(void)
{
    exs_qhandle_t q = exs_qcreate(4);
    static unsigned char buf[4096], other[64];
    exs_mhandle_t mh = exs_mregister(buf, sizeof(buf), 0);
    int sv[2];
    EXPECT(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    int e = exs_socket(AF_INET, SOCK_STREAM, 0);
    XCHECK(e);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    int p[2];
    EXPECT(k >= 0 && pipe(p) == 0);
    /* shutdown: bad how (before anything else), not connected, not a socket, not open. */
    XFAILS(exs_shutdown(sv[0], 3), EINVAL);
    XFAILS(exs_shutdown(sv[0], -1), EINVAL);
    XFAILS(exs_shutdown(e, 42), EINVAL);
    XFAILS(exs_shutdown(e, SHUT_WR), ENOTCONN);
    XFAILS(exs_shutdown(e, SHUT_RD), ENOTCONN);
    XFAILS(exs_shutdown(k, SHUT_RDWR), ENOTCONN);
    XFAILS(exs_shutdown(p[0], SHUT_WR), ENOTSOCK);
    XFAILS(exs_shutdown(p[1] + 1000, SHUT_WR), EBADF);
    /* A kernel pair: SHUT_WR, then sends fail with EPIPE and the peer reads the end. */
    XCHECK(exs_shutdown(sv[0], SHUT_WR));
    XFAILS(exs_send(sv[0], buf, 8, 0, q, NULL, mh), EPIPE);
    XCHECK(exs_recv(sv[1], buf, 8, 0, q, (void *)1, mh));
    exs_event_t ev = expect_event(q, EXS_EVT_RECV, (void *)1);
    EXPECT(ev.exs_evt_result == 0 && (ev.exs_evt_flags & EXS_MSG_EOF));

    /* sendmsg / recvmsg. */
    struct iovec iov[2] = {{buf, 10}, {buf + 100, 20}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    XFAILS(exs_sendmsg(sv[1], NULL, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_recvmsg(sv[1], NULL, 0, q, NULL, mh), EFAULT);
    struct msghdr noiov = {.msg_iov = NULL, .msg_iovlen = 2};
    XFAILS(exs_sendmsg(sv[1], &noiov, 0, q, NULL, mh), EFAULT);
    /* An iovec outside the registration: EFAULT, on a kernel and on an EXS socket. */
    iov[1].iov_base = other;
    XFAILS(exs_sendmsg(sv[1], &m, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_recvmsg(sv[1], &m, 0, q, NULL, mh), EFAULT);
    XFAILS(exs_sendmsg(e, &m, 0, q, NULL, mh), EFAULT);
    iov[1].iov_base = buf + sizeof(buf) - 10; /* straddles its end */
    XFAILS(exs_recvmsg(sv[1], &m, 0, q, NULL, mh), EFAULT);
    iov[1].iov_base = buf + 100;
    /* Too many iovecs: EMSGSIZE. */
    static struct iovec many[EXS_IOV_MAX + 1];
    for (int i = 0; i <= EXS_IOV_MAX; i++) {
        many[i].iov_base = buf + i;
        many[i].iov_len = 1;
    }
    struct msghdr big = {.msg_iov = many, .msg_iovlen = EXS_IOV_MAX + 1};
    XFAILS(exs_sendmsg(sv[1], &big, 0, q, NULL, mh), EMSGSIZE);
    XFAILS(exs_recvmsg(sv[1], &big, 0, q, NULL, mh), EMSGSIZE);
    /* Lengths adding up past SSIZE_MAX: EINVAL. */
    struct iovec huge[2] = {{buf, (size_t)SSIZE_MAX}, {buf, 2}};
    struct msghdr hm = {.msg_iov = huge, .msg_iovlen = 2};
    XFAILS(exs_sendmsg(sv[1], &hm, 0, q, NULL, mh), EINVAL);
    /* Ancillary data, unknown flags, an unknown registration, a socket not connected. */
    char ctl[64];
    struct msghdr cm = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    XFAILS(exs_sendmsg(sv[1], &cm, 0, q, NULL, mh), EOPNOTSUPP);
    XFAILS(exs_sendmsg(sv[1], &m, MSG_OOB, q, NULL, mh), EOPNOTSUPP);
    XFAILS(exs_recvmsg(sv[1], &m, MSG_PEEK, q, NULL, mh), EOPNOTSUPP);
    XFAILS(exs_sendmsg(sv[1], &m, 0, q, NULL, mh + 999), EINVAL);
    XFAILS(exs_sendmsg(e, &m, 0, q, NULL, mh), ENOTCONN);
    XFAILS(exs_recvmsg(e, &m, 0, q, NULL, mh), ENOTCONN);
    XFAILS(exs_sendmsg(sv[1], &m, 0, q + 1000, NULL, mh), EINVAL);
    long r = -1;
    XCHECK(exs_qstatus(q, EXS_QATTR_RESERVED, &r));
    EXPECT(r == 0); /* refused operations give their slot back */
    XCHECK(exs_mderegister(mh)); /* and their registration */
    XCHECK(exs_close(e, EXS_QHANDLE_INVALID, NULL));
    close(k);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
    XCHECK(exs_qdelete(q));
}

int main(void)
{
    watchdog(120);
    srandom((unsigned)getpid());
    before_init();
    XCHECK(exs_init(EXS_VERSION));
    XCHECK(exs_init(EXS_VERSION)); /* again: fine */
    queues();
    registrations();
    sockets();
    fcntls();
    connected();
    kernel_pair(SOCK_STREAM);
    kernel_pair(SOCK_SEQPACKET);
    shutdown_and_msg_errors();
    printf("exs_api: OK\n");
    return 0;
}
