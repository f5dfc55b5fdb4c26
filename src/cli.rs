//! The command-line interface: clap derive types only, no logic.
//!
//! Validation (does the process exist, do the flags fit together) lives in
//! [`crate::cmd`], so every parse here can be unit-tested on its own.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// A closed set of values an option takes: the enum, and the `ValueEnum`
/// that parses each variant from its name on the command line. Written
/// here rather than derived, so that the option's own help describes the
/// values (a derived one would add each variant's doc comment to it).
macro_rules! values {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl clap::ValueEnum for $name {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($name::$variant,)+]
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(match self {
                    $($name::$variant => $text,)+
                }))
            }
        }
    };
}

values! {
    /// How `--stack` takes a call's stack.
    StackHow {
        /// Frame pointers, followed in the target.
        Fp = "fp",
        /// A copy of the stack's top, unwound by tp.
        Dwarf = "dwarf",
    }
}

values! {
    /// How `--steps` steps a call (`--step-engine`).
    StepEngine {
        /// tp single-steps the thread with ptrace.
        Ptrace = "ptrace",
        /// The thread traces itself in the target (trap flag, SIGTRAP handler).
        Trap = "trap",
    }
}

values! {
    /// The forms of `tp attach`'s and `tp run`'s results (`--format`).
    ProbeFormat {
        /// Tables and event lines.
        Text = "text",
        /// JSON Lines of events, then one summary document.
        Json = "json",
        /// A Chrome trace.
        Chrome = "chrome",
        /// Folded stacks.
        Folded = "folded",
        /// A flame graph.
        Svg = "svg",
    }
}

values! {
    /// The forms of `tp status`'s results (`--format`).
    StatusFormat {
        /// A table.
        Text = "text",
        /// One JSON document.
        Json = "json",
        /// The OpenMetrics text format.
        OpenMetrics = "openmetrics",
        /// The Prometheus text format 0.0.4.
        Prometheus = "prometheus",
    }
}

values! {
    /// The forms of `tp profile`'s results (`--format`).
    ProfileFormat {
        /// A table.
        Text = "text",
        /// One JSON document.
        Json = "json",
        /// A Chrome trace of the sampled calls.
        Chrome = "chrome",
    }
}

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
    /// Probe functions of running processes and count their calls.
    Attach(AttachArgs),
    /// Start a program with probes in it from its entry point; its exit status is tp's.
    Run(RunArgs),
    /// Print the counts of the probes installed in processes (with --keep), as a table, JSON or OpenMetrics.
    Status(StatusArgs),
    /// Serve the counts of installed probes over HTTP for Prometheus (OpenMetrics text at /metrics).
    Serve(ServeArgs),
    /// Remove tp's probes from a process, or from every process that has some.
    Detach(DetachArgs),
    /// List the functions of a binary and whether each can be probed.
    ListProbes(ListProbesArgs),
    /// Turn kept probes off without stopping the process (they cost a jump and a test).
    Disable(ToggleArgs),
    /// Turn kept probes back on without stopping the process.
    Enable(ToggleArgs),
    /// Profile many functions at once: every call counted, a random few per epoch timed.
    Profile(ProfileArgs),
    /// Start a bundled target, attach, show live hits, detach and check it.
    Demo(DemoArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print tp's manual page (roff; `tp man | man -l -`), or write every page to a directory.
    Man(ManArgs),
    /// Step one call for a tp session (tp starts it; it reads its job on stdin).
    #[command(hide = true)]
    StepWorker,
}

/// Which processes: `-p` (repeated, or a comma list) and `--name`.
#[derive(Debug, Clone, Default, Args)]
pub struct Targets {
    /// Process ID (repeat, or a comma list: -p 12,34).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<i32>,
    /// Every process whose command name or executable file name is NAME exactly (as `pgrep -x`).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
}

