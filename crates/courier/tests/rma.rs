//! One-sided operations between real processes. The parent owns the memory; children
//! (this binary re-run) connect, unpack the keys passed in their environment, and act.
//! Each scenario runs over shared memory and over TCP.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::{
    Owner, child_command, dial, keys_from_env, keys_hex, port_from_env, sizes_in, stderr_of,
};

fn ctx(tls: &str) -> Context {
    ctx_with(tls, &[])
}

fn ctx_with(tls: &str, cfg: &[(&str, &str)]) -> Context {
    let f = Features {
        rma: true,
        atomics: true,
        ..Default::default()
    };
    let mut p = ContextParams::default()
        .features(f)
        .config("COURIER_TLS", tls);
    for (k, v) in cfg {
        p = p.config(k, v);
    }
    Context::new(p).unwrap()
}

// ----- the owner (parent) -------------------------------------------------------------------

fn owner(tls: &str) -> (Owner, Context) {
    owner_with(tls, &[])
}

fn owner_with(tls: &str, cfg: &[(&str, &str)]) -> (Owner, Context) {
    let o = Owner::on(ctx_with(tls, cfg));
    let c = o.c.clone();
    (o, c)
}

fn spawn(
    tls: &str,
    scenario: &str,
    port: u16,
    keys: &[Vec<u8>],
    extra: &[(&str, String)],
) -> Child {
    command(tls, scenario, port, keys, extra).spawn().unwrap()
}

