//! The shared-memory transport's layouts, as data: the setup messages on the unix socket
//! (hello, reply, confirmation), the shared segment's header, each FIFO's control block,
//! its cells, and the words of packed cells.
//!
//! Both ends share a host and a kernel, so integers are in native byte order. Every field
//! a peer writes is read through atomics (segment) or parsed from a copy (messages), and
//! checked by the transport before use: the peer may be buggy or hostile.
//!
//! ```text
//! segment:  offset 0          SegHeader (one page): magic, version, layout, sizes, pids,
//!                             map bases, probe
//!           HEADER_SIZE       FIFO 0 (connector -> acceptor): FifoCtl (CTL_SIZE), then
//!                             ncells cells of CELL bytes
//!           + fifo_bytes      FIFO 1 (acceptor -> connector): the same
//! cell:     0 seq: u64 | 8 len: u32 | 12 ncells: u32 | 16 payload (frames run on into
//!           the next cells, which have no header of their own)
//! ```

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64};

type Field = Range<usize>;

fn u32_at(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_ne_bytes(a)
}

fn u64_at(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_ne_bytes(a)
}

// ----- setup messages ----------------------------------------------------------------

/// The connector's hello, sent with the segment's memfd (SCM_RIGHTS).
pub mod hello {
    use super::Field;
    /// `TAG`.
    pub const MAGIC: Field = 0..8;
    /// The segment layout version (`segment::VERSION`).
    pub const VERSION: Field = 8..12;
    /// The connector's CMA policy (`policy` bits).
    pub const POLICY: Field = 12..16;
    /// Cells per FIFO.
    pub const NCELLS: Field = 16..20;
    /// Bytes per cell.
    pub const CELL: Field = 20..24;
    /// The segment's size in bytes.
    pub const SIZE: Field = 24..32;
    /// Bytes of a hello.
    pub const LEN: usize = 32;
    /// Its magic.
    pub const TAG: [u8; 8] = *b"CRSHMHI1";
}

/// The acceptor's reply: accepted (`OK`) or refused (`NO`, with a reason).
pub mod reply {
    use super::Field;
    /// `OK` or `NO`.
    pub const MAGIC: Field = 0..8;
    /// The acceptor's `policy` bits, with `policy::CMA_WORKS` when it read our memory.
    pub const FLAGS: Field = 8..12;
    /// The acceptor's process id, as it sees itself.
    pub const PID: Field = 12..16;
    /// Why it refused (`reason`), in a refusal.
    pub const REASON: Field = 16..20;
    /// Bytes of a reply.
    pub const LEN: usize = 24;
    /// Magic of an acceptance.
    pub const OK: [u8; 8] = *b"CRSHMOK1";
    /// Magic of a refusal.
    pub const NO: [u8; 8] = *b"CRSHMNO1";
}

/// The connector's confirmation, after which both sides use the link.
pub mod confirm {
    use super::Field;
    /// `TAG`.
    pub const MAGIC: Field = 0..8;
    /// `CMA` or `ABORT`.
    pub const FLAGS: Field = 8..12;
    /// Bytes of a confirmation.
    pub const LEN: usize = 16;
    /// Its magic.
    pub const TAG: [u8; 8] = *b"CRSHMGO1";
    /// Both sides use CMA.
    pub const CMA: u32 = 1;
    /// The connector gives up (CMA required but unavailable).
    pub const ABORT: u32 = 2;
}

/// CMA policy bits of a hello and a reply.
pub mod policy {
    /// CMA may be used.
    pub const CMA_ALLOWED: u32 = 1;
    /// CMA must be used (`COURIER_SHM_CMA=yes`).
    pub const CMA_REQUIRED: u32 = 2;
    /// Reply only: the acceptor could read the connector's memory.
    pub const CMA_WORKS: u32 = 4;
}

/// Why an acceptor refused a connection.
pub mod reason {
    /// It could not use the segment (another layout, bad sizes).
    pub const BAD_SEGMENT: u32 = 1;
    /// It requires CMA, which did not work on the connector.
    pub const CMA_REQUIRED: u32 = 2;
}

/// A hello, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The connector's segment layout version.
    pub version: u32,
    /// Its `policy` bits.
    pub policy: u32,
    /// Cells per FIFO.
    pub ncells: u32,
    /// Bytes per cell.
    pub cell: u32,
    /// The segment's size.
    pub size: u64,
}

