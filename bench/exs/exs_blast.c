/* exs-blast: one-way throughput of EXS SOCK_STREAM against message size and the number of
 * messages outstanding, with the CPU time (user, system) of both processes, as UNH-EXS's
 * blast. The receiver (this process) keeps O receives posted (MSG_WAITALL), the sender (a
 * child) keeps O sends in flight.
 *
 *   exs-blast [-k courier|tcp|unix] [-s SIZES] [-o COUNTS] [-t SECONDS] [-b] [-c RCPU,SCPU]
 *             [-S SPLIT_MIN]
 *
 * -k: EXS sockets over Courier (COURIER_TLS picks shm or tcp), or kernel TCP loopback or
 * Unix stream sockets through the same calls. -s, -o: comma lists (sizes take K and M).
 * -t: seconds per point (0.3). -b: busy-polling (default: the completion thread). -c: pin
 * the receiver and the sender (and their completion threads) to these CPUs. -S: the
 * sender's EXS_F_SPLIT_MIN (Courier: sends from this size into a whole advertised receive
 * are copied by both processes over shared memory; 0: never; default: the library's).
 * Prints one JSON line per point. */
#include "exs_bench.h"

static enum over over = OVER_COURIER;
static size_t sizes[32] = {4096, 65536, 524288, 2097152, 16777216};
static int nsizes = 5;
static int counts[16] = {1, 4, 16};
static int ncounts = 3;
static double secs = 0.3;
static int busy = 0;
static int cpus[2] = {-1, -1};
static long split_min = -1;

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    return v;
}

struct result {
    double secs, user, sys;
};

static void setup(int cpu)
{
    pin(cpu);
    X(exs_init(EXS_VERSION));
    X(exs_fcntl(-1, EXS_F_BUSY_POLL, busy));
    if (cpu >= 0)
        X(exs_fcntl(-1, EXS_F_CPU, cpu));
}

