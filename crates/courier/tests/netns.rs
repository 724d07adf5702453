//! Two "hosts" in network namespaces joined by a veth pair, made and removed by the test.
//! Skipped (with the reason printed) where namespaces cannot be made.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use courier::*;

struct Net {
    a: String,
    b: String,
    ip_a: String,
    ip_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    fn new(tag: &str) -> Result<Net, String> {
        let id = std::process::id() % 200 + 20;
        let n = Net {
            a: format!("crt{tag}a{}", std::process::id()),
            b: format!("crt{tag}b{}", std::process::id()),
            ip_a: format!("10.251.{id}.1"),
            ip_b: format!("10.251.{id}.2"),
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (format!("va{}{tag}", id), format!("vb{}{tag}", id));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        ip(&[
            "-n",
            &n.a,
            "addr",
            "add",
            &format!("{}/24", n.ip_a),
            "dev",
            &va,
        ])?;
        ip(&[
            "-n",
            &n.b,
            "addr",
            "add",
            &format!("{}/24", n.ip_b),
            "dev",
            &vb,
        ])?;
        for (ns, dev) in [(&n.a, &va), (&n.b, &vb)] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    fn dev_a(&self) -> String {
        format!("va{}{}", std::process::id() % 200 + 20, &self.a[3..4])
    }

    fn spawn(&self, ns: &str, role: &str, env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]);
        cmd.env("COURIER_TEST_ROLE", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }
}

impl Drop for Net {
    /// A test that fails leaves its children running: end every process still inside the
    /// test's namespaces (their pids, from `ip netns pids`), then remove the namespaces.
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() else {
                continue;
            };
            for pid in String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: kill has no memory arguments; the pid is a process in this
                // test's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn wait_line(child: &mut Child, word: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut r = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("child exited before saying {word}");
        }
        if let Some(p) = line.find(word) {
            return line[p + word.len()..].trim().to_string();
        }
    }
}

