/*
 * A stand-in for the CUDA driver (libcuda.so.1), for Courier's tests on machines without
 * a GPU. It exports the driver entry points Courier loads, with the driver's names,
 * signatures and error codes, and behaves like a device whose memory the CPU cannot reach:
 *
 * - Device memory is a range of addresses mapped PROT_NONE. Any load or store Courier made
 *   on device memory itself (instead of through the copy functions) faults, and so does a
 *   process_vm_readv/writev or a socket read into it (EFAULT). The bytes live in a second,
 *   writable mapping of the same memfd, which only the copy functions use.
 * - Memory calls fail with CUDA_ERROR_INVALID_CONTEXT on a thread with no current
 *   context, as the real driver does; copies fail with CUDA_ERROR_INVALID_VALUE outside a
 *   live allocation; cuPointerGetAttribute answers CUDA_ERROR_INVALID_VALUE for memory it
 *   does not know (host memory).
 * - A stream belongs to the context it was made in: using it while another context is
 *   current fails with CUDA_ERROR_INVALID_CONTEXT (tests make one current to check that
 *   Courier pushes its own and gives theirs back).
 * - IPC handles work between processes of the same user: a handle names the creator's
 *   pool memfd and the allocation's place in it; opening it takes the fd with
 *   pidfd_getfd and maps the allocation again, with no CPU access, as the real driver
 *   maps a peer's device memory. A process cannot open its own handles, nor one it has
 *   open already (CUDA_ERROR_ALREADY_MAPPED).
 * - Copies on a stream are asynchronous, as the driver's may be: each call checks its
 *   arguments and queues the copy, and cuStreamSynchronize makes the queued copies, in
 *   order. So a host buffer Courier reuses, or a destination it reads, before waiting for
 *   the copy gives wrong bytes here, as it may on a GPU.
 * - MOCKCUDA_DEVICES=0 makes cuInit fail with CUDA_ERROR_NO_DEVICE; MOCKCUDA_NO_IPC_OPEN
 *   makes every cuIpcOpenMemHandle fail.
 * - mockcuda_count(kind) tells tests how many copies of each kind were made
 *   (0 host to device, 1 device to host, 2 device to device), and how many allocations
 *   (3) and opened IPC handles (4) are live, and how many page-locked host allocations
 *   were made (5); mockcuda_thread_count(kind) the copies made on the calling thread.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define OK 0
#define ERR_INVALID_VALUE 1
#define ERR_OUT_OF_MEMORY 2
#define ERR_NOT_INITIALIZED 3
#define ERR_NO_DEVICE 100
#define ERR_INVALID_DEVICE 101
#define ERR_INVALID_CONTEXT 201
#define ERR_ALREADY_MAPPED 208

#define POOL (256UL << 20)
#define MAX_ALLOCS 4096

struct alloc {
    uint64_t base;
    size_t size;
    int live;
    char *shadow; /* the allocation's bytes */
    /* An opened IPC handle: its own mappings, unmapped on close, and which handle. */
    char *map_dev, *map_shadow;
    size_t map_len;
    uint32_t ipc_pid;
    uint64_t ipc_offset;
};

