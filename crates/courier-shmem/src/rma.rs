//! Puts and gets: blocking, `_nbi`, single elements (`p`/`g`) and strided (`iput`/`iget`),
//! and `fence` / `quiet`.
//!
//! A target on this PE, or on a same-host peer whose segment is mapped here, is written
//! with plain copies (complete when the call returns). Others go through the peer's
//! endpoint: a blocking put returns at local completion (the source may be reused), a
//! get when the data is here, an `_nbi` one when issued (`shmem_quiet` completes it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering, fence};

use courier::{Buf, Callback, Endpoint, Info, RemoteKey};

use crate::ctx::Ctx;
use crate::error::fatal;
use crate::init::World;

/// Where an access lands.
pub enum Where<'a> {
    /// Memory mapped here: this PE's own, or a same-host peer's.
    Here(*mut u8),
    /// Through the peer's endpoint.
    Remote {
        /// The endpoint.
        ep: &'a Endpoint,
        /// The segment's key.
        key: &'a RemoteKey,
        /// The address in the peer's process.
        raddr: u64,
    },
}

/// Where `[addr, addr + len)`, a symmetric object named `arg` in `call`, lies on PE `pe`
/// (a PE of the world, already checked).
#[inline(always)]
pub fn target<'w>(
    w: &'w World,
    call: &'static str,
    arg: &'static str,
    addr: usize,
    len: usize,
    pe: usize,
) -> Where<'w> {
    let Some((seg, off)) = w.locate(addr, len) else {
        not_symmetric(w, call, arg, addr, len)
    };
    if pe == w.me {
        return Where::Here(addr as *mut u8);
    }
    let peer = w.peer(call, pe);
    let Some(part) = peer.parts[seg as usize].as_ref() else {
        fatal(
            call,
            format_args!("{arg}: PE {pe} has no {} to reach", seg.name()),
        )
    };
    if (off + len) as u64 > part.len {
        fatal(
            call,
            format_args!(
                "{arg}=[{addr:#x}, +{len}) lies past the end of PE {pe}'s {} ({} bytes; do all PEs run the same program?)",
                seg.name(),
                part.len
            ),
        )
    }
    if !part.direct.is_null() {
        // SAFETY: inside the peer's segment, which is mapped here whole.
        return Where::Here(unsafe { part.direct.add(off) });
    }
    peer.sent.store(true, Ordering::Relaxed);
    Where::Remote {
        ep: &peer.ep,
        key: &part.key,
        raddr: part.base + off as u64,
    }
}

#[cold]
#[inline(never)]
pub fn not_symmetric(w: &World, call: &str, arg: &str, addr: usize, len: usize) -> ! {
    let data = match &w.data {
        Some(d) => format!("data segment [{:#x}, +{})", d.base, d.len),
        None => "no shared data segment".into(),
    };
    fatal(
        call,
        format_args!(
            "{arg}=[{addr:#x}, +{len}) is not symmetric: it is neither in the symmetric heap [{:#x}, +{}) nor in the {data}",
            w.heap.base, w.heap.len
        ),
    )
}

/// The first failure of an operation that nobody waits on (`_nbi`), reported by the next
/// `shmem_quiet`.
static ASYNC_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Whether `ASYNC_ERROR` may hold a failure: `shmem_quiet` looks at this before it takes
/// the lock, which costs two locked instructions on every quiet otherwise.
static ASYNC_FAILED: AtomicBool = AtomicBool::new(false);

/// Completion of an `_nbi` operation: only a failure matters.
pub fn nbi_done(_user: usize, r: Result<Info, courier::Error>, _i: Info) {
    if let Err(e) = r {
        let mut g = ASYNC_ERROR.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(|| e.to_string());
        ASYNC_FAILED.store(true, Ordering::Release);
    }
}

#[cold]
#[inline(never)]
fn failed(call: &str, pe: usize, e: courier::Error) -> ! {
    fatal(call, format_args!("PE {pe}: {e}"))
}

/// Wait for a started operation (local completion for a put, the data for a get).
fn wait(w: &World, call: &str, pe: usize, s: courier::Started) {
    if let courier::Started::Pending(_) = s {
        // SAFETY: the buffers of the operation outlive this wait (the caller's).
        let r = crate::wait::request(w, unsafe { w.worker.request_for(s) });
        if let Err(e) = r {
            failed(call, pe, e)
        }
    }
}

