//! The two-sided API on every transport: worker B runs in multi-thread mode with its own
//! progress thread (so shared use is exercised too), worker A is single-thread on the test
//! thread. For `self` both ends are one worker.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

struct Pair {
    a: Worker,
    b: Worker,
    /// A → B.
    ab: Endpoint,
    /// B → A.
    ba: Endpoint,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _ctx: Context,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pair(tls: &str) -> Pair {
    pair_with(tls, &[])
}

/// A pair whose context also has the variables `cfg`.
fn pair_with(tls: &str, cfg: &[(&str, &str)]) -> Pair {
    let mut params = ContextParams::default().config("COURIER_TLS", tls);
    for &(k, v) in cfg {
        params = params.config(k, v);
    }
    let ctx = Context::new(params).unwrap();
    let a = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    if tls == "self" {
        let ab = a
            .connect(&a.address().unwrap(), EndpointParams::default())
            .unwrap();
        let ba = a.incoming_endpoint().expect("passive self endpoint");
        return Pair {
            b: a.clone(),
            a,
            ab,
            ba,
            stop,
            thread: None,
            _ctx: ctx,
        };
    }
    let b = Worker::new(
        &ctx,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )
    .unwrap();
    let (b2, s2) = (b.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            if b2.progress() == 0 {
                std::thread::yield_now();
            }
        }
    });
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ba = loop {
        a.progress();
        if let Some(e) = b.incoming_endpoint() {
            break e;
        }
        assert!(Instant::now() < deadline, "no incoming endpoint");
    };
    assert_eq!(ab.transport(), Some(tls));
    if tls == "shm" {
        // Made from a worker address, not a socket.
        assert_eq!(ab.local_sockaddr(), None);
    }
    Pair {
        a,
        b,
        ab,
        ba,
        stop,
        thread: Some(thread),
        _ctx: ctx,
    }
}

const TLS: [&str; 3] = ["self", "shm", "tcp"];

fn wait_on(w: &Worker, r: &mut Request<'_>) -> Result<Info> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(x) = r.test() {
            return x.clone();
        }
        w.progress();
        assert!(Instant::now() < deadline, "request did not complete");
    }
}

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
fn active_messages_reply_and_rendezvous_descriptors() {
    for tls in TLS {
        let p = pair(tls);
        type Seen = Arc<Mutex<Vec<(Vec<u8>, usize, bool)>>>;
        let seen: Seen = Arc::default();
        let s2 = seen.clone();
        let kept: Arc<Mutex<Option<AmRndv>>> = Arc::default();
        let k2 = kept.clone();
        p.a.am_set_handler(3, move |m: &mut AmMessage| {
            s2.lock()
                .unwrap()
                .push((m.header().to_vec(), m.data_len(), m.reply_ep().is_some()));
            if m.is_rndv() {
                *k2.lock().unwrap() = m.take_rndv();
            } else if let Some(ep) = m.reply_ep() {
                // Reply from inside the handler, fire and forget.
                let _ = ep.am_send(4, b"re", b"", AmFlags::default());
            }
        })
        .unwrap();
        let replies = Arc::new(AtomicUsize::new(0));
        let r2 = replies.clone();
        p.b.am_set_handler(4, move |m: &mut AmMessage| {
            assert_eq!(m.header(), b"re");
            r2.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let big: Vec<u8> = (0..500_000).map(|i| (i % 13) as u8).collect();
        let mut x =
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { p.ba.am_send_nb(
                3,
                b"h1",
                b"eager",
                AmFlags {
                    reply: true,
                    ..Default::default()
                },
            ) }
            .unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut y = unsafe { p.ba.am_send_nb(3, b"h2", &big, AmFlags::default()) }.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while kept.lock().unwrap().is_none() || replies.load(Ordering::SeqCst) == 0 {
            p.a.progress();
            assert!(
                Instant::now() < deadline,
                "{tls}: active messages not delivered"
            );
        }
        let desc = kept.lock().unwrap().take().unwrap();
        let mut into = vec![0u8; desc.len()];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.am_recv_data_nb(desc, &mut into) }.unwrap();
        wait_on(&p.a, &mut r).unwrap();
        drop(r);
        assert!(into == big, "{tls}: rendezvous active message differs");
        wait_on(&p.b, &mut x).unwrap();
        wait_on(&p.b, &mut y).unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0], (b"h1".to_vec(), 5, true), "{tls}");
        assert_eq!(seen[1], (b"h2".to_vec(), 500_000, false), "{tls}");
        // A message for an id nobody handles is dropped with a warning, and nothing breaks.
        p.ba.am_send(99, b"", b"lost", AmFlags::default()).ok();
    }
}

