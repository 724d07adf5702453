//! `Request`: an operation in flight, completed by polling, waiting, or a callback.

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
/// ```
/// use std::time::Duration;
/// use courier::{Context, ContextParams, EndpointParams, Status, Worker, WorkerParams};
///
/// let ctx = Context::new(ContextParams::default())?;
/// let worker = Worker::new(&ctx, WorkerParams::default())?;
/// let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
/// let mut buf = [0u8; 16];
/// let mut recv = worker.tag_recv(&mut buf, 5, u64::MAX)?;
/// // Nothing sent yet: a bounded wait gives up, the request stays in flight.
/// let e = recv.wait_timeout(Duration::from_millis(10)).unwrap_err();
/// assert_eq!(e.status(), Status::Timeout);
/// ep.tag_send(b"late", 5)?.wait()?;
/// let info = recv.wait()?; // progresses the worker until done
/// assert_eq!((info.length, info.tag), (4, 5));
/// # Ok::<(), courier::Error>(())
/// ```
#[must_use = "a request completes only while the worker progresses; wait() or test() it"]
pub struct Request<'a> {
    /// Only requests still in flight need their worker; completed ones skip the clone.
    worker: Option<Worker>,
    id: u64,
    done: Option<Result<Info>>,
    info: Info,
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
    pub fn wait(mut self) -> Result<Info> {
        self.wait_inner(None)
    }

    /// Like `wait`, but give up after `timeout` (the request stays in flight).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Info> {
        self.wait_inner(Some(Instant::now() + timeout))
    }

    fn wait_inner(&mut self, deadline: Option<Instant>) -> Result<Info> {
        let mut idle = 0u32;
        loop {
            if let Some(r) = self.test() {
                return r.clone();
            }
            let Some(w) = self.worker.as_ref() else {
                continue;
            };
            if w.progress() == 0 {
                idle += 1;
                if idle > 2000 {
                    let _ = w.wait(Some(Duration::from_millis(1)));
                    idle = 0;
                }
            } else {
                idle = 0;
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

    /// Cancel it if it has not started moving data.
    pub fn cancel(&mut self) -> bool {
        self.done.is_none() && self.worker.as_ref().is_some_and(|w| w.cancel(self.id))
    }
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
        let Some(w) = self.worker.clone() else { return };
        if w.cancel(self.id) {
            let _ = self.test();
            return;
        }
        if w.in_progress() {
            // Dropped inside a callback: cannot progress here; the request finishes on its own.
            tracing::warn!(
                "a request in flight was dropped inside a callback; its buffer must stay valid until it completes"
            );
            w.detach(self.id);
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
