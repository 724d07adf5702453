//! Streams: ordered bytes per endpoint, no message boundaries.

use std::ffi::c_void;

use crate::endpoint::courier_ep_t;
use crate::ffi::*;
use crate::handle::*;
use crate::request::{courier_op_params_t, courier_request_t, start};
use crate::status::*;

/// Complete a stream receive only when the whole buffer is filled.
pub const COURIER_STREAM_RECV_FLAG_WAITALL: u32 = 1 << 0;

/// Whether `flags` (`COURIER_STREAM_RECV_FLAG_*`) asks for WAITALL; unknown bits are refused.
fn stream_recv_flags(flags: u32) -> Result<bool, courier_core::Error> {
    known_bits(
        "stream recv flags",
        flags as u64,
        COURIER_STREAM_RECV_FLAG_WAITALL as u64,
    )?;
    Ok(has(flags as u64, COURIER_STREAM_RECV_FLAG_WAITALL as u64))
}

/// Send `length` stream bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_stream_send(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.stream_send_raw(b, cb)
            })
        }
    })
}

/// Send stream bytes gathered from `iov_count` segments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_stream_send_iov(
    ep: *const courier_ep_t,
    iov: *const courier_iov_t,
    iov_count: usize,
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
                e.ep.stream_send_raw(b, cb)
            })
        }
    })
}

/// Receive stream bytes into `buffer`: whatever has arrived (at least one byte), or with
/// `COURIER_STREAM_RECV_FLAG_WAITALL` exactly `length`. The info's length is the count.
/// Unknown `flags` bits are `COURIER_ERR_INVALID_PARAM`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_stream_recv(
    ep: *const courier_ep_t,
    buffer: *mut c_void,
    length: usize,
    flags: u32,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let b = one(buffer, length, "buffer")?;
        let waitall = stream_recv_flags(flags)?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.stream_recv_raw(b, waitall, cb)
            })
        }
    })
}

/// Receive stream bytes scattered into `iov_count` segments (`flags` as for
/// `courier_ep_stream_recv`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_stream_recv_iov(
    ep: *const courier_ep_t,
    iov: *const courier_iov_t,
    iov_count: usize,
    flags: u32,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        // SAFETY: NULL (refused) or the caller's `iov_count` entries, as courier.h documents.
        let b = unsafe { iov_buf(iov, iov_count) }?;
        let waitall = stream_recv_flags(flags)?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.stream_recv_raw(b, waitall, cb)
            })
        }
    })
}
