/* EXS between processes: refused connections, a peer that dies (ECONNRESET on its
 * connection, the others unaffected), SEQPACKET messages and STREAM bytes pipelined with
 * many in flight under every tuning that changes the data path (tiny credits and
 * advertisement windows, no receive buffer, busy-polling), every byte checked, over
 * Courier and over kernel sockets; and a hostile peer speaking Courier directly that
 * overdraws its credits, which resets its connection and no other. */
#include "exs_procs.h"

static exs_qhandle_t q;

static struct sockaddr_storage addr;
static socklen_t addrlen;

/* ----- refused ----------------------------------------------------------------------- */

static void refused(enum sock_kind kind)
{
    int k = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(in);
    EXPECT(bind(k, (struct sockaddr *)&in, l) == 0 && getsockname(k, (struct sockaddr *)&in, &l) == 0);
    close(k); /* nothing listens on that port now */
    int fd = kind == OVER_COURIER ? exs_socket(AF_INET, SOCK_STREAM, 0) : socket(AF_INET, SOCK_STREAM, 0);
    XCHECK(fd);
    XCHECK(exs_connect(fd, (struct sockaddr *)&in, l, q, (void *)1));
    exs_event_t e = next_event(q);
    EXPECT(e.exs_evt_type == EXS_EVT_CONNECT && e.exs_evt_ahandle == (void *)1);
    EXPECT(e.exs_evt_result == -ECONNREFUSED && e.exs_evt_errno == ECONNREFUSED);
    XCHECK(exs_close(fd, EXS_QHANDLE_INVALID, NULL));
    printf("exs_peers: refused (%s): OK\n", kind_name(kind));
}

/* ----- a peer dies ------------------------------------------------------------------- */

static int sock_type;

static int doomed(void *arg)
{
    (void)arg;
    exs_qhandle_t cq = child_init();
    int fd = exs_socket(AF_INET, sock_type, 0);
    XCHECK(exs_connect(fd, (struct sockaddr *)&addr, addrlen, cq, NULL));
    expect_event(cq, EXS_EVT_CONNECT, NULL);
    static char m[16] = "doomed";
    exs_mhandle_t mh = exs_mregister(m, sizeof(m), 0);
    XCHECK(exs_send(fd, m, sizeof(m), 0, cq, NULL, mh));
    expect_event(cq, EXS_EVT_SEND, NULL);
    for (;;)
        pause(); /* until SIGKILL */
}

static int echoer(void *arg)
{
    (void)arg;
    exs_qhandle_t cq = child_init();
    int fd = exs_socket(AF_INET, sock_type, 0);
    XCHECK(exs_connect(fd, (struct sockaddr *)&addr, addrlen, cq, NULL));
    expect_event(cq, EXS_EVT_CONNECT, NULL);
    static unsigned char b[1 << 16];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    for (;;) {
        XCHECK(exs_recv(fd, b, sizeof(b), 0, cq, NULL, mh));
        exs_event_t e = expect_event(cq, EXS_EVT_RECV, NULL);
        if (e.exs_evt_result == 0)
            break;
        XCHECK(exs_send(fd, b, (size_t)e.exs_evt_result, 0, cq, NULL, mh));
        expect_event(cq, EXS_EVT_SEND, NULL);
    }
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    return 0;
}

static int accept_one(int lfd)
{
    XCHECK(exs_accept(lfd, NULL, NULL, q, (void *)77));
    return (int)expect_event(q, EXS_EVT_ACCEPT, (void *)77).exs_evt_result;
}

static void death(int type)
{
    sock_type = type;
    int lfd = listen_socket(OVER_COURIER, type, &addr, &addrlen);
    static unsigned char b[1 << 16];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    pid_t a = spawn(doomed, NULL);
    int fa = accept_one(lfd);
    XCHECK(exs_recv(fa, b, 16, MSG_WAITALL, q, (void *)1, mh));
    EXPECT(expect_event(q, EXS_EVT_RECV, (void *)1).exs_evt_result == 16 && strcmp((char *)b, "doomed") == 0);
    pid_t e = spawn(echoer, NULL);
    int fe = accept_one(lfd);
    XCHECK(exs_recv(fa, b, 100, 0, q, (void *)2, mh));
    EXPECT(kill(a, SIGKILL) == 0);
    EXPECT(waitpid(a, NULL, 0) == a);
    exs_event_t ev = next_event(q);
    EXPECT(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_ahandle == (void *)2);
    EXPECT(ev.exs_evt_result == -ECONNRESET && ev.exs_evt_errno == ECONNRESET);
    XFAILS(exs_send(fa, b, 10, 0, q, NULL, mh), ECONNRESET);
    int err = 0;
    socklen_t l = sizeof(err);
    XCHECK(exs_getsockopt(fa, SOL_SOCKET, SO_ERROR, &err, &l));
    EXPECT(err == ECONNRESET);
    /* The other connection goes on. */
    fill(b, 1000, 42);
    XCHECK(exs_recv(fe, b + 2000, 1000, MSG_WAITALL, q, (void *)3, mh));
    XCHECK(exs_send(fe, b, 1000, 0, q, (void *)4, mh));
    for (int seen = 0; seen != 3;) {
        exs_event_t x = next_event(q);
        EXPECT(x.exs_evt_result == 1000);
        seen |= x.exs_evt_ahandle == (void *)4 ? 1 : 2;
    }
    EXPECT(verify(b + 2000, 1000, 42));
    XCHECK(exs_close(fa, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_close(fe, q, (void *)5));
    expect_event(q, EXS_EVT_CLOSE, (void *)5);
    EXPECT(child_status(e) == 0);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    printf("exs_peers: peer death (%s): OK\n", type == SOCK_STREAM ? "stream" : "seqpacket");
}

/* ----- pipelined data under every tuning ------------------------------------------------ */

struct tuning {
    const char *name;
    enum sock_kind kind;
    int busy;
    long small_max, adv, slots, rcvbuf, no_rcvbuf;
};

static struct tuning tun;

static void apply(int fd)
{
    if (tun.kind != OVER_COURIER)
        return;
    if (tun.small_max >= 0)
        XCHECK(exs_fcntl(fd, EXS_F_SMALL_MAX, tun.small_max));
    if (tun.adv > 0)
        XCHECK(exs_fcntl(fd, EXS_F_ADV_CREDITS, tun.adv));
    if (tun.slots > 0)
        XCHECK(exs_fcntl(fd, EXS_F_SMALL_SLOTS, tun.slots));
    if (tun.rcvbuf > 0)
        XCHECK(exs_fcntl(fd, EXS_F_RCVBUF, tun.rcvbuf));
    if (tun.no_rcvbuf)
        XCHECK(exs_fcntl(fd, EXS_F_NO_RCVBUF, 1));
}

#define NMSG 240
#define SLOT 300000
static const size_t msizes[] = {0, 1, 100, 8192, 8193, 40000, 300000};

static size_t msize(int i)
{
    /* A kernel Unix SEQPACKET message must fit the socket buffer. */
    size_t s = msizes[i % 7];
    return tun.kind == OVER_KERNEL && s > 40000 ? 40000 : s;
}

#define TOTAL (2u * 1000u * 1000u + 3u)

static unsigned lcg(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8);
}