/// Put `len` bytes from `src` to the symmetric `dest` on `pe` (a context's PE number).
#[inline(always)]
pub fn put(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    pe: i32,
    nbi: bool,
) {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    if len == 0 {
        return;
    }
    match target(w, call, "dest", dest as usize, len, pe) {
        // SAFETY: the target range was checked to lie in a mapped segment; `src` is the
        // caller's buffer of `len` bytes (they may overlap when `pe` is this PE).
        Where::Here(p) => unsafe { crate::copy::copy(p, src, len) },
        Where::Remote { ep, key, raddr } => {
            let cb = if nbi {
                Callback::Raw(nbi_done, 0)
            } else {
                Callback::None
            };
            // SAFETY: blocking: waited for below; `_nbi`: the caller keeps `src` until quiet.
            match unsafe { ep.put_raw(Buf::One((src as usize, len)), raddr, key, cb) } {
                Ok(s) if !nbi => wait(w, call, pe, s),
                Ok(_) => {}
                Err(e) => failed(call, pe, e),
            }
        }
    }
}

/// Get `len` bytes from the symmetric `src` on `pe` into `dest`.
#[inline(always)]
pub fn get(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    pe: i32,
    nbi: bool,
) {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    if len == 0 {
        return;
    }
    match target(w, call, "source", src as usize, len, pe) {
        // SAFETY: as in `put`, the other way.
        Where::Here(p) => unsafe { crate::copy::copy(dest, p, len) },
        Where::Remote { ep, key, raddr } => {
            let cb = if nbi {
                Callback::Raw(nbi_done, 0)
            } else {
                Callback::None
            };
            // SAFETY: blocking: waited for below; `_nbi`: `dest` is not read before quiet.
            match unsafe { ep.get_raw(Buf::One((dest as usize, len)), raddr, key, cb) } {
                Ok(s) if !nbi => wait(w, call, pe, s),
                Ok(_) => {}
                Err(e) => failed(call, pe, e),
            }
        }
    }
}

/// `shmem_TYPE_p`: one element.
#[inline(always)]
pub fn p<T: Copy>(call: &'static str, ctx: &Ctx, dest: *mut T, value: T, pe: i32) {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    let n = size_of::<T>();
    match target(w, call, "dest", dest as usize, n, pe) {
        // SAFETY: checked range; may be unaligned for odd element placements.
        Where::Here(p) => unsafe { std::ptr::write_unaligned(p as *mut T, value) },
        Where::Remote { ep, key, raddr } => {
            let v = value;
            // SAFETY: `v` lives until the wait below returns.
            match unsafe {
                ep.put_raw(
                    Buf::One((&v as *const T as usize, n)),
                    raddr,
                    key,
                    Callback::None,
                )
            } {
                Ok(s) => wait(w, call, pe, s),
                Err(e) => failed(call, pe, e),
            }
        }
    }
}

/// `shmem_TYPE_g`: one element.
#[inline(always)]
pub fn g<T: Copy + Default>(call: &'static str, ctx: &Ctx, src: *const T, pe: i32) -> T {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    let n = size_of::<T>();
    match target(w, call, "source", src as usize, n, pe) {
        Where::Here(p) => {
            if pe == w.me {
                // Spinning on one's own copy: serve peers reached through the worker.
                w.worker.progress();
            }
            // SAFETY: checked range.
            unsafe { std::ptr::read_unaligned(p as *const T) }
        }
        Where::Remote { ep, key, raddr } => {
            let mut v = T::default();
            // SAFETY: `v` lives until the wait below returns.
            match unsafe {
                ep.get_raw(
                    Buf::One((&mut v as *mut T as usize, n)),
                    raddr,
                    key,
                    Callback::None,
                )
            } {
                Ok(s) => wait(w, call, pe, s),
                Err(e) => failed(call, pe, e),
            }
            v
        }
    }
}

/// Strided put (`iput`): `nelems` elements of `size` bytes, `sst` elements apart in
/// `src`, `dst` elements apart at `dest`.
#[allow(clippy::too_many_arguments)]
pub fn iput(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut u8,
    src: *const u8,
    dst: isize,
    sst: isize,
    nelems: usize,
    size: usize,
    pe: i32,
) {
    strided(
        call,
        ctx,
        dest,
        src as *mut u8,
        dst,
        sst,
        nelems,
        size,
        pe,
        true,
    )
}

/// Strided get (`iget`): `sst` elements apart in the symmetric `src`, `dst` apart in `dest`.
#[allow(clippy::too_many_arguments)]
pub fn iget(
    call: &'static str,
    ctx: &Ctx,
    dest: *mut u8,
    src: *const u8,
    dst: isize,
    sst: isize,
    nelems: usize,
    size: usize,
    pe: i32,
) {
    strided(
        call,
        ctx,
        src as *mut u8,
        dest,
        sst,
        dst,
        nelems,
        size,
        pe,
        false,
    )
}

