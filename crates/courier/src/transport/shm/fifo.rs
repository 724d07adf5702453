//! Lock-free single-producer/single-consumer FIFO of 256-byte cells in shared memory.
//!
//! A frame of `len` bytes occupies `k = ceil((16 + len) / 256)` consecutive cells. Its first
//! cell starts with a 16-byte header, `seq: u64, len: u32, ncells: u32`; the payload follows
//! contiguously, running over the later cells (which have no headers of their own). The
//! producer writes the payload, then `len`/`ncells`, then stores `seq = position + 1` with
//! Release; the consumer polls only the `seq` word of the cell at its head with Acquire.
//! Positions are absolute cell counts, so a stale `seq` from an earlier lap never matches.
//! When a frame would run past the end of the array, the producer first writes a *skip*
//! marker (`len = SKIP`, `ncells` = cells to the end) so frames are always contiguous.
//!
//! *Packed cells.* In a burst (frames sent without the worker progressing in between, as a
//! bandwidth test's sender does), frames of up to `PACK_MAX` bytes do not take a cell each:
//! they are appended to an *open* cell, one after another, as sub-frames: an 8-byte word,
//! then the bytes, padded to 8. A packed cell's header has `ncells = 1 | PACKED` (and `len`
//! 0); its `seq` publishes the cell with its first sub-frame. Each later sub-frame is
//! published by its own word, stored with Release after its bytes, so it is visible the
//! moment it is sent, as a frame of its own would be, and the consumer polls the line the
//! next one will be written to, not the cell's header. A word carries its kind (a sub-frame
//! and its length, `CLOSE`, `PAD`) and the cell's position (its `seq - 1`, 46 bits), so a
//! word left from an earlier lap never passes for a new one and nothing has to be zeroed. A
//! frame that does not fit, or cannot be packed, closes the cell: `CLOSE` in the next word
//! (none is needed when the cell is full). A sub-frame that fits in a cache line but would
//! cross into the next starts at the next line instead, announced by `PAD` in its word's
//! place: a message then costs the consumer one line, not two in a row. A stream of small
//! messages thus moves one cache line for every two or more messages, where a cell each
//! moved a line for every one.
//!
//! The consumer publishes its progress in `tail` (its own cache line), which the producer
//! reads only when its cached copy says the FIFO is full. On consume, the consumer zeroes the
//! `seq` word of every non-first cell of the frame (payload bytes there could otherwise look
//! like a future `seq`). `armed` asks the producer for a wakeup byte on the socket.
//!
//! Everything read from the segment is validated: the peer may be buggy or hostile.

use std::sync::atomic::{AtomicU64, Ordering::*, fence};

use crate::base::sys::copy_small;
use crate::base::{Error, Result, Status};
use crate::transport::{RawFrame, TxError};
pub(super) use crate::wire::shm::PACK_MAX;
use crate::wire::shm::{
    CELL, CELL_HDR, CLOSE, CTL_SIZE, CellHdr, FifoCtl, KIND, LEN_MASK, LINE, PACK_ROOM, PACKED,
    PAD, PRODUCER_SLEEPS, ROOM_WANTED, SKIP, SUB_HDR, VALID, pos_tag,
};

/// `n` rounded up to a multiple of 8.
#[inline(always)]
fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Payload offset of the line after the one holding payload offset `at`.
#[inline(always)]
fn next_line(at: usize) -> usize {
    ((CELL_HDR + at) | (LINE - 1)) + 1 - CELL_HDR
}

/// Copy `a`, `b`, `c` one after another to `dst`.
///
/// # Safety
/// `dst` must be valid for writes of their total length.
#[inline(always)]
unsafe fn copy3(dst: *mut u8, a: &[u8], b: &[u8], c: &[u8]) {
    // SAFETY: per the caller's contract, each part ends inside the destination.
    unsafe {
        copy_small(a.as_ptr(), dst, a.len());
        copy_small(b.as_ptr(), dst.add(a.len()), b.len());
        copy_small(c.as_ptr(), dst.add(a.len() + b.len()), c.len());
    }
}

/// Where a sub-frame of `len` bytes goes in a packed cell used up to `used`: there, or at
/// the next line if it fits in one line but would cross into the next (a PAD at `used`
/// says so); `None` if the cell has no room for it.
#[inline(always)]
fn fit(used: usize, len: usize) -> Option<usize> {
    let need = SUB_HDR + len;
    let within = (CELL_HDR + used) & (LINE - 1);
    let at = if within + need > LINE && need <= LINE {
        next_line(used)
    } else {
        used
    };
    (at + need <= PACK_ROOM).then_some(at)
}

