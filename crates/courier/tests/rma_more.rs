//! More one-sided operations between real processes (tests/rma.rs has the first ones).
//!
//! Two set-ups. In most tests the parent owns the memory and children (this binary re-run
//! with `COURIER_TEST_ROLE`) connect, unpack the keys passed in their environment and act,
//! while the parent progresses and then checks its memory. Where the target's own view
//! matters (its log, a semaphore or signal it waits on) a child is the target: it prints
//! its port and keys on stdout, the parent connects and acts, and the child checks. Both
//! set-ups are in tests/common.
//!
//! Transports: shared memory with allocated memory (plain loads, stores and CPU atomics),
//! shared memory with registered memory (CMA for puts and gets, the owner's progress for
//! atomics and signals; with `COURIER_SHM_CMA=no` everything through shm frames), and tcp
//! with either kind of memory (everything through the owner's progress).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::*;

// ----- transports ---------------------------------------------------------------------------

/// A transport selection, given to both sides.
#[derive(Clone, Copy, Debug)]
struct Net {
    tls: &'static str,
    cma: &'static str,
}

const SHM: Net = Net {
    tls: "all",
    cma: "auto",
};
const SHM_NOCMA: Net = Net {
    tls: "all",
    cma: "no",
};
const TCP: Net = Net {
    tls: "tcp",
    cma: "auto",
};

impl Transport for Net {
    fn env(self) -> Vec<(&'static str, String)> {
        vec![
            ("COURIER_TLS", self.tls.to_string()),
            ("COURIER_SHM_CMA", self.cma.to_string()),
        ]
    }
}

impl Net {
    fn from_env() -> Net {
        let tls = std::env::var("COURIER_TLS").unwrap();
        let cma = std::env::var("COURIER_SHM_CMA").unwrap();
        [SHM, SHM_NOCMA, TCP]
            .into_iter()
            .find(|n| n.tls == tls && n.cma == cma)
            .unwrap()
    }
    /// Whether refusals are decided by the target (as opposed to by this process, which
    /// reads the owner's key table on the same host).
    fn remote_checks(self) -> bool {
        self.tls == "tcp"
    }
}

/// A child acting on the parent's memory over the transport it was started with.
fn actor() -> Actor<Net> {
    common::actor(Net::from_env())
}

/// A child that is the target, over the transport it was started with.
fn target() -> Target {
    common::target(Net::from_env())
}

#[test]
fn child_entry() {
    run_child(&[
        ("forged", child_forged),
        ("log_target", child_log_target),
        ("everyop", child_everyop),
        ("bigsig", child_bigsig),
        ("bigsig_badkey", child_bigsig_badkey),
        ("bigput_overrun", child_bigput_overrun),
        ("sem_consumer", child_sem_consumer),
        ("direct_ptr", child_direct_ptr),
        ("sleeper", child_sleeper),
        ("doomed", child_doomed),
    ]);
}

// ----- refusals -----------------------------------------------------------------------------

