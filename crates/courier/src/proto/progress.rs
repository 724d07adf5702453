//! The progress loop: what one call of `Worker::progress` does.
//!
//! Progress is explicit: nothing moves unless the application progresses the worker (or
//! waits on something, which progresses). A call first asks `State::work` what there is
//! to do, with a few loads and no system call when the answer is nothing; frames on one
//! link that can be read in place (the latency case) take a short path of their own;
//! everything else takes the general pass, which also reads epoll now and then (every
//! [`EPOLL_EVERY`] calls, or every call while connections are being set up). Callbacks
//! (completions, endpoint errors, connection requests, active-message handlers) run with
//! the state unlocked, so they may send and receive on the same worker.

use std::any::Any;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::epoll;

use super::State;
use super::am::AmDelivery;
use super::fdpoll::{self, token};
use super::recv::{Eager, PollOne};
use super::request::ErrorHandler;
use super::request::{Callback, Info, RawFn};
use crate::base::lock::{Guard, StateCell};
use crate::base::{Error, Result, Status};

/// What a progress call has to do (`State::work`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Work {
    Nothing,
    /// Frames on the link of this endpoint, which reads them in place
    /// (`Caps::frames_in_place`), and nothing else.
    InPlaceFrames(u32),
    Other,
}

/// Work to run outside the state lock (user code).
pub(crate) enum Deferred {
    Req(Callback, Result<Info, Error>, Info),
    EpError(ErrorHandler, Error),
    Conn(u32, crate::proto::wireup::ConnRequest),
}

/// How often (in progress calls, a power of two) progress asks epoll about links that
/// signal only through their fd (shared memory: wakeups and a peer's hang-up), listeners,
/// new connections and the event fd, when nothing else makes it look.
pub(crate) const EPOLL_EVERY: u64 = 256;

/// The progress loop's state.
pub(crate) struct ProgressState {
    /// The worker's epoll set.
    pub(super) epoll: OwnedFd,
    /// The event fd `Worker::signal` writes.
    pub(super) eventfd: OwnedFd,
    /// Progress calls so far.
    pub(super) calls: u64,
    /// A progress call is running (its callbacks may not progress again).
    pub(super) in_progress: bool,
    /// Endpoints with a link, polled by progress.
    pub(super) active: Vec<u32>,
    /// Links whose data arrives only through their fd (`fdpoll`).
    pub(super) fd_links: usize,
    /// Whether the fds of fd links are in the epoll set (`fdpoll`: only while the worker
    /// may sleep or watches too many links to read each one).
    pub(super) fd_watched: bool,
    /// `calls` at the last `arm`.
    pub(super) armed_at: u64,
    /// Work to run outside the lock (user callbacks).
    pub(super) deferred: Vec<Deferred>,
    /// An emptied `deferred`, swapped in when the callbacks run.
    pub(super) deferred_spare: Vec<Deferred>,
    /// Endpoints whose links must be dropped once no handler runs on them.
    pub(super) reap: Vec<u32>,
    /// Links that failed while frames were still buffered: fail after those are handled.
    pub(super) link_errors: Vec<(u32, Error)>,
}

impl ProgressState {
    /// A fresh state around the worker's epoll set and event fd.
    pub(super) fn new(epoll: OwnedFd, eventfd: OwnedFd) -> ProgressState {
        ProgressState {
            epoll,
            eventfd,
            calls: 0,
            in_progress: false,
            active: Vec::new(),
            fd_links: 0,
            fd_watched: false,
            armed_at: 0,
            deferred: Vec::new(),
            deferred_spare: Vec::new(),
            reap: Vec::new(),
            link_errors: Vec::new(),
        }
    }
}

/// One worker's progress: its state, and the API object that runs it (the `Worker`), which
/// active-message handlers get at each call.
pub(crate) struct Progress<'a> {
    pub(crate) cell: &'a StateCell<State>,
    pub(crate) owner: &'a dyn Any,
}

impl<'a> Progress<'a> {
    /// One progress call: handle arrived frames, retry queued sends, run callbacks. Returns
    /// how many events were handled.
    #[inline]
    pub(crate) fn progress(&self) -> usize {
        let Ok(mut g) = self.cell.lock() else {
            return 0;
        };
        if g.progress.in_progress {
            return 0;
        }
        g.progress.calls = g.progress.calls.wrapping_add(1);
        // Spinning callers mostly find nothing: answer them without the machinery below,
        // and a frame on the one busy link that reads frames in place with only what it
        // needs.
        match g.work() {
            Work::Nothing => 0,
            Work::InPlaceFrames(e) => self.progress_frames(g, e),
            Work::Other => {
                g.rndv.copy_spent = 0;
                self.progress_work(g)
            }
        }
    }

