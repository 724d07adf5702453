//! Single-copy rendezvous copies in pieces.
//!
//! On a same-host link a rendezvous moves its data with one copy between the processes
//! (through the peer's shared segment, or CMA): the receiver reads the sender's buffer, and
//! in a split the sender also writes part of the receiver's. A progress call copies about
//! one piece's bytes in all. Whole copies are made while they fit in what is left of the
//! call's piece, so many small receives started by handlers are made in the call that starts
//! them, as one started outside progress is. A copy longer than a piece is made one piece
//! per call: the call that starts it copies the first piece, each later progress call the
//! next, the oldest copy first. Copies that do not fit (a sender whose receiver asks for
//! several split parts at once, say) wait their turn in later calls. A piece
//! is what this worker copies in about
//! `PIECE_TIME` at the speed its last copies went, at most `COURIER_RNDV_PIECE`: a megabyte
//! while the data stays in cache, less when it streams from memory. No call into the library
//! then lasts much longer than `PIECE_TIME` per copy, so the worker's other endpoints are
//! served between pieces, and a runtime that takes a long foreign call for a blocked thread
//! (Go hands the processor of a goroutine that stays in C across two 20 us ticks of its
//! monitor to another thread) never sees one. What follows a copy (the acknowledgement, the
//! completion) happens when its last piece is in.

use std::time::{Duration, Instant};

use super::State;
use super::buf::{Segs, seg_range};
use crate::base::Result;
use crate::wire::frame::Kind;

/// About how long copying one piece takes.
const PIECE_TIME: Duration = Duration::from_micros(30);
/// The smallest piece, however slow the copies.
const MIN_PIECE: usize = 64 << 10;
/// One copy in this many that could size the pieces is timed (`State::clock`).
const TIMED_EVERY: u32 = 4;

/// What follows a copy, with its outcome.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AfterCopy {
    /// A receiver read a whole message: acknowledge send `sreq`, complete receive `rreq`.
    Read { rreq: u64, sreq: u64 },
    /// A receiver read its own part of split receive `rreq`.
    SplitOwn { rreq: u64 },
    /// A sender wrote its part of split receive `rreq` into the receiver: answer it.
    SplitRest { rreq: u64 },
}

/// Which way a single-copy rendezvous copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Read the peer's memory into host memory here.
    Read,
    /// Read the peer's host memory into device memory here (a tag receive into device
    /// memory), through page-locked pieces that the device copies in while the CPU reads
    /// the next (`stage::to_device_bounced`).
    ReadToDevice,
    /// Write host memory here into the peer's.
    Write,
}

/// A copy with pieces still to make.
pub(crate) struct CopyJob {
    pub(in crate::proto) ep: u32,
    key: Option<Box<[u8]>>,
    local: Segs<usize>,
    remote: Segs<u64>,
    dir: Dir,
    /// Device memory on either side: copied whole (`copy_then`).
    device: bool,
    /// Bytes copied so far, of `len`.
    done: usize,
    len: usize,
    after: AfterCopy,
}

