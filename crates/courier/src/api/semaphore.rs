//! `Semaphore`: a Berkeley UPC-style counting (or boolean) semaphore in this process's
//! memory, posted locally or by peers (atomic adds and signalling puts on its word);
//! `SemaphoreAt`: the same at a word of a region the caller already maps.

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
        Ok(Semaphore { mem, flags })
    }

    fn at(&self) -> SemaphoreAt<'_> {
        SemaphoreAt {
            mem: &self.mem,
            offset: 0,
            flags: self.flags,
        }
    }

    /// Key and address for peers that post to it remotely (atomic add or put-with-signal
    /// with `SignalOp::Add`; a boolean one also with `Set` 1 or a posted `Or` 1). The owner
    /// cannot bound a peer's add, so a boolean semaphore saturates instead: any value
    /// above 0 reads as 1, and a wait takes all of it.
    pub fn remote(&self) -> Result<(Vec<u8>, u64)> {
        Ok((self.mem.pack_rkey()?, self.mem.as_ptr() as u64))
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    pub fn value(&self) -> u64 {
        self.at().value()
    }

    /// Add `n`; fails if that would pass the maximum.
    pub fn post(&self, n: u64) -> Result<()> {
        self.at().post(n)
    }

    /// Take `n` if available now. A boolean semaphore holds at most 1: taking 1 empties
    /// it (also when peers' adds took the word past 1), and more than 1 is never there.
    pub fn try_wait(&self, n: u64) -> bool {
        self.at().try_wait(n)
    }

    /// Wait until at least `n` is there, then take it (progressing `worker`, spinning;
    /// `bupc_sem_wait`). See `wait_timeout`.
    pub fn wait(&self, worker: &Worker, n: u64) -> Result<()> {
        self.at().wait_timeout(worker, n, false, None)
    }

    /// `wait`, sleeping when asked and with a time limit: see `SemaphoreAt::wait_timeout`.
    pub fn wait_timeout(
        &self,
        worker: &Worker,
        n: u64,
        sleep: bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.at().wait_timeout(worker, n, sleep, timeout)
    }
}

/// A semaphore at an aligned word of a host region mapped here, for a library that keeps
/// many semaphores in a region whose key its peers already hold (an OpenSHMEM library's
/// symmetric heap, say) instead of one region each. It borrows the region; the word's
/// value is the semaphore's, and peers post to it as to a `Semaphore` (see
/// `Semaphore::remote`: an add, or a put-with-signal with `SignalOp::Add`).
pub struct SemaphoreAt<'a> {
    mem: &'a Memory,
    offset: usize,
    flags: u32,
}

impl<'a> SemaphoreAt<'a> {
    /// The semaphore at `offset` of `mem` with `flags` (as `Semaphore::new`'s); the word
    /// keeps its value. `InvalidParam` for bad flags, `OutOfRange` for an offset that is not
    /// an aligned word inside the region, `Unsupported` for device memory.
    pub fn new(mem: &'a Memory, offset: usize, flags: u32) -> Result<SemaphoreAt<'a>> {
        let flags = sem_flags::check(flags)?;
        mem.word(offset)?;
        Ok(SemaphoreAt { mem, offset, flags })
    }

    fn word(&self) -> Result<&AtomicU64> {
        self.mem.word(self.offset)
    }

    fn limit(&self) -> u64 {
        if self.boolean() { 1 } else { SEM_MAX }
    }

    fn boolean(&self) -> bool {
        self.flags & sem_flags::BOOLEAN != 0
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    pub fn value(&self) -> u64 {
        let v = self.mem.signal_fetch(self.offset).unwrap_or(0);
        if self.boolean() { v.min(1) } else { v }
    }

    /// The word itself, unsaturated: for an integer semaphore, more than `SEM_MAX` means
    /// peers' adds took it past what it may hold.
    pub fn raw_value(&self) -> u64 {
        self.mem.signal_fetch(self.offset).unwrap_or(0)
    }

    /// Add `n`; fails if that would pass the maximum.
    pub fn post(&self, n: u64) -> Result<()> {
        let w = self.word()?;
        let lim = self.limit();
        w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            v.checked_add(n).filter(|x| *x <= lim)
        })
        .map(|_| ())
        .map_err(|v| {
            Error::msg(
                Status::InvalidParam,
                format!("semaphore at {v} cannot rise by {n} past {lim}"),
            )
        })
    }

    /// Take `n` if available now. A boolean semaphore holds at most 1: taking 1 empties
    /// it (also when peers' adds took the word past 1), and more than 1 is never there.
    pub fn try_wait(&self, n: u64) -> bool {
        let boolean = self.boolean();
        if boolean && n > 1 {
            return false;
        }
        self.word()
            .map(|w| {
                w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    if boolean && n == 1 {
                        (v >= 1).then_some(0)
                    } else {
                        v.checked_sub(n)
                    }
                })
                .is_ok()
            })
            .unwrap_or(false)
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
        // A boolean one reads as 1 whatever peers' adds took its word to.
        let want = n.min(self.limit());
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
            // Until the word holds enough; another consumer may take it first, and then
            // this waits again.
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
        assert_eq!(sem.value(), 0);
        assert_eq!(w.load(Ordering::Acquire), 0, "one wait takes all of it");
        assert!(!sem.try_wait(1));
        sem.post(1).expect("post");
        assert!(sem.post(1).is_err(), "a local post past 1 is refused");
        assert!(sem.try_wait(1));
        // An integer semaphore counts.
        let int = Semaphore::new(&ctx, sem_flags::INTEGER).expect("semaphore");
        int.mem
            .word(0)
            .expect("word")
            .fetch_add(3, Ordering::AcqRel);
        assert_eq!(int.value(), 3);
        assert!(int.try_wait(2));
        assert_eq!(int.value(), 1);
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
        let e = SemaphoreAt::new(&mem, 12, 0).err().expect("unaligned");
        assert_eq!(e.status(), Status::OutOfRange);
        let e = SemaphoreAt::new(&mem, 4096, 0).err().expect("past the end");
        assert_eq!(e.status(), Status::OutOfRange);
        let e = SemaphoreAt::new(&mem, 64, sem_flags::BOOLEAN | sem_flags::INTEGER)
            .err()
            .expect("both kinds");
        assert_eq!(e.status(), Status::InvalidParam);
        let int = SemaphoreAt::new(&mem, 64, 0).expect("integer");
        let boolean = SemaphoreAt::new(&mem, 128, sem_flags::BOOLEAN).expect("boolean");
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
        mem.word(128).expect("word").fetch_add(2, Ordering::AcqRel);
        assert_eq!((boolean.value(), boolean.raw_value()), (1, 2));
        assert!(boolean.try_wait(1));
        assert_eq!(boolean.raw_value(), 0);
    }
}
