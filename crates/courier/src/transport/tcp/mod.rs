//! tcp — frames over TCP sockets, between hosts or processes (IPv4 and IPv6).
//!
//! Wire format: the connecting side first writes the 8-byte [`PREAMBLE`]; the accepting
//! side checks it before anything else. After that, in both directions, each frame is a
//! 4-byte little-endian length (1 to [`MAX_FRAME`]) followed by that many bytes.
//!
//! Sending: `send` writes the length prefix and the parts with one system call when nothing
//! is queued (a small frame gathered on the stack with `send`, a larger one with
//! `sendmsg`); what the kernel does not take goes into a user-space queue (fixed-size
//! blocks, recycled as they are written: `chunks`), which `flush` writes out, many small
//! frames in one system call, at most [`TX_BUDGET`] bytes per progress call. Beyond
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
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendAncillaryBuffer, SendFlags, SocketFlags};

use super::{Caps, RawFrame, RndvMode, Sent, TxError};
use crate::base::config::TcpCongestion;
use crate::base::{Config, Error, Result, Status};

mod chunks;
mod place;
mod rx;
#[cfg(any(test, feature = "fuzzing"))]
pub use rx::fuzz_framing;
mod sock;
mod tx;
pub(crate) use sock::set_keepalive;
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
/// A link's kernel receive buffer starts at most this large, and grows to
/// `COURIER_TCP_RCVBUF` once `GROW_AFTER_BULK` bytes arrived on it in frames of at least
/// `place::PLACE_MIN` bytes (`Rx::bulk_arrived`): a link that carries bulk data. A peer that
/// sends small segments faster than they are read keeps the kernel's queue full, and the
/// kernel then re-copies the whole queue as further segments arrive, inside whichever call
/// of this process next holds the socket: calls of up to a quarter of a second in a 60 s
/// get flood with 4 MiB, under 90 ms with 1 MiB. For bulk data 1 MiB costs up to a third
/// of the bandwidth of a connection on a slow host (bench/analysis.md, "Receive buffers that
/// grow with bulk data"). A peer that first sends in bulk and then floods meets the grown
/// buffer.
const RCVBUF_START: usize = 1 << 20;
/// Bytes in large frames after which a link's receive buffer grows.
const GROW_AFTER_BULK: usize = 4 << 20;

/// The receive buffer a link starts with when `COURIER_TCP_RCVBUF` is `configured` (0:
/// the system's, tuned by the kernel).
fn first_rcvbuf(configured: usize) -> usize {
    configured.min(RCVBUF_START)
}
/// Most queued bytes written between two `flush` calls (a progress call's round): a peer
/// that reads as fast as it is written to cannot keep one progress call writing to it (the
/// answers to a flood of gets, say), and the other links are served in between. A frame
/// sent while nothing is queued is written from the caller's memory regardless.
pub const TX_BUDGET: usize = 1 << 20;

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

/// The transport's name, as `COURIER_TLS` and the selection lines say it.
pub const NAME: &str = "tcp";

