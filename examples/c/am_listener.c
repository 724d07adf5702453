/* A listener and a client process exchanging active messages.
 *
 * The client first connects with client id 666, which the server rejects: its endpoint's
 * error handler must see COURIER_ERR_REJECTED. Then it connects with id 7 and sends three
 * messages to handler 1: an eager one (answered on the reply endpoint inside the handler),
 * a rendezvous one (received inside the handler), and a rendezvous one the handler keeps
 * and receives later. Each is acknowledged with an active message to the client's handler
 * 2, whose header carries the message number and whose data echoes a checksum. */
#include "common.h"

#define AM_REQ 1
#define AM_ACK 2
#define REJECT_ID 666
#define CLIENT_ID 7
#define EAGER_LEN 100
#define RNDV_LEN (2 << 20)

struct server_state {
    courier_worker_t *w;
    courier_ep_t *ep;
    int rejected;
    int acked;
    unsigned char *rndv_buf[3];
    courier_request_t *rndv_req[3];
    courier_am_desc_t *kept;
    size_t kept_len;
    uint32_t sums[3];
};

static uint32_t checksum(const unsigned char *p, size_t n)
{
    uint32_t s = 0;
    for (size_t i = 0; i < n; i++)
        s = s * 131u + p[i];
    return s;
}

static void send_ack(courier_ep_t *ep, uint32_t which, uint32_t *sum)
{
    courier_request_t *req = NULL;
    /* The header is copied at once; the data (a checksum slot that outlives the send)
     * must stay valid until completion. */
    courier_status_t s = courier_ep_am_send(ep, AM_ACK, &which, sizeof(which), sum, sizeof(*sum),
                                            COURIER_AM_SEND_FLAG_EAGER, NULL, &req);
    CHECK(s);
    if (s == COURIER_INPROGRESS)
        courier_request_free(req); /* completes on its own; the checksum slot stays valid */
}

static void on_conn(courier_conn_request_t *cr, void *user_data)
{
    struct server_state *st = user_data;
    courier_conn_request_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR | COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
    CHECK(courier_conn_request_query(cr, &attr));
    printf("am_listener: connection request from %s, client id %llu\n", attr.client_address,
           (unsigned long long)attr.client_id);
    if (attr.client_id == REJECT_ID) {
        st->rejected++;
        CHECK(courier_conn_request_reject(cr));
        return;
    }
    EXPECT(attr.client_id == CLIENT_ID);
    EXPECT(st->ep == NULL);
    CHECK(courier_conn_request_accept(cr, NULL, &st->ep));
}

static void on_rndv_done(courier_status_t status, const courier_request_info_t *info, void *user_data)
{
    struct server_state *st = user_data;
    CHECK(status);
    EXPECT(info->length == RNDV_LEN);
    EXPECT(verify(st->rndv_buf[1], RNDV_LEN, 1));
    st->sums[1] = checksum(st->rndv_buf[1], RNDV_LEN);
    send_ack(st->ep, 1, &st->sums[1]);
    st->acked++;
}