struct ipc_handle {
    char magic[8];
    uint32_t pid;
    int32_t fd;
    uint64_t offset;
    uint64_t size;
    char pad[64 - 32];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited;
static int pool_fd = -1;
static int devices = 1;
static char *dev;    /* what callers see: PROT_NONE */
static char *shadow; /* the bytes */
static size_t top;
static struct alloc allocs[MAX_ALLOCS];
static int nallocs;
static uint64_t counts[6];
static __thread uint64_t thread_counts[3];
static int primary_ctx;
static __thread void *current;
static __thread void *stack[16];
static __thread int depth;

int cuInit(unsigned int flags)
{
    (void)flags;
    const char *d = getenv("MOCKCUDA_DEVICES");
    if (d)
        devices = atoi(d);
    if (devices <= 0)
        return ERR_NO_DEVICE;
    pthread_mutex_lock(&mu);
    if (!inited) {
        int fd = memfd_create("mockcuda", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, POOL) != 0) {
            pthread_mutex_unlock(&mu);
            return ERR_OUT_OF_MEMORY;
        }
        dev = mmap(NULL, POOL, PROT_NONE, MAP_SHARED, fd, 0);
        shadow = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        pool_fd = fd; /* kept open: IPC handles name it */
        if (dev == MAP_FAILED || shadow == MAP_FAILED) {
            pthread_mutex_unlock(&mu);
            return ERR_OUT_OF_MEMORY;
        }
        inited = 1;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

int cuDriverGetVersion(int *v)
{
    *v = 12040;
    return OK;
}

int cuDeviceGetCount(int *n)
{
    if (!inited)
        return ERR_NOT_INITIALIZED;
    *n = devices;
    return OK;
}

int cuDeviceGet(int *d, int ordinal)
{
    if (!inited)
        return ERR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices)
        return ERR_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

int cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    if (len > 0) {
        strncpy(name, "Courier mock GPU", (size_t)len);
        name[len - 1] = 0;
    }
    return OK;
}

int cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    if (!inited)
        return ERR_NOT_INITIALIZED;
    if (d < 0 || d >= devices)
        return ERR_INVALID_DEVICE;
    *ctx = &primary_ctx;
    return OK;
}

int cuCtxGetCurrent(void **ctx)
{
    *ctx = current;
    return OK;
}

int cuCtxSetCurrent(void *ctx)
{
    current = ctx;
    return OK;
}

int cuCtxPushCurrent_v2(void *ctx)
{
    if (depth == 16)
        return ERR_INVALID_VALUE;
    stack[depth++] = current;
    current = ctx;
    return OK;
}

int cuCtxPopCurrent_v2(void **ctx)
{
    if (depth == 0)
        return ERR_INVALID_CONTEXT;
    if (ctx)
        *ctx = current;
    current = stack[--depth];
    return OK;
}

/* Streams are made in, and only usable in, the primary context. */
static int stream_ok(void *s)
{
    return s == (void *)0x57 && current == &primary_ctx;
}

int cuStreamCreate(void **s, unsigned int flags)
{
    (void)flags;
    if (current != &primary_ctx)
        return ERR_INVALID_CONTEXT;
    *s = (void *)0x57;
    return OK;
}

/* Copies queued on the stream, made by cuStreamSynchronize (see the top). */
struct queued {
    int kind; /* 0 host to device, 1 device to host, 2 device to device */
    uint64_t dst, src;
    size_t n;
};
static struct queued *queue;
static size_t queued_len, queued_cap;

static int enqueue(int kind, uint64_t dst, uint64_t src, size_t n)
{
    pthread_mutex_lock(&mu);
    if (queued_len == queued_cap) {
        size_t cap = queued_cap ? queued_cap * 2 : 64;
        struct queued *q = realloc(queue, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&mu);
            return ERR_OUT_OF_MEMORY;
        }
        queue = q;
        queued_cap = cap;
    }
    queue[queued_len++] = (struct queued){kind, dst, src, n};
    pthread_mutex_unlock(&mu);
    return OK;
}

static struct alloc *find(uint64_t p, size_t n);
static char *bytes(uint64_t p);

/* Held while queued copies are made: a synchronize on another thread, whose copies this
 * one may have taken, returns only once they are made. */
static pthread_mutex_t making = PTHREAD_MUTEX_INITIALIZER;

int cuStreamSynchronize(void *s)
{
    if (!stream_ok(s))
        return ERR_INVALID_CONTEXT;
    pthread_mutex_lock(&making);
    pthread_mutex_lock(&mu);
    struct queued *q = queue;
    size_t len = queued_len;
    queue = NULL;
    queued_len = queued_cap = 0;
    pthread_mutex_unlock(&mu);
    int rc = OK;
    for (size_t i = 0; i < len; i++) {
        struct queued c = q[i];
        /* Device memory freed (or closed) before its copy was made: the copy fails. */
        int dev_dst = c.kind != 1, dev_src = c.kind != 0;
        if ((dev_dst && !find(c.dst, c.n)) || (dev_src && !find(c.src, c.n))) {
            rc = ERR_INVALID_VALUE;
            continue;
        }
        char *d = dev_dst ? bytes(c.dst) : (char *)(uintptr_t)c.dst;
        char *from = dev_src ? bytes(c.src) : (char *)(uintptr_t)c.src;
        memmove(d, from, c.n);
    }
    pthread_mutex_unlock(&making);
    free(q);
    return rc;
}

