/* Put-with-signal: SET and ADD, blocking and _nbi, typed, sized and mem forms; a ring of
 * PEs passing a token; signal_fetch; signals in global data too. */
#include "common.h"

static uint64_t g_sig;
static int g_data[256];

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n;
    uint64_t *sig = shmem_calloc(2, sizeof(uint64_t));
    long *buf = shmem_calloc(1024, sizeof(long));
    long src[1024];
    for (int i = 0; i < 1024; i++) src[i] = me * 10000 + i;
    shmem_barrier_all();

    /* Ring: PE 0 starts; each PE waits for its signal then passes to the right. */
    const int rounds = 50;
    for (int r = 1; r <= rounds; r++) {
        if (me == 0) {
            shmem_long_put_signal(buf, src, 1024, &sig[0], r, SHMEM_SIGNAL_SET, right);
            uint64_t v = shmem_signal_wait_until(&sig[0], SHMEM_CMP_EQ, r);
            CHECK(v == (uint64_t)r, "ring value %lu", (unsigned long)v);
            CHECK(buf[1023] == (n - 1) * 10000 + 1023, "ring data at PE 0: %ld", buf[1023]);
        } else {
            shmem_signal_wait_until(&sig[0], SHMEM_CMP_GE, r);
            /* The data that came with the signal is here. */
            CHECK(buf[1023] == (me - 1) * 10000 + 1023, "ring data %ld", buf[1023]);
            shmem_long_put_signal(buf, src, 1024, &sig[0], r, SHMEM_SIGNAL_SET, right);
        }
    }
    shmem_barrier_all();
    CHECK(shmem_signal_fetch(&sig[0]) == (uint64_t)rounds, "signal_fetch %lu", (unsigned long)shmem_signal_fetch(&sig[0]));

    /* ADD from every PE into PE 0's global signal, with data; _nbi then quiet. */
    g_sig = 0;
    shmem_barrier_all();
    int mine[2] = {me, -me};
    shmem_int_put_signal_nbi(&g_data[2 * me], mine, 2, &g_sig, 1, SHMEM_SIGNAL_ADD, 0);
    shmem_quiet();
    if (me == 0) {
        shmem_signal_wait_until(&g_sig, SHMEM_CMP_EQ, (uint64_t)n);
        for (int pe = 0; pe < n; pe++)
            CHECK(g_data[2 * pe] == pe && g_data[2 * pe + 1] == -pe, "data from %d", pe);
    }
    shmem_barrier_all();

    /* mem and sized forms, and a context. */
    char text[8] = "courier";
    shmem_putmem_signal(&buf[0], text, 8, &sig[1], 5, SHMEM_SIGNAL_ADD, right);
    shmem_signal_wait_until(&sig[1], SHMEM_CMP_GE, 5);
    CHECK(memcmp(&buf[0], "courier", 8) == 0, "putmem_signal data");
    shmem_barrier_all();
    uint32_t w[3] = {7, 8, 9};
    shmem_ctx_put32_signal(SHMEM_CTX_DEFAULT, &buf[10], w, 3, &sig[1], 5, SHMEM_SIGNAL_ADD, right);
    shmem_signal_wait_until(&sig[1], SHMEM_CMP_EQ, 10);
    CHECK(((uint32_t *)&buf[10])[2] == 9, "put32_signal data");
    shmem_barrier_all();
    shmem_free(sig);
    shmem_free(buf);
    return test_end("signal");
}
