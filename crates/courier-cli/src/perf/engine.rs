//! The test loops, client and server side, and the control exchange between them.
//!
//! Control: the client sends each test's parameters as a tag message (`TAG_CTRL`, JSON);
//! the server answers `TAG_ACK` ("ok" or an error sentence), both run the test, and a
//! `{"op":"done"}` ends the session. `{"op":"info"}` asks where the server runs (answered
//! "ok" and a JSON object). One-way tests end with the server's `TAG_FIN`, so the
//! client's clock covers every message's arrival.
//!
//! A peer that dies is reported by the library (the endpoint's error handler); one that
//! stops (SIGSTOP, a hung host behind a live kernel) is given up on after `Link::stall`
//! without a sign of life (`--peer-timeout`). During one-sided tests, whose operations
//! the server may never see (shared memory), the client proves it is alive with an empty
//! active message (`AM_ALIVE`) every `BEAT` (see `Beat`).

use super::clock::Instant;
use std::cell::Cell;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{AmFlags, AmRndv, Endpoint, EndpointParams, Info, Memory, Request, Worker};

use super::params::{Params, TestKind};
use super::report::Meter;
use super::rma;
use crate::error::{CliError, CliResult};

const TAG_CTRL: u64 = 0xC0DE_0000_0000_0001;
const TAG_ACK: u64 = 0xC0DE_0000_0000_0002;
pub(super) const TAG_FIN: u64 = 0xC0DE_0000_0000_0003;
const TAG_PING: u64 = 0x1000;
const TAG_PONG: u64 = 0x1001;
const AM_PING: u16 = 1;
const AM_PONG: u16 = 2;
/// The client's proof of life during one-sided tests (no payload; the server's handler
/// ignores it, its arrival is the point).
const AM_ALIVE: u16 = 3;
/// How often a client running a one-sided test sends `AM_ALIVE` and looks at its link.
/// `--peer-timeout` is at least `MIN_STALL`, several beats.
pub(super) const BEAT: Duration = Duration::from_millis(200);
/// Quiet time after which a waiting side naps between looks (`Link::poll`), and the nap.
const IDLE_NAP_AFTER: Duration = Duration::from_millis(100);
const IDLE_NAP: Duration = Duration::from_millis(1);
/// Empty progress calls between two offers of the CPU to another process (`Link::poll`),
/// as MPI libraries yield when idle on a crowded machine.
const YIELD_EVERY: u32 = 64;
/// The shortest `--peer-timeout`.
pub const MIN_STALL: Duration = Duration::from_secs(1);
/// Progress calls a beat makes on shared memory: enough for an idle worker to look at its
/// links' sockets (it asks epoll every 256 calls when nothing else is going on), which is
/// how a dead shared-memory peer is noticed. (A tcp link's socket is read by every call.)
const BEAT_LOOKS_SHM: usize = 256;
const CTRL_MAX: usize = 64 << 10;

/// Where an endpoint's failure is recorded (its error handler runs inside progress).
#[derive(Default)]
pub struct Failure {
    flag: AtomicBool,
    msg: Mutex<Option<String>>,
    /// A signal word to set to `u64::MAX` on failure, so a signal wait returns.
    wake: AtomicPtr<u64>,
}

impl Failure {
    fn set(&self, m: String) {
        let mut g = self.msg.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(m);
        }
        self.flag.store(true, Ordering::Release);
        let w = self.wake.load(Ordering::Acquire);
        if !w.is_null() {
            // SAFETY: armed with an aligned word of a live mapped region, disarmed before
            // the region is unmapped (see `arm`).
            unsafe { AtomicU64::from_ptr(w) }.store(u64::MAX, Ordering::Release);
        }
    }

    /// On failure, set the word at `w` to `u64::MAX` (ends signal waits on it).
    ///
    /// # Safety
    /// `w` must be an 8-byte aligned word that stays valid until `disarm`.
    pub unsafe fn arm(&self, w: *mut u64) {
        self.wake.store(w, Ordering::Release);
        if self.is_set() {
            // SAFETY: forwarded contract.
            unsafe { AtomicU64::from_ptr(w) }.store(u64::MAX, Ordering::Release);
        }
    }

    /// Stop touching the word given to `arm`.
    pub fn disarm(&self) {
        self.wake.store(std::ptr::null_mut(), Ordering::Release);
    }
    /// Whether the endpoint failed.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
    fn text(&self) -> String {
        self.msg
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }
}

/// Endpoint parameters whose error handler records into `f`.
pub fn ep_params(f: &Arc<Failure>) -> EndpointParams {
    let f = f.clone();
    EndpointParams::default().error_handler(move |e| f.set(e.to_string()))
}

/// A connected endpoint with everything the loops need to wait on it safely.
pub struct Link {
    /// The worker.
    pub worker: Worker,
    /// The endpoint to the peer.
    pub ep: Endpoint,
    /// The endpoint's failure, if any.
    pub failure: Arc<Failure>,
    /// The peer, for messages.
    pub peer: String,
    /// Longest time without any progress before giving up on the peer.
    pub stall: Duration,
    /// Regions of finished one-sided tests, kept mapped until the session ends: the
    /// library caches a peer's segment by its descriptor number, so unmapping one (and
    /// reusing the number for the next test's region) would leave the peer writing into
    /// the old segment.
    pub(super) retired: std::cell::RefCell<Vec<courier::Memory>>,
}

#[derive(Default)]
pub(super) struct Idle {
    spins: u32,
    since: Option<Instant>,
}

impl Link {
    fn peer_failed(&self, why: &str) -> CliError {
        CliError::run(format!("peer {} failed: {why}", self.peer))
    }

    pub(super) fn failed(&self) -> CliError {
        self.peer_failed(&self.failure.text())
    }

    /// Give up on a peer that showed no sign of life for `stall`. The endpoint is closed
    /// at once, so that its requests still in flight fail: dropping one that cannot be
    /// canceled (a started send, a get, an atomic) would otherwise wait for the silent
    /// peer without end.
    #[cold]
    fn stalled(&self) -> CliError {
        self.ep.clone().close_force();
        CliError::run(format!(
            "peer {} stopped responding (no progress for {:?}; --peer-timeout sets the limit)",
            self.peer, self.stall
        ))
    }

