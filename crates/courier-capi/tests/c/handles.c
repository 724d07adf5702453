/* Handle rules of the C ABI, in one process: for every kind of handle, destroying it twice
 * and using it after destroy return COURIER_ERR_INVALID_HANDLE (never undefined behaviour),
 * as do a stale request handle (completed, freed, then used), a handle of the wrong kind,
 * NULL, and a value Courier never made. A child whose parent was destroyed first stays safe
 * to use and to destroy. Every check names itself on failure. */
#include "../../../../examples/c/common.h"

#include <stdint.h>

#define INVALID(call)                                                                \
    do {                                                                             \
        courier_status_t s_ = (call);                                                \
        if (s_ != COURIER_ERR_INVALID_HANDLE) {                                      \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected "                 \
                    "COURIER_ERR_INVALID_HANDLE\n", __FILE__, __LINE__, #call,       \
                    (int)s_, courier_status_string(s_));                             \
            exit(1);                                                                 \
        }                                                                            \
        EXPECT(strlen(courier_last_error_detail()) > 0);                             \
    } while (0)

static courier_conn_request_t *pending;

static void on_conn(courier_conn_request_t *r, void *ud)
{
    (void)ud;
    pending = r;
}

static courier_ep_t *connect_self(courier_worker_t *w)
{
    void *addr = NULL;
    size_t len = 0;
    CHECK(courier_worker_address(w, &addr, &len));
    courier_ep_params_t p = {.field_mask = COURIER_EP_FIELD_REMOTE_ADDRESS, .address = addr, .address_length = len};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &p, &ep));
    courier_buffer_free(addr);
    CHECK(courier_ep_wait_connected(ep, 20000));
    return ep;
}

static void contexts_and_workers(void)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "handles");
    courier_worker_t *w = make_worker(ctx);
    uint64_t f = 0;
    CHECK(courier_context_features(ctx, &f));
    /* Wrong kind: a worker where a context goes, a context where a worker goes. */
    INVALID(courier_context_features((courier_context_t *)w, &f));
    INVALID(courier_worker_signal((courier_worker_t *)ctx));
    /* Parent first: the worker stays usable and destroyable after its context is gone. */
    CHECK(courier_context_destroy(ctx));
    INVALID(courier_context_destroy(ctx));
    INVALID(courier_context_features(ctx, &f));
    EXPECT(strcmp(courier_context_name(ctx), "") == 0);
    CHECK(courier_worker_signal(w));
    CHECK(courier_worker_destroy(w));
    INVALID(courier_worker_destroy(w));
    INVALID(courier_worker_signal(w));
    INVALID(courier_worker_wait(w, 0));
    EXPECT(courier_worker_progress(w) == 0);
    int fd = -1;
    INVALID(courier_worker_event_fd(w, &fd));
    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR, .sockaddr = "127.0.0.1:1"};
    courier_ep_t *ep = NULL;
    INVALID(courier_ep_create(w, &ep_p, &ep));
    EXPECT(ep == NULL);
    /* NULL, and values Courier never made. */
    INVALID(courier_context_destroy(NULL));
    INVALID(courier_worker_destroy(NULL));
    INVALID(courier_worker_signal(NULL));
    INVALID(courier_worker_signal((courier_worker_t *)(uintptr_t)0x1000));
    INVALID(courier_worker_signal((courier_worker_t *)&f));
}

