//! The worker state and its shared mechanisms: request slots, completion, endpoint
//! failure, sending a frame with back-pressure, and the pending queue.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use rustix::event::epoll;

use super::progress::{Deferred, token};
use super::state::*;
use crate::base::{Config, Error, Result, Status};
use crate::transport::{LinkRx, LinkTx, Sent, TxError, shm, tcp};
use crate::wire::address::WorkerAddress;
use crate::wire::frame::{Header, Kind};

/// An active-message handler.
pub type AmHandler = crate::proto::am::AmHandlerFn;
/// An endpoint's error handler.
pub type ErrorHandler = Box<dyn FnMut(&Error) + Send>;
/// A listener's connection handler.
pub type ConnHandler = Box<dyn FnMut(crate::proto::wireup::ConnRequest) + Send>;

pub(crate) struct ListenerSlot {
    pub live: bool,
    pub generation: u32,
    pub tcp: tcp::Listener,
    pub handler: Option<ConnHandler>,
}

pub(crate) struct PendingConn {
    pub live: bool,
    pub generation: u32,
    pub tx: Option<LinkTx>,
    pub rx: Option<LinkRx>,
    /// Which user listener accepted it (None: the worker's own acceptors).
    pub listener: Option<u32>,
    pub peer: String,
    pub since: Instant,
    /// The connection handler has it and has not answered yet.
    pub offered: bool,
    pub client_id: u64,
    pub client_addr: Option<WorkerAddress>,
}

pub(crate) struct State {
    pub cfg: Arc<Config>,
    pub mem: Arc<crate::proto::memreg::MemRegistry>,
    pub ctx_name: String,
    pub worker_id: u64,
    pub address: WorkerAddress,
    pub address_bytes: Vec<u8>,
    pub reqs: Slab<ReqSlot>,
    pub eps: Slab<EpSlot>,
    /// Endpoints with a link, polled by progress.
    pub active: Vec<u32>,
    /// Posted tag receives, oldest first (every one is live: cancel and endpoint
    /// failure remove theirs).
    pub expected: VecDeque<Posted>,
    pub unexpected: VecDeque<Unexpected>,
    /// Emptied buffers of unexpected eager messages, reused for the next ones: a sender
    /// that runs ahead of its receiver's posts otherwise costs an allocation per message.
    pub unexp_pool: Vec<Vec<u8>>,
    pub am_handlers: Vec<Option<AmHandler>>,
    pub deferred: Vec<Deferred>,
    /// An emptied `deferred`, swapped in when the callbacks run.
    pub deferred_spare: Vec<Deferred>,
    pub shm_acceptor: Option<shm::Acceptor>,
    pub tcp_acceptor: Option<tcp::Listener>,
    pub listeners: Slab<ListenerSlot>,
    pub pending_conns: Slab<PendingConn>,
    /// Shared-memory links this side is setting up (their acceptors' replies awaited).
    pub shm_connects: Vec<crate::proto::wireup::ShmConnect>,
    pub epoll: OwnedFd,
    pub eventfd: OwnedFd,
    pub ep_configs: Vec<String>,
    pub progress_calls: u64,
    /// Flushes that found nothing to wait for, and when one of them last read epoll (at
    /// most once a `FLUSH_LOOK_GAP`, looked at every `FLUSH_LOOKS_EVERY`th), so that a
    /// caller that only puts and flushes still learns that a peer died.
    pub idle_flushes: u32,
    pub idle_flush_look: Option<std::time::Instant>,
    pub in_progress: bool,
    pub fd_links: usize,
    /// Whether the fds of fd links are in the epoll set (`fdpoll`: only while the worker
    /// may sleep or watches too many links to read each one).
    pub fd_watched: bool,
    /// `progress_calls` at the last `arm`.
    pub armed_at: u64,
    /// Endpoints whose links must be dropped once no handler runs on them.
    pub reap: Vec<u32>,
    pub excluded: Vec<String>,
    /// Links that failed while frames were still buffered: fail after those are handled.
    pub link_errors: Vec<(u32, Error)>,
    /// Endpoints peers created to this worker, not yet taken by the application.
    pub incoming: VecDeque<(u32, u32)>,
    /// Split rendezvous receives waiting for the sender's part.
    pub splits: Vec<SplitWait>,
    /// Rendezvous copies with pieces still to make, oldest first.
    pub copies: VecDeque<super::pieces::CopyJob>,
    /// Bytes a piece of a copy takes about `pieces::PIECE_TIME` to copy (`pieces`).
    pub piece_bytes: usize,
    /// Copies that could have sized the pieces since the last one timed (`pieces`).
    pub copies_untimed: u32,
    /// Bytes copied since the current (or last) progress call began; `usize::MAX` after a
    /// copy of device memory (`pieces`).
    pub copy_spent: usize,
    /// How this worker's single-copy rendezvous copies went.
    pub rndv_copies: RndvCopies,
    /// Scratch for the ids of zero-copy sends a link reports written.
    pub written: Vec<u64>,
    /// A host copy of device memory waiting for the request the operation being started
    /// allocates first (`proto::stage`).
    pub parked: Option<Box<crate::proto::stage::Stage>>,
}

