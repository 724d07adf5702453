//! The two-sided API on every transport: tag messages (unexpected, probed, truncated,
//! synchronous, posted with callbacks), streams, sleeping workers and their epoll set,
//! connections refused or failed, configuration errors. The workers are those of
//! tests/common/pair.rs; tests/api_rendezvous.rs has active messages and rendezvous.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::pair::*;

#[test]
fn unexpected_messages_probe_truncation_order() {
    for tls in TLS {
        let p = pair(tls);
        let small = b"small unexpected".to_vec();
        let big: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        // Sent before any receive is posted: they wait as unexpected messages.
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s1 = unsafe { p.ba.tag_send_nb(&small, 0x10) }.unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s2 = unsafe { p.ba.tag_send_nb(&big, 0x20) }.unwrap();
        let ordered: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 100 + i as usize]).collect();
        let mut os: Vec<Request> = ordered
            .iter()
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            .map(|m| unsafe { p.ba.tag_send_nb(m, 0x30) }.unwrap())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.a.tag_probe(0x20, u64::MAX).unwrap().is_none() {
            p.a.progress();
            assert!(
                Instant::now() < deadline,
                "{tls}: probe never saw the message"
            );
        }
        assert_eq!(
            p.a.tag_probe(0x20, u64::MAX).unwrap().unwrap().length,
            3 << 20,
            "{tls}"
        );
        assert_eq!(
            p.a.tag_probe(0x10, 0xf0).unwrap().unwrap().tag,
            0x10,
            "{tls}: masked probe"
        );
        assert!(p.a.tag_probe(0x99, u64::MAX).unwrap().is_none());
        // Truncation reports the real length.
        let mut tiny = [0u8; 5];
        let e =
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { p.a.tag_recv_nb(&mut tiny, 0x10, u64::MAX) }
                .err()
                .expect("truncated");
        assert_eq!(e.status(), Status::MessageTruncated, "{tls}: {e}");
        assert!(e.detail().contains("16 bytes"), "{tls}: {e}");
        assert_eq!(&tiny, b"small");
        let mut got = vec![0u8; 3 << 20];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.tag_recv_nb(&mut got, 0x20, u64::MAX) }.unwrap();
        assert_eq!(wait_on(&p.a, &mut r).unwrap().length, 3 << 20);
        drop(r);
        assert!(got == big, "{tls}: unexpected rendezvous message differs");
        // Same tag: matched in send order.
        for (i, m) in ordered.iter().enumerate() {
            let mut buf = vec![0u8; 200];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { p.a.tag_recv_nb(&mut buf, 0x30, u64::MAX) }.unwrap();
            let n = wait_on(&p.a, &mut r).unwrap().length;
            drop(r);
            assert_eq!(&buf[..n], &m[..], "{tls}: message {i} out of order");
        }
        wait_on(&p.b, &mut s1).unwrap();
        wait_on(&p.b, &mut s2).unwrap();
        for s in os.iter_mut() {
            wait_on(&p.b, s).unwrap();
        }
    }
}

#[test]
fn truncated_rendezvous_and_posted_truncation() {
    for tls in TLS {
        let p = pair(tls);
        let big = vec![9u8; 200_000];
        let mut small = vec![0u8; 1000];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.tag_recv_nb(&mut small, 7, u64::MAX) }.unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s = unsafe { p.ba.tag_send_nb(&big, 7) }.unwrap();
        let e = wait_on(&p.a, &mut r).expect_err("truncated");
        assert_eq!(e.status(), Status::MessageTruncated, "{tls}");
        assert_eq!(r.info().length, 200_000, "{tls}: real length reported");
        drop(r);
        assert!(small.iter().all(|&b| b == 9));
        wait_on(&p.b, &mut s).unwrap();
    }
}

