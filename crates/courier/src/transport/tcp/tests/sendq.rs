//! The send queue kept in blocks (`chunks`): partial writes across block boundaries, many
//! small frames then a large one, zero-copy tokens in order, abandon, and the memory a
//! queue holds as it grows and drains.

use super::chunks::BLOCK;
use super::*;

/// Send `frames` in one burst (no flush between them) and receive them; the most blocks
/// the queue held meanwhile.
fn burst_then_receive(tx: &mut Tx, rx: &mut Rx, frames: &[Vec<u8>]) -> usize {
    let mut most = 0;
    for f in frames {
        let (a, b) = f.split_at(f.len() / 2);
        tx.send(&[a, b]).unwrap();
        most = most.max(tx.q.allocated() / BLOCK);
    }
    check(frames, &receive_all(tx, rx, frames.len()));
    most
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn partial_writes_across_block_boundaries_keep_every_byte_in_order() {
    // Small kernel buffers: the kernel takes a few KiB at a time, so writes end anywhere
    // in a block and the next one starts there; frame sizes are chosen to straddle blocks.
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "16k"), ("COURIER_TCP_RCVBUF", "16k")]);
    let ((mut tx, _crx), (_atx, mut rx)) = pair_on(LO4, &cfg).unwrap();
    let sizes = [
        1,
        BLOCK - HDR,
        BLOCK - HDR - 1,
        BLOCK - HDR + 1,
        7,
        DIRECT_SEND - HDR - 1,
        3 * BLOCK + 11,
        BLOCK,
        13,
        2 * BLOCK - 5,
    ];
    let frames: Vec<Vec<u8>> = (0..60)
        .map(|i| pattern(i, sizes[i % sizes.len()]))
        .collect();
    let calls = write_calls();
    let most = burst_then_receive(&mut tx, &mut rx, &frames);
    assert!(
        most >= 8,
        "the queue should have spanned many blocks (held {most})"
    );
    assert!(
        write_calls() - calls > 100,
        "16 KiB kernel buffers should have cut the writes short many times"
    );
    assert_eq!(tx.queued(), 0);
    assert!(tx.q.allocated() <= BLOCK, "an empty queue keeps one block");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn many_small_frames_then_one_large_arrive_in_order() {
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "16k"), ("COURIER_TCP_RCVBUF", "16k")]);
    let ((mut tx, _crx), (_atx, mut rx)) = pair_on(LO4, &cfg).unwrap();
    let mut frames: Vec<Vec<u8>> = (0..5000).map(|i| pattern(i, 1 + i % 200)).collect();
    for f in &frames {
        tx.send(&[f]).unwrap();
    }
    assert!(
        tx.queued() > 0,
        "5000 small frames should not all fit 16 KiB"
    );
    let large = pattern(77, 3 << 20);
    match tx.send_zc(&[&large[..9], &large[9..]], 1, 42).unwrap() {
        Sent::Later => {}
        Sent::Done => panic!("3 MiB behind a queue cannot have left at once"),
    }
    // Written from the caller's memory: only its header piece was copied.
    assert!(tx.ref_bytes > (3 << 20) - BLOCK);
    frames.push(large);
    let got = receive_all(&mut tx, &mut rx, frames.len());
    check(&frames, &got);
    let mut done = Vec::new();
    tx.take_completed(&mut done);
    assert_eq!(done, [42]);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn zero_copy_tokens_come_out_in_the_order_of_their_frames() {
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "16k"), ("COURIER_TCP_RCVBUF", "16k")]);
    let ((mut tx, _crx), (_atx, mut rx)) = pair_on(LO4, &cfg).unwrap();
    let mut frames = Vec::new();
    let mut later = Vec::new();
    // Large zero-copy frames between runs of copied ones, which fill blocks; one
    // operation's last frame is copied (a marker then carries its token).
    let big: Vec<Vec<u8>> = (0..12)
        .map(|i| pattern(1000 + i, DIRECT_SEND + i * 40_000))
        .collect();
    for (i, b) in big.iter().enumerate() {
        for j in 0..40 {
            let f = pattern(i * 100 + j, 100 + j * 97);
            tx.send(&[&f]).unwrap();
            frames.push(f);
        }
        let token = 1 + i as u64;
        if tx.send_zc(&[&b[..5], &b[5..]], 1, token).unwrap() == Sent::Later {
            later.push(token);
        }
        frames.push(b.clone());
        if i % 3 == 2 {
            let tail = pattern(9000 + i, 33);
            let token = 500 + i as u64;
            if tx.send_zc(&[&tail[..3], &tail[3..]], 1, token).unwrap() == Sent::Later {
                later.push(token);
            }
            frames.push(tail);
        }
    }
    assert!(later.len() > 4, "most large frames should wait: {later:?}");
    let mut done = Vec::new();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < frames.len() {
        assert!(Instant::now() < deadline, "stalled at {}", got.len());
        tx.flush().unwrap();
        tx.take_completed(&mut done);
        rx.on_readable().unwrap();
        drain(&mut rx, &mut got).unwrap();
        if got.len() < frames.len() && rx.arm().unwrap() {
            wait_readable(rx.fd().unwrap(), 1);
        }
    }
    assert!(tx.flush().unwrap());
    tx.take_completed(&mut done);
    assert_eq!(done, later, "each token once, in the order of its frame");
    assert_eq!(tx.ref_bytes, 0);
    check(&frames, &got);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn abandon_drops_copies_and_references_and_fails_the_link() {
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "16k"), ("COURIER_TCP_RCVBUF", "16k")]);
    let ((mut tx, _crx), (_atx, _rx)) = pair_on(LO4, &cfg).unwrap();
    for i in 0..2000 {
        tx.send(&[&pattern(i, 300)]).unwrap();
    }
    let big = pattern(1, 1 << 20);
    assert_eq!(
        tx.send_zc(&[&big[..5], &big[5..]], 1, 9).unwrap(),
        Sent::Later
    );
    assert!(tx.q.len() > 4 * BLOCK && tx.ref_bytes > 0);
    tx.abandon(&Error::new(Status::PeerFailure, "test: the requests fail"));
    assert_eq!(tx.queued(), 0);
    assert_eq!(tx.ref_bytes, 0);
    assert!(tx.q.allocated() <= BLOCK, "{} bytes kept", tx.q.allocated());
    let mut done = Vec::new();
    tx.take_completed(&mut done);
    assert!(done.is_empty(), "an abandoned frame reports no token");
    assert!(tx.flush().is_err(), "a link whose queue was cut is failed");
    assert!(matches!(tx.send(&[b"x"]), Err(TxError::Failed(_))));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn a_queue_that_grew_big_gives_its_memory_back_as_it_drains() {
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "16k"), ("COURIER_TCP_RCVBUF", "16k")]);
    let ((mut tx, _crx), (_atx, mut rx)) = pair_on(LO4, &cfg).unwrap();
    // 24 MiB of copied frames while the receiver reads nothing.
    let mut frames = Vec::new();
    while tx.q.len() < 24 << 20 {
        let i = frames.len();
        let f = pattern(i, 1 + (i * 7919) % 60_000);
        tx.send(&[&f]).unwrap();
        frames.push(f);
    }
    let (queued, held) = (tx.q.len(), tx.q.allocated());
    // Only the bytes, in blocks: no doubling slack (a vector held up to twice, and up to
    // three times with its written prefix).
    assert!(
        held <= queued + 3 * BLOCK,
        "{held} bytes held for {queued} queued"
    );
    // The receiver reads half: half the blocks go.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tx.q.len() > queued / 2 {
        assert!(Instant::now() < deadline, "stalled at {}", tx.q.len());
        tx.flush().unwrap();
        rx.on_readable().unwrap();
        drain(&mut rx, &mut got).unwrap();
        if rx.arm().unwrap() {
            wait_readable(rx.fd().unwrap(), 1);
        }
    }
    let held = tx.q.allocated();
    assert!(
        held <= tx.q.len() + 6 * BLOCK,
        "{held} bytes held for {} queued",
        tx.q.len()
    );
    got.extend(receive_all(&mut tx, &mut rx, frames.len() - got.len()));
    check(&frames, &got);
    assert!(tx.flush().unwrap());
    assert!(
        tx.q.allocated() <= BLOCK,
        "{} bytes kept by an empty queue",
        tx.q.allocated()
    );
}