/// Why an operation must be refused.
#[derive(Clone, Copy, Debug)]
enum Why {
    /// A key whose secret is not the region's.
    Forged,
    /// A key of a region its owner unmapped.
    Stale,
    /// The region was mapped without the right (`what`: "read", "write", "atomics").
    NoRight(&'static str),
    /// Outside the region.
    Range,
}

impl Why {
    fn status(self) -> Status {
        match self {
            Why::Forged | Why::Stale => Status::InvalidKey,
            Why::NoRight(_) => Status::AccessDenied,
            Why::Range => Status::OutOfRange,
        }
    }
    /// Words the error's sentence must hold. Refused here (same host: the owner's key
    /// table is read here; or, for rights and bounds, what the key itself claims), the
    /// sentence says why; refused by the target, it says the target refused, and the
    /// status names why. Only the target can tell a forged or stale key.
    fn check(self, e: &Error, remote: bool) {
        assert_eq!(e.status(), self.status(), "{self:?}: {e}");
        let d = e.detail();
        let by_target =
            remote && (matches!(self, Why::Forged | Why::Stale) || d.contains("target refused"));
        let ok = if by_target {
            d.contains("target refused") && d.contains(self.status().as_str())
        } else {
            match self {
                Why::Forged => d.contains("forged"),
                Why::Stale => d.contains("stale") || d.contains("not mapped"),
                Why::NoRight(what) => d.contains(&format!("remote {what} access")),
                Why::Range => d.contains("outside"),
            }
        };
        assert!(ok, "{self:?}: the error does not say why: {e}");
    }
}

/// The operation must be refused for `why`: at once, at completion, or (operations the
/// target does not acknowledge one by one) at the next flush; reported once.
fn refused(a: &Actor<Net>, r: Result<Request<'_>>, why: Why, what: &str) {
    refused_on(&a.ep, a.net.remote_checks(), r, why, what)
}

fn refused_on(ep: &Endpoint, remote: bool, r: Result<Request<'_>>, why: Why, what: &str) {
    let e = match r {
        Err(e) => e,
        Ok(req) => match req.wait() {
            Err(e) => e,
            Ok(_) => match ep.flush() {
                Err(e) => e,
                Ok(()) => panic!("{what}: not refused ({why:?})"),
            },
        },
    };
    why.check(&e, remote);
    if let Err(e) = ep.flush() {
        panic!("{what}: a second error after the refusal: {e}");
    }
}

/// Region size of the refusal tests.
const FLEN: usize = 64 << 10;

fn child_forged() {
    // rk[0]: T (all rights), rk[1]: NR (write and atomics, no read), rk[2]: a region unmapped
    // before we ran (its owner mapped another one since, likely in its place), rk[3]: S, a
    // signal region (all rights).
    let a = actor();
    let (tb, tlen) = a.rk[0].bounds();
    let (nb, _) = a.rk[1].bounds();
    let (xb, _) = a.rk[2].bounds();
    let (sb, slen) = a.rk[3].bounds();
    let fk = a.ep.rkey_unpack(&forge_secret(&a.raw[0])).unwrap();
    let fsig = a.ep.rkey_unpack(&forge_secret(&a.raw[3])).unwrap();
    let wide = a.ep.rkey_unpack(&forge_length(&a.raw[0], 1 << 20)).unwrap();
    let (stale, t, nr, s) = (&a.rk[2], &a.rk[0], &a.rk[1], &a.rk[3]);

    // A get without the read right, small and large: refused, nothing read.
    for n in [8usize, 40_000] {
        let mut sink = vec![0xccu8; n];
        refused(
            &a,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { a.ep.get_nb(&mut sink, nb, nr) },
            Why::NoRight("read"),
            "get without the read right",
        );
        assert!(sink.iter().all(|&b| b == 0xcc), "a refused get wrote {n}");
    }
    // Forged and stale keys on gets.
    for (k, base, why) in [(&fk, tb, Why::Forged), (stale, xb, Why::Stale)] {
        for n in [8usize, 40_000] {
            let mut sink = vec![0xccu8; n];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            refused(&a, unsafe { a.ep.get_nb(&mut sink, base, k) }, why, "get");
            assert!(sink.iter().all(|&b| b == 0xcc), "a refused get wrote {n}");
        }
    }
    // Forged and stale keys on every atomic, both widths.
    for (k, base, why) in [(&fk, tb, Why::Forged), (stale, xb, Why::Stale)] {
        for op in AtomicOp::ALL {
            for bits32 in [false, true] {
                let what = format!("{op:?} (32-bit: {bits32}) with a {why:?} key");
                refused(
                    &a,
                    a.ep.atomic(op, 0x5a5a, 0x1111_1111, base + 64, k, bits32),
                    why,
                    &what,
                );
            }
        }
    }
    // Atomics out of the region's range with an honest key, and with a key that claims
    // more than the region (the owner's record decides).
    for (addr, bits32) in [
        (tb + tlen, false),
        (tb + tlen, true),
        (tb + tlen + 4096, false),
        (tb - 8, false),
        (tb - 4, true),
    ] {
        for op in [AtomicOp::Add, AtomicOp::Cswap] {
            let what = format!(
                "{op:?} at base{:+} (32-bit: {bits32})",
                addr as i64 - tb as i64
            );
            refused(
                &a,
                a.ep.atomic(op, 1, 0, addr, t, bits32),
                Why::Range,
                &what,
            );
        }
    }
    refused(
        &a,
        a.ep.atomic(AtomicOp::Add, 1, 0, tb + tlen, &wide, false),
        Why::Range,
        "atomic past the region with a key claiming 1 MiB",
    );
    // put_signal: a bad data key with a good signal key, a good data key with a bad
    // signal key; neither the data nor the signal may change.
    let msg = [0xeeu8; 256];
    for (dk, db, sk, sbase, why, what) in [
        (&fk, tb, s, sb, Why::Forged, "forged data key"),
        (stale, xb, s, sb, Why::Stale, "stale data key"),
        (t, tb, &fsig, sb, Why::Forged, "forged signal key"),
        (t, tb, stale, xb, Why::Stale, "stale signal key"),
        (
            t,
            tb,
            s,
            sb + slen,
            Why::Range,
            "signal word past its region",
        ),
        (t, tb + tlen - 8, s, sb, Why::Range, "data past its region"),
    ] {
        for op in [SignalOp::Set, SignalOp::Add] {
            refused(
                &a,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { a.ep.put_signal_nb(&msg, db, dk, sbase, sk, 99, op) },
                why,
                &format!("put_signal {op:?} with a {what}"),
            );
        }
    }
    // Honest operations still work: one add on S's first word, and T reads back whole.
    let old =
        a.ep.atomic(AtomicOp::Add, 1, 0, sb, s, false)
            .unwrap()
            .wait()
            .unwrap()
            .value;
    assert_eq!(old, S_INIT, "the signal word changed before the honest add");
    let mut back = vec![0u8; tlen as usize];
    a.ep.get(&mut back, tb, t).unwrap();
    assert!(
        back == pattern(FLEN, 1),
        "T reads back different: {}",
        first_diff(&back, &pattern(FLEN, 1))
    );
    a.ep.flush().unwrap();
}

const S_INIT: u64 = 0x5151_5151_5151_5151;

fn forged(net: Net, kind: Mem) {
    let o = Owner::new(net);
    let t = Region::new(&o.c, kind, FLEN, access::ALL);
    t.write(0, &pattern(FLEN, 1));
    let nr = Region::new(&o.c, kind, FLEN, access::WRITE | access::ATOMIC);
    nr.write(0, &pattern(FLEN, 2));
    let stale = Region::new(&o.c, kind, FLEN, access::ALL);
    let stale_key = stale.key();
    drop(stale);
    // Likely the same slot and, for allocated memory, the same address: a stale key must
    // not reach it.
    let reuse = Region::new(&o.c, kind, FLEN, access::ALL);
    reuse.write(0, &pattern(FLEN, 3));
    let s = Region::new(&o.c, kind, 4096, access::ALL);
    s.write(0, &pattern(4096, 4));
    s.word(0).store(S_INIT, Ordering::Release);
    let keys = [t.key(), nr.key(), stale_key, s.key()];
    let mut kid = o.spawn("forged", net, &keys, &[]);
    serve_one(&o.w, &mut kid);
    for (r, seed, name) in [
        (&t, 1, "T"),
        (&nr, 2, "NR"),
        (&reuse, 3, "the reused region"),
    ] {
        let want = pattern(FLEN, seed);
        assert!(
            r.bytes() == &want[..],
            "a refused operation changed {name}: {}",
            first_diff(r.bytes(), &want)
        );
    }
    let mut want = pattern(4096, 4);
    want[..8].copy_from_slice(&(S_INIT + 1).to_le_bytes());
    assert!(
        s.bytes() == &want[..],
        "the signal region holds more than the honest add: {}",
        first_diff(s.bytes(), &want)
    );
}

matrix! {
    forged_stale_and_out_of_range_shm_allocated: forged(SHM, Mem::Alloc);
    forged_stale_and_out_of_range_shm_registered: forged(SHM, Mem::Reg);
    forged_stale_and_out_of_range_shm_registered_no_cma: forged(SHM_NOCMA, Mem::Reg);
    forged_stale_and_out_of_range_tcp_allocated: forged(TCP, Mem::Alloc);
    forged_stale_and_out_of_range_tcp_registered: forged(TCP, Mem::Reg);
}

/// Over tcp the target decides: it logs each refusal (at warn, `COURIER_LOG_LEVEL`) and
/// goes on serving.
fn child_log_target() {
    let t = target();
    let r = Region::new(&t.c, Mem::Alloc, 4096, access::ALL);
    r.write(0, &pattern(4096, 5));
    let stale = Region::new(&t.c, Mem::Alloc, 4096, access::ALL);
    let stale_key = stale.key();
    drop(stale);
    t.publish(&[r.key(), stale_key]);
    let _ep = t.ep();
    t.recv_u64(EXIT);
    let mut want = pattern(4096, 5);
    let w = u64::from_le_bytes(want[64..72].try_into().unwrap());
    want[64..72].copy_from_slice(&(w + 1).to_le_bytes());
    assert!(
        r.bytes() == &want[..],
        "the target's memory is not what the one honest add left: {}",
        first_diff(r.bytes(), &want)
    );
}

#[test]
fn target_logs_refusals_and_goes_on_serving_tcp() {
    let mut kid = Kid::spawn(
        "log_target",
        TCP,
        &[("COURIER_LOG_LEVEL", "warn".to_string())],
    );
    let cl = client(&mut kid, TCP);
    let me = cl
        .ep
        .local_sockaddr()
        .expect("a tcp endpoint has a socket address");
    let (tb, _) = cl.rk[0].bounds();
    let (xb, _) = cl.rk[1].bounds();
    let fk = cl.ep.rkey_unpack(&forge_secret(&cl.raw[0])).unwrap();
    let mut sink = [0xccu8; 64];
    refused_on(
        &cl.ep,
        true,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { cl.ep.get_nb(&mut sink, tb, &fk) },
        Why::Forged,
        "forged get",
    );
    assert_eq!(sink, [0xcc; 64]);
    refused_on(
        &cl.ep,
        true,
        cl.ep.atomic(AtomicOp::Add, 1, 0, tb + 64, &fk, false),
        Why::Forged,
        "forged atomic",
    );
    refused_on(
        &cl.ep,
        true,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { cl.ep.put_nb(&[0xee; 64], xb, &cl.rk[1]) },
        Why::Stale,
        "stale put",
    );
    // Then an honest add and an honest read, served as usual.
    let want = pattern(4096, 5);
    let old = cl
        .ep
        .atomic(AtomicOp::Add, 1, 0, tb + 64, &cl.rk[0], false)
        .unwrap()
        .wait()
        .unwrap()
        .value;
    assert_eq!(old, u64::from_le_bytes(want[64..72].try_into().unwrap()));
    let mut back = vec![0u8; 4096];
    cl.ep.get(&mut back, tb, &cl.rk[0]).unwrap();
    assert_eq!(back[..64], want[..64]);
    assert_eq!(
        u64::from_le_bytes(back[64..72].try_into().unwrap()),
        old + 1
    );
    assert_eq!(back[72..], want[72..]);
    let log = cl.finish(&mut kid);
    // One line per refusal, in order, naming the peer and why; none for the honest
    // operations.
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    let expect = [
        (
            &format!("refused a remote read from {me}: ")[..],
            "has a wrong secret (forged key)",
        ),
        (
            &format!("refused a remote operation from {me}: ")[..],
            "has a wrong secret (forged key)",
        ),
        (
            &format!("refused a remote operation from {me}: ")[..],
            "is not mapped (stale key, or unmapped)",
        ),
    ];
    assert_eq!(
        lines.len(),
        expect.len(),
        "expected {} refusal lines in the target's log:\n{log}",
        expect.len()
    );
    for (line, (head, why)) in lines.iter().zip(expect) {
        assert!(
            line.contains(" WARN ") && line.contains(head) && line.contains(why),
            "log line {line:?} should say {head:?} ... {why:?}; the whole log:\n{log}"
        );
    }
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

// ----- signalling puts larger than a frame --------------------------------------------------

const MIB: usize = 1 << 20;
/// More than one tcp frame (16 MiB).
const TCP_MULTI: usize = 17 * MIB + 4099;

fn sizes_env(sizes: &[usize]) -> (&'static str, String) {
    let v: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    ("COURIER_TEST_SIZES", v.join(","))
}

fn sizes_from_env() -> Vec<usize> {
    std::env::var("COURIER_TEST_SIZES")
        .unwrap()
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect()
}

/// Round `r`: odd rounds set the signal to `r`, even ones add 1 to `r - 1`.
fn round_op(r: u64) -> (SignalOp, u64) {
    if r % 2 == 1 {
        (SignalOp::Set, r)
    } else {
        (SignalOp::Add, 1)
    }
}

fn child_bigsig() {
    let a = actor();
    let (d, s) = (&a.rk[0], &a.rk[1]);
    let (db, _) = d.bounds();
    let (sb, _) = s.bounds();
    for (i, &n) in sizes_from_env().iter().enumerate() {
        let r = i as u64 + 1;
        let (op, v) = round_op(r);
        let data = pattern(n, r);
        a.ep.put_signal(&data, db, d, sb, s, v, op).unwrap();
        // The owner reads the round before we write the next.
        let mut ack = [0u8; 8];
        a.w.tag_recv(&mut ack, ACK, u64::MAX).unwrap();
        assert_eq!(u64::from_le_bytes(ack), r);
    }
}

/// The owner watches the signal word; when it moves, the whole round's data must be
/// there.
fn bigsig(net: Net, kind: Mem, sizes: &[usize]) {
    let o = Owner::new(net);
    let max = *sizes.iter().max().unwrap();
    let d = Region::new(&o.c, kind, max, access::ALL);
    let s = Region::new(&o.c, kind, 64, access::ALL);
    let mut kid = o.spawn("bigsig", net, &[d.key(), s.key()], &[sizes_env(sizes)]);
    let ep = o.ep(&mut kid);
    for (i, &n) in sizes.iter().enumerate() {
        let r = i as u64 + 1;
        progress_until(&o.w, &mut kid, &format!("signal {r}"), || {
            s.word(0).load(Ordering::Acquire) != r - 1
        });
        assert_eq!(
            s.word(0).load(Ordering::Acquire),
            r,
            "the signal skipped or went back"
        );
        let want = pattern(n, r);
        let got = &d.bytes()[..n];
        assert!(
            got == &want[..],
            "round {r}: signal seen before all of its {n} bytes: {}",
            first_diff(got, &want)
        );
        send_u64(&ep, ACK, r);
    }
    serve_one(&o.w, &mut kid);
}

matrix! {
    put_signal_larger_than_a_frame_tcp_allocated:
        bigsig(TCP, Mem::Alloc, &[MIB, TCP_MULTI, MIB + 1, TCP_MULTI, 4096]);
    put_signal_larger_than_a_frame_tcp_registered:
        bigsig(TCP, Mem::Reg, &[MIB, TCP_MULTI, MIB + 1, TCP_MULTI, 4096]);
    // shm frames hold 64 KiB at most.
    put_signal_larger_than_a_frame_shm_registered:
        bigsig(SHM, Mem::Reg, &[MIB, 3 * MIB + 5, MIB, 200_000, MIB, 65_536]);
    put_signal_larger_than_a_frame_shm_registered_no_cma:
        bigsig(SHM_NOCMA, Mem::Reg, &[MIB, 3 * MIB + 5, 200_000]);
}

fn child_bigsig_badkey() {
    let a = actor();
    let (d, s) = (&a.rk[0], &a.rk[1]);
    let (db, dlen) = d.bounds();
    let (sb, _) = s.bounds();
    let fd = a.ep.rkey_unpack(&forge_secret(&a.raw[0])).unwrap();
    let fs = a.ep.rkey_unpack(&forge_secret(&a.raw[1])).unwrap();
    let data = vec![0xeeu8; dlen as usize];
    for op in [SignalOp::Set, SignalOp::Add] {
        refused(
            &a,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { a.ep.put_signal_nb(&data, db, &fd, sb, s, 9, op) },
            Why::Forged,
            "a put_signal larger than a frame with a forged data key",
        );
        refused(
            &a,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { a.ep.put_signal_nb(&data, db, d, sb, &fs, 9, op) },
            Why::Forged,
            "a put_signal larger than a frame with a forged signal key",
        );
    }
}

/// A refused signalling put changes nothing, however many frames its data takes.
fn bigsig_badkey(net: Net, kind: Mem, len: usize) {
    let o = Owner::new(net);
    let d = Region::new(&o.c, kind, len, access::ALL);
    d.write(0, &pattern(len, 7));
    let s = Region::new(&o.c, kind, 64, access::ALL);
    s.word(0).store(S_INIT, Ordering::Release);
    let mut kid = o.spawn("bigsig_badkey", net, &[d.key(), s.key()], &[]);
    serve_one(&o.w, &mut kid);
    assert_eq!(s.word(0).load(Ordering::Acquire), S_INIT, "signal changed");
    let want = pattern(len, 7);
    assert!(
        d.bytes() == &want[..],
        "a refused put_signal wrote data: {}",
        first_diff(d.bytes(), &want)
    );
}

matrix! {
    put_signal_larger_than_a_frame_with_a_bad_key_tcp: bigsig_badkey(TCP, Mem::Reg, TCP_MULTI);
    put_signal_larger_than_a_frame_with_a_bad_key_shm_registered_no_cma:
        bigsig_badkey(SHM_NOCMA, Mem::Reg, 3 * MIB);
}

fn child_bigput_overrun() {
    let a = actor();
    let (d, s) = (&a.rk[0], &a.rk[1]);
    let (db, dlen) = d.bounds();
    let (sb, _) = s.bounds();
    // 8 bytes more than the region holds.
    let data = vec![0xeeu8; dlen as usize + 8];
    refused(
        &a,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { a.ep.put_nb(&data, db, d) },
        Why::Range,
        "a put past the region's end",
    );
    refused(
        &a,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { a.ep.put_signal_nb(&data, db, d, sb, s, 9, SignalOp::Set) },
        Why::Range,
        "a put_signal past the region's end",
    );
}

/// A put that runs past its region's end is refused and writes nothing, however many
/// frames its data takes.
#[test]
fn put_larger_than_a_frame_past_the_region_end_tcp() {
    let (net, len) = (TCP, TCP_MULTI);
    let o = Owner::new(net);
    let d = Region::new(&o.c, Mem::Reg, len, access::ALL);
    d.write(0, &pattern(len, 7));
    let s = Region::new(&o.c, Mem::Reg, 64, access::ALL);
    s.word(0).store(S_INIT, Ordering::Release);
    let mut kid = o.spawn("bigput_overrun", net, &[d.key(), s.key()], &[]);
    serve_one(&o.w, &mut kid);
    assert_eq!(s.word(0).load(Ordering::Acquire), S_INIT, "signal changed");
    let want = pattern(len, 7);
    assert!(
        d.bytes() == &want[..],
        "a refused put wrote data: {}",
        first_diff(d.bytes(), &want)
    );
}

// ----- semaphores ---------------------------------------------------------------------------

const SEM_N: u64 = 32;
const SLOT: usize = 4096;
/// Parent to consumer: the phases of the semaphore test.
const P2: u64 = 0x202;
const P4: u64 = 0x204;

/// The consumer owns the semaphores and the data slots, and waits; the parent produces.
fn child_sem_consumer() {
    let t = target();
    let d = Region::new(&t.c, Mem::Alloc, SLOT * (SEM_N as usize + 8), access::ALL);
    let int = Semaphore::new(&t.c, 0).unwrap();
    let boolean = Semaphore::new(
        &t.c,
        sem_flags::BOOLEAN | sem_flags::SPRODUCER | sem_flags::SCONSUMER,
    )
    .unwrap();
    let (ik, ia) = int.remote().unwrap();
    let (bk, ba) = boolean.remote().unwrap();
    t.publish(&[d.key(), ik, bk]);
    println!("ADDRS {ia},{ba}");
    let slot = |k: u64| d.at(k as usize * SLOT, SLOT);

    // 1. An integer semaphore counts signalling puts (add 1); each post taken is one whose
    //    data is all there.
    //    Every other wait, and the last two (whose posts come after a pause), sleep on the
    //    worker's event fd. This child runs with COURIER_SIGNAL_NAP=inf: only the put
    //    itself can wake it (a put that woke no one shows as a wait of 20 s).
    for k in 1..=SEM_N {
        if k % 2 == 0 || k > SEM_N - 2 {
            let t0 = Instant::now();
            int.wait_timeout(&t.w, 1, true, Some(Duration::from_secs(20)))
                .unwrap();
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "post {k}: the sleeping wait was not woken by the put"
            );
        } else {
            int.wait(&t.w, 1).unwrap();
        }
        assert!(
            slot(k) == pattern(SLOT, k),
            "post {k} taken before its data"
        );
    }
    assert_eq!(int.value(), 0);
    assert!(!int.try_wait(1));
    let ep = t.ep();
    send_u64(&ep, ACK, 1);

    // 2. try(n) after a remote atomic add of 5: all or nothing.
    assert_eq!(t.recv_u64(P2), 5);
    assert_eq!(int.value(), 5);
    assert!(!int.try_wait(6), "took 6 of 5");
    assert_eq!(int.value(), 5, "a failed try took something");
    assert!(int.try_wait(2));
    assert_eq!(int.value(), 3);
    assert!(int.try_wait(3));
    assert_eq!(int.value(), 0);
    assert!(!int.try_wait(1));
    // Integers count up to SEM_MAX.
    int.post(SEM_MAX).unwrap();
    assert!(int.post(1).is_err());
    assert_eq!(int.value(), SEM_MAX);
    assert!(int.try_wait(SEM_MAX));
    send_u64(&ep, ACK, 2);

    // 3. A boolean semaphore posted by a signalling put (add 1).
    boolean.wait(&t.w, 1).unwrap();
    assert!(
        slot(SEM_N + 1) == pattern(SLOT, 1001),
        "post taken before its data"
    );
    assert_eq!(boolean.value(), 0);
    assert!(!boolean.try_wait(1));
    send_u64(&ep, ACK, 3);

    // 4. Two posts by signalling puts that set 1 leave a boolean at 1.
    assert_eq!(t.recv_u64(P4), 4);
    assert_eq!(boolean.value(), 1);
    assert!(slot(SEM_N + 2) == pattern(SLOT, 1002));
    assert!(slot(SEM_N + 3) == pattern(SLOT, 1003));
    assert!(!boolean.try_wait(2));
    assert!(boolean.try_wait(1));
    assert!(!boolean.try_wait(1));
    boolean.post(1).unwrap();
    assert!(
        boolean.post(1).is_err(),
        "a boolean semaphore holds at most 1"
    );
    assert!(boolean.try_wait(1));
    send_u64(&ep, ACK, 4);
    t.recv_u64(EXIT);
}

fn semaphores(net: Net) {
    let mut kid = Kid::spawn("sem_consumer", net, &[("COURIER_SIGNAL_NAP", "inf".into())]);
    let cl = client(&mut kid, net);
    let addrs: Vec<u64> = kid
        .line("ADDRS")
        .split(',')
        .map(|a| a.parse().unwrap())
        .collect();
    let (d, is, bs) = (&cl.rk[0], &cl.rk[1], &cl.rk[2]);
    let (ia, ba) = (addrs[0], addrs[1]);
    let (db, _) = d.bounds();
    let at = |k: u64| db + k * SLOT as u64;
    let post = |k: u64, key: &RemoteKey, addr: u64, v: u64, op: SignalOp| {
        let data = pattern(SLOT, k);
        cl.ep
            .put_signal(&data, at(k % 1000), d, addr, key, v, op)
            .unwrap();
    };
    if net.tls != "tcp" {
        // Direct posts from here on (before, they go through the consumer as frames).
        progress_until(&cl.w, &mut kid, "the shared-memory link", || {
            cl.ep.transport() == Some("shm")
        });
    }
    for k in 1..=SEM_N {
        if k > SEM_N - 2 {
            // The consumer is asleep by now.
            std::thread::sleep(Duration::from_millis(50));
        }
        post(k, is, ia, 1, SignalOp::Add);
    }
    assert_eq!(recv_u64(&cl.w, &mut kid, ACK), 1);
    let old = cl
        .ep
        .atomic(AtomicOp::Add, 5, 0, ia, is, false)
        .unwrap()
        .wait()
        .unwrap()
        .value;
    assert_eq!(old, 0, "the consumer took every post");
    send_u64(&cl.ep, P2, 5);
    assert_eq!(recv_u64(&cl.w, &mut kid, ACK), 2);
    // Slot SEM_N + i holds pattern 1000 + i.
    let k = |i: u64| 1000 + i;
    let post_b = |i: u64, v, op| {
        let data = pattern(SLOT, k(i));
        cl.ep
            .put_signal(&data, at(SEM_N + i), d, ba, bs, v, op)
            .unwrap();
    };
    post_b(1, 1, SignalOp::Add);
    assert_eq!(recv_u64(&cl.w, &mut kid, ACK), 3);
    post_b(2, 1, SignalOp::Set);
    post_b(3, 1, SignalOp::Set);
    cl.ep.flush().unwrap();
    send_u64(&cl.ep, P4, 4);
    assert_eq!(recv_u64(&cl.w, &mut kid, ACK), 4);
    cl.finish(&mut kid);
}

matrix! {
    semaphore_posted_by_a_peer_shm: semaphores(SHM);
    semaphore_posted_by_a_peer_tcp: semaphores(TCP);
}

// ----- direct pointers and sleeping signal waits --------------------------------------------

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

const SLEEP_ROUNDS: u64 = 3;
/// How long the parent waits before each signalling put.
const SLEEP_GAP: Duration = Duration::from_millis(150);

/// Times this thread gave up the cpu on its own (slept).
fn voluntary_switches() -> i64 {
    // SAFETY: a zeroed rusage is valid for getrusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    ru.ru_nvcsw as i64
}

fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
}

