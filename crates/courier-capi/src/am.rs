//! Active messages: handlers by id, sends (eager, rendezvous, with replies), and receiving a
//! rendezvous message's data later.
//!
//! A handler sees the message in place: `header` and `data` are valid only during the call.
//! A large message arrives as a descriptor (`COURIER_AM_RECV_FLAG_RNDV`, `desc`), its data
//! still at the sender. The handler may receive it at once with
//! `courier_worker_am_recv_data`, keep it by returning `COURIER_INPROGRESS` (then receive it
//! or release it with `courier_worker_am_desc_release` later), or return anything else to
//! decline it (the sender's request completes).

use std::ffi::c_void;
use std::ptr;
use std::sync::{Mutex, MutexGuard};
use std::thread::{self, ThreadId};

use courier_core::{AmFlags, AmMessage, AmRndv, Error, Status};

use crate::endpoint::courier_ep_t;
use crate::ffi::*;
use crate::handle::*;
use crate::request::{courier_op_params_t, courier_request_t, start};
use crate::status::*;
use crate::worker::courier_worker_t;

/// Always eager (error if the message does not fit one frame).
pub const COURIER_AM_SEND_FLAG_EAGER: u32 = 1 << 0;
/// Always rendezvous.
pub const COURIER_AM_SEND_FLAG_RNDV: u32 = 1 << 1;
/// The receiver may reply on the endpoint the message arrived on.
pub const COURIER_AM_SEND_FLAG_REPLY: u32 = 1 << 2;

/// The data is still at the sender: `desc` is set, `data` is NULL.
pub const COURIER_AM_RECV_FLAG_RNDV: u32 = 1 << 0;
/// The sender allows replies: `reply_ep` is set.
pub const COURIER_AM_RECV_FLAG_REPLY: u32 = 1 << 1;

/// An active message as its handler sees it (valid only during the handler).
#[repr(C)]
pub struct courier_am_recv_param_t {
    /// Handler id.
    pub id: u16,
    /// `COURIER_AM_RECV_FLAG_*`.
    pub flags: u32,
    /// User header.
    pub header: *const c_void,
    /// Its length.
    pub header_length: usize,
    /// Eager data (NULL for rendezvous).
    pub data: *const c_void,
    /// Length of the data, wherever it is.
    pub data_length: usize,
    /// Rendezvous descriptor (NULL for eager).
    pub desc: *mut courier_am_desc_t,
    /// Endpoint to reply on, lent for the duration of the handler (do not close it).
    pub reply_ep: *mut courier_ep_t,
}

/// Handler for one active-message id; runs inside progress. Return `COURIER_INPROGRESS` to
/// keep a rendezvous descriptor for later, anything else otherwise.
pub type courier_am_cb_t = Option<
    unsafe extern "C-unwind" fn(
        param: *const courier_am_recv_param_t,
        user_data: *mut c_void,
    ) -> courier_status_t,
>;

/// A rendezvous active message's data, still at the sender. The handle is in its table
/// until it is received or released (inside the handler or later); then it is dead.
pub struct courier_am_desc_t {
    state: Mutex<DescState>,
}
handle_kind!(courier_am_desc_t, 9, "active-message descriptor");

struct DescState {
    /// The data handle, once the handler kept the descriptor.
    rndv: Option<AmRndv>,
    /// The message (its address), while its handler runs: the data handle is taken from it
    /// only if used. 0 otherwise.
    msg: usize,
    /// The thread running the handler, while it runs: only it may use the descriptor then.
    handler: Option<ThreadId>,
}