/* The receiver: per point, reads N from the sender, posts, says ready, counts N. */
static int receiver(int to_child, int from_child, pid_t child)
{
    setup(cpus[0]);
    exs_qhandle_t q = exs_qcreate(64);
    X(q);
    struct sockaddr_storage ss;
    socklen_t len;
    int lfd = listen_on(over, &ss, &len);
    pipe_write(to_child, &len, sizeof(len));
    pipe_write(to_child, &ss, sizeof(ss));
    int fd = accept_on(lfd, q, over);
    size_t maxs = 0;
    int maxo = 0;
    for (int i = 0; i < nsizes; i++)
        maxs = sizes[i] > maxs ? sizes[i] : maxs;
    for (int i = 0; i < ncounts; i++)
        maxo = counts[i] > maxo ? counts[i] : maxo;
    unsigned char *buf = malloc(maxs * (size_t)maxo);
    if (!buf)
        DIE("malloc");
    memset(buf, 0, maxs * (size_t)maxo);
    exs_mhandle_t mh = exs_mregister(buf, maxs * (size_t)maxo, 0);
    X(mh == EXS_MHANDLE_INVALID ? -1 : 0);
    for (;;) {
        long hdr[3];
        pipe_read(from_child, hdr, sizeof(hdr));
        long n = hdr[0], o = hdr[2];
        size_t s = (size_t)hdr[1];
        if (n == 0)
            break;
        long posted = 0, got = 0;
        for (; posted < o && posted < n; posted++)
            X(exs_recv(fd, buf + (size_t)posted * s, s, MSG_WAITALL, q, (void *)(uintptr_t)posted, mh));
        double u0, s0, u1, s1;
        cpu_s(&u0, &s0);
        pipe_write(to_child, "r", 1);
        while (got < n) {
            exs_event_t ev = next_ev(q);
            if ((size_t)ev.exs_evt_result != s)
                DIE("received %zd of %zu", ev.exs_evt_result, s);
            got++;
            if (posted < n) {
                X(exs_recv(fd, ev.exs_evt_buf, s, MSG_WAITALL, q, ev.exs_evt_ahandle, mh));
                posted++;
            }
        }
        cpu_s(&u1, &s1);
        struct result r = {0, u1 - u0, s1 - s0};
        pipe_write(to_child, &r, sizeof(r));
    }
    X(exs_close(fd, q, NULL));
    next_ev(q);
    X(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    return reap(child);
}

/* One run of n messages of s bytes, o outstanding; the receiver's CPU comes back. */
static struct result run(int fd, exs_qhandle_t q, exs_mhandle_t mh, unsigned char *buf, long n,
                         size_t s, int o, int to_parent, int from_parent, struct result *rcv)
{
    long hdr[3] = {n, (long)s, o};
    pipe_write(to_parent, hdr, sizeof(hdr));
    char c;
    pipe_read(from_parent, &c, 1);
    double u0, s0, u1, s1;
    cpu_s(&u0, &s0);
    double t0 = now_s();
    long posted = 0, done = 0;
    for (; posted < o && posted < n; posted++)
        X(exs_send(fd, buf + (size_t)posted * s, s, 0, q, (void *)(uintptr_t)posted, mh));
    while (done < n) {
        exs_event_t ev = next_ev(q);
        done++;
        if (posted < n) {
            X(exs_send(fd, ev.exs_evt_buf, s, 0, q, ev.exs_evt_ahandle, mh));
            posted++;
        }
    }
    pipe_read(from_parent, rcv, sizeof(*rcv));
    double t1 = now_s();
    cpu_s(&u1, &s1);
    struct result r = {t1 - t0, u1 - u0, s1 - s0};
    return r;
}

static int sender(int to_parent, int from_parent)
{
    setup(cpus[1]);
    exs_qhandle_t q = exs_qcreate(64);
    X(q);
    struct sockaddr_storage ss;
    socklen_t len;
    pipe_read(from_parent, &len, sizeof(len));
    pipe_read(from_parent, &ss, sizeof(ss));
    int fd = connect_to(over, q, &ss, len);
    if (split_min >= 0 && over == OVER_COURIER)
        X(exs_fcntl(fd, EXS_F_SPLIT_MIN, split_min));
    size_t maxs = 0;
    int maxo = 0;
    for (int i = 0; i < nsizes; i++)
        maxs = sizes[i] > maxs ? sizes[i] : maxs;
    for (int i = 0; i < ncounts; i++)
        maxo = counts[i] > maxo ? counts[i] : maxo;
    unsigned char *buf = malloc(maxs * (size_t)maxo);
    if (!buf)
        DIE("malloc");
    for (size_t i = 0; i < maxs * (size_t)maxo; i++)
        buf[i] = (unsigned char)(i * 7);
    exs_mhandle_t mh = exs_mregister(buf, maxs * (size_t)maxo, 0);
    X(mh == EXS_MHANDLE_INVALID ? -1 : 0);
    for (int i = 0; i < nsizes; i++) {
        for (int j = 0; j < ncounts; j++) {
            size_t s = sizes[i];
            int o = counts[j];
            struct result rcv;
            /* Calibrate, then a run of about `secs`. */
            long n0 = 4L * o < 32 ? 32 : 4L * o;
            struct result w = run(fd, q, mh, buf, n0, s, o, to_parent, from_parent, &rcv);
            long n = (long)((double)n0 * secs / (w.secs > 1e-6 ? w.secs : 1e-6));
            if (n < n0)
                n = n0;
            if (n > 2000000)
                n = 2000000;
            struct result r = run(fd, q, mh, buf, n, s, o, to_parent, from_parent, &rcv);
            double bytes = (double)n * (double)s;
            printf("{\"test\":\"blast\",\"over\":\"%s\",\"busy\":%d,\"pinned\":%d,\"size\":%zu,"
                   "\"outstanding\":%d,\"msgs\":%ld,\"secs\":%.6f,\"gbps\":%.4f,"
                   "\"snd_user\":%.6f,\"snd_sys\":%.6f,\"rcv_user\":%.6f,\"rcv_sys\":%.6f}\n",
                   over_name(over), busy, cpus[0] >= 0, s, o, n, r.secs, bytes / r.secs / 1e9,
                   r.user, r.sys, rcv.user, rcv.sys);
            fflush(stdout);
        }
    }
    long stop[3] = {0, 0, 0};
    pipe_write(to_parent, stop, sizeof(stop));
    X(exs_close(fd, q, NULL));
    next_ev(q);
    return 0;
}

int main(int argc, char **argv)
{
    int opt;
    while ((opt = getopt(argc, argv, "k:s:o:t:bc:S:")) != -1) {
        switch (opt) {
        case 'k':
            over = parse_over(optarg);
            break;
        case 's':
            nsizes = 0;
            for (char *t = strtok(optarg, ","); t && nsizes < 32; t = strtok(NULL, ","))
                sizes[nsizes++] = parse_size(t);
            break;
        case 'o':
            ncounts = 0;
            for (char *t = strtok(optarg, ","); t && ncounts < 16; t = strtok(NULL, ","))
                counts[ncounts++] = atoi(t);
            break;
        case 't':
            secs = atof(optarg);
            break;
        case 'b':
            busy = 1;
            break;
        case 'c':
            if (sscanf(optarg, "%d,%d", &cpus[0], &cpus[1]) != 2)
                DIE("-c RCPU,SCPU");
            break;
        case 'S':
            split_min = (long)parse_size(optarg);
            break;
        default:
            DIE("usage: exs-blast [-k courier|tcp|unix] [-s SIZES] [-o COUNTS] [-t SECONDS] [-b] [-c RCPU,SCPU] [-S SPLIT_MIN]");
        }
    }
    for (int j = 0; j < ncounts; j++)
        if (counts[j] < 1 || counts[j] > 32)
            DIE("outstanding %d: 1..32", counts[j]);
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0)
        DIE("pipe");
    alarm(600);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        DIE("fork");
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        exit(sender(b[1], a[0]));
    }
    close(a[0]);
    close(b[1]);
    return receiver(a[1], b[0], pid);
}
