//! The subcommands: each turns validated arguments into calls on the engine
//! (`process`, `symbols`, `probe`) and hands the results to `output`.

pub mod attach;
pub mod demo;
pub mod detach;
pub mod guard;
pub mod interrupt;
pub mod list_probes;
pub mod profile;
pub mod resolve;
pub mod status;
pub mod toggle;
pub mod trace;

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::{Cli, Command};

/// Runs one command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Attach(args) => attach::run(args),
        Command::Status(args) => status::run(args),
        Command::Detach(args) => detach::run(args),
        Command::ListProbes(args) => list_probes::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Enable(args) => toggle::run(args, true),
        Command::Disable(args) => toggle::run(args, false),
        Command::Profile(args) => profile::run(args),
    }
}
