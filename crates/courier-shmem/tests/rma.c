/* RMA: put, get, p, g, iput, iget, the _nbi forms, sized and mem forms, on the heap and on
 * global and static data, to every PE, small to large. */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

#define BIG (1 << 20)
static long gl_long[64];
static char gl_bytes[BIG];
int gl_int;
static double gl_strided[40];

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;
    char *heap = shmem_malloc(BIG);
    char *src = malloc(BIG);
    CHECK(heap != NULL, "shmem_malloc(%d)", BIG);

    /* Every size from 1 byte to 1 MiB, heap then data segment, to the right neighbour. */
    for (size_t len = 1; len <= BIG; len *= 4) {
        for (size_t i = 0; i < len; i++) src[i] = (char)(me * 31 + i * 7 + len);
        memset(heap, 0, BIG);
        memset(gl_bytes, 0, BIG);
        shmem_barrier_all();
        shmem_putmem(heap, src, len, right);
        shmem_char_put(gl_bytes, src, len, right);
        shmem_barrier_all();
        for (size_t i = 0; i < len; i++) {
            char want = (char)(left * 31 + i * 7 + len);
            if (heap[i] != want || gl_bytes[i] != want) {
                CHECK(0, "len %zu byte %zu: heap %d data %d want %d", len, i, heap[i], gl_bytes[i], want);
                break;
            }
        }
        /* Read back from the left neighbour what it received from its own left. */
        char *back = malloc(len);
        shmem_getmem(back, heap, len, left);
        int ll = (left + n - 1) % n;
        for (size_t i = 0; i < len; i++) {
            if (back[i] != (char)(ll * 31 + i * 7 + len)) {
                CHECK(0, "get len %zu byte %zu", len, i);
                break;
            }
        }
        /* The left neighbour's global copy holds the same bytes as its heap copy. */
        char *back2 = malloc(len);
        shmem_char_get(back2, gl_bytes, len, left);
        CHECK(memcmp(back, back2, len) == 0, "get from the data segment, len %zu", len);
        free(back);
        free(back2);
        shmem_barrier_all();
    }

    /* p and g on globals of several types, every PE to every PE. */
    gl_int = -1;
    for (int i = 0; i < 64; i++) gl_long[i] = 0;
    shmem_barrier_all();
    for (int pe = 0; pe < n; pe++) {
        shmem_long_p(&gl_long[me], 1000 + me, pe);
        shmem_int_p(&gl_int, pe, pe);
    }
    shmem_barrier_all();
    for (int pe = 0; pe < n; pe++) {
        CHECK(gl_long[pe] == 1000 + pe, "gl_long[%d] = %ld", pe, gl_long[pe]);
        CHECK(shmem_long_g(&gl_long[me], pe) == 1000 + me, "g from %d", pe);
        CHECK(shmem_int_g(&gl_int, pe) == pe, "int g from %d", pe);
    }
    float *hf = shmem_malloc(sizeof(float) * n);
    shmem_barrier_all();
    shmem_float_p(&hf[me], 0.5f + me, right);
    shmem_barrier_all();
    CHECK(hf[left] == 0.5f + left, "float p: %f", hf[left]);
    CHECK(shmem_float_g(&hf[me], right) == 0.5f + me, "float g");

    /* Strided: every third element of a local array into every second of a global. */
    double loc[40];
    for (int i = 0; i < 40; i++) { loc[i] = me * 100 + i; gl_strided[i] = -1; }
    shmem_barrier_all();
    shmem_double_iput(gl_strided, loc, 2, 3, 10, right);
    shmem_barrier_all();
    for (int k = 0; k < 10; k++) CHECK(gl_strided[2 * k] == left * 100 + 3 * k, "iput elem %d: %f", k, gl_strided[2 * k]);
    CHECK(gl_strided[1] == -1, "iput wrote between strides");
    double got[10];
    shmem_double_iget(got, gl_strided, 1, 2, 10, right);
    for (int k = 0; k < 10; k++) CHECK(got[k] == me * 100 + 3 * k, "iget elem %d: %f", k, got[k]);
    shmem_barrier_all();

    /* Sized forms and _nbi, completed by quiet; and a context. */
    uint64_t *h64 = shmem_calloc(n, 8);
    uint32_t v32[4] = {1, 2, 3, 4};
    uint32_t *h32 = shmem_calloc(4 * n, 4);
    shmem_barrier_all();
    uint64_t mine = 0xabcdef00u + me;
    for (int pe = 0; pe < n; pe++) {
        shmem_put64_nbi(&h64[me], &mine, 1, pe);
        shmem_put32(&h32[4 * me], v32, 4, pe);
    }
    shmem_quiet();
    shmem_barrier_all();
    for (int pe = 0; pe < n; pe++) {
        CHECK(h64[pe] == 0xabcdef00u + (uint64_t)pe, "put64_nbi from %d", pe);
        CHECK(h32[4 * pe + 3] == 4, "put32 from %d", pe);
    }
    uint64_t fetched[8] = {0};
    for (int pe = 0; pe < n && pe < 8; pe++) shmem_get64_nbi(&fetched[pe], &h64[pe], 1, pe);
    shmem_quiet();
    for (int pe = 0; pe < n && pe < 8; pe++) CHECK(fetched[pe] == 0xabcdef00u + (uint64_t)pe, "get64_nbi %d", pe);
    shmem_ctx_t ctx;
    CHECK(shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx) == 0, "ctx create");
    long v = 7000 + me;
    shmem_ctx_long_put(ctx, &gl_long[0], &v, 1, right);
    shmem_ctx_quiet(ctx);
    shmem_ctx_destroy(ctx);
    shmem_barrier_all();
    CHECK(gl_long[0] == 7000 + left, "ctx put: %ld", gl_long[0]);

    /* A child made by fork gets its own copy of the globals (the data segment is shared
     * with peers, not with children): it sees what was there, and its writes stay its own. */
    shmem_barrier_all();
    fflush(stdout);
    char byte0 = gl_bytes[0] == 0x5a ? 0x5b : gl_bytes[0];
    gl_bytes[0] = byte0;
    pid_t kid = fork();
    CHECK(kid >= 0, "fork");
    if (kid == 0) {
        int saw = gl_long[0] == 7000 + left;
        gl_long[0] = -1;
        memset(gl_bytes, 0x5a, 4096);
        _exit(saw ? 0 : 3);
    }
    int status = 0;
    CHECK(waitpid(kid, &status, 0) == kid && WIFEXITED(status), "waitpid");
    CHECK(WEXITSTATUS(status) == 0, "the forked child did not see the globals' values");
    CHECK(gl_long[0] == 7000 + left && gl_bytes[0] == byte0,
          "the forked child's writes reached its parent: %ld", gl_long[0]);

    shmem_free(heap);
    shmem_free(hf);
    shmem_free(h64);
    shmem_free(h32);
    free(src);
    return test_end("rma");
}
