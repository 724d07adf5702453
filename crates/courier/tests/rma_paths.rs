//! Every one-sided operation on every path between real processes (direct, CMA, through
//! the owner; shm and tcp; allocated and registered memory), direct pointers into a
//! same-host peer's memory, and operations on the memory of a same-host peer that died.
//! The set-ups and transports are those of tests/common/net.rs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::net::{Net, SHM, SHM_NOCMA, TCP, actor, target};
use common::*;

#[test]
fn child_entry() {
    run_child(&[
        ("everyop", child_everyop),
        ("direct_ptr", child_direct_ptr),
        ("doomed", child_doomed),
    ]);
}

// ----- every operation on every path -------------------------------------------------------

/// The path a key takes for `kind` memory on `net`, and the transport carrying it.
fn expected_path(net: Net, kind: Mem) -> (&'static str, &'static str) {
    match (net.tls, kind, net.cma) {
        ("tcp", _, _) => ("remote", "tcp"),
        (_, Mem::Alloc, _) => ("direct", "shm"),
        (_, Mem::Reg, "no") => ("remote", "shm"),
        (_, Mem::Reg, _) => ("cma", "shm"),
    }
}

// The region of the every-operation test:
const E_LEN: usize = 64 << 10;
/// Puts and gets of several sizes; left holding `pattern(4096, 99)`.
const E_PG: usize = 0;
/// A 64-bit word and two 32-bit words side by side.
const E_W64: usize = 4096;
const E_W32A: usize = 4104;
const E_W32B: usize = 4108;
/// The signal word.
const E_SIG: usize = 4128;
/// Data of the two signalling puts.
const E_D1: usize = 8192;
const E_D1_LEN: usize = 3000;
const E_D2: usize = 12288;
const E_D2_LEN: usize = 5000;
/// A larger put and get.
const E_BIG: usize = 16384;
const E_BIG_LEN: usize = 40_000;

fn everyop_initial() -> Vec<u8> {
    let mut img = vec![0xa5u8; E_LEN];
    img[E_W64..E_W64 + 8].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
    img[E_W32A..E_W32A + 4].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    img[E_W32B..E_W32B + 4].copy_from_slice(&0x0102_0304u32.to_le_bytes());
    img[E_SIG..E_SIG + 8].copy_from_slice(&0u64.to_le_bytes());
    img
}

/// One atomic of the plan. A compare-and-swap `hits` when its compare is the word's value.
#[derive(Clone, Copy, Debug)]
struct Step {
    op: AtomicOp,
    value: u64,
    hits: bool,
    off: usize,
    bits32: bool,
}

const fn step(op: AtomicOp, value: u64, off: usize, bits32: bool) -> Step {
    Step {
        op,
        value,
        hits: true,
        off,
        bits32,
    }
}

/// Every operation in both widths, with carries and wrap-around, one at a time.
fn atomic_plan() -> Vec<Step> {
    use AtomicOp::*;
    let mut p = Vec::new();
    for (off, bits32, wide) in [(E_W64, false, u64::MAX), (E_W32A, true, u32::MAX as u64)] {
        p.extend([
            step(Add, 0x1111, off, bits32),
            step(Add, wide, off, bits32), // minus one: wraps
            step(Add, 0, off, bits32),    // a plain fetch
            step(Swap, 0xf0f0_f0f0_8000_0001 & wide, off, bits32),
            step(And, 0x0ff0_0ff0_0ff0_0ff3 & wide, off, bits32),
            step(Or, 0x8000_0000_0000_0010 & wide | 0x8000_0000, off, bits32),
            step(Xor, wide, off, bits32),
            Step {
                hits: false,
                ..step(Cswap, 0x77, off, bits32)
            },
            step(Cswap, 0x1234_5678_9abc_def0 & wide, off, bits32),
            step(Add, wide - 2, off, bits32),
        ]);
    }
    // The neighbour of the 32-bit word, which the steps above must not touch.
    p.extend([
        step(Add, 1, E_W32B, true),
        step(Xor, 0x0f0f, E_W32B, true),
        step(Cswap, 0xcafe_f00d, E_W32B, true),
    ]);
    p
}