/// Strided copy between the symmetric `sym` (stride `sym_st`) on `pe` and the local
/// `mine` (stride `my_st`), towards `sym` when `to_sym`.
#[allow(clippy::too_many_arguments)]
fn strided(
    call: &'static str,
    ctx: &Ctx,
    sym: *mut u8,
    mine: *mut u8,
    sym_st: isize,
    my_st: isize,
    nelems: usize,
    size: usize,
    pe: i32,
    to_sym: bool,
) {
    let w = ctx.world(call);
    let pe = ctx.pe(w, call, pe);
    if nelems == 0 {
        return;
    }
    if sym_st < 0 || my_st < 0 {
        fatal(
            call,
            format_args!(
                "strides must not be negative (dst={}, sst={})",
                if to_sym { sym_st } else { my_st },
                if to_sym { my_st } else { sym_st }
            ),
        )
    }
    // The whole symmetric span is checked once.
    let span = (nelems - 1)
        .checked_mul(sym_st as usize)
        .and_then(|v| v.checked_mul(size))
        .and_then(|v| v.checked_add(size))
        .unwrap_or_else(|| fatal(call, "the strided range overflows"));
    let arg = if to_sym { "dest" } else { "source" };
    match target(w, call, arg, sym as usize, span, pe) {
        Where::Here(base) => {
            for i in 0..nelems {
                // SAFETY: element i of both ranges; the symmetric span was checked.
                unsafe {
                    let s = base.add(i * sym_st as usize * size);
                    let m = mine.add(i * my_st as usize * size);
                    if to_sym {
                        std::ptr::copy(m, s, size)
                    } else {
                        std::ptr::copy(s, m, size)
                    }
                }
            }
        }
        Where::Remote { ep, key, raddr } => {
            for i in 0..nelems {
                let r = raddr + (i * sym_st as usize * size) as u64;
                let m = mine as usize + i * my_st as usize * size;
                let cb = Callback::Raw(nbi_done, 0);
                // SAFETY: the caller's buffer stays valid: the endpoint is flushed below.
                let s = unsafe {
                    if to_sym {
                        ep.put_raw(Buf::One((m, size)), r, key, cb)
                    } else {
                        ep.get_raw(Buf::One((m, size)), r, key, cb)
                    }
                };
                if let Err(e) = s {
                    failed(call, pe, e)
                }
            }
            complete(w, call, w.peer(call, pe));
            take_async_error(call);
        }
    }
}

fn take_async_error(call: &str) {
    if !ASYNC_FAILED.load(Ordering::Acquire) {
        return;
    }
    let e = {
        let mut g = ASYNC_ERROR.lock().unwrap_or_else(|p| p.into_inner());
        ASYNC_FAILED.store(false, Ordering::Relaxed);
        g.take()
    };
    if let Some(e) = e {
        fatal(
            call,
            format_args!("an earlier non-blocking operation failed: {e}"),
        )
    }
}

/// `shmem_quiet`: every operation issued so far is complete and visible.
///
/// Same-host peers' memory is written directly: nothing to wait for. For a peer reached
/// through its worker, the owner carries operations out in the order they came on the
/// link, so the answer to a fetching atomic sent now (an add of 0 to a word of the peer's
/// heap) says that everything before it is done. (`Endpoint::flush` would say the same,
/// and report a refused put, but with four or more processes on two cores over tcp its
/// confirmation after a flood of unacknowledged puts sometimes never comes; see the
/// report of the OpenSHMEM branch. Every put is checked against the peer's key before it
/// is sent, so a refusal cannot happen here.) Only the peers that operations went to
/// since the last quiet are asked (`Peer::sent`), unless the program runs threads
/// (`SHMEM_THREAD_MULTIPLE`), where one thread's quiet may clear the mark of another's
/// operation still being sent: then every peer reached through its worker is.
pub fn quiet_all(w: &World, call: &str) {
    let every = w.thread_level == crate::init::THREAD_MULTIPLE;
    for p in w.connected() {
        // A load first: same-host peers are never marked, and a swap is a locked
        // instruction per peer per quiet.
        if every || (p.sent.load(Ordering::Relaxed) && p.sent.swap(false, Ordering::AcqRel)) {
            complete(w, call, p);
        }
    }
    take_async_error(call);
    fence(Ordering::SeqCst);
}

/// Wait until the owner has carried out every operation sent to `p` so far (see
/// `quiet_all`); nothing to do for a peer whose heap is mapped here.
fn complete(w: &World, call: &str, p: &crate::symmetric::Peer) {
    let Some(part) = p.parts[0].as_ref() else {
        return;
    };
    if !part.direct.is_null() {
        return;
    }
    let r =
        p.ep.atomic(courier::AtomicOp::Add, 0, 0, part.base, &part.key, false)
            .and_then(|r| crate::wait::request(w, r));
    if let Err(e) = r {
        fatal(call, e)
    }
}

/// `shmem_fence`: operations to each PE issued before are delivered before those after.
pub fn fence_all(w: &World, call: &str) {
    for p in w.connected() {
        if let Err(e) = p.ep.fence() {
            fatal(call, e)
        }
    }
    fence(Ordering::SeqCst);
}
