//! The worker's state cell: a mutex in multi-thread mode, a thread-confined cell in
//! single-thread mode.
//!
//! Single-thread mode costs no atomic operation: the worker remembers the thread that
//! created it and every entry checks it; a call from another thread is refused with an
//! error instead of racing. That check is what makes sharing the cell sound.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use crate::base::sys::thread_token;
use crate::base::{Error, Result, Status};

/// Thread mode of a worker.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ThreadMode {
    /// Used only by the thread that created it; no locking.
    #[default]
    Single,
    /// Usable from many threads at once.
    Multi,
}

pub(crate) struct StateCell<T> {
    multi: bool,
    owner: usize,
    held: Cell<bool>,
    mutex: Mutex<()>,
    cell: UnsafeCell<T>,
}

// SAFETY: in multi mode every access goes through `mutex`; in single mode `lock` refuses
// every thread but `owner`, so the cell and `held` are only ever touched by one thread.
unsafe impl<T: Send> Sync for StateCell<T> {}
// SAFETY: as above; moving the cell moves T.
unsafe impl<T: Send> Send for StateCell<T> {}

pub(crate) struct Guard<'a, T> {
    cell: &'a StateCell<T>,
    _m: Option<MutexGuard<'a, ()>>,
}

impl<T> StateCell<T> {
    pub(crate) fn new(mode: ThreadMode, value: T) -> StateCell<T> {
        StateCell {
            multi: mode == ThreadMode::Multi,
            owner: thread_token(),
            held: Cell::new(false),
            mutex: Mutex::new(()),
            cell: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> Result<Guard<'_, T>> {
        if self.multi {
            let g = self.mutex.lock().unwrap_or_else(|p| p.into_inner());
            return Ok(Guard {
                cell: self,
                _m: Some(g),
            });
        }
        if thread_token() != self.owner {
            return Err(Error::new(
                Status::InvalidParam,
                "a single-thread worker was used from a thread other than the one that created it; create it with ThreadMode::Multi",
            ));
        }
        if self.held.replace(true) {
            return Err(Error::new(
                Status::InvalidParam,
                "worker re-entered while it is busy",
            ));
        }
        Ok(Guard {
            cell: self,
            _m: None,
        })
    }
}

impl<'a, T> Guard<'a, T> {
    /// Release the cell, run `f` (which may lock it again itself), and take it back. In
    /// single-thread mode the thread is the owner (it held the guard), so taking it back
    /// skips the check that `lock` makes of a caller. (A mutex's poison is recovered.)
    #[inline]
    pub(crate) fn unlocked<R>(self, f: impl FnOnce() -> R) -> (Guard<'a, T>, R) {
        let cell = self.cell;
        drop(self);
        let r = f();
        if cell.multi {
            let g = cell.mutex.lock().unwrap_or_else(|p| p.into_inner());
            return (Guard { cell, _m: Some(g) }, r);
        }
        if cell.held.replace(true) {
            // Only a crate-internal guard forgotten inside `f` leaves the cell held; two
            // guards would alias the state. A bug in Courier itself: stop.
            std::process::abort();
        }
        (Guard { cell, _m: None }, r)
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access (mutex held, or owner thread with `held`).
        unsafe { &*self.cell.cell.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`.
        unsafe { &mut *self.cell.cell.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if !self.cell.multi {
            self.cell.held.set(false);
        }
    }
}