    pub(super) fn req_err(&self, e: &courier::Error) -> CliError {
        if self.failure.is_set() {
            self.failed()
        } else {
            self.peer_failed(&e.to_string())
        }
    }

    /// One progress step; errors if the peer failed or nothing moved for `stall`.
    #[inline]
    pub(super) fn poll(&self, idle: &mut Idle) -> CliResult<()> {
        if self.worker.progress() != 0 {
            idle.spins = 0;
            idle.since = None;
            return Ok(());
        }
        if self.failure.is_set() {
            return Err(self.failed());
        }
        idle.spins = idle.spins.wrapping_add(1);
        if idle.spins.is_multiple_of(YIELD_EVERY) {
            // Let a peer that shares this CPU run: with more busy processes than CPUs,
            // a side that spins out its time slice makes each round trip wait for the
            // scheduler. With a CPU to itself, the call returns at once.
            std::thread::yield_now();
        }
        if idle.spins & 0x3ff == 0 {
            let now = Instant::now();
            match idle.since {
                None => idle.since = Some(now),
                Some(t) if now.duration_since(t) > self.stall => return Err(self.stalled()),
                // Long quiet (a server between tests, a side waiting out the other's run):
                // nap, so that an idle process does not hold a CPU. A run in progress
                // makes progress far more often than this.
                Some(t) if now.duration_since(t) > IDLE_NAP_AFTER => std::thread::sleep(IDLE_NAP),
                _ => {}
            }
        }
        Ok(())
    }

    /// Progress until `r` completes. One that finished inside its call (an eager send) is
    /// done with at the first look, in line, as ucx_perftest goes on at once after a send
    /// that returns no request.
    #[inline(always)]
    pub(super) fn wait(&self, r: &mut Request<'_>) -> CliResult<Info> {
        let mut idle = Idle::default();
        loop {
            match r.test() {
                Some(Ok(i)) => return Ok(*i),
                Some(Err(e)) => return Err(self.req_err(e)),
                None => self.poll(&mut idle)?,
            }
        }
    }

    #[inline]
    pub(super) fn check<T>(&self, r: courier::Result<T>) -> CliResult<T> {
        r.map_err(|e| self.req_err(&e))
    }

    /// A raw call's outcome, as `ucx_perftest` takes a `ucp_*_nbx` call's: finished
    /// inside the call, nothing (`None`: no request made, tested or dropped); still in
    /// flight, its request.
    ///
    /// # Safety
    /// The buffers the raw call was given must stay valid for `'a`.
    #[inline]
    pub(super) unsafe fn in_flight_raw<'a>(
        &self,
        started: courier::Result<courier::Started>,
    ) -> CliResult<Option<Request<'a>>> {
        match self.check(started)? {
            courier::Started::Done(_) => Ok(None),
            // SAFETY: forwarded contract.
            pending => Ok(Some(unsafe { self.worker.request_for(pending) })),
        }
    }

    pub(super) fn send_ctrl(&self, tag: u64, msg: &[u8]) -> CliResult<()> {
        let mut r = self.check(self.ep.tag_send(msg, tag))?;
        self.wait(&mut r).map(|_| ())
    }

    /// A control request to the server: `msg`, then its answer as text ("ok ..." or why
    /// not).
    fn request(&self, msg: &[u8]) -> CliResult<String> {
        self.send_ctrl(TAG_CTRL, msg)?;
        let mut buf = vec![0u8; CTRL_MAX];
        let n = self.recv_ctrl(TAG_ACK, &mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned())
    }

    pub(super) fn recv_ctrl(&self, tag: u64, buf: &mut [u8]) -> CliResult<usize> {
        let mut r = self.check(self.worker.tag_recv(buf, tag, u64::MAX))?;
        let n = self.wait(&mut r)?.len;
        Ok(n)
    }
}

/// A client's heartbeat during a one-sided test: every `BEAT`, an empty `AM_ALIVE` to the
/// server (whose waits then see progress: on shared memory the test's puts, gets and
/// atomics land without it) and a look at the link, so a server that died meanwhile ends
/// the run (those operations complete without this side's progress as well).
pub(super) struct Beat {
    next: Instant,
    pending: Option<Request<'static>>,
}

impl Beat {
    pub(super) fn new() -> Beat {
        Beat {
            next: Instant::now() + BEAT,
            pending: None,
        }
    }

    /// At `now` (a clock reading the caller has anyway): beat if it is time. `true` if it
    /// did: the time it took is not the next operation's, so the caller reads the clock
    /// again.
    #[inline]
    pub(super) fn tick(&mut self, link: &Link, now: Instant) -> CliResult<bool> {
        if now < self.next {
            return Ok(false);
        }
        self.beat(link, now).map(|()| true)
    }

    #[cold]
    #[inline(never)]
    fn beat(&mut self, link: &Link, now: Instant) -> CliResult<()> {
        self.next = now + BEAT;
        let looks = if link.ep.transport() == Some("shm") {
            BEAT_LOOKS_SHM
        } else {
            1
        };
        for _ in 0..looks {
            link.worker.progress();
        }
        if link.failure.is_set() {
            return Err(link.failed());
        }
        if let Some(r) = self.pending.as_mut() {
            match r.test() {
                // The last one has not left yet (a full socket): one in flight is enough.
                None => return Ok(()),
                Some(Err(e)) => return Err(link.req_err(e)),
                Some(Ok(_)) => self.pending = None,
            }
        }
        let mut r = link.check(link.ep.am_send(AM_ALIVE, &[], &[], AmFlags::default()))?;
        if !r.is_done() {
            self.pending = Some(r);
        }
        Ok(())
    }
}

