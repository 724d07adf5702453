//! One-sided tests: puts, gets, atomics and signaling puts (ucx_perftest's `ucp_put_lat`,
//! `ucp_put_bw`, `ucp_get`, `ucp_add`, `ucp_fadd`, `ucp_swap`, `ucp_cswap`, plus Courier's
//! `put_signal_lat`, `put_signal_bw` and `put_flush_signal_lat`).
//!
//! Both sides map one region of their `-m` memory type (the client's is the sender's, the
//! server's the receiver's) with the same layout; the client sends its packed key with the
//! test parameters and the server answers with its own. The server then progresses its
//! worker until the client's `TAG_FIN` (over tcp, the target's progress carries the remote
//! operations out), so its region stays mapped while the client uses it.

use super::clock::Instant;
use courier::poll_gap;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use courier::{
    AtomicOp, Callback, MemMapParams, Memory, MemoryType, RemoteKey, Request, SignalOp, Started,
};

use super::engine::{
    Beat, Failure, Idle, Link, TAG_FIN, buffers_what, pattern, try_ring, try_vec, verify,
};
use super::params::{MemKind, Params, TestKind};
use super::report::{Meter, Row, mem_label};
use crate::error::{CliError, CliResult};

/// Where things are in a region; both sides use the same layout.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Message size.
    size: usize,
    /// Offset of the send area (after `slots` receive slots at offset 0).
    send: usize,
    /// Offset of the 64-bit signal word (also the target of the atomic tests).
    sig: usize,
    /// Region length.
    len: usize,
}

/// Areas start on their own cache line: the peer writes the receive slots while this side
/// writes its send area, and sharing a line would bounce it between the CPUs. `None` when
/// it overflows.
fn round_line(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(64)
}

impl Layout {
    /// The layout of `p`'s region; `None` when it overflows (`Params::check_totals` keeps
    /// a client's parameters far below that).
    fn new(p: &Params) -> Option<Layout> {
        let size = p.msg_size();
        // Gets in flight each need their own landing slot.
        let slots = if p.test == TestKind::Get {
            p.window.max(1)
        } else {
            1
        };
        let send = round_line(size.checked_mul(slots)?)?;
        let sig = send.checked_add(round_line(size)?)?;
        Some(Layout {
            size,
            send,
            sig,
            len: sig.checked_add(8)?,
        })
    }
}

/// Check the parameters of a one-sided test (usage errors).
pub fn validate(p: &Params) -> CliResult<()> {
    if p.sizes.len() != 1 {
        return Err(CliError::usage(format!(
            "{} takes one message size (one-sided tests have no IOV form)",
            p.test.name()
        )));
    }
    let size = p.sizes[0];
    if p.test.is_atomic() && size != 4 && size != 8 {
        return Err(CliError::usage(format!(
            "-s {size}: {} takes 4 or 8 (the width of the atomic word)",
            p.test.name()
        )));
    }
    if p.test == TestKind::PutLat && size == 0 {
        return Err(CliError::usage(
            "ucp_put_lat needs at least 1 byte: the message carries the iteration number",
        ));
    }
    Ok(())
}

