//! Instruction counts of the small-message round trips over tcp, without a second process:
//! two workers of one process joined by a tcp connection over 127.0.0.1, driven by one
//! thread, so every count is the same from run to run (a frame written on loopback is in
//! the peer's socket when `sendmsg` returns; nobody spins on a peer). Each measured step is
//! a function of its own, for callgrind:
//!
//! ```sh
//! cargo build --release --example tcpcost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='tcpcost::step_*' \
//!     target/release/examples/tcpcost 1000
//! callgrind_annotate --inclusive=yes callgrind.out.* | grep step_
//! ```
//!
//! Worker `a` is the origin (it issues fetch-and-adds and tag sends), worker `b` the target
//! (its progress runs the atomic and answers, and echoes tag messages). Counts are per call
//! of each step; divide by the `n` given. Without valgrind it prints nanoseconds per step
//! (system calls included), for a rough look.

use std::time::Instant;

use courier::*;

mod common;
use common::Linked;

const TAG: u64 = 7;

/// Issue one fetch-and-add (up to the `sendmsg` that carries it).
#[inline(never)]
fn step_fadd_issue(ep: &Endpoint, key: &RemoteKey, at: u64) -> Result<Request<'static>> {
    ep.atomic(AtomicOp::Add, 1, 0, at, key, false)
}

/// Progress the target until it has run the atomic and answered.
#[inline(never)]
fn step_target(w: &Worker) -> usize {
    loop {
        let n = w.progress();
        if n != 0 {
            return n;
        }
    }
}

/// Progress the origin until the atomic completes; its old value.
#[inline(never)]
fn step_fadd_complete(w: &Worker, r: &mut Request<'_>) -> Result<u64> {
    loop {
        if let Some(done) = r.test() {
            return done.as_ref().map(|i| i.value).map_err(|e| e.clone());
        }
        w.progress();
    }
}

/// Send one 8-byte tag message.
#[inline(never)]
fn step_tag_send(ep: &Endpoint, data: &[u8]) -> Result<()> {
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.tag_send_nb(data, TAG) }?;
    while r.test().is_none() {}
    Ok(())
}

/// Post a receive and progress until the message is in it.
#[inline(never)]
fn step_tag_recv(w: &Worker, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { w.tag_recv_nb(buf, TAG, u64::MAX) }?;
    loop {
        if let Some(done) = r.test() {
            return done.as_ref().map(|i| i.length).map_err(|e| e.clone());
        }
        w.progress();
    }
}

/// `n` progress calls that find nothing (each reads the socket once).
#[inline(never)]
fn step_idle(w: &Worker, n: usize) -> usize {
    (0..n).map(|_| w.progress()).sum()
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
    } = common::linked("tcp")?;

    let mem = ctx_b.mem_map(MemMapParams::allocate(4096))?;
    let key = ab.rkey_unpack(&mem.pack_rkey()?)?;
    println!("atomic path: {}", key.path());
    let at = mem.as_ptr() as u64;

    let (mut t_issue, mut t_target, mut t_done) = (0u128, 0u128, 0u128);
    for i in 0..n as u64 {
        let t0 = Instant::now();
        let mut r = step_fadd_issue(&ab, &key, at)?;
        let t1 = Instant::now();
        step_target(&b);
        let t2 = Instant::now();
        let old = step_fadd_complete(&a, &mut r)?;
        let t3 = Instant::now();
        if old != i {
            return Err(Error::new(
                Status::IoError,
                "fetch-and-add returned a wrong value",
            ));
        }
        t_issue += (t1 - t0).as_nanos();
        t_target += (t2 - t1).as_nanos();
        t_done += (t3 - t2).as_nanos();
    }
    let per = |t: u128| t as f64 / n as f64;
    println!(
        "natively: fadd issue {:.0} ns, target {:.0} ns, completion {:.0} ns",
        per(t_issue),
        per(t_target),
        per(t_done)
    );

    let data = *b"tcpcost!";
    let (mut buf_a, mut buf_b) = ([0u8; 8], [0u8; 8]);
    for _ in 0..n {
        step_tag_send(&ab, &data)?;
        step_tag_recv(&b, &mut buf_b)?;
        step_tag_send(&ba, &buf_b)?;
        step_tag_recv(&a, &mut buf_a)?;
    }

    let t = Instant::now();
    step_idle(&a, n);
    println!(
        "natively: idle progress {:.0} ns per call",
        t.elapsed().as_nanos() as f64 / n as f64
    );
    println!("done: {n} of each");
    Ok(())
}
