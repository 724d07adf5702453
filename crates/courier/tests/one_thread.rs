//! Two workers of one process driven by one thread, as an event loop drives them: the
//! shared-memory setup between them must not wait for an acceptor only this thread can
//! run. (Before the setup was polled, `connect` blocked 5 s for the acceptor's reply and
//! the endpoint ended up on tcp.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

/// Progress both workers until `done` (at most `limit`).
fn progress_both(a: &Worker, b: &Worker, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not done within {limit:?}");
        a.progress();
        b.progress();
    }
}

/// A tag message from `ep` (on `from`) received by `to`.
fn tag_round(from: &Worker, to: &Worker, ep: &Endpoint, msg: &[u8]) {
    let mut buf = vec![0u8; msg.len()];
    {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { to.tag_recv_nb(&mut buf, 9, u64::MAX) }.unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let s = unsafe { ep.tag_send_nb(msg, 9) }.unwrap();
        progress_both(from, to, Duration::from_secs(5), || r.is_done());
        r.wait().unwrap();
        drop(s);
    }
    assert_eq!(buf, msg);
}

fn workers() -> (Context, Worker, Worker) {
    let ctx = Context::new(ContextParams::default().config("COURIER_TLS", "shm,tcp")).unwrap();
    let a = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let b = Worker::new(&ctx, WorkerParams::default()).unwrap();
    (ctx, a, b)
}

#[test]
fn address_connect_between_workers_of_one_thread_takes_shm_at_once() {
    let (_ctx, a, b) = workers();
    let t = Instant::now();
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "connect blocked for {:?}",
        t.elapsed()
    );
    // Sent while the setup is under way: queued, then delivered.
    let mut early = [0u8; 5];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { b.tag_recv_nb(&mut early, 3, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let s = unsafe { ab.tag_send_nb(b"early", 3) }.unwrap();
    progress_both(&a, &b, Duration::from_secs(2), || {
        ab.is_connected().unwrap() && r.is_done()
    });
    r.wait().unwrap();
    drop(s);
    assert_eq!(&early, b"early");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "setup took {:?}",
        t.elapsed()
    );
    assert_eq!(ab.transport(), Some("shm"));
    let mut ba = None;
    progress_both(&a, &b, Duration::from_secs(2), || {
        ba = b.incoming_endpoint();
        ba.is_some()
    });
    let ba = ba.unwrap();
    assert_eq!(ba.transport(), Some("shm"));
    tag_round(&a, &b, &ab, b"a to b");
    tag_round(&b, &a, &ba, b"b to a");
}

#[test]
fn listener_connection_between_workers_of_one_thread_upgrades_to_shm() {
    let (_ctx, a, b) = workers();
    let accepted: Arc<Mutex<Vec<Endpoint>>> = Arc::default();
    let acc = accepted.clone();
    let l = Listener::new(&b, "127.0.0.1:0".parse().unwrap(), move |r: ConnRequest| {
        acc.lock()
            .unwrap()
            .push(r.accept(EndpointParams::default()).unwrap());
    })
    .unwrap();
    let t = Instant::now();
    let ab = a
        .connect_sockaddr(l.local_addr(), 7, EndpointParams::default())
        .unwrap();
    progress_both(&a, &b, Duration::from_secs(3), || {
        ab.is_connected().unwrap() && !accepted.lock().unwrap().is_empty()
    });
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "setup took {:?}",
        t.elapsed()
    );
    assert_eq!(ab.transport(), Some("shm"));
    let ba = accepted.lock().unwrap().pop().unwrap();
    tag_round(&a, &b, &ab, b"over the upgrade");
    tag_round(&b, &a, &ba, b"and back");
    assert_eq!(ba.transport(), Some("shm"));
}

