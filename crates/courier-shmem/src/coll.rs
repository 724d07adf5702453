//! Collectives: sync and barrier, broadcast, collect and fcollect, alltoall(s), reductions;
//! team-based and the deprecated active-set forms (whose `pSync` and `pWrk` are not
//! needed, and left untouched).
//!
//! **Sync** is a dissemination algorithm (⌈log₂ n⌉ rounds; in round k each member signals
//! the member 2ᵏ after it and waits for the one 2ᵏ before it), or among a few members of
//! one host a flat one (each signals every other, then waits for every other: one round,
//! so a PE that shares its CPU gives it away once per sync), on *pairwise counters*: in
//! the heap's internal area every PE has one 64-bit word per peer, on a cache line of its
//! own, which that peer raises by one with a put-with-signal (so a sleeping waiter is
//! woken), and a private count of what it has taken from each. Any subset of PEs (a team,
//! an active set) synchronizes on the same words with no per-team state; two PEs that
//! share several teams meet in the same order in each, which the specification requires
//! of programs anyway.
//!
//! **Data** moves after an entry sync by each member *pulling* what it needs from its
//! peers' symmetric source buffers (plain copies from a same-host peer's mapped segment,
//! gets elsewhere); an exit sync then lets sources be reused. Reductions combine in team
//! order, so every member computes the same bits; a large one among same-host members is
//! split, each member combining one slice and copying the others' results (three syncs,
//! a fraction of the work). Small broadcasts are pushed instead:
//! each member tells the root it has entered, and the root writes each member's `dest`
//! with a put-with-signal on their pairwise counter (one round trip, no syncs); tiny ones
//! go through staging slots in each member's heap, so the root waits for no one. Tiny
//! reductions among a few members of one host go through the same slots: each member
//! stages its source at every other and combines what the others staged (no sync).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use courier::{Buf, Callback, Cmp, SignalOp, Started};

use crate::ctx::DEFAULT;
use crate::error::fatal;
use crate::init::World;
use crate::reduce::ReduceFn;
use crate::rma::{self, Where};
use crate::team::TeamData;

/// Bytes of the heap's internal area: the pairwise counters, a scratch line, two staging
/// slots per root for small broadcasts, and a count per member of those it has taken.
pub fn internal_bytes(npes: usize) -> usize {
    consumed_offset(npes) + (npes * 8).div_ceil(64) * 64
}

fn scratch_offset(npes: usize) -> usize {
    npes * COUNTER_STRIDE
}

/// Bytes between the pairwise counters: a cache line each, so that the peers signalling a
/// member raise different lines, and a member's wait for several reads each one only
/// when its peer wrote it.
const COUNTER_STRIDE: usize = 64;

/// Where root `root`'s staging slot `parity` (0 or 1) lies in a member's heap.
fn slot_offset(npes: usize, root: usize, parity: u64) -> usize {
    scratch_offset(npes) + 64 + (root * 2 + parity as usize) * STAGE
}

/// Where, in a root's heap, member `pe` says how many staged broadcasts it has taken.
fn consumed_offset(npes: usize) -> usize {
    scratch_offset(npes) + 64 + 2 * STAGE * npes
}

/// Signals taken so far from each peer.
static TAKEN: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Staged broadcasts sent to each member (as a root), and taken from each root.
static STAGED_SENT: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static STAGED_TAKEN: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// Add one to `counts[pe]` (sized for the world); the new count.
fn bump(counts: &Mutex<Vec<u64>>, npes: usize, pe: usize) -> u64 {
    let mut t = counts.lock().unwrap_or_else(|p| p.into_inner());
    if t.len() < npes {
        t.resize(npes, 0);
    }
    t[pe] += 1;
    t[pe]
}

/// A set of PEs taking part in a collective: world PE numbers, in order, and this PE's
/// place among them.
pub struct Members<'a> {
    /// World PEs.
    pub pes: std::borrow::Cow<'a, [usize]>,
    /// This PE's index.
    pub me: usize,
}

