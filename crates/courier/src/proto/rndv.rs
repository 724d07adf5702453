//! Rendezvous: large tag and active messages, moved once the receiver is ready.
//!
//! The sender offers the message (`TagRts`, `AmRts`). With remote read (a same-process
//! peer, or a same-host one whose CMA probe passed) the offer lists the sender's segments
//! (and, for memory in a shared segment or device memory, the key that maps it) and the
//! receiver copies them itself, in pieces as it progresses (`pieces.rs`), then acknowledges
//! (`RndvAts`); a large one is split, the sender writing the second half into the
//! receiver's memory while the receiver reads the first (`RndvSplit`). Otherwise the
//! receiver answers ready-to-receive (`RndvRtr`) and the sender pushes `RndvData` frames
//! straight from the user buffer.

use std::collections::VecDeque;

use super::State;
use super::buf::{Buf, Segs, seg_range};
use super::pieces::{AfterCopy, Dir};
use super::request::{Info, ReqKind};
use crate::base::{Error, Result, Status};
use crate::transport::{RndvMode, copy_segments};
use crate::wire::frame::{self, Header, Kind, Segments, emit_segments};

/// Rendezvous in flight, worker-wide.
pub(crate) struct RndvState {
    /// Split rendezvous receives waiting for the sender's part.
    pub(super) splits: Vec<SplitWait>,
    /// Rendezvous copies with pieces still to make, oldest first.
    pub(super) copies: VecDeque<super::pieces::CopyJob>,
    /// Bytes a piece of a copy takes about `pieces::PIECE_TIME` to copy (`pieces`).
    pub(super) piece_bytes: usize,
    /// Copies that could have sized the pieces since the last one timed (`pieces`).
    pub(super) copies_untimed: u32,
    /// Bytes copied since the current (or last) progress call began; `usize::MAX` after a
    /// copy of device memory (`pieces`).
    pub(super) copy_spent: usize,
    /// How this worker's single-copy rendezvous copies went.
    pub(super) stats: RndvCopies,
}

impl Default for RndvState {
    fn default() -> Self {
        RndvState {
            splits: Vec::new(),
            copies: VecDeque::new(),
            piece_bytes: usize::MAX,
            copies_untimed: 0,
            copy_spent: 0,
            stats: RndvCopies::default(),
        }
    }
}

impl RndvState {
    /// Endpoint `e` failed: its split receives and copies are over (their requests failed
    /// with it).
    pub(super) fn forget_ep(&mut self, e: u32) {
        self.splits.retain(|w| w.ep != e);
        self.copies.retain(|c| c.ep != e);
    }
}

/// Data to push to a peer after it said it is ready (rendezvous without remote read).
pub(crate) struct PushJob {
    pub(in crate::proto) sreq: u64,
    pub(in crate::proto) rreq: u64,
    pub(in crate::proto) data: Buf,
    pub(in crate::proto) offset: usize,
    pub(in crate::proto) total: usize,
}

/// How a worker's single-copy rendezvous copies (reads and writes of a same-host peer's
/// buffers, each part of a split counted once) were made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RndvCopies {
    /// Through a shared segment of memory the peer allocated with `mem_map`.
    pub shared: u64,
    /// Through the kernel (CMA, or a copy within the process for `self`).
    pub link: u64,
    /// From a same-host peer's device memory, opened with its CUDA IPC handle.
    pub device: u64,
}

/// A split rendezvous receive: this side reads the first part, the sender writes the rest;
/// it ends when both are done.
pub(crate) struct SplitWait {
    pub(in crate::proto) rreq: u64,
    pub(in crate::proto) ep: u32,
    pub(in crate::proto) sreq: u64,
    /// Result of this side's own read, once complete.
    pub(in crate::proto) own: Option<crate::base::Result<()>>,
    /// The sender's answer (0 or an error code), once it came.
    pub(in crate::proto) rest: Option<i32>,
    /// The rest: where it goes here, and where it lies in the sender (for a fallback read).
    pub(in crate::proto) rest_local: Segs<usize>,
    pub(in crate::proto) rest_remote: Segs<u64>,
}

impl State {
    /// How this worker's single-copy rendezvous copies were made so far.
    pub(crate) fn rndv_copies(&self) -> RndvCopies {
        self.rndv.stats
    }

