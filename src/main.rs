//! The `tp` command: parse the command line, run it, print one line on error.
//!
//! Every failure is one line on stderr starting `tp: `, escaped for the
//! terminal (it may quote names and paths a target chose): a parse error
//! (clap's own rendering is several lines), an error a command returns, and
//! a panic, which also unwinds through the guards that restore a target's
//! code ([`tp::session::guard`]).

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use tp::escape;

fn main() -> ExitCode {
    let cli = match tp::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return parse_error(e),
    };
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info.location().map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        tp::say!("tp: internal error: {}{at}; please report it", escape::text(&what));
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tp::cmd::run(cli)));
    match result {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => {
            // A closed pipe (`tp list-probes … | head`): what a shell reports
            // for a process killed by SIGPIPE, in silence.
            let broken_pipe = err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::from(tp::streams::EXIT_PIPE);
            }
            // One line: the error and its causes joined by ": " (anyhow's `{:#}`).
            tp::say!("tp: {}", escape::text(&format!("{err:#}")));
            ExitCode::from(1)
        }
        // The hook printed the line; the guards have run while unwinding.
        Err(_) => ExitCode::from(70),
    }
}

/// Help and version as clap prints them; any other parse error as one line
/// (clap's message without its `error:` prefix and usage block) and exit 2.
fn parse_error(e: clap::Error) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    tp::say!("tp: {}", one_line(&e.render().to_string()));
    ExitCode::from(2)
}

/// The first line of clap's message, without `error: `, escaped, and
/// followed by where to look (the help of the subcommand given, if any).
fn one_line(rendered: &str) -> String {
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or("cannot parse the command line");
    let msg = first.trim().strip_prefix("error:").unwrap_or(first).trim();
    let tip =
        rendered.lines().find_map(|l| l.trim().strip_prefix("tip: ")).map(|t| format!("; {t}")).unwrap_or_default();
    // The subcommand on the command line, if any, is the help to read.
    let names: Vec<String> = tp::cli::Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
    let command = std::env::args_os()
        .skip(1)
        .find_map(|a| names.iter().find(|n| a.to_str() == Some(n.as_str())).map(|n| format!("tp {n}")))
        .unwrap_or_else(|| "tp".into());
    format!("{}{}; see `{} --help`", escape::text(msg), escape::text(&tip), escape::text(&command))
}
