//! Multi-process tests: every peer is a real process (this test binary re-run as a child
//! with `COURIER_TEST_ROLE` set; the children are in tests/common/echo.rs). Each test runs
//! over shared memory and over TCP: messages of every size, mapped memory, bursts, active
//! messages, streams, the transport selection line. tests/multiprocess_faults.rs has peers
//! that die, stop or send garbage.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

mod common;
use common::echo::*;

const SIZES: &[usize] = &[
    0,
    1,
    7,
    64,
    240,
    241,
    4095,
    16383,
    16384,
    65536,
    (1 << 20) + 3,
    16 << 20,
    64 << 20,
];

fn sizes_case(tls: &str, expect: &str, split: Option<&str>) {
    let env: Vec<(&str, &str)> = split
        .map(|v| ("COURIER_CMA_SPLIT", v))
        .into_iter()
        .collect();
    let mut peer = Peer::spawn("echo", tls, &env);
    let mut params = ContextParams::default().config("COURIER_TLS", tls);
    if let Some(v) = split {
        params = params.config("COURIER_CMA_SPLIT", v);
    }
    let _c = Context::new(params).unwrap();
    let w = Worker::new(&_c, WorkerParams::default()).unwrap();
    let ep = connect(&w, &peer, 1);
    assert_eq!(ep.transport(), Some(expect));
    // Made over a socket: this side's address is the connecting socket's, also on shm.
    let local = ep.local_sockaddr().expect("local socket address");
    assert_eq!(local.ip(), peer.addr().ip());
    assert_ne!(local.port(), peer.addr().port());
    for (i, &size) in SIZES.iter().enumerate() {
        tag_echo(&w, &ep, 1, size, i);
    }
    // IOV: gather on send, scatter on receive.
    let parts = [pattern(100, 1), pattern(70_000, 2), pattern(3, 3)];
    let mut a = [0u8; 50];
    let mut b = vec![0u8; 70_053];
    {
        let mut iov = [&mut a[..], &mut b[..]];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { w.tag_recv_iov_nb(&mut iov, (1 << 32) | 99, u64::MAX) }.unwrap();
        let send: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        ep.tag_send_iov(&send, (1 << 32) | 99).unwrap();
        assert_eq!(r.wait().unwrap().length, 70_103);
    }
    let all: Vec<u8> = parts.concat();
    assert_eq!(&a[..], &all[..50]);
    assert_eq!(&b[..], &all[50..]);
    stop(&w, &ep, &mut peer);
}

#[test]
fn child_entry() {
    // The entry point children run; as a plain test it does nothing.
    child_main();
}

#[test]
fn tag_sizes_1b_to_64mib_shm() {
    sizes_case("all", "shm", None);
}

/// Large messages copied half by the receiver, half by the sender (split CMA rendezvous)
/// from 8 KiB on, so IOV messages split inside a segment on both sides.
#[test]
fn tag_sizes_split_copy_shm() {
    sizes_case("all", "shm", Some("8k"));
}

/// The receiver copies everything itself.
#[test]
fn tag_sizes_no_split_shm() {
    sizes_case("all", "shm", Some("off"));
}