fn caps(local: Option<SocketAddr>) -> Caps {
    Caps {
        name: NAME,
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
        frames_in_place: false,
        peer_memory: false,
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
    caps: Caps,
    /// Copied bytes not yet written; `segs` says where they go in the stream.
    q: chunks::Chunks,
    /// The queued stream, in order: runs of `q` and references to callers' memory.
    segs: VecDeque<Seg>,
    /// Bytes queued by reference (in `Seg::Ref`s).
    ref_bytes: usize,
    /// Queued bytes the kernel has taken since the link was made: while it grows, the
    /// peer's side takes data (a stopped peer's receive window closes, and it stops).
    drained: u64,
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
    /// Queued bytes that may still be written before the next `flush` ([`TX_BUDGET`]).
    budget: usize,
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
    /// Bytes read from the socket since the link was made: while it grows, the peer sends
    /// (a keepalive answer may wait behind what it sends).
    received: u64,
    /// Where a placed payload whose destination went away is read and dropped.
    scratch: Vec<u8>,
    /// The protocol declined to place the (large) frame at `start`: buffer it whole.
    declined: bool,
    /// The protocol looks at large frames before they are complete (it called
    /// `peek_partial`): do not buffer them whole unless it declines.
    placing_user: bool,
    /// The last frame taken was placed: the next one is likely large too, so reads stop
    /// after its head until the protocol has looked at it (`Rx::read_budget`).
    after_placed: bool,
    /// `peek_partial` showed the protocol the frame at `start`.
    offered: bool,
    /// The largest frame taken: `SETUP_FRAME_MAX` until the link belongs to an endpoint.
    frame_limit: usize,
    /// Bytes of `buf` past `RX_INITIAL`, counted in `GROWN` (released when `buf` shrinks
    /// back, and on drop).
    grown: usize,
    /// `COURIER_MAX_RX_BUFFERED`: what `GROWN` may reach.
    grown_limit: usize,
    /// The receive buffer to grow to once enough bulk data arrived (`bulk_arrived`); 0
    /// when the socket already has it (or the system's).
    grow_rcvbuf: usize,
    /// Bytes that arrived in large frames while the receive buffer may still grow.
    bulk: usize,
}

/// Bytes that every tcp link of this process holds in receive buffers grown past
/// `RX_INITIAL` (large frames that are not whole yet and not placed). A peer decides how
/// much of a frame it sends and when; with many links, each holding most of a frame of
/// up to `MAX_FRAME`, that would be gigabytes: `COURIER_MAX_RX_BUFFERED` bounds the sum,
/// and the link that would pass it fails.
static GROWN: AtomicUsize = AtomicUsize::new(0);

impl Drop for Rx {
    fn drop(&mut self) {
        GROWN.fetch_sub(self.grown, Ordering::Relaxed);
    }
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
    /// `COURIER_MAX_RX_BUFFERED`, for the links accepted here.
    rx_buffered: usize,
}

fn halves(
    fd: OwnedFd,
    peer: SocketAddr,
    accepting: bool,
    cc: &TcpCongestion,
    grown_limit: usize,
    rcvbuf: usize,
) -> (Tx, Rx) {
    let sock = Arc::new(fd);
    let local = sock::local_addr(sock.as_fd());
    sock::set_congestion(sock.as_fd(), peer, local, cc);
    let tx = Tx {
        sock: sock.clone(),
        peer,
        caps: caps(local),
        q: chunks::Chunks::default(),
        segs: VecDeque::new(),
        ref_bytes: 0,
        drained: 0,
        completed: Vec::new(),
        high_water: HIGH_WATER,
        burst: false,
        next_flush: COALESCE,
        full: false,
        budget: TX_BUDGET,
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
        received: 0,
        declined: false,
        scratch: Vec::new(),
        placing_user: false,
        after_placed: false,
        offered: false,
        frame_limit: SETUP_FRAME_MAX,
        grown: 0,
        grown_limit,
        grow_rcvbuf: if rcvbuf > first_rcvbuf(rcvbuf) {
            rcvbuf
        } else {
            0
        },
        bulk: 0,
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
        // Accepted sockets inherit these (set before listen; the window scale is chosen for
        // the largest buffer the system allows, so a receive buffer grown later fits it).
        sock::set_buffers(
            fd.as_fd(),
            cfg.tcp_sndbuf,
            first_rcvbuf(cfg.tcp_rcvbuf),
            &what,
        )?;
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
            rx_buffered: cfg.limits.rx_buffered,
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
                        sock::set_buffers(fd.as_fd(), self.sndbuf, first_rcvbuf(self.rcvbuf), &what)
                    });
                    if let Err(e) = setup {
                        tracing::debug!("{e}; connection dropped");
                        continue;
                    }
                    let (tx, rx) = halves(
                        fd,
                        peer,
                        true,
                        &self.congestion,
                        self.rx_buffered,
                        self.rcvbuf,
                    );
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
    let (mut tx, rx) = halves(
        fd,
        addr,
        false,
        &cfg.tcp_congestion,
        cfg.limits.rx_buffered,
        cfg.tcp_rcvbuf,
    );
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