/// Between two flushes (a progress call's round) at most `TX_BUDGET` queued bytes are
/// written, however much room the socket has: a peer that reads as fast as it is written
/// to cannot hold one progress call. The rest leaves at the next flushes, whole and in
/// order.
#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn a_round_writes_at_most_the_budget_of_queued_bytes() {
    // Kernel buffers of megabytes (as far as the system allows): the kernel would take
    // several times the budget at once.
    let cfg = cfg(&[("COURIER_TCP_SNDBUF", "4m"), ("COURIER_TCP_RCVBUF", "4m")]);
    let ((mut tx, _crx), (_atx, mut rx)) = pair_on(LO4, &cfg).unwrap();
    // A burst of 4 MiB in 1000-byte frames: the first leaves at once, the others are
    // coalesced, and the queue is written every COALESCE bytes until the round's budget
    // is spent.
    let frames: Vec<Vec<u8>> = (0..4 << 10).map(|i| pattern(i, 1000)).collect();
    for f in &frames {
        tx.send(&[f]).unwrap();
    }
    let first = (HDR + 1000) as u64;
    assert!(
        tx.drained() <= first + TX_BUDGET as u64,
        "{} bytes written in one round (budget {TX_BUDGET})",
        tx.drained()
    );
    assert!(
        tx.drained() > first,
        "the queue was never written during the burst"
    );
    // A new round: up to the budget again, and more is left.
    let before = tx.drained();
    assert!(
        !tx.flush().unwrap(),
        "4 MiB left in two rounds of {TX_BUDGET}"
    );
    let wrote = tx.drained() - before;
    assert!(
        wrote > 0 && wrote <= TX_BUDGET as u64,
        "a flush wrote {wrote} bytes (budget {TX_BUDGET})"
    );
    check(&frames, &receive_all(&mut tx, &mut rx, frames.len()));
    assert_eq!(tx.queued(), 0);
}
