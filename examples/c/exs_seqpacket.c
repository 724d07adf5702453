/* EXS SOCK_SEQPACKET: a server and a client in two processes, with an event queue and
 * registered memory, over Courier (shared memory, or tcp with COURIER_TLS=tcp) and then
 * over a kernel Unix SEQPACKET socket through the same calls. The client sends messages of
 * many sizes (small ones go eagerly, large ones straight into the server's advertised
 * buffer); the server echoes each; the client checks every byte of every echo. Then a
 * message longer than the server's buffer arrives truncated (MSG_TRUNC), a record sent in
 * two parts with exs_sendmsg (a header and a body, gathered into one message) is received
 * with exs_recvmsg into two buffers, and the client's close ends the server's receives
 * with 0 (EXS_MSG_EOF). */
#include "exs_common.h"

#define REGION (4u << 20)

static const size_t sizes[] = {1, 0, 100, 8192, 8193, 65536, 1u << 20, 3u << 20};
static enum sock_kind kind;
/* A kernel Unix SEQPACKET message must fit the socket's send buffer (about 200 KiB). */
#define NSIZES (kind == OVER_KERNEL ? 6 : sizeof(sizes) / sizeof(sizes[0]))

static int server(int pipe_fd, pid_t child)
{
    XCHECK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(64);
    XCHECK(q);
    struct sockaddr_storage ss;
    socklen_t sslen;
    int lfd = listen_socket(kind, SOCK_SEQPACKET, &ss, &sslen);
    write_all(pipe_fd, &sslen, sizeof(sslen));
    write_all(pipe_fd, &ss, sizeof(ss));
    close(pipe_fd);

    XCHECK(exs_accept(lfd, NULL, NULL, q, (void *)1));
    int fd = (int)expect_event(q, EXS_EVT_ACCEPT, (void *)1).exs_evt_result;
    char t[16];
    EXPECT(strcmp(transport_of(fd, t, sizeof(t)), expected_transport(kind)) == 0);

    unsigned char *buf = malloc(REGION);
    EXPECT(buf != NULL);
    exs_mhandle_t mh = exs_mregister(buf, REGION, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID);
    for (size_t i = 0; i < NSIZES; i++) {
        XCHECK(exs_recv(fd, buf, REGION, 0, q, (void *)2, mh));
        exs_event_t ev = expect_event(q, EXS_EVT_RECV, (void *)2);
        EXPECT((size_t)ev.exs_evt_result == sizes[i] && ev.exs_evt_flags == 0);
        EXPECT(ev.exs_evt_buf == buf && ev.exs_evt_len == REGION && ev.exs_evt_fd == fd);
        EXPECT(verify(buf, sizes[i], (unsigned)i));
        XCHECK(exs_send(fd, buf, sizes[i], 0, q, (void *)3, mh));
        EXPECT((size_t)expect_event(q, EXS_EVT_SEND, (void *)3).exs_evt_result == sizes[i]);
    }
    /* A 1000-byte message into 10 bytes: the first 10 arrive, the rest is dropped. */
    XCHECK(exs_recv(fd, buf, 10, 0, q, (void *)4, mh));
    exs_event_t ev = expect_event(q, EXS_EVT_RECV, (void *)4);
    EXPECT(ev.exs_evt_result == 10 && (ev.exs_evt_flags & MSG_TRUNC));
    EXPECT(verify(buf, 10, 99));
    /* A record: its header lands at buf, its body at buf + 4096 (both registered). */
    struct iovec parts[2] = {{buf, 8}, {buf + 4096, 5000}};
    struct msghdr rec = {.msg_iov = parts, .msg_iovlen = 2};
    XCHECK(exs_recvmsg(fd, &rec, 0, q, (void *)7, mh));
    ev = expect_event(q, EXS_EVT_RECVMSG, (void *)7);
    uint32_t head[2];
    memcpy(head, buf, sizeof(head));
    EXPECT(ev.exs_evt_result == 8 + 5000 && rec.msg_flags == 0);
    EXPECT(head[0] == 0x45585331 && head[1] == 5000 && verify(buf + 4096, 5000, 7));
    /* The client closes: end of stream. */
    XCHECK(exs_recv(fd, buf, REGION, 0, q, (void *)5, mh));
    ev = expect_event(q, EXS_EVT_RECV, (void *)5);
    EXPECT(ev.exs_evt_result == 0 && (ev.exs_evt_flags & EXS_MSG_EOF));

    XCHECK(exs_close(fd, q, (void *)6));
    expect_event(q, EXS_EVT_CLOSE, (void *)6);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    XCHECK(exs_qdelete(q));
    free(buf);
    return child_status(child);
}

