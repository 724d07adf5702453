//! Atomic memory operations on 32- and 64-bit words: fetching, non-fetching and the
//! fetching `_nbi` forms.
//!
//! On this PE and on same-host peers (heap or globals alike) they are CPU atomics on the
//! mapped word, done when the call returns; elsewhere Courier's atomics through the
//! owner. Every atomic on a word goes one of these two ways for a given pair of PEs, and
//! the owner's worker itself uses CPU atomics, so the two never tear each other.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use courier::{AtomicOp, Callback, Info, Started};

use crate::ctx::Ctx;
use crate::error::fatal;
use crate::rma::{Where, target};

/// A type of the atomic families: its width and bit pattern.
pub trait Amo: Copy {
    /// 4 or 8 bytes.
    const WIDE: bool;
    /// The bits, zero-extended.
    fn bits(self) -> u64;
    /// From the bits (the low ones for 32-bit types).
    fn from_bits(b: u64) -> Self;
}

macro_rules! amo_int {
    ($($t:ty, $u:ty, $wide:expr);*) => {$(
        impl Amo for $t {
            const WIDE: bool = $wide;
            #[inline(always)]
            fn bits(self) -> u64 { self as $u as u64 }
            #[inline(always)]
            fn from_bits(b: u64) -> Self { b as $u as $t }
        }
    )*};
}
amo_int!(i32, u32, false; u32, u32, false; i64, u64, true; u64, u64, true; isize, u64, true; usize, u64, true);

impl Amo for f32 {
    const WIDE: bool = false;
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn from_bits(b: u64) -> Self {
        f32::from_bits(b as u32)
    }
}
impl Amo for f64 {
    const WIDE: bool = true;
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn from_bits(b: u64) -> Self {
        f64::from_bits(b)
    }
}

/// What an atomic does beyond Courier's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A Courier operation.
    Rmw(AtomicOp),
    /// Read the word.
    Fetch,
    /// Write the word.
    Set,
}

/// Carry `op` out on a word mapped here; the old value.
///
/// # Safety
/// `p` must be a valid, aligned word of the width, accessed by others only atomically.
#[inline(always)]
unsafe fn local(p: *mut u8, wide: bool, op: Op, v: u64, cmp: u64) -> u64 {
    if wide {
        // SAFETY: per the contract.
        let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
        let o = Ordering::SeqCst;
        match op {
            Op::Fetch => a.load(o),
            Op::Set => a.swap(v, o),
            Op::Rmw(AtomicOp::Add) => a.fetch_add(v, o),
            Op::Rmw(AtomicOp::And) => a.fetch_and(v, o),
            Op::Rmw(AtomicOp::Or) => a.fetch_or(v, o),
            Op::Rmw(AtomicOp::Xor) => a.fetch_xor(v, o),
            Op::Rmw(AtomicOp::Swap) => a.swap(v, o),
            Op::Rmw(AtomicOp::Cswap) => a.compare_exchange(cmp, v, o, o).unwrap_or_else(|x| x),
        }
    } else {
        // SAFETY: per the contract.
        let a = unsafe { AtomicU32::from_ptr(p as *mut u32) };
        let (v, cmp, o) = (v as u32, cmp as u32, Ordering::SeqCst);
        (match op {
            Op::Fetch => a.load(o),
            Op::Set => a.swap(v, o),
            Op::Rmw(AtomicOp::Add) => a.fetch_add(v, o),
            Op::Rmw(AtomicOp::And) => a.fetch_and(v, o),
            Op::Rmw(AtomicOp::Or) => a.fetch_or(v, o),
            Op::Rmw(AtomicOp::Xor) => a.fetch_xor(v, o),
            Op::Rmw(AtomicOp::Swap) => a.swap(v, o),
            Op::Rmw(AtomicOp::Cswap) => a.compare_exchange(cmp, v, o, o).unwrap_or_else(|x| x),
        }) as u64
    }
}

/// The Courier operation carrying `op` through the owner: a read is an add of 0, a write
/// a swap whose old value nobody looks at.
fn remote_op(op: Op) -> (AtomicOp, bool) {
    match op {
        Op::Rmw(o) => (o, false),
        Op::Fetch => (AtomicOp::Add, true),
        Op::Set => (AtomicOp::Swap, false),
    }
}

#[cold]
#[inline(never)]
fn misaligned(call: &str, addr: usize, width: usize) -> ! {
    fatal(
        call,
        format_args!("dest={addr:#x}: not aligned to its {width}-byte type"),
    )
}

