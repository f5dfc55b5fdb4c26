//! The command-line interface: clap derive types only, no logic.
//!
//! Validation (does the process exist, do the flags fit together) lives in
//! [`crate::cmd`], so every parse here can be unit-tested on its own.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// tp: count and time function calls in a running process, without restarting
/// it, using jump probes patched into its code.
#[derive(Debug, Parser)]
#[command(name = "tp", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe functions of a running process and count their calls.
    Attach(AttachArgs),
    /// Print the counts of the probes installed in a process (with --keep).
    Status(StatusArgs),
    /// Remove tp's probes from a process, or from every process that has some.
    Detach(DetachArgs),
    /// List the functions of a binary and whether each can be probed.
    ListProbes(ListProbesArgs),
    /// Start a bundled target, attach, show live hits, detach and check it.
    Demo(DemoArgs),
}

/// `tp attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Process to attach to.
    #[arg(short, long)]
    pub pid: i32,
    /// Function to probe (repeat for several).
    #[arg(short, long = "func", value_name = "NAME", required = true)]
    pub funcs: Vec<String>,
    /// Install the probes and exit; they keep counting in the target.
    #[arg(long, conflicts_with = "duration")]
    pub keep: bool,
    /// Detach after this many seconds (default: until Ctrl-C or the target exits).
    #[arg(short, long, value_name = "SECS", value_parser = seconds)]
    pub duration: Option<f64>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `tp status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Process whose probes to show.
    #[arg(short, long)]
    pub pid: i32,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `tp detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Process to clean; without it, every process that holds tp probes.
    #[arg(short, long)]
    pub pid: Option<i32>,
}

/// `tp list-probes`.
#[derive(Debug, Args)]
pub struct ListProbesArgs {
    /// Executable or shared library to inspect.
    pub binary: PathBuf,
    /// Print totals and the most common refusal reasons instead of every function.
    #[arg(long)]
    pub summary: bool,
    /// One JSON object per line per function.
    #[arg(long)]
    pub json: bool,
}

/// `tp demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long to show live hits, in seconds.
    #[arg(short, long, default_value_t = 5.0, value_name = "SECS", value_parser = seconds)]
    pub duration: f64,
}

/// A number of seconds that a `Duration` can hold: finite, not negative.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    match std::time::Duration::try_from_secs_f64(v) {
        Ok(_) => Ok(v),
        Err(_) => Err(format!("`{s}` is not a number of seconds from 0 to about 10^19")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(line.split_whitespace())
    }

    #[test]
    fn attach_long_and_short_forms_agree() {
        for line in ["tp attach --pid 12 --func foo --func bar", "tp attach -p 12 -f foo -f bar"] {
            let Command::Attach(a) = parse(line).unwrap().command else { panic!("not attach") };
            assert_eq!(a.pid, 12);
            assert_eq!(a.funcs, ["foo", "bar"]);
            assert!(!a.keep && !a.json && a.duration.is_none());
        }
    }

    #[test]
    fn attach_needs_a_function() {
        let err = parse("tp attach -p 12").unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn duration_must_fit_a_duration() {
        for bad in ["nan", "inf", "-1", "1e30", "soon"] {
            let err = Cli::try_parse_from(["tp", "attach", "-p", "1", "-f", "foo", &format!("--duration={bad}")]);
            assert_eq!(err.unwrap_err().kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        let Command::Attach(a) = parse("tp attach -p 1 -f foo --duration 0.25").unwrap().command else { panic!() };
        assert_eq!(a.duration, Some(0.25));
    }

    #[test]
    fn keep_conflicts_with_duration() {
        let err = parse("tp attach -p 1 -f foo --keep --duration 3").unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn detach_pid_is_optional() {
        let Command::Detach(d) = parse("tp detach").unwrap().command else { panic!() };
        assert_eq!(d.pid, None);
        let Command::Detach(d) = parse("tp detach -p 7").unwrap().command else { panic!() };
        assert_eq!(d.pid, Some(7));
    }

    #[test]
    fn list_probes_takes_a_path_and_flags() {
        let Command::ListProbes(l) = parse("tp list-probes /bin/true --summary").unwrap().command else { panic!() };
        assert_eq!(l.binary, PathBuf::from("/bin/true"));
        assert!(l.summary && !l.json);
    }

    #[test]
    fn status_and_demo_parse() {
        let Command::Status(s) = parse("tp status -p 3 --json").unwrap().command else { panic!() };
        assert!(s.json && s.pid == 3);
        let Command::Demo(d) = parse("tp demo -d 2").unwrap().command else { panic!() };
        assert_eq!(d.duration, 2.0);
    }
}
