//! `tp status`: the probes installed in a process and their counts, read
//! from the target's data region without stopping it.

use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::cli::StatusArgs;
use crate::output::{ProbeStat, Summary, print_summary};
use crate::probe::region::{self, Region};
use crate::process;

/// Runs `tp status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    process::status(args.pid)?;
    process::check_readable(args.pid)?;
    let maps = process::read_maps(args.pid)?;
    let Some(mapping) = region::find(&maps) else {
        bail!("process {} has no tp probes; install some with `tp attach -p {} -f NAME --keep`", args.pid, args.pid);
    };
    let region = Region::open(args.pid, mapping)?;
    let live: Vec<_> = region.entries().into_iter().filter(|(_, e)| e.state().maybe_patched()).collect();
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
    print_summary(&Summary { pid: args.pid, probes }, args.json)?;
    Ok(ExitCode::SUCCESS)
}