    /// The matched tag receive `id` into device memory takes its data through host memory:
    /// make its deferred host copy (only page-locked, and only if the pool has one, when
    /// `pinned`), which becomes the request's buffer; the device buffer is filled from it
    /// when the receive completes (`Stage::finish`). Whether it was made.
    pub(super) fn recv_through_host(&mut self, id: u64, pinned: bool) -> bool {
        let Some(s) = self.req(id) else { return false };
        let host = s.stage.as_mut().and_then(|st| {
            if pinned {
                st.pinned_host_target()
            } else {
                st.host_target()
            }
        });
        host.map(|h| s.buf = h).is_some()
    }

    /// Whether `data` (holding device memory) goes to the peer of `e` as a rendezvous offer
    /// of the device memory itself: the peer is a process of this host that reads offers, the
    /// message is large enough for a rendezvous to pay, and one device region with an IPC
    /// handle holds all of it.
    pub(super) fn device_offer(&mut self, e: u32, data: &Buf) -> bool {
        // From `COURIER_CUDA_IPC_THRESH` (16 KiB): smaller messages go as a host copy, sent
        // eagerly. On an H100 the offer took 16 KiB device to device in 16 us one way
        // against 27 as a host copy, while at 1 KiB and below the host copy kept a higher
        // message rate and the receive into host memory quicker (`bench/GPU.md`).
        if data.len() < self.cfg.cuda_ipc_thresh.max(1) {
            return false;
        }
        let Some(ep) = self.ep(e) else { return false };
        let reads_peer = ep
            .caps
            .as_ref()
            .is_some_and(|c| c.peer_memory && c.rndv == RndvMode::RemoteRead);
        reads_peer && self.mem.device_key(data.segs(), None)
    }

