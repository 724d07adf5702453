//! Semaphores and the semaphore-signalling put (`shmemx_sem_*`,
//! `shmemx_putmem_signal_sem[_nbi]`): Berkeley UPC's `bupc_sem_t` and
//! `bupc_memput_signal[_async]` in OpenSHMEM terms.
//!
//! A semaphore is a word in a slot of the semaphore area, which every PE keeps at the same
//! offset of its symmetric heap (after the collectives' counters, before the first user
//! block), so a peer reaches any PE's semaphore through the heap's key it already holds:
//! allocation is local (not collective), and the handle, a 64-bit value the program may
//! send to other PEs, names the owner, the slot, the flags and the slot's generation.
//!
//! Each is Courier's semaphore (`courier::SemaphoreAt`) at the slot's word, with the
//! owner's count of takes in its own memory (`TAKEN`): the word counts what was ever
//! posted, and the semaphore holds posts less takes. So posts only add to the word (the
//! owner with an atomic add and a wakeup of its own sleeping threads, a peer with
//! Courier's put-with-signal of no data, `SignalOp::Add`: one operation, which wakes the
//! owner's worker), and a wait only loads it (why that matters: `courier::SemaphoreAt`).
//! The owner waits as the library's waits do (`wait::block_until`: spin, yield, then
//! sleep on the worker's event fd). The signalling put is the put-with-signal carrying
//! the data: whoever sees the count rise sees the data.

use std::sync::atomic::{AtomicU32, Ordering, fence};

use courier::{SEM_MAX, SemTaken, SemaphoreAt, sem_flags};

use crate::ctx::DEFAULT;
use crate::error::fatal;
use crate::init::{THREAD_MULTIPLE, World};
use crate::signal::SIGNAL_ADD;

/// Semaphores per PE.
pub const SLOTS: usize = 1024;
/// Bytes per slot: one word per cache line, so that peers posting to neighbouring
/// semaphores do not contend for a line.
const STRIDE: usize = 64;
/// The area's size in the heap.
pub const AREA_BYTES: usize = SLOTS * STRIDE;

/// Offset of the area in every PE's heap (after the collectives' internal bytes).
pub fn area_offset(npes: usize) -> usize {
    crate::coll::internal_bytes(npes).next_multiple_of(STRIDE)
}

/// Per slot: bit 16 live, bits 8..16 generation, bits 0..8 flags.
static STATE: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
const LIVE: u32 = 1 << 16;

/// Per slot, what the owner's waits and tries took from the word's count.
static TAKEN: [SemTaken; SLOTS] = [const { SemTaken::new() }; SLOTS];

/// A decoded handle: bits 0..24 slot + 1 (0 is `SHMEMX_SEM_NULL`), 24..32 flags, 32..40
/// generation, 40..64 owner PE.
#[derive(Clone, Copy, Debug)]
struct Handle {
    pe: usize,
    slot: usize,
    flags: u32,
    generation: u32,
}

impl Handle {
    fn encode(self) -> u64 {
        (self.slot as u64 + 1)
            | (u64::from(self.flags) << 24)
            | (u64::from(self.generation) << 32)
            | ((self.pe as u64) << 40)
    }

    /// The handle, checked for what any PE can check: a PE of the job, a slot that exists,
    /// flags that are a valid set.
    #[inline(always)]
    fn decode(w: &World, call: &'static str, h: u64) -> Handle {
        if h == 0 {
            fatal(call, "sem=SHMEMX_SEM_NULL")
        }
        let slot = (h & 0xff_ffff) as usize - 1;
        let flags = ((h >> 24) & 0xff) as u32;
        let generation = ((h >> 32) & 0xff) as u32;
        let pe = (h >> 40) as usize;
        if slot >= SLOTS || pe >= w.npes || sem_flags::check(flags).ok() != Some(flags) {
            fatal(
                call,
                format_args!(
                    "sem={h:#x}: not a semaphore handle (from shmemx_sem_alloc of a PE of this job)"
                ),
            )
        }
        Handle {
            pe,
            slot,
            flags,
            generation,
        }
    }

    fn boolean(self) -> bool {
        self.flags & sem_flags::BOOLEAN != 0
    }

    /// The word's offset in the heap (the same on every PE).
    fn heap_offset(self, w: &World) -> usize {
        area_offset(w.npes) + self.slot * STRIDE
    }

    /// The word's address in this PE's heap: this PE's copy of the symmetric slot.
    fn local_addr(self, w: &World) -> *mut u64 {
        (w.heap.base + self.heap_offset(w)) as *mut u64
    }

    /// Courier's semaphore at this PE's copy of the slot's word, with the owner's count of
    /// takes: the owner's view (`call`'s fatal error if the slot is not a word of the heap,
    /// which the area's layout rules out).
    #[inline(always)]
    fn at<'w>(self, w: &'w World, call: &'static str) -> SemaphoreAt<'w> {
        let off = w.heap.mem_offset(self.heap_offset(w));
        match SemaphoreAt::new(&w.heap.mem, off, self.flags, &TAKEN[self.slot]) {
            Ok(at) => at,
            Err(e) => not_a_word(call, self.slot, e),
        }
    }
}

