//! The origin side of operations carried out by the owner: put, get, atomics,
//! put-with-signal, flush and fence through the target's progress, and their answers.
//!
//! Used where the origin cannot reach the target's memory itself (another host, tcp, or a
//! same-host peer whose memory the kernel will not let us map). Every operation names a
//! region, its secret and an address; the target checks them against its registry and
//! answers with `RmaAck` (or `GetResp`), whose status names why a refused operation was
//! refused. Puts and posted (non-fetching) atomics are unacknowledged: the target answers
//! them only when it refuses them, and a flush confirms the rest. Operations on one
//! endpoint are carried out in the order they were sent, so a put-with-signal's signal is
//! seen only after its data. A put whose data takes more than one frame starts with a
//! `PutBegin` frame naming the whole operation: the target checks it all there, so a
//! refused operation writes none of its frames.

use std::sync::atomic::Ordering;

use super::atomic::{AtomicOp, SignalOp};
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::buf::Buf;
use crate::proto::endpoint::EpStatus;
use crate::proto::request::Started;
use crate::proto::request::{Callback, Info, ReqKind};
use crate::proto::send::Pending;
use crate::transport::{Sent, TxError};
use crate::wire::frame::{Header, Kind, RemoteRef};

fn refused(status: i32) -> Error {
    let st = Status::from_code(status).unwrap_or(Status::IoError);
    Error::msg(
        st,
        format!("the target refused the operation: {}", st.as_str()),
    )
}

/// What an unacknowledged operation refused by the target was, from the kind its refusal
/// names.
fn unacked_name(kind: u64) -> &'static str {
    match kind {
        k if k == Kind::Atomic as u64 => "posted atomic",
        k if k == Kind::PutSignal as u64 => "put with signal",
        k if k == Kind::Put as u64 => "put",
        _ => "put or posted atomic",
    }
}

impl State {
    fn rma_req(&mut self, e: u32, kind: ReqKind, buf: Buf, frames: usize, cb: Callback) -> u64 {
        let len = buf.len();
        let id = self.req_alloc(kind, Some(e), buf, cb);
        if let Some(s) = self.req(id) {
            s.expect = frames;
            s.real_len = len;
        }
        id
    }

    pub(super) fn chunk_of(&mut self, e: u32, kind: Kind) -> Result<usize> {
        let (_, max_frame, _) = self.ep_limits(e)?;
        Ok(kind.payload_max(max_frame))
    }

