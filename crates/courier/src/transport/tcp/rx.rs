//! The receiving half: reading frames from the socket into the receive buffer, checking
//! their lengths, and handing them out in place.

use super::*;

impl Rx {
    /// The peer's address.
    #[cfg(test)]
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Bytes read from the socket so far (a count that only grows, modulo 2^64).
    pub fn received(&self) -> u64 {
        self.received
    }

    fn protocol_error(&mut self, why: String) -> Error {
        let e = Error::msg(Status::ProtocolError, why);
        self.failed = Some(e.clone());
        e
    }

    /// Check the preamble and the next header; the payload length of the next frame if it
    /// is complete in the buffer. Only called when no frame is handed out.
    fn parse(&mut self) -> Result<Option<usize>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let have = &self.buf[self.start..self.end];
        match next_frame(have, self.need_preamble, self.frame_limit, &self.peer) {
            Ok(Framing::Preamble { complete }) => {
                if complete {
                    self.start += PREAMBLE.len();
                    self.need_preamble = false;
                    return self.parse();
                }
                Ok(None)
            }
            Ok(Framing::Frame(len)) => Ok(len),
            Err(why) => Err(self.protocol_error(why)),
        }
    }

    pub(crate) fn peek(&mut self) -> Result<Option<RawFrame>> {
        if self.place.is_some() {
            // A placed frame is taken with `take_placed`; nothing after it comes first.
            if self.placed_ready() {
                return Ok(None);
            }
            return self.closed.as_ref().map_or(Ok(None), |e| Err(e.clone()));
        }
        if self.out == 0 {
            match self.parse()? {
                Some(len) => self.out = HDR + len,
                None => return self.closed.as_ref().map_or(Ok(None), |e| Err(e.clone())),
            }
        }
        // `as_ptr` creates no reference, so later writes past `end` leave this pointer valid.
        let ptr = self.buf.as_ptr().wrapping_add(self.start + HDR);
        Ok(Some(RawFrame::private(ptr, self.out - HDR)))
    }

    pub(crate) fn consume(&mut self) {
        if self.out != 0 {
            if self.grow_rcvbuf != 0 {
                let len = self.out_len();
                if len >= place::PLACE_MIN {
                    self.bulk_arrived(len);
                }
            }
            self.start += self.out;
            self.out = 0;
            self.after_placed = self.place.take().is_some();
            self.offered = false;
            self.declined = false;
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
                // Kept while the process is well under the limit (the next large frame
                // then needs no new pages), given back once it holds more than half.
                if self.grown != 0 && GROWN.load(Ordering::Relaxed) > self.grown_limit / 2 {
                    self.shrink();
                }
            }
        }
    }

    /// A frame of `len` bytes (at least `PLACE_MIN`) arrived: once `GROW_AFTER_BULK` bytes
    /// have, the link carries bulk data, and the socket's receive buffer grows to
    /// `COURIER_TCP_RCVBUF` (`RCVBUF_START` says why it starts smaller).
    #[cold]
    fn bulk_arrived(&mut self, len: usize) {
        self.bulk = self.bulk.saturating_add(len);
        if self.bulk < super::GROW_AFTER_BULK {
            return;
        }
        let to = std::mem::take(&mut self.grow_rcvbuf);
        // Only speed is at stake: the socket keeps the buffer it has.
        if let Err(e) = sock::grow_rcvbuf(self.sock.as_fd(), to) {
            tracing::debug!("tcp link with {}: receive buffer to {to}: {e}", self.peer);
        }
    }

    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    /// Make room for the next frame: compact and grow. Only when no frame is handed out.
    fn make_room(&mut self) -> Result<()> {
        let complete = self.parse()?.is_some();
        if complete {
            return Ok(());
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let have = self.end - self.start;
        let need = if !self.need_preamble && have >= HDR {
            let mut h = [0u8; HDR];
            h.copy_from_slice(&self.buf[self.start..self.start + HDR]);
            let len = u32::from_le_bytes(h) as usize;
            if self.placeable(len) {
                // The protocol may place its payload: room for the head is enough.
                HDR + len.min(place::PLACE_MIN)
            } else {
                HDR + len
            }
        } else {
            PREAMBLE.len() + HDR
        };
        let size = self.buf.len();
        if self.start > 0 && (self.start + need > size || size - self.end < size / 4) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end = have;
            self.start = 0;
        }
        // Grow only a full buffer, and at most twice over: what a frame takes here follows
        // the bytes that came, not the length its header announces.
        if need > self.buf.len() && self.end == self.buf.len() {
            let new = (self.buf.len() * 2).min(need);
            self.charge_growth(new - self.buf.len(), need)?;
            self.buf.resize(new, 0);
        }
        Ok(())
    }

    /// Count `extra` more bytes of buffer against `COURIER_MAX_RX_BUFFERED` (for a frame
    /// of `need` bytes), or fail the link naming it.
    fn charge_growth(&mut self, extra: usize, need: usize) -> Result<()> {
        let before = GROWN.fetch_add(extra, Ordering::Relaxed);
        if before + extra > self.grown_limit {
            GROWN.fetch_sub(extra, Ordering::Relaxed);
            let limit = match self.grown_limit {
                n if n.is_multiple_of(1 << 20) => format!("{}m", n >> 20),
                n => n.to_string(),
            };
            let e = Error::msg(
                Status::NoResource,
                format!(
                    "{} sent part of a {need}-byte frame that does not fit: the tcp receive buffers of this process already hold {before} bytes past their first {}k (COURIER_MAX_RX_BUFFERED={limit}); the endpoint is failed, every other goes on (raise it if the peers are trusted)",
                    self.peer,
                    RX_INITIAL >> 10,
                ),
            );
            self.failed = Some(e.clone());
            return Err(e);
        }
        self.grown += extra;
        Ok(())
    }

    /// An emptied buffer that grew for a large frame goes back to its first size, and its
    /// bytes stop counting against `COURIER_MAX_RX_BUFFERED` (when that is more than half
    /// used: `consume`).
    #[cold]
    fn shrink(&mut self) {
        if self.place.is_none() && self.out == 0 && self.start == self.end {
            self.buf = vec![0; RX_INITIAL];
            self.start = 0;
            self.end = 0;
            GROWN.fetch_sub(self.grown, Ordering::Relaxed);
            self.grown = 0;
        }
    }

    /// The link now belongs to an endpoint: frames up to `MAX_FRAME` are taken.
    pub(crate) fn established(&mut self) {
        self.frame_limit = MAX_FRAME;
    }

    /// Read what the socket has, up to the budget or the end of the buffer.
    fn read_some(&mut self) {
        let mut budget = self.read_budget();
        while budget > 0 && self.end < self.buf.len() {
            let room = (self.buf.len() - self.end).min(budget);
            // SAFETY: `end + room <= buf.len()`; built from `as_mut_ptr` so that no reference
            // covers the bytes of a frame handed out by `peek` (they lie before `end`).
            let dst = unsafe {
                std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(self.end), room)
            };
            match net::recv(&*self.sock, dst, RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    self.closed = Some(Error::msg(
                        Status::PeerFailure,
                        format!("{} closed the connection", self.peer),
                    ));
                    return;
                }
                Ok((n, _)) => {
                    self.end += n;
                    self.received = self.received.wrapping_add(n as u64);
                    budget = budget.saturating_sub(n);
                    if n < room {
                        // Drained for now; asking again would only answer EAGAIN.
                        return;
                    }
                }
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return,
                Err(e) => {
                    let why = match e {
                        Errno::CONNRESET => format!("{} reset the connection ({e})", self.peer),
                        _ => format!("connection to {} failed: {e}", self.peer),
                    };
                    self.closed = Some(Error::msg(Status::PeerFailure, why));
                    return;
                }
            }
        }
    }

    pub(crate) fn on_readable(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.place.is_some() {
            return self.read_placing();
        }
        if self.closed.is_none() {
            if self.out == 0 {
                self.make_room()?;
            }
            self.read_some();
        }
        if self.out != 0 || self.parse()?.is_some() {
            // Frames are waiting; a close is reported by `peek` once they are taken.
            return Ok(());
        }
        self.closed.as_ref().map_or(Ok(()), |e| Err(e.clone()))
    }

    /// `false` only when certainly nothing is waiting to be handled: no byte buffered, no
    /// frame being placed, no failure or close to report. (Bytes may be waiting in the
    /// socket: `poll_read` or `on_readable` fetch them.)
    #[inline]
    pub(crate) fn maybe_ready(&self) -> bool {
        self.end != self.start
            || self.place.is_some()
            || self.closed.is_some()
            || self.failed.is_some()
    }

    /// Read without a readiness report (progress polls the socket itself when it watches
    /// few links): a no-op while a complete frame is already buffered, so a busy link costs
    /// one `recv` per buffer of frames, not per frame.
    #[inline]
    pub(crate) fn poll_read(&mut self) -> Result<()> {
        if self.start == self.end
            && self.place.is_none()
            && self.closed.is_none()
            && self.failed.is_none()
        {
            // The common case of a polled link: nothing buffered, so nothing to parse and
            // the whole buffer free; just read.
            self.start = 0;
            self.end = 0;
            self.read_some();
            return match &self.closed {
                Some(e) if self.end == 0 => Err(e.clone()),
                _ => Ok(()),
            };
        }
        self.poll_read_buffered()
    }

    #[inline(never)]
    fn poll_read_buffered(&mut self) -> Result<()> {
        if self.place.is_some() {
            return self.on_readable();
        }
        if self.out != 0 || self.parse()?.is_some() {
            return Ok(());
        }
        self.on_readable()
    }

    pub(crate) fn arm(&mut self) -> Result<bool> {
        if self.placed_ready() || self.out != 0 || self.parse()?.is_some() {
            return Ok(false);
        }
        self.closed.as_ref().map_or(Ok(true), |e| Err(e.clone()))
    }
}