int cuMemAlloc_v2(uint64_t *p, size_t n)
{
    if (!current)
        return ERR_INVALID_CONTEXT;
    if (n == 0)
        return ERR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    size_t need = (n + 255) & ~(size_t)255;
    if (top + need > POOL || nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock(&mu);
        return ERR_OUT_OF_MEMORY;
    }
    allocs[nallocs].base = (uint64_t)(uintptr_t)(dev + top);
    allocs[nallocs].size = n;
    allocs[nallocs].live = 1;
    allocs[nallocs].shadow = shadow + top;
    allocs[nallocs].map_dev = NULL;
    *p = allocs[nallocs].base;
    nallocs++;
    top += need;
    counts[3]++;
    pthread_mutex_unlock(&mu);
    return OK;
}

int cuMemFree_v2(uint64_t p)
{
    if (!current)
        return ERR_INVALID_CONTEXT;
    int rc = ERR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && !allocs[i].map_dev && allocs[i].base == p) {
            allocs[i].live = 0;
            counts[3]--;
            rc = OK;
            break;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Page-locked host memory: plain heap memory here, each allocation counted (kind 5). As
 * with the driver, a context must be current. */
int cuMemHostAlloc(void **pp, size_t n, unsigned int flags)
{
    (void)flags;
    if (!current)
        return ERR_INVALID_CONTEXT;
    if (n == 0)
        return ERR_INVALID_VALUE;
    void *p = malloc(n);
    if (!p)
        return ERR_OUT_OF_MEMORY;
    *pp = p;
    pthread_mutex_lock(&mu);
    counts[5]++;
    pthread_mutex_unlock(&mu);
    return OK;
}

int cuMemFreeHost(void *p)
{
    if (!p)
        return ERR_INVALID_VALUE;
    free(p);
    return OK;
}

/* The live allocation holding [p, p + n), or NULL. */
static struct alloc *find(uint64_t p, size_t n)
{
    struct alloc *a = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && p >= allocs[i].base && p - allocs[i].base < allocs[i].size &&
            n <= allocs[i].size - (p - allocs[i].base)) {
            a = &allocs[i];
            break;
        }
    pthread_mutex_unlock(&mu);
    return a;
}

static char *bytes(uint64_t p)
{
    struct alloc *a = find(p, 1);
    return a->shadow + (p - a->base);
}

static int count(int k)
{
    pthread_mutex_lock(&mu);
    counts[k]++;
    pthread_mutex_unlock(&mu);
    thread_counts[k]++;
    return OK;
}

int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s)
{
    if (!stream_ok(s))
        return ERR_INVALID_CONTEXT;
    if (!find(dst, n))
        return ERR_INVALID_VALUE;
    int rc = enqueue(0, dst, (uint64_t)(uintptr_t)src, n);
    return rc != OK ? rc : count(0);
}

int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s)
{
    if (!stream_ok(s))
        return ERR_INVALID_CONTEXT;
    if (!find(src, n))
        return ERR_INVALID_VALUE;
    int rc = enqueue(1, (uint64_t)(uintptr_t)dst, src, n);
    return rc != OK ? rc : count(1);
}

int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void *s)
{
    if (!stream_ok(s))
        return ERR_INVALID_CONTEXT;
    if (!find(dst, n) || !find(src, n))
        return ERR_INVALID_VALUE;
    int rc = enqueue(2, dst, src, n);
    return rc != OK ? rc : count(2);
}

int cuPointerGetAttribute(void *data, int attr, uint64_t p)
{
    if (!inited)
        return ERR_NOT_INITIALIZED;
    if (!find(p, 1))
        return ERR_INVALID_VALUE;
    switch (attr) {
    case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
        *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
        return OK;
    case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
        *(unsigned int *)data = 0;
        return OK;
    default:
        return ERR_INVALID_VALUE;
    }
}

int cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t p)
{
    if (!current)
        return ERR_INVALID_CONTEXT;
    struct alloc *a = find(p, 1);
    if (!a)
        return ERR_INVALID_VALUE;
    if (base)
        *base = a->base;
    if (size)
        *size = a->size;
    return OK;
}

int cuGetErrorName(int rc, const char **s)
{
    switch (rc) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case ERR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case ERR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case ERR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case ERR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
    case ERR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case ERR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case ERR_ALREADY_MAPPED: *s = "CUDA_ERROR_ALREADY_MAPPED"; return OK;
    default: *s = 0; return ERR_INVALID_VALUE;
    }
}

int cuIpcGetMemHandle(struct ipc_handle *h, uint64_t p)
{
    if (!current)
        return ERR_INVALID_CONTEXT;
    struct alloc *a = find(p, 1);
    if (!a || a->map_dev || a->base != p)
        return ERR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->magic, "MOCKIPC1", 8);
    h->pid = (uint32_t)getpid();
    h->fd = pool_fd;
    h->offset = a->shadow - shadow;
    h->size = a->size;
    return OK;
}

int cuIpcOpenMemHandle_v2(uint64_t *p, struct ipc_handle h, unsigned int flags)
{
    (void)flags;
    if (!current)
        return ERR_INVALID_CONTEXT;
    if (getenv("MOCKCUDA_NO_IPC_OPEN"))
        return ERR_INVALID_VALUE; /* a process that cannot open peers' handles */
    if (memcmp(h.magic, "MOCKIPC1", 8) != 0 || h.size == 0)
        return ERR_INVALID_VALUE;
    if (h.pid == (uint32_t)getpid())
        return ERR_INVALID_CONTEXT; /* as the driver: not in the creating process */
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)h.pid, 0);
    if (pidfd < 0)
        return ERR_INVALID_VALUE;
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, h.fd, 0);
    close(pidfd);
    if (fd < 0)
        return ERR_INVALID_VALUE;
    uint64_t start = h.offset & ~(uint64_t)4095;
    size_t len = (size_t)(h.offset + h.size - start);
    char *d = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, (off_t)start);
    char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (d == MAP_FAILED || b == MAP_FAILED)
        return ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && allocs[i].map_dev && allocs[i].ipc_pid == h.pid &&
            allocs[i].ipc_offset == h.offset) {
            /* As the driver: a handle is opened once per process until it is closed. */
            pthread_mutex_unlock(&mu);
            munmap(d, len);
            munmap(b, len);
            return ERR_ALREADY_MAPPED;
        }
    if (nallocs == MAX_ALLOCS) {
        pthread_mutex_unlock(&mu);
        munmap(d, len);
        munmap(b, len);
        return ERR_OUT_OF_MEMORY;
    }
    struct alloc *a = &allocs[nallocs++];
    a->base = (uint64_t)(uintptr_t)(d + (h.offset - start));
    a->size = h.size;
    a->live = 1;
    a->shadow = b + (h.offset - start);
    a->map_dev = d;
    a->map_shadow = b;
    a->map_len = len;
    a->ipc_pid = h.pid;
    a->ipc_offset = h.offset;
    *p = a->base;
    counts[4]++;
    pthread_mutex_unlock(&mu);
    return OK;
}

int cuIpcCloseMemHandle(uint64_t p)
{
    if (!current)
        return ERR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && allocs[i].map_dev && allocs[i].base == p) {
            allocs[i].live = 0;
            munmap(allocs[i].map_dev, allocs[i].map_len);
            munmap(allocs[i].map_shadow, allocs[i].map_len);
            counts[4]--;
            pthread_mutex_unlock(&mu);
            return OK;
        }
    pthread_mutex_unlock(&mu);
    return ERR_INVALID_VALUE;
}

/* The copies of a kind made on the calling thread. */
uint64_t mockcuda_thread_count(int kind)
{
    return kind >= 0 && kind < 3 ? thread_counts[kind] : 0;
}

uint64_t mockcuda_count(int kind)
{
    if (kind < 0 || kind > 5)
        return 0;
    pthread_mutex_lock(&mu);
    uint64_t v = counts[kind];
    pthread_mutex_unlock(&mu);
    return v;
}
