//! Tag matching and the eager protocol of tag messages (large ones go by rendezvous,
//! `rndv.rs`).
//!
//! Posted receives wait in `expected` in posting order; messages that arrive first wait in
//! `unexpected` in arrival order. A message matches the first receive whose
//! `(tag ^ recv_tag) & mask == 0`, so messages between two endpoints match in send order.

use std::collections::VecDeque;

use super::State;
use super::buf::{Buf, Segs};
use super::request::{Callback, Info, RawFn, ReqKind, Started, split_id};
use crate::base::sys::copy_small;
use crate::base::{Error, Result, Status};
use crate::transport::RndvMode;
use crate::wire::frame::{self, Header, Kind, Segments};

/// Tag matching's queues.
#[derive(Default)]
pub(crate) struct TagQueues {
    /// Posted tag receives, oldest first (every one is live: cancel and endpoint failure
    /// remove theirs).
    pub(super) expected: VecDeque<Posted>,
    /// Messages no receive matched yet, in arrival order.
    pub(super) unexpected: VecDeque<Unexpected>,
    /// Emptied buffers of unexpected eager messages, reused for the next ones: a sender
    /// that runs ahead of its receiver's posts otherwise costs an allocation per message.
    pub(super) unexp_pool: Vec<Vec<u8>>,
    /// Messages of failed endpoints, out of `unexpected`, whose memory is freed a batch
    /// per progress call (`State::reclaim_dropped`).
    pub(super) dropped: VecDeque<VecDeque<Unexpected>>,
}

impl TagQueues {
    /// Take posted receives `ids` out of the queue (they are failing).
    pub(super) fn forget_posted(&mut self, ids: &[u64]) {
        if !ids.is_empty() {
            self.expected.retain(|p| !ids.contains(&p.id));
        }
    }
}

/// A posted tag receive waiting for its message: the matching fields beside the request's
/// id, so matching an arrival reads only this queue.
#[derive(Copy, Clone)]
pub(crate) struct Posted {
    pub(in crate::proto) tag: u64,
    pub(in crate::proto) mask: u64,
    pub(in crate::proto) id: u64,
}

pub(crate) struct Unexpected {
    pub(in crate::proto) tag: u64,
    pub(in crate::proto) ep: u32,
    /// The endpoint's generation when it arrived (its slot may be reused later).
    pub(in crate::proto) generation: u32,
    pub(in crate::proto) len: usize,
    pub(in crate::proto) body: UnexpBody,
}

pub(crate) enum UnexpBody {
    Eager(Vec<u8>),
    EagerSync(Vec<u8>, u64),
    Rts {
        sreq: u64,
        segs: Segs<u64>,
        /// The sender's shared-segment key for `segs`, if it offered one.
        key: Option<Box<[u8]>>,
    },
}

/// Result of a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Tag of the first matching message.
    pub tag: u64,
    /// Its length.
    pub length: usize,
}

/// An immediate receive: done, or truncated (the error names both lengths).
fn done_or_truncated(len: usize, cap: usize, tag: u64) -> Result<Started> {
    if len > cap {
        Err(truncated(len, cap))
    } else {
        Ok(Started::Done(Info {
            length: len,
            tag,
            value: 0,
        }))
    }
}

pub(crate) fn truncated(len: usize, cap: usize) -> Error {
    Error::msg(
        Status::MessageTruncated,
        format!("message of {len} bytes does not fit the {cap}-byte receive buffer"),
    )
}

/// Write `data`, as much as fits, at the start of receive buffer `buf`: through the driver
/// when `device` says it holds device memory.
///
/// # Safety
/// `buf` must be a live receive buffer (writable host memory, or device memory).
unsafe fn deliver(buf: &Buf, data: &[u8], device: bool) -> Result<()> {
    if device {
        // SAFETY: per the contract.
        return unsafe { super::stage::scatter(buf, data) };
    }
    // SAFETY: per the contract.
    unsafe { buf.write_at(0, data) };
    Ok(())
}