/// Cells a frame of `len` bytes needs.
#[inline]
pub(super) fn cells_for(len: usize) -> usize {
    (len + CELL_HDR).div_ceil(CELL)
}

/// Largest frame for a FIFO of `n` cells: 64 KiB, or a quarter of the FIFO.
pub(super) fn max_frame(n: usize) -> usize {
    (64usize << 10).min((n / 4) * CELL - CELL_HDR)
}

/// Where one FIFO lives in a mapping.
#[derive(Copy, Clone)]
pub(super) struct FifoRef {
    ctl: *const FifoCtl,
    cells: *mut u8,
    n: usize,
}

impl FifoRef {
    /// # Safety
    /// `base` must point at a FIFO of `n` cells (CTL_SIZE + n * CELL bytes, 64-aligned)
    /// inside a mapping that outlives every use of the returned value.
    pub unsafe fn new(base: *mut u8, n: usize) -> FifoRef {
        // SAFETY: within the FIFO per the caller's contract.
        FifoRef {
            ctl: base.cast(),
            cells: unsafe { base.add(CTL_SIZE) },
            n,
        }
    }

    #[inline]
    fn ctl(&self) -> &FifoCtl {
        // SAFETY: FifoCtl is all atomics and lies inside the live mapping.
        unsafe { &*self.ctl }
    }

    #[inline]
    fn cell(&self, idx: usize) -> *mut u8 {
        debug_assert!(idx < self.n);
        // SAFETY: idx < n, so inside the cell array.
        unsafe { self.cells.add(idx * CELL) }
    }

    /// The packed-cell word at payload offset `at` of cell `idx`.
    #[inline(always)]
    fn word(&self, idx: usize, at: usize) -> &AtomicU64 {
        debug_assert!(at + SUB_HDR <= PACK_ROOM && at.is_multiple_of(8));
        // SAFETY: inside the cell's payload (`at + 8 <= PACK_ROOM`), 8-aligned (cells
        // are, CELL_HDR and `at` are multiples of 8); an atomic may alias memory the peer
        // writes.
        unsafe { &*self.cell(idx).add(CELL_HDR + at).cast::<AtomicU64>() }
    }

    #[inline]
    fn hdr(&self, idx: usize) -> &CellHdr {
        // SAFETY: a cell header is 16 bytes of atomics at the start of a cell in the mapping.
        unsafe { &*self.cell(idx).cast::<CellHdr>() }
    }
}

/// The writing end.
pub(super) struct Producer {
    f: FifoRef,
    head: u64,
    tail_cache: u64,
    max_frame: usize,
    /// The packed cell small frames are appended to (published, not closed).
    open: Option<Open>,
    /// Small frames now are part of a burst (`note_epoch`): they are packed.
    burst: bool,
    /// The worker's progress count at the last send (`note_epoch`).
    epoch: u64,
    /// The last frame did not fit (`want_room` may ask for a wakeup).
    full: bool,
}

/// How `placed` publishes a frame.
#[derive(Copy, Clone)]
enum Placed {
    /// A sub-frame of `len` bytes at payload offset `at` of packed cell `idx` (its words
    /// carry `tag`); the cell was used up to `from` (`from < at`: a PAD at `from`; `from` 0: the
    /// first, which publishes the cell).
    Sub {
        idx: usize,
        tag: u64,
        from: usize,
        at: usize,
        len: usize,
    },
    /// A frame of its own in cells idx..idx + k.
    Own { idx: usize, len: usize, k: usize },
}

/// A packed cell being filled.
#[derive(Copy, Clone)]
struct Open {
    idx: usize,
    /// The cell's position's word bits (`pos_tag`).
    tag: u64,
    /// Payload bytes used (a multiple of 8).
    used: usize,
}

impl Producer {
    /// How far the consumer says it has read (a position it writes, not trusted for
    /// anything but "it moves": a liveness hint).
    pub fn peer_tail(&self) -> u64 {
        self.f.ctl().tail.0.load(Relaxed)
    }