/* The sending side: SEQPACKET messages or STREAM pieces, 8 in flight. */
static int sender(void *arg)
{
    (void)arg;
    exs_qhandle_t cq = child_init();
    XCHECK(exs_fcntl(-1, EXS_F_BUSY_POLL, tun.busy));
    int fd = client_socket(tun.kind, sock_type, &addr);
    apply(fd);
    XCHECK(exs_connect(fd, (struct sockaddr *)&addr, addrlen, cq, NULL));
    expect_event(cq, EXS_EVT_CONNECT, NULL);
    size_t cap = sock_type == SOCK_STREAM ? TOTAL : 8u * SLOT;
    unsigned char *out = malloc(cap);
    exs_mhandle_t mh = exs_mregister(out, cap, 0);
    EXPECT(out && mh != EXS_MHANDLE_INVALID);
    int inflight = 0;
    if (sock_type == SOCK_SEQPACKET) {
        int slots[8] = {0, 1, 2, 3, 4, 5, 6, 7}, nfree = 8;
        for (int i = 0; i < NMSG || inflight > 0;) {
            while (i < NMSG && nfree > 0) {
                int s = slots[--nfree];
                fill(out + (size_t)s * SLOT, msize(i), (unsigned)i);
                int r = exs_send(fd, out + (size_t)s * SLOT, msize(i), 0, cq, (void *)(uintptr_t)s, mh);
                if (r < 0 && errno == EAGAIN) {
                    nfree++;
                    break; /* the peer's credits and advertisements are used up: wait */
                }
                XCHECK(r);
                inflight++;
                i++;
            }
            exs_event_t e = next_event(cq);
            EXPECT(e.exs_evt_type == EXS_EVT_SEND && e.exs_evt_result >= 0);
            slots[nfree++] = (int)(uintptr_t)e.exs_evt_ahandle;
            inflight--;
        }
    } else {
        fill(out, TOTAL, 77);
        unsigned seed = 1;
        size_t sent = 0;
        while (sent < TOTAL || inflight > 0) {
            while (sent < TOTAL && inflight < 8) {
                size_t n = 1 + lcg(&seed) % 70000;
                if (n > TOTAL - sent)
                    n = TOTAL - sent;
                XCHECK(exs_send(fd, out + sent, n, 0, cq, NULL, mh));
                sent += n;
                inflight++;
            }
            exs_event_t e = next_event(cq);
            EXPECT(e.exs_evt_type == EXS_EVT_SEND && e.exs_evt_result > 0);
            inflight--;
        }
    }
    /* SEQPACKET: the receiver's one-byte acknowledgement, then close. STREAM: close now (a
     * MSG_WAITALL receive at the end completes with the end of the stream). */
    if (sock_type == SOCK_SEQPACKET) {
        XCHECK(exs_recv(fd, out, 1, 0, cq, (void *)9, mh));
        EXPECT(expect_event(cq, EXS_EVT_RECV, (void *)9).exs_evt_result == 1);
    }
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    return 0;
}

