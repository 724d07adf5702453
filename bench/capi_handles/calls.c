/* What one C ABI call costs, in one process (no peer, no data moved), so that a change to
 * handle lookups shows above the noise of a ping-pong:
 *   test      courier_request_test on a request in flight (a lookup and a load)
 *   progress  courier_worker_progress on an idle worker (a lookup and an empty poll)
 *   status    courier_ep_status on a connected endpoint
 *   cycle     courier_worker_tag_recv + _cancel + _wait + _free (a request handle made,
 *             used three times and released)
 * Prints "<name>_ns <median of 5 blocks>" for each. */
#include "../../examples/c/common.h"

#include "timing.h"


static courier_worker_t *w;
static courier_ep_t *ep;
static courier_request_t *inflight;
static uint64_t sink;

static void do_test(long n)
{
    for (long i = 0; i < n; i++)
        sink += (uint64_t)courier_request_test(inflight);
}

static void do_progress(long n)
{
    for (long i = 0; i < n; i++)
        sink += courier_worker_progress(w);
}

static void do_status(long n)
{
    for (long i = 0; i < n; i++)
        sink += (uint64_t)courier_ep_status(ep);
}

static void do_cycle(long n)
{
    uint64_t buf;
    for (long i = 0; i < n; i++) {
        courier_request_t *r = NULL;
        EXPECT(courier_worker_tag_recv(w, &buf, sizeof(buf), 99, UINT64_MAX, NULL, &r) == COURIER_INPROGRESS);
        CHECK(courier_request_cancel(r));
        EXPECT(courier_request_wait(r) == COURIER_ERR_CANCELED);
        courier_request_free(r);
    }
}

static void measure(const char *name, void (*f)(long), long n)
{
    double blk[BLOCKS];
    f(n / 10);
    for (int b = 0; b < BLOCKS; b++) {
        double t0 = now_ns();
        f(n);
        blk[b] = (now_ns() - t0) / (double)n;
    }
    qsort(blk, BLOCKS, sizeof(double), cmp);
    printf("%s_ns %.1f\n", name, blk[BLOCKS / 2]);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "calls");
    w = make_worker(ctx);
    void *addr = NULL;
    size_t len = 0;
    CHECK(courier_worker_address(w, &addr, &len));
    courier_ep_params_t p = {.field_mask = COURIER_EP_FIELD_REMOTE_ADDRESS, .address = addr, .address_length = len};
    CHECK(courier_ep_create(w, &p, &ep));
    courier_buffer_free(addr);
    CHECK(courier_ep_wait_connected(ep, 10000));
    uint64_t buf;
    EXPECT(courier_worker_tag_recv(w, &buf, sizeof(buf), 7, UINT64_MAX, NULL, &inflight) == COURIER_INPROGRESS);
    measure("test", do_test, n);
    measure("progress", do_progress, n);
    measure("status", do_status, n);
    measure("cycle", do_cycle, n / 10);
    CHECK(courier_request_cancel(inflight));
    courier_request_wait(inflight);
    courier_request_free(inflight);
    courier_ep_close_force(ep);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    return sink == 42 ? 2 : 0;
}
