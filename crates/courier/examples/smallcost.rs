//! Instruction counts of the small-message paths over shared memory, without a second
//! process: two workers of one process joined by a shm link, driven by one thread after
//! set-up, so every count is the same from run to run (no spinning on a peer). Each
//! measured step is a function of its own, for callgrind:
//!
//! ```sh
//! cargo build --release --example smallcost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='smallcost::step_*' \
//!     target/release/examples/smallcost 1000
//! callgrind_annotate --inclusive=yes callgrind.out.* | grep step_
//! ```
//!
//! Worker `a` (single-threaded, as applications use it) is the one measured; worker `b`
//! (thread-safe, progressed by a helper thread while the link comes up) is its peer.
//! Counts are per call of each step; divide by the `n` given.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use courier::*;

mod common;
use common::Linked;

const TAG: u64 = 7;

/// `n` eager 8-byte tag sends on `ep` (the FIFO must have room for them).
#[inline(never)]
fn step_tag_send(ep: &Endpoint, n: usize, data: &[u8]) -> Result<()> {
    for _ in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { ep.tag_send_nb(data, TAG) }?;
        drop(r);
    }
    Ok(())
}

/// Post `n` tag receives.
#[inline(never)]
fn step_tag_post<'a>(w: &Worker, bufs: &'a mut [[u8; 8]]) -> Result<Vec<Request<'a>>> {
    let mut v = Vec::with_capacity(bufs.len());
    for b in bufs.iter_mut() {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        v.push(unsafe { w.tag_recv_nb(b, TAG, u64::MAX) }?);
    }
    Ok(v)
}

/// Progress until the posted receives complete, collecting each.
#[inline(never)]
fn step_tag_complete(w: &Worker, reqs: Vec<Request<'_>>) -> Result<usize> {
    let mut got = 0;
    for mut r in reqs {
        while !r.is_done() {
            w.progress();
        }
        got += r.wait()?.length;
    }
    Ok(got)
}

/// Progress until `n` frames are in (unexpected messages), then receive them.
#[inline(never)]
fn step_tag_unexpected(w: &Worker, n: usize) -> Result<usize> {
    let mut got = 0;
    let mut buf = [0u8; 8];
    for _ in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { w.tag_recv_nb(&mut buf, TAG, u64::MAX) }?;
        while !r.is_done() {
            w.progress();
        }
        got += r.wait()?.length;
    }
    Ok(got)
}

/// The count a counted receive's callback adds to (`step_tag_counted`).
fn count_one(user: usize, r: Result<Info>, _info: Info) {
    // SAFETY: `user` is the address of the `AtomicU64` `step_tag_counted` borrows for as
    // long as its receives are posted.
    let c = unsafe { &*(user as *const AtomicU64) };
    if r.is_ok() {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Post `bufs.len()` receives finished by a counting callback, then progress until all
/// are counted: what `courier perf -t tag_bw`'s receiver does for each message.
#[inline(never)]
fn step_tag_counted(w: &Worker, bufs: &mut [[u8; 8]], count: &AtomicU64) -> Result<()> {
    let start = count.load(Ordering::Relaxed);
    let user = count as *const AtomicU64 as usize;
    let mut at_once = 0;
    for b in bufs.iter_mut() {
        let buf = Buf::One((b.as_mut_ptr() as usize, b.len()));
        // SAFETY: the buffers outlive the receives (all finish before this returns).
        let s = unsafe { w.tag_recv_raw(buf, TAG, u64::MAX, Callback::Raw(count_one, user))? };
        if let Started::Done(_) = s {
            at_once += 1;
        }
    }
    while count.load(Ordering::Relaxed) + at_once < start + bufs.len() as u64 {
        w.progress();
    }
    Ok(())
}

/// `n` idle progress calls.
#[inline(never)]
fn step_idle(w: &Worker, n: usize) -> usize {
    (0..n).map(|_| w.progress()).sum()
}

/// Progress until `n` active messages were handled.
#[inline(never)]
fn step_am_recv(w: &Worker, count: &AtomicU64, n: u64) {
    let start = count.load(Ordering::Relaxed);
    while count.load(Ordering::Relaxed) < start + n {
        w.progress();
    }
}

/// `n` eager 8-byte active-message sends.
#[inline(never)]
fn step_am_send(ep: &Endpoint, n: usize, data: &[u8]) -> Result<()> {
    for _ in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ep.am_send_nb(1, &[], data, AmFlags::default()) }?);
    }
    Ok(())
}

