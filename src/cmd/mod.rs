//! The subcommands: each turns its command line into options for the
//! engine (`session`, or `probe` and `symbols` directly), runs it, and hands
//! the results to `output`.

pub mod attach;
pub mod completions;
pub mod demo;
pub mod detach;
pub mod list_probes;
pub mod man;
pub mod options;
pub mod profile;
pub mod run;
pub mod serve;
pub mod status;
pub mod step_worker;
pub mod toggle;

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::{Cli, Command};

/// Runs one command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    use crate::symbols::saving::{WAIT_AFTER_LISTING, WAIT_AT_EXIT, finish};
    let listing = matches!(cli.command, Command::ListProbes(_));
    // `tp run` exits with its program's status, whatever became of tp's output.
    let program_status = matches!(cli.command, Command::Run(_));
    let result = command(cli);
    // What this run learnt of its binaries: saved while a session ran, and
    // waited for only briefly now; a listing computed it all already.
    finish(if listing { WAIT_AFTER_LISTING } else { WAIT_AT_EXIT });
    match crate::streams::failure() {
        Some(f) if !program_status => {
            // An error of its own (not the failed write) is still the one line.
            if let Err(e) = &result
                && !e
                    .chain()
                    .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(f.errno)))
            {
                crate::streams::last_word(&format!("tp: {}", crate::escape::text(&format!("{e:#}"))));
            }
            end_with(f);
            Ok(ExitCode::from(f.code()))
        }
        _ => result,
    }
}

/// After stdout or stderr failed: the one line that says so, on the
/// stream that still works, unless the session said it already or a
/// reader of stdout simply went away (`tp list-probes … | head`), which
/// Unix tools let pass in silence.
fn end_with(f: crate::streams::Failure) {
    if crate::streams::said() || (f.broken_pipe() && f.stream == crate::streams::Stream::Stdout) {
        return;
    }
    crate::streams::last_word(&format!("tp: {}", f.describe()));
}

fn command(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Attach(args) => attach::run(args),
        Command::Status(args) => status::run(args),
        Command::Detach(args) => detach::run(args),
        Command::ListProbes(args) => list_probes::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Enable(args) => toggle::run(args, true),
        Command::Disable(args) => toggle::run(args, false),
        Command::Profile(args) => profile::run(args),
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
        Command::StepWorker => step_worker::run().map(|()| ExitCode::SUCCESS),
    }
}
