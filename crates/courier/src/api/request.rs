//! `Request`: an operation in flight, completed by polling, waiting, or a callback.
//!
//! # Why borrowing operations are scoped (or blocking, or `unsafe`)
//!
//! A request reads or writes the caller's buffer until it completes: a rendezvous send is
//! read by the peer or the link after `tag_send` returns, a receive or a get is written
//! when the data arrives. A `Request<'a>` borrows the buffer for `'a`, and its `Drop`
//! cancels it or waits for it, so that in a program that drops its requests the borrow
//! checker keeps the buffer alive and untouched for as long as the worker may use it.
//!
//! A destructor is not guaranteed to run, though: `mem::forget(request)` (or a request
//! left in an `Rc` cycle) is safe Rust, ends the borrow without waiting, and would let safe
//! code free or reuse the buffer while the worker still writes it. A request dropped
//! inside a callback cannot wait either (progress does not nest): it is detached and
//! finishes later, again after its borrow ended. Either way safe code could cause
//! undefined behaviour, so the operations that lend a buffer to a request are offered in
//! three ways, as `std::thread::scope` does for threads that borrow:
//!
//! - **Scoped** ([`Worker::scope`](crate::Worker::scope)): `worker.scope(|s| ...)` runs a
//!   closure whose operations (`s.tag_recv(..)`, `s.tag_send(&ep, ..)`, `s.get(&ep, ..)`,
//!   ...) return requests that borrow their buffers for the whole scope. The scope
//!   records every operation that did not complete at once, and before it returns (also
//!   when the closure panics) it waits for each one still in flight, however its request
//!   ended: waited, dropped, dropped inside a callback, or forgotten. So a forgotten
//!   request is harmless: the buffer stays borrowed until the scope returns, and by then
//!   nothing touches it. The wait is bounded as a dropped request's is (twice the
//!   keepalive timeout); past it the endpoint is failed, which takes the link's hands off
//!   the buffer. Nothing is copied: the fast path is the same zero-copy operation.
//! - **Blocking** (`ep.tag_send(data, tag)`, `worker.tag_recv(buf, tag, mask)`,
//!   `ep.put(..)`, `ep.get(..)`, ...): start and wait, returning the completion's
//!   [`Info`]; the borrow lasts only for the call. These are the common `op()?.wait()`.
//! - **Unsafe** (`*_nb`: `ep.tag_send_nb`, `worker.tag_recv_nb`, ...): the same requests
//!   with the contract written down instead of enforced, for code that manages buffer
//!   lifetimes itself (the C ABI, the OpenSHMEM and EXS layers, `courier perf`). See
//!   [`Request`]'s "Safety of borrowing requests".
//!
//! Requests that borrow nothing (atomics, whose old value comes back in the `Info`) stay
//! safe and unscoped. Owned buffers (`Vec` in, `Vec` out) were the other sound choice;
//! they were not taken because they force a copy or an allocation on callers that hold a
//! slice, where the scope costs nothing but one push per operation that did not complete
//! at once.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use super::worker::Worker;
use crate::base::{Error, Result, Status};
use crate::proto::request::Info;
use crate::proto::request::Started;