    pub fn new(f: FifoRef) -> Producer {
        Producer {
            f,
            head: 0,
            tail_cache: 0,
            max_frame: max_frame(f.n),
            open: None,
            burst: false,
            epoch: u64::MAX,
            full: false,
        }
    }

    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Write one frame made of `parts`, all or nothing. `Ok(true)` if the consumer is armed
    /// (asleep, wants a wakeup).
    #[inline]
    pub fn push(&mut self, parts: &[&[u8]]) -> Result<bool, TxError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (dst, frame) = if self.burst && len <= PACK_MAX {
            self.place_packed(len)?
        } else {
            self.place_own(len)?
        };
        let mut off = 0;
        for p in parts {
            // SAFETY: the place gave `len` writable bytes at `dst`, inside cells the
            // consumer has released, or past what it may read of the open cell.
            unsafe { copy_small(p.as_ptr(), dst.add(off), p.len()) };
            off += p.len();
        }
        Ok(self.placed(frame))
    }

    /// `push` of a frame in three parts (header, extra bytes, data): the small-message
    /// send, without building a list of parts and walking it. A frame of its own (the
    /// latency case) takes the short way in line; a burst's small frames are packed out
    /// of line.
    #[inline(always)]
    pub fn push3(&mut self, a: &[u8], b: &[u8], c: &[u8]) -> Result<bool, TxError> {
        let len = a.len() + b.len() + c.len();
        if self.burst && len <= PACK_MAX {
            return self.push3_packed(a, b, c, len);
        }
        let (dst, frame) = self.place_own(len)?;
        // SAFETY: `place_own` gave `len` writable bytes at `dst`, inside cells the
        // consumer has released and does not read until `seq` is published.
        unsafe { copy3(dst, a, b, c) };
        Ok(self.placed(frame))
    }

    /// `push3` of a burst's small frame: into the open packed cell.
    #[inline(never)]
    fn push3_packed(&mut self, a: &[u8], b: &[u8], c: &[u8], len: usize) -> Result<bool, TxError> {
        let (dst, frame) = self.place_packed(len)?;
        // SAFETY: `place_packed` gave `len` writable bytes at `dst`, past what the
        // consumer may read of the open cell.
        unsafe { copy3(dst, a, b, c) };
        Ok(self.placed(frame))
    }

    /// Where a frame of its own of `len` bytes goes (closing the open packed cell first).
    #[inline(always)]
    fn place_own(&mut self, len: usize) -> Result<(*mut u8, Placed), TxError> {
        self.close_open();
        let (idx, k) = self.reserve(len)?;
        // SAFETY: `reserve` gave cells idx..idx + k (idx + k <= n): [cell + 16, cell + 16
        // + len) is inside the array.
        let dst = unsafe { self.f.cell(idx).add(CELL_HDR) };
        Ok((dst, Placed::Own { idx, len, k }))
    }

    /// Where a small frame (`len <= PACK_MAX`) goes in the open packed cell, or in a new
    /// one when it does not fit.
    #[inline(always)]
    fn place_packed(&mut self, len: usize) -> Result<(*mut u8, Placed), TxError> {
        if let Some(o) = self.open {
            if let Some(at) = fit(o.used, len) {
                return Ok(self.slot(o, at, len));
            }
        }
        self.place_in_new_cell(len)
    }

    /// Before a send: `epoch` counts the worker's progress calls. The same as at the
    /// previous send means a burst (no progress since), whose small frames are packed. A
    /// frame sent between progress calls (a ping-pong) takes a cell of its own: its reader
    /// waits for it, and a line shared with the frames before it would cost that reader.
    #[inline(always)]
    pub fn note_epoch(&mut self, epoch: u64) {
        self.burst = epoch == self.epoch;
        self.epoch = epoch;
    }

    /// `place_packed` when there is no open cell, or it is full: close it and open the
    /// next.
    #[inline(never)]
    fn place_in_new_cell(&mut self, len: usize) -> Result<(*mut u8, Placed), TxError> {
        self.close_open();
        let (idx, _) = self.reserve(PACK_ROOM)?;
        let o = Open {
            idx,
            tag: pos_tag(self.head),
            used: 0,
        };
        // Any frame up to PACK_MAX fits an empty cell (at 0, or after a PAD at 0).
        let at = fit(0, len).unwrap_or(0);
        Ok(self.slot(o, at, len))
    }

    /// Take the sub-frame slot for `len` bytes at payload offset `at` (from `fit`) of the
    /// open cell `o`: where its bytes go.
    #[inline(always)]
    fn slot(&mut self, o: Open, at: usize, len: usize) -> (*mut u8, Placed) {
        debug_assert!(at >= o.used && at + SUB_HDR + len <= PACK_ROOM);
        let end = at + SUB_HDR + pad8(len);
        self.open = Some(Open { used: end, ..o });
        // SAFETY: the slot's bytes end inside the cell's payload (`fit` checked).
        let dst = unsafe { self.f.cell(o.idx).add(CELL_HDR + at + SUB_HDR) };
        (
            dst,
            Placed::Sub {
                idx: o.idx,
                tag: o.tag,
                from: o.used,
                at,
                len,
            },
        )
    }

    /// Publish a frame whose bytes are written. True if the consumer is armed.
    #[inline(always)]
    fn placed(&mut self, frame: Placed) -> bool {
        match frame {
            Placed::Sub {
                idx,
                tag,
                from,
                at,
                len,
            } => {
                // The word the consumer polls: the sub-frame's own, or a PAD before it
                // (stored after the sub-frame's word, which it makes visible).
                let own = VALID | tag | len as u64;
                let (w, word) = if from == at {
                    (self.f.word(idx, at), own)
                } else {
                    self.f.word(idx, at).store(own, Relaxed);
                    (self.f.word(idx, from), PAD | tag)
                };
                if from == 0 {
                    w.store(word, Relaxed);
                    self.publish(idx, 0, 1 | PACKED)
                } else {
                    w.store(word, Release);
                    self.armed()
                }
            }
            Placed::Own { idx, len, k } => self.publish(idx, len as u32, k as u32),
        }
    }

    /// Close the open packed cell, if any: the consumer moves past it once read.
    #[inline]
    fn close_open(&mut self) {
        if let Some(o) = self.open.take() {
            // A full cell needs no mark: the consumer leaves it at its end.
            if o.used + SUB_HDR <= PACK_ROOM {
                self.f.word(o.idx, o.used).store(CLOSE | o.tag, Release);
            }
        }
    }

    /// Room for a frame of `len` bytes: the index of its first cell and its cell count.
    /// Writes a skip marker first when the frame would run past the end of the array.
    #[inline(always)]
    fn reserve(&mut self, len: usize) -> Result<(usize, usize), TxError> {
        if len > self.max_frame {
            return Err(self.too_long(len));
        }
        let n = self.f.n;
        let k = cells_for(len);
        let idx = (self.head as usize) & (n - 1);
        let skip = if idx + k > n { n - idx } else { 0 };
        let need = (skip + k) as u64;
        if need > n as u64 - (self.head - self.tail_cache) {
            self.refresh_tail(need)?;
        }
        self.full = false;
        if skip > 0 {
            self.write_skip(idx, skip);
            return Ok((0, k));
        }
        Ok((idx, k))
    }

    #[cold]
    fn too_long(&self, len: usize) -> TxError {
        TxError::Failed(Error::msg(
            Status::InvalidParam,
            format!(
                "shm: frame of {len} bytes exceeds max_frame {}",
                self.max_frame
            ),
        ))
    }

    /// The FIFO looked too full for `need` cells by our cached consumer position: read
    /// the consumer's (validated: the peer writes it), then `NoResource` if still full.
    #[cold]
    fn refresh_tail(&mut self, need: u64) -> Result<(), TxError> {
        let n = self.f.n;
        let t = self.f.ctl().tail.0.load(Acquire);
        if t > self.head || self.head - t > n as u64 || t < self.tail_cache {
            return Err(TxError::Failed(Error::msg(
                Status::ProtocolError,
                format!(
                    "shm: peer's consumer position {t} is impossible (ours {}, FIFO {n} cells)",
                    self.head
                ),
            )));
        }
        self.tail_cache = t;
        if need > n as u64 - (self.head - t) {
            self.full = true;
            return Err(TxError::NoResource);
        }
        Ok(())
    }

    /// Before the worker sleeps with frames that did not fit: ask the consumer for a
    /// wakeup byte when it next frees cells. `false` if the last frame fitted, or the
    /// consumer freed cells since it did not (try again instead of sleeping).
    pub fn want_room(&mut self) -> bool {
        if !self.full {
            return false;
        }
        let room = &self.f.ctl().room.0;
        room.fetch_or(ROOM_WANTED, SeqCst);
        // Pairs with the fence in `Consumer::room_freed`: either it sees the request, or
        // this load sees the cells it freed.
        fence(SeqCst);
        if self.f.ctl().tail.0.load(Relaxed) != self.tail_cache {
            room.fetch_and(!ROOM_WANTED, Relaxed);
            return false;
        }
        true
    }

    /// Mark cells idx..n as skipped (the next frame starts at cell 0).
    #[cold]
    fn write_skip(&mut self, idx: usize, skip: usize) {
        let h = self.f.hdr(idx);
        h.len.store(SKIP, Relaxed);
        h.ncells.store(skip as u32, Relaxed);
        h.seq.store(self.head + 1, Release);
        self.head += skip as u64;
    }

    /// Publish the frame written into cells idx..idx + k (`len` its bytes, `ncells` its
    /// header's cell count: k, with `PACKED` for a packed cell). True if the consumer is
    /// armed (asleep, wants a wakeup).
    #[inline]
    fn publish(&mut self, idx: usize, len: u32, ncells: u32) -> bool {
        let h = self.f.hdr(idx);
        h.len.store(len, Relaxed);
        h.ncells.store(ncells, Relaxed);
        h.seq.store(self.head + 1, Release);
        self.head += (ncells & !PACKED) as u64;
        self.armed()
    }

    /// After a publish: whether the consumer is armed (asleep, wants a wakeup).
    #[inline(always)]
    fn armed(&self) -> bool {
        if self.f.ctl().sleeper.0.load(Relaxed) == 0 {
            // This consumer never sleeps: no wakeup protocol, no fence.
            return false;
        }
        // Pairs with the fence in `Consumer::arm`: either we see `armed`, or the consumer
        // sees what we published before it sleeps.
        fence(SeqCst);
        self.f.ctl().armed.0.load(Relaxed) != 0
    }

    /// Claim the consumer's wakeup request. True if we must send a wakeup byte.
    pub fn take_armed(&self) -> bool {
        self.f.take_armed()
    }

    /// The FIFO this producer writes.
    pub fn fifo_ref(&self) -> FifoRef {
        self.f
    }
}

