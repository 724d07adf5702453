//! Building a frame's fixed header: one typed constructor per kind, each writing the
//! kind's fields (`field`) and nothing else.

use super::{Field, Kind, RemoteRef, field, flags};

/// The longest fixed header of any kind (`Kind::PutSignal`'s).
pub const MAX_HEADER_LEN: usize = 88;

/// A fixed header being built; `as_bytes` gives exactly the kind's header length.
#[derive(Clone, Copy)]
pub struct Header {
    buf: [u8; MAX_HEADER_LEN],
    len: usize,
}

impl Header {
    /// A header of `kind` with zeroed fields.
    #[inline]
    pub fn new(kind: Kind) -> Header {
        let mut buf = [0u8; MAX_HEADER_LEN];
        buf[field::KIND] = kind as u8;
        Header {
            buf,
            len: kind.header_len(),
        }
    }
    /// Set the flags byte.
    #[inline]
    pub fn flags(mut self, f: u8) -> Self {
        self.buf[field::FLAGS] = f;
        self
    }
    /// Set aux16.
    #[inline]
    pub fn aux16(mut self, v: u16) -> Self {
        self.set16(field::AUX16, v);
        self
    }
    /// Set aux32.
    #[inline]
    pub fn aux32(mut self, v: u32) -> Self {
        self.set32(field::AUX32, v);
        self
    }
    /// Set 64-bit word `n` (1-based) after the common fields, whatever the kind's field
    /// map says: for tests that build frames field by field, as a hostile peer may. The
    /// library builds headers with the typed constructors below.
    #[inline]
    pub fn word(mut self, n: usize, v: u64) -> Self {
        self.set64(field::word(n), v);
        self
    }
    /// The header bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    #[inline(always)]
    fn set16(&mut self, f: Field, v: u16) {
        self.buf[f].copy_from_slice(&v.to_le_bytes());
    }
    #[inline(always)]
    fn set32(&mut self, f: Field, v: u32) {
        self.buf[f].copy_from_slice(&v.to_le_bytes());
    }
    #[inline(always)]
    fn set64(&mut self, f: Field, v: u64) {
        self.buf[f].copy_from_slice(&v.to_le_bytes());
    }
    #[inline(always)]
    fn set_ref(&mut self, f: field::RefFields, t: &RemoteRef) {
        self.set64(f.region, t.region);
        self.buf[f.secret].copy_from_slice(&t.secret.to_le_bytes());
        self.set64(f.addr, t.addr);
    }
    #[inline(always)]
    fn with(mut self, f: impl FnOnce(&mut Header)) -> Self {
        f(&mut self);
        self
    }

    // ----- two-sided ----------------------------------------------------------------------