/// Inside an active-message handler: start receiving rendezvous message `m` into slot `k`
/// of `slots`, `k` being the first byte of its header, completed by `done(k, result)`.
fn receive_into_slot(
    m: &mut AmMessage,
    slots: &[Mutex<Vec<u8>>],
    done: impl FnOnce(usize, Result<Info>) + Send + 'static,
) {
    let k = m.header()[0] as usize;
    let desc = m.take_rndv().expect("a rendezvous message");
    let (at, len) = {
        let mut v = slots[k].lock().unwrap();
        (v.as_mut_ptr() as usize, v.len())
    };
    let cb = Callback::Rust(Box::new(move |r: Result<Info>| done(k, r)));
    // SAFETY: the callers keep every slot alive and untouched until all completions ran.
    unsafe { m.worker().am_recv_data_raw(desc, Buf::One((at, len)), cb) }.expect("receive started");
}

/// A handler that starts receiving each rendezvous message at once, through the worker its
/// message hands it (as UCX handlers call `ucp_am_recv_data_nbx`), for messages sent back to
/// back: each lands whole in its own slot, each completion runs once, and a slot too short
/// for its message fails that receive only, with `MessageTruncated`.
#[test]
fn rendezvous_active_messages_received_inside_their_handler() {
    const N: usize = 4;
    const SIZE: usize = 300_000;
    for tls in TLS {
        let p = pair(tls);
        // Slot k receives message k; the last slot is one byte short.
        let slots: Arc<Vec<Mutex<Vec<u8>>>> = Arc::new(
            (0..N)
                .map(|k| Mutex::new(vec![0u8; if k == N - 1 { SIZE - 1 } else { SIZE }]))
                .collect(),
        );
        type Done = Arc<Mutex<Vec<(usize, std::result::Result<usize, Status>)>>>;
        let done: Done = Arc::default();
        let (sl, d2) = (slots.clone(), done.clone());
        p.a.am_set_handler(5, move |m: &mut AmMessage| {
            let d3 = d2.clone();
            receive_into_slot(m, &sl, move |k, r| {
                d3.lock()
                    .unwrap()
                    .push((k, r.map(|i| i.length).map_err(|e| e.status())));
            });
        })
        .unwrap();
        let msgs: Vec<Vec<u8>> = (0..N)
            .map(|k| (0..SIZE).map(|i| (i * 3 + k * 11) as u8).collect())
            .collect();
        let mut sends: Vec<_> = msgs
            .iter()
            .enumerate()
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            .map(|(k, m)| unsafe { p.ba.am_send_nb(5, &[k as u8], m, AmFlags::default()) }.unwrap())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.lock().unwrap().len() < N {
            p.a.progress();
            assert!(
                Instant::now() < deadline,
                "{tls}: receives did not complete"
            );
        }
        for s in sends.iter_mut() {
            // The truncated one's sender finishes too (its data was not taken whole).
            let _ = wait_on(&p.b, s);
        }
        let mut got = done.lock().unwrap().clone();
        got.sort_by_key(|&(k, _)| k);
        let want: Vec<_> = (0..N)
            .map(|k| {
                (
                    k,
                    if k == N - 1 {
                        Err(Status::MessageTruncated)
                    } else {
                        Ok(SIZE)
                    },
                )
            })
            .collect();
        assert_eq!(got, want, "{tls}: completions");
        for k in 0..N - 1 {
            assert!(
                *slots[k].lock().unwrap() == msgs[k],
                "{tls}: message {k} differs"
            );
        }
    }
}

/// Rendezvous copies longer than `COURIER_RNDV_PIECE` are made one piece per progress call
/// (the first at once): messages of many pieces, split or not, contiguous or scattered,
/// arrive whole; a receive that starts a copy of many pieces is not complete before the
/// worker progressed.
#[test]
fn rendezvous_copies_in_pieces() {
    for tls in TLS {
        let p = pair_with(tls, &[("COURIER_RNDV_PIECE", "16k")]);
        for (round, size) in [100_000usize, (1 << 20) + 13].into_iter().enumerate() {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + round) as u8).collect();
            let tag = 0x40 + round as u64;
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut s = unsafe { p.ba.tag_send_nb(&data, tag) }.unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while p.a.tag_probe(tag, u64::MAX).unwrap().is_none() {
                p.a.progress();
                assert!(
                    Instant::now() < deadline,
                    "{tls}: message {size} not offered"
                );
            }
            let mut got = vec![0u8; size];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { p.a.tag_recv_nb(&mut got, tag, u64::MAX) }.unwrap();
            if tls != "tcp" {
                // The receive copied its first piece; the others wait for progress.
                assert!(!r.is_done(), "{tls}: {size} bytes received in one call");
            }
            assert_eq!(wait_on(&p.a, &mut r).unwrap().length, size, "{tls}");
            drop(r);
            assert!(got == data, "{tls}: {size}-byte message differs");
            wait_on(&p.b, &mut s).unwrap();
            // Scattered on both sides, with segments that do not line up with pieces.
            let (head, tail) = data.split_at(size / 3);
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut s = unsafe { p.ba.tag_send_iov_nb(&[head, tail], tag) }.unwrap();
            let mut x = vec![0u8; 5000];
            let mut y = vec![0u8; size - 5000];
            let mut r = {
                let mut iov: [&mut [u8]; 2] = [&mut x, &mut y];
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { p.a.tag_recv_iov_nb(&mut iov, tag, u64::MAX) }.unwrap()
            };
            assert_eq!(wait_on(&p.a, &mut r).unwrap().length, size, "{tls}");
            drop(r);
            assert!(
                x == data[..5000] && y == data[5000..],
                "{tls}: scattered message differs"
            );
            wait_on(&p.b, &mut s).unwrap();
        }
    }
}