/// What to probe and record: shared by `tp attach` and `tp run`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Probe where a source line starts: `file.c:123` (every place, in every
    /// function) or `function:123`, from DWARF line tables (repeat for several).
    #[arg(long = "line", value_name = "FILE:LINE")]
    pub lines: Vec<String>,
    /// Count every basic block of the functions -f names, and their source
    /// lines: a count-only probe at the start of each block where one fits
    /// (`tp list-probes --blocks FUNCTION` shows which); the others' counts
    /// follow from the flow where it tells them.
    #[arg(long, conflicts_with_all = ["args", "ret", "stack", "predicate", "by", "agg", "lines"])]
    pub blocks: bool,
    /// Step N calls (default 1) of the functions -f names, one at a time,
    /// instruction by instruction to their return, with the functions they
    /// call, in the thread that made each (the others run on): how many
    /// instructions each executed, its source lines, its busiest
    /// instructions. Each instruction costs microseconds (ptrace).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=1000),
          conflicts_with_all = ["args", "ret", "stack", "predicate", "by", "agg", "lines", "blocks", "tree"])]
    pub steps: Option<u32>,
    /// The most instructions a stepped call records; then it runs on free.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, requires = "steps",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub step_limit: u64,
    /// How deep the calls a stepped call makes are stepped: 0 steps the
    /// function's own instructions alone, N its callees to N levels; a call
    /// deeper runs free (at full speed, not recorded) until it returns, and
    /// the trace counts such calls and their time by function called.
    /// Default: every call is stepped.
    #[arg(long, value_name = "N", requires = "steps",
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub step_depth: Option<u32>,
    /// How --steps steps a call: `ptrace` (tp single-steps the thread, on
    /// every architecture) or `trap` (x86-64: the thread sets its trap
    /// flag and a SIGTRAP handler tp installs in the target records each
    /// instruction, with no stop for tp; refused where the process handles
    /// SIGTRAP itself or a debugger traces it; every call is stepped).
    #[arg(long, value_name = "ENGINE", default_value = "ptrace", value_enum, requires = "steps")]
    pub step_engine: StepEngine,
    /// Record each call's arguments (named and typed with DWARF, else arg0..arg5),
    /// or the values EXPR lists: parameters, struct fields by DWARF
    /// (`--args 'req->method, req->uri.len, path'`, arrays by index `req->ids[2]`),
    /// strings at an address (`str(arg1)`), copied at the call. In `tp run`, put
    /// `--` before the program (`--args` would take it as EXPR).
    #[arg(long, value_name = "EXPR", num_args = 0..=1, default_missing_value = "")]
    pub args: Option<String>,
    /// Record each call's return value and duration (return probes).
    #[arg(long)]
    pub ret: bool,
    /// Record each call's user stack (implies --args): `fp` follows frame
    /// pointers in the target; `dwarf` copies the stack's top for tp to
    /// unwind with the unwind tables (code built without frame pointers).
    #[arg(long, value_name = "HOW", num_args = 0..=1, default_missing_value = "fp", value_enum)]
    pub stack: Option<StackHow>,
    /// The most frames of a stack.
    #[arg(long, value_name = "N", default_value_t = 30, requires = "stack",
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub stack_depth: u32,
    /// Bytes of the stack's top `--stack dwarf` copies.
    #[arg(long, value_name = "BYTES", default_value_t = 4096, requires = "stack",
          value_parser = clap::value_parser!(u32).range(64..=16384))]
    pub stack_size: u32,
    /// Write the stacks (or, with --steps, the stepped calls' instructions by call path) as
    /// folded lines (flamegraph.pl, speedscope) as the results: `--format folded`.
    #[arg(long)]
    pub folded: bool,
    /// Record only calls whose integer arguments (by name or arg0..arg5)
    /// and return value (`ret`) satisfy EXPR: `==` `!=` `<` `<=` `>` `>=` `&&` `||` `!`,
    /// and the bitwise `&` `|` `^`, which bind tighter than comparisons (`flags & 4 == 4`);
    /// C strings by == or != a literal: `path == "/"`, `str(arg0) == "GET"`, a prefix with `str(path, 5) == "/api/"`;
    /// struct fields by DWARF: `req->len > 100`, `str(req->method) == "GET"` (a call whose field cannot be read is not selected).
    #[arg(long = "if", value_name = "EXPR")]
    pub predicate: Option<String>,
    /// Count the calls per key, in the target: up to three of an integer
    /// argument (a name or arg0..arg5), `caller` (the call site: the
    /// return address, shown as function+offset) or `stack` (the call
    /// chain by frame pointers, 32 frames; `stack(N)` for N), `tid` and
    /// `pid` (`--by 'fd, tid'`, `--by caller`, `--by stack`); with --agg,
    /// the keys its values are aggregated by.
    #[arg(long, value_name = "KEYS")]
    pub by: Option<String>,
    /// Aggregate a value of each call in the target, per --by's keys:
    /// `count()`, `sum(v)`, `min(v)`, `max(v)`, `avg(v)`, `hist(v)` (powers
    /// of two), of one parameter, argN or struct field (`--agg 'hist(len),
    /// avg(len)'`, `--agg 'sum(req->len)'`), of `ret` (with --ret -q), or
    /// of `latency`, each call's duration in ns (`--agg 'hist(latency)'`);
    /// shown with the summary.
    #[arg(long, value_name = "EXPR")]
    pub agg: Option<String>,
    /// Show the calls as each thread's call tree (implies --args --ret):
    /// every call indented under its probed caller, with its duration; a
    /// call with no probed callee on one line with its return value.
    #[arg(long, conflicts_with_all = ["quiet", "blocks", "folded"])]
    pub tree: bool,
    /// Print only the summary, not every event.
    #[arg(short, long)]
    pub quiet: bool,
    /// The form of the results: text, json (JSON Lines, then one summary
    /// document), chrome (a Chrome trace for the Perfetto UI), folded or svg
    /// (the stacks, with --stack); default: what -o FILE's name says, else text.
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub format: Option<ProbeFormat>,
    /// Show the probes without hits too (the text summary leaves them out).
    #[arg(long)]
    pub all: bool,
    /// Show only the N busiest probes.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Events each thread's ring holds (a power of two from 4 to 1048576; set when tp first
    /// attaches to the process; default 2048, with --stack 65536: a stack takes several events).
    #[arg(long, value_name = "N", value_parser = ring_size)]
    pub ring_size: Option<u32>,
    /// Print the events and the summary as JSON: `--format json`.
    #[arg(long)]
    pub json: bool,
    /// After a traced process calls exec, probe the same functions in its new program.
    #[arg(long)]
    pub follow_exec: bool,
    /// Serve the session's counts and latency histograms for Prometheus at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Allow --listen on an address other than loopback (it exposes process and function names).
    #[arg(long, requires = "listen")]
    pub listen_any: bool,
}
/// `tp attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The processes to attach to.
    #[command(flatten)]
    pub targets: Targets,
    /// Every process that runs this program file (or maps this shared
    /// library), and each one that starts running it while tp runs: probed
    /// as soon as tp hears of its exec (before `main` where tp is quick
    /// enough), until Ctrl-C or -d.
    #[arg(long, value_name = "PATH", conflicts_with = "keep")]
    pub exe: Option<PathBuf>,
    /// Function to probe: `foo`, `libc:malloc`, a glob such as `'sqlite3_*'` or
    /// `'libz:*'`, an instruction inside one (`foo+0x1a`), or static probes
    /// (`usdt:provider:name`, globs allowed) (repeat for several). A name or
    /// glob without a module is looked up in the program first, and in its
    /// libraries only if the program has none (`'libc:ma*'` names libc's).
    #[arg(short, long = "func", value_name = "NAME", required_unless_present_any = ["addrs", "lines"])]
    pub funcs: Vec<String>,
    /// Address of a function's first instruction, or of one inside it, in hex (repeat for several).
    #[arg(long = "addr", value_name = "0xADDR", value_parser = parse_addr)]
    pub addrs: Vec<u64>,
    /// Install the probes and exit; they keep counting in the target (with
    /// --ret, timing each call too; with --agg or --by, aggregating: `tp
    /// status` shows the latency and the aggregates).
    #[arg(long, conflicts_with_all = ["duration", "args", "tree", "output", "follow_exec", "listen", "stack", "predicate"])]
    pub keep: bool,
    /// What to record and how to print it.
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Write the results to FILE instead of stdout, in the format --format
    /// (or --json, --folded) names, else the one FILE's name says: .txt,
    /// .json, .trace.json (Chrome trace), .folded, .svg (flame graph).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Detach after this many seconds (default: until Ctrl-C or the targets exit).
    #[arg(short, long, value_name = "SECS", value_parser = seconds)]
    pub duration: Option<f64>,
}

