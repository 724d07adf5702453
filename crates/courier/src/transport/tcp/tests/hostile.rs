//! What a tcp peer may send: a bad preamble, absurd frame lengths, frames that announce
//! more than they bring, a drop after buffered frames, strangers and empty frames.

use super::*;

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn bad_preamble_is_a_protocol_error() {
    let (mut rx, _s) = raw_peer(b"GET / HTTP/1.1\r\n\r\n");
    let e = until_error(&mut rx);
    assert_eq!(e.status(), Status::ProtocolError, "{e}");
    assert!(
        e.detail()
            .contains("not a Courier peer: bad preamble 474554202f204854"),
        "{e}"
    );
    // Sticky.
    assert_eq!(rx.peek().unwrap_err().status(), Status::ProtocolError);
    // Even a short wrong start is caught without waiting for 8 bytes.
    let (mut rx, _s) = raw_peer(b"XY");
    assert!(until_error(&mut rx).detail().contains("bad preamble 5859"));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn absurd_frame_lengths_are_protocol_errors() {
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(b"hello");
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    let (mut rx, s) = raw_peer(&bytes);
    rx.established();
    let mut got = Vec::new();
    let e = loop {
        match rx.on_readable().and_then(|()| drain(&mut rx, &mut got)) {
            Ok(()) => wait_readable(rx.fd().unwrap(), 5),
            Err(e) => break e,
        }
    };
    assert_eq!(
        got,
        vec![b"hello".to_vec()],
        "the good frame before the bad one arrives"
    );
    assert_eq!(e.status(), Status::ProtocolError);
    assert!(
        e.detail().contains(&format!(
            "frame length {} from {} exceeds the limit {MAX_FRAME}",
            u32::MAX,
            s.local_addr().unwrap()
        )),
        "{e}"
    );

    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let (mut rx, _s) = raw_peer(&bytes);
    let e = until_error(&mut rx);
    assert_eq!(e.status(), Status::ProtocolError);
    assert!(e.detail().contains("frame length 0"), "{e}");
}

/// A connection that has not yet become an endpoint's link takes only setup-sized frames,
/// and what a frame takes of memory follows the bytes that came, not the length its
/// header announces (a peer that announced 16 MiB and sent a few bytes made the receiver
/// commit 16 MiB, per connection).
#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn a_frame_takes_memory_as_its_bytes_arrive() {
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&((SETUP_FRAME_MAX + 1) as u32).to_le_bytes());
    bytes.push(1);
    let (mut rx, _s) = raw_peer(&bytes);
    let e = until_error(&mut rx);
    assert_eq!(e.status(), Status::ProtocolError);
    assert!(
        e.detail().contains(&format!(
            "exceeds the limit of a connection not yet set up {SETUP_FRAME_MAX}"
        )),
        "{e}"
    );
    // Set up, a frame of 16 MiB is allowed, but 100 bytes of it take no more room than
    // the buffer had.
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&(16u32 << 20).to_le_bytes());
    bytes.extend_from_slice(&[7u8; 100]);
    let (mut rx, mut s) = raw_peer(&bytes);
    rx.established();
    let initial = rx.buf.len();
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.end - rx.start < 4 + 100 {
        assert!(Instant::now() < deadline, "the bytes did not arrive");
        rx.on_readable().unwrap();
        wait_readable(rx.fd().unwrap(), 5);
    }
    rx.on_readable().unwrap();
    assert_eq!(rx.buf.len(), initial, "grew for bytes that never came");
    // As bytes come, it grows, at most to twice what it holds.
    let more = vec![9u8; 3 * initial];
    s.write_all(&more).unwrap();
    while rx.end - rx.start < 4 + 100 + more.len() {
        assert!(Instant::now() < deadline, "the bytes did not arrive");
        rx.on_readable().unwrap();
        wait_readable(rx.fd().unwrap(), 5);
    }
    assert!(
        rx.buf.len() <= 2 * (rx.end - rx.start),
        "{} for {}",
        rx.buf.len(),
        rx.end - rx.start
    );
    assert!(rx.peek().unwrap().is_none(), "the frame is not complete");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn peer_drop_is_peer_failure_after_buffered_frames() {
    let ((mut ctx, crx), (mut atx, mut arx)) = pair_for_tests();
    ctx.send(&[b"last words"]).unwrap();
    assert!(ctx.flush().unwrap());
    drop((ctx, crx));
    let mut got = Vec::new();
    let e = loop {
        match arx.on_readable().and_then(|()| drain(&mut arx, &mut got)) {
            Ok(()) => wait_readable(arx.fd().unwrap(), 5),
            Err(e) => break e,
        }
    };
    assert_eq!(got, vec![b"last words".to_vec()]);
    assert_eq!(e.status(), Status::PeerFailure);
    assert!(
        e.detail().contains("closed the connection")
            && e.detail().contains(&arx.peer_addr().to_string()),
        "{e}"
    );
    assert_eq!(arx.on_readable().unwrap_err().status(), Status::PeerFailure);
    assert_eq!(arx.arm().unwrap_err().status(), Status::PeerFailure);
    // Sending: the first write may still be accepted; then the reset shows.
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = loop {
        assert!(
            Instant::now() < deadline,
            "send never noticed the dead peer"
        );
        match atx
            .send(&[b"anyone there?"])
            .and_then(|()| atx.flush().map(|_| ()).map_err(TxError::Failed))
        {
            Ok(()) => std::thread::sleep(Duration::from_millis(2)),
            Err(TxError::Failed(e)) => break e,
            Err(TxError::NoResource) => panic!("unexpected NoResource"),
        }
    };
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(e.detail().contains(&atx.peer_addr().to_string()), "{e}");
}