/// How the echo steps answer: as a reply.
const REPLY: AmFlags = AmFlags {
    reply: true,
    rndv: false,
    eager: false,
};

/// One turn of an active-message ping-pong's answering side (`courier perf -t
/// ucp_am_lat`'s server): progress until the ping was handled (`count` reaches `want`),
/// then answer, as a reply. The send follows a progress call, so it takes the latency
/// path (a cell of its own), not the packed one.
#[inline(never)]
fn step_am_echo(
    w: &Worker,
    ep: &Endpoint,
    count: &AtomicU64,
    want: u64,
    data: &[u8],
) -> Result<()> {
    while count.load(Ordering::Acquire) < want {
        w.progress();
    }
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    drop(unsafe { ep.am_send_nb(1, &[], data, REPLY) }?);
    Ok(())
}

/// `step_am_echo` as `courier perf` answers: the raw send of the segment `seg` (no request
/// made for a send that finished at once).
#[inline(never)]
fn step_am_echo_raw(
    w: &Worker,
    ep: &Endpoint,
    count: &AtomicU64,
    want: u64,
    seg: (usize, usize),
) -> Result<()> {
    while count.load(Ordering::Acquire) < want {
        w.progress();
    }
    let buf = Buf::One(seg);
    // SAFETY: the caller's buffer outlives the call, and an eager send over shared memory
    // finishes inside it (checked below).
    match unsafe { ep.am_send_raw(1, &[], buf, REPLY, Callback::None)? } {
        Started::Done(_) => Ok(()),
        Started::Pending(_) => Err(Error::msg(
            Status::InvalidParam,
            "send did not finish at once",
        )),
    }
}

/// One turn of a tag ping-pong's answering side (`courier perf -t tag_lat`'s server):
/// post the receive, progress until it completes, answer.
#[inline(never)]
fn step_tag_echo(w: &Worker, ep: &Endpoint, buf: &mut [u8; 8], data: &[u8]) -> Result<()> {
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { w.tag_recv_nb(buf, TAG, u64::MAX) }?;
    while !r.is_done() {
        w.progress();
    }
    r.wait()?;
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    drop(unsafe { ep.tag_send_nb(data, TAG) }?);
    Ok(())
}

/// `n` 8-byte puts into the peer's region.
#[inline(never)]
fn step_put(ep: &Endpoint, key: &RemoteKey, at: u64, n: usize, data: &[u8]) -> Result<()> {
    for _ in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ep.put_nb(data, at, key) }?);
    }
    Ok(())
}

/// `n` 8-byte puts-with-signal into the peer's region (the signal word in the same region).
#[inline(never)]
fn step_put_signal(ep: &Endpoint, key: &RemoteKey, at: u64, n: usize, data: &[u8]) -> Result<()> {
    for i in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ep.put_signal_nb(data, at, key, at + 64, key, i as u64, SignalOp::Set) }?);
    }
    Ok(())
}

fn drain(w: &Worker, mut done: impl FnMut() -> bool) {
    while !done() {
        w.progress();
    }
}

