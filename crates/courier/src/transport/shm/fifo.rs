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
//! The consumer publishes its progress in `tail` (its own cache line), which the producer
//! reads only when its cached copy says the FIFO is full. On consume, the consumer zeroes the
//! `seq` word of every non-first cell of the frame (payload bytes there could otherwise look
//! like a future `seq`). `armed` asks the producer for a wakeup byte on the socket.
//!
//! Everything read from the segment is validated: the peer may be buggy or hostile.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*, fence};

use super::segment::{CELL, CELL_HDR, CTL_SIZE};
use crate::base::sys::copy_small;
use crate::base::{Error, Result, Status};
use crate::transport::{RawFrame, TxError};

/// `len` value of a skip-to-end marker.
const SKIP: u32 = u32::MAX;

#[repr(C, align(64))]
struct Line<T>(T);

/// FIFO control block (CTL_SIZE bytes before the cells).
#[repr(C)]
pub(super) struct FifoCtl {
    /// Cells consumed so far (written by the consumer only).
    tail: Line<AtomicU64>,
    /// Non-zero: the consumer sleeps and wants a wakeup byte.
    armed: Line<AtomicU32>,
    /// Non-zero: the consumer may sleep at all (its context asked for wakeup). Written by
    /// the consumer's side during the handshake, before the producer's first frame; the
    /// producer pays the store-load fence of the wakeup protocol only when it is set.
    sleeper: Line<AtomicU32>,
}
const _: () = assert!(std::mem::size_of::<FifoCtl>() <= CTL_SIZE);

/// Header at the start of a frame's first cell.
#[repr(C)]
struct CellHdr {
    seq: AtomicU64,
    len: AtomicU32,
    ncells: AtomicU32,
}
const _: () = assert!(std::mem::size_of::<CellHdr>() == CELL_HDR);

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
}

impl Producer {
    pub fn new(f: FifoRef) -> Producer {
        Producer {
            f,
            head: 0,
            tail_cache: 0,
            max_frame: max_frame(f.n),
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
        let (idx, k) = self.reserve(len)?;
        let cell = self.f.cell(idx);
        let mut off = CELL_HDR;
        for p in parts {
            // SAFETY: `reserve` gave cells idx..idx + k (idx + k <= n), so [cell + 16,
            // cell + 16 + len) is inside the array; the consumer has released them and does
            // not read them until `seq` is published.
            unsafe { copy_small(p.as_ptr(), cell.add(off), p.len()) };
            off += p.len();
        }
        Ok(self.publish(idx, len, k))
    }

    /// `push` of a frame in three parts (header, extra bytes, data): the small-message
    /// send, without building a list of parts and walking it.
    #[inline(always)]
    pub fn push3(&mut self, a: &[u8], b: &[u8], c: &[u8]) -> Result<bool, TxError> {
        let len = a.len() + b.len() + c.len();
        let (idx, k) = self.reserve(len)?;
        // SAFETY: as in `push`: the three parts end at cell + 16 + len, inside the cells
        // `reserve` gave.
        unsafe {
            let dst = self.f.cell(idx).add(CELL_HDR);
            copy_small(a.as_ptr(), dst, a.len());
            copy_small(b.as_ptr(), dst.add(a.len()), b.len());
            copy_small(c.as_ptr(), dst.add(a.len() + b.len()), c.len());
        }
        Ok(self.publish(idx, len, k))
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
            return Err(TxError::NoResource);
        }
        Ok(())
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

    /// Publish the frame of `len` bytes written into cells idx..idx + k. True if the
    /// consumer is armed (asleep, wants a wakeup).
    #[inline]
    fn publish(&mut self, idx: usize, len: usize, k: usize) -> bool {
        let h = self.f.hdr(idx);
        h.len.store(len as u32, Relaxed);
        h.ncells.store(k as u32, Relaxed);
        h.seq.store(self.head + 1, Release);
        self.head += k as u64;
        if self.f.ctl().sleeper.0.load(Relaxed) == 0 {
            // This consumer never sleeps: no wakeup protocol, no fence.
            return false;
        }
        // Pairs with the fence in `Consumer::arm`: either we see `armed`, or the consumer
        // sees our `seq` before it sleeps.
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
}

/// The reading end.
pub(super) struct Consumer {
    f: FifoRef,
    head: u64,
    /// The position last stored in `tail` for the producer.
    published: u64,
    max_frame: usize,
    cur: Option<Current>,
}

impl Consumer {
    pub fn new(f: FifoRef) -> Consumer {
        Consumer {
            f,
            head: 0,
            published: 0,
            max_frame: max_frame(f.n),
            cur: None,
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
    }

    #[cold]
    fn bad(&self, what: String) -> Error {
        Error::msg(
            Status::ProtocolError,
            format!("shm: corrupt FIFO cell at position {}: {what}", self.head),
        )
    }

    /// The next frame, not consumed. No system call, no allocation.
    #[inline]
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
        // The usual frame, checked in line; skip markers and bad cells go the long way.
        if (len as usize) <= self.max_frame
            && ncells == cells_for(len as usize)
            && idx + ncells <= n
        {
            let c = Current {
                idx,
                len: len as usize,
                ncells,
            };
            self.cur = Some(c);
            return Ok(Some(self.frame(c)));
        }
        self.peek_slow(idx, len, ncells)
    }

    #[inline]
    fn frame(&self, c: Current) -> RawFrame {
        // SAFETY: the frame's cells are inside the array (validated when `cur` was set).
        let ptr = unsafe { self.f.cell(c.idx).add(CELL_HDR) };
        RawFrame { ptr, len: c.len }
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
            for i in 1..c.ncells {
                // Payload bytes in these cells could look like a later lap's `seq`.
                self.f.hdr(c.idx + i).seq.store(0, Relaxed);
            }
            self.head += c.ncells as u64;
            self.publish();
        }
    }

    /// Whether a frame (or skip marker) is waiting or held.
    #[inline]
    pub fn ready(&self) -> bool {
        if self.cur.is_some() {
            return true;
        }
        let idx = (self.head as usize) & (self.f.n - 1);
        self.f.hdr(idx).seq.load(Acquire) == self.head + 1
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

    /// Test hook: overwrite the consumer position.
    pub fn set_tail(&self, t: u64) {
        self.ctl().tail.0.store(t, Release);
    }
}
