//! The sending half: the send queue, coalescing, sends from the caller's buffer, and
//! their completion reports.

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use super::*;

impl Tx {
    /// The peer's address.
    #[cfg(test)]
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Bytes queued in user space (copied or referenced), not yet taken by the kernel.
    pub fn queued(&self) -> usize {
        self.q.len() + self.ref_bytes
    }

    /// Queued bytes the kernel has taken so far (a count that only grows, modulo 2^64).
    pub fn drained(&self) -> u64 {
        self.drained
    }

    fn fail(&mut self, what: &str, e: Errno) -> Error {
        let err = match e {
            Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN | Errno::SHUTDOWN => Error::msg(
                Status::PeerFailure,
                format!(
                    "{what} to {}: the peer closed the connection ({e})",
                    self.peer
                ),
            ),
            _ => Error::msg(Status::PeerFailure, format!("{what} to {}: {e}", self.peer)),
        };
        self.failed = Some(err.clone());
        err
    }

    /// One non-blocking write of `iov`; bytes taken (0 if the socket is full). A single
    /// piece goes with `send`, which spares the kernel importing a message header and an
    /// iovec (about 40 ns per call on loopback).
    fn write(sock: &OwnedFd, iov: &[IoSlice<'_>]) -> std::result::Result<usize, Errno> {
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        #[cfg(test)]
        super::tests::WRITE_CALLS.with(|c| c.set(c.get() + 1));
        loop {
            let r = match iov {
                [one] => net::send(sock, one, flags),
                _ => net::sendmsg(sock, iov, &mut SendAncillaryBuffer::default(), flags),
            };
            match r {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) | Err(Errno::NOBUFS) | Err(Errno::NOMEM) => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a write may take bytes now: always, unless the kernel refused bytes since
    /// the last write that it took whole (`full`); then only once `poll` reports the
    /// socket writable (about a third of its send buffer free), an error or a hang-up
    /// (which the write then reports). `poll` takes no socket lock and imports no iovec,
    /// where a refused `sendmsg` does both.
    fn writable(&mut self) -> bool {
        if !self.full {
            return true;
        }
        let mut fds = [PollFd::from_borrowed_fd(self.sock.as_fd(), PollFlags::OUT)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&now)) {
            Ok(0) => false,
            // Writable, failed or closed; or poll itself failed (EINTR, ENOMEM): let the
            // write find out, as it did before this check.
            _ => {
                self.full = false;
                true
            }
        }
    }

    pub(crate) fn send(&mut self, parts: &[&[u8]]) -> Result<(), TxError> {
        self.send_frame(parts, None, 0).map(|_| ())
    }

    /// Like `send`, but a large frame's unwritten rest in `parts[first_ref..]` is kept by
    /// reference, not copied (the parts before, headers on the caller's stack, always are):
    /// `Sent::Later` means that memory is still in use until `token` comes out of
    /// `take_completed` (token 0: never reported; for all but the last frame of an
    /// operation, which finish before it). Small frames are copied and answer `Done`.
    pub(crate) fn send_zc(
        &mut self,
        parts: &[&[u8]],
        first_ref: usize,
        token: u64,
    ) -> Result<Sent, TxError> {
        let sent = self.send_frame(parts, Some(first_ref), token)?;
        if sent == Sent::Done && token != 0 && self.ref_bytes > 0 {
            // This frame was copied, but earlier frames of the same operation may still be
            // written from its memory: report the token once everything queued now is out.
            self.segs.push_back(Seg::Ref {
                addr: 0,
                len: 0,
                token,
            });
            return Ok(Sent::Later);
        }
        Ok(sent)
    }

    /// Tokens of `send_zc` frames whose last byte the kernel took, appended to `out`.
    #[inline]
    pub(crate) fn take_completed(&mut self, out: &mut Vec<u64>) {
        if !self.completed.is_empty() {
            out.append(&mut self.completed);
        }
    }

    /// Forget every queued byte, references to callers' memory included (their requests are
    /// about to fail). A frame cut short would corrupt the stream, so if anything was
    /// queued the link counts as failed from now on.
    pub(crate) fn abandon(&mut self, why: &Error) {
        if self.segs.is_empty() {
            return;
        }
        self.segs.clear();
        self.q.clear();
        self.ref_bytes = 0;
        self.full = false;
        self.completed.clear();
        if self.failed.is_none() {
            self.failed = Some(why.clone());
        }
    }

    /// Queue a frame; with `first_ref`, large frames keep `parts[first_ref..]` by reference.
    fn send_frame(
        &mut self,
        parts: &[&[u8]],
        first_ref: Option<usize>,
        token: u64,
    ) -> Result<Sent, TxError> {
        if let Some(e) = &self.failed {
            return Err(TxError::Failed(e.clone()));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total == 0 || total > self.caps.max_frame {
            return Err(TxError::Failed(Error::msg(
                Status::InvalidParam,
                format!(
                    "tcp frame of {total} bytes to {}: frames must be 1 to {} bytes",
                    self.peer, self.caps.max_frame
                ),
            )));
        }
        let hdr = (total as u32).to_le_bytes();
        if self.queued() > 0 && self.queued() + HDR + total > self.high_water {
            self.flush_within_budget()?;
            if self.queued() > 0 && self.queued() + HDR + total > self.high_water {
                return Err(TxError::NoResource);
            }
        }
        let burst = std::mem::replace(&mut self.burst, true);
        if self.segs.is_empty() && !burst && HDR + total <= SMALL_SEND {
            return self.write_small(&hdr, parts, total);
        }
        let large = HDR + total >= DIRECT_SEND;
        // A lone frame (the first since the last flush) leaves at once: latency. Frames of a
        // burst are coalesced and leave together (at `flush`, or when COALESCE bytes wait);
        // large ones are written from the caller's memory together with what is queued.
        if self.segs.is_empty() && (!burst || large) && parts.len() < MAX_IOV {
            let first_ref = first_ref.filter(|_| large).unwrap_or(usize::MAX);
            return self.write_direct(&hdr, parts, total, first_ref, token);
        }
        if large {
            return self.write_behind(&hdr, parts, first_ref, token);
        }
        self.push_copy(&hdr);
        for p in parts {
            self.push_copy(p);
        }
        if self.queued() >= self.next_flush {
            self.flush_within_budget()?;
        }
        Ok(Sent::Done)
    }

    /// Queue a copy of `b`.
    #[inline]
    pub(super) fn push_copy(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        self.q.push(b);
        match self.segs.back_mut() {
            Some(Seg::Copy(n)) => *n += b.len(),
            _ => self.segs.push_back(Seg::Copy(b.len())),
        }
    }

    /// Queue `b` by reference.
    fn push_ref(&mut self, b: &[u8], token: u64) {
        if b.is_empty() {
            return;
        }
        self.ref_bytes += b.len();
        self.segs.push_back(Seg::Ref {
            addr: b.as_ptr() as usize,
            len: b.len(),
            token,
        });
    }

    /// The queue is empty and the frame small: gather it on the stack and write it with one
    /// `send` (one piece); what the kernel does not take is queued. Always `Done`.
    #[inline]
    fn write_small(
        &mut self,
        hdr: &[u8; HDR],
        parts: &[&[u8]],
        total: usize,
    ) -> Result<Sent, TxError> {
        let len = HDR + total;
        let mut buf = std::mem::MaybeUninit::<[u8; SMALL_SEND]>::uninit();
        let base = buf.as_mut_ptr().cast::<u8>();
        let mut at = 0;
        for piece in std::iter::once(&hdr[..]).chain(parts.iter().copied()) {
            // SAFETY: the pieces add up to `len <= SMALL_SEND` bytes (checked by the
            // caller); `buf` is a different allocation from every piece.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), base.add(at), piece.len()) };
            at += piece.len();
        }
        // SAFETY: the first `len` bytes were written just above.
        let frame = unsafe { std::slice::from_raw_parts(base, len) };
        let wrote = match Self::write(&self.sock, &[IoSlice::new(frame)]) {
            Ok(w) => w,
            Err(e) => return Err(TxError::Failed(self.fail("tcp send", e))),
        };
        if wrote < len {
            self.push_copy(&frame[wrote..]);
            self.full = true;
        }
        self.next_flush = self.queued() + COALESCE;
        Ok(Sent::Done)
    }

    /// The queue is empty: write the frame from the caller's memory with as few `sendmsg`
    /// calls as the kernel allows; its unwritten rest is queued (`parts[first_ref..]` by
    /// reference, the rest copied).
    fn write_direct(
        &mut self,
        hdr: &[u8; HDR],
        parts: &[&[u8]],
        total: usize,
        first_ref: usize,
        token: u64,
    ) -> Result<Sent, TxError> {
        let want = HDR + total;
        let mut skip = 0usize;
        // A large frame may need a few calls: the kernel takes what fits its buffer, and on
        // a fast link (loopback) room opens again soon. Stop at the first refusal, and after
        // a partial write go on only once the socket is writable again.
        for _ in 0..WRITE_TRIES {
            if !self.writable() {
                break;
            }
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n = 0;
            let mut off = skip;
            for piece in std::iter::once(&hdr[..]).chain(parts.iter().copied()) {
                if off >= piece.len() {
                    off -= piece.len();
                    continue;
                }
                iov[n] = IoSlice::new(&piece[off..]);
                off = 0;
                n += 1;
            }
            let wrote = match Self::write(&self.sock, &iov[..n]) {
                Ok(w) => w,
                Err(e) => return Err(TxError::Failed(self.fail("tcp send", e))),
            };
            skip += wrote;
            if skip == want {
                break;
            }
            self.full = true;
            if wrote == 0 {
                break;
            }
        }
        let mut sent = Sent::Done;
        if skip < want {
            // Piece 0 is the length prefix; piece i + 1 is part i.
            for (i, piece) in std::iter::once(&hdr[..])
                .chain(parts.iter().copied())
                .enumerate()
            {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                if i > first_ref {
                    self.push_ref(&piece[skip..], 0);
                    sent = Sent::Later;
                } else {
                    self.push_copy(&piece[skip..]);
                }
                skip = 0;
            }
            if sent == Sent::Later {
                self.set_last_token(token);
            }
        }
        self.next_flush = self.queued() + COALESCE;
        Ok(sent)
    }

    /// Bytes are queued: queue a large frame behind them by reference and write as much as
    /// the kernel takes. Without `first_ref` the frame's unwritten rest is then copied;
    /// with it, parts before `first_ref` are copied at once and the others stay referenced.
    fn write_behind(
        &mut self,
        hdr: &[u8; HDR],
        parts: &[&[u8]],
        first_ref: Option<usize>,
        token: u64,
    ) -> Result<Sent, TxError> {
        self.push_copy(hdr);
        for (i, p) in parts.iter().enumerate() {
            if first_ref.is_some_and(|f| i < f) {
                self.push_copy(p);
            } else {
                self.push_ref(p, 0);
            }
        }
        self.write_queue(WRITE_TRIES)?;
        let sent = if self.segs.is_empty() {
            Sent::Done
        } else if first_ref.is_some() {
            if matches!(self.segs.back(), Some(Seg::Ref { .. })) {
                self.set_last_token(token);
                Sent::Later
            } else {
                Sent::Done
            }
        } else {
            self.own_tail();
            Sent::Done
        };
        self.next_flush = self.queued() + COALESCE;
        Ok(sent)
    }

    /// Put `token` on the last queued piece, a reference of the frame just queued.
    fn set_last_token(&mut self, token: u64) {
        if let Some(Seg::Ref { token: t, .. }) = self.segs.back_mut() {
            *t = token;
        }
    }

    /// Copy the references at the end of the queue (the parts of the frame just queued:
    /// its header, a copy, comes before them) so the caller's memory is free again.
    fn own_tail(&mut self) {
        let refs = self
            .segs
            .iter()
            .rev()
            .take_while(|s| matches!(s, Seg::Ref { .. }))
            .count();
        let start = self.segs.len() - refs;
        let mut copied = 0;
        for s in self.segs.range(start..) {
            if let Seg::Ref { addr, len, .. } = *s {
                // SAFETY: the references were queued by the current `send`, whose parts are
                // still borrowed.
                self.q
                    .push(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
                copied += len;
            }
        }
        self.segs.truncate(start);
        self.ref_bytes -= copied;
        if copied > 0 {
            match self.segs.back_mut() {
                Some(Seg::Copy(n)) => *n += copied,
                _ => self.segs.push_back(Seg::Copy(copied)),
            }
        }
    }

    /// Write queued pieces with up to `calls` `sendmsg` calls, stopping when the kernel
    /// refuses or this round's budget is spent (`flush`); report the tokens of references
    /// that were finished.
    fn write_queue(&mut self, calls: usize) -> Result<()> {
        for _ in 0..calls {
            self.pop_markers();
            let budget = self.budget;
            if self.segs.is_empty() || budget == 0 || !self.writable() {
                break;
            }
            let mut offered = 0;
            let r = {
                let mut iov = [IoSlice::new(&[]); FLUSH_IOV];
                let mut n = 0;
                let mut cur = self.q.cursor();
                'fill: for s in &self.segs {
                    match *s {
                        // A copied run is one piece per block it lies in.
                        Seg::Copy(mut len) => {
                            while len > 0 && n < FLUSH_IOV && offered < budget {
                                let piece = self.q.next_piece(&mut cur, len);
                                if piece.is_empty() {
                                    debug_assert!(false, "send queue runs past its bytes");
                                    break 'fill;
                                }
                                len -= piece.len();
                                let piece = &piece[..piece.len().min(budget - offered)];
                                offered += piece.len();
                                iov[n] = IoSlice::new(piece);
                                n += 1;
                            }
                        }
                        // Markers (empty references) carry no bytes.
                        Seg::Ref { len: 0, .. } => {}
                        Seg::Ref { addr, len, .. } if n < FLUSH_IOV => {
                            let len = len.min(budget - offered);
                            // SAFETY: a reference stays valid until its frame's token is
                            // reported (or the queue is abandoned): the owning request
                            // completes only then; `len` is at most its length.
                            iov[n] = IoSlice::new(unsafe {
                                std::slice::from_raw_parts(addr as *const u8, len)
                            });
                            offered += len;
                            n += 1;
                        }
                        Seg::Ref { .. } => {}
                    }
                    if n == FLUSH_IOV || offered == budget {
                        break;
                    }
                }
                Self::write(&self.sock, &iov[..n])
            };
            match r {
                Ok(wrote) => {
                    self.advance(wrote);
                    self.budget -= wrote;
                    if wrote < offered {
                        // The socket is full: the next call would be refused.
                        self.full = true;
                        break;
                    }
                }
                Err(e) => return Err(self.fail("tcp send", e)),
            }
        }
        if self.segs.is_empty() {
            self.q.clear();
            self.full = false;
        }
        Ok(())
    }

    /// Report and drop empty references (token markers) at the front of the queue.
    fn pop_markers(&mut self) {
        while let Some(&Seg::Ref { len: 0, token, .. }) = self.segs.front() {
            if token != 0 {
                self.completed.push(token);
            }
            self.segs.pop_front();
        }
    }

    /// `wrote` bytes from the front of the queue left.
    fn advance(&mut self, mut wrote: usize) {
        self.drained = self.drained.wrapping_add(wrote as u64);
        self.pop_markers();
        while wrote > 0 {
            let Some(front) = self.segs.front_mut() else {
                return;
            };
            let done = match front {
                Seg::Copy(n) => {
                    let k = (*n).min(wrote);
                    *n -= k;
                    self.q.consume(k);
                    wrote -= k;
                    *n == 0
                }
                Seg::Ref { addr, len, token } => {
                    let k = (*len).min(wrote);
                    *addr += k;
                    *len -= k;
                    self.ref_bytes -= k;
                    wrote -= k;
                    if *len == 0 && *token != 0 {
                        self.completed.push(*token);
                    }
                    *len == 0
                }
            };
            if done {
                self.segs.pop_front();
            }
            self.pop_markers();
        }
    }

    /// Whether `flush` or `take_completed` would have anything to do: bytes are queued or
    /// written zero-copy frames wait to be reported. (`flush` also ends a burst: that
    /// much it does without a system call.)
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        !self.segs.is_empty() || !self.completed.is_empty()
    }

    /// Whether written zero-copy frames wait to be reported by `take_completed`.
    #[inline]
    pub(crate) fn has_completed(&self) -> bool {
        !self.completed.is_empty()
    }

    /// Write what is queued, up to [`TX_BUDGET`] bytes (a new round of it: progress calls
    /// this for every link on every call); whether nothing is left.
    #[inline]
    pub(crate) fn flush(&mut self) -> Result<bool> {
        self.budget = TX_BUDGET;
        self.flush_within_budget()
    }

    /// `flush` without a new round: what `send` writes out of the queue counts against the
    /// round's budget.
    #[inline]
    fn flush_within_budget(&mut self) -> Result<bool> {
        // An empty queue answers at once.
        if self.segs.is_empty() && self.failed.is_none() {
            self.burst = false;
            self.next_flush = COALESCE;
            return Ok(true);
        }
        self.flush_queue()
    }

    #[inline(never)]
    fn flush_queue(&mut self) -> Result<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.burst = false;
        self.write_queue(usize::MAX)?;
        if !self.segs.is_empty() {
            self.next_flush = self.queued() + COALESCE;
            return Ok(false);
        }
        self.next_flush = COALESCE;
        Ok(true)
    }

    pub(crate) fn caps(&self) -> &Caps {
        &self.caps
    }

    pub(crate) unsafe fn remote_read(
        &mut self,
        _local: &[(usize, usize)],
        _remote: &[(u64, u64)],
    ) -> Result<()> {
        Err(Error::new(
            Status::Unsupported,
            "tcp cannot read remote memory; it pushes data (RndvMode::Push)",
        ))
    }
}
