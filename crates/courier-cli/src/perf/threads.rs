//! `-T N`: a two-sided test in N client threads at once, as ucx_perftest runs it.
//!
//! Like ucx_perftest (which makes one UCP worker per thread on a shared context), every
//! thread has its own worker and its own endpoint to the server, and the server answers
//! each on a thread, worker and endpoint of its own. Sharing one worker would not measure
//! threads: Courier's tag matching and progress belong to the worker, so the threads would
//! receive one another's messages and take turns at its lock.
//!
//! Thread 0 connects first and asks the server for the other threads' links (their ports
//! come back with the "ok"); then every thread asks for the test on its own link. Once all
//! are ready the header is printed and they start together. Each prints its rows as
//! `[thread k]` (in CSV, `k` in a first column); the last row aggregates them as
//! ucx_perftest does (`report::Aggregate`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, mpsc};

use super::engine::{self, Link};
use super::params::Params;
use super::report::{self, Aggregate, Meter, Output, Row};
use super::{Settings, make_worker};
use crate::error::{CliError, CliResult};

/// Where the threads wait for one another before they start measuring.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    ready: usize,
    go: bool,
    failed: bool,
}

/// Said by a thread that stopped because another one failed.
const OTHER_FAILED: &str = "another thread failed";

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A thread is ready; wait until all are and the run starts (or one failed).
    fn ready_and_wait(&self) -> CliResult<()> {
        let mut g = self.lock();
        g.ready += 1;
        self.cv.notify_all();
        while !g.go && !g.failed {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if g.go {
            Ok(())
        } else {
            Err(CliError::run(OTHER_FAILED))
        }
    }

    /// The coordinator: wait until `n` threads are ready (false if one failed first).
    fn all_ready(&self, n: usize) -> bool {
        let mut g = self.lock();
        while g.ready < n && !g.failed {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        !g.failed
    }

    fn open(&self) {
        self.lock().go = true;
        self.cv.notify_all();
    }

    fn fail(&self) {
        self.lock().failed = true;
        self.cv.notify_all();
    }
}

/// Fails the gate if its thread panics, so that the others and the coordinator, who wait
/// at the gate for it, go on.
struct FailOnPanic<'a>(&'a Gate);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// What one thread measured.
struct Done {
    row: Row,
    transport: Option<&'static str>,
    /// With `--json`: where its client and server threads ran (`engine::sides`).
    sides: Option<serde_json::Value>,
}

/// One thread: ask for the test on `link`, wait for the others, run it, close. A failure
/// lets the threads waiting at the gate go.
fn run_one(link: Link, k: usize, p: &Params, s: &Settings, gate: &Gate) -> CliResult<Done> {
    let _guard = FailOnPanic(gate);
    let r = (|| {
        let side = engine::client_start(&link, p)?;
        gate.ready_and_wait()?;
        let mut meter = Meter::new(p, s.percentile, s.out, s.thousands, None).for_thread(k);
        let row = engine::run_client(&link, p, &mut meter, side)?;
        let sides = if s.out == Output::Json {
            Some(engine::sides(&link)?)
        } else {
            None
        };
        Ok((row, sides))
    })();
    match r {
        Ok((row, sides)) => {
            let transport = link.ep.transport();
            engine::client_finish(link);
            Ok(Done {
                row,
                transport,
                sides,
            })
        }
        Err(e) => {
            gate.fail();
            Err(e)
        }
    }
}

