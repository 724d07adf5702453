//! Listeners and the connection requests they hand to their handler.
//!
//! Socket addresses cross the ABI as strings, "ip:port" (IPv6 "[addr]:port"): the same
//! form the library prints, easy to build from every language, no `struct sockaddr`
//! casting.

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use courier_core::{ConnRequest, Error, Listener, Status};

use crate::endpoint::{courier_ep_params_t, courier_ep_t, ep_params};
use crate::ffi::*;
use crate::handle::*;
use crate::status::*;
use crate::worker::courier_worker_t;

/// Called inside progress for each client that connects. The handler owns `conn_request`
/// and must end it with `courier_conn_request_accept` or `_reject`, now or later (on the
/// worker's thread for single-thread workers).
pub type courier_conn_handler_cb_t = Option<
    unsafe extern "C-unwind" fn(conn_request: *mut courier_conn_request_t, user_data: *mut c_void),
>;

/// `courier_listener_params_t.sockaddr` is set (otherwise "0.0.0.0:0").
pub const COURIER_LISTENER_FIELD_SOCK_ADDR: u64 = 1 << 0;
/// `conn_handler` is set (required).
pub const COURIER_LISTENER_FIELD_CONN_HANDLER: u64 = 1 << 1;
/// `user_data` is set.
pub const COURIER_LISTENER_FIELD_USER_DATA: u64 = 1 << 2;

const LISTENER_FIELDS: u64 = COURIER_LISTENER_FIELD_SOCK_ADDR
    | COURIER_LISTENER_FIELD_CONN_HANDLER
    | COURIER_LISTENER_FIELD_USER_DATA;

/// Parameters of `courier_listener_create`.
#[repr(C)]
pub struct courier_listener_params_t {
    /// Which fields below are set (`COURIER_LISTENER_FIELD_*`).
    pub field_mask: u64,
    /// Where to listen, "ip:port"; port 0 picks a free one.
    pub sockaddr: *const c_char,
    /// Called for each connection request.
    pub conn_handler: courier_conn_handler_cb_t,
    /// Passed to `conn_handler`.
    pub user_data: *mut c_void,
}

/// A listening socket of a worker.
pub struct courier_listener_t {
    l: Listener,
}
handle_kind!(courier_listener_t, 4, "listener");

/// A client asking to connect.
pub struct courier_conn_request_t {
    /// Taken by accept or reject (after the handle has left its table).
    r: Mutex<Option<ConnRequest>>,
}
handle_kind!(courier_conn_request_t, 5, "connection request");

impl courier_conn_request_t {
    fn take(&self) -> Result<ConnRequest, Error> {
        self.r
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                Error::new(
                    Status::InvalidHandle,
                    "the connection request was already accepted or rejected",
                )
            })
    }
}

/// Largest client address string, NUL included.
pub const COURIER_SOCKADDR_STRLEN: usize = 64;

/// `client_address` is wanted.
pub const COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR: u64 = 1 << 0;
/// `client_id` is wanted.
pub const COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID: u64 = 1 << 1;

const CONN_REQUEST_ATTR_FIELDS: u64 =
    COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR | COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;

/// What `courier_conn_request_query` reports.
#[repr(C)]
pub struct courier_conn_request_attr_t {
    /// Which fields to fill (`COURIER_CONN_REQUEST_ATTR_FIELD_*`).
    pub field_mask: u64,
    /// The client's socket address, "ip:port", NUL-terminated.
    pub client_address: [c_char; COURIER_SOCKADDR_STRLEN],
    /// The id the client chose.
    pub client_id: u64,
}

/// Listen for clients (`conn_handler` required). `COURIER_ERR_INVALID_PARAM` for unknown
/// bits in `params->field_mask`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_listener_create(
    worker: *const courier_worker_t,
    params: *const courier_listener_params_t,
    listener_out: *mut *mut courier_listener_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        // SAFETY: NULL (refused or defaulted) or the caller's valid params struct.
        let p = unsafe { arg(params, "params") }?;
        let out = out_arg(listener_out, "listener_out")?;
        known_bits("listener field_mask", p.field_mask, LISTENER_FIELDS)?;
        let sa = if has(p.field_mask, COURIER_LISTENER_FIELD_SOCK_ADDR) {
            // SAFETY: NULL (refused) or the caller's NUL-terminated string.
            parse_sockaddr(unsafe { str_arg(p.sockaddr, "params->sockaddr") }?)?
        } else {
            "0.0.0.0:0"
                .parse()
                .map_err(|_| invalid("default address"))?
        };
        let cb = if has(p.field_mask, COURIER_LISTENER_FIELD_CONN_HANDLER) {
            p.conn_handler
        } else {
            None
        };
        let cb =
            cb.ok_or_else(|| invalid("a listener needs COURIER_LISTENER_FIELD_CONN_HANDLER"))?;
        let ud = if has(p.field_mask, COURIER_LISTENER_FIELD_USER_DATA) {
            p.user_data as usize
        } else {
            0
        };
        let l = Listener::new(&w.w, sa, move |r: ConnRequest| {
            // Dropping a request no handle could be made for rejects it.
            match insert(courier_conn_request_t {
                r: Mutex::new(Some(r)),
            }) {
                // SAFETY: a C callback; it now owns `h`.
                Ok(h) => call_user((), || unsafe { cb(h, ud as *mut c_void) }),
                Err(e) => {
                    record(&e);
                }
            }
        })?;
        let h = insert(courier_listener_t { l })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Stop listening. Connection requests already handed out stay valid.
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a listener already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_listener_destroy(
    listener: *mut courier_listener_t,
) -> courier_status_t {
    boundary(|| {
        drop(remove(listener, "listener")?);
        Ok(COURIER_OK)
    })
}

