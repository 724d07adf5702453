//! The two-sided tests' message buffers, one message of a test's kind, and the loops of
//! the ping-pong tests (`tag_lat`, `tag_sync_lat`, `stream_lat`, `ucp_am_lat`) on both
//! sides; the client and the server of every two-sided test start here and hand the
//! streaming tests to `super::streaming`.

use crate::perf::clock::Instant;
use std::cell::Cell;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use courier::{AmFlags, AmRndv, Info, Memory, Request};

use super::link::{Idle, Link};
use super::streaming::{bibw_round, counted_recvs, counted_sends, win_round_recv, win_round_send};
use super::{AM_PING, AM_PONG, TAG_FIN, TAG_PING, TAG_PONG};
use crate::error::{CliError, CliResult};
use crate::perf::params::{MemKind, Params, TestKind};
use crate::perf::report::Meter;
use crate::perf::rma;

// ---------------------------------------------------------------------------------------
// Buffers and patterns
// ---------------------------------------------------------------------------------------

#[inline]
pub(in crate::perf) fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(7) & 0xff) as u8
}

pub(in crate::perf) fn verify(buf: &[u8]) -> bool {
    buf.iter().enumerate().all(|(i, &b)| b == pattern(i))
}

/// The message buffers of a two-sided test, as ucx_perftest maps them with `ucp_mem_map`:
/// the send buffer in the first `-m` memory type, the receive buffers in the second,
/// allocated by the library (shared segments for host memory), except a host send buffer
/// over tcp, which is never-written private memory registered with it (`map_unwritten`).
pub(super) struct Buffers {
    send: ManuallyDrop<Memory>,
    /// One receive buffer per slot: a window's on the receiving side, one on a client that
    /// only sends or ping-pongs.
    recv: ManuallyDrop<Memory>,
    size: usize,
    /// How many receive buffers `recv` holds.
    slots: usize,
    bounds: Vec<(usize, usize)>,
    /// A failed run left operations that may still read or write the buffers (sends in
    /// flight, receives still posted): they stay mapped for the rest of the process.
    keep: Cell<bool>,
    /// The send buffer lies in this never-written private mapping (address, length; see
    /// `map_unwritten`), registered with the library; unmapped after `send` is dropped.
    unwritten: Option<(usize, usize)>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        if !self.keep.get() {
            // SAFETY: dropped once, here; nothing uses them after.
            unsafe {
                ManuallyDrop::drop(&mut self.send);
                ManuallyDrop::drop(&mut self.recv);
            }
            if let Some((addr, len)) = self.unwritten {
                // SAFETY: our own mapping, whose registration was dropped just above;
                // nothing refers to it any more.
                unsafe { libc::munmap(addr as *mut libc::c_void, len) };
            }
        }
    }
}

/// Huge pages: ucx_perftest's allocation of a large buffer is aligned to one and advised
/// to use them.
const HUGE: usize = 2 << 20;

/// A send buffer as ucx_perftest allocates it over tcp (`ucp_mem_map` with its "thp"
/// method, once a huge-page SysV segment is refused): private anonymous memory, aligned to
/// 2 MiB and advised to use huge pages when it is that large, and never written, so that
/// its pages read as the kernel's zero page and take no memory. Registered with the
/// library; returns the registration and the mapping to unmap after it.
fn map_unwritten(
    ctx: &courier::Context,
    len: usize,
    what: impl FnOnce() -> String,
) -> CliResult<(Memory, (usize, usize))> {
    let len = len.max(8);
    let huge = len >= HUGE;
    let span = if huge { len.saturating_add(HUGE) } else { len };
    // SAFETY: a fresh private anonymous mapping; no Rust reference points into it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(CliError::run(format!(
            "cannot allocate {len} bytes of host memory for the {}: {}",
            what(),
            std::io::Error::last_os_error()
        )));
    }
    let mut addr = base as usize;
    if huge {
        addr = addr.next_multiple_of(HUGE);
        // SAFETY: [addr, addr + len) lies inside our mapping (`span` has a huge page of
        // room for the alignment). Advice only: a kernel without huge pages ignores it.
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    }
    // SAFETY: [addr, addr + len) lies inside our own mapping, which is unmapped only after
    // the `Memory` (the caller keeps the pair and drops the Memory first); the benchmark
    // touches it only through raw pointers.
    let params = unsafe { courier::MemMapParams::register(addr as *mut u8, len) };
    match ctx.mem_map(params) {
        Ok(m) => Ok((m, (base as usize, span))),
        Err(e) => {
            // SAFETY: our mapping, registered nowhere.
            unsafe { libc::munmap(base, span) };
            Err(CliError::run(format!(
                "cannot register the {}: {e}",
                what()
            )))
        }
    }
}

