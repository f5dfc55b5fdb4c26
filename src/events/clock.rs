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
    last: (u64, u64),
    hz: Option<u64>,
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
    /// Starts calibrating.
    pub fn start() -> Clock {
        let s = sample();
        Clock { first: s, last: s, hz: Host::timestamp_hz() }
    }

    /// Adds a sample (call it at every drain).
    pub fn refine(&mut self) {
        self.last = sample();
    }

    /// Nanoseconds per counter tick.
    pub fn ns_per_tick(&self) -> f64 {
        if let Some(hz) = self.hz {
            return 1e9 / hz as f64;
        }
        let ticks = self.last.0.saturating_sub(self.first.0);
        let ns = self.last.1.saturating_sub(self.first.1);
        if ticks < 1_000_000 {
            // Too close together to fit a slope: assume a 1 GHz counter until
            // the next sample (events are only converted after a drain).
            return 1.0;
        }
        ns as f64 / ticks as f64
    }

    /// CLOCK_MONOTONIC nanoseconds at counter value `tsc`.
    pub fn ns(&self, tsc: u64) -> u64 {
        let d = tsc as i128 - self.first.0 as i128;
        (self.first.1 as i128 + (d as f64 * self.ns_per_tick()) as i128).max(0) as u64
    }

    /// Nanoseconds between two counter values.
    pub fn duration_ns(&self, from: u64, to: u64) -> u64 {
        (to.saturating_sub(from) as f64 * self.ns_per_tick()) as u64
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
}
