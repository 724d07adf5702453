//! The worker's state cell: a mutex in multi-thread mode, a thread-confined cell in
//! single-thread mode.
//!
//! Single-thread mode costs no atomic operation: the worker remembers the thread that
//! created it and every entry checks it; a call from another thread is refused with an
//! error instead of racing. That check is what makes sharing the cell sound.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::thread::futex;

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
    mutex: FutexLock,
    cell: UnsafeCell<T>,
}

/// The multi-thread mode's lock: a word and the kernel's futex, so that a guard is one
/// pointer (a `MutexGuard` beside it made the guard three words, moved through memory
/// at every hand-over on the small-message paths).
struct FutexLock {
    /// 0: free; 1: held; 2: held, and a thread may be sleeping on it.
    state: AtomicU32,
}

impl FutexLock {
    /// Spins on a held lock before sleeping (critical sections here are short).
    const SPINS: u32 = 100;

    const fn new() -> FutexLock {
        FutexLock {
            state: AtomicU32::new(0),
        }
    }

    #[inline]
    fn lock(&self) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        for _ in 0..Self::SPINS {
            if self.state.load(Ordering::Relaxed) == 0
                && self
                    .state
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            std::hint::spin_loop();
        }
        // From here on the lock is taken as "held with sleepers": whoever takes it this
        // way cannot know whether others still sleep, so its unlock wakes one.
        while self.state.swap(2, Ordering::Acquire) != 0 {
            // EAGAIN (the word changed) and EINTR both mean: look again.
            let _ = futex::wait(&self.state, futex::Flags::PRIVATE, 2, None);
        }
    }

    #[inline]
    fn unlock(&self) {
        if self.state.swap(0, Ordering::Release) == 2 {
            let _ = futex::wake(&self.state, futex::Flags::PRIVATE, 1);
        }
    }
}

// SAFETY: in multi mode every access goes through `mutex`; in single mode `lock` refuses
// every thread but `owner`, so the cell and `held` are only ever touched by one thread.
unsafe impl<T: Send> Sync for StateCell<T> {}
// SAFETY: as above; moving the cell moves T.
unsafe impl<T: Send> Send for StateCell<T> {}

/// The cell, held: one pointer, so it passes in a register. Not `Send`: a single-thread
/// worker's `held` flag is the owner thread's alone.
pub(crate) struct Guard<'a, T> {
    cell: &'a StateCell<T>,
    _not_send: PhantomData<*const ()>,
}

impl<T> StateCell<T> {
    pub(crate) fn new(mode: ThreadMode, value: T) -> StateCell<T> {
        StateCell {
            multi: mode == ThreadMode::Multi,
            owner: thread_token(),
            held: Cell::new(false),
            mutex: FutexLock::new(),
            cell: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> Result<Guard<'_, T>> {
        if self.multi {
            self.mutex.lock();
            return Ok(Guard::new(self));
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
        Ok(Guard::new(self))
    }
}

impl<'a, T> Guard<'a, T> {
    #[inline(always)]
    fn new(cell: &'a StateCell<T>) -> Guard<'a, T> {
        Guard {
            cell,
            _not_send: PhantomData,
        }
    }

    /// Release the cell, run `f` (which may lock it again itself), and take it back. In
    /// single-thread mode the thread is the owner (it held the guard), so taking it back
    /// skips the check that `lock` makes of a caller.
    #[inline]
    pub(crate) fn unlocked<R>(self, f: impl FnOnce() -> R) -> (Guard<'a, T>, R) {
        let cell = self.cell;
        drop(self);
        let r = f();
        if cell.multi {
            cell.mutex.lock();
            return (Guard::new(cell), r);
        }
        if cell.held.replace(true) {
            // Only a crate-internal guard forgotten inside `f` leaves the cell held; two
            // guards would alias the state. A bug in Courier itself: stop.
            std::process::abort();
        }
        (Guard::new(cell), r)
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
        if self.cell.multi {
            self.cell.mutex.unlock();
        } else {
            self.cell.held.set(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// Threads that each add to a plain counter under the lock lose no increment, and
    /// nobody is ever inside with another (a flag set on entry and cleared on exit).
    /// Short sections keep them spinning; a sleep inside some makes them wait in the
    /// kernel, so both ways of waiting are exercised.
    #[test]
    fn multi_mode_excludes_and_loses_nothing() {
        struct Shared {
            cell: StateCell<u64>,
            inside: AtomicBool,
        }
        let s = Arc::new(Shared {
            cell: StateCell::new(ThreadMode::Multi, 0),
            inside: AtomicBool::new(false),
        });
        let threads = 4;
        let rounds = 20_000;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..rounds {
                        let mut g = s.cell.lock().expect("multi mode never refuses");
                        assert!(!s.inside.swap(true, Ordering::SeqCst), "two holders");
                        *g += 1;
                        if (i + t) % 4_096 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        s.inside.store(false, Ordering::SeqCst);
                        drop(g);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("a locking thread panicked");
        }
        let g = s.cell.lock().expect("lock");
        assert_eq!(*g, (threads * rounds) as u64);
        assert_eq!(
            s.cell.mutex.state.load(Ordering::SeqCst),
            1,
            "held, no sleepers"
        );
        drop(g);
        assert_eq!(
            s.cell.mutex.state.load(Ordering::SeqCst),
            0,
            "free after the guard"
        );
    }

    /// `unlocked` lets another thread in while `f` runs, and takes the lock back after.
    #[test]
    fn unlocked_releases_for_other_threads() {
        let cell = Arc::new(StateCell::new(ThreadMode::Multi, 0u32));
        let g = cell.lock().expect("lock");
        let other = cell.clone();
        let (mut g, ()) = g.unlocked(|| {
            std::thread::spawn(move || *other.lock().expect("lock") += 5)
                .join()
                .expect("the other thread panicked");
        });
        *g += 1;
        assert_eq!(*g, 6);
        assert_eq!(cell.mutex.state.load(Ordering::SeqCst), 1);
    }

    /// Single mode: another thread and re-entry are refused with an error that says so.
    #[test]
    fn single_mode_refuses_other_threads_and_reentry() {
        let cell = Arc::new(StateCell::new(ThreadMode::Single, 0u32));
        let g = cell.lock().expect("owner locks");
        let e = cell.lock().err().expect("re-entry refused");
        assert!(e.to_string().contains("re-entered"), "{e}");
        drop(g);
        let other = cell.clone();
        let e = std::thread::spawn(move || other.lock().err().map(|e| e.to_string()))
            .join()
            .expect("thread")
            .expect("another thread refused");
        assert!(e.contains("other than the one that created it"), "{e}");
        assert!(
            cell.lock().is_ok(),
            "the owner locks again after the guard is gone"
        );
    }
}
