//! Attach and detach at scale, and the memory tp leaves in the target:
//! `tp attach` on 1, 100, 1,000 and 10,000 functions of the `many` target
//! (targets/many.c, which calls every one of them each millisecond), timed
//! from the command's start to its `attached` line, with the stop windows tp
//! reports; then Ctrl-C, timed to its `detached` line (tp checks for it
//! every 20 ms). While attached, the injected code and data are read from
//! the target's data region and /proc/PID/smaps.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::hit::open_region;
use crate::proc::{Proc, kv, number_before};

/// The probe counts measured, and the glob that selects each in `many`.
pub const SIZES: [(usize, &str); 4] = [(1, "fn0000"), (100, "fn00*"), (1000, "fn0*"), (10_000, "fn*")];

/// One attach/detach cycle.
#[derive(Debug, Clone, Default)]
pub struct Cycle {
    /// `tp attach` start → its `attached` line, ms.
    pub attach_wall_ms: f64,
    /// tp's own attach time, ms.
    pub attach_tp_ms: f64,
    /// All threads stopped, µs (tp's report).
    pub attach_stop_us: f64,
    /// The worker thread stopped for the injection, µs (tp's report).
    pub worker_us: f64,
    /// SIGINT to the session → its `detached` line, ms.
    pub detach_wall_ms: f64,
    /// All threads stopped for the detach, µs.
    pub detach_stop_us: f64,
    /// Memory, read while attached.
    pub memory: Memory,
}

/// tp's memory in the target.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// Bytes of detour code of this session's probes.
    pub detour_bytes: u64,
    /// Bytes used in the code arenas (detours and runtime blocks).
    pub arena_used: u64,
    /// Bytes mapped for code arenas.
    pub arena_mapped: u64,
    /// Bytes of the data region (virtual).
    pub region_bytes: u64,
    /// Bytes of the data region that are resident.
    pub region_rss: u64,
    /// Bytes the region reserves per probe (entry, enable flag, sample
    /// budget and period, a counter and a sampling countdown per row).
    pub data_per_probe: u64,
}

/// Runs one cycle with the `probes`-function glob `glob`.
pub fn cycle(env: &Env, probes: usize, glob: &str) -> Result<Cycle> {
    let mut target = Proc::spawn("many", &env.target("many"), &["300".to_string()], false)?;
    target.wait_prefix("ready", Duration::from_secs(30))?;
    let pid = target.pid();
    let args: Vec<String> = ["attach", "-p", &pid.to_string(), "-f", glob, "-q", "--json"].map(String::from).into();
    let mut session = Proc::spawn("tp attach", &env.tp, &args, false)?;
    let line = session.wait_prefix("tp: attached", Duration::from_secs(300))?;
    let attach_wall_ms = line.at.duration_since(session.started).as_secs_f64() * 1e3;
    let n: usize = line.text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).context("probe count")?;
    if n != probes {
        bail!("tp attached {n} probes, expected {probes}: {}", line.text);
    }
    let num = |after: &str, unit: &str| {
        number_before(&line.text, after, unit).with_context(|| format!("no `{after}` in `{}`", line.text))
    };
    let (attach_tp_ms, attach_stop_us, worker_us) =
        (num(" in ", " ms")?, num("target stopped", " µs")?, num("one thread", " µs")?);
    let memory = memory(pid, session.pid() as u32).context("reading tp's memory in the target")?;
    // Every function runs each millisecond: let each probe count some calls.
    std::thread::sleep(Duration::from_millis(100));

    // Ctrl-C ends the session: tp removes its probes and prints the counts.
    let started = Instant::now();
    session.signal(libc::SIGINT);
    let done = session.wait_prefix("tp: detached from", Duration::from_secs(300))?;
    let detach_wall_ms = done.at.duration_since(started).as_secs_f64() * 1e3;
    let detach_stop_us = number_before(&done.text, "target stopped", " µs").context("detach stop time")?;
    if !session.wait_exit(Duration::from_secs(60)).is_some_and(|s| s.success()) {
        bail!("tp attach failed:\n{}", session.text());
    }
    check_counts(&session, probes)?;
    target.signal(libc::SIGUSR1);
    let exit = target.wait_prefix("exit", Duration::from_secs(30))?;
    if kv(&exit.text, "checksum") != Some("ok") {
        bail!("the target computed wrong results while probed: {}", exit.text);
    }
    Ok(Cycle { attach_wall_ms, attach_tp_ms, attach_stop_us, worker_us, detach_wall_ms, detach_stop_us, memory })
}

/// Every probe counted calls (the target calls each function every ms).
pub fn check_counts(session: &Proc, probes: usize) -> Result<()> {
    let json = session.seen.iter().rev().find(|l| !l.stderr && l.text.starts_with('{')).context("no summary")?;
    let v: serde_json::Value = serde_json::from_str(&json.text).context("tp's JSON summary")?;
    let list = v["processes"][0]["probes"].as_array().context("no probes in the summary")?;
    let zero = list.iter().filter(|p| p["hits"].as_u64().unwrap_or(0) == 0).count();
    if list.len() != probes || zero > 0 {
        bail!("{} probes in the summary, {zero} of them without hits (expected {probes}, all hit)", list.len());
    }
    Ok(())
}

/// tp's code and data in process `pid`, for the probes owned by `owner`.
pub fn memory(pid: i32, owner: u32) -> Result<Memory> {
    let region = open_region(pid)?;
    let h = region.header();
    let detour_bytes =
        region.entries().iter().filter(|(_, e)| e.owner == owner).map(|(_, e)| u64::from(e.detour_len)).sum();
    let arenas = &h.arenas[..h.arena_count as usize];
    let rows = 1u64 << h.slot_bits;
    Ok(Memory {
        detour_bytes,
        arena_used: arenas.iter().map(|a| a.used).sum(),
        arena_mapped: arenas.iter().map(|a| a.size).sum(),
        region_bytes: region.len(),
        region_rss: rss(pid, region.target_addr())?,
        data_per_probe: tp::probe::layout::ENTRY_SIZE + 1 + 4 + 4 + rows * 16,
    })
}

/// Resident bytes of the mapping of `pid` that starts at `addr`.
fn rss(pid: i32, addr: u64) -> Result<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut inside = false;
    for l in smaps.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if let Some((start, _)) = first.split_once('-')
            && let Ok(start) = u64::from_str_radix(start, 16)
            && !first.contains(':')
        {
            inside = start == addr;
            continue;
        }
        if inside && let Some(kb) = l.strip_prefix("Rss:") {
            return Ok(kb.trim().trim_end_matches("kB").trim().parse::<u64>()? * 1024);
        }
    }
    bail!("no mapping at {addr:#x} in /proc/{pid}/smaps")
}
