use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Instant;

use super::*;
use crate::wire::shm::hello::TAG as HELLO_MAGIC;
use crate::wire::shm::reply::NO as REPLY_NO;

fn cfg(cells: usize, cma: &str) -> Config {
    let cells = cells.to_string();
    Config::from_env_with(&[
        ("COURIER_SHM_FIFO_SIZE", cells.as_str()),
        ("COURIER_SHM_CMA", cma),
    ])
    .unwrap()
}

/// Wait up to `ms` for `fd` to be readable (or hung up).
fn readable(fd: BorrowedFd<'_>, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0
}

fn accept_one(acc: &mut Acceptor, secs: u64) -> (Tx, Rx) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(l) = acc.accept().unwrap() {
            return l;
        }
        assert!(Instant::now() < deadline, "no connection accepted");
        readable(acc.fd(), 50);
    }
}

/// (connector side, acceptor side), each (Tx, Rx).
fn pair(c: &Config) -> ((Tx, Rx), (Tx, Rx)) {
    let mut acc = Acceptor::bind(c).unwrap();
    let name = acc.name().to_vec();
    let c2 = c.clone();
    let h = std::thread::spawn(move || connect(&name, &c2));
    let a = accept_one(&mut acc, 5);
    let b = h.join().unwrap().unwrap();
    (b, a)
}

fn pattern(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (seq.wrapping_mul(31) as usize + i * 7) as u8)
        .collect();
    let s = seq.to_le_bytes();
    let k = len.min(8);
    v[..k].copy_from_slice(&s[..k]);
    v
}

fn send_spin(tx: &mut Tx, parts: &[&[u8]]) {
    loop {
        match tx.send(parts) {
            Ok(()) => return,
            Err(TxError::NoResource) => std::thread::yield_now(),
            Err(TxError::Failed(e)) => panic!("send failed: {e}"),
        }
    }
}

fn recv_one(rx: &mut Rx) -> Vec<u8> {
    loop {
        if let Some(f) = rx.peek().unwrap() {
            // SAFETY: between peek and consume.
            let v = unsafe { f.copy_whole() };
            rx.consume();
            return v;
        }
        std::hint::spin_loop();
    }
}

