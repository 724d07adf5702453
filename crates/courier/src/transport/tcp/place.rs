//! Direct placement: the payload of a large frame goes from the socket straight into its
//! destination, without passing through the receive buffer.
//!
//! When the next frame is at least [`PLACE_MIN`] bytes and not complete, `peek_partial`
//! shows the protocol the part that is buffered. The protocol either names where the
//! payload goes (`place`: the frame's bytes from some offset on, into memory it has checked
//! and keeps valid), declines (`decline`: the frame is buffered whole, as any other), or
//! waits for more of the head. Once placed, the head stays in the buffer, the payload bytes
//! already buffered are copied out once, and every later read is a `readv` into the
//! destination (and, after the payload's end, into the buffer for the frames that follow).
//! When the payload is complete, `take_placed` hands the head back for the protocol to
//! finish the operation; `consume` releases it. A close or reset before that is reported
//! as the link's failure, so the operation fails instead of waiting.

use rustix::io::{Errno, IoSliceMut};

use super::{HDR, RawFrame, Rx};
use crate::base::{Error, Result, Status};

/// Frames at least this long (after the length prefix) are offered for direct placement.
pub const PLACE_MIN: usize = 32 << 10;
/// After a placed frame, bytes read into the buffer until the protocol has seen the next
/// frame's head (a length prefix and any placeable frame's header fit).
pub(super) const NEXT_HEAD: usize = 512;
/// Destination segments filled by one `readv` (plus one for the receive buffer).
const PLACE_IOV: usize = 15;

/// A frame whose payload is being read into the protocol's memory.
pub(super) struct Placing {
    /// Bytes of the frame kept in the buffer at `start`: the length prefix and the head.
    head: usize,
    /// Bytes of the frame after the head.
    payload: usize,
    segs: Vec<(usize, usize)>,
    /// Next byte to fill: segment and offset in it.
    idx: usize,
    off: usize,
    /// Payload bytes still to come.
    left: usize,
    /// Asked before every read into the destination: whether it may still be written (a
    /// put's region that its owner unmaps meanwhile may not).
    guard: Option<super::super::PlaceGuard>,
    /// The guard said no: the rest of the payload is read and dropped.
    lost: bool,
}

/// Bytes of a payload whose destination went away read per call into this much scratch.
const LOST_CHUNK: usize = 64 << 10;

impl Placing {
    /// Copy `src` to the next destination bytes.
    ///
    /// # Safety
    /// The segments are valid for writes (the `place` contract) and `src.len() <= left`.
    unsafe fn fill(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            let (a, l) = self.segs[self.idx];
            let n = (l - self.off).min(src.len());
            // SAFETY: inside the segment; the source is the receive buffer, a different
            // allocation.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (a + self.off) as *mut u8, n) };
            self.advance(n);
            src = &src[n..];
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.left -= n;
        while n > 0 {
            let l = self.segs[self.idx].1;
            let k = (l - self.off).min(n);
            self.off += k;
            n -= k;
            if self.off == l {
                self.idx += 1;
                self.off = 0;
            }
        }
    }
}

impl Rx {
    /// The frame length in the prefix at `start` (the preamble is checked, a header is
    /// buffered).
    fn next_len(&self) -> Option<usize> {
        if self.need_preamble || self.end - self.start < HDR {
            return None;
        }
        let mut h = [0u8; HDR];
        h.copy_from_slice(&self.buf[self.start..self.start + HDR]);
        Some(u32::from_le_bytes(h) as usize)
    }

    /// Whether the next frame, if incomplete, is one to offer for placement.
    pub(super) fn placeable(&self, len: usize) -> bool {
        len >= PLACE_MIN && self.placing_user && !self.declined
    }

    /// The buffered start of the next frame, if it is large, incomplete, and not yet
    /// offered and declined: (the buffered bytes after the length prefix, the frame length).
    pub(crate) fn peek_partial(&mut self) -> Option<(RawFrame, usize)> {
        self.placing_user = true;
        if self.out != 0 || self.place.is_some() || self.failed.is_some() {
            return None;
        }
        let len = self.next_len()?;
        let have = self.end - self.start - HDR;
        if !self.placeable(len) || have >= len || len > super::MAX_FRAME {
            return None;
        }
        let ptr = self.buf.as_ptr().wrapping_add(self.start + HDR);
        self.offered = true;
        Some((RawFrame::private(ptr, have), len))
    }

    /// The protocol keeps the next large frame whole in the buffer.
    pub(crate) fn decline(&mut self) {
        self.declined = true;
        self.after_placed = false;
    }

    /// Bytes to read into the buffer now. After a placed frame the next one is likely
    /// large too: while its head may not have been offered yet, only up to `NEXT_HEAD` of
    /// it is buffered, so that the rest goes straight to its destination instead of being
    /// read here and copied out.
    pub(super) fn read_budget(&self) -> usize {
        if !self.after_placed || self.declined {
            return super::RX_BUDGET;
        }
        let have = self.end - self.start;
        match self.next_len() {
            Some(len) if !self.placeable(len) => super::RX_BUDGET,
            _ if have < NEXT_HEAD => NEXT_HEAD - have,
            // The head is here: nothing more until the protocol has seen it (it looks at
            // every link with bytes buffered, in the same progress call).
            _ if !self.offered => 0,
            // It saw the head and waits for more of it: read on as usual.
            _ => super::RX_BUDGET,
        }
    }

