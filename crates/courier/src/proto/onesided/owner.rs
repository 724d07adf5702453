//! The owner side of one-sided operations that a peer sends as frames (another host, tcp,
//! or a same-host peer that cannot map the memory): every frame names a region, its secret
//! and an address, checked against this context's registry before anything is touched;
//! the answer (`RmaAck`, `GetResp`, `FlushAck`) says what was done or why it was refused.
//! Puts and posted atomics are answered only when refused. A put of many frames is checked
//! whole at its `PutBegin`; a refused one writes none of its frames.

use std::sync::atomic::{Ordering, fence};

use super::atomic::{AtomicOp, SignalOp, do_atomic, do_signal, write_place};
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::buf::Buf;
use crate::proto::memreg::Place;
use crate::proto::send::{Pending, RegionRead};
use crate::wire::frame::{Header, Kind, RemoteRef};
use crate::wire::rkey::access;

impl State {
    pub(crate) fn on_flush_req(&mut self, e: u32, req: u64) {
        let _ = self.send_answer(e, &Header::flush_ack(req), &[], Buf::EMPTY, None);
    }

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
        let h = Header::rma_ack(req, status, value);
        let _ = self.send_answer(e, &h, &[], Buf::EMPTY, None);
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
                let h = Header::get_resp(req, 0, err.status().code());
                let _ = self.send_answer(e, &h, &[], Buf::EMPTY, None);
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
            let h = Header::get_resp(req, off as u64, 0);
            // Staged bytes go as the frame's own bytes (a queued frame keeps a copy of
            // them); region bytes are sent from the region. A frame that has to wait keeps
            // pointing into the region, named so that it is checked again before it leaves
            // (the owner may unmap the region meanwhile: `check_queued_read`).
            let sent = match &staged {
                Some(host) => self.send_answer(e, &h, &host[off..off + n], Buf::EMPTY, None),
                None => {
                    let data = Buf::One((p as usize + off, n));
                    let src = RegionRead {
                        region: t.region,
                        secret: t.secret,
                        addr: t.addr.wrapping_add(off as u64),
                        req,
                    };
                    self.send_answer(e, &h, &[], data, Some(src))
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
        let h = Header::get_resp(req, 0, why.status().code());
        ep.pending.insert(
            at,
            Pending {
                req: None,
                hdr: h,
                extra: Vec::new(),
                data: Buf::EMPTY,
                region: None,
                answer: true,
            },
        );
        ep.spent.replies = ep.pending.iter().map(crate::proto::send::reply_cost).sum();
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

    /// Where the `n` payload bytes of a put-with-signal may be read from the link straight
    /// into their destination (`proto/place.rs`): both its destination and its signal word
    /// pass their checks, and the destination is host memory. `None`: the frame is handled
    /// whole by `on_put_signal`, which refuses it or copies.
    pub(crate) fn put_signal_place(
        &self,
        t: RemoteRef,
        sig: RemoteRef,
        op: u16,
        n: u64,
    ) -> Option<Place> {
        self.signal_word(sig, op).ok()?;
        self.mem
            .lookup_place(t.region, t.secret, t.addr, n, access::WRITE)
            .ok()
            .filter(|p| !p.device)
    }

    /// A put-with-signal's `n` payload bytes were placed: the signal, as `on_put_signal`
    /// does after its copy, unless the destination went away while the data arrived (then
    /// it did not get all of it: refused, and the signal left alone).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_signal_placed(
        &mut self,
        e: u32,
        t: RemoteRef,
        req: u64,
        sig: RemoteRef,
        op: u16,
        value: u64,
        n: u64,
    ) {
        let res = (|| {
            self.mem
                .lookup_place(t.region, t.secret, t.addr, n, access::WRITE)
                .map_err(|err| {
                    Error::msg(
                        err.status(),
                        format!("{} (while the put's data was arriving)", err.detail()),
                    )
                })?;
            let (sp, op) = self.signal_word(sig, op)?;
            fence(Ordering::Release);
            // SAFETY: the signal word was checked (mapped, writable, aligned) just now.
            unsafe { do_signal(sp, op, value) };
            Ok(0)
        })();
        self.ack(e, req, Kind::PutSignal, res);
    }
}
