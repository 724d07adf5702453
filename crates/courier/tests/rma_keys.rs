//! One-sided operations between real processes through keys and regions that must be
//! refused: forged, stale, lying and shortened keys, keys naming another region's segment,
//! regions unmapped while a put arrives or a get's answer waits to leave. The parent owns
//! the memory; children (this binary re-run) connect, unpack the keys passed in their
//! environment, and act, over shared memory and over TCP. The set-up is in
//! tests/common/tls.rs.

use std::process::Stdio;
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::tls::*;

// ----- the children -------------------------------------------------------------------------

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
        let e =
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
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

#[test]
fn child_entry() {
    child_main(act);
}

/// What a child does, by its role.
fn act(role: &str, p: &Peer) {
    let Peer { keys, ep, rk, .. } = p;
    match role {
        "liar" => child_liar(ep, rk, keys),
        "bigput" => {
            // The owner unmaps the region while this put's data arrives: refused, and
            // reported by the flush.
            let (base, len) = rk[0].bounds();
            ep.put(&pattern(len as usize, 1), base, &rk[0]).unwrap();
            let e = ep.flush().expect_err("region unmapped during the put");
            assert_eq!(e.status(), Status::InvalidKey, "{e}");
        }
        "bigputsig" => {
            // As "bigput", with a signal in a second region: the put is refused and the
            // signal never raised.
            let (base, len) = rk[0].bounds();
            let (sbase, _) = rk[1].bounds();
            ep.put_signal(
                &pattern(len as usize, 1),
                base,
                &rk[0],
                sbase,
                &rk[1],
                7,
                SignalOp::Set,
            )
            .unwrap();
            let e = ep
                .flush()
                .expect_err("region unmapped during the put-with-signal");
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
        "past_the_key" => child_partial(ep, keys, false),
        "partial_liar" => child_partial(ep, keys, true),
        "shortened" => {
            // The key claims 8 bytes of a three-page region; the owner's record says three
            // pages. The key reaches only what it claims, on every path: past that (inside
            // the record) puts and gets are refused before anything is touched or sent.
            let (base, _) = rk[0].bounds();
            let at = base + SHORTENED_AT as u64;
            expect_err(
                ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.put_nb(&[0xeeu8; 8], at, &rk[0]) },
                Status::OutOfRange,
            );
            let mut got = [0u8; 8];
            expect_err(
                ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.get_nb(&mut got, at, &rk[0]) },
                Status::OutOfRange,
            );
            expect_err(
                ep,
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
        other => panic!("unknown role {other}"),
    }
}

// ----- the scenarios ------------------------------------------------------------------------

/// Progress until `child`'s large put into `reg` (mapped as `m`) has started but not
/// finished arriving, unmap the region, fill it, serve the child to its end, and check
/// that nothing more landed in it.
fn unmap_mid_put(o: &common::Owner, reg: &mut [u8], m: Memory, child: std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // SAFETY: our buffer; the link writes it only inside progress, on this thread.
    while unsafe { std::ptr::read_volatile(reg.as_ptr()) } == 0 {
        o.w.progress();
        assert!(Instant::now() < deadline, "the put did not start arriving");
    }
    let landed = reg.iter().rposition(|&b| b != 0).unwrap_or(0) + 1;
    assert!(
        landed < reg.len(),
        "the whole put arrived in one progress call; the test needs more"
    );
    drop(m);
    reg.fill(0xee);
    serve_until_done(o, vec![child], || {});
    assert!(
        reg.iter().all(|&b| b == 0xee),
        "the put wrote into the region after it was unmapped"
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
    unmap_mid_put(&o, &mut reg, m, child);
}

/// The same with a put-with-signal, whose payload is placed as a put's: the put is
/// refused, nothing lands after the unmap, and the signal word is left alone.
#[test]
fn region_unmapped_while_a_put_signal_arrives_tcp() {
    let (o, c) = owner("tcp");
    let len = 16 << 20;
    let mut reg = vec![0u8; len];
    let mut word = vec![0u64; 1];
    let m = c
        // SAFETY: the vector is declared before the region and outlives it; the test reads it only
        // once the peer is done.
        .mem_map(unsafe { MemMapParams::register(reg.as_mut_ptr(), len) })
        .unwrap();
    let s = c
        // SAFETY: as above.
        .mem_map(unsafe { MemMapParams::register(word.as_mut_ptr().cast(), 8) })
        .unwrap();
    let keys = [m.pack_rkey().unwrap(), s.pack_rkey().unwrap()];
    let child = spawn("tcp", "bigputsig", o.port, &keys, &[]);
    unmap_mid_put(&o, &mut reg, m, child);
    // SAFETY: our word; the peer is done.
    let w = unsafe { std::ptr::read_volatile(word.as_ptr()) };
    assert_eq!(
        w, 0,
        "the signal was raised for a put that did not land whole"
    );
    drop(s);
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

#[test]
fn forged_and_stale_keys_shm() {
    liar("all");
}

#[test]
fn forged_and_stale_keys_tcp() {
    liar("tcp");
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
