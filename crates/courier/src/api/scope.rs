//! `Scope`: operations that lend buffers to requests, made safe by waiting at the scope's
//! end for every one still in flight (`request.rs` says why).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use super::endpoint::Endpoint;
use super::onesided::RemoteKey;
use super::request::Request;
use super::worker::Worker;
use crate::base::Result;
use crate::proto::am::{AmFlags, AmRndv};
use crate::proto::onesided::SignalOp;

/// A scope for operations that borrow buffers: made by [`Worker::scope`]. Its operations
/// mirror the `unsafe` `*_nb` operations of [`Endpoint`] and [`Worker`], safely: their
/// requests borrow the buffers for the whole scope, and the scope does not end before
/// every operation started in it has completed, whatever became of its request.
pub struct Scope<'scope, 'env: 'scope> {
    worker: Worker,
    /// Operations that did not complete when they started: (their worker, request id).
    started: RefCell<Vec<(Worker, u64)>>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

impl Worker {
    /// Run `f` with a [`Scope`] whose operations lend buffers to requests safely, as
    /// `std::thread::scope` lends data to threads: a request made in the scope borrows its
    /// buffer until the scope ends, and before `scope` returns (or lets a panic of `f` go
    /// on) it waits for every operation started in it that has not completed: one whose
    /// request was waited for costs nothing more; one whose request was dropped was
    /// already canceled or waited for; one whose request was forgotten, or dropped inside
    /// a callback, is canceled or waited for here. That wait is bounded like a dropped
    /// request's (twice the keepalive timeout), after which the endpoint is failed so that
    /// nothing touches the buffer any more.
    ///
    /// Endpoints of other workers may be used in the scope too; each operation is waited
    /// for on its own worker. A scope used inside a callback (progress does not nest)
    /// cannot wait: operations still in flight at its end are canceled, or their endpoints
    /// failed.
    ///
    /// ```
    /// use courier::{Context, ContextParams, EndpointParams, Worker, WorkerParams};
    ///
    /// let ctx = Context::new(ContextParams::default())?;
    /// let worker = Worker::new(&ctx, WorkerParams::default())?;
    /// let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
    /// let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    /// worker.scope(|s| {
    ///     // Two receives posted, then the sends: overlapped, with no copy.
    ///     let ra = s.tag_recv(&mut a, 1, u64::MAX)?;
    ///     let rb = s.tag_recv(&mut b, 2, u64::MAX)?;
    ///     let sent = s.tag_send(&ep, b"two!", 2)?;
    ///     ep.tag_send(b"one!", 1)?; // blocking
    ///     sent.wait()?;
    ///     ra.wait()?;
    ///     std::mem::forget(rb); // harmless: the scope waits for it
    ///     Ok::<(), courier::Error>(())
    /// })?;
    /// assert_eq!((&a, &b), (b"one!", b"two!"));
    /// # Ok::<(), courier::Error>(())
    /// ```
    pub fn scope<'env, F, T>(&self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        let scope = Scope {
            worker: self.clone(),
            started: RefCell::new(Vec::new()),
            scope: PhantomData,
            env: PhantomData,
        };
        let result = catch_unwind(AssertUnwindSafe(|| f(&scope)));
        scope.settle();
        match result {
            Ok(t) => t,
            Err(panic) => resume_unwind(panic),
        }
    }
}

