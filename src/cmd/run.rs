//! `tp run -f NAME… -- PROGRAM ARGS…`: start a program with probes in it from
//! its entry point, let it run untraced, and print the summary when it
//! exits ([`crate::session::run`]); tp's exit status is the program's
//! (128 + the signal that killed it, as shells report it). The program
//! keeps tp's stdin, stdout and stderr; tp's results go to stderr as text,
//! or to `-o FILE` in any format.

use std::process::ExitCode;

use anyhow::Result;

use super::options::CommandLine;
use crate::cli::RunArgs;
use crate::escape::text;
use crate::session::Options;
use crate::session::run::{self, Ran};

/// Runs `tp run`.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let opts = Options::from_cli(CommandLine::Run(&args))?;
    match run::run(&opts, &args.command)? {
        Ran::Ended(exit) => Ok(ExitCode::from(exit.shell_status())),
        Ran::NotStarted(why, status) => {
            let program = args.command.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let why = why.strip_prefix(&format!("`{program}`: ")).unwrap_or(&why);
            crate::say!("tp: cannot run `{}`: {}", text(&program), text(why));
            Ok(ExitCode::from(status))
        }
    }
}
