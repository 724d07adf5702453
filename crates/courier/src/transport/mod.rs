//! transports — one interface, several implementations.
//!
//! A transport moves whole *frames* (byte strings built by the protocol layer) between two
//! workers, reliably and in order. It never looks inside a frame. A connection is split in
//! two halves so that a handler running on received data can send on the same connection:
//!
//! - [`LinkTx`]: `send` queues one frame, atomically (all of it or `NoResource`, never a
//!   part); `flush` pushes out what is queued. `send_zc` is the zero-copy variant: a link
//!   may keep writing from the caller's memory after it returns (`Sent::Later`) and reports
//!   the frame's token through `take_completed` once it is written (tcp only; the others
//!   copy and answer `Sent::Done`).
//! - [`LinkRx`]: `peek` returns the next complete frame without consuming it; the bytes stay
//!   valid until `consume`, even while other code sends on the `LinkTx`. A shared-memory
//!   link's frames lie in memory the peer can still write: the protocol reads every frame
//!   through [`RawFrame::split`], which gives the parser private bytes (see `raw`).
//!   `peek` makes no system call; `on_readable` is called when the link's fd (if any) is
//!   readable, and does the reading.
//!
//! Capabilities are plain data ([`Caps`]); the protocol layer decides from them and never
//! from a transport's name. Built-in transports are dispatched through enums, not trait
//! objects, so the hot path has no virtual calls.
//!
//! Beside the links: `dial` holds which transport reaches a worker (acceptors, dialing a
//! worker address in order of preference, link setups over several steps, the listener
//! flow's sockets); `info` says what each transport can do in this process
//! (`courier::transports`); `shm::memory` is the one interface through which the layers
//! above reach this host's memory (segments, a peer's descriptors, CMA, doorbells).
//!
//! Errors: `send` returns [`TxError::NoResource`] when its queue is full (back-pressure: the
//! caller keeps the frame in its pending queue and retries after progress); any other error
//! means the link is dead (peer gone, protocol violation) and the endpoint fails.

use std::os::fd::BorrowedFd;

use crate::base::{Error, Result, Status};

pub use info::{DeviceInfo, TransportInfo, probe_transport, transports};
pub use raw::{HeadBuf, RawFrame};

#[cfg(test)]
mod conformance;
pub(crate) mod dial;
mod info;
pub mod loopback;
mod raw;
pub mod shm;
pub mod tcp;

/// How large messages move on a link.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RndvMode {
    /// The receiver reads the sender's memory directly (self: memcpy; shm: CMA).
    RemoteRead,
    /// The sender pushes data frames after the receiver is ready.
    Push,
}

/// What a link can do, as plain data.
#[derive(Clone, Debug)]
pub struct Caps {
    /// Transport name: `self`, `shm` or `tcp`.
    pub name: &'static str,
    /// Device: `memory`, `cma`, an interface name.
    pub device: String,
    /// Largest frame that takes the fastest (inline) path.
    pub max_short: usize,
    /// Largest frame `send` accepts.
    pub max_frame: usize,
    /// Large-message mode.
    pub rndv: RndvMode,
    /// Default rendezvous threshold in bytes.
    pub rndv_thresh: usize,
    /// Frames at least this long may stay in the caller's memory after `send_zc` returns
    /// (`Sent::Later`); `usize::MAX` where `send_zc` always copies.
    pub zcopy_min: usize,
    /// Arriving frames at least this long (header included) may be read straight into
    /// memory the protocol names (`LinkRx::peek_partial`); `usize::MAX` where never.
    pub place_min: usize,
    /// Whether the link notices a dead peer by itself.
    pub peer_failure: bool,
    /// Whether the link can wake a sleeping peer.
    pub wakeup: bool,
    /// Whether arriving data is noticed only through the link's fd (so progress must poll
    /// it each time); otherwise the fd only signals wakeups and hang-ups.
    pub data_via_fd: bool,
    /// Whether frames are read where the peer wrote them: whether one waits is one load
    /// (`LinkRx::in_place_ready`), and reading it (`LinkRx::peek_in_place`) makes no system
    /// call. Progress takes its shortest path for such a link.
    pub frames_in_place: bool,
    /// Whether the peer is another process of this host whose memory this side may reach:
    /// its pid is known (`LinkTx::peer_pid`), it may offer shared segments and device
    /// memory by key, and, where `rndv` is `RemoteRead`, CMA reaches it.
    pub peer_memory: bool,
    /// Estimated one-way latency in nanoseconds.
    pub latency_ns: f64,
    /// Estimated bandwidth in MB/s.
    pub bandwidth_mbs: f64,
}

