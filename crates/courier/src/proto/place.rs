//! Direct placement of large payloads on links that read from a socket.
//!
//! When a large frame is still arriving, the link shows its head (`LinkRx::peek_partial`).
//! If the head names memory we already know and have checked — pushed rendezvous data for a
//! posted receive, a get's answer for its buffer, a put into registered memory whose key
//! and range pass the registry's check — the link reads the payload straight into it and
//! hands the head back when the payload is complete (`take_placed`); the bookkeeping the
//! frame's handler would do then follows. Anything else is declined and takes the usual
//! path (the whole frame buffered, then handled), so refusals, logging and protocol errors
//! stay in one place.
//!
//! Puts of an operation the target refused at its first frame (`Kind::PutBegin`) are
//! declined too: their handler drops them.
//!
//! A request's buffer stays valid while its request lives (dropping a request waits for
//! it), and requests waiting on a link end only when the link is dropped with its
//! endpoint. A put's region is checked against the registry before every read into it: once
//! its owner has unmapped it, the rest of the payload is read and dropped, and the put is
//! refused. (A read already under way when the owner unmaps on another thread still lands:
//! that window is one read, as it is one store with shared memory.)

use super::State;
use super::recv::PollOne;
use super::request::ReqKind;
use crate::base::Error;
use crate::transport::PlaceGuard;
use crate::wire::frame::{Frame, Kind, RemoteRef};
use crate::wire::rkey::access;

/// What to do with a large frame whose head arrived.
enum Placement {
    /// Read the frame from this offset on into these segments, while the guard (if any)
    /// says they may still be written.
    Place(usize, Vec<(usize, usize)>, Option<PlaceGuard>),
    /// Buffer it and handle it as usual.
    Decline,
    /// The head is not all here yet.
    Wait,
}

