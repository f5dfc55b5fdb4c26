//! The command line into session options, for every command that runs a
//! session: [`Options::from_cli`] is the one way from what clap parsed
//! (`tp attach`, `tp run`, `tp profile`, `tp demo`) to what the session
//! engine is asked, every refusal of the command line's included; and
//! which processes a command names (`tp attach`, `tp status`, `tp serve`),
//! the form of `tp status`'s results and what `tp list-probes` lists.
//! The command line's closed sets of values (`--stack`, `--step-engine`,
//! `--format`) arrive typed, and become the engine's and the output's
//! types here.
//! Commands import this module, never one another.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::addr::RuntimeAddr;
use crate::cli::{
    AttachArgs, DemoArgs, ListProbesArgs, ProbeArgs, ProbeFormat, ProfileArgs, ProfileFormat, RunArgs, StackHow,
    StatusArgs, StatusFormat, StepEngine, Targets,
};
use crate::output::format::{self, Format};
use crate::output::report::View;
use crate::probe::layout::DEFAULT_RING_LEN;
use crate::session::probeable::Source;
use crate::session::steps::StepOptions;
use crate::session::targets::Which;
use crate::session::{Listen, Options, Records, Selection, StackMode, profile};

/// Events per ring when stacks are recorded and `--ring-size` is not given.
const STACK_RING_LEN: u32 = 1 << 16;