/// `tp run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Function to probe: `foo`, `libc:malloc`, a glob, `foo+0x1a`, `usdt:provider:name`
    /// (repeat for several); those of libraries the program loads later are probed when they appear.
    #[arg(short, long = "func", value_name = "NAME", required_unless_present = "lines")]
    pub funcs: Vec<String>,
    /// What to record and how to print it.
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Write the results to FILE instead of stderr (the program keeps
    /// stdout), in the format --format (or --json, --folded) names, else the
    /// one FILE's name says: .txt, .json, .trace.json, .folded, .svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

/// `tp status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The processes whose probes to show (default: every process that holds tp probes).
    #[command(flatten)]
    pub targets: Targets,
    /// Print one JSON object on stdout.
    #[arg(long, conflicts_with_all = ["openmetrics", "prometheus"])]
    pub json: bool,
    /// Print the OpenMetrics text format (what Prometheus scrapes).
    #[arg(long, conflicts_with = "prometheus")]
    pub openmetrics: bool,
    /// Print the Prometheus text format 0.0.4 (what node_exporter's textfile collector reads).
    #[arg(long)]
    pub prometheus: bool,
    /// The form of the results: text, json, openmetrics or prometheus
    /// (default: what -o FILE's name says, else text).
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub format: Option<StatusFormat>,
    /// Write to FILE instead of stdout, atomically (a temporary file renamed
    /// over it), in the format the flags name, else the one FILE's name
    /// says: .txt, .json, .om, .prom.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show the probes without hits too (the text summary leaves them out).
    #[arg(long)]
    pub all: bool,
    /// Show only the N busiest probes.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

/// `tp serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, such as 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Allow an address other than loopback (it exposes process and function names).
    #[arg(long)]
    pub listen_any: bool,
    /// The processes whose probes to serve (default: every process that holds tp probes, at each scrape).
    #[command(flatten)]
    pub targets: Targets,
}