#[cold]
#[inline(never)]
fn not_a_word(call: &'static str, slot: usize, e: courier::Error) -> ! {
    fatal(call, format_args!("semaphore slot {slot}: {e}"))
}

/// The handle of one of this PE's own live semaphores, or a fatal error: the handle must
/// be this PE's and the slot still allocated to it.
#[inline(always)]
fn own_handle(w: &World, call: &'static str, h: u64) -> Handle {
    let d = Handle::decode(w, call, h);
    if d.pe != w.me {
        fatal(
            call,
            format_args!(
                "sem={h:#x}: belongs to PE {}; only its owner waits on or frees a semaphore",
                d.pe
            ),
        )
    }
    let st = STATE[d.slot].load(Ordering::Acquire);
    if st & LIVE == 0 || (st >> 8) & 0xff != d.generation || st & 0xff != d.flags {
        fatal(
            call,
            format_args!("sem={h:#x}: this semaphore was freed (or never allocated here)"),
        )
    }
    d
}

/// One of this PE's own semaphores, as its owner sees it: Courier's semaphore at the
/// slot's word, with the owner's count of takes.
struct Own<'w> {
    h: u64,
    d: Handle,
    at: SemaphoreAt<'w>,
}

impl<'w> Own<'w> {
    /// Inlined with `own_handle` and `Handle::decode`: every wait, try and local post builds
    /// one. Built by a call, returning it through memory, a local `shmemx_sem_post` then
    /// `shmemx_sem_wait` (one thread) took 60-80 ns; inlined, 42-52.
    #[inline(always)]
    fn new(w: &'w World, call: &'static str, h: u64) -> Own<'w> {
        let d = own_handle(w, call, h);
        Own {
            h,
            d,
            at: d.at(w, call),
        }
    }

    /// Take `n` if it is there (a boolean one: all of it, for `n` of 1), with an integer
    /// semaphore that posts took past its maximum as the fatal error it is.
    fn take_or_die(&self, call: &'static str, n: u64) -> bool {
        if !self.d.boolean() {
            let v = self.at.raw_value();
            if v > SEM_MAX {
                overflowed(call, self.h, v)
            }
        }
        self.at.try_wait(n)
    }
}