impl State {
    // ----- requests -------------------------------------------------------------------

    /// A new request with its buffer and callback; its id.
    pub(crate) fn req_alloc(
        &mut self,
        kind: ReqKind,
        ep: Option<u32>,
        buf: Buf,
        callback: Callback,
    ) -> u64 {
        let (id, s) = self.req_take(kind, ep);
        s.buf = buf;
        s.callback = callback;
        id
    }

    /// A new request's slot with every field that is read before it completes set, but its
    /// buffer and callback, which the caller stores (`req_alloc`, `post_recv`): a freed
    /// slot's were released, so nothing is left to drop.
    #[inline]
    pub(crate) fn req_take(&mut self, kind: ReqKind, ep: Option<u32>) -> (u64, &mut ReqSlot) {
        // A freed slot (`req_free` left its buffer and callback empty and it is not live),
        // or a new one, made vacant first; either is then set field by field (cheaper than
        // building and moving a whole slot).
        let idx = match self.reqs.free.pop() {
            Some(i) if (i as usize) < self.reqs.slots.len() => i as usize,
            _ => {
                self.reqs.slots.push(ReqSlot::vacant());
                self.reqs.slots.len() - 1
            }
        };
        let stage = self.parked.take();
        // In bounds: a free index checked above, or the slot just pushed.
        let s = &mut self.reqs.slots[idx];
        // Generations start at 1, so no request id is 0: the wire uses 0 for "no request"
        // (puts that are acknowledged only when refused).
        let generation = s.generation.wrapping_add(1).max(1);
        s.generation = generation;
        s.live = true;
        s.done = false;
        s.detached = false;
        s.zc_wait = false;
        s.waitall = false;
        s.rndv_push = false;
        s.kind = kind;
        s.ep = ep;
        s.expect = 0;
        s.got = 0;
        s.tag = 0;
        s.real_len = 0;
        // A free slot holds no staged copy (`ReqSlot::release`): only a new one is stored,
        // so the common case makes no call to drop the old.
        if stage.is_some() {
            s.stage = stage;
        }
        (make_id(generation, idx as u32), s)
    }

    /// The live slot for `id`, if the id is current.
    #[inline]
    pub(crate) fn req(&mut self, id: u64) -> Option<&mut ReqSlot> {
        let (generation, idx) = split_id(id);
        self.reqs
            .slots
            .get_mut(idx as usize)
            .filter(|s| s.live && s.generation == generation)
    }

    pub(crate) fn req_free(&mut self, id: u64) {
        let (_, idx) = split_id(id);
        if let Some(s) = self.req(id) {
            s.release();
            self.reqs.free.push(idx);
        }
    }