fn command(
    tls: &str,
    scenario: &str,
    port: u16,
    keys: &[Vec<u8>],
    extra: &[(&str, String)],
) -> Command {
    let mut cmd = child_command(scenario);
    cmd.env("COURIER_TLS", tls)
        .env("COURIER_TEST_PORT", port.to_string())
        .env("COURIER_TEST_KEYS", keys_hex(keys))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// Progress the owner until every child exits; each must exit 0.
fn serve_until_done(o: &Owner, mut children: Vec<Child>, mut also: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !children.is_empty() {
        o.w.progress();
        also();
        let mut i = 0;
        while i < children.len() {
            if let Some(st) = children[i].try_wait().unwrap() {
                let mut c = children.remove(i);
                let _ = c.wait();
                let err = stderr_of(&mut c);
                assert!(st.success(), "child failed ({st}):\n{err}");
            } else {
                i += 1;
            }
        }
        assert!(Instant::now() < deadline, "children did not finish in time");
    }
}

// ----- the children -------------------------------------------------------------------------

fn child_entry_main() -> bool {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return false;
    };
    let tls = std::env::var("COURIER_TLS").unwrap();
    let port = port_from_env();
    let keys = keys_from_env();
    let c = ctx(&tls);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, std::process::id() as u64);
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    let rk: Vec<RemoteKey> = keys.iter().map(|k| ep.rkey_unpack(k).unwrap()).collect();
    match role.as_str() {
        "putget" => child_putget(&w, &ep, &rk, &tls),
        "atomics" => child_atomics(&ep, &rk),
        "liar" => child_liar(&ep, &rk, &keys),
        "bigput" => {
            // The owner unmaps the region while this put's data arrives: refused, and
            // reported by the flush.
            let (base, len) = rk[0].bounds();
            ep.put(&pattern(len as usize, 1), base, &rk[0]).unwrap();
            let e = ep.flush().expect_err("region unmapped during the put");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
        }
        "stalled_get" => {
            // Ask for the whole region, then read nothing until the owner says so: its
            // answers back up on its side. It unmaps the region meanwhile and overwrites
            // the memory with 0xee: the get is refused, and nothing read after the unmap
            // reaches us.
            let (base, len) = rk[0].bounds();
            let mut buf = vec![0u8; len as usize];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let r = unsafe { ep.get_nb(&mut buf, base, &rk[0]) }.unwrap();
            println!("asked"); // after the test harness's own words on that line
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            let e = r
                .wait()
                .expect_err("the region was unmapped while the get's answer waited to leave");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
            assert!(
                buf.iter().all(|&b| b == 0 || b == 0x5a),
                "bytes of the region read after it was unmapped reached the peer"
            );
        }
        "swapped_fd" => {
            // Region a's key with region b's segment fd: refused when unpacked, naming why;
            // whatever happens, nothing lands in b (the owner checks).
            let mut forged = keys[0].clone();
            let fd = courier::wire::rkey::field::REGION_FD;
            forged[fd.clone()].copy_from_slice(&keys[1][fd]);
            courier::wire::rkey::reseal(&mut forged);
            assert_ne!(forged, keys[0], "the regions have different segment fds");
            let (base, len) = rk[0].bounds();
            let r = ep.rkey_unpack(&forged);
            if let Ok(k) = &r {
                let _ = ep.put(&vec![0xabu8; len as usize], base, k);
                let _ = ep.flush();
            }
            let e = r
                .err()
                .expect("a key naming another region's segment was accepted");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
            assert!(e.detail().contains("forged key"), "{e}");
            // The honest key still works.
            ep.put(&vec![0xcdu8; len as usize], base, &rk[0]).unwrap();
        }
        "past_the_key" => child_partial(&ep, &keys, false),
        "partial_liar" => child_partial(&ep, &keys, true),
        "fence" => {
            // rk[0]: registered memory, reached through the owner (CMA is off); rk[1]:
            // allocated memory, stored to directly. Each round: an operation through the
            // owner, a fence, then a direct store the owner watches for.
            assert_eq!(rk[0].path(), "remote");
            assert_eq!(rk[1].path(), "direct");
            let (x, _) = rk[0].bounds();
            let (y, _) = rk[1].bounds();
            for i in 1..=FENCE_ROUNDS {
                // In step with the owner, which watches for this round's store.
                let mut go = [0u8; 8];
                w.tag_recv(&mut go, 0xf0, u64::MAX).unwrap();
                assert_eq!(u64::from_le_bytes(go), i);
                let word = i.to_le_bytes();
                let before = if i % 2 == 1 {
                    ep.atomic(AtomicOp::Swap, i, 0, x, &rk[0], false).unwrap()
                } else {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    unsafe { ep.put_nb(&word, x, &rk[0]) }.unwrap()
                };
                ep.fence().unwrap();
                ep.put(&i.to_le_bytes(), y, &rk[1]).unwrap();
                before.wait().unwrap();
            }
        }
        "fadd" => {
            let n: u64 = std::env::var("COURIER_TEST_N").unwrap().parse().unwrap();
            let (base, _) = rk[0].bounds();
            for _ in 0..n {
                ep.atomic(AtomicOp::Add, 1, 0, base, &rk[0], false)
                    .unwrap()
                    .wait()
                    .unwrap();
            }
        }
        "signaler" => child_signaler(&w, &ep, &rk),
        "shortened" => {
            // The key claims 8 bytes of a three-page region; the owner's record says three
            // pages. The key reaches only what it claims, on every path: past that (inside
            // the record) puts and gets are refused before anything is touched or sent.
            let (base, _) = rk[0].bounds();
            let at = base + SHORTENED_AT as u64;
            expect_err(
                &ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.put_nb(&[0xeeu8; 8], at, &rk[0]) },
                Status::OutOfRange,
            );
            let mut got = [0u8; 8];
            expect_err(
                &ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.get_nb(&mut got, at, &rk[0]) },
                Status::OutOfRange,
            );
            expect_err(
                &ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.put_nb(&[0xeeu8; 16], base, &rk[0]) },
                Status::OutOfRange,
            );
            // What it claims works.
            ep.put(&[0xabu8; 8], base, &rk[0]).unwrap();
            ep.get(&mut got, base, &rk[0]).unwrap();
            assert_eq!(got, [0xab; 8]);
        }
        "remap" => {
            // Write into the first region, then into a second one whose key arrives later
            // (its owner unmapped the first: the fd number is likely reused).
            let (a, alen) = rk[0].bounds();
            ep.put(&vec![0x11u8; alen as usize], a, &rk[0]).unwrap();
            ep.flush().unwrap();
            // A get and an atomic through the same key while it is good.
            let mut got = [0u8; 8];
            ep.get(&mut got, a, &rk[0]).unwrap();
            assert_eq!(got, [0x11; 8]);
            let old = ep
                .atomic(AtomicOp::Add, 0, 0, a, &rk[0], false)
                .unwrap()
                .wait()
                .unwrap()
                .value;
            assert_eq!(old, u64::from_le_bytes([0x11; 8]));
            ep.tag_send(b"A", 0xa1).unwrap();
            let mut kb = vec![0u8; 200];
            let n = w.tag_recv(&mut kb, 0xb, u64::MAX).unwrap().length;
            let k2 = ep.rkey_unpack(&kb[..n]).unwrap();
            let (b, blen) = k2.bounds();
            ep.put(&vec![0x22u8; blen as usize], b, &k2).unwrap();
            ep.flush().unwrap();
            // The first key is stale now.
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let e = unsafe { ep.put_nb(&[1u8; 8], a, &rk[0]) }
                .and_then(|r| r.wait())
                .and_then(|_| ep.flush())
                .expect_err("stale key");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
            // Gets and atomics see it too (on shm they check the same view of the owner's
            // record as puts, made while the key was good); the new region, likely at the
            // same address, is left alone (the owner checks its bytes).
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let e = unsafe { ep.get_nb(&mut got, a, &rk[0]) }
                .and_then(|r| r.wait())
                .expect_err("stale key, get");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
            let e = ep
                .atomic(AtomicOp::Add, 1, 0, a, &rk[0], false)
                .and_then(|r| r.wait())
                .expect_err("stale key, atomic");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
            ep.tag_send(b"B", 0xb1).unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    ep.flush().unwrap();
    w.flush().unwrap();
    std::process::exit(0);
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn child_putget(_w: &Worker, ep: &Endpoint, rk: &[RemoteKey], tls: &str) {
    // rk[0]: allocated (direct on shm), rk[1]: registered (cma on shm).
    let want = if tls == "tcp" {
        ["remote", "remote"]
    } else {
        ["direct", "cma"]
    };
    for (k, w) in rk.iter().zip(want) {
        assert_eq!(k.path(), w);
        let (base, len) = k.bounds();
        for (i, size, off) in sizes_in(len) {
            let data = pattern(size, i as u8);
            ep.put(&data, base + off, k).unwrap();
            let mut back = vec![0u8; size];
            ep.get(&mut back, base + off, k).unwrap();
            assert!(
                back == data,
                "{}: {size} bytes at offset {off} came back different",
                k.path()
            );
        }
        // Gather and scatter.
        let parts = [pattern(10, 1), pattern(5000, 2), pattern(3, 3)];
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        ep.put_iov(&refs, base + 64, k).unwrap();
        let (mut x, mut y) = (vec![0u8; 4000], vec![0u8; 1013]);
        {
            let mut iov = [&mut x[..], &mut y[..]];
            ep.get_iov(&mut iov, base + 64, k).unwrap();
        }
        assert_eq!([x, y].concat(), parts.concat(), "{}: iov put/get", k.path());
        // Leave a known pattern for the owner to check.
        let fin = pattern(len as usize, 42);
        ep.put(&fin, base, k).unwrap();
    }
}

fn child_atomics(ep: &Endpoint, rk: &[RemoteKey]) {
    let k = &rk[0];
    let (base, _) = k.bounds();
    let a = base; // 64-bit word, starts at 0
    let b = base + 8; // 32-bit word, starts at 0
    let f = |op, v, c, addr, b32| {
        ep.atomic(op, v, c, addr, k, b32)
            .unwrap()
            .wait()
            .unwrap()
            .value
    };
    assert_eq!(f(AtomicOp::Add, 5, 0, a, false), 0);
    assert_eq!(f(AtomicOp::Add, 10, 0, a, false), 5);
    assert_eq!(f(AtomicOp::Swap, 0xff00, 0, a, false), 15);
    assert_eq!(f(AtomicOp::And, 0x0ff0, 0, a, false), 0xff00);
    assert_eq!(f(AtomicOp::Or, 0x000f, 0, a, false), 0x0f00);
    assert_eq!(f(AtomicOp::Xor, 0x0001, 0, a, false), 0x0f0f);
    assert_eq!(
        f(AtomicOp::Cswap, 77, 0x1234, a, false),
        0x0f0e,
        "failed compare leaves the value"
    );
    assert_eq!(f(AtomicOp::Cswap, 77, 0x0f0e, a, false), 0x0f0e);
    assert_eq!(f(AtomicOp::Add, 0, 0, a, false), 77);
    assert_eq!(f(AtomicOp::Add, u32::MAX as u64, 0, b, true), 0);
    assert_eq!(
        f(AtomicOp::Add, 2, 0, b, true),
        u32::MAX as u64,
        "32-bit wraps"
    );
    assert_eq!(f(AtomicOp::Cswap, 9, 1, b, true), 1);
    assert_eq!(f(AtomicOp::Swap, 3, 0, b, true), 9);
    let e = ep
        .atomic(AtomicOp::Add, 1, 0, a + 1, k, false)
        .err()
        .expect("misaligned");
    assert_eq!(e.status(), Status::InvalidParam);
}

/// The operation must be refused with `st`: at once, at completion, or (puts through the
/// target, which are not acknowledged one by one) at the next flush.
fn expect_err(ep: &Endpoint, r: Result<Request<'_>>, st: Status) {
    let e = match r {
        Err(e) => e,
        Ok(req) => match req.wait() {
            Err(e) => e,
            Ok(_) => ep.flush().expect_err("operation should have been refused"),
        },
    };
    assert_eq!(e.status(), st, "{e}");
    assert!(ep.flush().is_ok(), "an error is reported once");
}

fn child_liar(ep: &Endpoint, rk: &[RemoteKey], raw: &[Vec<u8>]) {
    use courier::wire::rkey;
    // rk[0]: writable region of 4096, rk[1]: read-only region, rk[2]: unmapped before we ran.
    let (base, len) = rk[0].bounds();
    let junk = [0xeeu8; 64];
    // Forged secret.
    let mut forged = raw[0].clone();
    forged[rkey::field::SECRET.start] ^= 0x55;
    rkey::reseal(&mut forged);
    let fk = ep.rkey_unpack(&forged).unwrap();
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&junk, base, &fk) },
        Status::InvalidKey,
    );
    expect_err(
        ep,
        ep.atomic(AtomicOp::Add, 1, 0, base, &fk, false),
        Status::InvalidKey,
    );
    // Forged bounds: claims 1 MiB on a 4 KiB region.
    let mut big = raw[0].clone();
    big[rkey::field::LENGTH].copy_from_slice(&(1u64 << 20).to_le_bytes());
    rkey::reseal(&mut big);
    let bk = ep.rkey_unpack(&big).unwrap();
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&junk, base + len, &bk) },
        Status::OutOfRange,
    );
    // Out of range with an honest key.
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ep.put_nb(&junk, base + len - 8, &rk[0]) },
        Status::OutOfRange,
    );
    let mut sink = [0u8; 16];
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.get_nb(&mut sink, base - 16, &rk[0]) },
        Status::OutOfRange,
    );
    // The same lies with payloads large enough to be read straight into memory on tcp:
    // refused before a byte lands. (The forged secret comes with forged bounds, or the
    // sender itself refuses a put its key does not cover.)
    let big_junk = vec![0xeeu8; 300_000];
    let mut both = big.clone();
    both[rkey::field::SECRET.start] ^= 0x55;
    rkey::reseal(&mut both);
    let fbk = ep.rkey_unpack(&both).unwrap();
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&big_junk, base, &fbk) },
        Status::InvalidKey,
    );
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&big_junk, base, &fk) },
        Status::OutOfRange,
    );
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&big_junk, base, &bk) },
        Status::OutOfRange,
    );
    // No right.
    let (rbase, _) = rk[1].bounds();
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&junk, rbase, &rk[1]) },
        Status::AccessDenied,
    );
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ep.put_nb(&big_junk[..40_000], rbase, &rk[1]) },
        Status::AccessDenied,
    );
    expect_err(
        ep,
        ep.atomic(AtomicOp::Add, 1, 0, rbase, &rk[1], false),
        Status::AccessDenied,
    );
    // Stale key (region unmapped by its owner).
    let (sbase, _) = rk[2].bounds();
    expect_err(
        ep,
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
        // or goes; it is never forgotten.
        unsafe { ep.put_nb(&junk, sbase, &rk[2]) },
        Status::InvalidKey,
    );
    // Garbage key bytes.
    assert_eq!(
        ep.rkey_unpack(&raw[0][..20]).err().map(|e| e.status()),
        Some(Status::InvalidKey)
    );
    // Honest operations still work afterwards.
    let mut back = [0u8; 8];
    ep.get(&mut back, rbase, &rk[1]).unwrap();
    assert_eq!(back, [7u8; 8]);
}

