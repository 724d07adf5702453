//! Endpoints: connect by worker address or socket address, the error handler, flush and
//! close.

use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Endpoint, EndpointParams, Error, Status};

use crate::ffi::*;
use crate::handle::*;
use crate::status::*;
use crate::worker::courier_worker_t;

/// Called once, inside progress, when an endpoint fails (peer died, closed, rejected the
/// connection); on a multi-thread worker whose endpoint failed while `courier_ep_create` or
/// `courier_conn_request_accept` was still making its handle, inside that call instead. `ep` is the handle the error handler was given to (do not close it inside
/// the callback; close it afterwards), `status` why, `user_data` the endpoint's.
/// `courier_last_error_detail()` holds the sentence while the callback runs. Not called
/// for a local close.
pub type courier_ep_error_cb_t = Option<
    unsafe extern "C-unwind" fn(
        ep: *mut courier_ep_t,
        status: courier_status_t,
        user_data: *mut c_void,
    ),
>;

/// `address` / `address_length` are set: connect to a worker address.
pub const COURIER_EP_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
/// `sockaddr` is set: connect to a listener at "ip:port" (or "host:port").
pub const COURIER_EP_FIELD_SOCK_ADDR: u64 = 1 << 1;
/// `client_id` is set (listener connections; shown to the listener's handler).
pub const COURIER_EP_FIELD_CLIENT_ID: u64 = 1 << 2;
/// `err_handler` is set.
pub const COURIER_EP_FIELD_ERR_HANDLER: u64 = 1 << 3;
/// `user_data` is set.
pub const COURIER_EP_FIELD_USER_DATA: u64 = 1 << 4;

const EP_FIELDS: u64 = COURIER_EP_FIELD_REMOTE_ADDRESS
    | COURIER_EP_FIELD_SOCK_ADDR
    | COURIER_EP_FIELD_CLIENT_ID
    | COURIER_EP_FIELD_ERR_HANDLER
    | COURIER_EP_FIELD_USER_DATA;

/// Parameters of `courier_ep_create` and `courier_conn_request_accept`.
#[repr(C)]
pub struct courier_ep_params_t {
    /// Which fields below are set (`COURIER_EP_FIELD_*`).
    pub field_mask: u64,
    /// A peer worker's address (from `courier_worker_address`).
    pub address: *const c_void,
    /// Its length.
    pub address_length: usize,
    /// A listener's socket address as "ip:port" (IPv6: "[addr]:port").
    pub sockaddr: *const c_char,
    /// An id of the caller's choosing, shown to the listener.
    pub client_id: u64,
    /// Called when the endpoint fails.
    pub err_handler: courier_ep_error_cb_t,
    /// Passed to `err_handler`.
    pub user_data: *mut c_void,
}

/// Where the error handler finds the handle it reports. On a multi-thread worker another
/// thread's progress may fail the endpoint before `courier_ep_create` has made the handle:
/// then the error waits here and is delivered as soon as the handle exists.
pub(crate) struct ErrCell {
    ptr: AtomicPtr<courier_ep_t>,
    early: Mutex<Option<Error>>,
    cb: unsafe extern "C-unwind" fn(*mut courier_ep_t, courier_status_t, *mut c_void),
    ud: usize,
}

impl ErrCell {
    fn deliver(&self, ep: *mut courier_ep_t, e: &Error) {
        record(e);
        let status = e.status().code();
        let (cb, ud) = (self.cb, self.ud);
        // SAFETY: a C callback with the user's own data.
        call_user((), || unsafe { cb(ep, status, ud as *mut c_void) });
    }

    fn on_error(&self, e: &Error) {
        let mut early = self.early.lock().unwrap_or_else(|p| p.into_inner());
        let ep = self.ptr.load(Ordering::Acquire);
        if ep.is_null() {
            *early = Some(e.clone());
            return;
        }
        drop(early);
        if ep as usize != CLOSED {
            self.deliver(ep, e);
        }
    }

    fn set(&self, ep: *mut courier_ep_t) {
        let early = {
            let mut g = self.early.lock().unwrap_or_else(|p| p.into_inner());
            self.ptr.store(ep, Ordering::Release);
            g.take()
        };
        if let Some(e) = early {
            self.deliver(ep, &e);
        }
    }
}

/// The handle was closed: the error handler stays silent.
const CLOSED: usize = 1;

/// A connection to one peer worker.
pub struct courier_ep_t {
    pub(crate) ep: Endpoint,
    /// The error handler's view of this handle.
    err_cell: Option<Arc<ErrCell>>,
    /// Lent for the duration of a callback (an active message's reply endpoint).
    borrowed: bool,
}
handle_kind!(courier_ep_t, 3, "endpoint");

