//! Remote memory access through the target's progress: put, get, atomics, put-with-signal.
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

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use super::State;
use super::buf::Buf;
use super::endpoint::EpStatus;
use super::memreg::Place;
use super::request::{Callback, Info, ReqKind};
use super::send::{Pending, RegionRead};
use super::tag::Started;
use crate::base::{Error, Result, Status};
use crate::transport::{Sent, TxError};
use crate::wire::frame::{Header, Kind, RemoteRef, flags};
use crate::wire::rkey::access;

/// Atomic operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum AtomicOp {
    /// `*p += v`
    Add = 0,
    /// `*p &= v`
    And = 1,
    /// `*p |= v`
    Or = 2,
    /// `*p ^= v`
    Xor = 3,
    /// `*p = v`
    Swap = 4,
    /// `if *p == compare { *p = v }`
    Cswap = 5,
}

impl AtomicOp {
    /// Every operation, in wire order.
    pub const ALL: [AtomicOp; 6] = [
        AtomicOp::Add,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
        AtomicOp::Swap,
        AtomicOp::Cswap,
    ];

    /// Lower-case name, as in ucx_info's `atomic_<name>` capabilities.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::And => "and",
            AtomicOp::Or => "or",
            AtomicOp::Xor => "xor",
            AtomicOp::Swap => "swap",
            AtomicOp::Cswap => "cswap",
        }
    }

    fn from_u16(v: u16) -> Option<AtomicOp> {
        Some(match v {
            0 => AtomicOp::Add,
            1 => AtomicOp::And,
            2 => AtomicOp::Or,
            3 => AtomicOp::Xor,
            4 => AtomicOp::Swap,
            5 => AtomicOp::Cswap,
            _ => return None,
        })
    }
}

/// How a put-with-signal updates the signal word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Add the value.
    Add = 1,
}

/// Run an atomic on local memory; returns the old value.
///
/// # Safety
/// `p` must be valid and aligned for the width, and shared only through atomics.
pub(crate) unsafe fn do_atomic(
    p: *mut u8,
    op: AtomicOp,
    bits32: bool,
    v: u64,
    compare: u64,
) -> u64 {
    if bits32 {
        // SAFETY: caller guarantees alignment and validity.
        let a = unsafe { AtomicU32::from_ptr(p as *mut u32) };
        let (v, c) = (v as u32, compare as u32);
        (match op {
            AtomicOp::Add => a.fetch_add(v, Ordering::AcqRel),
            AtomicOp::And => a.fetch_and(v, Ordering::AcqRel),
            AtomicOp::Or => a.fetch_or(v, Ordering::AcqRel),
            AtomicOp::Xor => a.fetch_xor(v, Ordering::AcqRel),
            AtomicOp::Swap => a.swap(v, Ordering::AcqRel),
            AtomicOp::Cswap => a
                .compare_exchange(c, v, Ordering::AcqRel, Ordering::Acquire)
                .unwrap_or_else(|x| x),
        }) as u64
    } else {
        // SAFETY: as above.
        let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
        match op {
            AtomicOp::Add => a.fetch_add(v, Ordering::AcqRel),
            AtomicOp::And => a.fetch_and(v, Ordering::AcqRel),
            AtomicOp::Or => a.fetch_or(v, Ordering::AcqRel),
            AtomicOp::Xor => a.fetch_xor(v, Ordering::AcqRel),
            AtomicOp::Swap => a.swap(v, Ordering::AcqRel),
            AtomicOp::Cswap => a
                .compare_exchange(compare, v, Ordering::AcqRel, Ordering::Acquire)
                .unwrap_or_else(|x| x),
        }
    }
}

