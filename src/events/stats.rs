//! Latency statistics per function: count, total, percentiles from a
//! log-linear histogram (16 linear buckets per power of two: at most 1/16
//! relative error), and the power-of-two buckets bpftrace users know.

/// Linear sub-buckets per power of two.
const SUB: u64 = 16;

/// The durations of one function's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latency {
    /// Calls timed.
    pub count: u64,
    /// Sum of durations, ns.
    pub total_ns: u64,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    buckets: Vec<u64>,
    /// Calls of at most 2^k ns and more than 2^(k-1) (index 0: at most 1 ns),
    /// for histograms whose bounds are "less than or equal" (OpenMetrics).
    at_most_pow2: Vec<u64>,
}

/// The smallest k with `ns <= 2^k`.
fn ceil_log2(ns: u64) -> usize {
    if ns <= 1 { 0 } else { 64 - (ns - 1).leading_zeros() as usize }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let power = 63 - ns.leading_zeros() as u64; // ns in [2^power, 2^(power+1))
    let shift = power - 4; // SUB = 2^4
    let sub = (ns >> shift) - SUB; // 0..16
    ((power - 3) * SUB + sub) as usize
}

fn bucket_low(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let power = b / SUB + 3;
    let sub = b % SUB;
    (SUB + sub) << (power - 4)
}

impl Latency {
    /// Adds one call of `ns` nanoseconds.
    pub fn add(&mut self, ns: u64) {
        if self.count == 0 || ns < self.min_ns {
            self.min_ns = ns;
        }
        self.max_ns = self.max_ns.max(ns);
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        let b = bucket_of(ns);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0);
        }
        self.buckets[b] += 1;
        let k = ceil_log2(ns);
        if self.at_most_pow2.len() <= k {
            self.at_most_pow2.resize(k + 1, 0);
        }
        self.at_most_pow2[k] += 1;
    }

    /// Adds `n` calls of about `ns` nanoseconds each (a bucket of a
    /// histogram kept in the target); [`Latency::set_exact`] then sets what
    /// the target counted exactly.
    pub fn add_n(&mut self, ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        if self.count == 0 || ns < self.min_ns {
            self.min_ns = ns;
        }
        self.max_ns = self.max_ns.max(ns);
        self.count += n;
        self.total_ns = self.total_ns.saturating_add(ns.saturating_mul(n));
        let b = bucket_of(ns);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0);
        }
        self.buckets[b] += n;
        let k = ceil_log2(ns);
        if self.at_most_pow2.len() <= k {
            self.at_most_pow2.resize(k + 1, 0);
        }
        self.at_most_pow2[k] += n;
    }

    /// Sets the total, shortest and longest, known exactly where the
    /// durations were binned (in the target).
    pub fn set_exact(&mut self, total_ns: u64, min_ns: u64, max_ns: u64) {
        self.total_ns = total_ns;
        self.min_ns = min_ns;
        self.max_ns = max_ns.max(min_ns);
    }

    /// Adds every call of `other` (the same function in another process).
    pub fn merge(&mut self, other: &Latency) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 || other.min_ns < self.min_ns {
            self.min_ns = other.min_ns;
        }
        self.max_ns = self.max_ns.max(other.max_ns);
        self.count += other.count;
        self.total_ns = self.total_ns.saturating_add(other.total_ns);
        for (mine, theirs) in [(&mut self.buckets, &other.buckets), (&mut self.at_most_pow2, &other.at_most_pow2)] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        }
    }

    /// Calls of at most `2^k` ns, exactly.
    pub fn at_most_pow2_ns(&self, k: u32) -> u64 {
        self.at_most_pow2.iter().take(k as usize + 1).sum()
    }

    /// Mean, ns.
    pub fn avg_ns(&self) -> u64 {
        self.total_ns.checked_div(self.count).unwrap_or(0)
    }

    /// The `q` quantile (0..=1), ns: the low edge of its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (b, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_low(b).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    /// Calls per power-of-two range `[2^k, 2^(k+1))` ns (k = -1 means 0 ns), for
    /// the bpftrace-style histogram; only non-empty ranges between the first and last.
    pub fn log2_buckets(&self) -> Vec<(u64, u64, u64)> {
        let mut pow: Vec<u64> = vec![0; 65];
        for (b, &n) in self.buckets.iter().enumerate() {
            let low = bucket_low(b);
            let k = if low == 0 { 0 } else { 64 - low.leading_zeros() as usize };
            pow[k] += n;
        }
        let Some(first) = pow.iter().position(|&n| n > 0) else { return Vec::new() };
        let last = pow.iter().rposition(|&n| n > 0).unwrap();
        (first..=last)
            .map(|k| {
                let (lo, hi) = if k == 0 { (0, 1) } else { (1u64 << (k - 1), 1u64 << k) };
                (lo, hi, pow[k])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_with_bounded_error() {
        for ns in [0, 1, 15, 16, 17, 31, 32, 100, 1000, 123_456, 10_000_000_000] {
            let low = bucket_low(bucket_of(ns));
            assert!(low <= ns && (ns - low) as f64 <= ns as f64 / 16.0 + 1.0, "{ns}: bucket starts at {low}");
        }
        assert!(bucket_of(33) > bucket_of(32) || bucket_low(bucket_of(33)) == 32);
    }

    #[test]
    fn percentiles_and_mean() {
        let mut l = Latency::default();
        for ns in 1..=1000 {
            l.add(ns * 1000);
        }
        assert_eq!(l.count, 1000);
        assert_eq!(l.avg_ns(), 500_500);
        let p50 = l.quantile_ns(0.5);
        assert!((470_000..=500_000).contains(&p50), "{p50}");
        let p99 = l.quantile_ns(0.99);
        assert!((930_000..=990_000).contains(&p99), "{p99}");
        assert_eq!(l.quantile_ns(1.0), bucket_low(bucket_of(1_000_000)), "the low edge of the last bucket");
    }

    #[test]
    fn counts_at_most_a_power_of_two_exactly_and_merges() {
        let mut a = Latency::default();
        for ns in [0, 1, 2, 3, 4, 5, 1024, 1025] {
            a.add(ns);
        }
        assert_eq!([a.at_most_pow2_ns(0), a.at_most_pow2_ns(1), a.at_most_pow2_ns(2)], [2, 3, 5]);
        assert_eq!((a.at_most_pow2_ns(10), a.at_most_pow2_ns(11), a.at_most_pow2_ns(63)), (7, 8, 8));
        let mut b = Latency::default();
        b.add(2048);
        b.merge(&a);
        assert_eq!((b.count, b.min_ns, b.max_ns, b.total_ns), (9, 0, 2048, 2048 + 2064));
        assert_eq!((b.at_most_pow2_ns(10), b.at_most_pow2_ns(11)), (7, 9));
        assert_eq!(b.log2_buckets().iter().map(|x| x.2).sum::<u64>(), 9);
    }

    #[test]
    fn log2_buckets_as_bpftrace_shows_them() {
        let mut l = Latency::default();
        for ns in [0, 1, 2, 3, 5, 1000, 1023] {
            l.add(ns);
        }
        let b = l.log2_buckets();
        assert_eq!(b[0], (0, 1, 1));
        assert_eq!(b[1], (1, 2, 1));
        assert_eq!(b[2], (2, 4, 2));
        assert_eq!(b[3], (4, 8, 1));
        assert_eq!(*b.last().unwrap(), (512, 1024, 2));
        assert_eq!(b.iter().map(|x| x.2).sum::<u64>(), 7);
    }
}