#[test]
fn sync_send_completes_only_when_matched_and_cancel() {
    for tls in TLS {
        let p = pair(tls);
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s = unsafe { p.ba.tag_send_sync_nb(b"sync", 0x55) }.unwrap();
        for _ in 0..2000 {
            p.a.progress();
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !s.is_done(),
            "{tls}: synchronous send completed before it was matched"
        );
        let mut buf = [0u8; 4];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.tag_recv_nb(&mut buf, 0x55, u64::MAX) }.unwrap();
        wait_on(&p.a, &mut r).unwrap();
        drop(r);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.is_done() {
            p.a.progress();
            assert!(
                Instant::now() < deadline,
                "{tls}: sync send never completed"
            );
        }
        // Cancel a posted receive.
        let mut buf = [0u8; 4];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.tag_recv_nb(&mut buf, 0xdead, u64::MAX) }.unwrap();
        assert!(r.cancel(), "{tls}");
        assert_eq!(
            r.test().unwrap().as_ref().unwrap_err().status(),
            Status::Canceled
        );
    }
}

#[test]
fn streams_partial_and_exact() {
    for tls in TLS {
        let p = pair(tls);
        p.ba.stream_send(b"abc").ok();
        let mut buf = [0u8; 10];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.ab.stream_recv_nb(&mut buf) }.unwrap();
        let n = wait_on(&p.a, &mut r).unwrap().length;
        drop(r);
        assert!(
            (1..=3).contains(&n),
            "{tls}: partial receive returns what arrived"
        );
        let rest = 3 - n;
        let data: Vec<u8> = (0..1_000_000).map(|i| (i % 97) as u8).collect();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s = unsafe { p.ba.stream_send_nb(&data) }.unwrap();
        let mut all = vec![0u8; rest + data.len()];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.ab.stream_recv_exact_nb(&mut all) }.unwrap();
        wait_on(&p.a, &mut r).unwrap();
        drop(r);
        assert_eq!(&all[..rest], &b"abc"[n..]);
        assert!(all[rest..] == data[..], "{tls}: stream bytes differ");
        wait_on(&p.b, &mut s).unwrap();
        // A receive of no bytes ends at once (it waited for the peer's next bytes).
        let mut none = [0u8; 0];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.ab.stream_recv_nb(&mut none) }.unwrap();
        assert_eq!(
            r.test().map(|x| x.clone().map(|i| i.length)),
            Some(Ok(0)),
            "{tls}"
        );
    }
}

#[test]
fn wakeup_sleeps_until_a_message_or_a_signal() {
    for tls in ["shm", "tcp"] {
        let p = pair(tls);
        // Nothing pending: sleep is allowed and a signal from another thread wakes it.
        let a2 = p.a.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            a2.signal().unwrap();
        });
        let t0 = Instant::now();
        p.a.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "{tls}: signal did not wake the worker"
        );
        t.join().unwrap();
        while p.a.progress() > 0 {}
        // A message wakes it too.
        let ba = p.ba.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            ba.tag_send(b"wake", 1).unwrap();
        });
        let mut buf = [0u8; 4];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.tag_recv_nb(&mut buf, 1, u64::MAX) }.unwrap();
        let t0 = Instant::now();
        while !r.is_done() {
            if p.a.arm().unwrap() {
                p.a.wait(Some(Duration::from_secs(5))).unwrap();
            }
            p.a.progress();
            assert!(
                t0.elapsed() < Duration::from_secs(4),
                "{tls}: message did not wake the worker"
            );
        }
        drop(r);
        t.join().unwrap();
        assert_eq!(&buf, b"wake");
    }
}