    /// The result of request `id` if it has completed, which frees its slot: one lookup
    /// for what a `Request` polls on every test.
    ///
    /// Written into the caller's `done` and `info` (a `Request`'s own fields) rather than
    /// returned: the done path of every polled request moves them once.
    #[inline]
    pub(crate) fn take_result(
        &mut self,
        id: u64,
        done: &mut Option<Result<Info, Error>>,
        info: &mut Info,
    ) {
        let Some(s) = self.req(id).filter(|s| s.done) else {
            return;
        };
        *info = s.info;
        *done = Some(std::mem::replace(&mut s.result, Ok(Info::default())));
        s.release();
        self.reqs.free.push(split_id(id).1);
    }

    /// Complete a request: record the result, queue its callback, free it if detached.
    pub(crate) fn complete(&mut self, id: u64, result: Result<Info, Error>) {
        let info = result.as_ref().copied().unwrap_or_default();
        self.complete_info(id, result, info)
    }

    /// Complete with an explicit info (kept also on failure).
    #[inline]
    pub(crate) fn complete_info(&mut self, id: u64, result: Result<Info, Error>, info: Info) {
        if self.req(id).is_some() {
            self.complete_slot(split_id(id).1, result, info);
        }
    }

    /// `complete_info` for the request in slot `idx`, which the caller found live and
    /// current (a matched receive: no second lookup by id).
    #[inline]
    pub(crate) fn complete_slot(&mut self, idx: u32, result: Result<Info, Error>, info: Info) {
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        if s.done {
            return;
        }

        s.done = true;
        s.info = info;
        // Device memory: the host copy goes to the device before anyone hears of it.
        let result = match s.stage.take() {
            Some(stage) => stage.finish(result),
            None => result,
        };
        if matches!(s.callback, Callback::None) {
            s.result = result;
            if s.detached {
                s.release();
                self.reqs.free.push(idx);
            }
            return;
        }
        // A request with a callback belongs to it (nobody polls it): free it now, or the
        // slot of every operation started with a callback (the C ABI's) stays taken.
        let cb = std::mem::replace(&mut s.callback, Callback::None);
        s.release();
        self.reqs.free.push(idx);
        self.deferred.push(Deferred::Req(cb, result, info));
    }

    /// Complete the receive in slot `idx` (live, not done, no device copy, one host
    /// segment: the caller checked) with `info`: the small-message path of
    /// `complete_slot`, in line, for a request polled by its handle or finished by a
    /// plain function.
    #[inline(always)]
    pub(crate) fn complete_small(&mut self, idx: u32, len: usize, tag: u64) {
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        match (&s.callback, &s.buf) {
            (Callback::None, _) if !s.detached => {
                let info = Info { len, tag, value: 0 };
                s.done = true;
                s.info = info;
                s.result = Ok(info);
            }
            (&Callback::Raw(f, user), Buf::One(_)) => {
                // Neither a plain function nor one segment needs a drop: forget them.
                s.done = true;
                s.info = Info { len, tag, value: 0 };
                s.live = false;
                std::mem::forget(std::mem::replace(&mut s.callback, Callback::None));
                std::mem::forget(std::mem::replace(&mut s.buf, Buf::EMPTY));
                self.reqs.free.push(idx);
                self.defer_raw_ok(f, user, Info { len, tag, value: 0 });
            }
            _ => {
                let info = Info { len, tag, value: 0 };
                self.complete_slot(idx, Ok(info), info)
            }
        }
    }

