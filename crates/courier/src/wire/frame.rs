//! Frame headers of the protocol layer.
//!
//! All frames begin with the same 8 bytes:
//!
//! ```text
//! 0      1      2       4               8
//! +------+------+-------+---------------+
//! | kind | flags|  aux  |     aux32     |   then kind-specific fields, then payload
//! +------+------+-------+---------------+
//! ```
//!
//! All integers are little-endian. The frame length is carried by the transport.

use std::ops::Range;

type Field = Range<usize>;

/// Common header fields.
#[allow(missing_docs)]
pub mod field {
    use super::Field;
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    pub const AUX16: Field = 2..4;
    pub const AUX32: Field = 4..8;
    pub const W1: Field = 8..16;
    pub const W2: Field = 16..24;
    pub const W3: Field = 24..32;
    pub const W4: Field = 32..40;
    pub const W5: Field = 40..48;
    pub const W6: Field = 48..56;
    pub const W7: Field = 56..64;
    pub const W8: Field = 64..72;
}

/// Protocol version carried in wireup frames.
pub const VERSION: u8 = 1;

/// Frame kinds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Eager tag message: W1 tag; payload data.
    TagEager = 1,
    /// Eager synchronous tag message: W1 tag, W2 sender request; payload data.
    TagEagerSync = 2,
    /// Rendezvous request to send: W1 tag, W2 sender request, W3 total length, aux32 segment
    /// count; payload: segments as (address u64, length u64) for single-copy reads.
    TagRts = 3,
    /// Rendezvous done by the receiver (it read the data itself): W1 sender request,
    /// aux32 status (i32).
    RndvAts = 4,
    /// Ready to receive (sender must push the data): W1 sender request, W2 receiver
    /// request, W3 length wanted.
    RndvRtr = 5,
    /// Rendezvous data: W1 receiver request, W2 offset; payload chunk.
    RndvData = 6,
    /// Synchronous send matched: W1 sender request.
    SyncAck = 7,
    /// Split rendezvous (the receiver copies the first part itself): the sender is asked to
    /// write bytes `[W3, W3 + W4)` of its message into the receiver's memory. W1 sender
    /// request, W2 receiver request, W3 offset, W4 length, aux32 segment count; payload: the
    /// receiver's segments as (address u64, length u64).
    RndvSplit = 13,
    /// Answer to `RndvSplit`: W1 receiver request, aux32 status (i32; 0 = written).
    RndvSplitDone = 14,
    /// Active message: aux16 handler id, aux32 user-header length; payload header + data.
    Am = 8,
    /// Active message by rendezvous: aux16 id, aux32 header length, W1 sender request,
    /// W2 total data length, W3 segment count; payload header + segments.
    AmRts = 9,
    /// Stream bytes: payload.
    Stream = 10,
    /// The peer closes its endpoint gracefully.
    Close = 11,
    /// Liveness.
    Keepalive = 12,
    /// Connection request through a listener: W1 client id; payload client worker address.
    ConnReq = 20,
    /// Connection accepted: W1 connection id; payload server worker address.
    ConnAccept = 21,
    /// Connection rejected.
    ConnReject = 22,
    /// Endpoint wireup by worker address: W1 connection id, aux32 purpose; payload the
    /// initiator's worker address.
    Wireup = 23,
    /// Remote write: W1 region, W2 secret, W3 remote address, W4 origin request; payload data.
    Put = 30,
    /// Result of a remote operation: W1 origin request, aux32 status (i32), W2 value
    /// (fetching atomics). An unacknowledged operation (W4 0: puts, posted atomics) is
    /// answered only when refused, with W1 0 and W2 the kind of the refused frame.
    RmaAck = 31,
    /// Remote read request: W1 region, W2 secret, W3 remote address, W4 origin request,
    /// W5 length.
    GetReq = 32,
    /// Remote read data: W1 origin request, W2 offset, aux32 status; payload data.
    GetResp = 33,
    /// Remote atomic: aux16 op, flags bit 0 = 32-bit, W1 region, W2 secret, W3 address,
    /// W4 origin request (0: a posted atomic, answered only if refused), W5 operand, W6
    /// compare.
    Atomic = 34,
    /// Put with signal: aux16 signal op, W1 region, W2 secret, W3 address, W4 origin
    /// request, W5 signal region, W6 signal secret, W7 signal address, W8 signal value;
    /// payload data. The target writes the data, then updates the signal (release order).
    PutSignal = 35,
    /// Remote completion: W1 origin request. The target answers `FlushAck` after every
    /// earlier operation on this link has been carried out.
    FlushReq = 36,
    /// Answer to `FlushReq`: W1 origin request.
    FlushAck = 37,
    /// The first frame of a put or put-with-signal whose data takes more than one frame:
    /// W1 region, W2 secret, W3 address, W4 total data length; with `flags::SIGNAL`, W5
    /// signal region, W6 signal secret, W7 signal address, aux16 signal op. The target
    /// checks the whole operation before any of its data; if it refuses it, it answers the
    /// refusal once (as for an unacknowledged put) and drops the next W4 bytes of put data
    /// on the link (the operation's `Put` frames and closing `PutSignal`) unwritten.
    PutBegin = 38,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        Some(match b {
            1 => TagEager,
            2 => TagEagerSync,
            3 => TagRts,
            4 => RndvAts,
            5 => RndvRtr,
            6 => RndvData,
            7 => SyncAck,
            8 => Am,
            9 => AmRts,
            10 => Stream,
            11 => Close,
            12 => Keepalive,
            13 => RndvSplit,
            14 => RndvSplitDone,
            20 => ConnReq,
            21 => ConnAccept,
            22 => ConnReject,
            23 => Wireup,
            30 => Put,
            31 => RmaAck,
            32 => GetReq,
            33 => GetResp,
            34 => Atomic,
            35 => PutSignal,
            36 => FlushReq,
            37 => FlushAck,
            38 => PutBegin,
            _ => return None,
        })
    }

    /// Fixed header length of this kind.
    pub const fn header_len(self) -> usize {
        use Kind::*;
        match self {
            Stream | Close | Keepalive | ConnReject => 8,
            TagEager | RndvAts | SyncAck | ConnReq | ConnAccept | Wireup | RndvSplitDone => 16,
            RndvSplit => 40,
            TagEagerSync | RndvData => 24,
            RndvRtr | AmRts => 32,
            Am => 8,
            TagRts => 32,
            RmaAck | GetResp => 24,
            FlushReq | FlushAck => 16,
            Put => 40,
            GetReq => 48,
            Atomic => 56,
            PutSignal => 72,
            PutBegin => 64,
        }
    }

    /// The most payload bytes one frame of this kind carries on a link whose largest frame
    /// is `max_frame` (at least 1): the piece size of operations split into such frames.
    pub const fn payload_max(self, max_frame: usize) -> usize {
        let n = max_frame.saturating_sub(self.header_len());
        if n == 0 { 1 } else { n }
    }
}

