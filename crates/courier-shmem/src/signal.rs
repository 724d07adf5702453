//! Put-with-signal (`shmem_put_signal` and kin), `shmem_signal_fetch` and
//! `shmem_signal_wait_until`.
//!
//! A put-with-signal is Courier's one operation on every path: written directly (data,
//! then the signal word, then the owner's worker woken) for a same-host peer, one frame
//! for any other. `shmem_signal_wait_until` is the library's wait (`wait::block_until`):
//! it spins, yielding the CPU, for `SHMEM_WAIT_SPIN`, then sleeps on the worker's event fd,
//! which a signal carried in a frame wakes (a same-host peer's direct store is seen at the
//! next look).

use std::sync::atomic::{AtomicU64, Ordering, fence};

use courier::{Buf, Callback, SignalOp, Started};

use crate::ctx::Ctx;
use crate::error::fatal;
use crate::init::World;
use crate::symmetric::Seg;
use crate::wait::{check_cmp, holds};

/// `SHMEM_SIGNAL_SET`.
pub const SIGNAL_SET: i32 = 0;
/// `SHMEM_SIGNAL_ADD`.
pub const SIGNAL_ADD: i32 = 1;

fn sig_op(call: &'static str, op: i32) -> SignalOp {
    match op {
        SIGNAL_SET => SignalOp::Set,
        SIGNAL_ADD => SignalOp::Add,
        _ => fatal(
            call,
            format_args!("sig_op={op}: not SHMEM_SIGNAL_SET (0) or SHMEM_SIGNAL_ADD (1)"),
        ),
    }
}

/// Segment and offset of a symmetric range, or a fatal error naming `arg`.
fn locate(
    w: &World,
    call: &'static str,
    arg: &'static str,
    addr: usize,
    len: usize,
) -> (Seg, usize) {
    w.locate(addr, len)
        .unwrap_or_else(|| crate::rma::not_symmetric(w, call, arg, addr, len))
}

/// `shmem_putmem_signal` and every typed and `_nbi` form.
#[allow(clippy::too_many_arguments)]
pub fn put_signal(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    sig_addr: *mut u64,
    signal: u64,
    op: i32,
    pe: i32,
    nbi: bool,
) {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    let op = sig_op(call, op);
    if !(sig_addr as usize).is_multiple_of(8) {
        fatal(
            call,
            format_args!("sig_addr={sig_addr:p}: not 8-byte aligned"),
        )
    }
    let (dseg, doff) = locate(w, call, "dest", dest as usize, len);
    let (sseg, soff) = locate(w, call, "sig_addr", sig_addr as usize, 8);
    if pe == w.me {
        // SAFETY: both checked inside this PE's segments; the signal word is aligned.
        unsafe {
            std::ptr::copy(src, dest, len);
            fence(Ordering::Release);
            let a = AtomicU64::from_ptr(sig_addr);
            match op {
                SignalOp::Set => a.store(signal, Ordering::Release),
                SignalOp::Add => {
                    a.fetch_add(signal, Ordering::AcqRel);
                }
            }
        }
        return;
    }
    let peer = w.peer(call, pe);
    let part = |s: Seg, arg: &str| {
        peer.parts[s as usize]
            .as_ref()
            .unwrap_or_else(|| fatal(call, format_args!("{arg}: PE {pe} has no {}", s.name())))
    };
    let (dp, sp) = (part(dseg, "dest"), part(sseg, "sig_addr"));
    let mut data = Buf::One((src as usize, len));
    if len >= crate::copy::WIDE_MIN && !dp.direct.is_null() {
        // A same-host peer's dest, mapped here, and a copy large enough for the library's
        // own loop (faster than memcpy where the two buffers sit at different offsets in
        // their lines, see copy.rs): copied here, then only the signal goes through
        // Courier, which stores it after these stores (and wakes the peer if it sleeps).
        // Smaller ones stay one put-with-signal, which is faster than the two steps.
        // SAFETY: `dest` checked inside the segment, which is mapped here whole; `src`
        // is the caller's `len` bytes.
        unsafe { crate::copy::copy(dp.direct.add(doff), src, len) };
        data = Buf::One((0, 0));
    }
    peer.sent.store(true, std::sync::atomic::Ordering::Relaxed);
    let cb = if nbi {
        Callback::Raw(crate::rma::nbi_done, 0)
    } else {
        Callback::None
    };
    // SAFETY: blocking: waited for below (local completion); `_nbi`: the caller keeps `src`
    // until quiet.
    let s = unsafe {
        peer.ep.put_signal_raw(
            data,
            dp.base + doff as u64,
            &dp.key,
            sp.base + soff as u64,
            &sp.key,
            signal,
            op,
            cb,
        )
    };
    match s {
        Ok(Started::Pending(id)) if !nbi => {
            // SAFETY: `src` outlives the wait.
            let r = crate::wait::request(w, unsafe { w.worker.request_for(Started::Pending(id)) });
            if let Err(e) = r {
                fatal(call, format_args!("PE {pe}: {e}"))
            }
        }
        Ok(_) => {}
        Err(e) => fatal(call, format_args!("PE {pe}: {e}")),
    }
}

/// `shmem_signal_fetch`: the local signal word.
pub fn fetch(call: &'static str, sig_addr: *const u64) -> u64 {
    let w = crate::init::world(call);
    if !(sig_addr as usize).is_multiple_of(8) {
        fatal(
            call,
            format_args!("sig_addr={sig_addr:p}: not 8-byte aligned"),
        )
    }
    locate(w, call, "sig_addr", sig_addr as usize, 8);
    // SAFETY: checked symmetric and aligned.
    unsafe { AtomicU64::from_ptr(sig_addr as *mut u64) }.load(Ordering::Acquire)
}

/// `shmem_signal_wait_until`: the value that met the condition.
pub fn wait_until(call: &'static str, sig_addr: *mut u64, cmp: i32, value: u64) -> u64 {
    let w = crate::init::world(call);
    check_cmp(call, cmp);
    if !(sig_addr as usize).is_multiple_of(8) {
        fatal(
            call,
            format_args!("sig_addr={sig_addr:p}: not 8-byte aligned"),
        )
    }
    locate(w, call, "sig_addr", sig_addr as usize, 8);
    // The library's wait, as `shmem_wait_until`'s: it yields the CPU while it spins (the
    // PE that signals may need this core when PEs outnumber cores), then sleeps on the
    // worker, which a signal arriving in a frame wakes.
    // SAFETY: checked symmetric and 8-byte aligned above; the word lives as long as the heap.
    let word = unsafe { AtomicU64::from_ptr(sig_addr) };
    let mut seen = 0;
    crate::wait::block_until(w, || {
        seen = word.load(Ordering::Acquire);
        holds(cmp, seen, value)
    });
    seen
}