/// `tp completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `tp man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The subcommand whose page to print (`tp man attach` is tp-attach(1)); default: tp(1).
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Option<String>,
    /// Write every page (tp.1, tp-attach.1, ...) into DIR instead.
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub dir: Option<PathBuf>,
}

/// `tp detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Process to clean; without it, every process that holds tp probes.
    #[arg(short, long)]
    pub pid: Option<i32>,
    /// Also remove the probes of tp sessions that are still running (they
    /// are left alone otherwise: each session restores its own when it ends).
    #[arg(long)]
    pub force: bool,
}

/// `tp list-probes`.
#[derive(Debug, Args)]
pub struct ListProbesArgs {
    /// Executable or shared library to inspect.
    #[arg(required_unless_present = "pid", conflicts_with = "pid")]
    pub binary: Option<PathBuf>,
    /// List every module of this running process instead.
    #[arg(short, long)]
    pub pid: Option<i32>,
    /// Show each function's signature from DWARF.
    #[arg(short, long)]
    pub verbose: bool,
    /// List where each source line of these functions starts, and whether each place can be probed.
    #[arg(long, value_name = "FUNCTION", conflicts_with_all = ["summary", "usdt"])]
    pub lines: Vec<String>,
    /// List the basic blocks of these functions, their source lines, and
    /// whether `--blocks` can count each (and why not).
    #[arg(long = "blocks", value_name = "FUNCTION", conflicts_with_all = ["summary", "usdt", "lines"])]
    pub blocks: Vec<String>,
    /// List the static probes (USDT, SystemTap SDT notes) instead: their sites, arguments and semaphores.
    #[arg(long, conflicts_with = "summary")]
    pub usdt: bool,
    /// Print totals and the most common refusal reasons instead of every function.
    #[arg(long)]
    pub summary: bool,
    /// One JSON object per line per function.
    #[arg(long)]
    pub json: bool,
}