/// Why a send did not queue its frame.
#[derive(Debug)]
pub enum TxError {
    /// Queue full now; retry after progress. Nothing was written.
    NoResource,
    /// The link is dead.
    Failed(Error),
}

impl From<Error> for TxError {
    fn from(e: Error) -> TxError {
        TxError::Failed(e)
    }
}

/// What `send_zc` did with a frame it accepted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The link no longer refers to the caller's memory (written or copied).
    Done,
    /// Part of the frame is still to be written from the caller's memory, which must stay
    /// valid until `take_completed` reports the frame's token (or the link is abandoned).
    Later,
}

/// Asked by a link that reads a payload straight into memory, before each read: whether
/// that memory may still be written.
pub type PlaceGuard = Box<dyn FnMut() -> bool + Send>;

/// The sending half of a connection.
pub enum LinkTx {
    /// Inside one worker.
    Loopback(loopback::Tx),
    /// Shared memory.
    Shm(shm::Tx),
    /// TCP.
    Tcp(tcp::Tx),
}

/// The receiving half of a connection.
pub enum LinkRx {
    /// Inside one worker.
    Loopback(loopback::Rx),
    /// Shared memory.
    Shm(shm::Rx),
    /// TCP.
    Tcp(tcp::Rx),
}

macro_rules! dispatch {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            Self::Loopback($t) => $e,
            Self::Shm($t) => $e,
            Self::Tcp($t) => $e,
        }
    };
}

impl LinkTx {
    /// Bytes taken by the link but not yet by the kernel (tcp's queue; the other links
    /// write at once or refuse).
    pub fn queued(&self) -> usize {
        match self {
            Self::Tcp(t) => t.queued(),
            _ => 0,
        }
    }

    /// Before the worker sleeps with frames this link refused for want of room: whether
    /// the peer's reading wakes the worker (tcp: the fd is watched for room to write,
    /// see `proto::fdpoll`; shm: the consumer was asked for a wakeup byte). `false`:
    /// progress, do not sleep.
    pub fn wakes_on_room(&mut self) -> bool {
        match self {
            Self::Tcp(t) => t.queued() > 0,
            Self::Shm(t) => t.want_room(),
            Self::Loopback(_) => false,
        }
    }

    /// A count that grows while the peer takes our data: queued bytes the kernel has
    /// taken (tcp), how far the peer has read our FIFO (shm); 0 on loopback.
    pub fn drained(&self) -> u64 {
        match self {
            Self::Tcp(t) => t.drained(),
            Self::Shm(t) => t.drained(),
            Self::Loopback(_) => 0,
        }
    }

    /// Queue one frame made of `parts` concatenated. All or nothing.
    #[inline]
    pub fn send(&mut self, parts: &[&[u8]]) -> Result<(), TxError> {
        dispatch!(self, t => t.send(parts))
    }

    /// Before a send: the worker's progress count (shared memory packs the small frames
    /// of a burst, sent with no progress call between them).
    #[inline(always)]
    pub fn note_epoch(&mut self, epoch: u64) {
        if let Self::Shm(t) = self {
            t.note_epoch(epoch);
        }
    }

    /// `send` of a frame in three parts (header, extra bytes, data): the small-message
    /// path, which shared memory writes without building and walking a list of parts.
    #[inline]
    pub fn send3(&mut self, a: &[u8], b: &[u8], c: &[u8]) -> Result<(), TxError> {
        match self {
            Self::Shm(t) => t.send3(a, b, c),
            _ => self.send(&[a, b, c]),
        }
    }

    /// Queue one frame like `send`, but links with `Caps::zcopy_min` may keep referring to
    /// the memory of `parts[first_ref..]` after returning (`Sent::Later`) instead of copying
    /// what they could not write yet; earlier parts (headers) are always copied. `token`
    /// (0: none) is reported by `take_completed` when the frame's last byte is written;
    /// frames leave in order, so one token per operation (on its last frame) covers all.
    #[inline]
    pub fn send_zc(
        &mut self,
        parts: &[&[u8]],
        first_ref: usize,
        token: u64,
    ) -> Result<Sent, TxError> {
        match self {
            Self::Tcp(t) => t.send_zc(parts, first_ref, token),
            Self::Loopback(_) | Self::Shm(_) => self.send(parts).map(|()| Sent::Done),
        }
    }