/// `key` as if its owner were on another host: the peer cannot check the owner's records
/// itself, so every operation goes through the owner (on shared memory too), and the peer
/// knows only what the key claims.
fn through_owner(ep: &Endpoint, key: &[u8]) -> RemoteKey {
    let mut k = key.to_vec();
    k[courier::wire::rkey::field::HOST_ID.start] ^= 0xff;
    courier::wire::rkey::reseal(&mut k);
    let rk = ep.rkey_unpack(&k).unwrap();
    assert_eq!(rk.path(), "remote");
    rk
}

/// The "partial" scenarios' keys, every one reached through the owner. raw[0]: a writable
/// region of PARTIAL_LEN bytes, raw[1]: a read-only region, raw[2]: another writable region
/// of PARTIAL_LEN bytes, raw[3]: a signal word.
fn child_partial(ep: &Endpoint, raw: &[Vec<u8>], liar: bool) {
    let r = through_owner(ep, &raw[0]);
    let ro = through_owner(ep, &raw[1]);
    let r2 = through_owner(ep, &raw[2]);
    let sig = through_owner(ep, &raw[3]);
    let (base, len) = r.bounds();
    let (rob, _) = ro.bounds();
    let (sbase, _) = sig.bounds();
    let len = len as usize;
    // Many frames, the first ones inside the region, the last ones past its end.
    let over = vec![0xeeu8; len + len / 5];
    if !liar {
        // Past the end of what the key says: refused before anything leaves.
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let e = unsafe { ep.put_nb(&over, base, &r) }
            .err()
            .expect("refused before sending");
        assert_eq!(e.status(), Status::OutOfRange, "{e}");
        // Data inside, signal word without the write right: the same.
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let e = unsafe { ep.put_signal_nb(&over[..len], base, &r, rob, &ro, 1, SignalOp::Set) }
            .err()
            .expect("refused before sending");
        assert_eq!(e.status(), Status::AccessDenied, "{e}");
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let e =
            unsafe { ep.put_signal_nb(&over[..len], base, &r, sbase + 64, &sig, 1, SignalOp::Set) }
                .err()
                .expect("refused before sending");
        assert_eq!(e.status(), Status::OutOfRange, "{e}");
    } else {
        // A key that claims four times its region passes the sender's check: the owner
        // refuses the whole put at its first frame.
        let mut big = raw[0].clone();
        big[courier::wire::rkey::field::LENGTH].copy_from_slice(&(4 * len as u64).to_le_bytes());
        courier::wire::rkey::reseal(&mut big);
        let bk = through_owner(ep, &big);
        expect_err(
            ep,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
            // again or goes; it is never forgotten.
            unsafe { ep.put_nb(&over, base, &bk) },
            Status::OutOfRange,
        );
        // A forged signal key: nothing of the data is written either.
        let mut forged = raw[3].clone();
        forged[courier::wire::rkey::field::SECRET.start] ^= 0x55;
        let fs = through_owner(ep, &forged);
        expect_err(
            ep,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { ep.put_signal_nb(&over[..len], base, &r, sbase, &fs, 1, SignalOp::Set) },
            Status::InvalidKey,
        );
        // Data past the region's end with a good signal: neither lands.
        expect_err(
            ep,
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { ep.put_signal_nb(&over, base, &bk, sbase, &sig, 1, SignalOp::Set) },
            Status::OutOfRange,
        );
    }
    // The owner goes on serving: an honest put-with-signal of as many frames lands whole.
    let (base2, _) = r2.bounds();
    ep.put_signal(
        &vec![0x22u8; len],
        base2,
        &r2,
        sbase,
        &sig,
        7,
        SignalOp::Set,
    )
    .unwrap();
    ep.flush().unwrap();
}

