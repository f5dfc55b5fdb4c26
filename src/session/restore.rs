//! Restoring the original code of every tp probe in a process (or in
//! every process that has some) outside any session, using only what the
//! target's data region records, so it works after the tracer that
//! attached was killed: the engine of `tp detach`.
//!
//! It removes probes kept with `--keep` and probes whose session died, but
//! leaves the probes of a `tp attach` (or `tp profile`) that is still
//! running: that session restores them itself when it ends. A process whose
//! only probes are a running session's is not even stopped; the line
//! says whose they are. `force` removes them too.
//!
//! Over every process (no PID named), one that it cannot clean (a region
//! that fails validation, a process that vanished) is reported in one line
//! while the others are cleaned. [`code_is_original`] says whether a
//! process's functions are their file's again.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use crate::escape::text;
use crate::notes::Notes;
use crate::output::thousands;
use crate::probe::layout::kind;
use crate::probe::region::{self, Region};
use crate::probe::remove::{self, Kept};
use crate::probe::{family, orphan};
use crate::process;
use crate::process::memory::Memory;
use crate::process::stop::Stopped;

use super::installed;
use super::kept::session_is_running;

/// Removes the probes of process `pid`, or of every process that holds
/// some when `pid` is None; `force` removes those of running sessions too.
/// Says to `notes` what it removed from each process and, in one line, why
/// one could not be cleaned; false when one could not.
pub fn detach(notes: &Arc<dyn Notes>, pid: Option<i32>, force: bool) -> Result<bool> {
    super::interrupt::install();
    let pids = match pid {
        Some(pid) => {
            process::status(pid)?;
            process::check_readable(pid)?;
            vec![pid]
        }
        None => {
            let scan = installed::scan();
            if scan.pids.is_empty() {
                crate::note!(notes, "tp: {}", scan.nothing_found());
            }
            scan.pids
        }
    };
    let scope = Scope { named: pid.is_some(), force };
    let mut failed = false;
    for pid in pids {
        match detach_one(notes, pid, scope) {
            Ok(()) => {}
            // It died under our hands: its code is gone with it.
            Err(_) if process::has_exited(pid, std::time::Duration::from_millis(200)) => {
                crate::note!(notes, "tp: process {pid} exited; nothing left to restore");
            }
            Err(e) => {
                let e = format!("{e:#}");
                let e = e.strip_prefix(&format!("process {pid}: ")).unwrap_or(&e);
                crate::note!(notes, "tp: process {pid}: {}", text(e));
                failed = true;
            }
        }
    }
    Ok(!failed)
}

/// What this `tp detach` may do.
#[derive(Debug, Clone, Copy)]
struct Scope {
    /// The user named the process (`-p`).
    named: bool,
    /// Remove the probes of running sessions too.
    force: bool,
}

/// The running tp sessions that own entries of `region`, each with the
/// names of its probes.
fn live_sessions(region: &Region) -> BTreeMap<u32, Vec<String>> {
    let mut sessions: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut running: BTreeMap<u32, bool> = BTreeMap::new();
    for (_, e) in region.entries() {
        let live = *running.entry(e.owner).or_insert_with(|| session_is_running(e.owner));
        if e.state() != crate::probe::layout::State::Free && live {
            let names = sessions.entry(e.owner).or_default();
            if e.state().maybe_patched() && e.kind & crate::probe::layout::kind::OWN == 0 {
                names.push(format!("`{}`", e.name()));
            }
        }
    }
    sessions
}

/// `tp session 12 (`foo`, `bar`)` for each session.
fn describe(sessions: &BTreeMap<u32, Vec<String>>) -> String {
    let each: Vec<String> = sessions
        .iter()
        .map(|(pid, names)| match names.len() {
            0 => format!("tp session {pid}"),
            1..=4 => format!("tp session {pid} ({})", names.join(", ")),
            n => format!("tp session {pid} ({}, and {} more)", names[..3].join(", "), n - 3),
        })
        .collect();
    each.join(", ")
}

