//! `tp man`: the manual pages, generated from the command-line definitions
//! ([`crate::cli`]) by clap_mangen: tp(1) lists the subcommands, and each
//! has a page of its own (tp-attach(1), ...), as git and cargo do. To what
//! clap_mangen renders, each page adds EXAMPLES, and tp(1) ENVIRONMENT,
//! EXIT STATUS, FILES and SEE ALSO, written here.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::CommandFactory;
use clap_mangen::Man;

use crate::cli::{Cli, ManArgs};

/// Runs `tp man`.
pub fn run(args: ManArgs) -> Result<ExitCode> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    if let Some(dir) = &args.dir {
        write_all(cmd, dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    let page = match &args.subcommand {
        None => cmd,
        Some(name) => match cmd.find_subcommand(name) {
            Some(sub) => sub.clone(),
            None => {
                let names: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
                bail!("tp has no subcommand `{name}`; pages exist for: {}", names.join(", "))
            }
        },
    };
    let mut out = crate::streams::stdout();
    out.write_all(&page_of(page, args.subcommand.as_deref())?)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The roff of the page of `cmd` (`sub`: the subcommand it is, or tp itself).
fn page_of(cmd: clap::Command, sub: Option<&str>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    Man::new(cmd).render(&mut out)?;
    out.extend_from_slice(sections(sub).as_bytes());
    Ok(out)
}

/// Writes tp.1 and one page per subcommand into `dir`.
fn write_all(cmd: clap::Command, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    let pages = cmd.get_subcommands().cloned().map(|s| (s.get_name().to_string(), Some(s))).collect::<Vec<_>>();
    for (name, sub) in pages {
        let sub = sub.expect("a subcommand");
        let path = dir.join(Man::new(sub.clone()).get_filename());
        std::fs::write(&path, page_of(sub, Some(&name))?)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
    }
    let path = dir.join(Man::new(cmd.clone()).get_filename());
    std::fs::write(&path, page_of(cmd, None)?).with_context(|| format!("cannot write `{}`", path.display()))?;
    crate::say!("tp: wrote the manual pages into {}", dir.display());
    Ok(())
}

/// Examples: the command line, then what it does.
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("attach", "tp attach -p 1234 -f foo -f bar", "Count the calls of foo and bar until Ctrl-C, then print them."),
    ("attach", "tp attach -p 1234 -f 'libc:malloc' -d 10", "Count malloc's calls for 10 seconds."),
    ("attach", "tp attach -p 1234 -f add --args --ret", "Print each call's arguments, return value and duration."),
    (
        "attach",
        "tp attach -p 1234 -f add --ret --json | head -1",
        "The first event as JSON; tp then removes its probes and exits 141.",
    ),
    ("attach", "tp attach -p 1234 -f 'sqlite3_*' -d 5 --top 10", "The 10 busiest of a library's functions."),
    ("attach", "tp attach -p 1234 -f leaf --stack -o flame.svg", "Who calls leaf, as a flame graph."),
    ("attach", "tp attach -p 1234 -f add --if 'a < 0' --args", "Only the calls whose argument a is negative."),
    ("attach", "tp attach --name nginx -f 'ngx_http_*' -d 10 --json", "Every process named nginx; one JSON summary."),
    ("attach", "tp attach -p 1234 -f foo --keep", "Install and exit; tp status shows the count, tp detach removes it."),
    ("run", "tp run -f 'libc:opendir' -- ls -R /etc", "Count a program's calls from its first instruction."),
    ("run", "tp run -f foo -o calls.json -- ./prog", "The same, the results as JSON in calls.json."),
    ("status", "tp status", "Every process's kept probes and their counts."),
    (
        "status",
        "tp status --prometheus -o /var/lib/node_exporter/textfile/tp.prom",
        "For node_exporter, written atomically.",
    ),
    ("detach", "tp detach -p 1234", "Remove tp's probes from a process."),
    ("profile", "tp profile -p 1234 -f '*' -d 10", "Sampled latency of every function, exact call counts."),
    ("list-probes", "tp list-probes ./prog", "Every function of a program and whether it can be probed."),
    ("serve", "tp serve --listen 127.0.0.1:9464", "The counts of kept probes for Prometheus."),
    ("enable", "tp enable -p 1234 --all", "Turn kept probes back on."),
    ("disable", "tp disable -p 1234 -f foo", "Turn a kept probe off without stopping the process."),
    ("demo", "tp demo", "Attach to a bundled program, show live counts, detach and check."),
    ("completions", "tp completions bash > /etc/bash_completion.d/tp", "Shell completion, -p offering process IDs."),
    ("man", "tp man attach | man -l -", "Read this manual."),
];

/// The environment tp reads.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("TP_CACHE", "off: do not read or write the cache of module analyses."),
    ("XDG_CACHE_HOME", "Where the caches go (tp/, tp/debuginfod/); default $HOME/.cache."),
    ("DEBUGINFOD_URLS", "Servers, separated by spaces, that tp asks for debug files by build-id."),
    ("DEBUGINFOD_TIMEOUT", "Seconds a debuginfod server may take to answer (default 90)."),
    ("DEBUGINFOD_MAXTIME", "Seconds a download from a debuginfod server may take."),
    ("DEBUGINFOD_MAXSIZE", "The largest debug file tp downloads, in bytes."),
    ("TP_DEBUG_DIRS", "Directories, separated by colons, of separate debug files (default /usr/lib/debug)."),
];

