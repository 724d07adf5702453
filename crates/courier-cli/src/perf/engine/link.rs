//! A connected endpoint and the ways the test loops wait on it safely: the peer's failure,
//! the stall limit (`--peer-timeout`), the idle side's offers of its CPU, and the client's
//! heartbeat during one-sided tests (`Beat`).
//!
//! A peer that dies is reported by the library (the endpoint's error handler); one that
//! stops (SIGSTOP, a hung host behind a live kernel) is given up on after `Link::stall`
//! without a sign of life (`--peer-timeout`). During one-sided tests, whose operations
//! the server may never see (shared memory), the client proves it is alive with an empty
//! active message (`AM_ALIVE`) every `BEAT` (see `Beat`).

use crate::perf::clock::Instant;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{AmFlags, Endpoint, EndpointParams, Info, Request, Worker};

use super::{AM_ALIVE, CTRL_MAX, TAG_ACK, TAG_CTRL};
use crate::error::{CliError, CliResult};

/// How often a client running a one-sided test sends `AM_ALIVE` and looks at its link.
/// `--peer-timeout` is at least `MIN_STALL`, several beats.
pub(in crate::perf) const BEAT: Duration = Duration::from_millis(200);
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
    pub(in crate::perf) retired: std::cell::RefCell<Vec<courier::Memory>>,
}

#[derive(Default)]
pub(in crate::perf) struct Idle {
    spins: u32,
    since: Option<Instant>,
}

impl Link {
    fn peer_failed(&self, why: &str) -> CliError {
        CliError::run(format!("peer {} failed: {why}", self.peer))
    }

    pub(in crate::perf) fn failed(&self) -> CliError {
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

    pub(in crate::perf) fn req_err(&self, e: &courier::Error) -> CliError {
        if self.failure.is_set() {
            self.failed()
        } else {
            self.peer_failed(&e.to_string())
        }
    }

    /// One progress step; errors if the peer failed or nothing moved for `stall`.
    #[inline]
    pub(in crate::perf) fn poll(&self, idle: &mut Idle) -> CliResult<()> {
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
    pub(in crate::perf) fn wait(&self, r: &mut Request<'_>) -> CliResult<Info> {
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
    pub(in crate::perf) fn check<T>(&self, r: courier::Result<T>) -> CliResult<T> {
        r.map_err(|e| self.req_err(&e))
    }

    /// A raw call's outcome, as `ucx_perftest` takes a `ucp_*_nbx` call's: finished
    /// inside the call, nothing (`None`: no request made, tested or dropped); still in
    /// flight, its request.
    ///
    /// # Safety
    /// The buffers the raw call was given must stay valid for `'a`.
    #[inline]
    pub(in crate::perf) unsafe fn in_flight_raw<'a>(
        &self,
        started: courier::Result<courier::Started>,
    ) -> CliResult<Option<Request<'a>>> {
        match self.check(started)? {
            courier::Started::Done(_) => Ok(None),
            // SAFETY: forwarded contract.
            pending => Ok(Some(unsafe { self.worker.request_for(pending) })),
        }
    }

    pub(in crate::perf) fn send_ctrl(&self, tag: u64, msg: &[u8]) -> CliResult<()> {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = self.check(unsafe { self.ep.tag_send_nb(msg, tag) })?;
        self.wait(&mut r).map(|_| ())
    }

    /// A control request to the server: `msg`, then its answer as text ("ok ..." or why
    /// not).
    pub(super) fn request(&self, msg: &[u8]) -> CliResult<String> {
        self.send_ctrl(TAG_CTRL, msg)?;
        let mut buf = vec![0u8; CTRL_MAX];
        let n = self.recv_ctrl(TAG_ACK, &mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned())
    }

    pub(in crate::perf) fn recv_ctrl(&self, tag: u64, buf: &mut [u8]) -> CliResult<usize> {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = self.check(unsafe { self.worker.tag_recv_nb(buf, tag, u64::MAX) })?;
        let n = self.wait(&mut r)?.length;
        Ok(n)
    }
}

/// A client's heartbeat during a one-sided test: every `BEAT`, an empty `AM_ALIVE` to the
/// server (whose waits then see progress: on shared memory the test's puts, gets and
/// atomics land without it) and a look at the link, so a server that died meanwhile ends
/// the run (those operations complete without this side's progress as well).
pub(in crate::perf) struct Beat {
    next: Instant,
    pending: Option<Request<'static>>,
}

impl Beat {
    pub(in crate::perf) fn new() -> Beat {
        Beat {
            next: Instant::now() + BEAT,
            pending: None,
        }
    }

    /// At `now` (a clock reading the caller has anyway): beat if it is time. `true` if it
    /// did: the time it took is not the next operation's, so the caller reads the clock
    /// again.
    #[inline]
    pub(in crate::perf) fn tick(&mut self, link: &Link, now: Instant) -> CliResult<bool> {
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
        let mut r =
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            link.check(unsafe { link.ep.am_send_nb(AM_ALIVE, &[], &[], AmFlags::default()) })?;
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
