//! Unknown bits in flags words and field masks are refused, naming them.

use super::*;

/// The call was refused with `COURIER_ERR_INVALID_PARAM`, and the detail names exactly the
/// unknown bits `bits` of `what` (not the whole word).
#[track_caller]
fn refused(rc: courier_status_t, what: &str, bits: u64) {
    refused_with(rc, &cstr(courier_last_error_detail()), what, bits);
}

#[track_caller]
fn refused_with(rc: courier_status_t, detail: &str, what: &str, bits: u64) {
    assert_eq!(
        rc, COURIER_ERR_INVALID_PARAM,
        "{what} with unknown bits {bits:#x}"
    );
    assert!(
        detail.contains(&format!("unknown {what} bits {bits:#x} (known: ")),
        "{what}: {detail:?}"
    );
}

/// Unknown bits in every flags word and field mask the ABI reads are refused, with a detail
/// naming them; nothing is created, started or written.
#[test]
fn unknown_flag_and_field_mask_bits_are_refused() {
    let s = Setup::new();
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        // Context: field_mask, and features (only read with COURIER_CONTEXT_FIELD_FEATURES).
        let (mut p, _cfg) = tls(c"all");
        p.field_mask |= 1 << 20;
        let mut ctx = null_mut();
        refused(
            courier_context_create(&p, &mut ctx),
            "context field_mask",
            1 << 20,
        );
        assert!(ctx.is_null());
        p.field_mask = COURIER_CONTEXT_FIELD_FEATURES;
        p.features = COURIER_FEATURE_TAG | 1 << 40;
        refused(
            courier_context_create(&p, &mut ctx),
            "context features",
            1 << 40,
        );
        assert!(ctx.is_null());

        // Worker.
        let wp = courier_worker_params_t {
            field_mask: COURIER_WORKER_FIELD_THREAD_MODE | 1 << 7,
            thread_mode: COURIER_THREAD_MODE_SINGLE,
        };
        let mut w = null_mut();
        refused(
            courier_worker_create(s.ctx, &wp, &mut w),
            "worker field_mask",
            1 << 7,
        );
        assert!(w.is_null());

        // Endpoint: refused before any connection is attempted.
        let (ep_p, addr) = self_ep_params(s.w, 1 << 9);
        let mut ep = null_mut();
        refused(
            courier_ep_create(s.w, &ep_p, &mut ep),
            "endpoint field_mask",
            1 << 9,
        );
        assert!(ep.is_null());
        courier_buffer_free(addr);

        // Listener.
        let lp = courier_listener_params_t {
            field_mask: COURIER_LISTENER_FIELD_SOCK_ADDR
                | COURIER_LISTENER_FIELD_CONN_HANDLER
                | 1 << 3,
            sockaddr: c"127.0.0.1:0".as_ptr(),
            conn_handler: Some(reject_all),
            user_data: null_mut(),
        };
        let mut l = null_mut();
        refused(
            courier_listener_create(s.w, &lp, &mut l),
            "listener field_mask",
            1 << 3,
        );
        assert!(l.is_null());

        // Memory map: field_mask, flags, access.
        let mut mp = courier_mem_map_params_t {
            field_mask: COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS | 1 << 5,
            address: null_mut(),
            length: 4096,
            flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
            memory_type: COURIER_MEMORY_TYPE_HOST,
            access: COURIER_ACCESS_ALL,
        };
        let mut mem = null_mut();
        refused(
            courier_mem_map(s.ctx, &mp, &mut mem),
            "mem_map field_mask",
            1 << 5,
        );
        mp.field_mask = COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS;
        mp.flags = COURIER_MEM_MAP_FLAG_ALLOCATE | 1 << 4;
        refused(
            courier_mem_map(s.ctx, &mp, &mut mem),
            "mem_map flags",
            1 << 4,
        );
        mp.flags = COURIER_MEM_MAP_FLAG_ALLOCATE;
        mp.field_mask |= COURIER_MEM_MAP_FIELD_ACCESS;
        mp.access = COURIER_ACCESS_READ | 1 << 3;
        refused(
            courier_mem_map(s.ctx, &mp, &mut mem),
            "mem_map access",
            1 << 3,
        );
        assert!(mem.is_null());
        // With only known bits the same parameters map.
        mp.access = COURIER_ACCESS_ALL;
        assert_eq!(courier_mem_map(s.ctx, &mp, &mut mem), COURIER_OK);

        // Operation params: the operation never starts (no request, nothing sent).
        let mut info = courier_request_info_t::default();
        let op = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_INFO | 1 << 5,
            cb: None,
            user_data: null_mut(),
            info: &mut info,
        };
        let mut req = null_mut();
        let msg = b"never sent";
        refused(
            courier_ep_tag_send(s.ep, msg.as_ptr().cast(), msg.len(), 77, &op, &mut req),
            "op params field_mask",
            1 << 5,
        );
        assert!(req.is_null());
        courier_worker_progress(s.w);
        assert_eq!(
            courier_worker_tag_probe(s.w, 77, u64::MAX, &mut info),
            COURIER_ERR_NO_MESSAGE
        );

        // Active-message send flags, plain and gathered; eager with rendezvous.
        let h = b"h";
        let iov = [courier_iov_t {
            buffer: msg.as_ptr() as *mut c_void,
            length: msg.len(),
        }];
        let am_send = |gathered: bool, flags: u32, req: &mut *mut courier_request_t| {
            let hdr = h.as_ptr().cast();
            if gathered {
                courier_ep_am_send_iov(s.ep, 9, hdr, 1, iov.as_ptr(), 1, flags, null(), req)
            } else {
                let data = msg.as_ptr().cast();
                courier_ep_am_send(s.ep, 9, hdr, 1, data, msg.len(), flags, null(), req)
            }
        };
        let both = COURIER_AM_SEND_FLAG_EAGER | COURIER_AM_SEND_FLAG_RNDV;
        for gathered in [false, true] {
            let bad = COURIER_AM_SEND_FLAG_REPLY | 1 << 3;
            refused(am_send(gathered, bad, &mut req), "am send flags", 1 << 3);
            assert_eq!(am_send(gathered, both, &mut req), COURIER_ERR_INVALID_PARAM);
            assert!(
                cstr(courier_last_error_detail())
                    .contains("COURIER_AM_SEND_FLAG_EAGER and _RNDV exclude each other"),
                "{}",
                cstr(courier_last_error_detail())
            );
        }
        assert!(req.is_null());

        // Stream receive flags.
        let mut buf = [0u8; 16];
        refused(
            courier_ep_stream_recv(
                s.ep,
                buf.as_mut_ptr().cast(),
                buf.len(),
                COURIER_STREAM_RECV_FLAG_WAITALL | 1 << 4,
                null(),
                &mut req,
            ),
            "stream recv flags",
            1 << 4,
        );
        let riov = [courier_iov_t {
            buffer: buf.as_mut_ptr().cast(),
            length: buf.len(),
        }];
        refused(
            courier_ep_stream_recv_iov(s.ep, riov.as_ptr(), 1, 1 << 6, null(), &mut req),
            "stream recv flags",
            1 << 6,
        );
        assert!(req.is_null());

        // Signal wait flags (a short limit, so a wait that did start ends).
        let mut v = 0u64;
        refused(
            courier_signal_wait_until(
                mem,
                s.w,
                64,
                COURIER_CMP_EQ,
                1,
                COURIER_SIGNAL_WAIT_FLAG_SLEEP | 1 << 2,
                10,
                &mut v,
            ),
            "signal wait flags",
            1 << 2,
        );
        courier_mem_unmap(mem);

        // Semaphores: creation flags, and wait flags.
        let mut sem = null_mut();
        refused(
            courier_sem_create(s.ctx, COURIER_SEM_FLAG_INTEGER | 1 << 6, &mut sem),
            "semaphore flags",
            1 << 6,
        );
        assert!(sem.is_null());
        assert_eq!(courier_sem_create(s.ctx, 0, &mut sem), COURIER_OK);
        refused(
            courier_sem_wait_timeout(sem, s.w, 1, 1 << 3, 10),
            "semaphore wait flags",
            1 << 3,
        );
        courier_sem_destroy(sem);
    }
}

