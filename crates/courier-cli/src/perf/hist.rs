//! A latency histogram cheap enough to record every operation of an 8-byte ping-pong.
//!
//! Samples are clock ticks, counted in log-linear buckets: exact below 256 ticks, and
//! above that 128 buckets per power of two, so a bucket is at most 1/128 of its value
//! wide and a percentile read from it is within 0.4% of the true sample. Recording is a
//! bit scan, a shift and one increment; ucx_perftest keeps only a ring of recent samples
//! for its percentile, while this keeps every sample at about the same cost.

/// Values below this are their own bucket.
const EXACT: u64 = 256;
/// Buckets per power of two above `EXACT` (as a shift).
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
/// Enough buckets for any `u64`: the largest value has shift 56.
const BUCKETS: usize = (64 - SUB_BITS as usize) * SUB + SUB;

/// Counts of samples (in ticks) by bucket.
#[derive(Clone)]
pub struct TickHist {
    counts: Box<[u64]>,
    total: u64,
    /// Lowest and one past the highest bucket used (to bound merges and scans).
    lo: usize,
    hi: usize,
}

impl Default for TickHist {
    fn default() -> TickHist {
        TickHist {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            lo: BUCKETS,
            hi: 0,
        }
    }
}

/// The bucket of value `v`.
#[inline]
fn bucket(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    // v >= 256: its top bit is at 8 or above, so shift >= 1.
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    (shift as usize) * SUB + (v >> shift) as usize
}

/// The middle of bucket `i` (the value itself for exact buckets).
fn value(i: usize) -> u64 {
    if (i as u64) < EXACT {
        return i as u64;
    }
    let shift = (i / SUB - 1) as u32;
    let low = ((i % SUB + SUB) as u64) << shift;
    low + ((1u64 << shift) >> 1)
}

impl TickHist {
    /// Count one sample.
    #[inline]
    pub fn record(&mut self, ticks: u64) {
        let i = bucket(ticks);
        // `bucket` is below BUCKETS for every u64.
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.total += 1;
        self.lo = self.lo.min(i);
        self.hi = self.hi.max(i + 1);
    }

    /// Samples counted.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Add `other`'s counts to these.
    pub fn merge(&mut self, other: &TickHist) {
        if other.total == 0 {
            return;
        }
        for i in other.lo..other.hi {
            self.counts[i] += other.counts[i];
        }
        self.total += other.total;
        self.lo = self.lo.min(other.lo);
        self.hi = self.hi.max(other.hi);
    }

    /// Forget every sample.
    pub fn reset(&mut self) {
        if self.total > 0 {
            self.counts[self.lo..self.hi].fill(0);
        }
        self.total = 0;
        self.lo = BUCKETS;
        self.hi = 0;
    }

    /// The sample at quantile `q` (0 to 1) in ticks: the smallest value with at least
    /// `q` of the samples at or below it. Zero when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let want = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for i in self.lo..self.hi {
            seen += self.counts[i];
            if seen >= want {
                return value(i);
            }
        }
        value(self.hi.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_and_narrowly() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 40) + 12345, u64::MAX / 3, u64::MAX]) {
            let i = bucket(v);
            assert!(i < BUCKETS, "{v} -> {i}");
            assert!(i >= last || v == 1 << 20, "buckets out of order at {v}");
            last = i;
            let mid = value(i);
            let err = (mid as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 128.0, "{v}: bucket middle {mid}, error {err}");
            assert_eq!(bucket(mid), i, "the middle of bucket {i} lies in it");
        }
        assert_eq!(bucket(255), 255);
        assert_eq!(bucket(256), 256);
        assert_eq!(value(bucket(100)), 100);
    }

    #[test]
    fn quantiles_of_known_samples() {
        let mut h = TickHist::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v * 10);
        }
        assert_eq!(h.len(), 1000);
        let near = |got: u64, want: u64| {
            assert!(
                (got as f64 - want as f64).abs() <= want as f64 / 128.0,
                "{got} vs {want}"
            )
        };
        near(h.quantile(0.5), 5000);
        near(h.quantile(0.99), 9900);
        near(h.quantile(1.0), 10000);
        near(h.quantile(0.0), 10);
        // Heavy tail: the median stays put.
        for _ in 0..10 {
            h.record(1 << 40);
        }
        near(h.quantile(0.5), 5050);
    }

    #[test]
    fn merge_and_reset() {
        let (mut a, mut b) = (TickHist::default(), TickHist::default());
        for _ in 0..3 {
            a.record(100);
        }
        for _ in 0..5 {
            b.record(700);
        }
        a.merge(&b);
        assert_eq!(a.len(), 8);
        let mid = a.quantile(0.5);
        assert!((mid as i64 - 700).abs() <= 6, "{mid}");
        assert_eq!(a.quantile(0.3), 100);
        b.reset();
        assert_eq!(b.len(), 0);
        assert_eq!(b.quantile(0.5), 0);
        b.record(42);
        assert_eq!(b.quantile(0.5), 42);
        assert_eq!(b.len(), 1);
    }
}
