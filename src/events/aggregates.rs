//! What the runtime keeps in the target instead of sending events: each
//! thread's latency histograms of return probes whose events nobody reads
//! (`--ret -q`) and its counts of calls by an argument's value (`--by`),
//! after its ring in the data region ([`crate::probe::layout::AggHead`]).
//! Read here, summed over the threads, and cleared when a session starts.
//! The target can write these tables: a probe index past the region's
//! capacity is skipped, a count is taken as it is (it only changes what is
//! reported).

use std::collections::HashMap;

use anyhow::Result;

use super::clock::Clock;
use super::stats::Latency;
use crate::probe::layout::{
    AGG_BY_ENTRIES, AGG_LAT_ENTRIES, AggHead, ByEntry, Header, LAT_BUCKETS, LatEntry, lat_bucket_low,
};
use crate::probe::region::Region;

/// Offsets of the thread slots some thread has claimed (as the drainer reads them).
fn slots_in_use(h: &Header) -> Vec<u64> {
    (0..1u64 << h.ctx.slot_bits)
        .filter(|&i| h.ctx.claimed[(i / 64) as usize] & (1 << (i % 64)) != 0)
        .map(|i| h.slot_off(i))
        .collect()
}

fn lat_off(h: &Header, slot: u64, i: usize) -> u64 {
    h.agg_off(slot) + (std::mem::size_of::<AggHead>() + i * std::mem::size_of::<LatEntry>()) as u64
}

fn by_off(h: &Header, slot: u64, i: usize) -> u64 {
    h.agg_off(slot)
        + (std::mem::size_of::<AggHead>()
            + AGG_LAT_ENTRIES * std::mem::size_of::<LatEntry>()
            + i * std::mem::size_of::<ByEntry>()) as u64
}

/// The durations the threads kept per probe (entry index), in ns by `clock`.
pub fn latency(region: &Region, clock: &Clock) -> HashMap<u32, Latency> {
    let h = region.header();
    let mut out: HashMap<u32, Latency> = HashMap::new();
    let mut exact: HashMap<u32, (u64, u64, u64)> = HashMap::new();
    for slot in slots_in_use(&h) {
        for i in 0..AGG_LAT_ENTRIES {
            let off = lat_off(&h, slot, i);
            let probe = region.load_u64(off) as u32;
            if probe == 0 || probe > h.capacity {
                continue;
            }
            let e: LatEntry = region.get(off);
            if e.count == 0 {
                continue;
            }
            let l = out.entry(probe - 1).or_default();
            for (b, &n) in e.buckets.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let lo = lat_bucket_low(b);
                let hi = if b + 1 < LAT_BUCKETS { lat_bucket_low(b + 1) } else { lo };
                l.add_n(clock.duration_ns(0, lo + (hi - lo) / 2), n);
            }
            let x = exact.entry(probe - 1).or_insert((0, u64::MAX, 0));
            x.0 = x.0.saturating_add(clock.duration_ns(0, e.sum));
            x.1 = x.1.min(clock.duration_ns(0, e.min));
            x.2 = x.2.max(clock.duration_ns(0, e.max));
        }
    }
    for (probe, (total, min, max)) in exact {
        if let Some(l) = out.get_mut(&probe) {
            l.set_exact(total, min, max);
        }
    }
    out
}

/// Calls counted per (probe entry index, argument value), and the calls no
/// thread's table had room for.
pub fn by_value(region: &Region) -> (HashMap<(u32, u64), u64>, u64) {
    let h = region.header();
    let mut out: HashMap<(u32, u64), u64> = HashMap::new();
    let mut overflow = 0u64;
    for slot in slots_in_use(&h) {
        overflow = overflow.saturating_add(region.get::<AggHead>(h.agg_off(slot)).by_overflow);
        for i in 0..AGG_BY_ENTRIES {
            let e: ByEntry = region.get(by_off(&h, slot, i));
            if e.probe == 0 || e.probe > h.capacity || e.count == 0 {
                continue;
            }
            let n = out.entry((e.probe - 1, e.value)).or_default();
            *n = n.saturating_add(e.count);
        }
    }
    (out, overflow)
}

/// Clears every thread's aggregates, so that a session counts only its
/// own. Call it with the target's threads stopped.
pub fn clear(region: &Region) -> Result<()> {
    let h = region.header();
    let zeros = vec![0u8; crate::probe::layout::AGG_SIZE as usize];
    for slot in slots_in_use(&h) {
        region.write(h.agg_off(slot), &zeros)?;
    }
    Ok(())
}