impl<'scope> Scope<'scope, '_> {
    /// The worker the scope was made on (its receives are posted there).
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Record an operation that did not complete at once.
    fn track(&'scope self, r: Result<Request<'scope>>) -> Result<Request<'scope>> {
        let mut r = r?;
        if let Some((w, id)) = r.mark_scoped() {
            let w = w.clone();
            self.started.borrow_mut().push((w, id));
        }
        Ok(r)
    }

    /// The end: wait for whatever is still in flight.
    fn settle(&self) {
        let started = std::mem::take(&mut *self.started.borrow_mut());
        for (w, id) in started {
            Request::settle(&w, id);
        }
    }

    /// [`Endpoint::tag_send_nb`], scoped.
    pub fn tag_send(
        &'scope self,
        ep: &Endpoint,
        data: &'scope [u8],
        tag: u64,
    ) -> Result<Request<'scope>> {
        // SAFETY: `data` is borrowed for the scope, whose end waits for the request.
        self.track(unsafe { ep.tag_send_nb(data, tag) })
    }

    /// [`Endpoint::tag_send_sync_nb`], scoped.
    pub fn tag_send_sync(
        &'scope self,
        ep: &Endpoint,
        data: &'scope [u8],
        tag: u64,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send`.
        self.track(unsafe { ep.tag_send_sync_nb(data, tag) })
    }

    /// [`Endpoint::tag_send_iov_nb`], scoped.
    pub fn tag_send_iov(
        &'scope self,
        ep: &Endpoint,
        iov: &[&'scope [u8]],
        tag: u64,
    ) -> Result<Request<'scope>> {
        // SAFETY: the buffers are borrowed for the scope, whose end waits for the request.
        self.track(unsafe { ep.tag_send_iov_nb(iov, tag) })
    }

    /// [`Endpoint::am_send_nb`], scoped.
    pub fn am_send(
        &'scope self,
        ep: &Endpoint,
        id: u16,
        header: &[u8],
        data: &'scope [u8],
        flags: AmFlags,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send` (the header is copied before the call returns).
        self.track(unsafe { ep.am_send_nb(id, header, data, flags) })
    }

    /// [`Endpoint::am_send_iov_nb`], scoped.
    pub fn am_send_iov(
        &'scope self,
        ep: &Endpoint,
        id: u16,
        header: &[u8],
        iov: &[&'scope [u8]],
        flags: AmFlags,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send_iov`.
        self.track(unsafe { ep.am_send_iov_nb(id, header, iov, flags) })
    }

    /// [`Endpoint::stream_send_nb`], scoped.
    pub fn stream_send(&'scope self, ep: &Endpoint, data: &'scope [u8]) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send`.
        self.track(unsafe { ep.stream_send_nb(data) })
    }

    /// [`Endpoint::stream_recv_nb`], scoped.
    pub fn stream_recv(
        &'scope self,
        ep: &Endpoint,
        buf: &'scope mut [u8],
    ) -> Result<Request<'scope>> {
        // SAFETY: `buf` is borrowed (exclusively) for the scope, whose end waits for the
        // request.
        self.track(unsafe { ep.stream_recv_nb(buf) })
    }

    /// [`Endpoint::stream_recv_exact_nb`], scoped.
    pub fn stream_recv_exact(
        &'scope self,
        ep: &Endpoint,
        buf: &'scope mut [u8],
    ) -> Result<Request<'scope>> {
        // SAFETY: as `stream_recv`.
        self.track(unsafe { ep.stream_recv_exact_nb(buf) })
    }

    /// [`Endpoint::put_nb`], scoped.
    pub fn put(
        &'scope self,
        ep: &Endpoint,
        data: &'scope [u8],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send`.
        self.track(unsafe { ep.put_nb(data, raddr, key) })
    }

    /// [`Endpoint::get_nb`], scoped.
    pub fn get(
        &'scope self,
        ep: &Endpoint,
        buf: &'scope mut [u8],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `stream_recv`.
        self.track(unsafe { ep.get_nb(buf, raddr, key) })
    }

    /// [`Endpoint::put_iov_nb`], scoped.
    pub fn put_iov(
        &'scope self,
        ep: &Endpoint,
        iov: &[&'scope [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send_iov`.
        self.track(unsafe { ep.put_iov_nb(iov, raddr, key) })
    }

    /// [`Endpoint::get_iov_nb`], scoped.
    pub fn get_iov(
        &'scope self,
        ep: &Endpoint,
        iov: &mut [&'scope mut [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'scope>> {
        // SAFETY: the buffers are borrowed (exclusively) for the scope, whose end waits
        // for the request.
        self.track(unsafe { ep.get_iov_nb(iov, raddr, key) })
    }

    /// [`Endpoint::put_signal_nb`], scoped.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal(
        &'scope self,
        ep: &Endpoint,
        data: &'scope [u8],
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `tag_send`.
        self.track(unsafe { ep.put_signal_nb(data, raddr, key, sig_addr, sig_key, value, op) })
    }

    /// [`Worker::tag_recv_nb`] on the scope's worker, scoped.
    pub fn tag_recv(
        &'scope self,
        buf: &'scope mut [u8],
        tag: u64,
        mask: u64,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `stream_recv`.
        self.track(unsafe { self.worker.tag_recv_nb(buf, tag, mask) })
    }

    /// [`Worker::tag_recv_iov_nb`] on the scope's worker, scoped.
    pub fn tag_recv_iov(
        &'scope self,
        iov: &mut [&'scope mut [u8]],
        tag: u64,
        mask: u64,
    ) -> Result<Request<'scope>> {
        // SAFETY: as `get_iov`.
        self.track(unsafe { self.worker.tag_recv_iov_nb(iov, tag, mask) })
    }

    /// [`Worker::am_recv_data_nb`] on the scope's worker, scoped.
    pub fn am_recv_data(
        &'scope self,
        desc: AmRndv,
        buf: &'scope mut [u8],
    ) -> Result<Request<'scope>> {
        // SAFETY: as `stream_recv`.
        self.track(unsafe { self.worker.am_recv_data_nb(desc, buf) })
    }
}
