//! Multi-process tests of peers that fail: killed mid-transfer, stopped while a send to
//! them is dropped, sending garbage to a listener; and a listener out of descriptors. Every
//! peer is a real process (this test binary re-run as a child with `COURIER_TEST_ROLE` set;
//! the children are in tests/common/echo.rs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::echo::*;

#[test]
fn child_entry() {
    // The entry point children run; as a plain test it does nothing.
    child_main();
}

fn killed_case(tls: &str) {
    let sink = Peer::spawn("sink", tls, &[]);
    let mut echo = Peer::spawn("echo", tls, &[]);
    let (_c, w) = client(tls);
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let ep = w
        .connect_sockaddr(
            sink.addr(),
            2,
            EndpointParams::default().error_handler(move |e| {
                assert_eq!(e.status(), Status::PeerFailure, "{e}");
                c2.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    let other = connect(&w, &echo, 3);
    let big = pattern(32 << 20, 1);
    let mut sbuf = vec![0u8; 100];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { ep.tag_send_nb(&big, 7) }
        .unwrap_or_else(|e| panic!("{e}; sink log:\n{}", sink.stderr()));
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut srecv = unsafe { ep.stream_recv_exact_nb(&mut sbuf) }.unwrap();
    for _ in 0..1000 {
        w.progress();
    }
    assert!(
        !send.is_done(),
        "nobody received the message, so the send cannot be done"
    );
    let mut sink = sink;
    sink.child.kill().unwrap();
    let t = Instant::now();
    while !(send.is_done() && srecv.is_done()) {
        w.progress();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "requests still pending {:?} after the peer was killed",
            t.elapsed()
        );
    }
    let e = send.test().unwrap().clone().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(srecv.test().unwrap().is_err());
    drop(send);
    drop(srecv);
    for _ in 0..100 {
        w.progress();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "error handler must run exactly once"
    );
    // The worker and its other endpoint go on.
    tag_echo(&w, &other, 3, 100_000, 1);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.tag_send_nb(b"x", 1) }
        .err()
        .expect("send on a failed endpoint must fail");
    assert_eq!(e.status(), Status::PeerFailure);
    ep.close_force();
    stop(&w, &other, &mut echo);
}

#[test]
fn peer_killed_mid_transfer_shm() {
    killed_case("all");
}

#[test]
fn peer_killed_mid_transfer_tcp() {
    killed_case("tcp");
}

/// A send to a peer that is alive but stopped (SIGSTOP) cannot finish, and cannot be
/// canceled once started. Dropping it waits for it; the keepalive (no answer within
/// `COURIER_KEEPALIVE_TIMEOUT`, 1 s here) fails the endpoint as not progressing, so the
/// drop returns instead of hanging (long before the 5 s a drop gives up after on its
/// own); the worker's other endpoint goes on.
fn dropped_to_stopped_case(tls: &str) {
    let sink = Peer::spawn("sink", tls, &[]);
    let mut echo = Peer::spawn("echo", tls, &[]);
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", tls)
            .config("COURIER_KEEPALIVE_TIMEOUT", "1s"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = connect(&w, &sink, 2);
    let other = connect(&w, &echo, 3);
    let big = pattern(32 << 20, 2);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { ep.tag_send_nb(&big, 7) }.unwrap();
    for _ in 0..1000 {
        w.progress();
    }
    assert!(!send.is_done(), "nobody received the message");
    assert!(!send.cancel(), "a started send cannot be canceled");
    let pid = sink.child.id() as libc::pid_t;
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Should the drop hang, fail the test rather than the whole run.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(90)).is_err() {
            eprintln!("dropping the request still waits after 90 s");
            std::process::exit(1);
        }
    });
    let t = Instant::now();
    drop(send);
    let took = t.elapsed();
    let _ = tx.send(());
    watchdog.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "the drop took {took:?} with COURIER_KEEPALIVE_TIMEOUT=1s"
    );
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.tag_send_nb(b"x", 1) }
        .err()
        .expect("the endpoint of the abandoned request must have failed");
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(e.detail().contains("not progressing"), "{e}");
    // The worker and its other endpoint go on.
    tag_echo(&w, &other, 3, 100_000, 2);
    ep.close_force();
    stop(&w, &other, &mut echo);
    // SAFETY: as above; the sink is then killed when dropped.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

