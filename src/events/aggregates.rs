//! What the runtime keeps in the target instead of sending events: each
//! thread's latency histograms of return probes whose events nobody reads
//! (`--ret -q`), its counts of calls by an argument's value (`--by`) and
//! its aggregates of a value (`--agg`), after its ring in the data region
//! ([`crate::probe::layout::AggHead`]). Each table is one slot's, and each
//! entry of `--by` and `--agg` names the thread that made it (its PID and
//! TID), which keys them by thread and process. Read here, summed over the
//! threads, and cleared when a session starts (but for kept probes').
//! The target can write these tables: a probe index past the region's
//! capacity is skipped, a count is taken as it is (it only changes what is
//! reported).

use std::collections::{HashMap, HashSet};

use anyhow::Result;

use super::clock::Clock;
use super::stats::Latency;
use crate::probe::layout::{
    AGG_BY_ENTRIES, AGG_LAT_ENTRIES, AGG_VAL_ENTRIES, AggEntry, AggHead, ByEntry, Header, LAT_BUCKETS, LatEntry, Plain,
    STACK_KEY_DEPTH, StackKey, lat_bucket_low, stack_hash,
};
use crate::probe::region::Region;

/// The buckets of an aggregate's histogram, and the bucket of a value.
pub use crate::probe::layout::{AGG_HIST_BUCKETS, agg_bucket};

/// Offsets of the thread slots some thread has claimed (as the drainer reads them).
fn slots_in_use(h: &Header) -> Vec<u64> {
    (0..1u64 << h.ctx.slot_bits)
        .filter(|&i| h.ctx.claimed[(i / 64) as usize] & (1 << (i % 64)) != 0)
        .map(|i| h.slot_off(i))
        .collect()
}

/// The entries of a thread slot's table of `n` (entry `i` at `off(i)`)
/// that counted calls, each with its probe's entry index (`probe_count`
/// reads an entry's probe word and count): a probe word of 0 (a free
/// entry) or past the capacity (the words are the target's to write)
/// names no probe.
fn counted<T: Plain>(
    region: &Region,
    h: &Header,
    n: usize,
    off: impl Fn(usize) -> u64,
    probe_count: fn(&T) -> (u32, u64),
) -> Vec<(u32, T)> {
    (0..n)
        .filter_map(|i| {
            let e: T = region.get(off(i));
            let (probe, count) = probe_count(&e);
            (probe != 0 && probe <= h.capacity && count != 0).then(|| (probe - 1, e))
        })
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
        let entries = counted(region, &h, AGG_LAT_ENTRIES, |i| lat_off(&h, slot, i), |e: &LatEntry| (e.probe, e.count));
        for (probe, e) in entries {
            let l = out.entry(probe).or_default();
            for (b, &n) in e.buckets.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let lo = lat_bucket_low(b);
                let hi = if b + 1 < LAT_BUCKETS { lat_bucket_low(b + 1) } else { lo };
                l.add_n(clock.duration_ns(0, lo + (hi - lo) / 2), n);
            }
            let x = exact.entry(probe).or_insert((0, u64::MAX, 0));
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
        for (probe, e) in counted(region, &h, AGG_BY_ENTRIES, |i| by_off(&h, slot, i), |e: &ByEntry| (e.probe, e.count))
        {
            let n = out.entry((probe, e.value)).or_default();
            *n = n.saturating_add(e.count);
        }
    }
    (out, overflow)
}

fn value_off(h: &Header, slot: u64, i: usize) -> u64 {
    by_off(h, slot, AGG_BY_ENTRIES) + (i * std::mem::size_of::<AggEntry>()) as u64
}

fn stack_key_off(h: &Header, slot: u64, i: usize) -> u64 {
    value_off(h, slot, AGG_VAL_ENTRIES) + (i * std::mem::size_of::<StackKey>()) as u64
}

/// The frames of the `--by stack` keys in the threads' tables of
/// aggregates, by key (return addresses, the call's own first). A key's
/// frames are taken only where they hash to it ([`stack_hash`]) and the
/// entry beside them holds it: the target can write the store, and a
/// key whose frames are not there (or not whole) is shown by its hash.
pub fn stack_keys(region: &Region) -> HashMap<u64, Vec<u64>> {
    let h = region.header();
    let mut out = HashMap::new();
    for slot in slots_in_use(&h) {
        for i in 0..AGG_VAL_ENTRIES {
            let e: AggEntry = region.get(value_off(&h, slot, i));
            if e.probe == 0 || out.contains_key(&e.key) {
                continue;
            }
            let k: StackKey = region.get(stack_key_off(&h, slot, i));
            let Some(frames) =
                usize::try_from(k.n).ok().filter(|n| (1..=STACK_KEY_DEPTH).contains(n)).map(|n| &k.frames[..n])
            else {
                continue;
            };
            if k.hash == e.key && stack_hash(frames) == k.hash {
                out.insert(k.hash, frames.to_vec());
            }
        }
    }
    out
}

/// The owners of the thread slots, by slot offset, as last seen claimed:
/// tp frees the slots of a process that ended or detached (their key
/// becomes 0), and its aggregates are read after that.
#[derive(Debug, Clone, Default)]
pub struct Owners(HashMap<u64, u64>);

impl Owners {
    /// Notes the owner of every claimed slot that has one now.
    pub fn note(&mut self, region: &Region) {
        let h = region.header();
        for slot in slots_in_use(&h) {
            let key = region.load_u64(slot);
            if key != 0 {
                self.0.insert(slot, key);
            }
        }
    }

