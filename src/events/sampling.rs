//! The tracer's half of sampling probes (`tp profile`): at the end of each
//! epoch, sets every function's sampling period from its calls in the epoch
//! and renews spent budgets.
//!
//! In the target, a sampling probe counts every call and times one call in
//! `period` at random: each thread row counts down the calls to skip, and
//! the runtime draws the next count when it takes a sample. Samples drawn
//! that way are spread over all calls, so their latencies are unbiased;
//! timing the *first* calls after an instant (say, after each epoch began)
//! would over-represent calls that follow a pause (the inspection paradox).
//! Hence:
//!
//! - until tp knows a function's rate (period 0), the runtime samples it
//!   with a small period of its own and never times the first call of a row;
//! - when a function's period drops (it became rarer, or its rate was just
//!   learnt), tp redraws its countdowns at random for the new period, so
//!   the change takes effect at once without timing the next call;
//! - the first epoch is short ([`FIRST_EPOCH`]) so that the rates of the
//!   functions busy from the start are known soon.

use anyhow::Result;

use crate::probe::region::Region;

/// How long the first epoch lasts at most.
pub const FIRST_EPOCH: std::time::Duration = std::time::Duration::from_millis(1);

/// Sampling state of a set of probes.
pub struct Sampler {
    idx: Vec<u32>,
    /// Samples wanted per function per epoch.
    per_epoch: u32,
    /// Samples allowed per function per epoch.
    budget: i32,
    periods: Vec<u32>,
    last_hits: Vec<u64>,
    rng: u64,
    /// Stores into the target's region so far: periods, countdowns redrawn,
    /// budgets renewed.
    pub toggles: u64,
}

impl Sampler {
    /// Starts sampling probes `idx`, installed with the budget
    /// [`Sampler::budget_for`] `per_epoch` and period 0.
    pub fn new(region: &Region, idx: Vec<u32>, per_epoch: u32) -> Sampler {
        let last_hits = region.hits_of(&idx);
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos());
        Sampler {
            periods: vec![0; idx.len()],
            idx,
            per_epoch,
            budget: Self::budget_for(per_epoch),
            last_hits,
            rng: (seed as u64) | 1,
            toggles: 0,
        }
    }

    /// Samples probes `idx` too, installed as those of [`Sampler::new`].
    pub fn add(&mut self, region: &Region, idx: &[u32]) {
        self.last_hits.extend(region.hits_of(idx));
        self.periods.extend(idx.iter().map(|_| 0));
        self.idx.extend_from_slice(idx);
    }

    /// Gives each probe installed again since the last look the period tp
    /// had learnt for it, and counts its calls from 0. A library loaded
    /// again takes its entries again, and their install zeroes their
    /// counters and periods: their calls would be sampled as those of a
    /// function whose rate tp does not know, the first of each load never.
    /// Called before the loading thread goes on, every call of the new load
    /// is sampled as before, the first included.
    pub fn reinstalled(&mut self, region: &Region) -> Result<()> {
        for k in 0..self.idx.len() {
            let (i, period) = (self.idx[k], self.periods[k]);
            if period == 0 || region.period(i) != 0 {
                continue;
            }
            region.set_period(i, period)?;
            let rng = &mut self.rng;
            let span = 2 * period as u64 - 1;
            region.set_countdowns(i, || next(rng) % span)?;
            self.last_hits[k] = region.hits_of(&[i])[0];
            self.toggles += 1;
        }
        Ok(())
    }

    /// The budget of probes sampling `per_epoch` calls per epoch: twice as
    /// many, for functions whose calls become more frequent.
    pub fn budget_for(per_epoch: u32) -> i32 {
        per_epoch.saturating_mul(2).min(i32::MAX as u32) as i32
    }

    /// Ends an epoch: sets the next epoch's periods and budgets.
    pub fn end_epoch(&mut self, region: &Region) -> Result<()> {
        let budgets = region.budgets_of(&self.idx);
        let hits = region.hits_of(&self.idx);
        for k in 0..self.idx.len() {
            let i = self.idx[k];
            let calls = hits[k].saturating_sub(self.last_hits[k]);
            let period = (calls / self.per_epoch as u64).clamp(1, u32::MAX as u64) as u32;
            let old = self.periods[k];
            if calls > 0 && period != old {
                region.set_period(i, period)?;
                if old == 0 || period < old / 2 {
                    let rng = &mut self.rng;
                    let span = 2 * period as u64 - 1;
                    region.set_countdowns(i, || next(rng) % span)?;
                }
                self.periods[k] = period;
                self.toggles += 1;
            }
            if budgets[k] < self.budget {
                region.set_budget(i, self.budget)?;
                self.toggles += 1;
            }
        }
        self.last_hits = hits;
        Ok(())
    }
}

/// xorshift64*.
fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_covers_its_range_evenly() {
        let mut s = 7;
        let mut seen = [0u32; 10];
        for _ in 0..100_000 {
            seen[(next(&mut s) % 10) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (9_000..11_000).contains(&n)), "{seen:?}");
    }

    #[test]
    fn budget_is_twice_the_samples_wanted() {
        assert_eq!(Sampler::budget_for(10), 20);
        assert_eq!(Sampler::budget_for(u32::MAX), i32::MAX);
    }
}
