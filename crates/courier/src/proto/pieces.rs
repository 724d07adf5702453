//! Single-copy rendezvous copies in pieces.
//!
//! On a same-host link a rendezvous moves its data with one copy between the processes
//! (through the peer's shared segment, or CMA): the receiver reads the sender's buffer, and
//! in a split the sender also writes part of the receiver's. A copy longer than
//! `COURIER_RNDV_PIECE` is made one piece per call: the call that starts it copies the first
//! piece, each progress call the next one (the oldest copy first). No call into the library
//! then lasts much longer than one piece, so the worker's other endpoints are served between
//! pieces, and a runtime that takes a long foreign call for a blocked thread (Go hands the
//! caller's processor to another thread) never sees one. What follows a copy (the
//! acknowledgement, the completion) happens when its last piece is in.

use super::core::State;
use super::state::*;
use crate::base::Result;
use crate::wire::frame::Kind;

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

/// A copy with pieces still to make.
pub(crate) struct CopyJob {
    pub ep: u32,
    key: Option<Box<[u8]>>,
    local: Vec<(usize, usize)>,
    remote: Vec<(u64, u64)>,
    write: bool,
    /// Bytes copied so far, of `len`.
    done: usize,
    len: usize,
    after: AfterCopy,
}

impl State {
    /// Copy between `local` segments here and `remote` segments of the peer of `e` (read
    /// them, or `write` them) as `peer_copy` does, then act on the outcome as `after` says:
    /// at once when the copy fits one piece, otherwise its first piece now and the others in
    /// later progress calls.
    ///
    /// # Safety
    /// `local` segments must be valid for writes (reads when `write`) of their lengths until
    /// `after` has run, or until the endpoint fails (which drops the copy).
    pub(crate) unsafe fn copy_then(
        &mut self,
        e: u32,
        key: Option<&[u8]>,
        local: Vec<(usize, usize)>,
        remote: Vec<(u64, u64)>,
        write: bool,
        after: AfterCopy,
    ) {
        let len: usize = local.iter().map(|&(_, l)| l).sum();
        let piece = self.cfg.rndv_piece.unwrap_or(usize::MAX);
        if len <= piece {
            // SAFETY: forwarded contract.
            let res = unsafe { self.peer_copy(e, key, &local, &remote, write, true) };
            self.after_copy(e, after, res);
            return;
        }
        let mut job = CopyJob {
            ep: e,
            key: key.map(Box::from),
            local,
            remote,
            write,
            done: 0,
            len,
            after,
        };
        // SAFETY: forwarded contract.
        match unsafe { self.copy_piece(&mut job, piece) } {
            Ok(()) => self.copies.push_back(job),
            Err(err) => self.after_copy(e, after, Err(err)),
        }
    }

    /// Copy the next piece of `job`.
    ///
    /// # Safety
    /// As `copy_then`, for the job's segments.
    unsafe fn copy_piece(&mut self, job: &mut CopyJob, piece: usize) -> Result<()> {
        let n = piece.min(job.len - job.done);
        let local = seg_range(&job.local, job.done, n);
        let remote = seg_range(&job.remote, job.done as u64, n as u64);
        let first = job.done == 0;
        // SAFETY: forwarded contract.
        unsafe {
            self.peer_copy(
                job.ep,
                job.key.as_deref(),
                &local,
                &remote,
                job.write,
                first,
            )
        }?;
        job.done += n;
        Ok(())
    }

    /// Copy one piece of the oldest unfinished copy. Returns 1 if there was one, else 0.
    pub(crate) fn progress_copies(&mut self) -> usize {
        let Some(mut job) = self.copies.pop_front() else {
            return 0;
        };
        let piece = self.cfg.rndv_piece.unwrap_or(usize::MAX);
        // SAFETY: a queued job's segments stay valid until its `after` runs (`copy_then`);
        // an endpoint that fails drops its jobs first.
        match unsafe { self.copy_piece(&mut job, piece) } {
            Ok(()) if job.done < job.len => self.copies.push_front(job),
            res => self.after_copy(job.ep, job.after, res),
        }
        1
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
                if let Some(w) = self.splits.iter_mut().find(|w| w.rreq == rreq && w.ep == e) {
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
