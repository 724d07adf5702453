//! Posted (non-fetching) atomics and sleeping signal waits between real processes.
//!
//! The set-ups are those of tests/rma_refusals.rs (their code is in tests/common): this binary
//! re-runs itself as a child with `COURIER_TEST_ROLE`. For posted atomics the parent owns
//! the memory and children connect, unpack the keys passed in their environment and post;
//! for the sleeping waits a child is the target, prints its port and keys, and measures
//! itself while the parent signals it.
//!
//! Paths: shared memory with allocated memory (mapped by the peer: CPU atomics), shared
//! memory with registered memory (the owner's progress carries the atomics out, their frames
//! on the shm FIFO), and tcp (the owner's progress).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::*;

// ----- transports and memory ----------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Net {
    Shm,
    Tcp,
}

impl Net {
    fn tls(self) -> &'static str {
        match self {
            Net::Shm => "all",
            Net::Tcp => "tcp",
        }
    }
    fn from_env() -> Net {
        match std::env::var("COURIER_TLS").unwrap().as_str() {
            "tcp" => Net::Tcp,
            _ => Net::Shm,
        }
    }
}

impl Transport for Net {
    fn env(self) -> Vec<(&'static str, String)> {
        vec![("COURIER_TLS", self.tls().to_string())]
    }
}

// ----- processes ----------------------------------------------------------------------------

/// Start a child acting on `keys` in memory of kind `kind`, as poster `index`.
fn spawn(o: &Owner, role: &str, net: Net, kind: Mem, keys: &[Vec<u8>], index: usize) -> Kid {
    o.spawn(
        role,
        net,
        keys,
        &[
            ("COURIER_TEST_MEM", kind.name().into()),
            ("COURIER_TEST_INDEX", index.to_string()),
        ],
    )
}

/// A child of [`spawn`]: connected, with the keys unpacked.
fn actor() -> Actor<Net> {
    common::actor(Net::from_env())
}

/// A child of [`spawn`]: which poster it is.
fn poster_index() -> usize {
    std::env::var("COURIER_TEST_INDEX")
        .unwrap()
        .parse()
        .unwrap()
}

/// The path the first key must take: CPU atomics on a same-host peer's allocated memory,
/// the owner's progress otherwise.
fn check_path(a: &Actor<Net>) {
    let path = a.rk[0].path();
    match (a.net, Mem::from_env()) {
        (Net::Shm, Mem::Alloc) => assert_eq!(path, "direct"),
        (Net::Shm, Mem::Reg) => assert!(
            path == "cma" || path == "remote",
            "registered memory on shm: path {path}"
        ),
        (Net::Tcp, _) => assert_eq!(path, "remote"),
    }
}

#[test]
fn child_entry() {
    run_child(&[
        ("poster", child_poster),
        ("refused", child_refused),
        ("waiter", child_waiter),
    ]);
}

// ----- many posters, one counter ------------------------------------------------------------

const POSTERS: usize = 3;
/// Adds each poster posts on each counter.
const ADDS: u64 = 3000;
/// Words of the region: a 64-bit counter, a 32-bit counter, and two bit words (64 and
/// 32 bits) in which poster `k` owns byte lane `k` for its and/or/xor.
const C64: usize = 0;
const C32: usize = 8;
const B64: usize = 16;
const B32: usize = 24;
const C64_INIT: u64 = 1_000_000;
/// Wraps around during the test.
const C32_INIT: u32 = 0xffff_ff00;
const B64_INIT: u64 = 0x1122_3344_5566_7788;
const B32_INIT: u32 = 0x99aa_bbcc;
const PLEN: usize = 4096;

/// Poster `k`'s bit operations, in order: (op, byte) on its lane, one every tenth add.
fn lane_ops(k: usize) -> Vec<(AtomicOp, u64)> {
    (0..ADDS / 10)
        .map(|j| {
            let v = (j * 37 + k as u64 * 11) & 0xff;
            match j % 3 {
                0 => (AtomicOp::Or, v),
                1 => (AtomicOp::Xor, v ^ 0x5a),
                _ => (AtomicOp::And, v | 0x81),
            }
        })
        .collect()
}

/// The operand of a lane op on the whole word: other lanes untouched.
fn lane_operand(op: AtomicOp, byte: u64, k: usize) -> u64 {
    let shift = 8 * k as u32;
    match op {
        AtomicOp::And => !(0xffu64 << shift) | (byte << shift),
        _ => byte << shift,
    }
}

