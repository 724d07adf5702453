//! The job exports in a process that no launcher started: a job of one (rank 0 of 1,
//! launcher "single"), its key-value exchange, fences and barriers, a job world over a
//! worker, and the errors for bad arguments, unknown keys and out-of-range ranks. (Jobs of
//! several ranks under every launcher: examples/c/job_ring.c under `make capi-job-test` and
//! the launcher tests of courier-cli.)

use super::*;

fn detail() -> String {
    cstr(courier_last_error_detail())
}

#[test]
fn a_process_without_a_launcher_is_a_job_of_one() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let mut job = null_mut();
        assert_eq!(courier_job_init(&mut job), COURIER_OK, "{}", detail());
        assert!(!job.is_null());
        let mut v = u32::MAX;
        for (f, want) in [
            (courier_job_rank as unsafe extern "C" fn(_, _) -> _, 0),
            (courier_job_size, 1),
            (courier_job_local_rank, 0),
            (courier_job_local_size, 1),
        ] {
            assert_eq!(f(job, &mut v), COURIER_OK, "{}", detail());
            assert_eq!(v, want);
        }
        assert_eq!(cstr(courier_job_launcher(job)), "single");
        // A key of its own, random, the same from call to call.
        let (mut k1, mut k2) = (
            [0u8; COURIER_JOB_AUTH_KEY_LEN],
            [1u8; COURIER_JOB_AUTH_KEY_LEN],
        );
        assert_eq!(
            courier_job_auth_key(job, k1.as_mut_ptr()),
            COURIER_OK,
            "{}",
            detail()
        );
        assert_eq!(courier_job_auth_key(job, k2.as_mut_ptr()), COURIER_OK);
        assert_eq!(k1, k2);
        assert!(k1.iter().any(|&b| b != 0));

        // Its own value, through put, commit, fence and get.
        let val = b"the value \x00 with a NUL inside";
        assert_eq!(
            courier_job_put(job, c"abi-key".as_ptr(), val.as_ptr().cast(), val.len()),
            COURIER_OK,
            "{}",
            detail()
        );
        assert_eq!(courier_job_commit(job), COURIER_OK, "{}", detail());
        assert_eq!(courier_job_fence(job, 5000), COURIER_OK, "{}", detail());
        assert_eq!(courier_job_barrier(job, 5000), COURIER_OK, "{}", detail());
        let (mut p, mut n) = (null_mut(), 0usize);
        assert_eq!(
            courier_job_get(job, 0, c"abi-key".as_ptr(), 1000, &mut p, &mut n),
            COURIER_OK,
            "{}",
            detail()
        );
        assert_eq!(std::slice::from_raw_parts(p as *const u8, n), val);
        courier_buffer_free(p);

        // A key nobody put, a rank the job does not have: errors that say which.
        let (mut p, mut n) = (null_mut(), 0usize);
        let s = courier_job_get(job, 0, c"never-put".as_ptr(), 50, &mut p, &mut n);
        assert_ne!(s, COURIER_OK);
        assert!(p.is_null() && n == 0, "an output written on failure");
        assert!(detail().contains("never-put"), "{}", detail());
        let s = courier_job_get(job, 1, c"abi-key".as_ptr(), 50, &mut p, &mut n);
        assert_ne!(s, COURIER_OK);
        assert!(detail().contains('1'), "{}", detail());

        // NULL arguments name the argument.
        let refused = |s: courier_status_t, arg: &str| {
            assert_eq!(s, COURIER_ERR_INVALID_PARAM, "{arg}: {}", detail());
            assert!(detail().contains(arg), "{arg}: {}", detail());
        };
        refused(courier_job_rank(job, null_mut()), "out");
        refused(
            courier_job_put(job, null(), val.as_ptr().cast(), val.len()),
            "key",
        );
        refused(
            courier_job_get(job, 0, c"abi-key".as_ptr(), 10, null_mut(), &mut n),
            "value_out",
        );
        refused(courier_job_auth_key(job, null_mut()), "key_out");

        // A world over a worker: one rank, an endpoint to itself, a barrier.
        let (ctx, w) = ctx_worker(c"all");
        let mut world = null_mut();
        assert_eq!(
            courier_job_world_create(job, w, &mut world),
            COURIER_OK,
            "{}",
            detail()
        );
        let mut ep = null_mut();
        assert_eq!(
            courier_job_world_endpoint(world, 0, &mut ep),
            COURIER_OK,
            "{}",
            detail()
        );
        assert!(!ep.is_null());
        let mut none = null_mut();
        assert_ne!(courier_job_world_endpoint(world, 1, &mut none), COURIER_OK);
        assert!(none.is_null());
        assert_eq!(
            courier_job_world_connect_all(world),
            COURIER_OK,
            "{}",
            detail()
        );
        assert_eq!(
            courier_job_world_barrier(world, 5000),
            COURIER_OK,
            "{}",
            detail()
        );
        let mut count = usize::MAX;
        assert_eq!(courier_job_world_connected(world, &mut count), COURIER_OK);
        assert_eq!(count, 1);
        assert_eq!(courier_job_world_destroy(world), COURIER_OK);
        courier_worker_destroy(w);
        courier_context_destroy(ctx);

        // (Not finalized: the job is the process's, shared with the other tests here, and
        // finalizing it would end their exchange.)
        assert_eq!(courier_job_destroy(job), COURIER_OK);
    }
}
