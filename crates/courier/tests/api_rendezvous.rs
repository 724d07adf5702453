//! Active messages and rendezvous on every transport: replies, rendezvous descriptors,
//! receives started inside handlers, copies made in pieces across progress calls, kept
//! and declined messages, headers too large for the link. The workers are those of
//! tests/common/pair.rs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::pair::*;

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
