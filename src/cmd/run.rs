//! `tp run -f NAME… -- PROGRAM ARGS…`: start a program with probes in it from
//! its entry point, let it run untraced, and print the summary when it
//! exits; tp's exit status is the program's (128 + the signal that killed
//! it, as shells report it). The program keeps tp's stdin, stdout and
//! stderr; tp's results go to stderr as text, or to `-o FILE` in any format.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};

use super::metrics;
use super::options::CommandLine;
use crate::cli::RunArgs;
use crate::escape::text;
use crate::output::format::Format;
use crate::output::sink::Sink;
use crate::session::group::Behaviour;
use crate::session::run::{self, Ran};
use crate::session::{Options, results};

/// How often tp looks at the program: its exit ends the session, so a short
/// program's summary comes this soon after it.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// Runs `tp run`.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let opts = Options::from_cli(CommandLine::Run(&args))?;
    if opts.format != Format::Text && opts.output.is_none() {
        // stdout is the program's, stderr carries tp's notes.
        bail!(
            "`tp run` writes {} results to a file: add -o FILE (its program keeps stdout, and stderr carries \
             tp's lines)",
            opts.format.name()
        );
    }
    let output = results::open(&opts, Sink::stderr(), false)?;
    let published = match &args.probe.listen {
        Some(addr) => Some(metrics::start_session_server(addr, args.probe.listen_any)?),
        None => None,
    };
    let how = Behaviour {
        several: false,
        follow_exec: args.probe.follow_exec,
        check_every: CHECK_EVERY,
        live: false,
        announce: false,
        command: "run",
    };
    match run::run(&opts, &args.command, output, how, published)? {
        Ran::Ended(exit) => Ok(ExitCode::from(exit.shell_status())),
        Ran::NotStarted(why, status) => {
            let program = args.command.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let why = why.strip_prefix(&format!("`{program}`: ")).unwrap_or(&why);
            crate::say!("tp: cannot run `{}`: {}", text(&program), text(why));
            Ok(ExitCode::from(status))
        }
    }
}