impl Hello {
    /// The hello's bytes.
    pub fn emit(&self) -> [u8; hello::LEN] {
        let mut b = [0u8; hello::LEN];
        b[hello::MAGIC].copy_from_slice(&hello::TAG);
        b[hello::VERSION].copy_from_slice(&self.version.to_ne_bytes());
        b[hello::POLICY].copy_from_slice(&self.policy.to_ne_bytes());
        b[hello::NCELLS].copy_from_slice(&self.ncells.to_ne_bytes());
        b[hello::CELL].copy_from_slice(&self.cell.to_ne_bytes());
        b[hello::SIZE].copy_from_slice(&self.size.to_ne_bytes());
        b
    }

    /// A hello from its bytes; `None` when the magic is not a hello's.
    pub fn parse(b: &[u8; hello::LEN]) -> Option<Hello> {
        (b[hello::MAGIC] == hello::TAG).then(|| Hello {
            version: u32_at(b, hello::VERSION),
            policy: u32_at(b, hello::POLICY),
            ncells: u32_at(b, hello::NCELLS),
            cell: u32_at(b, hello::CELL),
            size: u64_at(b, hello::SIZE),
        })
    }
}

/// A reply, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Accepted: the acceptor's `policy` bits and pid.
    Ok {
        /// `policy` bits, with `policy::CMA_WORKS` when it read our memory.
        flags: u32,
        /// The acceptor's pid, as it sees itself.
        pid: u32,
    },
    /// Refused.
    No {
        /// The acceptor's pid, as it sees itself.
        pid: u32,
        /// `reason`.
        reason: u32,
    },
}

impl Reply {
    /// The reply's bytes.
    pub fn emit(&self) -> [u8; reply::LEN] {
        let mut b = [0u8; reply::LEN];
        match *self {
            Reply::Ok { flags, pid } => {
                b[reply::MAGIC].copy_from_slice(&reply::OK);
                b[reply::FLAGS].copy_from_slice(&flags.to_ne_bytes());
                b[reply::PID].copy_from_slice(&pid.to_ne_bytes());
            }
            Reply::No { pid, reason } => {
                b[reply::MAGIC].copy_from_slice(&reply::NO);
                b[reply::PID].copy_from_slice(&pid.to_ne_bytes());
                b[reply::REASON].copy_from_slice(&reason.to_ne_bytes());
            }
        }
        b
    }

    /// A reply from its bytes; `None` when it is neither an acceptance nor a refusal.
    pub fn parse(b: &[u8; reply::LEN]) -> Option<Reply> {
        let pid = u32_at(b, reply::PID);
        if b[reply::MAGIC] == reply::NO {
            Some(Reply::No {
                pid,
                reason: u32_at(b, reply::REASON),
            })
        } else if b[reply::MAGIC] == reply::OK {
            Some(Reply::Ok {
                flags: u32_at(b, reply::FLAGS),
                pid,
            })
        } else {
            None
        }
    }
}

/// A confirmation's bytes, with `flags` (`confirm::CMA`, `confirm::ABORT`).
pub fn emit_confirm(flags: u32) -> [u8; confirm::LEN] {
    let mut b = [0u8; confirm::LEN];
    b[confirm::MAGIC].copy_from_slice(&confirm::TAG);
    b[confirm::FLAGS].copy_from_slice(&flags.to_ne_bytes());
    b
}

/// A confirmation's flags; `None` when the magic is not a confirmation's.
pub fn parse_confirm(b: &[u8; confirm::LEN]) -> Option<u32> {
    (b[confirm::MAGIC] == confirm::TAG).then(|| u32_at(b, confirm::FLAGS))
}

// ----- the shared segment --------------------------------------------------------------

/// Bytes per FIFO cell.
pub const CELL: usize = 256;
/// Bytes of frame header at the start of a frame's first cell.
pub const CELL_HDR: usize = 16;
/// Segment magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CRSHMSEG");
/// Layout version; bump on any change of the layout below.
pub const VERSION: u32 = 3;
/// Bytes reserved for the segment header.
pub const HEADER_SIZE: usize = 4096;
/// Bytes reserved for each FIFO's control block (before its cells).
pub const CTL_SIZE: usize = 256;
/// Smallest cell count accepted from a peer.
pub const MIN_CELLS: usize = 16;
/// Largest cell count accepted from a peer.
pub const MAX_CELLS: usize = 65536;