static void pipelined(int type, struct tuning t)
{
    const char *only = getenv("EXS_PEERS_ONLY"); /* run one case: "<type> <name>" */
    char me[128];
    snprintf(me, sizeof(me), "%s %s", type == SOCK_STREAM ? "stream" : "seqpacket", t.name);
    if (only && strcmp(only, me) != 0)
        return;
    tun = t;
    sock_type = type;
    XCHECK(exs_fcntl(-1, EXS_F_BUSY_POLL, t.busy));
    int lfd = listen_socket(t.kind, type, &addr, &addrlen);
    apply(lfd);
    pid_t child = spawn(sender, NULL);
    int fd = accept_one(lfd);
    enum { RING = 6 };
    size_t slot = type == SOCK_STREAM ? 100000 : SLOT;
    unsigned char *ring = malloc(RING * slot), *in = malloc(TOTAL);
    exs_mhandle_t mh = exs_mregister(ring, RING * slot, 0);
    EXPECT(ring && in && mh != EXS_MHANDLE_INVALID);
    unsigned seed = 7;
    size_t got = 0, posted = 0;
    int received = 0, pending = 0;
    int target = type == SOCK_STREAM ? -1 : NMSG;
    /* ahandle: ring slot; STREAM: the size asked and whether WAITALL, to check the result. */
    size_t asked[RING];
    int waitall[RING];
    for (int s = 0; s < RING; s++) {
        size_t n = type == SOCK_STREAM ? 1 + lcg(&seed) % 100000 : slot;
        waitall[s] = type == SOCK_STREAM && s % 3 == 0;
        asked[s] = n;
        XCHECK(exs_recv(fd, ring + (size_t)s * slot, n, waitall[s] ? MSG_WAITALL : 0, q, (void *)(uintptr_t)s, mh));
        pending++;
        posted++;
    }
    for (;;) {
        if (type == SOCK_STREAM ? got == TOTAL : received == target)
            break;
        exs_event_t e = next_event(q);
        EXPECT(e.exs_evt_type == EXS_EVT_RECV && e.exs_evt_result >= 0);
        int s = (int)(uintptr_t)e.exs_evt_ahandle;
        pending--;
        if (type == SOCK_SEQPACKET) {
            EXPECT((size_t)e.exs_evt_result == msize(received) && e.exs_evt_flags == 0);
            EXPECT(verify(ring + (size_t)s * slot, msize(received), (unsigned)received));
            received++;
        } else {
            size_t n = (size_t)e.exs_evt_result;
            EXPECT(n > 0 && n <= asked[s] && (!waitall[s] || n == asked[s] || got + n == TOTAL));
            memcpy(in + got, ring + (size_t)s * slot, n);
            got += n;
        }
        if (type == SOCK_SEQPACKET ? posted < NMSG : 1) {
            size_t n = type == SOCK_STREAM ? 1 + lcg(&seed) % 100000 : slot;
            waitall[s] = type == SOCK_STREAM && (posted % 3 == 0);
            asked[s] = n;
            XCHECK(exs_recv(fd, ring + (size_t)s * slot, n, waitall[s] ? MSG_WAITALL : 0, q, (void *)(uintptr_t)s, mh));
            pending++;
            posted++;
        }
    }
    if (type == SOCK_STREAM) {
        unsigned char *expect = malloc(TOTAL);
        fill(expect, TOTAL, 77);
        EXPECT(memcmp(in, expect, TOTAL) == 0);
        free(expect);
    }
    /* SEQPACKET: acknowledge; the sender closes; the receives still posted end with 0. */
    static unsigned char one = 1;
    exs_mhandle_t m1 = exs_mregister(&one, 1, 0);
    int sent = type == SOCK_STREAM;
    if (!sent)
        XCHECK(exs_send(fd, &one, 1, 0, q, (void *)100, m1));
    while (pending > 0 || !sent) {
        exs_event_t e = next_event(q);
        if (e.exs_evt_type == EXS_EVT_SEND) {
            EXPECT(e.exs_evt_result == 1);
            sent = 1;
            continue;
        }
        EXPECT(e.exs_evt_type == EXS_EVT_RECV && e.exs_evt_result == 0);
        pending--;
    }
    XCHECK(exs_close(fd, q, (void *)101));
    expect_event(q, EXS_EVT_CLOSE, (void *)101);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    EXPECT(child_status(child) == 0);
    XCHECK(exs_mderegister(mh));
    XCHECK(exs_mderegister(m1));
    free(ring);
    free(in);
    XCHECK(exs_fcntl(-1, EXS_F_BUSY_POLL, 0));
    printf("exs_peers: %s %s (%s): OK\n", type == SOCK_STREAM ? "stream" : "seqpacket", t.name,
           kind_name(t.kind));
}

/* ----- shutdown ---------------------------------------------------------------------------- */

/* Pipes between the two processes for the steps the test orders (never for data). */
static int c2p[2], p2c[2];
static enum sock_kind sh_kind;

static void tell(int fd, char c) { write_all(fd, &c, 1); }
static void await_byte(int fd, char want)
{
    char c = 0;
    read_all(fd, &c, 1);
    EXPECT(c == want);
}

/* The child of a case ordered by the pipes: its ends of them, its own library and queue
 * (*cq), and its connection to the listener at addr, of sh_kind and sock_type. */
static int paired_connect(exs_qhandle_t *cq)
{
    watchdog(120);
    close(c2p[0]); /* so that a parent gone is an end of file here */
    close(p2c[1]);
    *cq = child_init();
    int fd = client_socket(sh_kind, sock_type, &addr);
    XCHECK(exs_connect(fd, (struct sockaddr *)&addr, addrlen, *cq, NULL));
    expect_event(*cq, EXS_EVT_CONNECT, NULL);
    return fd;
}

/* The parent's end: the connection closed, the child's success, the listener, the
 * registration and the pipes gone. */
static void paired_end(int fd, int lfd, pid_t child, exs_mhandle_t mh)
{
    XCHECK(exs_close(fd, q, (void *)8));
    expect_event(q, EXS_EVT_CLOSE, (void *)8);
    EXPECT(child_status(child) == 0);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    close(c2p[0]);
    close(p2c[1]);
}

/* The parent's side: the pipes, a listener (*lfd), the child `fn` started (*child), and
 * its connection accepted, over the transport expected. */
static int paired_accept(enum sock_kind kind, int type, int (*fn)(void *), pid_t *child, int *lfd)
{
    sh_kind = kind;
    sock_type = type;
    EXPECT(pipe(c2p) == 0 && pipe(p2c) == 0);
    *lfd = listen_socket(kind, type, &addr, &addrlen);
    *child = spawn(fn, NULL);
    close(c2p[1]);
    close(p2c[0]);
    int fd = accept_one(*lfd);
    char t[16];
    EXPECT(strcmp(transport_of(fd, t, sizeof(t)), expected_transport(kind)) == 0);
    return fd;
}

/* Sizes of the three sends made before SHUT_WR: one eager, one too big for that (it
 * waits for the receiver's advertisement, posted only after the shutdown), one inline. */
static size_t sh_size(int i)
{
    static const size_t courier[] = {5000, 200000, 10}, kernel[] = {5000, 40000, 10};
    return sh_kind == OVER_COURIER ? courier[i] : kernel[i];
}