/// What `refuse_unknown_bits` saw: the query's and the accept's status and detail.
#[derive(Default)]
struct ConnSeen {
    query: Option<(courier_status_t, String)>,
    accept: Option<(courier_status_t, String)>,
}

unsafe extern "C-unwind" fn refuse_unknown_bits(cr: *mut courier_conn_request_t, u: *mut c_void) {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    let seen = unsafe { &*(u as *const std::sync::Mutex<ConnSeen>) };
    let mut a = courier_conn_request_attr_t {
        field_mask: COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID | 1 << 2,
        client_address: [0; COURIER_SOCKADDR_STRLEN],
        client_id: 0,
    };
    let p = courier_ep_params_t {
        field_mask: COURIER_EP_FIELD_USER_DATA | 1 << 12,
        address: null(),
        address_length: 0,
        sockaddr: null(),
        client_id: 0,
        err_handler: None,
        user_data: null_mut(),
    };
    let mut ep = null_mut();
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let q = courier_conn_request_query(cr, &mut a);
        let qd = cstr(courier_last_error_detail());
        assert_eq!(a.client_id, 0, "filled although refused");
        // Refused, and the request is consumed: the client is rejected.
        let r = courier_conn_request_accept(cr, &p, &mut ep);
        let rd = cstr(courier_last_error_detail());
        assert!(ep.is_null());
        let mut g = seen.lock().unwrap();
        g.query = Some((q, qd));
        g.accept = Some((r, rd));
    }
}