    /// Read the next frame's bytes from `data_start` (counted after the length prefix) into
    /// `segs`, whose lengths must add up to the rest of the frame. `false` (nothing done)
    /// if they do not, or if the frame is not the one `peek_partial` offered.
    ///
    /// # Safety
    /// Every segment must be valid for writes of its length until the frame is taken with
    /// `take_placed` or the link is dropped, and must not overlap another.
    pub(crate) unsafe fn place(
        &mut self,
        data_start: usize,
        segs: Vec<(usize, usize)>,
        guard: Option<super::super::PlaceGuard>,
    ) -> bool {
        if self.peek_partial().is_none() {
            return false;
        }
        let Some(len) = self.next_len() else {
            return false;
        };
        let have = self.end - self.start - HDR;
        let total: usize = segs.iter().map(|s| s.1).sum();
        if data_start > have || data_start > len || total != len - data_start {
            return false;
        }
        let head = HDR + data_start;
        let mut p = Placing {
            head,
            payload: len - data_start,
            segs: segs.into_iter().filter(|s| s.1 > 0).collect(),
            idx: 0,
            off: 0,
            left: len - data_start,
            guard,
            lost: false,
        };
        let buffered = self.start + head..self.end;
        // SAFETY: the caller's contract; `buffered` is shorter than the payload (the frame
        // is incomplete).
        unsafe { p.fill(&self.buf[buffered]) };
        // Keep only the head, at the front, so the buffer has room for what follows.
        self.buf.copy_within(self.start..self.start + head, 0);
        self.start = 0;
        self.end = head;
        self.place = Some(p);
        true
    }

    /// The placed frame, once its whole payload arrived: (its head after the length
    /// prefix, the payload length). `consume` releases it.
    pub(crate) fn take_placed(&mut self) -> Option<(RawFrame, usize)> {
        let p = self.place.as_ref()?;
        if p.left > 0 || self.out != 0 {
            return None;
        }
        self.out = p.head;
        let ptr = self.buf.as_ptr().wrapping_add(self.start + HDR);
        Some((RawFrame::private(ptr, p.head - HDR), p.payload))
    }

    /// The length of the frame handed out, a placed one's payload included.
    pub(super) fn out_len(&self) -> usize {
        self.place.as_ref().map_or(self.out, |p| p.head + p.payload)
    }

    /// Whether a placed frame is complete and waits for `take_placed`.
    pub(super) fn placed_ready(&self) -> bool {
        self.place.as_ref().is_some_and(|p| p.left == 0)
    }

    /// `on_readable` while a frame is being placed.
    pub(super) fn read_placing(&mut self) -> Result<()> {
        let mut budget = super::RX_BUDGET;
        while budget > 0 && self.closed.is_none() {
            let Some(p) = self.place.as_mut() else { break };
            if p.left == 0 {
                break;
            }
            if !p.lost && p.guard.as_mut().is_some_and(|still| !still()) {
                // The destination went away (its region was unmapped): nothing more is
                // written there; the rest of the payload is read and dropped.
                p.lost = true;
                self.scratch.resize(LOST_CHUNK, 0);
            }
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(PLACE_IOV + 1);
            let mut dst = 0;
            let (mut idx, mut off) = (p.idx, p.off);
            if p.lost {
                dst = p.left.min(LOST_CHUNK);
                iov.push(IoSliceMut::new(&mut self.scratch[..dst]));
            }
            while !p.lost && iov.len() < PLACE_IOV && dst < p.left {
                let (a, l) = p.segs[idx];
                let n = (l - off).min(p.left - dst);
                // SAFETY: the `place` contract: the segment is valid for writes and nothing
                // else refers to it while the frame is placed.
                iov.push(IoSliceMut::new(unsafe {
                    std::slice::from_raw_parts_mut((a + off) as *mut u8, n)
                }));
                dst += n;
                idx += 1;
                off = 0;
            }
            // The start of what follows lands in the buffer, in the same call: up to the
            // next frame's head, which may be placed too (`read_budget`).
            let mut offered = dst;
            let tail = (self.buf.len() - self.end).min(NEXT_HEAD);
            if dst == p.left && tail > 0 {
                iov.push(IoSliceMut::new(&mut self.buf[self.end..self.end + tail]));
                offered += tail;
            }
            let r = rustix::io::readv(&*self.sock, &mut iov);
            drop(iov);
            match r {
                Ok(0) => {
                    self.closed = Some(Error::msg(
                        Status::PeerFailure,
                        format!(
                            "{} closed the connection in the middle of a frame",
                            self.peer
                        ),
                    ));
                }
                Ok(n) => {
                    self.received = self.received.wrapping_add(n as u64);
                    let to_dst = n.min(dst);
                    if p.lost {
                        p.left -= to_dst;
                    } else {
                        p.advance(to_dst);
                    }
                    self.end += n - to_dst;
                    budget = budget.saturating_sub(n);
                    if n < offered {
                        break;
                    }
                }
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => break,
                Err(e) => {
                    self.closed = Some(Error::msg(
                        Status::PeerFailure,
                        format!("connection to {} failed: {e}", self.peer),
                    ));
                }
            }
        }
        if self.placed_ready() {
            return Ok(());
        }
        self.closed.as_ref().map_or(Ok(()), |e| Err(e.clone()))
    }
}
