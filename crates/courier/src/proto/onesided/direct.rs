//! The paths that reach the owner's memory in the call, without its worker: copies into a
//! region mapped here (this context's own, or a same-host peer's shared segment), CMA
//! copies into a same-host peer's registered memory, and direct signal updates that ring
//! the owner's doorbell when it may sleep.

use super::atomic::{SignalOp, do_signal, do_signal_sc};
use crate::base::Result;
use crate::base::cuda;
use crate::base::sys::copy_small;
use crate::proto::buf::Buf;
use crate::proto::memreg::Place;
use crate::proto::request::Info;
use crate::proto::request::Started;
use crate::proto::stage;
use crate::transport::shm::memory::{Doorbell, cma_read, cma_write};

/// Update a signal word written directly, and ring `bell` (the owner's worker) if it may
/// sleep: a sleeping `signal_wait_until` on it then returns at once, not at its next look.
/// Where the owner cannot sleep, or nobody is to be woken (`None`: this context's own
/// memory), the update is a plain one, with no ordering cost.
///
/// # Safety
/// `sig` must be an aligned, valid, host-memory word.
#[inline]
pub(super) unsafe fn signal_with(bell: Option<&Doorbell>, sig: *mut u8, op: SignalOp, value: u64) {
    match bell.filter(|b| b.may_sleep()) {
        Some(b) => {
            // SAFETY: forwarded contract.
            unsafe { do_signal_sc(sig, op, value) };
            b.ring();
        }
        // SAFETY: forwarded contract.
        None => unsafe { do_signal(sig, op, value) },
    }
}

/// Which way a one-sided copy goes.
#[derive(Clone, Copy)]
pub(crate) enum Dir {
    /// From the caller's buffer into the region (put).
    ToRegion,
    /// From the region into the caller's buffer (get).
    FromRegion,
}

pub(super) fn done(len: usize) -> Started {
    Started::Done(Info {
        length: len,
        ..Info::default()
    })
}

/// Copy between the caller's segments and a region mapped here, in order: plain copies
/// between host memory, the CUDA driver's copies wherever either side is device memory.
///
/// # Safety
/// `region` must be valid for `buf.len()` bytes and the segments for their lengths.
#[inline]
pub(crate) unsafe fn copy_local(buf: &Buf, region: Place, dir: Dir) -> Result<()> {
    if let Buf::One((a, l)) = *buf {
        if !region.device && !cuda::is_device(a) {
            // The one-segment case without a memcpy call: a peer may be polling the
            // region, and a word-sized put lands as one store.
            // SAFETY: per the function's contract.
            unsafe {
                match dir {
                    Dir::ToRegion => copy_small(a as *const u8, region.ptr, l),
                    Dir::FromRegion => copy_small(region.ptr, a as *mut u8, l),
                }
            }
            return Ok(());
        }
    }
    let mut off = 0;
    for &(a, l) in buf.segs() {
        if l == 0 {
            continue;
        }
        let r = region.ptr.wrapping_add(off);
        let (src, dst) = match dir {
            Dir::ToRegion => ((a, cuda::is_device(a)), (r as usize, region.device)),
            Dir::FromRegion => ((r as usize, region.device), (a, cuda::is_device(a))),
        };
        // SAFETY: per the function's contract.
        unsafe { stage::copy(dst, src, l)? };
        off += l;
    }
    Ok(())
}

/// Copy between the caller's segments and process `pid`'s memory at `raddr` with CMA.
///
/// # Safety
/// The segments must be valid for their lengths (writable for `FromRegion`).
pub(super) unsafe fn copy_cma(pid: u32, buf: &Buf, raddr: u64, dir: Dir) -> Result<()> {
    let mut off = 0u64;
    for &(a, l) in buf.segs() {
        match dir {
            Dir::ToRegion => cma_write(pid, a, l, raddr + off)?,
            // SAFETY: per the function's contract.
            Dir::FromRegion => unsafe { cma_read(pid, a, l, raddr + off)? },
        }
        off += l as u64;
    }
    Ok(())
}