    /// Queue a plain function's successful completion (`Vec::push`, in line on the
    /// small-message path). Room is made first and the entry built in place: built before
    /// a possible `reserve` call, it would be spilled whole and copied back in wide loads
    /// of the narrow stores that built it, which the CPU cannot forward.
    #[inline(always)]
    fn defer_raw_ok(&mut self, f: RawFn, user: usize, info: Info) {
        if self.deferred.len() == self.deferred.capacity() {
            self.deferred.reserve(32);
        }
        let at = self.deferred.len();
        // SAFETY: there is room for one more element (reserved above); writing it past the
        // end and then counting it is what `push` does.
        unsafe {
            self.deferred.as_mut_ptr().add(at).write(Deferred::Req(
                Callback::Raw(f, user),
                Ok(info),
                info,
            ));
            self.deferred.set_len(at + 1);
        }
    }

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
            rndv_thresh: usize::MAX,
            pending: VecDeque::new(),
            push: VecDeque::new(),
            stream_in: VecDeque::new(),
            stream_reqs: VecDeque::new(),
            err_handler: None,
            err_reported: false,
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
        rx.established();
        let caps = tx.caps().clone();
        let thresh = self.cfg.rndv_thresh.unwrap_or(caps.rndv_thresh).max(1);
        if let Some(fd) = rx.fd() {
            // An fd link is read by progress itself; its fd joins the epoll set only while
            // the worker may sleep or reads through epoll (`fdpoll`).
            if !caps.data_via_fd || self.fd_watched {
                watch(&self.epoll, fd, e).map_err(|err| Error::io("epoll add", err))?;
            }
            if caps.data_via_fd {
                self.fd_links += 1;
                crate::proto::wireup::set_tcp_keepalive(fd, &self.cfg);
            }
        }
        let Some(ep) = self.ep(e) else {
            return Err(Error::new(Status::InvalidParam, "endpoint gone"));
        };
        ep.rndv_thresh = thresh;
        ep.caps = Some(caps);
        ep.tx = Some(tx);
        ep.rx = Some(rx);
        if !self.active.contains(&e) {
            self.active.push(e);
        }
        if !self.fd_watched && self.fd_links > crate::proto::fdpoll::DIRECT_POLL_LINKS {
            self.watch_fd_links()?;
        }
        Ok(())
    }

    /// Take `ep`'s link out (deregistering its fd).
    pub(crate) fn ep_take_link(&mut self, e: u32) -> Option<(LinkTx, LinkRx)> {
        let epfd = &self.epoll;
        let ep = self.eps.slots.get_mut(e as usize)?;
        let (tx, rx) = (ep.tx.take(), ep.rx.take());
        let via_fd = ep.caps.take().is_some_and(|c| c.data_via_fd);
        self.active.retain(|&x| x != e);
        match (tx, rx) {
            (Some(tx), Some(rx)) => {
                if let Some(fd) = rx.fd() {
                    let _ = epoll::delete(epfd, fd);
                    if via_fd {
                        self.fd_links = self.fd_links.saturating_sub(1);
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
        let pending: Vec<u64> = ep.pending.drain(..).filter_map(|p| p.req).collect();
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
        for id in pending.into_iter().chain(stream_reqs) {
            self.complete(id, Err(err.clone()));
        }
        // Every request still waiting on this endpoint (rendezvous, acks).
        let ids: Vec<u64> = self
            .reqs
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && !s.done && s.ep == Some(e))
            .map(|(i, s)| make_id(s.generation, i as u32))
            .collect();
        for id in ids {
            self.expected.retain(|p| p.id != id);
            self.complete(id, Err(err.clone()));
        }
        // Split receives from this peer and copies with it: their requests failed above.
        self.splits.retain(|w| w.ep != e);
        self.copies.retain(|c| c.ep != e);
        // Rendezvous offers from this peer can no longer be fetched.
        self.unexpected
            .retain(|u| !(u.ep == e && matches!(u.body, UnexpBody::Rts { .. })));
        if let Some(h) = handler {
            self.deferred.push(Deferred::EpError(h, err));
        }
        if busy {
            self.reap.push(e);
        } else {
            self.ep_take_link(e);
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
                ep.stream_in = VecDeque::new();
                ep.old = None;
                self.eps.free.push(e);
            }
        }
    }

    // ----- sending --------------------------------------------------------------------

    /// Try to send one frame on `e` at once, without a request: `Ok(true)` if it left,
    /// `Ok(false)` if it must wait (earlier frames queued, link busy or not connected yet).
    #[inline]
    pub(crate) fn try_send_now(
        &mut self,
        e: u32,
        hdr: &Header,
        extra: &[u8],
        data: &Buf,
    ) -> Result<bool> {
        let epoch = self.progress_calls;
        let Some(ep) = self.ep(e) else {
            return Err(Error::new(Status::EndpointClosed, "endpoint was closed"));
        };
        if let EpStatus::Dead(err) = &ep.status {
            return Err(err.clone());
        }
        if !(ep.pending.is_empty() && ep.status == EpStatus::Connected) {
            return Ok(false);
        }
        let Some(tx) = ep.tx.as_mut() else {
            return Ok(false);
        };
        tx.note_epoch(epoch);
        match send_parts(tx, hdr.as_bytes(), extra, data) {
            Ok(()) => Ok(true),
            Err(TxError::NoResource) => Ok(false),
            Err(TxError::Failed(err)) => {
                self.fail_ep(e, err.clone());
                Err(self.ep(e).and_then(|ep| ep.dead_error()).unwrap_or(err))
            }
        }
    }

    /// The small-message fast path: header, extra bytes and one contiguous data segment
    /// go straight into the link of a connected endpoint with nothing queued. `eager_len`
    /// must be below the rendezvous threshold (`None`: eager regardless) and `frame` (the
    /// size checked against the link's largest frame) must fit. `None`: take the general
    /// path (which queues, or reports the endpoint's error).
    #[inline(always)]
    pub(crate) fn send_now_fast(
        &mut self,
        e: u32,
        hdr: &[u8],
        extra: &[u8],
        (addr, len): (usize, usize),
        eager_len: Option<usize>,
        frame: usize,
    ) -> Option<Result<()>> {
        let ep = self.eps.slots.get_mut(e as usize)?;
        if !(ep.live && ep.status == EpStatus::Connected && ep.pending.is_empty())
            || eager_len.is_some_and(|l| l >= ep.rndv_thresh)
        {
            return None;
        }
        let tx = ep.tx.as_mut()?;
        if frame > tx.max_frame() {
            return None;
        }
        let data: &[u8] = seg_slice(addr, len);
        tx.note_epoch(self.progress_calls);
        match tx.send3(hdr, extra, data) {
            Ok(()) => Some(Ok(())),
            Err(TxError::NoResource) => None,
            Err(TxError::Failed(err)) => Some(Err(self.send_failed(e, err))),
        }
    }

    /// A link refused a frame for good: the endpoint fails; the error to report.
    #[cold]
    #[inline(never)]
    fn send_failed(&mut self, e: u32, err: Error) -> Error {
        self.fail_ep(e, err.clone());
        self.ep(e).and_then(|ep| ep.dead_error()).unwrap_or(err)
    }

    /// Send one frame on `e` now, or queue it behind earlier ones. `Ok(true)`: sent now.
    /// On a dead endpoint returns its error.
    #[inline]
    pub(crate) fn send_frame(
        &mut self,
        e: u32,
        hdr: &Header,
        extra: &[u8],
        data: &Buf,
        req: Option<u64>,
    ) -> Result<bool> {
        // A frame the link cannot carry is this call's error, not the link's: handed to
        // the link, it would fail the endpoint for good.
        let size = hdr.as_bytes().len() + extra.len() + data.len();
        if let Some(max) = self
            .ep(e)
            .and_then(|ep| ep.caps.as_ref())
            .map(|c| c.max_frame)
            && size > max
        {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "a frame of {size} bytes ({} of them a message header or rendezvous offer) exceeds the transport's {max}-byte frame; nothing was sent",
                    extra.len()
                ),
            ));
        }
        if self.try_send_now(e, hdr, extra, data)? {
            return Ok(true);
        }
        self.enqueue(
            e,
            Pending {
                req,
                hdr: *hdr,
                extra: extra.to_vec(),
                data: data.clone(),
                region: None,
            },
        )?;
        Ok(false)
    }

    /// Queue a frame on `e` behind the ones already waiting (`progress_tx` sends them).
    pub(crate) fn enqueue(&mut self, e: u32, p: Pending) -> Result<()> {
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        ep.pending.push_back(p);
        Ok(())
    }

    /// Retry queued frames and rendezvous pushes of `e`; flush its transport queue.
    pub(crate) fn progress_tx(&mut self, e: u32) -> usize {
        let mut n = 0;
        loop {
            self.check_queued_read(e);
            let Some(ep) = self.ep(e) else { return n };
            if ep.status != EpStatus::Connected {
                return n;
            }
            let Some(tx) = ep.tx.as_mut() else { return n };
            let Some(p) = ep.pending.front() else { break };
            // A frame that completes a request may be left in its buffer (zero copy).
            let sent = match p.req {
                Some(id) => send_parts_zc(tx, p.hdr.as_bytes(), &p.extra, &p.data, id),
                None => send_parts(tx, p.hdr.as_bytes(), &p.extra, &p.data).map(|()| Sent::Done),
            };
            match sent {
                Ok(sent) => {
                    let p = ep.pending.pop_front();
                    n += 1;
                    // A queued eager send completes when its last frame is written.
                    if let Some(Pending {
                        req: Some(id), hdr, ..
                    }) = p
                    {
                        let kind = hdr.as_bytes()[0];
                        let eager = [
                            Kind::TagEager,
                            Kind::Am,
                            Kind::Stream,
                            Kind::Put,
                            Kind::PutSignal,
                        ];
                        if eager.iter().any(|k| *k as u8 == kind) {
                            let len = self.req(id).map(|s| s.buf.len()).unwrap_or(0);
                            self.complete_when_written(
                                id,
                                sent,
                                Info {
                                    len,
                                    tag: 0,
                                    value: 0,
                                },
                            );
                        }
                    }
                }
                Err(TxError::NoResource) => break,
                Err(TxError::Failed(err)) => {
                    self.fail_ep(e, err);
                    return n;
                }
            }
        }
        n += self.progress_push(e);
        if let Some(tx) = self.ep(e).and_then(|ep| ep.tx.as_mut()) {
            if let Err(err) = tx.flush() {
                self.fail_ep(e, err);
                return n;
            }
        }
        n + self.reap_written(e)
    }

    /// If the next frame queued on `e` is a get's answer read from one of our regions, make
    /// sure the region is still mapped; if not, the answers of that get still queued are
    /// dropped and the requester is told the get was refused (`drop_get_answers`). Only
    /// frames that waited are checked again: one sent at once leaves while the get's own
    /// check holds. (An unmap on another thread while the frame is being handed to the link
    /// still races that one copy, as a store through shared memory would.)
    #[inline]
    fn check_queued_read(&mut self, e: u32) {
        let Some((src, len)) = self
            .eps
            .slots
            .get(e as usize)
            .and_then(|ep| ep.pending.front())
            .and_then(|p| Some((p.region?, p.data.len() as u64)))
        else {
            return;
        };
        let need = crate::wire::rkey::access::READ;
        if let Err(err) = self
            .mem
            .lookup_place(src.region, src.secret, src.addr, len, need)
        {
            self.drop_get_answers(e, src.req, err);
        }
    }

    /// A send request's last frame went to the link: complete it now if the link holds no
    /// reference to its buffer, else when the link reports it written (`reap_written`).
    pub(crate) fn complete_when_written(&mut self, id: u64, sent: Sent, info: Info) {
        match sent {
            Sent::Done => self.complete(id, Ok(info)),
            Sent::Later => {
                if let Some(s) = self.req(id) {
                    s.zc_wait = true;
                    s.info = info;
                }
            }
        }
    }

    /// Complete the sends whose last bytes `e`'s link has written since the last call;
    /// how many.
    #[inline]
    pub(crate) fn reap_written(&mut self, e: u32) -> usize {
        let waiting = self
            .eps
            .slots
            .get(e as usize)
            .and_then(|ep| ep.tx.as_ref())
            .is_some_and(|tx| tx.has_completed());
        if !waiting {
            return 0;
        }
        let mut n = 0;
        let mut ids = std::mem::take(&mut self.written);
        if let Some(tx) = self
            .eps
            .slots
            .get_mut(e as usize)
            .and_then(|ep| ep.tx.as_mut())
        {
            tx.take_completed(&mut ids);
        }
        for id in ids.drain(..) {
            // Ids of requests that failed or were reused meanwhile are not waiting.
            if let Some(s) = self.req(id).filter(|s| s.zc_wait && !s.done) {
                s.zc_wait = false;
                let info = s.info;
                self.complete(id, Ok(info));
                n += 1;
            }
        }
        self.written = ids;
        n
    }
}