impl State {
    /// Called when `e`'s link has no complete frame: finish a placed frame, or offer the
    /// arriving one a destination.
    pub(crate) fn poll_placed(&mut self, e: u32) -> PollOne {
        let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) else {
            return PollOne::Empty;
        };
        if let Some((head, payload)) = rx.take_placed() {
            // SAFETY: valid until `consume` below.
            let bytes = unsafe { head.bytes() };
            self.placed_done(e, bytes, payload);
            if let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) {
                rx.consume();
            }
            return PollOne::Handled;
        }
        let Some((prefix, len)) = rx.peek_partial() else {
            return PollOne::Empty;
        };
        if len > self.cfg.limits.max_frame {
            self.refuse_frame_size(e, len);
            return PollOne::Handled;
        }
        // SAFETY: valid until the link reads again, which happens after this call.
        let bytes = unsafe { prefix.bytes() };
        let decision = self.placement(e, bytes, len);
        let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) else {
            return PollOne::Empty;
        };
        match decision {
            Placement::Place(start, segs, guard) => {
                // SAFETY: the segments are a live request's buffer or a checked registered
                // range, written only while its guard says it is still mapped (module doc).
                if !unsafe { rx.place(start, segs, guard) } {
                    rx.decline();
                }
            }
            Placement::Decline => rx.decline(),
            Placement::Wait => {}
        }
        PollOne::Empty
    }

    /// Where the payload of the `len`-byte frame starting with `head` goes, if anywhere.
    fn placement(&mut self, e: u32, head: &[u8], len: usize) -> Placement {
        let frame = match Frame::parse(head) {
            Ok(f) => f,
            Err(crate::wire::frame::WireError::Truncated { .. }) => return Placement::Wait,
            Err(_) => return Placement::Decline,
        };
        let (start, segs) = match frame {
            Frame::RndvData { rreq, offset, data } => {
                let start = head.len() - data.len();
                let n = len - start;
                let Some(s) = self.req(rreq) else {
                    return Placement::Decline;
                };
                let ok = s.rndv_push
                    && (s.kind == ReqKind::TagRecv || s.kind == ReqKind::AmData)
                    && s.takes(e, offset, n);
                if !ok {
                    return Placement::Decline;
                }
                (start, s.buf.slice(offset as usize, n))
            }
            Frame::GetResp {
                req,
                offset,
                status,
                data,
            } => {
                let start = head.len() - data.len();
                let n = len - start;
                let Some(s) = self.req(req) else {
                    return Placement::Decline;
                };
                let ok = status == 0 && s.kind == ReqKind::Get && s.takes(e, offset, n);
                if !ok {
                    return Placement::Decline;
                }
                (start, s.buf.slice(offset as usize, n))
            }
            Frame::Put { target, data, .. } => {
                let start = head.len() - data.len();
                let n = len - start;
                // Part of a put refused at its first frame: dropped by the usual handler.
                if self.ep(e).is_some_and(|ep| ep.put_refused.is_some()) {
                    return Placement::Decline;
                }
                // Refused puts are declined: the usual handler refuses, logs and answers.
                // So is device memory: the socket cannot be read into it.
                match self.mem.lookup_place(
                    target.region,
                    target.secret,
                    target.addr,
                    n as u64,
                    access::WRITE,
                ) {
                    Ok(p) if !p.device => return self.place_put(start, p.ptr, target, n),
                    _ => return Placement::Decline,
                }
            }
            // A put-with-signal's frame, placed as a put's when both its destination and
            // its signal word pass (the signal follows once the payload is in place).
            Frame::PutSignal {
                target,
                signal,
                op,
                data,
                ..
            } => {
                let start = head.len() - data.len();
                let n = len - start;
                if self.ep(e).is_some_and(|ep| ep.put_refused.is_some()) {
                    return Placement::Decline;
                }
                return match self.put_signal_place(target, signal, op, n as u64) {
                    Some(p) => self.place_put(start, p.ptr, target, n),
                    None => Placement::Decline,
                };
            }
            _ => return Placement::Decline,
        };
        if segs.iter().map(|s| s.1).sum::<usize>() != len - start {
            return Placement::Decline;
        }
        Placement::Place(start, segs.into(), None)
    }

    /// Place a put's `n` payload bytes (from `start` in its frame) at `ptr`, the checked
    /// host address of `t`.
    fn place_put(&self, start: usize, ptr: *mut u8, t: RemoteRef, n: usize) -> Placement {
        // The owner may unmap the region while the payload arrives: the link asks before
        // every read, and drops the rest once it is gone.
        let mem = self.mem.clone();
        let still = move || {
            mem.lookup_place(t.region, t.secret, t.addr, n as u64, access::WRITE)
                .is_ok()
        };
        Placement::Place(start, vec![(ptr as usize, n)], Some(Box::new(still)))
    }

    /// A placed frame's payload is in place: do what its handler does after copying.
    fn placed_done(&mut self, e: u32, head: &[u8], payload: usize) {
        match Frame::parse(head) {
            Ok(Frame::RndvData { rreq, .. }) => {
                let Some(s) = self.req(rreq) else { return };
                s.got += payload;
                if s.got >= s.expect {
                    let (real, cap, tag) = (s.real_len, s.buf.len(), s.tag);
                    self.complete_recv(rreq, real, cap, tag);
                }
            }
            Ok(Frame::GetResp { req, .. }) => self.get_landed(req, payload),
            // Acknowledged puts are answered; unacknowledged ones (req 0) only if refused:
            // a region unmapped while the payload arrived did not get all of it.
            Ok(Frame::Put { req, target, .. }) => {
                let res = self
                    .mem
                    .lookup_place(
                        target.region,
                        target.secret,
                        target.addr,
                        payload as u64,
                        access::WRITE,
                    )
                    .map(|_| 0)
                    .map_err(|err| {
                        Error::msg(
                            err.status(),
                            format!("{} (while the put's data was arriving)", err.detail()),
                        )
                    });
                self.ack(e, req, Kind::Put, res);
            }
            Ok(Frame::PutSignal {
                target,
                req,
                signal,
                op,
                value,
                ..
            }) => self.put_signal_placed(e, target, req, signal, op, value, payload as u64),
            _ => {}
        }
    }
}