/// Byte lane `k` of a word after poster `k`'s operations.
fn lane_final(init: u64, k: usize) -> u64 {
    let mut b = (init >> (8 * k)) & 0xff;
    for (op, v) in lane_ops(k) {
        b = match op {
            AtomicOp::Or => b | v,
            AtomicOp::Xor => b ^ v,
            AtomicOp::And => b & v,
            _ => unreachable!(),
        };
    }
    b
}

fn child_poster() {
    let a = actor();
    check_path(&a);
    let k = poster_index();
    let (base, _) = a.rk[0].bounds();
    let rk = &a.rk[0];
    let mut ops = lane_ops(k).into_iter();
    for j in 0..ADDS {
        a.ep.atomic_post(AtomicOp::Add, 1, base + C64 as u64, rk, false)
            .unwrap();
        a.ep.atomic_post(AtomicOp::Add, k as u64 + 1, base + C32 as u64, rk, true)
            .unwrap();
        if j % 10 == 9 {
            let (op, v) = ops.next().unwrap();
            a.ep.atomic_post(op, lane_operand(op, v, k), base + B64 as u64, rk, false)
                .unwrap();
            a.ep.atomic_post(op, lane_operand(op, v, k), base + B32 as u64, rk, true)
                .unwrap();
        }
        if j == ADDS / 2 {
            // A flush in the middle: confirmed so far, and the posts go on after it.
            a.ep.flush().unwrap();
        }
    }
    // Every post has been carried out at the owner when the flush returns.
    a.ep.flush().unwrap();
}

fn posted_by_many(net: Net, kind: Mem) {
    let o = Owner::new(net);
    let r = Region::new(&o.c, kind, PLEN, access::ALL);
    r.write(0, &pattern(PLEN, 7));
    r.word(C64).store(C64_INIT, Ordering::Relaxed);
    r.word(C32)
        .store(C32_INIT as u64 | (0xdead_beef << 32), Ordering::Relaxed);
    r.word(B64).store(B64_INIT, Ordering::Relaxed);
    r.word(B32)
        .store(B32_INIT as u64 | (0x0bad_f00d << 32), Ordering::Relaxed);
    let before = r.bytes().to_vec();
    let t0 = Instant::now();
    let mut kids: Vec<Kid> = (0..POSTERS)
        .map(|k| spawn(&o, "poster", net, kind, &[r.key()], k))
        .collect();
    serve(&o.w, &mut kids);
    let n = POSTERS as u64;
    let mut want = before;
    let c32 = C32_INIT.wrapping_add((ADDS * n * (n + 1) / 2) as u32);
    let (mut b64, mut b32) = (B64_INIT, B32_INIT as u64);
    for k in 0..POSTERS {
        b64 = (b64 & !(0xff << (8 * k))) | (lane_final(B64_INIT, k) << (8 * k));
        b32 = (b32 & !(0xff << (8 * k))) | (lane_final(B32_INIT as u64, k) << (8 * k));
    }
    want[C64..C64 + 8].copy_from_slice(&(C64_INIT + ADDS * n).to_le_bytes());
    want[C32..C32 + 4].copy_from_slice(&c32.to_le_bytes());
    want[B64..B64 + 8].copy_from_slice(&b64.to_le_bytes());
    want[B32..B32 + 4].copy_from_slice(&(b32 as u32).to_le_bytes());
    let got = r.bytes();
    assert_eq!(
        r.word(C64).load(Ordering::Acquire),
        C64_INIT + ADDS * n,
        "64-bit counter"
    );
    assert!(
        got == &want[..],
        "{POSTERS} posters over {net:?} ({kind:?}): {}; 64-bit bits {:#x} (want {b64:#x}), 32-bit counter {:#x} (want {c32:#x}), 32-bit bits {:#x} (want {:#x})",
        first_diff(got, &want),
        r.word(B64).load(Ordering::Acquire),
        r.word(C32).load(Ordering::Acquire) as u32,
        r.word(B32).load(Ordering::Acquire) as u32,
        b32 as u32
    );
    eprintln!(
        "{POSTERS} posters x {} posted atomics over {net:?} ({kind:?}) in {:?}",
        2 * ADDS + ADDS / 5,
        t0.elapsed()
    );
}

matrix! {
    posted_atomics_from_three_processes_shm_allocated: posted_by_many(Net::Shm, Mem::Alloc);
    posted_atomics_from_three_processes_shm_registered: posted_by_many(Net::Shm, Mem::Reg);
    posted_atomics_from_three_processes_tcp_allocated: posted_by_many(Net::Tcp, Mem::Alloc);
    posted_atomics_from_three_processes_tcp_registered: posted_by_many(Net::Tcp, Mem::Reg);
}