impl courier_am_desc_t {
    fn state(&self) -> MutexGuard<'_, DescState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether this thread may use the descriptor now (refused while another thread's handler
/// still has it).
fn usable_here(d: &courier_am_desc_t) -> Result<(), Error> {
    match d.state().handler {
        Some(t) if t != thread::current().id() => Err(invalid(
            "the active-message descriptor is still in its handler on another thread",
        )),
        _ => Ok(()),
    }
}

impl DescState {
    fn take(&mut self) -> Option<AmRndv> {
        if let Some(r) = self.rndv.take() {
            return Some(r);
        }
        if self.msg == 0 {
            return None;
        }
        // SAFETY: `msg` is non-zero only while the handler runs (`deliver` clears it, under
        // this lock, before the message goes away), and only the handler's thread gets
        // here then (`usable_here`), so this is the handler's exclusive borrow of it.
        unsafe { (*(self.msg as *mut AmMessage<'static>)).take_rndv() }
    }
}

const AM_SEND_FLAGS: u32 =
    COURIER_AM_SEND_FLAG_EAGER | COURIER_AM_SEND_FLAG_RNDV | COURIER_AM_SEND_FLAG_REPLY;

/// `COURIER_AM_SEND_FLAG_*` as the library's flags: unknown bits, and eager with rendezvous,
/// are refused.
fn send_flags(f: u32) -> Result<AmFlags, Error> {
    known_bits("am send flags", f as u64, AM_SEND_FLAGS as u64)?;
    let flags = AmFlags {
        eager: has(f as u64, COURIER_AM_SEND_FLAG_EAGER as u64),
        rndv: has(f as u64, COURIER_AM_SEND_FLAG_RNDV as u64),
        reply: has(f as u64, COURIER_AM_SEND_FLAG_REPLY as u64),
    };
    if flags.eager && flags.rndv {
        return Err(invalid(
            "COURIER_AM_SEND_FLAG_EAGER and _RNDV exclude each other",
        ));
    }
    Ok(flags)
}

fn deliver(
    cb: unsafe extern "C-unwind" fn(
        *const courier_am_recv_param_t,
        *mut c_void,
    ) -> courier_status_t,
    ud: usize,
    msg: &mut AmMessage<'_>,
) {
    let rndv = msg.is_rndv();
    let (hp, hl) = (msg.header().as_ptr(), msg.header().len());
    let dp = if rndv {
        ptr::null()
    } else {
        msg.data().as_ptr()
    };
    let dl = msg.data_len();
    let id = msg.id();
    // Without room for a handle the handler gets no reply endpoint (the reason is kept).
    let reply = match msg.reply_ep().map(courier_ep_t::new_borrowed) {
        Some(Ok(h)) => h,
        Some(Err(e)) => {
            record(&e);
            ptr::null_mut()
        }
        None => ptr::null_mut(),
    };
    let mut flags = 0;
    if !reply.is_null() {
        flags |= COURIER_AM_RECV_FLAG_REPLY;
    }
    let desc = if rndv {
        flags |= COURIER_AM_RECV_FLAG_RNDV;
        let m = (msg as *mut AmMessage<'_>) as usize;
        let d = courier_am_desc_t {
            state: Mutex::new(DescState {
                rndv: None,
                msg: m,
                handler: Some(thread::current().id()),
            }),
        };
        // Without room for a handle the data is declined (the reason is kept).
        insert(d).unwrap_or_else(|e| {
            record(&e);
            ptr::null_mut()
        })
    } else {
        ptr::null_mut()
    };
    let param = courier_am_recv_param_t {
        id,
        flags,
        header: hp as *const c_void,
        header_length: hl,
        data: dp as *const c_void,
        data_length: dl,
        desc,
        reply_ep: reply,
    };
    // SAFETY: a C callback with the user's own data; `param` lives across the call.
    let ret = call_user(COURIER_OK, || unsafe { cb(&param, ud as *mut c_void) });
    // Still in its table: neither received nor released inside the handler.
    if let Ok(d) = get(desc, "desc") {
        let kept = {
            let mut st = d.state();
            st.handler = None;
            st.msg = 0;
            if ret == COURIER_INPROGRESS {
                st.rndv = msg.take_rndv();
                true
            } else {
                false
            }
        };
        if !kept {
            // Declined: the library tells the sender once the handler returns.
            let _ = remove(desc, "desc");
        }
    }
    if !reply.is_null() {
        // Lent for the call only.
        courier_ep_t::end_borrowed(reply);
    }
}

/// Register the handler of active-message `id` (replacing any earlier one). A NULL `cb`
/// installs a handler that drops every message (and declines rendezvous data).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_set_am_handler(
    worker: *const courier_worker_t,
    id: u16,
    cb: courier_am_cb_t,
    user_data: *mut c_void,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let ud = user_data as usize;
        match cb {
            Some(cb) => {
                w.w.am_set_handler(id, move |msg: &mut AmMessage<'_>| deliver(cb, ud, msg))?
            }
            None => w.w.am_set_handler(id, |_: &mut AmMessage<'_>| {})?,
        }
        Ok(COURIER_OK)
    })
}

/// Send an active message to handler `id` on the peer: `header` is copied at once; `buffer`
/// must stay valid until completion. `flags`: `COURIER_AM_SEND_FLAG_*` (unknown bits, or
/// EAGER with RNDV, are `COURIER_ERR_INVALID_PARAM`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_am_send(
    ep: *const courier_ep_t,
    id: u16,
    header: *const c_void,
    header_length: usize,
    buffer: *const c_void,
    length: usize,
    flags: u32,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        // SAFETY: the caller promises that many readable bytes (NULL only with 0).
        let h = unsafe { bytes_arg(header, header_length, "header") }?;
        let b = one(buffer, length, "buffer")?;
        let f = send_flags(flags)?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.am_send_raw(id, h, b, f, cb)
            })
        }
    })
}

