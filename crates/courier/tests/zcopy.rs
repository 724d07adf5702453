//! Zero-copy sends on tcp: a large send's request completes only when its last byte has been
//! written, its buffer is read until then (not a copy), and a peer that goes away while a
//! frame is half written fails the request instead of leaving it hanging.
//!
//! Both workers are single-thread and progressed by the test, so the receiver can be held
//! still while the sender's small socket buffers fill up.

use std::time::{Duration, Instant};

use courier::*;

const BIG: usize = 8 << 20;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i / 3) as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

struct Two {
    a: Worker,
    b: Worker,
    ab: Endpoint,
    _ba: Endpoint,
    _ctx: Context,
}

fn two() -> Two {
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", "tcp")
            .config("COURIER_TCP_SNDBUF", "64k")
            .config("COURIER_TCP_RCVBUF", "64k"),
    )
    .unwrap();
    let a = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let b = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ba = loop {
        a.progress();
        b.progress();
        if let Some(e) = b.incoming_endpoint() {
            break e;
        }
        assert!(Instant::now() < deadline, "no incoming endpoint");
    };
    ab.wait_connected(Duration::from_secs(10)).unwrap();
    assert_eq!(ab.transport(), Some("tcp"));
    Two {
        a,
        b,
        ab,
        _ba: ba,
        _ctx: ctx,
    }
}

/// Progress both until the receiver answered the offer (the offer leaves at once, the
/// answer on the receiver's first progress, the push on the sender's next) and the sender
/// has pushed what the sockets take; then the receiver stands still.
fn start_push(t: &Two, recv: &mut Request<'_>) {
    for _ in 0..3 {
        t.a.progress();
        t.b.progress();
    }
    for _ in 0..2000 {
        t.a.progress();
    }
    assert!(!recv.is_done(), "8 MiB cannot pass 64 KiB socket buffers");
}

#[test]
fn large_send_completes_only_when_written_and_sends_the_callers_bytes() {
    let t = two();
    let data = pattern(BIG, 1);
    let mut back = vec![0u8; BIG];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut recv = unsafe { t.b.tag_recv_nb(&mut back, 5, u64::MAX) }.unwrap();
    // The buffer is borrowed by the request; the link writes from it.
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { t.ab.tag_send_nb(&data, 5) }.unwrap();
    start_push(&t, &mut recv);
    assert!(
        !send.is_done(),
        "the send completed while most of its bytes were still unwritten"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(send.is_done() && recv.is_done()) {
        t.a.progress();
        t.b.progress();
        assert!(Instant::now() < deadline, "transfer stalled");
    }
    send.test().unwrap().clone().unwrap();
    assert_eq!(recv.test().unwrap().clone().unwrap().length, BIG);
    drop(recv);
    assert!(back == data, "received bytes differ");
}

#[test]
fn peer_gone_mid_zero_copy_frame_fails_the_send() {
    let t = two();
    let data = pattern(BIG, 2);
    let mut back = vec![0u8; BIG];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut recv = unsafe { t.b.tag_recv_nb(&mut back, 9, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { t.ab.tag_send_nb(&data, 9) }.unwrap();
    start_push(&t, &mut recv);
    assert!(!send.is_done());
    // The receiving side drops the connection with the frame half written.
    let Two {
        a,
        b,
        ab,
        _ba,
        _ctx,
    } = t;
    _ba.close_force();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !send.is_done() {
        a.progress();
        b.progress();
        assert!(
            Instant::now() < deadline,
            "send still pending after its peer went away"
        );
    }
    assert!(recv.test().unwrap().is_err(), "the receive cannot succeed");
    drop(recv);
    let e = send.test().unwrap().clone().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    drop(send);
    // The endpoint is dead; new sends fail at once rather than queue behind a cut frame.
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ab.tag_send_nb(&data, 10) }
        .err()
        .expect("send on a dead endpoint");
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    ab.close_force();
    drop(data);
}