/// Issued all at once, then waited for: on one endpoint they are carried out in order.
fn atomic_batch() -> Vec<Step> {
    (0..24)
        .map(|i| match i % 3 {
            0 => step(AtomicOp::Add, 1, E_W64, false),
            1 => step(AtomicOp::Add, 3, E_W32B, true),
            _ => step(AtomicOp::Xor, 1 << (i % 32), E_W32A, true),
        })
        .collect()
}

/// Apply `s` to the image; returns (compare to send, old value).
fn model(img: &mut [u8], s: Step) -> (u64, u64) {
    let w = if s.bits32 { 4 } else { 8 };
    let mut b = [0u8; 8];
    b[..w].copy_from_slice(&img[s.off..s.off + w]);
    let old = u64::from_le_bytes(b);
    let mask = if s.bits32 { u32::MAX as u64 } else { u64::MAX };
    let compare = if s.hits { old } else { old ^ 0x5a };
    let v = s.value & mask;
    let new = match s.op {
        AtomicOp::Add => old.wrapping_add(v) & mask,
        AtomicOp::And => old & v,
        AtomicOp::Or => old | v,
        AtomicOp::Xor => old ^ v,
        AtomicOp::Swap => v,
        AtomicOp::Cswap if compare == old => v,
        AtomicOp::Cswap => old,
    };
    img[s.off..s.off + w].copy_from_slice(&new.to_le_bytes()[..w]);
    (compare, old)
}

/// What the region holds once the child is done.
fn everyop_final() -> Vec<u8> {
    let mut img = everyop_initial();
    img[E_PG..E_PG + 4096].copy_from_slice(&pattern(4096, 99));
    img[E_BIG..E_BIG + E_BIG_LEN].copy_from_slice(&pattern(E_BIG_LEN, 3));
    for s in atomic_plan().into_iter().chain(atomic_batch()) {
        model(&mut img, s);
    }
    img[E_D1..E_D1 + E_D1_LEN].copy_from_slice(&pattern(E_D1_LEN, 11));
    img[E_D2..E_D2 + E_D2_LEN].copy_from_slice(&pattern(E_D2_LEN, 12));
    img[E_SIG..E_SIG + 8].copy_from_slice(&13u64.to_le_bytes());
    img
}