/// Waits, sleeping, for each round's signal; the data must be there when it returns, it
/// must return soon after the put, and it must not have spun meanwhile.
///
/// With `COURIER_SIGNAL_NAP=inf` a sleep ends only when something wakes the worker: the
/// wait has a 10 s limit (it looks at the word once more when the limit ends its sleep),
/// so a put-with-signal that woke no one shows as a wait 10 s late.
fn child_sleeper() {
    let t = target();
    let only_woken = std::env::var("COURIER_SIGNAL_NAP").is_ok_and(|v| v == "inf");
    let d = Region::new(&t.c, Mem::Alloc, SLOT * 4, access::ALL);
    let s = Region::new(&t.c, Mem::Alloc, 64, access::ALL);
    t.publish(&[d.key(), s.key()]);
    let (mut cpu, mut wall, mut naps) = (Duration::ZERO, Duration::ZERO, 0);
    for r in 1..=SLEEP_ROUNDS {
        let (c0, w0, n0) = (cpu_time(), Instant::now(), voluntary_switches());
        let limit = only_woken.then_some(Duration::from_secs(10));
        let v = s
            .mem
            .signal_wait_until_timeout(Some(&t.w), 0, Cmp::Ge, r, true, limit)
            .unwrap();
        let late = unix_now();
        cpu += cpu_time() - c0;
        wall += w0.elapsed();
        naps += voluntary_switches() - n0;
        assert_eq!(v, r);
        let got = d.at(r as usize * SLOT, SLOT);
        assert!(
            got[8..] == pattern(SLOT, r)[8..],
            "round {r}: signal before data"
        );
        let sent = Duration::from_nanos(u64::from_le_bytes(got[..8].try_into().unwrap()));
        let delay = late.saturating_sub(sent);
        assert!(
            delay < Duration::from_secs(5),
            "round {r}: woke {delay:?} after the put"
        );
        send_u64(&t.ep(), ACK, r);
    }
    eprintln!("sleeping waits: {cpu:?} of cpu in {wall:?}, {naps} naps");
    // A spinning wait never gives up the cpu on its own (however busy the machine, which
    // makes its cpu share a poor witness); one that sleeps does, every millisecond or so
    // (counted as one per 50 ms: on a crowded machine a woken sleeper waits for a CPU), or,
    // when only a wakeup ends its sleep, at least once in each round.
    let least = if only_woken {
        SLEEP_ROUNDS as u128
    } else {
        wall.as_millis() / 50
    };
    assert!(
        naps as u128 >= least,
        "a sleeping wait slept {naps} times in {wall:?} ({cpu:?} of cpu): it spun"
    );
    t.recv_u64(EXIT);
}

