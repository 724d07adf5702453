//! `Semaphore`: a Berkeley UPC-style counting (or boolean) semaphore in this process's
//! memory, posted locally or by peers (atomic adds and signalling puts on its word);
//! `SemaphoreAt`: the same at a word of a region the caller already maps.
//!
//! The word counts what was ever posted, and only ever rises: a post is an add (the
//! owner's, or a peer's atomic add or put-with-signal with `SignalOp::Add`). What the
//! owner's waits and tries took is counted apart, in the owner's memory, on a cache line of
//! its own (`SemTaken`); the semaphore holds the difference. So a wait only loads the
//! word: its cache line goes from the poster to the waiter once per post, where a take
//! that wrote the word moved it back as well, and the next post waited for it. A boolean
//! one saturates: it holds 1 whenever more was posted than taken, and a take takes all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::context::Context;
use super::memory::{Cmp, MemMapParams, Memory};
use super::worker::Worker;
use crate::base::{Error, Result, Status};

/// A Berkeley UPC-style semaphore living in this process's memory.
pub struct Semaphore {
    mem: Memory,
    flags: u32,
    taken: SemTaken,
}

/// What a semaphore's owner took from it, in the owner's memory, on a cache line of its
/// own (consumers of different semaphores do not contend): the other half of a
/// `SemaphoreAt`, which its owner keeps.
#[repr(align(64))]
#[derive(Debug, Default)]
pub struct SemTaken(AtomicU64);

impl SemTaken {
    /// Nothing taken.
    pub const fn new() -> SemTaken {
        SemTaken(AtomicU64::new(0))
    }
}

/// Semaphore flags (`bupc_sem_alloc`).
pub mod sem_flags {
    use crate::base::{Error, Result, Status};

    /// Value is 0 or 1.
    pub const BOOLEAN: u32 = 1;
    /// Value counts up to 65535.
    pub const INTEGER: u32 = 2;
    /// One producer.
    pub const SPRODUCER: u32 = 4;
    /// Many producers.
    pub const MPRODUCER: u32 = 8;
    /// One consumer.
    pub const SCONSUMER: u32 = 16;
    /// Many consumers.
    pub const MCONSUMER: u32 = 32;

    /// The flags in force for `flags` (0 = INTEGER | MPRODUCER | MCONSUMER), or
    /// `InvalidParam` when they are not a valid set: exactly one of BOOLEAN and INTEGER, at
    /// most one producer kind and at most one consumer kind, nothing else.
    pub fn check(flags: u32) -> Result<u32> {
        let flags = if flags == 0 {
            INTEGER | MPRODUCER | MCONSUMER
        } else {
            flags
        };
        if flags & !(BOOLEAN | INTEGER | SPRODUCER | MPRODUCER | SCONSUMER | MCONSUMER) != 0
            || (flags & BOOLEAN != 0) == (flags & INTEGER != 0)
            || flags & (SPRODUCER | MPRODUCER) == (SPRODUCER | MPRODUCER)
            || flags & (SCONSUMER | MCONSUMER) == (SCONSUMER | MCONSUMER)
        {
            return Err(Error::new(
                Status::InvalidParam,
                "semaphore flags: exactly one of BOOLEAN/INTEGER, at most one of each producer and consumer kind",
            ));
        }
        Ok(flags)
    }
}

/// The largest value a semaphore holds.
pub const SEM_MAX: u64 = 65535;

impl Semaphore {
    /// Allocate a semaphore at 0 (flags 0 = INTEGER | MPRODUCER | MCONSUMER).
    pub fn new(ctx: &Context, flags: u32) -> Result<Semaphore> {
        let flags = sem_flags::check(flags)?;
        let mem = ctx.mem_map(MemMapParams::allocate(64))?;
        Ok(Semaphore {
            mem,
            flags,
            taken: SemTaken::new(),
        })
    }