impl State {
    /// Copy between `local` segments here and `remote` segments of the peer of `e` as `dir`
    /// says, as `peer_copy` does, then act on the outcome as `after` says:
    /// at once when the copy fits one piece, otherwise its first piece now and the others in
    /// later progress calls. Inside a progress call, a copy waits for later calls while
    /// older copies wait, or when this call has copied already and the copy does not fit in
    /// what is left of its piece.
    ///
    /// # Safety
    /// `local` segments must be valid for writes (reads for `Dir::Write`) of their lengths until
    /// `after` has run, or until the endpoint fails (which drops the copy).
    pub(crate) unsafe fn copy_then(
        &mut self,
        e: u32,
        key: Option<&[u8]>,
        local: Segs<usize>,
        remote: Segs<u64>,
        dir: Dir,
        after: AfterCopy,
    ) {
        let len: usize = local.iter().map(|&(_, l)| l).sum();
        // A peer's device memory, or device memory here, is copied whole: the device's part
        // overlaps the CPU's only within one call, and its speed says nothing about the
        // CPU's copies.
        let device = dir == Dir::ReadToDevice || key.is_some_and(super::memreg::is_device_key);
        let mut job = CopyJob {
            ep: e,
            key: None,
            local,
            remote,
            dir,
            device,
            done: 0,
            len,
            after,
        };
        let piece = if device { usize::MAX } else { self.piece() };
        if self.progress.in_progress
            && (!self.rndv.copies.is_empty() || !self.fits_call(device, len, piece))
        {
            // Older copies wait, or this progress call has spent its piece: after them.
            job.key = key.map(Box::from);
            self.rndv.copies.push_back(job);
            return;
        }
        if len <= piece {
            let t = self.clock(device, len);
            // SAFETY: forwarded contract.
            let res = unsafe { self.peer_copy(e, key, &job.local, &job.remote, dir, true) };
            self.copied(device, len, t);
            self.after_copy(e, after, res);
            return;
        }
        job.key = key.map(Box::from);
        // SAFETY: forwarded contract.
        match unsafe { self.copy_piece(&mut job, piece) } {
            Ok(()) if job.done < job.len => self.rndv.copies.push_back(job),
            Ok(()) => self.after_copy(e, after, Ok(())),
            Err(err) => self.after_copy(e, after, Err(err)),
        }
    }

    /// Copy the next piece of `job`.
    ///
    /// # Safety
    /// As `copy_then`, for the job's segments.
    unsafe fn copy_piece(&mut self, job: &mut CopyJob, piece: usize) -> Result<()> {
        let device = job.device;
        let n = if device {
            job.len - job.done
        } else {
            piece.min(job.len - job.done)
        };
        let local = seg_range(&job.local, job.done, n);
        let remote = seg_range(&job.remote, job.done as u64, n as u64);
        let first = job.done == 0;
        let t = self.clock(device, n);
        // SAFETY: forwarded contract.
        unsafe { self.peer_copy(job.ep, job.key.as_deref(), &local, &remote, job.dir, first) }?;
        self.copied(device, n, t);
        job.done += n;
        Ok(())
    }

    /// Whether a copy with `rest` bytes to go may start in this progress call, whose piece is
    /// `piece`: always as its first copy, else whole in what is left of the piece. A peer's
    /// device memory is copied whole, by the device, and only as a call's first copy.
    fn fits_call(&self, device: bool, rest: usize, piece: usize) -> bool {
        self.rndv.copy_spent == 0 || (!device && rest <= piece.saturating_sub(self.rndv.copy_spent))
    }

    /// When a copy of `n` bytes starts, if it is to be timed: one in `TIMED_EVERY` of those
    /// that size the pieces (host copies of at least `MIN_PIECE`, with pieces on). Reading
    /// the clock twice costs about 5% of a 64 KiB copy, and the speed changes slowly.
    fn clock(&mut self, device: bool, n: usize) -> Option<Instant> {
        if device || n < MIN_PIECE || self.cfg.rndv_piece.is_none() {
            return None;
        }
        self.rndv.copies_untimed += 1;
        if self.rndv.copies_untimed < TIMED_EVERY {
            return None;
        }
        self.rndv.copies_untimed = 0;
        Some(Instant::now())
    }

    /// A copy of `n` bytes was made, timed from `t` if `clock` said so. A peer's device
    /// memory is copied whole, by the device (the call only waits for its DMA; pieces would
    /// each add a driver call and a synchronization): it spends the call's piece, and its
    /// speed says nothing about the CPU's copies.
    fn copied(&mut self, device: bool, n: usize, t: Option<Instant>) {
        if device {
            self.rndv.copy_spent = usize::MAX;
            return;
        }
        self.rndv.copy_spent = self.rndv.copy_spent.saturating_add(n);
        if let Some(t) = t {
            self.copy_took(n, t.elapsed());
        }
    }

