//! `tp enable` / `tp disable`: switch kept probes on and off by writing
//! their enable flags in the target's data region, without stopping it
//! ([`crate::session::installed::switch`]).

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::ToggleArgs;
use crate::notes::Stderr;
use crate::session::installed;

/// Runs `tp enable` (`on`) or `tp disable`.
pub fn run(args: ToggleArgs, on: bool) -> Result<ExitCode> {
    installed::switch(&Stderr, args.pid, &args.funcs, args.all, on)?;
    Ok(ExitCode::SUCCESS)
}
