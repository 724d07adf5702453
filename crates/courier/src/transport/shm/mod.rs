//! shm — frames between processes of one host through shared memory.
//!
//! Setup: the connecting side creates a sealed memfd holding a header and two FIFOs (one per
//! direction, see [`fifo`]), connects a unix stream socket to the acceptor's *abstract* name
//! and passes the memfd with SCM_RIGHTS in a hello. The acceptor checks and maps the segment,
//! probes CMA, and replies; the connector probes CMA too and confirms. Nothing is ever named
//! in the file system, so nothing leaks when a process dies. Neither side waits for the
//! other: the acceptor steps its setups as its worker progresses, and the connector
//! ([`Connecting`]) polls for the reply, so two workers driven by one thread connect too.
//!
//! The socket stays open for the life of the link: the kernel closes it when the peer exits
//! or is killed, which is how a dead peer is noticed (HUP/EOF on [`Rx::fd`]), and it carries
//! one-byte wakeups when the receiver sleeps ([`Rx::arm`]).
//!
//! Large messages: when `process_vm_readv` works between the two processes (in both
//! directions), the link offers [`RndvMode::RemoteRead`] (CMA); otherwise
//! [`RndvMode::Push`] through the FIFO.

mod cma;
mod fifo;
pub(crate) mod memory;
mod segment;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::{Caps, RawFrame, RndvMode, TxError};
use crate::base::config::CmaPolicy;
use crate::base::{Config, Error, Result, Status};
use crate::wire::shm::{
    Hello, Reply, confirm, emit_confirm, hello, parse_confirm, policy, reason, reply,
};
use fifo::{Consumer, FifoRef, Producer};
use segment::Mapping;

/// How long a connection may take to set up (either side).
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections being set up that an acceptor keeps at most.
const MAX_PENDING: usize = 64;

const HELLO_LEN: usize = hello::LEN;
const REPLY_LEN: usize = reply::LEN;
const CONFIRM_LEN: usize = confirm::LEN;

fn policy_bits(p: CmaPolicy) -> u32 {
    match p {
        CmaPolicy::Auto => policy::CMA_ALLOWED,
        CmaPolicy::Yes => policy::CMA_ALLOWED | policy::CMA_REQUIRED,
        CmaPolicy::No => 0,
    }
}

/// Probe CMA by reading the peer's view of the probe word. Logs (once per process) when the
/// kernel refuses. Returns whether it works.
fn probe_cma(pid: u32, map: &Mapping, peer_side: usize) -> std::result::Result<(), String> {
    if pid == 0 {
        return Err("peer pid not visible (another pid namespace)".into());
    }
    let h = map.header();
    let addr = h.map_base[peer_side]
        .load(Relaxed)
        .wrapping_add(segment::PROBE_OFFSET as u64);
    let want = h.probe.load(Relaxed);
    match cma::read_word(pid, addr) {
        Ok(v) if v == want => Ok(()),
        Ok(_) => Err("probe word mismatch (peer pid does not name the peer process)".into()),
        Err(e) => {
            static ONCE: Once = Once::new();
            let text = cma::errno_text(e);
            ONCE.call_once(|| {
                tracing::info!("shm: CMA refused by the kernel ({text}); large messages go through shared bounce buffers");
            });
            Err(format!("process_vm_readv refused: {text}"))
        }
    }
}

/// The transport's name, as `COURIER_TLS` and the selection lines say it.
pub const NAME: &str = "shm";

fn caps(max_frame: usize, cma: bool) -> Caps {
    Caps {
        name: NAME,
        device: "memory".into(),
        max_short: segment::CELL - segment::CELL_HDR,
        max_frame,
        rndv: if cma {
            RndvMode::RemoteRead
        } else {
            RndvMode::Push
        },
        rndv_thresh: 16 << 10,
        zcopy_min: usize::MAX,
        place_min: usize::MAX,
        peer_failure: true,
        wakeup: true,
        data_via_fd: false,
        frames_in_place: true,
        peer_memory: true,
        latency_ns: 100.0,
        bandwidth_mbs: 10000.0,
    }
}

/// What both halves of a link share: the socket and the mapping.
struct Link {
    sock: OwnedFd,
    /// Kept mapped for as long as either half lives (the FIFOs point into it).
    _map: Mapping,
    peer_pid: u32,
}

