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
//! All integers are little-endian. The frame length is carried by the transport. Each kind
//! has its field map in [`field`] (`field::put::REQ` is a put's request id), its fixed
//! header length in [`Kind::header_len`], a typed constructor of its header in [`Header`]
//! (`Header::put`), and its decoded form in [`Frame`].

use std::ops::Range;

mod header;
pub use header::{Header, MAX_HEADER_LEN, am_word, tag_eager_words};

/// A field: a byte range of the header.
pub type Field = Range<usize>;

/// Field maps: the header fields every frame has, then each kind's own.
pub mod field {
    use super::Field;

    /// The frame's kind (`Kind` as a byte).
    pub const KIND: usize = 0;
    /// The flags byte (`flags`).
    pub const FLAGS: usize = 1;
    /// A 16-bit field whose meaning is the kind's.
    pub const AUX16: Field = 2..4;
    /// A 32-bit field whose meaning is the kind's.
    pub const AUX32: Field = 4..8;

    /// The `n`th 64-bit word after the common fields (1-based).
    pub(crate) const fn word(n: usize) -> Field {
        8 * n..8 * n + 8
    }

    /// Where a frame names a remote location (region, 128-bit secret, address): four
    /// words.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct RefFields {
        /// The region's id.
        pub region: Field,
        /// The region's secret: 16 bytes, one little-endian 128-bit integer.
        pub secret: Field,
        /// The address in the target's process.
        pub addr: Field,
    }

    /// Words a remote location takes.
    pub const REF_WORDS: usize = 4;

    /// A remote location in words `n` (region), `n + 1` and `n + 2` (secret), `n + 3`
    /// (address).
    const fn at(n: usize) -> RefFields {
        RefFields {
            region: word(n),
            secret: 8 * (n + 1)..8 * (n + 3),
            addr: word(n + 3),
        }
    }

    /// `Kind::TagEager`.
    pub mod tag_eager {
        use super::{Field, word};
        /// The message's tag.
        pub const TAG: Field = word(1);
    }
    /// `Kind::TagEagerSync`.
    pub mod tag_eager_sync {
        use super::{Field, word};
        /// The message's tag.
        pub const TAG: Field = word(1);
        /// The sender's request, named by the `SyncAck`.
        pub const SREQ: Field = word(2);
    }
    /// `Kind::TagRts`; flags `SYNC`, `SHARED`.
    pub mod tag_rts {
        use super::{AUX32, Field, word};
        /// The message's tag.
        pub const TAG: Field = word(1);
        /// The sender's request.
        pub const SREQ: Field = word(2);
        /// The message's length.
        pub const LEN: Field = word(3);
        /// Segments in the payload.
        pub const COUNT: Field = AUX32;
    }
    /// `Kind::RndvAts`.
    pub mod rndv_ats {
        use super::{AUX32, Field, word};
        /// The sender's request.
        pub const SREQ: Field = word(1);
        /// 0, or the status (i32) of why the receiver could not read the message.
        pub const STATUS: Field = AUX32;
    }
    /// `Kind::RndvRtr`.
    pub mod rndv_rtr {
        use super::{Field, word};
        /// The sender's request.
        pub const SREQ: Field = word(1);
        /// The receiver's request, which the data frames name.
        pub const RREQ: Field = word(2);
        /// Bytes wanted.
        pub const LEN: Field = word(3);
    }
    /// `Kind::RndvData`.
    pub mod rndv_data {
        use super::{Field, word};
        /// The receiver's request.
        pub const RREQ: Field = word(1);
        /// Where the payload goes in the message.
        pub const OFFSET: Field = word(2);
    }
    /// `Kind::SyncAck`.
    pub mod sync_ack {
        use super::{Field, word};
        /// The sender's request.
        pub const SREQ: Field = word(1);
    }
    /// `Kind::RndvSplit`; flag `SHARED`.
    pub mod rndv_split {
        use super::{AUX32, Field, word};
        /// The sender's request.
        pub const SREQ: Field = word(1);
        /// The receiver's request.
        pub const RREQ: Field = word(2);
        /// Where the sender's part starts in the message.
        pub const OFFSET: Field = word(3);
        /// The sender's part's length.
        pub const LEN: Field = word(4);
        /// Segments in the payload.
        pub const COUNT: Field = AUX32;
    }
    /// `Kind::RndvSplitDone`.
    pub mod rndv_split_done {
        use super::{AUX32, Field, word};
        /// The receiver's request.
        pub const RREQ: Field = word(1);
        /// 0 (written) or the status (i32) of why not.
        pub const STATUS: Field = AUX32;
    }
    /// `Kind::Am`; flag `AM_REPLY`.
    pub mod am {
        use super::{AUX16, AUX32, Field};
        /// The handler id.
        pub const ID: Field = AUX16;
        /// The user header's length (it starts the payload; the data follows).
        pub const HEADER_LEN: Field = AUX32;
    }
    /// `Kind::AmRts`; flags `AM_REPLY`, `SHARED`.
    pub mod am_rts {
        use super::{AUX16, AUX32, Field, word};
        /// The handler id.
        pub const ID: Field = AUX16;
        /// The user header's length (it starts the payload; the segments follow).
        pub const HEADER_LEN: Field = AUX32;
        /// The sender's request.
        pub const SREQ: Field = word(1);
        /// The data's length.
        pub const LEN: Field = word(2);
        /// Segments in the payload.
        pub const COUNT: Field = word(3);
    }
    /// `Kind::ConnReq`.
    pub mod conn_req {
        use super::{Field, word};
        /// The id the client chose.
        pub const CLIENT_ID: Field = word(1);
    }
    /// `Kind::ConnAccept`.
    pub mod conn_accept {
        use super::{Field, word};
        /// The connection's id.
        pub const CONN_ID: Field = word(1);
    }
    /// `Kind::Wireup`.
    pub mod wireup {
        use super::{AUX32, Field, word};
        /// The connection's id.
        pub const CONN_ID: Field = word(1);
        /// Why: a new connection, an upgrade, or no upgrade.
        pub const PURPOSE: Field = AUX32;
    }
    /// `Kind::Put`.
    pub mod put {
        use super::{Field, RefFields, at, word};
        /// Where the data goes (words 1-4).
        pub const TARGET: RefFields = at(1);
        /// The origin's request (0: unacknowledged).
        pub const REQ: Field = word(5);
    }
    /// `Kind::RmaAck`.
    pub mod rma_ack {
        use super::{AUX32, Field, word};
        /// The origin's request (0: an unacknowledged operation's refusal).
        pub const REQ: Field = word(1);
        /// 0 or the status (i32) of the refusal.
        pub const STATUS: Field = AUX32;
        /// A fetching atomic's old value; in a refusal of an unacknowledged operation, the
        /// kind of the frame refused.
        pub const VALUE: Field = word(2);
    }
    /// `Kind::GetReq`.
    pub mod get_req {
        use super::{Field, RefFields, at, word};
        /// Where the data is (words 1-4).
        pub const TARGET: RefFields = at(1);
        /// The origin's request.
        pub const REQ: Field = word(5);
        /// Bytes wanted.
        pub const LEN: Field = word(6);
    }
    /// `Kind::GetResp`.
    pub mod get_resp {
        use super::{AUX32, Field, word};
        /// The origin's request.
        pub const REQ: Field = word(1);
        /// Where the payload goes in the get's buffer.
        pub const OFFSET: Field = word(2);
        /// 0 or the status (i32) of the refusal.
        pub const STATUS: Field = AUX32;
    }
    /// `Kind::Atomic`; flag `BITS32`.
    pub mod atomic {
        use super::{AUX16, Field, RefFields, at, word};
        /// The operation.
        pub const OP: Field = AUX16;
        /// The word (words 1-4).
        pub const TARGET: RefFields = at(1);
        /// The origin's request (0: a posted atomic).
        pub const REQ: Field = word(5);
        /// The operand.
        pub const OPERAND: Field = word(6);
        /// The compare value (`Cswap`).
        pub const COMPARE: Field = word(7);
    }
    /// `Kind::PutSignal`.
    pub mod put_signal {
        use super::{AUX16, Field, RefFields, at, word};
        /// The signal update.
        pub const OP: Field = AUX16;
        /// Where the data goes (words 1-4).
        pub const TARGET: RefFields = at(1);
        /// The origin's request (0: unacknowledged).
        pub const REQ: Field = word(5);
        /// The signal word (words 6-9).
        pub const SIGNAL: RefFields = at(6);
        /// The signal value.
        pub const VALUE: Field = word(10);
    }
    /// `Kind::FlushReq`.
    pub mod flush_req {
        use super::{Field, word};
        /// The origin's request.
        pub const REQ: Field = word(1);
    }
    /// `Kind::FlushAck`.
    pub mod flush_ack {
        use super::{Field, word};
        /// The origin's request.
        pub const REQ: Field = word(1);
    }
    /// `Kind::PutBegin`; flag `SIGNAL`.
    pub mod put_begin {
        use super::{AUX16, Field, RefFields, at, word};
        /// Where the data goes (words 1-4).
        pub const TARGET: RefFields = at(1);
        /// The whole operation's data length.
        pub const LEN: Field = word(5);
        /// With `SIGNAL`: the signal word (words 6-9).
        pub const SIGNAL: RefFields = at(6);
        /// With `SIGNAL`: the signal update.
        pub const OP: Field = AUX16;
    }
}

