//! One-sided operations between real processes. The parent owns the memory; children
//! (this binary re-run) connect, unpack the keys passed in their environment, and act.
//! Each scenario runs over shared memory and over TCP. The set-up is in tests/common/tls.rs;
//! tests/rma_keys.rs has the keys and regions that must be refused.

use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::tls::*;
use common::{sizes_in, stderr_of};

// ----- the children -------------------------------------------------------------------------

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
    child_main(act);
}

/// What a child does, by its role.
fn act(role: &str, p: &Peer) {
    let Peer { tls, w, ep, rk, .. } = p;
    match role {
        "putget" => child_putget(w, ep, rk, tls),
        "atomics" => child_atomics(ep, rk),
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
        "signaler" => child_signaler(w, ep, rk),
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
    // device paths are tested against a stand-in driver in tests/cuda_memory.rs).
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