/// A copy made in pieces moves on at every progress call, with nothing else to do: a
/// receive of 16 pieces (no split) completes within 15 more calls.
#[test]
fn rendezvous_pieces_move_on_every_progress_call() {
    let p = pair_with(
        "shm",
        &[("COURIER_RNDV_PIECE", "64k"), ("COURIER_CMA_SPLIT", "off")],
    );
    let size = 1 << 20;
    let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut s = unsafe { p.ba.tag_send_nb(&data, 9) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.a.tag_probe(9, u64::MAX).unwrap().is_none() {
        p.a.progress();
        assert!(Instant::now() < deadline, "message not offered");
    }
    let mut got = vec![0u8; size];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { p.a.tag_recv_nb(&mut got, 9, u64::MAX) }.unwrap();
    let mut calls = 0;
    while r.test().is_none() {
        p.a.progress();
        calls += 1;
        assert!(calls <= 15, "16 pieces not copied in 15 progress calls");
    }
    assert_eq!(r.test().unwrap().clone().unwrap().length, size);
    drop(r);
    assert!(got == data, "message differs");
    wait_on(&p.b, &mut s).unwrap();
}

/// A progress call copies about one piece's bytes in all: a sender whose receiver asked for
/// four split parts at once (each four pieces long) writes a piece of one of them per call,
/// oldest first, and every message arrives whole.
#[test]
fn one_rendezvous_piece_per_progress_call() {
    let p = pair_with("shm", &[("COURIER_RNDV_PIECE", "64k")]);
    let size = 512 << 10;
    let msgs: Vec<Vec<u8>> = (0..4)
        .map(|m| (0..size).map(|i| (i * 3 + m) as u8).collect())
        .collect();
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; size]).collect();
    let mut recvs: Vec<_> = bufs
        .iter_mut()
        .enumerate()
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        .map(|(m, b)| unsafe { p.b.tag_recv_nb(b, 0x70 + m as u64, u64::MAX) }.unwrap())
        .collect();
    let before = p.a.rndv_copies().unwrap();
    let mut sends: Vec<_> = msgs
        .iter()
        .enumerate()
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        .map(|(m, d)| unsafe { p.ab.tag_send_nb(d, 0x70 + m as u64) }.unwrap())
        .collect();
    // The receiver asks for each second half as it starts reading the first.
    let total = |c: RndvCopies| c.shared + c.link;
    let deadline = Instant::now() + Duration::from_secs(10);
    while total(p.b.rndv_copies().unwrap()) < 4 {
        std::thread::yield_now();
        assert!(
            Instant::now() < deadline,
            "receiver did not start its copies"
        );
    }
    let mut made = 0;
    while made < 4 {
        p.a.progress();
        let now = total(p.a.rndv_copies().unwrap()) - total(before);
        assert!(
            now <= made + 1,
            "{} copies started in one progress call",
            now - made
        );
        made = now;
        assert!(Instant::now() < deadline, "sender did not write its parts");
    }
    for s in &mut sends {
        wait_on(&p.a, s).unwrap();
    }
    for r in &mut recvs {
        wait_on(&p.b, r).unwrap();
    }
    drop(recvs);
    assert!(bufs == msgs, "a message differs");
}