impl Link {
    /// Send the wakeup byte (a full socket already holds one to wake on).
    fn wake(&self) -> Result<(), TxError> {
        loop {
            match rustix::net::send(
                &self.sock,
                &[1u8],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(_) | Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => continue,
                Err(e) => {
                    return Err(TxError::Failed(Error::msg(
                        Status::PeerFailure,
                        format!(
                            "shm peer (pid {}) closed the connection or died ({e})",
                            self.peer_pid
                        ),
                    )));
                }
            }
        }
    }
}

/// Wakes the peer's worker after a write into its memory that is not a frame: a same-host
/// direct put-with-signal, which a `signal_wait_until` sleeping on that worker waits for.
/// It uses the link's own wakeup protocol (the consumer's `armed` flag and the socket's
/// byte), so it may be rung from any thread, beside the link's sender.
pub(crate) struct Doorbell {
    f: FifoRef,
    link: Arc<Link>,
}

// SAFETY: the FIFO reference points into the mapping kept alive by the Arc<Link>, and a
// doorbell touches only its control block's atomics and the socket (a send of one byte,
// safe from any thread).
unsafe impl Send for Doorbell {}
// SAFETY: as above; every method takes `&self` and uses atomics or a socket send.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Whether the peer's worker may sleep at all: if not, a writer needs no ordered
    /// write and no `ring`.
    #[inline]
    pub(crate) fn may_sleep(&self) -> bool {
        self.f.consumer_may_sleep()
    }

    /// Wake the peer's worker if it sleeps, after a sequentially consistent
    /// read-modify-write of the word it waits on (see `FifoRef::claim_wakeup`). A peer
    /// that has gone away is not an error here: the write is done, and the link reports
    /// the failure to whoever uses it next.
    pub(crate) fn ring(&self) {
        if self.f.claim_wakeup()
            && let Err(TxError::Failed(e)) = self.link.wake()
        {
            tracing::debug!("doorbell: {e}");
        }
    }
}

/// Build the two halves. `side` 0 = connector (sends on FIFO 0), 1 = acceptor.
/// `n` is the cell count the mapping was created or checked for — never re-read from the
/// shared header, which the peer could change after the check.
fn make_link(
    sock: OwnedFd,
    map: Mapping,
    n: usize,
    side: usize,
    peer_pid: u32,
    cma: bool,
) -> Result<(Tx, Rx)> {
    rustix::io::ioctl_fionbio(&sock, true)
        .map_err(|e| Error::io("shm: making the socket non-blocking", e))?;
    if !segment::valid_ncells(n) || map.len() < segment::fifo_offset(n, 2) {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "shm: mapping of {} bytes cannot hold two FIFOs of {n} cells",
                map.len()
            ),
        ));
    }
    let base = map.base();
    // SAFETY: checked just above: both FIFOs of `n` cells lie inside the mapping; the
    // Arc<Link> held by Tx and Rx keeps it mapped.
    let (out_f, in_f) = unsafe {
        (
            FifoRef::new(base.add(segment::fifo_offset(n, side)), n),
            FifoRef::new(base.add(segment::fifo_offset(n, 1 - side)), n),
        )
    };
    let link = Arc::new(Link {
        sock,
        _map: map,
        peer_pid,
    });
    let prod = Producer::new(out_f);
    let caps = caps(prod.max_frame(), cma);
    Ok((
        Tx {
            prod,
            link: link.clone(),
            caps,
            cma,
        },
        Rx {
            cons: Consumer::new(in_f),
            link,
            eof: false,
        },
    ))
}

/// Sending half.
pub struct Tx {
    prod: Producer,
    link: Arc<Link>,
    caps: Caps,
    cma: bool,
}

impl Drop for Tx {
    /// The socket closes when the last holder of the link goes, which a `Doorbell` (held
    /// by a remote key) can delay past the endpoint's end: shut our side now, so the peer
    /// sees the hang-up when the link goes, as it would without one.
    fn drop(&mut self) {
        let _ = rustix::net::shutdown(&self.link.sock, rustix::net::Shutdown::Write);
    }
}

/// Receiving half.
pub struct Rx {
    cons: Consumer,
    link: Arc<Link>,
    eof: bool,
}

// SAFETY: Tx owns its producer position exclusively (one producer per FIFO); the raw pointers
// in it point into the mapping kept alive by the Arc<Link>, and the shared state they reach
// is accessed through atomics only. Moving Tx to another thread changes none of that.
unsafe impl Send for Tx {}
// SAFETY: as for Tx, with the consumer position owned exclusively by Rx.
unsafe impl Send for Rx {}

impl Tx {
    pub(crate) fn send(&mut self, parts: &[&[u8]]) -> Result<(), TxError> {
        if self.prod.push(parts)? && self.prod.take_armed() {
            self.wake()?;
        }
        Ok(())
    }