const SLOTS: u64 = 16;
const SLOT: usize = 4096;

fn child_signaler(w: &Worker, ep: &Endpoint, rk: &[RemoteKey]) {
    let n: u64 = std::env::var("COURIER_TEST_N").unwrap().parse().unwrap();
    let (dbase, _) = rk[0].bounds();
    let (sbase, _) = rk[1].bounds();
    let mut msg = vec![0u8; SLOT];
    for i in 1..=n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        msg[8..].fill(i as u8);
        let slot = (i % SLOTS) * SLOT as u64;
        ep.put_signal(&msg, dbase + slot, &rk[0], sbase, &rk[1], i, SignalOp::Set)
            .unwrap();
        if i % SLOTS == 0 {
            // Wait for the consumer to have read this round before overwriting slots.
            let mut ack = [0u8; 8];
            w.tag_recv(&mut ack, 0xac, u64::MAX).unwrap();
            assert_eq!(u64::from_le_bytes(ack), i);
        }
    }
}

#[test]
fn child_entry() {
    child_entry_main();
}

// ----- the scenarios ------------------------------------------------------------------------

fn putget(tls: &str) {
    let (o, c) = owner(tls);
    let alloc = c.mem_map(MemMapParams::allocate(1 << 20)).unwrap();
    let mut reg = vec![0u8; 1 << 20];
    let regm = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(reg.as_mut_ptr(), reg.len()) })
        .unwrap();
    let keys = vec![alloc.pack_rkey().unwrap(), regm.pack_rkey().unwrap()];
    let child = spawn(tls, "putget", o.port, &keys, &[]);
    serve_until_done(&o, vec![child], || {});
    let want = pattern(1 << 20, 42);
    // SAFETY: the allocated region is ours and idle now.
    let got = unsafe { std::slice::from_raw_parts(alloc.as_ptr(), 1 << 20) };
    assert!(
        got == &want[..],
        "allocated region does not hold what the peer put"
    );
    drop(regm);
    assert!(
        reg == want,
        "registered region does not hold what the peer put"
    );
}

