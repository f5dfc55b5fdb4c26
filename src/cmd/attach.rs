//! `tp attach`: probe functions of running processes (`-p`, repeated or a
//! comma list, and `--name`), show live counts (and events, with
//! `--args`/`--ret`), and on Ctrl-C, `--duration` or the targets' exit,
//! restore the code and print a summary (per process and in total when
//! there are several). With `--keep`, install and exit instead; with
//! `--listen`, serve the session's metrics over HTTP meanwhile.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};

use super::serve;
use crate::addr::RuntimeAddr;
use crate::cli::{AttachArgs, ProbeArgs, Targets};
use crate::output::events::Style;
use crate::output::sink::Sink;
use crate::probe::layout::{DEFAULT_RING_LEN, kind};
use crate::session::group::{Behaviour, Group};
use crate::session::targets::Which;
use crate::session::tracer::{TraceOutput, open_chrome};
use crate::session::{Options, Selection, StackMode, interrupt};

/// Events per ring when stacks are recorded and `--ring-size` is not given.
const STACK_RING_LEN: u32 = 1 << 16;

/// The selection and output options `tp attach` and `tp run` share.
pub fn options(pid: i32, funcs: &[String], addrs: &[u64], probe: &ProbeArgs) -> Options {
    let mut k = kind::COUNT;
    if probe.args {
        k |= kind::ARGS;
    }
    if probe.ret {
        k |= kind::RET;
    }
    let stack = probe.stack.as_deref().map(|how| match how {
        "dwarf" => StackMode::Unwind { bytes: probe.stack_size, depth: probe.stack_depth },
        _ => StackMode::FramePointers { depth: probe.stack_depth },
    });
    if stack.is_some() {
        // A stack comes with its call's entry event.
        k |= kind::ARGS | kind::STACK;
    }
    if probe.by.is_some() {
        k |= kind::BY;
    }
    if probe.predicate.is_some() && k & kind::CALLS_AT_ENTRY == 0 {
        // A predicate alone selects the calls to show.
        k |= kind::ARGS;
    }
    // A source line is a pattern of its own (`line:FILE:N`): it follows
    // libraries loaded later as the others do.
    let lines = probe.lines.iter().map(|l| format!("line:{l}"));
    let selection = Selection {
        addrs: addrs.iter().copied().map(RuntimeAddr).collect(),
        // A stack takes several of the ring's events (a 4 KiB copy 75).
        ring_len: probe.ring_size.unwrap_or(if stack.is_some() { STACK_RING_LEN } else { DEFAULT_RING_LEN }),
        predicate: probe.predicate.clone(),
        by: probe.by.clone(),
        stack,
        ..Selection::new(funcs.iter().cloned().chain(lines).collect(), k)
    };
    let style = if probe.quiet {
        Style::Quiet
    } else if probe.json {
        Style::Json
    } else {
        Style::Text
    };
    Options { style, json: probe.json, folded: probe.folded, ..Options::new(pid, selection) }
}

/// Settles what the options ask for once every flag is known: a trace file
/// ending in `.svg` is the stacks' flame graph; return probes whose events
/// nobody reads (only the summary, no trace file, no arguments or stacks)
/// keep their durations in the target's histograms instead of sending an
/// event per call (`TP_AGGREGATE=0` sends the events still, for the
/// benchmark's rows that measure them).
pub fn settle(mut opts: Options) -> Options {
    if opts.trace_file.as_ref().is_some_and(|p| p.extension().is_some_and(|e| e == "svg")) {
        opts.flame_file = opts.trace_file.take();
    }
    let k = opts.selection.kind;
    if opts.style == Style::Quiet
        && opts.trace_file.is_none()
        && k & kind::RET != 0
        && k & (kind::ARGS | kind::STACK | kind::SAMPLE) == 0
        && std::env::var("TP_AGGREGATE").as_deref() != Ok("0")
    {
        opts.selection.kind |= kind::AGGREGATE;
    }
    opts
}

impl From<&AttachArgs> for Options {
    fn from(args: &AttachArgs) -> Options {
        let pid = args.targets.pids.first().copied().unwrap_or(0);
        settle(Options {
            keep: args.keep,
            duration: args.duration.map(Duration::from_secs_f64),
            trace_file: args.output.clone(),
            ..options(pid, &args.funcs, &args.addrs, &args.probe)
        })
    }
}

/// The processes named on the command line.
pub fn which(t: &Targets) -> Which {
    Which { pids: t.pids.clone(), name: t.name.clone() }
}

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    let which = which(&args.targets);
    if which.is_empty() {
        bail!("name the processes to attach to with -p PID (repeat, or a comma list) or --name NAME");
    }
    let selected = which.select()?;
    if let (Some(n), Some(name)) = (selected.by_name, &args.targets.name) {
        crate::say!(
            "tp: --name {} matched {n} process{}: {}",
            crate::escape::text(name),
            if n == 1 { "" } else { "es" },
            selected.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    // Every process must exist before any is touched.
    for &pid in &selected.pids {
        crate::process::check_attachable(pid)?;
    }
    let several = selected.pids.len() > 1 || args.targets.name.is_some();
    let opts = Options::from(&args);
    let published = match &args.probe.listen {
        Some(addr) if !opts.keep => Some(serve::start_session_server(addr, args.probe.listen_any)?),
        _ => None,
    };
    let chrome = opts.trace_file.as_deref().map(|p| open_chrome(p, opts.pid)).transpose()?;
    let output = TraceOutput::new(Sink::stdout(), chrome, several);
    let how = Behaviour {
        several,
        follow_exec: args.probe.follow_exec,
        check_every: Duration::from_millis(100),
        live: true,
        announce: true,
    };
    let duration = opts.duration;
    let keep = opts.keep;
    let mut group = Group::new(opts, output, how);
    if let Some(p) = published {
        group.publish(p);
    }
    // One after another, each with its own stop; an error restores those
    // attached already (the group's guard) and is the one line.
    for &pid in &selected.pids {
        group.attach(pid)?;
    }
    if keep {
        std::mem::forget(group);
        return Ok(ExitCode::SUCCESS);
    }
    let why = group.observe(duration)?;
    let reports = group.detach(why)?;
    group.write_reports(&reports)?;
    Ok(ExitCode::SUCCESS)
}