static void endpoints_and_requests(void)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG | COURIER_FEATURE_STREAM, "handles-ep");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_t *ep = connect_self(w);
    uint64_t v = 7, in = 0;
    courier_request_t *req = NULL;

    /* A request completed, freed, then used: stale. */
    courier_status_t s = courier_worker_tag_recv(w, &in, sizeof(in), 5, UINT64_MAX, NULL, &req);
    EXPECT(s == COURIER_INPROGRESS);
    courier_request_t *sreq = NULL;
    CHECK(finish(courier_ep_tag_send(ep, &v, sizeof(v), 5, NULL, &sreq), &sreq));
    CHECK(courier_request_wait(req));
    EXPECT(in == 7);
    CHECK(courier_request_destroy(req));
    INVALID(courier_request_test(req));
    INVALID(courier_request_wait(req));
    INVALID(courier_request_wait_timeout(req, 0));
    INVALID(courier_request_cancel(req));
    courier_request_info_t info;
    INVALID(courier_request_info(req, &info));
    INVALID(courier_request_destroy(req));
    INVALID(courier_request_free(req));
    INVALID(courier_request_finish(COURIER_INPROGRESS, req, &info));
    /* The next request may reuse the freed one's slot: the old handle still fails. */
    courier_request_t *next = NULL;
    EXPECT(courier_worker_tag_recv(w, &in, sizeof(in), 6, UINT64_MAX, NULL, &next) == COURIER_INPROGRESS);
    EXPECT(next != req);
    INVALID(courier_request_test(req));
    EXPECT(courier_request_test(next) == COURIER_INPROGRESS);
    CHECK(courier_request_cancel(next));
    EXPECT(courier_request_wait(next) == COURIER_ERR_CANCELED);
    CHECK(courier_request_free(next));
    /* Wrong kinds: an endpoint as a request, a request as an endpoint or a worker. */
    INVALID(courier_request_test((courier_request_t *)ep));
    INVALID(courier_ep_flush((courier_ep_t *)next));
    INVALID(courier_worker_signal((courier_worker_t *)ep));
    INVALID(courier_request_test(NULL));
    INVALID(courier_request_destroy(NULL));

    /* An endpoint destroyed, then used and destroyed again. */
    CHECK(courier_ep_destroy(ep));
    INVALID(courier_ep_destroy(ep));
    INVALID(courier_ep_close(ep));
    INVALID(courier_ep_close_force(ep));
    INVALID(courier_ep_flush(ep));
    INVALID(courier_ep_status(ep));
    INVALID(courier_ep_tag_send(ep, &v, sizeof(v), 5, NULL, &req));
    INVALID(courier_ep_stream_send(ep, &v, sizeof(v), NULL, &req));
    EXPECT(strcmp(courier_ep_transport(ep), "") == 0);
    INVALID(courier_ep_flush(NULL));

    /* A worker destroyed before its endpoint: the endpoint is still released safely. */
    courier_ep_t *ep2 = connect_self(w);
    CHECK(courier_worker_destroy(w));
    INVALID(courier_worker_tag_recv(w, &in, sizeof(in), 5, UINT64_MAX, NULL, &req));
    CHECK(courier_ep_flush(ep2)); /* the endpoint keeps what it needs of its worker */
    CHECK(courier_ep_destroy(ep2));
    INVALID(courier_ep_destroy(ep2));
    CHECK(courier_context_destroy(ctx));
}

static void listeners_and_conn_requests(void)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "handles-listener");
    courier_worker_t *w = make_worker(ctx);
    courier_listener_params_t lp = {.field_mask = COURIER_LISTENER_FIELD_SOCK_ADDR | COURIER_LISTENER_FIELD_CONN_HANDLER,
                                    .sockaddr = "127.0.0.1:0",
                                    .conn_handler = on_conn};
    courier_listener_t *l = NULL;
    CHECK(courier_listener_create(w, &lp, &l));
    uint16_t port = 0;
    CHECK(courier_listener_port(l, &port));
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%u", (unsigned)port);
    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR, .sockaddr = where};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &ep_p, &ep));
    while (pending == NULL)
        courier_worker_progress(w);
    courier_conn_request_t *r = pending;
    courier_conn_request_attr_t attr = {.field_mask = COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID};
    CHECK(courier_conn_request_query(r, &attr));
    INVALID(courier_conn_request_query((courier_conn_request_t *)l, &attr));
    CHECK(courier_conn_request_reject(r));
    INVALID(courier_conn_request_reject(r));
    INVALID(courier_conn_request_query(r, &attr));
    courier_ep_t *accepted = NULL;
    INVALID(courier_conn_request_accept(r, NULL, &accepted));
    EXPECT(accepted == NULL);
    INVALID(courier_conn_request_reject(NULL));

    CHECK(courier_listener_destroy(l));
    INVALID(courier_listener_destroy(l));
    INVALID(courier_listener_port(l, &port));
    char buf[64];
    INVALID(courier_listener_address(l, buf, sizeof(buf)));
    INVALID(courier_listener_destroy(NULL));
    CHECK(courier_ep_destroy(ep));
    CHECK(courier_worker_destroy(w));
    CHECK(courier_context_destroy(ctx));
}