/// Over tcp a large put's data is read from the socket straight into registered memory.
/// When the owner unmaps the region while it arrives, nothing more is written there (the
/// owner frees and reuses such memory), and the put is refused.
#[test]
fn region_unmapped_while_a_put_arrives_tcp() {
    let (o, c) = owner("tcp");
    let len = 16 << 20;
    let mut reg = vec![0u8; len];
    let m = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(reg.as_mut_ptr(), len) })
        .unwrap();
    let child = spawn("tcp", "bigput", o.port, &[m.pack_rkey().unwrap()], &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    // SAFETY: our buffer; the link writes it only inside progress, on this thread.
    while unsafe { std::ptr::read_volatile(reg.as_ptr()) } == 0 {
        o.w.progress();
        assert!(Instant::now() < deadline, "the put did not start arriving");
    }
    let landed = reg.iter().rposition(|&b| b != 0).unwrap_or(0) + 1;
    assert!(
        landed < len,
        "the whole put arrived in one progress call; the test needs more"
    );
    drop(m);
    reg.fill(0xee);
    serve_until_done(&o, vec![child], || {});
    assert!(
        reg.iter().all(|&b| b == 0xee),
        "the put wrote into the region after it was unmapped"
    );
}

/// Over tcp a get's answer is sent straight from the region; when the peer does not read,
/// the frames that do not fit the link's queue wait in the endpoint's queue, pointing into
/// the region. The owner unmaps the region (and frees or reuses the memory) meanwhile:
/// those frames are never sent from it, the get is refused at the peer, and the owner goes
/// on serving.
fn stalled_get(allocated: bool) {
    use std::io::{BufRead, Write};
    // Small socket buffers: the link's own queue fills, the rest waits in the endpoint's.
    let small = [("COURIER_TCP_SNDBUF", "64k"), ("COURIER_TCP_RCVBUF", "64k")];
    let (o, c) = owner_with("tcp", &small);
    let len = 128 << 20;
    let mut reg = vec![0x5au8; if allocated { 0 } else { len }];
    let m = if allocated {
        let m = c.mem_map(MemMapParams::allocate(len)).unwrap();
        m.write(0, &vec![0x5au8; len]).unwrap();
        m
    } else {
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        c.mem_map(unsafe { MemMapParams::register(reg.as_mut_ptr(), len) })
            .unwrap()
    };
    let mut child = command(
        "tcp",
        "stalled_get",
        o.port,
        &[m.pack_rkey().unwrap()],
        &[("COURIER_TCP_RCVBUF", "64k".into())],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, asked) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            if line.is_ok_and(|l| l.ends_with("asked")) {
                let _ = tx.send(());
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while asked.try_recv().is_err() {
        o.w.progress();
        assert!(Instant::now() < deadline, "the child did not ask");
    }
    // The request is on its way: answer it, until the link backs up.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        o.w.progress();
    }
    drop(m);
    reg.fill(0xee);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    serve_until_done(&o, vec![child], || {});
}