#[test]
fn rejected_connection_and_error_handler() {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let s2 = seen.clone();
    let l = Listener::new(&w, "127.0.0.1:0".parse().unwrap(), move |r: ConnRequest| {
        s2.lock()
            .unwrap()
            .push((r.client_addr().to_string(), r.client_id()));
        r.reject();
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let ep = w
        .connect_sockaddr(
            l.local_addr(),
            4242,
            EndpointParams::default().error_handler(move |e| {
                assert_eq!(e.status(), Status::Rejected);
                c2.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    let e = ep
        .wait_connected(Duration::from_secs(10))
        .expect_err("rejected");
    assert_eq!(e.status(), Status::Rejected, "{e}");
    for _ in 0..10 {
        w.progress();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].1, 4242);
    assert!(seen[0].0.starts_with("127.0.0.1:"), "{:?}", seen[0]);
    // Closing a failed endpoint returns at once.
    let t = Instant::now();
    let _ = ep.close();
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn bad_configuration_is_refused_with_the_variable_named() {
    let e = Context::new(ContextParams::default().config("COURIER_TLS", "shm,infiniband"))
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::BadConfig);
    assert!(
        e.detail().contains("COURIER_TLS") && e.detail().contains("infiniband"),
        "{e}"
    );
    let e = Context::new(ContextParams::default().config("COURIER_KEEPALIVE_TIMEOUT", "soon"))
        .err()
        .unwrap();
    assert!(e.detail().contains("COURIER_KEEPALIVE_TIMEOUT"), "{e}");
    let e = Context::new(ContextParams::default().config("COURIER_NOT_A_VAR", "1"))
        .err()
        .unwrap();
    assert!(e.detail().contains("COURIER_NOT_A_VAR"), "{e}");
}

#[test]
fn unreachable_peer_says_why() {
    let shm_only = Context::new(ContextParams::default().config("COURIER_TLS", "shm")).unwrap();
    let w = Worker::new(&shm_only, WorkerParams::default()).unwrap();
    // A peer "on another host": a worker address with a different host id.
    let other = courier::wire::address::WorkerAddress {
        worker_id: 5,
        host_id: [1; 16],
        pid: 1,
        uds_name: vec![],
        tcp: vec!["127.0.0.1:9".parse().unwrap()],
        max_frame_k: 0,
    };
    let e = w
        .connect(&other.pack(), EndpointParams::default())
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::Unreachable);
    assert!(
        e.detail().contains("another host") && e.detail().contains("excluded by COURIER_TLS"),
        "{e}"
    );
    let e = w
        .connect(b"garbage", EndpointParams::default())
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::InvalidAddress);
}

#[test]
fn single_thread_worker_refuses_other_threads() {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let w2 = w.clone();
    let r = std::thread::spawn(move || w2.address()).join().unwrap();
    let e = r.expect_err("refused");
    assert!(e.detail().contains("ThreadMode::Multi"), "{e}");
}

/// How many fds the epoll set `epfd` watches (from /proc/self/fdinfo).
fn epoll_set_len(epfd: i32) -> usize {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("tfd:"))
        .count()
}

/// Progress calls after which a worker that reads its tcp links itself has taken them out
/// of its epoll set (it last armed long before).
const BUSY_PROGRESS: usize = 20_000;

/// Send `msg` with tag `tag` on `from` and receive it on worker `w` (progressing both, never
/// arming `w`).
fn one_message(w: &Worker, from: &Endpoint, tag: u64, msg: &[u8]) {
    let mut buf = vec![0u8; msg.len()];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { w.tag_recv_nb(&mut buf, tag, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut s = unsafe { from.tag_send_nb(msg, tag) }.unwrap();
    wait_on(w, &mut r).unwrap();
    wait_on(from.worker(), &mut s).unwrap();
    drop(r);
    assert_eq!(buf, msg);
}

#[test]
fn tcp_links_join_the_epoll_set_only_while_the_worker_may_sleep() {
    let p = pair("tcp");
    let set = || epoll_set_len(p.a.event_fd());
    for _ in 0..BUSY_PROGRESS {
        p.a.progress();
    }
    let polled = set();
    one_message(&p.a, &p.ba, 3, b"read directly");
    assert!(p.a.arm().unwrap(), "nothing is waiting");
    assert_eq!(
        set(),
        polled + 1,
        "arming puts the link's socket in the set"
    );
    // Sleeping on the set wakes on the peer's message.
    let ba = p.ba.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        ba.tag_send(b"wake", 4).unwrap();
    });
    let mut buf = [0u8; 4];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { p.a.tag_recv_nb(&mut buf, 4, u64::MAX) }.unwrap();
    let t0 = Instant::now();
    p.a.wait(Some(Duration::from_secs(5))).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "the message did not wake the worker"
    );
    wait_on(&p.a, &mut r).unwrap();
    drop(r);
    t.join().unwrap();
    assert_eq!(&buf, b"wake");
    // Busy again: the worker reads the socket itself and takes it out of the set.
    for _ in 0..BUSY_PROGRESS {
        p.a.progress();
    }
    assert_eq!(set(), polled);
    one_message(&p.a, &p.ba, 5, b"read directly again");
    // A peer that goes away is still noticed without epoll.
    let failed = Arc::new(AtomicBool::new(false));
    let f2 = failed.clone();
    let ab =
        p.a.connect(
            &p.b.address().unwrap(),
            EndpointParams::default().error_handler(move |_| f2.store(true, Ordering::SeqCst)),
        )
        .unwrap();
    let ba = loop {
        p.a.progress();
        if let Some(e) = p.b.incoming_endpoint() {
            break e;
        }
    };
    one_message(&p.a, &ba, 6, b"second link");
    for _ in 0..BUSY_PROGRESS {
        p.a.progress();
    }
    assert_eq!(set(), polled, "both links are read directly");
    ba.close_force();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !failed.load(Ordering::SeqCst) {
        p.a.progress();
        assert!(Instant::now() < deadline, "the peer's close was not seen");
    }
    drop(ab);
}

