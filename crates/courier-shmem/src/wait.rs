//! Point-to-point synchronization on local symmetric variables: `wait_until` and its
//! `_all`/`_any`/`_some` and vector forms, `test` and its family.
//!
//! A wait looks at the words, progresses the worker (operations from peers over tcp land
//! only then), yields the CPU now and then (at every round when this machine's PEs outnumber
//! their CPUs: `init::WaitCfg`), and after the spin (`SHMEM_WAIT_SPIN`, 1 ms: `init::SPIN`)
//! sleeps on the worker's event fd, so that a job of more PEs than cores still moves: a
//! frame from a peer wakes it at once, a store made directly by a same-host peer is seen
//! at the next look. The sleeps between looks start at 16 us and double up to 1 ms, so a
//! wait that outlived the spin by a little (its peer lost its CPU for a moment) sees the
//! store soon.
//!
//! The collectives know which PE they wait for (`for_pe`): where PEs outnumber CPUs, a
//! wait for one bound to other CPUs spins a while first (it runs meanwhile), and a wait
//! for one that may share this CPU looks once per round before it yields.

use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicIsize, AtomicU16, AtomicU32, AtomicU64, AtomicUsize,
    Ordering,
};
use std::time::{Duration, Instant};

use crate::error::fatal;
use crate::init::World;

/// `SHMEM_CMP_EQ` .. `SHMEM_CMP_LE`.
pub const CMP_EQ: i32 = 1;
/// `SHMEM_CMP_NE`.
pub const CMP_NE: i32 = 2;
/// `SHMEM_CMP_GT`.
pub const CMP_GT: i32 = 3;
/// `SHMEM_CMP_GE`.
pub const CMP_GE: i32 = 4;
/// `SHMEM_CMP_LT`.
pub const CMP_LT: i32 = 5;
/// `SHMEM_CMP_LE`.
pub const CMP_LE: i32 = 6;

/// A type the wait family watches.
pub trait Word: Copy + PartialOrd {
    /// Load it atomically.
    ///
    /// # Safety
    /// `p` valid and aligned.
    unsafe fn load(p: *const Self) -> Self;
}

macro_rules! word {
    ($($t:ty, $a:ty);*) => {$(
        impl Word for $t {
            #[inline(always)]
            unsafe fn load(p: *const Self) -> Self {
                // SAFETY: per the contract.
                unsafe { <$a>::from_ptr(p as *mut $t) }.load(Ordering::Acquire)
            }
        }
    )*};
}
word!(i16, AtomicI16; u16, AtomicU16; i32, AtomicI32; u32, AtomicU32; i64, AtomicI64; u64, AtomicU64; isize, AtomicIsize; usize, AtomicUsize);

/// Check a comparison code.
#[inline(always)]
pub fn check_cmp(call: &'static str, cmp: i32) {
    if !(CMP_EQ..=CMP_LE).contains(&cmp) {
        bad_cmp(call, cmp)
    }
}

#[cold]
#[inline(never)]
fn bad_cmp(call: &str, cmp: i32) -> ! {
    fatal(
        call,
        format_args!("cmp={cmp}: not a comparison (SHMEM_CMP_EQ..SHMEM_CMP_LE, 1..6)"),
    )
}

/// Whether `a cmp b` holds (`cmp` checked by `check_cmp`).
#[inline(always)]
pub(crate) fn holds<T: PartialOrd>(cmp: i32, a: T, b: T) -> bool {
    match cmp {
        CMP_EQ => a == b,
        CMP_NE => a != b,
        CMP_GT => a > b,
        CMP_GE => a >= b,
        CMP_LT => a < b,
        _ => a <= b,
    }
}

/// Progress and look until `done` holds: spin, then sleep (see the module doc).
pub fn block_until(w: &World, done: impl FnMut() -> bool) {
    wait_looking(w, 8, done)
}

/// As `block_until`, for what a PE that may share this CPU does (`World::elsewhere`):
/// where PEs outnumber CPUs, it likely needs this CPU, so each round looks once before
/// it gives the CPU away. (A wait for anyone, as `wait_until`'s, looks a few times: the
/// writer may run elsewhere, and a yield costs a switch there and back.)
pub fn yield_until(w: &World, done: impl FnMut() -> bool) {
    wait_looking(w, if w.wait.oversubscribed { 1 } else { 8 }, done)
}

