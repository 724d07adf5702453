/* EXS registrations moved into shared memory in place (src/exs/inplace.rs): a large
 * registration of memory mapped for the buffer itself becomes a shared segment at the same
 * addresses (read back from /proc/self/maps), contents kept, and private memory again,
 * contents kept, when it is deregistered. Memory that holds other data (the brk heap, a
 * bss, a stack, a file mapping), a small registration, pages already moved, and
 * COURIER_EXS_SHARE_MIN=off stay as they are. Then STREAM data between two processes
 * from a moved buffer into a moved buffer at unaligned addresses, by every path
 * (put-with-signal, split placement, eager), every byte checked. */
#include "exs_procs.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

#define K 1024u
#define M (1024u * 1024u)

static exs_qhandle_t q;
static struct sockaddr_storage addr;
static socklen_t addrlen;

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* What /proc/self/maps says of the pages holding [p, p + n): 's' when one shared
 * courier-in-place segment covers them all, 'p' when private anonymous memory does, '?'
 * for anything else or a mix. */
static char pages_are(const void *p, size_t n)
{
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(page() - 1), end = (uintptr_t)p + n;
    FILE *f = fopen("/proc/self/maps", "r");
    EXPECT(f);
    char line[512];
    char kind = 0;
    uintptr_t at = start;
    while (at < end && fgets(line, sizeof line, f)) {
        unsigned long a, b, ino;
        char perms[8], path[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %255s", &a, &b, perms, &ino, path) < 4)
            continue;
        if (b <= at)
            continue;
        char k = '?';
        if (a <= at && strncmp(perms, "rw-s", 4) == 0 && strstr(path, "courier-in-place"))
            k = 's';
        else if (a <= at && strncmp(perms, "rw-p", 4) == 0 && ino == 0 && path[0] != '[')
            k = 'p';
        if (k == '?' || (kind && kind != k)) {
            kind = '?';
            break;
        }
        kind = k;
        at = b;
    }
    fclose(f);
    return at >= end ? kind : '?';
}

/* Fresh private anonymous pages of their own, with a hole on each side: the kernel never
 * merges them with a neighbouring mapping (a thread's stack, say), which would make them
 * look like that neighbour to the library. */
static unsigned char *own_pages(size_t n)
{
    size_t pg = page(), whole = (n + pg - 1) / pg * pg;
    unsigned char *p = mmap(NULL, whole + 2 * pg, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(p != MAP_FAILED);
    EXPECT(munmap(p, pg) == 0 && munmap(p + pg + whole, pg) == 0);
    return p + pg;
}

/* Registered (whole, from 100 bytes into its first page) and deregistered: moved and back,
 * the bytes of all its pages kept both ways. */
static void moved_and_back(void)
{
    size_t n = 3 * M;
    unsigned char *base = own_pages(n);
    fill(base, n, 11);
    unsigned char *buf = base + 100;
    size_t len = 2 * M + 5;
    EXPECT(pages_are(buf, len) == 'p');
    exs_mhandle_t mh = exs_mregister(buf, len, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID);
    EXPECT(pages_are(buf, len) == 's');
    EXPECT(verify(base, n, 11));
    /* Written through the segment, read after it is private again. */
    memset(buf, 0x5a, 4096);
    fill(buf + 4096, len - 4096, 12);
    XCHECK(exs_mderegister(mh));
    EXPECT(pages_are(buf, len) == 'p');
    EXPECT(buf[0] == 0x5a && buf[4095] == 0x5a && verify(buf + 4096, len - 4096, 12));
    EXPECT(verify(base, 100, 11)); /* the first page's bytes before the region */
    munmap(base, n);
    printf("exs_share: moved into a shared segment and back, contents kept: OK\n");
}

static unsigned char bss_buf[512 * K];

/* Registrations that must stay where they are, each still usable. */
static void stays(void)
{
    /* Too small (the default COURIER_EXS_SHARE_MIN is 64k). */
    unsigned char *small = own_pages(1 * M);
    exs_mhandle_t a = exs_mregister(small, 60 * K, 0);
    EXPECT(a != EXS_MHANDLE_INVALID && pages_are(small, 60 * K) == 'p');
    /* A bss. */
    exs_mhandle_t b = exs_mregister(bss_buf + 8, sizeof(bss_buf) - 8, 0);
    EXPECT(b != EXS_MHANDLE_INVALID && pages_are(bss_buf + 8, sizeof(bss_buf) - 8) != 's');
    /* The bss's pages past those its file's data shares: anonymous memory, yet it stays. */
    uintptr_t past = ((uintptr_t)bss_buf + 2 * page() - 1) & ~(uintptr_t)(page() - 1);
    size_t past_len = (size_t)((uintptr_t)bss_buf + sizeof(bss_buf) - past);
    exs_mhandle_t b2 = exs_mregister((void *)past, past_len, 0);
    EXPECT(b2 != EXS_MHANDLE_INVALID && pages_are((void *)past, past_len) == 'p');
    /* The main thread's stack. */
    unsigned char on_stack[256 * K];
    memset(on_stack, 1, sizeof on_stack);
    exs_mhandle_t c = exs_mregister(on_stack, sizeof on_stack, 0);
    EXPECT(c != EXS_MHANDLE_INVALID && pages_are(on_stack, sizeof on_stack) != 's');
    /* The brk heap (kept below the mmap threshold). */
    mallopt(M_MMAP_THRESHOLD, 64 * M);
    unsigned char *heap = malloc(300 * K);
    EXPECT(heap);
    exs_mhandle_t d = exs_mregister(heap, 300 * K, 0);
    EXPECT(d != EXS_MHANDLE_INVALID && pages_are(heap, 300 * K) != 's');
    /* A private file mapping. */
    FILE *tf = tmpfile();
    EXPECT(tf && ftruncate(fileno(tf), 1 * M) == 0);
    unsigned char *fm = mmap(NULL, 1 * M, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(tf), 0);
    EXPECT(fm != MAP_FAILED);
    exs_mhandle_t e = exs_mregister(fm, 1 * M, 0);
    EXPECT(e != EXS_MHANDLE_INVALID && pages_are(fm, 1 * M) == '?');
    /* Pages already moved never move again: the inner registration stays in the outer's
     * segment, and ends without taking the pages back. */
    unsigned char *outer = own_pages(2 * M);
    fill(outer, 2 * M, 13);
    exs_mhandle_t o = exs_mregister(outer, 2 * M, 0);
    exs_mhandle_t i = exs_mregister(outer + 4096, 1 * M, 0);
    EXPECT(o != EXS_MHANDLE_INVALID && i != EXS_MHANDLE_INVALID);
    EXPECT(pages_are(outer, 2 * M) == 's');
    XCHECK(exs_mderegister(i));
    EXPECT(pages_are(outer, 2 * M) == 's');
    XCHECK(exs_mderegister(o));
    EXPECT(pages_are(outer, 2 * M) == 'p' && verify(outer, 2 * M, 13));
    /* Unmapped before its deregistration: the deregistration leaves the new memory there
     * alone. */
    unsigned char *gone = own_pages(1 * M);
    exs_mhandle_t g = exs_mregister(gone, 1 * M, 0);
    EXPECT(g != EXS_MHANDLE_INVALID && pages_are(gone, 1 * M) == 's');
    munmap(gone, 1 * M);
    unsigned char *again = mmap(gone, 1 * M, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    EXPECT(again != MAP_FAILED);
    memset(again, 0x77, 1 * M);
    XCHECK(exs_mderegister(g));
    EXPECT(again[0] == 0x77 && again[1 * M - 1] == 0x77);
    munmap(again, 1 * M);
    XCHECK(exs_mderegister(a));
    XCHECK(exs_mderegister(b));
    XCHECK(exs_mderegister(b2));
    XCHECK(exs_mderegister(c));
    XCHECK(exs_mderegister(d));
    XCHECK(exs_mderegister(e));
    free(heap);
    munmap(fm, 1 * M);
    fclose(tf);
    munmap(small, 1 * M);
    mallopt(M_MMAP_THRESHOLD, 128 * K);
    printf("exs_share: heap, bss, stack, file, small and moved pages stay: OK\n");
}

/* In another thread: a buffer on its stack and one from its malloc arena stay. */
static void *in_a_thread(void *arg)
{
    (void)arg;
    unsigned char on_stack[256 * K];
    memset(on_stack, 2, sizeof on_stack);
    exs_mhandle_t a = exs_mregister(on_stack, sizeof on_stack, 0);
    EXPECT(a != EXS_MHANDLE_INVALID && pages_are(on_stack, sizeof on_stack) != 's');
    unsigned char *arena = malloc(300 * K);
    EXPECT(arena);
    exs_mhandle_t b = exs_mregister(arena, 300 * K, 0);
    EXPECT(b != EXS_MHANDLE_INVALID && pages_are(arena, 300 * K) != 's');
    XCHECK(exs_mderegister(a));
    XCHECK(exs_mderegister(b));
    free(arena);
    return NULL;
}

static void stays_in_a_thread(void)
{
    mallopt(M_MMAP_THRESHOLD, 64 * M);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, in_a_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    mallopt(M_MMAP_THRESHOLD, 128 * K);
    printf("exs_share: a thread's stack and malloc arena stay: OK\n");
}

/* With COURIER_EXS_SHARE_MIN=off nothing moves (a child: the setting is read at exs_init). */
static int switched_off(void *arg)
{
    (void)arg;
    setenv("COURIER_EXS_SHARE_MIN", "off", 1);
    child_init();
    unsigned char *p = own_pages(2 * M);
    exs_mhandle_t mh = exs_mregister(p, 2 * M, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID && pages_are(p, 2 * M) == 'p');
    return 0;
}

/* Sizes sent: eager and put-with-signal (below the split), split placements, and a
 * chunk that ends mid-page. */
static const size_t sends[] = {1000, 100 * K, 300 * K, 1 * M + 5, 64 * K, 2 * M, 517};
#define NSENDS (sizeof(sends) / sizeof(sends[0]))

static size_t total_sent(void)
{
    size_t t = 0;
    for (size_t i = 0; i < NSENDS; i++)
        t += sends[i];
    return t;
}

static int sender(void *arg)
{
    (void)arg;
    exs_qhandle_t cq = child_init();
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    XCHECK(fd);
    XCHECK(exs_connect(fd, (struct sockaddr *)&addr, addrlen, cq, NULL));
    expect_event(cq, EXS_EVT_CONNECT, NULL);
    size_t total = total_sent();
    unsigned char *base = own_pages(total + 2 * page());
    unsigned char *out = base + 333;
    fill(out, total, 21);
    exs_mhandle_t mh = exs_mregister(out, total, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID && pages_are(out, total) == 's');
    size_t off = 0;
    for (size_t i = 0; i < NSENDS; i++) {
        XCHECK(exs_send(fd, out + off, sends[i], 0, cq, (void *)sends[i], mh));
        off += sends[i];
    }
    for (size_t i = 0; i < NSENDS; i++) {
        exs_event_t e = next_event(cq);
        EXPECT(e.exs_evt_type == EXS_EVT_SEND && (size_t)e.exs_evt_result == (size_t)e.exs_evt_ahandle);
    }
    XCHECK(exs_close(fd, cq, NULL));
    expect_event(cq, EXS_EVT_CLOSE, NULL);
    XCHECK(exs_mderegister(mh));
    EXPECT(pages_are(out, total) == 'p' && verify(out, total, 21));
    return 0;
}

/* Receives the size of each send, posted before the data comes, into one moved buffer. */
static void between_processes(void)
{
    int lfd = listen_socket(OVER_COURIER, SOCK_STREAM, &addr, &addrlen);
    pid_t child = spawn(sender, NULL);
    XCHECK(exs_accept(lfd, NULL, NULL, q, (void *)77));
    int fd = (int)expect_event(q, EXS_EVT_ACCEPT, (void *)77).exs_evt_result;
    char tr[16];
    transport_of(fd, tr, sizeof(tr));
    size_t total = total_sent();
    unsigned char *base = own_pages(total + 2 * page());
    unsigned char *in = base + 4000;
    memset(in, 0xcc, total);
    exs_mhandle_t mh = exs_mregister(in, total, 0);
    EXPECT(mh != EXS_MHANDLE_INVALID && pages_are(in, total) == 's');
    size_t off = 0;
    for (size_t i = 0; i < NSENDS; i++) {
        XCHECK(exs_recv(fd, in + off, sends[i], MSG_WAITALL, q, (void *)i, mh));
        off += sends[i];
    }
    for (size_t i = 0; i < NSENDS; i++) {
        exs_event_t e = next_event(q);
        EXPECT(e.exs_evt_type == EXS_EVT_RECV && (size_t)e.exs_evt_result == sends[(size_t)e.exs_evt_ahandle]);
    }
    EXPECT(verify(in, total, 21));
    EXPECT(child_status(child) == 0);
    XCHECK(exs_close(fd, q, (void *)9));
    expect_event(q, EXS_EVT_CLOSE, (void *)9);
    XCHECK(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    XCHECK(exs_mderegister(mh));
    EXPECT(pages_are(in, total) == 'p' && verify(in, total, 21));
    munmap(base, total + 2 * page());
    printf("exs_share: %zu bytes between processes (%s), moved buffers at both ends: OK\n", total, tr);
}

int main(void)
{
    watchdog(120);
    srandom((unsigned)getpid());
    XCHECK(exs_init(EXS_VERSION));
    q = exs_qcreate(64);
    XCHECK(q);
    moved_and_back();
    stays();
    stays_in_a_thread();
    EXPECT(child_status(spawn(switched_off, NULL)) == 0);
    between_processes();
    XCHECK(exs_qdelete(q));
    printf("exs_share: OK\n");
    return 0;
}
