/* The C ABI's hot path, for measuring what handle checks cost: an 8-byte tag ping-pong
 * between two processes (shared memory by default; COURIER_TLS chooses), where every round
 * trip posts a receive (a request handle), sends (completes at once or returns a request),
 * waits, reads the request's info and frees it: each call looks a handle up.
 *
 *   hot ITERS    prints "round_trip_ns <median of 5 timed blocks of ITERS/5>"
 *
 * bench/capi_handles/run.sh builds it once and runs it alternately against two libraries. */
#include "../../examples/c/common.h"

#include "timing.h"

#define TAG_PING 1
#define TAG_PONG 2

static long iters = 200000;

/* One exchange: receive `rtag`, send `stag` (the sender posts its receive first). */
static void recv_then(courier_worker_t *w, courier_ep_t *ep, int tag_in, int tag_out, int send_first)
{
    uint64_t in = 0, out = 42;
    courier_request_t *r = NULL, *s = NULL;
    courier_request_info_t info = {0};
    courier_op_params_t op = {.field_mask = COURIER_OP_FIELD_INFO, .info = &info};
    courier_status_t rs = courier_worker_tag_recv(w, &in, sizeof(in), (uint64_t)tag_in, UINT64_MAX, &op, &r);
    CHECK(rs);
    if (send_first)
        CHECK(finish(courier_ep_tag_send(ep, &out, sizeof(out), (uint64_t)tag_out, NULL, &s), &s));
    if (rs == COURIER_INPROGRESS) {
        CHECK(courier_request_wait(r));
        CHECK(courier_request_info(r, &info));
        courier_request_free(r);
    }
    EXPECT(info.length == sizeof(in));
    if (!send_first)
        CHECK(finish(courier_ep_tag_send(ep, &out, sizeof(out), (uint64_t)tag_out, NULL, &s), &s));
}

static int server(int addr_fd, pid_t child)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "hot-server");
    courier_worker_t *w = make_worker(ctx);
    send_address(w, addr_fd);
    courier_ep_t *ep = NULL;
    uint64_t first = 0;
    courier_request_t *r = NULL;
    CHECK(finish(courier_worker_tag_recv(w, &first, sizeof(first), TAG_PING, UINT64_MAX, NULL, &r), &r));
    while (courier_worker_incoming_ep(w, &ep) == COURIER_ERR_NO_MESSAGE)
        courier_worker_progress(w);
    CHECK(finish(courier_ep_tag_send(ep, &first, sizeof(first), TAG_PONG, NULL, &r), &r));
    for (long i = 0; i < iters + iters / 10; i++)
        recv_then(w, ep, TAG_PING, TAG_PONG, 0);
    int rc = child_status(child);
    courier_ep_close_force(ep);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    return rc;
}

static int client(int addr_fd)
{
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "hot-client");
    courier_worker_t *w = make_worker(ctx);
    courier_ep_t *ep = connect_to(w, addr_fd);
    recv_then(w, ep, TAG_PONG, TAG_PING, 1);
    for (long i = 0; i < iters / 10; i++) /* warm-up */
        recv_then(w, ep, TAG_PONG, TAG_PING, 1);
    double blk[BLOCKS];
    long per = iters / BLOCKS;
    for (int b = 0; b < BLOCKS; b++) {
        double t0 = now_ns();
        for (long i = 0; i < per; i++)
            recv_then(w, ep, TAG_PONG, TAG_PING, 1);
        blk[b] = (now_ns() - t0) / (double)per;
    }
    qsort(blk, BLOCKS, sizeof(double), cmp);
    printf("round_trip_ns %.1f transport %s\n", blk[BLOCKS / 2], courier_ep_transport(ep));
    fflush(stdout);
    CHECK(courier_ep_flush(ep));
    courier_ep_close_force(ep);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        iters = atol(argv[1]);
    if (iters < BLOCKS)
        iters = BLOCKS;
    iters -= iters % BLOCKS;
    return run_two_processes("hot", 600, server, client);
}
