//! The floor, measured in the same run: what counting a call costs at best
//! on this machine right now (targets/floor.c: a tiny function called by 1
//! and 2 threads, plain, with a plain `inc` of a thread-local counter as
//! tp's detour counts in the thread's row, with a per-thread `lock inc` as
//! it did before, with one shared `lock inc`), and one `rdtsc`; and what
//! an event costs at best: an `rdtsc` and a 64-byte event written to a
//! ring, the same with the ring found through four dependent loads (as
//! tp's detours found a thread's until issue 17's third round; an `rdtsc`
//! keeps such a chain from overlapping the next call), through three (as
//! they find it now), through one (a block of the thread's own at a fixed
//! offset from its thread pointer, as a segment register tp owned in each
//! thread would give), a return taken over
//! (returning through a stub), and both with a second `rdtsc` (an exit with
//! its latency). On a shared, noisy machine
//! tp's rows are read against these.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::env::Env;
use crate::proc::{Proc, kv_f64};

/// One run of the floor program.
#[derive(Debug, Clone, Default)]
pub struct Floor {
    /// ns per call per thread, for 1 and 2 threads: plain, per-thread slot, shared counter.
    pub plain: [f64; 2],
    /// With a plain increment of a thread-local counter.
    pub own: [f64; 2],
    /// With a `lock inc` of a per-thread counter slot.
    pub slot: [f64; 2],
    /// With one shared counter.
    pub shared: [f64; 2],
    /// One rdtsc, ns.
    pub rdtsc: f64,
    /// Extra ns per call (1 thread) for one rdtsc and a 64-byte event.
    pub event: f64,
    /// The same, with the ring found through a cache entry, a thread
    /// state and a ring slot.
    pub found: f64,
    /// The same, with the ring found through a cache entry's ring slot.
    pub now: f64,
    /// The same, with the ring in a block at a fixed offset from the
    /// thread pointer.
    pub owned: f64,
    /// Extra ns per call for a return taken over.
    pub hijack: f64,
    /// Extra ns per call for a return taken over, two rdtsc and an event.
    pub timed: f64,
}

/// Runs the floor program once.
pub fn measure(env: &Env) -> Result<Floor> {
    let calls = if env.smoke { "200000" } else { "20000000" };
    let mut p = Proc::spawn("floor", &env.target("floor"), &[calls.to_string()], false)?;
    let mut f = Floor::default();
    for t in 0..2 {
        let l = p.wait_prefix("floor threads=", Duration::from_secs(120))?;
        let get = |k: &str| kv_f64(&l.text, k).with_context(|| format!("no {k} in `{}`", l.text));
        f.plain[t] = get("plain")?;
        f.own[t] = get("own")?;
        f.slot[t] = get("slot")?;
        f.shared[t] = get("shared")?;
    }
    let l = p.wait_prefix("floor rdtsc=", Duration::from_secs(60))?;
    f.rdtsc = kv_f64(&l.text, "rdtsc").context("no rdtsc")?;
    let l = p.wait_prefix("floor event=", Duration::from_secs(60))?;
    let get = |k: &str| kv_f64(&l.text, k).with_context(|| format!("no {k} in `{}`", l.text));
    (f.event, f.found, f.now, f.owned) = (get("event")?, get("found")?, get("now")?, get("owned")?);
    (f.hijack, f.timed) = (get("hijack")?, get("timed")?);
    p.wait_exit(Duration::from_secs(10));
    Ok(f)
}
