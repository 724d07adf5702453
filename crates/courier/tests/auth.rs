//! Who may connect, between real processes: the parent connects to a child worker (or
//! plays a hostile peer on a raw socket), over shared memory and over tcp, with the same
//! key, another key, or none (`COURIER_AUTH`, `COURIER_AUTH_KEY_FILE`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::authed::*;
use common::*;
use courier::wire::auth::AuthMsg;
use courier::wire::frame::{Header, Kind};
use courier::*;

const MSG: u64 = 1;

const KEY_A: &[u8; 32] = b"key A: thirty-two bytes of it...";
const KEY_B: &[u8; 32] = b"key B: thirty-two bytes of it...";

// ----- the child: a worker that prints what reaches it ------------------------------------

/// Prints its address, then `GOT <value>` for every `MSG` message, until `EXIT`.
fn server() {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    announce(&w);
    let mut eps = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut b = [0u8; 8];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { w.tag_recv_nb(&mut b, 0, 0) }.unwrap();
        let info = loop {
            if let Some(res) = r.test() {
                break res.clone().unwrap();
            }
            w.progress();
            while let Some(ep) = w.incoming_endpoint() {
                eps.push(ep);
            }
            assert!(Instant::now() < deadline, "server: no EXIT in time");
        };
        drop(r);
        if info.tag == EXIT {
            return;
        }
        println!("GOT {}", u64::from_le_bytes(b));
        std::io::stdout().flush().unwrap();
    }
}

#[test]
fn child_entry() {
    run_child(&[("server", server)]);
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

/// Send `v` as `MSG` to the child at `addr`: the send's result.
fn send_to(w: &Worker, addr: &[u8], v: u64) -> (Endpoint, Result<Info>) {
    let ep = w.connect(addr, EndpointParams::default()).unwrap();
    let b = v.to_le_bytes();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.tag_send_nb(&b, MSG) }.unwrap();
    let res = r.wait_timeout(DEADLINE);
    drop(r);
    (ep, res)
}

/// Stop the child (an authenticated endpoint sends `EXIT`) and return its stderr.
fn stop(w: &Worker, addr: &[u8], kid: &mut Kid) -> String {
    let (ep, res) = send_to_tag(w, addr, EXIT);
    res.unwrap_or_else(|e| panic!("EXIT to the child: {e}"));
    let err = serve_one(w, kid);
    drop(ep);
    err
}

fn send_to_tag(w: &Worker, addr: &[u8], tag: u64) -> (Endpoint, Result<Info>) {
    let ep = w.connect(addr, EndpointParams::default()).unwrap();
    let b = 0u64.to_le_bytes();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.tag_send_nb(&b, tag) }.unwrap();
    let res = r.wait_timeout(DEADLINE);
    drop(r);
    (ep, res)
}

fn got(kid: &Kid, v: u64) {
    assert_eq!(kid.line("GOT"), v.to_string());
}

/// The same key on both sides: connected, the message arrives.
fn matching_key(net: Net) {
    let k = KeyFile::new("match", KEY_A, 0o600);
    let mut kid = Kid::spawn("server", net, &[k.env()]);
    let addr = unhex(&kid.line("ADDR"));
    let (_c, w) = parent(net, &[k.env()]);
    let (_ep, res) = send_to(&w, &addr, 42);
    res.unwrap();
    got(&kid, 42);
    let log = stop(&w, &addr, &mut kid);
    assert!(!log.contains("dropped connection"), "log:\n{log}");
}