fn mem_type_name(t: MemoryType) -> &'static str {
    match t {
        MemoryType::Host => "host",
        MemoryType::Nic => "nic",
        MemoryType::Cuda => "cuda",
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Map `len` bytes of memory type `kind` (a usage error when the type cannot be had).
pub fn map_memory(ctx: &courier::Context, kind: MemKind, len: usize) -> CliResult<Memory> {
    ctx.mem_map(MemMapParams::allocate(len.max(8)).memory_type(kind.memory_type()))
        .map_err(|e| CliError::usage(format!("memory type {}: {e}", kind.name())))
}

/// Map `len` bytes of memory type `kind` for the buffers `what()` names: a size the
/// library cannot map is an error saying so.
pub fn map_buffer(
    ctx: &courier::Context,
    kind: MemKind,
    len: usize,
    what: impl FnOnce() -> String,
) -> CliResult<Memory> {
    ctx.mem_map(MemMapParams::allocate(len.max(8)).memory_type(kind.memory_type()))
        .map_err(|e| {
            CliError::run(format!(
                "cannot allocate {len} bytes of {} memory for the {}: {e}",
                kind.name(),
                what()
            ))
        })
}

/// Zero the first `len` bytes of `mem`, a chunk at a time. Fresh host memory is zero
/// already, but writing it takes its pages now, before anything is timed.
pub fn zero(mem: &Memory, len: usize) -> CliResult<()> {
    let chunk = vec![0u8; len.min(1 << 20)];
    let mut off = 0;
    while off < len {
        let n = chunk.len().min(len - off);
        fill(mem, off, &chunk[..n])?;
        off += n;
    }
    Ok(())
}

/// Fill `[off, off + bytes.len())` of `mem` (through the driver for device memory).
pub fn fill(mem: &Memory, off: usize, bytes: &[u8]) -> CliResult<()> {
    mem.write(off, bytes)
        .map_err(|e| CliError::run(format!("cannot initialize the test buffers: {e}")))
}

/// One side's mapped region and the peer's key.
pub struct Side {
    /// Always `Some` until `retire`.
    mem: Option<Memory>,
    layout: Layout,
    failure: Arc<Failure>,
    peer: Option<RemoteKey>,
    peer_base: u64,
    /// The memory type the peer actually got (the client learns the server's).
    peer_actual: Option<MemoryType>,
}

impl Drop for Side {
    fn drop(&mut self) {
        // Before the region goes: a late failure must not write into it.
        self.failure.disarm();
    }
}

impl Side {
    /// Map this side's region of memory type `kind` for `p`.
    pub fn map(link: &Link, p: &Params, kind: MemKind) -> CliResult<Side> {
        validate(p)?;
        let what = || buffers_what(p);
        let layout = Layout::new(p).ok_or_else(|| {
            CliError::run(format!(
                "cannot allocate the {}: the region's size overflows",
                what()
            ))
        })?;
        // The send pattern first: a size the allocator refuses ends here, before anything
        // is mapped.
        let mut send: Vec<u8> = try_vec(layout.size, what)?;
        send.extend((0..layout.size).map(pattern));
        let mem = map_buffer(link.worker.context(), kind, layout.len, what)?;
        zero(&mem, layout.len)?;
        fill(&mem, layout.send, &send)?;
        if mem.query().memory_type != MemoryType::Cuda {
            // SAFETY: the signal word is aligned (offset and base are multiples of 8) and
            // is disarmed in Drop, before the region is unmapped. (Device memory serves
            // only the tests that wait on no signal: `check_mem`.)
            unsafe { link.failure.arm(mem.as_ptr().add(layout.sig) as *mut u64) };
        }
        Ok(Side {
            mem: Some(mem),
            layout,
            failure: link.failure.clone(),
            peer: None,
            peer_base: 0,
            peer_actual: None,
        })
    }

    fn mem(&self) -> &Memory {
        self.mem.as_ref().expect("mapped until retired")
    }

    /// Done with the test: keep the region mapped for the rest of the session (see
    /// `Link::retired`).
    fn retire(mut self, link: &Link) {
        self.failure.disarm();
        if let Some(m) = self.mem.take() {
            link.retired.borrow_mut().push(m);
        }
    }

    /// This side's packed key, as hex for the control messages.
    pub fn packed_hex(&self) -> CliResult<String> {
        self.mem()
            .pack_rkey()
            .map(|k| hex(&k))
            .map_err(|e| CliError::run(format!("cannot pack the remote key: {e}")))
    }

    /// The server's answer: its key and the memory type it actually got.
    pub fn ack_json(&self) -> CliResult<String> {
        Ok(serde_json::json!({
            "rkey": self.packed_hex()?,
            "mem": mem_type_name(self.mem().query().memory_type),
        })
        .to_string())
    }

    /// Unpack the peer's key from its control message (`rkey`, and `mem` from a server).
    pub fn attach_peer(&mut self, link: &Link, v: &serde_json::Value) -> CliResult<()> {
        let bad = |why: String| CliError::run(format!("remote key from {}: {why}", link.peer));
        let bytes = v["rkey"]
            .as_str()
            .and_then(unhex)
            .ok_or_else(|| bad("missing or not hex".into()))?;
        let key = link
            .ep
            .rkey_unpack(&bytes)
            .map_err(|e| bad(e.to_string()))?;
        let (base, len) = key.bounds();
        if len < self.layout.len as u64 {
            return Err(bad(format!(
                "region of {len} bytes, the test needs {}",
                self.layout.len
            )));
        }
        self.peer_actual = v["mem"].as_str().and_then(|m| match m {
            "host" => Some(MemoryType::Host),
            "nic" => Some(MemoryType::Nic),
            "cuda" => Some(MemoryType::Cuda),
            _ => None,
        });
        self.peer_base = base;
        self.peer = Some(key);
        Ok(())
    }

    /// The header box's Send memory and Recv memory rows (the client's view).
    pub fn labels(&self, p: &Params) -> [String; 2] {
        [
            mem_label(p.mem[0], Some(self.mem().query().memory_type)),
            mem_label(p.mem[1], self.peer_actual),
        ]
    }

    fn key(&self, link: &Link) -> CliResult<&RemoteKey> {
        self.peer
            .as_ref()
            .ok_or_else(|| CliError::run(format!("no remote key from {}", link.peer)))
    }

    /// Wait until this side's signal word is at least `v`, progressing the worker (the
    /// library's `signal_wait_until` has no time limit: a stopped peer would hold it
    /// forever). The word becomes `u64::MAX` when the peer fails (`Failure::arm`).
    #[inline]
    fn wait_signal(&self, link: &Link, v: u64) -> CliResult<()> {
        let m = self.mem();
        if self.layout.sig + 8 > m.len() {
            return Err(CliError::run(
                "the signal word lies outside the test region",
            ));
        }
        // SAFETY: inside the region (checked above), 8-byte aligned (Layout; the base is
        // page aligned); the region outlives this call. The peer writes it, so atomically.
        let word = unsafe {
            std::sync::atomic::AtomicU64::from_ptr(m.as_ptr().add(self.layout.sig).cast())
        };
        let got = watch(link, move || {
            let got = word.load(Ordering::Acquire);
            (got >= v).then_some(got)
        })?;
        if got == u64::MAX && link.failure.is_set() {
            return Err(link.failed());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Helpers of the loops
// ---------------------------------------------------------------------------------------

/// The iteration number as carried in `size` bytes (the low bytes when fewer than 8).
#[inline]
fn mask(size: usize, v: u64) -> u64 {
    if size >= 8 {
        v
    } else {
        v & ((1u64 << (8 * size)) - 1)
    }
}

/// Write the iteration number into the last (up to 8) bytes of a message.
///
/// # Safety
/// `p` must be valid for writes of `size` bytes, with no operation reading them.
#[inline]
unsafe fn stamp(p: *mut u8, size: usize, v: u64) {
    // SAFETY: forwarded contract; the word, or the k <= size bytes, end at `size`.
    unsafe {
        if size >= 8 {
            std::ptr::write_unaligned(p.add(size - 8).cast::<u64>(), v.to_le());
        } else {
            std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), p, size);
        }
    }
}

/// Read the iteration number a peer wrote at the end of the message at `p`.
///
/// # Safety
/// `p` must be valid for reads of `size` bytes.
#[inline]
unsafe fn read_stamp(p: *const u8, size: usize) -> u64 {
    let k = size.min(8);
    // SAFETY: inside the message; volatile because the peer writes it.
    let at = unsafe { p.add(size - k) };
    if k == 8 && at.cast::<u64>().is_aligned() {
        // One load of the whole word (the peer's put stores it whole).
        // SAFETY: as above, and aligned.
        return u64::from_le(unsafe { std::ptr::read_volatile(at.cast::<u64>()) });
    }
    let mut b = [0u8; 8];
    for (j, x) in b.iter_mut().enumerate().take(k) {
        // SAFETY: inside the message; volatile because the peer writes it.
        *x = unsafe { std::ptr::read_volatile(p.add(size - k + j)) };
    }
    u64::from_le_bytes(b)
}

/// Look at memory the peer writes directly until `look` gives a result: 16 looks per
/// progress call (a same-host peer's store lands without our progress, and an idle
/// progress costs more than a load), spaced by `poll_gap` (the store lands sooner).
#[inline]
fn watch<R>(link: &Link, mut look: impl FnMut() -> Option<R>) -> CliResult<R> {
    let mut idle = Idle::default();
    loop {
        for _ in 0..16 {
            if let Some(r) = look() {
                return Ok(r);
            }
            poll_gap();
        }
        link.poll(&mut idle)?;
    }
}

/// Poll this side's receive area until the message of iteration `v` is there.
#[inline]
fn poll_stamp(link: &Link, p: *const u8, size: usize, v: u64) -> CliResult<()> {
    let want = mask(size, v);
    // Captured by value, so that the size's checks in `read_stamp` are made once.
    watch(link, move || {
        // SAFETY: `p` is the receive area of a live region of at least `size` bytes.
        (unsafe { read_stamp(p, size) } == want).then(|| fence(Ordering::Acquire))
    })
}

fn check_data(link: &Link, p: &Params, buf: &[u8]) -> CliResult<()> {
    if p.check && !verify(buf) {
        return Err(CliError::run(format!(
            "data check failed: {} bytes from {} had wrong contents",
            buf.len(),
            link.peer
        )));
    }
    Ok(())
}

/// Run `body(i)` for every iteration, timing each after the warm-up, with the client's
/// heartbeat (`Beat`) in between.
#[inline]
fn timed(
    link: &Link,
    meter: &mut Meter<'_>,
    p: &Params,
    mut body: impl FnMut(u64) -> CliResult<()>,
) -> CliResult<()> {
    let (total, warm) = (p.total(), p.warmup);
    let mut beat = Beat::new();
    let mut t = Instant::now();
    for i in 0..total {
        if i == warm {
            t = Instant::now();
            meter.begin(t, i);
        }
        body(i)?;
        let now = Instant::now();
        if i >= warm {
            meter.record(now, t);
        }
        t = if beat.tick(link, now)? {
            Instant::now()
        } else {
            now
        };
    }
    Ok(())
}

/// A request to settle later, or `None` when it already completed (a put into memory
/// mapped here: nothing left to wait for before the next one).
#[inline]
fn in_flight(mut r: Request<'_>) -> Option<Request<'_>> {
    if r.is_done() { None } else { Some(r) }
}

/// A put of a latency test, as ucx_perftest makes it: one the library finished inside
/// the call (into a peer's region mapped here) gives no request (`None`), so none is made,
/// tested or dropped; one still in flight gives its request.
#[inline]
fn put_start<'a>(
    link: &Link,
    msg: &'a [u8],
    raddr: u64,
    rk: &RemoteKey,
) -> CliResult<Option<Request<'a>>> {
    let buf = courier::Buf::One((msg.as_ptr() as usize, msg.len()));
    // SAFETY: a put still in flight becomes a `Request` borrowing `msg`, below.
    let started = unsafe { link.ep.put_raw(buf, raddr, rk, Callback::None) };
    // SAFETY: `started` came with `msg`, which lives for 'a.
    unsafe { link.in_flight_raw(started) }
}

/// Wait for a finished-or-not request slot, then empty it.
#[inline]
fn settle(link: &Link, slot: &mut Option<Request<'_>>) -> CliResult<u64> {
    match slot.take() {
        Some(mut r) => Ok(link.wait(&mut r)?.value),
        None => Ok(0),
    }
}

/// The old value a fetching atomic of iteration `j` must return: every test's operation
/// `j` moves the word from `j` to `j + 1` (add 1, swap in `j + 1`, compare `j` swap `j + 1`).
#[inline]
fn expect_old(link: &Link, p: &Params, j: u64, got: u64) -> CliResult<()> {
    if p.check && got != mask(p.msg_size(), j) {
        return Err(CliError::run(format!(
            "data check failed: {} operation {j} on {}'s word returned {got}, expected {}",
            p.test.name(),
            link.peer,
            mask(p.msg_size(), j)
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Client side (measures)
// ---------------------------------------------------------------------------------------

/// Run a one-sided test as the client; returns the final row.
pub fn run_client(link: &Link, p: &Params, meter: &mut Meter<'_>, side: Side) -> CliResult<Row> {
    let row = client_loops(link, p, meter, &side)?;
    // Every operation has completed: the server may unmap.
    link.send_ctrl(TAG_FIN, &p.total().to_le_bytes())?;
    side.retire(link);
    Ok(row)
}

fn client_loops(link: &Link, p: &Params, meter: &mut Meter<'_>, side: &Side) -> CliResult<Row> {
    let l = side.layout;
    let size = l.size;
    let w = p.window.max(1);
    let rk = side.key(link)?;
    let rb = side.peer_base;
    let base = side.mem().as_ptr();
    // SAFETY: offsets inside the region (Layout); the region outlives every request below,
    // which all complete before this function returns.
    let (send_ptr, recv_ptr) = unsafe { (base.add(l.send), base as *const u8) };
    // SAFETY: the send area; written again only by `stamp` while no request reads it.
    let data: &[u8] = unsafe { std::slice::from_raw_parts(send_ptr, size) };
    let (r_recv, r_send, r_sig) = (rb, rb + l.send as u64, rb + l.sig as u64);
    let ep = &link.ep;
    if p.total() == 0 {
        return Ok(meter.finish(Instant::now()));
    }
    match p.test {
        TestKind::PutLat => {
            let mut pending: Option<Request<'_>> = None;
            timed(link, meter, p, |i| {
                settle(link, &mut pending)?;
                // SAFETY: the previous put from the send area has completed.
                unsafe { stamp(send_ptr, size, i + 1) };
                // SAFETY: as for `data`.
                let msg: &[u8] = unsafe { std::slice::from_raw_parts(send_ptr, size) };
                pending = put_start(link, msg, r_recv, rk)?;
                poll_stamp(link, recv_ptr, size, i + 1)?;
                if p.check {
                    // SAFETY: the receive area; the peer is waiting for our next put.
                    let got = unsafe { std::slice::from_raw_parts(recv_ptr, size) };
                    check_data(link, p, &got[..size - size.min(8)])?;
                }
                Ok(())
            })?;
            settle(link, &mut pending)?;
        }
        TestKind::PutSignalLat => {
            let mut pending: Option<Request<'_>> = None;
            timed(link, meter, p, |i| {
                settle(link, &mut pending)?;
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                pending = in_flight(link.check(unsafe {
                    ep.put_signal_nb(data, r_recv, rk, r_sig, rk, i + 1, SignalOp::Set)
                })?);
                side.wait_signal(link, i + 1)?;
                if p.check {
                    // SAFETY: the receive area; the peer is waiting for our next put.
                    check_data(link, p, unsafe {
                        std::slice::from_raw_parts(recv_ptr, size)
                    })?;
                }
                Ok(())
            })?;
            settle(link, &mut pending)?;
        }
        TestKind::PutFlushSignalLat => {
            let mut pending: Option<Request<'_>> = None;
            timed(link, meter, p, |i| {
                settle(link, &mut pending)?;
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut put = link.check(unsafe { ep.put_nb(data, r_recv, rk) })?;
                link.check(ep.flush())?;
                link.wait(&mut put)?;
                drop(put);
                pending =
                    in_flight(link.check(ep.atomic(AtomicOp::Swap, i + 1, 0, r_sig, rk, false))?);
                side.wait_signal(link, i + 1)?;
                if p.check {
                    // SAFETY: the receive area; the peer is waiting for our next put.
                    check_data(link, p, unsafe {
                        std::slice::from_raw_parts(recv_ptr, size)
                    })?;
                }
                Ok(())
            })?;
            settle(link, &mut pending)?;
        }
        TestKind::PutBw | TestKind::PutSignalBw => {
            let signal = p.test == TestKind::PutSignalBw;
            let mut ring: Vec<Option<Request<'_>>> = try_ring(w, || buffers_what(p))?;
            timed(link, meter, p, |i| {
                let s = &mut ring[(i % w as u64) as usize];
                settle(link, s)?;
                *s = Some(link.check(if signal {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    unsafe { ep.put_signal_nb(data, r_recv, rk, r_sig, rk, 1, SignalOp::Add) }
                } else {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    unsafe { ep.put_nb(data, r_recv, rk) }
                })?);
                Ok(())
            })?;
            for s in ring.iter_mut() {
                settle(link, s)?;
            }
            link.check(ep.flush())?;
            if signal {
                // The server saw the last signal: every message arrived.
                let mut fin = [0u8; 8];
                link.recv_ctrl(TAG_FIN, &mut fin)?;
            }
        }
        TestKind::Get => {
            let mut ring: Vec<Option<Request<'_>>> = try_ring(w, || buffers_what(p))?;
            let slot_ptr = |k: usize| base.wrapping_add(k * size);
            timed(link, meter, p, |i| {
                let k = (i % w as u64) as usize;
                settle(link, &mut ring[k])?;
                if p.check && i >= w as u64 {
                    // SAFETY: slot k's get has completed.
                    check_data(link, p, unsafe {
                        std::slice::from_raw_parts(slot_ptr(k), size)
                    })?;
                }
                // SAFETY: slot k of the receive slots (Layout has one per window slot);
                // one request per slot at a time.
                let buf = unsafe { std::slice::from_raw_parts_mut(slot_ptr(k), size) };
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                ring[k] = Some(link.check(unsafe { ep.get_nb(buf, r_send, rk) })?);
                Ok(())
            })?;
            for s in ring.iter_mut() {
                settle(link, s)?;
            }
        }
        TestKind::Add => {
            // Posted adds streamed without waiting for any: one progress call per window
            // (queued frames leave, refusals come in), a flush at the end. Then every add
            // has been carried out, and `--check` reads the word back.
            let bits32 = size == 4;
            timed(link, meter, p, |i| {
                link.check(ep.atomic_post(AtomicOp::Add, 1, r_sig, rk, bits32))?;
                if (i + 1).is_multiple_of(w as u64) {
                    link.worker.progress();
                }
                Ok(())
            })?;
            link.check(ep.flush())?;
            if p.check {
                let mut word = [0u8; 8];
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut r = link.check(unsafe { ep.get_nb(&mut word[..size], r_sig, rk) })?;
                link.wait(&mut r)?;
                drop(r);
                let (got, want) = (u64::from_le_bytes(word), mask(size, p.total()));
                if got != want {
                    return Err(CliError::run(format!(
                        "data check failed: {}'s word is {got} after {} posted adds of 1, expected {want}",
                        link.peer,
                        p.total()
                    )));
                }
            }
        }
        TestKind::Fadd | TestKind::Swap | TestKind::Cswap => {
            let bits32 = size == 4;
            let op = match p.test {
                TestKind::Fadd => AtomicOp::Add,
                TestKind::Swap => AtomicOp::Swap,
                _ => AtomicOp::Cswap,
            };
            let mut ring: Vec<Option<(u64, Request<'static>)>> = try_ring(w, || buffers_what(p))?;
            let drain = |s: &mut Option<(u64, Request<'static>)>| -> CliResult<()> {
                if let Some((j, mut r)) = s.take() {
                    let old = link.wait(&mut r)?.value;
                    expect_old(link, p, j, old)?;
                }
                Ok(())
            };
            timed(link, meter, p, |i| {
                let s = &mut ring[(i % w as u64) as usize];
                drain(s)?;
                let (value, compare) = match op {
                    AtomicOp::Add => (1, 0),
                    _ => (mask(size, i + 1), mask(size, i)),
                };
                // As ucx_perftest: an atomic carried out inside the call (on a peer's
                // region mapped here) returns its old value at once, with no request to
                // make, test and drop; one sent to the owner is waited for in its slot.
                let started = ep.atomic_raw(op, value, compare, r_sig, rk, bits32, Callback::None);
                match link.check(started)? {
                    Started::Done(info) => expect_old(link, p, i, info.value)?,
                    // SAFETY: an atomic borrows no buffer of ours.
                    pending => *s = Some((i, unsafe { link.worker.request_for(pending) })),
                }
                Ok(())
            })?;
            for s in ring.iter_mut() {
                drain(s)?;
            }
        }
        t => {
            return Err(CliError::run(format!(
                "{} is not a one-sided test",
                t.name()
            )));
        }
    }
    Ok(meter.finish(Instant::now()))
}

// ---------------------------------------------------------------------------------------
// Server side (answers and progresses, does not measure)
// ---------------------------------------------------------------------------------------

/// Run a one-sided test as the server: answer the ping-pongs, then progress until the
/// client's `TAG_FIN` (its operations need this side's progress over tcp). Every wait
/// ends if the client fails or falls silent (its heartbeat stops) for the stall limit.
pub fn run_server(link: &Link, p: &Params, side: Side) -> CliResult<()> {
    server_loops(link, p, &side)?;
    let mut fin = [0u8; 8];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = link.check(unsafe { link.worker.tag_recv_nb(&mut fin, TAG_FIN, u64::MAX) })?;
    // However long the test runs, the client's heartbeat arrives every `BEAT`: a client
    // silent for the stall limit is gone.
    link.wait(&mut r)?;
    drop(r);
    side.retire(link);
    Ok(())
}

fn server_loops(link: &Link, p: &Params, side: &Side) -> CliResult<()> {
    let l = side.layout;
    let size = l.size;
    let total = p.total();
    let rk = side.key(link)?;
    let rb = side.peer_base;
    let base = side.mem().as_ptr();
    // SAFETY: offsets inside the region (Layout).
    let (send_ptr, recv_ptr) = unsafe { (base.add(l.send), base as *const u8) };
    // SAFETY: the send area; written again only by `stamp` while no request reads it.
    let data: &[u8] = unsafe { std::slice::from_raw_parts(send_ptr, size) };
    let (r_recv, r_sig) = (rb, rb + l.sig as u64);
    let ep = &link.ep;
    match p.test {
        TestKind::PutLat => {
            let mut pending: Option<Request<'_>> = None;
            for i in 0..total {
                poll_stamp(link, recv_ptr, size, i + 1)?;
                settle(link, &mut pending)?;
                // SAFETY: the previous put from the send area has completed.
                unsafe { stamp(send_ptr, size, i + 1) };
                // SAFETY: as for `data`.
                let msg: &[u8] = unsafe { std::slice::from_raw_parts(send_ptr, size) };
                pending = put_start(link, msg, r_recv, rk)?;
            }
            settle(link, &mut pending)?;
        }
        TestKind::PutSignalLat => {
            let mut pending: Option<Request<'_>> = None;
            for i in 0..total {
                side.wait_signal(link, i + 1)?;
                settle(link, &mut pending)?;
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                pending = in_flight(link.check(unsafe {
                    ep.put_signal_nb(data, r_recv, rk, r_sig, rk, i + 1, SignalOp::Set)
                })?);
            }
            settle(link, &mut pending)?;
        }
        TestKind::PutFlushSignalLat => {
            let mut pending: Option<Request<'_>> = None;
            for i in 0..total {
                side.wait_signal(link, i + 1)?;
                settle(link, &mut pending)?;
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut put = link.check(unsafe { ep.put_nb(data, r_recv, rk) })?;
                link.check(ep.flush())?;
                link.wait(&mut put)?;
                drop(put);
                pending =
                    in_flight(link.check(ep.atomic(AtomicOp::Swap, i + 1, 0, r_sig, rk, false))?);
            }
            settle(link, &mut pending)?;
        }
        TestKind::PutSignalBw => {
            if total > 0 {
                side.wait_signal(link, total)?;
            }
            if p.check {
                // SAFETY: the receive area; every put has landed.
                check_data(link, p, unsafe {
                    std::slice::from_raw_parts(recv_ptr, size)
                })?;
            }
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        // The client's operations need only this side's progress (in run_server).
        _ => {}
    }
    Ok(())
}