    /// Whether `flush` has bytes to write or `take_completed` tokens to report (links that
    /// keep no queue never have).
    #[inline]
    pub fn has_work(&self) -> bool {
        match self {
            Self::Tcp(t) => t.has_work(),
            Self::Loopback(_) | Self::Shm(_) => false,
        }
    }

    /// Whether `take_completed` has tokens to report.
    #[inline]
    pub fn has_completed(&self) -> bool {
        match self {
            Self::Tcp(t) => t.has_completed(),
            Self::Loopback(_) | Self::Shm(_) => false,
        }
    }

    /// Append the tokens of `send_zc` frames written since the last call to `out`.
    #[inline]
    pub fn take_completed(&mut self, out: &mut Vec<u64>) {
        if let Self::Tcp(t) = self {
            t.take_completed(out)
        }
    }

    /// The endpoint failed and its requests are about to fail: drop every reference to
    /// their memory. A link that dropped queued bytes stays failed (its stream is cut).
    pub fn abandon(&mut self, why: &Error) {
        if let Self::Tcp(t) = self {
            t.abandon(why)
        }
    }

    /// Push out queued bytes. `Ok(true)` when nothing is left queued.
    #[inline]
    pub fn flush(&mut self) -> Result<bool> {
        dispatch!(self, t => t.flush())
    }

    /// Capabilities.
    pub fn caps(&self) -> &Caps {
        dispatch!(self, t => t.caps())
    }

    /// Read `remote` segments of the peer's memory into `local` (RndvMode::RemoteRead only).
    /// `local` is (address, length) pairs in this process.
    ///
    /// # Safety
    /// Every `local` segment must be valid for writes of its length.
    pub unsafe fn remote_read(
        &mut self,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { dispatch!(self, t => t.remote_read(local, remote)) }
    }

    /// The peer's process id where the link is same-host shared memory.
    pub fn peer_pid(&self) -> Option<u32> {
        match self {
            LinkTx::Shm(t) => Some(t.peer_pid()),
            _ => None,
        }
    }

    /// What wakes the peer's worker after a direct write into its memory (shared memory
    /// links only).
    pub(crate) fn doorbell(&self) -> Option<shm::Doorbell> {
        match self {
            LinkTx::Shm(t) => Some(t.doorbell()),
            _ => None,
        }
    }

    /// Whether `remote_write` works on this link (shared memory with CMA).
    pub fn writes_remote(&self) -> bool {
        match self {
            LinkTx::Shm(t) => t.writes_remote(),
            _ => false,
        }
    }

    /// Write `local` segments (in this process) into the peer's `remote` segments: the
    /// other half of a split rendezvous. Links without single-copy access refuse.
    ///
    /// # Safety
    /// Every `local` segment must be valid for reads of its length.
    pub unsafe fn remote_write(
        &mut self,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
    ) -> Result<()> {
        match self {
            // SAFETY: forwarded contract.
            LinkTx::Shm(t) => unsafe { t.remote_write(local, remote) },
            _ => Err(Error::new(
                Status::Unsupported,
                "no split rendezvous here: remote writes are for shared-memory CMA links",
            )),
        }
    }
}

impl LinkRx {
    /// The link now belongs to an endpoint: it takes frames of any size the protocol
    /// allows (before, a tcp link takes only setup-sized ones), and a link whose peer is
    /// noticed gone only by probing (tcp keepalive) probes as `cfg` says.
    pub fn established(&mut self, cfg: &crate::base::Config) {
        match self {
            Self::Tcp(r) => {
                r.established();
                if let Some(fd) = r.fd() {
                    tcp::set_keepalive(fd, cfg);
                }
            }
            Self::Shm(r) => r.established(),
            _ => {}
        }
    }

    /// A count that grows while the peer sends: bytes read (tcp), FIFO cells read (shm);
    /// 0 on loopback.
    pub fn received(&self) -> u64 {
        match self {
            Self::Tcp(r) => r.received(),
            Self::Shm(r) => r.received(),
            Self::Loopback(_) => 0,
        }
    }

