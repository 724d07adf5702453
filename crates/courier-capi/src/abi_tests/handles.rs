//! Generation-checked handles: every kind refuses destroy-twice, use-after-destroy, a stale
//! handle (its slot reused by a new object), another kind's handle and NULL with
//! `COURIER_ERR_INVALID_HANDLE`; a child outlives its destroyed parent safely.

use super::*;

fn invalid(s: courier_status_t) {
    assert_eq!(
        s,
        COURIER_ERR_INVALID_HANDLE,
        "{}",
        cstr(courier_last_error_detail())
    );
    assert!(!cstr(courier_last_error_detail()).is_empty());
}

#[test]
fn contexts_workers_and_endpoints() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let s = Setup::new();
        let mut f = 0u64;
        // Another kind's handle, and a value the library never made.
        invalid(courier_context_features(s.w.cast(), &mut f));
        assert!(cstr(courier_last_error_detail()).contains("worker handle"));
        invalid(courier_worker_signal(s.ep.cast()));
        invalid(courier_ep_flush(s.w.cast()));
        invalid(courier_ep_flush(&f as *const u64 as *const courier_ep_t));
        invalid(courier_ep_flush(0x10 as *const courier_ep_t));

        // A second endpoint: destroyed, then used and destroyed again.
        let (p, addr) = self_ep_params(s.w, 0);
        let mut ep = null_mut();
        assert_eq!(courier_ep_create(s.w, &p, &mut ep), COURIER_OK);
        assert_eq!(courier_ep_destroy(ep), COURIER_OK);
        invalid(courier_ep_destroy(ep));
        invalid(courier_ep_close(ep));
        invalid(courier_ep_flush(ep));
        let mut req = null_mut();
        invalid(courier_ep_tag_send(
            ep,
            c"x".as_ptr().cast(),
            1,
            1,
            null(),
            &mut req,
        ));
        assert!(req.is_null());
        assert_eq!(cstr(courier_ep_transport(ep)), "");
        // A new endpoint may take the old one's slot: the old handle stays dead.
        let mut again = null_mut();
        assert_eq!(courier_ep_create(s.w, &p, &mut again), COURIER_OK);
        assert_ne!(again, ep);
        invalid(courier_ep_flush(ep));
        assert_eq!(courier_ep_destroy(again), COURIER_OK);
        courier_buffer_free(addr);

        // A context and a worker of their own, the parent destroyed first.
        let (ctx, w) = ctx_worker(c"all");
        assert_eq!(courier_context_destroy(ctx), COURIER_OK);
        invalid(courier_context_destroy(ctx));
        invalid(courier_context_features(ctx, &mut f));
        assert_eq!(cstr(courier_context_name(ctx)), "");
        let mut w2 = null_mut();
        invalid(courier_worker_create(ctx, null(), &mut w2));
        assert!(w2.is_null());
        assert_eq!(courier_worker_signal(w), COURIER_OK);
        assert_eq!(courier_worker_destroy(w), COURIER_OK);
        invalid(courier_worker_destroy(w));
        invalid(courier_worker_signal(w));
        assert_eq!(courier_worker_progress(w), 0);
        assert!(cstr(courier_last_error_detail()).contains("destroyed"));
    }
}

#[test]
fn stale_requests() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let s = Setup::new();
        let mut buf = [0u8; 8];
        let mut req = null_mut();
        let st = courier_worker_tag_recv(
            s.w,
            buf.as_mut_ptr().cast(),
            8,
            9,
            u64::MAX,
            null(),
            &mut req,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        let mut sreq = null_mut();
        let st = courier_ep_tag_send(s.ep, c"1234567".as_ptr().cast(), 8, 9, null(), &mut sreq);
        assert!(st == COURIER_OK || st == COURIER_INPROGRESS);
        assert_eq!(courier_request_finish(st, sreq, null_mut()), COURIER_OK);
        assert_eq!(courier_request_wait(req), COURIER_OK);
        assert_eq!(courier_request_free(req), COURIER_OK);
        // Completed and released: every use is refused.
        invalid(courier_request_test(req));
        invalid(courier_request_wait(req));
        invalid(courier_request_wait_timeout(req, 0));
        invalid(courier_request_cancel(req));
        let mut info = courier_request_info_t::default();
        invalid(courier_request_info(req, &mut info));
        invalid(courier_request_free(req));
        invalid(courier_request_destroy(req));
        invalid(courier_request_finish(COURIER_INPROGRESS, req, &mut info));
        // Many requests later (reusing the freed one's slot and object) it is still stale.
        for _ in 0..100 {
            let mut r = null_mut();
            let st = courier_worker_tag_recv(
                s.w,
                buf.as_mut_ptr().cast(),
                8,
                10,
                u64::MAX,
                null(),
                &mut r,
            );
            assert_eq!(st, COURIER_INPROGRESS);
            assert_ne!(r, req);
            invalid(courier_request_test(req));
            assert_eq!(courier_request_test(r), COURIER_INPROGRESS);
            assert_eq!(courier_request_cancel(r), COURIER_OK);
            assert_eq!(courier_request_wait(r), COURIER_ERR_CANCELED);
            assert_eq!(courier_request_free(r), COURIER_OK);
        }
        // A request as an endpoint, an endpoint as a request.
        invalid(courier_request_test(s.ep.cast()));
        invalid(courier_ep_flush(req.cast()));
    }
}