    /// Send put frames for `data` at `target`, the last one with header `last`; completes
    /// locally when every frame has been written (remote completion is `flush`). The target
    /// answers only when it refuses a frame; the refusal is reported by the next flush. Data
    /// of more than one frame is announced by `first` (a `PutBegin` naming the whole
    /// operation), which the target checks before any of it.
    ///
    /// Small puts are copied by the link and complete at once. Puts of at least the link's
    /// `zcopy_min` are written from `data` itself: they return `Pending` unless the kernel
    /// took every byte at once, and complete when the link reports their last frame written.
    #[allow(clippy::too_many_arguments)]
    fn unacked(
        &mut self,
        e: u32,
        data: Buf,
        target: RemoteRef,
        last: impl Fn(RemoteRef) -> Header,
        first: Header,
        kind: Kind,
        cb: Callback,
    ) -> Result<Started> {
        let chunk = self.chunk_of(e, kind)?;
        let len = data.len();
        let n = len.div_ceil(chunk).max(1);
        if n > 1 {
            self.send_frame(e, &first, &[], &Buf::EMPTY, None)?;
        }
        let mut zc = false;
        self.sent_via_owner(e);
        if let Some(ep) = self.ep(e) {
            ep.rma_unacked = true;
            zc = ep.caps.as_ref().is_some_and(|c| len >= c.zcopy_min);
        }
        let mut cb = Some(cb);
        let id = if zc {
            let cb = cb.take().unwrap_or(Callback::None);
            self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb)
        } else {
            0
        };
        let mut queued = false;
        let mut sent = Sent::Done;
        for i in 0..n {
            let off = i * chunk;
            let part = data.part(off, chunk.min(len - off));
            let t = RemoteRef {
                addr: target.addr.wrapping_add(off as u64),
                ..target
            };
            let is_last = i + 1 == n;
            let h = if is_last { last(t) } else { Header::put(&t, 0) };
            // Once one frame waits behind back-pressure, all later ones queue behind it.
            let r = if zc {
                let token = if is_last { id } else { 0 };
                self.send_frame_zc(e, &h, &part, token)
            } else {
                self.send_frame(e, &h, &[], &part, None)
                    .map(|now| now.then_some(Sent::Done))
            };
            match r {
                Ok(Some(s)) => sent = s,
                Ok(None) => queued = true,
                Err(err) => {
                    if zc {
                        self.req_free(id);
                    }
                    return Err(err);
                }
            }
        }
        let info = Info {
            length: len,
            ..Info::default()
        };
        if !queued && sent == Sent::Done {
            if zc {
                self.req_free(id);
            }
            return Ok(Started::Done(info));
        }
        let id = match cb {
            Some(cb) => self.req_alloc(ReqKind::Send, Some(e), data, cb),
            None => id,
        };
        if queued {
            // The last queued frame is this operation's last: it completes the request
            // when it is written (progress_tx).
            if let Some(p) = self.ep(e).and_then(|ep| ep.pending.back_mut()) {
                p.req = Some(id);
            }
        } else {
            self.complete_when_written(id, sent, info);
        }
        Ok(Started::Pending(id))
    }

    /// Send one put frame on `e` without copying `data` where the link allows: `Some`
    /// when it went to the link, `None` when it waits in the pending queue.
    fn send_frame_zc(
        &mut self,
        e: u32,
        h: &Header,
        data: &Buf,
        token: u64,
    ) -> Result<Option<Sent>> {
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        if let Some(err) = ep.dead_error() {
            return Err(err);
        }
        if ep.pending.is_empty() && ep.status == EpStatus::Connected {
            if let Some(tx) = ep.tx.as_mut() {
                match crate::proto::send::send_parts_zc(tx, h.as_bytes(), &[], data, token) {
                    Ok(sent) => return Ok(Some(sent)),
                    Err(TxError::NoResource) => {}
                    Err(TxError::Failed(err)) => {
                        self.fail_ep(e, err.clone());
                        return Err(self.ep(e).and_then(|ep| ep.dead_error()).unwrap_or(err));
                    }
                }
            }
        }
        self.enqueue(
            e,
            Pending {
                req: None,
                hdr: *h,
                extra: Vec::new(),
                data: data.clone(),
                region: None,
                answer: false,
            },
        )?;
        Ok(None)
    }

    /// Put `data` at `target`.
    pub(crate) fn rma_put(
        &mut self,
        e: u32,
        data: Buf,
        target: RemoteRef,
        cb: Callback,
    ) -> Result<Started> {
        let first = Header::put_begin(&target, data.len() as u64, None);
        self.unacked(
            e,
            data,
            target,
            |t| Header::put(&t, 0),
            first,
            Kind::Put,
            cb,
        )
    }

    /// Get `buf.len()` bytes from `target`.
    pub(crate) fn rma_get(
        &mut self,
        e: u32,
        buf: Buf,
        target: RemoteRef,
        cb: Callback,
    ) -> Result<Started> {
        let len = buf.len();
        let id = self.rma_req(e, ReqKind::Get, buf, 0, cb);
        if let Some(s) = self.req(id) {
            s.expect = len;
        }
        let h = Header::get_req(&target, id, len as u64);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        self.sent_via_owner(e);
        Ok(Started::Pending(id))
    }

    /// An atomic at `target`; the old value comes back in `Info::value`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_atomic(
        &mut self,
        e: u32,
        op: AtomicOp,
        bits32: bool,
        operand: u64,
        compare: u64,
        target: RemoteRef,
        cb: Callback,
    ) -> Result<Started> {
        self.ep_limits(e)?;
        let id = self.rma_req(e, ReqKind::Rma, Buf::EMPTY, 1, cb);
        let h = Header::atomic(&target, id, op as u16, bits32, operand, compare);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        self.sent_via_owner(e);
        Ok(Started::Pending(id))
    }

    /// A posted atomic at `target`: sent with request id 0, so the target answers only if
    /// it refuses it (reported by the next flush, which also confirms it was carried out).
    /// Nothing waits for it: queued behind back-pressure, it leaves with the queue.
    pub(crate) fn rma_atomic_post(
        &mut self,
        e: u32,
        op: AtomicOp,
        bits32: bool,
        operand: u64,
        target: RemoteRef,
    ) -> Result<()> {
        self.ep_limits(e)?;
        let h = Header::atomic(&target, 0, op as u16, bits32, operand, 0);
        self.send_frame(e, &h, &[], &Buf::EMPTY, None)?;
        if let Some(ep) = self.ep(e) {
            ep.rma_unacked = true;
        }
        self.sent_via_owner(e);
        Ok(())
    }

    /// Put `data` at `target` and then update `signal`, in one message when it fits.
    /// Large puts are split; the signal rides on the last fragment, so it rises once, after
    /// all the data (the link delivers and the target executes in order).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_put_signal(
        &mut self,
        e: u32,
        data: Buf,
        target: RemoteRef,
        signal: RemoteRef,
        op: SignalOp,
        value: u64,
        cb: Callback,
    ) -> Result<Started> {
        let last = move |t: RemoteRef| Header::put_signal(&t, 0, &signal, op as u16, value);
        let first = Header::put_begin(&target, data.len() as u64, Some((&signal, op as u16)));
        self.unacked(e, data, target, last, first, Kind::PutSignal, cb)
    }

    /// Ask the target to confirm every earlier operation on `e`; `Ok(None)` if nothing
    /// unconfirmed was sent. (Called once every acknowledged operation is answered, so the
    /// owner has carried out all of them when it confirms.)
    pub(crate) fn rma_flush_start(&mut self, e: u32) -> Result<Option<u64>> {
        let need = match self.ep(e) {
            Some(ep) => {
                ep.rma_via_owner = false;
                ep.rma_unacked
            }
            None => false,
        };
        self.recount_mixed();
        if !need {
            return Ok(None);
        }
        let id = self.rma_req(e, ReqKind::Rma, Buf::EMPTY, 1, Callback::None);
        if let Some(s) = self.req(id) {
            s.detached = true; // nobody collects it: freed when the answer comes
        }
        if let Err(err) = self.send_frame(e, &Header::flush_req(id), &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        if let Some(ep) = self.ep(e) {
            ep.rma_unacked = false;
        }
        Ok(Some(id))
    }

    /// What a fence on `e` waits for: when operations were sent through the owner since
    /// the last fence or flush and a key on `e` reaches memory without it (so an operation
    /// after the fence could overtake them), ask the owner to confirm everything sent so
    /// far; the id of that request. `Ok(None)`: nothing to wait for, the fence orders this
    /// process's own loads and stores only. Refusals of earlier puts stay for the next
    /// flush to report.
    pub(crate) fn rma_fence_start(&mut self, e: u32) -> Result<Option<u64>> {
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        if !(ep.rma_via_owner && ep.rma_direct_keys) {
            return Ok(None);
        }
        let id = self.rma_req(e, ReqKind::Rma, Buf::EMPTY, 1, Callback::None);
        let h = Header::flush_req(id);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        if let Some(ep) = self.ep(e) {
            // The owner confirms the unacknowledged puts too (and reports refusals first).
            ep.rma_via_owner = false;
            ep.rma_unacked = false;
        }
        self.recount_mixed();
        Ok(Some(id))
    }

    /// The flag `Endpoint::fence` reads without the lock (`OnesidedState::mixed`).
    pub(crate) fn rma_mixed_flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.onesided.mixed.clone()
    }

    /// `e` sent an operation through its owner: a fence on `e` now waits for it when a
    /// key of `e` reaches memory without the owner (`OnesidedState::mixed`).
    #[inline]
    fn sent_via_owner(&mut self, e: u32) {
        let Some(ep) = self.ep(e) else { return };
        ep.rma_via_owner = true;
        if ep.rma_direct_keys {
            self.onesided.mixed.store(true, Ordering::Release);
        }
    }

    /// A fence or flush waited for an endpoint's operations through its owner: clear
    /// `OnesidedState::mixed` when no endpoint has any left that a direct operation could
    /// overtake.
    #[inline]
    pub(crate) fn recount_mixed(&mut self) {
        if self.onesided.mixed.load(Ordering::Relaxed)
            && !self
                .eps
                .slots
                .iter()
                .any(|ep| ep.live && ep.rma_via_owner && ep.rma_direct_keys)
        {
            self.onesided.mixed.store(false, Ordering::Release);
        }
    }

    /// The first refusal of an unacknowledged put or posted atomic since the last flush.
    pub(crate) fn rma_take_error(&mut self, e: u32) -> Option<Error> {
        self.ep(e).and_then(|ep| ep.rma_error.take())
    }

    pub(crate) fn on_flush_ack(&mut self, e: u32, req: u64) {
        let ok = matches!(self.req(req), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Rma);
        if ok {
            self.complete(req, Ok(Info::default()));
        }
    }

    pub(crate) fn on_get_resp(&mut self, e: u32, req: u64, offset: u64, status: i32, data: &[u8]) {
        let ok = matches!(self.req(req), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Get);
        if !ok {
            tracing::debug!("read data for unknown request {req:#x}; dropped");
            return;
        }
        if status != 0 {
            self.complete(req, Err(refused(status)));
            return;
        }
        let Some(s) = self.req(req) else { return };
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|x| x > s.expect as u64) {
            self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "read data beyond the length asked for",
                ),
            );
            return;
        }
        // SAFETY: bounds checked against the request's buffer length.
        unsafe { s.buf.write_at(offset as usize, data) };
        self.get_landed(req, data.len());
    }

    /// `n` more bytes of get `req` are in its buffer: complete it when all are.
    pub(crate) fn get_landed(&mut self, req: u64, n: usize) {
        let Some(s) = self.req(req) else { return };
        s.got += n;
        if s.got >= s.expect {
            let len = s.expect;
            self.complete(
                req,
                Ok(Info {
                    length: len,
                    ..Info::default()
                }),
            );
        }
    }

    pub(crate) fn on_rma_ack(&mut self, e: u32, req: u64, status: i32, value: u64) {
        if req == 0 {
            // A refused unacknowledged operation: remembered for the next flush. `value`
            // names the kind of frame refused.
            if status != 0 {
                if let Some(ep) = self.ep(e) {
                    if ep.rma_error.is_none() {
                        let st = Status::from_code(status).unwrap_or(Status::IoError);
                        ep.rma_error = Some(Error::msg(
                            st,
                            format!(
                                "the target refused an earlier {}: {}",
                                unacked_name(value),
                                st.as_str()
                            ),
                        ));
                    }
                }
            }
            return;
        }
        let ok = matches!(self.req(req), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Rma);
        if !ok {
            tracing::debug!("acknowledgement for unknown request {req:#x}; dropped");
            return;
        }
        if status != 0 {
            self.complete(req, Err(refused(status)));
            return;
        }
        let Some(s) = self.req(req) else { return };
        s.got += 1;
        s.info.value = value;
        if s.got >= s.expect {
            let len = s.real_len;
            self.complete(
                req,
                Ok(Info {
                    length: len,
                    tag: 0,
                    value,
                }),
            );
        }
    }
}