    /// `progress_work` when its only work is frames on the in-place link of endpoint `e`
    /// (`State::work`): the eager tag and active messages of a latency test, handled
    /// without the general pass. Whatever else turns up (another kind of frame, a send
    /// queued by a handler, a copy, a failure) goes on to `progress_work`.
    #[inline(never)]
    fn progress_frames<'g>(&'g self, mut g: Guard<'g, State>, e: u32) -> usize {
        g.progress.in_progress = true;
        // About one piece's bytes of copies per progress call, also when `progress_work`
        // follows.
        g.rndv.copy_spent = 0;
        let mut n = 0;
        let mut rest = false;
        for _ in 0..32 {
            match g.poll_eager(e) {
                Eager::Done(PollOne::Empty) => break,
                Eager::Done(PollOne::Handled) => n += 1,
                Eager::Done(PollOne::Am(am)) => {
                    n += 1;
                    g = self.run_am(g, am);
                }
                Eager::Other => {
                    rest = true;
                    break;
                }
            }
            if !g.rx_maybe_ready(e) {
                break;
            }
        }
        g.progress.in_progress = false;
        if rest || g.tx_busy(e) || !g.progress.link_errors.is_empty() || !g.rndv.copies.is_empty() {
            return n + self.progress_work(g);
        }
        // Callbacks of the receives completed above (a counted receive's, as in a
        // bandwidth test): run here, without a pass over everything for them.
        if !g.progress.deferred.is_empty() {
            n += self.run_deferred_of(g);
        }
        n
    }

    /// The general pass of a progress call (`copy_spent` reset by the caller: once per
    /// call, however it got here).
    #[inline(never)]
    fn progress_work<'g>(&'g self, mut g: Guard<'g, State>) -> usize {
        g.progress.in_progress = true;
        let mut n = 0;
        let has_conns = g.conns_in_setup();
        // Coalesced sends leave before we look for their answers.
        let direct = g.progress.fd_links > 0 && g.progress.fd_links <= fdpoll::DIRECT_POLL_LINKS;
        if g.progress.fd_links > 0 {
            n += g.flush_fd_links().1;
        }
        let every = if direct {
            fdpoll::DIRECT_EPOLL_EVERY
        } else {
            EPOLL_EVERY
        };
        if (g.progress.fd_links > 0 && !direct) || has_conns || g.progress.calls & (every - 1) == 0
        {
            n += g.progress_events();
            n += g.progress_conns();
            g.keepalive_tick();
            if direct && g.watched_idle() {
                g.unwatch_fd_links();
            }
        }
        if direct {
            g.read_fd_links();
        }
        let mut i = 0;
        while i < g.progress.active.len() {
            let e = g.progress.active[i];
            let ready = g.rx_maybe_ready(e);
            if !ready && !g.tx_busy(e) {
                // The common idle case: nothing in, nothing queued.
                i += 1;
                continue;
            }
            for _ in 0..32 {
                match g.poll_one(e) {
                    PollOne::Empty => break,
                    PollOne::Handled => n += 1,
                    PollOne::Am(am) => {
                        n += 1;
                        g = self.run_am(g, am);
                    }
                }
                // A shared-memory link says with one load whether another frame is there.
                if !g.rx_maybe_ready(e) {
                    break;
                }
            }
            // Handlers may have queued answers behind the first (a burst): out they go.
            if g.tx_busy(e) {
                n += g.progress_tx(e);
            }
            i += 1;
        }
        // About one piece's bytes per call, counting copies the frames above started.
        if !g.rndv.copies.is_empty() {
            n += g.progress_copies();
        }
        // Memory of failed endpoints' messages and queued frames, a batch at a time (not
        // an event).
        if g.has_dropped() {
            g.reclaim_dropped();
        }
        if !g.progress.link_errors.is_empty() {
            let errs = std::mem::take(&mut g.progress.link_errors);
            for (e, err) in errs {
                let more = g
                    .ep(e)
                    .and_then(|ep| ep.rx.as_mut())
                    .map(|rx| matches!(rx.peek(), Ok(Some(_))))
                    .unwrap_or(false);
                if more {
                    g.progress.link_errors.push((e, err));
                } else {
                    g.fail_ep(e, err);
                }
            }
        }
        g.progress.in_progress = false;
        if g.progress.deferred.is_empty() {
            return n;
        }
        n + self.run_deferred_of(g)
    }

    /// Run the callbacks this progress call queued, with the state released; how many.
    fn run_deferred_of<'g>(&'g self, mut g: Guard<'g, State>) -> usize {
        let spare = std::mem::take(&mut g.progress.deferred_spare);
        let mut deferred = std::mem::replace(&mut g.progress.deferred, spare);
        drop(g);
        let n = deferred.len();
        self.run_deferred(&mut deferred);
        // The emptied vector serves a later progress call (callbacks come in every call that
        // completes operations started with one: no allocation for each).
        if let Ok(mut g) = self.cell.lock() {
            g.progress.deferred_spare = deferred;
        }
        n
    }

    fn run_deferred(&self, deferred: &mut Vec<Deferred>) {
        for d in deferred.drain(..) {
            match d {
                Deferred::Req(Callback::Rust(f), r, _) => f(r),
                Deferred::Req(Callback::Raw(f, user), r, info) => f(user, r, info),
                Deferred::Req(Callback::None, _, _) => {}
                Deferred::EpError(mut h, err) => h(&err),
                Deferred::Conn(l, req) => {
                    let handler = self.cell.lock().ok().and_then(|mut g| {
                        g.wireup
                            .listeners
                            .slots
                            .get_mut(l as usize)
                            .and_then(|s| s.handler.take())
                    });
                    match handler {
                        Some(mut h) => {
                            h(req);
                            if let Ok(mut g) = self.cell.lock() {
                                if let Some(s) = g
                                    .wireup
                                    .listeners
                                    .slots
                                    .get_mut(l as usize)
                                    .filter(|s| s.live && s.handler.is_none())
                                {
                                    s.handler = Some(h);
                                }
                            }
                        }
                        None => {
                            if let Ok(mut g) = self.cell.lock() {
                                g.conn_reject(&req);
                            }
                        }
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn run_am<'g>(
        &'g self,
        mut g: Guard<'g, State>,
        mut d: AmDelivery<'static>,
    ) -> Guard<'g, State> {
        let e = d.ep.0;
        let id = d.id;
        let handler = g.am.handlers.get_mut(id as usize).and_then(|h| h.take());
        let Some(mut h) = handler else {
            let peer = g.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
            tracing::warn!("active message with id {id} from {peer} has no handler; dropped");
            if let Some(r) = d.rndv {
                g.am_decline(*r);
            }
            g.finish_am(e);
            return g;
        };
        // The frame stays unconsumed (rx_busy) until finish_am below.
        let (mut g, ()) = g.unlocked(|| h(&mut d, self.owner));
        if let Some(slot) = g.am.handlers.get_mut(id as usize) {
            if slot.is_none() {
                *slot = Some(h);
            }
        }
        if let Some(r) = d.rndv.take() {
            g.am_decline(*r);
        }
        g.finish_am(e);
        g
    }
}

impl State {
    /// Queue the completion of a request whose callback runs outside the lock.
    #[inline(always)]
    pub(super) fn defer_completion(
        &mut self,
        cb: Callback,
        result: Result<Info, Error>,
        info: Info,
    ) {
        self.progress.deferred.push(Deferred::Req(cb, result, info));
    }

    /// Queue a plain function's successful completion (`Vec::push`, in line on the
    /// small-message path). Room is made first and the entry built in place: built before
    /// a possible `reserve` call, it would be spilled whole and copied back in wide loads
    /// of the narrow stores that built it, which the CPU cannot forward.
    #[inline(always)]
    pub(super) fn defer_raw_ok(&mut self, f: RawFn, user: usize, info: Info) {
        if self.progress.deferred.len() == self.progress.deferred.capacity() {
            self.progress.deferred.reserve(32);
        }
        let at = self.progress.deferred.len();
        // SAFETY: there is room for one more element (reserved above); writing it past the
        // end and then counting it is what `push` does.
        unsafe {
            self.progress
                .deferred
                .as_mut_ptr()
                .add(at)
                .write(Deferred::Req(Callback::Raw(f, user), Ok(info), info));
            self.progress.deferred.set_len(at + 1);
        }
    }

    /// Queue an endpoint's error handler (`Deferred::EpError`).
    pub(super) fn defer_ep_error(&mut self, h: ErrorHandler, err: Error) {
        self.progress.deferred.push(Deferred::EpError(h, err));
    }

    /// Queue a listener's handler for a connection request.
    pub(super) fn defer_conn(&mut self, listener: u32, req: crate::proto::wireup::ConnRequest) {
        self.progress.deferred.push(Deferred::Conn(listener, req));
    }

    /// Drop the endpoint error handlers queued so far (a local close calls none).
    pub(super) fn drop_deferred_ep_errors(&mut self) {
        self.progress
            .deferred
            .retain(|d| !matches!(d, Deferred::EpError(..)));
    }

    /// Whether a progress call is running (a request dropped inside a callback cannot
    /// progress the worker itself).
    pub(crate) fn in_progress(&self) -> bool {
        self.progress.in_progress
    }

    /// Make the next progress call read epoll (it does every `EPOLL_EVERY` calls, a
    /// multiple of `fdpoll::DIRECT_EPOLL_EVERY`): after a sleep ended by an event.
    pub(crate) fn epoll_next(&mut self) {
        self.progress.calls |= EPOLL_EVERY - 1;
    }

    /// What a progress call (already counted in `progress_calls`) has to do: nothing (no
    /// fd link to poll, no connection being set up, not epoll's turn, no failure or
    /// callback to deliver, no copy with pieces to make, and no active link with a frame
    /// waiting or sends queued: the idle case of a spinning caller on shared memory,
    /// answered with a few loads); only frames on one shared-memory link (the latency
    /// case, which `Progress::progress_frames` handles without the general pass); or
    /// anything else.
    #[inline]
    pub(crate) fn work(&self) -> Work {
        if self.progress.fd_links != 0
            || self.progress.calls & (EPOLL_EVERY - 1) == 0
            || self.conns_in_setup()
            || !self.progress.link_errors.is_empty()
            || !self.progress.deferred.is_empty()
            || !self.rndv.copies.is_empty()
            || self.has_dropped()
        {
            return Work::Other;
        }
        let mut found = Work::Nothing;
        for &e in &self.progress.active {
            let Some(ep) = self.eps.slots.get(e as usize) else {
                continue;
            };
            if !ep.pending.is_empty() || !ep.push.is_empty() {
                return Work::Other;
            }
            let Some(rx) = &ep.rx else {
                continue;
            };
            match rx.in_place_ready() {
                Some(true) => {
                    if found != Work::Nothing {
                        return Work::Other;
                    }
                    found = Work::InPlaceFrames(e);
                }
                Some(false) => {}
                None if rx.maybe_ready() => return Work::Other,
                None => {}
            }
        }
        found
    }

    /// Whether connections are being set up that need looking at: accepted ones on links
    /// whose data does not come through their socket (shared memory, polled while the
    /// worker spins), links this side is setting up over several steps, and ones an
    /// acceptor is in the middle of. Until each is done, every progress call reads epoll
    /// and moves them on, so a spinning worker is not held to its periodic epoll pass.
    /// Accepted tcp connections waiting for their first frame are looked at only when
    /// epoll says their socket is readable (`limits.rs`): idle ones cost nothing.
    #[inline]
    pub(crate) fn conns_in_setup(&self) -> bool {
        self.limits.polled_conns != 0
            || !self.wireup.setups.is_empty()
            || !self.wireup.auths.is_empty()
            || self.wireup.acceptors.setting_up()
    }

    /// Whether endpoint `idx` has sends to retry or push, or its link has queued bytes or
    /// written zero-copy sends to report: what `progress_tx` is for.
    #[inline]
    pub(crate) fn tx_busy(&self, idx: u32) -> bool {
        self.eps.slots.get(idx as usize).is_some_and(|ep| {
            !ep.pending.is_empty()
                || !ep.push.is_empty()
                || ep.tx.as_ref().is_some_and(|tx| tx.has_work())
        })
    }

    /// Whether endpoint `idx`'s link may hold a frame: one load on shared memory; on tcp,
    /// whether bytes are buffered (its socket is read before, by `read_fd_links` or epoll).
    #[inline]
    pub(crate) fn rx_maybe_ready(&self, idx: u32) -> bool {
        self.eps
            .slots
            .get(idx as usize)
            .and_then(|ep| ep.rx.as_ref())
            .is_some_and(|rx| rx.maybe_ready())
    }

    /// Handle ready fds. Returns events handled.
    pub(crate) fn progress_events(&mut self) -> usize {
        let mut events = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }; 32];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let n = match epoll::wait(&self.progress.epoll, &mut events, Some(&zero)) {
            Ok(n) => n,
            Err(_) => return 0,
        };
        let mut handled = 0;
        for ev in &events[..n] {
            let (kind, idx) = token::split(ev.data.u64());
            match kind {
                token::EP => {
                    use epoll::EventFlags as F;
                    let flags = { ev.flags };
                    if flags.contains(F::OUT) {
                        handled += self.on_writable(idx);
                    }
                    if !flags.intersects(F::IN | F::RDHUP | F::ERR | F::HUP) {
                        continue;
                    }
                    let r = self
                        .ep(idx)
                        .and_then(|ep| ep.rx.as_mut())
                        .map(|rx| rx.on_readable());
                    if let Some(Err(err)) = r {
                        // Frames already buffered are still delivered before the failure.
                        self.drain_then_fail(idx, err);
                    }
                    handled += 1;
                }
                token::PENDING => handled += self.pending_step(idx),
                token::ACCEPT => handled += self.accept_from(idx),
                token::LISTENER => handled += self.accept_listener(idx),
                // Only a wakeup: `progress_conns`, which runs right after this, moves
                // every setup on (the watched ones and any that could not be watched).
                token::SETUP => {}
                token::EVENT => {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.progress.eventfd, &mut b);
                    handled += 1;
                }
                _ => {}
            }
        }
        handled
    }

    /// Remember a link failure; the endpoint fails once its buffered frames are handled.
    /// A limit the link reached (`COURIER_MAX_RX_BUFFERED`) is a peer's doing: warned about,
    /// rate-limited, as the protocol's own limits are.
    pub(crate) fn drain_then_fail(&mut self, e: u32, err: Error) {
        if err.status() == Status::NoResource {
            self.warn_peer(err.detail());
        }
        let has_frame = self
            .ep(e)
            .and_then(|ep| ep.rx.as_mut())
            .map(|rx| matches!(rx.peek(), Ok(Some(_))))
            .unwrap_or(false);
        if has_frame {
            self.progress.link_errors.push((e, err));
        } else {
            self.fail_ep(e, err);
        }
    }

    /// Whether some link of this worker's is woken, when the worker sleeps, by its peer's
    /// doing (shared memory: a wakeup byte the peer writes after its message), not by the
    /// kernel when bytes come (tcp).
    pub(crate) fn sleep_rings_peers(&self) -> bool {
        self.progress.active.len() > self.progress.fd_links
    }

    /// Arm every link for sleeping. `Ok(false)`: something is already waiting.
    pub(crate) fn arm(&mut self) -> Result<bool> {
        // A link setup's reply wakes the worker through epoll where its fd is watched; one
        // that could not be watched is polled, so no sleep then.
        if !self.progress.deferred.is_empty()
            || !self.progress.link_errors.is_empty()
            || !self.rndv.copies.is_empty()
            || self.has_dropped()
            || self.wireup.setups.iter().any(|c| !c.watched)
            || !self.arm_auths()?
        {
            return Ok(false);
        }
        for &e in &self.progress.active.clone() {
            if let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) {
                if !rx.arm()? {
                    return Ok(false);
                }
            }
            // Queued frames wait for progress, unless the link refused them for want of
            // room and the peer's reading wakes the worker (tcp: `arm_fd_links` watches
            // the fd for room; shm: the consumer sends a wakeup byte): then it sleeps
            // instead of spinning until the peer reads.
            if self.ep(e).is_some_and(|ep| {
                (!ep.pending.is_empty() || !ep.push.is_empty())
                    && !ep.tx.as_mut().is_some_and(|tx| tx.wakes_on_room())
            }) {
                return Ok(false);
            }
        }
        for p in self
            .wireup
            .pending_conns
            .slots
            .iter_mut()
            .filter(|p| p.live && !p.offered)
        {
            if let Some(rx) = p.rx.as_mut() {
                if !rx.arm()? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The event fd `Worker::signal` writes.
    pub(crate) fn eventfd_as_fd(&self) -> BorrowedFd<'_> {
        self.progress.eventfd.as_fd()
    }

    /// The worker's epoll set.
    pub(crate) fn epoll_as_fd(&self) -> BorrowedFd<'_> {
        self.progress.epoll.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_rings_peers_when_some_active_link_is_not_an_fd_link() {
        let mut s = State::for_test("rings");
        assert!(!s.sleep_rings_peers(), "no link");
        s.progress.active = vec![1, 2];
        s.progress.fd_links = 2;
        assert!(!s.sleep_rings_peers(), "tcp links only");
        s.progress.fd_links = 1;
        assert!(s.sleep_rings_peers(), "a shm link among them");
    }
}