/// An operation in flight. It borrows the buffer it reads or writes, so the buffer
/// outlives the operation. Dropping a request that is still in flight cancels it if it has
/// not started, otherwise waits for it: at most twice the keepalive timeout (5 to 60 s),
/// after which the endpoint it waits on is failed, with the reason, so that nothing
/// touches the buffer any more.
///
/// Requests that borrow a buffer come from a [`Worker::scope`](crate::Worker::scope)
/// (safe) or from the `unsafe` `*_nb` operations (the module documentation says why).
///
/// ```
/// use std::time::Duration;
/// use courier::{Context, ContextParams, EndpointParams, Status, Worker, WorkerParams};
///
/// let ctx = Context::new(ContextParams::default())?;
/// let worker = Worker::new(&ctx, WorkerParams::default())?;
/// let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
/// let mut buf = [0u8; 16];
/// let info = worker.scope(|s| {
///     let mut recv = s.tag_recv(&mut buf, 5, u64::MAX)?;
///     // Nothing sent yet: a bounded wait gives up, the request stays in flight.
///     let e = recv.wait_timeout(Duration::from_millis(10)).unwrap_err();
///     assert_eq!(e.status(), Status::Timeout);
///     ep.tag_send(b"late", 5)?; // blocking: returns once sent
///     recv.wait() // progresses the worker until done
/// })?;
/// assert_eq!((info.length, info.tag), (4, 5));
/// assert_eq!(&buf[..4], b"late");
/// # Ok::<(), courier::Error>(())
/// ```
///
/// # Safety of borrowing requests
///
/// The `unsafe` operations that return a borrowing request (`Endpoint::tag_send_nb`,
/// `Worker::tag_recv_nb`, `Endpoint::get_nb` and the rest of the `*_nb` family) require
/// of their caller what the borrow checker cannot see:
///
/// - the buffer stays allocated and valid until the request has completed (a `test`
///   that returned `Some`, a `wait` that returned) or its `drop` has returned outside a
///   callback (a drop cancels or waits);
/// - until then it is not written (a send's data, a put's source) or neither read nor
///   written (a receive's or a get's destination) by anyone else;
/// - so the request is never `mem::forget`-ed or leaked while in flight, and never
///   dropped inside a callback (a handler or a completion, which run inside progress)
///   while in flight: there it can only be detached, and it finishes later.
///
/// A scope's requests need none of this: the scope itself waits for them.
///
/// A scoped request cannot leave its scope, and its buffer stays borrowed until the
/// scope ends, so it cannot be freed (or read) while the worker may write it:
///
/// ```compile_fail,E0505
/// # use courier::{Context, ContextParams, Worker, WorkerParams};
/// # let ctx = Context::new(ContextParams::default()).unwrap();
/// # let worker = Worker::new(&ctx, WorkerParams::default()).unwrap();
/// let mut buf = vec![0u8; 16];
/// worker.scope(|s| {
///     let recv = s.tag_recv(&mut buf, 5, u64::MAX).unwrap();
///     std::mem::forget(recv);
///     drop(buf); // error: `buf` is borrowed until the scope ends
/// });
/// ```
///
/// ```compile_fail,E0499
/// # use courier::{Context, ContextParams, Worker, WorkerParams};
/// # let ctx = Context::new(ContextParams::default()).unwrap();
/// # let worker = Worker::new(&ctx, WorkerParams::default()).unwrap();
/// let mut buf = vec![0u8; 16];
/// worker.scope(|s| {
///     let recv = s.tag_recv(&mut buf, 5, u64::MAX).unwrap();
///     std::mem::forget(recv);
///     buf[0] = 1; // error: nor written (or read) while the scope lasts
/// });
/// ```
///
/// ```compile_fail,E0505
/// # use courier::{Context, ContextParams, Worker, WorkerParams};
/// # let ctx = Context::new(ContextParams::default()).unwrap();
/// # let worker = Worker::new(&ctx, WorkerParams::default()).unwrap();
/// let mut buf = vec![0u8; 16];
/// let escaped = worker.scope(|s| s.tag_recv(&mut buf, 5, u64::MAX).unwrap());
/// drop(buf); // error: a scoped request cannot outlive its scope
/// ```
///
/// ```compile_fail,E0133
/// # use courier::{Context, ContextParams, Worker, WorkerParams};
/// # let ctx = Context::new(ContextParams::default()).unwrap();
/// # let worker = Worker::new(&ctx, WorkerParams::default()).unwrap();
/// // Outside a scope the borrowing operations are unsafe.
/// let mut buf = vec![0u8; 16];
/// let recv = worker.tag_recv_nb(&mut buf, 5, u64::MAX).unwrap();
/// std::mem::forget(recv);
/// ```
#[must_use = "a request completes only while the worker progresses; wait() or test() it"]
pub struct Request<'a> {
    /// Only requests still in flight need their worker; completed ones skip the clone.
    worker: Option<Worker>,
    id: u64,
    done: Option<Result<Info>>,
    info: Info,
    /// Made in a scope, which waits for it if it is detached or forgotten.
    scoped: bool,
    _buf: PhantomData<&'a mut [u8]>,
    _not_send: PhantomData<*const ()>,
}