fn child_everyop() {
    let a = actor();
    let kind = Mem::from_env();
    let (k, ep) = (&a.rk[0], &a.ep);
    let (base, len) = k.bounds();
    assert_eq!(len as usize, E_LEN);
    let (path, transport) = expected_path(a.net, kind);
    assert_eq!(k.path(), path, "{:?} {kind:?}", a.net);
    assert_eq!(ep.transport(), Some(transport));
    // Only a region mapped here has a pointer here.
    assert_eq!(k.direct_ptr(base).is_some(), path == "direct");
    let at = |off: usize| base + off as u64;
    let get = |off: usize, n: usize| {
        // Puts complete here before the target has them (through its progress, or a
        // copy through the kernel beside the link): a flush makes them visible.
        ep.flush().unwrap();
        let mut v = vec![0u8; n];
        ep.get(&mut v, at(off), k).unwrap();
        v
    };

    // Puts and gets.
    for (i, n) in [1usize, 7, 8, 100, 4095, 4096].into_iter().enumerate() {
        let off = E_PG + (i * 977) % (4096 - n + 1);
        let data = pattern(n, 50 + i as u64);
        ep.put(&data, at(off), k).unwrap();
        let back = get(off, n);
        assert!(
            back == data,
            "{n} bytes at {off}: {}",
            first_diff(&back, &data)
        );
    }
    ep.put(&pattern(4096, 99), at(E_PG), k).unwrap();
    ep.put(&pattern(E_BIG_LEN, 3), at(E_BIG), k).unwrap();
    let back = get(E_BIG, E_BIG_LEN);
    assert!(back == pattern(E_BIG_LEN, 3), "large put and get");

    // Atomics, one at a time: each returns the old value.
    let mut img = everyop_initial();
    for s in atomic_plan() {
        let (compare, want) = model(&mut img, s);
        let got = ep
            .atomic(s.op, s.value, compare, at(s.off), k, s.bits32)
            .unwrap()
            .wait()
            .unwrap()
            .value;
        assert_eq!(got, want, "{s:?}: old value");
    }
    // Many in flight at once.
    let mut reqs = Vec::new();
    let mut wants = Vec::new();
    for s in atomic_batch() {
        let (compare, want) = model(&mut img, s);
        reqs.push(
            ep.atomic(s.op, s.value, compare, at(s.off), k, s.bits32)
                .unwrap(),
        );
        wants.push((s, want));
    }
    for (r, (s, want)) in reqs.into_iter().zip(wants) {
        assert_eq!(r.wait().unwrap().value, want, "{s:?} in a batch: old value");
    }
    let words = get(E_W64, 16);
    assert_eq!(words, img[E_W64..E_W64 + 16], "the words read back");

    // Signalling puts: set, add, and a signal with no data.
    ep.put_signal(
        &pattern(E_D1_LEN, 11),
        at(E_D1),
        k,
        at(E_SIG),
        k,
        7,
        SignalOp::Set,
    )
    .unwrap();
    assert_eq!(get(E_SIG, 8), 7u64.to_le_bytes());
    assert!(get(E_D1, E_D1_LEN) == pattern(E_D1_LEN, 11));
    ep.put_signal(
        &pattern(E_D2_LEN, 12),
        at(E_D2),
        k,
        at(E_SIG),
        k,
        5,
        SignalOp::Add,
    )
    .unwrap();
    assert_eq!(get(E_SIG, 8), 12u64.to_le_bytes());
    assert!(get(E_D2, E_D2_LEN) == pattern(E_D2_LEN, 12));
    ep.put_signal(&[], at(E_D2), k, at(E_SIG), k, 1, SignalOp::Add)
        .unwrap();
    ep.flush().unwrap();
    let sig = ep
        .atomic(AtomicOp::Add, 0, 0, at(E_SIG), k, false)
        .unwrap()
        .wait()
        .unwrap()
        .value;
    assert_eq!(sig, 13, "signal after set 7, add 5, add 1");
    let all = get(0, E_LEN);
    let want = everyop_final();
    assert!(all == want, "read back whole: {}", first_diff(&all, &want));
}

fn everyop(net: Net, kind: Mem) {
    let o = Owner::new(net);
    let r = Region::new(&o.c, kind, E_LEN, access::ALL);
    r.write(0, &everyop_initial());
    let mut kid = o.spawn(
        "everyop",
        net,
        &[r.key()],
        &[("COURIER_TEST_MEM", kind.name().to_string())],
    );
    serve_one(&o.w, &mut kid);
    let want = everyop_final();
    assert!(
        r.bytes() == &want[..],
        "the owner's memory after every operation: {}",
        first_diff(r.bytes(), &want)
    );
}

matrix! {
    every_operation_shm_allocated: everyop(SHM, Mem::Alloc);
    every_operation_shm_registered: everyop(SHM, Mem::Reg);
    every_operation_shm_registered_no_cma: everyop(SHM_NOCMA, Mem::Reg);
    every_operation_tcp_allocated: everyop(TCP, Mem::Alloc);
    every_operation_tcp_registered: everyop(TCP, Mem::Reg);
}

// ----- direct pointers ---------------------------------------------------------------------

/// Flags in the direct-pointer test's region.
const DP_F1: usize = 8192;
const DP_F2: usize = 8200;
const DP_F3: usize = 8208;
const DP_F4: usize = 8216;