/// Connect to a `courier perf` server; give up on it after `stall` without a sign of life.
pub fn connect(worker: &Worker, addr: SocketAddr, shown: &str, stall: Duration) -> CliResult<Link> {
    let failure = Arc::new(Failure::default());
    let ep = worker
        .connect_sockaddr(addr, std::process::id() as u64, ep_params(&failure))
        .map_err(|e| CliError::run(format!("cannot connect to {shown}: {e}")))?;
    ep.wait_connected(Duration::from_secs(10))
        .map_err(|e| CliError::run(format!("cannot connect to {shown}: {e}")))?;
    if failure.is_set() {
        return Err(CliError::run(format!(
            "cannot connect to {shown}: {}",
            failure.text()
        )));
    }
    Ok(Link {
        worker: worker.clone(),
        ep,
        failure,
        peer: shown.to_string(),
        stall,
        retired: Default::default(),
    })
}

/// Wait for one client on `listener` (without limit, as the ucx_perftest server does, or
/// at most `limit`); once connected, give up on it after `stall` without a sign of life.
pub fn accept(
    worker: &Worker,
    listener_addr: SocketAddr,
    stall: Duration,
    limit: Option<Duration>,
    announce: impl FnOnce(u16),
) -> CliResult<Link> {
    type Slot = Arc<Mutex<Option<(Endpoint, String)>>>;
    let slot: Slot = Arc::default();
    let failure = Arc::new(Failure::default());
    let (s, f) = (slot.clone(), failure.clone());
    let listener = courier::Listener::new(worker, listener_addr, move |req| {
        let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            req.reject();
            return;
        }
        let who = req.client_addr().to_string();
        if let Ok(ep) = req.accept(ep_params(&f)) {
            *g = Some((ep, who));
        }
    })
    .map_err(|e| CliError::run(format!("cannot listen on {listener_addr}: {e}")))?;
    announce(listener.local_addr().port());
    let deadline = limit.map(|l| std::time::Instant::now() + l);
    let mut idle = 0u32;
    loop {
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            return Err(CliError::run(format!(
                "no client connected to {} within {:?}",
                listener.local_addr(),
                limit.unwrap_or_default()
            )));
        }
        if let Some((ep, who)) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
            drop(listener);
            return Ok(Link {
                worker: worker.clone(),
                ep,
                failure,
                peer: who,
                stall,
                retired: Default::default(),
            });
        }
        if worker.progress() == 0 {
            idle += 1;
            if idle > 1000 {
                // The perf workers have no wakeup feature (they never sleep on their fd),
                // so a server waiting for its client naps instead of holding a CPU.
                std::thread::sleep(IDLE_NAP);
                idle = 0;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------

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
        "thread_mode": super::params::thread_mode_name(worker.thread_mode()),
        "cpus": super::params::affinity().unwrap_or_default(),
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
    pub cpus: super::CpuPlan,
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
                let worker = super::make_worker(o2.mode, None)?;
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
        let _ = out.write_all(super::report::server_box(p, &mem).as_bytes());
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
        let (b, am) = match Buffers::new(link, &p, p.window.max(1))
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

// ---------------------------------------------------------------------------------------
// Buffers and patterns
// ---------------------------------------------------------------------------------------

#[inline]
pub(super) fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(7) & 0xff) as u8
}

pub(super) fn verify(buf: &[u8]) -> bool {
    buf.iter().enumerate().all(|(i, &b)| b == pattern(i))
}

/// The message buffers of a two-sided test, mapped by the library (allocated, as
/// ucx_perftest allocates them with `ucp_mem_map`): the send buffer in the first `-m`
/// memory type, the receive buffers in the second.
struct Buffers {
    send: ManuallyDrop<Memory>,
    /// One receive buffer per slot: a window's on the receiving side, one on a client that
    /// only sends or ping-pongs.
    recv: ManuallyDrop<Memory>,
    size: usize,
    /// How many receive buffers `recv` holds.
    slots: usize,
    bounds: Vec<(usize, usize)>,
    /// A failed run left operations that may still read or write the buffers (sends in
    /// flight, receives still posted): they stay mapped for the rest of the process.
    keep: Cell<bool>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        if !self.keep.get() {
            // SAFETY: dropped once, here; nothing uses them after.
            unsafe {
                ManuallyDrop::drop(&mut self.send);
                ManuallyDrop::drop(&mut self.recv);
            }
        }
    }
}

impl Buffers {
    /// The buffers of `p`, with `recv_slots` receive buffers (1 or `p`'s window).
    fn new(link: &Link, p: &Params, recv_slots: usize) -> CliResult<Buffers> {
        let what = || buffers_what(p);
        let size = p.msg_size();
        let recv_len = size.checked_mul(recv_slots.max(1)).ok_or_else(|| {
            CliError::run(format!(
                "cannot allocate the {}: message size × window overflows",
                what()
            ))
        })?;
        // The send pattern first: a size the allocator refuses ends here, before anything
        // is mapped.
        let mut data: Vec<u8> = try_vec(size, what)?;
        data.extend((0..size).map(pattern));
        let ctx = link.worker.context();
        let send = super::rma::map_buffer(ctx, p.mem[0], size, what)?;
        let recv = super::rma::map_buffer(ctx, p.mem[1], recv_len, what)?;
        // Through the library: the buffers may be device memory (then the library stages
        // every message through host memory, and `-check` is refused).
        super::rma::fill(&send, 0, &data)?;
        drop(data);
        super::rma::zero(&recv, recv_len)?;
        let mut bounds = try_vec(p.sizes.len(), what)?;
        let mut off = 0;
        for &s in &p.sizes {
            bounds.push((off, s));
            off += s;
        }
        Ok(Buffers {
            send: ManuallyDrop::new(send),
            recv: ManuallyDrop::new(recv),
            size,
            slots: recv_slots.max(1),
            bounds,
            keep: Cell::new(false),
        })
    }

    fn data(&self) -> &[u8] {
        // SAFETY: the send region holds `size` initialized bytes and lives as long as self;
        // nothing writes it after `new`.
        unsafe { std::slice::from_raw_parts(self.send.as_ptr(), self.size) }
    }

    /// The first of `n` receive buffers in a row, each `size` bytes; an error if fewer
    /// were mapped (a test that would write past them).
    fn recv_base(&self, n: usize) -> CliResult<*mut u8> {
        if n > self.slots {
            return Err(CliError::run(format!(
                "internal error: {n} receive buffers wanted, {} mapped",
                self.slots
            )));
        }
        Ok(self.recv.as_ptr())
    }