proptest::proptest! {
    /// The framer splits what a sender writes (the preamble, then each frame after its
    /// length) into exactly the frames written; a cut stream gives the whole frames before
    /// the cut.
    #[test]
    #[cfg_attr(miri, ignore = "sockets and epoll on them: system calls Miri does not model")]
    fn framing_splits_what_was_written(frames in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 1..300), 0..8),
                                       cut in 0usize..4000) {
        let mut wire = PREAMBLE.to_vec();
        for f in &frames {
            wire.extend_from_slice(&(f.len() as u32).to_le_bytes());
            wire.extend_from_slice(f);
        }
        let got = fuzz_framing(&wire, MAX_FRAME).unwrap();
        proptest::prop_assert_eq!(got.len(), frames.len());
        for (g, f) in got.iter().zip(&frames) {
            proptest::prop_assert_eq!(*g, &f[..]);
        }
        let cut = cut.min(wire.len());
        let part = fuzz_framing(&wire[..cut], MAX_FRAME).unwrap();
        proptest::prop_assert!(part.len() <= frames.len());
        for (g, f) in part.iter().zip(&frames) {
            proptest::prop_assert_eq!(*g, &f[..]);
        }
        // A limit below a frame's length refuses the peer, naming the limit.
        if let Some(big) = frames.iter().map(Vec::len).max() {
            let e = fuzz_framing(&wire, big - 1).unwrap_err();
            proptest::prop_assert!(e.contains("exceeds the limit"), "{}", e);
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn framing_refuses_strangers_and_empty_frames() {
    let e = fuzz_framing(b"GET / HTTP/1.1\r\n", MAX_FRAME).unwrap_err();
    assert!(e.contains("not a Courier peer"), "{e}");
    let mut wire = PREAMBLE.to_vec();
    wire.extend_from_slice(&0u32.to_le_bytes());
    let e = fuzz_framing(&wire, MAX_FRAME).unwrap_err();
    assert!(e.contains("empty frames are not allowed"), "{e}");
    assert_eq!(fuzz_framing(&PREAMBLE[..3], MAX_FRAME), Ok(vec![]));
}