/// The child has key A; the parent connects with `env`'s (key B, or none): refused on
/// both sides, with the reason in the child's log, and nothing reaches the child.
fn refused(net: Net, parent_env: &[(&str, String)], child_says: &str, parent_says: &str) {
    let k = KeyFile::new("refused", KEY_A, 0o600);
    let mut kid = Kid::spawn("server", net, &[k.env()]);
    let addr = unhex(&kid.line("ADDR"));
    let (_c, bad) = parent(net, parent_env);
    // The endpoint fails (a send may complete before it does: it left this side).
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let f2 = failed.clone();
    let params = EndpointParams::default().error_handler(move |e: &Error| {
        *f2.lock().unwrap() = Some(e.to_string());
    });
    let ep = bad.connect(&addr, params).unwrap();
    let b = 13u64.to_le_bytes();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { ep.tag_send_nb(&b, MSG) }.unwrap();
    bad.progress_until(DEADLINE, || failed.lock().unwrap().is_some())
        .unwrap_or_else(|e| panic!("a peer without the key was not refused: {e}"));
    drop(r);
    let e = failed.lock().unwrap().clone().unwrap();
    assert!(e.contains(parent_says), "parent's error: {e}");
    // A worker with the right key still gets in, and is the only one whose message came.
    let (_c2, good) = parent(net, &[k.env()]);
    let (_ep2, res) = send_to(&good, &addr, 7);
    res.unwrap();
    got(&kid, 7);
    let log = stop(&good, &addr, &mut kid);
    assert!(
        log.contains("dropped connection from") && log.contains(child_says),
        "child's log:\n{log}"
    );
}

fn wrong_key(net: Net) {
    let b = KeyFile::new("wrong", KEY_B, 0o600);
    refused(
        net,
        &[b.env()],
        "proof does not match",
        "failed authentication",
    );
}

fn no_key(net: Net) {
    refused(
        net,
        &[("COURIER_AUTH", "auto".into())],
        "did not authenticate",
        "requires authentication",
    );
}

common::matrix! {
    matching_key_connects_shm: matching_key(Net::Shm);
    matching_key_connects_tcp: matching_key(Net::Tcp);
    wrong_key_is_refused_shm: wrong_key(Net::Shm);
    wrong_key_is_refused_tcp: wrong_key(Net::Tcp);
    unauthenticated_peer_is_refused_when_a_key_is_set_shm: no_key(Net::Shm);
    unauthenticated_peer_is_refused_when_a_key_is_set_tcp: no_key(Net::Tcp);
}

/// A key file others may read is refused with what to do; `required` without a key is a
/// configuration error; a file of the right mode is taken.
#[test]
fn key_file_with_loose_permissions_is_refused() {
    for mode in [0o644, 0o640, 0o604, 0o660] {
        let k = KeyFile::new(&format!("loose{mode:o}"), KEY_A, mode);
        let e = Context::new(ContextParams::default().config(k.env().0, &k.env().1))
            .err()
            .unwrap_or_else(|| panic!("a key file of mode {mode:o} was taken"));
        let s = e.to_string();
        assert!(
            s.contains("too open")
                && s.contains("chmod 600")
                && s.contains("COURIER_AUTH_KEY_FILE"),
            "{s}"
        );
    }
    let e = Context::new(
        ContextParams::default()
            .config("COURIER_AUTH", "required")
            .config("COURIER_AUTH_KEY_FILE", ""),
    )
    .err()
    .expect("required without a key");
    assert!(e.to_string().contains("COURIER_AUTH_KEY_FILE"), "{e}");
    let short = KeyFile::new("short", b"short", 0o600);
    let e = Context::new(ContextParams::default().config(short.env().0, &short.env().1))
        .err()
        .expect("a 5-byte key");
    assert!(e.to_string().contains("at least 16"), "{e}");
    let ok = KeyFile::new("ok", KEY_A, 0o400);
    Context::new(ContextParams::default().config(ok.env().0, &ok.env().1)).unwrap();
    // What `courier info -c` shows comes from the same check.
    let line = courier::auth::in_force(courier::auth::AuthMode::Auto, Some(&short.path));
    assert!(line.contains("at least 16"), "{line}");
}

