//! Receive dispatch: parse each frame an endpoint's link delivers and route it.
//!
//! Active messages are not handled here: `poll_one` returns them unconsumed so the worker
//! can call the user's handler with the state lock released (the handler may send, even on
//! the same endpoint), then `finish_am` consumes the frame.

use super::State;
use super::am::{AmDelivery, AmRndv};
use crate::base::{Error, Status};
use crate::transport::HeadBuf;
use crate::wire::frame::Frame;

/// One step of polling an endpoint.
pub(crate) enum PollOne {
    /// No frame waiting.
    Empty,
    /// A frame was handled.
    Handled,
    /// An active message for the handler; its frame stays unconsumed until `finish_am`.
    /// The delivery's slices point into that frame: they are valid only until then,
    /// whatever their lifetime says (the handler sees them with the call's).
    Am(AmDelivery<'static>),
}

/// What `poll_eager` did.
pub(crate) enum Eager {
    /// Handled (or nothing there), as `poll_one` says.
    Done(PollOne),
    /// The link is not shared memory, its next frame is not an eager tag or active
    /// message, or it failed: left for `poll_one_other`.
    Other,
}

/// A slice of a frame the link holds until `finish_am` (see `PollOne::Am`).
#[inline(always)]
fn held(bytes: &[u8]) -> &'static [u8] {
    // SAFETY: the frame stays unconsumed until `finish_am`, after the handler's call, the
    // only place the slice is read.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) }
}

/// The active message for its handler if the frame (`head`, `rest`: `RawFrame::split`)
/// is a whole eager one (from endpoint `ep`: index, generation).
#[inline]
fn eager_am(head: &[u8], rest: &[u8], ep: (u32, u32)) -> Option<PollOne> {
    let (id, reply, header, data) = Frame::as_am_parts(head, rest)?;
    Some(PollOne::Am(AmDelivery {
        id,
        header: held(header),
        data: held(data),
        rndv: None,
        reply: reply.then_some(ep),
        ep,
    }))
}

impl State {
    /// Handle the next frame of endpoint `e`. Eager tag and active messages on shared
    /// memory, the small-message cases, are handled in line; everything else by
    /// `poll_one_other`.
    #[inline]
    pub(crate) fn poll_one(&mut self, e: u32) -> PollOne {
        match self.poll_eager(e) {
            Eager::Done(p) => p,
            Eager::Other => self.poll_one_other(e),
        }
    }