impl<'a> Request<'a> {
    pub(crate) fn new(worker: &Worker, started: Started) -> Request<'a> {
        let (id, done, info, worker) = match started {
            Started::Done(i) => (0, Some(Ok(i)), i, None),
            Started::Pending(id) => (id, None, Info::default(), Some(worker.clone())),
        };
        Request {
            worker,
            id,
            done,
            info,
            scoped: false,
            _buf: PhantomData,
            _not_send: PhantomData,
        }
    }

    /// Whether it has completed (progress the worker to move it on).
    #[inline]
    pub fn test(&mut self) -> Option<&Result<Info>> {
        if self.done.is_none() {
            if let Some(w) = self.worker.as_ref() {
                w.take_result(self.id, &mut self.done, &mut self.info);
            }
        }
        self.done.as_ref()
    }

    /// Whether it has completed.
    pub fn is_done(&mut self) -> bool {
        self.test().is_some()
    }

    /// Progress the worker until the request completes.
    ///
    /// It spends the progress calls that find nothing as [`Backoff`] says: spin, then give
    /// the CPU away now and then, then sleep on the worker between calls.
    pub fn wait(mut self) -> Result<Info> {
        self.wait_inner(None)
    }

    /// Like `wait`, but give up after `timeout` (the request stays in flight).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Info> {
        self.wait_inner(Some(Instant::now() + timeout))
    }

    fn wait_inner(&mut self, deadline: Option<Instant>) -> Result<Info> {
        let mut backoff = Backoff::new();
        loop {
            if let Some(r) = self.test() {
                return r.clone();
            }
            let Some(w) = self.worker.as_ref() else {
                continue;
            };
            if w.progress() > 0 {
                backoff.busy();
            } else {
                // A sleep that cannot be had (the wrong thread) leaves a spin that yields.
                let _ = backoff.idle(w);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(Error::new(
                    Status::Timeout,
                    "request did not complete in time",
                ));
            }
        }
    }

    /// What the operation reported; for a truncated receive, the real message length.
    pub fn info(&self) -> Info {
        self.info
    }

    /// The id of a request still in flight when it was made (for a scope to record).
    pub(super) fn mark_scoped(&mut self) -> Option<(&Worker, u64)> {
        self.scoped = true;
        self.worker.as_ref().map(|w| (w, self.id))
    }

    /// Cancel it if it has not started moving data.
    pub fn cancel(&mut self) -> bool {
        self.done.is_none() && self.worker.as_ref().is_some_and(|w| w.cancel(self.id))
    }
}

