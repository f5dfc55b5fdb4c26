//! `tp attach`: probe functions of running processes (`-p`, repeated or a
//! comma list, and `--name`), show live counts (and events, with
//! `--args`/`--ret`), and on Ctrl-C, `--duration` or the targets' exit,
//! restore the code and print a summary (per process and in total when
//! there are several). With `--keep`, install and exit instead; with
//! `--listen`, serve the session's metrics over HTTP meanwhile.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};

use super::serve;
use crate::addr::RuntimeAddr;
use crate::cli::{AttachArgs, ProbeArgs, Targets};
use crate::output::events::Style;
use crate::output::format::{self, Format};
use crate::output::report::View;
use crate::output::sink::Sink;
use crate::probe::layout::{DEFAULT_RING_LEN, kind};
use crate::session::exe::ExeFile;
use crate::session::group::{Behaviour, Group};
use crate::session::targets::{Selected, Which};
use crate::session::{Options, Selection, StackMode, interrupt, results};

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
    if probe.args {
        k |= kind::ARGS;
    }
    if probe.ret {
        k |= kind::RET;
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
    if probe.by.is_some() {
        k |= kind::BY;
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
        Format::Svg | Format::Folded if stack.is_none() => bail!(
            "a {} shows stacks: add --stack (or --stack=dwarf for code built without frame pointers)",
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
        by: probe.by.clone(),
        stack,
        ..Selection::new(funcs.iter().cloned().chain(lines).collect(), k)
    };
    let style = match format {
        _ if probe.quiet => Style::Quiet,
        Format::Text => Style::Text,
        Format::Json => Style::Json,
        _ => Style::Quiet,
    };
    let view = View { all: probe.all, top: probe.top };
    if probe.tree && !matches!(format, Format::Text | Format::Json) {
        bail!("--tree shows the calls as text or JSON lines, not as {}", format.name());
    }
    Ok(Options {
        style,
        format,
        view,
        output: output.map(Path::to_path_buf),
        tree: probe.tree,
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
    if opts.style == Style::Quiet
        && opts.format != Format::Chrome
        && k & kind::RET != 0
        && k & (kind::ARGS | kind::STACK | kind::SAMPLE) == 0
        && std::env::var("TP_AGGREGATE").as_deref() != Ok("0")
    {
        opts.selection.kind |= kind::AGGREGATE;
    }
    opts
}

/// The session options of `tp attach`.
pub fn attach_options(args: &AttachArgs) -> Result<Options> {
    let pid = args.targets.pids.first().copied().unwrap_or(0);
    Ok(settle(Options {
        keep: args.keep,
        duration: args.duration.map(Duration::from_secs_f64),
        ..options("attach", pid, &args.funcs, &args.addrs, &args.probe, args.output.as_deref())?
    }))
}

/// The processes named on the command line.
pub fn which(t: &Targets) -> Which {
    Which { pids: t.pids.clone(), name: t.name.clone() }
}

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    // The command line first: a format that cannot be, before any process is looked at.
    let opts = attach_options(&args)?;
    let which = which(&args.targets);
    let exe = args.exe.as_deref().map(ExeFile::open).transpose()?;
    if which.is_empty() && exe.is_none() {
        bail!("name the processes to attach to with -p PID (repeat, or a comma list), --name NAME or --exe PATH");
    }
    let mut selected = match which.is_empty() {
        true => Selected { pids: Vec::new(), by_name: None },
        false => which.select()?,
    };
    let mut exe_line = None;
    if let Some(exe) = &exe {
        let running = exe.processes();
        exe_line = Some(format!(
            "tp: --exe {}: {} process{} run{} it now{}; tp probes each that starts (Ctrl-C to stop)",
            crate::escape::text(&exe.path.display().to_string()),
            running.len(),
            if running.len() == 1 { "" } else { "es" },
            if running.len() == 1 { "s" } else { "" },
            match running.is_empty() {
                true => String::new(),
                false => format!(" ({})", running.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")),
            }
        ));
        for p in running {
            if !selected.pids.contains(&p) {
                selected.pids.push(p);
            }
        }
    }
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
    let several = selected.pids.len() > 1 || args.targets.name.is_some() || exe.is_some();
    let published = match &args.probe.listen {
        Some(addr) if !opts.keep => Some(serve::start_session_server(addr, args.probe.listen_any)?),
        _ => None,
    };
    let output = results::open(&opts, Sink::stdout(), several)?;
    let how = Behaviour {
        several,
        follow_exec: args.probe.follow_exec,
        check_every: Duration::from_millis(100),
        live: true,
        announce: true,
        command: "attach",
    };
    let duration = opts.duration;
    let keep = opts.keep;
    let mut group = Group::new(opts, output, how);
    if let Some(p) = published {
        group.publish(p);
    }
    if let Some(exe) = exe {
        // Listening before the running ones are probed: none that starts
        // meanwhile is missed.
        group.follow_exe(exe)?;
    }
    if let Some(line) = exe_line {
        crate::say!("{line}");
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
