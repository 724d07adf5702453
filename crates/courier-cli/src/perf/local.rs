//! `courier perf --local`: the standard suite, both processes started here, per transport.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL};

use super::engine::{self, Link};
use super::params::{self, MemKind, Params, TestKind};
use super::report::{Output, Row};
use super::{PerfArgs, Settings, make_worker};
use crate::error::{CliError, CliResult};

/// A `courier perf` server in a child process.
pub struct ChildServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    stderr: Arc<Mutex<String>>,
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
            .arg(params::thread_mode_name(s.mode));
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
        let mut s = ChildServer {
            child,
            port: 0,
            stderr,
        };
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(p) => {
                s.port = p;
                Ok(s)
            }
            Err(_) => {
                let _ = s.child.kill();
                let _ = s.child.wait();
                std::thread::sleep(Duration::from_millis(50));
                Err(CliError::run(format!(
                    "the server process did not start: {}",
                    s.stderr_text()
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

struct Case {
    test: TestKind,
    size: usize,
    iters: u64,
    warmup: u64,
}

const SUITE: [Case; 10] = [
    Case {
        test: TestKind::TagLat,
        size: 8,
        iters: 20_000,
        warmup: 1_000,
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

struct Outcome {
    tls: &'static str,
    used: Option<&'static str>,
    case: usize,
    result: Result<Row, String>,
}

fn line(tls: &str, c: &Case, r: &Row) -> String {
    format!(
        "{tls:<4} {:<20} {:>7}  {:>9} iters  {:>9.3} us  {:>10.2} MB/s  {:>11.0} msg/s",
        c.test.name(),
        human_size(c.size),
        r.iters,
        r.lat_overall,
        r.bw_overall,
        r.mr_overall
    )
}

/// Run the suite.
pub fn run(_a: &PerfArgs, s: &Settings) -> CliResult<()> {
    let tty = std::io::stdout().is_terminal();
    let quiet = Settings {
        out: Output::Silent,
        ..s.clone()
    };
    let mut outcomes: Vec<Outcome> = Vec::new();
    println!(
        "courier perf --local: {} tests per transport, server and client in two processes",
        SUITE.len()
    );
    for tls in ["shm", "tcp"] {
        let probe = courier::Config::from_env_with(&[("COURIER_TLS", tls)])
            .map_err(CliError::from)
            .and_then(|cfg| {
                if tls == "shm" {
                    courier::transport::shm::probe(&cfg)
                        .map_err(|e| CliError::run(format!("shm is not usable here: {e}")))
                } else {
                    Ok(())
                }
            });
        if let Err(e) = probe {
            for (i, _) in SUITE.iter().enumerate() {
                outcomes.push(Outcome {
                    tls,
                    used: None,
                    case: i,
                    result: Err(e.msg.clone()),
                });
            }
            println!("{tls:<4} skipped: {}", e.msg);
            continue;
        }
        let mut session: Option<(ChildServer, Link)> = None;
        for (i, c) in SUITE.iter().enumerate() {
            if session.is_none() {
                let started = ChildServer::spawn(Some(tls), &quiet).and_then(|srv| {
                    match srv.connect(Some(tls), courier::ThreadMode::Single) {
                        Ok(l) => Ok((srv, l)),
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
                        println!(
                            "{tls:<4} {:<20} {:>7}  error: {}",
                            c.test.name(),
                            human_size(c.size),
                            e.msg
                        );
                        outcomes.push(Outcome {
                            tls,
                            used: None,
                            case: i,
                            result: Err(e.msg),
                        });
                        continue;
                    }
                }
            }
            let (srv, link) = session.as_ref().expect("just set");
            let p = Params {
                test: c.test,
                sizes: vec![c.size],
                iters: c.iters,
                warmup: c.warmup,
                window: c.test.default_window(),
                check: false,
                mem: [MemKind::Host; 2],
            };
            let mut watch = |r: &Row| {
                if tty {
                    print!("\r{}", line(tls, c, r));
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
                    println!(
                        "{}{}",
                        if tty { "\r\x1b[2K" } else { "" },
                        line(tls, c, &row)
                    );
                    outcomes.push(Outcome {
                        tls,
                        used,
                        case: i,
                        result: Ok(row),
                    });
                }
                Err(e) => {
                    let more = srv.stderr_text();
                    let msg = if more.is_empty() {
                        e.msg
                    } else {
                        format!("{} (server: {more})", e.msg)
                    };
                    println!(
                        "{}{tls:<4} {:<20} {:>7}  error: {msg}",
                        if tty { "\r\x1b[2K" } else { "" },
                        c.test.name(),
                        human_size(c.size)
                    );
                    outcomes.push(Outcome {
                        tls,
                        used,
                        case: i,
                        result: Err(msg),
                    });
                    session = None;
                }
            }
        }
        if let Some((srv, link)) = session.take() {
            engine::client_finish(link);
            if let Err(e) = srv.finish(Duration::from_secs(5)) {
                println!("{tls:<4} note: {}", e.msg);
            }
        }
    }
    print_summary(&outcomes);
    if outcomes.iter().all(|o| o.result.is_err()) {
        return Err(CliError::run("every test failed"));
    }
    Ok(())
}

fn print_summary(outcomes: &[Outcome]) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic);
    t.set_header(vec![
        "Transport",
        "Test",
        "Size",
        "Latency (µs)",
        "Bandwidth (MB/s)",
        "Msg rate (msg/s)",
    ]);
    for o in outcomes {
        let c = &SUITE[o.case];
        let tr = match o.used {
            Some(u) if u != o.tls => format!("{} (got {u})", o.tls),
            _ => o.tls.to_string(),
        };
        let mut row = vec![
            Cell::new(tr),
            Cell::new(c.test.name()),
            Cell::new(human_size(c.size)).set_alignment(CellAlignment::Right),
        ];
        match &o.result {
            Ok(r) => {
                row.push(
                    Cell::new(format!("{:.3}", r.lat_overall)).set_alignment(CellAlignment::Right),
                );
                row.push(
                    Cell::new(format!("{:.2}", r.bw_overall)).set_alignment(CellAlignment::Right),
                );
                row.push(
                    Cell::new(format!("{:.0}", r.mr_overall)).set_alignment(CellAlignment::Right),
                );
            }
            Err(e) => {
                row.push(Cell::new(format!("error: {e}")));
                row.push(Cell::new("-"));
                row.push(Cell::new("-"));
            }
        }
        t.add_row(row);
    }
    println!();
    println!("{t}");
    println!(
        "Latency: one-way for *_lat (RTT/2), per-message overhead for *_bw. MB/s = 2^20 bytes/s."
    );
}