/// A command line that runs a session, as clap parsed it.
#[derive(Debug, Clone, Copy)]
pub enum CommandLine<'a> {
    /// `tp attach`.
    Attach(&'a AttachArgs),
    /// `tp run`.
    Run(&'a RunArgs),
    /// `tp profile`.
    Profile(&'a ProfileArgs),
    /// `tp demo`, in the process it started (its PID).
    Demo(&'a DemoArgs, i32),
}

impl Options {
    /// The session options `line` asks for, refused before anything is
    /// touched when its flags cannot be: formats that disagree, a file name
    /// that says none, a format the session cannot produce (a flame graph
    /// without stacks, a trace without calls), flags that do not fit
    /// together.
    pub fn from_cli(line: CommandLine<'_>) -> Result<Options> {
        let opts = match line {
            CommandLine::Attach(args) => Options {
                keep: args.keep,
                duration: args.duration.map(Duration::from_secs_f64),
                ..probing(
                    "attach",
                    args.targets.pids.first().copied().unwrap_or(0),
                    &args.funcs,
                    &args.addrs,
                    &args.probe,
                    args.output.as_deref(),
                )?
            },
            CommandLine::Run(args) => {
                let opts = probing("run", 0, &args.funcs, &[], &args.probe, args.output.as_deref())?;
                if opts.format != Format::Text && opts.output.is_none() {
                    // stdout is the program's, stderr carries tp's notes.
                    bail!(
                        "`tp run` writes {} results to a file: add -o FILE (its program keeps stdout, and stderr \
                         carries tp's lines)",
                        opts.format.name()
                    );
                }
                opts
            }
            CommandLine::Profile(args) => profiling(args)?,
            CommandLine::Demo(args, pid) => {
                let selection = Selection::new(vec!["foo".to_string(), "bar".to_string()], Records::COUNT);
                Options {
                    duration: Some(Duration::from_secs_f64(args.duration)),
                    // Every row of the summary, hits or not.
                    view: View { all: true, top: None },
                    ..Options::new(pid, selection)
                }
            }
        };
        Ok(settle(opts))
    }
}

/// The selection and output options `tp attach` and `tp run` share;
/// `output` is `-o FILE`.
fn probing(
    command: &str,
    pid: i32,
    funcs: &[String],
    addrs: &[u64],
    probe: &ProbeArgs,
    output: Option<&Path>,
) -> Result<Options> {
    let in_target = probe.step_engine == StepEngine::Trap;
    let stack = probe.stack.map(|how| match how {
        StackHow::Dwarf => StackMode::Unwind { bytes: probe.stack_size, depth: probe.stack_depth },
        StackHow::Fp => StackMode::FramePointers { depth: probe.stack_depth },
    });
    crate::session::check_aggregation(probe.by.as_deref(), probe.agg.as_deref())?;
    let mut records = Records {
        // A tree shows every call's entry and exit; a stack comes with its
        // call's entry event.
        args: probe.args.is_some() || probe.tree || stack.is_some(),
        // A duration is the exit's: `--agg` of latency times the call as
        // --ret times it.
        ret: probe.ret || probe.tree || crate::session::aggregates_latency(probe.agg.as_deref()),
        stack: stack.is_some(),
        by: probe.by.is_some() || probe.agg.is_some(),
        step: probe.steps.is_some(),
        ..Records::COUNT
    };
    if probe.predicate.is_some() && !records.calls_at_entry() {
        // A predicate alone selects the calls to show.
        records.args = true;
    }
    let format = format::choose(
        command,
        &[(probe.json, Format::Json), (probe.folded, Format::Folded)],
        probe.format.map(Format::from),
        output,
        &[Format::Text, Format::Json, Format::Chrome, Format::Folded, Format::Svg],
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    match format {
        Format::Svg | Format::Folded if stack.is_none() && probe.steps.is_none() => bail!(
            "a {} shows stacks: add --stack (or --stack=dwarf for code built without frame pointers), or the \
             instructions of stepped calls: add --steps",
            if format == Format::Svg { "flame graph" } else { "folded output" }
        ),
        Format::Chrome if !records.args && !records.ret => {
            bail!("a Chrome trace shows calls: add --args or --ret (or --stack) to record them")
        }
        _ => {}
    }
    // A source line is a pattern of its own (`line:FILE:N`): it follows
    // libraries loaded later as the others do.
    let lines = probe.lines.iter().map(|l| format!("line:{l}"));
    // So are a function's blocks (`blocks:NAME`).
    let funcs: Vec<String> = match probe.blocks {
        true => funcs.iter().map(|f| format!("blocks:{f}")).collect(),
        false => funcs.to_vec(),
    };
    let selection = Selection {
        addrs: addrs.iter().copied().map(RuntimeAddr).collect(),
        // A stack takes several of the ring's events (a 4 KiB copy 75).
        ring_len: probe.ring_size.unwrap_or(if stack.is_some() { STACK_RING_LEN } else { DEFAULT_RING_LEN }),
        predicate: probe.predicate.clone(),
        picks: probe.args.clone().filter(|a| !a.trim().is_empty()),
        by: probe.by.clone(),
        agg: probe.agg.clone(),
        stack,
        step_calls: probe.steps.unwrap_or(0),
        trap_steps: (probe.steps.is_some() && in_target).then_some(probe.step_limit),
        ..Selection::new(funcs.iter().cloned().chain(lines).collect(), records)
    };
    let view = View { all: probe.all, top: probe.top };
    if in_target && probe.step_depth.is_some() {
        bail!("--step-depth needs --step-engine ptrace: the in-target engine steps every call the stepped one makes");
    }
    if probe.tree && !matches!(format, Format::Text | Format::Json) {
        bail!("--tree shows the calls as text or JSON lines, not as {}", format.name());
    }
    Ok(Options {
        quiet: probe.quiet,
        format,
        view,
        output: output.map(Path::to_path_buf),
        tree: probe.tree,
        steps: probe.steps.map(|_| StepOptions { limit: probe.step_limit, depth: probe.step_depth, in_target }),
        follow_exec: probe.follow_exec,
        listen: probe.listen.clone().map(|addr| Listen { addr, any: probe.listen_any }),
        ..Options::new(pid, selection)
    })
}

/// `tp profile`'s options: its format, its sampling.
fn profiling(args: &ProfileArgs) -> Result<Options> {
    let format = format::choose(
        "profile",
        &[(args.json, Format::Json)],
        args.format.map(Format::from),
        args.output.as_deref(),
        crate::output::profile::FORMATS,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Options {
        duration: args.duration.map(Duration::from_secs_f64),
        format,
        view: View { all: args.all, top: args.top },
        output: args.output.clone(),
        samples_per_epoch: args.sample,
        epoch: args.epoch,
        ..Options::new(args.pid, profile::selection(args.funcs.clone(), args.sample))
    })
}

/// Settles what the options ask for once every flag is known: return
/// probes whose events nobody reads keep their durations in the target's
/// histograms instead of sending an event per call. Nobody reads a kept
/// probe's events (its threads keep the durations where `tp status` reads
/// them), nor a session's that shows only the summary, with no trace, no
/// arguments or stacks (`TP_AGGREGATE=0` sends its events still, for the
/// benchmark's rows that measure them).
fn settle(mut opts: Options) -> Options {
    let r = opts.selection.records;
    // `--agg` of latency keeps the durations in the target in any style:
    // it asks for no event.
    let latency = crate::session::aggregates_latency(opts.selection.agg.as_deref());
    let unread = || {
        (opts.event_lines().is_none() || latency)
            && opts.format != Format::Chrome
            && !(r.args || r.stack || r.sample)
            && std::env::var("TP_AGGREGATE").as_deref() != Ok("0")
    };
    if r.ret && (opts.keep || unread()) {
        opts.selection.records.aggregate = true;
    }
    opts
}

impl From<ProbeFormat> for Format {
    fn from(f: ProbeFormat) -> Format {
        match f {
            ProbeFormat::Text => Format::Text,
            ProbeFormat::Json => Format::Json,
            ProbeFormat::Chrome => Format::Chrome,
            ProbeFormat::Folded => Format::Folded,
            ProbeFormat::Svg => Format::Svg,
        }
    }
}

impl From<ProfileFormat> for Format {
    fn from(f: ProfileFormat) -> Format {
        match f {
            ProfileFormat::Text => Format::Text,
            ProfileFormat::Json => Format::Json,
            ProfileFormat::Chrome => Format::Chrome,
        }
    }
}

impl From<StatusFormat> for Format {
    fn from(f: StatusFormat) -> Format {
        match f {
            StatusFormat::Text => Format::Text,
            StatusFormat::Json => Format::Json,
            StatusFormat::OpenMetrics => Format::OpenMetrics,
            StatusFormat::Prometheus => Format::Prometheus,
        }
    }
}

/// The processes named on the command line.
pub fn which(t: &Targets) -> Which {
    Which { pids: t.pids.clone(), name: t.name.clone() }
}

/// The form of `tp status`'s results: the format its flags and `-o FILE`
/// name, and how the table shows its rows.
pub fn status_form(args: &StatusArgs) -> Result<(Format, View)> {
    let format = format::choose(
        "status",
        &[(args.json, Format::Json), (args.openmetrics, Format::OpenMetrics), (args.prometheus, Format::Prometheus)],
        args.format.map(Format::from),
        args.output.as_deref(),
        &[Format::Text, Format::Json, Format::OpenMetrics, Format::Prometheus],
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((format, View { all: args.all, top: args.top }))
}

/// What `tp list-probes` lists: a binary, or a process's modules.
pub fn listed(args: &ListProbesArgs) -> Result<Source<'_>> {
    match (&args.binary, args.pid) {
        (Some(path), None) => Ok(Source::Binary(path)),
        (None, Some(pid)) => Ok(Source::Process(pid)),
        _ => bail!("give either a binary or --pid, not both"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::probe::layout::kind;
    use clap::Parser;

    /// The options of a command line, as `tp` would build them.
    fn options_of(line: &str) -> Result<Options> {
        let cli = Cli::try_parse_from(line.split_whitespace()).unwrap();
        match &cli.command {
            Command::Attach(a) => Options::from_cli(CommandLine::Attach(a)),
            Command::Run(r) => Options::from_cli(CommandLine::Run(r)),
            Command::Profile(p) => Options::from_cli(CommandLine::Profile(p)),
            Command::Demo(d) => Options::from_cli(CommandLine::Demo(d, 7)),
            other => panic!("no session options for {other:?}"),
        }
    }

    #[test]
    fn each_flag_records_what_its_probes_need() {
        // Durations nobody reads stay in the target, unless TP_AGGREGATE=0.
        let quiet = match std::env::var("TP_AGGREGATE").as_deref() {
            Ok("0") => 0,
            _ => kind::AGGREGATE,
        };
        for (flags, bits) in [
            ("", kind::COUNT),
            ("--args", kind::ARGS),
            ("--ret", kind::RET),
            ("--tree", kind::ARGS | kind::RET),
            ("--stack", kind::ARGS | kind::STACK),
            ("--stack=dwarf -q", kind::ARGS | kind::STACK),
            ("--if a>1", kind::ARGS),
            ("--if ret>1 --ret", kind::RET),
            ("--by a", kind::BY),
            ("--agg sum(a)", kind::BY),
            ("--if a>1 --by a", kind::BY),
            ("--steps", kind::STEP),
            ("--ret -q", kind::RET | quiet),
            ("--ret -q --args", kind::RET | kind::ARGS),
            ("--ret -q -o t.trace.json", kind::RET),
            ("--ret --keep", kind::RET | kind::AGGREGATE),
            ("--keep", kind::COUNT),
        ] {
            let opts = options_of(&format!("tp attach -p 1 -f foo {flags}")).unwrap();
            assert_eq!(opts.selection.records.bits(), bits, "{flags}");
        }
        let run = options_of("tp run -f foo --ret -q -- /bin/true").unwrap();
        assert_eq!(run.selection.records.bits(), kind::RET | quiet);
        let profile = options_of("tp profile -p 1 -f *").unwrap();
        assert_eq!(profile.selection.records.bits(), kind::RET | kind::SAMPLE);
        let demo = options_of("tp demo").unwrap();
        assert_eq!((demo.pid, demo.selection.records.bits()), (7, kind::COUNT));
    }

    #[test]
    fn typed_values_become_the_engines() {
        let opts = options_of("tp attach -p 1 -f foo --stack=dwarf --stack-size 8192 --stack-depth 9").unwrap();
        assert_eq!(opts.selection.stack, Some(StackMode::Unwind { bytes: 8192, depth: 9 }));
        let opts = options_of("tp attach -p 1 -f foo --stack --format json").unwrap();
        assert_eq!((opts.selection.stack, opts.format), (Some(StackMode::FramePointers { depth: 30 }), Format::Json));
        let opts = options_of("tp attach -p 1 -f foo --steps 2 --step-engine trap --step-limit 50").unwrap();
        let steps = opts.steps.unwrap();
        assert_eq!((steps.in_target, steps.limit, opts.selection.trap_steps), (true, 50, Some(50)));
        let opts = options_of("tp attach -p 1 -f foo --steps --step-depth 3").unwrap();
        assert_eq!((opts.steps.unwrap().in_target, opts.selection.trap_steps), (false, None));
        let refused = options_of("tp attach -p 1 -f foo --steps --step-engine trap --step-depth 3").unwrap_err();
        assert!(refused.to_string().starts_with("--step-depth needs --step-engine ptrace"), "{refused}");
    }

    #[test]
    fn the_session_is_told_where_to_serve_and_whether_to_follow_exec() {
        let opts = options_of("tp attach -p 1 -f foo --listen 127.0.0.1:9464 --follow-exec").unwrap();
        assert_eq!(opts.listen, Some(Listen { addr: "127.0.0.1:9464".into(), any: false }));
        assert!(opts.follow_exec);
        let opts = options_of("tp run -f foo --listen 0.0.0.0:1 --listen-any -- /bin/true").unwrap();
        assert_eq!((opts.listen.map(|l| l.any), opts.follow_exec), (Some(true), false));
        // `tp run`'s stdout is its program's: other formats go to a file.
        let refused = options_of("tp run -f foo --json -- /bin/true").unwrap_err();
        assert!(refused.to_string().starts_with("`tp run` writes json results to a file: add -o FILE"), "{refused}");
        assert!(options_of("tp run -f foo -o calls.json -- /bin/true").is_ok());
    }
}