impl State {
    /// Start a tag send on endpoint `e`. The small-message case is in line: one host
    /// segment, not synchronous, written to the link at once.
    #[inline]
    pub(crate) fn tag_send(
        &mut self,
        e: u32,
        data: Buf,
        tag: u64,
        sync: bool,
        cb: Callback,
    ) -> Result<Started> {
        if !sync && !super::stage::device_active() {
            if let Some(r) = self.tag_send_now(e, &data, tag) {
                return r;
            }
        }
        self.tag_send_other(e, data, tag, sync, cb)
    }

    /// The small-message case of `tag_send`: one host segment written to the link at once
    /// (`None`: not that case, or the link cannot take it now).
    #[inline(always)]
    fn tag_send_now(&mut self, e: u32, data: &Buf, tag: u64) -> Option<Result<Started>> {
        let &Buf::One((addr, len)) = data else {
            return None;
        };
        // Built as whole words: the link copies it as words, and a word read back from
        // bytes stored one at a time waits for those stores to reach the cache.
        let words = frame::tag_eager_words(tag);
        let hdr = words.as_flattened();
        let frame = len + Kind::TagEagerSync.header_len();
        let r = self.send_now_fast(e, hdr, &[], (addr, len), Some(len), frame)?;
        Some(r.map(|()| {
            Started::Done(Info {
                length: len,
                tag,
                value: 0,
            })
        }))
    }

