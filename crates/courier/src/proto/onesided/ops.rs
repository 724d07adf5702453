//! The one-sided operations at the origin. Each first tries its direct path in line: a
//! contiguous host buffer and a region mapped here (`Key::direct`), done with a copy or a
//! CPU atomic and no lock. Everything else takes the general path, out of line: the key's
//! checks, then a local or device copy (`direct.rs`), a CMA copy into a same-host peer's
//! registered memory, or frames to the owner (`origin.rs`), with a host copy of device
//! memory where a link must carry it.

use std::sync::atomic::{Ordering, fence};

use super::atomic::{AtomicOp, SignalOp, do_atomic};
use super::direct::{Dir, copy_cma, copy_local, done, signal_with};
use super::key::{Key, Path};
use crate::base::cuda;
use crate::base::sys::copy_small;
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::buf::Buf;
use crate::proto::endpoint::EpRef;
use crate::proto::request::Started;
use crate::proto::request::{Callback, Info};
use crate::proto::stage;
use crate::wire::frame::RemoteRef;
use crate::wire::rkey::access;

/// Where an operation through the owner goes: the key's region and secret, at `addr`.
fn rref(k: &Key, addr: u64) -> RemoteRef {
    RemoteRef {
        region: k.key.region,
        secret: k.key.secret,
        addr,
    }
}