/// Flags byte.
pub mod flags {
    /// Active message: the receiver may reply on the endpoint it arrived on.
    pub const AM_REPLY: u8 = 1 << 0;
    /// Rendezvous: the sender asked for a synchronous send.
    pub const SYNC: u8 = 1 << 1;
    /// Rendezvous offers (`TagRts`, `AmRts`, `RndvSplit`): a packed remote key follows the
    /// segment list, naming the shared segment that holds every segment.
    pub const SHARED: u8 = 1 << 2;
    /// `PutBegin`: the operation is a put-with-signal, whose signal the frame names.
    pub const SIGNAL: u8 = 1 << 3;
}

/// Why a frame was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its kind's fixed header.
    #[error("truncated {kind:?} frame: {len} bytes, need {need}")]
    Truncated {
        /// Kind.
        kind: Kind,
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Empty frame.
    #[error("empty frame")]
    Empty,
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A length or count field that does not fit the frame.
    #[error("{0}")]
    BadField(&'static str),
}

fn u64_at(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8], f: Field) -> u16 {
    u16::from_le_bytes([b[f.start], b[f.start + 1]])
}

/// A parsed frame: fixed fields decoded, payload borrowed. Field meanings are those of
/// the matching [`Kind`].
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// See [`Kind::TagEager`].
    TagEager { tag: u64, data: &'a [u8] },
    /// See [`Kind::TagEagerSync`].
    TagEagerSync { tag: u64, sreq: u64, data: &'a [u8] },
    /// See [`Kind::TagRts`].
    TagRts {
        tag: u64,
        sreq: u64,
        len: u64,
        sync: bool,
        segs: Segments<'a>,
    },
    /// See [`Kind::RndvAts`].
    RndvAts { sreq: u64, status: i32 },
    /// See [`Kind::RndvRtr`].
    RndvRtr { sreq: u64, rreq: u64, len: u64 },
    /// See [`Kind::RndvSplit`].
    RndvSplit {
        sreq: u64,
        rreq: u64,
        offset: u64,
        len: u64,
        segs: Segments<'a>,
    },
    /// See [`Kind::RndvSplitDone`].
    RndvSplitDone { rreq: u64, status: i32 },
    /// See [`Kind::RndvData`].
    RndvData {
        rreq: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// See [`Kind::SyncAck`].
    SyncAck { sreq: u64 },
    /// See [`Kind::Am`].
    Am {
        id: u16,
        reply: bool,
        header: &'a [u8],
        data: &'a [u8],
    },
    /// See [`Kind::AmRts`].
    AmRts {
        id: u16,
        reply: bool,
        sreq: u64,
        len: u64,
        header: &'a [u8],
        segs: Segments<'a>,
    },
    /// See [`Kind::Stream`].
    Stream { data: &'a [u8] },
    /// See [`Kind::Close`].
    Close,
    /// See [`Kind::Keepalive`].
    Keepalive,
    /// See [`Kind::ConnReq`].
    ConnReq { client_id: u64, address: &'a [u8] },
    /// See [`Kind::ConnAccept`].
    ConnAccept { conn_id: u64, address: &'a [u8] },
    /// See [`Kind::ConnReject`].
    ConnReject,
    /// See [`Kind::Wireup`].
    Wireup {
        conn_id: u64,
        purpose: u32,
        address: &'a [u8],
    },
    /// See [`Kind::Put`].
    Put {
        target: RemoteRef,
        req: u64,
        data: &'a [u8],
    },
    /// See [`Kind::RmaAck`].
    RmaAck { req: u64, status: i32, value: u64 },
    /// See [`Kind::GetReq`].
    GetReq {
        target: RemoteRef,
        req: u64,
        len: u64,
    },
    /// See [`Kind::GetResp`].
    GetResp {
        req: u64,
        offset: u64,
        status: i32,
        data: &'a [u8],
    },
    /// See [`Kind::Atomic`].
    Atomic {
        target: RemoteRef,
        req: u64,
        op: u16,
        bits32: bool,
        operand: u64,
        compare: u64,
    },
    /// See [`Kind::FlushReq`].
    FlushReq { req: u64 },
    /// See [`Kind::FlushAck`].
    FlushAck { req: u64 },
    /// See [`Kind::PutSignal`].
    PutSignal {
        target: RemoteRef,
        req: u64,
        signal: RemoteRef,
        op: u16,
        value: u64,
        data: &'a [u8],
    },
    /// See [`Kind::PutBegin`].
    PutBegin {
        target: RemoteRef,
        len: u64,
        /// The signal word and op of a put-with-signal.
        signal: Option<(RemoteRef, u16)>,
    },
}

/// A remote location as a frame names it: region, secret, address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRef {
    /// Region id.
    pub region: u64,
    /// Region secret.
    pub secret: u64,
    /// Address in the target process.
    pub addr: u64,
}

/// A list of (address, length) segments, validated to fit, iterated lazily.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segments<'a> {
    raw: &'a [u8],
    key: Option<&'a [u8]>,
}

/// Bytes per encoded segment.
pub const SEG_LEN: usize = 16;

impl<'a> Segments<'a> {
    fn new(
        raw: &'a [u8],
        count: usize,
        total: u64,
        shared: bool,
    ) -> Result<Segments<'a>, WireError> {
        let need = count
            .checked_mul(SEG_LEN)
            .ok_or(WireError::BadField("segment count overflows"))?;
        // The key after the segments: a region's, or a device region's with its IPC trailer.
        let (raw, key) = if shared {
            let keylen = raw.len().saturating_sub(need);
            if keylen != super::rkey::LEN && keylen != super::rkey::LEN + super::rkey::IPC_LEN {
                return Err(WireError::BadField(
                    "offer flagged shared has no room for its segment key",
                ));
            }
            (&raw[..need], Some(&raw[need..]))
        } else {
            (raw, None)
        };
        if raw.len() != need {
            return Err(WireError::BadField(
                "segment list length does not match its count",
            ));
        }
        let s = Segments { raw, key };
        let mut sum: u64 = 0;
        for (_, len) in s.iter() {
            sum = sum
                .checked_add(len)
                .ok_or(WireError::BadField("segment lengths overflow"))?;
        }
        if count > 0 && sum != total {
            return Err(WireError::BadField(
                "segment lengths do not add up to the message length",
            ));
        }
        Ok(s)
    }

    /// The packed key of the shared segment holding every segment, if the sender gave one.
    pub fn shared_key(&self) -> Option<&'a [u8]> {
        self.key
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.raw.len() / SEG_LEN
    }

    /// Whether there are none (the sender offers no single-copy read).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// (address, length) pairs.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.raw
            .chunks_exact(SEG_LEN)
            .map(|c| (u64_at(c, 0..8), u64_at(c, 8..16)))
    }
}

