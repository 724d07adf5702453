//! `Worker`: the progress engine, its address, and its event fd.
//!
//! Nothing moves unless the application calls `progress` (or waits on a request, which
//! progresses). Callbacks run inside `progress`, on the progressing thread, with the
//! worker's state unlocked, so they may send and receive.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::epoll;

use super::context::Context;
use super::endpoint::{Endpoint, EndpointParams, wait_now};
use super::request::Request;
use crate::base::lock::{Guard, StateCell, ThreadMode};
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::am::{AmDelivery, AmRndv};
use crate::proto::buf::Buf;
use crate::proto::progress::Progress;
use crate::proto::request::Started;
use crate::proto::request::{Callback, Info, RawFn};
use crate::proto::tag::ProbeInfo;

pub(crate) struct WorkerInner {
    pub cell: StateCell<State>,
    pub ctx: Context,
    pub mode: ThreadMode,
    pub epoll_raw: RawFd,
    /// The wakeup eventfd (owned by the state; valid as long as the worker).
    pub event_raw: RawFd,
    /// Some endpoint has operations through an owner that a fence must wait for (the
    /// state's `OnesidedState::mixed`, read without the lock).
    pub rma_mixed: Arc<std::sync::atomic::AtomicBool>,
}

/// Parameters of a worker.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerParams {
    /// Thread mode.
    pub thread_mode: ThreadMode,
}

/// A progress engine with its own address and connections.
///
/// Nothing moves unless it progresses: call [`Worker::progress`] in a loop, or wait on a
/// request (which progresses). Handlers and callbacks run inside progress, on the thread
/// that progresses. A worker made in [`ThreadMode::Single`] (the default) is used from
/// the thread that made it; [`ThreadMode::Multi`] shares it between threads.
///
/// ```
/// use courier::{Context, ContextParams, EndpointParams, ThreadMode, Worker, WorkerParams};
///
/// let ctx = Context::new(ContextParams::default())?;
/// let worker = Worker::new(&ctx, WorkerParams { thread_mode: ThreadMode::Multi })?;
/// // Peers connect to the worker's address (here: the worker itself).
/// let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
/// let mut buf = [0u8; 4];
/// worker.scope(|s| {
///     // Operations that lend a buffer to a request are scoped (or blocking).
///     let mut recv = s.tag_recv(&mut buf, 1, u64::MAX)?;
///     ep.tag_send(b"ping", 1)?; // blocking: returns once sent
///     while !recv.is_done() {
///         worker.progress(); // or recv.wait()
///     }
///     Ok::<(), courier::Error>(())
/// })?;
/// assert_eq!(&buf, b"ping");
/// # Ok::<(), courier::Error>(())
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Arc<WorkerInner>,
}

/// An active message as its handler sees it.
pub struct AmMessage<'a> {
    worker: &'a Worker,
    d: &'a mut AmDelivery<'a>,
}

impl AmMessage<'_> {
    /// Handler id.
    pub fn id(&self) -> u16 {
        self.d.id
    }
    /// User header.
    pub fn header(&self) -> &[u8] {
        self.d.header
    }
    /// Eager data, valid during the handler (empty when the data is still at the sender).
    pub fn data(&self) -> &[u8] {
        self.d.data
    }
    /// Whether the data is still at the sender (rendezvous).
    pub fn is_rndv(&self) -> bool {
        self.d.rndv.is_some()
    }
    /// Length of the data, wherever it is.
    pub fn data_len(&self) -> usize {
        self.d
            .rndv
            .as_ref()
            .map(|r| r.len())
            .unwrap_or(self.d.data.len())
    }
    /// Keep the rendezvous descriptor to receive the data later with
    /// [`Worker::am_recv_data`]. Not taking it declines the data.
    pub fn take_rndv(&mut self) -> Option<AmRndv> {
        self.d.rndv.take().map(|r| *r)
    }
    /// The endpoint to reply on, when the sender asked for replies.
    pub fn reply_ep(&self) -> Option<Endpoint> {
        self.d
            .reply
            .map(|(idx, generation)| Endpoint::from_parts(self.worker, idx, generation))
    }
    /// The endpoint the message arrived on.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_parts(self.worker, self.d.ep.0, self.d.ep.1)
    }
    /// The worker running the handler: a handler may start receiving a rendezvous
    /// message's data at once (`take_rndv`, then [`Worker::am_recv_data_raw`] with a
    /// callback), as UCX handlers call `ucp_am_recv_data_nbx`, instead of queueing it.
    pub fn worker(&self) -> &Worker {
        self.worker
    }
}