impl Buffers {
    /// The buffers of `p`, with `recv_slots` receive buffers (see `recv_slots`).
    ///
    /// As ucx_perftest's, they are mapped and left as they are: the warm-up's first
    /// message takes their pages (a never-written send buffer takes none). Only a run that
    /// checks the data (`--check`) writes the pattern into the send buffer and zeroes the
    /// receive buffers first.
    pub(super) fn new(link: &Link, p: &Params, recv_slots: usize) -> CliResult<Buffers> {
        let what = || buffers_what(p);
        let size = p.msg_size();
        let recv_len = size.checked_mul(recv_slots.max(1)).ok_or_else(|| {
            CliError::run(format!(
                "cannot allocate the {}: message size × window overflows",
                what()
            ))
        })?;
        // The send pattern first: a size the allocator refuses ends here, before anything
        // is mapped.
        let data: Option<Vec<u8>> = if p.check {
            let mut d: Vec<u8> = try_vec(size, what)?;
            d.extend((0..size).map(pattern));
            Some(d)
        } else {
            None
        };
        let ctx = link.worker.context();
        // Over tcp, the send buffer is ucx_perftest's (`map_unwritten`). On shared memory
        // ucx_perftest's is a shared segment, as the library allocates it here (and a peer
        // on this host copies straight out of it).
        let tcp = link.ep.transport() == Some("tcp");
        let (send, unwritten) = if data.is_none() && p.mem[0] == MemKind::Host && tcp {
            let (m, u) = map_unwritten(ctx, size, what)?;
            (m, Some(u))
        } else {
            (rma::map_buffer(ctx, p.mem[0], size, what)?, None)
        };
        let recv = rma::map_buffer(ctx, p.mem[1], recv_len, what)?;
        if let Some(data) = data {
            // Through the library, as device memory would need (`--check` refuses it).
            rma::fill(&send, 0, &data)?;
            drop(data);
            rma::zero(&recv, recv_len)?;
        }
        let mut bounds = try_vec(p.sizes.len(), what)?;
        let mut off = 0;
        for &s in &p.sizes {
            bounds.push((off, s));
            off += s;
        }
        Ok(Buffers {
            send: ManuallyDrop::new(send),
            recv: ManuallyDrop::new(recv),
            size,
            slots: recv_slots.max(1),
            bounds,
            keep: Cell::new(false),
            unwritten,
        })
    }

    fn data(&self) -> &[u8] {
        // SAFETY: the send region holds `size` initialized bytes (mapped memory is zeroed
        // by the system, or written by `new`) and lives as long as self; nothing writes it
        // after `new`.
        unsafe { std::slice::from_raw_parts(self.send.as_ptr(), self.size) }
    }

    /// The first of `n` receive buffers in a row, each `size` bytes; an error if fewer
    /// were mapped (a test that would write past them).
    fn recv_base(&self, n: usize) -> CliResult<*mut u8> {
        if n > self.slots {
            return Err(CliError::run(format!(
                "internal error: {n} receive buffers wanted, {} mapped",
                self.slots
            )));
        }
        Ok(self.recv.as_ptr())
    }

    fn iov(&self) -> Vec<&[u8]> {
        let data = self.data();
        self.bounds.iter().map(|&(o, l)| &data[o..o + l]).collect()
    }
}

/// The receive buffers a side of `p` maps, as ucx_perftest and OSU map them: one, into
/// which every receive of a window lands (their contents are not looked at), unless the
/// data is checked or the receives of a window go to slots of their own (`tag_bibw` and
/// `tag_win_bw`, whose windows are bounded by the sweep); the client receives only in
/// `tag_bibw`.
pub(super) fn recv_slots(p: &Params, server: bool) -> usize {
    let w = p.window.max(1);
    match p.test {
        TestKind::TagBibw => w,
        TestKind::TagWinBw if server => w,
        TestKind::TagBw | TestKind::TagSyncBw if server && p.check => w,
        _ => 1,
    }
}

/// What the message buffers of `p` are, for errors: `message buffers (-s 64, -O 32)`.
pub(in crate::perf) fn buffers_what(p: &Params) -> String {
    let sizes: Vec<String> = p.sizes.iter().map(|s| s.to_string()).collect();
    format!("message buffers (-s {}, -O {})", sizes.join(","), p.window)
}

