//! tcp — frames over TCP sockets, between hosts or processes (IPv4 and IPv6).
//!
//! Wire format: the connecting side first writes the 8-byte [`PREAMBLE`]; the accepting
//! side checks it before anything else. After that, in both directions, each frame is a
//! 4-byte little-endian length (1 to [`MAX_FRAME`]) followed by that many bytes.
//!
//! Sending: `send` writes the length prefix and the parts with one system call when nothing
//! is queued (a small frame gathered on the stack with `send`, a larger one with
//! `sendmsg`); what the kernel does not take goes into a user-space queue (one growable
//! buffer, reused), which `flush` writes out, many small frames in one system call. Beyond
//! [`HIGH_WATER`] queued bytes, `send` answers `NoResource` (back-pressure).
//!
//! A full socket is not written to again until the kernel says it is writable: once it
//! took less than it was offered, the next write first asks `poll` for `POLLOUT`, which
//! the kernel reports once about a third of the send buffer is free. Retrying `sendmsg`
//! at every progress call instead took the socket's lock for nothing tens of thousands of
//! times a second, and the few calls that did get in wrote whatever had just drained
//! (128 KiB at a time where a free third is megabytes); bench/analysis.md has the profile.
//!
//! Zero copy: `send_zc` queues the unwritten rest of a large frame (at least
//! [`DIRECT_SEND`] bytes) as references to the caller's memory instead of copying it, and
//! answers `Sent::Later`; the frame's token comes out of `take_completed` once its last
//! byte is written. The queue is a list of pieces (copied runs and references) so frames
//! of both kinds keep their order. `abandon` drops references when their requests fail.
//!
//! Receiving: `on_readable` reads into one buffer (at most [`RX_BUDGET`] bytes per call, so
//! a flooding peer cannot starve other links; the fd stays readable, so a level-triggered
//! poller calls again). `peek` parses the next complete frame out of that buffer without a
//! system call; the buffer is never moved or compacted while a frame is handed out.
//!
//! Both halves share the socket; it closes when both are dropped.
//!
//! Congestion control: a connection whose two ends are on this host uses reno unless
//! `COURIER_TCP_CONGESTION` says otherwise. No network is shared there, and bbr (the
//! default on some systems) holds one loopback connection to about half of what it carries
//! with reno (bench/analysis.md). Connections to other hosts keep the system's choice.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendAncillaryBuffer, SendFlags, SocketFlags};

use super::{Caps, RawFrame, RndvMode, Sent, TxError};
use crate::base::config::TcpCongestion;
use crate::base::{Config, Error, Result, Status};

mod place;
mod sock;
#[cfg(test)]
mod tests;

/// Largest frame length accepted on the wire (payload limit plus header room).
pub const MAX_FRAME: usize = (16 << 20) + 4096;
/// The largest frame a connection takes before it belongs to an endpoint (`Rx::established`):
/// the setup messages (a connection request, a worker address) are far smaller, and a peer
/// that has not introduced itself gets no large buffer.
pub const SETUP_FRAME_MAX: usize = 64 << 10;
/// Largest frame `send` accepts (`caps().max_frame`); the protocol splits bigger data.
pub const MAX_SEND: usize = 16 << 20;
/// What a connecting peer writes first.
pub const PREAMBLE: [u8; 8] = *b"COURIER\x01";
/// Queued bytes beyond which `send` answers `NoResource`.
pub const HIGH_WATER: usize = 64 << 20;
/// Most bytes one `on_readable` call reads.
pub const RX_BUDGET: usize = 4 << 20;

const HDR: usize = 4;
const RX_INITIAL: usize = 256 << 10;
/// Frames up to this long (length prefix included) that leave at once are gathered into
/// one piece on the stack first (`Tx::write_small`).
const SMALL_SEND: usize = 512;
/// Parts that go straight into one `sendmsg`; frames with more parts go through the queue.
const MAX_IOV: usize = 16;
/// Queue pieces written by one `sendmsg` of `flush`.
const FLUSH_IOV: usize = 64;
/// Coalesced small frames are written once this many bytes wait (and again after each
/// further COALESCE bytes while the socket is full).
const COALESCE: usize = 64 << 10;
/// Frames at least this long are written from the caller's memory, not copied first; with
/// `send_zc` their unwritten rest stays there too (`Caps::zcopy_min`).
const DIRECT_SEND: usize = 16 << 10;
/// Most `sendmsg` calls for one large frame before its rest is queued.
const WRITE_TRIES: usize = 4;
/// A send queue whose capacity grew beyond this is shrunk back when it empties.
const TXQ_SHRINK_ABOVE: usize = 32 << 20;
const TXQ_SHRINK_TO: usize = 4 << 20;

