//! The C ABI called from Rust the way C calls it (unit tests: the crate builds no rlib, whose
//! name would collide with the core library's `libcourier.rlib`): status codes and strings, NULL arguments,
//! panics stopped at the boundary, and a round trip through every kind of handle.

use std::ffi::{CStr, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::*;
use courier_core::Status;

fn cstr(p: *const std::ffi::c_char) -> String {
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
}

fn tls(value: &'static CStr) -> (courier_context_params_t, Box<[courier_config_entry_t; 1]>) {
    let cfg = Box::new([courier_config_entry_t {
        name: c"COURIER_TLS".as_ptr(),
        value: value.as_ptr(),
    }]);
    let p = courier_context_params_t {
        field_mask: COURIER_CONTEXT_FIELD_CONFIG | COURIER_CONTEXT_FIELD_NAME,
        features: 0,
        name: c"abi-test".as_ptr(),
        config: cfg.as_ptr(),
        config_count: 1,
    };
    (p, cfg)
}

struct Setup {
    ctx: *mut courier_context_t,
    w: *mut courier_worker_t,
    ep: *mut courier_ep_t,
}

impl Setup {
    /// A worker connected to itself (the `self` transport).
    fn new() -> Setup {
        unsafe {
            let (p, _cfg) = tls(c"all");
            let mut ctx = null_mut();
            assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
            assert_eq!(cstr(courier_context_name(ctx)), "abi-test");
            let mut w = null_mut();
            assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
            let mut addr = null_mut();
            let mut len = 0usize;
            assert_eq!(courier_worker_address(w, &mut addr, &mut len), COURIER_OK);
            assert!(len > 0);
            let ep_p = courier_ep_params_t {
                field_mask: COURIER_EP_FIELD_REMOTE_ADDRESS,
                address: addr,
                address_length: len,
                sockaddr: null(),
                client_id: 0,
                err_handler: None,
                user_data: null_mut(),
            };
            let mut ep = null_mut();
            assert_eq!(courier_ep_create(w, &ep_p, &mut ep), COURIER_OK);
            courier_buffer_free(addr);
            assert_eq!(courier_ep_wait_connected(ep, 5000), COURIER_OK);
            assert_eq!(cstr(courier_ep_transport(ep)), "self");
            Setup { ctx, w, ep }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        unsafe {
            assert_eq!(courier_ep_close_force(self.ep), COURIER_OK);
            courier_worker_destroy(self.w);
            courier_context_destroy(self.ctx);
        }
    }
}

#[test]
fn status_strings_match_the_library() {
    for s in Status::ALL {
        assert_eq!(cstr(courier_status_string(s.code())), s.as_str(), "{s:?}");
    }
    assert_eq!(
        cstr(courier_status_string(COURIER_ERR_REJECTED)),
        "connection rejected by peer"
    );
    assert!(cstr(courier_status_string(COURIER_ERR_PANIC)).contains("panic"));
    assert_eq!(cstr(courier_status_string(12345)), "unknown status");
}

#[test]
fn config_table_is_listed() {
    let n = courier_config_var_count();
    assert!(n > 0);
    let mut names = Vec::new();
    for i in 0..n {
        let mut v = courier_config_var_t {
            name: null(),
            default_value: null(),
            help: null(),
        };
        assert_eq!(unsafe { courier_config_var(i, &mut v) }, COURIER_OK);
        names.push(cstr(v.name));
        assert!(!cstr(v.help).is_empty());
    }
    assert!(names.iter().any(|n| n == "COURIER_TLS"));
    let mut v = courier_config_var_t {
        name: null(),
        default_value: null(),
        help: null(),
    };
    assert_eq!(
        unsafe { courier_config_var(n, &mut v) },
        COURIER_ERR_INVALID_PARAM
    );
}

#[test]
fn bad_config_reports_status_and_detail() {
    let (p, _cfg) = tls(c"carrier-pigeon");
    let mut ctx = null_mut();
    assert_eq!(
        unsafe { courier_context_create(&p, &mut ctx) },
        COURIER_ERR_BAD_CONFIG
    );
    assert!(ctx.is_null(), "output written on failure");
    assert!(cstr(courier_last_error_detail()).contains("carrier-pigeon"));
}

#[test]
fn null_arguments_are_invalid_param() {
    unsafe {
        assert_eq!(
            courier_context_create(null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert!(cstr(courier_last_error_detail()).contains("context_out"));
        let mut w = null_mut();
        assert_eq!(
            courier_worker_create(null(), null(), &mut w),
            COURIER_ERR_INVALID_PARAM
        );
        assert!(w.is_null());
        assert_eq!(courier_worker_progress(null()), 0);
        assert_eq!(courier_worker_signal(null()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(courier_worker_wait(null(), 0), COURIER_ERR_INVALID_PARAM);
        assert_eq!(
            courier_worker_address(null(), null_mut(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_event_fd(null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_ep_create(null(), null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(courier_ep_close(null_mut()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(
            courier_ep_close_force(null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(courier_ep_flush(null()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(
            courier_listener_create(null(), null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_conn_request_accept(null_mut(), null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_conn_request_reject(null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_conn_request_query(null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        let mut req = null_mut();
        assert_eq!(
            courier_ep_tag_send(null(), null(), 0, 1, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_tag_recv(null(), null_mut(), 0, 1, 0, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_tag_probe(null(), 0, 0, null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_ep_stream_send(null(), null(), 0, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_ep_am_send(null(), 0, null(), 0, null(), 0, 0, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_set_am_handler(null(), 0, None, null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_am_recv_data(null(), null_mut(), null_mut(), 0, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(courier_request_test(null()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(courier_request_wait(null()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(courier_request_cancel(null()), COURIER_ERR_INVALID_PARAM);
        assert_eq!(
            courier_request_info(null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert!(req.is_null());
        // Releasing NULL is fine.
        courier_request_free(null_mut());
        courier_worker_destroy(null_mut());
        courier_context_destroy(null_mut());
        courier_listener_destroy(null_mut());
        courier_buffer_free(null_mut());

        // With a live worker and endpoint: NULL buffers with a length, NULL outputs.
        let s = Setup::new();
        assert_eq!(
            courier_ep_tag_send(s.ep, null(), 10, 1, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_ep_tag_send(s.ep, c"x".as_ptr().cast(), 1, 1, null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_worker_tag_recv_iov(s.w, null(), 2, 1, 0, null(), &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(
            courier_ep_create(s.w, null(), &mut null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        let both = courier_ep_params_t {
            field_mask: COURIER_EP_FIELD_REMOTE_ADDRESS | COURIER_EP_FIELD_SOCK_ADDR,
            address: null(),
            address_length: 0,
            sockaddr: null(),
            client_id: 0,
            err_handler: None,
            user_data: null_mut(),
        };
        assert_eq!(
            courier_ep_create(s.w, &both, &mut null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert!(req.is_null());
    }
}

static COMPLETIONS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C-unwind" fn panicking_completion(
    _s: courier_status_t,
    _i: *const courier_request_info_t,
    _u: *mut c_void,
) {
    COMPLETIONS.fetch_add(1, Ordering::SeqCst);
    panic!("a callback that panics");
}

unsafe extern "C-unwind" fn panicking_am(
    _p: *const courier_am_recv_param_t,
    _u: *mut c_void,
) -> courier_status_t {
    panic!("an active-message handler that panics");
}

#[test]
fn panic_in_callback_stays_inside() {
    let s = Setup::new();
    unsafe {
        let mut buf = [0u8; 8];
        let op = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_CALLBACK,
            cb: Some(panicking_completion),
            user_data: null_mut(),
            info: null_mut(),
        };
        let mut rreq = null_mut();
        let st = courier_worker_tag_recv(
            s.w,
            buf.as_mut_ptr().cast(),
            buf.len(),
            5,
            u64::MAX,
            &op,
            &mut rreq,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        let mut sreq = null_mut();
        let st = courier_ep_tag_send(s.ep, c"payload".as_ptr().cast(), 8, 5, null(), &mut sreq);
        assert!(st == COURIER_OK || st == COURIER_INPROGRESS);
        if st == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(sreq), COURIER_OK);
            courier_request_free(sreq);
        }
        // The callback panics inside progress; progress returns normally.
        assert_eq!(courier_request_wait(rreq), COURIER_OK);
        for _ in 0..10 {
            courier_worker_progress(s.w);
        }
        assert_eq!(COMPLETIONS.load(Ordering::SeqCst), 1);
        let mut info = courier_request_info_t::default();
        assert_eq!(courier_request_info(rreq, &mut info), COURIER_OK);
        assert_eq!((info.length, info.tag), (8, 5));
        courier_request_free(rreq);
        assert_eq!(&buf, b"payload\0");
        assert!(cstr(courier_last_error_detail()).contains("panicked"));

        // A panicking active-message handler: the message is dropped, the worker goes on.
        assert_eq!(
            courier_worker_set_am_handler(s.w, 3, Some(panicking_am), null_mut()),
            COURIER_OK
        );
        let mut req = null_mut();
        let st = courier_ep_am_send(
            s.ep,
            3,
            null(),
            0,
            c"x".as_ptr().cast(),
            1,
            0,
            null(),
            &mut req,
        );
        assert!(st >= 0);
        for _ in 0..100 {
            courier_worker_progress(s.w);
        }
        if st == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(req), COURIER_OK);
            courier_request_free(req);
        }
        // Still usable.
        round_trip(&s, 7, b"after the panic");
    }
}

/// Keeps every rendezvous descriptor in the `Vec` its `user_data` points to.
unsafe extern "C-unwind" fn keeping_am(
    p: *const courier_am_recv_param_t,
    u: *mut c_void,
) -> courier_status_t {
    let (p, kept) = unsafe { (&*p, &mut *u.cast::<Vec<usize>>()) };
    if p.desc.is_null() {
        return COURIER_OK;
    }
    kept.push(p.desc as usize);
    COURIER_INPROGRESS
}

#[test]
fn kept_rendezvous_released_or_received_later() {
    let s = Setup::new();
    let mut kept: Vec<usize> = Vec::new();
    let data: Vec<u8> = (0..200_000).map(|i| (i % 251) as u8).collect();
    unsafe {
        let ud = (&mut kept as *mut Vec<usize>).cast();
        assert_eq!(
            courier_worker_set_am_handler(s.w, 4, Some(keeping_am), ud),
            COURIER_OK
        );
        let mut sreqs = [null_mut(); 2];
        for r in &mut sreqs {
            let st = courier_ep_am_send(
                s.ep,
                4,
                null(),
                0,
                data.as_ptr().cast(),
                data.len(),
                COURIER_AM_SEND_FLAG_RNDV,
                null(),
                r,
            );
            assert_eq!(st, COURIER_INPROGRESS);
        }
        for _ in 0..1000 {
            if kept.len() == 2 {
                break;
            }
            courier_worker_progress(s.w);
        }
        assert_eq!(kept.len(), 2);
        // Released after the handler returned: the sender's request completes.
        let first = kept[0] as *mut courier_am_desc_t;
        assert_eq!(courier_worker_am_desc_release(s.w, first), COURIER_OK);
        assert_eq!(courier_request_wait(sreqs[0]), COURIER_OK);
        // The other is still received whole.
        let mut into = vec![0u8; data.len()];
        let mut rreq = null_mut();
        let second = kept[1] as *mut courier_am_desc_t;
        let st = courier_worker_am_recv_data(
            s.w,
            second,
            into.as_mut_ptr().cast(),
            into.len(),
            null(),
            &mut rreq,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        assert_eq!(courier_request_wait(rreq), COURIER_OK);
        courier_request_free(rreq);
        assert!(into == data);
        assert_eq!(courier_request_wait(sreqs[1]), COURIER_OK);
        for r in sreqs {
            courier_request_free(r);
        }
    }
}

unsafe fn round_trip(s: &Setup, tag: u64, msg: &[u8]) {
    unsafe {
        let mut buf = vec![0u8; msg.len()];
        let mut info = courier_request_info_t::default();
        let op = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_INFO,
            cb: None,
            user_data: null_mut(),
            info: &mut info,
        };
        let mut rreq = null_mut();
        let rs = courier_worker_tag_recv(
            s.w,
            buf.as_mut_ptr().cast(),
            buf.len(),
            tag,
            u64::MAX,
            &op,
            &mut rreq,
        );
        assert_eq!(rs, COURIER_INPROGRESS);
        let mut sreq = null_mut();
        let ss = courier_ep_tag_send(s.ep, msg.as_ptr().cast(), msg.len(), tag, null(), &mut sreq);
        if ss == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(sreq), COURIER_OK);
            courier_request_free(sreq);
        } else {
            assert_eq!(ss, COURIER_OK);
        }
        assert_eq!(courier_request_wait(rreq), COURIER_OK);
        assert_eq!(courier_request_info(rreq, &mut info), COURIER_OK);
        courier_request_free(rreq);
        assert_eq!(info.length, msg.len());
        assert_eq!(buf, msg);
    }
}

#[test]
fn tag_round_trip_truncation_and_probe() {
    let s = Setup::new();
    unsafe {
        round_trip(&s, 1, b"hello");
        round_trip(&s, 2, &vec![7u8; 1 << 20]);
        // An unexpected message is visible to probe, then truncates a short receive.
        let mut sreq = null_mut();
        let st = courier_ep_tag_send(
            s.ep,
            c"0123456789".as_ptr().cast(),
            10,
            9,
            null(),
            &mut sreq,
        );
        assert!(st >= 0);
        let mut info = courier_request_info_t::default();
        let mut found = COURIER_ERR_NO_MESSAGE;
        for _ in 0..1000 {
            courier_worker_progress(s.w);
            found = courier_worker_tag_probe(s.w, 9, u64::MAX, &mut info);
            if found == COURIER_OK {
                break;
            }
        }
        assert_eq!(found, COURIER_OK);
        assert_eq!((info.length, info.tag), (10, 9));
        if st == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(sreq), COURIER_OK);
            courier_request_free(sreq);
        }
        let mut small = [0u8; 4];
        let mut rreq = null_mut();
        let rs = courier_worker_tag_recv(
            s.w,
            small.as_mut_ptr().cast(),
            4,
            9,
            u64::MAX,
            null(),
            &mut rreq,
        );
        let rs = if rs == COURIER_INPROGRESS {
            let r = courier_request_wait(rreq);
            courier_request_free(rreq);
            r
        } else {
            rs
        };
        assert_eq!(rs, COURIER_ERR_MESSAGE_TRUNCATED);
        assert!(!cstr(courier_last_error_detail()).is_empty());
        assert_eq!(
            courier_worker_tag_probe(s.w, 9, u64::MAX, &mut info),
            COURIER_ERR_NO_MESSAGE
        );
    }
}

static CANCELED: AtomicI32 = AtomicI32::new(0);

unsafe extern "C-unwind" fn on_cancel_done(
    status: courier_status_t,
    _info: *const courier_request_info_t,
    _u: *mut c_void,
) {
    CANCELED.store(status, Ordering::SeqCst);
}

#[test]
fn tag_receive_cancels() {
    let s = Setup::new();
    unsafe {
        let mut buf = [0u8; 8];
        let p = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_CALLBACK,
            cb: Some(on_cancel_done),
            user_data: null_mut(),
            info: null_mut(),
        };
        let mut req = null_mut();
        let st =
            courier_worker_tag_recv(s.w, buf.as_mut_ptr().cast(), 8, 77, u64::MAX, &p, &mut req);
        assert_eq!(st, COURIER_INPROGRESS);
        assert_eq!(courier_request_cancel(req), COURIER_OK);
        // The callback runs in the next progress, with the canceled status.
        for _ in 0..100 {
            if CANCELED.load(Ordering::SeqCst) != 0 {
                break;
            }
            courier_worker_progress(s.w);
        }
        assert_eq!(CANCELED.load(Ordering::SeqCst), COURIER_ERR_CANCELED);
        assert_eq!(courier_request_test(req), COURIER_ERR_CANCELED);
        // Too late for a second cancel; a message sent now is not taken by the canceled
        // receive.
        assert_eq!(courier_request_cancel(req), COURIER_ERR_NO_RESOURCE);
        courier_request_free(req);
        let mut sreq = null_mut();
        let st = courier_ep_tag_send(s.ep, c"x".as_ptr().cast(), 1, 77, null(), &mut sreq);
        assert!(st >= 0);
        let mut info = courier_request_info_t::default();
        let mut found = COURIER_ERR_NO_MESSAGE;
        for _ in 0..1000 {
            courier_worker_progress(s.w);
            found = courier_worker_tag_probe(s.w, 77, u64::MAX, &mut info);
            if found == COURIER_OK {
                break;
            }
        }
        assert_eq!(found, COURIER_OK);
        if st == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(sreq), COURIER_OK);
            courier_request_free(sreq);
        }
    }
}

static TRUNC_STATUS: AtomicI32 = AtomicI32::new(0);
static TRUNC_LEN: AtomicU64 = AtomicU64::new(0);

unsafe extern "C-unwind" fn on_trunc_done(
    status: courier_status_t,
    info: *const courier_request_info_t,
    _u: *mut c_void,
) {
    // SAFETY: the library passes a valid info for the call.
    let len = unsafe { (*info).length } as u64;
    TRUNC_LEN.store(len, Ordering::SeqCst);
    TRUNC_STATUS.store(status, Ordering::SeqCst);
}

#[test]
fn failed_completion_callback_carries_info() {
    let s = Setup::new();
    unsafe {
        // A posted receive too short for the message: the callback gets the truncation and
        // the message's real length.
        let mut small = [0u8; 4];
        let p = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_CALLBACK,
            cb: Some(on_trunc_done),
            user_data: null_mut(),
            info: null_mut(),
        };
        let mut rreq = null_mut();
        let st = courier_worker_tag_recv(
            s.w,
            small.as_mut_ptr().cast(),
            4,
            31,
            u64::MAX,
            &p,
            &mut rreq,
        );
        assert_eq!(st, COURIER_INPROGRESS);
        let mut sreq = null_mut();
        let st = courier_ep_tag_send(
            s.ep,
            c"0123456789".as_ptr().cast(),
            10,
            31,
            null(),
            &mut sreq,
        );
        assert!(st >= 0);
        for _ in 0..10_000 {
            if TRUNC_STATUS.load(Ordering::SeqCst) != 0 {
                break;
            }
            courier_worker_progress(s.w);
        }
        assert_eq!(
            TRUNC_STATUS.load(Ordering::SeqCst),
            COURIER_ERR_MESSAGE_TRUNCATED
        );
        assert_eq!(TRUNC_LEN.load(Ordering::SeqCst), 10);
        let mut info = courier_request_info_t::default();
        assert_eq!(courier_request_test(rreq), COURIER_ERR_MESSAGE_TRUNCATED);
        assert_eq!(courier_request_info(rreq, &mut info), COURIER_OK);
        assert_eq!(info.length, 10);
        courier_request_free(rreq);
        if st == COURIER_INPROGRESS {
            assert_eq!(courier_request_wait(sreq), COURIER_OK);
            courier_request_free(sreq);
        }
    }
}

static EP_ERR: AtomicI32 = AtomicI32::new(0);

unsafe extern "C-unwind" fn on_ep_error(
    _ep: *mut courier_ep_t,
    status: courier_status_t,
    _u: *mut c_void,
) {
    EP_ERR.store(status, Ordering::SeqCst);
}

unsafe extern "C-unwind" fn reject_all(cr: *mut courier_conn_request_t, _u: *mut c_void) {
    let mut a = courier_conn_request_attr_t {
        field_mask: COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID
            | COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR,
        client_address: [0; COURIER_SOCKADDR_STRLEN],
        client_id: 0,
    };
    unsafe {
        assert_eq!(
            courier_conn_request_query(cr, &a as *const _ as *mut _),
            COURIER_OK
        );
        a.client_id = 0;
        assert_eq!(courier_conn_request_query(cr, &mut a), COURIER_OK);
        assert_eq!(a.client_id, 42);
        assert!(cstr(a.client_address.as_ptr()).starts_with("127.0.0.1:"));
        assert_eq!(courier_conn_request_reject(cr), COURIER_OK);
    }
}

#[test]
fn listener_reject_reaches_error_handler() {
    unsafe {
        let (p, _cfg) = tls(c"tcp");
        let mut ctx = null_mut();
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        let mut w = null_mut();
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
        let lp = courier_listener_params_t {
            field_mask: COURIER_LISTENER_FIELD_SOCK_ADDR | COURIER_LISTENER_FIELD_CONN_HANDLER,
            sockaddr: c"127.0.0.1:0".as_ptr(),
            conn_handler: Some(reject_all),
            user_data: null_mut(),
        };
        let mut l = null_mut();
        assert_eq!(courier_listener_create(w, &lp, &mut l), COURIER_OK);
        let mut buf = [0 as std::ffi::c_char; COURIER_SOCKADDR_STRLEN];
        assert_eq!(
            courier_listener_address(l, buf.as_mut_ptr(), buf.len()),
            COURIER_OK
        );
        assert_eq!(
            courier_listener_address(l, buf.as_mut_ptr(), 3),
            COURIER_ERR_INVALID_PARAM
        );
        let where_ = std::ffi::CString::new(cstr(buf.as_ptr())).unwrap();
        let ep_p = courier_ep_params_t {
            field_mask: COURIER_EP_FIELD_SOCK_ADDR
                | COURIER_EP_FIELD_CLIENT_ID
                | COURIER_EP_FIELD_ERR_HANDLER,
            address: null(),
            address_length: 0,
            sockaddr: where_.as_ptr(),
            client_id: 42,
            err_handler: Some(on_ep_error),
            user_data: null_mut(),
        };
        let mut ep = null_mut();
        assert_eq!(courier_ep_create(w, &ep_p, &mut ep), COURIER_OK);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while EP_ERR.load(Ordering::SeqCst) == 0 {
            courier_worker_progress(w);
            assert!(std::time::Instant::now() < deadline);
        }
        assert_eq!(EP_ERR.load(Ordering::SeqCst), COURIER_ERR_REJECTED);
        assert_eq!(courier_ep_status(ep), COURIER_ERR_REJECTED);
        assert_eq!(courier_ep_close_force(ep), COURIER_OK);
        courier_listener_destroy(l);
        courier_worker_destroy(w);
        courier_context_destroy(ctx);
    }
}

#[test]
fn single_thread_worker_refuses_other_threads() {
    let s = Setup::new();
    let w = s.w as usize;
    let (st, sig) = std::thread::spawn(move || unsafe {
        let w = w as *const courier_worker_t;
        let mut armed = false;
        (courier_worker_arm(w, &mut armed), courier_worker_signal(w))
    })
    .join()
    .unwrap();
    assert_eq!(st, COURIER_ERR_INVALID_PARAM);
    // Waking a worker is allowed from any thread.
    assert_eq!(sig, COURIER_OK);
}

/// Wait for an operation that may have completed at once; its final status and info.
unsafe fn settle(
    st: courier_status_t,
    req: *mut courier_request_t,
    info: &mut courier_request_info_t,
) -> courier_status_t {
    if st != COURIER_INPROGRESS {
        return st;
    }
    unsafe {
        let s = courier_request_wait(req);
        courier_request_info(req, info);
        courier_request_free(req);
        s
    }
}

#[test]
fn one_sided_on_a_local_region() {
    let s = Setup::new();
    unsafe {
        // CUDA memory without a driver or device is an error, never a panic.
        let mut mp = courier_mem_map_params_t {
            field_mask: COURIER_MEM_MAP_FIELD_LENGTH
                | COURIER_MEM_MAP_FIELD_FLAGS
                | COURIER_MEM_MAP_FIELD_MEMORY_TYPE,
            address: null_mut(),
            length: 4096,
            flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
            memory_type: COURIER_MEMORY_TYPE_CUDA,
            access: 0,
        };
        let mut mem = null_mut();
        let rc = courier_mem_map(s.ctx, &mp, &mut mem);
        if rc == COURIER_OK {
            // A machine with a GPU: device memory, said so.
            let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
            assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
            assert_eq!(attr.memory_type, COURIER_MEMORY_TYPE_CUDA);
            courier_mem_unmap(mem);
            mem = null_mut();
        } else {
            assert!(rc < 0);
            assert!(mem.is_null());
        }
        mp.memory_type = 99;
        assert_eq!(
            courier_mem_map(s.ctx, &mp, &mut mem),
            COURIER_ERR_INVALID_PARAM
        );
        mp.memory_type = COURIER_MEMORY_TYPE_HOST;
        assert_eq!(courier_mem_map(s.ctx, &mp, &mut mem), COURIER_OK);
        let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
        assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
        assert_eq!(attr.length, 4096);
        assert_eq!(attr.memory_type, COURIER_MEMORY_TYPE_HOST);
        let base = attr.address as u64;

        let (mut kb, mut kl) = (null_mut(), 0usize);
        assert_eq!(courier_rkey_pack(mem, &mut kb, &mut kl), COURIER_OK);
        let mut rk = null_mut();
        assert_eq!(
            courier_ep_rkey_unpack(s.ep, c"junk".as_ptr().cast(), 4, &mut rk),
            COURIER_ERR_INVALID_KEY
        );
        assert_eq!(courier_ep_rkey_unpack(s.ep, kb, kl, &mut rk), COURIER_OK);
        courier_buffer_free(kb);
        assert_eq!(cstr(courier_rkey_path(rk)), "local");
        let (mut b, mut l) = (0u64, 0u64);
        assert_eq!(courier_rkey_bounds(rk, &mut b, &mut l), COURIER_OK);
        assert_eq!((b, l), (base, 4096));

        let data = [5u8; 100];
        let mut info = courier_request_info_t::default();
        let mut req = null_mut();
        let st = courier_ep_put(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 8,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        let mut back = [0u8; 100];
        let st = courier_ep_get(
            s.ep,
            back.as_mut_ptr().cast(),
            100,
            base + 8,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(back, data);
        let st = courier_ep_put(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 4090,
            rk,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_ERR_OUT_OF_RANGE);

        let op = courier_op_params_t {
            field_mask: COURIER_OP_FIELD_INFO,
            cb: None,
            user_data: null_mut(),
            info: &mut info,
        };
        for (v, old) in [(3u64, 0u64), (4, 3)] {
            let st = courier_ep_atomic(
                s.ep,
                COURIER_ATOMIC_OP_ADD,
                v,
                0,
                8,
                base + 1024,
                rk,
                &op,
                &mut req,
            );
            assert_eq!(settle(st, req, &mut info), COURIER_OK);
            assert_eq!(info.value, old);
        }
        assert_eq!(
            courier_ep_atomic(s.ep, 77, 1, 0, 8, base + 1024, rk, &op, &mut req),
            COURIER_ERR_INVALID_PARAM
        );
        // Posted atomics: done at once on a region mapped here; the fetch sees them.
        for (o, v) in [
            (COURIER_ATOMIC_OP_ADD, 10u64),
            (COURIER_ATOMIC_OP_OR, 0x100),
        ] {
            assert_eq!(
                courier_ep_atomic_post(s.ep, o, v, 8, base + 1024, rk),
                COURIER_OK
            );
        }
        for (o, size, addr) in [
            (COURIER_ATOMIC_OP_SWAP, 8, base + 1024),
            (COURIER_ATOMIC_OP_CSWAP, 4, base + 1024),
            (77, 8, base + 1024),
            (COURIER_ATOMIC_OP_ADD, 2, base + 1024),
            (COURIER_ATOMIC_OP_ADD, 8, base + 1028),
        ] {
            assert_eq!(
                courier_ep_atomic_post(s.ep, o, 1, size, addr, rk),
                COURIER_ERR_INVALID_PARAM,
                "op {o} size {size} at +{}",
                addr - base
            );
        }
        assert_eq!(
            courier_ep_atomic_post(s.ep, COURIER_ATOMIC_OP_ADD, 1, 8, base + 4096, rk),
            COURIER_ERR_OUT_OF_RANGE
        );
        let st = courier_ep_atomic(
            s.ep,
            COURIER_ATOMIC_OP_ADD,
            0,
            0,
            8,
            base + 1024,
            rk,
            &op,
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(info.value, (3 + 4 + 10) | 0x100);
        assert_eq!(courier_ep_flush(s.ep), COURIER_OK);
        assert_eq!(
            courier_ep_atomic(
                s.ep,
                COURIER_ATOMIC_OP_ADD,
                1,
                0,
                2,
                base + 1024,
                rk,
                &op,
                &mut req
            ),
            COURIER_ERR_INVALID_PARAM
        );

        let st = courier_ep_put_signal(
            s.ep,
            data.as_ptr().cast(),
            100,
            base + 2048,
            rk,
            base + 4088,
            rk,
            2,
            COURIER_SIGNAL_ADD,
            null(),
            &mut req,
        );
        assert_eq!(settle(st, req, &mut info), COURIER_OK);
        assert_eq!(courier_ep_fence(s.ep), COURIER_OK);
        let mut sig = 0u64;
        assert_eq!(courier_signal_fetch(mem, 4088, &mut sig), COURIER_OK);
        assert_eq!(sig, 2);
        assert_eq!(
            courier_signal_fetch(mem, 4089, &mut sig),
            COURIER_ERR_OUT_OF_RANGE
        );
        assert_eq!(
            courier_signal_wait_until(mem, s.w, 4088, COURIER_CMP_GE, 2, 0, 1000, &mut sig),
            COURIER_OK
        );
        assert_eq!(
            courier_signal_wait_until(mem, s.w, 4088, COURIER_CMP_GT, 2, 0, 20, &mut sig),
            COURIER_ERR_TIMEOUT
        );
        courier_rkey_destroy(rk);
        courier_mem_unmap(mem);

        let mut sem = null_mut();
        assert_eq!(
            courier_sem_create(
                s.ctx,
                COURIER_SEM_FLAG_BOOLEAN | COURIER_SEM_FLAG_INTEGER,
                &mut sem
            ),
            COURIER_ERR_INVALID_PARAM
        );
        assert_eq!(courier_sem_create(s.ctx, 0, &mut sem), COURIER_OK);
        assert_eq!(courier_sem_try(sem, 1), COURIER_ERR_NO_RESOURCE);
        assert_eq!(courier_sem_post(sem, 3), COURIER_OK);
        assert_eq!(courier_sem_wait(sem, s.w, 2), COURIER_OK);
        let mut v = 0u64;
        assert_eq!(courier_sem_value(sem, &mut v), COURIER_OK);
        assert_eq!(v, 1);
        // Only 1 is there: a limited wait for 2, sleeping or not, times out and takes
        // nothing.
        for flags in [0, COURIER_SIGNAL_WAIT_FLAG_SLEEP] {
            assert_eq!(
                courier_sem_wait_timeout(sem, s.w, 2, flags, 20),
                COURIER_ERR_TIMEOUT
            );
        }
        assert_eq!(
            courier_sem_wait_timeout(sem, s.w, 1, COURIER_SIGNAL_WAIT_FLAG_SLEEP, 1000),
            COURIER_OK
        );
        assert_eq!(courier_sem_post(sem, 1), COURIER_OK);
        assert_eq!(
            courier_sem_post(sem, COURIER_SEM_MAX),
            COURIER_ERR_INVALID_PARAM
        );
        let (mut kb, mut kl, mut addr) = (null_mut(), 0usize, 0u64);
        assert_eq!(
            courier_sem_remote(sem, &mut kb, &mut kl, &mut addr),
            COURIER_OK
        );
        courier_buffer_free(kb);
        courier_sem_destroy(sem);
    }
}

/// With `COURIER_SIGNAL_WAIT_FLAG_SLEEP` on a context without the wakeup feature the wait
/// spins (yielding) instead of failing, as the Rust call does.
#[test]
fn sleeping_signal_wait_without_wakeup_spins() {
    unsafe {
        let (mut p, _cfg) = tls(c"all");
        p.field_mask |= COURIER_CONTEXT_FIELD_FEATURES;
        p.features = COURIER_FEATURE_TAG | COURIER_FEATURE_RMA | COURIER_FEATURE_AMO;
        let mut ctx = null_mut();
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        let mut w = null_mut();
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
        let mp = courier_mem_map_params_t {
            field_mask: COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS,
            address: null_mut(),
            length: 4096,
            flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
            memory_type: COURIER_MEMORY_TYPE_HOST,
            access: 0,
        };
        let mut mem = null_mut();
        assert_eq!(courier_mem_map(ctx, &mp, &mut mem), COURIER_OK);
        let mut attr = std::mem::zeroed::<courier_mem_attr_t>();
        assert_eq!(courier_mem_query(mem, &mut attr), COURIER_OK);
        let word = attr.address as usize + 64;
        let setter = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            AtomicU64::from_ptr(word as *mut u64).store(7, Ordering::Release);
        });
        let sleep = COURIER_SIGNAL_WAIT_FLAG_SLEEP;
        let mut v = 0u64;
        assert_eq!(
            courier_signal_wait_until(mem, w, 64, COURIER_CMP_GE, 7, sleep, 10_000, &mut v),
            COURIER_OK
        );
        assert_eq!(v, 7);
        setter.join().unwrap();
        assert_eq!(
            courier_signal_wait_until(mem, w, 64, COURIER_CMP_EQ, 8, sleep, 20, &mut v),
            COURIER_ERR_TIMEOUT
        );
        courier_mem_unmap(mem);
        courier_worker_destroy(w);
        courier_context_destroy(ctx);
    }
}

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
        let mut addr = null_mut();
        let mut len = 0usize;
        assert_eq!(courier_worker_address(s.w, &mut addr, &mut len), COURIER_OK);
        let ep_p = courier_ep_params_t {
            field_mask: COURIER_EP_FIELD_REMOTE_ADDRESS | 1 << 9,
            address: addr,
            address_length: len,
            sockaddr: null(),
            client_id: 0,
            err_handler: None,
            user_data: null_mut(),
        };
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
    unsafe { &*(u as *const AtomicI32) }.store(status, Ordering::SeqCst);
}

/// A connection request's query mask and accept params with unknown bits are refused; the
/// refused accept still consumes the request (the client sees a rejection).
#[test]
fn conn_request_unknown_bits_are_refused() {
    unsafe {
        let (p, _cfg) = tls(c"tcp");
        let mut ctx = null_mut();
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        let mut w = null_mut();
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
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