    fn iov(&self) -> Vec<&[u8]> {
        let data = self.data();
        self.bounds.iter().map(|&(o, l)| &data[o..o + l]).collect()
    }
}

/// What the message buffers of `p` are, for errors: `message buffers (-s 64, -O 32)`.
pub(super) fn buffers_what(p: &Params) -> String {
    let sizes: Vec<String> = p.sizes.iter().map(|s| s.to_string()).collect();
    format!("message buffers (-s {}, -O {})", sizes.join(","), p.window)
}

/// An empty vector with room for `n` elements, or why not: every vector whose length the
/// test's parameters set (a window, a message) is allocated so, so that a size the
/// allocator refuses is an error naming `what()`, not an abort.
pub(super) fn try_vec<T>(n: usize, what: impl FnOnce() -> String) -> CliResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        CliError::run(format!(
            "cannot allocate {} bytes for the {}: {e}",
            n.saturating_mul(std::mem::size_of::<T>()),
            what()
        ))
    })?;
    Ok(v)
}

/// `n` empty slots of a window of requests (see `try_vec`).
pub(super) fn try_ring<T>(n: usize, what: impl FnOnce() -> String) -> CliResult<Vec<Option<T>>> {
    let mut v = try_vec(n, what)?;
    v.resize_with(n, || None);
    Ok(v)
}

/// A receive slot of `b.recv`, with a lifetime of the caller's choosing.
///
/// # Safety
/// `base` must point to a live buffer of at least `(slot + 1) * size` bytes that outlives
/// `'a`, and no two live slices may overlap (one request per slot at a time).
#[inline]
unsafe fn slot<'a>(base: *mut u8, slot: usize, size: usize) -> &'a mut [u8] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts_mut(base.add(slot * size), size) }
}

// ---------------------------------------------------------------------------------------
// Active-message receive side
// ---------------------------------------------------------------------------------------

struct AmState {
    count: AtomicU64,
    rndv: Mutex<VecDeque<AmRndv>>,
    has_rndv: AtomicBool,
    bad: AtomicBool,
}

fn setup_am(link: &Link, p: &Params, id: u16) -> CliResult<Option<Arc<AmState>>> {
    if !matches!(p.test, TestKind::AmLat | TestKind::AmBw) {
        return Ok(None);
    }
    let st = Arc::new(AmState {
        count: AtomicU64::new(0),
        rndv: Mutex::new(VecDeque::new()),
        has_rndv: AtomicBool::new(false),
        bad: AtomicBool::new(false),
    });
    let s = st.clone();
    let check = p.check;
    link.worker
        .am_set_handler(id, move |m| {
            if m.is_rndv() {
                if let Some(d) = m.take_rndv() {
                    s.rndv
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(d);
                    s.has_rndv.store(true, Ordering::Release);
                }
                return;
            }
            if check && !verify(m.data()) {
                s.bad.store(true, Ordering::Relaxed);
            }
            // The count is written only on the one thread that progresses the worker (here
            // and in wait_count): a plain increment, not a locked read-modify-write per
            // message.
            s.count
                .store(s.count.load(Ordering::Relaxed) + 1, Ordering::Release);
        })
        .map_err(|e| CliError::run(format!("cannot set the active-message handler: {e}")))?;
    Ok(Some(st))
}