impl<'a> Members<'a> {
    /// A team's members.
    pub fn of(t: &'a TeamData) -> Members<'a> {
        Members {
            pes: std::borrow::Cow::Borrowed(&t.members),
            me: t.me,
        }
    }

    /// The deprecated active set `PE_start + k * 2^logPE_stride`, `k < PE_size`.
    pub fn active_set(
        w: &World,
        call: &'static str,
        start: i32,
        log_stride: i32,
        size: i32,
    ) -> Members<'static> {
        if start < 0 || !(0..31).contains(&log_stride) || size < 1 {
            fatal(
                call,
                format_args!(
                    "PE_start={start}, logPE_stride={log_stride}, PE_size={size}: not an active set"
                ),
            )
        }
        let stride = 1i64 << log_stride;
        let last = start as i64 + stride * (size as i64 - 1);
        if last >= w.npes as i64 {
            fatal(
                call,
                format_args!(
                    "PE_start={start}, logPE_stride={log_stride}, PE_size={size}: the set ends at PE {last}, past the job's {} PEs",
                    w.npes
                ),
            )
        }
        let pes: Vec<usize> = (0..size as i64)
            .map(|k| (start as i64 + stride * k) as usize)
            .collect();
        let Some(me) = pes.iter().position(|&p| p == w.me) else {
            fatal(
                call,
                format_args!("PE {} is not in the active set it was called with", w.me),
            )
        };
        Members {
            pes: std::borrow::Cow::Owned(pes),
            me,
        }
    }

    fn n(&self) -> usize {
        self.pes.len()
    }
}

/// Raise our counter at `to` by one (waking it if it sleeps).
fn signal(w: &World, call: &'static str, to: usize) {
    if to != w.me {
        // SAFETY: no data.
        unsafe { signal_with(w, call, to, None) }
    }
}

/// Raise our counter at `to` by one, after writing `data` (`len` bytes at `src`) to the
/// symmetric `dest` there, in one put-with-signal: when `to` sees the count, the data is
/// in place. Returns once `src` may be reused.
///
/// # Safety
/// `data`'s `src` must be valid for `len` bytes; `dest` a checked symmetric range.
unsafe fn signal_with(
    w: &World,
    call: &'static str,
    to: usize,
    data: Option<(*mut u8, *const u8, usize)>,
) {
    let word = w.heap.base + w.me * COUNTER_STRIDE;
    let peer = w.peer(call, to);
    let part = |s: crate::symmetric::Seg| {
        peer.parts[s as usize]
            .as_ref()
            .unwrap_or_else(|| fatal(call, format_args!("PE {to} has no {}", s.name())))
    };
    let heap = part(crate::symmetric::Seg::Heap);
    let raddr = heap.base + (word - w.heap.base) as u64;
    // Zero bytes: only the signal (`dest` may be anything, NULL included).
    let (buf, daddr, dkey) = match data.filter(|d| d.2 > 0) {
        Some((dest, src, len)) => {
            let Some((seg, off)) = w.locate(dest as usize, len) else {
                rma::not_symmetric(w, call, "dest", dest as usize, len)
            };
            let d = part(seg);
            (Buf::One((src as usize, len)), d.base + off as u64, &d.key)
        }
        None => (Buf::One((0, 0)), raddr, &heap.key),
    };
    // SAFETY: per the contract; waited for below when not done at once.
    let s = unsafe {
        peer.ep.put_signal_raw(
            buf,
            daddr,
            dkey,
            raddr,
            &heap.key,
            1,
            SignalOp::Add,
            Callback::None,
        )
    };
    match s {
        Ok(Started::Done(_)) => {}
        Ok(s) => {
            // SAFETY: `src` outlives the wait.
            if let Err(e) = crate::wait::request(w, unsafe { w.worker.request_for(s) }) {
                fatal(call, format_args!("PE {to}: {e}"))
            }
        }
        Err(e) => fatal(call, format_args!("PE {to}: {e}")),
    }
}

/// Our pairwise counter for world PE `from` (`from` raises it).
fn counter(w: &World, from: usize) -> &AtomicU64 {
    // The counter lies in the heap's internal area, on a 64-aligned line of its own.
    // SAFETY: a valid, aligned word, mapped as long as the heap (`w`) lives.
    unsafe { AtomicU64::from_ptr((w.heap.base + from * COUNTER_STRIDE) as *mut u64) }
}

