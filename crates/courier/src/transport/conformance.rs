//! One conformance suite for every transport: each test runs against a connected pair of
//! `self`, `shm` (with and without CMA) and `tcp` links and checks what the transport
//! contract (module `transport`) promises and what its `Caps` claim.

use std::time::{Duration, Instant};

use super::{LinkRx, LinkTx, RndvMode, TxError};
use crate::base::{Config, Status};

type Pair = ((LinkTx, LinkRx), (LinkTx, LinkRx));
type MakePair = Box<dyn Fn() -> Pair>;

fn cfg(over: &[(&str, &str)]) -> Config {
    Config::from_env_with(over).expect("config")
}

fn pairs() -> Vec<(&'static str, MakePair)> {
    vec![
        (
            "self",
            Box::new(|| {
                let ((a, b), (c, d)) = super::loopback::pair();
                (
                    (LinkTx::Loopback(a), LinkRx::Loopback(b)),
                    (LinkTx::Loopback(c), LinkRx::Loopback(d)),
                )
            }),
        ),
        (
            "shm",
            Box::new(|| {
                let ((a, b), (c, d)) = super::shm::pair_for_tests(&cfg(&[]));
                (
                    (LinkTx::Shm(a), LinkRx::Shm(b)),
                    (LinkTx::Shm(c), LinkRx::Shm(d)),
                )
            }),
        ),
        (
            "shm-nocma",
            Box::new(|| {
                let ((a, b), (c, d)) =
                    super::shm::pair_for_tests(&cfg(&[("COURIER_SHM_CMA", "no")]));
                (
                    (LinkTx::Shm(a), LinkRx::Shm(b)),
                    (LinkTx::Shm(c), LinkRx::Shm(d)),
                )
            }),
        ),
        (
            "tcp",
            Box::new(|| {
                let ((a, b), (c, d)) = super::tcp::pair_for_tests();
                (
                    (LinkTx::Tcp(a), LinkRx::Tcp(b)),
                    (LinkTx::Tcp(c), LinkRx::Tcp(d)),
                )
            }),
        ),
    ]
}

fn pattern(seq: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq * 131 + i * 7) as u8).collect()
}

/// Read one frame, pumping the fd (and the sender's queue, if given) as an event loop would.
fn recv(rx: &mut LinkRx) -> Vec<u8> {
    recv_flushing(rx, None)
}

fn recv_flushing(rx: &mut LinkRx, mut tx: Option<&mut LinkTx>) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(tx) = tx.as_mut() {
            let _ = tx.flush();
        }
        if let Some(f) = rx.peek().expect("peek") {
            // SAFETY: within the peek/consume window.
            let v = unsafe { f.copy_whole() };
            rx.consume();
            return v;
        }
        rx.on_readable().expect("on_readable");
        assert!(Instant::now() < deadline, "no frame arrived");
    }
}