/// `block_until` with `looks` looks at `done` between progress calls.
fn wait_looking(w: &World, looks: u32, mut done: impl FnMut() -> bool) {
    // One progress call even when the condition already holds: a program that spins on
    // `wait_until`/`test` calls still serves its peers (their tcp operations, their
    // connections) through them.
    w.worker.progress();
    if done() {
        return;
    }
    let start = Instant::now();
    let mut rounds = 0u32;
    let mut nap = crate::init::FIRST_NAP.min(w.wait.nap);
    loop {
        for _ in 0..looks {
            if done() {
                return;
            }
            std::hint::spin_loop();
        }
        if w.worker.progress() > 0 {
            continue;
        }
        rounds = rounds.wrapping_add(1);
        // Oversubscribed, the PE this waits for is likely waiting for a CPU (see WaitCfg).
        if !w.wait.oversubscribed && !rounds.is_multiple_of(32) {
            continue;
        }
        if start.elapsed() < w.wait.spin || !w.wait.sleep {
            // Another process (maybe the one this waits for) may need this CPU.
            std::thread::yield_now();
            continue;
        }
        match w.worker.arm() {
            Ok(true) => {
                if done() {
                    return;
                }
                let _ = w.worker.wait(Some(nap));
                nap = (nap * 2).min(w.wait.nap);
            }
            Ok(false) => {}
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// How long a wait for a PE bound to other CPUs spins before it yields, where PEs
/// outnumber CPUs: a few of that CPU's switches between its PEs (about 1 us each here).
pub const ELSEWHERE_SPIN: Duration = Duration::from_micros(10);

/// Wait for something PE `pe` does: where this machine's PEs outnumber its CPUs and `pe`
/// is bound to CPUs this PE is never on, spin first (`spin_then_block`): `pe` runs
/// meanwhile; else `yield_until`.
pub fn for_pe(w: &World, pe: usize, done: impl FnMut() -> bool) {
    if w.wait.oversubscribed && w.elsewhere.get(pe) == Some(&true) {
        spin_then_block(w, ELSEWHERE_SPIN, done)
    } else {
        yield_until(w, done)
    }
}

/// As `block_until`, but first progress and look for up to `spin` without giving the CPU
/// away: for PEs bound to other CPUs (`World::elsewhere`), which run meanwhile, where a
/// yield would only hand this CPU to a PE that waits too.
pub fn spin_then_block(w: &World, spin: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return;
            }
            std::hint::spin_loop();
        }
        w.worker.progress();
        if start.elapsed() >= spin {
            return block_until(w, done);
        }
    }
}

/// Wait for a request of the worker's (an operation through a peer's worker) as the
/// library's own waits do (`block_until`), not with the request's spin: that one progresses
/// up to a few milliseconds before it sleeps and never yields, which starves the peer it
/// waits for when the two share a CPU.
pub fn request(w: &World, mut r: courier::Request<'_>) -> courier::Result<courier::Info> {
    block_until(w, || r.test().is_some());
    r.wait()
}

fn check_ivars<T>(w: &World, call: &'static str, ivars: *const T, n: usize) {
    if n == 0 {
        return;
    }
    if ivars.is_null() {
        fatal(call, "ivars=NULL")
    }
    if !(ivars as usize).is_multiple_of(align_of::<T>()) {
        fatal(
            call,
            format_args!("ivars={ivars:p}: not aligned to its type"),
        )
    }
    let len = n.saturating_mul(size_of::<T>());
    if w.locate(ivars as usize, len).is_none() {
        crate::rma::not_symmetric(w, call, "ivars", ivars as usize, len)
    }
}

/// Whether element `i` takes part (`status[i] == 0`, or no status).
///
/// # Safety
/// `status` null or valid for `i + 1` ints.
#[inline(always)]
unsafe fn active(status: *const i32, i: usize) -> bool {
    // SAFETY: per the contract.
    status.is_null() || unsafe { *status.add(i) } == 0
}

/// The comparison value for element `i`: one for all, or one each.
///
/// # Safety
/// `values` valid for `i + 1` elements when `vector`.
#[inline(always)]
unsafe fn value_at<T: Copy>(value: T, values: *const T, vector: bool, i: usize) -> T {
    // SAFETY: per the contract.
    if vector {
        unsafe { *values.add(i) }
    } else {
        value
    }
}

/// `wait_until`: wait for `*ivar cmp value`.
pub fn wait_until<T: Word>(call: &'static str, ivar: *mut T, cmp: i32, value: T) {
    let w = crate::init::world(call);
    check_cmp(call, cmp);
    check_ivars(w, call, ivar, 1);
    // SAFETY: checked symmetric and aligned.
    block_until(w, || holds(cmp, unsafe { T::load(ivar) }, value));
}