/// Protocol version carried in wireup frames.
pub const VERSION: u8 = 1;

/// Frame kinds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Eager tag message (`field::tag_eager`); payload data.
    TagEager = 1,
    /// Eager synchronous tag message (`field::tag_eager_sync`); payload data.
    TagEagerSync = 2,
    /// Rendezvous request to send (`field::tag_rts`); payload: segments as (address u64,
    /// length u64) for single-copy reads.
    TagRts = 3,
    /// Rendezvous done by the receiver, which read the data itself (`field::rndv_ats`).
    RndvAts = 4,
    /// Ready to receive: the sender must push the data (`field::rndv_rtr`).
    RndvRtr = 5,
    /// Rendezvous data (`field::rndv_data`); payload a chunk.
    RndvData = 6,
    /// Synchronous send matched (`field::sync_ack`).
    SyncAck = 7,
    /// Split rendezvous (the receiver copies the first part itself): the sender is asked to
    /// write bytes `[OFFSET, OFFSET + LEN)` of its message into the receiver's memory
    /// (`field::rndv_split`); payload: the receiver's segments as (address u64, length u64).
    RndvSplit = 13,
    /// Answer to `RndvSplit` (`field::rndv_split_done`).
    RndvSplitDone = 14,
    /// Active message (`field::am`); payload user header, then data.
    Am = 8,
    /// Active message by rendezvous (`field::am_rts`); payload user header, then segments.
    AmRts = 9,
    /// Stream bytes: payload.
    Stream = 10,
    /// The peer closes its endpoint gracefully.
    Close = 11,
    /// Liveness: with `flags::PING`, a question the peer answers with a `Keepalive`
    /// without it, from its progress (so that a peer that is alive but no longer
    /// progresses is told from one that is slow).
    Keepalive = 12,
    /// Connection request through a listener (`field::conn_req`); payload the client's
    /// worker address.
    ConnReq = 20,
    /// Connection accepted (`field::conn_accept`); payload the server's worker address.
    ConnAccept = 21,
    /// Connection rejected.
    ConnReject = 22,
    /// Endpoint wireup by worker address (`field::wireup`); payload the initiator's worker
    /// address.
    Wireup = 23,
    /// Remote write (`field::put`); payload data.
    Put = 30,
    /// Result of a remote operation (`field::rma_ack`). An unacknowledged operation (request
    /// 0: puts, posted atomics) is answered only when refused, with request 0 and the kind
    /// of the refused frame as the value.
    RmaAck = 31,
    /// Remote read request (`field::get_req`).
    GetReq = 32,
    /// Remote read data (`field::get_resp`); payload data.
    GetResp = 33,
    /// Remote atomic (`field::atomic`; `flags::BITS32` for a 32-bit word); request 0 is a
    /// posted atomic, answered only if refused.
    Atomic = 34,
    /// Put with signal (`field::put_signal`); payload data. The target writes the data,
    /// then updates the signal (release order).
    PutSignal = 35,
    /// Remote completion (`field::flush_req`). The target answers `FlushAck` after every
    /// earlier operation on this link has been carried out.
    FlushReq = 36,
    /// Answer to `FlushReq` (`field::flush_ack`).
    FlushAck = 37,
    /// The first frame of a put or put-with-signal whose data takes more than one frame
    /// (`field::put_begin`). The target checks the whole operation before any of its data;
    /// if it refuses it, it answers the refusal once (as for an unacknowledged put) and
    /// drops the next `LEN` bytes of put data on the link (the operation's `Put` frames and
    /// closing `PutSignal`) unwritten.
    PutBegin = 38,
}

