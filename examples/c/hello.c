/* Hello, two processes: a server that listens and keeps the endpoint it accepts, a client
 * that connects to it, and a tag message and an active message each way.
 *
 *   cc hello.c $(pkg-config --cflags --libs courier) -o hello
 *   ./hello server 127.0.0.1:13337      # prints "listening on 127.0.0.1:13337"
 *   ./hello client 127.0.0.1:13337      # COURIER_TLS=tcp for tcp on one host (shm by default)
 */
#include <courier.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_TO_SERVER = 1, TAG_TO_CLIENT = 2, TAG_BYE = 3, AM_TO_SERVER = 1, AM_TO_CLIENT = 2 };

/* Every call returns a status; on failure, say which call and the library's reason. */
#define CHECK(call)                                                                      \
    do {                                                                                 \
        courier_status_t s_ = (call);                                                    \
        if (s_ < 0) {                                                                    \
            fprintf(stderr, "hello: %s: %s (%s)\n", #call, courier_status_string(s_),    \
                    courier_last_error_detail());                                        \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

struct state {
    courier_ep_t *ep;   /* the accepted endpoint (server) */
    char am[64];        /* the last active message's data */
    int am_seen;
};

/* Runs inside progress for each client: keep the endpoint, to answer on it. */
static void on_conn(courier_conn_request_t *req, void *user_data)
{
    struct state *st = user_data;
    CHECK(courier_conn_request_accept(req, NULL, &st->ep));
}

static courier_status_t on_am(const courier_am_recv_param_t *p, void *user_data)
{
    struct state *st = user_data;
    size_t n = p->data_length < sizeof(st->am) - 1 ? p->data_length : sizeof(st->am) - 1;
    memcpy(st->am, p->data, n); /* an eager message's data is lent for the call */
    st->am[n] = '\0';
    st->am_seen = 1;
    return COURIER_OK;
}

static void on_ep_error(courier_ep_t *ep, courier_status_t status, void *user_data)
{
    (void)ep;
    (void)user_data;
    fprintf(stderr, "hello: peer failed: %s (%s)\n", courier_status_string(status),
            courier_last_error_detail());
}

// snippet: helpers
/* Send on `ep` and wait until the buffer may be reused. */
static void tag_send(courier_ep_t *ep, const char *text, uint64_t tag)
{
    courier_request_t *req = NULL;
    courier_status_t s = courier_ep_tag_send(ep, text, strlen(text), tag, NULL, &req);
    CHECK(courier_request_finish(s, req, NULL));
}

static void am_send(courier_ep_t *ep, uint16_t id, const char *text)
{
    courier_request_t *req = NULL;
    courier_status_t s = courier_ep_am_send(ep, id, NULL, 0, text, strlen(text), 0, NULL, &req);
    CHECK(courier_request_finish(s, req, NULL));
}

/* Receive a message with `tag` into buf (NUL-terminated). */
static void tag_recv(courier_worker_t *w, char *buf, size_t cap, uint64_t tag)
{
    courier_request_info_t info;
    courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
    courier_request_t *req = NULL;
    courier_status_t s = courier_worker_tag_recv(w, buf, cap - 1, tag, UINT64_MAX, &op, &req);
    CHECK(courier_request_finish(s, req, &info)); /* info is written either way */
    buf[info.length] = '\0';
}

static void wait_am(courier_worker_t *w, struct state *st)
{
    while (!st->am_seen)
        courier_worker_progress(w);
    st->am_seen = 0;
}
// snippet-end

static courier_context_t *context(void)
{
    courier_context_params_t p = {.field_mask = COURIER_CONTEXT_FIELD_FEATURES,
                                  .features = COURIER_FEATURE_TAG | COURIER_FEATURE_AM |
                                              COURIER_FEATURE_WAKEUP};
    courier_context_t *ctx = NULL;
    CHECK(courier_context_create(&p, &ctx)); /* COURIER_* variables from the environment */
    return ctx;
}

// snippet: server
static int server(const char *addr)
{
    struct state st = {0};
    courier_context_t *ctx = context();
    courier_worker_t *w = NULL;
    CHECK(courier_worker_create(ctx, NULL, &w));
    CHECK(courier_worker_set_am_handler(w, AM_TO_SERVER, on_am, &st));
    courier_listener_params_t lp = {.field_mask = COURIER_LISTENER_FIELD_SOCK_ADDR |
                                                  COURIER_LISTENER_FIELD_CONN_HANDLER |
                                                  COURIER_LISTENER_FIELD_USER_DATA,
                                    .sockaddr = addr,
                                    .conn_handler = on_conn,
                                    .user_data = &st};
    courier_listener_t *l = NULL;
    CHECK(courier_listener_create(w, &lp, &l));
    char where[COURIER_SOCKADDR_STRLEN];
    CHECK(courier_listener_address(l, where, sizeof(where)));
    printf("listening on %s\n", where);
    fflush(stdout);

    while (st.ep == NULL) /* the connection handler runs inside progress */
        courier_worker_progress(w);

    char buf[64];
    tag_recv(w, buf, sizeof(buf), TAG_TO_SERVER);
    printf("server: tag: %s\n", buf);
    tag_send(st.ep, "hello, client", TAG_TO_CLIENT);

    wait_am(w, &st);
    printf("server: am: %s\n", st.am);
    am_send(st.ep, AM_TO_CLIENT, "hello, client (am)");

    tag_recv(w, buf, sizeof(buf), TAG_BYE); /* the client has everything */
    CHECK(courier_ep_close(st.ep));
    courier_listener_destroy(l);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    printf("server: done\n");
    return 0;
}
// snippet-end

// snippet: client
static int client(const char *addr)
{
    struct state st = {0};
    courier_context_t *ctx = context();
    courier_worker_t *w = NULL;
    CHECK(courier_worker_create(ctx, NULL, &w));
    CHECK(courier_worker_set_am_handler(w, AM_TO_CLIENT, on_am, &st));
    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR | COURIER_EP_FIELD_CLIENT_ID |
                                              COURIER_EP_FIELD_ERR_HANDLER,
                                .sockaddr = addr,
                                .client_id = 7,
                                .err_handler = on_ep_error};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &ep_p, &ep));
    CHECK(courier_ep_wait_connected(ep, 30000));
    printf("client: connected over %s\n", courier_ep_transport(ep));

    /* Post the receive first, then send; both complete as the worker progresses. */
    char buf[64];
    courier_request_info_t info;
    courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
    courier_request_t *recv = NULL;
    courier_status_t rs = courier_worker_tag_recv(w, buf, sizeof(buf) - 1, TAG_TO_CLIENT, UINT64_MAX,
                                                  &op, &recv);
    CHECK(rs);
    tag_send(ep, "hello, server", TAG_TO_SERVER);
    CHECK(courier_request_finish(rs, recv, &info));
    buf[info.length] = '\0';
    printf("client: tag: %s\n", buf);

    am_send(ep, AM_TO_SERVER, "hello, server (am)");
    wait_am(w, &st);
    printf("client: am: %s\n", st.am);

    tag_send(ep, "bye", TAG_BYE);
    CHECK(courier_ep_close(ep));
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    printf("client: done\n");
    return 0;
}
// snippet-end

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "server") == 0)
        return server(argv[2]);
    if (argc == 3 && strcmp(argv[1], "client") == 0)
        return client(argv[2]);
    fprintf(stderr, "usage: hello server IP:PORT | hello client IP:PORT\n");
    return 2;
}