/// Encode segments into `out`.
pub fn emit_segments(out: &mut Vec<u8>, segs: impl Iterator<Item = (u64, u64)>) {
    for (a, l) in segs {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
}

impl<'a> Frame<'a> {
    /// The tag and payload of `b` if it is a whole eager tag frame: the receive fast path's
    /// test, agreeing with `parse` on such frames, and cheaper than building a `Frame`.
    #[inline]
    pub fn as_tag_eager(b: &'a [u8]) -> Option<(u64, &'a [u8])> {
        let need = Kind::TagEager.header_len();
        if b.len() < need || b[field::KIND] != Kind::TagEager as u8 {
            return None;
        }
        Some((u64_at(b, field::W1), &b[need..]))
    }

    /// The handler id, reply flag, user header and data of `b` if it is a whole eager
    /// active-message frame: the receive fast path's test, agreeing with `parse` on such
    /// frames (and `None` for a malformed one, which `parse` then reports).
    #[inline]
    pub fn as_am(b: &'a [u8]) -> Option<(u16, bool, &'a [u8], &'a [u8])> {
        let need = Kind::Am.header_len();
        if b.len() < need || b[field::KIND] != Kind::Am as u8 {
            return None;
        }
        let rest = &b[need..];
        let hlen = u32_at(b, field::AUX32) as usize;
        if hlen > rest.len() {
            return None;
        }
        let reply = b[field::FLAGS] & flags::AM_REPLY != 0;
        Some((u16_at(b, field::AUX16), reply, &rest[..hlen], &rest[hlen..]))
    }

    /// Parse a whole frame. Never panics; every length is checked.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let kb = *b.first().ok_or(WireError::Empty)?;
        let kind = Kind::from_u8(kb).ok_or(WireError::UnknownKind(kb))?;
        let need = kind.header_len();
        if b.len() < need {
            return Err(WireError::Truncated {
                kind,
                len: b.len(),
                need,
            });
        }
        let fl = b[field::FLAGS];
        let rest = &b[need..];
        Ok(match kind {
            Kind::TagEager => Frame::TagEager {
                tag: u64_at(b, field::W1),
                data: rest,
            },
            Kind::TagEagerSync => Frame::TagEagerSync {
                tag: u64_at(b, field::W1),
                sreq: u64_at(b, field::W2),
                data: rest,
            },
            Kind::TagRts => {
                let len = u64_at(b, field::W3);
                let count = u32_at(b, field::AUX32) as usize;
                Frame::TagRts {
                    tag: u64_at(b, field::W1),
                    sreq: u64_at(b, field::W2),
                    len,
                    sync: fl & flags::SYNC != 0,
                    segs: Segments::new(rest, count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::RndvAts => Frame::RndvAts {
                sreq: u64_at(b, field::W1),
                status: u32_at(b, field::AUX32) as i32,
            },
            Kind::RndvRtr => Frame::RndvRtr {
                sreq: u64_at(b, field::W1),
                rreq: u64_at(b, field::W2),
                len: u64_at(b, field::W3),
            },
            Kind::RndvSplit => {
                let len = u64_at(b, field::W4);
                let count = u32_at(b, field::AUX32) as usize;
                Frame::RndvSplit {
                    sreq: u64_at(b, field::W1),
                    rreq: u64_at(b, field::W2),
                    offset: u64_at(b, field::W3),
                    len,
                    segs: Segments::new(rest, count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::RndvSplitDone => Frame::RndvSplitDone {
                rreq: u64_at(b, field::W1),
                status: u32_at(b, field::AUX32) as i32,
            },
            Kind::RndvData => Frame::RndvData {
                rreq: u64_at(b, field::W1),
                offset: u64_at(b, field::W2),
                data: rest,
            },
            Kind::SyncAck => Frame::SyncAck {
                sreq: u64_at(b, field::W1),
            },
            Kind::Am => {
                let hlen = u32_at(b, field::AUX32) as usize;
                if hlen > rest.len() {
                    return Err(WireError::BadField(
                        "active-message header longer than the frame",
                    ));
                }
                Frame::Am {
                    id: u16_at(b, field::AUX16),
                    reply: fl & flags::AM_REPLY != 0,
                    header: &rest[..hlen],
                    data: &rest[hlen..],
                }
            }
            Kind::AmRts => {
                let hlen = u32_at(b, field::AUX32) as usize;
                if hlen > rest.len() {
                    return Err(WireError::BadField(
                        "active-message header longer than the frame",
                    ));
                }
                let len = u64_at(b, field::W2);
                let count = usize::try_from(u64_at(b, field::W3))
                    .map_err(|_| WireError::BadField("segment count too large"))?;
                Frame::AmRts {
                    id: u16_at(b, field::AUX16),
                    reply: fl & flags::AM_REPLY != 0,
                    sreq: u64_at(b, field::W1),
                    len,
                    header: &rest[..hlen],
                    segs: Segments::new(&rest[hlen..], count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::Stream => Frame::Stream { data: rest },
            Kind::Close => Frame::Close,
            Kind::Keepalive => Frame::Keepalive,
            Kind::ConnReq => Frame::ConnReq {
                client_id: u64_at(b, field::W1),
                address: rest,
            },
            Kind::ConnAccept => Frame::ConnAccept {
                conn_id: u64_at(b, field::W1),
                address: rest,
            },
            Kind::ConnReject => Frame::ConnReject,
            Kind::Wireup => Frame::Wireup {
                conn_id: u64_at(b, field::W1),
                purpose: u32_at(b, field::AUX32),
                address: rest,
            },
            Kind::Put => Frame::Put {
                target: rref(b, field::W1, field::W2, field::W3),
                req: u64_at(b, field::W4),
                data: rest,
            },
            Kind::RmaAck => Frame::RmaAck {
                req: u64_at(b, field::W1),
                status: u32_at(b, field::AUX32) as i32,
                value: u64_at(b, field::W2),
            },
            Kind::GetReq => Frame::GetReq {
                target: rref(b, field::W1, field::W2, field::W3),
                req: u64_at(b, field::W4),
                len: u64_at(b, field::W5),
            },
            Kind::GetResp => Frame::GetResp {
                req: u64_at(b, field::W1),
                offset: u64_at(b, field::W2),
                status: u32_at(b, field::AUX32) as i32,
                data: rest,
            },
            Kind::Atomic => Frame::Atomic {
                target: rref(b, field::W1, field::W2, field::W3),
                req: u64_at(b, field::W4),
                op: u16_at(b, field::AUX16),
                bits32: fl & 1 != 0,
                operand: u64_at(b, field::W5),
                compare: u64_at(b, field::W6),
            },
            Kind::FlushReq => Frame::FlushReq {
                req: u64_at(b, field::W1),
            },
            Kind::FlushAck => Frame::FlushAck {
                req: u64_at(b, field::W1),
            },
            Kind::PutSignal => Frame::PutSignal {
                target: rref(b, field::W1, field::W2, field::W3),
                req: u64_at(b, field::W4),
                signal: rref(b, field::W5, field::W6, field::W7),
                op: u16_at(b, field::AUX16),
                value: u64_at(b, field::W8),
                data: rest,
            },
            Kind::PutBegin => Frame::PutBegin {
                target: rref(b, field::W1, field::W2, field::W3),
                len: u64_at(b, field::W4),
                signal: (fl & flags::SIGNAL != 0).then(|| {
                    (
                        rref(b, field::W5, field::W6, field::W7),
                        u16_at(b, field::AUX16),
                    )
                }),
            },
        })
    }
}

fn rref(b: &[u8], r: Field, s: Field, a: Field) -> RemoteRef {
    RemoteRef {
        region: u64_at(b, r),
        secret: u64_at(b, s),
        addr: u64_at(b, a),
    }
}

/// A fixed header being built; `as_bytes` gives exactly the kind's header length.
#[derive(Clone, Copy)]
pub struct Header {
    buf: [u8; 72],
    len: usize,
}

impl Header {
    /// A header of `kind` with zeroed fields.
    #[inline]
    pub fn new(kind: Kind) -> Header {
        let mut buf = [0u8; 72];
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
        self.buf[field::AUX16].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Set aux32.
    #[inline]
    pub fn aux32(mut self, v: u32) -> Self {
        self.buf[field::AUX32].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// Set 64-bit word `n` (1-based, as in the field map).
    #[inline]
    pub fn word(mut self, n: usize, v: u64) -> Self {
        let start = 8 * n;
        self.buf[start..start + 8].copy_from_slice(&v.to_le_bytes());
        self
    }
    /// The header bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(h: Header, payload: &[u8]) -> Vec<u8> {
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn round_trips() {
        let b = frame(Header::new(Kind::TagEager).word(1, 0xdead_beef), b"hello");
        assert_eq!(
            Frame::parse(&b).unwrap(),
            Frame::TagEager {
                tag: 0xdead_beef,
                data: b"hello"
            }
        );

        let b = frame(
            Header::new(Kind::Am)
                .aux16(7)
                .aux32(3)
                .flags(flags::AM_REPLY),
            b"hdrdata",
        );
        assert_eq!(
            Frame::parse(&b).unwrap(),
            Frame::Am {
                id: 7,
                reply: true,
                header: b"hdr",
                data: b"data"
            }
        );

        let mut segs = Vec::new();
        emit_segments(&mut segs, [(0x1000u64, 10u64), (0x2000, 6)].into_iter());
        let b = frame(
            Header::new(Kind::TagRts)
                .word(1, 5)
                .word(2, 9)
                .word(3, 16)
                .aux32(2)
                .flags(flags::SYNC),
            &segs,
        );
        match Frame::parse(&b).unwrap() {
            Frame::TagRts {
                tag: 5,
                sreq: 9,
                len: 16,
                sync: true,
                segs,
            } => {
                assert_eq!(
                    segs.iter().collect::<Vec<_>>(),
                    vec![(0x1000, 10), (0x2000, 6)]
                );
            }
            f => panic!("{f:?}"),
        }

        let t = RemoteRef {
            region: 0x1001,
            secret: 77,
            addr: 0x4000,
        };
        let put = Header::new(Kind::PutBegin)
            .word(1, t.region)
            .word(2, t.secret)
            .word(3, t.addr)
            .word(4, 1 << 30);
        assert_eq!(
            Frame::parse(put.as_bytes()).unwrap(),
            Frame::PutBegin {
                target: t,
                len: 1 << 30,
                signal: None
            }
        );
        let s = RemoteRef {
            region: 0x2002,
            secret: 5,
            addr: 0x8008,
        };
        let b = put
            .flags(flags::SIGNAL)
            .aux16(1)
            .word(5, s.region)
            .word(6, s.secret)
            .word(7, s.addr);
        assert_eq!(
            Frame::parse(b.as_bytes()).unwrap(),
            Frame::PutBegin {
                target: t,
                len: 1 << 30,
                signal: Some((s, 1))
            }
        );
    }

    #[test]
    fn rejects_lies() {
        assert_eq!(Frame::parse(&[]), Err(WireError::Empty));
        assert_eq!(Frame::parse(&[200]), Err(WireError::UnknownKind(200)));
        assert!(matches!(
            Frame::parse(&[1, 0, 0]),
            Err(WireError::Truncated { .. })
        ));
        // Header length beyond the frame.
        let b = frame(Header::new(Kind::Am).aux32(100), b"abc");
        assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
        // Segment count that does not match.
        let b = frame(Header::new(Kind::TagRts).word(3, 16).aux32(5), &[0u8; 16]);
        assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
        // Segments that do not add up.
        let mut segs = Vec::new();
        emit_segments(&mut segs, [(0u64, 3u64)].into_iter());
        let b = frame(Header::new(Kind::TagRts).word(3, 16).aux32(1), &segs);
        assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
        // Overflowing segment lengths.
        let mut segs = Vec::new();
        emit_segments(&mut segs, [(0u64, u64::MAX), (0, 2)].into_iter());
        let b = frame(Header::new(Kind::TagRts).word(3, 1).aux32(2), &segs);
        assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
        // An offer flagged shared with no room for its key.
        let mut segs = Vec::new();
        emit_segments(&mut segs, [(64u64, 16u64)].into_iter());
        let shared = Header::new(Kind::TagRts)
            .word(3, 16)
            .aux32(1)
            .flags(flags::SHARED);
        assert!(matches!(
            Frame::parse(&frame(shared, &segs)),
            Err(WireError::BadField(_))
        ));
    }

    #[test]
    fn shared_offers_carry_their_key_after_the_segments() {
        let key: Vec<u8> = (0..crate::wire::rkey::LEN as u8).collect();
        let mut extra = Vec::new();
        emit_segments(&mut extra, [(64u64, 10u64), (4096, 6)].into_iter());
        extra.extend_from_slice(&key);
        let h = Header::new(Kind::RndvSplit)
            .word(1, 1)
            .word(2, 2)
            .word(3, 0)
            .word(4, 16)
            .aux32(2)
            .flags(flags::SHARED);
        match Frame::parse(&frame(h, &extra)).unwrap() {
            Frame::RndvSplit { segs, len, .. } => {
                assert_eq!(len, 16);
                assert_eq!(segs.iter().collect::<Vec<_>>(), [(64, 10), (4096, 6)]);
                assert_eq!(segs.shared_key(), Some(&key[..]));
            }
            f => panic!("{f:?}"),
        }
        // Unflagged, the same bytes are a segment list of the wrong length.
        let h = Header::new(Kind::RndvSplit).word(4, 16).aux32(2);
        assert!(matches!(
            Frame::parse(&frame(h, &extra)),
            Err(WireError::BadField(_))
        ));
        // An active-message offer: header, segments, key.
        let mut extra = b"hd".to_vec();
        emit_segments(&mut extra, [(8u64, 5u64)].into_iter());
        extra.extend_from_slice(&key);
        let h = Header::new(Kind::AmRts)
            .aux32(2)
            .word(2, 5)
            .word(3, 1)
            .flags(flags::SHARED);
        match Frame::parse(&frame(h, &extra)).unwrap() {
            Frame::AmRts { header, segs, .. } => {
                assert_eq!(header, b"hd");
                assert_eq!(segs.len(), 1);
                assert_eq!(segs.shared_key(), Some(&key[..]));
            }
            f => panic!("{f:?}"),
        }
        // A device region's key carries its IPC trailer; a key of any other length is refused.
        let dkey: Vec<u8> =
            (0..(crate::wire::rkey::LEN + crate::wire::rkey::IPC_LEN) as u8).collect();
        for (k, ok) in [
            (&dkey[..], true),
            (&dkey[..crate::wire::rkey::LEN + 1], false),
        ] {
            let mut extra = Vec::new();
            emit_segments(&mut extra, [(1u64 << 40, 70_000u64)].into_iter());
            extra.extend_from_slice(k);
            let h = Header::new(Kind::TagRts)
                .word(3, 70_000)
                .aux32(1)
                .flags(flags::SHARED);
            match Frame::parse(&frame(h, &extra)) {
                Ok(Frame::TagRts { segs, .. }) if ok => assert_eq!(segs.shared_key(), Some(k)),
                Err(WireError::BadField(_)) if !ok => {}
                other => panic!("key of {} bytes: {other:?}", k.len()),
            }
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Frame::parse(&b);
        }

        #[test]
        fn fast_readers_agree_with_parse(k in prop::sample::select(vec![1u8, 2, 8, 9, 20]),
                                         rest in proptest::collection::vec(any::<u8>(), 0..96)) {
            let mut b = vec![k];
            b.extend(rest);
            match Frame::parse(&b) {
                Ok(Frame::TagEager { tag, data }) => {
                    prop_assert_eq!(Frame::as_tag_eager(&b), Some((tag, data)));
                }
                _ => prop_assert_eq!(Frame::as_tag_eager(&b), None),
            }
            match Frame::parse(&b) {
                Ok(Frame::Am { id, reply, header, data }) => {
                    prop_assert_eq!(Frame::as_am(&b), Some((id, reply, header, data)));
                }
                _ => prop_assert_eq!(Frame::as_am(&b), None),
            }
        }

        #[test]
        fn parse_never_panics_on_known_kinds(k in prop::sample::select(vec![1u8,2,3,4,5,6,7,8,9,10,11,12,20,21,22,23,30,31,32,33,34,35,36,37,38]),
                                             rest in proptest::collection::vec(any::<u8>(), 0..96)) {
            let mut b = vec![k];
            b.extend(rest);
            let _ = Frame::parse(&b);
        }
    }
}