/// Send an active message whose data is gathered from `iov_count` segments (`flags` as for
/// `courier_ep_am_send`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_am_send_iov(
    ep: *const courier_ep_t,
    id: u16,
    header: *const c_void,
    header_length: usize,
    iov: *const courier_iov_t,
    iov_count: usize,
    flags: u32,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        // SAFETY: the caller promises that many readable bytes (NULL only with 0).
        let h = unsafe { bytes_arg(header, header_length, "header") }?;
        // SAFETY: NULL (refused) or the caller's `iov_count` entries, as courier.h documents.
        let b = unsafe { iov_buf(iov, iov_count) }?;
        let f = send_flags(flags)?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.am_send_raw(id, h, b, f, cb)
            })
        }
    })
}

/// Receive a rendezvous message's data into `buffer` (at least the message's length).
/// Consumes `desc` (also on failure). Always returns a request (`COURIER_INPROGRESS`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_am_recv_data(
    worker: *const courier_worker_t,
    desc: *mut courier_am_desc_t,
    buffer: *mut c_void,
    length: usize,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        out_arg(req_out, "req_out")?;
        let b = one(buffer, length, "buffer")?;
        let rndv = consume(desc)?;
        // SAFETY: the caller promises `length` writable bytes until completion.
        unsafe {
            start(&w.w, params, req_out, |cb| {
                w.w.am_recv_data_raw(rndv, b, cb)
            })
        }
    })
}

/// End the descriptor's handle and take its data handle.
fn consume(desc: *mut courier_am_desc_t) -> Result<AmRndv, Error> {
    let d = remove_if(desc, "desc", usable_here)?;
    let r = d.state().take();
    r.ok_or_else(|| {
        Error::new(
            Status::InvalidHandle,
            "the active-message descriptor was already used",
        )
    })
}

/// Release a kept rendezvous message's descriptor, declining its data: the data stays at
/// the sender, whose request completes. Inside the handler this is the same as returning
/// without keeping it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_am_desc_destroy(
    worker: *const courier_worker_t,
    desc: *mut courier_am_desc_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let d = remove_if(desc, "desc", usable_here)?;
        let mut st = d.state();
        if st.handler.is_some() {
            // Inside the handler: the library declines the data when the handler returns.
            return Ok(COURIER_OK);
        }
        let rndv = st.take().ok_or_else(|| {
            Error::new(
                Status::InvalidHandle,
                "the active-message descriptor was already used",
            )
        })?;
        drop(st);
        w.w.am_decline(rndv)?;
        Ok(COURIER_OK)
    })
}

/// The older name of `courier_am_desc_destroy`, kept for callers built against it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_am_desc_release(
    worker: *const courier_worker_t,
    desc: *mut courier_am_desc_t,
) -> courier_status_t {
    // SAFETY: forwarded contract.
    unsafe { courier_am_desc_destroy(worker, desc) }
}
