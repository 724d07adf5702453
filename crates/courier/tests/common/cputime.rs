//! CPU time of calls on this thread: `hostile.rs`'s victim counts its progress calls by the
//! CPU each took (`COURIER_TEST_PROGRESS_CPU`), which a loaded machine's wall time hides.

/// This thread's CPU time, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What `getrusage(RUSAGE_THREAD)` says of this thread: user and system time (us), minor
/// page faults, involuntary context switches.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    user_us: u64,
    sys_us: u64,
    minflt: u64,
    nivcsw: u64,
}

/// This thread's `Usage`.
pub fn thread_usage() -> Usage {
    // SAFETY: an all-zero rusage is valid, and getrusage writes a whole one.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid rusage to write.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Usage {
        user_us: us(r.ru_utime),
        sys_us: us(r.ru_stime),
        minflt: r.ru_minflt as u64,
        nivcsw: r.ru_nivcsw as u64,
    }
}

/// The victim's progress calls by the CPU time each took (`COURIER_TEST_PROGRESS_CPU`, for
/// `bench_hostile`): what the library makes a client wait, whatever else the machine runs
/// (a round trip's wall time on a loaded machine is mostly the scheduler's).
#[derive(Default)]
pub struct CallTimes {
    calls: u64,
    /// Calls over 100 us, 250 us, 500 us, 1 ms, 2 ms, 4 ms.
    over: [u64; 6],
    max_ns: u64,
    /// The longest calls (CPU ns, and what `Usage` moved by during each), longest first.
    longest: Vec<(u64, Usage)>,
}

impl CallTimes {
    const EDGES_US: [u64; 6] = [100, 250, 500, 1000, 2000, 4000];
    /// How many of the longest calls the line breaks down.
    const LONGEST: usize = 3;

    /// A call that took `ns` of CPU; `usage`, what `thread_usage` moved by meanwhile, is
    /// kept for the longest calls.
    pub fn add(&mut self, ns: u64, usage: impl FnOnce() -> Usage) {
        self.calls += 1;
        self.max_ns = self.max_ns.max(ns);
        for (i, us) in Self::EDGES_US.iter().enumerate() {
            if ns > us * 1000 {
                self.over[i] += 1;
            }
        }
        if self.longest.len() < Self::LONGEST || self.longest.last().is_some_and(|l| ns > l.0) {
            self.longest.push((ns, usage()));
            self.longest.sort_by_key(|l| std::cmp::Reverse(l.0));
            self.longest.truncate(Self::LONGEST);
        }
    }

    pub fn line(&self) -> String {
        let over: Vec<String> = Self::EDGES_US
            .iter()
            .zip(self.over)
            .map(|(us, n)| format!("cpu_over_{us}us={n}"))
            .collect();
        // Each of the longest: CPU us, of it user and system us, minor faults, preemptions.
        let longest: Vec<String> = self
            .longest
            .iter()
            .map(|(ns, u)| {
                format!(
                    "{:.0}/{}u/{}s/{}flt/{}pre",
                    *ns as f64 / 1e3,
                    u.user_us,
                    u.sys_us,
                    u.minflt,
                    u.nivcsw
                )
            })
            .collect();
        format!(
            "PROGRESS_CPU calls={} {} cpu_max_us={:.0} longest={}",
            self.calls,
            over.join(" "),
            self.max_ns as f64 / 1e3,
            longest.join(",")
        )
    }
}

impl Usage {
    /// What moved from `before` to `self`.
    pub fn since(self, before: Usage) -> Usage {
        Usage {
            user_us: self.user_us.saturating_sub(before.user_us),
            sys_us: self.sys_us.saturating_sub(before.sys_us),
            minflt: self.minflt.saturating_sub(before.minflt),
            nivcsw: self.nivcsw.saturating_sub(before.nivcsw),
        }
    }
}