fn finish(mut c: Child, limit: Duration) -> (bool, String) {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            let _ = c.stderr.take().unwrap().read_to_string(&mut err);
            return (st.success(), err);
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return (false, "timed out".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ----- child roles ----------------------------------------------------------------------------

fn child_main() {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return;
    };
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    match role.as_str() {
        "addr_server" => {
            let a: String = w
                .address()
                .unwrap()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            println!("ADDR {a}");
            let mut b = [0u8; 8];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let r = unsafe { w.tag_recv_nb(&mut b, 1, u64::MAX) }.unwrap();
            r.wait().unwrap();
            let ep = loop {
                if let Some(ep) = w.incoming_endpoint() {
                    break ep;
                }
                w.progress();
            };
            ep.tag_send(&b, 3).unwrap();
            ep.flush().unwrap();
            std::process::exit(0);
        }
        "addr_client" => {
            let a = std::env::var("COURIER_TEST_ADDR").unwrap();
            let addr: Vec<u8> = (0..a.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&a[i..i + 2], 16).unwrap())
                .collect();
            let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
            let f2 = failed.clone();
            let params = EndpointParams::default().error_handler(move |e: &Error| {
                *f2.lock().unwrap() = Some(e.to_string());
            });
            let mut back = [0u8; 8];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { w.tag_recv_nb(&mut back, 3, u64::MAX) }.unwrap();
            match w.connect(&addr, params) {
                Err(e) => println!("SAID FAILED {e}"),
                Ok(ep) => {
                    let b = 7u64.to_le_bytes();
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    let s = unsafe { ep.tag_send_nb(&b, 1) }.unwrap();
                    w.progress_until(Duration::from_secs(60), || {
                        failed.lock().unwrap().is_some() || r.test().is_some()
                    })
                    .unwrap();
                    drop(s);
                    let f = failed.lock().unwrap().clone();
                    drop(r);
                    match f {
                        Some(e) => println!("SAID FAILED {e}"),
                        None => println!("SAID REPLY {}", u64::from_le_bytes(back)),
                    }
                }
            }
            std::process::exit(0);
        }
        "server" => {
            let slot = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let s2 = slot.clone();
            let l = Listener::new(&w, "0.0.0.0:0".parse().unwrap(), move |r: ConnRequest| {
                s2.lock()
                    .unwrap()
                    .push(r.accept(EndpointParams::default()).unwrap());
            })
            .unwrap();
            println!("PORT {}", l.local_addr().port());
            let mut buf = vec![0u8; 16 << 20];
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let r = unsafe { w.tag_recv_nb(&mut buf, 0, 0) }.unwrap();
                let info = match r.wait() {
                    Ok(i) => i,
                    Err(_) => continue,
                };
                if info.tag == 0 || Instant::now() > deadline {
                    std::process::exit(0);
                }
                // Tag 9: bulk for the slow-link test, taken without an answer.
                if info.tag == 9 {
                    continue;
                }
                let ep = slot.lock().unwrap()[0].clone();
                let _ =
                    // SAFETY: the request is waited for, or dropped (which waits), before its
                    // buffer is used again or goes; it is never forgotten.
                    unsafe { ep.tag_send_nb(&buf[..info.length], info.tag) }.and_then(|r| r.wait());
            }
        }
        "client" => {
            let to: std::net::SocketAddr =
                std::env::var("COURIER_TEST_TO").unwrap().parse().unwrap();
            let ep = w
                .connect_sockaddr(to, 1, EndpointParams::default())
                .unwrap();
            ep.wait_connected(Duration::from_secs(10)).unwrap();
            assert_eq!(ep.transport(), Some("tcp"));
            for (i, size) in [1usize, 1000, 100_000, 16 << 20].into_iter().enumerate() {
                let data: Vec<u8> = (0..size).map(|j| (j * 7 + i) as u8).collect();
                let mut back = vec![0u8; size];
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let r = unsafe { w.tag_recv_nb(&mut back, 5, u64::MAX) }.unwrap();
                ep.tag_send(&data, 5).unwrap();
                r.wait().unwrap();
                assert!(
                    back == data,
                    "{size} bytes came back different across hosts"
                );
            }
            ep.tag_send(b"", 0).unwrap();
            ep.flush().unwrap();
        }
        "cut" => {
            let to: std::net::SocketAddr =
                std::env::var("COURIER_TEST_TO").unwrap().parse().unwrap();
            let called = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let c2 = called.clone();
            let ep = w
                .connect_sockaddr(
                    to,
                    2,
                    EndpointParams::default().error_handler(move |_| {
                        c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }),
                )
                .unwrap();
            ep.wait_connected(Duration::from_secs(10)).unwrap();
            let mut sbuf = [0u8; 8];
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            let mut r = unsafe { ep.stream_recv_exact_nb(&mut sbuf) }.unwrap();
            println!("READY");
            use std::io::Write;
            std::io::stdout().flush().unwrap();
            let t = Instant::now();
            while !r.is_done() {
                w.progress();
                assert!(
                    t.elapsed() < Duration::from_secs(8),
                    "no failure noticed {:?} after the link went down",
                    t.elapsed()
                );
            }
            assert!(r.test().unwrap().is_err());
            drop(r);
            eprintln!("failure noticed after {:?}", t.elapsed());
            assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
        "slow" => {
            // Eight megabytes queued at once over a link that carries one a second.
            let to: std::net::SocketAddr =
                std::env::var("COURIER_TEST_TO").unwrap().parse().unwrap();
            let ep = w
                .connect_sockaddr(to, 3, EndpointParams::default())
                .unwrap();
            ep.wait_connected(Duration::from_secs(10)).unwrap();
            let data = vec![7u8; 60_000];
            let t = Instant::now();
            let sends: Vec<_> = (0..140)
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                .map(|_| unsafe { ep.tag_send_nb(&data, 9) }.unwrap())
                .collect();
            ep.flush().unwrap();
            eprintln!("flushed after {:.1} s", t.elapsed().as_secs_f64());
            for s in sends {
                s.wait().unwrap();
            }
            ep.tag_send(b"", 0).unwrap();
            ep.flush().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

#[test]
fn child_entry() {
    child_main();
}

#[test]
fn two_hosts_over_veth() {
    let net = match Net::new("x") {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED two_hosts_over_veth: cannot make network namespaces here: {e}");
            return;
        }
    };
    let mut srv = net.spawn(&net.a, "server", &[("COURIER_LOG_LEVEL", "info")]);
    let port = wait_line(&mut srv, "PORT ");
    let to = format!("{}:{port}", net.ip_a);
    let cli = net.spawn(
        &net.b,
        "client",
        &[("COURIER_TEST_TO", &to), ("COURIER_LOG_LEVEL", "info")],
    );
    let (ok, err) = finish(cli, Duration::from_secs(60));
    assert!(ok, "client in the other namespace failed:\n{err}");
    assert!(
        err.contains("inter-node cfg#") && err.contains("tag(tcp/"),
        "no inter-node selection line:\n{err}"
    );
    let (ok, err) = finish(srv, Duration::from_secs(20));
    assert!(ok, "server failed:\n{err}");
    let _ = net.ip_b;
}

#[test]
fn dead_host_is_noticed_within_the_keepalive_timeout() {
    let net = match Net::new("y") {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED dead_host_is_noticed: cannot make network namespaces here: {e}");
            return;
        }
    };
    let mut srv = net.spawn(&net.a, "server", &[]);
    let port = wait_line(&mut srv, "PORT ");
    let to = format!("{}:{port}", net.ip_a);
    let mut cli = net.spawn(
        &net.b,
        "cut",
        &[
            ("COURIER_TEST_TO", &to),
            ("COURIER_KEEPALIVE_TIMEOUT", "2s"),
            ("COURIER_KEEPALIVE_INTERVAL", "500ms"),
        ],
    );
    wait_line(&mut cli, "READY");
    // The server's host vanishes from the network: nothing answers, no reset is sent.
    ip(&["-n", &net.a, "link", "set", &net.dev_a(), "down"]).unwrap();
    let (ok, err) = finish(cli, Duration::from_secs(15));
    assert!(ok, "client did not notice the dead host:\n{err}");
    eprintln!(
        "{}",
        err.lines().find(|l| l.contains("noticed")).unwrap_or("")
    );
    let _ = srv.kill();
    let _ = srv.wait();
}

/// A flush over a slow link that keeps taking data is waited for, however long it takes:
/// it gave up after a fixed 5 s (twice the keepalive timeout), and `ucp_put_bw` over an
/// 8 Mbit/s link failed with "flush did not finish" while the peer was alive.
#[test]
fn a_flush_over_a_slow_link_waits_while_data_moves() {
    let net = match Net::new("z") {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED a_flush_over_a_slow_link: cannot make network namespaces here: {e}");
            return;
        }
    };
    let dev_b = format!("vb{}z", std::process::id() % 200 + 20);
    let tc = Command::new("ip")
        .args([
            "netns", "exec", &net.b, "tc", "qdisc", "replace", "dev", &dev_b,
        ])
        .args([
            "root", "tbf", "rate", "8mbit", "burst", "32k", "latency", "100ms",
        ])
        .output();
    match tc {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("SKIPPED a_flush_over_a_slow_link: no tbf qdisc here: {other:?}");
            return;
        }
    }
    let mut srv = net.spawn(&net.a, "server", &[]);
    let port = wait_line(&mut srv, "PORT ");
    let to = format!("{}:{port}", net.ip_a);
    // A small socket buffer: the kernel takes little, and the flush waits on the link.
    let cli = net.spawn(
        &net.b,
        "slow",
        &[("COURIER_TEST_TO", &to), ("COURIER_TCP_SNDBUF", "64k")],
    );
    let (ok, err) = finish(cli, Duration::from_secs(60));
    assert!(ok, "the flush over a slow link failed:\n{err}");
    // The link really was slower than the old fixed limit.
    let secs: f64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("flushed after ")?
                .strip_suffix(" s")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no flush time:\n{err}"));
    assert!(
        secs > 5.0,
        "the link took only {secs} s: nothing was tested"
    );
    let (ok, err) = finish(srv, Duration::from_secs(20));
    assert!(ok, "server failed:\n{err}");
}

