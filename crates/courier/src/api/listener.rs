//! `Listener`: accepts connection requests on a socket address.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use super::endpoint::{Endpoint, EndpointParams};
use super::worker::{Worker, WorkerInner};
use crate::base::Result;
use crate::proto::wireup;

/// A connection request, handed to the listener's handler. Accept or reject it; dropping
/// it unanswered rejects it.
pub struct ConnRequest {
    worker: Worker,
    inner: Option<wireup::ConnRequest>,
}

impl ConnRequest {
    /// The client's socket address.
    pub fn client_addr(&self) -> &str {
        self.inner
            .as_ref()
            .map(|r| r.client_addr.as_str())
            .unwrap_or("")
    }
    /// The id the client chose.
    pub fn client_id(&self) -> u64 {
        self.inner.as_ref().map(|r| r.client_id).unwrap_or(0)
    }
    /// Accept: an endpoint to the client.
    pub fn accept(mut self, params: EndpointParams) -> Result<Endpoint> {
        let req = self.inner.take().ok_or(crate::Status::InvalidParam)?;
        let mut g = self.worker.lock()?;
        let e = g.conn_accept(&req)?;
        Endpoint::adopt(&self.worker, &mut g, e, params)
    }
    /// Reject: the client's endpoint fails with `Rejected`.
    pub fn reject(mut self) {
        self.reject_inner();
    }
    fn reject_inner(&mut self) {
        if let Some(req) = self.inner.take() {
            if let Ok(mut g) = self.worker.lock() {
                g.conn_reject(&req);
            }
        }
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        self.reject_inner();
    }
}

/// Listens on a socket address; closed when dropped.
///
/// The handler runs inside progress for each client, with a [`ConnRequest`] to accept
/// (keep the endpoint to answer on it) or reject. Clients connect with
/// [`Worker::connect_sockaddr`].
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use courier::{Context, ContextParams, EndpointParams, Listener, Worker, WorkerParams};
///
/// let ctx = Context::new(ContextParams::default())?;
/// let worker = Worker::new(&ctx, WorkerParams::default())?;
/// let (tx, accepted) = mpsc::channel();
/// let listener = Listener::new(&worker, ([127, 0, 0, 1], 0).into(), move |req| {
///     if req.client_id() == 7 {
///         let _ = tx.send(req.accept(EndpointParams::default()));
///     } else {
///         req.reject(); // the client's endpoint fails with `Rejected`
///     }
/// })?;
/// let client = worker.connect_sockaddr(listener.local_addr(), 7, EndpointParams::default())?;
/// client.wait_connected(Duration::from_secs(10))?;
/// let server_side = accepted.try_recv().expect("accepted during progress")?;
/// server_side.tag_send(b"welcome", 1)?;
/// # Ok::<(), courier::Error>(())
/// ```
pub struct Listener {
    worker: Worker,
    idx: u32,
    addr: SocketAddr,
}

impl Listener {
    /// Listen on `addr` (port 0 picks one); `handler` runs inside progress for each client.
    pub fn new(
        worker: &Worker,
        addr: SocketAddr,
        handler: impl FnMut(ConnRequest) + Send + 'static,
    ) -> Result<Listener> {
        let weak: Weak<WorkerInner> = Arc::downgrade(&worker.inner);
        let mut user = handler;
        let wrapped = move |r: wireup::ConnRequest| {
            if let Some(inner) = weak.upgrade() {
                user(ConnRequest {
                    worker: Worker { inner },
                    inner: Some(r),
                });
            }
        };
        let (idx, bound) = worker.lock()?.listener_add(addr, Box::new(wrapped))?;
        Ok(Listener {
            worker: worker.clone(),
            idx,
            addr: bound,
        })
    }

    /// The bound address (with the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Ok(mut g) = self.worker.lock() {
            g.listener_remove(self.idx);
        }
    }
}