#[test]
fn setup_with_an_acceptor_that_never_answers_falls_back_to_tcp_and_says_why() {
    // A worker that is never progressed: its acceptor never replies, so the connecting
    // side's setup times out (5 s) while its own worker keeps running, then goes on tcp.
    let (_ctx, a, b) = workers();
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let t = Instant::now();
    let mut idle = 0u64;
    while !ab.is_connected().unwrap() {
        assert!(t.elapsed() < Duration::from_secs(15), "never connected");
        if a.progress() == 0 {
            idle += 1;
        }
    }
    // The worker was not blocked: it went through many progress calls meanwhile.
    assert!(
        idle > 1000,
        "only {idle} idle progress calls during the setup"
    );
    assert!(t.elapsed() >= Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(ab.transport(), Some("tcp"));
    // Now b runs: the tcp link carries messages.
    let mut ba = None;
    progress_both(&a, &b, Duration::from_secs(5), || {
        ba = b.incoming_endpoint();
        ba.is_some()
    });
    tag_round(&a, &b, &ab, b"over tcp");
}

#[test]
fn endpoint_closed_during_its_setup_leaves_both_workers_usable() {
    let (_ctx, a, b) = workers();
    let addr = b.address().unwrap();
    // Closed before b's acceptor ever answered; the next endpoint takes its slot at once.
    // The abandoned setup must end with its endpoint, not finish into the new one.
    let first = a.connect(&addr, EndpointParams::default()).unwrap();
    assert!(!first.is_connected().unwrap());
    first.close_force();
    let ab = a.connect(&addr, EndpointParams::default()).unwrap();
    progress_both(&a, &b, Duration::from_secs(2), || {
        ab.is_connected().unwrap()
    });
    assert_eq!(ab.transport(), Some("shm"));
    let mut incoming = Vec::new();
    for _ in 0..2000 {
        a.progress();
        b.progress();
        if let Some(ep) = b.incoming_endpoint() {
            incoming.push(ep);
        }
    }
    assert_eq!(
        incoming.len(),
        1,
        "b has {} incoming endpoints",
        incoming.len()
    );
    tag_round(&a, &b, &ab, b"after the abandoned setup");
    tag_round(&b, &a, &incoming[0], b"and back");
}

#[test]
fn a_worker_waiting_for_its_setup_sleeps_until_the_reply() {
    // b lives on a thread of its own that starts progressing it only after 300 ms; a
    // connects and waits on its event fd meanwhile. The setup's socket wakes it: a few
    // waits, not a spin of thousands (as when the setup could only be polled).
    let ctx = Context::new(ContextParams::default().config("COURIER_TLS", "shm,tcp")).unwrap();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (began_tx, began_rx) = std::sync::mpsc::channel::<Instant>();
    let ctx_b = ctx.clone();
    let peer = std::thread::spawn(move || {
        let b = Worker::new(&ctx_b, WorkerParams::default()).unwrap();
        addr_tx.send(b.address().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        began_tx.send(Instant::now()).unwrap();
        while stop_rx.try_recv().is_err() {
            if b.progress() == 0 {
                let _ = b.wait(Some(Duration::from_millis(10)));
            }
        }
    });
    let a = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ab = a
        .connect(&addr_rx.recv().unwrap(), EndpointParams::default())
        .unwrap();
    let t = Instant::now();
    let mut waits = 0;
    while !ab.is_connected().unwrap() {
        assert!(t.elapsed() < Duration::from_secs(10), "not connected");
        if a.progress() == 0 {
            a.wait(Some(Duration::from_secs(1))).unwrap();
            waits += 1;
        }
    }
    let connected = Instant::now();
    let _ = stop_tx.send(());
    peer.join().unwrap();
    assert_eq!(ab.transport(), Some("shm"));
    // The setup needed b's reply: it ended after b began progressing, so a did wait.
    let began = began_rx.recv().unwrap();
    assert!(
        connected > began,
        "connected {:?} before b began progressing",
        began - connected
    );
    assert!(
        waits < 50,
        "{waits} waits: the worker spun instead of sleeping"
    );
}

/// What `b`'s handler for id 1 saw of one message: the sender's header, the first byte of
/// the data, its length, and whether it came by rendezvous.
type Seen = (Vec<u8>, u8, usize, bool);

/// Active messages (eager, rendezvous, for a handler that replies from inside, for an id
/// with no handler) and tag messages (eager and rendezvous), all waiting on one
/// shared-memory link before the receiver progresses, plus a message on a second link:
/// each arrives, those of one link in the order sent, whichever path progress takes for
/// it (small frames on one busy shared-memory link in line, everything else by the
/// general pass, which also sends the handler's reply).
#[test]
fn mixed_frames_waiting_on_shm_links_all_arrive_in_order() {
    let (ctx, a, b) = workers();
    let c = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let cb = c
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    // Both connections are set up at both ends (`b` takes in the two endpoints) before
    // the messages go: the rounds counted below are then all for the messages.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut incoming = Vec::new();
    while !(ab.is_connected().unwrap() && cb.is_connected().unwrap() && incoming.len() == 2) {
        assert!(Instant::now() < deadline, "not connected");
        a.progress();
        b.progress();
        c.progress();
        incoming.extend(b.incoming_endpoint());
    }
    assert_eq!(ab.transport(), Some("shm"));
    assert_eq!(cb.transport(), Some("shm"));

    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let kept: Arc<Mutex<Vec<AmRndv>>> = Arc::default();
    let (s, k) = (seen.clone(), kept.clone());
    b.am_set_handler(1, move |m| {
        let first = m.data().first().copied().unwrap_or(0);
        s.lock()
            .unwrap()
            .push((m.header().to_vec(), first, m.data_len(), m.is_rndv()));
        if first == 5 {
            let ep = m.reply_ep().expect("sent with the reply flag");
            drop(
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { ep.am_send_nb(2, b"re", &[55u8; 8], AmFlags::default()) }.unwrap(),
            );
        }
        if let Some(d) = m.take_rndv() {
            k.lock().unwrap().push(d);
        }
    })
    .unwrap();
    let replies: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let r2 = replies.clone();
    a.am_set_handler(2, move |m| r2.lock().unwrap().push(m.data().to_vec()))
        .unwrap();

    let (mut t5, mut t6) = ([0u8; 16], vec![0u8; 100_000]);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r5 = unsafe { b.tag_recv_nb(&mut t5, 5, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r6 = unsafe { b.tag_recv_nb(&mut t6, 6, u64::MAX) }.unwrap();
    let big_am = vec![2u8; 100_000];
    let big_tag = vec![6u8; 100_000];
    let rndv = AmFlags {
        rndv: true,
        ..AmFlags::default()
    };
    let reply = AmFlags {
        reply: true,
        ..AmFlags::default()
    };
    let mut sends = vec![
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.am_send_nb(1, b"a", &[1u8; 8], AmFlags::default()) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.am_send_nb(1, b"a", &big_am, rndv) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.am_send_nb(7, b"a", &[3u8; 8], AmFlags::default()) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.tag_send_nb(&[4u8; 16], 5) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.am_send_nb(1, b"a", &[5u8; 8], reply) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.tag_send_nb(&big_tag, 6) }.unwrap(),
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { ab.am_send_nb(1, b"a", &[7u8; 8], AmFlags::default()) }.unwrap(),
    ];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    sends.push(unsafe { cb.am_send_nb(1, b"c", &[9u8; 8], AmFlags::default()) }.unwrap());

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rounds = 0;
    while !(seen.lock().unwrap().len() == 5
        && r5.is_done()
        && r6.is_done()
        && !replies.lock().unwrap().is_empty()
        && sends.iter_mut().all(|r| r.is_done()))
    {
        assert!(
            Instant::now() < deadline,
            "not all delivered after {rounds} rounds: handler saw {:?}, tag 5 {}, tag 6 {}, replies {}",
            seen.lock().unwrap(),
            r5.is_done(),
            r6.is_done(),
            replies.lock().unwrap().len()
        );
        rounds += 1;
        a.progress();
        b.progress();
        c.progress();
        // A rendezvous message kept by the handler is received here, as an application
        // would, while the others move on.
        let d = kept.lock().unwrap().pop();
        if let Some(d) = d {
            let mut buf = vec![0u8; d.len()];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { b.am_recv_data_nb(d, &mut buf) }.unwrap();
            while !r.is_done() {
                a.progress();
                b.progress();
                assert!(Instant::now() < deadline, "rendezvous data not received");
            }
            r.wait().unwrap();
            assert_eq!(buf, big_am, "rendezvous active-message data");
        }
    }
    // A frame the in-line path leaves to the general pass must be handled in the same
    // call, not at the next periodic full pass (every 256 calls).
    eprintln!("rounds {rounds}");
    assert!(
        rounds < 100,
        "{rounds} rounds of progress calls to deliver eight messages"
    );
    r5.wait().unwrap();
    r6.wait().unwrap();
    assert_eq!(t5, [4u8; 16]);
    assert_eq!(t6, big_tag);
    assert_eq!(replies.lock().unwrap().as_slice(), &[vec![55u8; 8]]);
    let seen = seen.lock().unwrap();
    let from_a: Vec<(u8, usize, bool)> = seen
        .iter()
        .filter(|s| s.0 == b"a")
        .map(|s| (s.1, s.2, s.3))
        .collect();
    // The message for id 7 has no handler: dropped (with a warning), not delivered.
    assert_eq!(
        from_a,
        [
            (1, 8, false),
            (0, 100_000, true),
            (5, 8, false),
            (7, 8, false)
        ]
    );
    assert_eq!(
        seen.iter().filter(|s| s.0 == b"c").count(),
        1,
        "the second link's message: {seen:?}"
    );
    // The link is still in order for what comes next.
    tag_round(&a, &b, &ab, b"after the mix");
}

/// A spinning worker sees a new shm connection at its periodic epoll pass (every 256
/// progress calls; nothing in shared memory announces a connection that does not exist
/// yet). From there the setup must finish in the next calls, not at the pass after: a
/// message sent at once on the new endpoint then arrives a few rounds after the first
/// pass, not 256 later.
#[test]
fn a_spinning_acceptor_takes_a_new_connections_first_message_at_once() {
    let (_ctx, a, b) = workers();
    // 250 calls in: the next periodic pass is six calls away.
    for _ in 0..250 {
        a.progress();
        b.progress();
    }
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let mut buf = [0u8; 5];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { b.tag_recv_nb(&mut buf, 4, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let s = unsafe { ab.tag_send_nb(b"first", 4) }.unwrap();
    let mut rounds = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !r.is_done() {
        assert!(
            Instant::now() < deadline,
            "not received after {rounds} rounds"
        );
        rounds += 1;
        a.progress();
        b.progress();
    }
    r.wait().unwrap();
    drop(s);
    assert_eq!(&buf, b"first");
    assert_eq!(ab.transport(), Some("shm"));
    assert!(
        rounds < 100,
        "{rounds} rounds of progress calls for the first message of a new connection"
    );
}
