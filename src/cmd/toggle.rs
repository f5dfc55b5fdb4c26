//! `tp enable` / `tp disable`: switch kept probes on and off by writing
//! their enable flags in the target's data region. Every detour tests its
//! flag first, so a switch is one store: no ptrace, no stop, no code
//! modification. A disabled probe costs a jump, a test and a jump back.

use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::cli::ToggleArgs;
use crate::escape::text;
use crate::probe::layout::kind;
use crate::probe::region::{self, Region};
use crate::process;
use crate::symbols::demangle::strip_arguments;
use crate::symbols::pattern::glob;

/// Runs `tp enable` (`on`) or `tp disable`.
pub fn run(args: ToggleArgs, on: bool) -> Result<ExitCode> {
    process::status(args.pid)?;
    process::check_readable(args.pid)?;
    let maps = process::read_maps(args.pid)?;
    let Some(mapping) = region::find(&maps) else {
        bail!("process {} has no tp probes; install some with `tp attach -p {} -f NAME --keep`", args.pid, args.pid);
    };
    let region = Region::open(args.pid, mapping)?;
    let mut switched = 0;
    for (i, e) in region.entries() {
        if !e.state().maybe_patched() || e.kind & kind::OWN != 0 {
            continue;
        }
        let name = e.name();
        let short = strip_arguments(&name);
        let wanted = args.all || args.funcs.iter().any(|p| glob(p, &name) || glob(p, &short));
        if wanted {
            region.set_enabled(i, on)?;
            switched += 1;
            crate::say!("tp: {} `{}` in {}", if on { "enabled" } else { "disabled" }, text(&name), args.pid);
        }
    }
    if switched == 0 {
        bail!("no probe of process {} matches; `tp status -p {}` lists them", args.pid, args.pid);
    }
    Ok(ExitCode::SUCCESS)
}