#[derive(Copy, Clone)]
struct Current {
    idx: usize,
    len: usize,
    ncells: usize,
    /// In a packed cell: where the frame's bytes start in the payload (0: not packed).
    at: usize,
    /// In a packed cell: where the next sub-frame's word would be (0: not packed).
    next: usize,
}

/// The reading end.
pub(super) struct Consumer {
    f: FifoRef,
    head: u64,
    /// The position last stored in `tail` for the producer.
    published: u64,
    max_frame: usize,
    cur: Option<Current>,
    /// Offset of the next sub-frame in the packed cell at `head` (0 at a cell's start).
    sub: usize,
    /// A sub-frame of the packed cell at `head` was read (a `CLOSE` before one is corrupt).
    read_in_cell: bool,
    /// The producer asked for room and `publish_now` freed some: it gets a wakeup byte.
    wake_producer: bool,
}

impl Consumer {
    /// Cells read so far (a count that only grows).
    pub fn consumed(&self) -> u64 {
        self.head
    }

    pub fn new(f: FifoRef) -> Consumer {
        Consumer {
            f,
            head: 0,
            published: 0,
            max_frame: max_frame(f.n),
            cur: None,
            sub: 0,
            read_in_cell: false,
            wake_producer: false,
        }
    }

    /// Tell the producer how far we have read, in batches of a quarter of the FIFO, and
    /// when `peek` finds the FIFO drained. A producer that runs ahead reads `tail` on
    /// every frame once the FIFO is full; publishing per frame would move that cache line
    /// between the two CPUs twice per message. A quarter is always enough to unblock
    /// it: its largest frame with a skip marker needs less than half of the cells, so a
    /// producer that sees too little room leaves unread frames, whose reading publishes.
    #[inline]
    fn publish(&mut self) {
        if self.head - self.published >= (self.f.n as u64 >> 2) {
            self.publish_now();
        }
    }