fn child_direct_ptr() {
    let a = actor();
    let (k, g) = (&a.rk[0], &a.rk[1]);
    let (base, len) = k.bounds();
    assert_eq!(k.path(), "direct");
    let p = k
        .direct_ptr(base)
        .expect("a same-host peer's allocated region is mapped here");
    assert_eq!(
        k.direct_ptr(base + len - 1),
        Some(p.wrapping_add(len as usize - 1))
    );
    assert!(k.direct_ptr(base + len).is_none(), "past the end");
    assert!(k.direct_ptr(base - 1).is_none(), "before the start");
    let (gb, _) = g.bounds();
    assert_eq!(g.path(), "cma");
    assert!(
        g.direct_ptr(gb).is_none(),
        "registered memory is not mapped here"
    );
    // SAFETY: aligned words inside the mapped region, shared only through atomics.
    let word = |off: usize| unsafe { AtomicU64::from_ptr(p.add(off) as *mut u64) };
    // SAFETY: inside the mapped region; the owner does not write these bytes meanwhile.
    let bytes = |off: usize| unsafe { std::slice::from_raw_parts(p.add(off), 4096) };
    // The owner's stores, seen through the pointer.
    assert_eq!(word(DP_F1).load(Ordering::Acquire), 1);
    assert!(bytes(0) == pattern(4096, 1), "the owner's data, read here");
    // Ours, for the owner to see.
    let mine = pattern(4096, 2);
    // SAFETY: inside the mapped region; the owner reads it only after the flag.
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), p.add(4096), 4096) };
    word(DP_F2).store(1, Ordering::Release);
    // The owner answers with new data.
    let deadline = Instant::now() + DEADLINE;
    while word(DP_F3).load(Ordering::Acquire) != 1 {
        a.w.progress();
        assert!(Instant::now() < deadline, "no answer from the owner");
    }
    assert!(
        bytes(0) == pattern(4096, 3),
        "the owner's new data, read here"
    );
    // The operations see the same memory.
    let mut back = vec![0u8; 4096];
    a.ep.get(&mut back, base, k).unwrap();
    assert!(back == pattern(4096, 3));
    word(DP_F4).store(0xfeed, Ordering::Release);
    let old =
        a.ep.atomic(AtomicOp::Add, 1, 0, base + DP_F4 as u64, k, false)
            .unwrap()
            .wait()
            .unwrap()
            .value;
    assert_eq!(old, 0xfeed);
}

/// In one process (the key's path is `local`) the pointer is given only for an address in
/// the key's region while its owner maps it, as for a same-host peer's region.
#[test]
fn direct_pointer_of_a_local_key_only_inside_a_live_region() {
    let c = ctx(SHM);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(5)).unwrap();
    let len = 4096u64;
    let r = Region::new(&c, Mem::Reg, len as usize, access::READ);
    let k = ep.rkey_unpack(&r.key()).unwrap();
    assert_eq!(k.path(), "local");
    let (base, _) = k.bounds();
    assert_eq!(k.direct_ptr(base), Some(base as *mut u8));
    assert_eq!(
        k.direct_ptr(base + len - 1),
        Some((base + len - 1) as *mut u8)
    );
    for (addr, what) in [
        (base + len, "past the end"),
        (base + 100 * len, "far past the end"),
        (base - 1, "before the start"),
        (0, "address 0"),
    ] {
        let e = k.local_ptr(addr).expect_err(what);
        assert_eq!(e.status(), Status::OutOfRange, "{what}: {e}");
        assert!(k.direct_ptr(addr).is_none(), "{what}");
    }
    drop(r);
    let e = k.local_ptr(base).expect_err("a region its owner unmapped");
    assert_eq!(e.status(), Status::InvalidKey, "{e}");
}