impl courier_ep_t {
    /// A handle the caller owns. If the endpoint already failed (another thread's
    /// progress), its error handler runs here, before the handle is returned.
    pub(crate) fn new_owned(
        ep: Endpoint,
        cell: Option<Arc<ErrCell>>,
    ) -> Result<*mut courier_ep_t, Error> {
        let p = insert(courier_ep_t {
            ep,
            err_cell: cell.clone(),
            borrowed: false,
        })?;
        if let Some(c) = cell {
            c.set(p);
        }
        Ok(p)
    }

    /// A handle lent to a callback; `end_borrowed` ends it when the callback returns.
    pub(crate) fn new_borrowed(ep: Endpoint) -> Result<*mut courier_ep_t, Error> {
        insert(courier_ep_t {
            ep,
            err_cell: None,
            borrowed: true,
        })
    }

    /// End a handle `new_borrowed` made: later uses get `COURIER_ERR_INVALID_HANDLE`.
    pub(crate) fn end_borrowed(h: *mut courier_ep_t) {
        let _ = remove(h, "reply_ep");
    }
}

/// The endpoint parameters that matter to the library, and the cell to fill with the handle.
/// Unknown `field_mask` bits are refused.
pub(crate) unsafe fn ep_params(
    p: Option<&courier_ep_params_t>,
) -> Result<(EndpointParams, Option<Arc<ErrCell>>), Error> {
    let Some(p) = p else {
        return Ok((EndpointParams::default(), None));
    };
    known_bits("endpoint field_mask", p.field_mask, EP_FIELDS)?;
    let cb = if has(p.field_mask, COURIER_EP_FIELD_ERR_HANDLER) {
        p.err_handler
    } else {
        None
    };
    let Some(cb) = cb else {
        return Ok((EndpointParams::default(), None));
    };
    let ud = if has(p.field_mask, COURIER_EP_FIELD_USER_DATA) {
        p.user_data as usize
    } else {
        0
    };
    let cell = Arc::new(ErrCell {
        ptr: AtomicPtr::new(ptr::null_mut()),
        early: Mutex::new(None),
        cb,
        ud,
    });
    let seen = cell.clone();
    let params = EndpointParams::default().error_handler(move |e: &Error| seen.on_error(e));
    Ok((params, Some(cell)))
}

/// Connect to a peer: by worker address (`COURIER_EP_FIELD_REMOTE_ADDRESS`) or to a
/// listener (`COURIER_EP_FIELD_SOCK_ADDR`, with `COURIER_EP_FIELD_CLIENT_ID`). Returns at
/// once; operations queue until the connection is up (`courier_ep_wait_connected`).
/// `COURIER_ERR_INVALID_PARAM` for unknown bits in `params->field_mask`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_create(
    worker: *const courier_worker_t,
    params: *const courier_ep_params_t,
    ep_out: *mut *mut courier_ep_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        // SAFETY: NULL (refused or defaulted) or the caller's valid params struct.
        let p = unsafe { arg(params, "params") }?;
        let out = out_arg(ep_out, "ep_out")?;
        known_bits("endpoint field_mask", p.field_mask, EP_FIELDS)?;
        let by_addr = has(p.field_mask, COURIER_EP_FIELD_REMOTE_ADDRESS);
        let by_sock = has(p.field_mask, COURIER_EP_FIELD_SOCK_ADDR);
        let ep = match (by_addr, by_sock) {
            (true, false) => {
                // SAFETY: the caller promises that many readable bytes (NULL only with 0).
                let a = unsafe { bytes_arg(p.address, p.address_length, "params->address") }?;
                // SAFETY: the caller's params struct, checked non-NULL above.
                let (ep_p, cell) = unsafe { ep_params(Some(p)) }?;
                (w.w.connect(a, ep_p)?, cell)
            }
            (false, true) => {
                // SAFETY: NULL (refused) or the caller's NUL-terminated string.
                let s = unsafe { str_arg(p.sockaddr, "params->sockaddr") }?;
                let sa = parse_sockaddr(s)?;
                let id = if has(p.field_mask, COURIER_EP_FIELD_CLIENT_ID) {
                    p.client_id
                } else {
                    0
                };
                // SAFETY: the caller's params struct, checked non-NULL above.
                let (ep_p, cell) = unsafe { ep_params(Some(p)) }?;
                (w.w.connect_sockaddr(sa, id, ep_p)?, cell)
            }
            _ => {
                return Err(invalid(
                    "set exactly one of COURIER_EP_FIELD_REMOTE_ADDRESS and COURIER_EP_FIELD_SOCK_ADDR",
                ));
            }
        };
        let h = courier_ep_t::new_owned(ep.0, ep.1)?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// End an owned endpoint handle (not one lent to a callback): later uses of it get
