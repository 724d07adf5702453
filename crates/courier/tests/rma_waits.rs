//! Waiting for a peer's one-sided operations between real processes: semaphores posted
//! by a peer, and signal waits that sleep until a peer's signalling put wakes them. The
//! set-ups and transports are those of tests/common/net.rs.

use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::net::{Net, SHM, TCP, target};
use common::*;

#[test]
fn child_entry() {
    run_child(&[
        ("sem_consumer", child_sem_consumer),
        ("sleeper", child_sleeper),
    ]);
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

    // 4. Two posts by signalling puts (add 1 each) leave a boolean at 1.
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
    // The word counts posts; the consumer's takes are counted in its own memory.
    assert_eq!(old, SEM_N, "the word counts every post");
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
    post_b(2, 1, SignalOp::Add);
    post_b(3, 1, SignalOp::Add);
    cl.ep.flush().unwrap();
    send_u64(&cl.ep, P4, 4);
    assert_eq!(recv_u64(&cl.w, &mut kid, ACK), 4);
    cl.finish(&mut kid);
}

matrix! {
    semaphore_posted_by_a_peer_shm: semaphores(SHM);
    semaphore_posted_by_a_peer_tcp: semaphores(TCP);
}

// ----- sleeping signal waits ----------------------------------------------------------------

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