/// Write `data` where a checked access landed: a plain copy, or through the CUDA driver for
/// device memory (in place when it returns).
///
/// # Safety
/// `p` must be a checked place of at least `data.len()` bytes.
pub(crate) unsafe fn write_place(p: Place, data: &[u8]) -> Result<()> {
    if p.device {
        // SAFETY: per the contract.
        unsafe { crate::proto::stage::to_device(p.ptr, data.as_ptr(), data.len()) }
    } else {
        // SAFETY: per the contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.ptr, data.len()) };
        Ok(())
    }
}

/// Apply a signal update after the data it covers.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
pub(crate) unsafe fn do_signal(p: *mut u8, op: SignalOp, value: u64) {
    // SAFETY: caller guarantees alignment and validity.
    let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
    match op {
        SignalOp::Set => a.store(value, Ordering::Release),
        SignalOp::Add => {
            a.fetch_add(value, Ordering::AcqRel);
        }
    }
}

/// `do_signal` as a sequentially consistent read-modify-write, for a writer that looks
/// next whether the word's owner sleeps (`shm::Doorbell::ring`).
///
/// # Safety
/// As for `do_signal`.
pub(crate) unsafe fn do_signal_sc(p: *mut u8, op: SignalOp, value: u64) {
    // SAFETY: caller guarantees alignment and validity.
    let a = unsafe { AtomicU64::from_ptr(p as *mut u64) };
    match op {
        SignalOp::Set => a.swap(value, Ordering::SeqCst),
        SignalOp::Add => a.fetch_add(value, Ordering::SeqCst),
    };
}

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

fn hdr(kind: Kind, t: &RemoteRef, req: u64) -> Header {
    Header::new(kind)
        .word(1, t.region)
        .word(2, t.secret)
        .word(3, t.addr)
        .word(4, req)
}