/// An empty vector with room for `n` elements, or why not: every vector whose length the
/// test's parameters set (a window, a message) is allocated so, so that a size the
/// allocator refuses is an error naming `what()`, not an abort.
pub(in crate::perf) fn try_vec<T>(n: usize, what: impl FnOnce() -> String) -> CliResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        CliError::run(format!(
            "cannot allocate {} bytes for the {}: {e}",
            n.saturating_mul(std::mem::size_of::<T>()),
            what()
        ))
    })?;
    Ok(v)
}

/// `n` empty slots of a window of requests (see `try_vec`).
pub(in crate::perf) fn try_ring<T>(
    n: usize,
    what: impl FnOnce() -> String,
) -> CliResult<Vec<Option<T>>> {
    let mut v = try_vec(n, what)?;
    v.resize_with(n, || None);
    Ok(v)
}

/// A receive slot of `b.recv`, with a lifetime of the caller's choosing.
///
/// # Safety
/// `base` must point to a live buffer of at least `(slot + 1) * size` bytes that outlives
/// `'a`, and no two live slices may overlap (one request per slot at a time).
#[inline]
pub(super) unsafe fn slot<'a>(base: *mut u8, slot: usize, size: usize) -> &'a mut [u8] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts_mut(base.add(slot * size), size) }
}

// ---------------------------------------------------------------------------------------
// Active-message receive side
// ---------------------------------------------------------------------------------------

pub(super) struct AmState {
    count: AtomicU64,
    rndv: Mutex<VecDeque<AmRndv>>,
    has_rndv: AtomicBool,
    bad: AtomicBool,
}

pub(super) fn setup_am(link: &Link, p: &Params, id: u16) -> CliResult<Option<Arc<AmState>>> {
    if !matches!(p.test, TestKind::AmLat | TestKind::AmBw) {
        return Ok(None);
    }
    let st = Arc::new(AmState {
        count: AtomicU64::new(0),
        rndv: Mutex::new(VecDeque::new()),
        has_rndv: AtomicBool::new(false),
        bad: AtomicBool::new(false),
    });
    let s = st.clone();
    let check = p.check;
    link.worker
        .am_set_handler(id, move |m| {
            if m.is_rndv() {
                if let Some(d) = m.take_rndv() {
                    s.rndv
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(d);
                    s.has_rndv.store(true, Ordering::Release);
                }
                return;
            }
            if check && !verify(m.data()) {
                s.bad.store(true, Ordering::Relaxed);
            }
            // The count is written only on the one thread that progresses the worker (here
            // and in wait_count): a plain increment, not a locked read-modify-write per
            // message.
            s.count
                .store(s.count.load(Ordering::Relaxed) + 1, Ordering::Release);
        })
        .map_err(|e| CliError::run(format!("cannot set the active-message handler: {e}")))?;
    Ok(Some(st))
}

