//! Progress for links whose data arrives only through their fd (`Caps::data_via_fd`).
//!
//! Such links coalesce small sends in user space, so progress flushes them first (before
//! it looks for answers to them) and `arm` flushes them before the worker may sleep. When
//! the worker watches only a few of them, progress reads each socket directly instead of
//! asking epoll which one is readable: one system call per poll instead of two or three
//! per arriving message (epoll, recv, and the recv that finds the socket empty).
//!
//! While it reads them directly, their fds stay out of the worker's epoll set. A socket
//! in an epoll set has a waiter, so every segment delivered to it also runs the epoll
//! callback (wait-queue lock, ready list) on the sending CPU: on loopback that is about
//! 0.1 us per message (a plain C ping-pong whose sockets sit in an epoll set takes 0.2 us
//! longer per round trip of 5.6 us).
//! `arm` puts them in (the worker may sleep on the set, or the application on its fd),
//! and they leave again once the worker has progressed [`UNWATCH_AFTER`] times without
//! arming. With more than [`DIRECT_POLL_LINKS`] links progress reads through epoll, so
//! they stay in. Either way a failure or close is seen: a direct read reports it as
//! epoll would.

use std::os::fd::OwnedFd;

use rustix::event::epoll;

use super::State;
use crate::base::{Error, Result};

/// Epoll token kinds.
pub(crate) mod token {
    /// One of the worker's acceptors (`transport::dial::Acceptors`), by index.
    pub const ACCEPT: u64 = 1;
    pub const LISTENER: u64 = 3;
    pub const EP: u64 = 4;
    pub const PENDING: u64 = 5;
    pub const EVENT: u64 = 6;
    /// A link setup's fd (`State::setups`): it may move on.
    pub const SETUP: u64 = 7;
    pub fn make(kind: u64, idx: u32) -> u64 {
        (kind << 56) | idx as u64
    }
    pub fn split(t: u64) -> (u64, u32) {
        (t >> 56, t as u32)
    }
}