/// `tp enable` and `tp disable`.
#[derive(Debug, Args)]
pub struct ToggleArgs {
    /// Process whose probes to switch.
    #[arg(short, long)]
    pub pid: i32,
    /// Probes to switch, by function name or glob (repeat for several).
    #[arg(short, long = "func", value_name = "NAME", required_unless_present = "all")]
    pub funcs: Vec<String>,
    /// Every probe of the process.
    #[arg(long, conflicts_with = "funcs")]
    pub all: bool,
}

/// `tp profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Process to profile.
    #[arg(short, long)]
    pub pid: i32,
    /// Functions to profile: names or globs such as `'*'` or `'libz:*'` (repeat for several).
    #[arg(short, long = "func", value_name = "GLOB", required = true)]
    pub funcs: Vec<String>,
    /// Timed calls per function per epoch, on average (at most twice as many).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=500_000))]
    pub sample: u32,
    /// How often tp adapts the sampling periods and renews the budgets: `10ms`, `500us`, `1s`.
    #[arg(long, value_name = "TIME", default_value = "10ms", value_parser = parse_time)]
    pub epoch: std::time::Duration,
    /// Stop after this many seconds (default: Ctrl-C or the target's exit).
    #[arg(short, long, value_name = "SECS", value_parser = seconds)]
    pub duration: Option<f64>,
    /// Write the results to FILE instead of stdout, in the format the flags
    /// name, else the one FILE's name says: .txt, .json, .trace.json (the
    /// sampled calls as a Chrome trace).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the results as one JSON document: `--format json`.
    #[arg(long)]
    pub json: bool,
    /// The form of the results: text, json or chrome (default: what -o
    /// FILE's name says, else text).
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub format: Option<ProfileFormat>,
    /// Show the functions that were not called too (the text leaves them out).
    #[arg(long)]
    pub all: bool,
    /// Show only the N functions with the most time (default in text: 40).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

/// Parses `10ms`, `500us`, `2s`.
fn parse_time(s: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("`{s}` is not a time like 10ms, 500us or 1s");
    let (num, unit) = s.find(|c: char| c.is_ascii_alphabetic()).map_or((s, "ms"), |i| s.split_at(i));
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        _ => return Err(bad()),
    };
    if !(secs > 0.0 && secs < 3600.0) {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
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

/// The most events a ring holds (`probe::layout::MAX_RING_LEN`).
pub const MAX_RING_SIZE: u32 = 1 << 20;

/// A ring size: a power of two from 4 to [`MAX_RING_SIZE`].
fn ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|_| format!("`{s}` is not a number of events"))?;
    if n.is_power_of_two() && (4..=MAX_RING_SIZE).contains(&n) {
        return Ok(n);
    }
    let below = if n >= 4 { 1u32 << (31 - n.leading_zeros()).min(20) } else { 4 };
    let above = n.checked_next_power_of_two().unwrap_or(MAX_RING_SIZE).clamp(4, MAX_RING_SIZE);
    let nearest = if below == above { below.to_string() } else { format!("{below} or {above}") };
    Err(format!("{n} is not a power of two from 4 to {MAX_RING_SIZE}; try {nearest}"))
}