/// The `PutBegin` frame of a put of `len` bytes at `t`.
fn begin(t: &RemoteRef, len: usize) -> Header {
    hdr(Kind::PutBegin, t, len as u64)
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

    fn chunk_of(&mut self, e: u32, kind: Kind) -> Result<usize> {
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
        if let Some(ep) = self.ep(e) {
            ep.rma_unacked = true;
            ep.rma_via_owner = true;
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
            let h = if is_last {
                last(t)
            } else {
                hdr(Kind::Put, &t, 0)
            };
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
            len,
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
                match super::send::send_parts_zc(tx, h.as_bytes(), &[], data, token) {
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
        let first = begin(&target, data.len());
        self.unacked(
            e,
            data,
            target,
            |t| hdr(Kind::Put, &t, 0),
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
        let h = hdr(Kind::GetReq, &target, id).word(5, len as u64);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        if let Some(ep) = self.ep(e) {
            ep.rma_via_owner = true;
        }
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
        let h = hdr(Kind::Atomic, &target, id)
            .aux16(op as u16)
            .flags(bits32 as u8)
            .word(5, operand)
            .word(6, compare);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        if let Some(ep) = self.ep(e) {
            ep.rma_via_owner = true;
        }
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
        let h = hdr(Kind::Atomic, &target, 0)
            .aux16(op as u16)
            .flags(bits32 as u8)
            .word(5, operand);
        self.send_frame(e, &h, &[], &Buf::EMPTY, None)?;
        if let Some(ep) = self.ep(e) {
            ep.rma_unacked = true;
            ep.rma_via_owner = true;
        }
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
        let last = move |t: RemoteRef| {
            hdr(Kind::PutSignal, &t, 0)
                .aux16(op as u16)
                .word(5, signal.region)
                .word(6, signal.secret)
                .word(7, signal.addr)
                .word(8, value)
        };
        let first = begin(&target, data.len())
            .flags(flags::SIGNAL)
            .aux16(op as u16)
            .word(5, signal.region)
            .word(6, signal.secret)
            .word(7, signal.addr);
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
        if !need {
            return Ok(None);
        }
        let id = self.rma_req(e, ReqKind::Rma, Buf::EMPTY, 1, Callback::None);
        if let Some(s) = self.req(id) {
            s.detached = true; // nobody collects it: freed when the answer comes
        }
        if let Err(err) = self.send_frame(
            e,
            &Header::new(Kind::FlushReq).word(1, id),
            &[],
            &Buf::EMPTY,
            None,
        ) {
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
        let h = Header::new(Kind::FlushReq).word(1, id);
        if let Err(err) = self.send_frame(e, &h, &[], &Buf::EMPTY, None) {
            self.req_free(id);
            return Err(err);
        }
        if let Some(ep) = self.ep(e) {
            // The owner confirms the unacknowledged puts too (and reports refusals first).
            ep.rma_via_owner = false;
            ep.rma_unacked = false;
        }
        Ok(Some(id))
    }

    /// The first refusal of an unacknowledged put or posted atomic since the last flush.
    pub(crate) fn rma_take_error(&mut self, e: u32) -> Option<Error> {
        self.ep(e).and_then(|ep| ep.rma_error.take())
    }

    pub(crate) fn on_flush_req(&mut self, e: u32, req: u64) {
        let _ = self.send_frame(
            e,
            &Header::new(Kind::FlushAck).word(1, req),
            &[],
            &Buf::EMPTY,
            None,
        );
    }

    pub(crate) fn on_flush_ack(&mut self, e: u32, req: u64) {
        let ok = matches!(self.req(req), Some(s) if s.ep == Some(e) && !s.done && s.kind == ReqKind::Rma);
        if ok {
            self.complete(req, Ok(Info::default()));
        }
    }

    // ----- target side -------------------------------------------------------------------

    /// Answer operation `req` (a `what` frame) on `e`. Unacknowledged operations (`req`
    /// 0: puts, posted atomics) are answered only when refused, and the answer names the
    /// kind of frame refused in place of a value.
    pub(crate) fn ack(&mut self, e: u32, req: u64, what: Kind, res: Result<u64>) {
        if req == 0 && res.is_ok() {
            return; // unacknowledged: only refusals are reported
        }
        let (status, value) = match res {
            Ok(v) => (0, v),
            Err(err) => {
                let peer = self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
                tracing::warn!("refused a remote operation from {peer}: {err}");
                let value = if req == 0 { what as u64 } else { 0 };
                (err.status().code(), value)
            }
        };
        let h = Header::new(Kind::RmaAck)
            .word(1, req)
            .aux32(status as u32)
            .word(2, value);
        let _ = self.send_frame(e, &h, &[], &Buf::EMPTY, None);
    }

    /// The first frame of a put (or put-with-signal) of `len` bytes in many frames: check
    /// the whole operation now. Refused, it is answered once, and its data frames, which
    /// follow on this link, are dropped unwritten (`take_refused`).
    pub(crate) fn on_put_begin(
        &mut self,
        e: u32,
        t: RemoteRef,
        len: u64,
        signal: Option<(RemoteRef, u16)>,
    ) {
        let res = self
            .mem
            .lookup_place(t.region, t.secret, t.addr, len, access::WRITE)
            .and_then(|_| match signal {
                Some((sig, op)) => self.signal_word(sig, op).map(|_| ()),
                None => Ok(()),
            });
        let Some(ep) = self.ep(e) else { return };
        match res {
            Ok(()) => ep.put_refused = None,
            Err(err) => {
                ep.put_refused = (len > 0).then_some((len, err.status()));
                let what = if signal.is_some() {
                    Kind::PutSignal
                } else {
                    Kind::Put
                };
                self.ack(e, 0, what, Err(err));
            }
        }
    }

    /// Whether a put frame of `n` bytes on `e` belongs to an operation refused at its first
    /// frame, and is to be dropped (`last`: the operation's closing `PutSignal`). A frame
    /// asking for an answer gets one.
    #[inline]
    fn take_refused(&mut self, e: u32, req: u64, n: usize, last: bool) -> bool {
        let Some(ep) = self.ep(e) else { return false };
        let Some((left, st)) = ep.put_refused else {
            return false;
        };
        let left = left.saturating_sub(n as u64);
        ep.put_refused = (left > 0 && !last).then_some((left, st));
        if req != 0 {
            let why = Error::new(st, "part of an operation refused at its first frame");
            let what = if last { Kind::PutSignal } else { Kind::Put };
            self.ack(e, req, what, Err(why));
        }
        true
    }

    /// Check a put-with-signal's signal word and op: where the word is.
    fn signal_word(&self, sig: RemoteRef, op: u16) -> Result<(*mut u8, SignalOp)> {
        let op = match op {
            0 => SignalOp::Set,
            1 => SignalOp::Add,
            _ => {
                return Err(Error::msg(
                    Status::Unsupported,
                    format!("unknown signal operation {op}"),
                ));
            }
        };
        if !sig.addr.is_multiple_of(8) {
            return Err(Error::new(
                Status::InvalidParam,
                "signal address is not 8-byte aligned",
            ));
        }
        let p = self
            .mem
            .lookup(sig.region, sig.secret, sig.addr, 8, access::WRITE)?;
        Ok((p, op))
    }

    pub(crate) fn on_put(&mut self, e: u32, t: RemoteRef, req: u64, data: &[u8]) {
        if self.take_refused(e, req, data.len(), false) {
            return;
        }
        let res = self
            .mem
            .lookup_place(t.region, t.secret, t.addr, data.len() as u64, access::WRITE)
            .and_then(|p| {
                // SAFETY: the registry checked the whole range is inside a mapped region.
                unsafe { write_place(p, data) }.map(|()| 0)
            });
        self.ack(e, req, Kind::Put, res);
    }

    pub(crate) fn on_get_req(&mut self, e: u32, t: RemoteRef, req: u64, len: u64) {
        let staged = self
            .mem
            .lookup_place(t.region, t.secret, t.addr, len, access::READ)
            .and_then(|p| {
                if !p.device {
                    return Ok((p.ptr, None));
                }
                // Device memory is read once into host memory, sent from there. The peer
                // chose the length (within the region): a host copy that cannot be had is
                // a refusal, not an abort.
                let mut host = Vec::new();
                if host.try_reserve_exact(len as usize).is_err() {
                    return Err(Error::msg(
                        Status::NoMemory,
                        format!("no host memory to stage a {len}-byte read of device memory"),
                    ));
                }
                host.resize(len as usize, 0);
                // SAFETY: the registry checked the range; `host` holds `len` bytes.
                unsafe { crate::proto::stage::from_device(host.as_mut_ptr(), p.ptr, host.len())? };
                Ok((host.as_mut_ptr(), Some(host)))
            });
        let (p, staged) = match staged {
            Ok(x) => x,
            Err(err) => {
                let peer = self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
                tracing::warn!("refused a remote read from {peer}: {err}");
                let h = Header::new(Kind::GetResp)
                    .word(1, req)
                    .aux32(err.status().code() as u32);
                let _ = self.send_frame(e, &h, &[], &Buf::EMPTY, None);
                return;
            }
        };
        let Ok(chunk) = self.chunk_of(e, Kind::GetResp) else {
            return;
        };
        let len = len as usize;
        let mut off = 0;
        loop {
            let n = chunk.min(len - off);
            let h = Header::new(Kind::GetResp).word(1, req).word(2, off as u64);
            // Staged bytes go as the frame's own bytes (a queued frame keeps a copy of
            // them); region bytes are sent from the region. A frame that has to wait keeps
            // pointing into the region, named so that it is checked again before it leaves
            // (the owner may unmap the region meanwhile: `check_queued_read`).
            let sent = match &staged {
                Some(host) => self.send_frame(e, &h, &host[off..off + n], &Buf::EMPTY, None),
                None => {
                    let data = Buf::One((p as usize + off, n));
                    let src = RegionRead {
                        region: t.region,
                        secret: t.secret,
                        addr: t.addr.wrapping_add(off as u64),
                        req,
                    };
                    self.send_region_frame(e, &h, data, src)
                }
            };
            if sent.is_err() {
                return;
            }
            off += n;
            if off >= len {
                return;
            }
        }
    }

    /// Send one frame of a get's answer whose data lies in one of our regions: now, or
    /// queued with the region named (`Pending::region`).
    fn send_region_frame(
        &mut self,
        e: u32,
        h: &Header,
        data: Buf,
        src: RegionRead,
    ) -> Result<bool> {
        if self.try_send_now(e, h, &[], &data)? {
            return Ok(true);
        }
        self.enqueue(
            e,
            Pending {
                req: None,
                hdr: *h,
                extra: Vec::new(),
                data,
                region: Some(src),
            },
        )?;
        Ok(false)
    }

    /// The region a queued answer of get `req` reads from is gone (`why`): every answer of
    /// that get still queued on `e` is dropped unsent, and the requester is told the get
    /// was refused, in their place (in order with the answers already sent).
    pub(crate) fn drop_get_answers(&mut self, e: u32, req: u64, why: Error) {
        let peer = self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
        tracing::warn!(
            "a read by {peer} was cut short: the region was unmapped while its data waited to be sent ({why})"
        );
        let Some(ep) = self.ep(e) else { return };
        let Some(at) = ep
            .pending
            .iter()
            .position(|p| p.region.is_some_and(|r| r.req == req))
        else {
            return;
        };
        ep.pending.retain(|p| p.region.is_none_or(|r| r.req != req));
        let h = Header::new(Kind::GetResp)
            .word(1, req)
            .aux32(why.status().code() as u32);
        ep.pending.insert(
            at,
            Pending {
                req: None,
                hdr: h,
                extra: Vec::new(),
                data: Buf::EMPTY,
                region: None,
            },
        );
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
                    len,
                    ..Info::default()
                }),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_atomic(
        &mut self,
        e: u32,
        t: RemoteRef,
        req: u64,
        op: u16,
        bits32: bool,
        operand: u64,
        compare: u64,
    ) {
        let width = if bits32 { 4 } else { 8 };
        let res = match AtomicOp::from_u16(op) {
            None => Err(Error::msg(
                Status::Unsupported,
                format!("unknown atomic operation {op}"),
            )),
            Some(_) if !t.addr.is_multiple_of(width) => Err(Error::msg(
                Status::InvalidParam,
                format!("atomic address {:#x} is not {width}-byte aligned", t.addr),
            )),
            Some(op) => self
                .mem
                .lookup(t.region, t.secret, t.addr, width, access::ATOMIC)
                .map(|p| {
                    // SAFETY: checked in range and aligned.
                    unsafe { do_atomic(p, op, bits32, operand, compare) }
                }),
        };
        self.ack(e, req, Kind::Atomic, res);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_put_signal(
        &mut self,
        e: u32,
        t: RemoteRef,
        req: u64,
        sig: RemoteRef,
        op: u16,
        value: u64,
        data: &[u8],
    ) {
        if self.take_refused(e, req, data.len(), true) {
            return;
        }
        let res = (|| {
            // Check both before touching either.
            let dst = self.mem.lookup_place(
                t.region,
                t.secret,
                t.addr,
                data.len() as u64,
                access::WRITE,
            )?;
            let (sp, op) = self.signal_word(sig, op)?;
            // SAFETY: both ranges checked. A device copy has finished when it returns.
            unsafe {
                write_place(dst, data)?;
                fence(Ordering::Release);
                do_signal(sp, op, value);
            }
            Ok(0)
        })();
        self.ack(e, req, Kind::PutSignal, res);
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
            self.complete(req, Ok(Info { len, tag: 0, value }));
        }
    }
}