#[test]
fn direct_pointer_loads_and_stores_shm() {
    let o = Owner::new(SHM);
    let r = Region::new(&o.c, Mem::Alloc, 64 << 10, access::ALL);
    r.write(0, &pattern(4096, 1));
    r.word(DP_F1).store(1, Ordering::Release);
    let g = Region::new(&o.c, Mem::Reg, 4096, access::ALL);
    let mut kid = o.spawn("direct_ptr", SHM, &[r.key(), g.key()], &[]);
    progress_until(&o.w, &mut kid, "the peer's stores", || {
        r.word(DP_F2).load(Ordering::Acquire) == 1
    });
    assert!(
        r.at(4096, 4096) == pattern(4096, 2),
        "the peer's stores through its pointer, read here"
    );
    r.write(0, &pattern(4096, 3));
    r.word(DP_F3).store(1, Ordering::Release);
    serve_one(&o.w, &mut kid);
    assert_eq!(r.word(DP_F4).load(Ordering::Acquire), 0xfeed + 1);
}

// ----- a same-host peer that dies ------------------------------------------------------------

/// A target that maps a region, publishes its key and serves until it is killed.
fn child_doomed() {
    let t = target();
    let d = Region::new(&t.c, Mem::Alloc, 64 << 10, access::ALL);
    t.publish(&[d.key()]);
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        t.w.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Puts, gets and atomics into a same-host peer's allocated memory are plain stores and
/// loads that never pass the worker. Once that peer dies they must fail as its sends do,
/// not write on into the dead process's memory and report success: whether the caller
/// progresses its worker (which notices the hung-up link) or only puts and flushes (the
/// flush then looks, every so many calls).
#[test]
fn one_sided_operations_to_a_dead_same_host_peer_fail() {
    for progress in [true, false] {
        let mut kid = Kid::spawn("doomed", SHM, &[]);
        let cl = client(&mut kid, SHM);
        progress_until(&cl.w, &mut kid, "the shared-memory link", || {
            cl.ep.transport() == Some("shm")
        });
        let k = &cl.rk[0];
        assert_eq!(k.path(), "direct");
        let (b, _) = k.bounds();
        let data = [7u8; 64];
        let put_flush = || -> Result<()> {
            cl.ep.put(&data, b, k)?;
            cl.ep.flush()
        };
        put_flush().expect("a put and flush to a live peer");
        kid.kill();
        let start = Instant::now();
        let mut rounds = 0u32;
        let err = loop {
            if progress {
                cl.w.progress();
            }
            rounds += 1;
            if let Err(e) = put_flush() {
                break e;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "progress {progress}: {rounds} puts and flushes to a killed peer succeeded in 10 s"
            );
        };
        assert_eq!(
            err.status(),
            Status::PeerFailure,
            "progress {progress}: {err}"
        );
        assert!(err.detail().contains("died"), "{err}");
        // Every later operation on the endpoint fails the same way, none writes or reads.
        let dead = |what: &str, r: Result<()>| {
            let e = r.expect_err(what);
            assert_eq!(e.status(), Status::PeerFailure, "{what}: {e}");
        };
        dead(
            "put",
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { cl.ep.put_nb(&data, b, k) }.and_then(|r| r.wait().map(drop)),
        );
        let mut back = [0u8; 64];
        dead(
            "get",
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { cl.ep.get_nb(&mut back, b, k) }.and_then(|r| r.wait().map(drop)),
        );
        dead(
            "atomic",
            cl.ep
                .atomic(AtomicOp::Add, 1, 0, b, k, false)
                .and_then(|r| r.wait().map(drop)),
        );
        dead(
            "atomic_post",
            cl.ep.atomic_post(AtomicOp::Add, 1, b, k, false),
        );
        dead(
            "put_signal",
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe {
                cl.ep
                    .put_signal_nb(&data, b, k, b + 64, k, 1, SignalOp::Set)
            }
            .and_then(|r| r.wait().map(drop)),
        );
        dead("flush", cl.ep.flush());
        assert_eq!(back, [0u8; 64], "a failed get wrote its buffer");
    }
}