/// Parses `0x1234` (or `1234`) as a hexadecimal address.
fn parse_addr(s: &str) -> Result<u64, String> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| format!("`{s}` is not a hexadecimal address (like 0x401136)"))
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
            assert_eq!(a.targets.pids, [12]);
            assert_eq!(a.funcs, ["foo", "bar"]);
            assert!(!a.keep && !a.probe.json && a.duration.is_none());
        }
    }

    #[test]
    fn attach_needs_a_function_or_an_address() {
        let err = parse("tp attach -p 12").unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let Command::Attach(a) = parse("tp attach -p 12 --addr 0x401136 --addr 7f00").unwrap().command else {
            panic!()
        };
        assert_eq!(a.addrs, [0x401136, 0x7f00]);
        assert!(a.funcs.is_empty());
        assert_eq!(parse("tp attach -p 1 --addr zz").unwrap_err().kind(), clap::error::ErrorKind::ValueValidation);
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
    fn profile_duration_must_fit_a_duration_too() {
        for bad in ["nan", "inf", "-1", "1e20", "1e300"] {
            let err = Cli::try_parse_from(["tp", "profile", "-p", "1", "-f", "*", &format!("--duration={bad}")]);
            assert_eq!(err.unwrap_err().kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        let Command::Profile(p) = parse("tp profile -p 1 -f * -d 2.5").unwrap().command else { panic!() };
        assert_eq!(p.duration, Some(2.5));
    }

    #[test]
    fn keep_conflicts_with_duration_and_events() {
        for extra in [
            "--duration 3",
            "--args",
            "--tree",
            "-o t.json",
            "--follow-exec",
            "--listen 127.0.0.1:1",
            "--stack",
            "--if arg0==1",
        ] {
            let err = parse(&format!("tp attach -p 1 -f foo --keep {extra}")).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{extra}");
        }
        // Aggregates stay in the target, where `tp status` reads them.
        for extra in ["--by arg0", "--agg count()"] {
            assert!(parse(&format!("tp attach -p 1 -f foo --keep {extra}")).is_ok(), "{extra}");
        }
    }

    #[test]
    fn event_flags_parse() {
        let Command::Attach(a) =
            parse("tp attach -p 1 -f foo --args --ret -q -o t.json --ring-size 64").unwrap().command
        else {
            panic!()
        };
        assert!(a.probe.args.is_some() && a.probe.ret && a.probe.quiet);
        assert_eq!((a.output, a.probe.ring_size), (Some(PathBuf::from("t.json")), Some(64)));
        // `--args EXPR` names the values; alone it shows every argument.
        let Command::Attach(a) = parse("tp attach -p 1 -f foo --args req->len -q").unwrap().command else { panic!() };
        assert_eq!(a.probe.args.as_deref(), Some("req->len"));
        let Command::Run(r) = parse("tp run -f foo --args -- ./prog x").unwrap().command else { panic!() };
        assert_eq!((r.probe.args.as_deref(), r.command.len()), (Some(""), 2));
    }

    #[test]
    fn stack_predicate_and_by_flags_parse() {
        let Command::Attach(a) = parse("tp attach -p 1 -f foo --stack --if arg0>3 --by n").unwrap().command else {
            panic!()
        };
        assert_eq!(a.probe.stack, Some(StackHow::Fp));
        assert_eq!(
            (a.probe.stack_depth, a.probe.predicate.as_deref(), a.probe.by.as_deref()),
            (30, Some("arg0>3"), Some("n"))
        );
        let Command::Attach(a) =
            parse("tp attach -p 1 -f foo --stack=dwarf --stack-size 8192 --folded -o f.svg").unwrap().command
        else {
            panic!()
        };
        assert_eq!((a.probe.stack, a.probe.stack_size, a.probe.folded), (Some(StackHow::Dwarf), 8192, true));
        assert!(parse("tp attach -p 1 -f foo --stack=lbr").is_err());
        assert!(
            parse("tp attach -p 1 -f foo --folded").is_ok(),
            "--folded is checked with the other options (--stack or --steps)"
        );
        assert!(parse("tp attach -p 1 -f foo --stack --stack-depth 500").is_err());
    }

    #[test]
    fn closed_sets_of_values_parse_to_their_variants() {
        let Command::Attach(a) = parse("tp attach -p 1 -f foo --steps").unwrap().command else { panic!() };
        assert_eq!((a.probe.step_engine, a.probe.format), (StepEngine::Ptrace, None));
        let Command::Attach(a) =
            parse("tp attach -p 1 -f foo --steps --step-engine trap --format folded").unwrap().command
        else {
            panic!()
        };
        assert_eq!((a.probe.step_engine, a.probe.format), (StepEngine::Trap, Some(ProbeFormat::Folded)));
        let err = parse("tp attach -p 1 -f foo --steps --step-engine gdb").unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let Command::Status(s) = parse("tp status --format openmetrics").unwrap().command else { panic!() };
        assert_eq!(s.format, Some(StatusFormat::OpenMetrics));
        let Command::Profile(p) = parse("tp profile -p 1 -f * --format chrome").unwrap().command else { panic!() };
        assert_eq!(p.format, Some(ProfileFormat::Chrome));
        for (line, kind) in [
            ("tp profile -p 1 -f * --format svg", clap::error::ErrorKind::InvalidValue),
            ("tp status --format chrome", clap::error::ErrorKind::InvalidValue),
        ] {
            assert_eq!(parse(line).unwrap_err().kind(), kind, "{line}");
        }
    }

    #[test]
    fn ring_size_is_a_power_of_two_in_range() {
        assert_eq!(ring_size("64"), Ok(64));
        assert_eq!(ring_size("1048576"), Ok(1 << 20));
        assert_eq!(ring_size("1000"), Err("1000 is not a power of two from 4 to 1048576; try 512 or 1024".into()));
        assert_eq!(ring_size("0"), Err("0 is not a power of two from 4 to 1048576; try 4".into()));
        assert_eq!(ring_size("2"), Err("2 is not a power of two from 4 to 1048576; try 4".into()));
        assert_eq!(ring_size("4194304"), Err("4194304 is not a power of two from 4 to 1048576; try 1048576".into()));
        assert!(ring_size("many").is_err());
        assert!(parse("tp attach -p 1 -f foo --ring-size 1000").is_err());
    }

    #[test]
    fn detach_pid_is_optional() {
        let Command::Detach(d) = parse("tp detach").unwrap().command else { panic!() };
        assert_eq!(d.pid, None);
        let Command::Detach(d) = parse("tp detach -p 7").unwrap().command else { panic!() };
        assert_eq!((d.pid, d.force), (Some(7), false));
        let Command::Detach(d) = parse("tp detach --force").unwrap().command else { panic!() };
        assert_eq!((d.pid, d.force), (None, true));
    }

    #[test]
    fn list_probes_takes_a_path_and_flags() {
        let Command::ListProbes(l) = parse("tp list-probes /bin/true --summary").unwrap().command else { panic!() };
        assert_eq!(l.binary, Some(PathBuf::from("/bin/true")));
        assert!(l.summary && !l.json && !l.verbose);
        let Command::ListProbes(l) = parse("tp list-probes -p 42 -v").unwrap().command else { panic!() };
        assert_eq!((l.pid, l.binary, l.verbose), (Some(42), None, true));
        assert!(parse("tp list-probes").is_err());
        assert!(parse("tp list-probes /bin/true -p 3").is_err());
    }

    #[test]
    fn lines_and_sites_parse() {
        let Command::Attach(a) = parse("tp attach -p 1 --line counter.c:42 --line bar:7").unwrap().command else {
            panic!()
        };
        assert!(a.funcs.is_empty());
        assert_eq!(a.probe.lines, ["counter.c:42", "bar:7"]);
        let Command::Run(r) = parse("tp run --line x.c:3 -- /bin/true").unwrap().command else { panic!() };
        assert_eq!(r.probe.lines, ["x.c:3"]);
        assert!(parse("tp run -- /bin/true").is_err());
        let Command::ListProbes(l) = parse("tp list-probes /bin/true --lines main").unwrap().command else { panic!() };
        assert_eq!(l.lines, ["main"]);
        assert!(parse("tp list-probes /bin/true --lines main --usdt").is_err());
        let Command::ListProbes(l) = parse("tp list-probes /bin/true --usdt").unwrap().command else { panic!() };
        assert!(l.usdt);
    }

    #[test]
    fn blocks_parse_and_count_only() {
        let Command::Attach(a) = parse("tp attach -p 1 -f shape --blocks").unwrap().command else { panic!() };
        assert!(a.probe.blocks && a.funcs == ["shape"]);
        let Command::Run(r) = parse("tp run -f shape --blocks -- /bin/true").unwrap().command else { panic!() };
        assert!(r.probe.blocks);
        for with in ["--ret", "--args", "--stack", "--by x", "--if x>1"] {
            assert!(parse(&format!("tp attach -p 1 -f shape --blocks {with}")).is_err(), "{with}");
        }
        let Command::ListProbes(l) = parse("tp list-probes /bin/true --blocks main").unwrap().command else { panic!() };
        assert_eq!(l.blocks, ["main"]);
        assert!(parse("tp list-probes /bin/true --blocks main --lines main").is_err());
    }

    #[test]
    fn toggles_and_profile_parse() {
        let Command::Disable(t) = parse("tp disable -p 5 -f foo -f 'ba*'").unwrap().command else { panic!() };
        assert_eq!((t.pid, t.funcs.len(), t.all), (5, 2, false));
        let Command::Enable(t) = parse("tp enable -p 5 --all").unwrap().command else { panic!() };
        assert!(t.all && t.funcs.is_empty());
        assert!(parse("tp enable -p 5").is_err());
        let Command::Profile(p) = parse("tp profile -p 9 -f * --sample 5 --epoch 500us -d 2").unwrap().command else {
            panic!()
        };
        assert_eq!((p.sample, p.epoch, p.duration), (5, std::time::Duration::from_micros(500), Some(2.0)));
        let Command::Profile(p) = parse("tp profile -p 9 -f *").unwrap().command else { panic!() };
        assert_eq!((p.sample, p.epoch), (10, std::time::Duration::from_millis(10)));
        assert!(parse("tp profile -p 9 -f * --epoch 10lightyears").is_err());
    }

    #[test]
    fn status_and_demo_parse() {
        let Command::Status(s) = parse("tp status -p 3 --json").unwrap().command else { panic!() };
        assert!(s.json && s.targets.pids == [3]);
        let Command::Demo(d) = parse("tp demo -d 2").unwrap().command else { panic!() };
        assert_eq!(d.duration, 2.0);
    }

    #[test]
    fn several_processes_by_pid_and_name() {
        let Command::Attach(a) = parse("tp attach -p 1,2 -p 3 -f foo").unwrap().command else { panic!() };
        assert_eq!(a.targets.pids, [1, 2, 3]);
        let Command::Attach(a) = parse("tp attach --name nginx -f foo --follow-exec").unwrap().command else {
            panic!()
        };
        assert_eq!((a.targets.name.as_deref(), a.targets.pids.len(), a.probe.follow_exec), (Some("nginx"), 0, true));
        assert!(parse("tp attach -p 1,x -f foo").is_err());
    }

    #[test]
    fn run_takes_the_program_after_its_options() {
        let Command::Run(r) = parse("tp run -f foo --ret -- ./prog -x --y z").unwrap().command else { panic!() };
        assert_eq!(r.funcs, ["foo"]);
        assert!(r.probe.ret);
        assert_eq!(r.command, ["./prog", "-x", "--y", "z"]);
        let Command::Run(r) = parse("tp run -f foo -o out.txt prog").unwrap().command else { panic!() };
        assert_eq!((r.command.len(), r.output), (1, Some(PathBuf::from("out.txt"))));
        assert!(parse("tp run -f foo").is_err(), "a program is required");
        assert!(parse("tp run -- prog").is_err(), "a function is required");
    }

    #[test]
    fn metrics_commands_parse() {
        let Command::Status(s) = parse("tp status --openmetrics -o m.prom").unwrap().command else { panic!() };
        assert!(s.openmetrics && s.targets.pids.is_empty() && s.output.is_some());
        assert!(parse("tp status --openmetrics --json").is_err());
        assert!(parse("tp status --openmetrics --prometheus").is_err());
        let Command::Serve(s) = parse("tp serve --listen 127.0.0.1:9464 -p 4").unwrap().command else { panic!() };
        assert_eq!((s.listen.as_str(), s.targets.pids.as_slice(), s.listen_any), ("127.0.0.1:9464", &[4][..], false));
        assert!(parse("tp serve").is_err());
        assert!(parse("tp attach -p 1 -f foo --listen-any").is_err(), "--listen-any needs --listen");
    }

    #[test]
    fn completions_and_man_parse() {
        let Command::Completions(c) = parse("tp completions bash").unwrap().command else { panic!() };
        assert_eq!(c.shell, clap_complete::Shell::Bash);
        assert!(parse("tp completions tcsh").is_err());
        let Command::Man(m) = parse("tp man attach").unwrap().command else { panic!() };
        assert_eq!(m.subcommand.as_deref(), Some("attach"));
        assert!(parse("tp man attach --dir /tmp").is_err());
    }
}