    /// The thread that owns `slot`: its PID and TID (as the thread wrote
    /// them), or as last noted if the slot was freed since.
    fn of(&self, region: &Region, slot: u64) -> (u32, u32) {
        let key = match region.load_u64(slot) {
            0 => self.0.get(&slot).copied().unwrap_or(0),
            key => key,
        };
        split(key)
    }

    /// The thread that made an entry of `slot`'s tables: the owner the
    /// entry names (`ByEntry::owner`, `AggEntry::owner`: the slot's key
    /// when the thread made it, so a thread that took over the slot of one
    /// that ended has entries of its own), or the slot's owner for an
    /// entry that names none.
    fn of_entry(&self, region: &Region, slot: u64, owner: u64) -> (u32, u32) {
        match owner {
            0 => self.of(region, slot),
            key => split(key),
        }
    }
}

/// A slot's key as its PID and TID.
fn split(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

/// One thread's count of a probe's calls with one argument value (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCount {
    /// The thread's process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// The probe's entry index.
    pub probe: u32,
    /// The argument's value.
    pub value: u64,
    /// Calls.
    pub count: u64,
}

/// Calls counted per thread, probe and argument value (`--by`), and the
/// calls no thread's table had room for.
pub fn by_thread(region: &Region, owners: &Owners) -> (Vec<ThreadCount>, u64) {
    let h = region.header();
    let mut out = Vec::new();
    let mut overflow = 0u64;
    for slot in slots_in_use(&h) {
        overflow = overflow.saturating_add(region.get::<AggHead>(h.agg_off(slot)).by_overflow);
        for i in 0..AGG_BY_ENTRIES {
            let e: ByEntry = region.get(by_off(&h, slot, i));
            if e.probe == 0 || e.probe > h.capacity || e.count == 0 {
                continue;
            }
            let (pid, tid) = owners.of_entry(region, slot, e.owner);
            out.push(ThreadCount { pid, tid, probe: e.probe - 1, value: e.value, count: e.count });
        }
    }
    (out, overflow)
}

/// One thread's aggregate of a probe's values under one key (`--agg`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadAggregate {
    /// The thread's process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// The probe's entry index.
    pub probe: u32,
    /// As the thread kept it.
    pub entry: AggEntry,
}

/// What the threads' tables of aggregates hold: each aggregate, the calls
/// no table had room for, and the calls whose value could not be read.
pub fn values(region: &Region, owners: &Owners) -> (Vec<ThreadAggregate>, u64, u64) {
    let h = region.header();
    let mut out = Vec::new();
    let (mut overflow, mut unreadable) = (0u64, 0u64);
    for slot in slots_in_use(&h) {
        let head: AggHead = region.get(h.agg_off(slot));
        overflow = overflow.saturating_add(head.agg_overflow);
        unreadable = unreadable.saturating_add(head.agg_unreadable);
        let entries =
            counted(region, &h, AGG_VAL_ENTRIES, |i| value_off(&h, slot, i), |e: &AggEntry| (e.probe, e.count));
        for (probe, entry) in entries {
            let (pid, tid) = owners.of_entry(region, slot, entry.owner);
            out.push(ThreadAggregate { pid, tid, probe, entry });
        }
    }
    (out, overflow, unreadable)
}

/// Clears every thread's aggregates, so that a session counts only its
/// own, but for the entries of probes kept in the process (`--keep`: no
/// session owns them, and `tp status` reads what they kept). Call it with
/// the target's threads stopped. An entry cleared in the middle of a
/// table's run of taken entries may make a thread start a second entry for
/// a kept probe's key after it: tp adds the two up as it adds up threads.
pub fn clear(region: &Region) -> Result<()> {
    let h = region.header();
    let kept: HashSet<u32> = region
        .entries()
        .into_iter()
        .filter(|(_, e)| e.owner == 0 && e.state().maybe_patched())
        .map(|(i, _)| i + 1)
        .collect();
    let zeros = vec![0u8; crate::probe::layout::AGG_SIZE as usize];
    for slot in slots_in_use(&h) {
        if kept.is_empty() {
            region.write(h.agg_off(slot), &zeros)?;
            continue;
        }
        region.write(h.agg_off(slot), &zeros[..size_of::<AggHead>()])?;
        clear_unkept(region, AGG_LAT_ENTRIES, |i| lat_off(&h, slot, i), |e: &LatEntry| e.probe, &kept)?;
        clear_unkept(region, AGG_BY_ENTRIES, |i| by_off(&h, slot, i), |e: &ByEntry| e.probe, &kept)?;
        clear_unkept(region, AGG_VAL_ENTRIES, |i| value_off(&h, slot, i), |e: &AggEntry| e.probe, &kept)?;
    }
    Ok(())
}

/// Zeroes the entries of a table of `n` (entry `i` at `off(i)`) whose
/// probe word (`probe`) is not one of `kept`.
fn clear_unkept<T: Plain>(
    region: &Region,
    n: usize,
    off: impl Fn(usize) -> u64,
    probe: fn(&T) -> u32,
    kept: &HashSet<u32>,
) -> Result<()> {
    let zeros = vec![0u8; size_of::<T>()];
    for i in 0..n {
        let e: T = region.get(off(i));
        if !kept.contains(&probe(&e)) {
            region.write(off(i), &zeros)?;
        }
    }
    Ok(())
}