unsafe extern "C-unwind" fn store_ep_error(
    _ep: *mut courier_ep_t,
    status: courier_status_t,
    u: *mut c_void,
) {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe { &*(u as *const AtomicI32) }.store(status, Ordering::SeqCst);
}

/// A connection request's query mask and accept params with unknown bits are refused; the
/// refused accept still consumes the request (the client sees a rejection).
#[test]
fn conn_request_unknown_bits_are_refused() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let (ctx, w) = ctx_worker(c"tcp");
        let seen = std::sync::Mutex::new(ConnSeen::default());
        let lp = courier_listener_params_t {
            field_mask: COURIER_LISTENER_FIELD_SOCK_ADDR
                | COURIER_LISTENER_FIELD_CONN_HANDLER
                | COURIER_LISTENER_FIELD_USER_DATA,
            sockaddr: c"127.0.0.1:0".as_ptr(),
            conn_handler: Some(refuse_unknown_bits),
            user_data: &seen as *const _ as *mut c_void,
        };
        let mut l = null_mut();
        assert_eq!(courier_listener_create(w, &lp, &mut l), COURIER_OK);
        let mut buf = [0 as std::ffi::c_char; COURIER_SOCKADDR_STRLEN];
        assert_eq!(
            courier_listener_address(l, buf.as_mut_ptr(), buf.len()),
            COURIER_OK
        );
        let ep_err = AtomicI32::new(0);
        let ep_p = courier_ep_params_t {
            field_mask: COURIER_EP_FIELD_SOCK_ADDR
                | COURIER_EP_FIELD_ERR_HANDLER
                | COURIER_EP_FIELD_USER_DATA,
            address: null(),
            address_length: 0,
            sockaddr: buf.as_ptr(),
            client_id: 5,
            err_handler: Some(store_ep_error),
            user_data: &ep_err as *const _ as *mut c_void,
        };
        let mut ep = null_mut();
        assert_eq!(courier_ep_create(w, &ep_p, &mut ep), COURIER_OK);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ep_err.load(Ordering::SeqCst) == 0 {
            courier_worker_progress(w);
            assert!(
                std::time::Instant::now() < deadline,
                "client never rejected"
            );
        }
        assert_eq!(ep_err.load(Ordering::SeqCst), COURIER_ERR_REJECTED);
        let g = seen.lock().unwrap();
        let (q, qd) = g.query.clone().expect("handler ran");
        refused_with(q, &qd, "conn request attr field_mask", 1 << 2);
        let (r, rd) = g.accept.clone().expect("handler ran");
        refused_with(r, &rd, "endpoint field_mask", 1 << 12);
        drop(g);
        assert_eq!(courier_ep_close_force(ep), COURIER_OK);
        courier_listener_destroy(l);
        courier_worker_destroy(w);
        courier_context_destroy(ctx);
    }
}