static int shut_child(void *arg)
{
    (void)arg;
    exs_qhandle_t cq;
    int fd = paired_connect(&cq);
    static unsigned char b[300000];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        fill(b + off, sh_size(i), 100u + (unsigned)i);
        XCHECK(exs_send(fd, b + off, sh_size(i), 0, cq, (void *)(uintptr_t)(i + 1), mh));
        off += sh_size(i);
    }
    /* At once, with the sends still waiting: the end of the stream goes after them. */
    XCHECK(exs_shutdown(fd, SHUT_WR));
    XCHECK(exs_shutdown(fd, SHUT_WR)); /* again: no error */
    XFAILS(exs_send(fd, b, 10, 0, cq, NULL, mh), EPIPE);
    tell(c2p[1], 'w');
    for (int i = 0; i < 3; i++) {
        exs_event_t e = next_event(cq);
        EXPECT(e.exs_evt_type == EXS_EVT_SEND && e.exs_evt_result == (ssize_t)sh_size((int)(uintptr_t)e.exs_evt_ahandle - 1));
    }
    /* Half closed: we still receive. */
    XCHECK(exs_recv(fd, b, 100, 0, cq, (void *)10, mh));
    exs_event_t e = expect_event(cq, EXS_EVT_RECV, (void *)10);
    EXPECT(e.exs_evt_result == 9 && memcmp(b, "half open", 9) == 0 && !(e.exs_evt_flags & EXS_MSG_EOF));
    /* SHUT_RD with a receive pending: it completes with the end, and so does a new one. */
    XCHECK(exs_recv(fd, b, 100, 0, cq, (void *)11, mh));
    XCHECK(exs_shutdown(fd, SHUT_RD));
    e = next_event(cq);
    EXPECT(e.exs_evt_type == EXS_EVT_RECV && e.exs_evt_ahandle == (void *)11 && e.exs_evt_result == 0);
    EXPECT(e.exs_evt_flags & EXS_MSG_EOF);
    XCHECK(exs_recv(fd, b, 100, 0, cq, (void *)12, mh));
    e = expect_event(cq, EXS_EVT_RECV, (void *)12);
    EXPECT(e.exs_evt_result == 0 && (e.exs_evt_flags & EXS_MSG_EOF));
    tell(c2p[1], 'r');
    await_byte(p2c[0], 'c');
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    return 0;
}

static void shutdown_case(enum sock_kind kind, int type)
{
    pid_t child;
    int lfd, fd = paired_accept(kind, type, shut_child, &child, &lfd);
    static unsigned char b[800000];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    /* Receives posted only once the peer has shut its writing side down. */
    await_byte(c2p[0], 'w');
    size_t total = sh_size(0) + sh_size(1) + sh_size(2);
    if (type == SOCK_STREAM) {
        XCHECK(exs_recv(fd, b, total + 1000, MSG_WAITALL, q, (void *)1, mh));
        exs_event_t e = expect_event(q, EXS_EVT_RECV, (void *)1);
        /* WAITALL ends short at the end of the stream, with everything sent before it. */
        EXPECT((size_t)e.exs_evt_result == total && (e.exs_evt_flags & EXS_MSG_EOF));
    } else {
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            XCHECK(exs_recv(fd, b + off, 250000, 0, q, (void *)(uintptr_t)(i + 1), mh));
            off += 250000;
        }
        for (int i = 0; i < 3; i++) {
            exs_event_t e = expect_event(q, EXS_EVT_RECV, (void *)(uintptr_t)(i + 1));
            EXPECT((size_t)e.exs_evt_result == sh_size(i) && !(e.exs_evt_flags & (EXS_MSG_EOF | MSG_TRUNC)));
        }
    }
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        unsigned char *at = type == SOCK_STREAM ? b + off : b + (size_t)i * 250000;
        EXPECT(verify(at, sh_size(i), 100u + (unsigned)i));
        off += sh_size(i);
    }
    /* After the end: 0 and EXS_MSG_EOF, again and again. */
    for (int i = 0; i < 2; i++) {
        XCHECK(exs_recv(fd, b, 100, 0, q, (void *)5, mh));
        exs_event_t e = expect_event(q, EXS_EVT_RECV, (void *)5);
        EXPECT(e.exs_evt_result == 0 && (e.exs_evt_flags & EXS_MSG_EOF));
    }
    /* Our side still sends. */
    memcpy(b, "half open", 9);
    XCHECK(exs_send(fd, b, 9, 0, q, (void *)6, mh));
    EXPECT(expect_event(q, EXS_EVT_SEND, (void *)6).exs_evt_result == 9);
    /* The peer shut reading down: our sends fail with EPIPE (over Courier, as on a Unix
     * socket, at the call; a kernel Unix socket says it in the event; kernel TCP takes
     * them). */
    await_byte(c2p[0], 'r');
    if (kind == OVER_COURIER) {
        XFAILS(exs_send(fd, b, 9, 0, q, NULL, mh), EPIPE);
    } else if (type == SOCK_SEQPACKET) {
        XCHECK(exs_send(fd, b, 9, 0, q, (void *)7, mh));
        exs_event_t e = next_event(q);
        EXPECT(e.exs_evt_ahandle == (void *)7 && e.exs_evt_result == -EPIPE);
    }
    /* Errors: a bad how; not connected (a listener). */
    XFAILS(exs_shutdown(fd, 7), EINVAL);
    XFAILS(exs_shutdown(fd, -1), EINVAL);
    if (kind == OVER_COURIER) /* (Linux takes SHUT_WR on a listening TCP socket) */
        XFAILS(exs_shutdown(lfd, SHUT_WR), ENOTCONN);
    tell(p2c[1], 'c');
    paired_end(fd, lfd, child, mh);
    printf("exs_peers: shutdown %s (%s): OK\n", type == SOCK_STREAM ? "stream" : "seqpacket", kind_name(kind));
}

/* ----- exs_sendmsg / exs_recvmsg ------------------------------------------------------------ */