impl Worker {
    /// Create a worker of `ctx`.
    pub fn new(ctx: &Context, params: WorkerParams) -> Result<Worker> {
        let state = State::new(
            ctx.inner.cfg.clone(),
            ctx.inner.name.clone(),
            ctx.inner.mem.clone(),
        )?;
        let epoll_raw = state.epoll_as_fd().as_raw_fd();
        let event_raw = state.eventfd_as_fd().as_raw_fd();
        let rma_mixed = state.rma_mixed_flag();
        Ok(Worker {
            inner: Arc::new(WorkerInner {
                cell: StateCell::new(params.thread_mode, state),
                ctx: ctx.clone(),
                mode: params.thread_mode,
                epoll_raw,
                event_raw,
                rma_mixed,
            }),
        })
    }

    pub(crate) fn lock(&self) -> Result<Guard<'_, State>> {
        self.inner.cell.lock()
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Thread mode.
    pub fn thread_mode(&self) -> ThreadMode {
        self.inner.mode
    }

    /// This worker's address, for peers to connect to.
    pub fn address(&self) -> Result<Vec<u8>> {
        Ok(self.lock()?.address_bytes().to_vec())
    }

    /// Connect to a peer worker by its address.
    pub fn connect(&self, address: &[u8], params: EndpointParams) -> Result<Endpoint> {
        let mut g = self.lock()?;
        let e = g.connect_address(address)?;
        Endpoint::adopt(self, &mut g, e, params)
    }

    /// Connect to a listener's socket address.
    pub fn connect_sockaddr(
        &self,
        addr: std::net::SocketAddr,
        client_id: u64,
        params: EndpointParams,
    ) -> Result<Endpoint> {
        let mut g = self.lock()?;
        let e = g.connect_sockaddr(addr, client_id)?;
        Endpoint::adopt(self, &mut g, e, params)
    }

    /// Make progress: handle arrived frames, retry queued sends, run callbacks. Returns how
    /// many events were handled.
    #[inline]
    pub fn progress(&self) -> usize {
        Progress {
            cell: &self.inner.cell,
            owner: self,
        }
        .progress()
    }

    /// Register the handler for active-message `id` (replacing any earlier one).
    pub fn am_set_handler(
        &self,
        id: u16,
        handler: impl FnMut(&mut AmMessage<'_>) + Send + 'static,
    ) -> Result<()> {
        self.inner.ctx.require(self.inner.ctx.features().am, "am")?;
        let mut user = handler;
        let wrapped = move |d: &mut AmDelivery<'_>, w: &dyn std::any::Any| {
            // `run_am` passes the worker that runs the handler.
            if let Some(w) = w.downcast_ref::<Worker>() {
                // SAFETY: shortening the delivery's lifetimes to the call.
                let d: &mut AmDelivery<'_> =
                    unsafe { std::mem::transmute::<&mut AmDelivery<'_>, &mut AmDelivery<'_>>(d) };
                let mut msg = AmMessage { worker: w, d };
                user(&mut msg);
            }
        };
        self.lock()?.am_set_handler(id, Box::new(wrapped));
        Ok(())
    }