/// How a fetching atomic's old value is delivered.
enum Out {
    /// Returned (blocking).
    Wait,
    /// Stored at this address when it completes (`_nbi`).
    Store(*mut u8),
    /// Nobody wants it (non-fetching).
    Drop,
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn run<T: Amo>(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut T,
    op: Op,
    v: T,
    cmp: T,
    pe: i32,
    out: Out,
) -> u64 {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    let width = if T::WIDE { 8 } else { 4 };
    if !(dest as usize).is_multiple_of(width) {
        misaligned(call, dest as usize, width)
    }
    match target(w, call, "dest", dest as usize, width, pe) {
        Where::Here(p) => {
            if pe == w.me && !matches!(out, Out::Drop) {
                // Fetching atomics on one's own word are how programs spin (a read, a
                // compare-and-swap on a lock) while peers reached through the worker (tcp)
                // wait to update it: serve them meanwhile.
                w.worker.progress();
            }
            // SAFETY: checked inside a mapped segment and aligned; symmetric words are
            // touched by everyone only through atomics.
            let old = unsafe { local(p, T::WIDE, op, v.bits(), cmp.bits()) };
            if let Out::Store(f) = out {
                // SAFETY: the caller's fetch buffer of the type.
                unsafe { std::ptr::write_unaligned(f as *mut T, T::from_bits(old)) };
            }
            old
        }
        Where::Remote { ep, key, raddr } => {
            let (cop, zero) = remote_op(op);
            let (val, cmpv) = if zero { (0, 0) } else { (v.bits(), cmp.bits()) };
            if let (Out::Drop, Op::Rmw(o)) = (&out, op) {
                if !matches!(o, AtomicOp::Swap | AtomicOp::Cswap) {
                    if let Err(e) = ep.atomic_post(o, val, raddr, key, !T::WIDE) {
                        fatal(call, format_args!("PE {pe}: {e}"))
                    }
                    return 0;
                }
            }
            let cb = match out {
                Out::Store(f) if T::WIDE => Callback::Raw(store64, f as usize),
                Out::Store(f) => Callback::Raw(store32, f as usize),
                _ => Callback::None,
            };
            let store = matches!(out, Out::Store(_));
            let s = ep
                .atomic_raw(cop, val, cmpv, raddr, key, !T::WIDE, cb)
                .unwrap_or_else(|e| fatal(call, format_args!("PE {pe}: {e}")));
            match s {
                Started::Done(i) => {
                    if let Out::Store(f) = out {
                        // SAFETY: as above.
                        unsafe { std::ptr::write_unaligned(f as *mut T, T::from_bits(i.value)) };
                    }
                    i.value
                }
                Started::Pending(_) if store => 0,
                Started::Pending(_) => {
                    // SAFETY: the operation owns no buffer of ours.
                    match crate::wait::request(w, unsafe { w.worker.request_for(s) }) {
                        Ok(i) => i.value,
                        Err(e) => fatal(call, format_args!("PE {pe}: {e}")),
                    }
                }
            }
        }
    }
}

fn store64(user: usize, r: Result<Info, courier::Error>, i: Info) {
    match r {
        // SAFETY: `user` is the caller's fetch buffer, valid until quiet.
        Ok(_) => unsafe { std::ptr::write_unaligned(user as *mut u64, i.value) },
        Err(e) => crate::rma::nbi_done(0, Err(e), i),
    }
}

fn store32(user: usize, r: Result<Info, courier::Error>, i: Info) {
    match r {
        // SAFETY: as in `store64`.
        Ok(_) => unsafe { std::ptr::write_unaligned(user as *mut u32, i.value as u32) },
        Err(e) => crate::rma::nbi_done(0, Err(e), i),
    }
}

/// A fetching atomic: the old value.
#[inline(always)]
pub fn fetch<T: Amo>(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut T,
    op: Op,
    v: T,
    cmp: T,
    pe: i32,
) -> T {
    T::from_bits(run(call, ctx, dest, op, v, cmp, pe, Out::Wait))
}

/// A non-fetching atomic.
#[inline(always)]
pub fn post<T: Amo>(call: &'static str, ctx: &Ctx, dest: *mut T, op: Op, v: T, pe: i32) {
    run(call, ctx, dest, op, v, v, pe, Out::Drop);
}

/// A fetching `_nbi` atomic: the old value lands in `*fetch` by `shmem_quiet`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn fetch_nbi<T: Amo>(
    call: &'static str,
    ctx: &Ctx,
    fetch: *mut T,
    dest: *mut T,
    op: Op,
    v: T,
    cmp: T,
    pe: i32,
) {
    if fetch.is_null() {
        fatal(call, "fetch=NULL")
    }
    run(
        call,
        ctx,
        dest,
        op,
        v,
        cmp,
        pe,
        Out::Store(fetch as *mut u8),
    );
}