    /// `send` of a frame in three parts (header, extra bytes, data).
    #[inline(always)]
    pub(crate) fn send3(&mut self, a: &[u8], b: &[u8], c: &[u8]) -> Result<(), TxError> {
        if self.prod.push3(a, b, c)? && self.prod.take_armed() {
            self.wake()?;
        }
        Ok(())
    }

    #[cold]
    fn wake(&self) -> Result<(), TxError> {
        self.link.wake()
    }

    /// Before a send: `epoch` counts the worker's progress calls. The same as at the
    /// previous send means a burst, whose small frames share cells (see `fifo`).
    #[inline(always)]
    pub(crate) fn note_epoch(&mut self, epoch: u64) {
        self.prod.note_epoch(epoch);
    }

    /// The handle a direct write into the peer's memory uses to wake the peer's worker
    /// (the one this link connects to) when it sleeps.
    pub(crate) fn doorbell(&self) -> Doorbell {
        Doorbell {
            f: self.prod.fifo_ref(),
            link: self.link.clone(),
        }
    }

    pub(crate) fn flush(&mut self) -> Result<bool> {
        Ok(true)
    }

    pub(crate) fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Whether this link reads the peer's memory directly (CMA, `process_vm_readv`).
    pub fn cma(&self) -> bool {
        self.cma
    }

    /// The peer's process id (as seen from this process).
    pub fn peer_pid(&self) -> u32 {
        self.link.peer_pid
    }

    /// The peer's pid for CMA, or why this link has none.
    fn cma_pid(&self, what: &str) -> Result<u32> {
        if self.cma {
            Ok(self.link.peer_pid)
        } else {
            Err(Error::msg(
                Status::Unsupported,
                format!("shm: this link has no CMA (remote {what} are off or refused)"),
            ))
        }
    }

    pub(crate) unsafe fn remote_read(
        &mut self,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
    ) -> Result<()> {
        let pid = self.cma_pid("reads")?;
        // SAFETY: the caller guarantees every local segment is writable.
        unsafe { cma::read(pid, local, remote) }
    }

    pub(crate) fn writes_remote(&self) -> bool {
        self.cma
    }

    pub(crate) unsafe fn remote_write(
        &mut self,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
    ) -> Result<()> {
        let pid = self.cma_pid("writes")?;
        // SAFETY: the caller guarantees every local segment is readable.
        unsafe { cma::write(pid, local, remote) }
    }
}

impl Rx {
    /// Whether a frame is waiting (one load; no validation, `peek` does that).
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        self.cons.ready()
    }

    #[inline]
    pub(crate) fn peek(&mut self) -> Result<Option<RawFrame>> {
        self.cons.peek()
    }

    #[inline]
    pub(crate) fn consume(&mut self) {
        self.cons.consume()
    }

    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.link.sock.as_fd())
    }

    /// Drain wakeup bytes. On EOF or a socket error the link is dead; frames the peer
    /// published before it went away are still delivered first (this returns `Ok` while one
    /// is waiting), then it returns `PeerFailure`.
    pub(crate) fn on_readable(&mut self) -> Result<()> {
        let mut buf = [0u8; 64];
        let mut why = None;
        while !self.eof {
            match rustix::net::recv(&self.link.sock, &mut buf, RecvFlags::DONTWAIT) {
                Ok((_, 0)) => self.eof = true,
                Ok((_, n)) if n < buf.len() => return Ok(()),
                Ok(_) => {}
                Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(e) => {
                    self.eof = true;
                    why = Some(e);
                }
            }
        }
        if self.cons.ready() {
            return Ok(());
        }
        let pid = self.link.peer_pid;
        Err(Error::msg(
            Status::PeerFailure,
            match why {
                Some(e) => format!("shm peer (pid {pid}) closed the connection / died ({e})"),
                None => format!("shm peer (pid {pid}) closed the connection / died"),
            },
        ))
    }

    pub(crate) fn arm(&mut self) -> Result<bool> {
        if self.eof {
            // The socket is hung up: a sleep on it returns at once and on_readable reports.
            return Ok(!self.cons.ready());
        }
        Ok(self.cons.arm())
    }
}

// ---------------------------------------------------------------------------------------
// Connector
// ---------------------------------------------------------------------------------------

fn unix_socket(flags: SocketFlags) -> Result<OwnedFd> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | flags,
        None,
    )
    .map_err(|e| Error::io("shm: creating a unix socket", e))
}

