//! Sessions: the control exchange that starts each test (client side) and the server that
//! answers a client's tests, its `info` and `threads` requests, until it says done.

use crate::perf::clock::Instant;
use std::net::SocketAddr;
use std::time::Duration;

use courier::Worker;

use super::link::{Link, accept};
use super::twosided::{Buffers, recv_slots, run_server, setup_am};
use super::{AM_ALIVE, AM_PING, CTRL_MAX, TAG_ACK, TAG_CTRL};
use crate::error::{CliError, CliResult};
use crate::perf::params::Params;
use crate::perf::rma;

/// Ask the server to run `p`; returns once it is ready. For one-sided tests this maps the
/// client's memory and exchanges remote keys (the client's go with the parameters, the
/// server's come back with its "ok").
pub fn client_start(link: &Link, p: &Params) -> CliResult<Option<rma::Side>> {
    let mut side = if p.test.is_rma() {
        Some(rma::Side::map(link, p, p.mem[0])?)
    } else {
        None
    };
    let mut msg = p.to_json();
    if let Some(s) = &side {
        msg["rkey"] = serde_json::Value::String(s.packed_hex()?);
    }
    let reply = link.request(msg.to_string().as_bytes())?;
    let extra = match reply.strip_prefix("ok") {
        Some("") => None,
        Some(rest) if rest.starts_with(' ') => Some(rest.trim()),
        _ => {
            return Err(CliError::run(format!(
                "server {} could not set up the test: {reply}",
                link.peer
            )));
        }
    };
    if let Some(s) = side.as_mut() {
        let v: serde_json::Value = extra
            .and_then(|e| serde_json::from_str(e).ok())
            .ok_or_else(|| {
                CliError::run(format!(
                    "server {} sent no remote key for {}",
                    link.peer,
                    p.test.name()
                ))
            })?;
        s.attach_peer(link, &v)?;
    }
    Ok(side)
}

/// Where the calling thread's side of a test runs: process, worker thread mode and the
/// CPUs the thread may use.
pub fn side_info(worker: &Worker) -> serde_json::Value {
    serde_json::json!({
        "pid": std::process::id(),
        "thread_mode": crate::perf::params::thread_mode_name(worker.thread_mode()),
        "cpus": crate::perf::params::affinity().unwrap_or_default(),
    })
}

/// Where both sides of `link` run, as found by each: `{"client": .., "server": ..}`.
pub fn sides(link: &Link) -> CliResult<serde_json::Value> {
    Ok(serde_json::json!({
        "client": side_info(&link.worker),
        "server": peer_info(link)?,
    }))
}

/// Put the `client` and `server` of `sides` (from `sides`) into the JSON row `v`.
pub fn add_sides(v: &mut serde_json::Value, sides: &serde_json::Value) {
    for k in ["client", "server"] {
        v[k] = sides[k].clone();
    }
}