    /// The semaphore as a `SemaphoreAt` of its region (host memory holding its word: this
    /// cannot fail, but it is a `Result` rather than a panic).
    fn at(&self) -> Result<SemaphoreAt<'_>> {
        Ok(SemaphoreAt {
            mem: &self.mem,
            offset: 0,
            flags: self.flags,
            posted: self.mem.word(0)?,
            taken: &self.taken.0,
        })
    }

    /// Key and address for peers that post to it remotely: an atomic add of `n`, or a
    /// put-with-signal with `SignalOp::Add` (the word counts posts and only rises: any
    /// other operation on it, a `Set` or a swap, breaks the count). The owner cannot bound
    /// a peer's add, so a boolean semaphore saturates instead: any excess of posts over
    /// takes reads as 1, and a wait takes all of it.
    pub fn remote(&self) -> Result<(Vec<u8>, u64)> {
        Ok((self.mem.pack_rkey()?, self.mem.as_ptr() as u64))
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    pub fn value(&self) -> u64 {
        self.at().map_or(0, |s| s.value())
    }

    /// Add `n`; fails if that would pass the maximum.
    pub fn post(&self, n: u64) -> Result<()> {
        self.at()?.post(n)
    }

    /// Take `n` if available now. A boolean semaphore holds at most 1: taking 1 empties
    /// it (also when peers' adds took it past 1), and more than 1 is never there.
    pub fn try_wait(&self, n: u64) -> bool {
        self.at().is_ok_and(|s| s.try_wait(n))
    }

    /// Wait until at least `n` is there, then take it (progressing `worker`, spinning;
    /// `bupc_sem_wait`). See `wait_timeout`.
    pub fn wait(&self, worker: &Worker, n: u64) -> Result<()> {
        self.at()?.wait_timeout(worker, n, false, None)
    }

    /// `wait`, sleeping when asked and with a time limit: see `SemaphoreAt::wait_timeout`.
    pub fn wait_timeout(
        &self,
        worker: &Worker,
        n: u64,
        sleep: bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.at()?.wait_timeout(worker, n, sleep, timeout)
    }
}

/// A semaphore at an aligned word of a host region mapped here, for a library that keeps
/// many semaphores in a region whose key its peers already hold (an OpenSHMEM library's
/// symmetric heap, say) instead of one region each. It borrows the region and the owner's
/// count of takes (`SemTaken`, which the caller keeps with the word: both start at 0, and
/// `reset` starts both again); the word counts posts, and peers post to it as to a
/// `Semaphore` (see `Semaphore::remote`).
pub struct SemaphoreAt<'a> {
    mem: &'a Memory,
    offset: usize,
    flags: u32,
    posted: &'a AtomicU64,
    taken: &'a AtomicU64,
}

