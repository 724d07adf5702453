//! Active messages: a handler id, a user header and data, eager or by rendezvous.
//!
//! Small messages reach the handler in place (the transport's buffer, valid during the
//! call). Large ones arrive as a descriptor ([`AmRndv`]) that the handler may keep and
//! later receive into a buffer of its choice with `am_recv_data`, or drop (which tells the
//! sender its data was declined so its request completes).

use super::State;
use super::buf::Buf;
use super::request::Started;
use super::request::{Callback, Info, ReqKind};
use crate::base::{Error, Result, Status};
use crate::transport::RndvMode;
use crate::wire::frame::{self, Header, Kind};

/// Flags for sending an active message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmFlags {
    /// Always eager (error if the message does not fit one frame).
    pub eager: bool,
    /// Always rendezvous.
    pub rndv: bool,
    /// The receiver may reply on the endpoint the message arrived on.
    pub reply: bool,
}

/// A large active message's data, still at the sender.
#[derive(Debug)]
pub struct AmRndv {
    pub(crate) ep: u32,
    pub(crate) ep_generation: u32,
    pub(crate) sreq: u64,
    pub(crate) len: usize,
    pub(crate) segs: super::buf::Segs<u64>,
    pub(crate) key: Option<Box<[u8]>>,
}

impl AmRndv {
    /// Length of the data.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the data is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What the protocol layer hands to an active-message handler.
pub struct AmDelivery<'a> {
    /// Handler id.
    pub id: u16,
    /// User header.
    pub header: &'a [u8],
    /// Eager data (empty for rendezvous).
    pub data: &'a [u8],
    /// Rendezvous descriptor, if the data is still at the sender (boxed: the eager
    /// case, the latency one, then moves a pointer's worth, not the descriptor's).
    pub rndv: Option<Box<AmRndv>>,
    /// The endpoint it arrived on (index, generation), when the sender allows replies.
    pub reply: Option<(u32, u32)>,
    /// The endpoint it arrived on, always.
    pub ep: (u32, u32),
}

/// The registered active-message handlers, by id.
#[derive(Default)]
pub(crate) struct AmHandlers {
    pub(super) handlers: Vec<Option<AmHandlerFn>>,
}