impl AmState {
    /// Progress until at least `n` messages arrived (receiving rendezvous data into `buf`).
    fn wait_count(&self, link: &Link, n: u64, buf: &mut [u8], check: bool) -> CliResult<()> {
        let mut idle = Idle::default();
        while self.count.load(Ordering::Acquire) < n {
            if self.has_rndv.load(Ordering::Acquire) {
                let d = {
                    let mut q = self.rndv.lock().unwrap_or_else(|e| e.into_inner());
                    let d = q.pop_front();
                    if q.is_empty() {
                        self.has_rndv.store(false, Ordering::Release);
                    }
                    d
                };
                if let Some(d) = d {
                    let len = d.len().min(buf.len());
                    let mut r =
                        // SAFETY: the request is waited for, or dropped (which waits), before its
                        // buffer is used again or goes; it is never forgotten.
                        link.check(unsafe { link.worker.am_recv_data_nb(d, &mut buf[..len]) })?;
                    link.wait(&mut r)?;
                    drop(r);
                    if check && !verify(&buf[..len]) {
                        self.bad.store(true, Ordering::Relaxed);
                    }
                    self.count
                        .store(self.count.load(Ordering::Relaxed) + 1, Ordering::Release);
                    continue;
                }
            }
            link.poll(&mut idle)?;
        }
        if self.bad.load(Ordering::Relaxed) {
            return Err(CliError::run(format!(
                "data check failed: an active message from {} had wrong contents",
                link.peer
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Sending one message of the test's kind
// ---------------------------------------------------------------------------------------

/// One message of a test: its kind, its bytes (`iov`, when it has more than one part, is
/// what goes), its tag and its active-message id.
#[derive(Clone, Copy)]
pub(super) struct Outgoing<'a, 'b> {
    kind: TestKind,
    data: &'a [u8],
    iov: &'b [&'a [u8]],
    tag: u64,
    am_id: u16,
}

impl<'a, 'b> Outgoing<'a, 'b> {
    /// A message of `kind` with tag 0 and active-message id 0.
    pub(super) fn new(kind: TestKind, data: &'a [u8], iov: &'b [&'a [u8]]) -> Self {
        Outgoing {
            kind,
            data,
            iov,
            tag: 0,
            am_id: 0,
        }
    }

    pub(super) fn tag(self, tag: u64) -> Self {
        Outgoing { tag, ..self }
    }

    fn am(self, am_id: u16) -> Self {
        Outgoing { am_id, ..self }
    }
}

#[inline]
pub(super) fn send<'a>(link: &Link, m: Outgoing<'a, '_>) -> CliResult<Request<'a>> {
    let Outgoing {
        kind,
        data,
        iov,
        tag,
        am_id,
    } = m;
    let r = match kind {
        TestKind::TagLat | TestKind::TagBw | TestKind::TagBibw | TestKind::TagWinBw => {
            if iov.len() > 1 {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { link.ep.tag_send_iov_nb(iov, tag) }
            } else {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { link.ep.tag_send_nb(data, tag) }
            }
        }
        TestKind::TagSyncLat | TestKind::TagSyncBw => {
            // The library has no synchronous IOV send: the contiguous copy goes instead.
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { link.ep.tag_send_sync_nb(data, tag) }
        }
        TestKind::AmLat | TestKind::AmBw => {
            let flags = AmFlags {
                reply: kind == TestKind::AmLat,
                ..AmFlags::default()
            };
            if iov.len() > 1 {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { link.ep.am_send_iov_nb(am_id, &[], iov, flags) }
            } else {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { link.ep.am_send_nb(am_id, &[], data, flags) }
            }
        }
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        TestKind::StreamLat | TestKind::StreamBw => unsafe { link.ep.stream_send_nb(data) },
        t => {
            return Err(CliError::run(format!(
                "{} is a one-sided test: it sends no messages",
                t.name()
            )));
        }
    };
    link.check(r)
}

/// Start one message of a ping-pong test as `ucx_perftest` does: a send the library
/// finished inside the call (every eager one) gives no request (`None`), so none is made,
/// tested or dropped; one still in flight gives its request. The gathered (IOV) form and
/// the other tests go through `send`.
#[inline]
fn send_start<'a>(link: &Link, m: Outgoing<'a, '_>) -> CliResult<Option<Request<'a>>> {
    if m.iov.len() > 1 || !matches!(m.kind, TestKind::TagLat | TestKind::AmLat) {
        return send(link, m).map(Some);
    }
    let buf = courier::Buf::One((m.data.as_ptr() as usize, m.data.len()));
    // SAFETY: a send still in flight becomes a `Request` borrowing `data`, below.
    let started = unsafe {
        if m.kind == TestKind::AmLat {
            let flags = AmFlags {
                reply: true,
                ..AmFlags::default()
            };
            link.ep
                .am_send_raw(m.am_id, &[], buf, flags, courier::Callback::None)
        } else {
            link.ep
                .tag_send_raw(buf, m.tag, false, courier::Callback::None)
        }
    };
    // SAFETY: `started` came with `data`, which lives for 'a.
    unsafe { link.in_flight_raw(started) }
}

/// `send_start`, then wait for the send to finish.
#[inline]
fn send_and_wait(link: &Link, m: Outgoing<'_, '_>) -> CliResult<()> {
    if let Some(mut r) = send_start(link, m)? {
        link.wait(&mut r)?;
    }
    Ok(())
}

pub(super) fn check_tag(link: &Link, p: &Params, buf: &[u8], info: &Info) -> CliResult<()> {
    if info.length != buf.len() {
        return Err(CliError::run(format!(
            "message from {} has {} bytes, expected {}",
            link.peer,
            info.length,
            buf.len()
        )));
    }
    if p.check && !verify(buf) {
        return Err(CliError::run(format!(
            "data check failed: a message from {} had wrong contents",
            link.peer
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Client side (measures)
// ---------------------------------------------------------------------------------------

/// Run `p` as the client; returns the final row.
pub fn run_client(
    link: &Link,
    p: &Params,
    meter: &mut Meter<'_>,
    side: Option<rma::Side>,
) -> CliResult<crate::perf::report::Row> {
    if let Some(side) = side {
        return rma::run_client(link, p, meter, side);
    }
    let b = Buffers::new(link, p, recv_slots(p, false))?;
    let am = setup_am(link, p, AM_PONG)?;
    let total = p.total();
    let warm = p.warmup;
    let size = b.size;
    let rbase = b.recv_base(1)?;
    let iov = b.iov();
    let data = b.data();
    if total == 0 {
        return Ok(meter.finish(Instant::now()));
    }
    match p.test {
        TestKind::TagLat | TestKind::TagSyncLat | TestKind::StreamLat => {
            let stream = p.test == TestKind::StreamLat;
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t, i);
                }
                // SAFETY: slot 0 of b.recv; the request is dropped within the iteration.
                let rb = unsafe { slot(rbase, 0, size) };
                if p.check {
                    rb.fill(0);
                }
                // Send, then post the receive for the answer, as ucx_perftest does: the
                // answer cannot arrive before a one-way trip, and posting takes less.
                let sr = send_start(link, Outgoing::new(p.test, data, &iov).tag(TAG_PING))?;
                let mut rr = if stream {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    link.check(unsafe { link.ep.stream_recv_exact_nb(rb) })?
                } else {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    link.check(unsafe { link.worker.tag_recv_nb(rb, TAG_PONG, u64::MAX) })?
                };
                if let Some(mut sr) = sr {
                    link.wait(&mut sr)?;
                }
                let info = link.wait(&mut rr)?;
                drop(rr);
                if !stream || p.check {
                    // SAFETY: as above; the receive finished.
                    check_tag(
                        link,
                        p,
                        unsafe { slot(rbase, 0, size) },
                        &if stream {
                            Info {
                                length: size,
                                ..Info::default()
                            }
                        } else {
                            info
                        },
                    )?;
                }
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        TestKind::AmLat => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count inside this loop.
            let rb = unsafe { slot(rbase, 0, size) };
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t, i);
                }
                send_and_wait(link, Outgoing::new(p.test, data, &iov).am(AM_PING))?;
                am.wait_count(link, i + 1, rb, p.check)?;
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        TestKind::TagBw | TestKind::TagSyncBw | TestKind::AmBw | TestKind::StreamBw => {
            // As `send`: the IOV form where the library has one (tag and active messages;
            // no synchronous or stream IOV send), the contiguous copy otherwise.
            let gather = iov.len() > 1 && matches!(p.test, TestKind::TagBw | TestKind::AmBw);
            let buf = if gather {
                courier::Buf::Many(iov.iter().map(|s| (s.as_ptr() as usize, s.len())).collect())
            } else {
                courier::Buf::One((data.as_ptr() as usize, data.len()))
            };
            let (row, in_flight) = counted_sends(link, p, meter, &buf);
            b.keep.set(in_flight);
            row
        }
        TestKind::TagBibw | TestKind::TagWinBw => {
            // Room for a window's requests, kept across windows: a window allocates nothing.
            let mut sends: Vec<Request<'_>> = try_vec(p.window.max(1), || buffers_what(p))?;
            let (mut recvs, rbase): (Vec<Request<'_>>, _) = if p.test == TestKind::TagBibw {
                let w = p.window.max(1);
                (try_vec(w, || buffers_what(p))?, b.recv_base(w)?)
            } else {
                (Vec::new(), rbase)
            };
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t, i);
                }
                if p.test == TestKind::TagWinBw {
                    win_round_send(link, p, data, &iov, &mut sends)?;
                } else {
                    let tags = (TAG_PING, TAG_PONG);
                    bibw_round(link, p, (data, &iov), rbase, tags, &mut sends, &mut recvs)?;
                }
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        t => Err(CliError::run(format!(
            "{}: a one-sided test started without remote keys",
            t.name()
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// Server side (answers, does not measure)
// ---------------------------------------------------------------------------------------

pub(super) fn run_server(
    link: &Link,
    p: &Params,
    b: &Buffers,
    am: Option<Arc<AmState>>,
) -> CliResult<()> {
    let total = p.total();
    let size = b.size;
    let w = p.window.max(1);
    // The receive slots the server of `p` mapped: each arm below stays inside them.
    let rbase = b.recv_base(recv_slots(p, true))?;
    let iov = b.iov();
    let data = b.data();
    match p.test {
        TestKind::TagLat | TestKind::TagSyncLat | TestKind::StreamLat => {
            let stream = p.test == TestKind::StreamLat;
            for _ in 0..total {
                // SAFETY: slot 0; the request is dropped within the iteration.
                let rb = unsafe { slot(rbase, 0, size) };
                if p.check {
                    rb.fill(0);
                }
                let mut rr = if stream {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    link.check(unsafe { link.ep.stream_recv_exact_nb(rb) })?
                } else {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    link.check(unsafe { link.worker.tag_recv_nb(rb, TAG_PING, u64::MAX) })?
                };
                let info = link.wait(&mut rr)?;
                drop(rr);
                if !stream || p.check {
                    // SAFETY: as above.
                    check_tag(
                        link,
                        p,
                        unsafe { slot(rbase, 0, size) },
                        &if stream {
                            Info {
                                length: size,
                                ..Info::default()
                            }
                        } else {
                            info
                        },
                    )?;
                }
                send_and_wait(link, Outgoing::new(p.test, data, &iov).tag(TAG_PONG))?;
            }
        }
        TestKind::AmLat => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count.
            let rb = unsafe { slot(rbase, 0, size) };
            for i in 0..total {
                am.wait_count(link, i + 1, rb, p.check)?;
                send_and_wait(link, Outgoing::new(p.test, data, &iov).am(AM_PONG))?;
            }
        }
        TestKind::AmBw => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count.
            let rb = unsafe { slot(rbase, 0, size) };
            am.wait_count(link, total, rb, p.check)?;
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBw | TestKind::TagSyncBw if !p.check => {
            let (r, posted) = counted_recvs(link, total, w, rbase, size);
            // A failed run left receives posted into the receive buffers.
            b.keep.set(posted);
            r?;
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBw | TestKind::TagSyncBw => {
            let mut ring: Vec<Option<Request<'_>>> = try_ring(w, || buffers_what(p))?;
            // As ucx_perftest: every receive of the window lands in the same buffer (its
            // contents are not looked at), unless the data is checked.
            let shared = !p.check;
            let post = |k: usize| -> CliResult<Request<'_>> {
                let at = if shared { 0 } else { k * size };
                let buf = courier::Buf::One((rbase as usize + at, size));
                // SAFETY: inside b.recv, which outlives the ring; with `shared`, the
                // receives overwrite one another's bytes, which nobody reads.
                let s = link.check(unsafe {
                    link.worker
                        .tag_recv_raw(buf, TAG_PING, u64::MAX, courier::Callback::None)
                })?;
                // SAFETY: as above.
                Ok(unsafe { link.worker.request_for(s) })
            };
            for (k, s) in ring
                .iter_mut()
                .enumerate()
                .take(total.min(w as u64) as usize)
            {
                *s = Some(post(k)?);
            }
            for i in 0..total {
                let k = (i % w as u64) as usize;
                let mut r = ring[k].take().expect("posted");
                let info = link.wait(&mut r)?;
                drop(r);
                // SAFETY: slot k (or the shared slot 0), its request finished.
                check_tag(
                    link,
                    p,
                    unsafe { slot(rbase, if shared { 0 } else { k }, size) },
                    &info,
                )?;
                if i + (w as u64) < total {
                    if p.check {
                        // SAFETY: as above.
                        unsafe { slot(rbase, k, size) }.fill(0);
                    }
                    ring[k] = Some(post(k)?);
                }
            }
            drop(ring);
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::StreamBw => {
            // SAFETY: slot 0; one receive at a time.
            let rb = unsafe { slot(rbase, 0, size) };
            for _ in 0..total {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut rr = link.check(unsafe { link.ep.stream_recv_exact_nb(rb) })?;
                link.wait(&mut rr)?;
                drop(rr);
                if p.check && !verify(rb) {
                    return Err(CliError::run(format!(
                        "data check failed: stream bytes from {} had wrong contents",
                        link.peer
                    )));
                }
            }
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBibw => {
            let mut sends: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            let mut recvs: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            for _ in 0..total {
                let tags = (TAG_PONG, TAG_PING);
                bibw_round(link, p, (data, &iov), rbase, tags, &mut sends, &mut recvs)?;
            }
        }
        TestKind::TagWinBw => {
            let mut recvs: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            for _ in 0..total {
                win_round_recv(link, p, rbase, &mut recvs)?;
            }
        }
        t => {
            return Err(CliError::run(format!(
                "{}: a one-sided test started without remote keys",
                t.name()
            )));
        }
    }
    Ok(())
}