/// `COURIER_AUTH=off` says so at warn level, and still serves.
#[test]
fn off_mode_warns() {
    let mut kid = Kid::spawn("server", Net::Tcp, &[("COURIER_AUTH", "off".into())]);
    let addr = unhex(&kid.line("ADDR"));
    let (_c, w) = parent(Net::Tcp, &[("COURIER_AUTH", "off".into())]);
    let (_ep, res) = send_to(&w, &addr, 5);
    res.unwrap();
    got(&kid, 5);
    let log = stop(&w, &addr, &mut kid);
    assert_eq!(
        log.matches("COURIER_AUTH=off").count(),
        1,
        "one warning expected; log:\n{log}"
    );
    assert!(log.contains("WARN"), "log:\n{log}");
}

// ----- hostile peers on a raw tcp socket ---------------------------------------------------

/// Garbage, truncated and reflected handshake frames before authentication, and garbage
/// and truncated frames after it: each connection is dropped, and an authenticated
/// endpoint made before them goes on.
#[test]
fn garbage_and_truncated_frames_before_and_after_authentication() {
    let k = KeyFile::new("garbage", KEY_A, 0o600);
    // Every drop's reason must show, so warnings held back by the rate limit too (debug).
    let mut kid = Kid::spawn(
        "server",
        Net::Tcp,
        &[k.env(), ("COURIER_LOG_LEVEL", "debug".to_string())],
    );
    let addr = unhex(&kid.line("ADDR"));
    let to: SocketAddr = kid.line("TCP").parse().unwrap();
    let (_c, w) = parent(Net::Tcp, &[k.env()]);
    let (ep, res) = send_to(&w, &addr, 1);
    res.unwrap();
    got(&kid, 1);

    let hello = AuthMsg::Hello { nonce: [1; 32] }.emit();
    let mut before: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", frame(b"\xa5\x07garbage that is no message")),
        ("truncated hello", frame(&hello[..20])),
        ("padded hello", frame(&[&hello[..], &[0u8; 3]].concat())),
        // The acceptor's own kind of proof, sent to it: a reflection.
        (
            "reflected challenge",
            frame(
                &AuthMsg::Challenge {
                    nonce: [2; 32],
                    proof: [3; 32],
                }
                .emit(),
            ),
        ),
        (
            "a response before the hello",
            frame(&AuthMsg::Response { proof: [4; 32] }.emit()),
        ),
        // A protocol frame without authenticating.
        (
            "a tag message",
            frame(Header::new(Kind::TagEager).word(1, MSG).as_bytes()),
        ),
    ];
    // A length longer than the frame, then the connection half-closed: truncated.
    let mut cut = 200u32.to_le_bytes().to_vec();
    cut.extend_from_slice(&hello);
    before.push(("frame cut short", cut));
    for (what, bytes) in &before {
        let mut s = TcpStream::connect(to).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"COURIER\x01").unwrap();
        s.write_all(bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(closed(&mut s), "{what}: the connection stayed open");
    }
    // A wrong proof in the response.
    {
        let mut s = TcpStream::connect(to).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"COURIER\x01").unwrap();
        s.write_all(&frame(&hello)).unwrap();
        let ch = read_frame(&mut s).unwrap();
        assert!(matches!(AuthMsg::parse(&ch), Ok(AuthMsg::Challenge { .. })));
        s.write_all(&frame(&AuthMsg::Response { proof: [9; 32] }.emit()))
            .unwrap();
        assert!(closed(&mut s), "a wrong proof was taken");
    }
    // After authenticating: a wireup, then garbage; a wireup, then a truncated frame.
    let wireup = fake_wireup(99);
    for (what, tail) in [
        (
            "garbage after authentication",
            frame(b"\xff\xffnot a frame kind"),
        ),
        ("a truncated frame after authentication", {
            let mut v = 100u32.to_le_bytes().to_vec();
            v.extend_from_slice(&[1, 0, 0, 0]);
            v
        }),
    ] {
        let mut s = raw_authenticated(to, KEY_A);
        s.write_all(&frame(&wireup)).unwrap();
        s.write_all(&tail).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(closed(&mut s), "{what}: the connection stayed open");
    }
    // The endpoint made first still works.
    let two = 2u64.to_le_bytes();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    unsafe { ep.tag_send_nb(&two, MSG) }
        .unwrap()
        .wait_timeout(DEADLINE)
        .unwrap();
    got(&kid, 2);
    let log = stop(&w, &addr, &mut kid);
    for why in [
        "malformed authentication message",
        "did not authenticate",
        "out of order",
        "proof does not match",
    ] {
        assert!(log.contains(why), "no {why:?} in the child's log:\n{log}");
    }
}