static courier_status_t on_am(const courier_am_recv_param_t *p, void *user_data)
{
    struct server_state *st = user_data;
    uint32_t which;
    EXPECT(p->id == AM_REQ);
    EXPECT(p->header_length == sizeof(which));
    memcpy(&which, p->header, sizeof(which));
    switch (which) {
    case 0: /* eager, reply on the reply endpoint */
        EXPECT(!(p->flags & COURIER_AM_RECV_FLAG_RNDV));
        EXPECT(p->flags & COURIER_AM_RECV_FLAG_REPLY);
        EXPECT(p->reply_ep != NULL);
        EXPECT(p->data_length == EAGER_LEN);
        EXPECT(verify(p->data, EAGER_LEN, 0));
        st->sums[0] = checksum(p->data, EAGER_LEN);
        send_ack(p->reply_ep, 0, &st->sums[0]);
        st->acked++;
        return COURIER_OK;
    case 1: /* rendezvous, received now */
        EXPECT(p->flags & COURIER_AM_RECV_FLAG_RNDV);
        EXPECT(p->desc != NULL && p->data == NULL);
        EXPECT(p->data_length == RNDV_LEN);
        st->rndv_buf[1] = malloc(RNDV_LEN);
        courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_CALLBACK | COURIER_OP_FIELD_USER_DATA,
                                  .cb = on_rndv_done,
                                  .user_data = st};
        CHECK(courier_worker_am_recv_data(st->w, p->desc, st->rndv_buf[1], RNDV_LEN, &op,
                                          &st->rndv_req[1]));
        return COURIER_OK;
    case 2: /* rendezvous, kept for later */
        EXPECT(p->flags & COURIER_AM_RECV_FLAG_RNDV);
        st->kept = p->desc;
        st->kept_len = p->data_length;
        return COURIER_INPROGRESS;
    }
    EXPECT(!"unknown message");
    return COURIER_OK;
}

static void on_ep_error(courier_ep_t *ep, courier_status_t status, void *user_data)
{
    (void)ep;
    int *seen = user_data;
    *seen = status;
}

static int server(int port_fd, pid_t child)
{
    struct server_state st;
    memset(&st, 0, sizeof(st));
    courier_context_t *ctx = make_context(COURIER_FEATURE_AM | COURIER_FEATURE_WAKEUP, "am-server");
    st.w = make_worker(ctx);
    CHECK(courier_worker_set_am_handler(st.w, AM_REQ, on_am, &st));
    courier_listener_params_t lp = {.field_mask = COURIER_LISTENER_FIELD_SOCK_ADDR |
                                                  COURIER_LISTENER_FIELD_CONN_HANDLER |
                                                  COURIER_LISTENER_FIELD_USER_DATA,
                                    .sockaddr = "127.0.0.1:0",
                                    .conn_handler = on_conn,
                                    .user_data = &st};
    courier_listener_t *l = NULL;
    CHECK(courier_listener_create(st.w, &lp, &l));
    char where[COURIER_SOCKADDR_STRLEN];
    CHECK(courier_listener_address(l, where, sizeof(where)));
    uint16_t port = 0;
    CHECK(courier_listener_port(l, &port));
    printf("am_listener: listening on %s\n", where);
    fflush(stdout);
    write_all(port_fd, &port, sizeof(port));
    close(port_fd);

    int rc = -1;
    for (;;) {
        courier_worker_progress(st.w);
        if (st.kept != NULL) {
            /* Receive the kept message outside the handler. */
            EXPECT(st.kept_len == RNDV_LEN);
            st.rndv_buf[2] = malloc(RNDV_LEN);
            courier_request_t *req = NULL;
            courier_status_t s = courier_worker_am_recv_data(st.w, st.kept, st.rndv_buf[2], RNDV_LEN, NULL, &req);
            st.kept = NULL;
            CHECK(finish(s, &req));
            EXPECT(verify(st.rndv_buf[2], RNDV_LEN, 2));
            st.sums[2] = checksum(st.rndv_buf[2], RNDV_LEN);
            send_ack(st.ep, 2, &st.sums[2]);
            st.acked++;
        }
        int ws;
        if (waitpid(child, &ws, WNOHANG) == child) {
            rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
            break;
        }
    }
    EXPECT(st.rejected == 1);
    EXPECT(st.acked == 3);
    if (st.rndv_req[1] != NULL) {
        CHECK(courier_request_test(st.rndv_req[1]));
        courier_request_free(st.rndv_req[1]);
    }
    courier_listener_destroy(l);
    if (st.ep != NULL)
        courier_ep_close_force(st.ep);
    courier_worker_destroy(st.w);
    courier_context_destroy(ctx);
    for (int i = 0; i < 3; i++)
        free(st.rndv_buf[i]);
    return rc;
}

struct client_state {
    int acks;
    uint32_t sums[3];
};

