//! The probes installed in a process, read from its data region without
//! stopping it: what `tp status` prints and `tp serve` exposes. Kept probes
//! (`--keep`) and those of a running session alike: counts, and the
//! latency threads keep in the target (`--ret --keep`); latency sent as
//! events exists only in the session that drains them. tp's own probes
//! (the unwinder's, a function's exits, the rendezvous) are not shown.
//! Switching kept probes on and off (`tp enable`, `tp disable`) is one
//! store to each one's enable flag in the region: no ptrace, no stop.
//! [`reports`] gathers `tp status`'s reports.

use std::collections::HashMap;

use anyhow::{Result, bail};

use crate::escape::text;
use crate::events::aggregates;
use crate::events::clock::Clock;
use crate::notes::Notes;
use crate::output::aggregates::ProbeAgg;
use crate::output::report::ProcessReport;
use crate::output::{ProbeStat, Summary};
use crate::probe::layout::kind;
use crate::probe::region::{self, Region};
use crate::process;
use crate::session::targets::Which;
use crate::session::tracer::{AggProbe, aggregates_of};
use crate::symbols::demangle::strip_arguments;
use crate::symbols::pattern::glob;

/// The processes a look through `/proc` found holding tp's probes.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Every process whose memory map shows a target's data region (not a
    /// tp tracer's view of one), in PID order. Nothing is mapped or
    /// validated here: a region that is not tp's is reported when its
    /// process's turn comes.
    pub pids: Vec<i32>,
    /// Processes whose memory map this user may not read (another user's,
    /// without the privilege): tp cannot see whether they hold probes. Not
    /// counted for root, who can trace all it may read (a process a
    /// security module hides from root is no process tp could attach to).
    pub hidden: usize,
}

impl Scan {
    /// The line for a scan that found nothing: no process holds probes, or
    /// none that tp can see, and how to see the others.
    pub fn nothing_found(&self) -> String {
        match self.hidden {
            0 => "no process holds tp probes".to_string(),
            n => format!(
                "no process that tp can see holds tp probes; it cannot see into {n} process{} of other users \
                 (run tp as root, or with CAP_SYS_PTRACE, to see them)",
                if n == 1 { "" } else { "es" }
            ),
        }
    }
}