static int client(int pipe_fd)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    read_all(pipe_fd, &sslen, sizeof(sslen));
    read_all(pipe_fd, &ss, sizeof(ss));
    close(pipe_fd);
    XCHECK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(16);
    XCHECK(q);
    int fd = client_socket(kind, SOCK_SEQPACKET, &ss);
    XCHECK(exs_connect(fd, (struct sockaddr *)&ss, sslen, q, (void *)10));
    expect_event(q, EXS_EVT_CONNECT, (void *)10);

    unsigned char *out = malloc(REGION), *in = malloc(REGION);
    EXPECT(out && in);
    exs_mhandle_t mo = exs_mregister(out, REGION, 0), mi = exs_mregister(in, REGION, 0);
    EXPECT(mo != EXS_MHANDLE_INVALID && mi != EXS_MHANDLE_INVALID);
    for (size_t i = 0; i < NSIZES; i++) {
        fill(out, sizes[i], (unsigned)i);
        /* The echo's receive is posted first: it is advertised before the data leaves. */
        XCHECK(exs_recv(fd, in, REGION, 0, q, (void *)11, mi));
        XCHECK(exs_send(fd, out, sizes[i], 0, q, (void *)12, mo));
        int seen = 0;
        while (seen != 3) {
            exs_event_t ev = next_event(q);
            EXPECT(ev.exs_evt_result >= 0);
            if (ev.exs_evt_type == EXS_EVT_SEND) {
                EXPECT(ev.exs_evt_ahandle == (void *)12 && (size_t)ev.exs_evt_result == sizes[i]);
                seen |= 1;
            } else {
                EXPECT(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_ahandle == (void *)11);
                EXPECT((size_t)ev.exs_evt_result == sizes[i]);
                seen |= 2;
            }
        }
        EXPECT(verify(in, sizes[i], (unsigned)i));
    }
    fill(out, 1000, 99);
    XCHECK(exs_send(fd, out, 1000, 0, q, (void *)13, mo));
    EXPECT(expect_event(q, EXS_EVT_SEND, (void *)13).exs_evt_result == 1000);
    /* A header and a body from two places, gathered into one message. */
    uint32_t head[2] = {0x45585331, 5000};
    memcpy(out, head, sizeof(head));
    fill(out + 64, 5000, 7);
    struct iovec parts[2] = {{out, sizeof(head)}, {out + 64, 5000}};
    struct msghdr rec = {.msg_iov = parts, .msg_iovlen = 2};
    XCHECK(exs_sendmsg(fd, &rec, 0, q, (void *)15, mo));
    EXPECT(expect_event(q, EXS_EVT_SENDMSG, (void *)15).exs_evt_result == 5008);
    XCHECK(exs_close(fd, q, (void *)14));
    expect_event(q, EXS_EVT_CLOSE, (void *)14);
    XCHECK(exs_mderegister(mo));
    XCHECK(exs_mderegister(mi));
    free(out);
    free(in);
    return 0;
}

int main(void)
{
    srandom((unsigned)getpid());
    kind = OVER_COURIER;
    int rc = run_two_processes("exs_seqpacket (courier)", 120, server, client);
    if (rc != 0)
        return rc;
    kind = OVER_KERNEL;
    return run_two_processes("exs_seqpacket (kernel)", 120, server, client);
}
