//! `courier perf --local`: the standard suite, both processes started here, per transport.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::engine::{self, Link};
use super::params::{self, MemKind, Params, TestKind};
use super::report::{self, Output, Row};
use super::{PerfArgs, Settings, make_worker};
use crate::error::{CliError, CliResult};

/// A `courier perf` server in a child process.
pub struct ChildServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    stderr: Arc<Mutex<String>>,
    /// The `--peer-timeout` both sides use.
    peer_timeout: Duration,
}

impl ChildServer {
    /// Start `courier perf -p 0 --announce` with COURIER_TLS=`tls` (None: inherit), its
    /// worker in `s.mode`, pinned per `s.server_cpu()` (else free to run wherever this
    /// process could when it started, whatever the calling thread is pinned to).
    pub fn spawn(tls: Option<&str>, s: &Settings) -> CliResult<ChildServer> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::run(format!("cannot find this program: {e}")))?;
        let mut cmd = Command::new(exe);
        cmd.args(["perf", "-p", "0", "--announce", "-M"])
            .arg(params::thread_mode_name(s.mode))
            .arg("--peer-timeout")
            .arg(if s.peer_timeout == Duration::MAX {
                "inf".to_string()
            } else {
                format!("{}ms", s.peer_timeout.as_millis())
            });
        match s.server_cpu() {
            Some(c) => {
                cmd.arg("-c").arg(c.to_string());
            }
            None if !s.start_cpus.is_empty() => {
                cmd.arg("--affinity").arg(params::cpu_list(&s.start_cpus));
            }
            None => {}
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = tls {
            cmd.env("COURIER_TLS", t);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CliError::run(format!("cannot start the server process: {e}")))?;
        let out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let s2 = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s2.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(out).lines();
            while let Some(Ok(l)) = lines.next() {
                if let Some(p) = l
                    .strip_prefix("PORT ")
                    .and_then(|p| p.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(p);
                }
            }
        });
        let mut srv = ChildServer {
            child,
            port: 0,
            stderr,
            peer_timeout: s.peer_timeout,
        };
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(p) => {
                srv.port = p;
                Ok(srv)
            }
            Err(_) => {
                let _ = srv.child.kill();
                let _ = srv.child.wait();
                std::thread::sleep(Duration::from_millis(50));
                Err(CliError::run(format!(
                    "the server process did not start: {}",
                    srv.stderr_text()
                )))
            }
        }
    }

    /// What the server wrote on stderr, minus the banner.
    pub fn stderr_text(&self) -> String {
        let s = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.lines()
            .filter(|l| !l.contains("Waiting for connection"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Wait for it to exit (it does after the session), killing it after `limit`.
    pub fn finish(mut self, limit: Duration) -> CliResult<()> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    return Err(CliError::run(format!(
                        "server process exited with {st}: {}",
                        self.stderr_text()
                    )));
                }
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(CliError::run("server process did not exit; killed"));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    return Err(CliError::run(format!(
                        "waiting for the server process: {e}"
                    )));
                }
            }
        }
    }

    /// Connect a client worker in `mode` with COURIER_TLS=`tls` to it.
    pub fn connect(&self, tls: Option<&str>, mode: courier::ThreadMode) -> CliResult<Link> {
        let worker = make_worker(mode, tls)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        engine::connect(
            &worker,
            addr,
            &format!("127.0.0.1:{} (pid {})", self.port, self.child.id()),
            self.peer_timeout,
        )
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The transports of the suite that COURIER_TLS allows (both without it), in the suite's
/// order; refused when it allows neither (`self` alone connects no two processes).
pub(super) fn two_process_transports() -> CliResult<Vec<&'static str>> {
    let cfg = courier::Config::from_env().map_err(CliError::from)?;
    let allowed: Vec<&'static str> = ["shm", "tcp"]
        .into_iter()
        .filter(|t| cfg.tls.allows(t))
        .collect();
    if allowed.is_empty() {
        return Err(CliError::usage(format!(
            "COURIER_TLS={}: --local and --sweep run client and server in two processes, which \
             only shm or tcp connect (self connects endpoints within one process)",
            cfg.tls.spec
        )));
    }
    Ok(allowed)
}

/// A message size for people: 8 B, 64 KiB, 1 MiB.
pub fn human_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Case {
    test: TestKind,
    size: usize,
    iters: u64,
    warmup: u64,
}