#[test]
fn more_tcp_links_than_progress_reads_itself_are_read_through_epoll() {
    let p = pair("tcp");
    // Six tcp links on worker a: one more than DIRECT_POLL_LINKS (4) plus one.
    let mut links = vec![(p.ab.clone(), p.ba.clone())];
    for _ in 0..5 {
        let ab =
            p.a.connect(&p.b.address().unwrap(), EndpointParams::default())
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let ba = loop {
            p.a.progress();
            if let Some(e) = p.b.incoming_endpoint() {
                break e;
            }
            assert!(Instant::now() < deadline, "no incoming endpoint");
        };
        links.push((ab, ba));
    }
    let set = || epoll_set_len(p.a.event_fd());
    for _ in 0..BUSY_PROGRESS {
        p.a.progress();
    }
    let six = set();
    // Never armed: every link's messages come in through epoll, which watches them all.
    for (k, (_, ba)) in links.iter().enumerate() {
        one_message(&p.a, ba, 10 + k as u64, b"through epoll");
    }
    assert_eq!(set(), six);
    // Down to four: progress reads them itself, and they leave the set.
    for (ab, _) in links.drain(4..) {
        ab.close_force();
    }
    assert_eq!(set(), six - 2);
    for _ in 0..BUSY_PROGRESS {
        p.a.progress();
    }
    assert_eq!(set(), six - 6, "the four links left are read directly");
    for (k, (_, ba)) in links.iter().enumerate() {
        one_message(&p.a, ba, 20 + k as u64, b"read directly");
    }
}

/// What `record_completion` saw: (receive, failure status, length, tag).
type Seen = Vec<(usize, Option<Status>, usize, u64)>;
static SEEN: Mutex<Seen> = Mutex::new(Vec::new());

/// A plain-function completion (the C ABI's kind) that records which receive finished.
fn record_completion(user: usize, r: Result<Info>, info: Info) {
    let st = r.as_ref().err().map(|e| e.status());
    SEEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((user, st, info.length, info.tag));
}