/// Looks through every process for tp's data region.
pub fn scan() -> Scan {
    let mut out = Scan::default();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for pid in process::other_pids() {
        match process::read_maps(pid) {
            Ok(m) => {
                if region::find(&m).is_some_and(|r| region::is_target_view(pid, r)) {
                    out.pids.push(pid);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !root => out.hidden += 1,
            // Gone since the listing.
            Err(_) => {}
        }
    }
    out.pids.sort();
    out
}

/// Every process whose memory map shows a target's data region, in PID order ([`scan`]).
pub fn processes_with_probes() -> Vec<i32> {
    scan().pids
}

/// The probes installed in `pid` and their counts; a process without
/// tp's data region is an error that says how to install some.
pub fn summary(pid: i32) -> Result<Summary> {
    Ok(report(pid)?.summary)
}

/// [`summary`], with the latency of the probes whose threads keep their
/// calls' durations in the target (`--ret --keep`, or a session's `--ret
/// -q`): read from the region's histograms.
pub fn report(pid: i32) -> Result<ProcessReport> {
    let region = region_of(pid)?;
    // tp's own probes on the unwinder's entry points (for --ret) are not
    // the user's: they come and go with the return probes.
    let live: Vec<_> =
        region.entries().into_iter().filter(|(_, e)| e.state().maybe_patched() && e.kind & kind::OWN == 0).collect();
    let hits = region.hits_of(&live.iter().map(|(i, _)| *i).collect::<Vec<_>>());
    let timed = live.iter().any(|(_, e)| e.kind & kind::AGGREGATE != 0);
    let mut durations = match timed {
        true => aggregates::latency(&region, &calibrated_clock()),
        false => HashMap::new(),
    };
    let latency = live
        .iter()
        .map(|(i, e)| (e.kind & kind::AGGREGATE != 0).then(|| durations.remove(i).unwrap_or_default()))
        .collect();
    let aggregates = aggregates_in(pid, &region, &live);
    let probes = live
        .into_iter()
        .zip(hits)
        .map(|((i, e), hits)| {
            let calls = crate::session::attached::filtered(&region, i, e.kind, hits);
            ProbeStat::new(e.name(), e.module(), e.function, calls).switched(region.enabled(i))
        })
        .collect();
    Ok(ProcessReport::kept(Summary { pid, probes }, latency, aggregates))
}

/// The aggregates a running session keeps in the target (`--agg`, `--by
/// tid`), as its summary would show them now: the probes' configurations
/// say what was asked (`--by`'s keys and `--agg`'s names, in short
/// forms), the threads' tables hold the rows. A probe whose texts do not
/// read back (the target can write them) shows none. `--by caller`'s
/// return addresses are named in process `pid`.
fn aggregates_in(pid: i32, region: &Region, live: &[(u32, crate::probe::layout::Entry)]) -> Vec<ProbeAgg> {
    use crate::events::predicate;
    use crate::probe::layout::words_text;
    let mut groups: Vec<((String, String), Vec<AggProbe>)> = Vec::new();
    for (i, e) in live {
        let Some(config) = (e.kind & (kind::BY | kind::AGGREGATE) != 0).then(|| region.config(*i)).flatten() else {
            continue;
        };
        let texts = (words_text(&config.by_text), words_text(&config.agg_text));
        if texts.0.is_empty() && texts.1.is_empty() {
            continue;
        }
        let p = AggProbe { function: e.name(), index: *i, config };
        match groups.iter_mut().find(|(t, _)| *t == texts) {
            Some((_, ps)) => ps.push(p),
            None => groups.push((texts, vec![p])),
        }
    }
    if groups.is_empty() {
        return Vec::new();
    }
    let mut owners = aggregates::Owners::default();
    owners.note(region);
    let mut out: Vec<(u32, ProbeAgg)> = Vec::new();
    let mut sym: Option<crate::symbols::symbolize::Symbolizer> = None;
    let mut name = |a: u64| sym.get_or_insert_with(|| crate::symbols::symbolize::Symbolizer::new(pid)).frame(a, true);
    for ((by, agg), probes) in &groups {
        fn opt(t: &str) -> Option<&str> {
            (!t.is_empty()).then_some(t)
        }
        // A text that does not read back (the target can write it) shows none.
        let names = match opt(agg).map(predicate::AggNames::from_stored) {
            Some(None) => continue,
            n => n.flatten(),
        };
        let mut aggs = aggregates_of(region, &owners, probes, opt(by), names.as_ref(), &mut name);
        // The calls no table counted are the process's: said once.
        if !out.is_empty() {
            for a in &mut aggs {
                (a.overflow, a.unreadable) = (0, 0);
            }
        }
        out.extend(probes.iter().map(|p| p.index).zip(aggs));
    }
    // In the summary's order, as the metrics pair them with its rows.
    out.sort_by_key(|(i, _)| live.iter().position(|(j, _)| j == i));
    out.into_iter().map(|(_, a)| a).collect()
}

/// The data region of process `pid`; a process without one is an error
/// that says how to install probes.
fn region_of(pid: i32) -> Result<Region> {
    process::status(pid)?;
    process::check_readable(pid)?;
    let maps = process::read_maps(pid)?;
    let Some(mapping) = region::find(&maps) else {
        bail!("process {pid} has no tp probes; install some with `tp attach -p {pid} -f NAME --keep`");
    };
    Region::open(pid, mapping)
}

/// A clock that converts the target's timestamps: calibrated for a moment
/// where the CPU does not say its counter's rate.
fn calibrated_clock() -> Clock {
    Clock::calibrated()
}

/// The reports of `tp status`: of the processes `which` names, or of every
/// process that holds probes when it names none (saying so when none
/// does). Named processes must all answer; in a scan of every process, one
/// that cannot be read (it exited, its region fails validation) is said in
/// one line and left out, and the second value is true: tp exits 1 after
/// printing the rest.
pub fn reports(notes: &dyn Notes, which: &Which) -> Result<(Vec<ProcessReport>, bool)> {
    let mut scanned = None;
    let pids = if which.is_empty() {
        let found = scan();
        let pids = found.pids.clone();
        scanned = Some(found);
        pids
    } else {
        which.select()?.pids
    };
    if pids.is_empty() {
        crate::note!(notes, "tp: {}", scanned.unwrap_or_default().nothing_found());
    }
    let mut reports = Vec::new();
    let mut failed = false;
    for pid in pids {
        match report(pid) {
            Ok(report) => reports.push(report),
            // Gone since the scan: nothing to say.
            Err(_) if which.is_empty() && process::has_exited(pid, std::time::Duration::from_millis(100)) => {}
            Err(e) if which.is_empty() => {
                crate::note!(notes, "tp: process {pid}: {}", text(&format!("{e:#}")));
                failed = true;
            }
            Err(e) => return Err(e),
        }
    }
    Ok((reports, failed))
}

/// Switches on (`on`) or off the probes of `pid` whose function matches
/// one of the names or globs `funcs` (every probe with `all`) by writing
/// their enable flags in its data region, and says each to `notes`. Every
/// detour tests its flag first, so a switch is one store: no ptrace, no
/// stop, no code modification; a disabled probe costs a jump, a test and a
/// jump back. Matching no probe is an error that says how to list them.
pub fn switch(notes: &dyn Notes, pid: i32, funcs: &[String], all: bool, on: bool) -> Result<()> {
    let region = region_of(pid)?;
    let mut switched = 0;
    for (i, e) in region.entries() {
        if !e.state().maybe_patched() || e.kind & kind::OWN != 0 {
            continue;
        }
        let name = e.name();
        let short = strip_arguments(&name);
        let wanted = all || funcs.iter().any(|p| glob(p, &name) || glob(p, &short));
        if wanted {
            region.set_enabled(i, on)?;
            switched += 1;
            crate::note!(notes, "tp: {} `{}` in {pid}", if on { "enabled" } else { "disabled" }, text(&name));
        }
    }
    if switched == 0 {
        bail!("no probe of process {pid} matches; `tp status -p {pid}` lists them");
    }
    Ok(())
}