/// Ask the server where its side runs (`side_info` of its serving thread).
pub fn peer_info(link: &Link) -> CliResult<serde_json::Value> {
    let reply = link.request(br#"{"op":"info"}"#)?;
    reply
        .strip_prefix("ok ")
        .and_then(|j| serde_json::from_str(j).ok())
        .ok_or_else(|| {
            CliError::run(format!(
                "server {} did not say where it runs: {reply}",
                link.peer
            ))
        })
}

/// Ask the server for the links of a client's threads 1..n (`-T n`); returns their ports
/// on the server's host.
pub fn client_threads(link: &Link, n: usize) -> CliResult<Vec<u16>> {
    let msg = serde_json::json!({ "op": "threads", "n": n });
    let reply = link.request(msg.to_string().as_bytes())?;
    let ports: Option<Vec<u16>> = reply
        .strip_prefix("ok ")
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .and_then(|v| {
            v["ports"].as_array().map(|a| {
                a.iter()
                    .filter_map(|p| p.as_u64().and_then(|p| u16::try_from(p).ok()))
                    .collect()
            })
        });
    match ports {
        Some(p) if p.len() + 1 == n && !p.contains(&0) => Ok(p),
        _ => Err(CliError::run(format!(
            "server {} cannot serve {n} threads: {reply}",
            link.peer
        ))),
    }
}

/// Tell the server the session is over and close.
pub fn client_finish(link: Link) {
    let _ = link.send_ctrl(TAG_CTRL, br#"{"op":"done"}"#);
    let _ = link.ep.close();
}

/// How a server runs: where it listens (for the links of a client's other threads), its
/// workers' thread mode, its stall limit and whether it says what it runs.
#[derive(Clone, Debug)]
pub struct ServeOpts {
    /// The address its listener is bound to (the other threads' listeners use its IP).
    pub ip: std::net::IpAddr,
    /// Thread mode of the workers it makes for a client's other threads.
    pub mode: courier::ThreadMode,
    /// The stall limit (`--peer-timeout`).
    pub stall: Duration,
    /// Print what it runs (`--verbose`).
    pub verbose: bool,
    /// This is the link of one of a client's extra threads (its own threads were asked
    /// for on the first link): it refuses to start more, so that a client cannot multiply
    /// server threads by asking on every link.
    pub helper: bool,
    /// Where the server threads of a client's threads run (thread k on `cpus.cpu(k)`; the
    /// first, serving this link, is pinned by its starter).
    pub cpus: crate::perf::CpuPlan,
    /// The client's thread this link serves (0: the first link).
    pub thread: usize,
    /// Print on stdout, before each test, the box that describes it, as ucx_perftest's
    /// server does (a lone server: not one started by `-l`, nor with `--announce`, whose
    /// stdout is read by a program, nor the server threads of a client's other threads).
    pub boxes: bool,
}

/// Serve tests until the client says done (or fails). A client running `-T N` asks first
/// for N - 1 more links (`{"op":"threads","n":N}`): each gets its own server thread,
/// worker and listener, whose ports go back with the "ok"; each is served like this one.
pub fn serve(link: Link, o: &ServeOpts) -> CliResult<()> {
    let mut helpers: Vec<std::thread::JoinHandle<CliResult<()>>> = Vec::new();
    let r = serve_link(&link, o, &mut helpers);
    // Every helper ends: its client says done, fails, or falls silent (bounded by the
    // stall limit), or never connects (bounded by the accept limit).
    let mut first = r.err();
    for h in helpers {
        let hr = h
            .join()
            .unwrap_or_else(|_| Err(CliError::run("a server thread panicked")));
        if let (None, Err(e)) = (&first, hr) {
            first = Some(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => {
            finish_link(link);
            Ok(())
        }
    }
}

/// Start the server threads for a client's threads 1..n, each listening on a port of its
/// own; returns the ports once all listen.
fn spawn_helpers(
    o: &ServeOpts,
    n: usize,
    helpers: &mut Vec<std::thread::JoinHandle<CliResult<()>>>,
) -> CliResult<Vec<u16>> {
    let mut ports = Vec::with_capacity(n.saturating_sub(1));
    for k in 1..n {
        let (tx, rx) = std::sync::mpsc::channel::<u16>();
        let o2 = ServeOpts {
            helper: true,
            thread: k,
            boxes: false,
            ..o.clone()
        };
        let h = std::thread::Builder::new()
            .name(format!("perf-server-{k}"))
            .spawn(move || -> CliResult<()> {
                o2.cpus.pin(k)?;
                let worker = crate::perf::make_worker(o2.mode, None)?;
                let link = accept(
                    &worker,
                    SocketAddr::new(o2.ip, 0),
                    o2.stall,
                    // The client connects right after it hears the ports.
                    Some(o2.stall.min(Duration::from_secs(60))),
                    move |port| {
                        let _ = tx.send(port);
                    },
                )?;
                serve(link, &o2)
            })
            .map_err(|e| CliError::run(format!("cannot start a server thread: {e}")))?;
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(port) => {
                helpers.push(h);
                ports.push(port);
            }
            Err(_) => {
                // It failed before listening (or hangs there): its error is the one to
                // report, if it has one.
                return Err(if h.is_finished() {
                    match h.join() {
                        Ok(Err(e)) => e,
                        _ => CliError::run(format!("server thread {k} failed")),
                    }
                } else {
                    CliError::run(format!("server thread {k} did not start listening"))
                });
            }
        }
    }
    Ok(ports)
}

/// ucx_perftest's server output for a test it is about to run (`ServeOpts::boxes`): the
/// box that describes it, closed by a rule; the client prints the results.
fn print_box(o: &ServeOpts, p: &Params) {
    if o.boxes {
        use std::io::Write;
        let mem = p.mem.map(|k| k.name().to_string());
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(crate::perf::report::server_box(p, &mem).as_bytes());
        let _ = out.flush();
    }
}

/// The most threads a client may run (and a server answer).
pub const MAX_THREADS: usize = 256;

fn serve_link(
    link: &Link,
    o: &ServeOpts,
    helpers: &mut Vec<std::thread::JoinHandle<CliResult<()>>>,
) -> CliResult<()> {
    let verbose = o.verbose;
    link.worker
        .am_set_handler(AM_ALIVE, |_| {})
        .map_err(|e| CliError::run(format!("cannot set the active-message handler: {e}")))?;
    let mut buf = vec![0u8; CTRL_MAX];
    // Said once the client's first control message is in: a client on this host moves
    // the endpoint from the tcp link it connected over to shared memory before it sends
    // anything, so the transport is the one the tests run on.
    let mut announced = !verbose;
    // The last test this server could not set up (the client was told why): a client
    // that leaves after that left because of it.
    let mut refused: Option<CliError> = None;
    loop {
        // Between tests the client only prints: a client silent for `stall` is gone.
        let n = match link.recv_ctrl(TAG_CTRL, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                return Err(match refused {
                    Some(r) => CliError::run(format!(
                        "could not set up the test of client {}: {} (it was told, and left)",
                        link.peer, r.msg
                    )),
                    None => e,
                });
            }
        };
        refused = None;
        if !announced {
            announced = true;
            let thread = if o.thread > 0 {
                format!(" (thread {})", o.thread)
            } else {
                String::new()
            };
            eprintln!(
                "connected: {} over {}{thread}",
                link.peer,
                link.ep.transport().unwrap_or("?")
            );
        }
        let msg = &buf[..n.min(buf.len())];
        let v: serde_json::Value = serde_json::from_slice(msg).unwrap_or(serde_json::Value::Null);
        if v["op"] == "done" {
            break;
        }
        if v["op"] == "info" {
            link.send_ctrl(
                TAG_ACK,
                format!("ok {}", side_info(&link.worker)).as_bytes(),
            )?;
            continue;
        }
        if v["op"] == "threads" {
            let n = v["n"]
                .as_u64()
                .filter(|&n| (2..=MAX_THREADS as u64).contains(&n));
            let reply = match n {
                None => format!(
                    "threads: expected a count from 2 to {MAX_THREADS}, got {}",
                    v["n"]
                ),
                Some(_) if o.helper => {
                    "threads: asked on the link of a client's extra thread".to_string()
                }
                Some(_) if !helpers.is_empty() => {
                    "threads: this session already has its threads".to_string()
                }
                Some(n) => {
                    if verbose {
                        eprintln!("client runs {n} threads");
                    }
                    match spawn_helpers(o, n as usize, helpers) {
                        Ok(ports) => format!("ok {}", serde_json::json!({ "ports": ports })),
                        Err(e) => e.msg,
                    }
                }
            };
            link.send_ctrl(TAG_ACK, reply.as_bytes())?;
            continue;
        }
        let p = match Params::decode(msg) {
            Ok(p) => p,
            Err(e) => {
                link.send_ctrl(TAG_ACK, e.msg.as_bytes())?;
                refused = Some(e);
                continue;
            }
        };
        if verbose {
            eprintln!(
                "running {} size {:?} iterations {}+{} window {}",
                p.test.name(),
                p.sizes,
                p.warmup,
                p.iters,
                p.window
            );
        }
        if p.test.is_rma() {
            let side = match rma::Side::map(link, &p, p.mem[1]).and_then(|mut s| {
                s.attach_peer(link, &v)?;
                Ok(s)
            }) {
                Ok(s) => s,
                Err(e) => {
                    link.send_ctrl(TAG_ACK, e.msg.as_bytes())?;
                    refused = Some(e);
                    continue;
                }
            };
            let ack = format!("ok {}", side.ack_json()?);
            print_box(o, &p);
            link.send_ctrl(TAG_ACK, ack.as_bytes())?;
            let t0 = Instant::now();
            rma::run_server(link, &p, side)?;
            if verbose {
                eprintln!(
                    "done {} in {:.3} s",
                    p.test.name(),
                    t0.elapsed().as_secs_f64()
                );
            }
            continue;
        }
        // A test this side cannot set up (buffers it cannot allocate) is refused with the
        // reason, which the client reports; the server goes on serving.
        let (b, am) = match Buffers::new(link, &p, recv_slots(&p, true))
            .and_then(|b| setup_am(link, &p, AM_PING).map(|am| (b, am)))
        {
            Ok(x) => x,
            Err(e) => {
                if verbose {
                    eprintln!("refused {}: {}", p.test.name(), e.msg);
                }
                link.send_ctrl(TAG_ACK, e.msg.as_bytes())?;
                refused = Some(e);
                continue;
            }
        };
        print_box(o, &p);
        link.send_ctrl(TAG_ACK, b"ok")?;
        let t0 = Instant::now();
        let before = link.worker.rndv_copies().unwrap_or_default();
        run_server(link, &p, &b, am)?;
        if verbose {
            let after = link.worker.rndv_copies().unwrap_or_default();
            eprintln!(
                "done {} in {:.3} s (rendezvous copies: {} through shared segments, {} through the kernel, {} from device memory through CUDA IPC)",
                p.test.name(),
                t0.elapsed().as_secs_f64(),
                after.shared - before.shared,
                after.link - before.link,
                after.device - before.device
            );
        }
    }
    Ok(())
}

/// The client said done: let it close first, then close.
fn finish_link(link: Link) {
    let _ = link.ep.flush();
    // Give the client a moment to close first, so its last receive is not cut short.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !link.failure.is_set() && Instant::now() < deadline {
        if link.worker.progress() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if !link.failure.is_set() {
        let _ = link.ep.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::engine::connect;

    /// A client's extra threads get their links from the first one; asking for threads
    /// again on one of those links is refused, so a client cannot make the server start
    /// threads without end.
    #[test]
    fn threads_are_given_only_on_the_first_link() {
        let stall = Duration::from_secs(20);
        let (ptx, prx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || -> CliResult<()> {
            let w = crate::perf::make_worker(courier::ThreadMode::Single, Some("tcp"))?;
            let link = accept(&w, "127.0.0.1:0".parse().expect("address"), stall, None, {
                move |p| {
                    let _ = ptx.send(p);
                }
            })?;
            serve(
                link,
                &ServeOpts {
                    ip: [127, 0, 0, 1].into(),
                    mode: courier::ThreadMode::Single,
                    stall,
                    verbose: false,
                    helper: false,
                    cpus: Default::default(),
                    thread: 0,
                    boxes: false,
                },
            )
        });
        let port = prx.recv_timeout(stall).expect("the server listens");
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let w = crate::perf::make_worker(courier::ThreadMode::Single, Some("tcp")).expect("worker");
        let first = connect(&w, addr(port), "server", stall).expect("first link");
        let ports = client_threads(&first, 2).expect("one more link");
        assert_eq!(ports.len(), 1);
        let w2 =
            crate::perf::make_worker(courier::ThreadMode::Single, Some("tcp")).expect("worker");
        let extra = connect(&w2, addr(ports[0]), "server thread 1", stall).expect("extra link");
        let e = client_threads(&extra, 2).expect_err("threads asked on an extra link");
        assert!(e.msg.contains("extra thread"), "{}", e.msg);
        let e = client_threads(&first, 2).expect_err("threads asked twice");
        assert!(e.msg.contains("already has its threads"), "{}", e.msg);
        client_finish(extra);
        client_finish(first);
        server.join().expect("server thread").expect("served");
    }
}
