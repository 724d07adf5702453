//! One-sided operations between real processes that must be refused: forged, stale and
//! out-of-range keys and missing rights, on every path; a tcp target that logs what it
//! refused and goes on serving; and signalling puts larger than a frame, honest and
//! refused. The set-ups and transports are those of tests/common/net.rs; tests/rma_paths.rs
//! and rma_waits.rs have the operations that succeed.

use std::sync::atomic::Ordering;

use courier::*;

mod common;
use common::net::{Net, SHM, SHM_NOCMA, TCP, actor, target};
use common::*;

#[test]
fn child_entry() {
    run_child(&[
        ("forged", child_forged),
        ("log_target", child_log_target),
        ("bigsig", child_bigsig),
        ("bigsig_badkey", child_bigsig_badkey),
        ("bigput_overrun", child_bigput_overrun),
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