const SUITE: [Case; 11] = [
    Case {
        test: TestKind::TagLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::TagLat,
        size: 1 << 20,
        iters: 2_000,
        warmup: 100,
    },
    Case {
        test: TestKind::TagBw,
        size: 8,
        iters: 200_000,
        warmup: 10_000,
    },
    Case {
        test: TestKind::TagBw,
        size: 1 << 20,
        iters: 1_000,
        warmup: 50,
    },
    Case {
        test: TestKind::AmLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::StreamBw,
        size: 64 << 10,
        iters: 10_000,
        warmup: 500,
    },
    Case {
        test: TestKind::PutLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::Fadd,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::PutSignalLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::PutFlushSignalLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
    },
    Case {
        test: TestKind::PutBw,
        size: 1 << 20,
        iters: 1_000,
        warmup: 50,
    },
];

/// Options that mean nothing to `--local` (it starts its servers and picks each test's
/// size, window and memory itself), by clap id, with how to name them and why.
const NOT_WITH_LOCAL: [(&str, &str, &str); 14] = [
    (
        "host",
        "HOST",
        "--local starts its own server processes (drop --local to run one test against HOST)",
    ),
    (
        "port",
        "-p",
        "--local's servers listen on ports the system picks",
    ),
    (
        "loopback",
        "-l",
        "--local already runs client and server here, in two processes",
    ),
    ("size", "-s", "the suite sets each test's message size"),
    (
        "outstanding",
        "-O",
        "the suite uses each test's default window",
    ),
    ("mem", "-m", "the suite runs on host memory"),
    ("layout", "-D", "the suite sends contiguous messages"),
    (
        "final_only",
        "-f",
        "--local prints a summary table (or JSON lines with --json)",
    ),
    (
        "csv",
        "-v",
        "--local prints a summary table (or JSON lines with --json)",
    ),
    ("max_size", "--max-size", "it belongs to --sweep"),
    ("pairs", "--pairs", "it belongs to --sweep"),
    ("quick", "--quick", "it belongs to --sweep"),
    ("verbose", "--verbose", "it is a server option"),
    ("announce", "--announce", "it is a server option"),
];

/// The suite's rows as `a` asks: those of the tests in `-t` (a comma list), every one
/// without it; `-n` replaces each row's iteration count and scales its warm-up alike,
/// unless `-w` gives the warm-up.
fn plan(a: &PerfArgs) -> CliResult<Vec<Case>> {
    for (id, flag, why) in NOT_WITH_LOCAL {
        if a.given(id) {
            return Err(CliError::usage(format!(
                "{flag} cannot be used with --local: {why}; with --local use -t, -n, -w, -c, \
                 -M, -R, -N, --json and --check"
            )));
        }
    }
    let mut cases: Vec<Case> = match a.test.as_deref().filter(|_| a.given("test")) {
        None => SUITE.to_vec(),
        Some(list) => {
            let mut want = Vec::new();
            for name in list.split(',').map(str::trim) {
                if name.is_empty() {
                    return Err(CliError::usage(format!(
                        "-t {list:?}: expected test names separated by commas"
                    )));
                }
                let t = TestKind::parse(name)?;
                if !SUITE.iter().any(|c| c.test == t) {
                    let mut names: Vec<&str> = SUITE.iter().map(|c| c.test.name()).collect();
                    names.dedup();
                    return Err(CliError::usage(format!(
                        "-t {name}: not in the --local suite; its tests: {}",
                        names.join(", ")
                    )));
                }
                want.push(t);
            }
            SUITE
                .iter()
                .filter(|c| want.contains(&c.test))
                .copied()
                .collect()
        }
    };
    let iters = if a.given("iters") {
        let n = params::parse_count("-n", &a.iters)?;
        if n == 0 {
            return Err(CliError::usage(
                "-n 0: every test of --local needs at least one iteration",
            ));
        }
        Some(n)
    } else {
        None
    };
    let warmup = if a.given("warmup") {
        Some(params::parse_count("-w", &a.warmup)?)
    } else {
        None
    };
    for c in &mut cases {
        if let Some(n) = iters {
            // The suite's warm-up share of the row, at least one iteration.
            let scaled = (c.warmup as u128 * n as u128).div_ceil(c.iters as u128);
            c.warmup = u64::try_from(scaled).unwrap_or(u64::MAX).max(1);
            c.iters = n;
        }
        if let Some(w) = warmup {
            c.warmup = params::warmup_run(w, c.iters);
        }
        if c.iters.checked_add(c.warmup).is_none() {
            return Err(CliError::usage(format!(
                "-n {} -w {}: {}'s iterations plus warm-up exceed {}",
                c.iters,
                c.warmup,
                c.test.name(),
                u64::MAX
            )));
        }
    }
    Ok(cases)
}