/// The checks of every general path: the key was unpacked on `ep`, and `ep` has not failed
/// (paths that bypass the worker must not go on writing into a failed peer's memory as if
/// nothing happened: they get the endpoint's error, as its sends do).
pub(crate) fn check_key(ep: &EpRef<'_>, k: &Key) -> Result<()> {
    if !k.unpacked_on(ep) {
        return Err(Error::new(
            Status::InvalidParam,
            "remote key was unpacked on another endpoint",
        ));
    }
    if k.gone.as_ref().is_some_and(|g| g.load(Ordering::Acquire)) {
        return Err(ep
            .with(|st, e| Ok(st.ep(e).and_then(|ep| ep.dead_error())))?
            .unwrap_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed")));
    }
    Ok(())
}

/// Write `data` at `raddr` in `key`'s region, on `ep`.
///
/// # Safety
/// `data` must stay valid until completion.
#[inline(always)]
pub(crate) unsafe fn put(
    ep: &EpRef<'_>,
    data: Buf,
    raddr: u64,
    key: &Key,
    cb: Callback,
) -> Result<Started> {
    if let Some(((a, l), dst)) = direct_one(ep, &data, raddr, key, access::WRITE) {
        // SAFETY: the owner's record and our mapping cover [raddr, raddr + l); the
        // source is the caller's host buffer.
        unsafe { copy_small(a as *const u8, dst, l) };
        return Ok(done(l));
    }
    // SAFETY: forwarded contract.
    unsafe { put_general(ep, data, raddr, key, cb) }
}

/// The fast path of puts and gets: the caller's buffer, when it is one segment of host
/// memory, and where `[raddr, raddr + its length)` lies here (`Key::direct`).
#[inline(always)]
fn direct_one(
    ep: &EpRef<'_>,
    buf: &Buf,
    raddr: u64,
    key: &Key,
    need: u16,
) -> Option<((usize, usize), *mut u8)> {
    let &Buf::One((a, l)) = buf else { return None };
    if cuda::is_device(a) {
        return None;
    }
    Some(((a, l), key.direct(ep, raddr, l as u64, need)?))
}

/// `put` for every case but a contiguous host-memory put into a region mapped here.
///
/// # Safety
/// As `put`.
#[inline(never)]
unsafe fn put_general(
    ep: &EpRef<'_>,
    data: Buf,
    raddr: u64,
    key: &Key,
    cb: Callback,
) -> Result<Started> {
    check_key(ep, key)?;
    let len = data.len();
    if let Some(dst) = key.resolve(raddr, len as u64, access::WRITE)? {
        // SAFETY: the owner's record covers [raddr, raddr+len); source is the caller's.
        unsafe { copy_local(&data, dst, Dir::ToRegion)? };
        return Ok(done(len));
    }
    // Neither CMA nor a link can read device memory: a host copy goes instead, kept
    // with the request when the owner's path has one.
    let host = stage::gather(&data)?;
    let src = match &host {
        Some(h) => Buf::One((h.as_ptr() as usize, h.len())),
        None => data,
    };
    if matches!(key.path, Path::Direct { cma: true, .. }) {
        // SAFETY: the segments are the caller's buffer (or our host copy).
        unsafe { copy_cma(key.key.pid, &src, raddr, Dir::ToRegion)? };
        return Ok(done(len));
    }
    let target = rref(key, raddr);
    ep.with(|st, e| match host {
        Some(h) => st.staged_send(h, |st, b| st.rma_put(e, b, target, cb)),
        None => st.rma_put(e, src, target, cb),
    })
}

/// Read into `buf` from `raddr` in `key`'s region, on `ep`.
///
/// # Safety
/// `buf` must stay valid until completion.
#[inline(always)]
pub(crate) unsafe fn get(
    ep: &EpRef<'_>,
    buf: Buf,
    raddr: u64,
    key: &Key,
    cb: Callback,
) -> Result<Started> {
    if let Some(((a, l), src)) = direct_one(ep, &buf, raddr, key, access::READ) {
        // SAFETY: the owner's record and our mapping cover [raddr, raddr + l); the
        // destination is the caller's writable host buffer.
        unsafe { copy_small(src, a as *mut u8, l) };
        return Ok(done(l));
    }
    // SAFETY: forwarded contract.
    unsafe { get_general(ep, buf, raddr, key, cb) }
}

/// `get` for every case but a contiguous host-memory get from a region mapped here.
///
/// # Safety
/// As `get`.
#[inline(never)]
unsafe fn get_general(
    ep: &EpRef<'_>,
    buf: Buf,
    raddr: u64,
    key: &Key,
    cb: Callback,
) -> Result<Started> {
    check_key(ep, key)?;
    let len = buf.len();
    if let Some(src) = key.resolve(raddr, len as u64, access::READ)? {
        // SAFETY: the record covers the source range; destination is the caller's.
        unsafe { copy_local(&buf, src, Dir::FromRegion)? };
        return Ok(done(len));
    }
    let cma = matches!(key.path, Path::Direct { cma: true, .. });
    let (pid, target) = (key.key.pid, rref(key, raddr));
    let get = move |st: &mut State, e: u32, b: Buf| {
        if cma {
            // SAFETY: `b` is the caller's writable buffer (or a host copy of it).
            unsafe { copy_cma(pid, &b, raddr, Dir::FromRegion)? };
            Ok(done(len))
        } else {
            st.rma_get(e, b, target, cb)
        }
    };
    if stage::has_device(&buf) {
        // Into host memory first; the device buffer is written on completion.
        return ep.with(|st, e| st.staged_recv(buf, |st, b| get(st, e, b)));
    }
    ep.with(|st, e| get(st, e, buf))
}

/// A fetching atomic on the 64-bit (or, with `bits32`, 32-bit) word at `raddr`; the old
/// value in the completion's `Info::value`. `compare` is used by `Cswap` only.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn atomic(
    ep: &EpRef<'_>,
    op: AtomicOp,
    value: u64,
    compare: u64,
    raddr: u64,
    key: &Key,
    bits32: bool,
    cb: Callback,
) -> Result<Started> {
    match atomic_target(ep, raddr, key, bits32)? {
        (width, Some(p)) => Ok(Started::Done(Info {
            length: width as usize,
            tag: 0,
            // SAFETY: checked in range and aligned, in host memory (`atomic_target`);
            // shared memory is touched only atomically.
            value: unsafe { do_atomic(p, op, bits32, value, compare) },
        })),
        (_, None) => {
            ep.with(|st, e| st.rma_atomic(e, op, bits32, value, compare, rref(key, raddr), cb))
        }
    }
}