#[test]
fn get_answers_queued_when_the_region_is_unmapped_registered_tcp() {
    stalled_get(false);
}

#[test]
fn get_answers_queued_when_the_region_is_unmapped_allocated_tcp() {
    stalled_get(true);
}

#[test]
fn put_get_shm() {
    putget("all");
}

#[test]
fn put_get_tcp() {
    putget("tcp");
}

fn atomics(tls: &str) {
    let (o, c) = owner(tls);
    let m = c.mem_map(MemMapParams::allocate(64)).unwrap();
    let child = spawn(tls, "atomics", o.port, &[m.pack_rkey().unwrap()], &[]);
    serve_until_done(&o, vec![child], || {});
    assert_eq!(m.signal_fetch(0).unwrap(), 77);
}

#[test]
fn atomics_shm() {
    atomics("all");
}

#[test]
fn atomics_tcp() {
    atomics("tcp");
}

fn liar(tls: &str) {
    let (o, c) = owner(tls);
    let target = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    // SAFETY: our own fresh region.
    unsafe { std::ptr::write_bytes(target.as_ptr(), 0x11, 4096) };
    let mut ro = vec![7u8; 65536];
    let rom = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(ro.as_mut_ptr(), ro.len()) }.access(access::READ))
        .unwrap();
    let stale = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    let keys = vec![
        target.pack_rkey().unwrap(),
        rom.pack_rkey().unwrap(),
        stale.pack_rkey().unwrap(),
    ];
    let stale_ptr = stale.as_ptr() as usize;
    drop(stale);
    let _ = stale_ptr;
    let child = spawn(tls, "liar", o.port, &keys, &[]);
    serve_until_done(&o, vec![child], || {});
    // SAFETY: our own region.
    let t = unsafe { std::slice::from_raw_parts(target.as_ptr(), 4096) };
    assert!(
        t.iter().all(|&b| b == 0x11),
        "a refused operation touched the target's memory"
    );
    drop(rom);
    assert!(
        ro.iter().all(|&b| b == 7),
        "a refused put touched read-only memory"
    );
}

/// Regions of the "partial" scenario: more than one frame on every link (16 MiB on tcp).
const PARTIAL_LEN: usize = 20 << 20;

/// Puts and puts-with-signal through the owner that are refused (past the region's end, a
/// signal word without the right or with a forged key) write nothing, though their data
/// takes many frames: the sender refuses what its key does not allow before anything
/// leaves ("past_the_key"), and the owner refuses the whole operation at its first frame
/// (a lying key, "partial_liar").
fn partial(tls: &str, role: &str) {
    let (o, c) = owner(tls);
    let mut r = vec![0x11u8; PARTIAL_LEN];
    let rm = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(r.as_mut_ptr(), r.len()) })
        .unwrap();
    let mut ro = vec![7u8; 4096];
    let rom = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(ro.as_mut_ptr(), ro.len()) }.access(access::READ))
        .unwrap();
    let mut r2 = vec![0u8; PARTIAL_LEN];
    let r2m = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(r2.as_mut_ptr(), r2.len()) })
        .unwrap();
    let sig = c.mem_map(MemMapParams::allocate(64)).unwrap();
    let keys = [&rm, &rom, &r2m, &sig].map(|m| m.pack_rkey().unwrap());
    let child = spawn(tls, role, o.port, &keys, &[]);
    serve_until_done(&o, vec![child], || {});
    assert_eq!(sig.signal_fetch(0).unwrap(), 7, "the honest signal");
    drop((rm, rom, r2m));
    let first = r.iter().position(|&b| b != 0x11);
    assert_eq!(first, None, "a refused put wrote into the region");
    assert!(
        ro.iter().all(|&b| b == 7),
        "a refused put wrote into read-only memory"
    );
    assert!(
        r2.iter().all(|&b| b == 0x22),
        "the honest put did not land whole"
    );
}

#[test]
fn puts_past_their_key_are_refused_before_sending_shm() {
    partial("all", "past_the_key");
}

#[test]
fn puts_past_their_key_are_refused_before_sending_tcp() {
    partial("tcp", "past_the_key");
}

#[test]
fn puts_refused_by_the_owner_write_none_of_their_frames_shm() {
    partial("all", "partial_liar");
}

#[test]
fn puts_refused_by_the_owner_write_none_of_their_frames_tcp() {
    partial("tcp", "partial_liar");
}

/// Where the "shortened" child puts, in a region of `3 * 4096` bytes.
const SHORTENED_AT: usize = 2 * 4096 + 8;

fn shortened(tls: &str) {
    let (o, c) = owner(tls);
    let len = 3 * 4096;
    let target = c.mem_map(MemMapParams::allocate(len)).unwrap();
    // SAFETY: our own fresh region.
    unsafe { std::ptr::write_bytes(target.as_ptr(), 0x11, len) };
    let mut key = target.pack_rkey().unwrap();
    key[courier::wire::rkey::field::LENGTH].copy_from_slice(&8u64.to_le_bytes());
    courier::wire::rkey::reseal(&mut key);
    let child = spawn(tls, "shortened", o.port, &[key], &[]);
    serve_until_done(&o, vec![child], || {});
    // SAFETY: our own region.
    let t = unsafe { std::slice::from_raw_parts(target.as_ptr(), len) };
    assert_eq!(t[..8], [0xab; 8]);
    assert!(
        t[8..].iter().all(|&b| b == 0x11),
        "a put landed past what its key claims"
    );
}

