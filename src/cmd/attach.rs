//! `tp attach`: probe functions of running processes (`-p`, repeated or a
//! comma list, `--name` and `--exe`), show live counts (and events, with
//! `--args`/`--ret`), and on Ctrl-C, `--duration` or the targets' exit,
//! restore the code and print a summary (per process and in total when
//! there are several). With `--keep`, install and exit instead; with
//! `--listen`, serve the session's metrics over HTTP meanwhile
//! ([`crate::session::attach`] runs it).

use std::process::ExitCode;

use anyhow::Result;

use super::options::{CommandLine, which};
use crate::cli::AttachArgs;
use crate::session::{Options, attach, interrupt};

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    // The command line first: a format that cannot be, before any process is looked at.
    let opts = Options::from_cli(CommandLine::Attach(&args))?;
    let status = attach::run(opts, &which(&args.targets), args.exe.as_deref())?;
    Ok(ExitCode::from(status))
}