/// Connections by worker address between two hosts: without a key, refused on both sides
/// (`COURIER_AUTH=auto`) with how to give one; with the same key file, connected.
#[test]
fn worker_address_across_hosts_needs_a_key() {
    let net = match Net::new("k") {
        Ok(n) => n,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "cannot make network namespaces under CI: {e}"
            );
            eprintln!(
                "SKIPPED worker_address_across_hosts_needs_a_key: cannot make network namespaces here: {e}"
            );
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("courier-netns-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, [0x42u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = key.to_str().unwrap().to_string();
    let with_key = [("COURIER_AUTH_KEY_FILE", k.as_str())];
    // (server's settings, client's, what the client must say, what the server's log must say)
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, Env, &str, &str); 3] = [
        (&[], &[], "FAILED", ""),
        (
            &[],
            &[("COURIER_AUTH", "off")],
            "FAILED",
            "it is on another host and did not authenticate",
        ),
        (&with_key, &with_key, "REPLY 7", ""),
    ];
    for (srv_env, cli_env, cli_says, srv_says) in cases {
        let mut srv = net.spawn(&net.a, "addr_server", srv_env);
        let addr = wait_line(&mut srv, "ADDR ");
        let mut env = vec![("COURIER_TEST_ADDR", addr.as_str())];
        env.extend_from_slice(cli_env);
        let mut cli = net.spawn(&net.b, "addr_client", &env);
        let said = wait_line(&mut cli, "SAID ");
        let (ok, cerr) = finish(cli, Duration::from_secs(60));
        assert!(ok, "client failed:\n{cerr}");
        assert!(
            said.starts_with(cli_says),
            "client said {said:?}; its log:\n{cerr}"
        );
        if cli_says == "FAILED" {
            assert!(
                said.contains("COURIER_AUTH_KEY_FILE"),
                "the refusal does not say how to give a key: {said}"
            );
            let _ = srv.kill();
        }
        let (_, serr) = finish(srv, Duration::from_secs(20));
        assert!(serr.contains(srv_says), "server's log:\n{serr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