#[test]
fn key_shorter_than_its_region_shm() {
    shortened("all");
}

#[test]
fn key_shorter_than_its_region_tcp() {
    shortened("tcp");
}

/// A key whose segment fd is another region's: refused, and the other region untouched.
#[test]
fn key_naming_another_regions_segment_shm() {
    let (o, c) = owner("all");
    let a = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    let b = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    a.write(0, &[0x11; 4096]).unwrap();
    b.write(0, &[0x11; 4096]).unwrap();
    let keys = [a.pack_rkey().unwrap(), b.pack_rkey().unwrap()];
    let child = spawn("all", "swapped_fd", o.port, &keys, &[]);
    serve_until_done(&o, vec![child], || {});
    let mut got = [0u8; 4096];
    b.read(0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0x11),
        "a write through a forged key landed in another region"
    );
    a.read(0, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xcd),
        "the honest key's write did not land"
    );
}

const FENCE_ROUNDS: u64 = 20;

/// A fence orders an operation still on its way to the owner (an atomic, or a put, on
/// registered memory with CMA off) before a direct store issued after it on the same
/// endpoint: whoever sees the store sees the operation's effect.
#[test]
fn fence_orders_operations_through_the_owner_before_direct_stores_shm() {
    let (o, c) = owner("all");
    let mut x = vec![0u64; 8];
    let xm = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(x.as_mut_ptr().cast(), 64) })
        .unwrap();
    let y = c.mem_map(MemMapParams::allocate(64)).unwrap();
    let keys = [xm.pack_rkey().unwrap(), y.pack_rkey().unwrap()];
    let mut child = spawn(
        "all",
        "fence",
        o.port,
        &keys,
        &[("COURIER_SHM_CMA", "no".into())],
    );
    let xp = x.as_ptr();
    let deadline = Instant::now() + Duration::from_secs(60);
    while o.eps.lock().unwrap().is_empty() {
        o.w.progress();
        assert!(Instant::now() < deadline, "the child did not connect");
    }
    let ep = o.eps.lock().unwrap()[0].clone();
    for i in 1..=FENCE_ROUNDS {
        ep.tag_send(&i.to_le_bytes(), 0xf0).unwrap();
        // Watch the flag, progressing only now and then: an operation the fence did not
        // wait for is still unprocessed here when the flag rises.
        'seen: loop {
            let until = Instant::now() + Duration::from_millis(20);
            while Instant::now() < until {
                if y.signal_fetch(0).unwrap() == i {
                    break 'seen;
                }
            }
            o.w.progress();
            if y.signal_fetch(0).unwrap() == i {
                break 'seen;
            }
            if let Some(st) = child.try_wait().unwrap() {
                let err = stderr_of(&mut child);
                panic!("child ended in round {i} ({st}):\n{err}");
            }
            assert!(Instant::now() < deadline, "round {i} did not finish");
        }
        // SAFETY: our registered word; the owner's progress (this thread) writes it.
        let got = unsafe { std::ptr::read_volatile(xp) };
        assert_eq!(
            got, i,
            "a direct store issued after a fence was seen before the operation issued before it"
        );
    }
    serve_until_done(&o, vec![child], || {});
    drop(xm);
}

#[test]
fn forged_and_stale_keys_shm() {
    liar("all");
}

#[test]
fn forged_and_stale_keys_tcp() {
    liar("tcp");
}

fn fadd(tls: &str) {
    let (o, c) = owner(tls);
    let m = c.mem_map(MemMapParams::allocate(64)).unwrap();
    let key = m.pack_rkey().unwrap();
    let (procs, each) = (4u64, 2000u64);
    let children = (0..procs)
        .map(|_| {
            spawn(
                tls,
                "fadd",
                o.port,
                std::slice::from_ref(&key),
                &[("COURIER_TEST_N", each.to_string())],
            )
        })
        .collect();
    // The owner adds too, locally, through the same memory.
    let own = Endpoint::clone(
        &o.w.connect(&o.w.address().unwrap(), EndpointParams::default())
            .unwrap(),
    );
    let ok = own.rkey_unpack(&key).unwrap();
    let mut mine = 0;
    serve_until_done(&o, children, || {
        if mine < each {
            own.atomic(AtomicOp::Add, 1, 0, m.as_ptr() as u64, &ok, false)
                .unwrap()
                .wait()
                .unwrap();
            mine += 1;
        }
    });
    while mine < each {
        own.atomic(AtomicOp::Add, 1, 0, m.as_ptr() as u64, &ok, false)
            .unwrap()
            .wait()
            .unwrap();
        mine += 1;
    }
    assert_eq!(m.signal_fetch(0).unwrap(), (procs + 1) * each);
    drop(o.eps);
}

#[test]
fn n_processes_fetch_add_one_counter_shm() {
    fadd("all");
}

#[test]
fn n_processes_fetch_add_one_counter_tcp() {
    fadd("tcp");
}