struct Outcome {
    tls: &'static str,
    used: Option<&'static str>,
    case: usize,
    result: Result<Row, String>,
    /// The row failed because its transport is not usable here (probed before the run),
    /// not because its run failed.
    skipped: bool,
}

fn line(tls: &str, used: Option<&str>, c: &Case, r: &Row, thousands: bool) -> String {
    format!(
        "{tls:<4} {:<20} {:>7}  {:>9} iters  {:>9.3} us  {:>10.2} MB/s  {:>11} msg/s{}",
        c.test.name(),
        human_size(c.size),
        report::group(r.iters as f64, thousands),
        r.lat_overall,
        r.bw_overall,
        report::group(r.mr_overall, thousands),
        match used {
            Some(u) if u != tls => format!("  (over {u})"),
            _ => String::new(),
        }
    )
}

/// Where `--local` prints: its table and progress on stdout, or with `--json` one JSON
/// object per line on stdout and its remarks on stderr.
struct Out {
    json: bool,
    tty: bool,
}

impl Out {
    /// A remark (a transport skipped, a row that failed, a server that lingered).
    fn say(&self, text: &str) {
        if self.json {
            eprintln!("courier perf --local: {text}");
        } else {
            println!("{}{text}", if self.tty { "\r\x1b[2K" } else { "" });
        }
    }
}

fn error_json(tls: &str, c: &Case, msg: &str) -> serde_json::Value {
    serde_json::json!({
        "tls": tls,
        "test": c.test.name(),
        "message_size": c.size,
        "error": msg,
    })
}