/* Four messages, each sent from uneven iovecs with gaps between them, received into other
 * uneven iovecs: a SEQPACKET one longer than its receive (MSG_TRUNC), a big one into one
 * buffer, a tiny one (copied at the call). Sizes: [message][iovec], 0-terminated; -1 ends. */
#define NM 4
static const size_t snd_courier[NM][7] = {{1, 7, 3000, 0, 30013, 2, (size_t)-1},
                                          {5000, 11, 14989, (size_t)-1},
                                          {100000, 3, 199997, (size_t)-1},
                                          {3, 4, (size_t)-1}};
static const size_t snd_kernel[NM][7] = {{1, 7, 3000, 0, 30013, 2, (size_t)-1},
                                         {5000, 11, 14989, (size_t)-1},
                                         {10000, 3, 19997, (size_t)-1},
                                         {3, 4, (size_t)-1}};
/* Receives: SEQPACKET and STREAM differ for message 1 (truncated / all of it). */
static const size_t rcv_seq[NM][7] = {{100, 5, 40000, 17, (size_t)-1},
                                      {300, 700, (size_t)-1},
                                      {310000, (size_t)-1},
                                      {2, 5, (size_t)-1}};
static const size_t rcv_str[NM][7] = {{100, 5, 32901, 17, (size_t)-1},
                                      {12000, 8000, (size_t)-1},
                                      {0, (size_t)-1}, /* filled in: the message's total */
                                      {2, 5, (size_t)-1}};

static size_t msg_total(const size_t *lens)
{
    size_t t = 0;
    for (int i = 0; lens[i] != (size_t)-1; i++)
        t += lens[i];
    return t;
}

/* iovecs of `lens` laid out from *at in `base`, 64 bytes apart; returns their count. */
static int lay_out(struct iovec *iov, unsigned char *base, size_t *at, const size_t *lens)
{
    int n = 0;
    for (; lens[n] != (size_t)-1; n++) {
        iov[n].iov_base = base + *at;
        iov[n].iov_len = lens[n];
        *at += lens[n] + 64;
    }
    return n;
}

static const size_t (*snd_sizes(void))[7] { return sh_kind == OVER_COURIER ? snd_courier : snd_kernel; }

static int msg_child(void *arg)
{
    (void)arg;
    exs_qhandle_t cq;
    int fd = paired_connect(&cq);
    static unsigned char b[1 << 20];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    static struct iovec iov[NM][8];
    static struct msghdr m[NM];
    size_t at = 0;
    for (int k = 0; k < NM; k++) {
        const size_t *lens = snd_sizes()[k];
        size_t total = msg_total(lens);
        unsigned char *want = malloc(total + 1);
        fill(want, total, 300u + (unsigned)k);
        int n = lay_out(iov[k], b, &at, lens);
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            memcpy(iov[k][i].iov_base, want + off, iov[k][i].iov_len);
            off += iov[k][i].iov_len;
        }
        free(want);
        memset(&m[k], 0, sizeof(m[k]));
        m[k].msg_iov = iov[k];
        m[k].msg_iovlen = (size_t)n;
        XCHECK(exs_sendmsg(fd, &m[k], 0, cq, (void *)(uintptr_t)(k + 1), mh));
    }
    for (int k = 0; k < NM; k++) {
        exs_event_t e = next_event(cq);
        int i = (int)(uintptr_t)e.exs_evt_ahandle - 1;
        EXPECT(e.exs_evt_type == EXS_EVT_SENDMSG && i >= 0 && i < NM && e.exs_evt_buf == &m[i]);
        EXPECT((size_t)e.exs_evt_result == msg_total(snd_sizes()[i]) && e.exs_evt_len == (size_t)e.exs_evt_result);
    }
    await_byte(p2c[0], 'c');
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    return 0;
}

static void msg_case(enum sock_kind kind, int type)
{
    pid_t child;
    int lfd, fd = paired_accept(kind, type, msg_child, &child, &lfd);
    static unsigned char b[1 << 20];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    static struct iovec iov[NM][8];
    static struct msghdr m[NM];
    size_t at = 0;
    for (int k = 0; k < NM; k++) {
        size_t lens[7];
        memcpy(lens, type == SOCK_SEQPACKET ? rcv_seq[k] : rcv_str[k], sizeof(lens));
        if (type == SOCK_STREAM && k == 2)
            lens[0] = msg_total(snd_sizes()[2]);
        int n = lay_out(iov[k], b, &at, lens);
        memset(&m[k], 0, sizeof(m[k]));
        m[k].msg_iov = iov[k];
        m[k].msg_iovlen = (size_t)n;
        m[k].msg_flags = -1; /* written at completion */
        XCHECK(exs_recvmsg(fd, &m[k], type == SOCK_STREAM ? MSG_WAITALL : 0, q, (void *)(uintptr_t)(k + 1), mh));
    }
    for (int k = 0; k < NM; k++) {
        exs_event_t e = expect_event(q, EXS_EVT_RECVMSG, (void *)(uintptr_t)(k + 1));
        size_t sent = msg_total(snd_sizes()[k]), room = 0;
        for (size_t i = 0; i < m[k].msg_iovlen; i++)
            room += iov[k][i].iov_len;
        size_t want = sent < room ? sent : room;
        int trunc = type == SOCK_SEQPACKET && sent > room;
        EXPECT(e.exs_evt_buf == &m[k] && e.exs_evt_len == room);
        EXPECT((size_t)e.exs_evt_result == want);
        EXPECT(!!(e.exs_evt_flags & MSG_TRUNC) == trunc && !!(m[k].msg_flags & MSG_TRUNC) == trunc);
        EXPECT(!(m[k].msg_flags & EXS_MSG_EOF));
        EXPECT(trunc == (k == 1 && type == SOCK_SEQPACKET)); /* the plan truncates one */
        /* Gathered back in order: the sender's pattern. */
        unsigned char *got = malloc(want + 1);
        size_t off = 0;
        for (size_t i = 0; i < m[k].msg_iovlen && off < want; i++) {
            size_t c = iov[k][i].iov_len < want - off ? iov[k][i].iov_len : want - off;
            memcpy(got + off, iov[k][i].iov_base, c);
            off += c;
        }
        EXPECT(verify(got, want, 300u + (unsigned)k));
        free(got);
    }
    tell(p2c[1], 'c');
    /* The sender closed: a receive after it sees the end. */
    struct iovec one = {b, 10};
    struct msghdr end = {.msg_iov = &one, .msg_iovlen = 1};
    XCHECK(exs_recvmsg(fd, &end, 0, q, (void *)9, mh));
    exs_event_t e = expect_event(q, EXS_EVT_RECVMSG, (void *)9);
    EXPECT(e.exs_evt_result == 0 && (e.exs_evt_flags & EXS_MSG_EOF) && (end.msg_flags & EXS_MSG_EOF));
    paired_end(fd, lfd, child, mh);
    printf("exs_peers: sendmsg/recvmsg %s (%s): OK\n", type == SOCK_STREAM ? "stream" : "seqpacket", kind_name(kind));
}