impl AmState {
    /// Progress until at least `n` messages arrived (receiving rendezvous data into `buf`).
    fn wait_count(&self, link: &Link, n: u64, buf: &mut [u8], check: bool) -> CliResult<()> {
        let mut idle = Idle::default();
        while self.count.load(Ordering::Acquire) < n {
            if self.has_rndv.load(Ordering::Acquire) {
                let d = {
                    let mut q = self.rndv.lock().unwrap_or_else(|e| e.into_inner());
                    let d = q.pop_front();
                    if q.is_empty() {
                        self.has_rndv.store(false, Ordering::Release);
                    }
                    d
                };
                if let Some(d) = d {
                    let len = d.len().min(buf.len());
                    let mut r = link.check(link.worker.am_recv_data(d, &mut buf[..len]))?;
                    link.wait(&mut r)?;
                    drop(r);
                    if check && !verify(&buf[..len]) {
                        self.bad.store(true, Ordering::Relaxed);
                    }
                    self.count
                        .store(self.count.load(Ordering::Relaxed) + 1, Ordering::Release);
                    continue;
                }
            }
            link.poll(&mut idle)?;
        }
        if self.bad.load(Ordering::Relaxed) {
            return Err(CliError::run(format!(
                "data check failed: an active message from {} had wrong contents",
                link.peer
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Sending one message of the test's kind
// ---------------------------------------------------------------------------------------

/// One message of a test: its kind, its bytes (`iov`, when it has more than one part, is
/// what goes), its tag and its active-message id.
#[derive(Clone, Copy)]
struct Outgoing<'a, 'b> {
    kind: TestKind,
    data: &'a [u8],
    iov: &'b [&'a [u8]],
    tag: u64,
    am_id: u16,
}

impl<'a, 'b> Outgoing<'a, 'b> {
    /// A message of `kind` with tag 0 and active-message id 0.
    fn new(kind: TestKind, data: &'a [u8], iov: &'b [&'a [u8]]) -> Self {
        Outgoing {
            kind,
            data,
            iov,
            tag: 0,
            am_id: 0,
        }
    }

    fn tag(self, tag: u64) -> Self {
        Outgoing { tag, ..self }
    }

    fn am(self, am_id: u16) -> Self {
        Outgoing { am_id, ..self }
    }
}

#[inline]
fn send<'a>(link: &Link, m: Outgoing<'a, '_>) -> CliResult<Request<'a>> {
    let Outgoing {
        kind,
        data,
        iov,
        tag,
        am_id,
    } = m;
    let r = match kind {
        TestKind::TagLat | TestKind::TagBw | TestKind::TagBibw | TestKind::TagWinBw => {
            if iov.len() > 1 {
                link.ep.tag_send_iov(iov, tag)
            } else {
                link.ep.tag_send(data, tag)
            }
        }
        TestKind::TagSyncLat | TestKind::TagSyncBw => {
            // The library has no synchronous IOV send: the contiguous copy goes instead.
            link.ep.tag_send_sync(data, tag)
        }
        TestKind::AmLat | TestKind::AmBw => {
            let flags = AmFlags {
                reply: kind == TestKind::AmLat,
                ..AmFlags::default()
            };
            if iov.len() > 1 {
                link.ep.am_send_iov(am_id, &[], iov, flags)
            } else {
                link.ep.am_send(am_id, &[], data, flags)
            }
        }
        TestKind::StreamLat | TestKind::StreamBw => link.ep.stream_send(data),
        t => {
            return Err(CliError::run(format!(
                "{} is a one-sided test: it sends no messages",
                t.name()
            )));
        }
    };
    link.check(r)
}

/// Start one message of a ping-pong test as `ucx_perftest` does: a send the library
/// finished inside the call (every eager one) gives no request (`None`), so none is made,
/// tested or dropped; one still in flight gives its request. The gathered (IOV) form and
/// the other tests go through `send`.
#[inline]
fn send_start<'a>(link: &Link, m: Outgoing<'a, '_>) -> CliResult<Option<Request<'a>>> {
    if m.iov.len() > 1 || !matches!(m.kind, TestKind::TagLat | TestKind::AmLat) {
        return send(link, m).map(Some);
    }
    let buf = courier::Buf::One((m.data.as_ptr() as usize, m.data.len()));
    // SAFETY: a send still in flight becomes a `Request` borrowing `data`, below.
    let started = unsafe {
        if m.kind == TestKind::AmLat {
            let flags = AmFlags {
                reply: true,
                ..AmFlags::default()
            };
            link.ep
                .am_send_raw(m.am_id, &[], buf, flags, courier::Callback::None)
        } else {
            link.ep
                .tag_send_raw(buf, m.tag, false, courier::Callback::None)
        }
    };
    // SAFETY: `started` came with `data`, which lives for 'a.
    unsafe { link.in_flight_raw(started) }
}

/// `send_start`, then wait for the send to finish.
#[inline]
fn send_and_wait(link: &Link, m: Outgoing<'_, '_>) -> CliResult<()> {
    if let Some(mut r) = send_start(link, m)? {
        link.wait(&mut r)?;
    }
    Ok(())
}

/// Operations finished by a counting callback (`counted_recvs`, `counted_sends`): how many
/// (failed ones too), and the first failure.
struct OpCount {
    /// The size every received message must have (`None` for sends).
    size: Option<usize>,
    finished: AtomicU64,
    any_failed: AtomicBool,
    failed: Mutex<Option<OpFailed>>,
}

/// How a counted operation failed.
enum OpFailed {
    /// The library reported an error.
    Op(courier::Error),
    /// A message of the wrong size arrived: (its size, the size expected).
    Size(usize, usize),
}

impl OpCount {
    fn new(size: Option<usize>) -> Box<OpCount> {
        Box::new(OpCount {
            size,
            finished: AtomicU64::new(0),
            any_failed: AtomicBool::new(false),
            failed: Mutex::new(None),
        })
    }

    /// The callback word for `op_counted`.
    fn user(&self) -> usize {
        self as *const OpCount as usize
    }

    fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// The first failure, as the run's error.
    #[inline]
    fn failure(&self, link: &Link, what: &str) -> Option<CliError> {
        if !self.any_failed.load(Ordering::Relaxed) {
            return None;
        }
        self.take_failure(link, what)
    }

    #[cold]
    #[inline(never)]
    fn take_failure(&self, link: &Link, what: &str) -> Option<CliError> {
        let m = self.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        Some(match m {
            Some(OpFailed::Op(e)) => link.req_err(&e),
            Some(OpFailed::Size(got, want)) => CliError::run(format!(
                "{what} {} has {got} bytes, expected {want}",
                link.peer
            )),
            None => link.failed(),
        })
    }

    /// Free the count once none of the `posted` operations can still call back; a failed
    /// run may leave some posted, whose callbacks may yet run, so the count stays where
    /// they point (a failed run ends the test; this is its cost). True if it was leaked.
    fn release(self: Box<Self>, posted: u64) -> bool {
        if self.finished() >= posted {
            false
        } else {
            Box::leak(self);
            true
        }
    }
}

/// The callback of a counted operation. `user` is the address of an `OpCount` that
/// outlives every operation started with it (`OpCount::release`).
fn op_counted(user: usize, r: courier::Result<Info>, _info: Info) {
    // SAFETY: see above; the count is only read and written through atomics and a mutex.
    let c = unsafe { &*(user as *const OpCount) };
    let failure = match r {
        Err(e) => Some(OpFailed::Op(e)),
        Ok(i) if c.size.is_some_and(|s| s != i.len) => {
            Some(OpFailed::Size(i.len, c.size.unwrap_or_default()))
        }
        Ok(_) => None,
    };
    if let Some(m) = failure {
        let mut g = c.failed.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(m);
        }
        c.any_failed.store(true, Ordering::Relaxed);
    }
    // One thread progresses the worker: a load and a store count without a locked
    // instruction.
    c.finished
        .store(c.finished.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Receive `total` tag messages of `size` bytes with `w` receives posted at a time, all into
/// the same buffer at `rbase` (their contents are not looked at), each finished by a
/// callback that counts it: ucx_perftest's receiver (`tag_recv_cb`, `wait_recv_window`). A
/// receive that finds its message already waiting finishes at once, without a callback.
/// Also says whether receives may still be posted (a failed run): then the buffer must
/// stay mapped.
fn counted_recvs(
    link: &Link,
    total: u64,
    w: usize,
    rbase: *mut u8,
    size: usize,
) -> (CliResult<()>, bool) {
    let count = OpCount::new(Some(size));
    let user = count.user();
    let mut posted = 0u64;
    let mut at_once = 0u64;
    let mut idle = Idle::default();
    let result = loop {
        if let Some(e) = count.failure(link, "a message from") {
            break Err(e);
        }
        let done = count.finished() + at_once;
        if done >= total {
            break Ok(());
        }
        if posted < total && posted - done < w as u64 {
            let buf = (rbase as usize, size);
            // SAFETY: the buffer lies inside the receive area, which outlives this call;
            // the receives overwrite one another's bytes, which nobody reads.
            let started = unsafe {
                link.worker
                    .tag_recv_fn(buf, TAG_PING, u64::MAX, op_counted, user)
            };
            match link.check(started) {
                Ok(courier::Started::Done(info)) if info.len != size => {
                    break Err(CliError::run(format!(
                        "message from {} has {} bytes, expected {size}",
                        link.peer, info.len
                    )));
                }
                Ok(courier::Started::Done(_)) => at_once += 1,
                Ok(courier::Started::Pending(_)) => {}
                Err(e) => break Err(e),
            }
            posted += 1;
            continue;
        }
        if let Err(e) = link.poll(&mut idle) {
            break Err(e);
        }
    };
    let still_posted = count.release(posted - at_once);
    (result, still_posted)
}

/// The client of `tag_bw`, `tag_sync_bw`, `ucp_am_bw` and `stream_bw`: `total` sends with
/// at most `w` in flight, each finished by a callback that counts it (ucx_perftest's
/// sender: its send callback, `wait_window`); a send the library finishes at once (an
/// eager message written to the link) needs no callback and no request. Returns the run's
/// row, and whether sends may still be in flight (a failed run): then the caller must
/// keep their memory (`buf`) alive.
fn counted_sends(
    link: &Link,
    p: &Params,
    meter: &mut Meter<'_>,
    buf: &courier::Buf,
) -> (CliResult<super::report::Row>, bool) {
    let total = p.total();
    let warm = p.warmup;
    let w = p.window.max(1) as u64;
    let count = OpCount::new(None);
    let user = count.user();
    let mut posted = 0u64;
    let mut at_once = 0u64;
    let mut idle = Idle::default();
    let mut t = Instant::now();
    let mut run = || -> CliResult<()> {
        for i in 0..total {
            if i == warm {
                t = Instant::now();
                meter.begin(t);
            }
            while posted - (count.finished() + at_once) >= w {
                link.poll(&mut idle)?;
            }
            if let Some(e) = count.failure(link, "a send to") {
                return Err(e);
            }
            let cb = courier::Callback::Raw(op_counted, user);
            // SAFETY: `buf` is the send buffer, which the caller keeps alive until every
            // send finished (or for good, if one may still be in flight).
            let started = unsafe { send_raw(link, p.test, buf.clone(), cb) };
            if let courier::Started::Done(_) = link.check(started)? {
                at_once += 1;
            }
            posted += 1;
            let now = Instant::now();
            if i >= warm {
                meter.record(now, t);
            }
            t = now;
        }
        while count.finished() + at_once < posted {
            link.poll(&mut idle)?;
        }
        if let Some(e) = count.failure(link, "a send to") {
            return Err(e);
        }
        let mut fin = [0u8; 8];
        link.recv_ctrl(TAG_FIN, &mut fin)?;
        Ok(())
    };
    let r = run();
    let leaked = count.release(posted - at_once);
    (r.map(|()| meter.finish(Instant::now())), leaked)
}

/// Start one send of a two-sided bandwidth test, finished by `cb` unless it finished at once.
///
/// # Safety
/// As the library's `*_raw` sends: `data` stays valid until the send finished.
unsafe fn send_raw(
    link: &Link,
    kind: TestKind,
    data: courier::Buf,
    cb: courier::Callback,
) -> courier::Result<courier::Started> {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            TestKind::TagSyncBw => link.ep.tag_send_raw(data, TAG_PING, true, cb),
            TestKind::AmBw => link
                .ep
                .am_send_raw(AM_PING, &[], data, AmFlags::default(), cb),
            TestKind::StreamBw => link.ep.stream_send_raw(data, cb),
            _ => link.ep.tag_send_raw(data, TAG_PING, false, cb),
        }
    }
}

fn check_tag(link: &Link, p: &Params, buf: &[u8], info: &Info) -> CliResult<()> {
    if info.len != buf.len() {
        return Err(CliError::run(format!(
            "message from {} has {} bytes, expected {}",
            link.peer,
            info.len,
            buf.len()
        )));
    }
    if p.check && !verify(buf) {
        return Err(CliError::run(format!(
            "data check failed: a message from {} had wrong contents",
            link.peer
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Client side (measures)
// ---------------------------------------------------------------------------------------

/// Run `p` as the client; returns the final row.
pub fn run_client(
    link: &Link,
    p: &Params,
    meter: &mut Meter<'_>,
    side: Option<rma::Side>,
) -> CliResult<super::report::Row> {
    if let Some(side) = side {
        return rma::run_client(link, p, meter, side);
    }
    // The client receives a window of messages at once only in tag_bibw; otherwise one at
    // a time (a ping-pong's reply) or none (it only sends).
    let slots = if p.test == TestKind::TagBibw {
        p.window.max(1)
    } else {
        1
    };
    let b = Buffers::new(link, p, slots)?;
    let am = setup_am(link, p, AM_PONG)?;
    let total = p.total();
    let warm = p.warmup;
    let size = b.size;
    let rbase = b.recv_base(1)?;
    let iov = b.iov();
    let data = b.data();
    if total == 0 {
        return Ok(meter.finish(Instant::now()));
    }
    match p.test {
        TestKind::TagLat | TestKind::TagSyncLat | TestKind::StreamLat => {
            let stream = p.test == TestKind::StreamLat;
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t);
                }
                // SAFETY: slot 0 of b.recv; the request is dropped within the iteration.
                let rb = unsafe { slot(rbase, 0, size) };
                if p.check {
                    rb.fill(0);
                }
                // Send, then post the receive for the answer, as ucx_perftest does: the
                // answer cannot arrive before a one-way trip, and posting takes less.
                let sr = send_start(link, Outgoing::new(p.test, data, &iov).tag(TAG_PING))?;
                let mut rr = if stream {
                    link.check(link.ep.stream_recv_exact(rb))?
                } else {
                    link.check(link.worker.tag_recv(rb, TAG_PONG, u64::MAX))?
                };
                if let Some(mut sr) = sr {
                    link.wait(&mut sr)?;
                }
                let info = link.wait(&mut rr)?;
                drop(rr);
                if !stream || p.check {
                    // SAFETY: as above; the receive finished.
                    check_tag(
                        link,
                        p,
                        unsafe { slot(rbase, 0, size) },
                        &if stream {
                            Info {
                                len: size,
                                ..Info::default()
                            }
                        } else {
                            info
                        },
                    )?;
                }
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        TestKind::AmLat => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count inside this loop.
            let rb = unsafe { slot(rbase, 0, size) };
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t);
                }
                send_and_wait(link, Outgoing::new(p.test, data, &iov).am(AM_PING))?;
                am.wait_count(link, i + 1, rb, p.check)?;
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        TestKind::TagBw | TestKind::TagSyncBw | TestKind::AmBw | TestKind::StreamBw => {
            // As `send`: the IOV form where the library has one (tag and active messages;
            // no synchronous or stream IOV send), the contiguous copy otherwise.
            let gather = iov.len() > 1 && matches!(p.test, TestKind::TagBw | TestKind::AmBw);
            let buf = if gather {
                courier::Buf::Many(iov.iter().map(|s| (s.as_ptr() as usize, s.len())).collect())
            } else {
                courier::Buf::One((data.as_ptr() as usize, data.len()))
            };
            let (row, in_flight) = counted_sends(link, p, meter, &buf);
            b.keep.set(in_flight);
            row
        }
        TestKind::TagBibw | TestKind::TagWinBw => {
            // Room for a window's requests, kept across windows: a window allocates nothing.
            let mut sends: Vec<Request<'_>> = try_vec(p.window.max(1), || buffers_what(p))?;
            let (mut recvs, rbase): (Vec<Request<'_>>, _) = if p.test == TestKind::TagBibw {
                let w = p.window.max(1);
                (try_vec(w, || buffers_what(p))?, b.recv_base(w)?)
            } else {
                (Vec::new(), rbase)
            };
            let mut t = Instant::now();
            for i in 0..total {
                if i == warm {
                    t = Instant::now();
                    meter.begin(t);
                }
                if p.test == TestKind::TagWinBw {
                    win_round_send(link, p, data, &iov, &mut sends)?;
                } else {
                    let tags = (TAG_PING, TAG_PONG);
                    bibw_round(link, p, (data, &iov), rbase, tags, &mut sends, &mut recvs)?;
                }
                let now = Instant::now();
                if i >= warm {
                    meter.record(now, t);
                }
                t = now;
            }
            Ok(meter.finish(Instant::now()))
        }
        t => Err(CliError::run(format!(
            "{}: a one-sided test started without remote keys",
            t.name()
        ))),
    }
}

/// One bi-directional window: `w` receives (tag `rtag`) and `w` sends (tag `stag`) of
/// `msg` (the data and its IOV) in flight at once. `sends` and `recvs` are room for the
/// requests, kept across windows (a window allocates nothing).
fn bibw_round<'a>(
    link: &'a Link,
    p: &Params,
    msg: (&'a [u8], &[&'a [u8]]),
    rbase: *mut u8,
    (stag, rtag): (u64, u64),
    sends: &mut Vec<Request<'a>>,
    recvs: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    let w = p.window.max(1);
    let size = p.msg_size();
    sends.clear();
    recvs.clear();
    for k in 0..w {
        // SAFETY: slot k of the receive buffers, one request per slot: the last window's
        // were dropped by `clear` above, and the caller's buffers outlive `recvs`.
        let rb = unsafe { slot(rbase, k, size) };
        recvs.push(link.check(link.worker.tag_recv(rb, rtag, u64::MAX))?);
    }
    for _ in 0..w {
        sends.push(send(
            link,
            Outgoing::new(TestKind::TagBibw, msg.0, msg.1).tag(stag),
        )?);
    }
    for r in sends.iter_mut().chain(recvs.iter_mut()) {
        link.wait(r)?;
    }
    Ok(())
}

/// The bytes of the receiver's ack that ends each window of `tag_win_bw` (osu_bw's size).
const WIN_ACK_LEN: usize = 4;

/// The sender's window of `tag_win_bw`, as osu_bw's: `w` sends started at once, waited for
/// together, then the receiver's ack. `sends` is scratch room for the requests (kept across
/// windows, so that a window allocates nothing).
fn win_round_send<'a>(
    link: &Link,
    p: &Params,
    data: &'a [u8],
    iov: &[&'a [u8]],
    sends: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    sends.clear();
    for _ in 0..p.window.max(1) {
        sends.push(send(
            link,
            Outgoing::new(TestKind::TagWinBw, data, iov).tag(TAG_PING),
        )?);
    }
    for r in sends.iter_mut() {
        link.wait(r)?;
    }
    let mut ack = [0u8; WIN_ACK_LEN];
    link.recv_ctrl(TAG_PONG, &mut ack)?;
    Ok(())
}

/// The receiver's window of `tag_win_bw`, as osu_bw's: `w` receives posted at once (one
/// slot each), waited for together and checked, then the ack. `recvs` is scratch room for
/// the requests (kept across windows, so that a window allocates nothing).
fn win_round_recv<'a>(
    link: &'a Link,
    p: &Params,
    rbase: *mut u8,
    recvs: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    let w = p.window.max(1);
    let size = p.msg_size();
    recvs.clear();
    for k in 0..w {
        // SAFETY: slot k of the receive buffers (a window of slots), one request per
        // slot: the last window's were dropped by `clear` above, and the caller's buffers
        // outlive `recvs`.
        let rb = unsafe { slot(rbase, k, size) };
        if p.check {
            rb.fill(0);
        }
        recvs.push(link.check(link.worker.tag_recv(rb, TAG_PING, u64::MAX))?);
    }
    for (k, r) in recvs.iter_mut().enumerate() {
        let info = link.wait(r)?;
        // SAFETY: as above; this slot's receive finished and nothing else reads it.
        check_tag(link, p, unsafe { slot(rbase, k, size) }, &info)?;
    }
    link.send_ctrl(TAG_PONG, &[0u8; WIN_ACK_LEN])
}

// ---------------------------------------------------------------------------------------
// Server side (answers, does not measure)
// ---------------------------------------------------------------------------------------

fn run_server(link: &Link, p: &Params, b: &Buffers, am: Option<Arc<AmState>>) -> CliResult<()> {
    let total = p.total();
    let size = b.size;
    let w = p.window.max(1);
    let rbase = b.recv_base(w)?;
    let iov = b.iov();
    let data = b.data();
    match p.test {
        TestKind::TagLat | TestKind::TagSyncLat | TestKind::StreamLat => {
            let stream = p.test == TestKind::StreamLat;
            for _ in 0..total {
                // SAFETY: slot 0; the request is dropped within the iteration.
                let rb = unsafe { slot(rbase, 0, size) };
                if p.check {
                    rb.fill(0);
                }
                let mut rr = if stream {
                    link.check(link.ep.stream_recv_exact(rb))?
                } else {
                    link.check(link.worker.tag_recv(rb, TAG_PING, u64::MAX))?
                };
                let info = link.wait(&mut rr)?;
                drop(rr);
                if !stream || p.check {
                    // SAFETY: as above.
                    check_tag(
                        link,
                        p,
                        unsafe { slot(rbase, 0, size) },
                        &if stream {
                            Info {
                                len: size,
                                ..Info::default()
                            }
                        } else {
                            info
                        },
                    )?;
                }
                send_and_wait(link, Outgoing::new(p.test, data, &iov).tag(TAG_PONG))?;
            }
        }
        TestKind::AmLat => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count.
            let rb = unsafe { slot(rbase, 0, size) };
            for i in 0..total {
                am.wait_count(link, i + 1, rb, p.check)?;
                send_and_wait(link, Outgoing::new(p.test, data, &iov).am(AM_PONG))?;
            }
        }
        TestKind::AmBw => {
            let am = am.expect("set up for am tests");
            // SAFETY: slot 0, used only by wait_count.
            let rb = unsafe { slot(rbase, 0, size) };
            am.wait_count(link, total, rb, p.check)?;
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBw | TestKind::TagSyncBw if !p.check => {
            let (r, posted) = counted_recvs(link, total, w, rbase, size);
            // A failed run left receives posted into the receive buffers.
            b.keep.set(posted);
            r?;
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBw | TestKind::TagSyncBw => {
            let mut ring: Vec<Option<Request<'_>>> = try_ring(w, || buffers_what(p))?;
            // As ucx_perftest: every receive of the window lands in the same buffer (its
            // contents are not looked at), unless the data is checked.
            let shared = !p.check;
            let post = |k: usize| -> CliResult<Request<'_>> {
                let at = if shared { 0 } else { k * size };
                let buf = courier::Buf::One((rbase as usize + at, size));
                // SAFETY: inside b.recv, which outlives the ring; with `shared`, the
                // receives overwrite one another's bytes, which nobody reads.
                let s = link.check(unsafe {
                    link.worker
                        .tag_recv_raw(buf, TAG_PING, u64::MAX, courier::Callback::None)
                })?;
                // SAFETY: as above.
                Ok(unsafe { link.worker.request_for(s) })
            };
            for (k, s) in ring
                .iter_mut()
                .enumerate()
                .take(total.min(w as u64) as usize)
            {
                *s = Some(post(k)?);
            }
            for i in 0..total {
                let k = (i % w as u64) as usize;
                let mut r = ring[k].take().expect("posted");
                let info = link.wait(&mut r)?;
                drop(r);
                // SAFETY: slot k (or the shared slot 0), its request finished.
                check_tag(
                    link,
                    p,
                    unsafe { slot(rbase, if shared { 0 } else { k }, size) },
                    &info,
                )?;
                if i + (w as u64) < total {
                    if p.check {
                        // SAFETY: as above.
                        unsafe { slot(rbase, k, size) }.fill(0);
                    }
                    ring[k] = Some(post(k)?);
                }
            }
            drop(ring);
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::StreamBw => {
            // SAFETY: slot 0; one receive at a time.
            let rb = unsafe { slot(rbase, 0, size) };
            for _ in 0..total {
                let mut rr = link.check(link.ep.stream_recv_exact(rb))?;
                link.wait(&mut rr)?;
                drop(rr);
                if p.check && !verify(rb) {
                    return Err(CliError::run(format!(
                        "data check failed: stream bytes from {} had wrong contents",
                        link.peer
                    )));
                }
            }
            link.send_ctrl(TAG_FIN, &total.to_le_bytes())?;
        }
        TestKind::TagBibw => {
            let mut sends: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            let mut recvs: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            for _ in 0..total {
                let tags = (TAG_PONG, TAG_PING);
                bibw_round(link, p, (data, &iov), rbase, tags, &mut sends, &mut recvs)?;
            }
        }
        TestKind::TagWinBw => {
            let mut recvs: Vec<Request<'_>> = try_vec(w, || buffers_what(p))?;
            for _ in 0..total {
                win_round_recv(link, p, rbase, &mut recvs)?;
            }
        }
        t => {
            return Err(CliError::run(format!(
                "{}: a one-sided test started without remote keys",
                t.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's extra threads get their links from the first one; asking for threads
    /// again on one of those links is refused, so a client cannot make the server start
    /// threads without end.
    #[test]
    fn threads_are_given_only_on_the_first_link() {
        let stall = Duration::from_secs(20);
        let (ptx, prx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || -> CliResult<()> {
            let w = super::super::make_worker(courier::ThreadMode::Single, Some("tcp"))?;
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
        let w =
            super::super::make_worker(courier::ThreadMode::Single, Some("tcp")).expect("worker");
        let first = connect(&w, addr(port), "server", stall).expect("first link");
        let ports = client_threads(&first, 2).expect("one more link");
        assert_eq!(ports.len(), 1);
        let w2 =
            super::super::make_worker(courier::ThreadMode::Single, Some("tcp")).expect("worker");
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