// ----- refusals -----------------------------------------------------------------------------

/// The counter the honest posts of the refusal test add to.
const RC: usize = 64;
/// How many honest adds of 1 the refusal test posts around the refused operations.
const HONEST_ADDS: u64 = 5;

/// A posted atomic that must be refused with `status`, the error saying why (`why`): at
/// once, or (only where the target decides: `deferred`) by the next flush, which then says
/// the target refused a posted atomic. Reported once.
fn refused(a: &Actor<Net>, r: Result<()>, status: Status, why: &str, deferred: bool, what: &str) {
    let e = match r {
        Err(e) => {
            assert!(
                !deferred,
                "{what}: refused at once ({e}); the target should decide"
            );
            assert!(
                e.detail().contains(why),
                "{what}: the error does not say why: {e}"
            );
            e
        }
        Ok(()) => {
            let e = match a.ep.flush() {
                Err(e) => e,
                Ok(()) => panic!("{what}: not refused"),
            };
            assert!(
                e.detail()
                    .contains("target refused an earlier posted atomic")
                    && e.detail().contains(status.as_str()),
                "{what}: the flush's error does not say what was refused, and why: {e}"
            );
            e
        }
    };
    assert_eq!(e.status(), status, "{what}: {e}");
    if let Err(e) = a.ep.flush() {
        panic!("{what}: a second error after the refusal: {e}");
    }
}

fn child_refused() {
    // rk[0]: T (all rights), rk[1]: NA (read and write, no atomics).
    let a = actor();
    check_path(&a);
    let (tb, tlen) = a.rk[0].bounds();
    let (nb, _) = a.rk[1].bounds();
    let t = &a.rk[0];
    let c = tb + RC as u64;
    // Only tcp leaves the owner's record to the owner: on shared memory this process reads
    // it, and refuses a forged key or a range past the region at once.
    let remote = a.net == Net::Tcp;
    let forged = a.ep.rkey_unpack(&forge_secret(&a.raw[0])).unwrap();
    let wide = a.ep.rkey_unpack(&forge_length(&a.raw[0], 1 << 20)).unwrap();
    let mut honest = 0u64;
    let mut post = |op, v, bits32| {
        a.ep.atomic_post(op, v, c, t, bits32).unwrap();
        honest += 1;
    };

    // Forged secret: between two honest posts, which still land.
    for bits32 in [false, true] {
        post(AtomicOp::Add, 1, false);
        let r = a.ep.atomic_post(AtomicOp::Add, 1000, c, &forged, bits32);
        post(AtomicOp::Add, 1, false);
        refused(
            &a,
            r,
            Status::InvalidKey,
            "forged",
            remote,
            &format!("posted add with a forged key (32-bit: {bits32})"),
        );
    }
    // A key claiming more than the region: the owner's record refuses past its end.
    for op in [AtomicOp::Add, AtomicOp::Xor] {
        let r = a.ep.atomic_post(op, 0xffff, tb + tlen, &wide, false);
        refused(
            &a,
            r,
            Status::OutOfRange,
            "outside",
            remote,
            &format!("posted {op:?} past the region with a key claiming 1 MiB"),
        );
    }
    // What the key itself shows is refused at once, whatever the path.
    for (addr, bits32) in [(tb + tlen, false), (tb + tlen, true), (tb - 4, true)] {
        refused(
            &a,
            a.ep.atomic_post(AtomicOp::Or, 1, addr, t, bits32),
            Status::OutOfRange,
            "outside",
            false,
            &format!("posted or at base{:+}", addr as i64 - tb as i64),
        );
    }
    refused(
        &a,
        a.ep.atomic_post(AtomicOp::Add, 1, nb, &a.rk[1], false),
        Status::AccessDenied,
        "remote atomic access",
        false,
        "posted add without the atomic right",
    );
    refused(
        &a,
        a.ep.atomic_post(AtomicOp::Add, 1, c + 4, t, false),
        Status::InvalidParam,
        "aligned",
        false,
        "unaligned posted add",
    );
    // Swap and compare-and-swap exist for their old value.
    for op in [AtomicOp::Swap, AtomicOp::Cswap] {
        for bits32 in [false, true] {
            refused(
                &a,
                a.ep.atomic_post(op, 5, c, t, bits32),
                Status::InvalidParam,
                "posted atomic",
                false,
                &format!("posted {op:?}"),
            );
        }
    }
    post(AtomicOp::Add, 1, false);
    a.ep.flush().unwrap();
    // A fetch sees every honest add and none of the refused operations.
    let old =
        a.ep.atomic(AtomicOp::Add, 0, 0, c, t, false)
            .unwrap()
            .wait()
            .unwrap()
            .value;
    assert_eq!(honest, HONEST_ADDS);
    assert_eq!(old, honest, "the counter after {honest} honest posted adds");
}