/// Run the suite.
pub fn run(a: &PerfArgs, s: &Settings) -> CliResult<()> {
    let cases = plan(a)?;
    let transports = two_process_transports()?;
    let out = Out {
        json: s.out == Output::Json,
        tty: s.out != Output::Json && std::io::stdout().is_terminal(),
    };
    let tty = out.tty;
    let quiet = Settings {
        out: Output::Silent,
        ..s.clone()
    };
    s.note_one_cpu();
    s.pin_client()?;
    let mut outcomes: Vec<Outcome> = Vec::new();
    if !out.json {
        println!(
            "courier perf --local: {} tests per transport, server and client in two processes",
            cases.len()
        );
        println!(
            "courier perf --local: latency is one-way for *_lat (RTT/2), per-message overhead \
             for *_bw; MB/s = 2^20 bytes/s"
        );
        if a.given("cpus") || a.given("thread_mode") {
            let at = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("CPU {c}"));
            println!(
                "courier perf --local: thread mode {}; client on {}, server on {}",
                params::thread_mode_name(s.mode),
                at(s.cpus.first().copied()),
                at(s.server_cpu())
            );
        }
    }
    if let [only] = transports[..] {
        out.say(&format!(
            "only {only}: COURIER_TLS excludes {}",
            if only == "shm" { "tcp" } else { "shm" }
        ));
    }
    for tls in transports {
        let probe = courier::Config::from_env_with(&[("COURIER_TLS", tls)])
            .map_err(CliError::from)
            .and_then(|cfg| {
                if tls == "shm" {
                    courier::probe_transport(&cfg, "shm")
                        .map_err(|e| CliError::run(format!("shm is not usable here: {e}")))
                } else {
                    Ok(())
                }
            });
        if let Err(e) = probe {
            for (i, c) in cases.iter().enumerate() {
                if out.json {
                    println!("{}", error_json(tls, c, &e.msg));
                }
                outcomes.push(Outcome {
                    tls,
                    used: None,
                    case: i,
                    result: Err(e.msg.clone()),
                    skipped: true,
                });
            }
            out.say(&format!("{tls:<4} skipped: {}", e.msg));
            continue;
        }
        // The server process, the link to it, and (for --json) where each side runs.
        let mut session: Option<(ChildServer, Link, serde_json::Value)> = None;
        for (i, c) in cases.iter().enumerate() {
            if session.is_none() {
                let started = ChildServer::spawn(Some(tls), s).and_then(|srv| {
                    let linked = srv.connect(Some(tls), s.mode).and_then(|l| {
                        let sides = if out.json {
                            engine::sides(&l)?
                        } else {
                            serde_json::Value::Null
                        };
                        Ok((l, sides))
                    });
                    match linked {
                        Ok((l, sides)) => Ok((srv, l, sides)),
                        Err(e) => {
                            std::thread::sleep(Duration::from_millis(100));
                            let more = srv.stderr_text();
                            Err(CliError::run(if more.is_empty() {
                                e.msg
                            } else {
                                format!("{} (server: {more})", e.msg)
                            }))
                        }
                    }
                });
                match started {
                    Ok(x) => session = Some(x),
                    Err(e) => {
                        if out.json {
                            println!("{}", error_json(tls, c, &e.msg));
                        }
                        out.say(&format!(
                            "{tls:<4} {:<20} {:>7}  error: {}",
                            c.test.name(),
                            human_size(c.size),
                            e.msg
                        ));
                        outcomes.push(Outcome {
                            tls,
                            used: None,
                            case: i,
                            result: Err(e.msg),
                            skipped: false,
                        });
                        continue;
                    }
                }
            }
            let Some((srv, link, sides)) = session.as_ref() else {
                continue;
            };
            let p = Params {
                test: c.test,
                sizes: vec![c.size],
                iters: c.iters,
                warmup: c.warmup,
                window: c.test.default_window(),
                check: a.check,
                mem: [MemKind::Host; 2],
            };
            let mut watch = |r: &Row| {
                if tty {
                    print!("\r{}", line(tls, None, c, r, s.thousands));
                    let _ = std::io::stdout().flush();
                }
            };
            if tty {
                print!(
                    "\r{tls:<4} {:<20} {:>7}  running...",
                    c.test.name(),
                    human_size(c.size)
                );
                let _ = std::io::stdout().flush();
            }
            let r = super::run_test(link, &p, &quiet, Some(&mut watch));
            let used = link.ep.transport();
            match r {
                Ok(row) => {
                    if out.json {
                        let mut v = report::json(&p, s.percentile, &row, used);
                        v["tls"] = tls.into();
                        engine::add_sides(&mut v, sides);
                        println!("{v}");
                    } else {
                        println!(
                            "{}{}",
                            if tty { "\r\x1b[2K" } else { "" },
                            line(tls, used, c, &row, s.thousands)
                        );
                    }
                    outcomes.push(Outcome {
                        tls,
                        used,
                        case: i,
                        result: Ok(row),
                        skipped: false,
                    });
                }
                Err(e) => {
                    let more = srv.stderr_text();
                    let msg = if more.is_empty() {
                        e.msg
                    } else {
                        format!("{} (server: {more})", e.msg)
                    };
                    if out.json {
                        println!("{}", error_json(tls, c, &msg));
                    }
                    out.say(&format!(
                        "{tls:<4} {:<20} {:>7}  error: {msg}",
                        c.test.name(),
                        human_size(c.size)
                    ));
                    outcomes.push(Outcome {
                        tls,
                        used,
                        case: i,
                        result: Err(msg),
                        skipped: false,
                    });
                    session = None;
                }
            }
        }
        if let Some((srv, link, _)) = session.take() {
            engine::client_finish(link);
            if let Err(e) = srv.finish(Duration::from_secs(5)) {
                out.say(&format!("{tls:<4} note: {}", e.msg));
            }
        }
    }
    if out.json {
        println!("{}", summary_json(&cases, &outcomes));
    } else {
        println!("{}", summary_line(&outcomes));
    }
    if outcomes.iter().all(|o| o.result.is_err()) {
        return Err(CliError::run("every test failed"));
    }
    // A transport this machine lacks is a note; a test that failed on one it has (a server
    // that died, a check that failed) fails the run, so that a script sees it.
    let failed = outcomes
        .iter()
        .filter(|o| o.result.is_err() && !o.skipped)
        .count();
    if failed > 0 {
        return Err(CliError::run(format!(
            "{failed} of {} tests failed (see the rows marked error)",
            outcomes.iter().filter(|o| !o.skipped).count()
        )));
    }
    Ok(())
}

/// The summary table's rows as one JSON object (`--json`).
fn summary_json(cases: &[Case], outcomes: &[Outcome]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            let c = &cases[o.case];
            let mut v = serde_json::json!({
                "tls": o.tls,
                "transport": o.used,
                "test": c.test.name(),
                "message_size": c.size,
                "iterations": c.iters,
            });
            match &o.result {
                Ok(r) => {
                    v["latency_overall_us"] = r.lat_overall.into();
                    v["bandwidth_overall_mbs"] = r.bw_overall.into();
                    v["msgrate_overall"] = r.mr_overall.into();
                }
                Err(e) => v["error"] = e.as_str().into(),
            }
            v
        })
        .collect();
    let ok = outcomes.iter().filter(|o| o.result.is_ok()).count();
    serde_json::json!({
        "summary": {
            "tests_per_transport": cases.len(),
            "passed": ok,
            "failed": outcomes.len() - ok,
            "rows": rows,
        }
    })
}