/// Add endpoint `e`'s link fd to the worker's epoll set (already there: fine).
pub(crate) fn watch(
    epfd: &OwnedFd,
    fd: std::os::fd::BorrowedFd<'_>,
    e: u32,
) -> std::result::Result<(), rustix::io::Errno> {
    match epoll::add(
        epfd,
        fd,
        epoll::EventData::new_u64(token::make(token::EP, e)),
        epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
    ) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(err) => Err(err),
    }
}

/// A user data segment as a slice (empty segments may have any address, even 0).
#[inline]
fn seg_slice<'a>(a: usize, l: usize) -> &'a [u8] {
    if l == 0 {
        &[]
    } else {
        // SAFETY: data segments are user buffers kept alive by their request.
        unsafe { std::slice::from_raw_parts(a as *const u8, l) }
    }
}

/// Hand header, extra bytes and data segments to the transport as one frame.
#[inline]
pub(crate) fn send_parts(
    tx: &mut LinkTx,
    hdr: &[u8],
    extra: &[u8],
    data: &Buf,
) -> Result<(), TxError> {
    with_parts(hdr, extra, data, |parts| tx.send(parts))
}

/// `send_parts` without copying large data the link cannot write at once: `Sent::Later`
/// means the link reports `token` (0: none) when done with `data`, which must stay valid
/// until then (it is a request's buffer, and the request completes no earlier).
#[inline]
pub(crate) fn send_parts_zc(
    tx: &mut LinkTx,
    hdr: &[u8],
    extra: &[u8],
    data: &Buf,
    token: u64,
) -> Result<Sent, TxError> {
    // Header and extra bytes belong to the caller's stack or queue entry: copied.
    with_parts(hdr, extra, data, |parts| tx.send_zc(parts, 2, token))
}

/// Call `f` with header, extra bytes and data segments as one list of parts.
#[inline]
fn with_parts<T>(hdr: &[u8], extra: &[u8], data: &Buf, f: impl FnOnce(&[&[u8]]) -> T) -> T {
    let segs = data.segs();
    if segs.len() <= 6 {
        let mut parts: [&[u8]; 8] = [&[]; 8];
        parts[0] = hdr;
        parts[1] = extra;
        for (i, &(a, l)) in segs.iter().enumerate() {
            parts[2 + i] = seg_slice(a, l);
        }
        f(&parts[..2 + segs.len()])
    } else {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(segs.len() + 2);
        parts.push(hdr);
        parts.push(extra);
        for &(a, l) in segs {
            parts.push(seg_slice(a, l));
        }
        f(&parts)
    }
}
