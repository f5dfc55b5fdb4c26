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

/// clap's message as one line: without `error: `, the usage block and the
/// pointer to `--help`, its indented lines (the missing arguments, the
/// allowed values, a tip) joined to the first, escaped, and followed by
/// where to look (the help of the subcommand given, if any).
fn one_line(rendered: &str) -> String {
    // The subcommand on the command line, if any, is the help to read.
    let names: Vec<String> = tp::cli::Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
    let command = std::env::args_os()
        .skip(1)
        .find_map(|a| names.iter().find(|n| a.to_str() == Some(n.as_str())).map(|n| format!("tp {n}")))
        .unwrap_or_else(|| "tp".into());
    joined(rendered, &command)
}

/// [`one_line`] for the help of `command`.
fn joined(rendered: &str, command: &str) -> String {
    let mut msg = String::new();
    let mut items: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for line in rendered.lines() {
        let l = line.trim();
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if l.is_empty() {
            continue;
        }
        if msg.is_empty() {
            msg = l.strip_prefix("error:").unwrap_or(l).trim().to_string();
        } else if let Some(tip) = l.strip_prefix("tip: ") {
            notes.push(tip.to_string());
        } else if let Some(values) = l.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            notes.push(values.to_string());
        } else {
            items.push(l.to_string());
        }
    }
    if msg.is_empty() {
        msg = "cannot parse the command line".into();
    }
    if !items.is_empty() {
        let sep = if msg.ends_with(':') { " " } else { ": " };
        msg = format!("{msg}{sep}{}", items.join(", "));
    }
    let msg = msg.trim_end_matches(':').to_string();
    let notes: String = notes.iter().map(|n| format!("; {n}")).collect();
    format!("{}{}; see `{}`", escape::text(&msg), escape::text(&notes), escape::text(&format!("{command} --help")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(args: &[&str]) -> String {
        let err = tp::cli::Cli::try_parse_from(args).unwrap_err();
        let command = args.get(1).map_or("tp".to_string(), |c| format!("tp {c}"));
        joined(&err.render().to_string(), &command)
    }

    #[test]
    fn clap_errors_keep_their_content_on_one_line() {
        assert_eq!(
            parse_line(&["tp", "attach", "-p", "402"]),
            "the following required arguments were not provided: --func <NAME>; see `tp attach --help`"
        );
        let run = parse_line(&["tp", "run"]);
        assert!(
            run.starts_with("the following required arguments were not provided: --func <NAME>, <PROGRAM>"),
            "{run}"
        );
        assert_eq!(
            parse_line(&["tp", "attach", "-p", "1", "-f", "x", "--stack=lbr"]),
            "invalid value 'lbr' for '--stack [<HOW>]'; possible values: fp, dwarf; see `tp attach --help`"
        );
        let shell = parse_line(&["tp", "completions", "tcsh"]);
        assert!(shell.contains("possible values: bash, elvish, fish, powershell, zsh"), "{shell}");
        for args in [&["tp", "serve"][..], &["tp", "disable"], &["tp", "list-probes"], &["tp", "detach", "-p"]] {
            let line = parse_line(args);
            assert!(!line.contains(":;") && !line.contains('\n'), "{line}");
            assert!(!line.contains("provided; "), "{line}");
        }
    }
}
