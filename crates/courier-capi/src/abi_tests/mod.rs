//! The C ABI called from Rust the way C calls it (unit tests: the crate builds no rlib, whose
//! name would collide with the core library's `libcourier.rlib`): status codes and strings, NULL arguments,
//! panics stopped at the boundary, and a round trip through every kind of handle.

use std::ffi::{CStr, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::*;
use courier_core::Status;

fn cstr(p: *const std::ffi::c_char) -> String {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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

/// A context on `COURIER_TLS=tls_value` and a worker on it.
///
/// # Safety
/// Calls the C ABI under test; the caller destroys what it returns.
unsafe fn ctx_worker(tls_value: &'static CStr) -> (*mut courier_context_t, *mut courier_worker_t) {
    let (p, _cfg) = tls(tls_value);
    let mut ctx = null_mut();
    let mut w = null_mut();
    // SAFETY: valid params and out-pointers, as the C ABI's contract asks.
    unsafe {
        assert_eq!(courier_context_create(&p, &mut ctx), COURIER_OK);
        assert_eq!(courier_worker_create(ctx, null(), &mut w), COURIER_OK);
    }
    (ctx, w)
}

/// Endpoint params that name `w`'s own worker address, with `extra` field bits; the
/// address buffer comes back too, for `courier_buffer_free` once the params are used.
///
/// # Safety
/// `w` is a live worker handle.
unsafe fn self_ep_params(
    w: *mut courier_worker_t,
    extra: u64,
) -> (courier_ep_params_t, *mut c_void) {
    let mut addr = null_mut();
    let mut len = 0usize;
    // SAFETY: a live worker and valid out-pointers.
    assert_eq!(
        unsafe { courier_worker_address(w, &mut addr, &mut len) },
        COURIER_OK
    );
    assert!(len > 0);
    let p = courier_ep_params_t {
        field_mask: COURIER_EP_FIELD_REMOTE_ADDRESS | extra,
        address: addr,
        address_length: len,
        sockaddr: null(),
        client_id: 0,
        err_handler: None,
        user_data: null_mut(),
    };
    (p, addr)
}

/// An endpoint from `w` to itself, connected.
///
/// # Safety
/// `w` is a live worker handle; the caller closes the endpoint.
unsafe fn self_ep(w: *mut courier_worker_t) -> *mut courier_ep_t {
    let mut ep = null_mut();
    // SAFETY: a live worker, params naming its own address, valid out-pointers.
    unsafe {
        let (p, addr) = self_ep_params(w, 0);
        assert_eq!(courier_ep_create(w, &p, &mut ep), COURIER_OK);
        courier_buffer_free(addr);
        assert_eq!(courier_ep_wait_connected(ep, 5000), COURIER_OK);
    }
    ep
}

/// Params that map `length` bytes of fresh host memory.
fn alloc_params(length: usize) -> courier_mem_map_params_t {
    courier_mem_map_params_t {
        field_mask: COURIER_MEM_MAP_FIELD_LENGTH | COURIER_MEM_MAP_FIELD_FLAGS,
        address: null_mut(),
        length,
        flags: COURIER_MEM_MAP_FLAG_ALLOCATE,
        memory_type: COURIER_MEMORY_TYPE_HOST,
        access: 0,
    }
}

struct Setup {
    ctx: *mut courier_context_t,
    w: *mut courier_worker_t,
    ep: *mut courier_ep_t,
}

impl Setup {
    /// A worker connected to itself (the `self` transport).
    fn new() -> Setup {
        // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
        unsafe {
            let (ctx, w) = ctx_worker(c"all");
            assert_eq!(cstr(courier_context_name(ctx)), "abi-test");
            let ep = self_ep(w);
            assert_eq!(cstr(courier_ep_transport(ep)), "self");
            Setup { ctx, w, ep }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
        // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
        // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
        unsafe { courier_config_var(n, &mut v) },
        COURIER_ERR_INVALID_PARAM
    );
}

#[test]
fn bad_config_reports_status_and_detail() {
    let (p, _cfg) = tls(c"carrier-pigeon");
    let mut ctx = null_mut();
    assert_eq!(
        // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
        unsafe { courier_context_create(&p, &mut ctx) },
        COURIER_ERR_BAD_CONFIG
    );
    assert!(ctx.is_null(), "output written on failure");
    assert!(cstr(courier_last_error_detail()).contains("carrier-pigeon"));
}

/// NULL outputs and buffers are `COURIER_ERR_INVALID_PARAM`; NULL handles
/// `COURIER_ERR_INVALID_HANDLE`.
#[test]
fn null_arguments_are_refused() {
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        assert_eq!(
            courier_context_create(null(), null_mut()),
            COURIER_ERR_INVALID_PARAM
        );
        assert!(cstr(courier_last_error_detail()).contains("context_out"));
        let mut w = null_mut();
        assert_eq!(
            courier_worker_create(null(), null(), &mut w),
            COURIER_ERR_INVALID_HANDLE
        );
        assert!(w.is_null());
        assert_eq!(courier_worker_progress(null()), 0);
        assert_eq!(courier_worker_signal(null()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(courier_worker_wait(null(), 0), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_worker_address(null(), null_mut(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_worker_event_fd(null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_ep_create(null(), null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(courier_ep_close(null_mut()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_ep_close_force(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(courier_ep_flush(null()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_listener_create(null(), null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_conn_request_accept(null_mut(), null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_conn_request_reject(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_conn_request_query(null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        let mut req = null_mut();
        assert_eq!(
            courier_ep_tag_send(null(), null(), 0, 1, null(), &mut req),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_worker_tag_recv(null(), null_mut(), 0, 1, 0, null(), &mut req),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_worker_tag_probe(null(), 0, 0, null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_ep_stream_send(null(), null(), 0, null(), &mut req),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_ep_am_send(null(), 0, null(), 0, null(), 0, 0, null(), &mut req),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_worker_set_am_handler(null(), 0, None, null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_worker_am_recv_data(null(), null_mut(), null_mut(), 0, null(), &mut req),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(courier_request_test(null()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(courier_request_wait(null()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(courier_request_cancel(null()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_request_info(null(), null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert!(req.is_null());
        // Releasing NULL does nothing and says so.
        assert_eq!(courier_request_free(null_mut()), COURIER_ERR_INVALID_HANDLE);
        assert_eq!(
            courier_worker_destroy(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_context_destroy(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
        assert_eq!(
            courier_listener_destroy(null_mut()),
            COURIER_ERR_INVALID_HANDLE
        );
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let (ctx, w) = ctx_worker(c"tcp");
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
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
    // SAFETY: the C ABI under test, given live handles and valid pointers as its contract asks.
    unsafe {
        let s = courier_request_wait(req);
        courier_request_info(req, info);
        courier_request_free(req);
        s
    }
}

mod bits;
mod finish;
mod handles;
mod job;
mod onesided;
mod release;
