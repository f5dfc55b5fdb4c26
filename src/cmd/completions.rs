//! `tp completions SHELL`: the completion script for a shell, generated
//! from the command-line definitions ([`crate::cli`]) by clap_complete, so
//! it always knows every subcommand and option tp has.

use std::process::ExitCode;

use anyhow::Result;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};

/// Runs `tp completions`.
pub fn run(args: CompletionsArgs) -> Result<ExitCode> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "tp", &mut out);
    std::io::Write::flush(&mut out)?;
    Ok(ExitCode::SUCCESS)
}