#[test]
fn dropped_send_to_a_stopped_peer_gives_up_shm() {
    dropped_to_stopped_case("all");
}

#[test]
fn dropped_send_to_a_stopped_peer_gives_up_tcp() {
    dropped_to_stopped_case("tcp");
}

fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

#[test]
fn garbage_to_listener_and_open_connection() {
    use courier::wire::address::WorkerAddress;
    use courier::wire::frame::{Header, Kind};
    let mut peer = Peer::spawn("echo", "tcp", &[]);
    // Not Courier at all.
    let mut s = TcpStream::connect(peer.addr()).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    // A Courier peer that accepts, delivers one message, then lies about a length.
    let mut raw = TcpStream::connect(peer.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"COURIER\x01").unwrap();
    let fake = WorkerAddress {
        worker_id: 1,
        host_id: [0xee; 16],
        pid: 1,
        uds_name: vec![],
        tcp: vec![],
        max_frame_k: 0,
    };
    let mut req = Header::new(Kind::ConnReq).word(1, 77).as_bytes().to_vec();
    req.extend(fake.pack());
    raw.write_all(&frame(&req)).unwrap();
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).unwrap();
    let mut accept = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut accept).unwrap();
    assert_eq!(accept[0], Kind::ConnAccept as u8);
    let tag = (77u64 << 32) | 5;
    let mut msg = Header::new(Kind::TagEager).word(1, tag).as_bytes().to_vec();
    msg.extend_from_slice(b"delivered before the lie");
    raw.write_all(&frame(&msg)).unwrap();
    raw.read_exact(&mut len).unwrap();
    let mut echo = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut echo).unwrap();
    assert_eq!(&echo[16..], b"delivered before the lie");
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    raw.write_all(&[0u8; 64]).unwrap();
    // The server keeps serving real clients.
    let (_c, w) = client("tcp");
    let ep = connect(&w, &peer, 9);
    tag_echo(&w, &ep, 9, 70_000, 3);
    stop(&w, &ep, &mut peer);
    let log = peer.stderr_final();
    assert!(
        log.contains("dropped connection from") && log.contains("bad preamble"),
        "log:\n{log}"
    );
    assert!(
        log.contains("dropping connection to") && log.contains("exceeds the limit"),
        "log:\n{log}"
    );
}

/// A listener out of descriptors says so once (not at every progress call, which flooded
/// the log with some 20,000 lines a second), and accepts again when descriptors are free.
#[test]
fn a_listener_out_of_descriptors_waits_quietly_and_recovers() {
    let mut peer = Peer::spawn("echo", "tcp", &[("COURIER_TEST_NOFILE", "64")]);
    // More connections than the child has descriptors; the kernel's backlog keeps them.
    let held: Vec<TcpStream> = (0..120)
        .map(|_| TcpStream::connect(peer.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    drop(held);
    // Once the held connections are gone (the child drops each at its end of file), a real
    // client is served.
    let (_c, w) = client("tcp");
    let ep = connect(&w, &peer, 4);
    tag_echo(&w, &ep, 4, 1000, 3);
    stop(&w, &ep, &mut peer);
    let log = peer.stderr_final();
    let warnings = log.lines().filter(|l| l.contains("tcp accept on")).count();
    assert!(
        log.contains("Too many open files") && log.contains("incoming connections wait"),
        "log:\n{log}"
    );
    assert!(warnings <= 3, "{warnings} warnings:\n{log}");
}