static courier_status_t on_ack(const courier_am_recv_param_t *p, void *user_data)
{
    struct client_state *cs = user_data;
    uint32_t which, sum;
    EXPECT(p->header_length == sizeof(which) && p->data_length == sizeof(sum));
    memcpy(&which, p->header, sizeof(which));
    memcpy(&sum, p->data, sizeof(sum));
    EXPECT(which < 3);
    EXPECT(sum == cs->sums[which]);
    cs->acks++;
    return COURIER_OK;
}

static int client(int port_fd)
{
    uint16_t port = 0;
    read_all(port_fd, &port, sizeof(port));
    close(port_fd);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%u", port);

    struct client_state cs;
    memset(&cs, 0, sizeof(cs));
    courier_context_t *ctx = make_context(COURIER_FEATURE_AM | COURIER_FEATURE_WAKEUP, "am-client");
    courier_worker_t *w = make_worker(ctx);
    CHECK(courier_worker_set_am_handler(w, AM_ACK, on_ack, &cs));

    /* A connection the server rejects. */
    int seen = 0;
    courier_ep_params_t rp = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR | COURIER_EP_FIELD_CLIENT_ID |
                                            COURIER_EP_FIELD_ERR_HANDLER | COURIER_EP_FIELD_USER_DATA,
                              .sockaddr = where,
                              .client_id = REJECT_ID,
                              .err_handler = on_ep_error,
                              .user_data = &seen};
    courier_ep_t *rejected = NULL;
    CHECK(courier_ep_create(w, &rp, &rejected));
    while (seen == 0)
        courier_worker_progress(w);
    EXPECT(seen == COURIER_ERR_REJECTED);
    printf("am_listener: rejected as expected (%s)\n", courier_status_string(seen));
    CHECK(courier_ep_close_force(rejected));

    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR | COURIER_EP_FIELD_CLIENT_ID,
                                .sockaddr = where,
                                .client_id = CLIENT_ID};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &ep_p, &ep));
    CHECK(courier_ep_wait_connected(ep, 10000));
    printf("am_listener: connected over %s\n", courier_ep_transport(ep));

    unsigned char *eager = malloc(EAGER_LEN), *big1 = malloc(RNDV_LEN), *big2 = malloc(RNDV_LEN);
    fill(eager, EAGER_LEN, 0);
    fill(big1, RNDV_LEN, 1);
    fill(big2, RNDV_LEN, 2);
    cs.sums[0] = checksum(eager, EAGER_LEN);
    cs.sums[1] = checksum(big1, RNDV_LEN);
    cs.sums[2] = checksum(big2, RNDV_LEN);

    courier_request_t *r[3] = {NULL, NULL, NULL};
    courier_status_t s[3];
    uint32_t h0 = 0, h1 = 1, h2 = 2;
    s[0] = courier_ep_am_send(ep, AM_REQ, &h0, sizeof(h0), eager, EAGER_LEN, COURIER_AM_SEND_FLAG_REPLY, NULL, &r[0]);
    s[1] = courier_ep_am_send(ep, AM_REQ, &h1, sizeof(h1), big1, RNDV_LEN, COURIER_AM_SEND_FLAG_RNDV, NULL, &r[1]);
    courier_iov_t iov[2] = {{big2, RNDV_LEN / 2}, {big2 + RNDV_LEN / 2, RNDV_LEN / 2}};
    s[2] = courier_ep_am_send_iov(ep, AM_REQ, &h2, sizeof(h2), iov, 2, COURIER_AM_SEND_FLAG_RNDV, NULL, &r[2]);
    for (int i = 0; i < 3; i++)
        CHECK(finish(s[i], &r[i]));
    while (cs.acks < 3)
        courier_worker_progress(w);
    printf("am_listener: 3 active messages acknowledged with matching checksums\n");
    CHECK(courier_ep_close(ep));
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(eager);
    free(big1);
    free(big2);
    return 0;
}

int main(void)
{
    return run_two_processes("am_listener", 60, server, client);
}
