//! The processes that hold one data region: a process and the children it
//! forked while probes were in (and theirs). A fork copies the patched
//! code and the mappings, so every such process runs the same probes, maps
//! the region at the same address (and the private area and the arenas),
//! and needs its own restore: its code is its own copy.
//!
//! [`restore_family`] restores a session's probes in every process that
//! holds the region, and unmaps tp's memory from each where nothing uses
//! it any more. The entries are shared, so an entry stays Active while any
//! process still holds its patch ([`remove::remove`]'s sharers): a tp
//! killed midway leaves entries that `tp detach -p PID` can still act on in
//! every process. Hence two passes: restore the code everywhere (children
//! first, then the session's process, then children forked meanwhile),
//! then, with every entry Inactive, unmap where unused.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::layout::Entry;
use super::region::Region;
use super::remove::{self, Kept};
use super::threads::Place;
use crate::notes::Notes;
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};

/// Looks for processes forked meanwhile at most this many times.
const ROUNDS: usize = 8;
/// How long tp keeps trying to unmap its memory from a process whose
/// thread was caught running tp's code (a detour, the runtime). The code
/// is restored, so the thread leaves it as soon as it runs on; on a loaded
/// machine it may not run at all between two looks a few milliseconds
/// apart, so each look waits for the thread to have run first.
const IN_USE_PATIENCE: Duration = Duration::from_secs(1);
/// The longest wait for a thread to run between two looks.
const RUN_WAIT: Duration = Duration::from_millis(200);
/// More looks at a process whose stack holds an address in tp's code.
const STACK_RETRIES: usize = 3;

/// True if process `pid` maps `region` where the target has it: one `stat`
/// of its `/proc/PID/map_files/` entry (a look-up of one mapping), or,
/// without the privilege that needs, a read of its memory map.
pub fn holds(region: &Region, pid: i32) -> bool {
    let range = format!("{:x}-{:x}", region.target_addr(), region.target_addr() + region.len());
    match std::fs::metadata(format!("/proc/{pid}/map_files/{range}")) {
        Ok(m) => m.ino() == region.inode(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            process::read_maps(pid).is_ok_and(|maps| region.is_mapped_in(&maps))
        }
        Err(_) => false,
    }
}

/// Every process but `pid` (and this tp) that holds `region`.
pub fn others(region: &Region, pid: i32) -> Vec<i32> {
    let mut pids: Vec<i32> = process::other_pids().into_iter().filter(|&p| p != pid && holds(region, p)).collect();
    pids.sort();
    pids
}

/// What became of one process of the family at a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its code is restored and tp's memory unmapped.
    Restored,
    /// Its code is restored; tp's memory stays, for the reason given.
    Kept(Kept),
    /// It ended (or exec'd) before tp got to it: nothing to restore.
    Gone,
    /// tp could not restore it.
    Failed(String),
}

/// One process that held the region besides the session's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relative {
    /// The process.
    pub pid: i32,
    /// What the restore did there.
    pub outcome: Outcome,
}

/// How the session's own process came out of [`restore_family`].
#[derive(Debug)]
pub enum Own {
    /// Restored (and tp's memory unmapped unless `kept` says why not);
    /// every thread was stopped for `stop_time`.
    Restored {
        /// Why tp's memory stayed.
        kept: Option<Kept>,
        /// How long all its threads were stopped.
        stop_time: Duration,
    },
    /// It exited before the restore.
    Exited,
    /// It runs another program (exec): its probes went with the old one.
    Execd,
}