#[test]
fn posted_receives_with_callbacks_match_by_mask_in_order_and_report_truncation() {
    // The small-message receive path: posted receives finished by plain functions, matched
    // in posting order by tag and mask (not only the oldest), a too-short buffer, and one
    // receive polled by its handle among them.
    for tls in TLS {
        let p = pair(tls);
        SEEN.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let mut bufs = [[0u8; 8]; 3];
        let mut short = [0u8; 4];
        // Receives 1 and 2 are posted as words (`tag_recv_fn`), 0 and 4 as a `Buf` and a
        // `Callback`: the two entries share one queue and its order (0, 2 and 4 wait for
        // the same tag), and 2 is truncated through the words' entry.
        let post = |buf: Buf, tag: u64, mask: u64, user: usize| {
            let cb = Callback::Raw(record_completion, user);
            let s = match (user, buf) {
                // SAFETY: the buffers outlive the receives, which all finish below.
                (1 | 2, Buf::One(seg)) => unsafe {
                    p.a.tag_recv_fn(seg, tag, mask, record_completion, user)
                },
                // SAFETY: as above.
                (_, buf) => unsafe { p.a.tag_recv_raw(buf, tag, mask, cb) },
            }
            .unwrap();
            assert!(
                matches!(s, Started::Pending(_)),
                "{tls}: nothing was sent yet"
            );
        };
        let one = |b: &mut [u8]| Buf::One((b.as_mut_ptr() as usize, b.len()));
        post(one(&mut bufs[0]), 5, u64::MAX, 0);
        post(one(&mut bufs[1]), 0x100, 0xF00, 1);
        post(one(&mut short), 5, u64::MAX, 2);
        let mut polled = [0u8; 8];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r3 = unsafe { p.a.tag_recv_nb(&mut polled, 9, u64::MAX) }.unwrap();
        post(one(&mut bufs[2]), 5, u64::MAX, 4);
        // Each send's request finishes at once or soon; the messages leave in this order.
        for (tag, msg) in [
            (0x1AB, b"masked.."),
            (5, b"five-one"),
            (5, b"five-two"),
            (9, b"polled.."),
            (5, b"five-3rd"),
        ] {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut s = unsafe { p.ba.tag_send_nb(msg, tag) }.unwrap();
            wait_on(&p.b, &mut s).unwrap();
        }
        let info = wait_on(&p.a, &mut r3).unwrap();
        drop(r3);
        assert_eq!(
            (info.length, info.tag, &polled),
            (8, 9, b"polled.."),
            "{tls}"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while SEEN.lock().unwrap_or_else(|p| p.into_inner()).len() < 4 {
            p.a.progress();
            assert!(Instant::now() < deadline, "{tls}: callbacks did not run");
        }
        let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(
            seen,
            vec![
                (1, None, 8, 0x1AB),
                (0, None, 8, 5),
                (2, Some(Status::MessageTruncated), 8, 5),
                (4, None, 8, 5),
            ],
            "{tls}: completions in arrival order, each with its message's length and tag"
        );
        assert_eq!(&bufs[0], b"five-one", "{tls}");
        assert_eq!(&bufs[1], b"masked..", "{tls}");
        assert_eq!(&bufs[2], b"five-3rd", "{tls}");
        assert_eq!(
            &short, b"five",
            "{tls}: a truncated message fills the buffer"
        );
        // A message that arrived before its receive (unexpected) is taken by `tag_recv_fn`
        // at once: a small one is copied out inside the call, and no function runs.
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s = unsafe { p.ba.tag_send_nb(b"early...", 11) }.unwrap();
        wait_on(&p.b, &mut s).unwrap();
        p.a.progress_until(Duration::from_secs(20), || {
            p.a.tag_probe(11, u64::MAX).unwrap().is_some()
        })
        .unwrap_or_else(|e| panic!("{tls}: the early message did not arrive: {e}"));
        let mut late = [0u8; 8];
        let seg = (late.as_mut_ptr() as usize, late.len());
        // SAFETY: `late` outlives the receive, which finishes inside the call.
        match unsafe { p.a.tag_recv_fn(seg, 11, u64::MAX, record_completion, 5) }.unwrap() {
            Started::Done(info) => assert_eq!((info.length, info.tag), (8, 11), "{tls}"),
            Started::Pending(_) => panic!("{tls}: an arrived small message waits"),
        }
        assert_eq!(
            SEEN.lock().unwrap_or_else(|p| p.into_inner()).len(),
            4,
            "{tls}: a receive finished at once runs no function"
        );
        assert_eq!(&late, b"early...", "{tls}");
    }
}

/// A forced close of one side of an endpoint pair ends the other side's waiting operations
/// with the peer's failure on every transport: the loopback link of two endpoints in one
/// worker said nothing, and a stream receive waited for good.
#[test]
fn a_forced_close_fails_the_other_sides_operations_on_every_transport() {
    for tls in TLS {
        let p = pair(tls);
        let mut buf = [0u8; 8];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.ba.stream_recv_nb(&mut buf) }.unwrap();
        p.ab.clone().close_force();
        let e = wait_on(&p.b, &mut r).expect_err(tls);
        assert_eq!(e.status(), Status::PeerFailure, "{tls}: {e}");
        assert!(e.detail().contains("closed"), "{tls}: {e}");
    }
}