/// Receives started by handlers inside one progress call are copied in that call while they
/// fit in its piece (64 KiB here): of five 16 KiB messages, four are in when the call that
/// ran the five handlers returns, and the fifth is copied by the next call.
#[test]
fn small_rendezvous_copies_share_a_progress_call() {
    const N: usize = 5;
    const SIZE: usize = 16 << 10;
    let p = pair_with("shm", &[("COURIER_RNDV_PIECE", "64k")]);
    let slots: Arc<Vec<Mutex<Vec<u8>>>> =
        Arc::new((0..N).map(|_| Mutex::new(vec![0u8; SIZE])).collect());
    let handled = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (sl, h2, d2) = (slots.clone(), handled.clone(), done.clone());
    p.a.am_set_handler(6, move |m: &mut AmMessage| {
        h2.fetch_add(1, Ordering::SeqCst);
        let d3 = d2.clone();
        receive_into_slot(m, &sl, move |k, r| {
            assert_eq!(r.map(|i| i.length).ok(), Some(SIZE), "message {k}");
            d3.fetch_add(1, Ordering::SeqCst);
        });
    })
    .unwrap();
    let msgs: Vec<Vec<u8>> = (0..N)
        .map(|k| (0..SIZE).map(|i| (i * 7 + k * 13) as u8).collect())
        .collect();
    let rndv = AmFlags {
        rndv: true,
        ..Default::default()
    };
    // On shared memory each announcement is in the receiver's queue when its send returns.
    let mut sends: Vec<_> = msgs
        .iter()
        .enumerate()
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        .map(|(k, m)| unsafe { p.ba.am_send_nb(6, &[k as u8], m, rndv) }.unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while handled.load(Ordering::SeqCst) == 0 {
        p.a.progress();
        assert!(Instant::now() < deadline, "no message handled");
    }
    assert_eq!(handled.load(Ordering::SeqCst), N, "handled in one call");
    assert_eq!(
        done.load(Ordering::SeqCst),
        4,
        "copied in the call that handled them"
    );
    p.a.progress();
    assert_eq!(
        done.load(Ordering::SeqCst),
        N,
        "the fifth, in the next call"
    );
    for s in &mut sends {
        wait_on(&p.b, s).unwrap();
    }
    for (k, m) in msgs.iter().enumerate() {
        assert!(*slots[k].lock().unwrap() == *m, "message {k} differs");
    }
}

#[test]
fn kept_rendezvous_message_declined_later() {
    for tls in TLS {
        let p = pair(tls);
        let kept: Arc<Mutex<Vec<AmRndv>>> = Arc::default();
        let k2 = kept.clone();
        p.a.am_set_handler(5, move |m: &mut AmMessage| {
            if let Some(d) = m.take_rndv() {
                k2.lock().unwrap().push(d);
            }
        })
        .unwrap();
        let big: Vec<u8> = (0..300_000).map(|i| (i % 7) as u8).collect();
        let rndv = AmFlags {
            rndv: true,
            ..Default::default()
        };
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut first = unsafe { p.ba.am_send_nb(5, b"", &big, rndv) }.unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut second = unsafe { p.ba.am_send_nb(5, b"", &big, rndv) }.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while kept.lock().unwrap().len() < 2 {
            p.a.progress();
            assert!(Instant::now() < deadline, "{tls}: messages not delivered");
        }
        let (d1, d2) = {
            let mut k = kept.lock().unwrap();
            let d2 = k.pop().unwrap();
            (k.pop().unwrap(), d2)
        };
        // Declined after the handler returned: the sender's request completes, nothing moves.
        p.a.am_decline(d1).unwrap();
        let info = wait_on(&p.b, &mut first).unwrap();
        assert_eq!(info.length, big.len(), "{tls}");
        // The endpoint goes on: the other kept message is still received whole.
        let mut into = vec![0u8; d2.len()];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { p.a.am_recv_data_nb(d2, &mut into) }.unwrap();
        wait_on(&p.a, &mut r).unwrap();
        drop(r);
        assert!(into == big, "{tls}: kept rendezvous data differs");
        wait_on(&p.b, &mut second).unwrap();
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

/// An active message whose header cannot travel on the link (beside its rendezvous offer,
/// on shared memory's 64 KiB frames) is refused by the call, saying so, and the endpoint
/// goes on: before, the link refused the frame and the endpoint failed for good, with a
/// message about a failed connection.
#[test]
fn an_active_message_header_too_large_for_the_link_is_refused_and_the_endpoint_lives() {
    let p = pair("shm");
    let header = vec![1u8; 70_000];
    let e =
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        unsafe { p.ab.am_send_nb(5, &header, b"d", AmFlags::default()) }
            .err()
            .expect("a 70,000-byte header on 64 KiB frames");
    assert_eq!(e.status(), Status::InvalidParam, "{e}");
    assert!(
        e.detail().contains("active-message header of 70000 bytes"),
        "{e}"
    );
    let mut buf = [0u8; 5];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { p.b.tag_recv_nb(&mut buf, 9, u64::MAX) }.unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut s = unsafe { p.ab.tag_send_nb(b"alive", 9) }.unwrap();
    wait_on(&p.a, &mut s).expect("the endpoint still sends");
    let deadline = Instant::now() + Duration::from_secs(20);
    let info = loop {
        if let Some(x) = r.test() {
            break x.clone().unwrap();
        }
        p.a.progress();
        assert!(Instant::now() < deadline, "the message did not arrive");
    };
    drop(r);
    assert_eq!((info.length, &buf), (5, b"alive"));
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
