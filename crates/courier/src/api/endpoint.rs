//! `Endpoint`: a connection to one peer worker.

use std::time::{Duration, Instant};

use super::request::{Backoff, Request};
use super::worker::Worker;
use crate::base::lock::Guard;
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::am::AmFlags;
use crate::proto::buf::Buf;
use crate::proto::endpoint::EpRef;
use crate::proto::request::Started;
use crate::proto::request::{Callback, Info};
use crate::wire::Kind;

/// Parameters of a new endpoint.
#[derive(Default)]
pub struct EndpointParams {
    /// Called once, inside progress, when the endpoint fails (peer died, closed, lied).
    pub error_handler: Option<crate::proto::request::ErrorHandler>,
}

impl EndpointParams {
    /// Set the error handler.
    pub fn error_handler(mut self, f: impl FnMut(&Error) + Send + 'static) -> Self {
        self.error_handler = Some(Box::new(f));
        self
    }
}

/// A connection to one peer worker. Cheap to clone; `close` ends it for every clone.
///
/// Made by [`Worker::connect`] (a peer's worker address), [`Worker::connect_sockaddr`] (a
/// [`Listener`](crate::Listener)'s socket address), or [`ConnRequest::accept`](crate::ConnRequest::accept).
/// When the peer fails, its requests complete with the error and its error handler runs
/// once.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use courier::{AmFlags, Context, ContextParams, EndpointParams, Worker, WorkerParams};
///
/// let ctx = Context::new(ContextParams::default())?;
/// let worker = Worker::new(&ctx, WorkerParams::default())?;
/// let got = Arc::new(Mutex::new(Vec::new()));
/// let into = got.clone();
/// worker.am_set_handler(3, move |m| into.lock().unwrap().extend_from_slice(m.data()))?;
/// let ep = worker.connect(
///     &worker.address()?,
///     EndpointParams::default().error_handler(|e| eprintln!("peer failed: {e}")),
/// )?;
/// ep.am_send(3, b"header", b"data", AmFlags::default())?;
/// worker.progress_until(std::time::Duration::from_secs(10), || !got.lock().unwrap().is_empty())?;
/// assert_eq!(&got.lock().unwrap()[..], b"data");
/// ep.close()?;
/// # Ok::<(), courier::Error>(())
/// ```
#[derive(Clone)]
pub struct Endpoint {
    worker: Worker,
    idx: u32,
    generation: u32,
}

fn one(b: &[u8]) -> Buf {
    Buf::One((b.as_ptr() as usize, b.len()))
}

/// Wait for a request made by a `*_nb` call of a blocking operation. `wait` returns only
/// once the request has completed (it progresses until then, and a panic unwinding out of
/// it drops the request, which cancels or waits), so the buffer the caller lent for the
/// call is not used after this returns.
#[inline]
pub(super) fn wait_now(r: Result<Request<'_>>) -> Result<Info> {
    r?.wait()
}

impl Endpoint {
    pub(crate) fn from_parts(worker: &Worker, idx: u32, generation: u32) -> Endpoint {
        Endpoint {
            worker: worker.clone(),
            idx,
            generation,
        }
    }

    pub(crate) fn adopt(
        worker: &Worker,
        g: &mut Guard<'_, State>,
        e: u32,
        params: EndpointParams,
    ) -> Result<Endpoint> {
        let generation = g.ep_adopt(e, params.error_handler)?;
        Ok(Endpoint {
            worker: worker.clone(),
            idx: e,
            generation,
        })
    }

