//! The `tp` command: parse the command line, run it, print one line on error.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = tp::cli::Cli::parse();
    match tp::cmd::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`tp list-probes … | head`) is not an error.
            let broken_pipe = err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            // One line: the error and its causes joined by ": " (anyhow's `{:#}`).
            eprintln!("tp: {err:#}");
            ExitCode::from(1)
        }
    }
}
