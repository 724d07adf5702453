/* Collectives: barrier and sync, broadcast (team and 32/64 active set), collect, fcollect,
 * alltoall(s), every reduction on representative types, _to_all on active sets. */
#include "common.h"
#include <complex.h>

static long pSync[SHMEM_REDUCE_SYNC_SIZE];
static long pWrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE + 64];

/* PE k's element i of a sum whose rounding depends on the order of its terms. */
static double order_value(int k, size_t i)
{
    return k == 0 ? 1e16 : k % 2 ? 1.0 + (double)i : -1e16 + (double)i;
}

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    static int counter;

    /* Barrier: nobody passes before everyone has written. */
    for (int r = 1; r <= 20; r++) {
        shmem_int_atomic_inc(&counter, 0);
        shmem_barrier_all();
        if (me == 0) CHECK(counter == r * n, "barrier round %d: %d", r, counter);
        shmem_barrier_all();
    }
    for (int r = 0; r < 50; r++) shmem_sync_all();

    /* Broadcast from every root, small and large. */
    size_t sizes[] = {1, 7, 1024, 1 << 18};
    long *src = shmem_malloc(sizeof(long) * (1 << 18));
    long *dst = shmem_malloc(sizeof(long) * (1 << 18) * (n > 4 ? n : 4));
    for (int root = 0; root < n; root++) {
        for (int s = 0; s < 4; s++) {
            size_t len = sizes[s];
            for (size_t i = 0; i < len; i++) src[i] = root * 1000000 + (long)i;
            dst[len - 1] = -1;
            CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, dst, src, len, root) == 0, "broadcast rc");
            CHECK(dst[0] == root * 1000000 && dst[len - 1] == root * 1000000 + (long)len - 1,
                  "broadcast root %d len %zu: %ld %ld", root, len, dst[0], dst[len - 1]);
        }
    }
    /* Zero elements: NULL buffers are allowed, and nothing moves. */
    CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, NULL, NULL, 0, 0) == 0, "empty broadcast rc");
    CHECK(shmem_int_sum_reduce(SHMEM_TEAM_WORLD, NULL, NULL, 0) == 0, "empty reduce rc");
    /* Back-to-back small broadcasts (pushed by the root) from rotating roots: a root
     * that runs ahead must not overwrite a dest still being checked. */
    for (int it = 0; it < 300; it++) {
        int root = it % n;
        size_t len = 1 + it % 9;
        for (size_t i = 0; i < len; i++) src[i] = it * 100 + (long)i;
        CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, dst, src, len, root) == 0, "broadcast rc");
        for (size_t i = 0; i < len; i++)
            CHECK(dst[i] == it * 100 + (long)i, "broadcast %d root %d [%zu]: %ld", it, root, i, dst[i]);
    }
    /* Active-set broadcast64 over the odd PEs: the root's dest is not written. */
    if (n >= 2) {
        int size = n / 2;
        if (me % 2 == 1) {
            src[0] = 4242 + me;
            dst[0] = -7;
            shmem_broadcast64(dst, src, 1, 0, 1, 1, size, pSync);
            if (me == 1) CHECK(dst[0] == -7, "active-set root's dest untouched");
            else CHECK(dst[0] == 4243, "broadcast64: %ld", dst[0]);
        }
        shmem_barrier_all();
    }

    /* fcollect and collect (different lengths per PE: me + 1). */
    for (int i = 0; i < 4 || i <= me; i++) src[i] = me * 10 + i;
    shmem_long_fcollect(SHMEM_TEAM_WORLD, dst, src, 4);
    for (int pe = 0; pe < n; pe++)
        for (int i = 0; i < 4; i++) CHECK(dst[4 * pe + i] == pe * 10 + i, "fcollect %d.%d: %ld", pe, i, dst[4 * pe + i]);
    shmem_long_collect(SHMEM_TEAM_WORLD, dst, src, (size_t)me + 1);
    {
        size_t at = 0;
        for (int pe = 0; pe < n; pe++)
            for (int i = 0; i <= pe; i++, at++) CHECK(dst[at] == pe * 10 + i, "collect %d.%d: %ld", pe, i, dst[at]);
    }
    shmem_fcollect64(dst, src, 2, 0, 0, n, pSync);
    CHECK(dst[2 * (n - 1) + 1] == (n - 1) * 10 + 1, "fcollect64");

    /* alltoall and alltoalls. */
    for (int pe = 0; pe < n; pe++) { src[2 * pe] = me * 100 + pe; src[2 * pe + 1] = -1; }
    shmem_long_alltoall(SHMEM_TEAM_WORLD, dst, src, 2);
    for (int pe = 0; pe < n; pe++) CHECK(dst[2 * pe] == pe * 100 + me, "alltoall from %d: %ld", pe, dst[2 * pe]);
    shmem_long_alltoalls(SHMEM_TEAM_WORLD, dst, src, 1, 2, 1);
    for (int pe = 0; pe < n; pe++) CHECK(dst[pe] == pe * 100 + me, "alltoalls from %d: %ld", pe, dst[pe]);

    /* Reductions. */
    int *ia = shmem_malloc(8 * sizeof(int)), *ib = shmem_malloc(8 * sizeof(int));
    double *da = shmem_malloc(8 * sizeof(double)), *db = shmem_malloc(8 * sizeof(double));
    for (int i = 0; i < 8; i++) { ia[i] = me + i; da[i] = me * 0.5 + i; }
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, ib, ia, 8);
    CHECK(ib[3] == n * (n - 1) / 2 + 3 * n, "int sum %d", ib[3]);
    shmem_int_max_reduce(SHMEM_TEAM_WORLD, ib, ia, 8);
    CHECK(ib[0] == n - 1, "int max %d", ib[0]);
    shmem_int_min_reduce(SHMEM_TEAM_WORLD, ib, ia, 8);
    CHECK(ib[5] == 5, "int min %d", ib[5]);
    shmem_double_prod_reduce(SHMEM_TEAM_WORLD, db, da, 8);
    { double p = 1; for (int pe = 0; pe < n; pe++) p *= pe * 0.5 + 2; CHECK(db[2] == p, "double prod %f vs %f", db[2], p); }
    unsigned *ua = shmem_malloc(sizeof(unsigned) * 2), *ub = shmem_malloc(sizeof(unsigned) * 2);
    ua[0] = 1u << me; ua[1] = ~(1u << me);
    shmem_uint_or_reduce(SHMEM_TEAM_WORLD, ub, ua, 1);
    CHECK(ub[0] == (n >= 32 ? ~0u : (1u << n) - 1), "or %x", ub[0]);
    shmem_uint_and_reduce(SHMEM_TEAM_WORLD, ub + 1, ua + 1, 1);
    CHECK(ub[1] == ~(n >= 32 ? ~0u : (1u << n) - 1), "and %x", ub[1]);
    shmem_uint_xor_reduce(SHMEM_TEAM_WORLD, ub, ua, 1);
    CHECK(ub[0] == (n >= 32 ? ~0u : (1u << n) - 1), "xor %x", ub[0]);
    /* In place. */
    for (int i = 0; i < 8; i++) ia[i] = 1;
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, ia, ia, 8);
    CHECK(ia[7] == n, "in-place sum %d", ia[7]);
    /* Large (pulled by every member between two syncs), larger (each member combines a
     * slice: 20011 longs, slices of unequal length) and small (combined by the first
     * member and pushed), back to back, in place too. */
    {
        size_t big = 4096, bigger = 20011; /* 32 KiB and 156 KiB of longs */
        long *la2 = shmem_malloc(bigger * sizeof(long)), *lb2 = shmem_malloc(bigger * sizeof(long));
        for (int it = 0; it < 60; it++) {
            size_t cnt = it % 3 == 1 ? big : it % 3 == 2 ? bigger : 1 + it % 7;
            for (size_t i = 0; i < cnt; i++) la2[i] = (long)i + me * 3 + it;
            if (it % 4 == 3) {
                shmem_long_sum_reduce(SHMEM_TEAM_WORLD, la2, la2, cnt);
                for (size_t i = 0; i < cnt; i++)
                    CHECK(la2[i] == n * ((long)i + it) + 3L * n * (n - 1) / 2, "in-place sum %d [%zu]", it, i);
            } else {
                shmem_long_sum_reduce(SHMEM_TEAM_WORLD, lb2, la2, cnt);
                for (size_t i = 0; i < cnt; i++)
                    CHECK(lb2[i] == n * ((long)i + it) + 3L * n * (n - 1) / 2, "sum %d [%zu]: %ld", it, i, lb2[i]);
            }
        }
        shmem_free(la2); shmem_free(lb2);
    }
    /* A large double sum whose result depends on the order of the additions: every PE
     * gets the bits of combining the PEs' sources in PE order. */
    {
        size_t cnt = 16389;
        double *da2 = shmem_malloc(cnt * sizeof(double)), *db2 = shmem_malloc(cnt * sizeof(double));
        for (size_t i = 0; i < cnt; i++) da2[i] = order_value(me, i);
        shmem_double_sum_reduce(SHMEM_TEAM_WORLD, db2, da2, cnt);
        for (size_t i = 0; i < cnt; i++) {
            double want = order_value(0, i);
            for (int k = 1; k < n; k++) want += order_value(k, i);
            CHECK(memcmp(&db2[i], &want, sizeof want) == 0, "double sum [%zu]: %.17g, want %.17g", i, db2[i], want);
        }
        shmem_free(da2); shmem_free(db2);
    }
    double _Complex *ca = shmem_malloc(sizeof(double _Complex)), *cb = shmem_malloc(sizeof(double _Complex));
    *ca = 1.0 + 1.0 * I;
    shmem_complexd_prod_reduce(SHMEM_TEAM_WORLD, cb, ca, 1);
    { double _Complex p = 1; for (int pe = 0; pe < n; pe++) p *= 1.0 + 1.0 * I; CHECK(*cb == p, "complex prod"); }
    long double *la = shmem_malloc(sizeof(long double)), *lb = shmem_malloc(sizeof(long double));
    *la = 1.25L + me;
    shmem_longdouble_sum_reduce(SHMEM_TEAM_WORLD, lb, la, 1);
    CHECK(*lb == 1.25L * n + n * (n - 1) / 2, "long double sum %Lf", *lb);
    shmem_longdouble_max_reduce(SHMEM_TEAM_WORLD, lb, la, 1);
    CHECK(*lb == 1.25L + n - 1, "long double max %Lf", *lb);

    /* Tiny reductions, back to back and between tiny broadcasts from rotating roots:
     * sums whose bits depend on the order of the terms (every PE combines in PE order),
     * in place too; broadcasts at the staging slots' size (32 longs) and one past it. */
    {
        double *ds = shmem_malloc(4 * sizeof(double)), *dd = shmem_malloc(4 * sizeof(double));
        long *ls = shmem_malloc(33 * sizeof(long)), *ld = shmem_malloc(33 * sizeof(long));
        for (int it = 0; it < 400; it++) {
            for (size_t i = 0; i < 4; i++) ds[i] = order_value(me, i + (size_t)it);
            shmem_double_sum_reduce(SHMEM_TEAM_WORLD, dd, ds, 4);
            for (size_t i = 0; i < 4; i++) {
                double want = order_value(0, i + (size_t)it);
                for (int k = 1; k < n; k++) want += order_value(k, i + (size_t)it);
                CHECK(memcmp(&dd[i], &want, sizeof want) == 0, "tiny double sum %d [%zu]: %.17g, want %.17g",
                      it, i, dd[i], want);
            }
            size_t cnt = it % 5 == 0 ? 32 : it % 5 == 1 ? 33 : 1 + (size_t)it % 4;
            for (size_t i = 0; i < cnt; i++) ls[i] = it + me * 7 + (long)i;
            int root = it % n;
            if (it % 3 == 0) {
                CHECK(shmem_long_broadcast(SHMEM_TEAM_WORLD, ld, ls, cnt, root) == 0, "broadcast rc");
                if (me != root)
                    for (size_t i = 0; i < cnt; i++)
                        CHECK(ld[i] == it + root * 7 + (long)i, "broadcast %d [%zu]: %ld", it, i, ld[i]);
            }
            shmem_long_max_reduce(SHMEM_TEAM_WORLD, ld, ls, cnt);
            for (size_t i = 0; i < cnt; i++)
                CHECK(ld[i] == it + (n - 1) * 7 + (long)i, "tiny max %d [%zu]: %ld", it, i, ld[i]);
            shmem_long_sum_reduce(SHMEM_TEAM_WORLD, ls, ls, cnt);
            for (size_t i = 0; i < cnt; i++)
                CHECK(ls[i] == n * (it + (long)i) + 7L * n * (n - 1) / 2, "tiny in-place sum %d [%zu]: %ld",
                      it, i, ls[i]);
        }
        shmem_free(ds); shmem_free(dd); shmem_free(ls); shmem_free(ld);
    }

    /* _to_all over the even PEs. */
    static int ta[4], tb[4], twrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE + 4];
    for (int i = 0; i < 4; i++) ta[i] = me;
    /* Over the evens, between reductions over every PE, 50 times: the pairs of evens
     * meet in both, in the same order. */
    for (int it = 0; it < 50; it++) {
        if (me % 2 == 0) {
            int size = (n + 1) / 2;
            shmem_int_sum_to_all(tb, ta, 4, 0, 1, size, twrk, pSync);
            CHECK(tb[0] == size * (size - 1), "sum_to_all over evens %d: %d", it, tb[0]);
        }
        shmem_int_max_reduce(SHMEM_TEAM_WORLD, tb, ta, 4);
        CHECK(tb[3] == n - 1, "max over all %d: %d", it, tb[3]);
    }
    shmem_barrier_all();
    shmem_long_max_to_all(dst, src, 1, 0, 0, n, pWrk, pSync);
    CHECK(dst[0] == (n - 1) * 100L, "max_to_all %ld", dst[0]);
    shmem_free(src); shmem_free(dst); shmem_free(ia); shmem_free(ib); shmem_free(da); shmem_free(db);
    shmem_free(ua); shmem_free(ub); shmem_free(ca); shmem_free(cb); shmem_free(la); shmem_free(lb);
    return test_end("coll");
}
