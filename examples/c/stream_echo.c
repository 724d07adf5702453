/* Stream echo between a listener process and a client process. The client sends TOTAL
 * bytes in uneven chunks (one gathered from two segments); the server receives whatever
 * has arrived and echoes it back; the client receives the whole echo with
 * COURIER_STREAM_RECV_FLAG_WAITALL and checks every byte. */
#include "common.h"

#define TOTAL (3 * 1000 * 1000 + 17)

struct server_state {
    courier_ep_t *ep;
};

static void on_conn(courier_conn_request_t *cr, void *user_data)
{
    struct server_state *st = user_data;
    EXPECT(st->ep == NULL);
    CHECK(courier_conn_request_accept(cr, NULL, &st->ep));
}

static int server(int port_fd, pid_t child)
{
    struct server_state st = {NULL};
    courier_context_t *ctx = make_context(COURIER_FEATURE_STREAM | COURIER_FEATURE_WAKEUP, "echo-server");
    courier_worker_t *w = make_worker(ctx);
    courier_listener_params_t lp = {.field_mask = COURIER_LISTENER_FIELD_SOCK_ADDR |
                                                  COURIER_LISTENER_FIELD_CONN_HANDLER |
                                                  COURIER_LISTENER_FIELD_USER_DATA,
                                    .sockaddr = "127.0.0.1:0",
                                    .conn_handler = on_conn,
                                    .user_data = &st};
    courier_listener_t *l = NULL;
    CHECK(courier_listener_create(w, &lp, &l));
    uint16_t port = 0;
    CHECK(courier_listener_port(l, &port));
    write_all(port_fd, &port, sizeof(port));
    close(port_fd);

    while (st.ep == NULL)
        courier_worker_progress(w);
    unsigned char *buf = malloc(1 << 20);
    size_t echoed = 0;
    while (echoed < TOTAL) {
        courier_request_t *req = NULL;
        courier_request_info_t info = {0};
        courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
        courier_status_t s = courier_ep_stream_recv(st.ep, buf, 1 << 20, 0, &op, &req);
        if (s == COURIER_INPROGRESS) {
            CHECK(courier_request_wait(req));
            CHECK(courier_request_info(req, &info));
            courier_request_free(req);
        } else {
            CHECK(s);
        }
        EXPECT(info.length > 0 && info.length <= (1 << 20));
        CHECK(finish(courier_ep_stream_send(st.ep, buf, info.length, NULL, &req), &req));
        echoed += info.length;
    }
    EXPECT(echoed == TOTAL);
    int rc = -1;
    for (;;) {
        courier_worker_progress(w);
        int ws;
        if (waitpid(child, &ws, WNOHANG) == child) {
            rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
            break;
        }
    }
    courier_listener_destroy(l);
    courier_ep_close_force(st.ep);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(buf);
    return rc;
}

static int client(int port_fd)
{
    uint16_t port = 0;
    read_all(port_fd, &port, sizeof(port));
    close(port_fd);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%u", port);
    courier_context_t *ctx = make_context(COURIER_FEATURE_STREAM | COURIER_FEATURE_WAKEUP, "echo-client");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR, .sockaddr = where};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &ep_p, &ep));
    CHECK(courier_ep_wait_connected(ep, 10000));
    printf("stream_echo: connected over %s\n", courier_ep_transport(ep));

    unsigned char *out = malloc(TOTAL), *in = malloc(TOTAL);
    fill(out, TOTAL, 5);
    memset(in, 0, TOTAL);
    /* Post the whole receive first; it completes only when full. */
    courier_request_t *rreq = NULL;
    courier_status_t rs = courier_ep_stream_recv(ep, in, TOTAL, COURIER_STREAM_RECV_FLAG_WAITALL, NULL, &rreq);
    CHECK(rs);
    size_t chunks[] = {1, 999, 65536, 1000000, TOTAL - 1 - 999 - 65536 - 1000000};
    size_t off = 0;
    courier_request_t *sreq[5] = {NULL};
    courier_status_t ss[5];
    for (int i = 0; i < 5; i++) {
        if (i == 3) {
            courier_iov_t iov[2] = {{out + off, chunks[i] / 2}, {out + off + chunks[i] / 2, chunks[i] - chunks[i] / 2}};
            ss[i] = courier_ep_stream_send_iov(ep, iov, 2, NULL, &sreq[i]);
        } else {
            ss[i] = courier_ep_stream_send(ep, out + off, chunks[i], NULL, &sreq[i]);
        }
        CHECK(ss[i]);
        off += chunks[i];
    }
    EXPECT(off == TOTAL);
    for (int i = 0; i < 5; i++)
        CHECK(finish(ss[i], &sreq[i]));
    courier_request_info_t info = {0};
    if (rs == COURIER_INPROGRESS) {
        CHECK(courier_request_wait(rreq));
        CHECK(courier_request_info(rreq, &info));
        courier_request_free(rreq);
        EXPECT(info.length == TOTAL);
    }
    EXPECT(verify(in, TOTAL, 5));
    printf("stream_echo: %d bytes echoed and verified\n", TOTAL);
    CHECK(courier_ep_close(ep));
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(out);
    free(in);
    return 0;
}

int main(void)
{
    return run_two_processes("stream_echo", 60, server, client);
}
