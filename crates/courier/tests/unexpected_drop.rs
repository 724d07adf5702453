//! What a peer failed at its unexpected-message limit leaves behind, over shm and tcp: its
//! messages are gone from the tag queue at once (a probe no longer sees them), the other
//! peers' messages stay receivable, whole and in order, and the memory they held is given
//! back to the worker's budget (`COURIER_MAX_UNEXPECTED`) as progress frees it, so that
//! another peer may then use that budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use courier::*;

const KEPT: u64 = 0x1;
const FLOOD: u64 = 0x2;
const LATER: u64 = 0x3;
const MSG: usize = 2 << 10;

fn message(tag: u64, i: usize) -> Vec<u8> {
    (0..MSG)
        .map(|j| (j as u64 ^ tag.wrapping_mul(131) ^ (i as u64 * 7)) as u8)
        .collect()
}

/// The victim's worker, progressed by its own thread.
struct Victim {
    w: Worker,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn victim(ctx: &Context) -> Victim {
    let w = Worker::new(
        ctx,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (w2, s2) = (w.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            if w2.progress() == 0 {
                std::thread::yield_now();
            }
        }
    });
    Victim {
        w,
        stop,
        thread: Some(thread),
    }
}

fn connect(from: &Worker, to: &Worker) -> Endpoint {
    let ep = from
        .connect(&to.address().unwrap(), EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(20)).unwrap();
    ep
}

/// Send `n` messages of `tag` and wait until all have left this process (a burst's last
/// frames wait for the sender's next progress call otherwise).
fn send_all(ep: &Endpoint, tag: u64, n: usize) {
    for i in 0..n {
        let m = message(tag, i);
        // SAFETY: the request is waited for before `m` goes; it is never forgotten.
        let mut r = unsafe { ep.tag_send_nb(&m, tag) }.unwrap();
        r.wait_timeout(Duration::from_secs(20)).unwrap();
    }
    ep.flush().unwrap();
}

/// Send messages of `FLOOD` until the victim fails the connection; how many went.
fn flood(ep: &Endpoint) -> usize {
    let m = message(FLOOD, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the victim never failed the flood"
        );
        // SAFETY: the request is waited for (or dropped, which waits) before `m` goes.
        let Ok(mut r) = (unsafe { ep.tag_send_nb(&m, FLOOD) }) else {
            return n;
        };
        if r.wait_timeout(Duration::from_secs(20)).is_err() {
            return n;
        }
        n += 1;
    }
}

/// Wait until a message of `tag` waits on the victim (`receive_all` counts them).
fn wait_probe(v: &Worker, tag: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while v.tag_probe(tag, u64::MAX).unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "no message of tag {tag:#x} arrived"
        );
        std::thread::yield_now();
    }
}

/// Receive `n` messages of `tag` on the victim and check each one's bytes and order.
fn receive_all(v: &Worker, tag: u64, n: usize, tls: &str) {
    for i in 0..n {
        let mut buf = vec![0u8; MSG];
        // SAFETY: the request is waited for before `buf` goes; it is never forgotten.
        let mut r = unsafe { v.tag_recv_nb(&mut buf, tag, u64::MAX) }.unwrap();
        let info = r
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{tls}: message {i} of tag {tag:#x}: {e}"));
        drop(r);
        assert_eq!(info.length, MSG, "{tls}");
        assert!(
            buf == message(tag, i),
            "{tls}: message {i} of tag {tag:#x} differs"
        );
    }
    assert!(
        v.tag_probe(tag, u64::MAX).unwrap().is_none(),
        "{tls}: more than {n} messages of tag {tag:#x}"
    );
}

#[test]
fn a_failed_flooders_messages_go_and_its_budget_comes_back() {
    for tls in ["shm", "tcp"] {
        let ctx = Context::new(
            ContextParams::default()
                .config("COURIER_TLS", tls)
                .config("COURIER_MAX_UNEXPECTED_EP", "512k")
                .config("COURIER_MAX_UNEXPECTED", "768k"),
        )
        .unwrap();
        let v = victim(&ctx);
        let senders = Worker::new(&ctx, WorkerParams::default()).unwrap();
        let other = connect(&senders, &v.w);
        // Another peer's messages wait first; then a flood from a second connection is
        // failed at its limit: its messages go, the other's stay (the queue held both).
        send_all(&other, KEPT, 5);
        wait_probe(&v.w, KEPT);
        let f1 = connect(&senders, &v.w);
        let sent = flood(&f1);
        assert!(
            sent >= 200,
            "{tls}: only {sent} messages before the failure"
        );
        assert!(
            v.w.tag_probe(FLOOD, u64::MAX).unwrap().is_none(),
            "{tls}: the failed peer's messages are still in the queue"
        );
        receive_all(&v.w, KEPT, 5, tls);
        // A flood alone in the queue (it is set aside whole), failed in turn.
        let f2 = connect(&senders, &v.w);
        flood(&f2);
        assert!(
            v.w.tag_probe(FLOOD, u64::MAX).unwrap().is_none(),
            "{tls}: the second flood's messages are still in the queue"
        );
        // 400 KiB from the other peer: within the worker's 768 KiB only once the 512 KiB
        // the flood held have been given back.
        let n = (400 << 10) / MSG;
        send_all(&other, LATER, n);
        wait_probe(&v.w, LATER);
        assert!(
            other.is_connected().unwrap(),
            "{tls}: the other peer was failed"
        );
        receive_all(&v.w, LATER, n, tls);
    }
}