    /// The worker it belongs to.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// The endpoint as the protocol layer names it.
    #[inline(always)]
    pub(crate) fn ep_ref(&self) -> EpRef<'_> {
        EpRef {
            cell: &self.worker.inner.cell,
            idx: self.idx,
            generation: self.generation,
        }
    }

    #[inline(always)]
    fn with<T>(&self, f: impl FnOnce(&mut State, u32) -> Result<T>) -> Result<T> {
        self.ep_ref().with(f)
    }

    pub(crate) fn with_state<T>(&self, f: impl FnOnce(&mut State, u32) -> Result<T>) -> Result<T> {
        self.with(f)
    }

    /// Whether two handles name the same endpoint.
    pub fn same_as(&self, other: &Endpoint) -> bool {
        self.idx == other.idx
            && self.generation == other.generation
            && std::sync::Arc::ptr_eq(&self.worker.inner, &other.worker.inner)
    }

    fn req<'a>(&self, s: Result<Started>) -> Result<Request<'a>> {
        s.map(|s| Request::new(&self.worker, s))
    }

    /// The peer, as text.
    pub fn peer(&self) -> String {
        self.with(|st, e| Ok(st.ep_peer(e))).unwrap_or_default()
    }

    /// The transport carrying this endpoint (`self`, `shm`, `tcp`), once connected.
    pub fn transport(&self) -> Option<&'static str> {
        self.with(|st, e| Ok(st.ep_transport(e))).ok().flatten()
    }

    /// This side's socket address when the endpoint was made over a socket (a tcp link,
    /// or the tcp link kept beside the shared-memory one it was upgraded to); `None`
    /// otherwise.
    pub fn local_sockaddr(&self) -> Option<std::net::SocketAddr> {
        self.with(|st, e| st.ep_local_sockaddr(e)).ok().flatten()
    }

    /// Whether the endpoint is connected; `Err` if it failed.
    pub fn is_connected(&self) -> Result<bool> {
        self.with(|st, e| st.ep_connected(e))
    }

    /// Progress until connected (or failed, or `timeout`).
    pub fn wait_connected(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_connected()? {
                return Ok(());
            }
            self.worker.progress();
            if Instant::now() > deadline {
                return Err(Error::new(
                    Status::Timeout,
                    "endpoint did not connect in time",
                ));
            }
        }
    }

    // ----- tag ------------------------------------------------------------------------

    /// Send a tag message and wait until `data` may be reused (it has left, or been
    /// received).
    pub fn tag_send(&self, data: &[u8], tag: u64) -> Result<Info> {
        // SAFETY: waited for before the borrow of `data` ends (see `wait_now`).
        wait_now(unsafe { self.tag_send_nb(data, tag) })
    }

    /// Send a tag message that completes only when the receiver has matched it, and wait
    /// for that.
    pub fn tag_send_sync(&self, data: &[u8], tag: u64) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.tag_send_sync_nb(data, tag) })
    }

    /// Send a tag message gathered from several buffers, and wait until they may be reused.
    pub fn tag_send_iov(&self, iov: &[&[u8]], tag: u64) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.tag_send_iov_nb(iov, tag) })
    }

    /// Start sending a tag message; the request completes when `data` may be reused.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn tag_send_nb<'a>(&self, data: &'a [u8], tag: u64) -> Result<Request<'a>> {
        let s = self.with(|st, e| st.tag_send(e, one(data), tag, false, Callback::None));
        self.req(s)
    }

    /// Start a tag send that completes only when the receiver has matched it.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn tag_send_sync_nb<'a>(&self, data: &'a [u8], tag: u64) -> Result<Request<'a>> {
        let s = self.with(|st, e| st.tag_send(e, one(data), tag, true, Callback::None));
        self.req(s)
    }

    /// Start a tag send gathered from several buffers.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn tag_send_iov_nb<'a>(&self, iov: &[&'a [u8]], tag: u64) -> Result<Request<'a>> {
        let segs = iov.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        let s = self.with(|st, e| st.tag_send(e, Buf::Many(segs), tag, false, Callback::None));
        self.req(s)
    }

    /// Send a tag message, completion by callback (inside progress). `Done` runs no callback.
    ///
    /// # Safety
    /// `data` must stay valid until the callback runs.
    pub unsafe fn tag_send_raw(
        &self,
        data: Buf,
        tag: u64,
        sync: bool,
        cb: Callback,
    ) -> Result<Started> {
        self.with(|st, e| st.tag_send(e, data, tag, sync, cb))
    }

    // ----- active messages --------------------------------------------------------------

    /// The most data bytes an active message with a `header_len`-byte header carries in one
    /// frame on this endpoint's link, so that `AmFlags::eager` accepts it (a conservative
    /// size while the endpoint still connects).
    pub fn am_eager_max(&self, header_len: usize) -> Result<usize> {
        let (_, max_frame, _) = self.with(|st, e| st.ep_limits(e))?;
        Ok(max_frame.saturating_sub(Kind::Am.header_len() + header_len))
    }

    /// Send an active message to handler `id`, and wait until `data` may be reused (the
    /// header is copied at once).
    pub fn am_send(&self, id: u16, header: &[u8], data: &[u8], flags: AmFlags) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.am_send_nb(id, header, data, flags) })
    }

    /// Send an active message gathered from several buffers, and wait until they may be
    /// reused.
    pub fn am_send_iov(
        &self,
        id: u16,
        header: &[u8],
        iov: &[&[u8]],
        flags: AmFlags,
    ) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.am_send_iov_nb(id, header, iov, flags) })
    }

    /// Start sending an active message to handler `id` (the header is copied at once).
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn am_send_nb<'a>(
        &self,
        id: u16,
        header: &[u8],
        data: &'a [u8],
        flags: AmFlags,
    ) -> Result<Request<'a>> {
        let s = self.with(|st, e| st.am_send(e, id, header, one(data), flags, Callback::None));
        self.req(s)
    }

    /// Start sending an active message gathered from several buffers.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn am_send_iov_nb<'a>(
        &self,
        id: u16,
        header: &[u8],
        iov: &[&'a [u8]],
        flags: AmFlags,
    ) -> Result<Request<'a>> {
        let segs = iov.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        let s =
            self.with(|st, e| st.am_send(e, id, header, Buf::Many(segs), flags, Callback::None));
        self.req(s)
    }

    /// Send an active message, completion by callback.
    ///
    /// # Safety
    /// `data` must stay valid until the callback runs.
    #[inline]
    pub unsafe fn am_send_raw(
        &self,
        id: u16,
        header: &[u8],
        data: Buf,
        flags: AmFlags,
        cb: Callback,
    ) -> Result<Started> {
        self.with(|st, e| st.am_send(e, id, header, data, flags, cb))
    }

    // ----- streams ----------------------------------------------------------------------

    /// Send stream bytes and wait until `data` may be reused.
    pub fn stream_send(&self, data: &[u8]) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.stream_send_nb(data) })
    }

    /// Receive whatever stream bytes have arrived (at least one; waits for one), up to
    /// `buf.len()`; `Info::length` says how many.
    pub fn stream_recv(&self, buf: &mut [u8]) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.stream_recv_nb(buf) })
    }

    /// Receive exactly `buf.len()` stream bytes, waiting for them.
    pub fn stream_recv_exact(&self, buf: &mut [u8]) -> Result<Info> {
        // SAFETY: as `tag_send`.
        wait_now(unsafe { self.stream_recv_exact_nb(buf) })
    }

    /// Start sending stream bytes.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn stream_send_nb<'a>(&self, data: &'a [u8]) -> Result<Request<'a>> {
        let s = self.with(|st, e| st.stream_send(e, one(data), Callback::None));
        self.req(s)
    }

    /// Start receiving whatever stream bytes have arrived (at least one), up to
    /// `buf.len()`.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn stream_recv_nb<'a>(&self, buf: &'a mut [u8]) -> Result<Request<'a>> {
        let s = self.with(|st, e| {
            st.stream_recv(
                e,
                Buf::One((buf.as_mut_ptr() as usize, buf.len())),
                false,
                Callback::None,
            )
        });
        self.req(s)
    }

    /// Start receiving exactly `buf.len()` stream bytes.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`] makes the same request safely.
    pub unsafe fn stream_recv_exact_nb<'a>(&self, buf: &'a mut [u8]) -> Result<Request<'a>> {
        let s = self.with(|st, e| {
            st.stream_recv(
                e,
                Buf::One((buf.as_mut_ptr() as usize, buf.len())),
                true,
                Callback::None,
            )
        });
        self.req(s)
    }

    /// Stream operations with raw buffers and callbacks.
    ///
    /// # Safety
    /// `buf` must stay valid until the callback runs.
    pub unsafe fn stream_recv_raw(&self, buf: Buf, waitall: bool, cb: Callback) -> Result<Started> {
        self.with(|st, e| st.stream_recv(e, buf, waitall, cb))
    }

    /// Send stream bytes with a raw buffer and a callback.
    ///
    /// # Safety
    /// `data` must stay valid until the callback runs.
    pub unsafe fn stream_send_raw(&self, data: Buf, cb: Callback) -> Result<Started> {
        self.with(|st, e| st.stream_send(e, data, cb))
    }

    // ----- flush and close ----------------------------------------------------------------

    /// Whether this endpoint's backlog moved since `last` (which it updates; `None`: not
    /// looked at yet, which is no move).
    #[cold]
    #[inline(never)]
    fn moved(&self, last: &mut Option<(usize, usize, usize)>) -> Result<bool> {
        let now = Some(self.with(|st, e| Ok(st.ep_backlog(e)))?);
        let moved = last.is_some() && now != *last;
        *last = now;
        Ok(moved)
    }

    /// Wait until every send on this endpoint has completed and left this process. Gives
    /// up (`Timeout`) after `give_up_after` without progress: a slow link that keeps taking
    /// data is waited for, a peer that takes nothing is not.
    /// Between progress calls that find nothing it spins, yields, then sleeps, as
    /// [`Request::wait`] does ([`Backoff`]).
    pub fn flush(&self) -> Result<()> {
        let limit = self.worker.context().config().give_up_after();
        let mut deadline = Instant::now() + limit;
        // Looked at only once the flush has to wait (most return at the first look).
        let mut backlog = None;
        let mut looked = 0u32;
        // Everything sent has left and every acknowledged operation is answered; then the
        // target confirms the unacknowledged puts, and reports any it refused.
        let mut confirm: Option<u64> = None;
        // Between progress calls that find nothing: spin, yield, sleep, as `Request::wait`.
        let mut backoff = Backoff::new();
        loop {
            if self.with(|st, e| st.ep_quiet(e))? {
                match confirm {
                    None => match self.with(|st, e| st.rma_flush_start(e))? {
                        None => return self.with(|st, e| st.ep_idle_flush_end(e)),
                        Some(id) => confirm = Some(id),
                    },
                    Some(_) => return self.with(|st, e| st.rma_take_error(e).map_or(Ok(()), Err)),
                }
            }
            if self.worker.progress() > 0 {
                backoff.busy();
            } else {
                // A sleep that cannot be had leaves a spin that yields.
                let _ = backoff.idle(&self.worker);
            }
            looked = looked.wrapping_add(1);
            if looked.is_multiple_of(64) && self.moved(&mut backlog)? {
                deadline = Instant::now() + limit;
            }
            if Instant::now() > deadline {
                let peer = self.with(|st, e| Ok(st.ep_peer(e)))?;
                let (frames, pushes, bytes) = self.with(|st, e| Ok(st.ep_backlog(e)))?;
                return Err(Error::msg(
                    Status::Timeout,
                    format!(
                        "flush to {peer} made no progress for {limit:?} (twice COURIER_KEEPALIVE_TIMEOUT, 5 s to 60 s): {frames} frames and {pushes} rendezvous pushes still queued here, {bytes} bytes in the link, or answers still awaited; the peer takes nothing and answers nothing"
                    ),
                ));
            }
        }
    }

    /// Close gracefully: flush, tell the peer, release. Bounded: after twice the keepalive
    /// timeout it closes by force.
    pub fn close(self) -> Result<()> {
        let flushed = self.flush();
        let r = self.with(|st, e| {
            st.ep_send_close(e);
            st.ep_release(e);
            Ok(())
        });
        match (flushed, r) {
            (Err(e), _) if e.status() == Status::Timeout => Err(e),
            (_, r) => r,
        }
    }

    /// Close at once without waiting for the peer; requests in flight fail.
    pub fn close_force(self) {
        let _ = self.with(|st, e| {
            st.ep_release(e);
            Ok(())
        });
    }
}
