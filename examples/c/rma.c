/* One-sided communication between two processes. The parent (owner) allocates a region and
 * a semaphore, and sends their remote keys to the child over a stream. The child puts a
 * block, gets it back, runs fetching atomics and posted (non-fetching) ones (64- and
 * 32-bit), checks that an access outside the region fails, puts a second block with a signal
 * (COURIER_SIGNAL_ADD) and posts the semaphore with a remote atomic add. The parent waits on
 * the signal word and the semaphore, then checks every byte it was sent. */
#include "common.h"

#include <stdint.h>

#define REGION (1u << 20)
#define BLOCK (64u * 1024u)
#define OFF_PUT 0u                /* put / get block */
#define OFF_SIGPUT (256u * 1024u) /* put-with-signal block */
#define OFF_ATOMIC64 (REGION - 64u)
#define OFF_ATOMIC32 (REGION - 56u)
#define OFF_POST64 (REGION - 48u) /* posted atomics */
#define OFF_POST32 (REGION - 40u)
#define POSTS 100u
#define OFF_SIGNAL (REGION - 8u)

struct keys_header {
    uint64_t base;
    uint64_t sem_addr;
    uint32_t key_len;
    uint32_t sem_key_len;
};

struct server_state {
    courier_ep_t *ep;
};

static void on_conn(courier_conn_request_t *cr, void *user_data)
{
    struct server_state *st = user_data;
    EXPECT(st->ep == NULL);
    CHECK(courier_conn_request_accept(cr, NULL, &st->ep));
}

static const uint64_t FEATURES = COURIER_FEATURE_RMA | COURIER_FEATURE_AMO |
                                 COURIER_FEATURE_STREAM | COURIER_FEATURE_WAKEUP;

static int owner(int port_fd, pid_t child)
{
    struct server_state st = {NULL};
    courier_context_t *ctx = make_context(FEATURES, "rma-owner");
    courier_worker_t *w = make_worker(ctx);

    courier_mem_map_params_t mp = {.field_mask = COURIER_MEM_MAP_FIELD_LENGTH |
                                                 COURIER_MEM_MAP_FIELD_FLAGS |
                                                 COURIER_MEM_MAP_FIELD_MEMORY_TYPE |
                                                 COURIER_MEM_MAP_FIELD_ACCESS,
                                   .length = REGION,
                                   .flags = COURIER_MEM_MAP_FLAG_ALLOCATE,
                                   .memory_type = COURIER_MEMORY_TYPE_HOST,
                                   .access = COURIER_ACCESS_ALL};
    courier_mem_t *mem = NULL;
    CHECK(courier_mem_map(ctx, &mp, &mem));
    courier_mem_attr_t attr;
    CHECK(courier_mem_query(mem, &attr));
    EXPECT(attr.length == REGION && attr.memory_type == COURIER_MEMORY_TYPE_HOST);
    unsigned char *region = attr.address;
    memset(region, 0, REGION);

    courier_sem_t *sem = NULL;
    CHECK(courier_sem_create(ctx, 0, &sem));

    struct keys_header h = {.base = (uint64_t)(uintptr_t)region};
    void *key = NULL, *sem_key = NULL;
    size_t key_len = 0, sem_key_len = 0;
    CHECK(courier_rkey_pack(mem, &key, &key_len));
    CHECK(courier_sem_remote(sem, &sem_key, &sem_key_len, &h.sem_addr));
    h.key_len = (uint32_t)key_len;
    h.sem_key_len = (uint32_t)sem_key_len;

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
    courier_request_t *req = NULL;
    CHECK(finish(courier_ep_stream_send(st.ep, &h, sizeof(h), NULL, &req), &req));
    CHECK(finish(courier_ep_stream_send(st.ep, key, key_len, NULL, &req), &req));
    CHECK(finish(courier_ep_stream_send(st.ep, sem_key, sem_key_len, NULL, &req), &req));
    courier_buffer_free(key);
    courier_buffer_free(sem_key);

    /* The child's put-with-signal adds 1 to the signal word once its data is in place;
     * progressing meanwhile carries out operations that come through this worker. */
    uint64_t sig = 0;
    CHECK(courier_signal_wait_until(mem, w, OFF_SIGNAL, COURIER_CMP_GE, 1,
                                    COURIER_SIGNAL_WAIT_FLAG_SLEEP, 60000, &sig));
    EXPECT(sig == 1);
    CHECK(courier_signal_fetch(mem, OFF_SIGNAL, &sig));
    EXPECT(sig == 1);
    EXPECT(verify(region + OFF_SIGPUT, BLOCK, 2));
    EXPECT(verify(region + OFF_PUT, BLOCK, 1));
    uint64_t a64;
    uint32_t a32;
    memcpy(&a64, region + OFF_ATOMIC64, 8);
    memcpy(&a32, region + OFF_ATOMIC32, 4);
    EXPECT(a64 == 12);
    EXPECT(a32 == 0xabcd);
    memcpy(&a64, region + OFF_POST64, 8);
    memcpy(&a32, region + OFF_POST32, 4);
    EXPECT(a64 == ((3u * POSTS) | 0x10000u));
    EXPECT(a32 == ((0xf0f0f0f0u ^ 0xffff0000u) & 0xff0ff0ffu));

    /* The child posts the semaphore with a remote atomic add after the signal. */
    CHECK(courier_sem_wait(sem, w, 1));
    uint64_t v = 99;
    CHECK(courier_sem_value(sem, &v));
    EXPECT(v == 0);
    EXPECT(courier_sem_try(sem, 1) == COURIER_ERR_NO_RESOURCE);
    CHECK(courier_sem_post(sem, 2));
    EXPECT(courier_sem_try(sem, 2) == COURIER_OK);
    printf("rma: owner saw the signal, the data, the atomics and the semaphore\n");

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
    courier_sem_destroy(sem);
    courier_mem_unmap(mem);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    return rc;
}