/// `test`: whether `*ivar cmp value` holds now (1) or not (0).
pub fn test<T: Word>(call: &'static str, ivar: *mut T, cmp: i32, value: T) -> i32 {
    let w = crate::init::world(call);
    check_cmp(call, cmp);
    check_ivars(w, call, ivar, 1);
    // SAFETY: checked.
    if holds(cmp, unsafe { T::load(ivar) }, value) {
        return 1;
    }
    w.worker.progress();
    // SAFETY: checked.
    i32::from(holds(cmp, unsafe { T::load(ivar) }, value))
}

/// What a multi-variable wait or test needs.
pub struct Many<T> {
    /// The variables.
    pub ivars: *mut T,
    /// How many.
    pub n: usize,
    /// Exclusions (null: none).
    pub status: *const i32,
    /// The comparison.
    pub cmp: i32,
    /// One value for all.
    pub value: T,
    /// One value each (`_vector` forms; then `value` is unused).
    pub values: *const T,
    /// Whether `values` is used.
    pub vector: bool,
}

impl<T: Word> Many<T> {
    fn check(&self, w: &World, call: &'static str) {
        check_cmp(call, self.cmp);
        check_ivars(w, call, self.ivars, self.n);
        if self.vector && self.n > 0 && self.values.is_null() {
            fatal(call, "cmp_values=NULL")
        }
    }
    /// Whether element `i` meets its condition.
    fn met(&self, i: usize) -> bool {
        // SAFETY: i < n, checked at entry.
        unsafe {
            holds(
                self.cmp,
                T::load(self.ivars.add(i)),
                value_at(self.value, self.values, self.vector, i),
            )
        }
    }
    fn active(&self, i: usize) -> bool {
        // SAFETY: i < n; status is null or the caller's array of n ints.
        unsafe { active(self.status, i) }
    }
}

/// `_all`: wait until every active element meets the condition.
pub fn wait_all<T: Word>(call: &'static str, m: Many<T>) {
    let w = crate::init::world(call);
    m.check(w, call);
    let mut next = 0;
    block_until(w, || {
        while next < m.n && (!m.active(next) || m.met(next)) {
            next += 1;
        }
        next == m.n
    });
}

/// `_any`: wait until one active element meets the condition; its index, or `usize::MAX`
/// when none is active.
pub fn wait_any<T: Word>(call: &'static str, m: Many<T>) -> usize {
    let w = crate::init::world(call);
    m.check(w, call);
    if !(0..m.n).any(|i| m.active(i)) {
        return usize::MAX;
    }
    let mut found = usize::MAX;
    block_until(w, || {
        found = (0..m.n)
            .find(|&i| m.active(i) && m.met(i))
            .unwrap_or(usize::MAX);
        found != usize::MAX
    });
    found
}

/// `_some`: wait until at least one active element meets the condition; writes their
/// indices and returns how many (0 when none is active).
pub fn wait_some<T: Word>(call: &'static str, m: Many<T>, indices: *mut usize) -> usize {
    let w = crate::init::world(call);
    m.check(w, call);
    if !(0..m.n).any(|i| m.active(i)) {
        return 0;
    }
    let mut count = 0;
    block_until(w, || {
        count = collect(&m, indices);
        count > 0
    });
    count
}

fn collect<T: Word>(m: &Many<T>, indices: *mut usize) -> usize {
    let mut count = 0;
    for i in 0..m.n {
        if m.active(i) && m.met(i) {
            if !indices.is_null() {
                // SAFETY: the caller's array of n indices.
                unsafe { *indices.add(count) = i };
            }
            count += 1;
        }
    }
    count
}

/// `test_all`: 1 if every active element meets the condition now.
pub fn test_all<T: Word>(call: &'static str, m: Many<T>) -> i32 {
    let w = crate::init::world(call);
    m.check(w, call);
    w.worker.progress();
    i32::from((0..m.n).all(|i| !m.active(i) || m.met(i)))
}

/// `test_any`: the index of an active element that meets the condition, or `usize::MAX`.
pub fn test_any<T: Word>(call: &'static str, m: Many<T>) -> usize {
    let w = crate::init::world(call);
    m.check(w, call);
    w.worker.progress();
    (0..m.n)
        .find(|&i| m.active(i) && m.met(i))
        .unwrap_or(usize::MAX)
}

/// `test_some`: the indices of the active elements that meet the condition now.
pub fn test_some<T: Word>(call: &'static str, m: Many<T>, indices: *mut usize) -> usize {
    let w = crate::init::world(call);
    m.check(w, call);
    w.worker.progress();
    collect(&m, indices)
}