    #[inline]
    fn publish_now(&mut self) {
        self.published = self.head;
        self.f.ctl().tail.0.store(self.head, Release);
        if self.f.ctl().room.0.load(Relaxed) & PRODUCER_SLEEPS != 0 {
            self.room_freed();
        }
    }

    /// Cells were freed and the producer may sleep: if it asked for room, it gets a
    /// wakeup byte (`take_wake_producer`).
    #[inline(never)]
    fn room_freed(&mut self) {
        // Pairs with the fence in `Producer::want_room`.
        fence(SeqCst);
        let room = &self.f.ctl().room.0;
        if room.load(Relaxed) & ROOM_WANTED != 0
            && room.fetch_and(!ROOM_WANTED, AcqRel) & ROOM_WANTED != 0
        {
            self.wake_producer = true;
        }
    }

    /// Whether the producer must be sent a wakeup byte (once per request).
    #[inline(always)]
    pub fn take_wake_producer(&mut self) -> bool {
        std::mem::take(&mut self.wake_producer)
    }

    #[cold]
    fn bad(&self, what: String) -> Error {
        Error::msg(
            Status::ProtocolError,
            format!("shm: corrupt FIFO cell at position {}: {what}", self.head),
        )
    }

    /// The next frame, not consumed. No system call, no allocation.
    #[inline(always)]
    pub fn peek(&mut self) -> Result<Option<RawFrame>> {
        if let Some(c) = self.cur {
            return Ok(Some(self.frame(c)));
        }
        let n = self.f.n;
        let idx = (self.head as usize) & (n - 1);
        let h = self.f.hdr(idx);
        if h.seq.load(Acquire) != self.head + 1 {
            if self.published != self.head {
                self.publish_now();
            }
            return Ok(None);
        }
        let len = h.len.load(Relaxed);
        let ncells = h.ncells.load(Relaxed) as usize;
        // The usual frame and packed cells are checked in line; skip markers and bad cells
        // go the long way.
        if (len as usize) <= self.max_frame
            && ncells == cells_for(len as usize)
            && idx + ncells <= n
        {
            let c = Current {
                idx,
                len: len as usize,
                ncells,
                at: 0,
                next: 0,
            };
            self.cur = Some(c);
            return Ok(Some(self.frame(c)));
        }
        if ncells == (1 | PACKED) as usize {
            return self.peek_packed(idx);
        }
        self.peek_slow(idx, len, ncells)
    }

