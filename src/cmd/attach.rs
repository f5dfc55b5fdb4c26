//! `tp attach`: probe functions of a running process, show live counts (and
//! events, with `--args`/`--ret`), and on Ctrl-C, `--duration` or the
//! target's exit, restore the code and print a summary. With `--keep`,
//! install and exit instead.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use crate::addr::RuntimeAddr;
use crate::cli::AttachArgs;
use crate::output::events::Style;
use crate::output::print_summary;
use crate::probe::layout::kind;
use crate::session::guard::Restore;
use crate::session::observe::LiveView;
use crate::session::tracer::Tracer;
use crate::session::{Attached, End, Options, Selection, interrupt, observe};

impl From<&AttachArgs> for Options {
    fn from(args: &AttachArgs) -> Options {
        let mut k = kind::COUNT;
        if args.args {
            k |= kind::ARGS;
        }
        if args.ret {
            k |= kind::RET;
        }
        let selection = Selection {
            funcs: args.funcs.clone(),
            addrs: args.addrs.iter().copied().map(RuntimeAddr).collect(),
            kind: k,
            ring_len: args.ring_size,
            sample_budget: 0,
        };
        let style = if args.quiet {
            Style::Quiet
        } else if args.json {
            Style::Json
        } else {
            Style::Text
        };
        Options {
            keep: args.keep,
            duration: args.duration.map(Duration::from_secs_f64),
            style,
            trace_file: args.output.clone(),
            json: args.json,
            ..Options::new(args.pid, selection)
        }
    }
}

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    let opts = Options::from(&args);
    let attached = Attached::attach(&opts)?;
    let n = attached.names().len();
    if attached.refused > 0 {
        eprintln!(
            "tp: {} of the matched functions cannot be probed and are skipped (`tp list-probes -p {}` says why)",
            attached.refused, args.pid
        );
    }
    eprintln!(
        "tp: attached {n} probe{} to {} in {:.1} ms (target stopped {} µs; one thread {} µs for injection)",
        if n == 1 { "" } else { "s" },
        args.pid,
        attached.attach_time.as_secs_f64() * 1e3,
        attached.stop_time.as_micros(),
        attached.worker_time.as_micros()
    );
    if opts.keep {
        eprintln!(
            "tp: probes stay in {pid} after tp exits; `tp status -p {pid}` shows counts, `tp detach -p {pid}` removes them",
            pid = args.pid
        );
        return Ok(ExitCode::SUCCESS);
    }
    let guard = Restore::new(&attached);
    let mut tracer = if opts.selection.kind != kind::COUNT { Some(Tracer::new(&attached, &opts)?) } else { None };
    let why = observe(&attached, opts.duration, &mut LiveView::new(&attached, tracer.as_mut()))?;
    let d = guard.detach()?;
    match (d.target_gone, why) {
        (true, _) => eprintln!("tp: process {} exited; final counts:", args.pid),
        (false, End::Removed) => eprintln!("tp: the probes were removed by another tp; final counts:"),
        (false, _) => {
            eprintln!("tp: detached from {}, code restored (target stopped {} µs)", args.pid, d.stop_time.as_micros())
        }
    }
    match tracer {
        Some(mut t) => {
            t.poll(&attached)?;
            t.finish(&attached, &d.summary, opts.json)?;
        }
        None => print_summary(&d.summary, opts.json)?,
    }
    Ok(ExitCode::SUCCESS)
}