/// A posted (non-fetching) atomic: `Add`, `And`, `Or` or `Xor` (the others exist for their
/// old value and are refused); carried out in the call where the word is mapped here,
/// else sent to the owner, which answers only a refusal (reported by the next flush).
pub(crate) fn atomic_post(
    ep: &EpRef<'_>,
    op: AtomicOp,
    value: u64,
    raddr: u64,
    key: &Key,
    bits32: bool,
) -> Result<()> {
    if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "a posted atomic cannot be {op:?}: it returns no old value (use a fetching atomic)"
            ),
        ));
    }
    match atomic_target(ep, raddr, key, bits32)? {
        (_, Some(p)) => {
            // SAFETY: as in `atomic`.
            unsafe { do_atomic(p, op, bits32, value, 0) };
            Ok(())
        }
        (_, None) => ep.with(|st, e| st.rma_atomic_post(e, op, bits32, value, rref(key, raddr))),
    }
}

/// Where an atomic goes: the word's width, and its address when it lies in host memory
/// mapped here (`None`: through the owner). The usual case, an aligned word of a host
/// region mapped here that grants atomics (`Key::direct`), in line; the checks and their
/// errors out of line.
#[inline(always)]
fn atomic_target(
    ep: &EpRef<'_>,
    raddr: u64,
    key: &Key,
    bits32: bool,
) -> Result<(u64, Option<*mut u8>)> {
    let width = if bits32 { 4 } else { 8 };
    if raddr.is_multiple_of(width)
        && let Some(p) = key.direct(ep, raddr, width, access::ATOMIC)
    {
        return Ok((width, Some(p)));
    }
    atomic_checked(ep, raddr, key, width)
}

/// The checks every atomic passes before it is carried out or sent: the key is this
/// endpoint's, the word aligned, and within what the key (and, where this process can
/// read it, the owner's record) grants for atomics. Where it is when mapped here.
#[inline(never)]
fn atomic_checked(
    ep: &EpRef<'_>,
    raddr: u64,
    key: &Key,
    width: u64,
) -> Result<(u64, Option<*mut u8>)> {
    check_key(ep, key)?;
    if !raddr.is_multiple_of(width) {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("atomic address {raddr:#x} is not {width}-byte aligned"),
        ));
    }
    // Host memory only: `resolve` refuses atomics on device memory.
    Ok((
        width,
        key.resolve(raddr, width, access::ATOMIC)?.map(|p| p.ptr),
    ))
}

/// The signal half of a put-with-signal: the word, its key, and the update.
pub(crate) struct SignalTarget<'k> {
    pub(crate) addr: u64,
    pub(crate) key: &'k Key,
    pub(crate) value: u64,
    pub(crate) op: SignalOp,
}

/// Write `data` at `raddr`, then update the signal word `sig`, as one operation.
///
/// # Safety
/// `data` must stay valid until completion.
#[inline(always)]
pub(crate) unsafe fn put_signal(
    ep: &EpRef<'_>,
    data: Buf,
    raddr: u64,
    key: &Key,
    sig: SignalTarget<'_>,
    cb: Callback,
) -> Result<Started> {
    // A same-host peer's region, mapped here, with the endpoint on shared memory (whose
    // link wakes the owner): contiguous host data and the signal written directly.
    if let Buf::One((a, l)) = data
        && sig.addr.is_multiple_of(8)
        && let Some(bell) = sig.key.doorbell(ep)
        && !cuda::is_device(a)
        && let Some((dst, word)) = direct_pair(ep, key, raddr, l as u64, sig.key, sig.addr)
    {
        // SAFETY: both ranges checked against the owner's record and our mapping; the
        // signal word is aligned (the owner's address is, and regions start on pages);
        // the source is the caller's buffer.
        unsafe {
            copy_small(a as *const u8, dst, l);
            fence(Ordering::Release);
            signal_with(Some(bell), word, sig.op, sig.value);
        }
        return Ok(done(l));
    }
    // SAFETY: forwarded contract.
    unsafe { put_signal_general(ep, data, raddr, key, sig, cb) }
}