/// Wait for the next signal from `from`.
fn take(w: &World, call: &'static str, from: usize) {
    let want = bump(&TAKEN, w.npes, from);
    if w.wait.oversubscribed {
        // The library's wait, which yields at every round when PEs outnumber CPUs.
        let word = counter(w, from);
        crate::wait::for_pe(w, from, || word.load(Ordering::Acquire) >= want);
    } else if let Err(e) = w.heap.mem.signal_wait_until(
        &w.worker,
        w.heap.mem_offset(from * COUNTER_STRIDE),
        Cmp::Ge,
        want,
        w.wait.sleep,
    ) {
        fatal(call, e)
    }
}

/// Wait for the next signal from each of `froms` (up to `FLAT_MAX`) at once, where PEs
/// outnumber CPUs: one wait whose every round looks at all of them gives the CPU away
/// once, where a wait per peer would give it away for each. First for the PEs that may
/// share this CPU, yielding to them; then for those bound elsewhere, which run
/// meanwhile, spinning first (`wait::ELSEWHERE_SPIN`: their CPU's PEs may switch once).
fn take_all(w: &World, call: &'static str, froms: impl Iterator<Item = usize>) {
    let mut froms = froms;
    let mut words: [(Option<&AtomicU64>, u64, bool); FLAT_MAX] = [(None, 0, false); FLAT_MAX];
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if taken.len() < w.npes {
        taken.resize(w.npes, 0);
    }
    for (slot, from) in words.iter_mut().zip(froms.by_ref()) {
        taken[from] += 1;
        let word = counter(w, from);
        *slot = (
            Some(word),
            taken[from],
            w.elsewhere.get(from) == Some(&true),
        );
    }
    drop(taken);
    let arrived = |away: bool| {
        words.iter().all(|&(word, want, elsewhere)| {
            elsewhere != away || word.is_none_or(|x| x.load(Ordering::Acquire) >= want)
        })
    };
    if !arrived(false) {
        crate::wait::yield_until(w, || arrived(false));
    }
    if !arrived(true) {
        crate::wait::spin_then_block(w, crate::wait::ELSEWHERE_SPIN, || arrived(true));
    }
    // More than `FLAT_MAX` (no caller has them): one at a time.
    for from in froms {
        take(w, call, from);
    }
}

/// Sync among `m` (no completion of earlier operations): flat among a few members of one
/// host, else dissemination.
pub fn sync(w: &World, call: &'static str, m: &Members) {
    let n = m.n();
    if flat(w, m) {
        for j in 1..n {
            signal(w, call, m.pes[(m.me + j) % n]);
        }
        if w.wait.oversubscribed {
            return take_all(w, call, (1..n).map(|j| m.pes[(m.me + n - j) % n]));
        }
        for j in 1..n {
            take(w, call, m.pes[(m.me + n - j) % n]);
        }
        return;
    }
    let mut d = 1;
    while d < n {
        signal(w, call, m.pes[(m.me + d) % n]);
        take(w, call, m.pes[(m.me + n - d) % n]);
        d *= 2;
    }
}

/// Sets of at most this many members, all of one host, sync flat and reduce tiny sources
/// through staging slots. A flat sync writes each member's counters from n - 1 peers at
/// once, where dissemination spreads them over ⌈log₂ n⌉ rounds; over tcp its n - 1
/// messages per member cost more than the rounds they save (4 PEs: 40 us against 31).
const FLAT_MAX: usize = 8;

/// Whether `m` syncs flat: few members, every one's memory reached with plain stores. The
/// same on every member (`World::same_host` is), as both sides of each signal must agree.
fn flat(w: &World, m: &Members) -> bool {
    m.n() <= FLAT_MAX && m.pes.iter().all(|&pe| w.same_host(pe))
}

/// `shmem_team_sync` (and the split routines' synchronization).
pub fn sync_team(w: &World, call: &'static str, t: &TeamData) {
    sync(w, call, &Members::of(t))
}

/// `shmem_barrier_all`: complete everything, then sync the world.
pub fn barrier_world(w: &World, call: &'static str) {
    rma::quiet_all(w, call);
    sync_team(w, call, crate::team::world_team());
}

/// A barrier over `m`: quiet, then sync.
pub fn barrier(w: &World, call: &'static str, m: &Members) {
    rma::quiet_all(w, call);
    sync(w, call, m);
}