/// A fingerprint of the compiled layout, so two builds that disagree never talk.
pub const LAYOUT: u64 = (CELL as u64)
    | ((CELL_HDR as u64) << 12)
    | ((HEADER_SIZE as u64) << 20)
    | ((CTL_SIZE as u64) << 36)
    | ((std::mem::size_of::<SegHeader>() as u64) << 48);

/// The segment header. Written by the connector at creation, except `pid[1]` and
/// `map_base[1]`, which the acceptor fills in before it replies.
#[repr(C, align(64))]
pub struct SegHeader {
    /// `MAGIC`.
    pub magic: AtomicU64,
    /// `VERSION`.
    pub version: AtomicU32,
    /// `CELL`.
    pub cell_size: AtomicU32,
    /// Cells per FIFO.
    pub ncells: AtomicU32,
    /// Zero.
    pub _pad: AtomicU32,
    /// The segment's size in bytes.
    pub seg_size: AtomicU64,
    /// `LAYOUT`.
    pub layout: AtomicU64,
    /// Process ids as each side sees itself: `[connector, acceptor]` (informational; the
    /// pid used for CMA comes from SO_PEERCRED, which is namespace-correct).
    pub pid: [AtomicU32; 2],
    /// Where each side mapped the segment, for the CMA probe: `[connector, acceptor]`.
    pub map_base: [AtomicU64; 2],
    /// A random word; each side reads it from the other's mapping with process_vm_readv.
    pub probe: AtomicU64,
}

/// What a connector wrote in a segment header that the acceptor checks, as read from the
/// segment (`SegInfo::read`) or from a copy of its bytes (`SegInfo::parse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegInfo {
    /// `MAGIC`.
    pub magic: u64,
    /// `VERSION`.
    pub version: u32,
    /// `CELL`.
    pub cell_size: u32,
    /// Cells per FIFO.
    pub ncells: u32,
    /// The segment's size in bytes.
    pub seg_size: u64,
    /// `LAYOUT`.
    pub layout: u64,
}

impl SegInfo {
    /// The fields of a header in shared memory (each read once, atomically).
    pub fn read(h: &SegHeader) -> SegInfo {
        use std::sync::atomic::Ordering::Relaxed;
        SegInfo {
            magic: h.magic.load(Relaxed),
            version: h.version.load(Relaxed),
            cell_size: h.cell_size.load(Relaxed),
            ncells: h.ncells.load(Relaxed),
            seg_size: h.seg_size.load(Relaxed),
            layout: h.layout.load(Relaxed),
        }
    }

    /// The fields of a copy of a header's bytes; `None` when shorter than a header.
    pub fn parse(b: &[u8]) -> Option<SegInfo> {
        use std::mem::offset_of;
        let f = |off: usize, n: usize| off..off + n;
        if b.len() < std::mem::size_of::<SegHeader>() {
            return None;
        }
        Some(SegInfo {
            magic: u64_at(b, f(offset_of!(SegHeader, magic), 8)),
            version: u32_at(b, f(offset_of!(SegHeader, version), 4)),
            cell_size: u32_at(b, f(offset_of!(SegHeader, cell_size), 4)),
            ncells: u32_at(b, f(offset_of!(SegHeader, ncells), 4)),
            seg_size: u64_at(b, f(offset_of!(SegHeader, seg_size), 8)),
            layout: u64_at(b, f(offset_of!(SegHeader, layout), 8)),
        })
    }

    /// The header's bytes (the fields not here are zero), as `parse` reads them.
    pub fn emit(&self) -> [u8; std::mem::size_of::<SegHeader>()] {
        use std::mem::offset_of;
        let mut b = [0u8; std::mem::size_of::<SegHeader>()];
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(offset_of!(SegHeader, magic), &self.magic.to_ne_bytes());
        put(offset_of!(SegHeader, version), &self.version.to_ne_bytes());
        put(
            offset_of!(SegHeader, cell_size),
            &self.cell_size.to_ne_bytes(),
        );
        put(offset_of!(SegHeader, ncells), &self.ncells.to_ne_bytes());
        put(
            offset_of!(SegHeader, seg_size),
            &self.seg_size.to_ne_bytes(),
        );
        put(offset_of!(SegHeader, layout), &self.layout.to_ne_bytes());
        b
    }