    /// Whether the peer is known to have exited by other means than the link (a shared
    /// memory peer's pidfd, polled).
    pub fn peer_exited(&self) -> bool {
        match self {
            Self::Shm(r) => r.peer_exited(),
            _ => false,
        }
    }

    /// `false` only when certainly nothing is waiting: a cheap check before `peek` (one
    /// load on shared memory; on tcp, whether bytes are buffered, the socket being read by
    /// `poll_read` or `on_readable`; on the loopback link, whether a frame is queued or its
    /// other half has closed).
    #[inline]
    pub fn maybe_ready(&self) -> bool {
        match self {
            LinkRx::Shm(r) => r.ready(),
            LinkRx::Tcp(r) => r.maybe_ready(),
            LinkRx::Loopback(r) => r.ready(),
        }
    }

    /// For a link whose frames are read in place (`Caps::frames_in_place`): whether a frame
    /// waits (one load); `None` for other links.
    #[inline(always)]
    pub fn in_place_ready(&self) -> Option<bool> {
        match self {
            LinkRx::Shm(r) => Some(r.ready()),
            _ => None,
        }
    }

    /// `peek` on a link whose frames are read in place (`Caps::frames_in_place`), in line:
    /// the receive loop's small-message path. `None` for other links.
    #[inline(always)]
    pub fn peek_in_place(&mut self) -> Option<Result<Option<RawFrame>>> {
        match self {
            LinkRx::Shm(r) => Some(r.peek()),
            _ => None,
        }
    }

    /// The next complete frame, not consumed. No system call. (Shared memory is read in
    /// place at the call; the other links behind a call of their own, so that the small
    /// shared-memory case stays small enough to be inlined into the receive loop.)
    #[inline]
    pub fn peek(&mut self) -> Result<Option<RawFrame>> {
        match self {
            LinkRx::Shm(r) => r.peek(),
            _ => self.peek_other(),
        }
    }

    #[inline(never)]
    fn peek_other(&mut self) -> Result<Option<RawFrame>> {
        dispatch!(self, r => r.peek())
    }

    /// Release the frame returned by the last `peek`.
    #[inline]
    pub fn consume(&mut self) {
        match self {
            LinkRx::Shm(r) => r.consume(),
            _ => self.consume_other(),
        }
    }

    #[inline(never)]
    fn consume_other(&mut self) {
        dispatch!(self, r => r.consume())
    }