/// Copy `len` bytes of the symmetric `src` on world PE `pe` into `dst` (here).
fn pull(w: &World, call: &'static str, dst: *mut u8, src: *const u8, len: usize, pe: usize) {
    if len == 0 {
        return;
    }
    match rma::target(w, call, "source", src as usize, len, pe) {
        // SAFETY: checked range; `dst` is the caller's buffer of `len` bytes.
        Where::Here(p) => unsafe { crate::copy::copy(dst, p, len) },
        Where::Remote { .. } => rma::get(call, &DEFAULT, dst, src, len, pe as i32, false),
    }
}

/// A size in bytes, or the end of the job with `why` where its arithmetic overflowed.
fn sized(call: &'static str, v: Option<usize>, why: impl FnOnce() -> String) -> usize {
    v.unwrap_or_else(|| fatal(call, why()))
}

/// Why `n` members' blocks of `len` bytes are too many to add up.
fn blocks(len: usize, n: usize) -> String {
    format!("nelems: {n} blocks of {len} bytes overflow")
}

fn check_sym(w: &World, call: &'static str, arg: &'static str, p: *const u8, len: usize) {
    if len > 0 && w.locate(p as usize, len).is_none() {
        rma::not_symmetric(w, call, arg, p as usize, len)
    }
}

/// Broadcast `len` bytes of `src` at member `root` into `dest` on the others (and on the
/// root too when `root_too`, as the team form does).
#[allow(clippy::too_many_arguments)]
pub fn broadcast(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    root: i32,
    root_too: bool,
) {
    if root < 0 || root as usize >= m.n() {
        fatal(
            call,
            format_args!("PE_root={root}: out of range for {} PEs", m.n()),
        )
    }
    check_sym(w, call, "dest", dest, len);
    check_sym(w, call, "source", src, len);
    let root = root as usize;
    if len <= PUSH_MAX {
        if len <= STAGE {
            broadcast_staged(w, call, m, dest, src, len, root);
        } else {
            broadcast_push(w, call, m, dest, src, len, root);
        }
        if m.me == root && root_too && len > 0 && !std::ptr::eq(dest, src) {
            // SAFETY: both checked symmetric ranges of `len` bytes here.
            unsafe { std::ptr::copy(src, dest, len) };
        }
        return;
    }
    sync(w, call, m);
    if m.me != root {
        pull(w, call, dest, src, len, m.pes[root]);
    } else if root_too && !std::ptr::eq(dest, src) {
        // SAFETY: both checked symmetric ranges of `len` bytes here.
        unsafe { std::ptr::copy(src, dest, len) };
    }
    sync(w, call, m);
}

/// Broadcasts up to this many bytes are pushed by the root (`broadcast_push`); larger
/// ones pulled by every member at once.
const PUSH_MAX: usize = 4096;

/// Broadcasts up to this many bytes go through staging slots (`broadcast_staged`).
const STAGE: usize = 256;

/// A tiny broadcast in one message per member, the root waiting for no one: the root
/// writes the data into a staging slot of its own in each member's heap with a
/// put-with-signal on their pairwise counter, and each member, once the signal is there,
/// copies the slot into its `dest` and tells the root so (a count in the root's heap). A
/// member's `dest` is written by that member only, inside its call, as with the other
/// forms. Each root has two slots at each member: its next broadcast to that member
/// waits only if the member has not yet taken the one before the last (a root two
/// broadcasts ahead).
fn broadcast_staged(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    root: usize,
) {
    if m.me != root {
        stage_take(w, call, m.pes[root], |slot| {
            if len > 0 {
                // SAFETY: the slot holds the root's `len` bytes; `dest` is a checked range
                // of `len` here.
                unsafe { std::ptr::copy_nonoverlapping(slot, dest, len) };
            }
        });
        return;
    }
    for (j, &pe) in m.pes.iter().enumerate() {
        if j != root {
            // SAFETY: `src` is `len` <= STAGE readable bytes.
            unsafe { stage_send(w, call, pe, src, len) };
        }
    }
}