fn stream(cells: usize, count: u64) {
    let c = cfg(cells, "auto");
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let max = ta.caps().max_frame;
    assert_eq!(max, fifo::max_frame(cells));
    let sizes = [
        1,
        2,
        7,
        8,
        9,
        239,
        240,
        241,
        255,
        256,
        497,
        max / 3,
        max / 2,
        max - 1,
        max,
    ];
    let producer = std::thread::spawn(move || {
        for seq in 0..count {
            let len = sizes[seq as usize % sizes.len()];
            let v = pattern(seq, len);
            // Split into up to three parts to exercise gathering.
            let (a, rest) = v.split_at(len / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            // Bursts of 5: small frames share packed cells, which open and close
            // between frames of their own.
            ta.note_epoch(seq / 5);
            send_spin(&mut ta, &[a, b, c]);
        }
        ta
    });
    for seq in 0..count {
        let len = sizes[seq as usize % sizes.len()];
        let got = recv_one(&mut rb);
        assert_eq!(got.len(), len, "frame {seq}");
        assert!(
            got == pattern(seq, len),
            "frame {seq} of {len} bytes corrupted"
        );
    }
    let _ta = producer.join().unwrap();
    assert!(rb.peek().unwrap().is_none());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn threads_stream_all_sizes_small_fifo() {
    stream(16, 20_000);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn threads_stream_all_sizes_large_fifo() {
    stream(1024, 5_000);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn caps_and_limits() {
    let c = cfg(1024, "no");
    let ((ta, _), _) = pair(&c);
    let caps = ta.caps();
    assert_eq!(caps.name, "shm");
    assert_eq!(caps.device, "memory");
    assert_eq!(caps.max_short, 240);
    assert_eq!(caps.max_frame, 65520);
    assert!(caps.peer_failure && caps.wakeup);
    assert_eq!(fifo::max_frame(4096), 65536);
    assert_eq!(fifo::max_frame(16), 1008);
    let ((mut ta, _), _) = pair(&cfg(16, "no"));
    let big = vec![0u8; 1009];
    match ta.send(&[&big]) {
        Err(TxError::Failed(e)) => assert_eq!(e.status(), Status::InvalidParam),
        other => panic!("oversized frame accepted: {:?}", other.is_ok()),
    }
}

/// Send frames made by `send(tx, i)` for i = 0, 1, ... until the FIFO is full; the count.
fn fill(ta: &mut Tx, mut send: impl FnMut(&mut Tx, u64) -> Result<(), TxError>) -> u64 {
    let mut sent = 0u64;
    loop {
        match send(ta, sent) {
            Ok(()) => sent += 1,
            Err(TxError::NoResource) => return sent,
            Err(TxError::Failed(e)) => panic!("{e}"),
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn full_is_all_or_nothing_and_recovers() {
    let c = cfg(16, "no");
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let sent = fill(&mut ta, |ta, i| ta.send(&[&pattern(i, 240)]));
    assert_eq!(
        sent, 16,
        "one cell per 240-byte frame (too big to be packed)"
    );
    let max = ta.caps().max_frame;
    let big = pattern(999, max); // 4 cells
    assert!(matches!(ta.send(&[&big]), Err(TxError::NoResource)));
    for i in 0..3 {
        assert_eq!(recv_one(&mut rb), pattern(i, 240));
    }
    assert!(
        matches!(ta.send(&[&big]), Err(TxError::NoResource)),
        "3 free cells must not take a 4-cell frame"
    );
    assert_eq!(recv_one(&mut rb), pattern(3, 240));
    ta.send(&[&big]).unwrap();
    for i in 4..16 {
        assert_eq!(recv_one(&mut rb), pattern(i, 240));
    }
    assert_eq!(recv_one(&mut rb), big);
    assert!(rb.peek().unwrap().is_none());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn wrap_with_skip_marker_and_peek_stability() {
    let c = cfg(16, "no");
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    // Five 3-cell frames (15 cells), so the next 4-cell frame must skip the last cell.
    for i in 0..5 {
        ta.send(&[&pattern(i, 600)]).unwrap();
        assert_eq!(recv_one(&mut rb), pattern(i, 600));
    }
    let big = pattern(77, 1000);
    ta.send(&[&big[..10], &big[10..]]).unwrap();
    let f = rb.peek().unwrap().unwrap();
    // Peeking again returns the same frame; sending meanwhile does not disturb it.
    let f2 = rb.peek().unwrap().unwrap();
    assert_eq!((f.ptr, f.len), (f2.ptr, f2.len));
    for i in 0..3 {
        ta.send(&[&pattern(100 + i, 200)]).unwrap();
    }
    // SAFETY: between peek and consume.
    assert_eq!(unsafe { f.copy_whole() }, &big[..]);
    rb.consume();
    for i in 0..3 {
        assert_eq!(recv_one(&mut rb), pattern(100 + i, 200));
    }
}

/// Make the sends that follow a burst (as the worker does when no progress call came
/// between two sends): their small frames are packed.
fn in_burst(ta: &mut Tx) {
    ta.note_epoch(1);
    ta.note_epoch(1);
}

/// In a burst, fill 8 cells with frames of 240 bytes (a cell each, too big to be packed),
/// unread: the next small frame opens a packed cell at position 8.
fn fall_behind(ta: &mut Tx) -> Vec<Vec<u8>> {
    in_burst(ta);
    (0..8)
        .map(|i| {
            let v = pattern(900 + i, 240);
            ta.send(&[&v]).unwrap();
            v
        })
        .collect()
}

/// Pack `small` 8-byte frames into the cell at position 8 (behind 8 frames of their own),
/// read all frames but the last, replace the packed-cell word at payload offset `at` with
/// `word`, and look again: the length of the frame seen, if any, or the error.
fn forged_word(c: &Config, small: usize, at: usize, word: u64) -> Result<Option<usize>> {
    let ((mut ta, _ra), (_tb, mut rb)) = pair(c);
    let first = fall_behind(&mut ta);
    for _ in 0..small {
        ta.send(&[b"8 bytes."]).unwrap();
    }
    for _ in 0..first.len() + small - 1 {
        recv_one(&mut rb);
    }
    ta.prod
        .fifo_ref()
        .corrupt_payload(8, at, &word.to_le_bytes());
    rb.peek().map(|f| f.map(|f| f.len))
}

/// The small frames of a burst share cells/// The small frames of a burst share cells: 8-byte frames go 15 to a cell (an 8-byte word
/// and 8 bytes each), each visible as soon as it is sent; frames sent between progress
/// calls take a cell each; a frame too big to join closes the open cell and takes cells
/// of its own. The consumer gets every frame, in order, with its bytes.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn small_frames_share_cells_and_are_seen_at_once() {
    let c = cfg(16, "no");
    let f = |i: u64| i.to_le_bytes();
    // Not a burst: a cell each.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let sent = fill(&mut ta, |ta, i| {
        ta.note_epoch(i);
        ta.send(&[&f(i)])
    });
    assert_eq!(
        sent, 16,
        "a cell for each frame sent between progress calls"
    );
    for i in 0..sent {
        assert_eq!(recv_one(&mut rb), f(i), "frame {i}");
    }
    // A burst.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    in_burst(&mut ta);
    let sent = fill(&mut ta, |ta, i| ta.send(&[&f(i)]));
    assert_eq!(sent, 16 * 15, "16 cells of 15 frames");
    for i in 0..sent {
        assert_eq!(recv_one(&mut rb), f(i), "frame {i}");
    }
    assert!(!rb.ready() && rb.peek().unwrap().is_none());
    // One at a time, each seen before the next is sent.
    for i in 0..40 {
        ta.send(&[&f(1000 + i)]).unwrap();
        assert!(rb.ready(), "frame {i} not seen at once");
        assert_eq!(recv_one(&mut rb), f(1000 + i));
        assert!(rb.peek().unwrap().is_none());
    }
    // 24-byte frames (32-byte slots): one would cross a cache line after the first of
    // each cell, so it starts at the line (a PAD before it): 7 to a packed cell.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    in_burst(&mut ta);
    let sent = fill(&mut ta, |ta, i| ta.send(&[&pattern(i, 24)]));
    assert_eq!(sent, 16 * 7, "16 cells of 7 frames of 24 bytes");
    for i in 0..sent {
        assert_eq!(recv_one(&mut rb), pattern(i, 24), "frame {i}");
    }
    assert!(rb.peek().unwrap().is_none());
    // Small frames and frames of their own keep their order.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let first = fall_behind(&mut ta);
    let big = pattern(5, 1000);
    ta.send(&[b"small 1"]).unwrap();
    ta.send(&[&big]).unwrap();
    ta.send(&[b"small 2"]).unwrap();
    ta.send(&[&pattern(6, 232)]).unwrap();
    ta.send(&[&pattern(7, 233)]).unwrap();
    for v in &first {
        assert_eq!(&recv_one(&mut rb), v);
    }
    assert_eq!(recv_one(&mut rb), b"small 1");
    assert_eq!(recv_one(&mut rb), big);
    assert_eq!(recv_one(&mut rb), b"small 2");
    assert_eq!(recv_one(&mut rb), pattern(6, 232));
    assert_eq!(recv_one(&mut rb), pattern(7, 233));
    assert!(rb.peek().unwrap().is_none());
}

/// A frame appended to an open packed cell wakes an armed consumer, as a cell's first
/// frame does.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn a_frame_appended_to_a_packed_cell_wakes_an_armed_consumer() {
    let c = cfg(64, "no");
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let fd = rb.fd().unwrap().try_clone_to_owned().unwrap();
    in_burst(&mut ta);
    ta.send(&[b"first"]).unwrap();
    assert_eq!(recv_one(&mut rb), b"first");
    assert!(rb.arm().unwrap());
    ta.send(&[b"appended"]).unwrap();
    assert!(
        readable(fd.as_fd(), 2000),
        "the appended frame did not wake the consumer"
    );
    rb.on_readable().unwrap();
    assert_eq!(recv_one(&mut rb), b"appended");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn arm_and_wake() {
    let c = cfg(64, "no");
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    let fd = rb.fd().unwrap().try_clone_to_owned().unwrap();
    // Not armed: sends do not touch the socket.
    ta.send(&[b"x"]).unwrap();
    assert!(!readable(fd.as_fd(), 0));
    // A waiting frame: do not sleep.
    assert!(!rb.arm().unwrap());
    assert_eq!(recv_one(&mut rb), b"x");
    assert!(rb.arm().unwrap());
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        ta.send(&[b"wake up"]).unwrap();
        ta
    });
    let t0 = Instant::now();
    assert!(
        readable(fd.as_fd(), 3000),
        "sleeping receiver was not woken"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    rb.on_readable().unwrap();
    assert_eq!(recv_one(&mut rb), b"wake up");
    let mut ta = h.join().unwrap();
    // The wake byte was drained and the flag cleared: no more bytes.
    assert!(!readable(fd.as_fd(), 0));
    ta.send(&[b"quiet"]).unwrap();
    assert!(!readable(fd.as_fd(), 0));
    assert_eq!(recv_one(&mut rb), b"quiet");
}

/// A producer that found the FIFO full and asked for room (`want_room`) gets one wakeup
/// byte on its side of the socket once the consumer frees cells (it publishes every
/// quarter of the FIFO), and none before or after; one with room, or whose consumer freed
/// cells before it asked, is told not to sleep.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn a_producer_waiting_for_room_is_woken_once() {
    let c = cfg(16, "no");
    let ((mut ta, mut ra), (_tb, mut rb)) = pair(&c);
    let fd = ra.fd().unwrap().try_clone_to_owned().unwrap();
    assert!(!ta.want_room(), "nothing refused: no reason to sleep");
    let sent = fill(&mut ta, |ta, i| ta.send(&[&pattern(i, 240)]));
    assert_eq!(sent, 16);
    assert!(
        ta.want_room(),
        "a full FIFO: sleep until the consumer frees cells"
    );
    let mut got = 0;
    while !readable(fd.as_fd(), 0) {
        assert!(got < 4, "4 cells freed and the producer was not woken");
        assert_eq!(recv_one(&mut rb), pattern(got, 240));
        got += 1;
    }
    assert_eq!(got, 4, "woken before the consumer published");
    ra.on_readable().unwrap();
    // Once per request: reading on sends no more bytes.
    for i in got..sent {
        assert_eq!(recv_one(&mut rb), pattern(i, 240));
    }
    assert!(rb.peek().unwrap().is_none());
    assert!(!readable(fd.as_fd(), 0), "a second wakeup for one request");
    // Freed before it asked: the producer tries again instead of sleeping.
    let sent = fill(&mut ta, |ta, i| ta.send(&[&pattern(i, 240)]));
    for i in 0..sent {
        assert_eq!(recv_one(&mut rb), pattern(i, 240));
    }
    assert!(rb.peek().unwrap().is_none());
    assert!(
        !ta.want_room(),
        "the consumer freed every cell: do not sleep"
    );
    assert!(!readable(fd.as_fd(), 0));
}

/// A direct write's doorbell (a same-host put-with-signal) wakes the consumer only when it
/// is armed, claims the request as a frame's send does, and leaves no frame behind.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn doorbell_wakes_only_an_armed_consumer() {
    let c = cfg(64, "no");
    let ((ta, _ra), (_tb, mut rb)) = pair(&c);
    let fd = rb.fd().unwrap().try_clone_to_owned().unwrap();
    let bell = ta.doorbell();
    assert!(bell.may_sleep());
    bell.ring();
    assert!(!readable(fd.as_fd(), 0), "a consumer awake was sent a byte");
    assert!(rb.arm().unwrap());
    // From another thread, beside the link's sender.
    std::thread::scope(|s| {
        s.spawn(|| bell.ring());
    });
    assert!(
        readable(fd.as_fd(), 3000),
        "the armed consumer was not woken"
    );
    rb.on_readable().unwrap();
    assert!(rb.peek().unwrap().is_none(), "a doorbell sends no frame");
    // Claimed: once woken, another ring sends nothing until the consumer arms again.
    bell.ring();
    assert!(!readable(fd.as_fd(), 0));
    assert!(rb.arm().unwrap());
    bell.ring();
    assert!(readable(fd.as_fd(), 0));

    // A consumer whose context has no wakeup never sleeps: no ordered write, no ring.
    let mut c = cfg(64, "no");
    c.wakeup = false;
    let ((ta, _ra), _b) = pair(&c);
    assert!(!ta.doorbell().may_sleep());
}

/// A doorbell kept after its link is dropped (a remote key outliving its endpoint) does
/// not hide the hang-up from the peer.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn a_kept_doorbell_does_not_hide_the_hang_up() {
    let c = cfg(16, "no");
    let ((ta, ra), (_tb, mut rb)) = pair(&c);
    let bell = ta.doorbell();
    drop(ta);
    drop(ra);
    assert!(readable(rb.fd().unwrap(), 2000), "the peer saw no hang-up");
    let e = rb.on_readable().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure);
    // Ringing a gone peer is no error.
    bell.ring();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn dropped_peer_is_peer_failure_after_its_last_frames() {
    let c = cfg(16, "no");
    let ((mut ta, ra), (_tb, mut rb)) = pair(&c);
    ta.send(&[b"last words"]).unwrap();
    drop(ta);
    drop(ra);
    assert!(readable(rb.fd().unwrap(), 2000));
    rb.on_readable().unwrap(); // a frame is still waiting
    assert_eq!(recv_one(&mut rb), b"last words");
    let e = rb.on_readable().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure);
    assert!(e.detail().contains("pid"), "{e}");
    assert!(rb.arm().unwrap()); // sleeping returns at once on the hung-up socket
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn corrupted_cells_are_errors_not_panics() {
    let c = cfg(16, "no");
    // Frames of 240 bytes: one cell each, too big to be packed.
    let one = [7u8; 240];
    // Length beyond max_frame.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    ta.send(&[&one]).unwrap();
    ta.prod.fifo_ref().corrupt(0, Some(100_000), None);
    let e = rb.peek().unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError);
    assert!(e.detail().contains("length"), "{e}");
    // Cell count not matching the length.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    ta.send(&[&one]).unwrap();
    ta.prod.fifo_ref().corrupt(0, None, Some(3));
    assert!(rb.peek().unwrap_err().detail().contains("cell count"));
    // A frame running past the end of the array.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    for _ in 0..15 {
        ta.send(&[&one]).unwrap();
        recv_one(&mut rb);
    }
    ta.send(&[&one]).unwrap();
    ta.prod.fifo_ref().corrupt(15, Some(600), Some(3));
    assert!(rb.peek().unwrap_err().detail().contains("past the end"));
    // A skip marker at index 0.
    let ((mut ta, _ra), (_tb, mut rb)) = pair(&c);
    ta.send(&[&one]).unwrap();
    ta.prod.fifo_ref().corrupt(0, Some(u32::MAX), Some(16));
    assert!(rb.peek().unwrap_err().detail().contains("skip"));
    // A packed cell (the consumer behind: at cell 8) whose sub-frame runs past the cell's
    // payload.
    let err = |r: Result<Option<usize>>| r.unwrap_err().detail().to_string();
    let past = 1u64 << 63 | 8 << 16 | 1000;
    assert!(err(forged_word(&c, 1, 0, past)).contains("runs past its packed cell"));
    // A packed cell whose first word is a CLOSE: a writer never does that, and a peer
    // publishing only such cells must not make the reader recurse through them.
    let close = 1u64 << 62 | 8 << 16;
    assert!(err(forged_word(&c, 1, 0, close)).contains("closed before its first"));
    // Words of another lap (or any bytes that do not name this cell) are nothing yet.
    assert_eq!(forged_word(&c, 1, 0, 0x5555_5555_5555_5555).unwrap(), None);
    // A PAD in a cell's last line (the 15th frame is at payload offset 224).
    let pad = 3u64 << 62 | 8 << 16;
    assert!(err(forged_word(&c, 15, 224, pad)).contains("pads past its end"));
    // An impossible consumer position seen by the producer.
    let ((mut ta, _ra), (_tb, _rb)) = pair(&c);
    while ta.send(&[b"fill"]).is_ok() {}
    ta.prod.fifo_ref().set_tail(1 << 40);
    match ta.send(&[b"x"]) {
        Err(TxError::Failed(e)) => assert_eq!(e.status(), Status::ProtocolError),
        _ => panic!("corrupt tail not detected"),
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn cma_round_trip_in_process() {
    let ((mut ta, _), _) = pair(&cfg(16, "auto"));
    if !ta.cma() {
        eprintln!("process_vm_readv refused even on our own pid here; skipping");
        return;
    }
    assert_eq!(ta.caps().rndv, RndvMode::RemoteRead);
    let s1 = pattern(1, 1000);
    let s2 = pattern(2, 3000);
    let mut d1 = vec![0u8; 1500];
    let mut d2 = vec![0u8; 2500];
    let remote = [
        (s1.as_ptr() as u64, 1000u64),
        (0, 0),
        (s2.as_ptr() as u64, 3000),
    ];
    let local = [
        (d1.as_mut_ptr() as usize, 1500usize),
        (d2.as_mut_ptr() as usize, 2500),
    ];
    // SAFETY: local buffers are ours and writable.
    unsafe { ta.remote_read(&local, &remote) }.unwrap();
    let want: Vec<u8> = s1.iter().chain(s2.iter()).copied().collect();
    assert_eq!(&d1[..], &want[..1500]);
    assert_eq!(&d2[..], &want[1500..]);
    // Unmapped remote address.
    let mut d = [0u8; 8];
    // SAFETY: as above.
    let e = unsafe { ta.remote_read(&[(d.as_mut_ptr() as usize, 8)], &[(8, 8)]) }.unwrap_err();
    assert_eq!(e.status(), Status::OutOfRange, "{e}");
    // Writes scatter the same way (the sender's half of a split rendezvous).
    assert!(ta.writes_remote());
    let mut w1 = vec![0u8; 1000];
    let mut w2 = vec![0u8; 3000];
    let wremote = [
        (w1.as_mut_ptr() as u64, 1000u64),
        (w2.as_mut_ptr() as u64, 3000),
    ];
    let wlocal = [
        (d1.as_ptr() as usize, 1500usize),
        (d2.as_ptr() as usize, 2500),
    ];
    // SAFETY: local segments are our readable buffers.
    unsafe { ta.remote_write(&wlocal, &wremote) }.unwrap();
    assert_eq!(&w1[..], &want[..1000]);
    assert_eq!(&w2[..], &want[1000..]);
    // SAFETY: as above.
    let e = unsafe { ta.remote_write(&[(d.as_ptr() as usize, 8)], &[(8, 8)]) }.unwrap_err();
    assert_eq!(e.status(), Status::OutOfRange, "{e}");
    assert!(e.detail().contains("not mapped"), "{e}");
    // Required works too when CMA does.
    let ((ty, _), _) = pair(&cfg(16, "yes"));
    assert!(ty.cma());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn cma_forced_off() {
    let ((mut ta, _), (tb, _)) = pair(&cfg(16, "no"));
    assert!(!ta.cma() && !tb.cma());
    assert_eq!(ta.caps().rndv, RndvMode::Push);
    assert_eq!(tb.caps().rndv, RndvMode::Push);
    let mut d = [0u8; 4];
    let s = [1u8; 4];
    // SAFETY: local buffer is ours.
    let e = unsafe { ta.remote_read(&[(d.as_mut_ptr() as usize, 4)], &[(s.as_ptr() as u64, 4)]) }
        .unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(!ta.writes_remote());
    // SAFETY: as above.
    let e = unsafe { ta.remote_write(&[(s.as_ptr() as usize, 4)], &[(d.as_mut_ptr() as u64, 4)]) }
        .unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn connect_to_missing_name_is_unreachable() {
    let e = connect(b"courier-no-such-acceptor-0000", &cfg(16, "auto"))
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::Unreachable);
    assert!(e.detail().contains("courier-no-such-acceptor"), "{e}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn misbehaving_clients_are_dropped_not_errors() {
    let c = cfg(16, "auto");
    let mut acc = Acceptor::bind(&c).unwrap();
    let addr = SocketAddrUnix::new_abstract_name(acc.name()).unwrap();
    // Garbage without an fd.
    let s1 = unix_socket(SocketFlags::empty()).unwrap();
    rustix::net::connect(&s1, &addr).unwrap();
    rustix::net::send(&s1, &[0xAB; HELLO_LEN], SendFlags::empty()).unwrap();
    // A valid-looking hello carrying a pipe instead of a memfd.
    let s2 = unix_socket(SocketFlags::empty()).unwrap();
    rustix::net::connect(&s2, &addr).unwrap();
    let (pr, _pw) = rustix::pipe::pipe().unwrap();
    let mut hello = [0u8; HELLO_LEN];
    hello[0..8].copy_from_slice(&HELLO_MAGIC);
    hello[8..12].copy_from_slice(&segment::VERSION.to_ne_bytes());
    hello[16..20].copy_from_slice(&16u32.to_ne_bytes());
    hello[20..24].copy_from_slice(&(segment::CELL as u32).to_ne_bytes());
    hello[24..32].copy_from_slice(&(segment::seg_size(16) as u64).to_ne_bytes());
    let fds = [pr.as_fd()];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    assert!(anc.push(SendAncillaryMessage::ScmRights(&fds)));
    rustix::net::sendmsg(&s2, &[IoSlice::new(&hello)], &mut anc, SendFlags::empty()).unwrap();
    // A client that connects and closes.
    let s3 = unix_socket(SocketFlags::empty()).unwrap();
    rustix::net::connect(&s3, &addr).unwrap();
    drop(s3);
    assert!(acc.accept().unwrap().is_none());
    assert!(acc.pending.is_empty(), "bad clients should be dropped");
    // The pipe client got a rejection.
    let mut r = [0u8; REPLY_LEN];
    let (_, n) = rustix::net::recv(&s2, &mut r, RecvFlags::empty()).unwrap();
    assert_eq!(n, REPLY_LEN);
    assert_eq!(&r[0..8], &REPLY_NO);
    // The acceptor still works.
    let name = acc.name().to_vec();
    let c2 = c.clone();
    let h = std::thread::spawn(move || connect(&name, &c2));
    let _a = accept_one(&mut acc, 5);
    h.join().unwrap().unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn acceptor_fd_signals_every_setup_step() {
    let c = cfg(16, "auto");
    let mut acc = Acceptor::bind(&c).unwrap();
    assert!(!readable(acc.fd(), 0));
    let name = acc.name().to_vec();
    let c2 = c.clone();
    let h = std::thread::spawn(move || connect(&name, &c2));
    // Every wait must be ended by readiness, never by the timeout.
    let (_ta, _ra) = loop {
        assert!(
            readable(acc.fd(), 3000),
            "acceptor fd did not signal a setup step"
        );
        if let Some(l) = acc.accept().unwrap() {
            break l;
        }
    };
    let (mut tb, _rb) = h.join().unwrap().unwrap();
    assert!(acc.accept().unwrap().is_none());
    // The finished link's socket no longer drives the acceptor fd.
    assert!(!readable(acc.fd(), 0));
    tb.send(&[b"x"]).unwrap();
    assert!(!readable(acc.fd(), 0));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn probe_works_here() {
    probe(&cfg(256, "auto")).unwrap();
    assert!(!cma_status().is_empty());
}

const CHILD_ENV: &str = "COURIER_TEST_SHM_PEER";

/// Not a test on its own: the child side of `killed_child_is_peer_failure`.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn shm_child_peer() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    let data = pattern(4242, 100_000);
    let (mut tx, _rx) = connect(name.as_bytes(), &cfg(64, "auto")).unwrap();
    let mut msg = Vec::new();
    msg.extend_from_slice(&(data.as_ptr() as u64).to_ne_bytes());
    msg.extend_from_slice(&(data.len() as u64).to_ne_bytes());
    tx.send(&[&msg]).unwrap();
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn killed_child_is_peer_failure() {
    let c = cfg(64, "auto");
    let mut acc = Acceptor::bind(&c).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "transport::shm::tests::shm_child_peer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, String::from_utf8(acc.name().to_vec()).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (mut tx, mut rx) = accept_one(&mut acc, 20);
    assert_eq!(tx.peer_pid(), child.id());
    let msg = recv_one(&mut rx);
    assert_eq!(msg.len(), 16);
    let addr = u64::from_ne_bytes(msg[0..8].try_into().unwrap());
    let len = u64::from_ne_bytes(msg[8..16].try_into().unwrap());
    if tx.cma() {
        let mut buf = vec![0u8; len as usize];
        // SAFETY: buf is ours and writable.
        unsafe { tx.remote_read(&[(buf.as_mut_ptr() as usize, buf.len())], &[(addr, len)]) }
            .unwrap();
        assert!(
            buf == pattern(4242, 100_000),
            "CMA read the wrong bytes from the child"
        );
    } else {
        eprintln!(
            "CMA not available between processes here; remote read not tested across processes"
        );
    }
    assert!(!readable(rx.fd().unwrap(), 0));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(readable(rx.fd().unwrap(), 3000));
    let e = rx.on_readable().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure);
    assert!(e.detail().contains(&child.id().to_string()), "{e}");
}

/// Rough one-way latency (half round trip) of 8-byte frames between two threads, pinned
/// to CPUs 0 and 1, through FIFOs of the default size:
/// `cargo test --release -p courier shm::tests::pingpong -- --ignored --nocapture`.
#[test]
#[ignore]
fn pingpong_latency() {
    let ((mut ta, mut ra), (mut tb, mut rb)) = pair(&cfg(1024, "auto"));
    let iters = 200_000u64;
    // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
    let pin = |cpu: usize| unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    };
    pin(0);
    let echo = std::thread::spawn(move || {
        pin(1);
        for _ in 0..iters {
            let v = recv_one(&mut rb);
            send_spin(&mut tb, &[&v]);
        }
    });
    let t0 = Instant::now();
    for i in 0..iters {
        send_spin(&mut ta, &[&i.to_le_bytes()]);
        recv_one(&mut ra);
    }
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64 / 2.0;
    echo.join().unwrap();
    eprintln!("shm one-way latency ~{ns:.0} ns");
}

/// A local process that connects and then says nothing is dropped once the setup timeout
/// has passed, whether or not the acceptor becomes readable again (`accept` only runs when
/// it does, so such a peer held its socket and slot until it left).
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn a_silent_peer_is_dropped_after_the_setup_timeout() {
    let c = cfg(64, "auto");
    let mut acc = Acceptor::bind(&c).unwrap();
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let addr = rustix::net::SocketAddrUnix::new_abstract_name(acc.name()).unwrap();
    rustix::net::connect(&sock, &addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !acc.setting_up() {
        assert!(Instant::now() < deadline, "the connection was not taken");
        assert!(acc.accept().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(1));
    }
    acc.expire();
    assert!(acc.setting_up(), "dropped before its time");
    // As if the timeout had passed.
    acc.pending[0].since = Instant::now() - SETUP_TIMEOUT - Duration::from_millis(1);
    acc.expire();
    assert!(
        !acc.setting_up(),
        "a silent peer past the setup timeout is kept"
    );
    // Its socket is closed: the peer sees the end.
    let mut b = [0u8; 1];
    assert!(readable(sock.as_fd(), 1000));
    assert_eq!(
        rustix::net::recv(&sock, &mut b, rustix::net::RecvFlags::empty()).map(|r| r.0),
        Ok(0)
    );
}

/// What a producer writes into a FIFO, the fuzz entry point's consumer reads back, frame
/// for frame; zeroed or garbled cells give no frame.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd, shared mappings and Unix sockets: system calls Miri does not model"
)]
fn fuzz_consumer_reads_what_a_producer_wrote() {
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Block([u8; 64]);
    let n = crate::wire::shm::MIN_CELLS;
    let size = crate::wire::shm::CTL_SIZE + n * crate::wire::shm::CELL;
    let mut mem = vec![Block([0; 64]); size / 64];
    let base = mem.as_mut_ptr().cast::<u8>();
    // SAFETY: `mem` holds a FIFO of n cells, 64-aligned, and outlives the producer.
    let mut p = fifo::Producer::new(unsafe { fifo::FifoRef::new(base, n) });
    let lens = [1usize, 100, 240, 700];
    for (i, len) in lens.iter().enumerate() {
        p.push(&[&vec![i as u8; *len]]).unwrap();
    }
    let cell = crate::wire::shm::CELL;
    // SAFETY: the cells of `mem`, read after the producer is done.
    let mut cells =
        unsafe { std::slice::from_raw_parts(base.add(crate::wire::shm::CTL_SIZE), n * cell) }
            .to_vec();
    // The cells after the frames: never published (an odd `seq` is left as it is).
    let used: usize = lens.iter().map(|&l| fifo::cells_for(l)).sum();
    for c in cells.chunks_exact_mut(cell).skip(used) {
        c[..8].copy_from_slice(&u64::MAX.to_ne_bytes());
    }
    assert_eq!(fuzz_consumer(&cells), lens.len());
    assert_eq!(fuzz_consumer(&[0xff; 64]), 0);
    assert_eq!(fuzz_consumer(&[]), 0);
}