fn name_text(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn send_all(sock: &OwnedFd, buf: &[u8], what: &str) -> Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        match rustix::net::send(sock, &buf[sent..], SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: sending the {what}: {e}"),
                ));
            }
        }
    }
    Ok(())
}

fn peer_pid(sock: &OwnedFd) -> u32 {
    rustix::net::sockopt::socket_peercred(sock)
        .map(|c| c.pid.as_raw_nonzero().get() as u32)
        .unwrap_or(0)
}

/// The connecting side of a setup under way. The hello (with the segment) is sent;
/// `poll` reads the acceptor's reply without blocking and `finish` completes the setup.
/// Nothing here waits for the acceptor: its worker may be progressed by the very thread
/// that connects (two workers of one event loop), which waiting would starve.
pub struct Connecting {
    sock: OwnedFd,
    map: Mapping,
    n: usize,
    shown: String,
    acc_pid: u32,
    cma: CmaPolicy,
    wakeup: bool,
    reply: [u8; REPLY_LEN],
    got: usize,
    since: Instant,
}

/// Start connecting to the acceptor named `name` (abstract namespace, without the leading
/// NUL): connect and send the hello. Does not wait for the acceptor.
pub fn connect_start(name: &[u8], cfg: &Config) -> Result<Connecting> {
    let shown = name_text(name);
    let (memfd, map) = segment::create(cfg.shm_fifo_size)?;
    let n = cfg.shm_fifo_size;
    let sock = unix_socket(SocketFlags::empty())?;
    for t in [
        rustix::net::sockopt::Timeout::Recv,
        rustix::net::sockopt::Timeout::Send,
    ] {
        rustix::net::sockopt::set_socket_timeout(&sock, t, Some(SETUP_TIMEOUT))
            .map_err(|e| Error::io("shm: setting socket timeouts", e))?;
    }
    let addr = SocketAddrUnix::new_abstract_name(name).map_err(|_| {
        Error::msg(
            Status::InvalidAddress,
            format!("shm: acceptor name {shown:?} is too long"),
        )
    })?;
    loop {
        match rustix::net::connect(&sock, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => continue,
            Err(e @ (Errno::CONNREFUSED | Errno::NOENT)) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!(
                        "shm: no acceptor named {shown:?} on this host ({e}); the peer process is gone or on another host"
                    ),
                ));
            }
            Err(Errno::AGAIN) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: acceptor {shown:?} is not accepting (backlog full)"),
                ));
            }
            Err(e) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: connecting to {shown:?}: {e}"),
                ));
            }
        }
    }
    let acc_pid = peer_pid(&sock);

    // Hello with the memfd.
    let hello = Hello {
        version: segment::VERSION,
        policy: policy_bits(cfg.shm_cma),
        ncells: n as u32,
        cell: segment::CELL as u32,
        size: map.len() as u64,
    }
    .emit();
    {
        let fds = [memfd.as_fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::new(
                Status::IoError,
                "shm: ancillary buffer too small for one fd",
            ));
        }
        let sent = loop {
            match rustix::net::sendmsg(
                &sock,
                &[IoSlice::new(&hello)],
                &mut anc,
                SendFlags::NOSIGNAL,
            ) {
                Err(Errno::INTR) => continue,
                r => break r,
            }
        }
        .map_err(|e| {
            Error::msg(
                Status::Unreachable,
                format!("shm: sending the segment to {shown:?}: {e}"),
            )
        })?;
        if sent < HELLO_LEN {
            send_all(&sock, &hello[sent..], "hello")?;
        }
    }
    drop(memfd);
    rustix::io::ioctl_fionbio(&sock, true)
        .map_err(|e| Error::io("shm: making the socket non-blocking", e))?;
    Ok(Connecting {
        sock,
        map,
        n,
        shown,
        acc_pid,
        cma: cfg.shm_cma,
        wakeup: cfg.wakeup,
        reply: [0u8; REPLY_LEN],
        got: 0,
        since: Instant::now(),
    })
}

/// Connect to the acceptor named `name` and finish the setup, blocking until it answers
/// (at most `SETUP_TIMEOUT`): for a caller whose acceptor runs on another thread.
#[cfg(test)]
pub fn connect(name: &[u8], cfg: &Config) -> Result<(Tx, Rx)> {
    let mut c = connect_start(name, cfg)?;
    while !c.poll()? {
        std::thread::sleep(Duration::from_micros(50));
    }
    c.finish()
}