/// Write `len` (<= STAGE) bytes of `src` into our next staging slot at world PE `pe`,
/// with a put-with-signal on our pairwise counter there. Our slots at `pe` alternate, so
/// this waits only if `pe` has not yet taken the message before the last.
///
/// # Safety
/// `src` must be valid for `len` bytes, and `len` at most STAGE.
unsafe fn stage_send(w: &World, call: &'static str, pe: usize, src: *const u8, len: usize) {
    let k = bump(&STAGED_SENT, w.npes, pe);
    if k > 2 {
        // SAFETY: our count for `pe`, 8-byte aligned in our heap's internal area.
        let taken = unsafe {
            AtomicU64::from_ptr((w.heap.base + consumed_offset(w.npes) + pe * 8) as *mut u64)
        };
        if taken.load(Ordering::Acquire) < k - 2 {
            crate::wait::for_pe(w, pe, || taken.load(Ordering::Acquire) >= k - 2);
        }
    }
    let slot = (w.heap.base + slot_offset(w.npes, w.me, k % 2)) as *mut u8;
    // SAFETY: `src` is `len` readable bytes; the slot is a symmetric range of STAGE >= len
    // bytes, which `pe` no longer reads (it took message k - 2).
    unsafe { signal_with(w, call, pe, Some((slot, src, len))) };
}

/// Wait for world PE `from`'s next staged message, hand its slot to `read`, then tell
/// `from` that the slot is free (a count in its heap).
fn stage_take(w: &World, call: &'static str, from: usize, read: impl FnOnce(*const u8)) {
    take(w, call, from);
    stage_read(w, call, from, read)
}

/// `stage_take` once the signal of `from`'s next staged message was taken.
fn stage_read(w: &World, call: &'static str, from: usize, read: impl FnOnce(*const u8)) {
    let k = bump(&STAGED_TAKEN, w.npes, from);
    // The slot lies in our heap's internal area (STAGE bytes), filled by `from` before
    // its signal, which `take` saw.
    read((w.heap.base + slot_offset(w.npes, from, k % 2)) as *const u8);
    let count = w.heap.base + consumed_offset(w.npes) + w.me * 8;
    match rma::target(w, call, "dest", count, 8, from) {
        // SAFETY: `from`'s count for us, 8-byte aligned in its mapped heap.
        Where::Here(p) => unsafe { AtomicU64::from_ptr(p as *mut u64) }.store(k, Ordering::Release),
        Where::Remote { .. } => rma::p(call, &DEFAULT, count as *mut u64, k, from as i32),
    }
}

/// A small broadcast in one round trip, not two syncs: each member tells the root it has
/// entered (so its `dest` may be written), the root writes `dest` on each with a
/// put-with-signal on the same pairwise counter, and each member waits for that signal.
/// The root's `src` is free when it returns; no member waits for the others.
fn broadcast_push(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
    root: usize,
) {
    fan_in(w, call, m, root);
    if m.me == root {
        fan_out(w, call, m, root, dest, src, len);
    }
}

/// A member (not the root) tells the root it has entered, then waits for the root's
/// put-with-signal (`fan_out`); the root waits until every member has entered.
fn fan_in(w: &World, call: &'static str, m: &Members, root: usize) {
    let rpe = m.pes[root];
    if m.me != root {
        signal(w, call, rpe);
        take(w, call, rpe);
        return;
    }
    for (j, &pe) in m.pes.iter().enumerate() {
        if j != root {
            take(w, call, pe);
        }
    }
}

/// The root writes `len` bytes of `src` (any memory here) into the symmetric `dest` of
/// every other member, each with the signal its `fan_in` waits for.
fn fan_out(
    w: &World,
    call: &'static str,
    m: &Members,
    root: usize,
    dest: *mut u8,
    src: *const u8,
    len: usize,
) {
    for (j, &pe) in m.pes.iter().enumerate() {
        if j != root {
            // SAFETY: `src` is `len` readable bytes; `dest` a checked symmetric range.
            unsafe { signal_with(w, call, pe, Some((dest, src, len))) };
        }
    }
}

/// `fcollect`: every member's `len` bytes, in member order, into `dest` everywhere.
pub fn fcollect(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
) {
    let n = m.n();
    let total = sized(call, len.checked_mul(n), || blocks(len, n));
    check_sym(w, call, "dest", dest, total);
    check_sym(w, call, "source", src, len);
    sync(w, call, m);
    for (j, &pe) in m.pes.iter().enumerate() {
        // SAFETY: block j of `dest`, checked above.
        pull(w, call, unsafe { dest.add(j * len) }, src, len, pe);
    }
    sync(w, call, m);
}