    /// `peek` of the packed cell at `idx`: its sub-frame at `sub`; none yet; or, at a
    /// `CLOSE`, the next cell.
    #[inline]
    fn peek_packed(&mut self, idx: usize) -> Result<Option<RawFrame>> {
        // `sub` stays 8-aligned and leaves room for a word (`consume` leaves a cell with
        // less).
        let word = self.f.word(idx, self.sub).load(Acquire);
        if word & !LEN_MASK == VALID | pos_tag(self.head) {
            let len = word & LEN_MASK;
            let at = self.sub + SUB_HDR;
            if len <= (PACK_ROOM - at) as u64 {
                let len = len as usize;
                let c = Current {
                    idx,
                    len,
                    ncells: 1,
                    at,
                    next: at + pad8(len),
                };
                self.cur = Some(c);
                return Ok(Some(self.frame(c)));
            }
        }
        self.peek_packed_other(word)
    }

    /// `peek_packed` of a word that is not a sub-frame that fits: nothing yet, the end of
    /// the cell, or a corrupt cell.
    #[inline(never)]
    fn peek_packed_other(&mut self, word: u64) -> Result<Option<RawFrame>> {
        let tag = pos_tag(self.head);
        if word & !(KIND | LEN_MASK) != tag || word & KIND == 0 {
            // Another lap's word (or bytes): nothing written here yet.
            if self.published != self.head {
                self.publish_now();
            }
            return Ok(None);
        }
        match word & KIND {
            PAD => {
                let at = next_line(self.sub);
                if at + SUB_HDR > PACK_ROOM {
                    return Err(self.bad(format!(
                        "packed cell pads past its end at offset {}",
                        self.sub
                    )));
                }
                self.sub = at;
                // The cell is still at `head`.
                let idx = (self.head as usize) & (self.f.n - 1);
                self.peek_packed(idx)
            }
            // The producer closes a cell only after a sub-frame in it: a cell closed
            // before we read one is corrupt. This also bounds
            // `peek`'s recursion to one cell however many cells a peer publishes.
            CLOSE if !self.read_in_cell => Err(self.bad(format!(
                "packed cell closed before its first sub-frame, at offset {}",
                self.sub
            ))),
            CLOSE => {
                self.sub = 0;
                self.read_in_cell = false;
                self.head += 1;
                self.publish();
                self.peek()
            }
            // VALID: a sub-frame longer than the rest of the cell.
            _ => Err(self.bad(format!(
                "sub-frame of {} bytes at offset {} runs past its packed cell",
                word & LEN_MASK,
                self.sub
            ))),
        }
    }

    #[inline]
    fn frame(&self, c: Current) -> RawFrame {
        // SAFETY: the frame's cells are inside the array, and a packed cell's sub-frame
        // inside its payload (validated when `cur` was set).
        let ptr = unsafe { self.f.cell(c.idx).add(CELL_HDR + c.at) };
        RawFrame {
            ptr,
            len: c.len,
            shared: true,
        }
    }