/// The last line of the text output: how many of the tests that ran passed (a transport
/// this machine lacks runs none; its rows said so).
fn summary_line(outcomes: &[Outcome]) -> String {
    let ran = outcomes.iter().filter(|o| !o.skipped).count();
    let passed = outcomes.iter().filter(|o| o.result.is_ok()).count();
    let skipped = outcomes.len() - ran;
    let mut t = format!("{passed} of {ran} tests passed");
    if skipped > 0 {
        t.push_str(&format!(
            " ({skipped} skipped: a transport this machine lacks)"
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        a: PerfArgs,
    }

    fn args(v: &[&str]) -> PerfArgs {
        let m = Cmd::command().get_matches_from(std::iter::once("perf").chain(v.iter().copied()));
        let mut a = Cmd::from_arg_matches(&m).expect("parsed").a;
        a.given = super::super::given_ids(&m);
        a
    }

    #[test]
    fn the_suite_has_large_message_latency() {
        let all = plan(&args(&["--local"])).unwrap();
        assert_eq!(all, SUITE.to_vec());
        assert!(
            all.iter()
                .any(|c| c.test == TestKind::TagLat && c.size == 1 << 20)
        );
    }

    #[test]
    fn t_picks_rows_and_n_w_set_the_counts() {
        let p = plan(&args(&["--local", "-n", "2000", "-t", "tag_bw, tag_lat"])).unwrap();
        let rows: Vec<(TestKind, usize, u64, u64)> = p
            .iter()
            .map(|c| (c.test, c.size, c.iters, c.warmup))
            .collect();
        assert_eq!(
            rows,
            vec![
                (TestKind::TagLat, 8, 2000, 100),
                (TestKind::TagLat, 1 << 20, 2000, 100),
                (TestKind::TagBw, 8, 2000, 100),
                (TestKind::TagBw, 1 << 20, 2000, 100),
            ]
        );
        // Given, even at its default value, -n replaces the suite's counts.
        let p = plan(&args(&["--local", "-n", "1000000", "-t", "ucp_fadd"])).unwrap();
        assert_eq!((p[0].iters, p[0].warmup), (1_000_000, 50_000));
        let p = plan(&args(&[
            "--local",
            "-n",
            "3",
            "-w",
            "7",
            "-t",
            "ucp_put_bw",
        ]))
        .unwrap();
        // -w as in ucx_perftest: at most a tenth of -n, rounded up, is run.
        assert_eq!((p[0].iters, p[0].warmup), (3, 1));
        let p = plan(&args(&[
            "--local", "-n", "1000", "-w", "7", "-t", "tag_lat",
        ]))
        .unwrap();
        assert_eq!(p.iter().map(|c| c.warmup).collect::<Vec<_>>(), [7, 7]);
        let p = plan(&args(&["--local", "-n", "1", "-t", "ucp_put_bw"])).unwrap();
        assert_eq!((p[0].iters, p[0].warmup), (1, 1));
        let p = plan(&args(&["--local", "-w", "0", "-t", "ucp_am_lat"])).unwrap();
        assert_eq!((p[0].iters, p[0].warmup), (20_000, 0));
    }

    #[test]
    fn options_local_cannot_honour_are_refused() {
        for (v, want) in [
            (
                &["--local", "-s", "64"][..],
                "-s cannot be used with --local",
            ),
            (&["--local", "10.0.0.1"], "HOST cannot be used with --local"),
            (&["--local", "-O", "4"], "-O cannot be used with --local"),
            (&["--local", "-m", "host"], "-m cannot be used with --local"),
            (&["--local", "-f"], "-f cannot be used with --local"),
            (&["--local", "-v"], "-v cannot be used with --local"),
            (&["--local", "-l"], "-l cannot be used with --local"),
            (&["--local", "-p", "1"], "-p cannot be used with --local"),
            (&["--local", "--pairs", "3"], "--pairs cannot be used"),
            (&["--local", "-t", "ucp_get"], "not in the --local suite"),
            (&["--local", "-t", "nope"], "unknown test"),
            (&["--local", "-t", "tag_lat,"], "separated by commas"),
            (&["--local", "-n", "0"], "at least one iteration"),
            (&["--local", "-n", "many"], "-n \"many\""),
            (
                &["--local", "-n", "18446744073709551615", "-w", "1"],
                "iterations plus warm-up exceed",
            ),
            (
                &["--local", "-n", "18446744073709551615", "-t", "tag_lat"],
                "iterations plus warm-up exceed",
            ),
        ] {
            let e = plan(&args(v)).unwrap_err();
            assert_eq!(e.code, 2, "{v:?}");
            assert!(e.msg.contains(want), "{v:?}: {}", e.msg);
        }
    }
}