/// Restores the probes `select` picks in process `pid` and in every other
/// process that holds `region`, and unmaps tp's memory where it is unused.
/// Returns how `pid` came out and what became of each other process.
/// Warnings go to `notes`.
pub fn restore_family(
    notes: &Arc<dyn Notes>,
    pid: i32,
    mem: &Memory,
    region: &Region,
    select: &dyn Fn(u32, &Entry) -> bool,
) -> Result<(Own, Vec<Relative>)> {
    let mut seen: BTreeSet<i32> = BTreeSet::from([pid]);
    let mut relatives: Vec<Relative> = Vec::new();
    let restore_new = |seen: &mut BTreeSet<i32>, relatives: &mut Vec<Relative>| {
        for _ in 0..ROUNDS {
            let new: Vec<i32> = others(region, pid).into_iter().filter(|p| !seen.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            for p in new {
                seen.insert(p);
                relatives.push(Relative { pid: p, outcome: restore_code(notes, p, region, select) });
            }
        }
    };
    // Children first: while the session's process still has the patch it
    // may fork more, which the next look finds.
    restore_new(&mut seen, &mut relatives);
    let own = restore_own(notes, pid, mem, region, select)?;
    // Forked between the last look and the restore: they hold the patch.
    restore_new(&mut seen, &mut relatives);
    for r in relatives.iter_mut().filter(|r| r.outcome == Outcome::Kept(Kept::LiveProbes)) {
        r.outcome = unmap_if_unused(notes, r.pid, region);
    }
    Ok((own, relatives))
}

/// The other processes that hold `region`, as [`remove::remove`] wants
/// them: whose memory still has a patch keeps its entry live.
fn sharer_memories(region: &Region, pid: i32) -> Vec<Memory> {
    others(region, pid).into_iter().filter_map(|p| Memory::open(p).ok()).collect()
}

/// Restores the session's probes in the session's own process, then
/// unmaps tp's memory there if unused.
fn restore_own(
    notes: &Arc<dyn Notes>,
    pid: i32,
    mem: &Memory,
    region: &Region,
    select: &dyn Fn(u32, &Entry) -> bool,
) -> Result<Own> {
    if !process::is_alive(pid) {
        return Ok(Own::Exited);
    }
    if !holds(region, pid) {
        return Ok(if process::has_exited(pid, Duration::from_millis(100)) { Own::Exited } else { Own::Execd });
    }
    let sharers = sharer_memories(region, pid);
    let stopped = match Stopped::stop(pid, notes.clone()) {
        Ok(s) => s,
        Err(_) if !process::is_alive(pid) => return Ok(Own::Exited),
        Err(e) => return Err(e),
    };
    let done = (|| {
        remove::remove(&**notes, mem, region, &sharers, select)?;
        remove::finish(stopped, mem, region)
    })();
    match done {
        Ok((kept, stop_time)) => Ok(Own::Restored { kept: looked_again(notes, pid, region, kept), stop_time }),
        // The target died under our hands: its counts are still in our mapping.
        Err(_) if process::has_exited(pid, Duration::from_millis(200)) => Ok(Own::Exited),
        Err(e) => Err(e),
    }
}

/// Restores the session's probes in a process of the family; tp's memory
/// stays until the second pass ([`unmap_if_unused`]), since the entries
/// are live until every process is restored.
fn restore_code(notes: &Arc<dyn Notes>, pid: i32, region: &Region, select: &dyn Fn(u32, &Entry) -> bool) -> Outcome {
    let run = || -> Result<Outcome> {
        if !holds(region, pid) {
            return Ok(Outcome::Gone);
        }
        let mem = Memory::open(pid)?;
        let sharers = sharer_memories(region, pid);
        let stopped = Stopped::stop(pid, notes.clone())?;
        let removed = remove::remove(&**notes, &mem, region, &sharers, select);
        stopped.resume();
        removed?;
        Ok(Outcome::Kept(Kept::LiveProbes))
    };
    match run() {
        Ok(o) => o,
        Err(_) if process::has_exited(pid, Duration::from_millis(100)) || !holds(region, pid) => Outcome::Gone,
        Err(e) => Outcome::Failed(format!("{e:#}")),
    }
}

/// Why tp's memory stays in process `pid` after [`remove::finish`] said
/// `kept`: where a thread was in tp's code at that instant (and could not
/// be stepped out), it leaves once it runs: tp looks again, each time
/// once it has run, for up to a second.
pub fn looked_again(notes: &Arc<dyn Notes>, pid: i32, region: &Region, kept: Option<Kept>) -> Option<Kept> {
    let Some(used @ Kept::InUse { .. }) = kept else { return kept };
    match unmap_if_unused(notes, pid, region) {
        Outcome::Restored | Outcome::Gone => None,
        Outcome::Kept(k) => Some(k),
        Outcome::Failed(_) => Some(used),
    }
}

/// The second pass in a process of the family: with every thread stopped,
/// unmaps tp's memory if nothing uses it ([`remove::finish`]); a thread
/// caught running tp's code gets more chances to leave it, each after it
/// ran ([`IN_USE_PATIENCE`]), and a word on a stack a few looks more.
fn unmap_if_unused(notes: &Arc<dyn Notes>, pid: i32, region: &Region) -> Outcome {
    let deadline = std::time::Instant::now() + IN_USE_PATIENCE;
    let mut outcome = unmap_once(notes, pid, region);
    for retry in 0.. {
        let Outcome::Kept(Kept::InUse { tid, place, .. }) = outcome else { break };
        // A thread running tp's code leaves it as soon as it runs; a word
        // on a stack (a call still running through a detour or a
        // trampoline) may stay for as long as the call lasts: a few looks.
        let running = place == Place::Pc;
        if std::time::Instant::now() >= deadline || (!running && retry >= STACK_RETRIES) {
            break;
        }
        match running {
            true => process::wait_until_run(pid, tid, RUN_WAIT),
            false => std::thread::sleep(Duration::from_millis(10)),
        }
        outcome = unmap_once(notes, pid, region);
    }
    outcome
}

fn unmap_once(notes: &Arc<dyn Notes>, pid: i32, region: &Region) -> Outcome {
    let run = || -> Result<Outcome> {
        if !holds(region, pid) {
            return Ok(Outcome::Gone);
        }
        let mem = Memory::open(pid)?;
        let stopped = Stopped::stop(pid, notes.clone())?;
        let (kept, _) = remove::finish(stopped, &mem, region)?;
        Ok(match kept {
            None => Outcome::Restored,
            Some(k) => Outcome::Kept(k),
        })
    };
    match run() {
        Ok(o) => o,
        Err(_) if process::has_exited(pid, Duration::from_millis(100)) => Outcome::Gone,
        Err(e) => Outcome::Failed(format!("{e:#}")),
    }
}