fn caps(local: Option<SocketAddr>) -> Caps {
    Caps {
        name: "tcp",
        device: sock::device_for(local),
        // Frames that `send` writes from one stack buffer with one call (`write_small`).
        max_short: SMALL_SEND - HDR,
        max_frame: MAX_SEND,
        rndv: RndvMode::Push,
        rndv_thresh: 64 << 10,
        zcopy_min: DIRECT_SEND,
        place_min: place::PLACE_MIN,
        peer_failure: true,
        wakeup: true,
        data_via_fd: true,
        latency_ns: 6000.0,
        bandwidth_mbs: 4000.0,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A piece of the send queue.
enum Seg {
    /// The next this many bytes of `Tx::q`.
    Copy(usize),
    /// Bytes in a caller's memory, valid until the owning request completes, which is not
    /// before `token` (0: none) is reported once the last of them is written.
    Ref { addr: usize, len: usize, token: u64 },
}

/// Sending half.
pub struct Tx {
    sock: Arc<OwnedFd>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    caps: Caps,
    /// Copied bytes not yet written are `q[head..]`; `segs` says where they go in the stream.
    q: Vec<u8>,
    head: usize,
    /// The queued stream, in order: runs of `q` and references to callers' memory.
    segs: VecDeque<Seg>,
    /// Bytes queued by reference (in `Seg::Ref`s).
    ref_bytes: usize,
    /// Tokens of zero-copy frames fully written since the last `take_completed`.
    completed: Vec<u64>,
    high_water: usize,
    /// A frame was queued since the last `flush`: the next small one is coalesced.
    burst: bool,
    /// Queued bytes at which `send` writes out without waiting for `flush`.
    next_flush: usize,
    /// The kernel took less than it was offered: the socket's send buffer is full, and the
    /// next write waits for `POLLOUT` (`writable`). Only set while bytes are queued.
    full: bool,
    failed: Option<Error>,
}

/// Receiving half.
pub struct Rx {
    sock: Arc<OwnedFd>,
    peer: SocketAddr,
    /// Received bytes not yet consumed are `buf[start..end]`; the vector's length is its size.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes (header included) of the frame handed out by `peek`; 0 when none.
    out: usize,
    /// The accepting side still expects the preamble.
    need_preamble: bool,
    /// The peer closed or reset the connection; reported once buffered frames are drained.
    closed: Option<Error>,
    /// The peer broke the protocol; reported at once.
    failed: Option<Error>,
    /// The frame at `start` whose payload is read into the protocol's memory.
    place: Option<place::Placing>,
    /// Where a placed payload whose destination went away is read and dropped.
    scratch: Vec<u8>,
    /// The protocol declined to place the (large) frame at `start`: buffer it whole.
    declined: bool,
    /// The protocol looks at large frames before they are complete (it called
    /// `peek_partial`): do not buffer them whole unless it declines.
    placing_user: bool,
    /// The largest frame taken: `SETUP_FRAME_MAX` until the link belongs to an endpoint.
    frame_limit: usize,
}

/// Listens for TCP connections.
pub struct Listener {
    fd: OwnedFd,
    /// Out of descriptors or memory at the last accept: no accept is tried before this
    /// instant, and the refusals met meanwhile are counted for the next warning.
    starved: Option<Starved>,
    local: SocketAddr,
    sndbuf: usize,
    rcvbuf: usize,
    congestion: TcpCongestion,
}

fn halves(fd: OwnedFd, peer: SocketAddr, accepting: bool, cc: &TcpCongestion) -> (Tx, Rx) {
    let sock = Arc::new(fd);
    let local = sock::local_addr(sock.as_fd());
    sock::set_congestion(sock.as_fd(), peer, local, cc);
    let tx = Tx {
        sock: sock.clone(),
        peer,
        local,
        caps: caps(local),
        q: Vec::new(),
        head: 0,
        segs: VecDeque::new(),
        ref_bytes: 0,
        completed: Vec::new(),
        high_water: HIGH_WATER,
        burst: false,
        next_flush: COALESCE,
        full: false,
        failed: None,
    };
    let rx = Rx {
        sock,
        peer,
        buf: vec![0; RX_INITIAL],
        start: 0,
        end: 0,
        out: 0,
        need_preamble: accepting,
        closed: None,
        failed: None,
        place: None,
        declined: false,
        scratch: Vec::new(),
        placing_user: false,
        frame_limit: SETUP_FRAME_MAX,
    };
    (tx, rx)
}

impl Listener {
    /// Bind `addr` (port 0 picks one) and listen; the socket is non-blocking.
    pub fn bind(addr: SocketAddr, cfg: &Config) -> Result<Listener> {
        let what = format!("tcp listen on {addr}");
        let fd = sock::new_socket(&addr)?;
        net::sockopt::set_socket_reuseaddr(&fd, true)
            .map_err(|e| Error::io(&format!("{what}: SO_REUSEADDR"), e))?;
        // Accepted sockets inherit these; the receive buffer must be set before listen so
        // the window scale fits it.
        sock::set_buffers(fd.as_fd(), cfg.tcp_sndbuf, cfg.tcp_rcvbuf, &what)?;
        net::bind(&fd, &addr).map_err(|e| {
            let status = if e == Errno::ADDRINUSE || e == Errno::ADDRNOTAVAIL {
                Status::InvalidAddress
            } else {
                Status::IoError
            };
            Error::msg(status, format!("{what}: bind: {e}"))
        })?;
        net::listen(&fd, 1024).map_err(|e| Error::io(&format!("{what}: listen"), e))?;
        let local = sock::local_addr(fd.as_fd()).unwrap_or(addr);
        Ok(Listener {
            fd,
            starved: None,
            local,
            sndbuf: cfg.tcp_sndbuf,
            rcvbuf: cfg.tcp_rcvbuf,
            congestion: cfg.tcp_congestion.clone(),
        })
    }

    /// The bound address (with the port the kernel picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Fd to watch for incoming connections.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Accept one pending connection. `Ok(None)` when nothing is pending; `Err` only when
    /// the listening socket itself is broken.
    pub fn accept(&mut self) -> Result<Option<(Tx, Rx, SocketAddr)>> {
        if let Some(s) = &mut self.starved
            && std::time::Instant::now() < s.retry_at
        {
            // The socket stays readable meanwhile; trying would only fail again.
            s.skipped += 1;
            return Ok(None);
        }
        loop {
            match net::acceptfrom_with(&self.fd, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC) {
                Ok((fd, addr)) => {
                    let peer = addr.and_then(|a| SocketAddr::try_from(a).ok()).or_else(|| {
                        net::getpeername(&fd)
                            .ok()
                            .flatten()
                            .and_then(|a| SocketAddr::try_from(a).ok())
                    });
                    let Some(peer) = peer else {
                        tracing::debug!(
                            "tcp accept on {}: connection without a peer address; dropped",
                            self.local
                        );
                        continue;
                    };
                    let what = format!("tcp connection from {peer}");
                    let setup = sock::set_nodelay(fd.as_fd(), &what).and_then(|()| {
                        sock::set_buffers(fd.as_fd(), self.sndbuf, self.rcvbuf, &what)
                    });
                    if let Err(e) = setup {
                        tracing::debug!("{e}; connection dropped");
                        continue;
                    }
                    let (tx, rx) = halves(fd, peer, true, &self.congestion);
                    if let Some(s) = self.starved.take() {
                        tracing::info!(
                            "tcp accept on {}: accepting again ({} tries refused or put off)",
                            self.local,
                            s.refused + s.skipped
                        );
                    }
                    return Ok(Some((tx, rx, peer)));
                }
                Err(Errno::AGAIN) => return Ok(None),
                // The connection died before we took it, or a signal: try the next one.
                Err(Errno::INTR)
                | Err(Errno::CONNABORTED)
                | Err(Errno::PROTO)
                | Err(Errno::PERM) => continue,
                Err(e @ (Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)) => {
                    self.starve(e);
                    return Ok(None);
                }
                Err(e) => return Err(Error::io(&format!("tcp accept on {}", self.local), e)),
            }
        }
    }
}

/// A listener out of descriptors or memory (`Listener::starve`).
struct Starved {
    retry_at: std::time::Instant,
    warned_at: std::time::Instant,
    refused: u64,
    skipped: u64,
}

/// How long a starved listener waits before it tries to accept again.
const STARVED_RETRY: std::time::Duration = std::time::Duration::from_millis(10);
/// How often a listener that stays starved says so.
const STARVED_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Listener {
    /// Accept failed for want of descriptors or memory: wait a little before the next try
    /// (the socket stays readable, so every progress call would try and fail), and warn
    /// once, then every `STARVED_WARN_EVERY` while it lasts, not at every try.
    fn starve(&mut self, e: Errno) {
        let now = std::time::Instant::now();
        let retry_at = now + STARVED_RETRY;
        match &mut self.starved {
            Some(s) => {
                s.retry_at = retry_at;
                s.refused += 1;
                if now.duration_since(s.warned_at) >= STARVED_WARN_EVERY {
                    tracing::warn!(
                        "tcp accept on {}: still {e} ({} tries refused or put off since the last word); incoming connections wait",
                        self.local,
                        s.refused + s.skipped
                    );
                    s.warned_at = now;
                    s.refused = 0;
                    s.skipped = 0;
                }
            }
            None => {
                tracing::warn!(
                    "tcp accept on {}: {e}; incoming connections wait (tried again every {STARVED_RETRY:?}, said again every {STARVED_WARN_EVERY:?} while it lasts)",
                    self.local
                );
                self.starved = Some(Starved {
                    retry_at,
                    warned_at: now,
                    refused: 0,
                    skipped: 0,
                });
            }
        }
    }
}

/// Connect to a peer's listener; blocks up to `cfg.tcp_connect_timeout`.
pub fn connect(addr: SocketAddr, cfg: &Config) -> Result<(Tx, Rx)> {
    let fd = sock::connect_with_timeout(addr, cfg)?;
    let (mut tx, rx) = halves(fd, addr, false, &cfg.tcp_congestion);
    tx.push_copy(&PREAMBLE);
    // A fresh socket takes 8 bytes at once; anything left goes out with the next flush.
    tx.flush().map_err(|e| {
        Error::msg(
            Status::Unreachable,
            format!("connect to {addr}: {}", e.detail()),
        )
    })?;
    Ok((tx, rx))
}

/// Local interface addresses tcp may use, filtered by `COURIER_NET_DEVICES`: (name, address).
/// Interfaces that are down and IPv6 link-local addresses (which need a scope) are left out.
pub fn interfaces(cfg: &Config) -> Vec<(String, IpAddr)> {
    sock::interfaces(cfg.net_devices.as_deref())
}

impl Tx {
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This side's address, if known.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// Bytes queued in user space (copied or referenced), not yet taken by the kernel.
    pub fn queued(&self) -> usize {
        self.q.len() - self.head + self.ref_bytes
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
        tests::WRITE_CALLS.with(|c| c.set(c.get() + 1));
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
        self.head = 0;
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
            self.flush()?;
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
        self.compact();
        self.q.reserve(HDR + total);
        self.push_copy(&hdr);
        for p in parts {
            self.push_copy(p);
        }
        if self.queued() >= self.next_flush {
            self.flush()?;
        }
        Ok(Sent::Done)
    }

    /// Drop the written prefix of `q` once it is at least half of it: amortized O(1).
    fn compact(&mut self) {
        if self.head > 0 && self.head * 2 >= self.q.len() {
            self.q.drain(..self.head);
            self.head = 0;
        }
    }

    /// Queue a copy of `b`.
    fn push_copy(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        self.q.extend_from_slice(b);
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
            self.compact();
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
            self.compact();
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
        self.compact();
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
                self.q.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(addr as *const u8, len)
                });
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
    /// refuses; report the tokens of references that were finished.
    fn write_queue(&mut self, calls: usize) -> Result<()> {
        for _ in 0..calls {
            self.pop_markers();
            if self.segs.is_empty() || !self.writable() {
                break;
            }
            let mut offered = 0;
            let r = {
                let mut iov = [IoSlice::new(&[]); FLUSH_IOV];
                let mut n = 0;
                let mut at = self.head;
                // Markers (empty references) carry no bytes.
                let pieces = self
                    .segs
                    .iter()
                    .filter(|s| !matches!(s, Seg::Ref { len: 0, .. }));
                for s in pieces.take(FLUSH_IOV) {
                    iov[n] = match *s {
                        Seg::Copy(len) => {
                            at += len;
                            IoSlice::new(&self.q[at - len..at])
                        }
                        // SAFETY: a reference stays valid until its frame's token is
                        // reported (or the queue is abandoned): the owning request
                        // completes only then.
                        Seg::Ref { addr, len, .. } => IoSlice::new(unsafe {
                            std::slice::from_raw_parts(addr as *const u8, len)
                        }),
                    };
                    offered += iov[n].len();
                    n += 1;
                }
                Self::write(&self.sock, &iov[..n])
            };
            match r {
                Ok(wrote) => {
                    self.advance(wrote);
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
            self.head = 0;
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
        self.pop_markers();
        while wrote > 0 {
            let Some(front) = self.segs.front_mut() else {
                return;
            };
            let done = match front {
                Seg::Copy(n) => {
                    let k = (*n).min(wrote);
                    *n -= k;
                    self.head += k;
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

    #[inline]
    pub(crate) fn flush(&mut self) -> Result<bool> {
        // Progress calls this for every link on every call: an empty queue answers at once.
        if self.segs.is_empty() && self.failed.is_none() && self.q.capacity() <= TXQ_SHRINK_ABOVE {
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
        if self.q.capacity() > TXQ_SHRINK_ABOVE {
            self.q.shrink_to(TXQ_SHRINK_TO);
        }
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

impl Rx {
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
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
        if self.need_preamble {
            let have = &self.buf[self.start..self.end];
            let n = have.len().min(PREAMBLE.len());
            if have[..n] != PREAMBLE[..n] {
                let why = format!(
                    "not a Courier peer: bad preamble {} from {}",
                    hex(&have[..n]),
                    self.peer
                );
                return Err(self.protocol_error(why));
            }
            if n < PREAMBLE.len() {
                return Ok(None);
            }
            self.start += PREAMBLE.len();
            self.need_preamble = false;
        }
        let have = self.end - self.start;
        if have < HDR {
            return Ok(None);
        }
        let mut h = [0u8; HDR];
        h.copy_from_slice(&self.buf[self.start..self.start + HDR]);
        let len = u32::from_le_bytes(h) as usize;
        if len == 0 {
            return Err(self.protocol_error(format!(
                "frame length 0 from {}: empty frames are not allowed",
                self.peer
            )));
        }
        if len > self.frame_limit {
            let when = if self.frame_limit < MAX_FRAME {
                " of a connection not yet set up"
            } else {
                ""
            };
            return Err(self.protocol_error(format!(
                "frame length {len} from {} exceeds the limit{when} {}",
                self.peer, self.frame_limit
            )));
        }
        Ok(if have >= HDR + len { Some(len) } else { None })
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
        Ok(Some(RawFrame {
            ptr,
            len: self.out - HDR,
        }))
    }

    pub(crate) fn consume(&mut self) {
        if self.out != 0 {
            self.start += self.out;
            self.out = 0;
            self.place = None;
            self.declined = false;
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            }
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
            self.buf.resize(new, 0);
        }
        Ok(())
    }

    /// The link now belongs to an endpoint: frames up to `MAX_FRAME` are taken.
    pub(crate) fn established(&mut self) {
        self.frame_limit = MAX_FRAME;
    }

    /// Read what the socket has, up to the budget or the end of the buffer.
    fn read_some(&mut self) {
        let mut budget = RX_BUDGET;
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

/// A connected pair over `ip` (loopback), set up as an endpoint's link is (frames of any
/// size): (connecting side, accepting side).
#[cfg(test)]
pub fn pair_on(ip: IpAddr, cfg: &Config) -> Result<((Tx, Rx), (Tx, Rx))> {
    let mut l = Listener::bind(SocketAddr::new(ip, 0), cfg)?;
    let mut c = connect(l.local_addr(), cfg)?;
    c.1.established();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if let Some((tx, mut rx, _)) = l.accept()? {
            rx.established();
            return Ok((c, (tx, rx)));
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::new(
                Status::Timeout,
                "pair_on: accept saw no connection",
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A connected pair over 127.0.0.1 with the default configuration: (connecting, accepting).
#[cfg(test)]
pub fn pair_for_tests() -> ((Tx, Rx), (Tx, Rx)) {
    let cfg = Config::from_env().expect("default configuration");
    pair_on(IpAddr::from([127, 0, 0, 1]), &cfg).expect("tcp pair over 127.0.0.1")
}