fn refusals(net: Net, kind: Mem) {
    let o = Owner::new(net);
    let t = Region::new(&o.c, kind, PLEN, access::ALL);
    t.write(0, &pattern(PLEN, 1));
    t.word(RC).store(0, Ordering::Relaxed);
    let na = Region::new(&o.c, kind, PLEN, access::READ | access::WRITE);
    na.write(0, &pattern(PLEN, 2));
    let mut kid = spawn(&o, "refused", net, kind, &[t.key(), na.key()], 0);
    serve_one(&o.w, &mut kid);
    let mut want = pattern(PLEN, 1);
    want[RC..RC + 8].copy_from_slice(&HONEST_ADDS.to_le_bytes());
    assert!(
        t.bytes() == &want[..],
        "a refused posted atomic changed the region: {}",
        first_diff(t.bytes(), &want)
    );
    assert!(
        na.bytes() == &pattern(PLEN, 2)[..],
        "a refused posted atomic changed the region without the atomic right"
    );
}

matrix! {
    refused_posted_atomics_reported_by_flush_shm_allocated: refusals(Net::Shm, Mem::Alloc);
    refused_posted_atomics_reported_by_flush_shm_registered: refusals(Net::Shm, Mem::Reg);
    refused_posted_atomics_reported_by_flush_tcp: refusals(Net::Tcp, Mem::Alloc);
}

/// In one process (the key's path is `local`): posted atomics land at once, and swaps are
/// refused.
#[test]
fn posted_atomics_on_a_local_region() {
    let c = ctx(Net::Shm);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(5)).unwrap();
    let r = Region::new(&c, Mem::Alloc, PLEN, access::ALL);
    let rk = ep.rkey_unpack(&r.key()).unwrap();
    assert_eq!(rk.path(), "local");
    let (b, _) = rk.bounds();
    for _ in 0..10 {
        ep.atomic_post(AtomicOp::Add, 3, b, &rk, false).unwrap();
    }
    ep.atomic_post(AtomicOp::Or, 0x100, b, &rk, false).unwrap();
    ep.atomic_post(AtomicOp::Xor, 0x3, b, &rk, false).unwrap();
    ep.atomic_post(AtomicOp::And, 0xffff_0000, b + 12, &rk, true)
        .unwrap();
    assert_eq!(r.word(0).load(Ordering::Acquire), (30 | 0x100) ^ 3);
    for op in [AtomicOp::Swap, AtomicOp::Cswap] {
        let e = ep.atomic_post(op, 1, b, &rk, false).unwrap_err();
        assert_eq!(e.status(), Status::InvalidParam, "{e}");
        assert!(e.detail().contains("posted atomic"), "{e}");
    }
    ep.flush().unwrap();
    assert_eq!(r.word(0).load(Ordering::Acquire), (30 | 0x100) ^ 3);
}

// ----- sleeping signal waits ----------------------------------------------------------------

/// How long the parent lets the waiter sleep before it signals.
const WAIT_GAP: Duration = Duration::from_millis(500);
/// Rounds signalled as soon as the waiter asks for the next one (a signal may come just
/// as it arms its sleep).
const QUICK_ROUNDS: u64 = 30;

/// The target: waits, sleeping, for the parent's signals; measures its CPU time across the
/// first (long) wait, and tells the parent (in per mille of the wall time) with its ack.
fn child_waiter() {
    let me = target(Net::from_env());
    let w = &me.w;
    let s = Region::new(&me.c, Mem::Alloc, 64, access::ALL);
    me.publish(&[s.key()]);
    let ep = me.ep();
    send_u64(&ep, ACK, 0);
    // The long wait, measured.
    let (c0, w0) = (cpu_time(), Instant::now());
    let v = s.mem.signal_wait_until(w, 0, Cmp::Ge, 1, true).unwrap();
    let (cpu, wall) = (cpu_time() - c0, w0.elapsed());
    assert_eq!(v, 1);
    eprintln!("sleeping wait: {cpu:?} of cpu in {wall:?}");
    assert!(
        wall >= WAIT_GAP / 2,
        "woke after {wall:?}, before the parent signalled"
    );
    assert!(
        cpu < wall / 5,
        "a sleeping wait used {cpu:?} of cpu in {wall:?}: it spun"
    );
    send_u64(
        &ep,
        ACK,
        (cpu.as_micros() * 1000 / wall.as_micros().max(1)) as u64,
    );
    // Quick rounds: each must be seen soon, whenever it lands.
    for r in 2..=QUICK_ROUNDS + 1 {
        let t = Instant::now();
        let v = s.mem.signal_wait_until(w, 0, Cmp::Ge, r, true).unwrap();
        assert_eq!(v, r);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "round {r}: woke after {:?}",
            t.elapsed()
        );
        send_u64(&ep, ACK, r);
    }
    let mut b = [0u8; 8];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { w.tag_recv_nb(&mut b, EXIT, u64::MAX) }.unwrap();
    r.wait().unwrap();
}