    /// Receive a rendezvous active message's data into `buf`, waiting for it.
    pub fn am_recv_data(&self, desc: AmRndv, buf: &mut [u8]) -> Result<Info> {
        // SAFETY: waited for before the borrow of `buf` ends (see `wait_now`).
        wait_now(unsafe { self.am_recv_data_nb(desc, buf) })
    }

    /// Start receiving a rendezvous active message's data into `buf`.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn am_recv_data_nb<'a>(
        &self,
        desc: AmRndv,
        buf: &'a mut [u8],
    ) -> Result<Request<'a>> {
        let s = self.lock()?.am_recv_data(
            desc,
            Buf::One((buf.as_mut_ptr() as usize, buf.len())),
            Callback::None,
        )?;
        Ok(Request::new(self, s))
    }

    /// Receive a rendezvous active message's data into `buf`, completed by `cb` (run inside
    /// progress), or with `Callback::None` to be waited on through `request_for`. Always
    /// `Started::Pending`, also when the data was read at once.
    ///
    /// # Safety
    /// `buf` must stay valid and unused until the callback runs, or until the request
    /// completes.
    pub unsafe fn am_recv_data_raw(&self, desc: AmRndv, buf: Buf, cb: Callback) -> Result<Started> {
        self.lock()?.am_recv_data(desc, buf, cb)
    }

    /// Decline a rendezvous message kept with [`AmMessage::take_rndv`]: its data stays at
    /// the sender, whose request completes (as when a handler does not take it).
    pub fn am_decline(&self, desc: AmRndv) -> Result<()> {
        self.lock()?.am_decline(desc);
        Ok(())
    }

    /// Receive a tag message matching `tag` under `mask` into `buf`, waiting for it;
    /// `Info` has its tag and length (for a truncated one, `Status::Truncated` and the real
    /// length in the request's info: use a scope's `tag_recv` to see it).
    pub fn tag_recv(&self, buf: &mut [u8], tag: u64, mask: u64) -> Result<Info> {
        // SAFETY: as `am_recv_data`.
        wait_now(unsafe { self.tag_recv_nb(buf, tag, mask) })
    }

    /// Receive a tag message scattered into several buffers, waiting for it.
    pub fn tag_recv_iov(&self, iov: &mut [&mut [u8]], tag: u64, mask: u64) -> Result<Info> {
        // SAFETY: as `am_recv_data`.
        wait_now(unsafe { self.tag_recv_iov_nb(iov, tag, mask) })
    }

    /// Post a tag receive.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn tag_recv_nb<'a>(
        &self,
        buf: &'a mut [u8],
        tag: u64,
        mask: u64,
    ) -> Result<Request<'a>> {
        self.inner
            .ctx
            .require(self.inner.ctx.features().tag, "tag")?;
        let s = self.lock()?.tag_recv(
            Buf::One((buf.as_mut_ptr() as usize, buf.len())),
            tag,
            mask,
            Callback::None,
        );
        self.started(s)
    }

    /// Post a tag receive that scatters into several buffers.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn tag_recv_iov_nb<'a>(
        &self,
        iov: &mut [&'a mut [u8]],
        tag: u64,
        mask: u64,
    ) -> Result<Request<'a>> {
        self.inner
            .ctx
            .require(self.inner.ctx.features().tag, "tag")?;
        let segs = iov
            .iter_mut()
            .map(|b| (b.as_mut_ptr() as usize, b.len()))
            .collect();
        let s = self
            .lock()?
            .tag_recv(Buf::Many(segs), tag, mask, Callback::None);
        self.started(s)
    }

    /// A `Request` for an operation started with a `*_raw` call and no callback, to poll
    /// or wait on like any other.
    ///
    /// # Safety
    /// The buffers given to the raw call must stay valid for `'a`.
    pub unsafe fn request_for<'a>(&self, started: Started) -> Request<'a> {
        Request::new(self, started)
    }

    /// Post a tag receive completed by a callback (run inside progress), or with
    /// `Callback::None` to be waited on through `request_for`.
    ///
    /// # Safety
    /// `buf` must stay valid and unused until the callback runs (or the call returns
    /// `Done`, which runs no callback), or until the request completes.
    #[inline]
    pub unsafe fn tag_recv_raw(
        &self,
        buf: Buf,
        tag: u64,
        mask: u64,
        cb: Callback,
    ) -> Result<Started> {
        self.lock()?.tag_recv(buf, tag, mask, cb)
    }

    /// `tag_recv_raw` into one contiguous buffer `(address, length)`, completed by the plain
    /// function `f` with the word `user` (run inside progress), as `courier perf`'s
    /// receiver posts. Every argument is a plain word: the caller builds no `Buf` or
    /// `Callback` in memory for the library to copy (a copy that reads back, as one wide
    /// load, what the caller stored as narrower words waits for those stores).
    ///
    /// # Safety
    /// As `tag_recv_raw`.
    #[inline(never)]
    pub unsafe fn tag_recv_fn(
        &self,
        (addr, len): (usize, usize),
        tag: u64,
        mask: u64,
        f: RawFn,
        user: usize,
    ) -> Result<Started> {
        self.lock()?.tag_recv_fn((addr, len), tag, mask, f, user)
    }

    /// The first unexpected message that matches, without receiving it.
    pub fn tag_probe(&self, tag: u64, mask: u64) -> Result<Option<ProbeInfo>> {
        Ok(self.lock()?.tag_probe(tag, mask))
    }

    fn started<'a>(&self, s: Result<Started>) -> Result<Request<'a>> {
        match s {
            Ok(s) => Ok(Request::new(self, s)),
            Err(e) => Err(e),
        }
    }

    /// Prepare to sleep: `Ok(true)` if nothing is waiting and the event fd will wake on
    /// the next arrival; `Ok(false)` if the caller should progress instead.
    pub fn arm(&self) -> Result<bool> {
        self.inner
            .ctx
            .require(self.inner.ctx.features().wakeup, "wakeup")?;
        let mut g = self.lock()?;
        // Coalesced sends must leave before the worker sleeps.
        if !g.arm_fd_links()? {
            return Ok(false);
        }
        let armed = g.arm()?;
        if armed {
            // Whoever sleeps on `event_fd` in its own loop (not `wait`) progresses after
            // the wake: that progress reads epoll, so what woke the fd is taken off it
            // and the next sleep does not end at once.
            g.epoll_next();
        }
        Ok(armed)
    }

    /// Whether a sleep of this worker's is ended by a peer's doing for some link (shared
    /// memory), not only by the kernel when bytes come (tcp); `true` if that cannot be
    /// told (the worker is in use).
    pub(crate) fn sleep_rings_peers(&self) -> bool {
        self.lock().map_or(true, |g| g.sleep_rings_peers())
    }

    /// Sleep until something arrives, `signal` is called, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        if !self.arm()? {
            return Ok(());
        }
        self.sleep_armed(timeout)
    }

    /// The sleep of `wait`, after `arm` returned true.
    pub(crate) fn sleep_armed(&self, timeout: Option<Duration>) -> Result<()> {
        // SAFETY: the epoll fd is owned by the worker's state, which `self` keeps alive
        // (as `signal` does with the event fd); it is never replaced.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.inner.epoll_raw) };
        let ts = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: t.subsec_nanos() as i64,
        });
        let mut ev = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }; 1];
        match epoll::wait(fd, &mut ev, ts.as_ref()) {
            Ok(0) | Err(rustix::io::Errno::INTR) => Ok(()),
            Ok(_) => {
                // Whatever woke us (a wakeup byte, the event fd) stays readable until
                // progress reads epoll, which it does only now and then: the next call
                // does, or the next sleep would end at once too.
                if let Ok(mut g) = self.lock() {
                    g.epoll_next();
                }
                Ok(())
            }
            Err(e) => Err(Error::io("epoll_wait", e)),
        }
    }

    /// Wake a thread sleeping in `wait` (or on the event fd).
    pub fn signal(&self) -> Result<()> {
        // Callable from any thread, also for a single-thread worker: the eventfd is not
        // part of the locked state, and it lives as long as the worker `self` keeps alive.
        // SAFETY: see above.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.inner.event_raw) };
        rustix::io::write(fd, &1u64.to_ne_bytes()).map_err(|e| Error::io("eventfd write", e))?;
        Ok(())
    }

    /// An fd that becomes readable when the worker has work (after `arm` returned true);
    /// add it to your own epoll, poll or event loop.
    pub fn event_fd(&self) -> RawFd {
        self.inner.epoll_raw
    }

    #[inline]
    pub(crate) fn take_result(&self, id: u64, done: &mut Option<Result<Info>>, info: &mut Info) {
        if let Ok(mut g) = self.lock() {
            g.take_result(id, done, info);
        }
    }

    pub(crate) fn cancel(&self, id: u64) -> bool {
        self.lock().map(|mut g| g.cancel(id)).unwrap_or(false)
    }

    /// Cancel the operation `Started::Pending(id)` of a `*_raw` call if it has not started
    /// moving data: its callback then runs with `Status::Canceled` in the next progress.
    /// Returns whether it was canceled. (For the C ABI, whose requests are raw callbacks.)
    pub fn cancel_pending(&self, id: u64) -> bool {
        self.cancel(id)
    }

    /// See `State::abandon`.
    pub(crate) fn abandon(&self, id: u64, why: Error) -> bool {
        self.lock().map(|mut g| g.abandon(id, why)).unwrap_or(false)
    }

    pub(crate) fn detach(&self, id: u64) {
        if let Ok(mut g) = self.lock() {
            g.req_detach(id);
        }
    }

    /// See `State::req_reclaim`.
    pub(crate) fn reclaim(&self, id: u64) -> bool {
        self.lock().map(|mut g| g.req_reclaim(id)).unwrap_or(false)
    }

    pub(crate) fn in_progress(&self) -> bool {
        self.lock().map(|g| g.in_progress()).unwrap_or(true)
    }

    /// The next endpoint a peer opened to this worker by its address (passive side), if
    /// any. Endpoints made through a `Listener` are handed to its handler instead.
    pub fn incoming_endpoint(&self) -> Option<Endpoint> {
        let (idx, generation) = self.lock().ok()?.take_incoming()?;
        Some(Endpoint::from_parts(self, idx, generation))
    }

    /// Flush every endpoint of this worker: all sends and remote operations complete.
    /// Returns the first error met (endpoints that failed report their failure).
    pub fn flush(&self) -> Result<()> {
        let eps: Vec<Endpoint> = self
            .lock()?
            .ep_list()
            .into_iter()
            .map(|(e, generation)| Endpoint::from_parts(self, e, generation))
            .collect();
        let mut first = Ok(());
        for ep in eps {
            if let Err(e) = ep.flush() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// How this worker's single-copy rendezvous copies were made so far: through shared
    /// segments of allocated memory, or through the kernel. (`courier perf -v` prints it.)
    pub fn rndv_copies(&self) -> Result<crate::RndvCopies> {
        Ok(self.lock()?.rndv_copies())
    }

    /// Why transports are not usable by this worker (excluded, unavailable).
    pub fn excluded_transports(&self) -> Result<Vec<String>> {
        Ok(self.lock()?.excluded().to_vec())
    }

    /// Progress until `cond` holds or `timeout` passes. Between progress calls that find
    /// nothing to do it spins, and every 64 such calls offers the CPU to another thread or
    /// process (one this wait may be waiting for, on a machine with fewer CPUs than busy
    /// threads).
    pub fn progress_until(&self, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let mut idle = 0u32;
        while !cond() {
            if self.progress() == 0 {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else {
                idle = 0;
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::new(Status::Timeout, "condition not met in time"));
            }
        }
        Ok(())
    }
}
