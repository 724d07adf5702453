/* Teams: world and shared, strided splits (negative stride too), 2-D splits, translation,
 * collectives on teams, team contexts (team-relative PE numbers), destruction. */
#include "common.h"
#include <unistd.h>

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    CHECK(shmem_team_my_pe(SHMEM_TEAM_WORLD) == me, "world my_pe");
    CHECK(shmem_team_n_pes(SHMEM_TEAM_WORLD) == n, "world n_pes");
    CHECK(shmem_team_my_pe(SHMEM_TEAM_INVALID) == -1, "invalid my_pe");
    const char *tls = getenv("COURIER_TLS");
    int shared = shmem_team_n_pes(SHMEM_TEAM_SHARED);
    if (tls && strcmp(tls, "tcp") == 0) CHECK(shared == 1, "tcp: shared team has %d PEs", shared);
    else CHECK(shared == n, "one host: shared team has %d of %d PEs", shared, n);
    for (int i = 0; i < shared; i++) {
        int pe = shmem_team_translate_pe(SHMEM_TEAM_SHARED, i, SHMEM_TEAM_WORLD);
        static int probe;
        CHECK(shmem_ptr(&probe, pe) != NULL, "shmem_ptr to shared-team PE %d", pe);
        CHECK(shmem_team_ptr(SHMEM_TEAM_SHARED, &probe, i) == shmem_ptr(&probe, pe), "shmem_team_ptr %d", i);
    }

    /* Evens, by a strided split; odds by a negative stride from the top. */
    shmem_team_t evens, odds_rev;
    shmem_team_config_t cfg = {.num_contexts = 2};
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, (n + 1) / 2, &cfg, SHMEM_TEAM_NUM_CONTEXTS, &evens) == 0, "split evens");
    int top_odd = (n % 2 == 0) ? n - 1 : n - 2;
    int rc = shmem_team_split_strided(SHMEM_TEAM_WORLD, top_odd < 0 ? 0 : top_odd, -2, n / 2 > 0 ? n / 2 : 1, NULL, 0, &odds_rev);
    CHECK(rc == 0 || n == 1, "split odds: %d", rc);
    if (me % 2 == 0) {
        CHECK(evens != SHMEM_TEAM_INVALID, "member gets a team");
        CHECK(shmem_team_my_pe(evens) == me / 2, "evens my_pe %d", shmem_team_my_pe(evens));
        shmem_team_config_t got;
        CHECK(shmem_team_get_config(evens, SHMEM_TEAM_NUM_CONTEXTS, &got) == 0 && got.num_contexts == 2, "config");
        CHECK(shmem_team_translate_pe(evens, 1, SHMEM_TEAM_WORLD) == (n > 2 ? 2 : -1), "translate");
        /* A reduction on the team. */
        static int one = 1, sum;
        shmem_int_sum_reduce(evens, &sum, &one, 1);
        CHECK(sum == (n + 1) / 2, "team sum %d", sum);
        /* A team context: PE 0 of the team is world PE 0. */
        shmem_ctx_t ctx;
        CHECK(shmem_team_create_ctx(evens, 0, &ctx) == 0, "team ctx");
        shmem_team_t back;
        CHECK(shmem_ctx_get_team(ctx, &back) == 0 && back == evens, "ctx_get_team");
        static int slot[64];
        shmem_ctx_int_p(ctx, &slot[me], me + 100, 0);
        shmem_ctx_quiet(ctx);
        shmem_ctx_destroy(ctx);
        shmem_team_sync(evens);
        if (me == 0)
            for (int pe = 0; pe < n; pe += 2) CHECK(slot[pe] == pe + 100, "team ctx put from %d", pe);
        shmem_team_destroy(evens);
    } else {
        CHECK(evens == SHMEM_TEAM_INVALID, "non-member gets SHMEM_TEAM_INVALID");
        CHECK(shmem_team_my_pe(odds_rev) == (top_odd - me) / 2, "negative stride my_pe");
        shmem_team_destroy(odds_rev);
    }
    shmem_barrier_all();

    /* 2-D: rows of 2. */
    shmem_team_t xt, yt;
    CHECK(shmem_team_split_2d(SHMEM_TEAM_WORLD, 2, NULL, 0, &xt, NULL, 0, &yt) == 0, "split_2d");
    CHECK(shmem_team_my_pe(xt) == me % 2, "x my_pe %d", shmem_team_my_pe(xt));
    CHECK(shmem_team_my_pe(yt) == me / 2, "y my_pe %d", shmem_team_my_pe(yt));
    CHECK(shmem_team_n_pes(yt) == (n - me % 2 + 1) / 2, "y n_pes %d", shmem_team_n_pes(yt));
    static long xb[2], xs;
    xs = me;
    shmem_long_fcollect(xt, xb, &xs, 1);
    CHECK(xb[0] == me - me % 2, "row fcollect %ld", xb[0]);
    shmem_team_destroy(xt);
    shmem_team_destroy(yt);
    /* Splitting with a range that does not fit fails everywhere, without hanging. */
    shmem_team_t bad;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n + 1, NULL, 0, &bad) != 0 && bad == SHMEM_TEAM_INVALID, "oversized split refused");
    return test_end("team");
}
