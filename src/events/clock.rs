//! From the cycle counter the runtime stamps events with to CLOCK_MONOTONIC
//! nanoseconds: a linear map fitted from (counter, monotonic) pairs that the
//! tracer samples itself, the first when the attach starts and one more at
//! every drain, so the slope sharpens as the session goes on.

use nix::time::{ClockId, clock_gettime};

use crate::arch::{Arch, Host};

/// A calibrated clock.
#[derive(Debug, Clone)]
pub struct Clock {
    first: (u64, u64),
    hz: Option<u64>,
    /// Nanoseconds per tick, from the latest fit.
    slope: f64,
    /// A counter value and its time: the map is the line through it with
    /// `slope`. Each refit moves it along the previous line, so a time
    /// already reported never moves and later times never fall before it.
    anchor: (u64, f64),
    /// False until a slope was fitted (before, a 1 GHz counter is assumed).
    fitted: bool,
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn sample() -> (u64, u64) {
    // Read the counter between two clock reads and take the midpoint.
    let a = monotonic_ns();
    let tsc = Host::timestamp();
    let b = monotonic_ns();
    (tsc, a + (b - a) / 2)
}

impl Clock {
    /// Starts calibrating now.
    pub fn start() -> Clock {
        let s = sample();
        let hz = Host::timestamp_hz();
        let slope = hz.map_or(1.0, |hz| 1e9 / hz as f64);
        Clock { first: s, hz, slope, anchor: (s.0, s.1 as f64), fitted: hz.is_some() }
    }

    /// A clock whose rate is known now: the CPU's, or else fitted over a
    /// 20 ms wait.
    pub fn calibrated() -> Clock {
        let mut clock = Clock::start();
        if clock.hz.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(20));
            clock.refine();
        }
        clock
    }

    /// Adds a sample (call it at every drain): refits the slope over all
    /// the time since the start, continuing from where the map is now.
    pub fn refine(&mut self) {
        if self.hz.is_some() {
            return;
        }
        let now = sample();
        let ticks = now.0.saturating_sub(self.first.0);
        if ticks < 1_000_000 {
            return; // too close to the first sample to fit a slope
        }
        let slope = now.1.saturating_sub(self.first.1) as f64 / ticks as f64;
        if self.fitted {
            self.anchor = (now.0, self.at(now.0));
        }
        // (The first fit keeps the first sample as its anchor: the 1 GHz
        // guess before it is no line to continue.)
        self.slope = slope;
        self.fitted = true;
    }

    /// Nanoseconds per counter tick.
    pub fn ns_per_tick(&self) -> f64 {
        self.slope
    }

    fn at(&self, tsc: u64) -> f64 {
        self.anchor.1 + (tsc as i128 - self.anchor.0 as i128) as f64 * self.slope
    }

    /// CLOCK_MONOTONIC nanoseconds of a counter value.
    pub fn ns(&self, tsc: u64) -> u64 {
        self.at(tsc).max(0.0) as u64
    }

    /// Nanoseconds between two counter values.
    pub fn duration_ns(&self, from: u64, to: u64) -> u64 {
        (to.saturating_sub(from) as f64 * self.slope) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_time_of_the_counter_tracks_the_clock() {
        let mut c = Clock::start();
        std::thread::sleep(std::time::Duration::from_millis(30));
        c.refine();
        let now = sample();
        let err = c.ns(now.0) as i64 - now.1 as i64;
        // Within a millisecond after 30 ms of calibration (a loose bound: this
        // checks the arithmetic, not the machine).
        assert!(err.abs() < 1_000_000, "off by {err} ns");
        assert!(c.ns_per_tick() > 0.0);
    }

    #[test]
    fn a_refit_never_moves_a_time_backwards() {
        let mut c = Clock::start();
        std::thread::sleep(std::time::Duration::from_millis(5));
        c.refine();
        for _ in 0..100 {
            // An event converted before a drain's refit, and one stamped
            // just after it: the later one is never reported earlier.
            let (t1, n1) = {
                let t = Host::timestamp();
                (t, c.ns(t))
            };
            c.refine();
            let n2 = c.ns(Host::timestamp());
            assert!(n2 >= n1, "{n2} ns after {n1} ns");
            // And the earlier one barely moves (a refit turns the line at the
            // drain, not at the start of the session).
            assert!(c.ns(t1).abs_diff(n1) < 1_000, "{} vs {n1}", c.ns(t1));
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}