/// `collect`: every member's own `len` bytes (lengths may differ), concatenated in
/// member order.
pub fn collect(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
) {
    check_sym(w, call, "source", src, len);
    let scratch = w.heap.base + scratch_offset(w.npes);
    // SAFETY: this PE's scratch word in the heap's internal area; peers read it only
    // between the two syncs below.
    unsafe { std::ptr::write_volatile(scratch as *mut u64, len as u64) };
    sync(w, call, m);
    let mut lens = Vec::with_capacity(m.n());
    for &pe in m.pes.iter() {
        let mut v = 0u64;
        pull(
            w,
            call,
            &mut v as *mut u64 as *mut u8,
            scratch as *const u8,
            8,
            pe,
        );
        lens.push(v as usize);
    }
    let total: usize = lens.iter().sum();
    check_sym(w, call, "dest", dest, total);
    let mut off = 0;
    for (j, &pe) in m.pes.iter().enumerate() {
        // SAFETY: within `dest`'s checked `total` bytes.
        pull(w, call, unsafe { dest.add(off) }, src, lens[j], pe);
        off += lens[j];
    }
    sync(w, call, m);
}

/// `alltoall`: block `j` of `src` (of `len` bytes) goes to member `j`, into its block `me`.
pub fn alltoall(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    len: usize,
) {
    let n = m.n();
    let total = sized(call, len.checked_mul(n), || blocks(len, n));
    check_sym(w, call, "dest", dest, total);
    check_sym(w, call, "source", src, total);
    sync(w, call, m);
    for (j, &pe) in m.pes.iter().enumerate() {
        // SAFETY: block j of dest, block me of the peer's source; checked above.
        pull(
            w,
            call,
            unsafe { dest.add(j * len) },
            unsafe { src.add(m.me * len) },
            len,
            pe,
        );
    }
    sync(w, call, m);
}

/// `alltoalls`: strided blocks of `nelems` elements of `size` bytes.
#[allow(clippy::too_many_arguments)]
pub fn alltoalls(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    dst: isize,
    sst: isize,
    nelems: usize,
    size: usize,
) {
    if dst < 1 || sst < 1 {
        fatal(
            call,
            format_args!("dst={dst}, sst={sst}: strides must be at least 1"),
        )
    }
    let n = m.n();
    // From the first element to the end of the last: (n × nelems - 1) × stride + 1
    // elements.
    let span = |arg: &str, st: isize| {
        let v = n
            .checked_mul(nelems)
            .and_then(|k| (k - 1).checked_mul(st as usize))
            .and_then(|e| e.checked_add(1))
            .and_then(|e| e.checked_mul(size));
        sized(call, v, || {
            format!(
                "nelems={nelems}, {arg}={st}: {n} blocks of {nelems} elements of {size} bytes, {st} apart, overflow"
            )
        })
    };
    if nelems > 0 {
        check_sym(w, call, "dest", dest, span("dst", dst));
        check_sym(w, call, "source", src, span("sst", sst));
    }
    sync(w, call, m);
    for (j, &pe) in m.pes.iter().enumerate() {
        for k in 0..nelems {
            let d = (j * nelems + k) * dst as usize * size;
            let s = (m.me * nelems + k) * sst as usize * size;
            // SAFETY: inside the checked spans.
            pull(
                w,
                call,
                unsafe { dest.add(d) },
                unsafe { src.add(s) },
                size,
                pe,
            );
        }
    }
    sync(w, call, m);
}

