//! The tcp transport's tests, by theme: frames between two links (`frames`), what a peer
//! may send (`hostile`), large payloads placed straight into their destination (`placed`),
//! sockets, addresses and interfaces (`host`), the send queue's blocks (`sendq`). Here:
//! what they share.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::*;

mod frames;
mod host;
mod hostile;
mod placed;
mod sendq;

const LO4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn cfg(over: &[(&str, &str)]) -> Config {
    Config::from_env_with(over).unwrap()
}

fn wait_readable(fd: BorrowedFd<'_>, ms: u64) {
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: (ms * 1_000_000) as _,
    };
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    let _ = rustix::event::poll(&mut p, Some(&ts));
}

/// Deterministic contents for frame `i` of length `n`.
fn pattern(i: usize, n: usize) -> Vec<u8> {
    let mut x = (i as u32).wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Take every complete frame now buffered.
fn drain(rx: &mut Rx, got: &mut Vec<Vec<u8>>) -> Result<()> {
    while let Some(f) = rx.peek()? {
        // SAFETY: between peek and consume on a live link.
        got.push(unsafe { f.bytes() }.to_vec());
        rx.consume();
    }
    Ok(())
}

/// Send `frames` (each split into up to three parts) from `tx` and receive them on `rx`,
/// in one thread, alternating flush and read.
fn exchange(tx: &mut Tx, rx: &mut Rx, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut next = 0;
    while got.len() < frames.len() {
        assert!(
            Instant::now() < deadline,
            "exchange stalled at {} of {}",
            got.len(),
            frames.len()
        );
        while next < frames.len() {
            let f = &frames[next];
            let (a, rest) = f.split_at(f.len() / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            match tx.send(&[a, b, c]) {
                Ok(()) => next += 1,
                Err(TxError::NoResource) => break,
                Err(TxError::Failed(e)) => panic!("send failed: {e}"),
            }
        }
        tx.flush().unwrap();
        rx.on_readable().unwrap();
        drain(rx, &mut got).unwrap();
        if got.len() < frames.len() && rx.arm().unwrap() {
            wait_readable(rx.fd().unwrap(), 1);
        }
    }
    got
}

fn check(frames: &[Vec<u8>], got: &[Vec<u8>]) {
    assert_eq!(got.len(), frames.len());
    for (i, (a, b)) in frames.iter().zip(got).enumerate() {
        assert!(
            a == b,
            "frame {i} ({} bytes) differs (got {} bytes)",
            a.len(),
            b.len()
        );
    }
}

/// Flush and read until `n` frames have arrived.
fn receive_all(tx: &mut Tx, rx: &mut Rx, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(Instant::now() < deadline, "stalled at {} of {n}", got.len());
        tx.flush().unwrap();
        rx.on_readable().unwrap();
        drain(rx, &mut got).unwrap();
        if got.len() < n && rx.arm().unwrap() {
            wait_readable(rx.fd().unwrap(), 1);
        }
    }
    got
}

fn raw_peer(bytes: &[u8]) -> (Rx, TcpStream) {
    let cfg = cfg(&[]);
    let mut l = Listener::bind(SocketAddr::new(LO4, 0), &cfg).unwrap();
    let mut s = TcpStream::connect(l.local_addr()).unwrap();
    s.write_all(bytes).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((_tx, rx, peer)) = l.accept().unwrap() {
            assert_eq!(peer, s.local_addr().unwrap());
            return (rx, s);
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Read until an error, which is returned.
fn until_error(rx: &mut Rx) -> Error {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no error reported");
        if let Err(e) = rx.on_readable() {
            return e;
        }
        match rx.peek() {
            Err(e) => return e,
            Ok(Some(_)) => rx.consume(),
            Ok(None) => wait_readable(rx.fd().unwrap(), 5),
        }
    }
}

thread_local! {
    /// `Tx::write` calls (sendmsg or send) made by this thread.
    pub(in crate::transport::tcp) static WRITE_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn write_calls() -> u64 {
    WRITE_CALLS.with(|c| c.get())
}
