//! `tp profile`: sampled latency of many functions at once, with exact call
//! counts ([`crate::session::profile`] says how, and writes the results).

use std::process::ExitCode;

use anyhow::Result;

use super::options::CommandLine;
use crate::cli::ProfileArgs;
use crate::session::profile;
use crate::session::{Options, interrupt};

/// Runs `tp profile`.
pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    interrupt::install();
    let opts = Options::from_cli(CommandLine::Profile(&args))?;
    let killed_by = profile::run(&opts)?;
    Ok(ExitCode::from(crate::session::exit_status(killed_by)))
}