/// For the direct put-with-signal: where the data and the signal word are mapped here,
/// both checked for writing (with one check of the key's view of the owner's record when
/// both lie in the region of one key, as they usually do).
#[inline]
fn direct_pair(
    ep: &EpRef<'_>,
    key: &Key,
    raddr: u64,
    len: u64,
    sig_key: &Key,
    sig_addr: u64,
) -> Option<(*mut u8, *mut u8)> {
    let w = access::WRITE;
    if std::ptr::eq(key, sig_key) {
        // One region, one set of rights: both ranges lie in it exactly when the span
        // from the lower start to the higher end does.
        let lo = raddr.min(sig_addr);
        let hi = raddr.checked_add(len)?.max(sig_addr.checked_add(8)?);
        let at = key.direct(ep, lo, hi - lo, w)?;
        Some((
            at.wrapping_add((raddr - lo) as usize),
            at.wrapping_add((sig_addr - lo) as usize),
        ))
    } else {
        Some((
            key.direct(ep, raddr, len, w)?,
            sig_key.direct(ep, sig_addr, 8, w)?,
        ))
    }
}

/// `put_signal` for every case but the direct one.
///
/// # Safety
/// As `put_signal`.
#[inline(never)]
unsafe fn put_signal_general(
    ep: &EpRef<'_>,
    data: Buf,
    raddr: u64,
    key: &Key,
    sig: SignalTarget<'_>,
    cb: Callback,
) -> Result<Started> {
    let SignalTarget {
        addr: sig_addr,
        key: sig_key,
        value,
        op,
    } = sig;
    check_key(ep, key)?;
    check_key(ep, sig_key)?;
    if !sig_addr.is_multiple_of(8) {
        return Err(Error::new(
            Status::InvalidParam,
            "signal address is not 8-byte aligned",
        ));
    }
    let len = data.len();
    let dst = key.resolve(raddr, len as u64, access::WRITE)?;
    let sig = sig_key
        .resolve(sig_addr, 8, access::WRITE)?
        .filter(|s| s.device || sig_key.signal_direct_ready(ep));
    // Unless both are mapped here, the data goes through the owner or CMA: a host copy
    // of device memory, then.
    let host = match (dst, sig) {
        (Some(_), Some(_)) => None,
        _ => stage::gather(&data)?,
    };
    let data = match &host {
        Some(h) => Buf::One((h.as_ptr() as usize, h.len())),
        None => data,
    };
    match (dst, sig) {
        (_, Some(sig)) if sig.device => Err(Error::new(
            Status::Unsupported,
            "the signal word is in CUDA device memory; signal words need host memory",
        )),
        (Some(dst), Some(sig)) => {
            // SAFETY: both ranges checked against the owner's records; a device copy
            // has finished when it returns.
            unsafe { copy_local(&data, dst, Dir::ToRegion)? };
            fence(Ordering::Release);
            // SAFETY: checked, aligned, host memory.
            unsafe { sig_key.signal_direct(ep, sig.ptr, op, value) };
            Ok(done(len))
        }
        (None, Some(sig)) if matches!(key.path, Path::Direct { cma: true, .. }) => {
            // Registered memory of a same-host peer reached with CMA, the signal word
            // mapped here: the data is in place when `process_vm_writev` returns (the
            // range was checked against the owner's record by `resolve`), then the signal.
            // SAFETY: the segments are the caller's buffer (or our host copy).
            unsafe { copy_cma(key.key.pid, &data, raddr, Dir::ToRegion)? };
            fence(Ordering::Release);
            // SAFETY: checked, aligned, host memory.
            unsafe { sig_key.signal_direct(ep, sig.ptr, op, value) };
            Ok(done(len))
        }
        _ => {
            let (t, s) = (rref(key, raddr), rref(sig_key, sig_addr));
            ep.with(|st, e| match host {
                Some(h) => st.staged_send(h, |st, b| st.rma_put_signal(e, b, t, s, op, value, cb)),
                None => st.rma_put_signal(e, data, t, s, op, value, cb),
            })
        }
    }
}