/// `COURIER_ERR_INVALID_HANDLE`.
fn take_owned(ep: *mut courier_ep_t) -> Result<Removed<courier_ep_t>, Error> {
    let b = remove_if(ep, "ep", |h| {
        if h.borrowed {
            return Err(invalid(
                "this endpoint handle is lent to a callback (a reply endpoint); it cannot be closed",
            ));
        }
        Ok(())
    })?;
    if let Some(c) = &b.err_cell {
        c.ptr.store(CLOSED as *mut courier_ep_t, Ordering::Release);
    }
    Ok(b)
}

/// The next endpoint a peer opened to this worker by its address (passive side).
/// `COURIER_ERR_NO_MESSAGE` if there is none now. Endpoints made through a listener go to
/// its connection handler instead. Close it like any endpoint. It has no error handler
/// (the library cannot attach one to an incoming endpoint yet).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_incoming_ep(
    worker: *const courier_worker_t,
    ep_out: *mut *mut courier_ep_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let out = out_arg(ep_out, "ep_out")?;
        match w.w.incoming_endpoint() {
            Some(ep) => {
                let h = courier_ep_t::new_owned(ep, None)?;
                // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
                unsafe { *out = h };
                Ok(COURIER_OK)
            }
            None => Ok(COURIER_ERR_NO_MESSAGE),
        }
    })
}

/// Close gracefully: flush, tell the peer, release the handle (also on failure).
/// Bounded: after twice the keepalive timeout it closes by force (`COURIER_ERR_TIMEOUT`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_close(ep: *mut courier_ep_t) -> courier_status_t {
    boundary(|| {
        let b = take_owned(ep)?;
        b.ep.clone().close()?;
        Ok(COURIER_OK)
    })
}

/// Release an endpoint handle: close at once, without waiting for the peer; operations in
/// flight fail with `COURIER_ERR_ENDPOINT_CLOSED`. (`courier_ep_close` flushes and tells
/// the peer first, then releases the handle the same way.)
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_destroy(ep: *mut courier_ep_t) -> courier_status_t {
    boundary(|| {
        let b = take_owned(ep)?;
        b.ep.clone().close_force();
        Ok(COURIER_OK)
    })
}

/// The older name of `courier_ep_destroy`, kept for callers built against it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_close_force(ep: *mut courier_ep_t) -> courier_status_t {
    // SAFETY: forwarded contract.
    unsafe { courier_ep_destroy(ep) }
}

/// Progress until every send on the endpoint has completed and left this process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_flush(ep: *const courier_ep_t) -> courier_status_t {
    boundary(|| {
        get(ep, "ep")?.ep.flush()?;
        Ok(COURIER_OK)
    })
}

/// Progress until the endpoint is connected, failed, or `timeout_ms` passed (negative:
/// 24 hours).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_wait_connected(
    ep: *const courier_ep_t,
    timeout_ms: i64,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let t = u64::try_from(timeout_ms)
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(86400));
        e.ep.wait_connected(t)?;
        Ok(COURIER_OK)
    })
}

/// `COURIER_OK` if connected, `COURIER_INPROGRESS` while connecting, or why it failed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_status(ep: *const courier_ep_t) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        Ok(if e.ep.is_connected()? {
            COURIER_OK
        } else {
            COURIER_INPROGRESS
        })
    })
}

/// This side's socket address as "ip:port", NUL-terminated in `buf` of `buf_length` bytes,
/// for an endpoint made by socket address (also after its upgrade to shared memory);
/// `COURIER_ERR_UNSUPPORTED` for one made from a worker address, and
/// `COURIER_ERR_INVALID_PARAM` if it does not fit (`COURIER_SOCKADDR_STRLEN` always does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_local_address(
    ep: *const courier_ep_t,
    buf: *mut c_char,
    buf_length: usize,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let out = out_arg(buf, "buf")?;
        let Some(a) = e.ep.local_sockaddr() else {
            return Err(Error::new(
                Status::Unsupported,
                "the endpoint was not made over a socket",
            ));
        };
        // SAFETY: the output buffer was checked non-NULL and has the length the caller gave.
        unsafe { write_cstr(&a.to_string(), out, buf_length) }?;
        Ok(COURIER_OK)
    })
}

/// The transport carrying the endpoint ("self", "shm", "tcp"), or "" before it connects
/// (and for an invalid handle: then `courier_last_error_detail()` says why).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_transport(ep: *const courier_ep_t) -> *const c_char {
    boundary_or(c"".as_ptr(), || {
        let e = match get(ep, "ep") {
            Ok(e) => e,
            Err(err) => {
                record(&err);
                return c"".as_ptr();
            }
        };
        match e.ep.transport() {
            Some("self") => c"self".as_ptr(),
            Some("shm") => c"shm".as_ptr(),
            Some("tcp") => c"tcp".as_ptr(),
            Some(_) => c"other".as_ptr(),
            None => c"".as_ptr(),
        }
    })
}