    /// Check the header against what the hello announced (`ncells`, and `size`, the
    /// segment's size for that many cells); why not, for a log line.
    pub fn check(&self, ncells: usize, size: u64) -> Result<(), &'static str> {
        let checks = [
            (self.magic == MAGIC, "bad magic"),
            (self.version == VERSION, "layout version mismatch"),
            (
                self.layout == LAYOUT,
                "layout hash mismatch (different Courier build)",
            ),
            (self.cell_size as usize == CELL, "cell size mismatch"),
            (
                self.ncells as usize == ncells,
                "cell count in header differs from hello",
            ),
            (
                self.seg_size == size,
                "segment size in header differs from hello",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why),
            None => Ok(()),
        }
    }
}

/// Offset of the probe word inside the segment.
pub const PROBE_OFFSET: usize = std::mem::offset_of!(SegHeader, probe);

const _: () = assert!(std::mem::size_of::<SegHeader>() <= HEADER_SIZE);

/// Bytes of one FIFO (control block and cells).
pub fn fifo_bytes(ncells: usize) -> usize {
    CTL_SIZE + ncells * CELL
}

/// Offset of FIFO `k` (0 or 1).
pub fn fifo_offset(ncells: usize, k: usize) -> usize {
    HEADER_SIZE + k * fifo_bytes(ncells)
}

// ----- FIFO control blocks, cells and packed cells ------------------------------------------

/// `len` value of a skip-to-end marker.
pub const SKIP: u32 = u32::MAX;
/// Flag in a cell header's `ncells`: the cell packs several small frames.
pub const PACKED: u32 = 1 << 31;
/// A packed cell's word: kind (2 bits), the cell's position (46 bits), length (16 bits).
/// Kinds: a sub-frame of that length follows; `CLOSE`: the cell ends; `PAD`: the next
/// sub-frame starts at the next cache line. A word with another position is nothing yet.
pub const KIND: u64 = 3 << 62;
/// Kind of a word announcing a sub-frame of the word's length.
pub const VALID: u64 = 2 << 62;
/// Kind of a word that closes the cell.
pub const CLOSE: u64 = 1 << 62;
/// Kind of a word saying that the next sub-frame starts at the next cache line.
pub const PAD: u64 = 3 << 62;
/// Bits of the cell's position in a word.
pub const POS_BITS: u32 = 46;
/// Bits of the length in a word.
pub const LEN_MASK: u64 = 0xffff;

/// The position bits of a word of the packed cell at absolute position `pos`.
#[inline(always)]
pub fn pos_tag(pos: u64) -> u64 {
    (pos & ((1 << POS_BITS) - 1)) << 16
}
/// Cache line size the sub-frames are laid out for.
pub const LINE: usize = 64;
/// Bytes of a sub-frame's word.
pub const SUB_HDR: usize = 8;
/// Payload bytes of a packed cell.
pub const PACK_ROOM: usize = CELL - CELL_HDR;
/// Largest frame that joins a packed cell.
pub const PACK_MAX: usize = PACK_ROOM - SUB_HDR;

/// A field on a cache line of its own.
#[repr(C, align(64))]
pub struct Line<T>(pub T);

/// FIFO control block (CTL_SIZE bytes before the cells).
#[repr(C)]
pub struct FifoCtl {
    /// Cells consumed so far (written by the consumer only).
    pub tail: Line<AtomicU64>,
    /// Non-zero: the consumer sleeps and wants a wakeup byte.
    pub armed: Line<AtomicU32>,
    /// Non-zero: the consumer may sleep at all (its context asked for wakeup). Written by
    /// the consumer's side during the handshake, before the producer's first frame; the
    /// producer pays the store-load fence of the wakeup protocol only when it is set.
    pub sleeper: Line<AtomicU32>,
    /// Written by the producer: `PRODUCER_SLEEPS` (set during the handshake) says it may
    /// sleep at all; `ROOM_WANTED` that it sleeps on a full FIFO and wants a wakeup byte
    /// once the consumer publishes a new `tail` (which clears the bit). The consumer pays
    /// the store-load fence of that protocol only when `PRODUCER_SLEEPS` is set.
    pub room: Line<AtomicU32>,
}
const _: () = assert!(std::mem::size_of::<FifoCtl>() <= CTL_SIZE);