    /// `Kind::TagEager`.
    #[inline]
    pub fn tag_eager(tag: u64) -> Header {
        Header::new(Kind::TagEager).with(|h| h.set64(field::tag_eager::TAG, tag))
    }
    /// `Kind::TagEagerSync`.
    #[inline]
    pub fn tag_eager_sync(tag: u64, sreq: u64) -> Header {
        Header::new(Kind::TagEagerSync).with(|h| {
            h.set64(field::tag_eager_sync::TAG, tag);
            h.set64(field::tag_eager_sync::SREQ, sreq);
        })
    }
    /// `Kind::TagRts` offering `len` bytes in `count` segments; `fl`: `SYNC`, `SHARED`.
    #[inline]
    pub fn tag_rts(tag: u64, sreq: u64, len: u64, count: u32, fl: u8) -> Header {
        Header::new(Kind::TagRts).flags(fl).with(|h| {
            h.set64(field::tag_rts::TAG, tag);
            h.set64(field::tag_rts::SREQ, sreq);
            h.set64(field::tag_rts::LEN, len);
            h.set32(field::tag_rts::COUNT, count);
        })
    }
    /// `Kind::RndvAts` with status 0 or an error code.
    #[inline]
    pub fn rndv_ats(sreq: u64, status: i32) -> Header {
        Header::new(Kind::RndvAts).with(|h| {
            h.set64(field::rndv_ats::SREQ, sreq);
            h.set32(field::rndv_ats::STATUS, status as u32);
        })
    }
    /// `Kind::RndvRtr`.
    #[inline]
    pub fn rndv_rtr(sreq: u64, rreq: u64, len: u64) -> Header {
        Header::new(Kind::RndvRtr).with(|h| {
            h.set64(field::rndv_rtr::SREQ, sreq);
            h.set64(field::rndv_rtr::RREQ, rreq);
            h.set64(field::rndv_rtr::LEN, len);
        })
    }
    /// `Kind::RndvData`.
    #[inline]
    pub fn rndv_data(rreq: u64, offset: u64) -> Header {
        Header::new(Kind::RndvData).with(|h| {
            h.set64(field::rndv_data::RREQ, rreq);
            h.set64(field::rndv_data::OFFSET, offset);
        })
    }
    /// `Kind::SyncAck`.
    #[inline]
    pub fn sync_ack(sreq: u64) -> Header {
        Header::new(Kind::SyncAck).with(|h| h.set64(field::sync_ack::SREQ, sreq))
    }
    /// `Kind::RndvSplit` asking for `len` bytes from `offset`, into `count` segments; `fl`:
    /// `SHARED`.
    #[inline]
    pub fn rndv_split(sreq: u64, rreq: u64, offset: u64, len: u64, count: u32, fl: u8) -> Header {
        Header::new(Kind::RndvSplit).flags(fl).with(|h| {
            h.set64(field::rndv_split::SREQ, sreq);
            h.set64(field::rndv_split::RREQ, rreq);
            h.set64(field::rndv_split::OFFSET, offset);
            h.set64(field::rndv_split::LEN, len);
            h.set32(field::rndv_split::COUNT, count);
        })
    }
    /// `Kind::RndvSplitDone` with status 0 or an error code.
    #[inline]
    pub fn rndv_split_done(rreq: u64, status: i32) -> Header {
        Header::new(Kind::RndvSplitDone).with(|h| {
            h.set64(field::rndv_split_done::RREQ, rreq);
            h.set32(field::rndv_split_done::STATUS, status as u32);
        })
    }
    /// `Kind::Am` for handler `id` with a user header of `header_len` bytes; `fl`:
    /// `AM_REPLY`.
    #[inline]
    pub fn am(id: u16, header_len: u32, fl: u8) -> Header {
        Header::new(Kind::Am).flags(fl).with(|h| {
            h.set16(field::am::ID, id);
            h.set32(field::am::HEADER_LEN, header_len);
        })
    }
    /// `Kind::AmRts` for handler `id`, offering `len` bytes in `count` segments; `fl`:
    /// `AM_REPLY`, `SHARED`.
    #[inline]
    pub fn am_rts(id: u16, header_len: u32, fl: u8, sreq: u64, len: u64, count: u64) -> Header {
        Header::new(Kind::AmRts).flags(fl).with(|h| {
            h.set16(field::am_rts::ID, id);
            h.set32(field::am_rts::HEADER_LEN, header_len);
            h.set64(field::am_rts::SREQ, sreq);
            h.set64(field::am_rts::LEN, len);
            h.set64(field::am_rts::COUNT, count);
        })
    }
    /// `Kind::Keepalive`: a question (`ping`) or its answer.
    #[inline]
    pub fn keepalive(ping: bool) -> Header {
        Header::new(Kind::Keepalive).flags(if ping { flags::PING } else { 0 })
    }
    /// A frame of a kind without fields of its own (`Stream`, `Close`, `Keepalive`,
    /// `ConnReject`).
    #[inline]
    pub fn bare(kind: Kind) -> Header {
        Header::new(kind)
    }

    // ----- wireup -------------------------------------------------------------------------

    /// `Kind::ConnReq`.
    #[inline]
    pub fn conn_req(client_id: u64) -> Header {
        Header::new(Kind::ConnReq).with(|h| h.set64(field::conn_req::CLIENT_ID, client_id))
    }
    /// `Kind::ConnAccept`.
    #[inline]
    pub fn conn_accept(conn_id: u64) -> Header {
        Header::new(Kind::ConnAccept).with(|h| h.set64(field::conn_accept::CONN_ID, conn_id))
    }
    /// `Kind::Wireup` for `purpose`.
    #[inline]
    pub fn wireup(conn_id: u64, purpose: u32) -> Header {
        Header::new(Kind::Wireup).with(|h| {
            h.set64(field::wireup::CONN_ID, conn_id);
            h.set32(field::wireup::PURPOSE, purpose);
        })
    }

    // ----- one-sided ----------------------------------------------------------------------