/// A reduction of `count` elements of `size` bytes with `op`, in member order.
#[allow(clippy::too_many_arguments)]
pub fn reduce(
    w: &World,
    call: &'static str,
    m: &Members,
    dest: *mut u8,
    src: *const u8,
    count: usize,
    size: usize,
    op: ReduceFn,
) {
    let len = sized(call, count.checked_mul(size), || {
        format!("nreduce={count}: {count} elements of {size} bytes overflow")
    });
    check_sym(w, call, "dest", dest, len);
    check_sym(w, call, "source", src, len);
    let r = Operands {
        dest,
        src,
        count,
        size,
        len,
        op,
    };
    if len <= STAGE && flat(w, m) {
        return reduce_staged(w, call, m, r);
    }
    if len <= PUSH_MAX {
        // Small: the first member combines every source once they have all entered,
        // and pushes the result (`fan_in`, `fan_out`).
        fan_in(w, call, m, 0);
        if m.me == 0 {
            with_combined(w, call, m, r, |acc| {
                fan_out(w, call, m, 0, dest, acc.as_ptr(), len);
                if len > 0 {
                    // SAFETY: `dest` checked for `len` bytes; `acc` is ours.
                    unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dest, len) };
                }
            });
        }
        return;
    }
    sync(w, call, m);
    if len >= SCATTER_MIN && all_here(w, call, m, src, len) {
        return reduce_scattered(w, call, m, r);
    }
    with_combined(w, call, m, r, |acc| {
        sync(w, call, m);
        // SAFETY: `dest` checked for `len` bytes (> PUSH_MAX here); `acc` is ours.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dest, len) };
    });
}

/// A reduction's operands: `count` elements of `size` bytes (`len` in all) of every
/// member's `src`, combined with `op` into `dest`; both checked symmetric for `len`.
#[derive(Clone, Copy)]
struct Operands {
    dest: *mut u8,
    src: *const u8,
    count: usize,
    size: usize,
    len: usize,
    op: ReduceFn,
}

/// A tiny reduction among a few members of one host, with no sync: each member stages
/// its source at every other (`stage_send`), then combines every member's, in member
/// order, its own from `src` and the others' from their slots (`stage_take`). `dest` is
/// written last, so it may be `src`.
fn reduce_staged(w: &World, call: &'static str, m: &Members, r: Operands) {
    let Operands {
        dest,
        src,
        count,
        len,
        op,
        ..
    } = r;
    for (j, &pe) in m.pes.iter().enumerate() {
        if j != m.me {
            // SAFETY: `src` is a checked range of `len` <= STAGE bytes.
            unsafe { stage_send(w, call, pe, src, len) };
        }
    }
    // Where PEs outnumber CPUs, wait for every member's message at once (`take_all`),
    // rather than for each in member order, giving the CPU away for each.
    let all_at_once = w.wait.oversubscribed;
    if all_at_once {
        let n = m.n();
        take_all(w, call, (1..n).map(|j| m.pes[(m.me + j) % n]));
    }
    let mut acc = [0u8; STAGE];
    for (j, &pe) in m.pes.iter().enumerate() {
        let mut combine = |x: *const u8| {
            if len == 0 {
                // Nothing to combine (`src` may be NULL).
                return;
            }
            if j == 0 {
                // SAFETY: `x` is `len` <= STAGE readable bytes (our source or a slot).
                unsafe { std::ptr::copy_nonoverlapping(x, acc.as_mut_ptr(), len) };
            } else {
                // SAFETY: `acc` and `x` hold `count` elements of `size` bytes.
                unsafe { op(acc.as_mut_ptr(), x, count) };
            }
        };
        if j == m.me {
            combine(src);
        } else if all_at_once {
            stage_read(w, call, pe, combine);
        } else {
            stage_take(w, call, pe, combine);
        }
    }
    if len > 0 {
        // SAFETY: `dest` checked for `len` bytes; `acc` holds them.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dest, len) };
    }
}

/// Reductions of this many bytes or more, among members whose memory is all mapped here,
/// are split between the members (`reduce_scattered`).
const SCATTER_MIN: usize = 64 << 10;

/// Whether every member's `src` (`len` bytes) can be read here with plain loads.
fn all_here(w: &World, call: &'static str, m: &Members, src: *const u8, len: usize) -> bool {
    m.pes.iter().all(|&pe| {
        matches!(
            rma::target(w, call, "source", src as usize, len, pe),
            Where::Here(_)
        )
    })
}

