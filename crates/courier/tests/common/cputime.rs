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

/// The victim's progress calls by the CPU time each took (`COURIER_TEST_PROGRESS_CPU`, for
/// `bench_hostile`): what the library makes a client wait, whatever else the machine runs
/// (a round trip's wall time on a loaded machine is mostly the scheduler's).
#[derive(Default)]
pub struct CallTimes {
    calls: u64,
    /// Calls over 100 us, 250 us, 500 us, 1 ms, 2 ms, 4 ms.
    over: [u64; 6],
    max_ns: u64,
}

impl CallTimes {
    const EDGES_US: [u64; 6] = [100, 250, 500, 1000, 2000, 4000];

    pub fn add(&mut self, ns: u64) {
        self.calls += 1;
        self.max_ns = self.max_ns.max(ns);
        for (i, us) in Self::EDGES_US.iter().enumerate() {
            if ns > us * 1000 {
                self.over[i] += 1;
            }
        }
    }

    pub fn line(&self) -> String {
        let over: Vec<String> = Self::EDGES_US
            .iter()
            .zip(self.over)
            .map(|(us, n)| format!("cpu_over_{us}us={n}"))
            .collect();
        format!(
            "PROGRESS_CPU calls={} {} cpu_max_us={:.0}",
            self.calls,
            over.join(" "),
            self.max_ns as f64 / 1e3
        )
    }
}