#[test]
fn memory_keys_semaphores_and_jobs() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let s = Setup::new();
        let mp = alloc_params(4096);
        let mut mem = null_mut();
        assert_eq!(courier_mem_map(s.ctx, &mp, &mut mem), COURIER_OK);
        let (mut kb, mut kl) = (null_mut(), 0usize);
        assert_eq!(courier_rkey_pack(mem, &mut kb, &mut kl), COURIER_OK);
        let mut rk = null_mut();
        assert_eq!(courier_ep_rkey_unpack(s.ep, kb, kl, &mut rk), COURIER_OK);
        courier_buffer_free(kb);
        let (mut base, mut len) = (0u64, 0u64);
        invalid(courier_rkey_bounds(mem.cast(), &mut base, &mut len));
        assert_eq!(courier_rkey_bounds(rk, &mut base, &mut len), COURIER_OK);
        assert_eq!(courier_rkey_destroy(rk), COURIER_OK);
        invalid(courier_rkey_destroy(rk));
        invalid(courier_rkey_bounds(rk, &mut base, &mut len));
        assert_eq!(cstr(courier_rkey_path(rk)), "");
        let mut req = null_mut();
        let v = 1u64;
        invalid(courier_ep_put(
            s.ep,
            (&v as *const u64).cast(),
            8,
            base,
            rk,
            null(),
            &mut req,
        ));
        assert_eq!(courier_mem_destroy(mem), COURIER_OK);
        invalid(courier_mem_unmap(mem));
        let mut attr = std::mem::zeroed();
        invalid(courier_mem_query(mem, &mut attr));

        let mut sem = null_mut();
        assert_eq!(courier_sem_create(s.ctx, 0, &mut sem), COURIER_OK);
        assert_eq!(courier_sem_post(sem, 1), COURIER_OK);
        assert_eq!(courier_sem_destroy(sem), COURIER_OK);
        invalid(courier_sem_destroy(sem));
        invalid(courier_sem_post(sem, 1));

        let mut job = null_mut();
        assert_eq!(courier_job_init(&mut job), COURIER_OK);
        let mut world = null_mut();
        assert_eq!(courier_job_world_create(job, s.w, &mut world), COURIER_OK);
        let mut rank = 0u32;
        invalid(courier_job_rank(world.cast(), &mut rank));
        assert_eq!(courier_job_rank(job, &mut rank), COURIER_OK);
        let mut wep = null_mut();
        assert_eq!(
            courier_job_world_endpoint(world, rank, &mut wep),
            COURIER_OK
        );
        assert_eq!(courier_job_world_destroy(world), COURIER_OK);
        invalid(courier_job_world_destroy(world));
        // The world's endpoints went with it.
        invalid(courier_ep_flush(wep));
        assert_eq!(courier_job_destroy(job), COURIER_OK);
        invalid(courier_job_destroy(job));
        invalid(courier_job_rank(job, &mut rank));
        assert_eq!(cstr(courier_job_launcher(job)), "");
    }
}

/// Keeps the descriptor and the reply endpoint it was lent in the `[usize; 2]` at `u`.
unsafe extern "C-unwind" fn keep_desc_and_reply(
    p: *const courier_am_recv_param_t,
    u: *mut c_void,
) -> courier_status_t {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    let (p, out) = unsafe { (&*p, &mut *u.cast::<[usize; 2]>()) };
    out[0] = p.desc as usize;
    out[1] = p.reply_ep as usize;
    COURIER_INPROGRESS
}

#[test]
fn descriptors_and_lent_reply_endpoints() {
    let s = Setup::new();
    let data = vec![7u8; 200_000];
    let mut seen = [0usize; 2];
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let ud = (&mut seen as *mut [usize; 2]).cast();
        assert_eq!(
            courier_worker_set_am_handler(s.w, 5, Some(keep_desc_and_reply), ud),
            COURIER_OK
        );
        let mut sreq = null_mut();
        let st = courier_ep_am_send(
            s.ep,
            5,
            null(),
            0,
            data.as_ptr().cast(),
            data.len(),
            COURIER_AM_SEND_FLAG_RNDV | COURIER_AM_SEND_FLAG_REPLY,
            null(),
            &mut sreq,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        for _ in 0..1000 {
            if seen[0] != 0 {
                break;
            }
            courier_worker_progress(s.w);
        }
        let (desc, reply) = (
            seen[0] as *mut courier_am_desc_t,
            seen[1] as *mut courier_ep_t,
        );
        assert!(!desc.is_null() && !reply.is_null());
        // The reply endpoint was lent for the handler's call only.
        invalid(courier_ep_flush(reply));
        invalid(courier_ep_destroy(reply));
        // The kept descriptor: released once, then refused.
        invalid(courier_am_desc_destroy(s.w, s.ep.cast()));
        assert_eq!(courier_am_desc_destroy(s.w, desc), COURIER_OK);
        assert_eq!(courier_request_wait(sreq), COURIER_OK);
        assert_eq!(courier_request_free(sreq), COURIER_OK);
        invalid(courier_am_desc_destroy(s.w, desc));
        let mut into = vec![0u8; data.len()];
        let mut rreq = null_mut();
        invalid(courier_worker_am_recv_data(
            s.w,
            desc,
            into.as_mut_ptr().cast(),
            into.len(),
            null(),
            &mut rreq,
        ));
        assert!(rreq.is_null());
    }
}