/// `shmemx_sem_alloc`: a semaphore at 0 owned by this PE, or 0 when every slot is taken.
pub fn alloc(call: &'static str, flags: i32) -> u64 {
    let w = crate::init::world(call);
    let flags = match u32::try_from(flags)
        .map_err(|_| ())
        .and_then(|f| sem_flags::check(f).map_err(|_| ()))
    {
        Ok(f) => f,
        Err(()) => fatal(
            call,
            format_args!(
                "flags={flags:#x}: exactly one of SHMEMX_SEM_BOOLEAN and SHMEMX_SEM_INTEGER, at most one of SPRODUCER/MPRODUCER and of SCONSUMER/MCONSUMER, nothing else"
            ),
        ),
    };
    for (slot, s) in STATE.iter().enumerate() {
        let st = s.load(Ordering::Relaxed);
        if st & LIVE != 0 {
            continue;
        }
        let generation = (st >> 8) & 0xff;
        if s.compare_exchange(
            st,
            LIVE | (generation << 8) | flags,
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_err()
        {
            continue;
        }
        let d = Handle {
            pe: w.me,
            slot,
            flags,
            generation,
        };
        // No one else uses a slot that was not live.
        d.at(w, call).reset();
        return d.encode();
    }
    0
}

/// `shmemx_sem_free`: give the slot back (the handle, and any copy of it, is dead).
pub fn free(call: &'static str, h: u64) {
    let w = crate::init::world(call);
    let d = own_handle(w, call, h);
    let st = LIVE | (d.generation << 8) | d.flags;
    let next = ((d.generation + 1) & 0xff) << 8;
    if STATE[d.slot]
        .compare_exchange(st, next, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        fatal(call, format_args!("sem={h:#x}: freed twice at once"))
    }
}

/// `shmemx_sem_pe`: the owner.
pub fn owner(call: &'static str, h: u64) -> i32 {
    let w = crate::init::world(call);
    Handle::decode(w, call, h).pe as i32
}

fn check_n(call: &'static str, d: Handle, n: usize) -> u64 {
    let n = n as u64;
    if n > SEM_MAX {
        fatal(
            call,
            format_args!("n={n}: more than a semaphore holds ({SEM_MAX})"),
        )
    }
    // A boolean one is 0 or 1: any post sets it.
    if d.boolean() { n.min(1) } else { n }
}

/// `shmemx_sem_post`: add `n` (a boolean semaphore: set it). Ordered after this PE's
/// earlier puts to the owner (a fence to it first).
pub fn post(call: &'static str, h: u64, n: usize) {
    let w = crate::init::world(call);
    let d = Handle::decode(w, call, h);
    let n = check_n(call, d, n);
    if n == 0 {
        return;
    }
    if d.pe == w.me {
        let s = Own::new(w, call, h);
        fence(Ordering::SeqCst);
        if d.boolean() {
            // One already set stays set (also when another thread sets it meanwhile, which
            // the post then refuses).
            if s.at.value() == 0 {
                let _ = s.at.post(1);
            }
        } else if let Err(e) = s.at.post(n) {
            // An integer one may not pass its maximum.
            fatal(call, format_args!("sem={h:#x}: {e}"))
        }
        wake_own(w);
        return;
    }
    if let Err(e) = w.peer(call, d.pe).ep.fence() {
        fatal(call, format_args!("PE {}: {e}", d.pe))
    }
    let word = d.local_addr(w);
    // No data: the put's destination is the word itself, 0 bytes of it.
    crate::signal::put_signal(
        call,
        &DEFAULT,
        word.cast(),
        std::ptr::NonNull::<u8>::dangling().as_ptr(),
        0,
        word,
        n,
        SIGNAL_ADD,
        d.pe as i32,
        false,
    );
}

/// Other threads of this PE may sleep on the worker: a local post must wake them.
fn wake_own(w: &World) {
    if w.thread_level == THREAD_MULTIPLE {
        let _ = w.worker.signal();
    }
}

/// An integer semaphore that posts took to `v`, past its maximum: a broken program.
fn overflowed(call: &'static str, h: u64, v: u64) -> ! {
    fatal(
        call,
        format_args!("sem={h:#x}: posts took it to {v}, past its maximum {SEM_MAX}"),
    )
}

/// `shmemx_sem_wait`: wait until `n` is there and take it (the owner only).
pub fn wait(call: &'static str, h: u64, n: usize) {
    let w = crate::init::world(call);
    let s = Own::new(w, call, h);
    let n = n as u64;
    if s.d.boolean() && n > 1 {
        fatal(
            call,
            format_args!("n={n}: a boolean semaphore never holds more than 1"),
        )
    }
    if n > SEM_MAX {
        fatal(
            call,
            format_args!("n={n}: more than a semaphore holds ({SEM_MAX})"),
        )
    }
    // Already there: taken at once. The worker is still progressed on one such wait in
    // FAST_TAKES, so a program that only ever finds its semaphores posted keeps serving
    // its peers (their tcp operations land only when the worker progresses).
    let fast = FAST.with(|f| {
        let k = f.get().wrapping_add(1);
        f.set(k);
        !k.is_multiple_of(FAST_TAKES)
    });
    if !(fast && s.take_or_die(call, n)) {
        // The library's wait (`wait::block_until`), as `wait_until`'s: it yields the CPU
        // while it spins, which matters when the PEs outnumber the cores (the poster may
        // need this one), then sleeps on the worker, which a peer's post wakes.
        crate::wait::block_until(w, || s.take_or_die(call, n));
    }
    // A fence in OpenSHMEM's sense (shmemx.h): this PE's puts and stores before the wait
    // are ordered before those after it, as are its loads. Not a full barrier: the
    // OpenSHMEM fence does not order a store before a later load, and on x86 this costs
    // nothing, where a full one waited for the stores still on their way (a post's).
    fence(Ordering::AcqRel);
}

/// One wait in this many that finds its semaphore posted progresses the worker anyway.
const FAST_TAKES: u32 = 64;

thread_local! {
    /// Waits of this thread, for `FAST_TAKES`.
    static FAST: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `shmemx_sem_try`: take `n` if it is there now (1), else 0 (the owner only).
pub fn try_take(call: &'static str, h: u64, n: usize) -> i32 {
    let w = crate::init::world(call);
    let s = Own::new(w, call, h);
    // Serve peers (their tcp operations land only when the worker progresses).
    w.worker.progress();
    let got = s.take_or_die(call, n as u64);
    // As `wait`'s.
    fence(Ordering::AcqRel);
    got as i32
}

/// `shmemx_sem_value`: the current value (the owner only).
pub fn value(call: &'static str, h: u64) -> u64 {
    let w = crate::init::world(call);
    let s = Own::new(w, call, h);
    w.worker.progress();
    s.at.value()
}

/// `shmemx_putmem_signal_sem[_nbi]`: put `len` bytes to `dest` on the semaphore's owner,
/// then post `n` to it, as one operation. Blocking: returns when `src` may be reused;
/// `_nbi`: when issued (`shmem_quiet` completes it).
pub fn put_signal(
    call: &'static str,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    h: u64,
    n: usize,
    nbi: bool,
) {
    let w = crate::init::world(call);
    let d = Handle::decode(w, call, h);
    let n = check_n(call, d, n);
    if len > 0 && src.is_null() {
        fatal(call, "source=NULL")
    }
    if d.pe == w.me {
        crate::rma::put(call, &DEFAULT, dest, src, len, w.me as i32, false);
        post(call, h, n as usize);
        return;
    }
    crate::signal::put_signal(
        call,
        &DEFAULT,
        dest,
        src,
        len,
        d.local_addr(w),
        n,
        SIGNAL_ADD,
        d.pe as i32,
        nbi,
    );
}
