//! Multi-process tests: every peer is a real process (this test binary re-run as a child
//! with `COURIER_TEST_ROLE` set). Each test runs over shared memory and over TCP.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

type EpMap = Arc<Mutex<HashMap<u64, Endpoint>>>;
type AmQueue = Arc<Mutex<Vec<(Endpoint, Vec<u8>, Option<AmRndv>)>>>;

const EXIT_TAG: u64 = 0xdead;
const AM_ECHO: u16 = 1;
const AM_BACK: u16 = 2;

fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7 + size)) as u8)
        .collect()
}

// ----- child side -------------------------------------------------------------------------

/// Runs instead of the test when this binary is a child.
fn child_main() -> bool {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return false;
    };
    let code = match role.as_str() {
        "echo" => run_echo(),
        "sink" => run_sink(),
        other => {
            eprintln!("unknown role {other}");
            3
        }
    };
    std::process::exit(code);
}

fn serve_listener(w: &Worker) -> (Listener, EpMap) {
    let eps: EpMap = Arc::default();
    let e2 = eps.clone();
    let l = Listener::new(
        w,
        "127.0.0.1:0".parse().unwrap(),
        move |req: ConnRequest| {
            let id = req.client_id();
            match req.accept(EndpointParams::default()) {
                Ok(ep) => {
                    e2.lock().unwrap().insert(id, ep);
                }
                Err(e) => eprintln!("accept failed: {e}"),
            }
        },
    )
    .unwrap();
    println!("PORT {}", l.local_addr().port());
    std::io::stdout().flush().unwrap();
    (l, eps)
}

/// Echo server: tag messages go back with the same tag to the client named in the tag's
/// high 32 bits; active messages go back as AM_BACK; stream bytes go back as they come.
fn run_echo() -> i32 {
    // COURIER_TEST_NOFILE: run out of descriptors after that many.
    if let Some(n) = std::env::var("COURIER_TEST_NOFILE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let lim = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: setrlimit with a valid struct, before any thread starts.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    }
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let (_l, eps) = serve_listener(&w);
    let am_queue: AmQueue = Arc::default();
    let q2 = am_queue.clone();
    w.am_set_handler(AM_ECHO, move |m: &mut AmMessage| {
        let ep = m.reply_ep().expect("reply requested");
        let rndv = m.take_rndv();
        q2.lock().unwrap().push((ep, m.data().to_vec(), rndv));
    })
    .unwrap();
    // With COURIER_TEST_MAPPED, messages land in and leave from memory the library
    // allocated (shared segments), and the rendezvous copy counts are printed at exit.
    const BUF_LEN: usize = (64 << 20) + 64;
    let mapped = std::env::var_os("COURIER_TEST_MAPPED").is_some();
    let regions = mapped.then(|| {
        let m = |len| ctx.mem_map(MemMapParams::allocate(len)).unwrap();
        (m(BUF_LEN), m(BUF_LEN))
    });
    let mut owned = Vec::new();
    let buf: &mut [u8] = match &regions {
        // SAFETY: a live allocated region of BUF_LEN bytes, only reached through this slice.
        Some((r, _)) => unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), BUF_LEN) },
        None => {
            owned.resize(BUF_LEN, 0u8);
            &mut owned[..]
        }
    };
    // SAFETY: as above, for the second region (active-message data, one at a time).
    let am_buf: Option<&mut [u8]> = regions
        .as_ref()
        .map(|(_, r)| unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), BUF_LEN) });
    let mut am_buf = am_buf;
    let mut sbuf = vec![0u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Tag echo.
        let mut done = None;
        {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { w.tag_recv_nb(buf, 0, 0) }.unwrap();
            while done.is_none() {
                if let Some(res) = r.test() {
                    done = Some(res.clone());
                    break;
                }
                w.progress();
                // Active messages, handled outside the handler (they may need to wait).
                let items: Vec<_> = am_queue.lock().unwrap().drain(..).collect();
                for (ep, data, rndv) in items {
                    let mut v = Vec::new();
                    let back: &[u8] = match (rndv, am_buf.as_deref_mut()) {
                        (Some(d), Some(ab)) => {
                            let n = d.len();
                            w.am_recv_data(d, &mut ab[..n]).unwrap();
                            &ab[..n]
                        }
                        (Some(d), None) => {
                            v.resize(d.len(), 0);
                            w.am_recv_data(d, &mut v).unwrap();
                            &v
                        }
                        (None, _) => &data,
                    };
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    let _ = unsafe { ep.am_send_nb(AM_BACK, b"back", back, AmFlags::default()) }
                        .and_then(|r| r.wait());
                }
                // Stream echo on every endpoint.
                let list: Vec<Endpoint> = eps.lock().unwrap().values().cloned().collect();
                for ep in list {
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    let got = match unsafe { ep.stream_recv_nb(&mut sbuf) } {
                        Ok(mut r) => {
                            let res = r.test().cloned();
                            if res.is_none() {
                                r.cancel();
                            }
                            res
                        }
                        Err(_) => None,
                    };
                    if let Some(Ok(info)) = got {
                        // SAFETY: the request is waited for, or dropped (which waits), before its
                        // buffer is used again or goes; it is never forgotten.
                        let _ = unsafe { ep.stream_send_nb(&sbuf[..info.length]) }
                            .and_then(|r| r.wait());
                    }
                }
                if Instant::now() > deadline {
                    eprintln!("echo: deadline reached");
                    return 4;
                }
            }
            if done.is_none() {
                drop(r);
            }
        }
        let info = match done {
            Some(Ok(i)) => i,
            Some(Err(e)) => {
                eprintln!("echo: receive failed: {e}");
                continue;
            }
            None => continue,
        };
        if info.tag & 0xffff_ffff == EXIT_TAG {
            let c = w.rndv_copies().unwrap();
            eprintln!("RNDV shared={} link={}", c.shared, c.link);
            return 0;
        }
        let ep = eps.lock().unwrap().get(&(info.tag >> 32)).cloned();
        match ep {
            Some(ep) => {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                if let Err(e) =
                    unsafe { ep.tag_send_nb(&buf[..info.length], info.tag) }.and_then(|r| r.wait())
                {
                    eprintln!("echo: send back failed: {e}");
                }
            }
            None => eprintln!("echo: no endpoint for client {}", info.tag >> 32),
        }
    }
}