/// Messages sent from and received into memory the library allocated (`mem_map`): a
/// same-host peer copies them through the region's shared segment with plain loads and
/// stores, both its own part and, in a split, the sender's part. With both sides mapped
/// no copy goes through the kernel; with only this side mapped, the peer's buffers are
/// still reached with CMA. Every byte is checked either way.
fn mapped_case(echo_mapped: bool) {
    let mut env = vec![("COURIER_CMA_SPLIT", "8k")];
    if echo_mapped {
        env.push(("COURIER_TEST_MAPPED", "1"));
    }
    let mut peer = Peer::spawn("echo", "all", &env);
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", "all")
            .config("COURIER_CMA_SPLIT", "8k"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = connect(&w, &peer, 1);
    assert_eq!(ep.transport(), Some("shm"));
    const LEN: usize = (16 << 20) + 4096;
    let send = ctx.mem_map(MemMapParams::allocate(LEN)).unwrap();
    let recv = ctx.mem_map(MemMapParams::allocate(LEN)).unwrap();
    // SAFETY: two live allocated regions of LEN bytes, reached only through these slices.
    let (sbuf, rbuf) = unsafe {
        (
            std::slice::from_raw_parts_mut(send.as_ptr(), LEN),
            std::slice::from_raw_parts_mut(recv.as_ptr(), LEN),
        )
    };
    for (i, size) in [1usize, 20_000, 65536, (1 << 20) + 3, 16 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, i);
        // Off the region's start, so offsets inside the segment are exercised.
        let at = 4096 - i;
        sbuf[at..at + size].copy_from_slice(&data);
        rbuf[..size + 1].fill(0);
        let tag = (1u64 << 32) | (i as u64 + 1);
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { w.tag_recv_nb(&mut rbuf[..size], tag, u64::MAX) }.unwrap();
        ep.tag_send(&sbuf[at..at + size], tag).unwrap();
        assert_eq!(r.wait().unwrap().length, size);
        assert!(rbuf[..size] == data[..], "{size}-byte echo differs");
        assert_eq!(rbuf[size], 0, "{size}-byte echo wrote past its end");
    }
    // An IOV message whose parts all lie in the region.
    {
        let (a, b) = sbuf.split_at_mut(3 << 20);
        a[..70_000].copy_from_slice(&pattern(70_000, 7));
        b[..500_000].copy_from_slice(&pattern(500_000, 8));
        let tag = (1u64 << 32) | 77;
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { w.tag_recv_nb(&mut rbuf[..570_000], tag, u64::MAX) }.unwrap();
        ep.tag_send_iov(&[&a[..70_000], &b[..500_000]], tag)
            .unwrap();
        assert_eq!(r.wait().unwrap().length, 570_000);
        assert!(rbuf[..70_000] == pattern(70_000, 7)[..]);
        assert!(rbuf[70_000..570_000] == pattern(500_000, 8)[..]);
    }
    // A rendezvous active message, out of and back into allocated memory.
    let pend: Arc<Mutex<Vec<AmRndv>>> = Arc::default();
    let p2 = pend.clone();
    w.am_set_handler(AM_BACK, move |m: &mut AmMessage| {
        if let Some(d) = m.take_rndv() {
            p2.lock().unwrap().push(d);
        }
    })
    .unwrap();
    let size = 3 << 20;
    let data = pattern(size, 11);
    sbuf[..size].copy_from_slice(&data);
    let flags = AmFlags {
        reply: true,
        ..Default::default()
    };
    ep.am_send(AM_ECHO, b"hdr", &sbuf[..size], flags).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let d = loop {
        w.progress();
        if let Some(d) = pend.lock().unwrap().pop() {
            break d;
        }
        assert!(Instant::now() < deadline, "no rendezvous echo");
    };
    assert_eq!(d.len(), size);
    rbuf[..size].fill(0);
    w.am_recv_data(d, &mut rbuf[..size]).unwrap();
    assert!(
        rbuf[..size] == data[..],
        "active message came back different"
    );

    let mine = w.rndv_copies().unwrap();
    stop(&w, &ep, &mut peer);
    let err = peer.stderr_final();
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("RNDV "))
        .unwrap_or_else(|| panic!("no copy counts from the echo:\n{err}"));
    let count = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad counts line {line:?}"))
    };
    let (theirs_shared, theirs_link) = (count("shared="), count("link="));
    // The echo read every offer of ours through our segments.
    assert!(theirs_shared >= 5, "echo: {line}");
    if echo_mapped {
        assert!(mine.shared >= 5, "{mine:?}");
        assert_eq!(mine.link, 0, "a copy went through the kernel: {mine:?}");
        assert_eq!(
            theirs_link, 0,
            "a copy went through the kernel in the echo: {line}"
        );
    } else {
        // Its buffers are plain heap memory: reached with CMA.
        assert!(mine.link >= 5, "{mine:?}");
    }
}

#[test]
fn mapped_memory_rendezvous_shm() {
    mapped_case(true);
}

#[test]
fn mapped_sender_plain_receiver_shm() {
    mapped_case(false);
}

#[test]
fn tag_sizes_1b_to_64mib_tcp() {
    sizes_case("tcp", "tcp", None);
}

/// Many messages of mixed sizes in flight at once, every receive posted first: small ones
/// are coalesced into shared writes and parsed many per read, large ones are read straight
/// into the posted buffers; every byte is checked.
fn burst_case(tls: &str) {
    const BURST_SIZES: &[usize] = &[1, 8, 100, 1000, 5000, 40_000, 200_000, 3, 0, 70_001];
    let mut peer = Peer::spawn("echo", tls, &[]);
    let (_c, w) = client(tls);
    let ep = connect(&w, &peer, 1);
    for round in 0..3 {
        let n = 200;
        let sent: Vec<Vec<u8>> = (0..n)
            .map(|k| pattern(BURST_SIZES[k % BURST_SIZES.len()], round * 1000 + k))
            .collect();
        let mut back: Vec<Vec<u8>> = sent.iter().map(|d| vec![0u8; d.len()]).collect();
        let tag = |k: usize| (1u64 << 32) | (10_000 + k as u64);
        let recvs: Vec<Request<'_>> = back
            .iter_mut()
            .enumerate()
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            .map(|(k, b)| unsafe { w.tag_recv_nb(b, tag(k), u64::MAX) }.unwrap())
            .collect();
        let sends: Vec<Request<'_>> = sent
            .iter()
            .enumerate()
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            .map(|(k, d)| unsafe { ep.tag_send_nb(d, tag(k)) }.unwrap())
            .collect();
        for r in sends {
            r.wait().unwrap();
        }
        for (k, r) in recvs.into_iter().enumerate() {
            assert_eq!(r.wait().unwrap().length, sent[k].len(), "message {k}");
        }
        for (k, (a, b)) in sent.iter().zip(&back).enumerate() {
            assert!(
                a == b,
                "round {round} message {k} ({} bytes) differs",
                a.len()
            );
        }
    }
    stop(&w, &ep, &mut peer);
}