/// Receive the 8-byte message with `tag`, failing if `kid` exits first. Unlike
/// `common::recv_u64` (which naps on the worker's fd when idle) this progresses all along.
fn recv_u64_progressing(w: &Worker, kid: &mut Kid, tag: u64) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { w.tag_recv_nb(&mut b, tag, u64::MAX) }.unwrap();
    progress_until(w, kid, &format!("message {tag:#x}"), || r.is_done());
    r.wait().unwrap();
    u64::from_le_bytes(b)
}

fn sleeping_wait_cpu(net: Net) {
    let mut kid = Kid::spawn("waiter", net, &[]);
    let cl = client(&mut kid, net);
    let (w, ep, s) = (&cl.w, &cl.ep, &cl.rk[0]);
    let (sb, _) = s.bounds();
    let signal = |kid: &mut Kid, v: u64| {
        // Data into the signal region's second half; the signal is its first word.
        let mut r =
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { ep.put_signal_nb(&[0x5a; 32], sb + 32, s, sb, s, v, SignalOp::Set) }.unwrap();
        progress_until(w, kid, "the put", || r.is_done());
        r.wait().unwrap();
    };
    assert_eq!(recv_u64_progressing(w, &mut kid, ACK), 0);
    let t = Instant::now();
    while t.elapsed() < WAIT_GAP {
        w.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&mut kid, 1);
    let permille = recv_u64_progressing(w, &mut kid, ACK);
    eprintln!(
        "the waiter used {}.{}% of a CPU while it slept ({net:?})",
        permille / 10,
        permille % 10
    );
    for r in 2..=QUICK_ROUNDS + 1 {
        signal(&mut kid, r);
        assert_eq!(recv_u64_progressing(w, &mut kid, ACK), r);
    }
    let err = cl.finish(&mut kid);
    eprintln!("{}", err.trim());
}

matrix! {
    sleeping_signal_wait_uses_little_cpu_tcp: sleeping_wait_cpu(Net::Tcp);
    /// Over shared memory the signal lands directly in the mapped region, waking no fd: the
    /// waiter's bounded sleeps still see it soon, and cheaply.
    sleeping_signal_wait_uses_little_cpu_shm: sleeping_wait_cpu(Net::Shm);
}

/// Without the wakeup feature a sleeping wait cannot sleep on the worker's fd: it spins,
/// yielding, instead of failing (as the C call does); a time limit still ends it.
#[test]
fn sleeping_signal_wait_without_wakeup_spins() {
    let c = ctx_with(Net::Shm, false);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let r = Region::new(&c, Mem::Alloc, 64, access::ALL);
    let p = r.mem.as_ptr() as usize;
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: the region outlives the thread (joined below); aligned word.
        unsafe { AtomicU64::from_ptr(p as *mut u64) }.store(5, Ordering::Release);
    });
    assert_eq!(r.mem.signal_wait_until(&w, 0, Cmp::Eq, 5, true).unwrap(), 5);
    setter.join().unwrap();
    let e = r
        .mem
        .signal_wait_until_timeout(
            Some(&w),
            0,
            Cmp::Gt,
            5,
            true,
            Some(Duration::from_millis(20)),
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::Timeout, "{e}");
    // With the feature, a time limit ends a sleeping wait too.
    let c2 = ctx(Net::Shm);
    let w2 = Worker::new(&c2, WorkerParams::default()).unwrap();
    let r2 = Region::new(&c2, Mem::Alloc, 64, access::ALL);
    let t = Instant::now();
    let e = r2
        .mem
        .signal_wait_until_timeout(
            Some(&w2),
            0,
            Cmp::Ne,
            0,
            true,
            Some(Duration::from_millis(30)),
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::Timeout, "{e}");
    assert!(t.elapsed() >= Duration::from_millis(30));
}