/// Large frames sent in part over many authenticated links: the receive buffers they make
/// the child grow are held to `COURIER_MAX_RX_BUFFERED` together; the links that would pass
/// it fail with an error naming it, the others stay open, and an endpoint made before goes
/// on. Closing the links gives their buffers back: a new link may hold as much again.
#[test]
fn partial_large_frames_are_held_to_the_receive_buffer_limit() {
    const PART: usize = 6 << 20;
    let k = KeyFile::new("rxbuf", KEY_A, 0o600);
    let mut kid = Kid::spawn(
        "server",
        Net::Tcp,
        &[
            k.env(),
            ("COURIER_MAX_RX_BUFFERED", "16m".to_string()),
            // The raw links answer no keepalive; only the limit may end them here.
            ("COURIER_KEEPALIVE_TIMEOUT", "inf".to_string()),
        ],
    );
    let addr = unhex(&kid.line("ADDR"));
    let to: SocketAddr = kid.line("TCP").parse().unwrap();
    let (_c, w) = parent(Net::Tcp, &[k.env()]);
    let (ep, res) = send_to(&w, &addr, 1);
    res.unwrap();
    got(&kid, 1);

    // A link made an endpoint (a wireup), then PART bytes of a 16 MiB frame that never ends:
    // the child's buffer for it doubles from 256 KiB to 8 MiB, about 7.75 MiB counted.
    let hostile = |id: u64| {
        let mut s = raw_authenticated(to, KEY_A);
        s.write_all(&frame(&fake_wireup(1000 + id))).unwrap();
        let mut part = (16u32 << 20).to_le_bytes().to_vec();
        part.extend_from_slice(Header::new(Kind::Wireup).as_bytes());
        part.resize(PART, 0);
        // A link the child fails stops reading: the write then fails, as it should.
        let _ = s.write_all(&part);
        s
    };
    let open = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b) {
                Ok(0) => return false,
                Ok(_) => continue, // the child's wireup answer, keepalive questions
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return true;
                }
                Err(_) => return false,
            }
        }
    };
    let mut links: Vec<TcpStream> = (0..4).map(hostile).collect();
    let still: Vec<bool> = links.iter_mut().map(open).collect();
    let n_open = still.iter().filter(|o| **o).count();
    // Two such buffers fit in 16 MiB, three do not; at least one fits.
    assert!(
        (1..=2).contains(&n_open),
        "links still open: {still:?} (16 MiB hold two partial frames)"
    );
    // The endpoint made first still works.
    let two = 2u64.to_le_bytes();
    w.scope(|s| s.tag_send(&ep, &two, MSG)?.wait_timeout(DEADLINE))
        .unwrap();
    got(&kid, 2);
    // Closed links give their bytes back: after the child has seen the closes (a message
    // sent after them arrives after them on no common link, so look until one fits), new
    // links hold as much again.
    drop(links);
    let deadline = Instant::now() + DEADLINE;
    let fits = loop {
        let mut s = hostile(99);
        if open(&mut s) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    assert!(fits, "the buffers of closed links were not given back");
    let log = stop(&w, &addr, &mut kid);
    assert!(
        log.contains("(COURIER_MAX_RX_BUFFERED=16m)")
            && log.contains("part of a 16777220-byte frame"),
        "no error naming the limit in the child's log:\n{log}"
    );
}