/// Accepts and never answers: the test kills it.
fn run_sink() -> i32 {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let (_l, _eps) = serve_listener(&w);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        w.progress();
        std::thread::sleep(Duration::from_micros(200));
    }
    0
}

// ----- parent side ------------------------------------------------------------------------

struct Peer {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Peer {
    fn spawn(role: &str, tls: &str, extra_env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env("COURIER_TEST_ROLE", role)
            .env("COURIER_TLS", tls)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let port = loop {
            let line = lines
                .next()
                .expect("child exited before printing its port")
                .unwrap();
            if let Some(pos) = line.find("PORT ") {
                break line[pos + 5..].trim().parse().unwrap();
            }
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let s2 = stderr.clone();
        let mut es = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n) = es.read(&mut b) {
                if n == 0 {
                    break;
                }
                s2.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&b[..n]));
            }
        });
        Peer {
            child,
            port,
            stderr,
            reader: Some(reader),
        }
    }

    /// Everything the child wrote to stderr, once it has exited and the pipe is drained.
    fn stderr_final(&mut self) -> String {
        let _ = self.wait_exit(Duration::from_secs(10));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.stderr()
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(tls: &str) -> (Context, Worker) {
    let ctx = Context::new(ContextParams::default().config("COURIER_TLS", tls)).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    (ctx, w)
}

fn connect(w: &Worker, peer: &Peer, id: u64) -> Endpoint {
    let ep = w
        .connect_sockaddr(peer.addr(), id, EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    ep
}

fn tag_echo(w: &Worker, ep: &Endpoint, id: u64, size: usize, seed: usize) {
    let data = pattern(size, seed);
    let mut back = vec![0u8; size];
    let tag = (id << 32) | (seed as u64 + 1);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { w.tag_recv_nb(&mut back, tag, u64::MAX) }.unwrap();
    ep.tag_send(&data, tag).unwrap();
    let info = r.wait().unwrap();
    assert_eq!(info.length, size);
    assert!(back == data, "echo of {size} bytes differs");
}

fn stop(w: &Worker, ep: &Endpoint, peer: &mut Peer) {
    ep.tag_send(b"", EXIT_TAG).unwrap();
    let _ = ep.flush();
    let deadline = Instant::now() + Duration::from_secs(10);
    while peer.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        w.progress();
    }
    assert_eq!(
        peer.wait_exit(Duration::from_secs(10)),
        Some(0),
        "child stderr:\n{}",
        peer.stderr()
    );
}

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

fn killed_case(tls: &str) {
    let sink = Peer::spawn("sink", tls, &[]);
    let mut echo = Peer::spawn("echo", tls, &[]);
    let (_c, w) = client(tls);
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let ep = w
        .connect_sockaddr(
            sink.addr(),
            2,
            EndpointParams::default().error_handler(move |e| {
                assert_eq!(e.status(), Status::PeerFailure, "{e}");
                c2.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    let other = connect(&w, &echo, 3);
    let big = pattern(32 << 20, 1);
    let mut sbuf = vec![0u8; 100];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { ep.tag_send_nb(&big, 7) }
        .unwrap_or_else(|e| panic!("{e}; sink log:\n{}", sink.stderr()));
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut srecv = unsafe { ep.stream_recv_exact_nb(&mut sbuf) }.unwrap();
    for _ in 0..1000 {
        w.progress();
    }
    assert!(
        !send.is_done(),
        "nobody received the message, so the send cannot be done"
    );
    let mut sink = sink;
    sink.child.kill().unwrap();
    let t = Instant::now();
    while !(send.is_done() && srecv.is_done()) {
        w.progress();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "requests still pending {:?} after the peer was killed",
            t.elapsed()
        );
    }
    let e = send.test().unwrap().clone().unwrap_err();
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(srecv.test().unwrap().is_err());
    drop(send);
    drop(srecv);
    for _ in 0..100 {
        w.progress();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "error handler must run exactly once"
    );
    // The worker and its other endpoint go on.
    tag_echo(&w, &other, 3, 100_000, 1);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.tag_send_nb(b"x", 1) }
        .err()
        .expect("send on a failed endpoint must fail");
    assert_eq!(e.status(), Status::PeerFailure);
    ep.close_force();
    stop(&w, &other, &mut echo);
}

#[test]
fn peer_killed_mid_transfer_shm() {
    killed_case("all");
}

#[test]
fn peer_killed_mid_transfer_tcp() {
    killed_case("tcp");
}

/// A send to a peer that is alive but stopped (SIGSTOP) cannot finish, and cannot be
/// canceled once started. Dropping it waits for it; the keepalive (no answer within
/// `COURIER_KEEPALIVE_TIMEOUT`, 1 s here) fails the endpoint as not progressing, so the
/// drop returns instead of hanging (long before the 5 s a drop gives up after on its
/// own); the worker's other endpoint goes on.
fn dropped_to_stopped_case(tls: &str) {
    let sink = Peer::spawn("sink", tls, &[]);
    let mut echo = Peer::spawn("echo", tls, &[]);
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", tls)
            .config("COURIER_KEEPALIVE_TIMEOUT", "1s"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = connect(&w, &sink, 2);
    let other = connect(&w, &echo, 3);
    let big = pattern(32 << 20, 2);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut send = unsafe { ep.tag_send_nb(&big, 7) }.unwrap();
    for _ in 0..1000 {
        w.progress();
    }
    assert!(!send.is_done(), "nobody received the message");
    assert!(!send.cancel(), "a started send cannot be canceled");
    let pid = sink.child.id() as libc::pid_t;
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Should the drop hang, fail the test rather than the whole run.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(90)).is_err() {
            eprintln!("dropping the request still waits after 90 s");
            std::process::exit(1);
        }
    });
    let t = Instant::now();
    drop(send);
    let took = t.elapsed();
    let _ = tx.send(());
    watchdog.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "the drop took {took:?} with COURIER_KEEPALIVE_TIMEOUT=1s"
    );
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.tag_send_nb(b"x", 1) }
        .err()
        .expect("the endpoint of the abandoned request must have failed");
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(e.detail().contains("not progressing"), "{e}");
    // The worker and its other endpoint go on.
    tag_echo(&w, &other, 3, 100_000, 2);
    ep.close_force();
    stop(&w, &other, &mut echo);
    // SAFETY: as above; the sink is then killed when dropped.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

