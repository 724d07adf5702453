/* EXS SOCK_STREAM: an echo server and a client in two processes, with an event queue and
 * registered memory, over Courier (shared memory, or tcp with COURIER_TLS=tcp) and then
 * over kernel TCP through the same calls. The client streams TOTAL bytes in uneven sends,
 * four in flight, while one MSG_WAITALL receive waits for the whole echo; the server keeps
 * four receives posted, echoes whatever each brings and posts it again when its echo has
 * left. Once its last send is started, the client shuts its writing side down
 * (exs_shutdown SHUT_WR): the server's receives end after every byte (0, EXS_MSG_EOF) while
 * the echo still flows back (a half close). The client checks every byte. */
#include "exs_common.h"

#define TOTAL (3u * 1000u * 1000u + 17u)
#define RING 4
#define PIECE (64u << 10)

static enum sock_kind kind;

static int server(int pipe_fd, pid_t child)
{
    XCHECK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(32);
    XCHECK(q);
    struct sockaddr_storage ss;
    socklen_t sslen;
    int lfd = listen_socket(kind, SOCK_STREAM, &ss, &sslen);
    write_all(pipe_fd, &sslen, sizeof(sslen));
    write_all(pipe_fd, &ss, sizeof(ss));
    close(pipe_fd);

    struct sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    XCHECK(exs_accept(lfd, (struct sockaddr *)&peer, &plen, q, NULL));
    int fd = (int)expect_event(q, EXS_EVT_ACCEPT, NULL).exs_evt_result;
    EXPECT(peer.ss_family == AF_INET && plen == sizeof(struct sockaddr_in));
    char t[16];
    EXPECT(strcmp(transport_of(fd, t, sizeof(t)), expected_transport(kind)) == 0);

    unsigned char *ring = malloc(RING * PIECE);
    EXPECT(ring != NULL);
    exs_mhandle_t mh = exs_mregister(ring, RING * PIECE, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID);
    /* ahandle = slot + 1 for receives, slot + 101 for echoes. */
    for (uintptr_t i = 0; i < RING; i++)
        XCHECK(exs_recv(fd, ring + i * PIECE, PIECE, 0, q, (void *)(i + 1), mh));
    size_t echoed = 0, received = 0;
    int eof = 0;
    while (!eof || echoed < received) {
        exs_event_t ev = next_event(q);
        EXPECT(ev.exs_evt_result >= 0 && ev.exs_evt_fd == fd);
        uintptr_t a = (uintptr_t)ev.exs_evt_ahandle;
        if (ev.exs_evt_type == EXS_EVT_RECV) {
            EXPECT(a >= 1 && a <= RING);
            if (ev.exs_evt_result == 0) {
                /* The client shut down writing; the other receives end the same way. */
                EXPECT(ev.exs_evt_flags & EXS_MSG_EOF);
                eof = 1;
                continue;
            }
            received += (size_t)ev.exs_evt_result;
            XCHECK(exs_send(fd, ev.exs_evt_buf, (size_t)ev.exs_evt_result, 0, q,
                            (void *)(a + 100), mh));
        } else {
            EXPECT(ev.exs_evt_type == EXS_EVT_SEND && a >= 101 && a <= 100 + RING);
            echoed += (size_t)ev.exs_evt_result;
            uintptr_t i = a - 101;
            if (!eof)
                XCHECK(exs_recv(fd, ring + i * PIECE, PIECE, 0, q, (void *)(i + 1), mh));
        }
    }
    EXPECT(received == TOTAL && echoed == TOTAL);
    XCHECK(exs_close(fd, q, (void *)7));
    /* The remaining receives end (0 at the end of the stream, or ECANCELED), then CLOSE. */
    for (;;) {
        exs_event_t ev = next_event(q);
        if (ev.exs_evt_type == EXS_EVT_CLOSE)
            break;
        EXPECT(ev.exs_evt_type == EXS_EVT_RECV);
        EXPECT(ev.exs_evt_result == 0 || ev.exs_evt_result == -ECANCELED);
    }
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    free(ring);
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
    int fd = client_socket(kind, SOCK_STREAM, &ss);
    XCHECK(exs_connect(fd, (struct sockaddr *)&ss, sslen, q, NULL));
    expect_event(q, EXS_EVT_CONNECT, NULL);

    unsigned char *out = malloc(TOTAL), *in = malloc(TOTAL);
    EXPECT(out && in);
    fill(out, TOTAL, 5);
    memset(in, 0, TOTAL);
    exs_mhandle_t mo = exs_mregister(out, TOTAL, 0), mi = exs_mregister(in, TOTAL, 0);
    EXPECT(mo != EXS_MHANDLE_INVALID && mi != EXS_MHANDLE_INVALID);
    XCHECK(exs_recv(fd, in, TOTAL, MSG_WAITALL, q, (void *)1, mi));
    static const size_t steps[] = {1, 7, 100, 4096, 8192, 8193, 65536, 300000, 1000000};
    size_t sent = 0, done = 0, k = 0;
    int inflight = 0, echoed = 0, shut = 0;
    while (!echoed || done < TOTAL) {
        while (inflight < 4 && sent < TOTAL) {
            size_t n = steps[k++ % (sizeof(steps) / sizeof(steps[0]))];
            if (n > TOTAL - sent)
                n = TOTAL - sent;
            XCHECK(exs_send(fd, out + sent, n, 0, q, (void *)2, mo));
            sent += n;
            inflight++;
        }
        if (sent == TOTAL && !shut) {
            /* The end of our stream goes after the sends started; the echo still comes. */
            XCHECK(exs_shutdown(fd, SHUT_WR));
            shut = 1;
        }
        exs_event_t ev = next_event(q);
        EXPECT(ev.exs_evt_result >= 0);
        if (ev.exs_evt_type == EXS_EVT_SEND) {
            done += (size_t)ev.exs_evt_result;
            inflight--;
        } else {
            EXPECT(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_ahandle == (void *)1);
            EXPECT((size_t)ev.exs_evt_result == TOTAL);
            echoed = 1;
        }
    }
    EXPECT(memcmp(in, out, TOTAL) == 0);
    XCHECK(exs_close(fd, q, (void *)3));
    expect_event(q, EXS_EVT_CLOSE, (void *)3);
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
    int rc = run_two_processes("exs_stream (courier)", 120, server, client);
    if (rc != 0)
        return rc;
    kind = OVER_KERNEL;
    return run_two_processes("exs_stream (kernel)", 120, server, client);
}