/// What the start of a connection's unread bytes holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// The preamble, whole (`complete`: skip it) or so far as it came.
    Preamble {
        /// All of it is there.
        complete: bool,
    },
    /// A frame: its length once all of it is there (after its `HDR`-byte header).
    Frame(Option<usize>),
}

/// Read the start of `have` (the unread bytes of a connection from `peer`, whose preamble
/// is still expected if `need_preamble`): the preamble, or the next frame's header checked
/// against `limit`. A peer that is not a Courier peer, or announces an empty frame or one
/// over the limit, is refused with a sentence naming it.
pub(crate) fn next_frame(
    have: &[u8],
    need_preamble: bool,
    limit: usize,
    peer: &dyn std::fmt::Display,
) -> std::result::Result<Framing, String> {
    if need_preamble {
        let n = have.len().min(PREAMBLE.len());
        if have[..n] != PREAMBLE[..n] {
            return Err(format!(
                "not a Courier peer: bad preamble {} from {peer}",
                hex(&have[..n])
            ));
        }
        return Ok(Framing::Preamble {
            complete: n == PREAMBLE.len(),
        });
    }
    let Some(h) = have.first_chunk::<HDR>() else {
        return Ok(Framing::Frame(None));
    };
    let len = u32::from_le_bytes(*h) as usize;
    if len == 0 {
        return Err(format!(
            "frame length 0 from {peer}: empty frames are not allowed"
        ));
    }
    if len > limit {
        let when = if limit < MAX_FRAME {
            " of a connection not yet set up"
        } else {
            ""
        };
        return Err(format!(
            "frame length {len} from {peer} exceeds the limit{when} {limit}"
        ));
    }
    Ok(Framing::Frame((have.len() >= HDR + len).then_some(len)))
}

/// Split `bytes` (all a peer sent on a connection, preamble first) into frames as a
/// receiving link does, for fuzzing: every frame lies inside `bytes`, within `limit`. The
/// frames read, until the bytes end or the peer is refused.
#[cfg(any(test, feature = "fuzzing"))]
pub fn fuzz_framing(bytes: &[u8], limit: usize) -> std::result::Result<Vec<&[u8]>, String> {
    let mut at = 0;
    let mut need_preamble = true;
    let mut frames = Vec::new();
    loop {
        match next_frame(&bytes[at..], need_preamble, limit, &"the fuzzer")? {
            Framing::Preamble { complete: true } => {
                at += PREAMBLE.len();
                need_preamble = false;
            }
            Framing::Preamble { complete: false } | Framing::Frame(None) => return Ok(frames),
            Framing::Frame(Some(len)) => {
                assert!((1..=limit).contains(&len), "a frame of {len} bytes");
                frames.push(&bytes[at + HDR..at + HDR + len]);
                at += HDR + len;
            }
        }
    }
}
