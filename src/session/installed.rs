//! The probes installed in a process, read from its data region without
//! stopping it: what `tp status` prints and `tp serve` exposes. Kept probes
//! (`--keep`) and those of a running session alike; counts only, since
//! latency exists only in the session that drains the events. tp's own
//! unwinder probes, which `--ret` needs, are not shown.

use anyhow::{Result, bail};

use crate::output::{ProbeStat, Summary};
use crate::probe::region::{self, Region};
use crate::process;

/// Every process whose memory map shows a target's data region (not a tp
/// tracer's view of one), in PID order.
pub fn processes_with_probes() -> Vec<i32> {
    let mut pids: Vec<i32> = process::other_pids()
        .into_iter()
        .filter(|&pid| {
            process::read_maps(pid).is_ok_and(|m| region::find(&m).is_some_and(|r| region::is_target_view(pid, r)))
        })
        .collect();
    pids.sort();
    pids
}

/// The probes installed in `pid` and their counts; a process without
/// tp's data region is an error that says how to install some.
pub fn summary(pid: i32) -> Result<Summary> {
    process::status(pid)?;
    process::check_readable(pid)?;
    let maps = process::read_maps(pid)?;
    let Some(mapping) = region::find(&maps) else {
        bail!("process {pid} has no tp probes; install some with `tp attach -p {pid} -f NAME --keep`");
    };
    let region = Region::open(pid, mapping)?;
    // tp's own probes on the unwinder's entry points (for --ret) are not
    // the user's: they come and go with the return probes.
    let live: Vec<_> = region
        .entries()
        .into_iter()
        .filter(|(_, e)| e.state().maybe_patched() && e.kind & crate::probe::layout::kind::OWN == 0)
        .collect();
    let hits = region.hits_of(&live.iter().map(|(i, _)| *i).collect::<Vec<_>>());
    let probes = live
        .into_iter()
        .zip(hits)
        .map(|((i, e), hits)| ProbeStat {
            func: e.name(),
            module: e.module(),
            address: e.function,
            hits,
            enabled: region.enabled(i),
        })
        .collect();
    Ok(Summary { pid, probes })
}