impl Connecting {
    /// Read what has arrived of the acceptor's reply. `Ok(true)`: all of it (`finish`
    /// next); `Ok(false)`: not yet. An error if the acceptor closed, or has not answered
    /// within `SETUP_TIMEOUT`.
    pub fn poll(&mut self) -> Result<bool> {
        while self.got < REPLY_LEN {
            match rustix::net::recv(&self.sock, &mut self.reply[self.got..], RecvFlags::DONTWAIT) {
                Ok((_, 0)) => {
                    return Err(Error::msg(
                        Status::Rejected,
                        format!(
                            "shm: {:?} closed the connection during setup (setup reply); see its log",
                            self.shown
                        ),
                    ));
                }
                Ok((_, k)) => self.got += k,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) if self.since.elapsed() <= SETUP_TIMEOUT => return Ok(false),
                Err(Errno::AGAIN) => {
                    return Err(Error::msg(
                        Status::Timeout,
                        format!(
                            "shm: no setup reply from {:?} within {SETUP_TIMEOUT:?} (is its worker progressed?)",
                            self.shown
                        ),
                    ));
                }
                Err(e) => {
                    return Err(Error::msg(
                        Status::Unreachable,
                        format!("shm: reading the setup reply: {e}"),
                    ));
                }
            }
        }
        Ok(true)
    }

    /// The socket the acceptor's reply arrives on (readable when `poll` may move on).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Complete the setup once `poll` said the reply is all there: check it, decide on
    /// CMA, confirm, and build the link.
    pub fn finish(self) -> Result<(Tx, Rx)> {
        let Connecting {
            sock,
            map,
            n,
            shown,
            acc_pid,
            cma: policy,
            wakeup,
            reply,
            got,
            ..
        } = self;
        if got < REPLY_LEN {
            return Err(Error::new(
                Status::InvalidParam,
                "shm: setup finished before the reply was read",
            ));
        }
        let (rflags, rpid) = match Reply::parse(&reply) {
            Some(Reply::Ok { flags, pid }) => (flags, pid),
            Some(Reply::No { pid: rpid, reason }) => {
                let why = match reason {
                    reason::BAD_SEGMENT => {
                        "it could not use our shared segment (different Courier build?)"
                            .to_string()
                    }
                    reason::CMA_REQUIRED => {
                        "it requires CMA (COURIER_SHM_CMA=yes) and process_vm_readv on us was refused"
                            .to_string()
                    }
                    r => format!("reason code {r}"),
                };
                return Err(Error::msg(
                    Status::Rejected,
                    format!("shm: acceptor {shown:?} (pid {rpid}) rejected the connection: {why}"),
                ));
            }
            None => {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!("shm: acceptor {shown:?} sent a malformed setup reply"),
                ));
            }
        };

        // CMA decision: both policies allow it and both directions work.
        let ours = policy_bits(policy);
        let want = ours & policy::CMA_ALLOWED != 0 && rflags & policy::CMA_ALLOWED != 0;
        let mut why_not = String::new();
        let mut cma = false;
        if want {
            if rflags & policy::CMA_WORKS == 0 {
                why_not = "the peer cannot read our memory with process_vm_readv".into();
            } else {
                match probe_cma(acc_pid, &map, 1) {
                    Ok(()) => cma = true,
                    Err(e) => why_not = e,
                }
            }
        } else {
            why_not = "COURIER_SHM_CMA=no on one side".into();
        }
        let required = (ours | rflags) & policy::CMA_REQUIRED != 0;
        let abort = required && !cma;
        let cflags = if abort {
            confirm::ABORT
        } else if cma {
            confirm::CMA
        } else {
            0
        };
        let confirm = emit_confirm(cflags);
        // Our incoming FIFO is the acceptor's outgoing one: say whether we may sleep before
        // the confirmation lets it send.
        // SAFETY: the mapping holds both FIFOs of `n` cells (checked at creation).
        unsafe { FifoRef::new(map.base().add(segment::fifo_offset(n, 1)), n) }.set_sleeper(wakeup);
        send_all(&sock, &confirm, "setup confirmation")?;
        if abort {
            let who = if ours & policy::CMA_REQUIRED != 0 {
                "COURIER_SHM_CMA=yes here"
            } else {
                "the peer sets COURIER_SHM_CMA=yes"
            };
            return Err(Error::msg(
                Status::Unsupported,
                format!("shm: CMA is required ({who}) but unavailable: {why_not}"),
            ));
        }
        let pid = if acc_pid != 0 { acc_pid } else { rpid };
        tracing::debug!("shm: connected to {shown:?} (pid {pid}), {n} cells per FIFO, cma {cma}");
        make_link(sock, map, n, 0, pid, cma)
    }
}

// ---------------------------------------------------------------------------------------
// Acceptor
// ---------------------------------------------------------------------------------------