/// How a loop that progresses a worker until something happens spends the progress calls
/// that find nothing: `Request::wait` uses it, and so can a program's own loop.
///
/// It spins while things move. Once nothing has for 5 us it gives the CPU away (a
/// `sched_yield`) every 32 calls: the process it waits for may need that CPU, and then runs
/// at once instead of when the scheduler's time slice ends (two processes pinned to one
/// CPU: a tcp round trip in tens of microseconds, not a millisecond), while a wait that
/// ends sooner (a ping-pong where each process has a CPU of its own) makes no system call.
/// After 200 us it sleeps on the worker ([`Worker::wait`], at most 1 ms, ended by any
/// arrival) between calls; a worker without the wakeup feature yields instead.
///
/// A yield that keeps the CPU away for over 500 us means other busy processes had it, not
/// (only) the one waited for: the yielder waits out their time slice, where a sleeper is
/// woken when its data comes. After three such yields within 100 ms, for the next 100 ms,
/// a thread's waits sleep where they would have yielded; and where no peer of the worker
/// needs to ring it awake (its links are all tcp: the kernel wakes a sleeper when bytes
/// come), they look at the clock at every progress call that finds nothing and sleep
/// after 1 us. With the CPUs contended, a waiter that spins while its answer is far off
/// is often left waiting, once woken, for the running process's time slice (up to 1.5 ms
/// here), where one that sleeps at once is mostly run when woken. Over shared memory the
/// spin stays: answers mostly come within microseconds, and each sleep would cost the
/// peer a system call (the doorbell) and the sleeper a wakeup.
///
/// ```no_run
/// # fn f(w: &courier::Worker, done: impl Fn() -> bool) -> courier::Result<()> {
/// let mut b = courier::Backoff::new();
/// while !done() {
///     if w.progress() > 0 {
///         b.busy();
///     } else {
///         b.idle(w)?;
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct Backoff {
    /// Progress calls that found nothing, in a row.
    idle: u32,
    /// The first look at the clock since progress last found something.
    quiet_since: Option<Instant>,
    /// Contended: whether this wait sleeps after `CONTENDED_SPIN` (no peer of the worker
    /// rings it awake), decided at its first contended look.
    eager: Option<bool>,
}

impl Backoff {
    /// Progress calls that find nothing between two looks at the clock.
    const LOOK_EVERY: u32 = 32;
    /// Nothing moved for this long: give the CPU away at each look.
    const YIELD_AFTER: Duration = Duration::from_micros(5);
    /// Nothing moved for this long: sleep on the worker at each look.
    const SPIN: Duration = Duration::from_micros(200);
    /// The longest sleep.
    const NAP: Duration = Duration::from_millis(1);
    /// A yield that took this long says the CPU is contended by others.
    const SLOW_YIELD: Duration = Duration::from_micros(500);
    /// Three slow yields within this time make the thread's waits sleep instead of
    /// yielding, for this time.
    const CONTENDED_FOR: Duration = Duration::from_millis(100);
    /// Contended, with no peer that rings the worker awake, a wait spins only this long
    /// before it sleeps.
    const CONTENDED_SPIN: Duration = Duration::from_micros(1);

    /// A new wait: it spins first.
    pub fn new() -> Backoff {
        Backoff::default()
    }

    /// A progress call found something: spin again.
    #[inline]
    pub fn busy(&mut self) {
        self.idle = 0;
        self.quiet_since = None;
    }