    /// `peek` of the published cell at `idx` (header `len`, `ncells`) that is not a
    /// usual frame: a skip marker, passed over, or a corrupt cell, reported.
    #[cold]
    #[inline(never)]
    fn peek_slow(&mut self, idx: usize, len: u32, ncells: usize) -> Result<Option<RawFrame>> {
        let n = self.f.n;
        if len == SKIP {
            if idx == 0 || ncells != n - idx {
                return Err(self.bad(format!("skip marker of {ncells} cells at index {idx} does not reach the end of {n} cells")));
            }
            self.head += ncells as u64;
            self.publish();
            // The next cell is at index 0, where a skip marker is refused: no deeper.
            return self.peek();
        }
        let len = len as usize;
        if len > self.max_frame {
            return Err(self.bad(format!(
                "frame length {len} exceeds max_frame {}",
                self.max_frame
            )));
        }
        if ncells != cells_for(len) {
            return Err(self.bad(format!(
                "cell count {ncells} does not match frame length {len}"
            )));
        }
        Err(self.bad(format!(
            "frame of {ncells} cells at index {idx} runs past the end of {n} cells"
        )))
    }

    /// Release the frame returned by the last `peek`.
    #[inline]
    pub fn consume(&mut self) {
        if let Some(c) = self.cur.take() {
            if c.next != 0 && c.next + SUB_HDR <= PACK_ROOM {
                // Room for another sub-frame (or a `CLOSE`): the cell stays at the head.
                self.sub = c.next;
                self.read_in_cell = true;
                return;
            }
            self.sub = 0;
            self.read_in_cell = false;
            for i in 1..c.ncells {
                // Payload bytes in these cells could look like a later lap's `seq`.
                self.f.hdr(c.idx + i).seq.store(0, Relaxed);
            }
            self.head += c.ncells as u64;
            self.publish();
        }
    }

    /// Whether a frame (or skip marker) is waiting or held.
    #[inline(always)]
    pub fn ready(&self) -> bool {
        if self.cur.is_some() {
            return true;
        }
        let idx = (self.head as usize) & (self.f.n - 1);
        let h = self.f.hdr(idx);
        if h.seq.load(Acquire) != self.head + 1 {
            return false;
        }
        // Inside a packed cell: ready if its next word is written (a sub-frame, or a
        // `CLOSE` after which the next cell may still be empty: a false "maybe").
        self.sub == 0 || {
            // (A PAD says "maybe": what follows it is written before it.)
            let word = self.f.word(idx, self.sub).load(Acquire);
            word & !(KIND | LEN_MASK) == pos_tag(self.head) && word & KIND != 0
        }
    }

    /// Ask for a wakeup. `false` if a frame is already waiting (do not sleep), or if this
    /// consumer declared it never sleeps (then its producer sends no wakeups).
    pub fn arm(&self) -> bool {
        if self.cur.is_some() || self.f.ctl().sleeper.0.load(Relaxed) == 0 {
            return false;
        }
        let a = &self.f.ctl().armed.0;
        a.store(1, SeqCst);
        fence(SeqCst);
        if self.ready() {
            a.store(0, Relaxed);
            return false;
        }
        true
    }
}

impl FifoRef {
    /// Whether this FIFO's consumer may sleep at all (see `FifoCtl::sleeper`).
    #[inline]
    pub fn consumer_may_sleep(&self) -> bool {
        self.ctl().sleeper.0.load(Relaxed) != 0
    }

    /// For a write into the consumer's memory that is not a frame (a same-host peer's
    /// direct put-with-signal): claim the consumer's wakeup request, as `take_armed` does
    /// for frames. The caller's write must be a sequentially consistent read-modify-write
    /// made before this call: then either this load sees `armed`, or the consumer, which
    /// arms with a sequentially consistent store and fence before its last look, sees the
    /// write.
    pub fn claim_wakeup(&self) -> bool {
        self.ctl().armed.0.load(SeqCst) != 0 && self.take_armed()
    }

    /// Claim the consumer's wakeup request (clear `armed`). True if it was set: the
    /// claimer sends the wakeup byte.
    #[inline]
    fn take_armed(&self) -> bool {
        self.ctl().armed.0.swap(0, AcqRel) != 0
    }

    /// Declare whether this FIFO's consumer may sleep (see `FifoCtl::sleeper`). Called by
    /// the consumer's side before the handshake message that lets the producer start.
    pub fn set_sleeper(&self, may_sleep: bool) {
        self.ctl().sleeper.0.store(may_sleep as u32, Release);
    }

