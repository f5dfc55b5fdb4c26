//! The `tp` command: parse the command line, run it, print one line on error.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = tp::cli::Cli::parse();
    match tp::cmd::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // One line: the error and its causes joined by ": " (anyhow's `{:#}`).
            eprintln!("tp: {err:#}");
            ExitCode::from(1)
        }
    }
}