/* ----- zero-length SEQPACKET receives --------------------------------------------------------- */

/* A zero-length receive with no buffer and no registration (exs_recv(fd, NULL, 0, ...,
 * EXS_MHANDLE_INVALID), or exs_recvmsg over empty iovecs) takes the next message whole,
 * places nothing, and completes with 0 and MSG_TRUNC, as recvmsg(2) on a SEQPACKET socket
 * does; the connection goes on. Messages 0-3 are taken by zero-length receives, big ones
 * (over Courier: placed directly, into an advertisement of 0 bytes) and small ones
 * (eager); message 4 arrives whole in an ordinary receive; message 5, sent right before
 * the sender closes, is taken by one more (not the end), and then the end. */
#define NZ 5
static size_t zero_size(int i)
{
    static const size_t courier[NZ] = {100000, 100, 7, 200000, 50000}, kernel[NZ] = {40000, 100, 7, 30000, 20000};
    return sh_kind == OVER_COURIER ? courier[i] : kernel[i];
}

static int zero_child(void *arg)
{
    (void)arg;
    exs_qhandle_t cq;
    int fd = paired_connect(&cq);
    static unsigned char b[NZ * 200000];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    await_byte(p2c[0], 'g'); /* every receive is posted (over Courier: advertised) */
    for (int i = 0; i < NZ; i++) {
        unsigned char *at = b + (size_t)i * 200000;
        fill(at, zero_size(i), 500u + (unsigned)i);
        XCHECK(exs_send(fd, at, zero_size(i), 0, cq, (void *)(uintptr_t)(i + 1), mh));
    }
    for (int i = 0; i < NZ; i++) {
        exs_event_t e = next_event(cq);
        int k = (int)(uintptr_t)e.exs_evt_ahandle - 1;
        EXPECT(e.exs_evt_type == EXS_EVT_SEND && k >= 0 && k < NZ && (size_t)e.exs_evt_result == zero_size(k));
    }
    /* A last small message, then the end: the receiver takes the message only after. */
    await_byte(p2c[0], 'c');
    fill(b, 10, 505u);
    XCHECK(exs_send(fd, b, 10, 0, cq, (void *)9, mh));
    EXPECT(expect_event(cq, EXS_EVT_SEND, (void *)9).exs_evt_result == 10);
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    tell(c2p[1], 'x');
    return 0;
}

static void zero_case(enum sock_kind kind)
{
    pid_t child;
    int lfd, fd = paired_accept(kind, SOCK_SEQPACKET, zero_child, &child, &lfd);
    static unsigned char b[300000];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    /* Empty iovecs: none at all, one NULL, two of which one points into b. */
    static unsigned char spare[4];
    struct iovec none_iov[2] = {{NULL, 0}, {spare, 0}};
    struct msghdr m1 = {.msg_iov = NULL, .msg_iovlen = 0, .msg_flags = -1};
    struct msghdr m3 = {.msg_iov = none_iov, .msg_iovlen = 2, .msg_flags = -1};
    XCHECK(exs_recv(fd, NULL, 0, 0, q, (void *)1, EXS_MHANDLE_INVALID));
    XCHECK(exs_recvmsg(fd, &m1, 0, q, (void *)2, EXS_MHANDLE_INVALID));
    XCHECK(exs_recv(fd, NULL, 0, 0, q, (void *)3, EXS_MHANDLE_INVALID));
    XCHECK(exs_recvmsg(fd, &m3, 0, q, (void *)4, EXS_MHANDLE_INVALID));
    memset(b, 0xee, sizeof(b));
    XCHECK(exs_recv(fd, b, sizeof(b), 0, q, (void *)5, mh));
    tell(p2c[1], 'g');
    for (int k = 0; k < 4; k++) {
        exs_event_t e = expect_event(q, k % 2 ? EXS_EVT_RECVMSG : EXS_EVT_RECV, (void *)(uintptr_t)(k + 1));
        if (e.exs_evt_result != 0 || !(e.exs_evt_flags & MSG_TRUNC) || (e.exs_evt_flags & EXS_MSG_EOF))
            fprintf(stderr, "zero-length receive %d: result %zd flags %#x\n", k, e.exs_evt_result, e.exs_evt_flags);
        EXPECT(e.exs_evt_result == 0 && e.exs_evt_len == 0);
        EXPECT((e.exs_evt_flags & MSG_TRUNC) && !(e.exs_evt_flags & EXS_MSG_EOF));
        if (k % 2) {
            struct msghdr *m = k == 1 ? &m1 : &m3;
            EXPECT(e.exs_evt_buf == m && (m->msg_flags & MSG_TRUNC) && !(m->msg_flags & EXS_MSG_EOF));
        }
    }
    EXPECT(spare[0] == 0 && spare[3] == 0); /* nothing placed */
    /* The next message arrives whole, and nothing else (a message lost or taken twice
     * would show here). */
    exs_event_t e = expect_event(q, EXS_EVT_RECV, (void *)5);
    EXPECT((size_t)e.exs_evt_result == zero_size(4) && !(e.exs_evt_flags & (MSG_TRUNC | EXS_MSG_EOF)));
    EXPECT(verify(b, zero_size(4), 504u));
    EXPECT(b[zero_size(4)] == 0xee);
    /* The sender sends one more and closes: a zero-length receive takes that message
     * (which is not the end, though nothing follows it), the next one sees the end. */
    tell(p2c[1], 'c');
    await_byte(c2p[0], 'x');
    XCHECK(exs_recv(fd, NULL, 0, 0, q, (void *)6, EXS_MHANDLE_INVALID));
    e = expect_event(q, EXS_EVT_RECV, (void *)6);
    EXPECT(e.exs_evt_result == 0 && (e.exs_evt_flags & MSG_TRUNC) && !(e.exs_evt_flags & EXS_MSG_EOF));
    XCHECK(exs_recv(fd, NULL, 0, 0, q, (void *)7, EXS_MHANDLE_INVALID));
    e = expect_event(q, EXS_EVT_RECV, (void *)7);
    EXPECT(e.exs_evt_result == 0 && (e.exs_evt_flags & EXS_MSG_EOF) && !(e.exs_evt_flags & MSG_TRUNC));
    paired_end(fd, lfd, child, mh);
    printf("exs_peers: zero-length seqpacket receives (%s): OK\n", kind_name(kind));
}

