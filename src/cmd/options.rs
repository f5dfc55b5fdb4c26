//! The command line into session options, for every command that shares
//! a part of it: what to probe and record (`tp attach`, `tp run`), and
//! which processes (`tp attach`, `tp status`, `tp serve`). Commands import
//! this module, never one another.

use std::path::Path;

use anyhow::{Result, bail};

use crate::addr::RuntimeAddr;
use crate::cli::{ProbeArgs, Targets};
use crate::output::events::Style;
use crate::output::format::{self, Format};
use crate::output::report::View;
use crate::probe::layout::{DEFAULT_RING_LEN, kind};
use crate::session::steps::StepOptions;
use crate::session::targets::Which;
use crate::session::{Options, Selection, StackMode};

/// Events per ring when stacks are recorded and `--ring-size` is not given.
const STACK_RING_LEN: u32 = 1 << 16;

/// The selection and output options `tp attach` and `tp run` share;
/// `output` is `-o FILE`. Refused before anything is touched: formats that
/// disagree, a file name that says none, a format the session cannot
/// produce (a flame graph without stacks, a trace without calls).
pub fn options(
    command: &str,
    pid: i32,
    funcs: &[String],
    addrs: &[u64],
    probe: &ProbeArgs,
    output: Option<&Path>,
) -> Result<Options> {
    let mut k = kind::COUNT;
    if probe.args.is_some() {
        k |= kind::ARGS;
    }
    if probe.ret {
        k |= kind::RET;
    }
    if probe.steps.is_some() {
        k |= kind::STEP;
    }
    if probe.tree {
        // A tree shows every call's entry and exit.
        k |= kind::ARGS | kind::RET;
    }
    let stack = probe.stack.as_deref().map(|how| match how {
        "dwarf" => StackMode::Unwind { bytes: probe.stack_size, depth: probe.stack_depth },
        _ => StackMode::FramePointers { depth: probe.stack_depth },
    });
    if stack.is_some() {
        // A stack comes with its call's entry event.
        k |= kind::ARGS | kind::STACK;
    }
    crate::session::check_aggregation(probe.by.as_deref(), probe.agg.as_deref())?;
    if probe.by.is_some() || probe.agg.is_some() {
        k |= kind::BY;
    }
    if crate::session::aggregates_latency(probe.agg.as_deref()) {
        // A duration is the exit's: the call is timed as --ret times it.
        k |= kind::RET;
    }
    if probe.predicate.is_some() && k & kind::CALLS_AT_ENTRY == 0 {
        // A predicate alone selects the calls to show.
        k |= kind::ARGS;
    }
    let format = format::choose(
        command,
        &[(probe.json, Format::Json), (probe.folded, Format::Folded)],
        probe.format.as_deref(),
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
        Format::Chrome if k & (kind::ARGS | kind::RET) == 0 => {
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
        trap_steps: (probe.steps.is_some() && probe.step_engine == "trap").then_some(probe.step_limit),
        ..Selection::new(funcs.iter().cloned().chain(lines).collect(), k)
    };
    let style = match format {
        _ if probe.quiet => Style::Quiet,
        Format::Text => Style::Text,
        Format::Json => Style::Json,
        _ => Style::Quiet,
    };
    let view = View { all: probe.all, top: probe.top };
    if probe.step_engine == "trap" && probe.step_depth.is_some() {
        bail!("--step-depth needs --step-engine ptrace: the in-target engine steps every call the stepped one makes");
    }
    if probe.tree && !matches!(format, Format::Text | Format::Json) {
        bail!("--tree shows the calls as text or JSON lines, not as {}", format.name());
    }
    Ok(Options {
        style,
        format,
        view,
        output: output.map(Path::to_path_buf),
        tree: probe.tree,
        steps: probe.steps.map(|_| StepOptions {
            limit: probe.step_limit,
            depth: probe.step_depth,
            in_target: probe.step_engine == "trap",
        }),
        ..Options::new(pid, selection)
    })
}

/// Settles what the options ask for once every flag is known: return
/// probes whose events nobody reads (only the summary, no trace, no
/// arguments or stacks) keep their durations in the target's histograms
/// instead of sending an event per call (`TP_AGGREGATE=0` sends the events
/// still, for the benchmark's rows that measure them).
pub fn settle(mut opts: Options) -> Options {
    let k = opts.selection.kind;
    // `--agg` of latency keeps the durations in the target in any style:
    // it asks for no event.
    if (opts.style == Style::Quiet || crate::session::aggregates_latency(opts.selection.agg.as_deref()))
        && opts.format != Format::Chrome
        && k & kind::RET != 0
        && k & (kind::ARGS | kind::STACK | kind::SAMPLE) == 0
        && std::env::var("TP_AGGREGATE").as_deref() != Ok("0")
    {
        opts.selection.kind |= kind::AGGREGATE;
    }
    opts
}

/// The processes named on the command line.
pub fn which(t: &Targets) -> Which {
    Which { pids: t.pids.clone(), name: t.name.clone() }
}
