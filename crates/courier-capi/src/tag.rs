//! Tag-matched messages: send (contiguous, synchronous, gathered), receive (contiguous,
//! scattered), probe.
//!
//! Buffers given to a send or receive must stay valid and untouched until the operation
//! completes (`COURIER_OK` at once, or its request completes).

use std::ffi::c_void;

use crate::endpoint::courier_ep_t;
use crate::ffi::*;
use crate::handle::*;
use crate::request::{courier_op_params_t, courier_request_info_t, courier_request_t, start};
use crate::status::*;
use crate::worker::courier_worker_t;

/// Send `length` bytes with `tag`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_tag_send(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    tag: u64,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.tag_send_raw(b, tag, false, cb)
            })
        }
    })
}

/// Send that completes only when the receiver has matched the message.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_tag_send_sync(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    tag: u64,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.tag_send_raw(b, tag, true, cb)
            })
        }
    })
}

/// Send one message gathered from `iov_count` segments (the iov array itself may be
/// reused when the call returns; the segments may not until completion).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_tag_send_iov(
    ep: *const courier_ep_t,
    iov: *const courier_iov_t,
    iov_count: usize,
    tag: u64,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        // SAFETY: NULL (refused) or the caller's `iov_count` entries, as courier.h documents.
        let b = unsafe { iov_buf(iov, iov_count) }?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.tag_send_raw(b, tag, false, cb)
            })
        }
    })
}

/// Receive the first message whose `(msg_tag ^ tag) & tag_mask == 0` into `buffer`. The
/// completion's info has the message's length and tag; a longer message completes with
/// `COURIER_ERR_MESSAGE_TRUNCATED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_tag_recv(
    worker: *const courier_worker_t,
    buffer: *mut c_void,
    length: usize,
    tag: u64,
    tag_mask: u64,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(&w.w, params, req_out, |cb| {
                w.w.tag_recv_raw(b, tag, tag_mask, cb)
            })
        }
    })
}

/// Receive one message scattered into `iov_count` segments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_tag_recv_iov(
    worker: *const courier_worker_t,
    iov: *const courier_iov_t,
    iov_count: usize,
    tag: u64,
    tag_mask: u64,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        // SAFETY: NULL (refused) or the caller's `iov_count` entries, as courier.h documents.
        let b = unsafe { iov_buf(iov, iov_count) }?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(&w.w, params, req_out, |cb| {
                w.w.tag_recv_raw(b, tag, tag_mask, cb)
            })
        }
    })
}

/// Look for an arrived, unreceived message matching `tag`/`tag_mask` without receiving
/// it: `COURIER_OK` and its length and tag in `*info_out`, or `COURIER_ERR_NO_MESSAGE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_tag_probe(
    worker: *const courier_worker_t,
    tag: u64,
    tag_mask: u64,
    info_out: *mut courier_request_info_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let out = out_arg(info_out, "info_out")?;
        match w.w.tag_probe(tag, tag_mask)? {
            Some(p) => {
                // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
                unsafe {
                    *out = courier_request_info_t {
                        length: p.length,
                        tag: p.tag,
                        value: 0,
                    }
                };
                Ok(COURIER_OK)
            }
            None => Ok(COURIER_ERR_NO_MESSAGE),
        }
    })
}
