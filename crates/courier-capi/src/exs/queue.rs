//! Event queues: a bounded ring of completed operations. Every operation reserves its slot
//! when it starts, so a completion is never dropped: `exs_send` and friends fail with
//! `EAGAIN` when the queue has no free slot. A queue's descriptor (an eventfd, made on
//! first request) is readable exactly while events are waiting, for poll/epoll.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::abi::*;
use super::{XResult, fail};

/// Largest depth of one queue.
pub(crate) const DEPTH_MAX: usize = 1 << 20;
/// Most queues at once.
pub(crate) const QUEUES_MAX: usize = 4096;

struct Inner {
    depth: usize,
    events: VecDeque<exs_event_t>,
    /// Slots held by operations in flight.
    reserved: usize,
    /// Threads sleeping in `exs_qdequeue`.
    waiters: usize,
    /// The eventfd, once asked for; `set` while it holds a count (readable).
    efd: Option<OwnedFd>,
    set: bool,
}

pub(crate) struct Queue {
    pub id: exs_qhandle_t,
    inner: Mutex<Inner>,
    cv: Condvar,
    /// `EXS_WAIT_*`.
    pub wait: AtomicI64,
    /// A signal number raised at each event (0: none).
    pub signal: AtomicI32,
}

impl Queue {
    pub fn new(id: exs_qhandle_t, depth: usize) -> Queue {
        Queue {
            id,
            inner: Mutex::new(Inner {
                depth,
                events: VecDeque::with_capacity(depth.min(1024)),
                reserved: 0,
                waiters: 0,
                efd: None,
                set: false,
            }),
            cv: Condvar::new(),
            wait: AtomicI64::new(EXS_WAIT_DEFAULT),
            signal: AtomicI32::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold a slot for an operation that starts now; `EAGAIN` if none is free.
    pub fn reserve(&self) -> XResult<()> {
        let mut g = self.lock();
        if g.events.len() + g.reserved >= g.depth {
            return Err(fail(
                libc::EAGAIN,
                format!(
                    "event queue {} is full: {} events waiting and {} operations in flight, depth {}",
                    self.id,
                    g.events.len(),
                    g.reserved,
                    g.depth
                ),
            ));
        }
        g.reserved += 1;
        Ok(())
    }

    /// Give back a slot held by an operation that did not start after all.
    pub fn unreserve(&self) {
        let mut g = self.lock();
        g.reserved = g.reserved.saturating_sub(1);
    }

    /// Queue the event of an operation that held a slot.
    pub fn push(&self, ev: exs_event_t) {
        let (sig, wake) = {
            let mut g = self.lock();
            g.reserved = g.reserved.saturating_sub(1);
            g.events.push_back(ev);
            if !g.set
                && let Some(fd) = g.efd.as_ref()
            {
                efd_write(fd.as_raw_fd());
                g.set = true;
            }
            (self.signal.load(Ordering::Relaxed), g.waiters > 0)
        };
        // Woken after the lock is let go, so that the sleeper does not wake only to wait
        // for it. (A sleeper counted in `waiters` waits on the condition variable, which it
        // entered under the lock: it cannot miss this.)
        if wake {
            self.cv.notify_all();
        }
        if sig > 0 {
            // SAFETY: plain system calls with plain numbers.
            unsafe {
                libc::kill(libc::getpid(), sig);
            }
        }
    }

    /// Move up to `out.len()` events into `out`; how many.
    pub fn take(&self, out: &mut [exs_event_t]) -> usize {
        let mut g = self.lock();
        Self::take_locked(&mut g, out)
    }

    fn take_locked(g: &mut Inner, out: &mut [exs_event_t]) -> usize {
        let n = out.len().min(g.events.len());
        for (slot, ev) in out.iter_mut().zip(g.events.drain(..n)) {
            *slot = ev;
        }
        if g.events.is_empty() && g.set {
            if let Some(fd) = g.efd.as_ref() {
                efd_drain(fd.as_raw_fd());
            }
            g.set = false;
        }
        n
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    pub fn depth(&self) -> usize {
        self.lock().depth
    }

    pub fn reserved(&self) -> usize {
        self.lock().reserved
    }

    /// Change the depth; not below what is waiting and reserved.
    pub fn set_depth(&self, depth: usize) -> XResult<()> {
        let mut g = self.lock();
        if depth < g.events.len() + g.reserved {
            return Err(fail(
                libc::EBUSY,
                format!(
                    "depth {depth} is less than the {} events waiting and {} operations in flight",
                    g.events.len(),
                    g.reserved
                ),
            ));
        }
        g.depth = depth;
        Ok(())
    }

    /// The pollable descriptor (made now if it was not).
    pub fn fd(&self) -> XResult<RawFd> {
        let mut g = self.lock();
        if let Some(fd) = g.efd.as_ref() {
            return Ok(fd.as_raw_fd());
        }
        // SAFETY: a plain system call; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(fail(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("eventfd for queue {}: {e}", self.id),
            ));
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if !g.events.is_empty() {
            efd_write(raw);
            g.set = true;
        }
        g.efd = Some(fd);
        Ok(raw)
    }

    /// Wait on the queue (not progressing) until `want` events are there, `deadline` passes,
    /// or `tick` passes (the caller looks at other things then). Returns whether `want` are
    /// there.
    pub fn sleep_until(&self, want: usize, until: Option<Instant>) -> bool {
        let mut g = self.lock();
        if g.events.len() >= want {
            return true;
        }
        g.waiters += 1;
        let g2 = match until {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                self.cv
                    .wait_timeout(g, left)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0)
            }
            None => self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
        };
        let mut g = g2;
        g.waiters -= 1;
        g.events.len() >= want
    }

    /// Wake every thread sleeping on the queue (the queue is being deleted).
    pub fn wake_all(&self) {
        let _g = self.lock();
        self.cv.notify_all();
    }
}

fn efd_write(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to our eventfd.
    unsafe {
        libc::write(fd, &one as *const u64 as *const libc::c_void, 8);
    }
}

fn efd_drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a local from our non-blocking eventfd.
    unsafe {
        libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8);
    }
}