/// Add endpoint `e`'s link fd to the worker's epoll set (already there: fine).
pub(crate) fn watch(
    epfd: &OwnedFd,
    fd: std::os::fd::BorrowedFd<'_>,
    e: u32,
) -> std::result::Result<(), rustix::io::Errno> {
    match epoll::add(
        epfd,
        fd,
        epoll::EventData::new_u64(token::make(token::EP, e)),
        epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
    ) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Change what endpoint `e`'s watched link fd wakes the worker for: arrivals, and room to
/// write too when `out`. A fd not in the set (read directly now) is left out.
fn watch_as(
    epfd: &OwnedFd,
    fd: std::os::fd::BorrowedFd<'_>,
    e: u32,
    out: bool,
) -> std::result::Result<(), rustix::io::Errno> {
    let mut flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
    if out {
        flags |= epoll::EventFlags::OUT;
    }
    let data = epoll::EventData::new_u64(token::make(token::EP, e));
    match epoll::modify(epfd, fd, data, flags) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Whether `ep`'s link holds bytes its socket would not take at the last flush.
pub(crate) fn write_blocked(ep: &super::endpoint::EpSlot) -> bool {
    ep.caps.as_ref().is_some_and(|c| c.data_via_fd)
        && ep.tx.as_ref().is_some_and(|tx| tx.queued() > 0)
}

/// Up to this many fd links, progress reads their sockets directly; epoll still runs
/// every [`DIRECT_EPOLL_EVERY`] calls for listeners, new connections and the event fd.
pub(crate) const DIRECT_POLL_LINKS: usize = 4;
/// How often (in progress calls, a power of two) direct polling still runs epoll.
pub(crate) const DIRECT_EPOLL_EVERY: u64 = 64;
/// Progress calls after the last `arm` before directly read links leave the epoll set
/// (a worker that sleeps now and then keeps them in, instead of adding and removing them
/// around every sleep).
pub(crate) const UNWATCH_AFTER: u64 = 4096;

impl State {
    /// The active endpoint at `i` if its link is an fd link.
    fn fd_link_at(&mut self, i: usize) -> Option<u32> {
        let e = *self.progress.active.get(i)?;
        let ep = self.ep(e)?;
        ep.caps.as_ref().filter(|c| c.data_via_fd).map(|_| e)
    }

    /// Write out what fd links have queued: (`false` if some link still holds bytes the
    /// kernel would not take now, sends that completed because their last bytes left).
    pub(crate) fn flush_fd_links(&mut self) -> (bool, usize) {
        let mut all = true;
        let mut completed = 0;
        let mut i = 0;
        while i < self.progress.active.len() {
            if let Some(e) = self.fd_link_at(i) {
                if let Some(tx) = self.ep(e).and_then(|ep| ep.tx.as_mut()) {
                    match tx.flush() {
                        Ok(done) => {
                            all &= done;
                            completed += self.reap_written(e);
                        }
                        Err(err) => {
                            self.fail_ep(e, err);
                            continue; // the endpoint left `active`
                        }
                    }
                }
            }
            i += 1;
        }
        (all, completed)
    }

    /// Read every fd link's socket without waiting for epoll.
    pub(crate) fn read_fd_links(&mut self) {
        let mut i = 0;
        while i < self.progress.active.len() {
            if let Some(e) = self.fd_link_at(i) {
                let r = self
                    .ep(e)
                    .and_then(|ep| ep.rx.as_mut())
                    .map(|rx| rx.poll_read());
                if let Some(Err(err)) = r {
                    let before = self.progress.active.len();
                    self.drain_then_fail(e, err);
                    if self.progress.active.len() < before {
                        continue;
                    }
                }
            }
            i += 1;
        }
    }

    /// Prepare fd links for sleeping: everything queued must have left, and no send may
    /// have just completed (its callback runs in progress, which must come first). Their
    /// fds join the epoll set, so that it wakes the worker.
    ///
    /// A link whose socket would not take all its bytes (a peer that does not read) does
    /// not keep the worker awake: its fd is watched for room to write too, until its
    /// queue is empty again.
    pub(crate) fn arm_fd_links(&mut self) -> Result<bool> {
        self.progress.armed_at = self.progress.calls;
        if self.progress.fd_links == 0 {
            return Ok(true);
        }
        if !self.progress.fd_watched {
            self.watch_fd_links()?;
        }
        if self.flush_fd_links().1 > 0 {
            return Ok(false);
        }
        self.watch_blocked_writes()?;
        Ok(true)
    }

    /// Watch the fd of every fd link that holds unwritten bytes for room to write, and
    /// stop watching it once it holds none.
    fn watch_blocked_writes(&mut self) -> Result<()> {
        for i in 0..self.progress.active.len() {
            let Some(e) = self.fd_link_at(i) else {
                continue;
            };
            let Some(ep) = self.ep(e) else { continue };
            let blocked = write_blocked(ep);
            if blocked != ep.out_watched {
                ep.out_watched = blocked;
                if let Some(fd) = self.link_fd(e) {
                    watch_as(&self.progress.epoll, fd, e, blocked)
                        .map_err(|err| Error::io("epoll modify", err))?;
                }
            }
        }
        Ok(())
    }

    /// Endpoint `e`'s socket has room (it was watched for it while its link held bytes):
    /// write them. Once none are left, room no longer wakes the worker. Returns 1 if bytes
    /// left.
    pub(crate) fn on_writable(&mut self, e: u32) -> usize {
        let Some(tx) = self.ep(e).and_then(|ep| ep.tx.as_mut()) else {
            return 0;
        };
        let before = tx.queued();
        let r = tx.flush();
        let after = tx.queued();
        match r {
            Err(err) => {
                self.fail_ep(e, err);
                return 1;
            }
            Ok(true) => {
                if let Some(ep) = self.ep(e).filter(|ep| ep.out_watched) {
                    ep.out_watched = false;
                    if let Some(fd) = self.link_fd(e) {
                        // Failing that, the next `arm` sets OUT again and clears it later.
                        let _ = watch_as(&self.progress.epoll, fd, e, false);
                    }
                }
            }
            Ok(false) => {}
        }
        usize::from(after < before) + self.reap_written(e)
    }

    /// The fd of endpoint `e`'s link.
    fn link_fd(&self, e: u32) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.eps
            .slots
            .get(e as usize)
            .filter(|ep| ep.live)
            .and_then(|ep| ep.rx.as_ref())
            .and_then(|rx| rx.fd())
    }

    /// Put every fd link's fd in the epoll set.
    pub(crate) fn watch_fd_links(&mut self) -> Result<()> {
        for i in 0..self.progress.active.len() {
            let Some(e) = self.fd_link_at(i) else {
                continue;
            };
            if let Some(fd) = self.link_fd(e) {
                watch(&self.progress.epoll, fd, e).map_err(|err| Error::io("epoll add", err))?;
            }
        }
        self.progress.fd_watched = true;
        Ok(())
    }

    /// Take every fd link's fd out of the epoll set: progress reads them directly.
    pub(crate) fn unwatch_fd_links(&mut self) {
        for i in 0..self.progress.active.len() {
            let Some(e) = self.fd_link_at(i) else {
                continue;
            };
            if let Some(ep) = self.ep(e) {
                ep.out_watched = false;
            }
            if let Some(fd) = self.link_fd(e) {
                let _ = rustix::event::epoll::delete(&self.progress.epoll, fd);
            }
        }
        self.progress.fd_watched = false;
    }

    /// On direct polling's epoll turn: whether fd links are watched although the worker
    /// has not armed for a while.
    #[inline]
    pub(crate) fn watched_idle(&self) -> bool {
        self.progress.fd_watched
            && self.progress.calls.wrapping_sub(self.progress.armed_at) >= UNWATCH_AFTER
    }
}