/// A large reduction among same-host members, after the entry sync: member j combines
/// only the j-th of n slices, every member's source in member order (the same bits as
/// combining it all), into its own `dest`; after a sync each copies the other slices out
/// of their owners' `dest`; a last sync lets every `dest` and source be reused. Each
/// member combines a slice where combining it all would make every member read and
/// combine every source whole. `dest` may be `src` (an in-place reduction): a member
/// writes its own slice before the middle sync and the others after it, and only reads
/// others' sources in its own slice and their `dest` in theirs.
fn reduce_scattered(w: &World, call: &'static str, m: &Members, r: Operands) {
    let (dest, src, count, size, op) = (r.dest, r.src, r.count, r.size, r.op);
    let n = m.n();
    let slice = |j: usize| (j * count / n * size, (j + 1) * count / n * size);
    let here = |arg: &'static str, p: *const u8, len: usize, pe: usize| -> *mut u8 {
        match rma::target(w, call, arg, p as usize, len, pe) {
            Where::Here(q) => q,
            // `all_here` said so for the whole source, and `dest` lies in the same segment
            // at the same offsets on every member.
            Where::Remote { .. } => fatal(call, "a member's memory is not mapped here"),
        }
    };
    let (lo, hi) = slice(m.me);
    if hi > lo {
        SCRATCH.with(|scratch| {
            let mut acc = scratch.borrow_mut();
            if acc.len() < hi - lo {
                acc.resize(hi - lo, 0);
            }
            for (j, &pe) in m.pes.iter().enumerate() {
                // `src` is checked symmetric for `count` × `size` bytes and `[lo, hi)`
                // lies inside it.
                // SAFETY: so `x` is `hi - lo` readable bytes of member j's source, mapped.
                unsafe {
                    let x = here("source", src.add(lo), hi - lo, pe);
                    if j == 0 {
                        std::ptr::copy_nonoverlapping(x, acc.as_mut_ptr(), hi - lo);
                    } else {
                        op(acc.as_mut_ptr(), x, (hi - lo) / size);
                    }
                }
            }
            // SAFETY: `dest` is checked symmetric for the same length; our slice of it.
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dest.add(lo), hi - lo) };
        });
    }
    sync(w, call, m);
    for (j, &pe) in m.pes.iter().enumerate() {
        let (lo, hi) = slice(j);
        if j == m.me || hi == lo {
            continue;
        }
        // SAFETY: member j's `dest` slice, final since the sync, mapped here; ours is
        // the same range of our checked `dest`.
        unsafe {
            let from = here("dest", dest.add(lo), hi - lo, pe);
            std::ptr::copy_nonoverlapping(from, dest.add(lo), hi - lo);
        }
    }
    sync(w, call, m);
}

/// Combine every member's `src` in member order (same-host sources where they lie,
/// others fetched), and hand the result to `then`.
fn with_combined(
    w: &World,
    call: &'static str,
    m: &Members,
    r: Operands,
    then: impl FnOnce(&[u8]),
) {
    let (src, count, len, op) = (r.src, r.count, r.len, r.op);
    SCRATCH.with(|scratch| {
        // Kept from call to call: a fresh buffer each time costs its page faults.
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < 2 * len {
            scratch.resize(2 * len, 0);
        }
        let (acc, tmp) = scratch.split_at_mut(len);
        for (j, &pe) in m.pes.iter().enumerate() {
            if len == 0 {
                break;
            }
            // A same-host peer's source is combined where it lies; another's is fetched.
            let x = match rma::target(w, call, "source", src as usize, len, pe) {
                Where::Here(p) => p as *const u8,
                Where::Remote { .. } => {
                    let into = if j == 0 { &mut *acc } else { &mut *tmp };
                    rma::get(
                        call,
                        &DEFAULT,
                        into.as_mut_ptr(),
                        src,
                        len,
                        pe as i32,
                        false,
                    );
                    into.as_ptr()
                }
            };
            if j == 0 {
                if x != acc.as_ptr() {
                    // SAFETY: `x` is `len` readable bytes (a checked range or `acc`).
                    unsafe { std::ptr::copy(x, acc.as_mut_ptr(), len) };
                }
            } else {
                // SAFETY: `acc` holds `count` elements and `x` `len` = `count` × `size`
                // bytes (a checked range of the peer's source, or `tmp`).
                unsafe { op(acc.as_mut_ptr(), x, count) };
            }
        }
        then(acc);
    });
}

thread_local! {
    /// `reduce`'s accumulator and the buffer a remote peer's source is fetched into.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