    /// `Kind::Put` at `t` (request 0: unacknowledged).
    #[inline]
    pub fn put(t: &RemoteRef, req: u64) -> Header {
        Header::new(Kind::Put).with(|h| {
            h.set_ref(field::put::TARGET, t);
            h.set64(field::put::REQ, req);
        })
    }
    /// `Kind::RmaAck` with status 0 or an error code.
    #[inline]
    pub fn rma_ack(req: u64, status: i32, value: u64) -> Header {
        Header::new(Kind::RmaAck).with(|h| {
            h.set64(field::rma_ack::REQ, req);
            h.set32(field::rma_ack::STATUS, status as u32);
            h.set64(field::rma_ack::VALUE, value);
        })
    }
    /// `Kind::GetReq` for `len` bytes at `t`.
    #[inline]
    pub fn get_req(t: &RemoteRef, req: u64, len: u64) -> Header {
        Header::new(Kind::GetReq).with(|h| {
            h.set_ref(field::get_req::TARGET, t);
            h.set64(field::get_req::REQ, req);
            h.set64(field::get_req::LEN, len);
        })
    }
    /// `Kind::GetResp` with status 0 or an error code.
    #[inline]
    pub fn get_resp(req: u64, offset: u64, status: i32) -> Header {
        Header::new(Kind::GetResp).with(|h| {
            h.set64(field::get_resp::REQ, req);
            h.set64(field::get_resp::OFFSET, offset);
            h.set32(field::get_resp::STATUS, status as u32);
        })
    }
    /// `Kind::Atomic` `op` on the word at `t` (request 0: posted).
    #[inline]
    pub fn atomic(
        t: &RemoteRef,
        req: u64,
        op: u16,
        bits32: bool,
        operand: u64,
        compare: u64,
    ) -> Header {
        let fl = if bits32 { flags::BITS32 } else { 0 };
        Header::new(Kind::Atomic).flags(fl).with(|h| {
            h.set16(field::atomic::OP, op);
            h.set_ref(field::atomic::TARGET, t);
            h.set64(field::atomic::REQ, req);
            h.set64(field::atomic::OPERAND, operand);
            h.set64(field::atomic::COMPARE, compare);
        })
    }
    /// `Kind::PutSignal` at `t`, then `op` with `value` on the word at `signal`.
    #[inline]
    pub fn put_signal(t: &RemoteRef, req: u64, signal: &RemoteRef, op: u16, value: u64) -> Header {
        Header::new(Kind::PutSignal).with(|h| {
            h.set16(field::put_signal::OP, op);
            h.set_ref(field::put_signal::TARGET, t);
            h.set64(field::put_signal::REQ, req);
            h.set_ref(field::put_signal::SIGNAL, signal);
            h.set64(field::put_signal::VALUE, value);
        })
    }
    /// `Kind::FlushReq`.
    #[inline]
    pub fn flush_req(req: u64) -> Header {
        Header::new(Kind::FlushReq).with(|h| h.set64(field::flush_req::REQ, req))
    }
    /// `Kind::FlushAck`.
    #[inline]
    pub fn flush_ack(req: u64) -> Header {
        Header::new(Kind::FlushAck).with(|h| h.set64(field::flush_ack::REQ, req))
    }
    /// `Kind::PutBegin` of a put of `len` bytes at `t`; with `signal`, of a put-with-signal
    /// whose signal word and op it names.
    #[inline]
    pub fn put_begin(t: &RemoteRef, len: u64, signal: Option<(&RemoteRef, u16)>) -> Header {
        let mut h = Header::new(Kind::PutBegin);
        h.set_ref(field::put_begin::TARGET, t);
        h.set64(field::put_begin::LEN, len);
        if let Some((s, op)) = signal {
            h = h.flags(flags::SIGNAL);
            h.set_ref(field::put_begin::SIGNAL, s);
            h.set16(field::put_begin::OP, op);
        }
        h
    }
}

/// The whole header of an eager tag frame as two words, for the small-message path: built
/// as whole words, it is copied as words, and a word read back from bytes stored one at a
/// time waits for those stores to reach the cache.
#[inline(always)]
pub fn tag_eager_words(tag: u64) -> [[u8; 8]; 2] {
    [(Kind::TagEager as u64).to_le_bytes(), tag.to_le_bytes()]
}

/// The whole header of an eager active-message frame as one word (see `tag_eager_words`):
/// kind, flags (`reply`: `AM_REPLY`), handler id and user-header length.
#[inline(always)]
pub fn am_word(id: u16, reply: bool, header_len: u32) -> [u8; 8] {
    let fl = if reply { flags::AM_REPLY } else { 0 };
    (Kind::Am as u64 | u64::from(fl) << 8 | u64::from(id) << 16 | u64::from(header_len) << 32)
        .to_le_bytes()
}
