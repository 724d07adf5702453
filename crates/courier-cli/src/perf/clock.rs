//! The clock for per-operation timing: the CPU's time-stamp counter, as ucx_perftest uses,
//! calibrated once against the monotonic clock. Reading it costs a few nanoseconds where
//! `std::time::Instant::now()` costs tens on a virtual machine, which would show up in every
//! per-operation number. Without an invariant TSC it falls back to the monotonic clock.
//!
//! A drop-in for the parts of `std::time::Instant` the perf loops use.

use std::ops::Add;
use std::sync::OnceLock;
use std::time::{Duration, Instant as Mono};

/// A point in time, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

struct Calib {
    /// Nanoseconds per tick.
    ns_per_tick: f64,
    /// Use the TSC (else ticks are nanoseconds since `origin`).
    tsc: bool,
    origin: Mono,
}

fn invariant_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/proc/cpuinfo")
            .is_ok_and(|c| c.contains("constant_tsc") && c.contains("nonstop_tsc"))
}

fn calib() -> &'static Calib {
    static C: OnceLock<Calib> = OnceLock::new();
    C.get_or_init(|| {
        let origin = Mono::now();
        if !invariant_tsc() {
            return Calib {
                ns_per_tick: 1.0,
                tsc: false,
                origin,
            };
        }
        let (m0, t0) = (Mono::now(), raw_tsc());
        std::thread::sleep(Duration::from_millis(20));
        let (m1, t1) = (Mono::now(), raw_tsc());
        let ticks = t1.saturating_sub(t0).max(1);
        Calib {
            ns_per_tick: (m1 - m0).as_nanos() as f64 / ticks as f64,
            tsc: true,
            origin,
        }
    })
}

#[inline]
fn raw_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

impl Instant {
    /// Now.
    #[inline]
    pub fn now() -> Instant {
        let c = calib();
        if c.tsc {
            Instant(raw_tsc())
        } else {
            Instant(c.origin.elapsed().as_nanos() as u64)
        }
    }

    /// Time from `earlier` to `self` (zero if `earlier` is later).
    #[inline]
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        Duration::from_nanos((self.0.saturating_sub(earlier.0) as f64 * calib().ns_per_tick) as u64)
    }

    /// Clock ticks from `earlier` to `self` (zero if `earlier` is later): the cheap form
    /// for per-operation samples, converted with `ticks_to_ns` when reported.
    #[inline]
    pub fn ticks_since(&self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since `self`.
    #[inline]
    pub fn elapsed(&self) -> Duration {
        Instant::now().duration_since(*self)
    }
}

/// Nanoseconds in `ticks` clock ticks.
pub fn ticks_to_ns(ticks: u64) -> f64 {
    ticks as f64 * calib().ns_per_tick
}

impl Add<Duration> for Instant {
    type Output = Instant;
    #[allow(clippy::suspicious_arithmetic_impl)] // nanoseconds to ticks
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add((d.as_nanos() as f64 / calib().ns_per_tick) as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_monotonic_clock() {
        let (a, m) = (Instant::now(), Mono::now());
        std::thread::sleep(Duration::from_millis(30));
        let (ours, theirs) = (a.elapsed(), m.elapsed());
        let diff = ours.as_secs_f64() - theirs.as_secs_f64();
        assert!(
            diff.abs() < 0.005,
            "tsc clock {ours:?} vs monotonic {theirs:?}"
        );
        assert!(a + Duration::from_millis(10) > a);
    }
}