/// Releases what a tp killed while creating the data region left (see
/// [`orphan`]), in a process without a region.
fn release_orphans(notes: &Arc<dyn Notes>, pid: i32) -> Result<()> {
    let mem = Memory::open(pid)?;
    let maps = process::read_maps(pid)?;
    if orphan::find(pid, &maps, &mem).is_empty() {
        crate::note!(notes, "tp: process {pid} has no tp probes");
        return Ok(());
    }
    process::check_attachable(pid)?;
    // A tp creating or unmapping a region holds the target: once we hold
    // it, what looks orphaned is.
    let mut stopped = Stopped::stop(pid, notes.clone())?;
    let maps = process::read_maps(pid)?;
    let mut orphans = orphan::find(pid, &maps, &mem);
    orphan::keep_referenced(&stopped, &mem, &maps, &mut orphans)?;
    if region::find(&maps).is_some() || orphans.is_empty() {
        crate::note!(notes, "tp: process {pid} has no tp probes to remove");
        return Ok(());
    }
    stopped.release_all_but_worker();
    orphan::release(&mut stopped, &mem, &maps, &orphans)?;
    stopped.resume();
    crate::note!(
        notes,
        "tp: detached from {pid}: released what a killed tp left (code arenas: {}, descriptors: {}, private areas: {})",
        orphans.arenas.len(),
        orphans.fds.len(),
        orphans.privates.len()
    );
    Ok(())
}

/// Up to this many probes are listed one line each; more are summed up.
const LISTED: usize = 12;

/// One line per probe removed, or, after a probe-all, a few lines: how many
/// were restored with how many hits, the busiest, and the ones left changed.
fn report_removed(notes: &dyn Notes, pid: i32, removed: &[remove::Removed]) {
    let line = |r: &remove::Removed| {
        let what = if r.restored { "restored" } else { "left changed" };
        format!("tp: {pid}: {what} `{}` ({} hits)", text(&r.entry.name()), thousands(r.hits))
    };
    if removed.len() <= LISTED {
        for r in removed {
            crate::note!(notes, "{}", line(r));
        }
        return;
    }
    let restored: Vec<&remove::Removed> = removed.iter().filter(|r| r.restored).collect();
    let mut busiest = restored.clone();
    busiest.sort_by_key(|r| std::cmp::Reverse(r.hits));
    let top: Vec<String> = busiest
        .iter()
        .take(5)
        .filter(|r| r.hits > 0)
        .map(|r| format!("`{}` ({})", text(&r.entry.name()), thousands(r.hits)))
        .collect();
    let called = restored.iter().filter(|r| r.hits > 0).count();
    crate::note!(
        notes,
        "tp: {pid}: restored {} probes, {} of them called ({} hits in all){}{}",
        thousands(restored.len() as u64),
        thousands(called as u64),
        thousands(restored.iter().map(|r| r.hits).sum()),
        if top.is_empty() { "" } else { "; the most called: " },
        top.join(", ")
    );
    let changed: Vec<&remove::Removed> = removed.iter().filter(|r| !r.restored).collect();
    for r in changed.iter().take(LISTED) {
        crate::note!(notes, "{}", line(r));
    }
    if changed.len() > LISTED {
        crate::note!(notes, "tp: {pid}: and {} more left changed", changed.len() - LISTED);
    }
}

