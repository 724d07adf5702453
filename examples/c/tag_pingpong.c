/* Tag ping-pong between two processes. The server sends its worker address to the client
 * over a pipe; the client connects by address; the server answers on the endpoint the
 * client's connection made (courier_worker_incoming_ep). Sizes cover eager and rendezvous;
 * one round each uses a synchronous send, a gathered send and a scattered receive, and the
 * server probes before receiving. Every byte is checked. */
#include "common.h"

#define TAG_PING 1
#define TAG_PONG 2
#define ITERS 20

static const size_t sizes[] = {0, 1, 64, 4096, 65536, 1 << 20, 4 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXSZ (4 << 20)

static int server(int addr_fd, pid_t child)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG | COURIER_FEATURE_WAKEUP, "pp-server");
    courier_worker_t *w = make_worker(ctx);
    send_address(w, addr_fd);

    unsigned char *buf = malloc(MAXSZ);
    courier_ep_t *ep = NULL;
    for (size_t s = 0; s < NSIZES; s++) {
        for (int i = 0; i < ITERS; i++) {
            courier_request_info_t info = {0};
            if (s == 3 && i == 0) {
                /* Probe: wait until the ping has arrived, then look at it unreceived. */
                courier_status_t st;
                while ((st = courier_worker_tag_probe(w, TAG_PING, UINT64_MAX, &info)) ==
                       COURIER_ERR_NO_MESSAGE)
                    courier_worker_progress(w);
                CHECK(st);
                EXPECT(info.length == sizes[s] && info.tag == TAG_PING);
            }
            courier_request_t *req = NULL;
            courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
            courier_status_t st = courier_worker_tag_recv(w, buf, MAXSZ, TAG_PING, UINT64_MAX, &op, &req);
            if (st == COURIER_INPROGRESS) {
                CHECK(courier_request_wait(req));
                CHECK(courier_request_info(req, &info));
                courier_request_free(req);
            } else {
                CHECK(st);
            }
            EXPECT(info.length == sizes[s]);
            EXPECT(info.tag == TAG_PING);
            EXPECT(verify(buf, sizes[s], (unsigned)(s * 7 + i)));
            if (ep == NULL) {
                while (courier_worker_incoming_ep(w, &ep) == COURIER_ERR_NO_MESSAGE)
                    courier_worker_progress(w);
            }
            CHECK(finish(courier_ep_tag_send(ep, buf, sizes[s], TAG_PONG, NULL, &req), &req));
        }
    }
    /* Hold on until the client is done with its last receive. */
    int rc = -1;
    for (;;) {
        courier_worker_progress(w);
        int st;
        pid_t r = waitpid(child, &st, WNOHANG);
        if (r == child) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
            break;
        }
    }
    courier_ep_close_force(ep);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(buf);
    return rc;
}

static int client(int addr_fd)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG | COURIER_FEATURE_WAKEUP, "pp-client");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_t *ep = connect_to(w, addr_fd);
    printf("tag_pingpong: connected over %s\n", courier_ep_transport(ep));

    unsigned char *out = malloc(MAXSZ), *in = malloc(MAXSZ);
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        for (int i = 0; i < ITERS; i++) {
            unsigned seed = (unsigned)(s * 7 + i);
            fill(out, n, seed);
            memset(in, 0xee, n);
            courier_request_t *rreq = NULL, *sreq = NULL;
            courier_request_info_t info = {0};
            courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
            courier_status_t rs;
            if (i == 1 && n >= 2) {
                /* Scattered receive into two halves. */
                courier_iov_t iov[2] = {{in, n / 2}, {in + n / 2, n - n / 2}};
                rs = courier_worker_tag_recv_iov(w, iov, 2, TAG_PONG, UINT64_MAX, &op, &rreq);
            } else {
                rs = courier_worker_tag_recv(w, in, n, TAG_PONG, UINT64_MAX, &op, &rreq);
            }
            CHECK(rs);
            courier_status_t ss;
            if (i == 2) {
                ss = courier_ep_tag_send_sync(ep, out, n, TAG_PING, NULL, &sreq);
            } else if (i == 3 && n >= 3) {
                courier_iov_t iov[3] = {{out, 1}, {out + 1, n / 2}, {out + 1 + n / 2, n - 1 - n / 2}};
                ss = courier_ep_tag_send_iov(ep, iov, 3, TAG_PING, NULL, &sreq);
            } else {
                ss = courier_ep_tag_send(ep, out, n, TAG_PING, NULL, &sreq);
            }
            CHECK(finish(ss, &sreq));
            if (rs == COURIER_INPROGRESS) {
                CHECK(courier_request_wait(rreq));
                CHECK(courier_request_info(rreq, &info));
                courier_request_free(rreq);
            }
            EXPECT(info.length == n);
            EXPECT(verify(in, n, seed));
        }
    }
    printf("tag_pingpong: %zu sizes x %d round trips verified\n", NSIZES, ITERS);
    CHECK(courier_ep_close(ep));
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(out);
    free(in);
    return 0;
}

int main(void)
{
    return run_two_processes("tag_pingpong", 60, server, client);
}