    /// Declare whether this FIFO's producer may sleep (see `FifoCtl::room`). Called by the
    /// producer's side during the handshake.
    pub fn set_producer_sleeps(&self, may_sleep: bool) {
        let v = if may_sleep { PRODUCER_SLEEPS } else { 0 };
        self.ctl().room.0.store(v, Release);
    }
}

#[cfg(test)]
impl FifoRef {
    /// Test hook: overwrite the header fields of cell `idx` (len/ncells only).
    pub fn corrupt(&self, idx: usize, len: Option<u32>, ncells: Option<u32>) {
        let h = self.hdr(idx);
        if let Some(l) = len {
            h.len.store(l, Relaxed);
        }
        if let Some(c) = ncells {
            h.ncells.store(c, Relaxed);
        }
    }

    /// Test hook: overwrite payload bytes of cell `idx` from offset `off`.
    pub fn corrupt_payload(&self, idx: usize, off: usize, bytes: &[u8]) {
        assert!(CELL_HDR + off + bytes.len() <= CELL);
        // SAFETY: inside cell idx, checked just above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.cell(idx).add(CELL_HDR + off),
                bytes.len(),
            )
        };
    }

    /// Test hook: overwrite the consumer position.
    pub fn set_tail(&self, t: u64) {
        self.ctl().tail.0.store(t, Release);
    }
}

/// Read the frames a peer could have published in a FIFO of `MIN_CELLS` cells whose cells
/// hold `bytes` (repeated to fill them), as a link's consumer does, for fuzzing. A cell's
/// `seq` is made that of a published cell unless its lowest bit is set (then it stays as
/// the bytes say), so that the fuzzer reaches the cell checks. Every frame handed out lies
/// inside the cells and within the FIFO's largest frame, and parses from the receive
/// path's private copy (`RawFrame::split`) as it does whole. The frames read, until the FIFO
/// has nothing more or refuses a cell.
#[cfg(any(test, feature = "fuzzing"))]
pub fn fuzz_consumer(bytes: &[u8]) -> usize {
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Block([u8; 64]);
    const N: usize = crate::wire::shm::MIN_CELLS;
    let size = CTL_SIZE + N * CELL;
    let mut mem = vec![Block([0; 64]); size / 64];
    let base = mem.as_mut_ptr().cast::<u8>();
    if !bytes.is_empty() {
        // SAFETY: `mem` is `size` bytes; the cells start at CTL_SIZE < size.
        let cells = unsafe { std::slice::from_raw_parts_mut(base.add(CTL_SIZE), N * CELL) };
        for (d, s) in cells.iter_mut().zip(bytes.iter().cycle()) {
            *d = *s;
        }
        for (i, c) in cells.chunks_exact_mut(CELL).enumerate() {
            let mut seq = [0u8; 8];
            seq.copy_from_slice(&c[..8]);
            if u64::from_ne_bytes(seq) & 1 == 0 {
                c[..8].copy_from_slice(&(i as u64 + 1).to_ne_bytes());
            }
        }
    }
    // SAFETY: `mem` holds a FIFO of N cells, 64-aligned, and outlives the consumer.
    let mut c = Consumer::new(unsafe { FifoRef::new(base, N) });
    let (lo, hi) = (base as usize + CTL_SIZE, base as usize + size);
    let mut read = 0;
    // A lap and more: the consumer must stop (nothing more, or a refusal) in any case.
    for _ in 0..4 * N * (PACK_ROOM / SUB_HDR) {
        match c.peek() {
            Ok(Some(f)) => {
                let at = f.ptr as usize;
                assert!(at >= lo && at + f.len <= hi, "a frame outside the cells");
                assert!(f.len <= c.max_frame, "a frame over the largest");
                // As the receive path reads it: the parser sees a private copy of the
                // header and of any structured rest, and agrees with a parse of the
                // whole frame copied out.
                let (mut head, mut copy) = (crate::transport::HeadBuf::new(), Vec::new());
                // SAFETY: the frame is inside `mem`, between peek and consume.
                let (split, whole) = unsafe { (f.split(&mut head, &mut copy), f.copy_whole()) };
                assert_eq!(
                    crate::wire::frame::Frame::parse_parts(split.head, split.rest),
                    crate::wire::frame::Frame::parse(&whole),
                    "a split frame parses otherwise than the whole frame"
                );
                read += 1;
                c.consume();
            }
            Ok(None) | Err(_) => return read,
        }
    }
    panic!("the consumer read {read} frames from {N} cells and did not stop");
}
