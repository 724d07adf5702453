//! Endpoints as the protocol layer keeps them: status, link, queues, error handler; how
//! one gets its link, fails, and is freed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::State;
use super::blockq::BlockQueue;
use super::fdpoll::watch;
use super::request::ErrorHandler;
use super::request::ReqKind;
use super::request::make_id;
use super::rndv::PushJob;
use super::send::Pending;
use crate::base::lock::StateCell;
use crate::base::{Error, Result, Status};
use crate::transport::{Caps, LinkRx, LinkTx, RndvMode};
use crate::wire::frame::{Header, Kind};

/// How many flushes with nothing to wait for pass between two looks at the clock, and how
/// long between two reads of the worker's events (`State::ep_idle_flush_end`): a read is a
/// system call, which every flush of a put loop would pay for too dearly.
const FLUSH_LOOKS_EVERY: u32 = 64;
const FLUSH_LOOK_GAP: Duration = Duration::from_millis(1);

/// An endpoint as a handle names it: its worker's state cell, its slot, and the slot's
/// generation when the handle was made.
#[derive(Clone, Copy)]
pub(crate) struct EpRef<'a> {
    pub(crate) cell: &'a StateCell<State>,
    pub(crate) idx: u32,
    pub(crate) generation: u32,
}

/// Which endpoint an `EpRef` names, as a plain value (the worker by its cell's address): what
/// a remote key remembers of the endpoint it was unpacked on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EpId {
    cell: usize,
    idx: u32,
    generation: u32,
}