/* ----- a hostile peer ---------------------------------------------------------------------- */

static unsigned char hello_hdr[256];
static size_t hello_len;

static courier_status_t on_am(const courier_am_recv_param_t *p, void *user)
{
    (void)user;
    if (p->header_length <= sizeof(hello_hdr) && hello_len == 0) {
        memcpy(hello_hdr, p->header, p->header_length);
        hello_len = p->header_length;
    }
    return COURIER_OK;
}

static void put32(unsigned char *b, uint32_t v) { memcpy(b, &v, 4); }
static void put64(unsigned char *b, uint64_t v) { memcpy(b, &v, 8); }
static void put16(unsigned char *b, uint16_t v) { memcpy(b, &v, 2); }

/* What the hostile peer sends: `first` eager messages, then (told to go on) `then` more;
 * it writes a byte to `done_fd` after each batch and reads one from `go_fd` before the
 * second. */
struct overdraft {
    const char *name;
    int slots, first, then;
    int done_fd, go_fd;
};

static void send_data(courier_ep_t *e, uint32_t conn, uint32_t gen, uint64_t from, int n)
{
    static const char data[10] = "overdraft";
    courier_request_t *r = NULL;
    for (uint64_t c = from; c < from + (uint64_t)n; c++) {
        unsigned char d[32];
        memset(d, 0, sizeof(d));
        d[0] = 4; /* DATA */
        put32(d + 4, conn);
        put32(d + 8, gen);
        put64(d + 24, c);
        CHECK(finish(courier_ep_am_send(e, 0x4558, d, 32, data, sizeof(data), COURIER_AM_SEND_FLAG_EAGER, NULL, &r), &r));
    }
    CHECK(courier_ep_flush(e));
}

/* Speaks Courier directly: a correct HELLO, then eager data beyond the credits granted. */
static int hostile(void *arg)
{
    const struct overdraft *o = arg;
    courier_context_t *ctx = make_context(COURIER_FEATURE_AM | COURIER_FEATURE_RMA, "hostile");
    courier_worker_t *w = make_worker(ctx);
    CHECK(courier_worker_set_am_handler(w, 0x4558, on_am, NULL));
    char sa[64];
    struct sockaddr_in *in = (struct sockaddr_in *)&addr;
    snprintf(sa, sizeof(sa), "127.0.0.1:%d", ntohs(in->sin_port));
    courier_ep_params_t ep = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR | COURIER_EP_FIELD_CLIENT_ID,
                              .sockaddr = sa, .client_id = 1};
    courier_ep_t *e = NULL;
    CHECK(courier_ep_create(w, &ep, &e));
    while (hello_len == 0)
        courier_worker_progress(w);
    uint32_t srv_conn, srv_gen;
    memcpy(&srv_conn, hello_hdr + 24 + 8, 4);
    memcpy(&srv_gen, hello_hdr + 24 + 12, 4);
    courier_mem_map_params_t mp = {.field_mask = COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS,
                                   .length = 4096, .flags = COURIER_MEM_MAP_FLAG_ALLOCATE};
    courier_mem_t *mem = NULL;
    CHECK(courier_mem_map(ctx, &mp, &mem));
    courier_mem_attr_t at;
    CHECK(courier_mem_query(mem, &at));
    void *key = NULL;
    size_t klen = 0;
    CHECK(courier_rkey_pack(mem, &key, &klen));
    unsigned char h[24 + 42 + 512];
    memset(h, 0, sizeof(h));
    h[0] = 1; /* HELLO */
    put32(h + 4, 0xffffffffu);
    unsigned char *b = h + 24;
    memcpy(b, "EXS1", 4);
    put16(b + 4, 2); /* protocol version */
    put16(b + 6, SOCK_SEQPACKET);
    put32(b + 8, 0);
    put32(b + 12, 1);
    put64(b + 16, 4);
    put32(b + 24, 8192);
    put32(b + 28, 4);
    put64(b + 32, (uint64_t)(uintptr_t)at.address);
    put16(b + 40, (uint16_t)klen);
    memcpy(b + 42, key, klen);
    courier_request_t *r = NULL;
    CHECK(finish(courier_ep_am_send(e, 0x4558, h, 24 + 42 + klen, NULL, 0, 0, NULL, &r), &r));
    send_data(e, srv_conn, srv_gen, 0, o->first);
    write_all(o->done_fd, "x", 1);
    if (o->then > 0) {
        char go;
        read_all(o->go_fd, &go, 1);
        send_data(e, srv_conn, srv_gen, (uint64_t)o->first, o->then);
        write_all(o->done_fd, "x", 1);
    }
    /* Stay until the server has looked (it closes us). */
    for (int i = 0; i < 100000; i++) {
        courier_worker_progress(w);
        if (courier_ep_flush(e) < 0)
            break;
        usleep(200);
    }
    courier_buffer_free(key);
    return 0;
}