static void memory_keys_and_semaphores(void)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG | COURIER_FEATURE_RMA | COURIER_FEATURE_AMO, "handles-mem");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_t *ep = connect_self(w);
    courier_mem_map_params_t mp = {.field_mask = COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS,
                                   .length = 4096,
                                   .flags = COURIER_MEM_MAP_FLAG_ALLOCATE};
    courier_mem_t *mem = NULL;
    CHECK(courier_mem_map(ctx, &mp, &mem));
    void *packed = NULL;
    size_t plen = 0;
    CHECK(courier_rkey_pack(mem, &packed, &plen));
    courier_rkey_t *rkey = NULL;
    CHECK(courier_ep_rkey_unpack(ep, packed, plen, &rkey));
    courier_buffer_free(packed);
    uint64_t base = 0, length = 0;
    CHECK(courier_rkey_bounds(rkey, &base, &length));
    INVALID(courier_rkey_bounds((courier_rkey_t *)mem, &base, &length));
    CHECK(courier_rkey_destroy(rkey));
    INVALID(courier_rkey_destroy(rkey));
    INVALID(courier_rkey_bounds(rkey, &base, &length));
    void *p = NULL;
    INVALID(courier_rkey_ptr(rkey, base, &p));
    uint64_t v = 1;
    courier_request_t *req = NULL;
    INVALID(courier_ep_put(ep, &v, sizeof(v), base, rkey, NULL, &req));
    EXPECT(strcmp(courier_rkey_path(rkey), "") == 0);
    INVALID(courier_rkey_destroy(NULL));

    /* A key whose region is destroyed first: its use fails cleanly (the key is stale). */
    CHECK(courier_rkey_pack(mem, &packed, &plen));
    courier_rkey_t *orphan = NULL;
    CHECK(courier_ep_rkey_unpack(ep, packed, plen, &orphan));
    courier_buffer_free(packed);
    courier_mem_attr_t attr;
    CHECK(courier_mem_query(mem, &attr));
    CHECK(courier_mem_destroy(mem));
    courier_status_t st = courier_ep_put(ep, &v, sizeof(v), base, orphan, NULL, &req);
    EXPECT(courier_request_finish(st, req, NULL) < 0);
    CHECK(courier_rkey_destroy(orphan));
    INVALID(courier_mem_destroy(mem));
    INVALID(courier_mem_unmap(mem));
    INVALID(courier_mem_query(mem, &attr));
    INVALID(courier_rkey_pack(mem, &packed, &plen));
    INVALID(courier_mem_destroy(NULL));

    courier_sem_t *sem = NULL;
    CHECK(courier_sem_create(ctx, 0, &sem));
    CHECK(courier_sem_post(sem, 1));
    INVALID(courier_sem_post((courier_sem_t *)ep, 1));
    CHECK(courier_sem_destroy(sem));
    INVALID(courier_sem_destroy(sem));
    INVALID(courier_sem_post(sem, 1));
    INVALID(courier_sem_try(sem, 1));
    INVALID(courier_sem_destroy(NULL));

    CHECK(courier_ep_destroy(ep));
    CHECK(courier_worker_destroy(w));
    CHECK(courier_context_destroy(ctx));
}

static void jobs(void)
{
    courier_job_t *job = NULL;
    CHECK(courier_job_init(&job));
    uint32_t rank = 99;
    CHECK(courier_job_rank(job, &rank));
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "handles-job");
    courier_worker_t *w = make_worker(ctx);
    courier_job_world_t *world = NULL;
    CHECK(courier_job_world_create(job, w, &world));
    courier_ep_t *ep = NULL;
    CHECK(courier_job_world_endpoint(world, rank, &ep));
    /* The world owns its endpoints: once the world is destroyed, their handles are dead. */
    size_t n = 0;
    CHECK(courier_job_world_connected(world, &n));
    INVALID(courier_job_world_connected((courier_job_world_t *)job, &n));
    INVALID(courier_job_rank((courier_job_t *)world, &rank));
    CHECK(courier_job_world_destroy(world));
    INVALID(courier_job_world_destroy(world));
    INVALID(courier_job_world_connected(world, &n));
    INVALID(courier_ep_flush(ep));
    INVALID(courier_job_world_destroy(NULL));
    CHECK(courier_job_destroy(job));
    INVALID(courier_job_destroy(job));
    INVALID(courier_job_rank(job, &rank));
    EXPECT(strcmp(courier_job_launcher(job), "") == 0);
    INVALID(courier_job_destroy(NULL));
    CHECK(courier_worker_destroy(w));
    CHECK(courier_context_destroy(ctx));
}

int main(void)
{
    watchdog(120);
    contexts_and_workers();
    endpoints_and_requests();
    listeners_and_conn_requests();
    memory_keys_and_semaphores();
    jobs();
    printf("handles: every kind refuses destroy-twice, use-after-destroy, stale, wrong-kind and NULL handles: OK\n");
    return 0;
}
