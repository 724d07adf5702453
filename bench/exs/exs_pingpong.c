/* exs-pingpong: round-trip time of EXS SOCK_STREAM messages against size, busy-polling
 * against wait-for-notify, pinned against unpinned, with the CPU time of both processes,
 * as UNH-EXS's ping-pong. The client (a child) sends, this process echoes; each side posts
 * its next receive before it sends.
 *
 *   exs-pingpong [-k courier|tcp|unix] [-s SIZES] [-n ITERS] [-b] [-c CPU,CPU]
 *
 * Prints one JSON line per size: the median and mean round trip in microseconds. */
#include "exs_bench.h"

static enum over over = OVER_COURIER;
static size_t sizes[32] = {8, 1024, 65536};
static int nsizes = 3;
static long iters = 20000;
static int busy = 0;
static int cpus[2] = {-1, -1};

static void setup(int cpu)
{
    pin(cpu);
    X(exs_init(EXS_VERSION));
    X(exs_fcntl(-1, EXS_F_BUSY_POLL, busy));
    if (cpu >= 0)
        X(exs_fcntl(-1, EXS_F_CPU, cpu));
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct cpu {
    double user, sys;
};

/* Echo `n` messages of `s` bytes: each ping's receive completes, the next receive is
 * posted (into the other half of `buf`), the ping goes back. */
static void echo(int fd, exs_qhandle_t q, exs_mhandle_t mh, unsigned char *buf, size_t s, long n)
{
    long pings = 0, echoes = 0;
    X(exs_recv(fd, buf, s, MSG_WAITALL, q, (void *)1, mh));
    while (pings < n || echoes < n) {
        exs_event_t ev = next_ev(q);
        if (ev.exs_evt_type == EXS_EVT_SEND) {
            echoes++;
            continue;
        }
        if (ev.exs_evt_type != EXS_EVT_RECV || (size_t)ev.exs_evt_result != s)
            DIE("echo: event %d result %zd", ev.exs_evt_type, ev.exs_evt_result);
        pings++;
        unsigned char *cur = ev.exs_evt_buf;
        unsigned char *other = cur == buf ? buf + s : buf;
        if (pings < n)
            X(exs_recv(fd, other, s, MSG_WAITALL, q, (void *)1, mh));
        X(exs_send(fd, cur, s, 0, q, (void *)2, mh));
    }
}

static int server(int to_child, int from_child, pid_t child)
{
    setup(cpus[0]);
    exs_qhandle_t q = exs_qcreate(16);
    X(q);
    struct sockaddr_storage ss;
    socklen_t len;
    int lfd = listen_on(over, &ss, &len);
    pipe_write(to_child, &len, sizeof(len));
    pipe_write(to_child, &ss, sizeof(ss));
    int fd = accept_on(lfd, q, over);
    size_t maxs = 0;
    for (int i = 0; i < nsizes; i++)
        maxs = sizes[i] > maxs ? sizes[i] : maxs;
    unsigned char *buf = calloc(2, maxs);
    exs_mhandle_t mh = exs_mregister(buf, 2 * maxs, 0);
    X(mh == EXS_MHANDLE_INVALID ? -1 : 0);
    for (int i = 0; i < nsizes; i++) {
        long n;
        pipe_read(from_child, &n, sizeof(n));
        double u0, s0, u1, s1;
        cpu_s(&u0, &s0);
        pipe_write(to_child, "r", 1);
        echo(fd, q, mh, buf, sizes[i], n);
        cpu_s(&u1, &s1);
        struct cpu c = {u1 - u0, s1 - s0};
        pipe_write(to_child, &c, sizeof(c));
    }
    X(exs_close(fd, q, NULL));
    next_ev(q);
    X(exs_close(lfd, EXS_QHANDLE_INVALID, NULL));
    return reap(child);
}

static int client(int to_parent, int from_parent)
{
    setup(cpus[1]);
    exs_qhandle_t q = exs_qcreate(16);
    X(q);
    struct sockaddr_storage ss;
    socklen_t len;
    pipe_read(from_parent, &len, sizeof(len));
    pipe_read(from_parent, &ss, sizeof(ss));
    int fd = connect_to(over, q, &ss, len);
    size_t maxs = 0;
    for (int i = 0; i < nsizes; i++)
        maxs = sizes[i] > maxs ? sizes[i] : maxs;
    unsigned char *buf = calloc(2, maxs);
    exs_mhandle_t mh = exs_mregister(buf, 2 * maxs, 0);
    X(mh == EXS_MHANDLE_INVALID ? -1 : 0);
    double *rtt = malloc(sizeof(double) * (size_t)iters);
    for (int i = 0; i < nsizes; i++) {
        size_t s = sizes[i];
        long warm = iters / 10 + 10, n = warm + iters;
        pipe_write(to_parent, &n, sizeof(n));
        char c;
        pipe_read(from_parent, &c, 1);
        double u0, s0, u1, s1;
        cpu_s(&u0, &s0);
        double t0 = now_s();
        for (long k = 0; k < n; k++) {
            double a = now_s();
            X(exs_recv(fd, buf + s, s, MSG_WAITALL, q, (void *)3, mh));
            X(exs_send(fd, buf, s, 0, q, (void *)4, mh));
            int seen = 0;
            while (seen != 3) {
                exs_event_t ev = next_ev(q);
                seen |= ev.exs_evt_type == EXS_EVT_SEND ? 1 : 2;
                if (ev.exs_evt_type == EXS_EVT_RECV && (size_t)ev.exs_evt_result != s)
                    DIE("pong of %zd bytes", ev.exs_evt_result);
            }
            if (k >= warm)
                rtt[k - warm] = (now_s() - a) * 1e6;
        }
        double t1 = now_s();
        cpu_s(&u1, &s1);
        struct cpu sc;
        pipe_read(from_parent, &sc, sizeof(sc));
        double sum = 0;
        for (long k = 0; k < iters; k++)
            sum += rtt[k];
        qsort(rtt, (size_t)iters, sizeof(double), cmp);
        double wall = t1 - t0;
        printf("{\"test\":\"pingpong\",\"over\":\"%s\",\"busy\":%d,\"pinned\":%d,\"size\":%zu,"
               "\"iters\":%ld,\"rtt_median_us\":%.3f,\"rtt_mean_us\":%.3f,"
               "\"cli_cpu\":%.4f,\"srv_cpu\":%.4f}\n",
               over_name(over), busy, cpus[0] >= 0, s, iters, rtt[iters / 2], sum / (double)iters,
               ((u1 - u0) + (s1 - s0)) / wall, (sc.user + sc.sys) / wall);
        fflush(stdout);
    }
    X(exs_close(fd, q, NULL));
    next_ev(q);
    return 0;
}

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

int main(int argc, char **argv)
{
    int opt;
    while ((opt = getopt(argc, argv, "k:s:n:bc:")) != -1) {
        switch (opt) {
        case 'k':
            over = parse_over(optarg);
            break;
        case 's':
            nsizes = 0;
            for (char *t = strtok(optarg, ","); t && nsizes < 32; t = strtok(NULL, ","))
                sizes[nsizes++] = parse_size(t);
            break;
        case 'n':
            iters = atol(optarg);
            break;
        case 'b':
            busy = 1;
            break;
        case 'c':
            if (sscanf(optarg, "%d,%d", &cpus[0], &cpus[1]) != 2)
                DIE("-c CPU,CPU");
            break;
        default:
            DIE("usage: exs-pingpong [-k courier|tcp|unix] [-s SIZES] [-n ITERS] [-b] [-c CPU,CPU]");
        }
    }
    if (iters < 1)
        DIE("-n %ld", iters);
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
        exit(client(b[1], a[0]));
    }
    close(a[0]);
    close(b[1]);
    return server(a[1], b[0], pid);
}