impl Kind {
    /// The kind a frame's first byte names, if any.
    pub fn from_byte(b: u8) -> Option<Kind> {
        Self::from_u8(b)
    }

    /// Whether what follows this kind's fixed header is opaque to the protocol (message or
    /// put data, an active message's user header and data, or nothing it reads) rather
    /// than fields it parses (segment lists, keys, worker addresses). The receive path
    /// copies a structured rest out of shared memory before parsing it
    /// (`transport::RawFrame::split`); an opaque one is only ever copied once, whole.
    pub const fn rest_is_opaque(self) -> bool {
        use Kind::*;
        !matches!(
            self,
            TagRts | RndvSplit | AmRts | ConnReq | ConnAccept | Wireup
        )
    }

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
            Put => 48,
            GetReq => 56,
            Atomic => 64,
            PutSignal => 88,
            PutBegin => 80,
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
    /// `Atomic`: the word is 32 bits wide (else 64).
    pub const BITS32: u8 = 1 << 0;
    /// `Keepalive`: a question, to be answered with a `Keepalive` without this flag.
    pub const PING: u8 = 1 << 0;
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
    /// See [`Kind::Keepalive`]: `ping` asks for an answer.
    Keepalive { ping: bool },
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
    /// Region secret (128 bits).
    pub secret: super::rkey::Secret,
    /// Address in the target process.
    pub addr: u64,
}

