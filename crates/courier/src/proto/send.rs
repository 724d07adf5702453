//! Sending a frame: at once when the link takes it, otherwise behind the endpoint's
//! pending queue (back-pressure), and completing send requests when their last byte is
//! written.

use super::State;
use super::buf::Buf;
use super::request::Info;
use crate::base::{Error, Result, Status};
use crate::transport::{LinkTx, Sent, TxError};
use crate::wire::frame::{Header, Kind};

/// A frame that could not be sent yet (back-pressure or link not up).
pub(crate) struct Pending {
    pub(in crate::proto) req: Option<u64>,
    pub(in crate::proto) hdr: Header,
    /// Bytes after the header owned by the pending op (segment lists, addresses).
    pub(in crate::proto) extra: Vec<u8>,
    /// User data segments after `extra`.
    pub(in crate::proto) data: Buf,
    /// `data` lies in one of this context's regions (a get's answer): checked against the
    /// registry again before the frame leaves, so nothing is sent from a region unmapped
    /// while the frame waited.
    pub(in crate::proto) region: Option<RegionRead>,
    /// An answer to the peer's request (`State::send_answer`): it enters the link only
    /// while the link's queue holds less than `COURIER_MAX_REPLY_QUEUE`.
    pub(in crate::proto) answer: bool,
}

/// Bytes of waiting answers one `progress_tx` call hands to a link: a peer whose answers
/// wait (it reads them late, `State::send_answer`) gets them a share per progress call,
/// so that refilling its link's queue (copies of up to `COURIER_MAX_REPLY_QUEUE`) does
/// not hold up the worker's other endpoints for one long call.
const ANSWERS_PER_CALL: usize = 1 << 20;

/// What a frame queued without a request costs against `COURIER_MAX_REPLY_QUEUE`: the
/// queue entry and the bytes it copied (a request's frames are the application's, held
/// by its request; a get answer's data stays in its region).
pub(crate) fn reply_cost(p: &Pending) -> usize {
    if p.req.is_some() {
        0
    } else {
        std::mem::size_of::<Pending>() + p.extra.len()
    }
}

/// Where a queued get answer's bytes lie: the region as the get named it, and the
/// requester's get.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegionRead {
    pub(in crate::proto) region: u64,
    pub(in crate::proto) secret: crate::wire::rkey::Secret,
    pub(in crate::proto) addr: u64,
    pub(in crate::proto) req: u64,
}

impl State {
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
        let epoch = self.progress.calls;
        let Some(ep) = self.ep(e) else {
            return Err(Error::new(Status::EndpointClosed, "endpoint was closed"));
        };
        if let Some(err) = ep.dead_error() {
            return Err(err);
        }
        if !(ep.pending.is_empty() && ep.is_connected()) {
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
        if !(ep.live && ep.is_connected() && ep.pending.is_empty())
            || eager_len.is_some_and(|l| l >= ep.rndv_thresh)
        {
            return None;
        }
        if frame > ep.caps.as_ref()?.max_frame {
            return None;
        }
        let tx = ep.tx.as_mut()?;
        let data: &[u8] = seg_slice(addr, len);
        tx.note_epoch(self.progress.calls);
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
                answer: false,
            },
        )?;
        Ok(false)
    }

    /// Whether an answer may enter `e`'s link now: the link's own send queue (bytes the
    /// kernel has not taken, whoever queued them) holds less than
    /// `COURIER_MAX_REPLY_QUEUE`. Beyond it, answers wait in the endpoint's queue (an
    /// entry each; a get's data stays in its region), and are sent as the peer reads:
    /// a peer that asks and does not read gets its requests served only as fast as it
    /// takes the answers, and holds at most that much of the link's memory.
    #[inline]
    fn answer_room(&self, e: u32) -> bool {
        let lim = self.cfg.limits.reply_queue;
        self.eps
            .slots
            .get(e as usize)
            .and_then(|ep| ep.tx.as_ref())
            .is_none_or(|tx| tx.queued() < lim)
    }

    /// Send an answer to the peer of `e` (a get's data, an acknowledgement, a keepalive
    /// answer): now if the link has room for answers (`answer_room`), else queued behind
    /// the frames already waiting, its entry charged against `COURIER_MAX_REPLY_QUEUE`
    /// (`region`: the data lies in one of our regions, checked again before it leaves).
    /// `Ok(true)`: sent now.
    pub(crate) fn send_answer(
        &mut self,
        e: u32,
        hdr: &Header,
        extra: &[u8],
        data: Buf,
        region: Option<RegionRead>,
    ) -> Result<bool> {
        if self.answer_room(e) && self.try_send_now(e, hdr, extra, &data)? {
            return Ok(true);
        }
        self.enqueue(
            e,
            Pending {
                req: None,
                hdr: *hdr,
                extra: extra.to_vec(),
                data,
                region,
                answer: true,
            },
        )?;
        Ok(false)
    }

    /// Queue a frame on `e` behind the ones already waiting (`progress_tx` sends them).
    pub(crate) fn enqueue(&mut self, e: u32, p: Pending) -> Result<()> {
        let cost = reply_cost(&p);
        if cost > 0 && !self.charge_reply(e, cost) {
            return Err(self
                .ep(e)
                .and_then(|ep| ep.dead_error())
                .unwrap_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed")));
        }
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        ep.pending.push_back(p);
        Ok(())
    }

    /// Retry queued frames and rendezvous pushes of `e`; flush its transport queue.
    pub(crate) fn progress_tx(&mut self, e: u32) -> usize {
        let mut n = 0;
        let answer_room = self.cfg.limits.reply_queue;
        let mut answered = 0usize;
        loop {
            self.check_queued_read(e);
            let Some(ep) = self.ep(e) else { return n };
            if !ep.is_connected() {
                return n;
            }
            let Some(tx) = ep.tx.as_mut() else { return n };
            let Some(p) = ep.pending.front() else { break };
            if p.answer && (tx.queued() >= answer_room || answered >= ANSWERS_PER_CALL) {
                // The peer has not taken the answers before it (`answer_room`), or this
                // call has copied its share of them into the link: the next goes on.
                break;
            }
            if p.answer {
                answered += p.hdr.as_bytes().len() + p.extra.len() + p.data.len();
            }
            // A frame that completes a request may be left in its buffer (zero copy).
            let sent = match p.req {
                Some(id) => send_parts_zc(tx, p.hdr.as_bytes(), &p.extra, &p.data, id),
                None => send_parts(tx, p.hdr.as_bytes(), &p.extra, &p.data).map(|()| Sent::Done),
            };
            match sent {
                Ok(sent) => {
                    let p = ep.pending.pop_front();
                    if let Some(p) = &p {
                        let cost = reply_cost(p);
                        ep.spent.replies = ep.spent.replies.saturating_sub(cost);
                    }
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
                                    length: len,
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
