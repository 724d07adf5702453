/* A job through the C ABI: rank and size from whichever launcher started the program
 * (courier run, mpirun, srun, hydra; none = a job of one), a ring exchange over endpoints
 * made on first use, then an all-to-all after connecting eagerly, every byte checked.
 *
 *   courier run -n 4 ./job_ring        mpirun -n 4 ./job_ring        ./job_ring
 */
#include "common.h"

#define MSG 4096

static unsigned seed_of(uint32_t src, uint32_t dst) { return src * 131u + dst * 7u + 1u; }

int main(void)
{
    watchdog(120);
    courier_job_t *job = NULL;
    CHECK(courier_job_init(&job));
    uint32_t rank = 0, size = 0, lrank = 0, lsize = 0, host = 0;
    CHECK(courier_job_rank(job, &rank));
    CHECK(courier_job_size(job, &size));
    CHECK(courier_job_local_rank(job, &lrank));
    CHECK(courier_job_local_size(job, &lsize));
    CHECK(courier_job_host_id(job, &host));
    EXPECT(size >= 1 && rank < size && lrank < lsize);

    /* The authentication key is the same in every rank: rank 0 publishes its copy. */
    uint8_t key[COURIER_JOB_AUTH_KEY_LEN];
    CHECK(courier_job_auth_key(job, key));
    if (rank == 0)
        CHECK(courier_job_put(job, "ring.key", key, sizeof(key)));

    courier_context_t *ctx = make_context(COURIER_FEATURE_TAG, "job_ring");
    courier_worker_t *w = make_worker(ctx);
    courier_job_world_t *world = NULL;
    CHECK(courier_job_world_create(job, w, &world)); /* publishes the address; a fence */

    void *theirs = NULL;
    size_t theirs_len = 0;
    CHECK(courier_job_get(job, 0, "ring.key", 30000, &theirs, &theirs_len));
    EXPECT(theirs_len == sizeof(key) && memcmp(theirs, key, sizeof(key)) == 0);
    courier_buffer_free(theirs);

    /* Ring: send right, receive from the left; only the right neighbour is connected. */
    uint32_t right = (rank + 1) % size, left = (rank + size - 1) % size;
    unsigned char *out = malloc(MSG), *in = malloc(MSG);
    EXPECT(out && in);
    fill(out, MSG, seed_of(rank, right));
    courier_request_t *rr = NULL, *sr = NULL;
    courier_status_t rs = courier_worker_tag_recv(w, in, MSG, 1000 + left, UINT64_MAX, NULL, &rr);
    CHECK(rs);
    courier_ep_t *ep = NULL;
    CHECK(courier_job_world_endpoint(world, right, &ep));
    CHECK(finish(courier_ep_tag_send(ep, out, MSG, 1000 + rank, NULL, &sr), &sr));
    CHECK(finish(rs, &rr));
    EXPECT(verify(in, MSG, seed_of(left, rank)));
    size_t made = 0;
    CHECK(courier_job_world_connected(world, &made));
    EXPECT(made == 1); /* lazy: the ring opened one endpoint, not size */
    CHECK(courier_job_barrier(job, 60000));

    /* All-to-all, eager: every rank to every rank (itself included). */
    CHECK(courier_job_world_connect_all(world));
    CHECK(courier_job_world_connected(world, &made));
    EXPECT(made == size);
    unsigned char *outs = malloc((size_t)size * MSG), *ins = malloc((size_t)size * MSG);
    courier_request_t **rreq = calloc(size, sizeof(*rreq)), **sreq = calloc(size, sizeof(*sreq));
    courier_status_t *rst = calloc(size, sizeof(*rst)), *sst = calloc(size, sizeof(*sst));
    EXPECT(outs && ins && rreq && sreq && rst && sst);
    for (uint32_t p = 0; p < size; p++)
        rst[p] = courier_worker_tag_recv(w, ins + (size_t)p * MSG, MSG, 2000 + p, UINT64_MAX, NULL,
                                         &rreq[p]);
    for (uint32_t p = 0; p < size; p++) {
        fill(outs + (size_t)p * MSG, MSG, seed_of(rank, p) + 5u);
        CHECK(courier_job_world_endpoint(world, p, &ep));
        sst[p] = courier_ep_tag_send(ep, outs + (size_t)p * MSG, MSG, 2000 + rank, NULL, &sreq[p]);
        CHECK(sst[p]);
    }
    for (uint32_t p = 0; p < size; p++) {
        CHECK(finish(sst[p], &sreq[p]));
        CHECK(finish(rst[p], &rreq[p]));
        EXPECT(verify(ins + (size_t)p * MSG, MSG, seed_of(p, rank) + 5u));
    }
    CHECK(courier_job_world_barrier(world, 60000)); /* progresses the worker while it waits */
    printf("job_ring: rank %u of %u (local %u of %u, host %u, %s): ring and all-to-all OK\n", rank,
           size, lrank, lsize, host, courier_job_launcher(job));
    if (rank == 0)
        printf("job_ring: OK\n");
    fflush(stdout);

    free(outs), free(ins), free(rreq), free(sreq), free(rst), free(sst), free(out), free(in);
    courier_job_world_destroy(world);
    courier_worker_destroy(w);
    courier_context_destroy(ctx);
    courier_job_destroy(job);
    return 0;
}