/// The bound address as "ip:port" (the port picked, if 0 was asked for), NUL-terminated in
/// `buf` of `buf_length` bytes; `COURIER_ERR_INVALID_PARAM` if it does not fit
/// (`COURIER_SOCKADDR_STRLEN` always does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_listener_address(
    listener: *const courier_listener_t,
    buf: *mut c_char,
    buf_length: usize,
) -> courier_status_t {
    boundary(|| {
        let l = get(listener, "listener")?;
        let out = out_arg(buf, "buf")?;
        let s = l.l.local_addr().to_string();
        // SAFETY: the output buffer was checked non-NULL and has the length the caller gave.
        unsafe { write_cstr(&s, out, buf_length) }?;
        Ok(COURIER_OK)
    })
}

/// The bound port.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_listener_port(
    listener: *const courier_listener_t,
    port_out: *mut u16,
) -> courier_status_t {
    boundary(|| {
        let l = get(listener, "listener")?;
        let out = out_arg(port_out, "port_out")?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = l.l.local_addr().port() };
        Ok(COURIER_OK)
    })
}

/// Who is asking: fills the fields `attr->field_mask` names. `COURIER_ERR_INVALID_PARAM`
/// (nothing filled) for unknown bits in it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_conn_request_query(
    conn_request: *const courier_conn_request_t,
    attr: *mut courier_conn_request_attr_t,
) -> courier_status_t {
    boundary(|| {
        let r = get(conn_request, "conn_request")?;
        let r = r.r.lock().unwrap_or_else(|p| p.into_inner());
        let r = r.as_ref().ok_or_else(|| {
            Error::new(
                Status::InvalidHandle,
                "the connection request was already accepted or rejected",
            )
        })?;
        let a = out_arg(attr, "attr")?;
        // SAFETY: a valid attr struct (checked non-NULL).
        let a = unsafe { &mut *a };
        known_bits(
            "conn request attr field_mask",
            a.field_mask,
            CONN_REQUEST_ATTR_FIELDS,
        )?;
        if has(a.field_mask, COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR) {
            let s = r.client_addr();
            let s = if s.len() >= COURIER_SOCKADDR_STRLEN {
                &s[..COURIER_SOCKADDR_STRLEN - 1]
            } else {
                s
            };
            // SAFETY: the output buffer was checked non-NULL and has the length the caller gave.
            unsafe { write_cstr(s, a.client_address.as_mut_ptr(), COURIER_SOCKADDR_STRLEN) }?;
        }
        if has(a.field_mask, COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID) {
            a.client_id = r.client_id();
        }
        Ok(COURIER_OK)
    })
}

/// Accept: an endpoint to the client (params may be NULL; only the error handler and
/// user data are used; unknown bits in `params->field_mask` are `COURIER_ERR_INVALID_PARAM`).
/// Consumes `conn_request`, also on failure.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_conn_request_accept(
    conn_request: *mut courier_conn_request_t,
    params: *const courier_ep_params_t,
    ep_out: *mut *mut courier_ep_t,
) -> courier_status_t {
    boundary(|| {
        // Consumed here, also when a check below fails.
        let r = remove(conn_request, "conn_request")?.take()?;
        let out = out_arg(ep_out, "ep_out")?;
        // SAFETY: `params` is NULL or the caller's valid params struct.
        let (p, cell) = unsafe { ep_params(params.as_ref()) }?;
        let ep = r.accept(p)?;
        let h = courier_ep_t::new_owned(ep, cell)?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Reject: the client's endpoint fails with `COURIER_ERR_REJECTED`. Consumes
/// `conn_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_conn_request_reject(
    conn_request: *mut courier_conn_request_t,
) -> courier_status_t {
    boundary(|| {
        remove(conn_request, "conn_request")?.take()?.reject();
        Ok(COURIER_OK)
    })
}