/// How tp exits.
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success."),
    ("1", "An error, said in one line on stderr; every probe tp installed is removed."),
    ("2", "The command line is wrong (one line says what is missing or not allowed)."),
    ("70", "An internal error (a bug; the line asks to report it); probes are removed."),
    ("74", "tp's output cannot be written (ENOSPC, EIO): the session ended as on Ctrl-C."),
    ("126, 127", "tp run: the program cannot be executed, or is not found."),
    (
        "128+N",
        "tp run: the program was killed by signal N; otherwise tp run exits with the program's status. tp attach, tp profile: a process tp attached to was killed by signal N during the session (the first, with several; known where tp hears the kernel's process events, as root); the results are printed as ever.",
    ),
    (
        "141",
        "The reader of tp's output went away (tp attach ... | head): the session ended as on Ctrl-C, as a shell reports a process killed by SIGPIPE.",
    ),
];

/// The files tp uses.
const FILES: &[(&str, &str)] = &[
    ("$XDG_CACHE_HOME/tp/", "The cache of module analyses, per build-id (TP_CACHE=off to go without)."),
    ("$XDG_CACHE_HOME/tp/debuginfod/", "Debug files downloaded from debuginfod servers."),
    ("/usr/lib/debug/", "Separate debug files, by build-id and by path."),
    ("/proc/PID/maps", "Where tp finds its data region in a process (/memfd:tp-data)."),
];

/// The sections tp adds to the page of `sub` (None: tp(1)).
fn sections(sub: Option<&str>) -> String {
    let mut out = String::new();
    let examples: Vec<&(&str, &str, &str)> = EXAMPLES.iter().filter(|e| sub.is_none_or(|s| e.0 == s)).collect();
    if !examples.is_empty() {
        out += ".SH EXAMPLES\n";
        for (_, cmd, what) in examples {
            out += &format!(".TP\n\\fB{}\\fR\n{}\n", roff(cmd), roff(what));
        }
    }
    if sub.is_none() {
        out += &list("ENVIRONMENT", ENVIRONMENT, true);
    }
    out += &list("EXIT STATUS", EXIT_STATUS, false);
    if sub.is_none() {
        out += &list("FILES", FILES, true);
        out += ".SH SEE ALSO\n";
        out += &roff(
            "The output formats and their JSON schema: docs/output.md in tp's sources. The design: docs/design.md.",
        );
        out += "\n";
    }
    out
}

/// A section of `items`, each a term (bold when `bold`) and its meaning.
fn list(title: &str, items: &[(&str, &str)], bold: bool) -> String {
    let mut out = format!(".SH {title}\n");
    for (term, what) in items {
        let term = if bold { format!("\\fB{}\\fR", roff(term)) } else { roff(term) };
        out += &format!(".TP\n{term}\n{}\n", roff(what));
    }
    out
}

/// `s` as roff text: backslashes and hyphens escaped, no line that starts
/// as a request.
fn roff(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') { format!("\\&{t}") } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_have_examples_and_the_main_one_environment_exit_status_and_files() {
        let main = sections(None);
        for head in [".SH EXAMPLES", ".SH ENVIRONMENT", ".SH EXIT STATUS", ".SH FILES"] {
            assert!(main.contains(head), "{head}");
        }
        for var in ["TP_CACHE", "DEBUGINFOD_URLS", "TP_DEBUG_DIRS"] {
            assert!(main.contains(&format!("\\fB{var}\\fR")), "{var}");
        }
        assert!(main.contains(".TP\n141\n"), "{main}");
        let attach = sections(Some("attach"));
        assert!(attach.contains("\\fBtp attach \\-p 1234 \\-f foo \\-f bar\\fR"), "{attach}");
        assert!(!attach.contains("ENVIRONMENT") && attach.contains(".SH EXIT STATUS"));
        assert_eq!(roff(".x-y"), "\\&.x\\-y");
    }
}
