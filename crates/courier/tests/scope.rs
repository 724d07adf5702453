//! `Worker::scope`: a request forgotten, or dropped inside a callback, in a scope is
//! still waited for by the scope's end, so that the buffer it borrowed may be reused as
//! soon as the scope returns. Receiver B is a worker of its own context in its own thread
//! (a real link: shared memory or tcp, not the self transport); sender A is on the test
//! thread.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use courier::*;

/// Big enough to go by rendezvous on every link: the receiver reads it from the
/// sender's buffer (or the sender pushes it) after `tag_send` returned.
const BIG: usize = 4 << 20;
const TAG_GO: u64 = 1;
const TAG_BIG: u64 = 2;
const AM_DROP: u16 = 9;

fn pattern(seed: u8) -> Vec<u8> {
    (0..BIG)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Receiver B: gives its address, waits for A's small "go" message, only then posts the
/// receive of the big message (so that A's scope ends while the big send is still in
/// flight), and returns what it received.
fn receiver(tls: &str) -> (Vec<u8>, JoinHandle<Vec<u8>>) {
    let (tx, rx) = mpsc::channel();
    let tls = tls.to_string();
    let t = std::thread::spawn(move || {
        let ctx = Context::new(ContextParams::default().config("COURIER_TLS", &tls)).unwrap();
        let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
        tx.send(w.address().unwrap()).unwrap();
        let mut go = [0u8; 2];
        w.tag_recv(&mut go, TAG_GO, u64::MAX).unwrap();
        let mut out = vec![0u8; BIG];
        let info = w.tag_recv(&mut out, TAG_BIG, u64::MAX).unwrap();
        assert_eq!(info.length, BIG);
        out
    });
    (rx.recv().unwrap(), t)
}

/// What B received, progressing A meanwhile (were a scope's end not to wait, A would
/// still hold the send, and B must not hang on it: the test is to fail, not to hang).
fn received(a: &Worker, b: JoinHandle<Vec<u8>>) -> Vec<u8> {
    while !b.is_finished() {
        a.progress();
        std::thread::yield_now();
    }
    b.join().unwrap()
}

fn sender(tls: &str) -> (Context, Worker) {
    let ctx = Context::new(ContextParams::default().config("COURIER_TLS", tls)).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    (ctx, w)
}

/// A big send's request forgotten in the scope: when the scope returns the send is
/// over, so the buffer is overwritten at once, and B still receives the first contents.
fn forgotten_send(tls: &str) {
    let (addr, b) = receiver(tls);
    let (_ctx, a) = sender(tls);
    let ep = a.connect(&addr, EndpointParams::default()).unwrap();
    ep.wait_connected(Duration::from_secs(60)).unwrap();
    let mut big = pattern(1);
    let in_flight = a.scope(|s| {
        let mut r = s.tag_send(&ep, &big, TAG_BIG).unwrap();
        let in_flight = !r.is_done();
        std::mem::forget(r);
        // B posts its receive only now.
        ep.tag_send(b"go", TAG_GO).unwrap();
        in_flight
    });
    // The scope waited for the forgotten send: the buffer is ours again.
    big.fill(0xEE);
    let out = received(&a, b);
    assert!(
        out == pattern(1),
        "B received bytes written after the scope ended"
    );
    // Not proof by itself (a fast receiver may finish before the scope's end), but the
    // case this test is about: the send was in flight when its request was forgotten.
    assert!(
        in_flight,
        "the rendezvous send completed at once: the test proves nothing"
    );
}

#[test]
fn forgotten_send_is_waited_for_by_the_scope_shm() {
    forgotten_send("shm");
}

#[test]
fn forgotten_send_is_waited_for_by_the_scope_tcp() {
    forgotten_send("tcp");
}

/// A receive forgotten in a scope that ends before any message came is canceled: a
/// message that arrives later is not written into the buffer (it waits, unexpected).
#[test]
fn forgotten_receive_is_canceled_by_the_scope() {
    let (_ctx, w) = sender("self");
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    let mut buf = [0u8; 16];
    w.scope(|s| {
        let r = s.tag_recv(&mut buf, 7, u64::MAX).unwrap();
        std::mem::forget(r);
    });
    buf.fill(0x55);
    ep.tag_send(b"late message", 7).unwrap();
    w.progress_until(Duration::from_secs(30), || {
        w.tag_probe(7, u64::MAX).ok().flatten().is_some()
    })
    .expect("the late message waits unexpected");
    assert_eq!(buf, [0x55; 16], "a canceled receive wrote the buffer");
    // And it is still there for a receive posted now.
    let mut again = [0u8; 16];
    let info = w.tag_recv(&mut again, 7, u64::MAX).unwrap();
    assert_eq!(&again[..info.length], b"late message");
}

/// The scope's request reached from a handler (safe code cannot: handlers are `Send` and
/// `'static`, requests are neither; this test does it through a pointer to exercise the
/// path): dropped inside the callback it is only detached, and the scope's end still
/// waits for it.
struct Smuggled(*mut Option<Request<'static>>);
// SAFETY: the pointer is used only on the test thread, which progresses the worker that
// runs the handler, while the slot it points to is alive (inside the scope's closure).
unsafe impl Send for Smuggled {}

fn dropped_in_callback(tls: &str) {
    let (addr, b) = receiver(tls);
    let (_ctx, a) = sender(tls);
    let ep = a.connect(&addr, EndpointParams::default()).unwrap();
    ep.wait_connected(Duration::from_secs(60)).unwrap();
    let me = a
        .connect(&a.address().unwrap(), EndpointParams::default())
        .unwrap();
    let mut big = pattern(2);
    let dropped = Arc::new(Mutex::new(None::<bool>));
    a.scope(|s| {
        let r = s.tag_send(&ep, &big, TAG_BIG).unwrap();
        let mut slot: Option<Request<'_>> = Some(r);
        let p = Smuggled(std::ptr::addr_of_mut!(slot).cast::<Option<Request<'static>>>());
        let seen = dropped.clone();
        a.am_set_handler(AM_DROP, move |_| {
            let p = &p;
            // SAFETY: see `Smuggled`: `slot` lives until the scope's closure returns, and
            // the handler runs in `me.am_send` below, inside it, on this thread.
            let r = unsafe { (*p.0).take() };
            if let Some(mut r) = r {
                *seen.lock().unwrap() = Some(!r.is_done());
                drop(r); // inside the callback: detached, not waited for
            }
        })
        .unwrap();
        me.am_send(AM_DROP, b"", b"", AmFlags::default()).unwrap();
        a.progress_until(Duration::from_secs(30), || {
            dropped.lock().unwrap().is_some()
        })
        .unwrap();
        assert!(slot.is_none());
        // The handler's pointer is not to be used past this closure.
        a.am_set_handler(AM_DROP, |_| {}).unwrap();
        ep.tag_send(b"go", TAG_GO).unwrap();
    });
    big.fill(0xEE);
    let out = received(&a, b);
    assert!(
        out == pattern(2),
        "B received bytes written after the scope ended"
    );
    assert_eq!(
        *dropped.lock().unwrap(),
        Some(true),
        "the send was not in flight when the handler dropped it: the test proves nothing"
    );
}

#[test]
fn request_dropped_in_a_callback_is_waited_for_by_the_scope_shm() {
    dropped_in_callback("shm");
}

#[test]
fn request_dropped_in_a_callback_is_waited_for_by_the_scope_tcp() {
    dropped_in_callback("tcp");
}

/// A panic in the scope's closure still waits for what it started before it unwinds.
#[test]
fn a_panicking_scope_waits_before_unwinding() {
    let (addr, b) = receiver("shm");
    let (_ctx, a) = sender("shm");
    let ep = a.connect(&addr, EndpointParams::default()).unwrap();
    ep.wait_connected(Duration::from_secs(60)).unwrap();
    let mut big = pattern(3);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.scope(|s| {
            let r = s.tag_send(&ep, &big, TAG_BIG).unwrap();
            std::mem::forget(r);
            ep.tag_send(b"go", TAG_GO).unwrap();
            panic!("on purpose");
        })
    }));
    assert!(r.is_err());
    big.fill(0xEE);
    assert!(received(&a, b) == pattern(3));
}