/// `nap`: the child's `COURIER_SIGNAL_NAP` (`inf`: only a wakeup ends its sleeps).
fn sleeping_wait(net: Net, nap: &str) {
    let mut kid = Kid::spawn("sleeper", net, &[("COURIER_SIGNAL_NAP", nap.to_string())]);
    let cl = client(&mut kid, net);
    if net.tls != "tcp" {
        // Once the endpoint runs on shared memory, a same-host put-with-signal writes the
        // child's memory directly (before, it goes through the child as a frame).
        progress_until(&cl.w, &mut kid, "the shared-memory link", || {
            cl.ep.transport() == Some("shm")
        });
        assert_eq!(cl.rk[1].path(), "direct");
    }
    let (d, s) = (&cl.rk[0], &cl.rk[1]);
    let (db, _) = d.bounds();
    let (sb, _) = s.bounds();
    for r in 1..=SLEEP_ROUNDS {
        std::thread::sleep(SLEEP_GAP);
        let mut data = pattern(SLOT, r);
        data[..8].copy_from_slice(&(unix_now().as_nanos() as u64).to_le_bytes());
        cl.ep
            .put_signal(&data, db + r * SLOT as u64, d, sb, s, r, SignalOp::Set)
            .unwrap();
        // No flush: on shared memory it could send the child a frame, which would wake
        // it whether or not the put did.
        assert_eq!(recv_u64(&cl.w, &mut kid, ACK), r);
    }
    let err = cl.finish(&mut kid);
    eprintln!("{}", err.trim());
}

matrix! {
    signal_wait_sleeping_woken_by_a_peer_shm: sleeping_wait(SHM, "1ms");
    signal_wait_sleeping_woken_by_a_peer_tcp: sleeping_wait(TCP, "1ms");
    signal_wait_sleeping_woken_only_by_a_direct_put_shm: sleeping_wait(SHM, "inf");
    signal_wait_sleeping_woken_only_by_a_framed_put_tcp: sleeping_wait(TCP, "inf");
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
