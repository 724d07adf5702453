//! A peer that is killed, or stopped (SIGSTOP: gone but alive), in the middle of a
//! `courier perf` run: the other side ends within a bounded time with an error naming the
//! peer by its address, never hangs. Server and client are two real processes, as users
//! start them. Every wait is bounded; a child is stopped, continued and killed only by
//! its own pid, and never outlives its test (see `Proc`'s Drop).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
mod common;
use common::{courier, piped};

/// How long the machine may take to start a process and get a test going (a loaded
/// 2-core machine can be slow).
const START: Duration = Duration::from_secs(30);
/// How long after a peer was killed the other side must have ended (it notices at once on
/// this host; the limit is slack for a busy machine, far below any stall limit).
const AFTER_KILL: Duration = Duration::from_secs(10);
/// `--peer-timeout` of the SIGSTOP tests, and how long after it the run must have ended.
const PEER_TIMEOUT: &str = "2s";
const AFTER_STOP: Duration = Duration::from_secs(15);
/// How long a test lets the run go before it kills or stops a side.
const RUNNING: Duration = Duration::from_millis(500);

/// A `courier` child process with its stderr collected. Dropping it continues it (in case
/// it was stopped) and kills it.
struct Proc {
    child: Child,
    what: &'static str,
    err: Arc<Mutex<String>>,
    /// Reads its stderr until the end: joined once it has exited, so that every last byte
    /// is in `err` (a fixed pause lost them on a loaded machine).
    err_reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(
        what: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (Proc, mpsc::Receiver<String>) {
        let mut child = piped(args, env).spawn().expect("start courier");
        let out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let text = Arc::new(Mutex::new(String::new()));
        let t = text.clone();
        let err_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                t.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        (
            Proc {
                child,
                what,
                err: text,
                err_reader: Some(err_reader),
            },
            rx,
        )
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (it has not been waited for: `Proc` waits
        // only in `exit_within` and Drop, after which no signal is sent).
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig}) of the {}", self.pid(), self.what);
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its whole stderr, once it has exited.
    fn stderr_at_exit(&mut self) -> String {
        if let Some(h) = self.err_reader.take() {
            let _ = h.join();
        }
        self.stderr()
    }

    /// Wait until its stderr contains `what`, at most `limit`; returns the stderr.
    fn stderr_shows(&mut self, what: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.stderr();
            if s.contains(what) {
                return s;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                let err = self.stderr_at_exit();
                panic!(
                    "the {} exited ({st}) before printing {what:?}:\n{err}",
                    self.what
                );
            }
            assert!(
                Instant::now() < deadline,
                "the {} did not print {what:?} within {limit:?}:\n{s}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait for it to exit, at most `limit` (panics, and Drop kills it, if it does not);
    /// returns its status, stderr and how long it took.
    fn exit_within(&mut self, limit: Duration) -> (ExitStatus, String, Duration) {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                let took = t.elapsed();
                return (st, self.stderr_at_exit(), took);
            }
            assert!(
                t.elapsed() < limit,
                "the {} still runs {limit:?} after its peer was killed or stopped (a hang):\n{}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: our own child, not yet waited for.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A server (`--verbose`, so it says whom it serves and what it runs) and a client running
/// `test` with a practically endless iteration count, both with `env`; returns once the
/// server runs the test, with the client's address as the server names it and the
/// server's as the client names it.
struct Run {
    server: Proc,
    client: Proc,
    /// The client as the server sees it (`127.0.0.1:PORT`).
    client_addr: String,
    /// The server as the client was told it (`127.0.0.1:PORT`).
    server_addr: String,
}

fn start(test: &str, env: &[(&str, &str)], extra: &[&str]) -> Run {
    let mut sargs = vec!["perf", "-p", "0", "--announce", "--verbose"];
    sargs.extend_from_slice(extra);
    let (mut server, lines) = Proc::spawn("server", &sargs, env);
    let port = match lines.recv_timeout(START) {
        Ok(l) => l
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse::<u16>().ok())
            .unwrap_or_else(|| panic!("not a port announcement: {l}")),
        Err(_) => panic!("the server did not announce its port:\n{}", server.stderr()),
    };
    let port_s = port.to_string();
    let mut cargs = vec![
        "perf",
        "127.0.0.1",
        "-p",
        &port_s,
        "-t",
        test,
        "-n",
        "1000000000000",
        "-w",
        "10",
        "-f",
    ];
    cargs.extend_from_slice(extra);
    let (client, _) = Proc::spawn("client", &cargs, env);
    let said = server.stderr_shows(&format!("running {test} "), START);
    let client_addr = said
        .lines()
        .find_map(|l| l.strip_prefix("connected: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("the server did not say whom it serves:\n{said}"))
        .to_string();
    let a: SocketAddr = client_addr
        .parse()
        .unwrap_or_else(|e| panic!("{client_addr:?} is not an address ({e}):\n{said}"));
    assert!(
        a.ip().is_loopback() && a.port() != port,
        "the client's address: {a}"
    );
    std::thread::sleep(RUNNING);
    Run {
        server,
        client,
        client_addr,
        server_addr: format!("127.0.0.1:{port}"),
    }
}

/// `p` ended with a failure whose message names `peer` (and, if given, contains `why`).
fn assert_named(p: &str, st: ExitStatus, err: &str, peer: &str, why: Option<&str>) {
    assert!(!st.success(), "the {p} exited successfully:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("courier: error:"))
        .unwrap_or_else(|| panic!("the {p} printed no error ({st}):\n{err}"));
    assert!(
        line.contains(&format!("peer {peer} ")),
        "the {p}'s error does not name its peer {peer}: {line}"
    );
    if let Some(w) = why {
        assert!(
            line.contains(w),
            "the {p}'s error does not say {w:?}: {line}"
        );
    }
}

const TCP: &[(&str, &str)] = &[("COURIER_TLS", "tcp")];
/// The default transport: shared memory between two processes of this host.
const DEFAULT: &[(&str, &str)] = &[];

fn tls_name(env: &[(&str, &str)]) -> &'static str {
    if env.is_empty() { "default" } else { "tcp" }
}

#[test]
fn a_killed_client_ends_the_server_with_an_error_naming_it() {
    // Two-sided (the server waits for messages) and one-sided (it waits for the client's
    // end-of-test while the client's operations land, on shared memory without it).
    for (test, env) in [
        ("tag_lat", TCP),
        ("tag_bw", DEFAULT),
        ("ucp_put_bw", DEFAULT),
        ("ucp_get", TCP),
        ("put_signal_bw", DEFAULT),
    ] {
        let mut r = start(test, env, &[]);
        r.client.signal(libc::SIGKILL);
        let (st, err, took) = r.server.exit_within(AFTER_KILL);
        eprintln!(
            "{test} ({}): server ended {took:?} after the kill",
            tls_name(env)
        );
        assert_named("server", st, &err, &r.client_addr, Some("failed"));
    }
}

#[test]
fn a_killed_server_ends_the_client_on_shared_memory() {
    // On shared memory the one-sided operations complete in the client's own loads and
    // stores, without the server: the client must still look at its link.
    for test in ["tag_bw", "ucp_put_lat", "ucp_get", "ucp_put_bw", "ucp_fadd"] {
        let mut r = start(test, DEFAULT, &[]);
        r.server.signal(libc::SIGKILL);
        let (st, err, took) = r.client.exit_within(AFTER_KILL);
        eprintln!("{test}: client ended {took:?} after the kill");
        assert_named("client", st, &err, &r.server_addr, Some("failed"));
    }
}

#[test]
fn a_stopped_peer_is_given_up_after_the_peer_timeout() {
    // The kernel of a stopped process still answers for its sockets, so over tcp only the
    // silence tells; TCP's own timeout is put out of the way so that the perf tool's limit
    // is what ends the run.
    let env: &[(&str, &str)] = &[("COURIER_TLS", "tcp"), ("COURIER_KEEPALIVE_TIMEOUT", "60s")];
    let opts = ["--peer-timeout", PEER_TIMEOUT];
    // (test, which side stops): the other waits for a ping-pong answer, for the end of a
    // one-sided test, on a get or on a signal word.
    for (test, stop_client) in [
        ("tag_lat", true),
        ("tag_lat", false),
        ("ucp_put_bw", true),
        ("ucp_get", false),
        ("put_signal_lat", false),
    ] {
        let mut r = start(test, env, &opts);
        let (stopped, waiting, peer, who) = if stop_client {
            (&r.client, &mut r.server, r.client_addr.clone(), "server")
        } else {
            (&r.server, &mut r.client, r.server_addr.clone(), "client")
        };
        stopped.signal(libc::SIGSTOP);
        let (st, err, took) = waiting.exit_within(AFTER_STOP);
        eprintln!("{test}: the {who} gave up {took:?} after its peer stopped");
        assert_named(who, st, &err, &peer, Some("stopped responding"));
        assert!(
            err.contains(&format!("no progress for {PEER_TIMEOUT}")),
            "{err}"
        );
        // `r` drops: the stopped one is continued and killed.
    }
}

#[test]
fn a_stopped_client_of_a_one_sided_test_on_shared_memory_is_given_up() {
    // The server sees none of the client's operations on shared memory; the client's
    // heartbeat is what stops when the client does.
    let opts = ["--peer-timeout", PEER_TIMEOUT];
    for test in ["ucp_put_bw", "ucp_fadd"] {
        let mut r = start(test, DEFAULT, &opts);
        r.client.signal(libc::SIGSTOP);
        let (st, err, took) = r.server.exit_within(AFTER_STOP);
        eprintln!("{test}: the server gave up {took:?} after the client stopped");
        assert_named(
            "server",
            st,
            &err,
            &r.client_addr,
            Some("stopped responding"),
        );
    }
}

#[test]
fn a_live_client_of_a_long_one_sided_test_is_not_given_up() {
    // A one-sided test on shared memory that runs for several peer timeouts: the client's
    // heartbeat keeps the server waiting. Killed afterwards, the client is reported as
    // failed, not as silent.
    // (2 s, ten heartbeats: a crowded machine may hold a busy client off the CPU for a
    // while without the client being silent.)
    let opts = ["--peer-timeout", "2s"];
    for test in ["ucp_put_bw", "put_signal_bw"] {
        let mut r = start(test, DEFAULT, &opts);
        std::thread::sleep(Duration::from_secs(5));
        for p in [&mut r.server, &mut r.client] {
            assert!(
                p.child.try_wait().expect("try_wait").is_none(),
                "{test}: the {} ended while both sides were alive:\n{}",
                p.what,
                p.stderr()
            );
        }
        r.client.signal(libc::SIGKILL);
        let (st, err, _) = r.server.exit_within(AFTER_KILL);
        assert_named("server", st, &err, &r.client_addr, Some("failed"));
    }
}

#[test]
fn a_bad_peer_timeout_is_a_usage_error() {
    for (v, want) in [
        ("0.5s", "at least 1s"),
        ("soon", "expected a duration"),
        ("-3s", "expected a duration"),
        ("1e30", "expected a duration"),
    ] {
        let o = courier(
            &[
                "perf",
                "-l",
                "-t",
                "tag_lat",
                "-n",
                "10",
                &format!("--peer-timeout={v}"),
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{v}: {err}");
        assert!(
            err.contains("--peer-timeout") && err.contains(want),
            "{v}: {err}"
        );
    }
}

/// A server process (`--verbose`, announcing its port) with `env`; returns it and its
/// port.
fn lone_server(env: &[(&str, &str)]) -> (Proc, String) {
    let (mut server, lines) = Proc::spawn(
        "server",
        &["perf", "-p", "0", "--announce", "--verbose"],
        env,
    );
    let port = match lines.recv_timeout(START) {
        Ok(l) => l
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse::<u16>().ok())
            .unwrap_or_else(|| panic!("not a port announcement: {l}")),
        Err(_) => panic!("the server did not announce its port:\n{}", server.stderr()),
    };
    let _ = server.stderr_shows("Waiting for connection", START);
    (server, port.to_string())
}

/// `p` ended with an error of its own (exit status 1), not a panic or an abort.
fn assert_clean_failure(p: &str, st: ExitStatus, err: &str) {
    assert_eq!(st.code(), Some(1), "the {p} ({st}):\n{err}");
    for bad in ["panicked", "memory allocation of", "abort"] {
        assert!(!err.contains(bad), "the {p} says {bad:?}:\n{err}");
    }
}

/// A client asking for buffers no allocator can give (a petabyte: a message, or message
/// size × window where each receive has a slot, as with `--check`) gets the server's
/// refusal with its reason, instead of a server that aborts and a client that blames a
/// dead peer; the server ends with the same reason. Also in one process (`-l`), and for a
/// one-sided test (the client maps first). (Without `--check` a window of receives lands
/// in one buffer, as in ucx_perftest: a large window costs no memory.)
#[test]
fn a_test_the_server_cannot_allocate_is_refused_with_the_reason() {
    for env in [TCP, DEFAULT] {
        for (test, sizes) in [
            ("tag_lat", &["-s", "1000000g"][..]),
            ("tag_bw", &["-s", "1m", "-O", "1000000000", "--check"][..]),
            ("ucp_am_bw", &["-s", "1000000g"][..]),
        ] {
            let what = format!("{} {test} {sizes:?}", tls_name(env));
            let (mut server, port) = lone_server(env);
            let mut cargs = vec![
                "perf",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                test,
                "-n",
                "10",
                "-w",
                "0",
            ];
            cargs.extend_from_slice(sizes);
            let (mut client, _) = Proc::spawn("client", &cargs, env);
            let (cst, cerr, _) = client.exit_within(START);
            let (sst, serr, _) = server.exit_within(START);
            assert_clean_failure("client", cst, &cerr);
            assert_clean_failure("server", sst, &serr);
            assert!(
                cerr.contains(&format!(
                    "server 127.0.0.1:{port} could not set up the test: cannot allocate"
                )) && cerr.contains("for the message buffers (-s "),
                "{what}: the client's error does not give the server's reason:\n{cerr}"
            );
            assert!(
                !cerr.contains("closed the connection") && !cerr.contains("died"),
                "{what}: the client blames a dead peer:\n{cerr}"
            );
            assert!(
                serr.contains("could not set up the test of client")
                    && serr.contains("cannot allocate"),
                "{what}: the server's error does not give the reason:\n{serr}"
            );
        }
    }
    for args in [
        &["-t", "tag_lat", "-s", "1000000g"][..],
        &["-t", "tag_bw", "-s", "1m", "-O", "1000000000", "--check"],
        &["-t", "ucp_put_bw", "-s", "1000000g"],
        &["-t", "ucp_get", "-s", "1m", "-O", "1000000000"],
    ] {
        let mut a = vec!["perf", "-l", "-n", "10", "-w", "0"];
        a.extend_from_slice(args);
        let (mut p, _) = Proc::spawn("process", &a, TCP);
        let (st, err, _) = p.exit_within(START);
        assert_clean_failure("process", st, &err);
        assert!(
            err.contains("cannot allocate") && err.contains("for the message buffers (-s "),
            "{args:?}: {err}"
        );
    }
}

/// The server's `--verbose` names the transport its client's tests run on, the one the
/// client reports (a client on this host moves from tcp to shared memory by default).
#[test]
fn the_server_names_the_transport_the_client_reports() {
    for env in [TCP, DEFAULT] {
        let (mut server, port) = lone_server(env);
        let (mut client, lines) = Proc::spawn(
            "client",
            &[
                "perf",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                "tag_lat",
                "-n",
                "1000",
                "-w",
                "10",
                "--json",
            ],
            env,
        );
        let (cst, cerr, _) = client.exit_within(START);
        let (sst, serr, _) = server.exit_within(START);
        assert!(cst.success(), "{}: client: {cerr}", tls_name(env));
        assert!(sst.success(), "{}: server: {serr}", tls_name(env));
        let out = lines
            .recv_timeout(START)
            .unwrap_or_else(|_| panic!("the client printed nothing:\n{cerr}"));
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        let transport = v["transport"].as_str().expect("transport").to_string();
        let connected = serr
            .lines()
            .find(|l| l.starts_with("connected: "))
            .unwrap_or_else(|| panic!("the server did not say whom it serves:\n{serr}"));
        assert!(
            connected.ends_with(&format!(" over {transport}")),
            "{}: the client ran over {transport}; the server said: {connected}",
            tls_name(env)
        );
        if env == TCP {
            assert_eq!(transport, "tcp");
        }
    }
}