    /// Receive a rendezvous message `len` bytes long into request `id`'s buffer. `key`, if
    /// the sender gave one, names the shared segment its `segs` lie in.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rndv_receive(
        &mut self,
        e: u32,
        id: u64,
        sreq: u64,
        len: usize,
        tag: u64,
        segs: &[(u64, u64)],
        key: Option<&[u8]>,
    ) {
        self.req_set_ep(id, e);
        let Some(s) = self.req(id) else { return };
        let cap = s.buf.len();
        let want = len.min(cap);
        s.expect = want;
        s.got = 0;
        s.real_len = len;
        s.tag = tag;
        let mut remote_read = !segs.is_empty()
            && self
                .ep(e)
                .and_then(|ep| ep.caps.as_ref())
                .map(|c| c.rndv == RndvMode::RemoteRead)
                .unwrap_or(false);
        let device = key.is_some_and(super::memreg::is_device_key);
        if let (true, Some(k)) = (remote_read && device, key) {
            // The sender's device memory: read through its IPC handle if it opens here (the
            // opening is kept for the copy), else the sender pushes a host copy.
            let pid = self
                .ep(e)
                .and_then(|ep| ep.tx.as_ref())
                .and_then(|tx| tx.peer_pid())
                .unwrap_or(0);
            if let Err(err) = self.mem.device_view(k, pid, segs) {
                tracing::debug!(
                    "the peer's device memory cannot be opened here ({err}); it pushes a host copy"
                );
                remote_read = false;
            }
        }
        // A tag receive into device memory whose host copy is deferred: its buffer is the
        // device memory itself.
        let mut deferred = self
            .req(id)
            .and_then(|s| s.stage.as_ref())
            .is_some_and(|st| st.deferred());
        // The peer's host memory: into a page-locked host copy while the pool has one (both
        // sides copy, split, and the device takes it in one transfer), else through
        // page-locked pieces (`Dir::ReadToDevice`).
        if deferred && remote_read && !device && self.recv_through_host(id, true) {
            deferred = false;
        }
        if remote_read {
            // Device memory read from the peer's device memory goes straight into a device
            // receive buffer, not through its host copy.
            let direct = device
                .then(|| self.req(id)?.stage.as_mut()?.direct_target(want))
                .flatten();
            let local = direct.unwrap_or_else(|| {
                self.req(id)
                    .map(|s| s.buf.slice(0, want))
                    .unwrap_or_default()
            });
            let mut remote = Segs::new();
            let mut left = want as u64;
            for &(a, l) in segs {
                if left == 0 {
                    break;
                }
                let n = l.min(left);
                remote.push((a, n));
                left -= n;
            }
            if let Some(at) = self.split_point(e, want).filter(|_| !device && !deferred) {
                if self.start_split(e, id, sreq, at, want, &local, &remote, key) {
                    return;
                }
            }
            let after = AfterCopy::Read { rreq: id, sreq };
            // A deferred receive's buffer is device memory, filled from the peer's host
            // memory (its device memory is read through the key, device to device).
            let dir = if deferred && !device {
                Dir::ReadToDevice
            } else {
                Dir::Read
            };
            // SAFETY: `local` segments are the request's live receive buffer, until the copy
            // completes the request.
            unsafe { self.copy_then(e, key, local, remote, dir, after) };
            return;
        }
        if deferred {
            // Pushed data lands in host memory, as the link reads it.
            self.recv_through_host(id, false);
        }
        if let Some(s) = self.req(id) {
            s.rndv_push = true;
        }
        let hdr = Header::rndv_rtr(sreq, id, want as u64);
        if let Err(err) = self.send_frame(e, &hdr, &[], &Buf::EMPTY, None) {
            self.complete(id, Err(err));
            return;
        }
        if want == 0 {
            self.finish_recv(id);
        }
    }

    /// Where to split a remote-read rendezvous of `want` bytes on `e` so that the sender
    /// writes the second part while this side reads the first, if worth it.
    fn split_point(&mut self, e: u32, want: usize) -> Option<usize> {
        let min = self.cfg.cma_split?;
        if want < min.max(8192) {
            return None;
        }
        let tx = self.ep(e)?.tx.as_ref()?;
        if !tx.writes_remote() {
            return None;
        }
        // Page-aligned, so the two copies touch different pages.
        Some((want / 2) & !4095)
    }

    /// Start a split rendezvous: ask the sender to write bytes `[at, want)`, read `[0, at)`
    /// here. `false` if the request could not be sent (then read everything here).
    #[allow(clippy::too_many_arguments)]
    fn start_split(
        &mut self,
        e: u32,
        id: u64,
        sreq: u64,
        at: usize,
        want: usize,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
        key: Option<&[u8]>,
    ) -> bool {
        let rest_local = seg_range(local, at, want - at);
        let rest_remote = seg_range(remote, at as u64, (want - at) as u64);
        let rest = Buf::from(rest_local.clone());
        let mut extra = Vec::with_capacity(Self::offer_capacity(0, &rest));
        let (count, shared) = self.emit_offer(e, &mut extra, &rest);
        let rest_len = (want - at) as u64;
        let hdr = Header::rndv_split(sreq, id, at as u64, rest_len, count as u32, shared);
        if self.send_frame(e, &hdr, &extra, &Buf::EMPTY, None).is_err() {
            return false;
        }
        let own_local = seg_range(local, 0, at);
        let own_remote = seg_range(remote, 0, at as u64);
        self.rndv.splits.push(SplitWait {
            rreq: id,
            ep: e,
            sreq,
            own: None,
            rest: None,
            rest_local,
            rest_remote,
        });
        let after = AfterCopy::SplitOwn { rreq: id };
        // SAFETY: `own_local` lies in the request's live receive buffer, until the split
        // ends and completes the request.
        unsafe { self.copy_then(e, key, own_local, own_remote, Dir::Read, after) };
        true
    }

    /// Room for `data`'s rendezvous offer (segments and a region key) after `extra` bytes.
    pub(crate) fn offer_capacity(extra: usize, data: &Buf) -> usize {
        extra + data.segs().len() * frame::SEG_LEN + crate::wire::rkey::LEN
    }

    /// Append `data`'s segments to a rendezvous offer on `e`. Where the peer is a process of
    /// this host (`Caps::peer_memory`) and `data` lies in one of this context's allocated regions, that region's key follows,
    /// so the peer copies with plain loads and stores through the shared segment rather than
    /// through the kernel. Returns the segment count and the frame flags to set.
    pub(crate) fn emit_offer(&mut self, e: u32, out: &mut Vec<u8>, data: &Buf) -> (usize, u8) {
        let segs = data.segs();
        emit_segments(out, segs.iter().map(|&(a, l)| (a as u64, l as u64)));
        let peer_memory = self
            .ep(e)
            .and_then(|ep| ep.caps.as_ref())
            .is_some_and(|c| c.peer_memory);
        if peer_memory && self.cfg.shm_segment_copy && self.mem.shared_key(segs, out) {
            return (segs.len(), frame::flags::SHARED);
        }
        if peer_memory && super::stage::device_active() && self.mem.device_key(segs, Some(out)) {
            return (segs.len(), frame::flags::SHARED);
        }
        (segs.len(), 0)
    }

    /// Copy between `local` segments here and `remote` segments of the peer of `e`: read
    /// them or write them, as `dir` says. Through the peer's shared segment when it gave a
    /// `key` that checks out, else through the link (CMA). A key that does not check out
    /// (forged, stale, another process's) only costs the faster path. `count`: count it in
    /// `rndv_copies` (the first piece of a copy made in pieces).
    ///
    /// # Safety
    /// `local` segments must be valid for writes (reads for `Dir::Write`) of their lengths:
    /// device memory for `Dir::ReadToDevice`, host memory otherwise.
    pub(crate) unsafe fn peer_copy(
        &mut self,
        e: u32,
        key: Option<&[u8]>,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
        dir: Dir,
        count: bool,
    ) -> Result<()> {
        let write = dir == Dir::Write;
        let pid = self
            .ep(e)
            .and_then(|ep| ep.tx.as_ref())
            .and_then(|tx| tx.peer_pid());
        if let Some(key) = key.filter(|k| super::memreg::is_device_key(k)) {
            // The peer's device memory: only through its IPC handle (neither CMA nor the
            // CPU can reach it), and only read (a receiver never offers device memory).
            let pid = pid.ok_or_else(|| {
                Error::new(
                    Status::Unsupported,
                    "device memory offered over a non-shm link",
                )
            })?;
            if write {
                return Err(Error::new(
                    Status::Unsupported,
                    "a rendezvous never writes into a peer's device memory",
                ));
            }
            let (_map, there) = self.mem.device_view(key, pid, remote)?;
            self.rndv.stats.device += u64::from(count);
            // SAFETY: `there` lies in our live mapping of the peer's allocation (checked
            // against its owner's record and the allocation's length); `local` by the
            // caller's contract.
            return unsafe { super::stage::copy_from_device(local, &there) };
        }
        if dir == Dir::ReadToDevice {
            // A deferred tag receive's device memory, filled from the peer's host memory
            // through page-locked pieces: each piece read here while the device copies the
            // one before in.
            let n = local.iter().map(|&(_, l)| l).sum();
            // SAFETY: per the contract; each piece lies in a bounce buffer of its length.
            return unsafe {
                super::stage::to_device_bounced(local, n, |piece, off, len| {
                    let part = seg_range(remote, off as u64, len as u64);
                    self.peer_copy(e, key, piece, &part, Dir::Read, count && off == 0)
                })
            };
        }
        if let (Some(key), Some(pid)) = (key, pid) {
            match self.mem.shared_view(key, pid, remote) {
                Ok((_map, there)) => {
                    self.rndv.stats.shared += u64::from(count);
                    // SAFETY: `there` lies in our live mapping of the peer's segment (checked
                    // against its owner's record and the mapping's length); `local` by the
                    // caller's contract.
                    unsafe {
                        if write {
                            let dst: Segs<usize> = there
                                .iter()
                                .map(|&(a, l)| (a as usize, l as usize))
                                .collect();
                            let src: Segs<u64> =
                                local.iter().map(|&(a, l)| (a as u64, l as u64)).collect();
                            return copy_segments(&dst, &src);
                        }
                        return copy_segments(local, &there);
                    }
                }
                Err(err) => tracing::debug!("shared-segment copy refused ({err}); using CMA"),
            }
        }
        self.rndv.stats.link += u64::from(count);
        match self.ep(e).and_then(|ep| ep.tx.as_mut()) {
            // SAFETY: forwarded contract.
            Some(tx) if write => unsafe { tx.remote_write(local, remote) },
            // SAFETY: forwarded contract.
            Some(tx) => unsafe { tx.remote_read(local, remote) },
            None => Err(Error::new(Status::EndpointClosed, "endpoint has no link")),
        }
    }

    /// The receiver asks this sender to write part of send `sreq` into its memory.
    pub(crate) fn on_rndv_split(
        &mut self,
        e: u32,
        sreq: u64,
        rreq: u64,
        offset: u64,
        len: u64,
        segs: Segments<'_>,
    ) {
        let valid = matches!(self.req(sreq), Some(s) if s.ep == Some(e) && !s.done
            && s.kind == ReqKind::Send
            && offset.checked_add(len).is_some_and(|end| end <= s.expect as u64));
        if !valid {
            self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "split rendezvous for an unknown send or beyond the message",
                ),
            );
            return;
        }
        let local = self
            .req(sreq)
            .map(|s| s.buf.slice(offset as usize, len as usize))
            .unwrap_or_default();
        if self
            .req(sreq)
            .is_some_and(|s| super::stage::has_device(&s.buf))
        {
            // Device memory was offered whole; this receiver does not split such offers.
            let err = Err(Error::new(
                Status::Unsupported,
                "a split rendezvous of device memory",
            ));
            self.send_status(e, Kind::RndvSplitDone, rreq, &err);
            return;
        }
        let remote: Segs<u64> = match segs.read_once() {
            Ok(s) => s,
            Err(err) => {
                self.fail_ep(
                    e,
                    Error::msg(Status::ProtocolError, format!("split rendezvous: {err}")),
                );
                return;
            }
        };
        // SAFETY: `local` lies in the send request's buffer, live until the receiver's final
        // acknowledgement, which comes after the answer that ends this copy.
        unsafe {
            self.copy_then(
                e,
                segs.shared_key(),
                local,
                remote,
                Dir::Write,
                AfterCopy::SplitRest { rreq },
            )
        };
    }

    /// Answer a rendezvous step with its outcome: a `kind` frame naming the peer's request
    /// `id`, with status 0 or the error's code. (If it cannot be sent, the link is failing
    /// and the endpoint's failure completes the peer's request.)
    pub(crate) fn send_status(&mut self, e: u32, kind: Kind, id: u64, res: &Result<()>) {
        let code = match res {
            Ok(()) => 0,
            Err(err) => err.status().code(),
        };
        let hdr = match kind {
            Kind::RndvSplitDone => Header::rndv_split_done(id, code),
            _ => Header::rndv_ats(id, code),
        };
        let _ = self.send_frame(e, &hdr, &[], &Buf::EMPTY, None);
    }

    /// The sender wrote its part of a split rendezvous (or could not).
    pub(crate) fn on_rndv_split_done(&mut self, e: u32, rreq: u64, status: i32) {
        let Some(w) = self
            .rndv
            .splits
            .iter_mut()
            .find(|w| w.rreq == rreq && w.ep == e && w.rest.is_none())
        else {
            tracing::debug!("split rendezvous answer for unknown receive {rreq:#x}; ignored");
            return;
        };
        w.rest = Some(status);
        self.end_split(e, rreq);
    }

    /// End split receive `rreq` once both parts are in: acknowledge the sender, complete the
    /// receive.
    pub(crate) fn end_split(&mut self, e: u32, rreq: u64) {
        let Some(pos) = self
            .rndv
            .splits
            .iter()
            .position(|w| w.rreq == rreq && w.ep == e && w.own.is_some() && w.rest.is_some())
        else {
            return;
        };
        let w = self.rndv.splits.swap_remove(pos);
        let (Some(mut res), Some(status)) = (w.own, w.rest) else {
            return;
        };
        if status != 0 {
            // The sender could not write here: read its part instead (its buffer stays
            // valid until our acknowledgement).
            let rest = match self.ep(e).and_then(|ep| ep.tx.as_mut()) {
                // SAFETY: `rest_local` lies in the request's live receive buffer.
                Some(tx) => unsafe { tx.remote_read(&w.rest_local, &w.rest_remote) },
                None => Err(Error::new(Status::EndpointClosed, "endpoint has no link")),
            };
            if res.is_ok() {
                res = rest;
            }
        }
        self.send_status(e, Kind::RndvAts, w.sreq, &res);
        match res {
            Ok(()) => self.finish_recv(rreq),
            Err(err) => self.complete(rreq, Err(err)),
        }
    }

    /// All wanted bytes of a rendezvous receive are in.
    pub(crate) fn finish_recv(&mut self, id: u64) {
        let Some(s) = self.req(id) else { return };
        let (real, cap, tag) = (s.real_len, s.buf.len(), s.tag);
        self.complete_recv(id, real, cap, tag);
    }

    /// Pushed rendezvous data arrived.
    pub(crate) fn on_rndv_data(&mut self, e: u32, rreq: u64, offset: u64, data: &[u8]) {
        let ok = match self.req(rreq) {
            Some(s) => {
                s.ep == Some(e)
                    && !s.done
                    && s.rndv_push
                    && (s.kind == ReqKind::TagRecv || s.kind == ReqKind::AmData)
            }
            None => false,
        };
        if !ok {
            // Data for a canceled receive is dropped; anything else is a lie.
            tracing::debug!("rendezvous data for unknown or finished request {rreq:#x}; dropped");
            return;
        }
        let Some(s) = self.req(rreq) else { return };
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|end| end > s.expect as u64) {
            self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "rendezvous data beyond the length the receiver asked for",
                ),
            );
            return;
        }
        // SAFETY: bounds checked against the posted buffer's wanted length.
        unsafe { s.buf.write_at(offset as usize, data) };
        s.got += data.len();
        if s.got >= s.expect {
            self.finish_recv(rreq);
        }
    }

    /// The receiver is ready: push the data of send request `sreq`.
    pub(crate) fn on_rndv_rtr(&mut self, e: u32, sreq: u64, rreq: u64, len: u64) {
        let valid = matches!(self.req(sreq), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Send && len <= s.expect as u64);
        if !valid {
            self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "ready-to-receive for an unknown send or longer than the message",
                ),
            );
            return;
        }
        let mut data = self.req(sreq).map(|s| s.buf.clone()).unwrap_or(Buf::EMPTY);
        if super::stage::has_device(&data) {
            // Offered as device memory, which the receiver could not open: push a host copy,
            // kept with the request, which sends from it from now on (a second request to
            // push, forged or not, finds host memory and takes no new copy).
            match super::stage::host_copy(&data) {
                Ok(mut host) => {
                    let copy = Buf::One((host.as_mut_ptr() as usize, host.len()));
                    if let Some(s) = self.req(sreq) {
                        s.stage = Some(Box::new(super::stage::Stage::send_copy(host)));
                        s.buf = copy.clone();
                    }
                    data = copy;
                }
                Err(err) => {
                    self.fail_ep(e, err);
                    return;
                }
            }
        }
        let total = len as usize;
        if let Some(ep) = self.ep(e) {
            ep.push.push_back(PushJob {
                sreq,
                rreq,
                data,
                offset: 0,
                total,
            });
        }
        self.progress_push(e);
    }

    /// Push as much rendezvous data as the link takes.
    pub(crate) fn progress_push(&mut self, e: u32) -> usize {
        let mut n = 0;
        loop {
            let Some(ep) = self.ep(e) else { return n };
            if !ep.pending.is_empty() {
                return n;
            }
            let Some(job) = ep.push.front_mut() else {
                return n;
            };
            let Some(max_frame) = ep.caps.as_ref().map(|c| c.max_frame) else {
                return n;
            };
            let Some(tx) = ep.tx.as_mut() else { return n };
            let chunk_max = Kind::RndvData.payload_max(max_frame);
            let mut sent = crate::transport::Sent::Done;
            while job.offset < job.total {
                let n_bytes = (job.total - job.offset).min(chunk_max);
                let part = job.data.part(job.offset, n_bytes);
                let hdr = Header::rndv_data(job.rreq, job.offset as u64);
                // Frames leave in order: the last one's token says the whole job is written.
                let last = job.offset + n_bytes == job.total;
                let token = if last { job.sreq } else { 0 };
                match super::send::send_parts_zc(tx, hdr.as_bytes(), &[], &part, token) {
                    Ok(s) => {
                        job.offset += n_bytes;
                        sent = s;
                        n += 1;
                    }
                    Err(crate::transport::TxError::NoResource) => return n,
                    Err(crate::transport::TxError::Failed(err)) => {
                        self.fail_ep(e, err);
                        return n;
                    }
                }
            }
            let sreq = job.sreq;
            ep.push.pop_front();
            let len = self.req(sreq).map(|s| s.expect).unwrap_or(0);
            self.complete_when_written(
                sreq,
                sent,
                Info {
                    length: len,
                    tag: 0,
                    value: 0,
                },
            );
        }
    }

    /// The receiver finished a remote-read rendezvous (or refused it).
    pub(crate) fn on_rndv_ats(&mut self, e: u32, sreq: u64, status: i32) {
        let valid = matches!(self.req(sreq), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Send);
        if !valid {
            tracing::debug!("rendezvous ack for unknown send {sreq:#x} from endpoint {e}; ignored");
            return;
        }
        let len = self.req(sreq).map(|s| s.expect).unwrap_or(0);
        let res = if status == 0 {
            Ok(Info {
                length: len,
                tag: 0,
                value: 0,
            })
        } else {
            let st = Status::from_code(status).unwrap_or(Status::IoError);
            Err(Error::msg(st, "the receiver could not read the message"))
        };
        // A receiver that asked for the data to be pushed sends no ack: one arriving while
        // a push is queued is a lie, and the push must not go on from a buffer that the
        // completion hands back to the application (or a host copy it frees).
        if let Some(ep) = self.ep(e) {
            ep.push.retain(|j| j.sreq != sreq);
        }
        self.complete(sreq, res);
    }
}