/* Receive exactly n stream bytes. */
static void recv_all(courier_ep_t *ep, void *buf, size_t n)
{
    courier_request_t *req = NULL;
    CHECK(finish(courier_ep_stream_recv(ep, buf, n, COURIER_STREAM_RECV_FLAG_WAITALL, NULL, &req),
                 &req));
}

/* A fetching atomic: the old value, whether it completed at once or later. */
static uint64_t fetch_op(courier_ep_t *ep, uint32_t op, uint64_t value, uint64_t compare,
                         uint32_t size, uint64_t addr, courier_rkey_t *rk)
{
    courier_request_info_t info = {0};
    courier_op_params_t p = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
    courier_request_t *req = NULL;
    courier_status_t s = courier_ep_atomic(ep, op, value, compare, size, addr, rk, &p, &req);
    CHECK(s);
    if (s == COURIER_INPROGRESS) {
        CHECK(courier_request_wait(req));
        CHECK(courier_request_info(req, &info));
        courier_request_free(req);
    }
    return info.value;
}

static int user(int port_fd)
{
    uint16_t port = 0;
    read_all(port_fd, &port, sizeof(port));
    close(port_fd);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%u", port);
    courier_context_t *ctx = make_context(FEATURES, "rma-user");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_params_t ep_p = {.field_mask = COURIER_EP_FIELD_SOCK_ADDR, .sockaddr = where};
    courier_ep_t *ep = NULL;
    CHECK(courier_ep_create(w, &ep_p, &ep));
    CHECK(courier_ep_wait_connected(ep, 10000));

    struct keys_header h;
    recv_all(ep, &h, sizeof(h));
    void *key = malloc(h.key_len), *sem_key = malloc(h.sem_key_len);
    recv_all(ep, key, h.key_len);
    recv_all(ep, sem_key, h.sem_key_len);
    courier_rkey_t *rk = NULL, *sem_rk = NULL;
    CHECK(courier_ep_rkey_unpack(ep, key, h.key_len, &rk));
    CHECK(courier_ep_rkey_unpack(ep, sem_key, h.sem_key_len, &sem_rk));
    free(key);
    free(sem_key);
    uint64_t kbase = 0, klen = 0;
    CHECK(courier_rkey_bounds(rk, &kbase, &klen));
    EXPECT(kbase == h.base && klen == REGION);
    printf("rma: connected over %s, key path %s\n", courier_ep_transport(ep), courier_rkey_path(rk));

    unsigned char *out = malloc(BLOCK), *in = malloc(BLOCK);
    courier_request_t *req = NULL;

    /* put, then get it back */
    fill(out, BLOCK, 1);
    CHECK(finish(courier_ep_put(ep, out, BLOCK, h.base + OFF_PUT, rk, NULL, &req), &req));
    CHECK(courier_ep_fence(ep));
    memset(in, 0, BLOCK);
    CHECK(finish(courier_ep_get(ep, in, BLOCK, h.base + OFF_PUT, rk, NULL, &req), &req));
    EXPECT(verify(in, BLOCK, 1));

    /* fetching atomics */
    EXPECT(fetch_op(ep, COURIER_ATOMIC_OP_ADD, 5, 0, 8, h.base + OFF_ATOMIC64, rk) == 0);
    EXPECT(fetch_op(ep, COURIER_ATOMIC_OP_ADD, 7, 0, 8, h.base + OFF_ATOMIC64, rk) == 5);
    EXPECT(fetch_op(ep, COURIER_ATOMIC_OP_CSWAP, 0xabcd, 0, 4, h.base + OFF_ATOMIC32, rk) == 0);
    EXPECT(fetch_op(ep, COURIER_ATOMIC_OP_CSWAP, 0x1111, 0, 4, h.base + OFF_ATOMIC32, rk) ==
           0xabcd); /* compare fails: unchanged */

    /* posted atomics: nothing comes back; the flush confirms them (or reports a refusal) */
    const uint64_t p64 = h.base + OFF_POST64, p32 = h.base + OFF_POST32;
    for (unsigned i = 0; i < POSTS; i++)
        CHECK(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_ADD, 3, 8, p64, rk));
    CHECK(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_OR, 0x10000, 8, p64, rk));
    CHECK(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_OR, 0xf0f0f0f0, 4, p32, rk));
    CHECK(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_XOR, 0xffff0000, 4, p32, rk));
    CHECK(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_AND, 0xff0ff0ff, 4, p32, rk));
    CHECK(courier_ep_flush(ep));
    EXPECT(fetch_op(ep, COURIER_ATOMIC_OP_ADD, 0, 0, 8, p64, rk) == ((3u * POSTS) | 0x10000u));
    /* a swap fetches by nature; outside the key's region is refused before anything is sent */
    EXPECT(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_SWAP, 1, 8, p64, rk) ==
           COURIER_ERR_INVALID_PARAM);
    EXPECT(courier_ep_atomic_post(ep, COURIER_ATOMIC_OP_ADD, 1, 8, h.base + REGION, rk) ==
           COURIER_ERR_OUT_OF_RANGE);

    /* outside the region: refused at once (the region is mapped here), or, for a put the
     * target carries out, by the next flush (puts complete locally, like OpenSHMEM's) */
    courier_status_t bad = finish(courier_ep_put(ep, out, 16, h.base + REGION - 8, rk, NULL, &req),
                                  &req);
    if (bad == COURIER_OK)
        bad = courier_ep_flush(ep);
    EXPECT(bad == COURIER_ERR_OUT_OF_RANGE);
    CHECK(courier_ep_flush(ep)); /* reported once */
    EXPECT(courier_ep_atomic(ep, COURIER_ATOMIC_OP_ADD, 1, 0, 8, h.base + 3, rk, NULL, &req) ==
           COURIER_ERR_INVALID_PARAM);

    /* put with signal, then post the semaphore */
    fill(out, BLOCK, 2);
    CHECK(finish(courier_ep_put_signal(ep, out, BLOCK, h.base + OFF_SIGPUT, rk, h.base + OFF_SIGNAL,
                                       rk, 1, COURIER_SIGNAL_ADD, NULL, &req),
                 &req));
    fetch_op(ep, COURIER_ATOMIC_OP_ADD, 1, 0, 8, h.sem_addr, sem_rk);
    CHECK(courier_ep_flush(ep));
    printf("rma: put, get, atomics, put-with-signal and semaphore post done\n");

    courier_rkey_destroy(rk);
    courier_rkey_destroy(sem_rk);
    CHECK(courier_ep_close(ep));
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    free(out);
    free(in);
    return 0;
}

int main(void)
{
    return run_two_processes("rma", 90, owner, user);
}