fn main() -> Result<()> {
    let n = common::count_arg();
    let Linked {
        ctx_b,
        a,
        b,
        ab,
        ba,
        ..
    } = common::linked("shm")?;

    let data = *b"smallcst";
    let batch = 64; // well inside the FIFO
    let rounds = n.div_ceil(batch);

    // a sends; b drains what a sent (not measured).
    let seen = Arc::new(AtomicU64::new(0));
    {
        let s = seen.clone();
        b.am_set_handler(1, move |_m| {
            s.fetch_add(1, Ordering::Relaxed);
        })?;
    }
    for _ in 0..rounds {
        step_tag_send(&ab, batch, &data)?;
        let mut bufs = vec![[0u8; 8]; batch];
        let reqs: Vec<Request<'_>> = bufs
            .iter_mut()
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            .map(|x| unsafe { b.tag_recv_nb(x, TAG, u64::MAX) })
            .collect::<Result<_>>()?;
        for mut r in reqs {
            drain(&b, || r.is_done());
        }
    }

    // b sends; a posts first (expected) and completes.
    for _ in 0..rounds {
        let mut bufs = vec![[0u8; 8]; batch];
        let reqs = step_tag_post(&a, &mut bufs)?;
        for _ in 0..batch {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            drop(unsafe { ba.tag_send_nb(&data, TAG) }?);
        }
        step_tag_complete(&a, reqs)?;
    }

    // a posts receives finished by a callback, b sends, a progresses until all are counted.
    let counted = AtomicU64::new(0);
    for _ in 0..rounds {
        let mut bufs = vec![[0u8; 8]; batch];
        // The sends go first and wait in the FIFO: nothing progresses `a` before its
        // receives are posted, so they are matched as expected ones.
        for _ in 0..batch {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            drop(unsafe { ba.tag_send_nb(&data, TAG) }?);
        }
        step_tag_counted(&a, &mut bufs, &counted)?;
    }

    // b sends first; a receives from the unexpected queue.
    for _ in 0..rounds {
        for _ in 0..batch {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            drop(unsafe { ba.tag_send_nb(&data, TAG) }?);
        }
        step_tag_unexpected(&a, batch)?;
    }

    // Active messages both ways.
    let got = Arc::new(AtomicU64::new(0));
    {
        let g = got.clone();
        a.am_set_handler(1, move |_m| {
            g.fetch_add(1, Ordering::Relaxed);
        })?;
    }
    for _ in 0..rounds {
        for _ in 0..batch {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            drop(unsafe { ba.am_send_nb(1, &[], &data, AmFlags::default()) }?);
        }
        step_am_recv(&a, &got, batch as u64);
        let before = seen.load(Ordering::Relaxed);
        step_am_send(&ab, batch, &data)?;
        drain(&b, || seen.load(Ordering::Relaxed) >= before + batch as u64);
    }

    // Ping-pongs: b pings (not measured), a answers (measured), b takes the answer.
    let base = seen.load(Ordering::Relaxed);
    let t = std::time::Instant::now();
    for i in 0..n as u64 {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ba.am_send_nb(1, &[], &data, AmFlags::default()) }?);
        step_am_echo(&a, &ab, &got, got.load(Ordering::Relaxed) + 1, &data)?;
        drain(&b, || seen.load(Ordering::Relaxed) > base + i);
    }
    let am_turn_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let base = seen.load(Ordering::Relaxed);
    for i in 0..n as u64 {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ba.am_send_nb(1, &[], &data, AmFlags::default()) }?);
        let seg = (data.as_ptr() as usize, data.len());
        step_am_echo_raw(&a, &ab, &got, got.load(Ordering::Relaxed) + 1, seg)?;
        drain(&b, || seen.load(Ordering::Relaxed) > base + i);
    }
    let (mut buf, mut buf_b) = ([0u8; 8], [0u8; 8]);
    let t = std::time::Instant::now();
    for _ in 0..n {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        drop(unsafe { ba.tag_send_nb(&data, TAG) }?);
        step_tag_echo(&a, &ab, &mut buf, &data)?;
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { b.tag_recv_nb(&mut buf_b, TAG, u64::MAX) }?;
        drain(&b, || r.is_done());
    }

    let tag_turn_ns = t.elapsed().as_nanos() as f64 / n as f64;

    // Puts into b's allocated region (under valgrind, which cannot take the peer's segment,
    // they go through the link), and idle progress.
    let mem = ctx_b.mem_map(MemMapParams::allocate(4096))?;
    let key = ab.rkey_unpack(&mem.pack_rkey()?)?;
    println!("put path: {}", key.path());
    let at = mem.as_ptr() as u64;
    let t = std::time::Instant::now();
    step_put(&ab, &key, at, n, &data)?;
    let put_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let t = std::time::Instant::now();
    step_put_signal(&ab, &key, at, n, &data)?;
    let sig_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let t = std::time::Instant::now();
    step_idle(&a, n);
    let idle_ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "natively, both sides in one thread: AM round trip {am_turn_ns:.1} ns, tag round trip {tag_turn_ns:.1} ns"
    );
    println!(
        "natively: put {put_ns:.1} ns, put with signal {sig_ns:.1} ns, idle progress {idle_ns:.1} ns per call"
    );
    println!("done: {n} of each");
    Ok(())
}