/// A list of (address, length) segments, validated to fit, iterated lazily.
///
/// The receive path gives the parser a private copy of a shared-memory frame's segment
/// list (`transport::RawFrame::split`); what the protocol acts on still comes from one
/// reading of the list, checked again (`read_once`), so that a parser handed bytes in
/// place would not act on a list changed after its check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segments<'a> {
    raw: &'a [u8],
    key: Option<&'a [u8]>,
    total: u64,
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
        let s = Segments { raw, key, total };
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

    /// The (address, length) pairs, each read once and checked again as `parse` checked
    /// them (lengths add up to the message length without overflow): a peer that rewrote
    /// the list in shared memory after `parse` is caught here, not believed.
    pub fn read_once<C: FromIterator<(u64, u64)>>(&self) -> Result<C, WireError> {
        let mut sum = Some(0u64);
        let segs: C = self
            .iter()
            .inspect(|&(_, len)| sum = sum.and_then(|s| s.checked_add(len)))
            .collect();
        if !self.is_empty() && sum != Some(self.total) {
            return Err(WireError::BadField(
                "segment list changed after it was checked",
            ));
        }
        Ok(segs)
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
        if b.len() < need {
            return None;
        }
        Self::as_tag_eager_parts(&b[..need], &b[need..])
    }

    /// `as_tag_eager` of a frame given as header and rest, as `parse_parts` takes it.
    #[inline(always)]
    pub fn as_tag_eager_parts(h: &'a [u8], rest: &'a [u8]) -> Option<(u64, &'a [u8])> {
        let need = Kind::TagEager.header_len();
        if h.len() < need || h[field::KIND] != Kind::TagEager as u8 {
            return None;
        }
        Some((u64_at(h, field::tag_eager::TAG), rest))
    }

    /// The handler id, reply flag, user header and data of `b` if it is a whole eager
    /// active-message frame: the receive fast path's test, agreeing with `parse` on such
    /// frames (and `None` for a malformed one, which `parse` then reports).
    #[inline]
    pub fn as_am(b: &'a [u8]) -> Option<(u16, bool, &'a [u8], &'a [u8])> {
        let need = Kind::Am.header_len();
        if b.len() < need {
            return None;
        }
        Self::as_am_parts(&b[..need], &b[need..])
    }

    /// `as_am` of a frame given as header and rest, as `parse_parts` takes it.
    #[inline]
    pub fn as_am_parts(h: &'a [u8], rest: &'a [u8]) -> Option<(u16, bool, &'a [u8], &'a [u8])> {
        let need = Kind::Am.header_len();
        if h.len() < need || h[field::KIND] != Kind::Am as u8 {
            return None;
        }
        let hlen = u32_at(h, field::am::HEADER_LEN) as usize;
        if hlen > rest.len() {
            return None;
        }
        let reply = h[field::FLAGS] & flags::AM_REPLY != 0;
        Some((
            u16_at(h, field::am::ID),
            reply,
            &rest[..hlen],
            &rest[hlen..],
        ))
    }

    /// Parse a whole frame. Never panics; every length is checked.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let need = b
            .first()
            .and_then(|&k| Kind::from_u8(k))
            .map_or(0, |k| k.header_len().min(b.len()));
        let (head, rest) = b.split_at(need.max(b.len().min(1)));
        Self::parse_parts(head, rest)
    }

    /// Parse a frame given as its kind's fixed header `b` (bytes after it in `b` are
    /// ignored) and the `rest` that follows it: the header may be a private copy of the
    /// frame's first bytes, the rest elsewhere (`transport::RawFrame::split`). Every field
    /// is read from `b`, or from `rest` (segment lists, lengths checked against it);
    /// payload slices are parts of `rest`. A frame shorter than its header is `Truncated`
    /// when `b` is short (and `rest` then empty). Never panics.
    pub fn parse_parts(b: &'a [u8], rest: &'a [u8]) -> Result<Frame<'a>, WireError> {
        let kb = *b.first().ok_or(WireError::Empty)?;
        let kind = Kind::from_u8(kb).ok_or(WireError::UnknownKind(kb))?;
        let need = kind.header_len();
        if b.len() < need {
            return Err(WireError::Truncated {
                kind,
                len: b.len() + rest.len(),
                need,
            });
        }
        let fl = b[field::FLAGS];
        Ok(match kind {
            Kind::TagEager => Frame::TagEager {
                tag: u64_at(b, field::tag_eager::TAG),
                data: rest,
            },
            Kind::TagEagerSync => Frame::TagEagerSync {
                tag: u64_at(b, field::tag_eager_sync::TAG),
                sreq: u64_at(b, field::tag_eager_sync::SREQ),
                data: rest,
            },
            Kind::TagRts => {
                let len = u64_at(b, field::tag_rts::LEN);
                let count = u32_at(b, field::tag_rts::COUNT) as usize;
                Frame::TagRts {
                    tag: u64_at(b, field::tag_rts::TAG),
                    sreq: u64_at(b, field::tag_rts::SREQ),
                    len,
                    sync: fl & flags::SYNC != 0,
                    segs: Segments::new(rest, count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::RndvAts => Frame::RndvAts {
                sreq: u64_at(b, field::rndv_ats::SREQ),
                status: u32_at(b, field::rndv_ats::STATUS) as i32,
            },
            Kind::RndvRtr => Frame::RndvRtr {
                sreq: u64_at(b, field::rndv_rtr::SREQ),
                rreq: u64_at(b, field::rndv_rtr::RREQ),
                len: u64_at(b, field::rndv_rtr::LEN),
            },
            Kind::RndvSplit => {
                let len = u64_at(b, field::rndv_split::LEN);
                let count = u32_at(b, field::rndv_split::COUNT) as usize;
                Frame::RndvSplit {
                    sreq: u64_at(b, field::rndv_split::SREQ),
                    rreq: u64_at(b, field::rndv_split::RREQ),
                    offset: u64_at(b, field::rndv_split::OFFSET),
                    len,
                    segs: Segments::new(rest, count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::RndvSplitDone => Frame::RndvSplitDone {
                rreq: u64_at(b, field::rndv_split_done::RREQ),
                status: u32_at(b, field::rndv_split_done::STATUS) as i32,
            },
            Kind::RndvData => Frame::RndvData {
                rreq: u64_at(b, field::rndv_data::RREQ),
                offset: u64_at(b, field::rndv_data::OFFSET),
                data: rest,
            },
            Kind::SyncAck => Frame::SyncAck {
                sreq: u64_at(b, field::sync_ack::SREQ),
            },
            Kind::Am => {
                let hlen = u32_at(b, field::am::HEADER_LEN) as usize;
                if hlen > rest.len() {
                    return Err(WireError::BadField(
                        "active-message header longer than the frame",
                    ));
                }
                Frame::Am {
                    id: u16_at(b, field::am::ID),
                    reply: fl & flags::AM_REPLY != 0,
                    header: &rest[..hlen],
                    data: &rest[hlen..],
                }
            }
            Kind::AmRts => {
                let hlen = u32_at(b, field::am_rts::HEADER_LEN) as usize;
                if hlen > rest.len() {
                    return Err(WireError::BadField(
                        "active-message header longer than the frame",
                    ));
                }
                let len = u64_at(b, field::am_rts::LEN);
                let count = usize::try_from(u64_at(b, field::am_rts::COUNT))
                    .map_err(|_| WireError::BadField("segment count too large"))?;
                Frame::AmRts {
                    id: u16_at(b, field::am_rts::ID),
                    reply: fl & flags::AM_REPLY != 0,
                    sreq: u64_at(b, field::am_rts::SREQ),
                    len,
                    header: &rest[..hlen],
                    segs: Segments::new(&rest[hlen..], count, len, fl & flags::SHARED != 0)?,
                }
            }
            Kind::Stream => Frame::Stream { data: rest },
            Kind::Close => Frame::Close,
            Kind::Keepalive => Frame::Keepalive {
                ping: fl & flags::PING != 0,
            },
            Kind::ConnReq => Frame::ConnReq {
                client_id: u64_at(b, field::conn_req::CLIENT_ID),
                address: rest,
            },
            Kind::ConnAccept => Frame::ConnAccept {
                conn_id: u64_at(b, field::conn_accept::CONN_ID),
                address: rest,
            },
            Kind::ConnReject => Frame::ConnReject,
            Kind::Wireup => Frame::Wireup {
                conn_id: u64_at(b, field::wireup::CONN_ID),
                purpose: u32_at(b, field::wireup::PURPOSE),
                address: rest,
            },
            Kind::Put => Frame::Put {
                target: rref(b, field::put::TARGET),
                req: u64_at(b, field::put::REQ),
                data: rest,
            },
            Kind::RmaAck => Frame::RmaAck {
                req: u64_at(b, field::rma_ack::REQ),
                status: u32_at(b, field::rma_ack::STATUS) as i32,
                value: u64_at(b, field::rma_ack::VALUE),
            },
            Kind::GetReq => Frame::GetReq {
                target: rref(b, field::get_req::TARGET),
                req: u64_at(b, field::get_req::REQ),
                len: u64_at(b, field::get_req::LEN),
            },
            Kind::GetResp => Frame::GetResp {
                req: u64_at(b, field::get_resp::REQ),
                offset: u64_at(b, field::get_resp::OFFSET),
                status: u32_at(b, field::get_resp::STATUS) as i32,
                data: rest,
            },
            Kind::Atomic => Frame::Atomic {
                target: rref(b, field::atomic::TARGET),
                req: u64_at(b, field::atomic::REQ),
                op: u16_at(b, field::atomic::OP),
                bits32: fl & flags::BITS32 != 0,
                operand: u64_at(b, field::atomic::OPERAND),
                compare: u64_at(b, field::atomic::COMPARE),
            },
            Kind::FlushReq => Frame::FlushReq {
                req: u64_at(b, field::flush_req::REQ),
            },
            Kind::FlushAck => Frame::FlushAck {
                req: u64_at(b, field::flush_ack::REQ),
            },
            Kind::PutSignal => Frame::PutSignal {
                target: rref(b, field::put_signal::TARGET),
                req: u64_at(b, field::put_signal::REQ),
                signal: rref(b, field::put_signal::SIGNAL),
                op: u16_at(b, field::put_signal::OP),
                value: u64_at(b, field::put_signal::VALUE),
                data: rest,
            },
            Kind::PutBegin => Frame::PutBegin {
                target: rref(b, field::put_begin::TARGET),
                len: u64_at(b, field::put_begin::LEN),
                signal: (fl & flags::SIGNAL != 0).then(|| {
                    (
                        rref(b, field::put_begin::SIGNAL),
                        u16_at(b, field::put_begin::OP),
                    )
                }),
            },
        })
    }
}

fn rref(b: &[u8], f: field::RefFields) -> RemoteRef {
    let mut secret = [0u8; 16];
    secret.copy_from_slice(&b[f.secret]);
    RemoteRef {
        region: u64_at(b, f.region),
        secret: u128::from_le_bytes(secret),
        addr: u64_at(b, f.addr),
    }
}

#[cfg(test)]
mod tests;