#[test]
fn bursts_of_mixed_sizes_shm() {
    burst_case("all");
}

#[test]
fn bursts_of_mixed_sizes_tcp() {
    burst_case("tcp");
}

fn am_case(tls: &str) {
    let mut peer = Peer::spawn("echo", tls, &[]);
    let (_c, w) = client(tls);
    let ep = connect(&w, &peer, 5);
    type Got = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;
    let got: Got = Arc::default();
    let g2 = got.clone();
    let pend: Arc<Mutex<Vec<AmRndv>>> = Arc::default();
    let p2 = pend.clone();
    w.am_set_handler(AM_BACK, move |m: &mut AmMessage| match m.take_rndv() {
        Some(d) => p2.lock().unwrap().push(d),
        None => g2
            .lock()
            .unwrap()
            .push((m.header().to_vec(), m.data().to_vec())),
    })
    .unwrap();
    let roundtrip = |data: &[u8], flags: AmFlags| -> Result<()> {
        ep.am_send(
            AM_ECHO,
            b"hdr",
            data,
            AmFlags {
                reply: true,
                ..flags
            },
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let back = loop {
            w.progress();
            if let Some(d) = pend.lock().unwrap().pop() {
                let mut v = vec![0u8; d.len()];
                w.am_recv_data(d, &mut v).unwrap();
                break v;
            }
            if let Some((h, d)) = got.lock().unwrap().pop() {
                assert_eq!(h, b"back");
                break d;
            }
            assert!(
                Instant::now() < deadline,
                "no echo for {}-byte active message",
                data.len()
            );
        };
        assert!(
            back == data,
            "active message of {} bytes came back different",
            data.len()
        );
        Ok(())
    };
    for (i, &size) in [0usize, 5, 1000, 20_000, 300_000, 4 << 20]
        .iter()
        .enumerate()
    {
        roundtrip(&pattern(size, i), AmFlags::default()).unwrap();
    }
    // Forced rendezvous for a small message, forced eager for one that fits a frame.
    roundtrip(
        &pattern(100, 9),
        AmFlags {
            rndv: true,
            ..Default::default()
        },
    )
    .unwrap();
    roundtrip(
        &pattern(2000, 10),
        AmFlags {
            eager: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Forced eager beyond the transport's frame is refused with a reason.
    let big = vec![1u8; 32 << 20];
    let big = big.as_slice();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe {
        ep.am_send_nb(
            AM_ECHO,
            b"",
            big,
            AmFlags {
                eager: true,
                reply: true,
                ..Default::default()
            },
        )
    }
    .err()
    .expect("too big for eager");
    assert_eq!(e.status(), Status::InvalidParam);
    assert!(e.detail().contains("exceeds"), "{e}");
    stop(&w, &ep, &mut peer);
}

#[test]
fn active_messages_shm() {
    am_case("all");
}

#[test]
fn active_messages_tcp() {
    am_case("tcp");
}

fn stream_case(tls: &str) {
    let mut peer = Peer::spawn("echo", tls, &[]);
    let (_c, w) = client(tls);
    let ep = connect(&w, &peer, 6);
    let total = 3 << 20;
    let data = pattern(total, 4);
    let mut back = vec![0u8; total];
    {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { ep.stream_recv_exact_nb(&mut back) }.unwrap();
        let mut off = 0;
        let mut step = 1;
        while off < total {
            let n = step.min(total - off);
            ep.stream_send(&data[off..off + n]).unwrap();
            off += n;
            step = step * 3 + 1;
        }
        r.wait().unwrap();
    }
    assert!(back == data, "stream bytes came back different");
    stop(&w, &ep, &mut peer);
}

#[test]
fn streams_shm() {
    stream_case("all");
}

#[test]
fn streams_tcp() {
    stream_case("tcp");
}

fn selection_case(tls: &str, want: &str) {
    let mut peer = Peer::spawn("echo", tls, &[("COURIER_LOG_LEVEL", "info")]);
    let (_c, w) = client(tls);
    let ep = connect(&w, &peer, 1);
    tag_echo(&w, &ep, 1, 10, 0);
    stop(&w, &ep, &mut peer);
    let log = peer.stderr_final();
    assert!(log.contains("COURIER_TLS="), "log:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("intra-node cfg#"))
        .unwrap_or_else(|| panic!("no selection line in:\n{log}"));
    assert!(
        line.contains(want),
        "selection line {line:?} lacks {want:?}"
    );
    assert!(line.contains(" am(") && line.contains(" stream("), "{line}");
    assert!(line.contains(" rma(") && line.contains(" amo("), "{line}");
    if tls == "all" {
        // Same host over shm: allocated memory is stored into directly.
        assert!(line.contains("amo(direct/memory shm/memory)"), "{line}");
    } else {
        assert!(line.contains("amo(tcp/"), "{line}");
    }
}

#[test]
fn selection_line_same_host() {
    selection_case("all", "tag(shm/memory");
}

#[test]
fn selection_line_tcp_only() {
    selection_case("tcp", "tag(tcp/");
}