    /// The fd to watch for readability (and hang-up), if the link has one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        dispatch!(self, r => r.fd())
    }

    /// This side's socket address, for a tcp link.
    pub fn local_sockaddr(&self) -> Option<std::net::SocketAddr> {
        match self {
            LinkRx::Tcp(r) => {
                let fd = r.fd()?;
                let a = rustix::net::getsockname(fd).ok()?;
                std::net::SocketAddr::try_from(a).ok()
            }
            _ => None,
        }
    }

    /// The peer's socket address, for a tcp link.
    pub fn peer_sockaddr(&self) -> Option<std::net::SocketAddr> {
        match self {
            LinkRx::Tcp(r) => {
                let fd = r.fd()?;
                let a = rustix::net::getpeername(fd).ok()??;
                std::net::SocketAddr::try_from(a).ok()
            }
            _ => None,
        }
    }

    /// Whether the peer is certainly a process of this host: a link inside one worker, a
    /// same-host memory link (whose acceptor checked the peer's user), or a tcp connection
    /// from a loopback address or from this side's own address (the kernel refuses packets
    /// from outside that carry one of this host's addresses as their source).
    pub fn peer_on_this_host(&self, tx: &LinkTx) -> bool {
        match self {
            LinkRx::Loopback(_) => true,
            _ if tx.caps().peer_memory => true,
            LinkRx::Tcp(_) => {
                let (Some(peer), Some(me)) = (self.peer_sockaddr(), self.local_sockaddr()) else {
                    return false;
                };
                let ip = match peer.ip() {
                    std::net::IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map(std::net::IpAddr::V4)
                        .unwrap_or(std::net::IpAddr::V6(v6)),
                    v4 => v4,
                };
                ip.is_loopback() || ip == me.ip()
            }
            LinkRx::Shm(_) => false,
        }
    }

    /// The fd was reported readable or hung up: read what is there. An error means the
    /// link is dead (peer closed or died, or sent bytes that are not frames).
    pub fn on_readable(&mut self) -> Result<()> {
        dispatch!(self, r => r.on_readable())
    }

    /// Read without a readiness report, for links with `Caps::data_via_fd` that progress
    /// polls itself; does nothing while a complete frame is buffered. Other links: no-op.
    pub fn poll_read(&mut self) -> Result<()> {
        match self {
            Self::Tcp(r) => r.poll_read(),
            Self::Loopback(_) | Self::Shm(_) => Ok(()),
        }
    }

    /// Direct placement (links that read from a socket): the buffered start of the next
    /// frame if it is large and incomplete, with the frame's length. The caller answers with
    /// `place`, `decline`, or nothing (to look again when more has arrived). Calling it
    /// tells the link that large frames need not be buffered whole before they are offered.
    #[inline]
    pub fn peek_partial(&mut self) -> Option<(RawFrame, usize)> {
        match self {
            Self::Tcp(r) => r.peek_partial(),
            Self::Loopback(_) | Self::Shm(_) => None,
        }
    }

    /// Read the rest of the frame `peek_partial` offered, from byte `data_start` on,
    /// straight into `segs` (their lengths add up to that rest). `guard`, asked before each
    /// read, says whether the segments may still be written; once it says no, the rest of
    /// the payload is dropped. `false`: not done.
    ///
    /// # Safety
    /// The segments must be valid for writes, not overlap, and stay valid until the frame
    /// is returned by `take_placed` or the link is dropped.
    pub unsafe fn place(
        &mut self,
        data_start: usize,
        segs: Vec<(usize, usize)>,
        guard: Option<PlaceGuard>,
    ) -> bool {
        match self {
            // SAFETY: forwarded contract.
            Self::Tcp(r) => unsafe { r.place(data_start, segs, guard) },
            Self::Loopback(_) | Self::Shm(_) => false,
        }
    }

    /// Keep the frame `peek_partial` offered in the link's buffer; `peek` returns it whole.
    pub fn decline(&mut self) {
        if let Self::Tcp(r) = self {
            r.decline()
        }
    }

    /// A placed frame whose payload has fully arrived: (its bytes before `data_start`, the
    /// payload length). Release it with `consume`.
    #[inline]
    pub fn take_placed(&mut self) -> Option<(RawFrame, usize)> {
        match self {
            Self::Tcp(r) => r.take_placed(),
            Self::Loopback(_) | Self::Shm(_) => None,
        }
    }

    /// Prepare to sleep on `fd()`: ask the peer to wake us on its next send. Returns
    /// `Ok(false)` if a frame is already waiting (do not sleep).
    pub fn arm(&mut self) -> Result<bool> {
        dispatch!(self, r => r.arm())
    }
}

/// Copy scattered `remote` segments (addresses in this process) into scattered `local` ones.
///
/// # Safety
/// All segments must be valid for their lengths; `local` for writes.
pub(crate) unsafe fn copy_segments(local: &[(usize, usize)], remote: &[(u64, u64)]) -> Result<()> {
    walk_segments(local, remote, |laddr, raddr, n| {
        // SAFETY: bounds from the caller's segments; regions do not overlap (distinct buffers).
        unsafe { std::ptr::copy_nonoverlapping(raddr as *const u8, laddr as *mut u8, n) };
        Ok(())
    })
}

/// Walk `local` and `remote` side by side, in order: `f(local address, remote address, n)`
/// for each run that lies in one segment of each. Stops where `local` runs out.
pub(crate) fn walk_segments(
    local: &[(usize, usize)],
    remote: &[(u64, u64)],
    mut f: impl FnMut(usize, u64, usize) -> Result<()>,
) -> Result<()> {
    let (mut li, mut loff) = (0usize, 0usize);
    for &(raddr, rlen) in remote {
        let mut rdone = 0u64;
        while rdone < rlen {
            let Some(&(laddr, llen)) = local.get(li) else {
                return Ok(());
            };
            let n = ((rlen - rdone) as usize).min(llen - loff);
            f(laddr + loff, raddr + rdone, n)?;
            rdone += n as u64;
            loff += n;
            if loff == llen {
                li += 1;
                loff = 0;
            }
        }
    }
    Ok(())
}
