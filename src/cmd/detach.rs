//! `tp detach`: restore the original code of every tp probe in a process
//! (or in every process that has some), using only what the target's data
//! region records, so it works after the tracer that attached was killed.
//!
//! With `-p PID` every probe of that process goes. Without it, tp cleans up
//! probes kept with `--keep` and probes whose session died, but leaves the
//! probes of a `tp attach` that is still running: that session restores
//! them itself when it ends.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::cli::DetachArgs;
use crate::output::thousands;
use crate::probe::orphan;
use crate::probe::region::{self, Region};
use crate::probe::remove::{self, Kept};
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::session::session_is_running;

/// Runs `tp detach`.
pub fn run(args: DetachArgs) -> Result<ExitCode> {
    crate::session::interrupt::install();
    let (pids, spare_live_sessions) = match args.pid {
        Some(pid) => {
            process::status(pid)?;
            process::check_readable(pid)?;
            (vec![pid], false)
        }
        None => (processes_with_probes(), true),
    };
    if pids.is_empty() {
        eprintln!("tp: no process holds tp probes");
    }
    let mut failed = false;
    for pid in pids {
        match detach_one(pid, spare_live_sessions) {
            Ok(()) => {}
            // It died under our hands: its code is gone with it.
            Err(_) if process::has_exited(pid, std::time::Duration::from_millis(200)) => {
                eprintln!("tp: process {pid} exited; nothing left to restore");
            }
            Err(e) => {
                eprintln!("tp: process {pid}: {e:#}");
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Every process whose memory map shows a tp data region.
fn processes_with_probes() -> Vec<i32> {
    let mut pids: Vec<i32> = process::other_pids()
        .into_iter()
        .filter(|&pid| {
            process::read_maps(pid).is_ok_and(|m| region::find(&m).is_some_and(|r| Region::open(pid, r).is_ok()))
        })
        .collect();
    pids.sort();
    pids
}

/// Releases what a tp killed while creating the data region left (see
/// [`orphan`]), in a process without a region.
fn release_orphans(pid: i32) -> Result<()> {
    let mem = Memory::open(pid)?;
    let maps = process::read_maps(pid)?;
    if orphan::find(pid, &maps, &mem).is_empty() {
        eprintln!("tp: process {pid} has no tp probes");
        return Ok(());
    }
    process::check_attachable(pid)?;
    // A tp creating or unmapping a region holds the target: once we hold
    // it, what looks orphaned is.
    let mut stopped = Stopped::stop(pid)?;
    let maps = process::read_maps(pid)?;
    let mut orphans = orphan::find(pid, &maps, &mem);
    orphan::keep_referenced(&stopped, &mem, &maps, &mut orphans)?;
    if region::find(&maps).is_some() || orphans.is_empty() {
        eprintln!("tp: process {pid} has no tp probes to remove");
        return Ok(());
    }
    stopped.release_all_but_worker();
    orphan::release(&mut stopped, &mem, &maps, &orphans)?;
    stopped.resume();
    eprintln!(
        "tp: detached from {pid}: released what a killed tp left (code arenas: {}, descriptors: {})",
        orphans.arenas.len(),
        orphans.fds.len()
    );
    Ok(())
}

fn detach_one(pid: i32, spare_live_sessions: bool) -> Result<()> {
    let maps = process::read_maps(pid)?;
    let Some(mapping) = region::find(&maps) else {
        return release_orphans(pid);
    };
    process::check_attachable(pid)?;
    let region = Region::open(pid, mapping)?;
    let mem = Memory::open(pid)?;
    let sharer_pids = region::sharers(&region, pid);
    let sharers: Vec<Memory> = sharer_pids.iter().filter_map(|&p| Memory::open(p).ok()).collect();
    let stopped = Stopped::stop(pid)?;
    let removed = remove::remove(&mem, &region, &sharers, |_, e| !(spare_live_sessions && session_is_running(e.owner)))
        .context("restoring the code")?;
    let (kept, stop_time) = remove::finish(stopped, &mem, &region)?;
    for r in &removed {
        eprintln!(
            "tp: {pid}: {} `{}` ({} hits)",
            if r.restored { "restored" } else { "left changed" },
            r.entry.name(),
            thousands(r.hits)
        );
    }
    let memory = match kept {
        None => "tp's memory unmapped".to_string(),
        Some(Kept::LiveProbes) => "tp's memory kept (probes left)".to_string(),
        Some(Kept::InUse { tid }) => format!("tp's memory kept: thread {tid} still refers to it"),
        Some(Kept::Gone) => "tp's memory already unmapped".to_string(),
    };
    eprintln!(
        "tp: detached from {pid}: {} probes removed, {memory} (target stopped {} µs)",
        removed.len(),
        stop_time.as_micros()
    );
    if kept == Some(Kept::LiveProbes) && !sharer_pids.is_empty() {
        let list: Vec<String> = sharer_pids.iter().map(|p| p.to_string()).collect();
        eprintln!(
            "tp: process {pid} shares its probes with {} (forked while they were in); `tp detach -p PID` removes them there",
            list.join(", ")
        );
    }
    Ok(())
}