/* A peer that sends past the credits it was told of is reset (EPROTO), and every other
 * connection goes on. The server receives nothing while the overdraft is in flight, but
 * in the second plan: one message taken frees a slot, which the peer is not told of (a
 * credit goes back once a quarter of the grant is owed), so the message that takes it is
 * an overdraft too. */
static void hostile_peer(struct overdraft o)
{
    sock_type = SOCK_SEQPACKET;
    int lfd = listen_socket(OVER_COURIER, SOCK_SEQPACKET, &addr, &addrlen);
    XCHECK(exs_fcntl(lfd, EXS_F_SMALL_SLOTS, o.slots));
    int p[2], go[2];
    EXPECT(pipe(p) == 0 && pipe(go) == 0);
    o.done_fd = p[1];
    o.go_fd = go[0];
    pid_t h = spawn(hostile, &o);
    int fh = accept_one(lfd);
    char c;
    read_all(p[0], &c, 1);
    static unsigned char b[64];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    if (o.then > 0) {
        XCHECK(exs_recv(fh, b, sizeof(b), 0, q, (void *)1, mh));
        exs_event_t e = next_event(q);
        EXPECT(e.exs_evt_result == 10 && memcmp(b, "overdraft", 10) == 0);
        write_all(go[1], "x", 1);
        read_all(p[0], &c, 1);
    }
    /* The overdraft resets that connection. Nothing is received until it has: a slot
     * freed and acknowledged meanwhile would have made the last message a fair one. */
    int err = 0;
    for (int i = 0; i < 10000 && err == 0; i++) {
        socklen_t elen = sizeof(err);
        XCHECK(exs_getsockopt(fh, SOL_SOCKET, SO_ERROR, &err, &elen));
        if (err == 0)
            usleep(1000);
    }
    if (err != EPROTO)
        fprintf(stderr, "hostile peer: the connection's error is %s, not EPROTO\n", strerror(err));
    EXPECT(err == EPROTO);
    /* What we post now fails, with EPROTO. */
    errno = 0;
    EXPECT(exs_recv(fh, b, sizeof(b), 0, q, (void *)1, mh) == -1 && errno == EPROTO);
    /* Another peer still connects and talks. */
    sock_type = SOCK_SEQPACKET;
    pid_t e = spawn(echoer, NULL);
    int fe = accept_one(lfd);
    memcpy(b, "honest", 7);
    XCHECK(exs_recv(fe, b + 32, 32, 0, q, (void *)2, mh));
    XCHECK(exs_send(fe, b, 7, 0, q, (void *)3, mh));
    for (int seen = 0; seen != 3;) {
        exs_event_t x = next_event(q);
        EXPECT(x.exs_evt_result == 7);
        seen |= x.exs_evt_ahandle == (void *)3 ? 1 : 2;
    }
    EXPECT(strcmp((char *)b + 32, "honest") == 0);
    XCHECK(exs_close(fe, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_close(fh, EXS_QHANDLE_INVALID, NULL));
    EXPECT(child_status(e) == 0);
    EXPECT(child_status(h) == 0);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    close(p[0]);
    close(p[1]);
    close(go[0]);
    close(go[1]);
    printf("exs_peers: hostile peer, %s: OK\n", o.name);
}

int main(void)
{
    watchdog(300);
    srandom((unsigned)getpid());
    XCHECK(exs_init(EXS_VERSION));
    q = exs_qcreate(64);
    XCHECK(q);
    refused(OVER_COURIER);
    refused(OVER_KERNEL);
    death(SOCK_SEQPACKET);
    death(SOCK_STREAM);
    struct tuning base = {"default", OVER_COURIER, 0, -1, 0, 0, 0, 0};
    struct tuning busy = base, tiny = base, kernel = base, norcv = base, small = base;
    busy.name = "busy-poll";
    busy.busy = 1;
    tiny.name = "one advertisement, one slot, small max 100";
    tiny.adv = 1;
    tiny.slots = 1;
    tiny.small_max = 100;
    kernel.name = "default";
    kernel.kind = OVER_KERNEL;
    norcv.name = "no receive buffer";
    norcv.no_rcvbuf = 1;
    small.name = "1000-byte receive buffer, small max 512, one advertisement";
    small.rcvbuf = 1000;
    small.small_max = 512;
    small.adv = 1;
    struct tuning seq[] = {base, busy, tiny, kernel};
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++)
        pipelined(SOCK_SEQPACKET, seq[i]);
    struct tuning str[] = {base, busy, norcv, small, kernel};
    for (size_t i = 0; i < sizeof(str) / sizeof(str[0]); i++)
        pipelined(SOCK_STREAM, str[i]);
    for (int k = 0; k < 2; k++) {
        shutdown_case(k ? OVER_KERNEL : OVER_COURIER, SOCK_STREAM);
        shutdown_case(k ? OVER_KERNEL : OVER_COURIER, SOCK_SEQPACKET);
        msg_case(k ? OVER_KERNEL : OVER_COURIER, SOCK_STREAM);
        msg_case(k ? OVER_KERNEL : OVER_COURIER, SOCK_SEQPACKET);
        zero_case(k ? OVER_KERNEL : OVER_COURIER);
    }
    hostile_peer((struct overdraft){"three messages where two slots were granted", 2, 3, 0, -1, -1});
    hostile_peer((struct overdraft){"a slot freed but not yet acknowledged", 8, 8, 1, -1, -1});
    XCHECK(exs_qdelete(q));
    printf("exs_peers: OK\n");
    return 0;
}