/// Run `p` in `s.threads` threads against the server at `addr` (shown as `shown`).
pub fn run_client(p: &Params, s: &Settings, addr: SocketAddr, shown: &str) -> CliResult<()> {
    let n = s.threads;
    let gate = Arc::new(Gate::default());
    let (ports_tx, ports_rx) = mpsc::channel::<CliResult<Vec<u16>>>();
    let mut handles = Vec::with_capacity(n);
    // Thread 0: the first link, which also asks for the others'.
    {
        let (p, s, gate, shown) = (p.clone(), s.clone(), gate.clone(), shown.to_string());
        handles.push(spawn(0, move || {
            let first = s
                .client_cpus()
                .pin(0)
                .and_then(|()| make_worker(s.mode, None))
                .and_then(|w| engine::connect(&w, addr, &shown, s.peer_timeout))
                .and_then(|l| engine::client_threads(&l, n).map(|ports| (l, ports)));
            let link = match first {
                Ok((l, ports)) => {
                    let _ = ports_tx.send(Ok(ports));
                    l
                }
                Err(e) => {
                    gate.fail();
                    let _ = ports_tx.send(Err(CliError::run(e.msg.clone())));
                    return Err(e);
                }
            };
            run_one(link, 0, &p, &s, &gate)
        })?);
    }
    let ports = match ports_rx.recv() {
        Ok(Ok(ports)) => ports,
        Ok(Err(_)) | Err(_) => {
            return Err(collect(handles, &gate)
                .err()
                .unwrap_or_else(|| CliError::run("thread 0 ended before it connected")));
        }
    };
    for (i, port) in ports.into_iter().enumerate() {
        let k = i + 1;
        let (p, s, g) = (p.clone(), s.clone(), gate.clone());
        let at = SocketAddr::new(addr.ip(), port);
        let name = format!("{} (port {port}, thread {k})", shown);
        let h = spawn(k, move || {
            let link = s
                .client_cpus()
                .pin(k)
                .and_then(|()| make_worker(s.mode, None))
                .and_then(|w| engine::connect(&w, at, &name, s.peer_timeout))
                .inspect_err(|_| g.fail())?;
            run_one(link, k, &p, &s, &g)
        });
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                gate.fail();
                let _ = collect(handles, &gate);
                return Err(e);
            }
        }
    }
    if gate.all_ready(n) {
        let mem = p.mem.map(|k| k.name().to_string());
        let head = if matches!(s.out, Output::Csv | Output::CsvFinal) {
            // Rows of several threads: a thread column first.
            report::csv_header(s.percentile, true)
        } else {
            report::header(p, s.percentile, s.out, &mem)
        };
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(head.as_bytes());
        let _ = o.flush();
        drop(o);
        gate.open();
    }
    let done = collect(handles, &gate)?;
    let rows: Vec<Row> = done.iter().map(|d| d.row).collect();
    let agg = Aggregate::of(&rows);
    if s.out == Output::Json {
        let per: Vec<serde_json::Value> = done
            .iter()
            .enumerate()
            .map(|(k, d)| {
                let mut v = report::json(p, s.percentile, &d.row, d.transport);
                v["thread"] = k.into();
                if let Some(sides) = &d.sides {
                    engine::add_sides(&mut v, sides);
                }
                v
            })
            .collect();
        let v = serde_json::json!({
            "test": p.test.name(),
            "message_size": p.msg_size(),
            "threads": n,
            "iterations": agg.iters,
            "latency_overall_us": agg.lat_overall,
            "bandwidth_overall_mbs": agg.bw_overall,
            "msgrate_overall": agg.mr_overall,
            "transport": done.first().and_then(|d| d.transport),
            "per_thread": per,
        });
        println!("{v}");
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(report::format_aggregate(&agg, s.out, s.thousands).as_bytes());
        let _ = o.flush();
    }
    Ok(())
}

type Handle = std::thread::JoinHandle<CliResult<Done>>;

fn spawn(k: usize, f: impl FnOnce() -> CliResult<Done> + Send + 'static) -> CliResult<Handle> {
    std::thread::Builder::new()
        .name(format!("perf-client-{k}"))
        .spawn(f)
        .map_err(|e| CliError::run(format!("cannot start client thread {k}: {e}")))
}

/// Join every thread (a failed one makes the others that wait for it stop); all results,
/// or the first real failure (not a thread that stopped because of it), with its thread.
fn collect(handles: Vec<Handle>, gate: &Gate) -> CliResult<Vec<Done>> {
    // A thread that fails lets the others go at once instead of after their own errors.
    let mut out = Vec::with_capacity(handles.len());
    let mut first: Option<CliError> = None;
    let mut other = false;
    for (k, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(d)) => out.push(d),
            Ok(Err(e)) => {
                gate.fail();
                if e.msg == OTHER_FAILED {
                    other = true;
                } else if first.is_none() {
                    first = Some(CliError {
                        code: e.code,
                        msg: format!("thread {k}: {}", e.msg),
                    });
                }
            }
            Err(_) => {
                gate.fail();
                first.get_or_insert_with(|| CliError::run(format!("thread {k} panicked")));
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None if other => Err(CliError::run(OTHER_FAILED)),
        None => Ok(out),
    }
}