/// `FifoCtl::room`: the producer may sleep.
pub const PRODUCER_SLEEPS: u32 = 1;
/// `FifoCtl::room`: the producer sleeps until the consumer frees cells.
pub const ROOM_WANTED: u32 = 2;

/// Header at the start of a frame's first cell.
#[repr(C)]
pub struct CellHdr {
    /// The cell's position + 1 once the frame (or packed cell) is published.
    pub seq: AtomicU64,
    /// The frame's length (`SKIP`: skip to the end of the array; 0 in a packed cell).
    pub len: AtomicU32,
    /// Cells the frame takes (`PACKED` set: a packed cell).
    pub ncells: AtomicU32,
}
const _: () = assert!(std::mem::size_of::<CellHdr>() == CELL_HDR);

#[cfg(test)]
mod tests {
    use super::*;

    /// Setup messages read back as they were written; a wrong magic is no message.
    #[test]
    fn setup_messages_round_trip() {
        let h = Hello {
            version: 2,
            policy: policy::CMA_ALLOWED,
            ncells: 1024,
            cell: CELL as u32,
            size: 1 << 20,
        };
        assert_eq!(Hello::parse(&h.emit()), Some(h));
        let mut bad = h.emit();
        bad[0] ^= 1;
        assert_eq!(Hello::parse(&bad), None);
        for r in [
            Reply::Ok {
                flags: policy::CMA_WORKS,
                pid: 42,
            },
            Reply::No {
                pid: 7,
                reason: reason::CMA_REQUIRED,
            },
        ] {
            assert_eq!(Reply::parse(&r.emit()), Some(r));
        }
        assert_eq!(Reply::parse(&[0u8; reply::LEN]), None);
        assert_eq!(
            parse_confirm(&emit_confirm(confirm::CMA)),
            Some(confirm::CMA)
        );
        assert_eq!(parse_confirm(&[0u8; confirm::LEN]), None);
    }

    use proptest::prelude::*;

    proptest! {
        /// Every hello, reply, confirmation and segment header reads back as it was
        /// written, and whatever bytes parse emit back to a message that parses the same.
        #[test]
        fn setup_messages_emit_then_parse(v in any::<u32>(), p in any::<u32>(), n in any::<u32>(),
                                          c in any::<u32>(), size in any::<u64>(), ok in any::<bool>()) {
            let h = Hello { version: v, policy: p, ncells: n, cell: c, size };
            prop_assert_eq!(Hello::parse(&h.emit()), Some(h));
            let r = if ok { Reply::Ok { flags: p, pid: n } } else { Reply::No { pid: n, reason: c } };
            prop_assert_eq!(Reply::parse(&r.emit()), Some(r));
            prop_assert_eq!(parse_confirm(&emit_confirm(p)), Some(p));
            let s = SegInfo { magic: size, version: v, cell_size: c, ncells: n, seg_size: size ^ 1, layout: size.rotate_left(7) };
            prop_assert_eq!(SegInfo::parse(&s.emit()), Some(s));
        }

        #[test]
        fn parsed_messages_emit_back(h in any::<[u8; hello::LEN]>(), r in any::<[u8; reply::LEN]>(), ok in any::<bool>()) {
            let mut h = h;
            h[hello::MAGIC].copy_from_slice(&hello::TAG);
            let got = Hello::parse(&h).unwrap();
            prop_assert_eq!(got.emit(), h);
            let mut r = r;
            r[reply::MAGIC].copy_from_slice(if ok { &reply::OK } else { &reply::NO });
            let got = Reply::parse(&r).unwrap();
            prop_assert_eq!(Reply::parse(&got.emit()), Some(got));
        }
    }

    #[test]
    fn segment_header_checks() {
        let good = SegInfo {
            magic: MAGIC,
            version: VERSION,
            cell_size: CELL as u32,
            ncells: 64,
            seg_size: 1 << 20,
            layout: LAYOUT,
        };
        assert_eq!(good.check(64, 1 << 20), Ok(()));
        assert_eq!(
            good.check(32, 1 << 20),
            Err("cell count in header differs from hello")
        );
        assert_eq!(
            SegInfo { layout: 0, ..good }.check(64, 1 << 20),
            Err("layout hash mismatch (different Courier build)")
        );
        assert_eq!(
            SegInfo { magic: 1, ..good }.check(64, 1 << 20),
            Err("bad magic")
        );
        assert_eq!(SegInfo::parse(&[0; 8]), None);
    }
}