    /// `poll_one` for the small-message cases only: an eager tag or active message on
    /// shared memory (or nothing there). Anything else (another frame, another link, an
    /// error) is left where it is: `Eager::Other`.
    #[inline(always)]
    pub(crate) fn poll_eager(&mut self, e: u32) -> Eager {
        let max_frame = self.cfg.limits.max_frame;
        let Some(ep) = self.ep(e) else {
            return Eager::Done(PollOne::Empty);
        };
        let generation = ep.generation;
        let Some(peeked) = ep.rx.as_mut().and_then(|rx| rx.peek_in_place()) else {
            return Eager::Other;
        };
        let raw = match peeked {
            Ok(Some(raw)) => raw,
            // A link that reads frames in place places no partial frames: nothing is there.
            Ok(None) => return Eager::Done(PollOne::Empty),
            Err(_) => return Eager::Other,
        };
        if raw.len > max_frame {
            // Refused by `poll_one_other`.
            return Eager::Other;
        }
        let (mut head, mut copy) = (HeadBuf::new(), Vec::new());
        // SAFETY: valid until `consume`, below or in `finish_am`.
        let f = unsafe { raw.split(&mut head, &mut copy) };
        let Some((tag, data)) = Frame::as_tag_eager_parts(f.head, f.rest) else {
            if let Some(am) = eager_am(f.head, f.rest, (e, generation)) {
                ep.rx_busy = true;
                return Eager::Done(am);
            }
            return Eager::Other;
        };
        self.on_tag_eager(e, tag, data, None);
        // The handler may have failed the endpoint (and dropped its link).
        if let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) {
            rx.consume();
        }
        Eager::Done(PollOne::Handled)
    }

    /// `poll_one` for every other frame and link.
    #[inline(never)]
    fn poll_one_other(&mut self, e: u32) -> PollOne {
        let max_frame = self.cfg.limits.max_frame;
        let Some(ep) = self.ep(e) else {
            return PollOne::Empty;
        };
        let generation = ep.generation;
        let Some(rx) = ep.rx.as_mut() else {
            return PollOne::Empty;
        };
        let raw = match rx.peek() {
            Ok(Some(raw)) => raw,
            Ok(None) => return self.poll_placed(e),
            Err(err) => {
                self.fail_ep(e, err);
                return PollOne::Empty;
            }
        };
        if raw.len > max_frame {
            self.refuse_frame_size(e, raw.len);
            return PollOne::Handled;
        }
        // The parser sees private bytes only (a shared-memory frame's header and structured
        // parts are copied out of the cell; see `transport::RawFrame::split`).
        let (mut head, mut copy) = (HeadBuf::new(), Vec::new());
        // SAFETY: valid until `consume`, which happens below or in `finish_am`.
        let f = unsafe { raw.split(&mut head, &mut copy) };
        // The small-message case first, without building a `Frame`.
        if let Some((tag, data)) = Frame::as_tag_eager_parts(f.head, f.rest) {
            self.on_tag_eager(e, tag, data, None);
            if let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) {
                rx.consume();
            }
            return PollOne::Handled;
        }
        if let Some(am) = eager_am(f.head, f.rest, (e, generation)) {
            ep.rx_busy = true;
            return am;
        }
        let frame = match Frame::parse_parts(f.head, f.rest) {
            Ok(f) => f,
            Err(err) => {
                // A peer that refuses this side's link says why in the handshake's layout.
                let mut whole = Vec::new();
                // SAFETY: as above.
                let bytes = unsafe { raw.private_bytes(&mut whole) };
                let why = match crate::wire::auth::AuthMsg::parse(bytes) {
                    Ok(crate::wire::auth::AuthMsg::Reject { text, .. }) => Error::msg(
                        Status::Rejected,
                        format!(
                            "the peer refused the connection: {}",
                            String::from_utf8_lossy(text).escape_debug()
                        ),
                    ),
                    _ => Error::msg(Status::ProtocolError, format!("malformed frame: {err}")),
                };
                self.fail_ep(e, why);
                return PollOne::Handled;
            }
        };
        match frame {
            Frame::Am {
                id,
                reply,
                header,
                data,
            } => {
                ep.rx_busy = true;
                return PollOne::Am(AmDelivery {
                    id,
                    header: held(header),
                    data: held(data),
                    rndv: None,
                    reply: reply.then_some((e, generation)),
                    ep: (e, generation),
                });
            }
            Frame::AmRts {
                id,
                reply,
                sreq,
                len,
                header,
                segs,
            } => {
                let Ok(len) = usize::try_from(len) else {
                    self.fail_ep(
                        e,
                        Error::new(
                            Status::ProtocolError,
                            "active-message length does not fit in memory",
                        ),
                    );
                    return PollOne::Handled;
                };
                let remote = match segs.read_once() {
                    Ok(s) => s,
                    Err(err) => {
                        self.fail_ep(
                            e,
                            Error::msg(
                                Status::ProtocolError,
                                format!("active-message rendezvous offer: {err}"),
                            ),
                        );
                        return PollOne::Handled;
                    }
                };
                // The user header is opaque: the handler gets it where the link holds it
                // (valid until `finish_am`), not in `copy`, which is gone by then. It
                // starts the rest, in both.
                let header = &f.rest_in_link[..header.len()];
                ep.rx_busy = true;
                let rndv = AmRndv {
                    ep: e,
                    ep_generation: generation,
                    sreq,
                    len,
                    segs: remote,
                    key: segs.shared_key().map(Box::from),
                };
                return PollOne::Am(AmDelivery {
                    id,
                    header: held(header),
                    data: &[],
                    rndv: Some(Box::new(rndv)),
                    reply: reply.then_some((e, generation)),
                    ep: (e, generation),
                });
            }
            _ => {}
        }
        self.handle(e, frame);
        if let Some(rx) = self.ep(e).and_then(|ep| ep.rx.as_mut()) {
            rx.consume();
        }
        PollOne::Handled
    }

    /// The peer of `e` sent a frame of `len` bytes, larger than this worker accepts
    /// (`COURIER_MAX_FRAME`, which it was told at wireup): `e` fails.
    #[cold]
    pub(crate) fn refuse_frame_size(&mut self, e: u32, len: usize) {
        let max = self.cfg.limits.max_frame;
        let peer = self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
        self.fail_ep(
            e,
            Error::msg(
                Status::ProtocolError,
                format!(
                    "{peer} sent a frame of {len} bytes, larger than this worker accepts (COURIER_MAX_FRAME={}, which the peer was told at wireup); the endpoint is failed, every other goes on",
                    super::limits::human(max)
                ),
            ),
        );
    }

    /// Consume the active-message frame of `e` after its handler ran.
    #[inline(always)]
    pub(crate) fn finish_am(&mut self, e: u32) {
        if let Some(ep) = self.ep(e) {
            ep.rx_busy = false;
            if let Some(rx) = ep.rx.as_mut() {
                rx.consume();
            }
        }
        if !self.progress.reap.is_empty() {
            self.reap_after_am(e);
        }
    }

    /// A link kept for an active message's handler (its endpoint closed meanwhile) goes.
    #[inline(never)]
    fn reap_after_am(&mut self, e: u32) {
        if let Some(pos) = self.progress.reap.iter().position(|&x| x == e) {
            self.progress.reap.swap_remove(pos);
            self.ep_take_link(e);
        }
    }

    fn handle(&mut self, e: u32, frame: Frame<'_>) {
        match frame {
            Frame::TagEager { tag, data } => self.on_tag_eager(e, tag, data, None),
            Frame::TagEagerSync { tag, sreq, data } => self.on_tag_eager(e, tag, data, Some(sreq)),
            Frame::TagRts {
                tag,
                sreq,
                len,
                sync: _,
                segs,
            } => self.on_tag_rts(e, tag, sreq, len, segs),
            Frame::RndvAts { sreq, status } => self.on_rndv_ats(e, sreq, status),
            Frame::RndvRtr { sreq, rreq, len } => self.on_rndv_rtr(e, sreq, rreq, len),
            Frame::RndvSplit {
                sreq,
                rreq,
                offset,
                len,
                segs,
            } => self.on_rndv_split(e, sreq, rreq, offset, len, segs),
            Frame::RndvSplitDone { rreq, status } => self.on_rndv_split_done(e, rreq, status),
            Frame::RndvData { rreq, offset, data } => self.on_rndv_data(e, rreq, offset, data),
            Frame::SyncAck { sreq } => self.on_sync_ack(e, sreq),
            Frame::Stream { data } => self.on_stream(e, data),
            Frame::Keepalive { ping } => self.on_keepalive(e, ping),
            Frame::Close => {
                // What it sent before stays receivable (`limits.rs`).
                if let Some(ep) = self.ep(e) {
                    ep.spent.closed_by_peer = true;
                }
                let peer = self.ep(e).map(|ep| ep.peer.clone()).unwrap_or_default();
                self.fail_ep(
                    e,
                    Error::msg(Status::PeerFailure, format!("{peer} closed the connection")),
                );
            }
            Frame::ConnAccept { conn_id, address } => self.on_conn_accept(e, conn_id, address),
            // An answer to this side's connection request; on a connection that is set up
            // (or that this side accepted) it makes no sense.
            Frame::ConnReject => {
                let asked = self
                    .ep(e)
                    .is_some_and(|ep| ep.status == crate::proto::endpoint::EpStatus::Connecting);
                self.fail_ep(
                    e,
                    if asked {
                        Error::new(
                            Status::Rejected,
                            "the server's connection handler rejected the connection",
                        )
                    } else {
                        Error::new(
                            Status::ProtocolError,
                            "a connection rejection on a connection that was not asked for",
                        )
                    },
                )
            }
            Frame::Wireup { purpose, .. } => self.on_wireup_in_band(e, purpose),
            Frame::ConnReq { .. } => self.fail_ep(
                e,
                Error::new(
                    Status::ProtocolError,
                    "connection request on an established connection",
                ),
            ),
            Frame::Put { target, req, data } => self.on_put(e, target, req, data),
            Frame::RmaAck { req, status, value } => self.on_rma_ack(e, req, status, value),
            Frame::GetReq { target, req, len } => self.on_get_req(e, target, req, len),
            Frame::GetResp {
                req,
                offset,
                status,
                data,
            } => self.on_get_resp(e, req, offset, status, data),
            Frame::Atomic {
                target,
                req,
                op,
                bits32,
                operand,
                compare,
            } => self.on_atomic(e, target, req, op, bits32, operand, compare),
            Frame::PutSignal {
                target,
                req,
                signal,
                op,
                value,
                data,
            } => self.on_put_signal(e, target, req, signal, op, value, data),
            Frame::PutBegin {
                target,
                len,
                signal,
            } => self.on_put_begin(e, target, len, signal),
            Frame::FlushReq { req } => self.on_flush_req(e, req),
            Frame::FlushAck { req } => self.on_flush_ack(e, req),
            Frame::Am { .. } | Frame::AmRts { .. } => {}
        }
    }
}
