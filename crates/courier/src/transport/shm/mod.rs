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
#[cfg(any(test, feature = "fuzzing"))]
pub use fifo::fuzz_consumer;
pub(crate) mod memory;
mod segment;
mod setup;
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
#[cfg(test)]
pub use setup::connect;
#[cfg(test)]
use setup::unix_socket;
pub use setup::{Acceptor, Connecting, cma_status, connect_start, probe};

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
            process: None,
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
    /// The peer process, held by a pidfd once the link belongs to an endpoint: its exit
    /// is seen by polling it, even where another process holds the link's socket open.
    process: Option<memory::PeerProcess>,
}

// SAFETY: Tx owns its producer position exclusively (one producer per FIFO); the raw pointers
// in it point into the mapping kept alive by the Arc<Link>, and the shared state they reach
// is accessed through atomics only. Moving Tx to another thread changes none of that.
unsafe impl Send for Tx {}
// SAFETY: as for Tx, with the consumer position owned exclusively by Rx.
unsafe impl Send for Rx {}

impl Tx {
    /// How far the peer has read our FIFO (its word: a liveness hint only).
    pub fn drained(&self) -> u64 {
        self.prod.peer_tail()
    }

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

    /// The FIFO refused a frame: ask the peer to wake us when it frees cells (see
    /// `fifo::Producer::want_room`).
    pub(crate) fn want_room(&mut self) -> bool {
        self.prod.want_room()
    }

    pub(crate) fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Whether this link reads the peer's memory directly (CMA, `process_vm_readv`).
    #[cfg(test)]
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
    /// Cells of the peer's FIFO read so far.
    pub fn received(&self) -> u64 {
        self.cons.consumed()
    }

    /// The link belongs to an endpoint: hold the peer process by its pidfd.
    pub(crate) fn established(&mut self) {
        if self.process.is_none() {
            self.process = memory::PeerProcess::open(self.link.peer_pid).ok();
        }
    }

    /// Whether the peer process has exited (its pidfd polled; `false` without one).
    pub(crate) fn peer_exited(&self) -> bool {
        self.process.as_ref().is_some_and(|p| p.exited())
    }

    /// Whether a frame is waiting (one load; no validation, `peek` does that).
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        self.cons.ready()
    }

    #[inline]
    pub(crate) fn peek(&mut self) -> Result<Option<RawFrame>> {
        let r = self.cons.peek();
        if self.cons.take_wake_producer() {
            self.wake_producer();
        }
        r
    }

    #[inline]
    pub(crate) fn consume(&mut self) {
        self.cons.consume();
        if self.cons.take_wake_producer() {
            self.wake_producer();
        }
    }

    /// The peer sleeps until we free cells of its FIFO, which we just did.
    #[cold]
    fn wake_producer(&self) {
        // A failed send means the peer is gone: reading the socket reports that.
        let _ = self.link.wake();
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