/// Send, draining the peer while the link pushes back.
fn send(tx: &mut LinkTx, rx_peer: &mut LinkRx, parts: &[&[u8]], got: &mut Vec<Vec<u8>>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tx.send(parts) {
            Ok(()) => return,
            Err(TxError::NoResource) => {
                let _ = tx.flush();
                let _ = rx_peer.on_readable();
                while let Some(f) = rx_peer.peek().expect("peek") {
                    // SAFETY: within the window.
                    got.push(unsafe { f.copy_whole() });
                    rx_peer.consume();
                }
            }
            Err(TxError::Failed(e)) => panic!("send failed: {e}"),
        }
        assert!(Instant::now() < deadline, "link stayed full");
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn frames_of_every_size_arrive_whole_and_in_order() {
    for (name, make) in pairs() {
        let ((mut atx, _arx), (_btx, mut brx)) = make();
        let max = atx.caps().max_frame;
        let sizes: Vec<usize> = [
            1,
            2,
            7,
            63,
            64,
            65,
            240,
            241,
            256,
            4095,
            4096,
            8191,
            max / 2,
            max - 1,
            max,
        ]
        .into_iter()
        .filter(|&s| s >= 1 && s <= max)
        .collect();
        let mut got = Vec::new();
        let mut sent = Vec::new();
        for round in 0..3 {
            for (i, &s) in sizes.iter().enumerate() {
                let data = pattern(round * 100 + i, s);
                // Split into parts to exercise gathering.
                let cut = s / 3;
                send(&mut atx, &mut brx, &[&data[..cut], &data[cut..]], &mut got);
                sent.push(data);
            }
        }
        let _ = atx.flush();
        while got.len() < sent.len() {
            got.push(recv_flushing(&mut brx, Some(&mut atx)));
        }
        for (i, (a, b)) in sent.iter().zip(&got).enumerate() {
            assert!(
                a == b,
                "{name}: frame {i} ({} bytes) differs or is out of order",
                a.len()
            );
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn oversized_frames_are_refused_not_truncated() {
    for (name, make) in pairs() {
        let ((mut atx, _), _) = make();
        let max = atx.caps().max_frame;
        if name == "self" {
            continue; // self takes any size; its max_frame is a protocol hint
        }
        let big = vec![0u8; max + 1];
        match atx.send(&[&big]) {
            Err(TxError::Failed(e)) => assert_eq!(e.status(), Status::InvalidParam, "{name}: {e}"),
            Err(TxError::NoResource) => panic!("{name}: an oversized frame must fail, not wait"),
            Ok(()) => panic!("{name}: accepted a frame larger than max_frame"),
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn peeked_frame_stays_put_while_more_arrive() {
    for (name, make) in pairs() {
        let ((mut atx, _), (_, mut brx)) = make();
        let first = pattern(1, 100);
        atx.send(&[&first]).unwrap();
        let _ = atx.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        let f = loop {
            if let Some(f) = brx.peek().unwrap() {
                break f;
            }
            brx.on_readable().unwrap();
            assert!(Instant::now() < deadline);
        };
        for i in 0..50 {
            let d = pattern(i + 2, 200);
            if atx.send(&[&d]).is_err() {
                break;
            }
            let _ = atx.flush();
            let _ = brx.on_readable();
        }
        // SAFETY: still within the window.
        assert_eq!(
            unsafe { f.copy_whole() },
            &first[..],
            "{name}: peeked bytes changed"
        );
        brx.consume();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn arm_reports_waiting_frames() {
    for (name, make) in pairs() {
        let ((mut atx, _), (_, mut brx)) = make();
        assert!(
            brx.arm().unwrap(),
            "{name}: nothing waiting, arm must allow sleeping"
        );
        atx.send(&[b"wake"]).unwrap();
        let _ = atx.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _ = brx.on_readable();
            if !brx.arm().unwrap() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: arm kept saying sleep with a frame waiting"
            );
        }
        assert_eq!(recv(&mut brx), b"wake");
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn remote_read_works_where_claimed() {
    for (name, make) in pairs() {
        let ((mut atx, _), _) = make();
        let src = pattern(9, 100_000);
        let mut dst = vec![0u8; 100_000];
        let local = [
            (dst.as_mut_ptr() as usize, 60_000),
            (dst.as_mut_ptr() as usize + 60_000, 40_000),
        ];
        let remote = [(src.as_ptr() as u64, 100_000u64)];
        // SAFETY: `dst` is writable for its length; src is this process's (same pid for self/shm pairs).
        let r = unsafe { atx.remote_read(&local, &remote) };
        match atx.caps().rndv {
            RndvMode::RemoteRead => {
                r.unwrap_or_else(|e| panic!("{name}: claimed remote read failed: {e}"));
                assert!(dst == src, "{name}: remote read returned wrong bytes");
            }
            RndvMode::Push => assert!(
                r.is_err(),
                "{name}: remote read must be refused when not claimed"
            ),
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "real links (sockets, memfd): system calls Miri does not model"
)]
fn a_dropped_peer_is_a_failure_not_a_hang() {
    for (name, make) in pairs() {
        let ((mut atx, mut arx), (btx, brx)) = make();
        if !atx.caps().peer_failure {
            continue;
        }
        drop(btx);
        drop(brx);
        let deadline = Instant::now() + Duration::from_secs(5);
        let failed = loop {
            let r = arx.on_readable().and_then(|_| arx.peek().map(|_| ()));
            let s = match atx.send(&[b"x"]) {
                Err(TxError::Failed(_)) => true,
                _ => atx.flush().is_err(),
            };
            if r.is_err() || s {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if name != "self" {
            assert!(failed, "{name}: peer drop went unnoticed");
        }
    }
}