    /// A progress call found nothing: spin on, give the CPU away, or sleep on `worker`, by
    /// how long nothing has moved. Where the sleep cannot be had it yields instead, and
    /// returns the error unless it is only that the worker lacks the wakeup feature (the
    /// wrong thread for a single-thread worker, a worker that is gone).
    #[inline]
    pub fn idle(&mut self, worker: &Worker) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        // Look at the clock once in 32 calls, or at every call in an eager contended wait.
        let look = self.idle.is_multiple_of(Self::LOOK_EVERY)
            || (CONTENDED.get() && self.eager != Some(false));
        if !look {
            return Ok(());
        }
        self.pause(worker)
    }

    #[inline(never)]
    fn pause(&mut self, worker: &Worker) -> Result<()> {
        let now = Instant::now();
        let contended = CONTENTION.with(|c| c.get().sleeps_now(now));
        if !contended && CONTENDED.get() {
            CONTENDED.set(false);
        }
        let eager = contended
            && *self
                .eager
                .get_or_insert_with(|| !worker.sleep_rings_peers());
        match self.step(now, contended, eager) {
            Step::Spin => {}
            Step::Yield => {
                std::thread::yield_now();
                let back = Instant::now();
                if back.duration_since(now) >= Self::SLOW_YIELD {
                    slow_yield_at(back);
                }
            }
            Step::Sleep => {
                if let Err(e) = worker.wait(Some(Self::NAP)) {
                    std::thread::yield_now();
                    if e.status() != Status::Unsupported {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// What a look at the clock at `now` decides; `contended`: this thread's yields have
    /// been slow (`Contention`), so it sleeps where it would yield, and with `eager` after
    /// `CONTENDED_SPIN`.
    fn step(&mut self, now: Instant, contended: bool, eager: bool) -> Step {
        let quiet = now.duration_since(*self.quiet_since.get_or_insert(now));
        let sleep_after = if eager {
            Self::CONTENDED_SPIN
        } else {
            Self::YIELD_AFTER
        };
        if quiet >= Self::SPIN || (contended && quiet >= sleep_after) {
            Step::Sleep
        } else if quiet >= Self::YIELD_AFTER {
            Step::Yield
        } else {
            Step::Spin
        }
    }
}

/// A thread's recent slow yields (`Backoff::SLOW_YIELD`).
#[derive(Clone, Copy, Default)]
struct Contention {
    /// When the two slow yields before the next came back, the older first.
    last: [Option<Instant>; 2],
    /// Waits sleep instead of yielding until then.
    until: Option<Instant>,
}

impl Contention {
    fn sleeps_now(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }

    /// A yield came back slow at `at`: the third within `CONTENDED_FOR` (a sliding
    /// window) makes waits sleep for that long.
    fn slow_yield(mut self, at: Instant) -> Contention {
        let window = Backoff::CONTENDED_FOR;
        let [older, newer] = self.last;
        if older.is_some_and(|o| at.duration_since(o) <= window) {
            (self.last, self.until) = ([None, None], Some(at + window));
        } else {
            self.last = [newer, Some(at)];
        }
        self
    }
}

thread_local! {
    static CONTENTION: std::cell::Cell<Contention> = const {
        std::cell::Cell::new(Contention { last: [None, None], until: None })
    };
    /// Whether this thread's waits were last seen contended (`Contention::sleeps_now`):
    /// then `Backoff::idle` looks at the clock at every call, not once in 32. Set when
    /// contention starts; cleared at the first look after it ends.
    static CONTENDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A yield of this thread's came back slow at `at` (`Contention::slow_yield`); the third
/// within `CONTENDED_FOR` makes its waits contended (`CONTENDED`).
fn slow_yield_at(at: Instant) {
    let c = CONTENTION.with(|c| {
        c.set(c.get().slow_yield(at));
        c.get()
    });
    CONTENDED.set(c.sleeps_now(at));
}

/// What `Backoff` does at a look at the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Spin,
    Yield,
    Sleep,
}

impl Drop for Request<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.done.is_none() {
            self.drop_in_flight();
        }
    }
}

impl Request<'_> {
    /// Dropped before it completed: cancel it, or wait for it.
    #[cold]
    #[inline(never)]
    fn drop_in_flight(&mut self) {
        self.finish(true);
    }

    /// Request `id` of `worker`, started in a scope that now ends: if it is still in
    /// flight (its request was forgotten, or dropped inside a callback), cancel it or wait
    /// for it as a drop does, but never leave it running: the scope's buffers are free to
    /// the caller once this returns.
    pub(super) fn settle(worker: &Worker, id: u64) {
        if !worker.reclaim(id) {
            return;
        }
        let mut r = Request {
            worker: Some(worker.clone()),
            id,
            done: None,
            info: Info::default(),
            scoped: true,
            _buf: PhantomData,
            _not_send: PhantomData,
        };
        r.finish(false);
        // Completed: nothing of it is left to drop.
        debug_assert!(r.done.is_some());
    }

    /// Cancel the request, or wait for it (bounded, then its endpoint is failed). Inside
    /// a callback no wait is possible: with `may_detach` it is detached (a `Request`'s
    /// drop, whose buffer the caller vouched for or a scope waits for); without, its
    /// endpoint is failed at once, and if even that cannot end it the process aborts
    /// rather than let the buffer go while the worker may still write it.
    fn finish(&mut self, may_detach: bool) {
        let Some(w) = self.worker.clone() else { return };
        if w.cancel(self.id) {
            let _ = self.test();
            return;
        }
        if w.in_progress() {
            if may_detach {
                // Dropped inside a callback: cannot progress here; the request finishes on
                // its own (a scope waits for it at its end).
                if self.scoped {
                    tracing::debug!(
                        "a scoped request in flight was dropped inside a callback; its scope waits for it"
                    );
                } else {
                    tracing::warn!(
                        "a request in flight was dropped inside a callback; its buffer must stay valid until it completes"
                    );
                }
                w.detach(self.id);
                return;
            }
            let why = Error::new(
                Status::Canceled,
                "a scope ended inside a callback with this request in flight; its endpoint is closed so that nothing touches the scope's buffers any more",
            );
            tracing::warn!("{}", why.detail());
            w.abandon(self.id, why);
            if self.test().is_none() {
                tracing::error!(
                    "a scope ended inside a callback with a request in flight that could be neither canceled nor failed: aborting rather than free a buffer the worker may write"
                );
                std::process::abort();
            }
            return;
        }
        // Wait for it, as long as a flush would: its buffer is borrowed until it finishes.
        // A peer that is alive but stopped (or never answers) would hold the drop forever,
        // so past that limit its endpoint is failed, which takes the link's hands off the
        // buffer and completes the request with the reason.
        let limit = w.context().config().give_up_after();
        let timed_out = matches!(
            self.wait_inner(Instant::now().checked_add(limit)),
            Err(e) if e.status() == Status::Timeout
        );
        if !timed_out || self.done.is_some() {
            return;
        }
        let why = Error::msg(
            Status::Timeout,
            format!(
                "a request dropped while in flight did not finish within {limit:?}; the endpoint it waited on is closed so that nothing touches its buffer any more"
            ),
        );
        tracing::warn!("{}", why.detail());
        if !w.abandon(self.id, why) {
            tracing::warn!(
                "the dropped request waits on no endpoint: waiting on until it finishes"
            );
        }
        let _ = self.wait_inner(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_sleeps_and_busy_starts_over() {
        use Step::{Sleep, Spin, Yield};
        let t0 = Instant::now();
        let mut b = Backoff::new();
        /// A quiet time (after a `busy`): contended or not, eager or not, and the step at
        /// each look, by the microseconds since its first look.
        type QuietTime = (bool, bool, &'static [(u64, Step)]);
        let quiet_times: [QuietTime; 4] = [
            // Uncontended: spin, yield after 5 us, sleep after 200 us.
            (
                false,
                false,
                &[
                    (0, Spin),
                    (4, Spin),
                    (5, Yield),
                    (199, Yield),
                    (200, Sleep),
                    (5000, Sleep),
                ],
            ),
            (
                false,
                false,
                &[(0, Spin), (4, Spin), (5, Yield), (200, Sleep)],
            ),
            // Contended: spin, then sleep where it would have yielded.
            (true, false, &[(0, Spin), (4, Spin), (5, Sleep)]),
            // Contended with no peer that rings the worker awake: sleep after 1 us.
            (true, true, &[(0, Spin), (1, Sleep), (4, Sleep)]),
        ];
        let mut start = 0;
        for (contended, eager, looks) in quiet_times {
            b.busy();
            start += 10_000;
            for &(us, want) in looks {
                let at = t0 + Duration::from_micros(start + us);
                assert_eq!(
                    b.step(at, contended, eager),
                    want,
                    "{us} us into a quiet time, contended {contended}, eager {eager}"
                );
            }
        }
    }

    #[test]
    fn three_slow_yields_in_100ms_make_waits_sleep_for_100ms() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = Contention::default();
        // Two slow yields, then the third after the window: not contended.
        c = c.slow_yield(at(0)).slow_yield(at(50));
        assert!(!c.sleeps_now(at(60)));
        c = c.slow_yield(at(150));
        assert!(!c.sleeps_now(at(160)));
        // Three within 100 ms: contended for the next 100 ms.
        c = c.slow_yield(at(200)).slow_yield(at(210));
        assert!(c.sleeps_now(at(211)) && c.sleeps_now(at(309)));
        assert!(!c.sleeps_now(at(311)));
        // The window slides: at 499, 501 and 550 (three within 51 ms).
        let mut c = Contention::default();
        c = c.slow_yield(at(499)).slow_yield(at(501));
        assert!(!c.sleeps_now(at(510)));
        c = c.slow_yield(at(550));
        assert!(c.sleeps_now(at(551)));
    }

    /// A worker with no links, and this thread contended by three slow yields.
    fn contended_worker() -> (crate::Context, Worker) {
        let ctx = crate::Context::new(crate::ContextParams::default()).unwrap();
        let w = Worker::new(&ctx, crate::WorkerParams::default()).unwrap();
        let now = Instant::now();
        slow_yield_at(now);
        slow_yield_at(now);
        assert!(!CONTENDED.get(), "contended after two slow yields");
        slow_yield_at(now);
        assert!(CONTENDED.get(), "not contended after three slow yields");
        (ctx, w)
    }

    #[test]
    fn contended_waits_look_at_every_idle_call_until_contention_ends() {
        let (_ctx, w) = contended_worker();
        let mut b = Backoff::new();
        b.idle(&w).unwrap();
        assert!(
            b.quiet_since.is_some(),
            "a contended wait did not look at once"
        );
        // Contention over: the next look clears the flag, and looks are 1 in 32 again.
        CONTENTION.with(|cell| cell.set(Contention::default()));
        b.busy();
        b.idle(&w).unwrap();
        assert!(!CONTENDED.get(), "the flag outlived the contention");
        b.busy();
        b.idle(&w).unwrap();
        assert!(
            b.quiet_since.is_none(),
            "looked at the first idle call uncontended"
        );
    }

    #[test]
    fn contended_waits_are_eager_only_where_no_peer_rings_the_worker() {
        let (_ctx, w) = contended_worker();
        // A worker with no links: no peer rings it, so the wait is eager from its first
        // idle call on.
        let mut b = Backoff::new();
        b.idle(&w).unwrap();
        assert_eq!(b.eager, Some(true));
        assert!(
            b.quiet_since.is_some(),
            "an eager wait did not look at once"
        );
        // A wait whose worker some peer rings looks once in 32 calls, as uncontended.
        let mut b = Backoff {
            eager: Some(false),
            ..Backoff::default()
        };
        for _ in 0..31 {
            b.idle(&w).unwrap();
        }
        assert!(b.quiet_since.is_none(), "looked before the 32nd idle call");
        b.idle(&w).unwrap();
        assert!(b.quiet_since.is_some(), "no look at the 32nd idle call");
        CONTENDED.set(false);
        CONTENTION.with(|c| c.set(Contention::default()));
    }

    #[test]
    fn backoff_looks_at_the_clock_once_in_32_idle_calls() {
        let mut b = Backoff::new();
        let ctx = crate::Context::new(crate::ContextParams::default()).unwrap();
        let w = Worker::new(&ctx, crate::WorkerParams::default()).unwrap();
        for _ in 0..31 {
            b.idle(&w).unwrap();
        }
        assert!(b.quiet_since.is_none(), "looked before the 32nd idle call");
        b.idle(&w).unwrap();
        assert!(b.quiet_since.is_some(), "no look at the 32nd idle call");
        b.busy();
        assert_eq!((b.idle, b.quiet_since), (0, None));
    }
}