impl EpRef<'_> {
    /// Run `f` on the state with the endpoint's index, if the endpoint is still the one
    /// the handle was made for (`EndpointClosed` otherwise).
    #[inline(always)]
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut State, u32) -> Result<T>) -> Result<T> {
        let mut g = self.cell.lock()?;
        if !g.ep_is(self.idx, self.generation) {
            return Err(Error::new(Status::EndpointClosed, "endpoint was closed"));
        }
        f(&mut g, self.idx)
    }

    /// The endpoint this names.
    #[inline(always)]
    pub(crate) fn id(&self) -> EpId {
        EpId {
            cell: self.cell as *const StateCell<State> as usize,
            idx: self.idx,
            generation: self.generation,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EpStatus {
    /// Waiting for the peer to accept (listener flow) or for a link upgrade.
    Connecting,
    Connected,
    /// Failed or closed; operations fail with this error.
    Dead(Error),
}

pub(crate) struct EpSlot {
    pub(in crate::proto) generation: u32,
    pub(in crate::proto) live: bool,
    pub(in crate::proto) status: EpStatus,
    pub(in crate::proto) tx: Option<LinkTx>,
    pub(in crate::proto) rx: Option<LinkRx>,
    /// A link being replaced (listener flow: the tcp link while the shm one comes up).
    pub(in crate::proto) old: Option<(LinkTx, LinkRx)>,
    /// The link's capabilities, `max_frame` lowered to the peer's `COURIER_MAX_FRAME`
    /// (`peer_max_frame`): what every sender on this endpoint cuts frames to.
    pub(in crate::proto) caps: Option<Caps>,
    /// The largest frame the peer accepts (`COURIER_MAX_FRAME`, from its worker address;
    /// `usize::MAX` until known, or from a build that does not say).
    pub(in crate::proto) peer_max_frame: usize,
    pub(in crate::proto) rndv_thresh: usize,
    pub(in crate::proto) pending: BlockQueue<Pending>,
    pub(in crate::proto) push: VecDeque<PushJob>,
    pub(in crate::proto) stream_in: super::streamq::StreamQueue,
    pub(in crate::proto) stream_reqs: VecDeque<u64>,
    pub(in crate::proto) err_handler: Option<crate::proto::request::ErrorHandler>,
    pub(in crate::proto) err_reported: bool,
    /// The link's fd is watched for room to write too (`fdpoll::watch_blocked_writes`).
    pub(in crate::proto) out_watched: bool,
    pub(in crate::proto) peer: String,
    pub(in crate::proto) conn_id: u64,
    /// The peer's worker id (when known) and whether it runs in this process's worker.
    pub(in crate::proto) peer_worker: u64,
    /// A handler is running on a frame of this endpoint's rx: do not drop the link now.
    pub(in crate::proto) rx_busy: bool,
    /// Puts or posted atomics were sent that the target acknowledges only by refusing
    /// them: a flush must ask the target to confirm.
    pub(in crate::proto) rma_unacked: bool,
    /// The first refusal of an unacknowledged put or posted atomic, reported by the next
    /// flush.
    pub(in crate::proto) rma_error: Option<Error>,
    /// Operations were sent through the owner (puts, gets, atomics) that no fence or flush
    /// has waited for since.
    pub(in crate::proto) rma_via_owner: bool,
    /// A remote key unpacked on this endpoint reaches memory without the owner (mapped
    /// here, or CMA): an operation through the owner may be overtaken by one of those.
    pub(in crate::proto) rma_direct_keys: bool,
    /// Target side: the rest of a put refused at its first frame (`Kind::PutBegin`), as
    /// bytes of put data still to drop unwritten on this link, and the refusal's status.
    pub(in crate::proto) put_refused: Option<(u64, Status)>,
    /// Set when the endpoint fails or closes. Remote keys unpacked on it hold it, so that
    /// their direct paths (plain stores into a same-host peer's memory, which never go
    /// through the worker) see it without the worker's lock.
    pub(in crate::proto) gone: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// What this endpoint's peer makes the worker keep, and its liveness (`limits.rs`,
    /// `keepalive.rs`).
    pub(in crate::proto) spent: super::limits::Spent,
}

impl EpSlot {
    /// Whether the endpoint is connected (its link carries the protocols' frames).
    #[inline(always)]
    pub(crate) fn is_connected(&self) -> bool {
        self.status == EpStatus::Connected
    }

    #[inline]
    pub(crate) fn dead_error(&self) -> Option<Error> {
        match &self.status {
            EpStatus::Dead(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// Fail every request on `ep` (called when the endpoint dies).
pub(crate) fn fail_error(peer: &str, why: &Error) -> Error {
    if why.status() == Status::PeerFailure
        || why.status() == Status::EndpointClosed
        || why.status() == Status::Rejected
    {
        why.clone()
    } else {
        Error::msg(
            why.status(),
            format!("connection to {peer} failed: {}", why.detail()),
        )
    }
}

impl State {
    /// (rendezvous threshold, max frame, rendezvous mode) of a usable endpoint.
    pub(crate) fn ep_limits(&mut self, e: u32) -> Result<(usize, usize, RndvMode)> {
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        if let Some(err) = ep.dead_error() {
            return Err(err);
        }
        match &ep.caps {
            Some(c) => Ok((ep.rndv_thresh, c.max_frame, c.rndv)),
            // Still connecting: eager up to a conservative size, push rendezvous above.
            None => Ok((ep.rndv_thresh.min(8192), 8192, RndvMode::Push)),
        }
    }

    #[inline]
    pub(crate) fn ep(&mut self, idx: u32) -> Option<&mut EpSlot> {
        self.eps.slots.get_mut(idx as usize).filter(|s| s.live)
    }

    pub(crate) fn ep_alloc(&mut self, peer: String) -> u32 {
        let slot = EpSlot {
            generation: 0,
            live: true,
            status: EpStatus::Connecting,
            tx: None,
            rx: None,
            old: None,
            caps: None,
            peer_max_frame: usize::MAX,
            rndv_thresh: usize::MAX,
            pending: BlockQueue::default(),
            push: VecDeque::new(),
            stream_in: Default::default(),
            stream_reqs: VecDeque::new(),
            err_handler: None,
            err_reported: false,
            out_watched: false,
            peer,
            conn_id: 0,
            peer_worker: 0,
            rx_busy: false,
            rma_unacked: false,
            rma_error: None,
            rma_via_owner: false,
            rma_direct_keys: false,
            put_refused: None,
            gone: Default::default(),
            spent: Default::default(),
        };
        if let Some(idx) = self.eps.free.pop() {
            let s = &mut self.eps.slots[idx as usize];
            let generation = s.generation.wrapping_add(1);
            *s = EpSlot { generation, ..slot };
            idx
        } else {
            self.eps.slots.push(slot);
            (self.eps.slots.len() - 1) as u32
        }
    }

    /// Give `ep` its link and start polling it.
    pub(crate) fn ep_install_link(&mut self, e: u32, tx: LinkTx, mut rx: LinkRx) -> Result<()> {
        rx.established(&self.cfg);
        let caps = tx.caps().clone();
        let thresh = self.cfg.rndv_thresh.unwrap_or(caps.rndv_thresh).max(1);
        if let Some(fd) = rx.fd() {
            // An fd link is read by progress itself; its fd joins the epoll set only while
            // the worker may sleep or reads through epoll (`fdpoll`).
            if !caps.data_via_fd || self.progress.fd_watched {
                watch(&self.progress.epoll, fd, e).map_err(|err| Error::io("epoll add", err))?;
            }
            if caps.data_via_fd {
                self.progress.fd_links += 1;
            }
        }
        let Some(ep) = self.ep(e) else {
            return Err(Error::new(Status::InvalidParam, "endpoint gone"));
        };
        ep.rndv_thresh = thresh;
        // A new link's fd is watched for arrivals only.
        ep.out_watched = false;
        let mut caps = caps;
        caps.max_frame = caps.max_frame.min(ep.peer_max_frame);
        ep.caps = Some(caps);
        ep.tx = Some(tx);
        ep.rx = Some(rx);
        if !self.progress.active.contains(&e) {
            self.progress.active.push(e);
        }
        if !self.progress.fd_watched
            && self.progress.fd_links > crate::proto::fdpoll::DIRECT_POLL_LINKS
        {
            self.watch_fd_links()?;
        }
        Ok(())
    }

    /// The peer of `e` accepts frames of at most `k` KiB (its worker address's
    /// `max_frame_k`; 0: it did not say): frames sent on `e` are cut to that from now on.
    pub(crate) fn ep_set_peer_max_frame(&mut self, e: u32, k: u16) {
        if k == 0 {
            return;
        }
        let max = (k as usize) << 10;
        if let Some(ep) = self.ep(e) {
            ep.peer_max_frame = max;
            if let Some(c) = ep.caps.as_mut() {
                c.max_frame = c.max_frame.min(max);
            }
        }
    }

    /// Take `ep`'s link out (deregistering its fd).
    pub(crate) fn ep_take_link(&mut self, e: u32) -> Option<(LinkTx, LinkRx)> {
        let epfd = &self.progress.epoll;
        let ep = self.eps.slots.get_mut(e as usize)?;
        let (tx, rx) = (ep.tx.take(), ep.rx.take());
        let via_fd = ep.caps.take().is_some_and(|c| c.data_via_fd);
        self.progress.active.retain(|&x| x != e);
        match (tx, rx) {
            (Some(tx), Some(rx)) => {
                if let Some(fd) = rx.fd() {
                    let _ = epoll::delete(epfd, fd);
                    if via_fd {
                        self.progress.fd_links = self.progress.fd_links.saturating_sub(1);
                    }
                }
                Some((tx, rx))
            }
            _ => None,
        }
    }

    /// The endpoint died: fail its requests, report once, drop its link when safe.
    pub(crate) fn fail_ep(&mut self, e: u32, why: Error) {
        let Some(ep) = self.ep(e) else { return };
        if matches!(ep.status, EpStatus::Dead(_)) {
            return;
        }
        let peer = ep.peer.clone();
        let err = fail_error(&peer, &why);
        ep.status = EpStatus::Dead(err.clone());
        ep.gone.store(true, std::sync::atomic::Ordering::Release);
        // The requests below fail and their buffers go back to the user: the link must not
        // write from them any more.
        if let Some(tx) = ep.tx.as_mut() {
            tx.abandon(&err);
        }
        if let Some((tx, _)) = ep.old.as_mut() {
            tx.abandon(&err);
        }
        // Frames still queued: their requests fail below with every other request on
        // this endpoint; the frames are freed a batch at a time (`forget_queued`).
        let queued = std::mem::take(&mut ep.pending);
        let answers = std::mem::take(&mut ep.spent.replies);
        ep.push.clear();
        let stream_reqs: Vec<u64> = ep.stream_reqs.drain(..).collect();
        let handler = if ep.err_reported {
            None
        } else {
            ep.err_handler.take()
        };
        ep.err_reported = true;
        let busy = ep.rx_busy;
        match why.status() {
            Status::EndpointClosed => {
                tracing::debug!("endpoint to {peer} closed: {}", why.detail())
            }
            Status::ProtocolError => tracing::warn!("dropping connection to {peer}: {why}"),
            _ => tracing::info!("endpoint to {peer} failed: {why}"),
        }
        for id in stream_reqs {
            self.complete(id, Err(err.clone()));
        }
        self.forget_queued(queued, answers);
        // Every request still waiting on this endpoint (rendezvous, acks, the sends of the
        // frames queued above); tag receives among them leave the posted queue, in one
        // pass over it (a long queue of failing sends does not walk it once each).
        let mut recvs = Vec::new();
        let ids: Vec<u64> = self
            .reqs
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && !s.done && s.ep == Some(e))
            .map(|(i, s)| {
                let id = make_id(s.generation, i as u32);
                if s.kind == ReqKind::TagRecv {
                    recvs.push(id);
                }
                id
            })
            .collect();
        self.tag.forget_posted(&recvs);
        for id in ids {
            self.complete(id, Err(err.clone()));
        }
        // Split receives from this peer and copies with it: their requests failed above.
        self.rndv.forget_ep(e);
        // Rendezvous offers from this peer can no longer be fetched; what else it sent
        // and no one received goes too, unless it closed gracefully (`limits.rs`).
        self.forget_unexpected_from(e);
        // A same-host peer that died leaves the mappings this process cached of it.
        self.mem.forget_exited_peers();
        if let Some(h) = handler {
            self.defer_ep_error(h, err);
        }
        if busy {
            self.progress.reap.push(e);
        } else {
            self.ep_take_link(e);
            // An endpoint a peer made that the application never took is freed with it.
            self.free_if_unowned(e);
        }
    }

    /// Give up on request `id`, still in flight: fail the endpoint it waits on with `why`,
    /// the one way to make certain that nothing reads or writes its buffer any more (the
    /// request then completes with that error). `false`: it waits on no endpoint.
    pub(crate) fn abandon(&mut self, id: u64, why: Error) -> bool {
        let Some(e) = self.req(id).filter(|s| !s.done).and_then(|s| s.ep) else {
            return false;
        };
        self.fail_ep(e, why);
        true
    }

    /// Free an endpoint slot entirely (handle gone and link dropped).
    pub(crate) fn ep_free(&mut self, e: u32) {
        self.ep_take_link(e);
        if let Some(ep) = self.eps.slots.get_mut(e as usize) {
            if ep.live {
                ep.live = false;
                ep.err_handler = None;
                let held = ep.stream_in.len();
                self.limits.held = self.limits.held.saturating_sub(held);
                let Some(ep) = self.eps.slots.get_mut(e as usize) else {
                    return;
                };
                ep.stream_in.clear(&mut self.stream_spares);
                ep.old = None;
                self.eps.free.push(e);
            }
        }
    }
}

/// What the API's `Endpoint` asks of its slot: queries, and the steps of flush and close.
impl State {
    /// Whether endpoint `e` is live and of generation `generation` (a handle to it is
    /// current).
    #[inline(always)]
    pub(crate) fn ep_is(&mut self, e: u32, generation: u32) -> bool {
        self.ep(e).is_some_and(|ep| ep.generation == generation)
    }

    /// A handle takes endpoint `e` with its error handler: the endpoint's generation.
    pub(crate) fn ep_adopt(&mut self, e: u32, handler: Option<ErrorHandler>) -> Result<u32> {
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint vanished"))?;
        ep.err_handler = handler;
        ep.spent.owned = true;
        Ok(ep.generation)
    }

    /// What `e`'s link can do; `None` while it connects (or once it is closed).
    pub(crate) fn ep_caps(&mut self, e: u32) -> Option<Caps> {
        self.ep(e).and_then(|ep| ep.caps.clone())
    }

    /// The peer of `e`, as text.
    pub(crate) fn ep_peer(&mut self, e: u32) -> String {
        self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default()
    }

    /// The transport carrying `e`, once connected.
    pub(crate) fn ep_transport(&mut self, e: u32) -> Option<&'static str> {
        self.ep(e).and_then(|ep| ep.caps.as_ref().map(|c| c.name))
    }

    /// This side's socket address when `e` was made over a socket (its link, or the one
    /// kept beside the link it moved to).
    pub(crate) fn ep_local_sockaddr(&mut self, e: u32) -> Result<Option<std::net::SocketAddr>> {
        let ep = self.ep(e).ok_or(Status::EndpointClosed)?;
        Ok(ep
            .rx
            .as_ref()
            .and_then(|rx| rx.local_sockaddr())
            .or_else(|| ep.old.as_ref().and_then(|(_, rx)| rx.local_sockaddr())))
    }

    /// Whether `e` is connected; its error if it failed.
    pub(crate) fn ep_connected(&mut self, e: u32) -> Result<bool> {
        match self.ep(e).map(|ep| ep.status.clone()) {
            Some(EpStatus::Connected) => Ok(true),
            Some(EpStatus::Connecting) => Ok(false),
            Some(EpStatus::Dead(err)) => Err(err),
            None => Err(Error::new(Status::EndpointClosed, "endpoint was closed")),
        }
    }

    /// A flush's look at `e`: whether everything sent has left (queued frames, pushes,
    /// the link's own queue) and every acknowledged operation is answered.
    pub(crate) fn ep_quiet(&mut self, e: u32) -> Result<bool> {
        self.progress_tx(e);
        let Some(ep) = self.ep(e) else {
            return Ok(true);
        };
        if let Some(err) = ep.dead_error() {
            return Err(err);
        }
        if !ep.pending.is_empty() || !ep.push.is_empty() || ep.status != EpStatus::Connected {
            return Ok(false);
        }
        let flushed = match ep.tx.as_mut() {
            Some(tx) => tx.flush()?,
            None => true,
        };
        Ok(flushed && !self.inflight.outgoing(e))
    }

    /// The end of a flush that had nothing to wait for. Puts and atomics into a same-host
    /// peer's memory are plain stores that never pass the worker, so a caller that only
    /// puts and flushes would never learn that the peer died: such flushes read the
    /// worker's events (a hung-up link among them) once a `FLUSH_LOOK_GAP`, looking at the
    /// clock every `FLUSH_LOOKS_EVERY`th time.
    pub(crate) fn ep_idle_flush_end(&mut self, e: u32) -> Result<()> {
        self.onesided.idle_flushes = self.onesided.idle_flushes.wrapping_add(1);
        if self.onesided.idle_flushes.is_multiple_of(FLUSH_LOOKS_EVERY) {
            let now = Instant::now();
            if self
                .onesided
                .idle_flush_look
                .is_some_and(|t| now.duration_since(t) < FLUSH_LOOK_GAP)
            {
                return self.rma_take_error(e).map_or(Ok(()), Err);
            }
            self.onesided.idle_flush_look = Some(now);
            self.progress_events();
            if let Some(err) = self.ep(e).and_then(|ep| ep.dead_error()) {
                return Err(err);
            }
            // Failed with frames still to deliver: the endpoint fails once progress has
            // delivered them, but this flush cannot say its operations arrived.
            if let Some((_, err)) = self.progress.link_errors.iter().find(|(x, _)| *x == e) {
                return Err(err.clone());
            }
        }
        self.rma_take_error(e).map_or(Ok(()), Err)
    }

    /// What `e` still has to send: frames queued here, rendezvous pushes, and bytes its
    /// link holds. While it goes down (or changes), the peer is taking data.
    pub(crate) fn ep_backlog(&mut self, e: u32) -> (usize, usize, usize) {
        self.ep(e).map_or((0, 0, 0), |ep| {
            (
                ep.pending.len(),
                ep.push.len(),
                ep.tx.as_ref().map_or(0, |t| t.queued()),
            )
        })
    }

    /// Tell the peer of connected endpoint `e` that it closes (waiting at most 2 s for the
    /// link to take the frame).
    pub(crate) fn ep_send_close(&mut self, e: u32) {
        let hdr = Header::bare(Kind::Close);
        if self
            .ep(e)
            .is_some_and(|ep| ep.status == EpStatus::Connected)
        {
            if let Some(tx) = self.ep(e).and_then(|ep| ep.tx.as_mut()) {
                let _ = tx.send(&[hdr.as_bytes()]);
                let deadline = Instant::now() + Duration::from_secs(2);
                while !matches!(tx.flush(), Ok(true) | Err(_)) && Instant::now() < deadline {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Close `e` here: its requests fail, no error handler runs, and its slot is freed
    /// once no handler runs on its link.
    pub(crate) fn ep_release(&mut self, e: u32) {
        self.fail_ep(
            e,
            Error::new(Status::EndpointClosed, "endpoint closed locally"),
        );
        if let Some(ep) = self.ep(e) {
            ep.err_handler = None;
        }
        // Error handlers are not called for a local close.
        self.drop_deferred_ep_errors();
        if !self.ep(e).is_some_and(|ep| ep.rx_busy) {
            self.ep_free(e);
        }
    }

    /// Every live endpoint with a link, as (index, generation).
    pub(crate) fn ep_list(&mut self) -> Vec<(u32, u32)> {
        let ids: Vec<u32> = self.progress.active.clone();
        ids.into_iter()
            .filter_map(|e| self.ep(e).map(|ep| (e, ep.generation)))
            .collect()
    }
}