impl<'a> SemaphoreAt<'a> {
    /// The semaphore at `offset` of `mem` with `flags` (as `Semaphore::new`'s), whose
    /// owner's takes `taken` counts; word and count keep their values. `InvalidParam` for
    /// bad flags, `OutOfRange` for an offset that is not an aligned word inside the region,
    /// `Unsupported` for device memory.
    #[inline]
    pub fn new(
        mem: &'a Memory,
        offset: usize,
        flags: u32,
        taken: &'a SemTaken,
    ) -> Result<SemaphoreAt<'a>> {
        let flags = sem_flags::check(flags)?;
        let posted = mem.word(offset)?;
        Ok(SemaphoreAt {
            mem,
            offset,
            flags,
            posted,
            taken: &taken.0,
        })
    }

    /// Start again at 0, the word and the count of takes together (a slot of a region
    /// reused for a new semaphore). Only while no one posts or takes.
    pub fn reset(&self) {
        self.taken.store(0, Ordering::Release);
        self.posted.store(0, Ordering::Release);
    }

    #[inline]
    fn limit(&self) -> u64 {
        if self.boolean() { 1 } else { SEM_MAX }
    }

    #[inline]
    fn boolean(&self) -> bool {
        self.flags & sem_flags::BOOLEAN != 0
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    #[inline]
    pub fn value(&self) -> u64 {
        let v = self.raw_value();
        if self.boolean() { v.min(1) } else { v }
    }

    /// Posts less takes, unsaturated: for an integer semaphore, more than `SEM_MAX` means
    /// peers' adds took it past what it may hold.
    #[inline]
    pub fn raw_value(&self) -> u64 {
        let t = self.taken.load(Ordering::Acquire);
        self.posted.load(Ordering::Acquire).wrapping_sub(t)
    }

    /// Add `n`; fails if that would pass the maximum (a boolean one: if it is set).
    #[inline]
    pub fn post(&self, n: u64) -> Result<()> {
        let lim = self.limit();
        self.posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                // A take meanwhile only lowers the value: the check stays on the safe side.
                let v = p.wrapping_sub(self.taken.load(Ordering::Acquire));
                v.checked_add(n)
                    .filter(|x| *x <= lim)
                    .map(|_| p.wrapping_add(n))
            })
            .map(|_| ())
            .map_err(|p| {
                let v = p.wrapping_sub(self.taken.load(Ordering::Acquire));
                Error::msg(
                    Status::InvalidParam,
                    format!("semaphore at {v} cannot rise by {n} past {lim}"),
                )
            })
    }

    /// Take `n` if available now. A boolean semaphore holds at most 1: taking 1 empties
    /// it (also when peers' adds took it past 1), and more than 1 is never there. One load
    /// of the word; the take is a compare-exchange on the owner's count, so that several
    /// threads may take from one semaphore.
    #[inline]
    pub fn try_wait(&self, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        let boolean = self.boolean();
        let mut t = self.taken.load(Ordering::Acquire);
        loop {
            let p = self.posted.load(Ordering::Acquire);
            let v = p.wrapping_sub(t);
            let next = if boolean {
                if v == 0 || n > 1 {
                    return false;
                }
                p
            } else if v < n {
                return false;
            } else {
                t.wrapping_add(n)
            };
            match self
                .taken
                .compare_exchange(t, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => t = now,
            }
        }
    }

    /// Wait until at least `n` is there, then take it, progressing `worker`; sleeping when
    /// asked and with a time limit (`Timeout` when it passes; `None`: none). With `sleep`
    /// it waits as `Memory::signal_wait_until` does: a short spin, then sleeps on the
    /// worker's event fd, from which a peer's signalling put to this worker wakes it
    /// (framed, or written directly by a same-host peer). Waiting for more than a boolean
    /// semaphore can hold is refused.
    pub fn wait_timeout(
        &self,
        worker: &Worker,
        n: u64,
        sleep: bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        if n > self.limit() {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "a wait for {n} on a semaphore that holds at most {}",
                    self.limit()
                ),
            ));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if self.try_wait(n) {
                return Ok(());
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => Some(l),
                    None => {
                        return Err(Error::msg(
                            Status::Timeout,
                            format!(
                                "semaphore: {n} not available within {:?}",
                                timeout.unwrap_or_default()
                            ),
                        ));
                    }
                },
                None => None,
            };
            // Until the posts reach the takes and `n` more; another consumer may take it
            // first, and then this waits again.
            let want = self.taken.load(Ordering::Acquire).wrapping_add(n);
            match self.mem.signal_wait_until_timeout(
                Some(worker),
                self.offset,
                Cmp::Ge,
                want,
                sleep,
                left,
            ) {
                Ok(_) => {}
                Err(e) if e.status() == Status::Timeout => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::context::ContextParams;
    use std::sync::Arc;

    /// A boolean semaphore stays boolean when peers' adds take its word past 1: it reads
    /// as 1, one wait empties it, and a wait for 2 is never satisfied.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a Context (dlopen of the CUDA driver, epoll, memfd): system calls Miri does not model"
    )]
    fn boolean_semaphore_saturates_under_remote_adds() {
        let ctx = Context::new(ContextParams::default()).expect("context");
        let sem = Semaphore::new(&ctx, sem_flags::BOOLEAN).expect("semaphore");
        let w = sem.mem.word(0).expect("word");
        w.fetch_add(3, Ordering::AcqRel); // three peers' atomic adds of 1
        assert_eq!(sem.value(), 1);
        assert!(!sem.try_wait(2));
        assert!(sem.try_wait(1));
        assert_eq!(sem.value(), 0, "one wait takes all of it");
        assert_eq!(
            w.load(Ordering::Acquire),
            3,
            "the word counts posts; takes leave it"
        );
        assert!(!sem.try_wait(1));
        sem.post(1).expect("post");
        assert!(sem.post(1).is_err(), "a local post past 1 is refused");
        assert_eq!(w.load(Ordering::Acquire), 4);
        assert!(sem.try_wait(1));
        assert_eq!(sem.value(), 0);
        // An integer semaphore counts.
        let int = Semaphore::new(&ctx, sem_flags::INTEGER).expect("semaphore");
        int.mem
            .word(0)
            .expect("word")
            .fetch_add(3, Ordering::AcqRel);
        assert_eq!(int.value(), 3);
        assert!(int.try_wait(2));
        assert_eq!(int.value(), 1);
        // Integer posts past the maximum are the peers' doing: the value shows them, and
        // takes still count down from there.
        int.mem
            .word(0)
            .expect("word")
            .fetch_add(SEM_MAX, Ordering::AcqRel);
        assert_eq!(int.value(), SEM_MAX + 1);
        assert!(int.post(1).is_err(), "already past the maximum");
        assert!(int.try_wait(SEM_MAX));
        assert_eq!(int.value(), 1);
        int.post(1).expect("back under the maximum");
        assert_eq!(int.value(), 2);
    }

    /// A semaphore wait with a limit: refused beyond what it can hold, a timeout when
    /// nothing comes, the value taken when it is there; a sleeping wait as well.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a Context (dlopen of the CUDA driver, epoll, memfd): system calls Miri does not model"
    )]
    fn semaphore_waits_with_limits() {
        let ctx = Context::new(ContextParams::default()).expect("context");
        let w = Worker::new(&ctx, Default::default()).expect("worker");
        let boolean = Semaphore::new(&ctx, sem_flags::BOOLEAN).expect("semaphore");
        let e = boolean
            .wait(&w, 2)
            .expect_err("a boolean one never holds 2");
        assert_eq!(e.status(), Status::InvalidParam);
        let int = Semaphore::new(&ctx, 0).expect("semaphore");
        for sleep in [false, true] {
            let short = Some(Duration::from_millis(20));
            let e = int
                .wait_timeout(&w, 1, sleep, short)
                .expect_err("nothing posted");
            assert_eq!(e.status(), Status::Timeout, "{e}");
            int.post(3).expect("post");
            int.wait_timeout(&w, 2, sleep, short).expect("3 are there");
            assert_eq!(int.value(), 1);
            assert!(int.try_wait(1));
        }
        // Another thread posts while this one sleeps.
        let sem = Arc::new(int);
        let poster = {
            let s = sem.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                s.post(2)
            })
        };
        sem.wait_timeout(&w, 2, true, Some(Duration::from_secs(20)))
            .expect("posted by the other thread");
        poster.join().expect("poster").expect("post");
        assert_eq!(sem.value(), 0);
    }

    /// Many threads post and take at once: every post is taken exactly once (the takes'
    /// compare-exchange on the owner's count, the posts' on the word), and a boolean one
    /// never hands out more than was posted.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a Context (dlopen of the CUDA driver, epoll, memfd): system calls Miri does not model"
    )]
    fn concurrent_posts_and_takes_balance() {
        const EACH: u64 = 20_000;
        let ctx = Context::new(ContextParams::default()).expect("context");
        for flags in [sem_flags::INTEGER, sem_flags::BOOLEAN] {
            let sem = Arc::new(Semaphore::new(&ctx, flags).expect("semaphore"));
            let took = Arc::new(AtomicU64::new(0));
            let mut threads = Vec::new();
            for _ in 0..2 {
                let s = sem.clone();
                threads.push(std::thread::spawn(move || {
                    let mut posted = 0;
                    while posted < EACH {
                        // A full semaphore (a boolean one that is set) refuses: try again.
                        if s.post(1).is_ok() {
                            posted += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }));
            }
            for _ in 0..2 {
                let (s, t) = (sem.clone(), took.clone());
                threads.push(std::thread::spawn(move || {
                    while t.load(Ordering::Acquire) < 2 * EACH {
                        if s.try_wait(1) {
                            t.fetch_add(1, Ordering::AcqRel);
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }));
            }
            for t in threads {
                t.join().expect("thread");
            }
            assert_eq!(took.load(Ordering::Acquire), 2 * EACH, "flags {flags}");
            assert_eq!(sem.value(), 0, "flags {flags}");
            assert_eq!(
                sem.mem.word(0).expect("word").load(Ordering::Acquire),
                2 * EACH,
                "the word counts every post"
            );
        }
    }

    /// A semaphore at a word of a larger region: flags and offset checked, its value the
    /// word's, the neighbouring words untouched.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a Context (dlopen of the CUDA driver, epoll, memfd): system calls Miri does not model"
    )]
    fn semaphore_at_a_word_of_a_region() {
        let ctx = Context::new(ContextParams::default()).expect("context");
        let w = Worker::new(&ctx, Default::default()).expect("worker");
        let mem = ctx.mem_map(MemMapParams::allocate(4096)).expect("map");
        let (ti, tb) = (SemTaken::new(), SemTaken::new());
        let e = SemaphoreAt::new(&mem, 12, 0, &ti).err().expect("unaligned");
        assert_eq!(e.status(), Status::OutOfRange);
        let e = SemaphoreAt::new(&mem, 4096, 0, &ti)
            .err()
            .expect("past the end");
        assert_eq!(e.status(), Status::OutOfRange);
        let e = SemaphoreAt::new(&mem, 64, sem_flags::BOOLEAN | sem_flags::INTEGER, &ti)
            .err()
            .expect("both kinds");
        assert_eq!(e.status(), Status::InvalidParam);
        let int = SemaphoreAt::new(&mem, 64, 0, &ti).expect("integer");
        let boolean = SemaphoreAt::new(&mem, 128, sem_flags::BOOLEAN, &tb).expect("boolean");
        int.post(5).expect("post");
        assert!(int.post(SEM_MAX).is_err(), "past the maximum");
        assert_eq!(int.value(), 5);
        assert_eq!(mem.signal_fetch(64).expect("word"), 5);
        assert_eq!(mem.signal_fetch(56).expect("word"), 0);
        assert_eq!(mem.signal_fetch(72).expect("word"), 0);
        int.wait_timeout(&w, 4, true, Some(Duration::from_secs(20)))
            .expect("4 of 5");
        assert!(!int.try_wait(2));
        assert!(int.try_wait(1));
        assert_eq!(int.value(), 0);
        assert_eq!(
            mem.signal_fetch(64).expect("word"),
            5,
            "takes leave the word"
        );
        // A second wait needs posts past what was taken: a timeout, then a post.
        let e = int
            .wait_timeout(&w, 1, false, Some(Duration::from_millis(20)))
            .expect_err("all taken");
        assert_eq!(e.status(), Status::Timeout);
        mem.word(64).expect("word").fetch_add(1, Ordering::AcqRel);
        int.wait_timeout(&w, 1, true, Some(Duration::from_secs(20)))
            .expect("a peer's post");
        mem.word(128).expect("word").fetch_add(2, Ordering::AcqRel);
        assert_eq!((boolean.value(), boolean.raw_value()), (1, 2));
        assert!(boolean.try_wait(1));
        assert_eq!(boolean.raw_value(), 0);
        // A reset starts both again: nothing there, and the next post counts.
        boolean.reset();
        assert_eq!(
            (boolean.raw_value(), mem.signal_fetch(128).expect("word")),
            (0, 0)
        );
        boolean.post(1).expect("post");
        assert!(boolean.try_wait(1));
    }
}