fn signals(tls: &str) {
    let (o, c) = owner(tls);
    let data = c
        .mem_map(MemMapParams::allocate(SLOTS as usize * SLOT))
        .unwrap();
    let sig = c.mem_map(MemMapParams::allocate(64)).unwrap();
    let n = 3000u64;
    let child = spawn(
        tls,
        "signaler",
        o.port,
        &[data.pack_rkey().unwrap(), sig.pack_rkey().unwrap()],
        &[("COURIER_TEST_N", n.to_string())],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while o.eps.lock().unwrap().is_empty() {
        o.w.progress();
        assert!(Instant::now() < deadline);
    }
    let ep = o.eps.lock().unwrap()[0].clone();
    for i in 1..=n {
        let seen = sig.signal_wait_until(&o.w, 0, Cmp::Ge, i, false).unwrap();
        assert!(
            seen >= i && seen <= n,
            "signal went backwards or beyond what was sent: {seen} while waiting for {i}"
        );
        let slot = ((i % SLOTS) as usize) * SLOT;
        // SAFETY: our region; the producer does not touch this slot until we ack the round.
        let s = unsafe { std::slice::from_raw_parts(data.as_ptr().add(slot), SLOT) };
        assert_eq!(
            u64::from_le_bytes(s[..8].try_into().unwrap()),
            i,
            "signal {i} seen before its data"
        );
        assert!(
            s[8..].iter().all(|&b| b == i as u8),
            "signal {i} seen before all of its data"
        );
        if i % SLOTS == 0 {
            ep.tag_send(&i.to_le_bytes(), 0xac).unwrap();
        }
    }
    serve_until_done(&o, vec![child], || {});
}

#[test]
fn put_signal_never_before_data_shm() {
    signals("all");
}

#[test]
fn put_signal_never_before_data_tcp() {
    signals("tcp");
}

fn remap(tls: &str) {
    let (o, c) = owner(tls);
    let a = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    let child = spawn(tls, "remap", o.port, &[a.pack_rkey().unwrap()], &[]);
    let mut buf = [0u8; 1];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { o.w.tag_recv_nb(&mut buf, 0xa1, u64::MAX) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !r.is_done() {
        o.w.progress();
        assert!(Instant::now() < deadline, "no word from the child");
    }
    drop(r);
    // SAFETY: our region, idle now.
    assert!(
        unsafe { std::slice::from_raw_parts(a.as_ptr(), 4096) }
            .iter()
            .all(|&x| x == 0x11)
    );
    drop(a);
    let b = c.mem_map(MemMapParams::allocate(4096)).unwrap();
    let ep = o.eps.lock().unwrap()[0].clone();
    ep.tag_send(&b.pack_rkey().unwrap(), 0xb).unwrap();
    serve_until_done(&o, vec![child], || {});
    // SAFETY: as above.
    assert!(
        unsafe { std::slice::from_raw_parts(b.as_ptr(), 4096) }
            .iter()
            .all(|&x| x == 0x22),
        "writes through the new key did not reach the new region"
    );
}

#[test]
fn remapped_region_gets_the_writes_shm() {
    remap("all");
}

#[test]
fn remapped_region_gets_the_writes_tcp() {
    remap("tcp");
}

#[test]
fn memory_types_and_semaphores() {
    let c = ctx("all");
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    // nic falls back to host and says so.
    let m = c
        .mem_map(MemMapParams::allocate(128).memory_type(MemoryType::Nic))
        .unwrap();
    assert_eq!(m.query().memory_type, MemoryType::Host);
    // cuda without a driver or device is a clear error; with one, device memory (the
    // device paths are tested against a stand-in driver in tests/cuda.rs).
    match c.mem_map(MemMapParams::allocate(128).memory_type(MemoryType::Cuda)) {
        Err(e) => {
            assert_eq!(e.status(), Status::NoDevice, "{e}");
            assert!(
                e.detail().contains("CUDA") || e.detail().contains("cuda"),
                "{e}"
            );
        }
        Ok(m) => assert_eq!(m.query().memory_type, MemoryType::Cuda),
    }
    // Semaphores.
    let s = Semaphore::new(&c, 0).unwrap();
    assert!(!s.try_wait(1));
    s.post(3).unwrap();
    assert!(s.try_wait(2));
    assert_eq!(s.value(), 1);
    s.wait(&w, 1).unwrap();
    assert!(s.post(SEM_MAX + 1).is_err());
    let b = Semaphore::new(
        &c,
        sem_flags::BOOLEAN | sem_flags::SPRODUCER | sem_flags::SCONSUMER,
    )
    .unwrap();
    b.post(1).unwrap();
    assert!(b.post(1).is_err(), "boolean semaphore holds at most 1");
    assert!(Semaphore::new(&c, sem_flags::BOOLEAN | sem_flags::INTEGER).is_err());
    // A remote post through an atomic add on a self endpoint.
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    let (key, addr) = s.remote().unwrap();
    let rk = ep.rkey_unpack(&key).unwrap();
    ep.atomic(AtomicOp::Add, 2, 0, addr, &rk, false)
        .unwrap()
        .wait()
        .unwrap();
    s.wait(&w, 2).unwrap();
    assert_eq!(s.value(), 0);
}
