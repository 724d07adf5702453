//! `COURIER_MAX_FRAME` between real processes: a worker that accepts only small frames
//! still gets large messages whole (its peer, told the limit at wireup, cuts them into
//! more, smaller frames), over shared memory and over tcp; and a peer that sends a frame
//! over the limit anyway (a raw authenticated tcp link) fails its own endpoint only, with
//! an error naming the limit.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Instant;

use common::authed::*;
use common::*;
use courier::wire::frame::{Header, Kind};
use courier::*;

/// The child's limit: 4 KiB.
const SMALL: &str = "4k";
/// Message sizes: under, around and far over the limit (eager and rendezvous).
const SIZES: [usize; 6] = [100, 4000, 4097, 20_000, 300_000, (1 << 20) + 7];

const KEY: &[u8; 32] = b"max-frame test key, 32 bytes....";

// ----- the child: receives messages and says whether each arrived whole ---------------------

/// Prints its address, then answers every message (tag: its pattern's seed) with an `ACK`
/// to the first endpoint made to it (the parent's): the message's length if it arrived
/// whole, `u64::MAX` if not; until `EXIT`.
fn sink() {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    announce(&w);
    let mut eps = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    let mut b = vec![0u8; 2 << 20];
    loop {
        // SAFETY: the request is waited for before its buffer is used again or goes; it is
        // never forgotten.
        let mut r = unsafe { w.tag_recv_nb(&mut b, 0, 0) }.unwrap();
        let info = loop {
            if let Some(res) = r.test() {
                break res.clone().unwrap();
            }
            w.progress();
            while let Some(ep) = w.incoming_endpoint() {
                eps.push(ep);
            }
            assert!(Instant::now() < deadline, "sink: no EXIT in time");
        };
        drop(r);
        if info.tag == EXIT {
            return;
        }
        while let Some(ep) = w.incoming_endpoint() {
            eps.push(ep);
        }
        let ok = b[..info.length] == pattern(info.length, info.tag)[..];
        let v = if ok { info.length as u64 } else { u64::MAX };
        send_u64(&eps[0], ACK, v);
    }
}

#[test]
fn child_entry() {
    run_child(&[("sink", sink)]);
}

// ----- the parent ---------------------------------------------------------------------------

fn parent(net: Net, env: &[(&str, String)]) -> (Context, Worker) {
    let mut p = ContextParams::default();
    for (k, v) in net.env() {
        p = p.config(k, &v);
    }
    for (k, v) in env {
        p = p.config(k, v);
    }
    let c = Context::new(p).unwrap();
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    (c, w)
}

fn send(ep: &Endpoint, data: &[u8], tag: u64) -> Result<Info> {
    // SAFETY: the request is waited for before `data` goes; it is never forgotten.
    let mut r = unsafe { ep.tag_send_nb(data, tag) }.unwrap();
    let res = r.wait_timeout(DEADLINE);
    drop(r);
    res
}

fn stop(w: &Worker, ep: &Endpoint, kid: &mut Kid) -> String {
    send(ep, &[0u8; 8], EXIT).unwrap_or_else(|e| panic!("EXIT to the child: {e}"));
    serve_one(w, kid)
}

/// The child accepts frames of 4 KiB: the parent (default limit) learns it at wireup and
/// sends every size whole, in frames no larger.
fn large_messages_to_a_small_limit(net: Net) {
    let mut kid = Kid::spawn("sink", net, &[("COURIER_MAX_FRAME", SMALL.to_string())]);
    let addr = unhex(&kid.line("ADDR"));
    let (_c, w) = parent(net, &[]);
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = i as u64 + 1;
        send(&ep, &pattern(n, seed), seed).unwrap_or_else(|e| panic!("{n} bytes: {e}"));
        assert_eq!(recv_u64(&w, &mut kid, ACK), n as u64, "{net:?}: {n} bytes");
    }
    // The endpoint's frames follow the child's limit, not only the transport's.
    let eager = ep.am_eager_max(0).unwrap();
    assert!(
        eager <= 4096 - Kind::Am.header_len(),
        "{net:?}: active messages of {eager} bytes go in one frame to a 4k peer"
    );
    let log = stop(&w, &ep, &mut kid);
    assert!(!log.contains("COURIER_MAX_FRAME"), "child's log:\n{log}");
}

common::matrix! {
    large_messages_reach_a_small_frame_limit_shm: large_messages_to_a_small_limit(Net::Shm);
    large_messages_reach_a_small_frame_limit_tcp: large_messages_to_a_small_limit(Net::Tcp);
}

// ----- a peer that ignores the limit --------------------------------------------------------

/// An authenticated peer that sends a frame larger than the child's `COURIER_MAX_FRAME`
/// (after a wireup that says nothing of its own limit, as an older build's) has its
/// connection failed with an error naming the limit; a frame at the limit passes, and an
/// endpoint made before goes on.
#[test]
fn an_oversized_frame_fails_only_its_endpoint() {
    let k = KeyFile::new("oversized", KEY, 0o600);
    let mut kid = Kid::spawn(
        "sink",
        Net::Tcp,
        &[k.env(), ("COURIER_MAX_FRAME", SMALL.to_string())],
    );
    let addr = unhex(&kid.line("ADDR"));
    let to: SocketAddr = kid.line("TCP").parse().unwrap();
    let (_c, w) = parent(Net::Tcp, &[k.env()]);
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    send(&ep, &pattern(100, 1), 1).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 100);

    let wireup = fake_wireup(77);
    let tag_frame = |n: usize, seed: u64| {
        let mut v = Header::tag_eager(seed).as_bytes().to_vec();
        v.extend(pattern(n - v.len(), seed));
        v
    };
    let mut s = raw_authenticated(to, KEY);
    s.write_all(&frame(&wireup)).unwrap();
    // At the limit: taken.
    s.write_all(&frame(&tag_frame(4096, 2))).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 4096 - 16);
    // Over it: the link fails.
    s.write_all(&frame(&tag_frame(4097, 3))).unwrap();
    assert!(
        closed(&mut s),
        "an oversized frame left the connection open"
    );

    // The endpoint made first still works.
    send(&ep, &pattern(5000, 4), 4).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 5000);
    let log = stop(&w, &ep, &mut kid);
    assert!(
        log.contains("4097 bytes") && log.contains("COURIER_MAX_FRAME=4k"),
        "child's log:\n{log}"
    );
}