    /// `tag_send` for every other case.
    #[inline(never)]
    fn tag_send_other(
        &mut self,
        e: u32,
        data: Buf,
        tag: u64,
        sync: bool,
        cb: Callback,
    ) -> Result<Started> {
        // Device memory a same-host peer can open through its IPC handle is offered as it
        // is (a rendezvous, whatever the size); other device memory goes as a host copy.
        let device = super::stage::has_device(&data);
        if device && !self.device_offer(e, &data) {
            let host = super::stage::host_copy(&data)?;
            return self.staged_send(host, |st, b| st.tag_send(e, b, tag, sync, cb));
        }
        // Device memory in play, but not in this message.
        if !device && !sync {
            if let Some(r) = self.tag_send_now(e, &data, tag) {
                return r;
            }
        }
        let (thresh, max_frame, mode) = self.ep_limits(e)?;
        let len = data.len();
        if !device && len < thresh && len + Kind::TagEagerSync.header_len() <= max_frame {
            if !sync {
                let hdr = Header::tag_eager(tag);
                // Fast path: no request unless the frame has to wait.
                if self.try_send_now(e, &hdr, &[], &data)? {
                    return Ok(Started::Done(Info {
                        length: len,
                        tag,
                        value: 0,
                    }));
                }
                let id = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
                if self.send_frame(e, &hdr, &[], &data, Some(id))? {
                    self.complete(
                        id,
                        Ok(Info {
                            length: len,
                            tag,
                            value: 0,
                        }),
                    );
                }
                return Ok(Started::Pending(id));
            }
            let id = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
            let hdr = Header::tag_eager_sync(tag, id);
            if let Err(err) = self.send_frame(e, &hdr, &[], &data, Some(id)) {
                self.req_free(id);
                return Err(err);
            }
            return Ok(Started::Pending(id));
        }
        // Rendezvous.
        let id = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
        if let Some(s) = self.req(id) {
            s.tag = tag;
            s.expect = len;
        }
        let mut extra = Vec::new();
        let (count, shared) = if mode == RndvMode::RemoteRead {
            extra.reserve_exact(Self::offer_capacity(0, &data));
            let (n, shared) = self.emit_offer(e, &mut extra, &data);
            (n as u32, shared)
        } else {
            (0, 0)
        };
        let sync = if sync { frame::flags::SYNC } else { 0 };
        let hdr = Header::tag_rts(tag, id, len as u64, count, sync | shared);
        if let Err(err) = self.send_frame(e, &hdr, &extra, &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        Ok(Started::Pending(id))
    }

    /// Post a tag receive into `buf`.
    #[inline(always)]
    pub(crate) fn tag_recv(
        &mut self,
        buf: Buf,
        tag: u64,
        mask: u64,
        cb: Callback,
    ) -> Result<Started> {
        // The usual case of a receiver that keeps up: nothing waiting to match, host memory.
        if self.tag.unexpected.is_empty() && !super::stage::has_device(&buf) {
            return Ok(Started::Pending(self.post_recv(tag, mask, || (buf, cb))));
        }
        self.tag_recv_other(buf, tag, mask, cb)
    }

    /// `tag_recv` of one host segment completed by a plain function, from words.
    #[inline(always)]
    pub(crate) fn tag_recv_fn(
        &mut self,
        seg: (usize, usize),
        tag: u64,
        mask: u64,
        f: RawFn,
        user: usize,
    ) -> Result<Started> {
        // One host segment is device memory only with a driver loaded (`has_device`).
        if self.tag.unexpected.is_empty() && !crate::base::cuda::active() {
            let parts = || (Buf::One(seg), Callback::Raw(f, user));
            return Ok(Started::Pending(self.post_recv(tag, mask, parts)));
        }
        self.tag_recv_other(Buf::One(seg), tag, mask, Callback::Raw(f, user))
    }

    /// Post a receive to the expected queue; its id. `parts` gives its buffer and callback
    /// once the slot is found: built there, they are stored from registers, where built
    /// earlier they would be kept in memory across the slot's search and copied back in
    /// loads wider than the stores that built them (which the CPU cannot forward).
    #[inline(always)]
    fn post_recv(&mut self, tag: u64, mask: u64, parts: impl FnOnce() -> (Buf, Callback)) -> u64 {
        let (id, s) = self.req_take(ReqKind::TagRecv, None);
        let (buf, cb) = parts();
        s.buf = buf;
        s.callback = cb;
        s.tag = tag;
        self.tag.expected.push_back(Posted { tag, mask, id });
        id
    }

    /// `tag_recv` of device memory, or when an unexpected message may match.
    ///
    /// A receive into device memory takes no host copy here: its request holds the device
    /// buffer and a deferred stage (`Stage::deferred_recv`), and the copy is made only if
    /// the message that matches must pass through host memory (`recv_through_host`).
    #[inline(never)]
    fn tag_recv_other(&mut self, buf: Buf, tag: u64, mask: u64, cb: Callback) -> Result<Started> {
        let device = super::stage::has_device(&buf);
        let stage = || device.then(|| Box::new(super::stage::Stage::deferred_recv(buf.clone())));
        let pos = self
            .tag
            .unexpected
            .iter()
            .position(|u| (u.tag ^ tag) & mask == 0);
        if let Some(pos) = pos {
            let u = if pos == 0 {
                self.tag.unexpected.pop_front()
            } else {
                self.tag.unexpected.remove(pos)
            };
            let Some(u) = u else {
                return Err(Status::NoMessage.into());
            };
            self.release_unexpected(u.ep, u.generation, super::limits::unexpected_cost(&u.body));
            let cap = buf.len();
            match u.body {
                UnexpBody::Eager(data) => {
                    // SAFETY: `buf` is the caller's receive buffer.
                    let copied = unsafe { deliver(&buf, &data, device) };
                    let len = data.len();
                    self.unexp_recycle(data);
                    copied?;
                    return done_or_truncated(len, cap, u.tag);
                }
                UnexpBody::EagerSync(data, sreq) => {
                    // SAFETY: as above.
                    let copied = unsafe { deliver(&buf, &data, device) };
                    let len = data.len();
                    self.unexp_recycle(data);
                    let _ = self.send_answer(u.ep, &Header::sync_ack(sreq), &[], Buf::EMPTY, None);
                    copied?;
                    return done_or_truncated(len, cap, u.tag);
                }
                UnexpBody::Rts { sreq, segs, key } => {
                    self.parked = stage();
                    let id = self.req_alloc(ReqKind::TagRecv, Some(u.ep), buf, cb);
                    if let Some(s) = self.req(id) {
                        s.tag = u.tag;
                    }
                    self.rndv_receive(u.ep, id, sreq, u.len, u.tag, &segs, key.as_deref());
                    return Ok(Started::Pending(id));
                }
            }
        }
        self.parked = stage();
        Ok(Started::Pending(self.post_recv(tag, mask, || (buf, cb))))
    }

    /// The first unexpected message matching `tag`/`mask`, left in place.
    pub(crate) fn tag_probe(&self, tag: u64, mask: u64) -> Option<ProbeInfo> {
        self.tag
            .unexpected
            .iter()
            .find(|u| (u.tag ^ tag) & mask == 0)
            .map(|u| ProbeInfo {
                tag: u.tag,
                length: u.len,
            })
    }

    /// Find and remove the first posted receive matching `tag`; its id. The usual case,
    /// the oldest receive matching, is in line (and cheaper than `remove(0)`).
    #[inline]
    fn match_expected(&mut self, tag: u64) -> Option<u64> {
        let first = self.tag.expected.front()?;
        if (first.tag ^ tag) & first.mask == 0 {
            return self.tag.expected.pop_front().map(|p| p.id);
        }
        self.match_expected_later(tag)
    }

    #[inline(never)]
    fn match_expected_later(&mut self, tag: u64) -> Option<u64> {
        let i = self
            .tag
            .expected
            .iter()
            .position(|p| (p.tag ^ tag) & p.mask == 0)?;
        self.tag.expected.remove(i).map(|p| p.id)
    }

    /// An eager tag message arrived on `e`. The usual case is in line: a posted receive
    /// matches, its buffer is one host segment with room, and no ack is owed.
    #[inline(always)]
    pub(crate) fn on_tag_eager(&mut self, e: u32, tag: u64, data: &[u8], sync_sreq: Option<u64>) {
        let Some(id) = self.match_expected(tag) else {
            self.unexpected_eager(e, tag, data, sync_sreq);
            return;
        };
        let idx = split_id(id).1;
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        if let Buf::One((addr, cap)) = s.buf {
            if data.len() <= cap && s.stage.is_none() && !s.done && sync_sreq.is_none() {
                // SAFETY: the posted buffer (cap bytes) is kept alive by its request.
                unsafe { copy_small(data.as_ptr(), addr as *mut u8, data.len()) };
                self.complete_small(idx, data.len(), tag);
                return;
            }
        }
        let info = Info {
            length: data.len(),
            tag,
            value: 0,
        };
        self.matched_eager(e, idx, data, info, sync_sreq);
    }

    /// `on_tag_eager` for a matched receive the in-line case does not cover: a scattered
    /// or device buffer, a message longer than the buffer, a synchronous send's ack.
    #[inline(never)]
    fn matched_eager(&mut self, e: u32, idx: u32, data: &[u8], info: Info, sync_sreq: Option<u64>) {
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        let cap = s.buf.len();
        // A tag receive with a stage is device memory whose host copy is deferred: the
        // bytes go from the frame to the device.
        let mut copied = Ok(());
        match s.buf {
            // SAFETY: the posted buffer (cap bytes) is kept alive by its request.
            _ if s.stage.is_some() => copied = unsafe { deliver(&s.buf, data, true) },
            Buf::One((addr, _)) => {
                let n = data.len().min(cap);
                // SAFETY: as above.
                unsafe { copy_small(data.as_ptr(), addr as *mut u8, n) };
            }
            // SAFETY: as above.
            Buf::Many(_) => unsafe {
                s.buf.write_at(0, data);
            },
        }
        let res = match copied {
            Err(e) => Err(e),
            Ok(()) if info.length > cap => Err(truncated(info.length, cap)),
            Ok(()) => Ok(info),
        };
        self.complete_slot(idx, res, info);
        if let Some(sreq) = sync_sreq {
            let _ = self.send_answer(e, &Header::sync_ack(sreq), &[], Buf::EMPTY, None);
        }
    }

    /// An eager tag message no posted receive matches: it waits in the unexpected queue.
    #[inline(never)]
    fn unexpected_eager(&mut self, e: u32, tag: u64, data: &[u8], sync_sreq: Option<u64>) {
        // Charged before the copy is made: a peer past its limit costs no copy.
        let cost = super::limits::unexpected_cost(&UnexpBody::Eager(Vec::new())) + data.len();
        if !self.charge_unexpected(e, cost, None) {
            return;
        }
        let generation = self.ep(e).map_or(0, |ep| ep.generation);
        let copy = self.unexp_copy(data);
        let body = match sync_sreq {
            Some(sreq) => UnexpBody::EagerSync(copy, sreq),
            None => UnexpBody::Eager(copy),
        };
        self.tag.unexpected.push_back(Unexpected {
            tag,
            ep: e,
            generation,
            len: data.len(),
            body,
        });
    }

    /// A copy of an unexpected eager payload, in a reused buffer when one is free.
    fn unexp_copy(&mut self, data: &[u8]) -> Vec<u8> {
        match self.tag.unexp_pool.pop() {
            Some(mut v) => {
                v.clear();
                v.extend_from_slice(data);
                v
            }
            None => data.to_vec(),
        }
    }

    /// Keep an emptied unexpected-message buffer for reuse: small ones, and a bounded
    /// number (at most 128 of 8 KiB).
    pub(super) fn unexp_recycle(&mut self, v: Vec<u8>) {
        const KEEP_CAP: usize = 8 << 10;
        const KEEP_COUNT: usize = 128;
        if v.capacity() <= KEEP_CAP && self.tag.unexp_pool.len() < KEEP_COUNT {
            self.tag.unexp_pool.push(v);
        }
    }

    /// Complete a receive of a `len`-byte message into a `cap`-byte buffer; a truncated one
    /// fails with `MessageTruncated` and keeps the real length in its info.
    pub(crate) fn complete_recv(&mut self, id: u64, len: usize, cap: usize, tag: u64) {
        let info = Info {
            length: len,
            tag,
            value: 0,
        };
        let res = if len > cap {
            Err(truncated(len, cap))
        } else {
            Ok(info)
        };
        self.complete_info(id, res, info);
    }

    /// A rendezvous offer for a tag message arrived on `e`.
    pub(crate) fn on_tag_rts(&mut self, e: u32, tag: u64, sreq: u64, len: u64, segs: Segments<'_>) {
        let Ok(len) = usize::try_from(len) else {
            self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "rendezvous length does not fit in memory",
                ),
            );
            return;
        };
        let key = segs.shared_key();
        let segs: Segs<u64> = match segs.read_once() {
            Ok(s) => s,
            Err(err) => {
                self.fail_ep(
                    e,
                    Error::msg(Status::ProtocolError, format!("rendezvous offer: {err}")),
                );
                return;
            }
        };
        if let Some(id) = self.match_expected(tag) {
            self.req_set_ep(id, e);
            if let Some(s) = self.req(id) {
                s.tag = tag;
            }
            self.rndv_receive(e, id, sreq, len, tag, &segs, key);
        } else {
            let body = UnexpBody::Rts {
                sreq,
                segs,
                key: key.map(Box::from),
            };
            if !self.charge_unexpected(e, super::limits::unexpected_cost(&body), None) {
                return;
            }
            let generation = self.ep(e).map_or(0, |ep| ep.generation);
            self.tag.unexpected.push_back(Unexpected {
                tag,
                ep: e,
                generation,
                len,
                body,
            });
        }
    }

    /// A synchronous send was matched.
    pub(crate) fn on_sync_ack(&mut self, e: u32, sreq: u64) {
        let valid = matches!(self.req(sreq), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Send);
        if valid {
            let len = self.req(sreq).map(|s| s.buf.len()).unwrap_or(0);
            self.complete(
                sreq,
                Ok(Info {
                    length: len,
                    tag: 0,
                    value: 0,
                }),
            );
        }
    }
}