enum Stage {
    /// Waiting for the hello (and its memfd).
    Hello { memfd: Option<OwnedFd> },
    /// Replied; waiting for the confirmation.
    Confirm {
        map: Mapping,
        ncells: usize,
        cma_ok: bool,
    },
}

struct Pending {
    sock: OwnedFd,
    since: Instant,
    buf: [u8; HELLO_LEN],
    got: usize,
    stage: Stage,
    pid: u32,
}

enum Step {
    Wait,
    /// Setup finished: build the link from the segment, with or without CMA.
    Done(Mapping, usize, bool),
    /// Drop the connection; `true`: warn (misbehaving peer), `false`: debug.
    Drop(String, bool),
}

/// Accepts shm connections on an abstract unix socket.
pub struct Acceptor {
    listener: OwnedFd,
    /// Watches the listener and every connection being set up, so that `fd()` becomes
    /// readable whenever `accept` can make progress.
    epoll: OwnedFd,
    name: Vec<u8>,
    policy: CmaPolicy,
    wakeup: bool,
    pending: Vec<Pending>,
    ready: VecDeque<(Tx, Rx)>,
}

impl Acceptor {
    /// Bind a fresh abstract unix socket named `courier-<pid>-<random hex>`.
    pub fn bind(cfg: &Config) -> Result<Acceptor> {
        let listener = unix_socket(SocketFlags::NONBLOCK)?;
        let mut tries = 0;
        let name = loop {
            let name = format!(
                "courier-{}-{:016x}",
                std::process::id(),
                crate::base::sys::random_u64()
            )
            .into_bytes();
            let addr = SocketAddrUnix::new_abstract_name(&name)
                .map_err(|e| Error::io("shm: abstract name", e))?;
            match rustix::net::bind(&listener, &addr) {
                Ok(()) => break name,
                Err(Errno::ADDRINUSE) if tries < 8 => tries += 1,
                Err(e) => return Err(Error::io("shm: binding an abstract unix socket", e)),
            }
        };
        rustix::net::listen(&listener, 128).map_err(|e| Error::io("shm: listen", e))?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| Error::io("shm: epoll_create", e))?;
        epoll::add(
            &ep,
            &listener,
            epoll::EventData::new_u64(u64::MAX),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("shm: epoll_ctl", e))?;
        Ok(Acceptor {
            listener,
            epoll: ep,
            name,
            policy: cfg.shm_cma,
            wakeup: cfg.wakeup,
            pending: Vec::new(),
            ready: VecDeque::new(),
        })
    }

    /// Whether connections are in the middle of their setup (a hello answered, its
    /// confirmation not read yet).
    pub fn setting_up(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Socket name (abstract namespace, without the leading NUL).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Fd to watch for readability. It is an epoll fd that covers the listening socket and
    /// the connections still being set up; when it is readable, call [`accept`](Self::accept)
    /// until it returns `None`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }

    /// Drop the connection being set up at `i` if its setup has taken longer than
    /// `SETUP_TIMEOUT` (with a warning); whether it did.
    fn drop_if_late(&mut self, i: usize) -> bool {
        if self.pending[i].since.elapsed() <= SETUP_TIMEOUT {
            return false;
        }
        let p = self.remove(i);
        tracing::warn!(
            "shm: dropping connection from pid {}: setup not finished within {SETUP_TIMEOUT:?}",
            p.pid
        );
        true
    }

    /// Drop connections whose setup has taken too long. `accept` does it too, but only runs
    /// when the acceptor is readable, which a peer that says nothing never makes it.
    pub fn expire(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            if !self.drop_if_late(i) {
                i += 1;
            }
        }
    }

    /// Return a connection that is fully set up, if any; never blocks. Misbehaving peers are
    /// dropped with a warning; `Err` only if the listening socket itself failed.
    pub fn accept(&mut self) -> Result<Option<(Tx, Rx)>> {
        loop {
            match rustix::net::accept_with(
                &self.listener,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            ) {
                Ok(s) => self.add_pending(s),
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR | Errno::CONNABORTED | Errno::PROTO) => {}
                Err(e @ (Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)) => {
                    tracing::warn!(
                        "shm: cannot accept a connection on {:?} now: {e}",
                        name_text(&self.name)
                    );
                    break;
                }
                Err(e) => {
                    return Err(Error::io(
                        &format!("shm: accept on {:?}", name_text(&self.name)),
                        e,
                    ));
                }
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            let step = self.step(i);
            match step {
                Step::Wait => {
                    if !self.drop_if_late(i) {
                        i += 1;
                    }
                }
                Step::Done(map, n, cma) => {
                    let p = self.remove(i);
                    let pid = p.pid;
                    match make_link(p.sock, map, n, 1, pid, cma) {
                        Ok(link) => {
                            tracing::debug!("shm: accepted connection from pid {pid}, cma {cma}");
                            self.ready.push_back(link);
                        }
                        Err(e) => tracing::warn!("shm: dropping connection from pid {pid}: {e}"),
                    }
                }
                Step::Drop(why, warn) => {
                    let p = self.remove(i);
                    if warn {
                        tracing::warn!("shm: dropping connection from pid {}: {why}", p.pid);
                    } else {
                        tracing::debug!("shm: connection from pid {} abandoned: {why}", p.pid);
                    }
                }
            }
        }
        Ok(self.ready.pop_front())
    }

    fn add_pending(&mut self, sock: OwnedFd) {
        if self.pending.len() >= MAX_PENDING {
            let p = self.remove(0);
            tracing::warn!(
                "shm: too many connections being set up; dropping the oldest (pid {})",
                p.pid
            );
        }
        let pid = peer_pid(&sock);
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if let Err(e) = epoll::add(&self.epoll, &sock, epoll::EventData::new_u64(0), flags) {
            tracing::warn!("shm: dropping connection from pid {pid}: epoll_ctl: {e}");
            return;
        }
        self.pending.push(Pending {
            sock,
            since: Instant::now(),
            buf: [0; HELLO_LEN],
            got: 0,
            stage: Stage::Hello { memfd: None },
            pid,
        });
    }

    fn remove(&mut self, i: usize) -> Pending {
        let p = self.pending.swap_remove(i);
        let _ = epoll::delete(&self.epoll, &p.sock);
        p
    }
}