#[test]
fn dropped_send_to_a_stopped_peer_gives_up_shm() {
    dropped_to_stopped_case("all");
}

#[test]
fn dropped_send_to_a_stopped_peer_gives_up_tcp() {
    dropped_to_stopped_case("tcp");
}

fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

#[test]
fn garbage_to_listener_and_open_connection() {
    use courier::wire::address::WorkerAddress;
    use courier::wire::frame::{Header, Kind};
    let mut peer = Peer::spawn("echo", "tcp", &[]);
    // Not Courier at all.
    let mut s = TcpStream::connect(peer.addr()).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    // A Courier peer that accepts, delivers one message, then lies about a length.
    let mut raw = TcpStream::connect(peer.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"COURIER\x01").unwrap();
    let fake = WorkerAddress {
        worker_id: 1,
        host_id: [0xee; 16],
        pid: 1,
        uds_name: vec![],
        tcp: vec![],
    };
    let mut req = Header::new(Kind::ConnReq).word(1, 77).as_bytes().to_vec();
    req.extend(fake.pack());
    raw.write_all(&frame(&req)).unwrap();
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).unwrap();
    let mut accept = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut accept).unwrap();
    assert_eq!(accept[0], Kind::ConnAccept as u8);
    let tag = (77u64 << 32) | 5;
    let mut msg = Header::new(Kind::TagEager).word(1, tag).as_bytes().to_vec();
    msg.extend_from_slice(b"delivered before the lie");
    raw.write_all(&frame(&msg)).unwrap();
    raw.read_exact(&mut len).unwrap();
    let mut echo = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut echo).unwrap();
    assert_eq!(&echo[16..], b"delivered before the lie");
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    raw.write_all(&[0u8; 64]).unwrap();
    // The server keeps serving real clients.
    let (_c, w) = client("tcp");
    let ep = connect(&w, &peer, 9);
    tag_echo(&w, &ep, 9, 70_000, 3);
    stop(&w, &ep, &mut peer);
    let log = peer.stderr_final();
    assert!(
        log.contains("dropped connection from") && log.contains("bad preamble"),
        "log:\n{log}"
    );
    assert!(
        log.contains("dropping connection to") && log.contains("exceeds the limit"),
        "log:\n{log}"
    );
}

/// A listener out of descriptors says so once (not at every progress call, which flooded
/// the log with some 20,000 lines a second), and accepts again when descriptors are free.
#[test]
fn a_listener_out_of_descriptors_waits_quietly_and_recovers() {
    let mut peer = Peer::spawn("echo", "tcp", &[("COURIER_TEST_NOFILE", "64")]);
    // More connections than the child has descriptors; the kernel's backlog keeps them.
    let held: Vec<TcpStream> = (0..120)
        .map(|_| TcpStream::connect(peer.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    drop(held);
    // Once the held connections are gone (the child drops each at its end of file), a real
    // client is served.
    let (_c, w) = client("tcp");
    let ep = connect(&w, &peer, 4);
    tag_echo(&w, &ep, 4, 1000, 3);
    stop(&w, &ep, &mut peer);
    let log = peer.stderr_final();
    let warnings = log.lines().filter(|l| l.contains("tcp accept on")).count();
    assert!(
        log.contains("Too many open files") && log.contains("incoming connections wait"),
        "log:\n{log}"
    );
    assert!(warnings <= 3, "{warnings} warnings:\n{log}");
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