fn detach_one(notes: &Arc<dyn Notes>, pid: i32, scope: Scope) -> Result<()> {
    let maps = process::read_maps(pid)?;
    let Some(mapping) = region::find(&maps) else {
        return release_orphans(notes, pid);
    };
    process::check_attachable(pid)?;
    let region = Region::open(pid, mapping)?;
    let spare = |owner: u32| !scope.force && session_is_running(owner);
    let sessions = if scope.force { BTreeMap::new() } else { live_sessions(&region) };
    let removable = region.entries().iter().any(|(_, e)| e.state().maybe_patched() && !spare(e.owner));
    if !sessions.is_empty() && !removable {
        // Nothing for this tp to do: the sessions restore their own probes.
        let whose = describe(&sessions);
        if scope.named {
            bail!(
                "its probes belong to {whose}, still running; end that session (Ctrl-C, or `kill -INT PID`) \
                 or remove them anyway with `tp detach -p {pid} --force`"
            );
        }
        crate::note!(notes, "tp: process {pid}: left alone: its probes belong to {}, still running", text(&whose));
        return Ok(());
    }
    let mem = Memory::open(pid)?;
    let sharer_pids = family::others(&region, pid);
    let sharers: Vec<Memory> = sharer_pids.iter().filter_map(|&p| Memory::open(p).ok()).collect();
    let stopped = Stopped::stop(pid, notes.clone())?;
    let removed =
        remove::remove(&**notes, &mem, &region, &sharers, |_, e| !spare(e.owner)).context("restoring the code")?;
    let (kept, stop_time) = remove::finish(stopped, &mem, &region)?;
    let kept = family::looked_again(notes, pid, &region, kept);
    // tp's own sites (a function's exits, the unwinder's, the rendezvous)
    // are said only where one could not be restored.
    let removed: Vec<remove::Removed> =
        removed.into_iter().filter(|r| r.entry.kind & kind::OWN == 0 || !r.restored).collect();
    report_removed(notes, pid, &removed);
    let memory = match kept {
        None => "tp's memory unmapped".to_string(),
        Some(Kept::LiveProbes) => "tp's memory kept (probes left)".to_string(),
        Some(ref used @ Kept::InUse { .. }) => format!(
            "tp's memory kept: {} (run `tp detach -p {pid}` again to remove it)",
            used.in_use().unwrap_or_default()
        ),
        Some(Kept::Gone) => "tp's memory already unmapped".to_string(),
        Some(ref used @ Kept::Tracing { .. }) => format!(
            "tp's memory kept: {} (run `tp detach -p {pid}` again to remove it)",
            used.in_use().unwrap_or_default()
        ),
    };
    crate::note!(
        notes,
        "tp: detached from {pid}: {} probe{} removed, {memory} (target stopped {} µs)",
        removed.len(),
        if removed.len() == 1 { "" } else { "s" },
        stop_time.as_micros()
    );
    let live_elsewhere = region.entries().iter().any(|(_, e)| e.state().maybe_patched());
    if live_elsewhere && !sharer_pids.is_empty() {
        let list: Vec<String> = sharer_pids.iter().map(|p| p.to_string()).collect();
        crate::note!(
            notes,
            "tp: process {pid} shares its probes with {} (forked while they were in); `tp detach -p PID` removes them there",
            list.join(", ")
        );
    }
    if !sessions.is_empty() {
        let whose = describe(&sessions);
        if scope.named {
            bail!("left the probes of {whose}, still running; `tp detach -p {pid} --force` removes them too");
        }
        crate::note!(notes, "tp: process {pid}: left the probes of {}, still running", text(&whose));
    }
    Ok(())
}

/// True if the code of each of `funcs` (functions of its executable) in
/// process `pid` is byte for byte its code in the file: nothing of a probe
/// is left in it (`tp demo` checks it after the session).
pub fn code_is_original(pid: i32, funcs: &[String]) -> Result<bool> {
    let maps = process::read_maps(pid)?;
    let modules = crate::symbols::ProcessModules::new(pid, &maps)?;
    let module = modules.main()?;
    let mem = Memory::open(pid)?;
    for name in funcs {
        let f = module.function(name)?;
        if mem.read_vec(f.addr.0, f.size as usize)? != module.code_of(&f)? {
            return Ok(false);
        }
    }
    Ok(true)
}