/// A registered handler as the protocol layer sees it. The second argument is the API
/// object that runs it (its worker), opaque to this layer: handlers get it at each call
/// instead of keeping a reference of their own (which would cost two atomic operations
/// per message, and a reference cycle if it were strong).
pub type AmHandlerFn = Box<dyn FnMut(&mut AmDelivery<'_>, &dyn std::any::Any) + Send>;

impl State {
    /// Start an active-message send.
    #[inline(always)]
    pub(crate) fn am_send(
        &mut self,
        e: u32,
        id: u16,
        header: &[u8],
        data: Buf,
        flags: AmFlags,
        cb: Callback,
    ) -> Result<Started> {
        if !super::stage::device_active() {
            if let Some(r) = self.am_send_now(e, id, header, &data, flags) {
                return r;
            }
        }
        self.am_send_other(e, id, header, data, flags, cb)
    }

    /// The small-message case of `am_send`: one host segment written to the link at once
    /// (`None`: not that case, or the link cannot take it now).
    #[inline(always)]
    fn am_send_now(
        &mut self,
        e: u32,
        id: u16,
        header: &[u8],
        data: &Buf,
        flags: AmFlags,
    ) -> Option<Result<Started>> {
        let (Buf::One((addr, len)), false, Ok(hlen32)) =
            (data, flags.rndv, u32::try_from(header.len()))
        else {
            return None;
        };
        // One word (see `tag_send_now`): kind, flags, handler id, header length.
        let hdr = frame::am_word(id, flags.reply, hlen32);
        let total = header.len() + len;
        let eager_len = (!flags.eager).then_some(total);
        let frame = total + Kind::Am.header_len();
        let r = self.send_now_fast(e, &hdr, header, (*addr, *len), eager_len, frame)?;
        let len = *len;
        Some(r.map(|()| {
            Started::Done(Info {
                length: len,
                tag: 0,
                value: 0,
            })
        }))
    }

    /// `am_send` for every other case.
    #[inline(never)]
    fn am_send_other(
        &mut self,
        e: u32,
        id: u16,
        header: &[u8],
        data: Buf,
        flags: AmFlags,
        cb: Callback,
    ) -> Result<Started> {
        if let Some(host) = super::stage::gather(&data)? {
            return self.staged_send(host, |st, b| st.am_send(e, id, header, b, flags, cb));
        }
        // Device memory in play, but not in this message.
        if let Some(r) = self.am_send_now(e, id, header, &data, flags) {
            return r;
        }
        let (thresh, max_frame, mode) = self.ep_limits(e)?;
        let len = data.len();
        let hlen = header.len();
        if hlen > u32::MAX as usize {
            return Err(Error::new(
                Status::InvalidParam,
                "active-message header too long",
            ));
        }
        let fits = hlen + len + Kind::Am.header_len() <= max_frame;
        if flags.eager && !fits {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "eager active message of {} bytes exceeds the transport's {max_frame}-byte frame",
                    hlen + len
                ),
            ));
        }
        let rfl = if flags.reply {
            frame::flags::AM_REPLY
        } else {
            0
        };
        if fits && (flags.eager || (!flags.rndv && hlen + len < thresh)) {
            let hdr = Header::am(id, hlen as u32, rfl);
            if self.try_send_now(e, &hdr, header, &data)? {
                return Ok(Started::Done(Info {
                    length: len,
                    tag: 0,
                    value: 0,
                }));
            }
            let rid = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
            if self.send_frame(e, &hdr, header, &data, Some(rid))? {
                self.complete(
                    rid,
                    Ok(Info {
                        length: len,
                        tag: 0,
                        value: 0,
                    }),
                );
            }
            return Ok(Started::Pending(rid));
        }
        let offer = Self::offer_capacity(hlen, &data);
        if offer + Kind::AmRts.header_len() > max_frame {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "active-message header of {hlen} bytes does not fit the transport's {max_frame}-byte frame beside the rendezvous offer (at most {} bytes here); nothing was sent",
                    max_frame.saturating_sub(offer - hlen + Kind::AmRts.header_len())
                ),
            ));
        }
        let rid = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
        if let Some(s) = self.req(rid) {
            s.expect = len;
        }
        let mut extra = Vec::with_capacity(offer);
        extra.extend_from_slice(header);
        let (count, shared) = if mode == RndvMode::RemoteRead {
            let (n, shared) = self.emit_offer(e, &mut extra, &data);
            (n as u64, shared)
        } else {
            (0, 0)
        };
        let hdr = Header::am_rts(id, hlen as u32, rfl | shared, rid, len as u64, count);
        if let Err(err) = self.send_frame(e, &hdr, &extra, &Buf::EMPTY, None) {
            self.req_free(rid);
            return Err(err);
        }
        Ok(Started::Pending(rid))
    }

    /// Receive a rendezvous active message's data into `buf`.
    pub(crate) fn am_recv_data(&mut self, desc: AmRndv, buf: Buf, cb: Callback) -> Result<Started> {
        if super::stage::has_device(&buf) {
            return self.staged_recv(buf, |st, b| st.am_recv_data(desc, b, cb));
        }
        let live = matches!(self.ep(desc.ep), Some(ep) if ep.generation == desc.ep_generation);
        if !live {
            return Err(Error::new(
                Status::EndpointClosed,
                "the endpoint the message came from is gone",
            ));
        }
        if let Some(err) = self.ep(desc.ep).and_then(|ep| ep.dead_error()) {
            return Err(err);
        }
        let id = self.req_alloc(ReqKind::AmData, Some(desc.ep), buf, cb);
        self.rndv_receive(
            desc.ep,
            id,
            desc.sreq,
            desc.len,
            0,
            &desc.segs,
            desc.key.as_deref(),
        );
        // A receive that finished at once (remote read) is still returned as a request so
        // the caller has one way to collect the result.
        Ok(Started::Pending(id))
    }

    /// The handler did not keep a rendezvous message: release the sender.
    pub(crate) fn am_decline(&mut self, desc: AmRndv) {
        if matches!(self.ep(desc.ep), Some(ep) if ep.generation == desc.ep_generation) {
            let hdr = Header::rndv_ats(desc.sreq, 0);
            let _ = self.send_frame(desc.ep, &hdr, &[], &Buf::EMPTY, None);
        }
    }

    /// Register `handler` for active-message `id`, replacing any earlier one.
    pub(crate) fn am_set_handler(&mut self, id: u16, handler: AmHandlerFn) {
        let idx = id as usize;
        if self.am.handlers.len() <= idx {
            self.am.handlers.resize_with(idx + 1, || None);
        }
        self.am.handlers[idx] = Some(handler);
    }
}
