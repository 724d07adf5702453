/* EXS between processes: refused connections, a peer that dies (ECONNRESET on its
 * connection, the others unaffected), SEQPACKET messages and STREAM bytes pipelined with
 * many in flight under every tuning that changes the data path (tiny credits and
 * advertisement windows, no receive buffer, busy-polling), every byte checked, over
 * Courier and over kernel sockets; and a hostile peer speaking Courier directly that
 * overdraws its credits, which resets its connection and no other. */
#include "../../../../examples/c/exs_common.h"

#include <sys/wait.h>

static exs_qhandle_t q;

static pid_t spawn(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0)
        exit(fn(arg));
    return pid;
}

/* A child starts its own library (the parent's is not inherited). */
static exs_qhandle_t child_init(void)
{
    XCHECK(exs_init(EXS_VERSION));
    exs_qhandle_t cq = exs_qcreate(64);
    XCHECK(cq);
    return cq;
}

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

/* Speaks Courier directly: a correct HELLO, then eager data beyond the credits granted. */
static int hostile(void *arg)
{
    int done_fd = *(int *)arg;
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
    put16(b + 4, 1);
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
    /* Three eager messages where the server granted two. */
    static const char data[10] = "overdraft";
    for (uint64_t c = 0; c < 3; c++) {
        unsigned char d[32];
        memset(d, 0, sizeof(d));
        d[0] = 4; /* DATA */
        put32(d + 4, srv_conn);
        put32(d + 8, srv_gen);
        put64(d + 24, c);
        CHECK(finish(courier_ep_am_send(e, 0x4558, d, 32, data, sizeof(data), COURIER_AM_SEND_FLAG_EAGER, NULL, &r), &r));
    }
    CHECK(courier_ep_flush(e));
    write_all(done_fd, "x", 1);
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

static void hostile_peer(void)
{
    sock_type = SOCK_SEQPACKET;
    int lfd = listen_socket(OVER_COURIER, SOCK_SEQPACKET, &addr, &addrlen);
    XCHECK(exs_fcntl(lfd, EXS_F_SMALL_SLOTS, 2));
    int p[2];
    EXPECT(pipe(p) == 0);
    pid_t h = spawn(hostile, &p[1]);
    int fh = accept_one(lfd);
    char c;
    read_all(p[0], &c, 1);
    /* The overdraft resets that connection: what we post now fails, with EPROTO. */
    static unsigned char b[64];
    exs_mhandle_t mh = exs_mregister(b, sizeof(b), 0);
    int r = -1;
    for (int i = 0; i < 3000; i++) {
        errno = 0;
        r = exs_recv(fh, b, sizeof(b), 0, q, (void *)1, mh);
        if (r < 0)
            break;
        /* Delivered before the reset was seen: one of the two granted messages. */
        exs_event_t e = next_event(q);
        if (e.exs_evt_result < 0) {
            EXPECT(e.exs_evt_errno == EPROTO);
            r = -1;
            errno = EPROTO;
            break;
        }
        EXPECT(e.exs_evt_result == 10 && memcmp(b, "overdraft", 10) == 0);
    }
    EXPECT(r == -1 && errno == EPROTO);
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
    printf("exs_peers: hostile peer: OK\n");
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
    hostile_peer();
    XCHECK(exs_qdelete(q));
    printf("exs_peers: OK\n");
    return 0;
}
