//! The operations a one-sided access applies to a word: atomics and signal updates, and
//! the write of a put's data where a checked access landed. Every path uses these: the
//! origin on memory mapped here, the owner on frames it carries out.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::base::Result;
use crate::proto::memreg::Place;

/// Atomic operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum AtomicOp {
    /// `*p += v`
    Add = 0,
    /// `*p &= v`
    And = 1,
    /// `*p |= v`
    Or = 2,
    /// `*p ^= v`
    Xor = 3,
    /// `*p = v`
    Swap = 4,
    /// `if *p == compare { *p = v }`
    Cswap = 5,
}

impl AtomicOp {
    /// Every operation, in wire order.
    pub const ALL: [AtomicOp; 6] = [
        AtomicOp::Add,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
        AtomicOp::Swap,
        AtomicOp::Cswap,
    ];

    /// Lower-case name, as in ucx_info's `atomic_<name>` capabilities.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::And => "and",
            AtomicOp::Or => "or",
            AtomicOp::Xor => "xor",
            AtomicOp::Swap => "swap",
            AtomicOp::Cswap => "cswap",
        }
    }

    pub(crate) fn from_u16(v: u16) -> Option<AtomicOp> {
        Some(match v {
            0 => AtomicOp::Add,
            1 => AtomicOp::And,
            2 => AtomicOp::Or,
            3 => AtomicOp::Xor,
            4 => AtomicOp::Swap,
            5 => AtomicOp::Cswap,
            _ => return None,
        })
    }
}

/// How a put-with-signal updates the signal word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Add the value.
    Add = 1,
}

/// Run an atomic on local memory; returns the old value.
///
/// # Safety
/// `p` must be valid and aligned for the width, and shared only through atomics.
pub(crate) unsafe fn do_atomic(
    p: *mut u8,
    op: AtomicOp,
    bits32: bool,
    v: u64,
    compare: u64,
) -> u64 {
    if bits32 {
        // SAFETY: caller guarantees alignment and validity.
        let a = unsafe { AtomicU32::from_ptr(p as *mut u32) };
        let (v, c) = (v as u32, compare as u32);
        (match op {
            AtomicOp::Add => a.fetch_add(v, Ordering::AcqRel),
            AtomicOp::And => a.fetch_and(v, Ordering::AcqRel),
            AtomicOp::Or => a.fetch_or(v, Ordering::AcqRel),
            AtomicOp::Xor => a.fetch_xor(v, Ordering::AcqRel),
            AtomicOp::Swap => a.swap(v, Ordering::AcqRel),
            AtomicOp::Cswap => a
                .compare_exchange(c, v, Ordering::AcqRel, Ordering::Acquire)
                .unwrap_or_else(|x| x),
        }) as u64
    } else {
        // SAFETY: as above.
        let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
        match op {
            AtomicOp::Add => a.fetch_add(v, Ordering::AcqRel),
            AtomicOp::And => a.fetch_and(v, Ordering::AcqRel),
            AtomicOp::Or => a.fetch_or(v, Ordering::AcqRel),
            AtomicOp::Xor => a.fetch_xor(v, Ordering::AcqRel),
            AtomicOp::Swap => a.swap(v, Ordering::AcqRel),
            AtomicOp::Cswap => a
                .compare_exchange(compare, v, Ordering::AcqRel, Ordering::Acquire)
                .unwrap_or_else(|x| x),
        }
    }
}

/// Write `data` where a checked access landed: a plain copy, or through the CUDA driver for
/// device memory (in place when it returns).
///
/// # Safety
/// `p` must be a checked place of at least `data.len()` bytes.
pub(crate) unsafe fn write_place(p: Place, data: &[u8]) -> Result<()> {
    if p.device {
        // SAFETY: per the contract.
        unsafe { crate::proto::stage::to_device(p.ptr, data.as_ptr(), data.len()) }
    } else {
        // SAFETY: per the contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.ptr, data.len()) };
        Ok(())
    }
}

/// Apply a signal update after the data it covers.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
pub(crate) unsafe fn do_signal(p: *mut u8, op: SignalOp, value: u64) {
    // SAFETY: caller guarantees alignment and validity.
    let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
    match op {
        SignalOp::Set => a.store(value, Ordering::Release),
        SignalOp::Add => {
            a.fetch_add(value, Ordering::AcqRel);
        }
    }
}

/// `do_signal` as a sequentially consistent read-modify-write, for a writer that looks
/// next whether the word's owner sleeps (`shm::Doorbell::ring`).
///
/// # Safety
/// As for `do_signal`.
pub(crate) unsafe fn do_signal_sc(p: *mut u8, op: SignalOp, value: u64) {
    // SAFETY: caller guarantees alignment and validity.
    let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
    match op {
        SignalOp::Set => a.swap(value, Ordering::SeqCst),
        SignalOp::Add => a.fetch_add(value, Ordering::SeqCst),
    };
}
