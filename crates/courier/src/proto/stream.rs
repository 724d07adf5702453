//! Streams: ordered bytes per endpoint, no message boundaries, never rendezvous.
//!
//! Arriving bytes fill posted receives in order, straight from the transport's buffer;
//! what no receive wants yet waits in the endpoint's stream buffer.

use super::State;
use super::buf::Buf;
use super::request::Started;
use super::request::{Callback, Info, ReqKind};
use crate::base::{Error, Result, Status};
use crate::wire::frame::{Header, Kind};

impl State {
    /// Send `data` as stream bytes on `e`.
    pub(crate) fn stream_send(&mut self, e: u32, data: Buf, cb: Callback) -> Result<Started> {
        if let Some(host) = super::stage::gather(&data)? {
            return self.staged_send(host, |st, b| st.stream_send(e, b, cb));
        }
        let (_, max_frame, _) = self.ep_limits(e)?;
        let len = data.len();
        let chunk = max_frame - Kind::Stream.header_len();
        let hdr = Header::bare(Kind::Stream);
        if len <= chunk {
            if self.try_send_now(e, &hdr, &[], &data)? {
                return Ok(Started::Done(Info {
                    length: len,
                    tag: 0,
                    value: 0,
                }));
            }
        }
        let id = self.req_alloc(ReqKind::Send, Some(e), data.clone(), cb);
        let mut off = 0;
        let mut all_sent = true;
        while off < len || (len == 0 && off == 0) {
            let n = (len - off).min(chunk);
            let part = data.part(off, n);
            off += n;
            let last = off >= len;
            match self.send_frame(e, &hdr, &[], &part, if last { Some(id) } else { None }) {
                Ok(sent) => all_sent &= sent,
                Err(err) => {
                    self.req_free(id);
                    return Err(err);
                }
            }
            if len == 0 {
                break;
            }
        }
        if all_sent {
            self.complete(
                id,
                Ok(Info {
                    length: len,
                    tag: 0,
                    value: 0,
                }),
            );
        }
        Ok(Started::Pending(id))
    }

    /// Receive stream bytes from `e` into `buf`: with `waitall` exactly `buf.len()` bytes,
    /// otherwise whatever has arrived (at least one byte).
    pub(crate) fn stream_recv(
        &mut self,
        e: u32,
        buf: Buf,
        waitall: bool,
        cb: Callback,
    ) -> Result<Started> {
        if super::stage::has_device(&buf) {
            return self.staged_recv(buf, |st, b| st.stream_recv(e, b, waitall, cb));
        }
        let cap = buf.len();
        let ep = self
            .ep(e)
            .ok_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed"))?;
        let mut got = 0;
        // Nothing to wait for: a receive of no bytes ends at once, as a socket's does
        // (behind earlier receives, it ends in its turn).
        if cap == 0 && ep.stream_reqs.is_empty() {
            return match ep.dead_error() {
                Some(err) => Err(err),
                None => Ok(Started::Done(Info::default())),
            };
        }
        if ep.stream_reqs.is_empty() {
            // (`self.ep` would borrow the spares too.)
            let Some(ep) = self.eps.slots.get_mut(e as usize).filter(|s| s.live) else {
                return Err(Error::new(Status::EndpointClosed, "endpoint was closed"));
            };
            got = ep.stream_in.drain_into(&buf, 0, &mut self.stream_spares);
            self.release_stream(got);
            if got == cap && cap > 0 || (!waitall && got > 0) {
                return Ok(Started::Done(Info {
                    length: got,
                    tag: 0,
                    value: 0,
                }));
            }
        }
        if let Some(err) = self.ep(e).and_then(|ep| ep.dead_error()) {
            return if got > 0 {
                Ok(Started::Done(Info {
                    length: got,
                    tag: 0,
                    value: 0,
                }))
            } else {
                Err(err)
            };
        }
        let id = self.req_alloc(ReqKind::StreamRecv, Some(e), buf, cb);
        if let Some(s) = self.req(id) {
            s.got = got;
            s.waitall = waitall;
        }
        if let Some(ep) = self.ep(e) {
            ep.stream_reqs.push_back(id);
        }
        Ok(Started::Pending(id))
    }

    /// Stream bytes arrived on `e`.
    pub(crate) fn on_stream(&mut self, e: u32, mut data: &[u8]) {
        while !data.is_empty() {
            let Some(ep) = self.ep(e) else { return };
            let Some(&id) = ep.stream_reqs.front() else {
                break;
            };
            let Some(s) = self.req(id) else {
                if let Some(ep) = self.ep(e) {
                    ep.stream_reqs.pop_front();
                }
                continue;
            };
            let room = s.buf.len() - s.got;
            let n = room.min(data.len());
            // SAFETY: the request's buffer is alive until it completes.
            unsafe { s.buf.write_at(s.got, &data[..n]) };
            s.got += n;
            data = &data[n..];
            let full = s.got == s.buf.len();
            if full || !s.waitall {
                let len = s.got;
                if let Some(ep) = self.ep(e) {
                    ep.stream_reqs.pop_front();
                }
                self.complete(
                    id,
                    Ok(Info {
                        length: len,
                        tag: 0,
                        value: 0,
                    }),
                );
            }
        }
        if !data.is_empty() {
            let queued = self.ep(e).map_or(0, |ep| ep.stream_in.len());
            if !self.charge_unexpected(e, data.len(), Some(queued)) {
                return;
            }
            if let Some(ep) = self.eps.slots.get_mut(e as usize).filter(|s| s.live) {
                ep.stream_in.extend(data, &mut self.stream_spares);
            }
        }
    }
}