/// Tell a connecting peer why it is refused (best effort).
fn reject(p: &Pending, code: u32) {
    let r = Reply::No {
        pid: std::process::id(),
        reason: code,
    }
    .emit();
    let _ = rustix::net::send(&p.sock, &r, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

impl Acceptor {
    /// Make progress on pending connection `i`.
    fn step(&mut self, i: usize) -> Step {
        let policy = self.policy;
        let wakeup = self.wakeup;
        let p = &mut self.pending[i];
        let want = match p.stage {
            Stage::Hello { .. } => HELLO_LEN,
            Stage::Confirm { .. } => CONFIRM_LEN,
        };
        // Read what is there of the current message.
        while p.got < want {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut p.buf[p.got..want])];
            match rustix::net::recvmsg(
                &p.sock,
                &mut iov,
                &mut anc,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) if r.bytes == 0 => {
                    return Step::Drop("peer closed the connection during setup".into(), true);
                }
                Ok(r) => {
                    p.got += r.bytes;
                    for msg in anc.drain() {
                        if let RecvAncillaryMessage::ScmRights(fds) = msg {
                            for fd in fds {
                                match &mut p.stage {
                                    Stage::Hello { memfd: slot @ None } => *slot = Some(fd),
                                    _ => {
                                        return Step::Drop(
                                            "peer passed unexpected file descriptors".into(),
                                            true,
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                Err(Errno::AGAIN) => return Step::Wait,
                Err(Errno::INTR) => {}
                Err(e) => return Step::Drop(format!("reading setup message: {e}"), true),
            }
        }
        let stage = std::mem::replace(&mut p.stage, Stage::Hello { memfd: None });
        p.got = 0;
        match stage {
            Stage::Hello { memfd } => {
                let Some(memfd) = memfd else {
                    return Step::Drop("hello carried no shared segment fd".into(), true);
                };
                let Some(h) = Hello::parse(&p.buf) else {
                    return Step::Drop("not a Courier shm hello (bad magic)".into(), true);
                };
                let (version, cflags, size) = (h.version, h.policy, h.size);
                let (ncells, cell) = (h.ncells as usize, h.cell as usize);
                if version != segment::VERSION || cell != segment::CELL {
                    reject(p, reason::BAD_SEGMENT);
                    return Step::Drop(
                        format!(
                            "peer speaks layout version {version} with {cell}-byte cells; we speak {} with {}",
                            segment::VERSION,
                            segment::CELL
                        ),
                        true,
                    );
                }
                let map = match usize::try_from(size)
                    .map_err(|_| "segment size overflows".to_string())
                    .and_then(|s| segment::open(&memfd, ncells, s))
                {
                    Ok(m) => m,
                    Err(why) => {
                        reject(p, reason::BAD_SEGMENT);
                        return Step::Drop(format!("bad shared segment: {why}"), true);
                    }
                };
                drop(memfd);
                let h = map.header();
                h.pid[1].store(std::process::id(), Relaxed);
                h.map_base[1].store(map.base() as u64, Relaxed);
                let ours = policy_bits(policy);
                let mut rflags = ours;
                let mut cma_ok = false;
                if ours & policy::CMA_ALLOWED != 0 && cflags & policy::CMA_ALLOWED != 0 {
                    match probe_cma(p.pid, &map, 0) {
                        Ok(()) => {
                            cma_ok = true;
                            rflags |= policy::CMA_WORKS;
                        }
                        Err(why) if ours & policy::CMA_REQUIRED != 0 => {
                            reject(p, reason::CMA_REQUIRED);
                            return Step::Drop(
                                format!(
                                    "CMA required (COURIER_SHM_CMA=yes) but unavailable: {why}"
                                ),
                                true,
                            );
                        }
                        Err(_) => {}
                    }
                }
                // Our incoming FIFO: say whether we may sleep before the reply lets the
                // connector send.
                // SAFETY: `segment::open` checked the mapping holds both FIFOs.
                unsafe { FifoRef::new(map.base().add(segment::fifo_offset(ncells, 0)), ncells) }
                    .set_sleeper(wakeup);
                let r = Reply::Ok {
                    flags: rflags,
                    pid: std::process::id(),
                }
                .emit();
                match rustix::net::send(&p.sock, &r, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                    Ok(REPLY_LEN) => {}
                    Ok(_) | Err(_) => {
                        return Step::Drop("could not send the setup reply".into(), true);
                    }
                }
                p.stage = Stage::Confirm {
                    map,
                    ncells,
                    cma_ok,
                };
                // The confirmation may already be there.
                self.step(i)
            }
            Stage::Confirm {
                map,
                ncells,
                cma_ok,
            } => {
                let mut b = [0u8; CONFIRM_LEN];
                b.copy_from_slice(&p.buf[..CONFIRM_LEN]);
                let Some(f) = parse_confirm(&b) else {
                    return Step::Drop("malformed setup confirmation".into(), true);
                };
                if f & confirm::ABORT != 0 {
                    return Step::Drop(
                        "the connecting side gave up (CMA required but unavailable)".into(),
                        false,
                    );
                }
                let cma = f & confirm::CMA != 0;
                if cma && !cma_ok {
                    return Step::Drop(
                        "peer claims CMA works although our probe failed".into(),
                        true,
                    );
                }
                if policy == CmaPolicy::Yes && !cma {
                    return Step::Drop(
                        "CMA required (COURIER_SHM_CMA=yes) but the peer cannot use it".into(),
                        true,
                    );
                }
                Step::Done(map, ncells, cma)
            }
        }
    }
}

/// Whether shared memory can work in this process: memfd, shared mappings and abstract
/// unix sockets. `Err` says what is missing (for `courier info`).
pub fn probe(cfg: &Config) -> std::result::Result<(), String> {
    let (_fd, map) = segment::create(cfg.shm_fifo_size).map_err(|e| e.to_string())?;
    drop(map);
    let a = Acceptor::bind(cfg).map_err(|e| e.to_string())?;
    drop(a);
    Ok(())
}

/// A sentence on whether CMA (`process_vm_readv`) is likely to work between processes here,
/// from the Yama ptrace policy (for `courier info`; the real decision is a per-link probe).
pub fn cma_status() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
    {
        Ok(s) if s == "0" => "likely (Yama ptrace_scope 0)".into(),
        Ok(s) if s == "1" => {
            "only towards descendant processes (Yama ptrace_scope 1); probed per link".into()
        }
        Ok(s) => format!("unlikely (Yama ptrace_scope {s}); probed per link"),
        Err(_) => "no Yama policy; probed per link".into(),
    }
}

/// A connected pair in one process (connector side, acceptor side), for tests.
#[cfg(test)]
pub(crate) fn pair_for_tests(cfg: &Config) -> ((Tx, Rx), (Tx, Rx)) {
    let mut acc = Acceptor::bind(cfg).expect("bind shm acceptor");
    let name = acc.name().to_vec();
    let c2 = cfg.clone();
    let h = std::thread::spawn(move || connect(&name, &c2));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let a = loop {
        if let Some(l) = acc.accept().expect("accept") {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no shm connection accepted"
        );
        std::thread::sleep(std::time::Duration::from_micros(200));
    };
    let b = h.join().expect("connector thread").expect("shm connect");
    (b, a)
}
