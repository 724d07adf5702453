//! The children of tests/multiprocess.rs and multiprocess_faults.rs, each a real process
//! (the test binary re-run with `COURIER_TEST_ROLE` set): an echo server and a sink; and
//! the parent's side of them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

pub type EpMap = Arc<Mutex<HashMap<u64, Endpoint>>>;
pub type AmQueue = Arc<Mutex<Vec<(Endpoint, Vec<u8>, Option<AmRndv>)>>>;

pub const EXIT_TAG: u64 = 0xdead;
pub const AM_ECHO: u16 = 1;
pub const AM_BACK: u16 = 2;

pub fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7 + size)) as u8)
        .collect()
}

// ----- child side -------------------------------------------------------------------------

/// Runs instead of the test when this binary is a child.
pub fn child_main() -> bool {
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

pub fn serve_listener(w: &Worker) -> (Listener, EpMap) {
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
pub fn run_echo() -> i32 {
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
    let am_buf: Option<&mut [u8]> = regions
        .as_ref()
        // SAFETY: as above, for the second region (active-message data, one at a time).
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
                if let Err(e) =
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    unsafe { ep.tag_send_nb(&buf[..info.length], info.tag) }
                        .and_then(|r| r.wait())
                {
                    eprintln!("echo: send back failed: {e}");
                }
            }
            None => eprintln!("echo: no endpoint for client {}", info.tag >> 32),
        }
    }
}

/// Accepts and never answers: the test kills it.
pub fn run_sink() -> i32 {
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

pub struct Peer {
    pub child: Child,
    pub port: u16,
    pub stderr: Arc<Mutex<String>>,
    pub reader: Option<std::thread::JoinHandle<()>>,
}

impl Peer {
    pub fn spawn(role: &str, tls: &str, extra_env: &[(&str, &str)]) -> Peer {
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
    pub fn stderr_final(&mut self) -> String {
        let _ = self.wait_exit(Duration::from_secs(10));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.stderr()
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
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

pub fn client(tls: &str) -> (Context, Worker) {
    let ctx = Context::new(ContextParams::default().config("COURIER_TLS", tls)).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    (ctx, w)
}

pub fn connect(w: &Worker, peer: &Peer, id: u64) -> Endpoint {
    let ep = w
        .connect_sockaddr(peer.addr(), id, EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    ep
}

pub fn tag_echo(w: &Worker, ep: &Endpoint, id: u64, size: usize, seed: usize) {
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

pub fn stop(w: &Worker, ep: &Endpoint, peer: &mut Peer) {
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
