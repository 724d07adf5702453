//! `Semaphore`: a Berkeley UPC-style counting (or boolean) semaphore in this process's
//! memory, posted locally or by peers (atomic adds and signalling puts on its word).

use std::sync::atomic::Ordering;
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
}

/// The largest value a semaphore holds.
pub const SEM_MAX: u64 = 65535;

impl Semaphore {
    /// Allocate a semaphore at 0 (flags 0 = INTEGER | MPRODUCER | MCONSUMER).
    pub fn new(ctx: &Context, flags: u32) -> Result<Semaphore> {
        use sem_flags::*;
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
        let mem = ctx.mem_map(MemMapParams::allocate(64))?;
        Ok(Semaphore { mem, flags })
    }

    fn limit(&self) -> u64 {
        if self.flags & sem_flags::BOOLEAN != 0 {
            1
        } else {
            SEM_MAX
        }
    }

    /// Key and address for peers that post to it remotely (atomic add or put-with-signal
    /// with `SignalOp::Add`; a boolean one also with `Set` 1 or a posted `Or` 1). The owner
    /// cannot bound a peer's add, so a boolean semaphore saturates instead: any value
    /// above 0 reads as 1, and a wait takes all of it.
    pub fn remote(&self) -> Result<(Vec<u8>, u64)> {
        Ok((self.mem.pack_rkey()?, self.mem.as_ptr() as u64))
    }

    fn boolean(&self) -> bool {
        self.flags & sem_flags::BOOLEAN != 0
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    pub fn value(&self) -> u64 {
        let v = self.mem.signal_fetch(0).unwrap_or(0);
        if self.boolean() { v.min(1) } else { v }
    }

    /// Add `n`; fails if that would pass the maximum.
    pub fn post(&self, n: u64) -> Result<()> {
        let w = self.mem.word(0)?;
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
        self.mem
            .word(0)
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

    /// Wait until at least `n` is there, then take it (progressing `worker`, spinning;
    /// `bupc_sem_wait`). See `wait_timeout`.
    pub fn wait(&self, worker: &Worker, n: u64) -> Result<()> {
        self.wait_timeout(worker, n, false, None)
    }

    /// `wait`, sleeping when asked and with a time limit (`Timeout` when it passes; `None`:
    /// none). With `sleep` it waits as `Memory::signal_wait_until` does: a short spin, then
    /// sleeps on the worker's event fd, from which a peer's signalling put to this worker
    /// wakes it (framed, or written directly by a same-host peer). Waiting for more than a
    /// boolean semaphore can hold is refused.
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
            match self
                .mem
                .signal_wait_until_timeout(Some(worker), 0, Cmp::Ge, want, sleep, left)
            {
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
}