    /// The size of the next piece.
    fn piece(&self) -> usize {
        match self.cfg.rndv_piece {
            Some(max) => self.rndv.piece_bytes.clamp(MIN_PIECE.min(max), max),
            None => usize::MAX,
        }
    }

    /// A copy of `n` bytes (at least `MIN_PIECE`) took `took`: size the next pieces to take
    /// about `PIECE_TIME` (half the old size, half what this speed gives, so one slow copy
    /// does not swing it).
    fn copy_took(&mut self, n: usize, took: Duration) {
        if let Some(max) = self.cfg.rndv_piece {
            self.rndv.piece_bytes = next_piece(self.rndv.piece_bytes, n, took, max);
        }
    }

    /// Copy what this progress call's piece has left room for: whole queued copies, oldest
    /// first, while they fit, or one piece of the oldest if it is the call's first copy.
    /// Returns how many copies (or pieces) were made.
    pub(crate) fn progress_copies(&mut self) -> usize {
        let mut n = 0;
        while let Some(mut job) = self.rndv.copies.pop_front() {
            let piece = self.piece();
            if !self.fits_call(job.device, job.len - job.done, piece) {
                self.rndv.copies.push_front(job);
                break;
            }
            n += 1;
            // SAFETY: a queued job's segments stay valid until its `after` runs
            // (`copy_then`); an endpoint that fails drops its jobs first.
            match unsafe { self.copy_piece(&mut job, piece) } {
                Ok(()) if job.done < job.len => {
                    self.rndv.copies.push_front(job);
                    break;
                }
                res => self.after_copy(job.ep, job.after, res),
            }
        }
        n
    }

    fn after_copy(&mut self, e: u32, after: AfterCopy, res: Result<()>) {
        match after {
            AfterCopy::Read { rreq, sreq } => {
                self.send_status(e, Kind::RndvAts, sreq, &res);
                match res {
                    Ok(()) => self.finish_recv(rreq),
                    Err(err) => self.complete(rreq, Err(err)),
                }
            }
            AfterCopy::SplitOwn { rreq } => {
                if let Some(w) = self
                    .rndv
                    .splits
                    .iter_mut()
                    .find(|w| w.rreq == rreq && w.ep == e)
                {
                    w.own = Some(res);
                }
                self.end_split(e, rreq);
            }
            AfterCopy::SplitRest { rreq } => {
                if let Err(err) = &res {
                    tracing::debug!("split rendezvous: writing to the receiver failed: {err}");
                }
                self.send_status(e, Kind::RndvSplitDone, rreq, &res);
            }
        }
    }
}

/// The piece after one of `n` bytes that took `took`, when the last was `old` (at most
/// `max`): halfway between `old` and what this speed copies in `PIECE_TIME`.
fn next_piece(old: usize, n: usize, took: Duration, max: usize) -> usize {
    let ns = took.as_nanos().max(1);
    let fit = (n as u128 * PIECE_TIME.as_nanos() / ns).min(max as u128) as usize;
    old.min(max) / 2 + fit / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_copy_speed_within_bounds() {
        let max = 1 << 20;
        let us = Duration::from_micros;
        // 1 MiB in 10 us (cache): the next piece stays the largest.
        assert_eq!(next_piece(max, max, us(10), max), max);
        // 1 MiB in 90 us (memory): pieces shrink toward what 30 us copies (about 350 KiB).
        let mut p = max;
        for _ in 0..20 {
            p = next_piece(p, p, us(90) * (p as u32) / (max as u32), max);
        }
        assert!((330_000..370_000).contains(&p), "{p}");
        // A slow copy is weighed against the old size, not taken alone.
        assert_eq!(next_piece(max, max, us(3000), max), max / 2 + 10_485 / 2);
        // Never above the maximum, whatever the speed; a zero time counts as 1 ns.
        assert_eq!(next_piece(2 * max, max, Duration::ZERO, max), max);
    }
}
