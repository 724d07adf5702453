/* A job's start-up and footprint, for bench/startup.py and docs/scale.md.
 *
 *   job_scale barrier   join the job, one barrier, exit (the start-up benchmark)
 *   job_scale scale     join, publish a worker's address, barrier (timed from BENCH_T0,
 *                       the launcher's start in ns since the epoch), then a ring (lazy
 *                       wire-up: one endpoint) and all-to-all connections (eager); each
 *                       rank prints one JSON line with its memory, descriptors and sockets
 *                       after each phase.
 */
#include <courier.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        courier_status_t s_ = (call);                                                    \
        if (s_ < 0) {                                                                    \
            fprintf(stderr, "job_scale: %s: %s\n", #call, courier_last_error_detail()); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static void fds(int *all, int *sockets)
{
    *all = 0, *sockets = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[256];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n < 0)
            continue;
        link[n] = 0;
        (*all)++;
        if (strncmp(link, "socket:", 7) == 0)
            (*sockets)++;
    }
    if (d)
        closedir(d);
    (*all)--; /* the directory stream itself */
}

static double since_t0_ms(void)
{
    const char *t0 = getenv("BENCH_T0");
    if (!t0)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
    return (now - atof(t0)) / 1e6;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "barrier";
    courier_job_t *job = NULL;
    CHECK(courier_job_init(&job));
    uint32_t rank, size;
    CHECK(courier_job_rank(job, &rank));
    CHECK(courier_job_size(job, &size));
    if (strcmp(mode, "barrier") == 0) {
        CHECK(courier_job_barrier(job, 120000));
        courier_job_destroy(job);
        return 0;
    }
    courier_context_params_t cp = {.field_mask = COURIER_CONTEXT_FIELD_FEATURES,
                                   .features = COURIER_FEATURE_TAG};
    courier_context_t *ctx = NULL;
    CHECK(courier_context_create(&cp, &ctx));
    courier_worker_t *w = NULL;
    CHECK(courier_worker_create(ctx, NULL, &w));
    courier_job_world_t *world = NULL;
    CHECK(courier_job_world_create(job, w, &world));
    CHECK(courier_job_barrier(job, 120000));
    double t_barrier = since_t0_ms();
    int fd0, sk0;
    fds(&fd0, &sk0);
    long rss0 = rss_kib();
    /* Lazy: a ring needs the right neighbour only. */
    char out[64] = "ring", in[64];
    courier_request_t *rr = NULL, *sr = NULL;
    courier_status_t rs =
        courier_worker_tag_recv(w, in, sizeof in, 7, UINT64_MAX, NULL, &rr);
    CHECK(rs);
    courier_ep_t *ep = NULL;
    CHECK(courier_job_world_endpoint(world, (rank + 1) % size, &ep));
    courier_status_t ss = courier_ep_tag_send(ep, out, sizeof out, 7, NULL, &sr);
    CHECK(ss);
    if (ss == COURIER_INPROGRESS) {
        CHECK(courier_request_wait(sr));
        courier_request_free(sr);
    }
    if (rs == COURIER_INPROGRESS) {
        CHECK(courier_request_wait(rr));
        courier_request_free(rr);
    }
    CHECK(courier_job_world_barrier(world, 120000));
    int fd1, sk1;
    fds(&fd1, &sk1);
    long rss1 = rss_kib();
    size_t lazy = 0, eager = 0;
    CHECK(courier_job_world_connected(world, &lazy));
    /* Eager: every rank. */
    CHECK(courier_job_world_connect_all(world));
    CHECK(courier_job_world_barrier(world, 120000));
    int fd2, sk2;
    fds(&fd2, &sk2);
    long rss2 = rss_kib();
    CHECK(courier_job_world_connected(world, &eager));
    printf("{\"rank\": %u, \"size\": %u, \"t_barrier_ms\": %.3f, \"rss_kib\": [%ld, %ld, %ld], "
           "\"fds\": [%d, %d, %d], \"sockets\": [%d, %d, %d], \"endpoints\": [0, %zu, %zu]}\n",
           rank, size, t_barrier, rss0, rss1, rss2, fd0, fd1, fd2, sk0, sk1, sk2, lazy, eager);
    fflush(stdout);
    CHECK(courier_job_world_barrier(world, 120000));
    courier_job_world_destroy(world);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    courier_job_destroy(job);
    return 0;
}
