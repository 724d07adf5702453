//! Progress for links whose data arrives only through their fd (`Caps::data_via_fd`).
//!
//! Such links coalesce small sends in user space, so progress flushes them first (before
//! it looks for answers to them) and `arm` flushes them before the worker may sleep. When
//! the worker watches only a few of them, progress reads each socket directly instead of
//! asking epoll which one is readable: one system call per poll instead of two or three
//! per arriving message (epoll, recv, and the recv that finds the socket empty).

use super::core::State;
use crate::base::Result;

/// Up to this many fd links, progress reads their sockets directly; epoll still runs
/// every [`DIRECT_EPOLL_EVERY`] calls for listeners, new connections and the event fd.
pub(crate) const DIRECT_POLL_LINKS: usize = 4;
/// How often (in progress calls, a power of two) direct polling still runs epoll.
pub(crate) const DIRECT_EPOLL_EVERY: u64 = 64;

impl State {
    /// The active endpoint at `i` if its link is an fd link.
    fn fd_link_at(&mut self, i: usize) -> Option<u32> {
        let e = *self.active.get(i)?;
        let ep = self.ep(e)?;
        ep.caps.as_ref().filter(|c| c.data_via_fd).map(|_| e)
    }

    /// Write out what fd links have queued: (`false` if some link still holds bytes the
    /// kernel would not take now, sends that completed because their last bytes left).
    pub(crate) fn flush_fd_links(&mut self) -> (bool, usize) {
        let mut all = true;
        let mut completed = 0;
        let mut i = 0;
        while i < self.active.len() {
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
        while i < self.active.len() {
            if let Some(e) = self.fd_link_at(i) {
                let r = self
                    .ep(e)
                    .and_then(|ep| ep.rx.as_mut())
                    .map(|rx| rx.poll_read());
                if let Some(Err(err)) = r {
                    let before = self.active.len();
                    self.drain_then_fail(e, err);
                    if self.active.len() < before {
                        continue;
                    }
                }
            }
            i += 1;
        }
    }

    /// Prepare fd links for sleeping: everything queued must have left, and no send may
    /// have just completed (its callback runs in progress, which must come first).
    pub(crate) fn arm_fd_links(&mut self) -> Result<bool> {
        Ok(self.fd_links == 0 || self.flush_fd_links() == (true, 0))
    }
}
