//! Large payloads read straight into their destination, declined, or cut short by a peer
//! that goes away.

use super::*;

/// Read until the next large frame is offered with at least `head` bytes buffered.
fn until_offered(rx: &mut Rx, head: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no large frame offered");
        assert!(
            rx.peek().unwrap().is_none(),
            "a large frame was buffered whole before the protocol could place it"
        );
        if let Some((pre, len)) = rx.peek_partial() {
            if pre.len >= head {
                return len;
            }
        }
        rx.on_readable().unwrap();
        wait_readable(rx.fd().unwrap(), 1);
    }
}

/// A raw peer that has sent the preamble and the start of a frame of `24 + size` bytes:
/// its length, a 24-byte head, and `first` bytes of the payload.
fn raw_frame_start(head: &[u8], payload: &[u8], first: usize) -> (Rx, TcpStream) {
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&((head.len() + payload.len()) as u32).to_le_bytes());
    bytes.extend_from_slice(head);
    bytes.extend_from_slice(&payload[..first]);
    let (mut rx, s) = raw_peer(&bytes);
    rx.established();
    (rx, s)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn large_payloads_are_read_straight_into_their_destination() {
    for size in [place::PLACE_MIN, 100_003, (1 << 20) + 5, 5 << 20] {
        let (head, payload, tail) = (pattern(1, 24), pattern(2, size), pattern(3, 10));
        let (mut rx, mut s) = raw_frame_start(&head, &payload, 7);
        // Tell the link the protocol places large frames.
        assert!(rx.peek_partial().is_none());
        let len = until_offered(&mut rx, 24);
        assert_eq!(len, 24 + size);
        // Two destination segments, to cross a boundary.
        let mut a = vec![0u8; 1000];
        let mut b = vec![0u8; size - 1000];
        // SAFETY: `a` and `b` outlive the placement (taken below). Wrong lengths are
        // refused and change nothing.
        assert!(!unsafe { rx.place(24, vec![(a.as_mut_ptr() as usize, 10)], None) });
        let segs = vec![
            (a.as_mut_ptr() as usize, a.len()),
            (b.as_mut_ptr() as usize, b.len()),
        ];
        // SAFETY: as above.
        assert!(unsafe { rx.place(24, segs, None) });
        std::thread::scope(|sc| {
            sc.spawn(|| {
                s.write_all(&payload[7..]).unwrap();
                s.write_all(&(tail.len() as u32).to_le_bytes()).unwrap();
                s.write_all(&tail).unwrap();
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            let (h, n) = loop {
                assert!(Instant::now() < deadline, "placement stalled");
                if let Some(t) = rx.take_placed() {
                    break t;
                }
                assert!(
                    rx.peek().unwrap().is_none(),
                    "nothing overtakes a placed frame"
                );
                rx.on_readable().unwrap();
                if rx.arm().unwrap() {
                    wait_readable(rx.fd().unwrap(), 1);
                }
            };
            assert_eq!(n, size);
            // SAFETY: between take_placed and consume.
            assert_eq!(unsafe { h.bytes() }, &head[..]);
            rx.consume();
            let got = receive_all_rx(&mut rx, 1);
            assert_eq!(got[0], tail, "the frame after a placed one");
        });
        assert!([a, b].concat() == payload, "{size}: placed payload differs");
    }
}

/// Read until `n` frames have arrived (the sender flushes by itself).
fn receive_all_rx(rx: &mut Rx, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(Instant::now() < deadline, "stalled at {} of {n}", got.len());
        rx.on_readable().unwrap();
        drain(rx, &mut got).unwrap();
        if got.len() < n && rx.arm().unwrap() {
            wait_readable(rx.fd().unwrap(), 1);
        }
    }
    got
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn a_declined_large_frame_arrives_whole() {
    let (head, payload, tail) = (pattern(1, 24), pattern(2, 3 << 20), pattern(3, 10));
    let (mut rx, mut s) = raw_frame_start(&head, &payload, 100);
    assert!(rx.peek_partial().is_none());
    until_offered(&mut rx, 24);
    rx.decline();
    assert!(
        rx.peek_partial().is_none(),
        "a declined frame is not offered again"
    );
    std::thread::scope(|sc| {
        sc.spawn(|| {
            s.write_all(&payload[100..]).unwrap();
            s.write_all(&(tail.len() as u32).to_le_bytes()).unwrap();
            s.write_all(&tail).unwrap();
        });
        let got = receive_all_rx(&mut rx, 2);
        assert!(got[0] == [head.clone(), payload.clone()].concat());
        assert_eq!(got[1], tail);
    });
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn peer_gone_in_the_middle_of_a_placed_frame_is_peer_failure() {
    let (mut rx, s) = raw_frame_start(&pattern(1, 24), &pattern(2, 1 << 20), 100_000);
    assert!(rx.peek_partial().is_none());
    until_offered(&mut rx, 24);
    let mut dst = vec![0u8; 1 << 20];
    // SAFETY: `dst` outlives `rx`'s use of it (the link fails below, before `dst` drops).
    assert!(unsafe { rx.place(24, vec![(dst.as_mut_ptr() as usize, dst.len())], None) });
    drop(s);
    let e = until_error(&mut rx);
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(rx.take_placed().is_none());
    assert!(dst[..100_000] == pattern(2, 100_000)[..]);
    drop(rx);
}

/// The kernel's receive buffer of a socket (twice what SO_RCVBUF asked).
fn rcvbuf_of(rx: &Rx) -> usize {
    rustix::net::sockopt::socket_recv_buffer_size(&*rx.sock).unwrap()
}

/// What the kernel makes of `SO_RCVBUF=n`: doubled, within net.core.rmem_max.
fn kernel_rcvbuf(n: usize) -> usize {
    let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    2 * n.min(max)
}

/// Write `frames` (each after its length) from a thread, and take them all from `rx`.
fn send_and_take(s: &mut TcpStream, rx: &mut Rx, frames: &[Vec<u8>]) {
    std::thread::scope(|sc| {
        sc.spawn(move || {
            for f in frames {
                s.write_all(&(f.len() as u32).to_le_bytes()).unwrap();
                s.write_all(f).unwrap();
            }
        });
        check(frames, &receive_all_rx(rx, frames.len()));
    });
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn the_receive_buffer_grows_after_bulk_data_arrives() {
    let (small, large) = (kernel_rcvbuf(1 << 20), kernel_rcvbuf(4 << 20));
    if large == small {
        assert!(
            std::env::var_os("CI").is_none(),
            "net.core.rmem_max too small to test"
        );
        eprintln!("SKIPPED: net.core.rmem_max is at most 1 MiB: nothing to grow into");
        return;
    }
    // The accepting side has the default COURIER_TCP_RCVBUF (4m), and starts at 1 MiB.
    let (mut rx, mut s) = raw_peer(&PREAMBLE);
    rx.established();
    assert_eq!(rcvbuf_of(&rx), small);
    // 8 MiB of small frames, read and taken: nothing placed, the buffer stays.
    let small_frames: Vec<Vec<u8>> = (0..8192).map(|i| pattern(i, 1020)).collect();
    send_and_take(&mut s, &mut rx, &small_frames);
    assert_eq!(rcvbuf_of(&rx), small, "no large frame arrived");
    // 50 frames of 40 KiB taken from the buffer (2 MB in large frames), then frames of
    // 1 MiB placed where they go: the buffer grows with the third, past 4 MiB in all.
    let large_frames: Vec<Vec<u8>> = (0..50).map(|i| pattern(i, 40 << 10)).collect();
    send_and_take(&mut s, &mut rx, &large_frames);
    assert_eq!(rcvbuf_of(&rx), small, "2 MB in large frames");
    let clamp = sock::window_clamp(rx.sock.as_fd()).unwrap();
    let (head, payload) = (pattern(1, 24), pattern(2, 1 << 20));
    for k in 1..=5 {
        std::thread::scope(|sc| {
            let s = &mut s;
            let (head, payload) = (&head, &payload);
            sc.spawn(move || {
                s.write_all(&((head.len() + payload.len()) as u32).to_le_bytes())
                    .unwrap();
                s.write_all(head).unwrap();
                s.write_all(payload).unwrap();
            });
            assert_eq!(until_offered(&mut rx, 24), 24 + payload.len());
            let mut dst = vec![0u8; payload.len()];
            // SAFETY: `dst` outlives the placement, which is taken below.
            assert!(unsafe { rx.place(24, vec![(dst.as_mut_ptr() as usize, dst.len())], None) });
            let deadline = Instant::now() + Duration::from_secs(10);
            while rx.take_placed().is_none() {
                assert!(Instant::now() < deadline, "placement stalled");
                rx.on_readable().unwrap();
                if rx.arm().unwrap() {
                    wait_readable(rx.fd().unwrap(), 1);
                }
            }
            rx.consume();
            assert!(dst == *payload, "frame {k}: placed payload differs");
        });
        let want = if k < 3 { small } else { large };
        assert_eq!(rcvbuf_of(&rx), want, "after {k} placed MiB");
    }
    // The window the peer sees grows with the buffer (the kernel would keep the old
    // ceiling while a steady stream's ratio of payload to memory does not change).
    let grown = sock::window_clamp(rx.sock.as_fd()).unwrap();
    assert!(
        grown as u64 * small as u64 >= clamp as u64 * large as u64 * 9 / 10,
        "window clamp {clamp} before, {grown} after the buffer grew from {small} to {large}"
    );
}
