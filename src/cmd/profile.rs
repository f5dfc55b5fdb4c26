//! `tp profile`: sampled latency of many functions at once, with exact call
//! counts ([`crate::session::profile`] says how).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};

use super::options::CommandLine;
use crate::cli::ProfileArgs;
use crate::output::chrome::ChromeTrace;
use crate::output::events::duration;
use crate::output::format::Format;
use crate::output::sink::Sink;
use crate::output::{self, thousands};
use crate::session::forked::Family;
use crate::session::profile::{self, Profiler};
use crate::session::{End, Options, interrupt, observe};

/// Runs `tp profile`.
pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    interrupt::install();
    let opts = Options::from_cli(CommandLine::Profile(&args))?;
    let mut out = match &opts.output {
        Some(path) => Sink::create(path).with_context(|| format!("cannot create `{}`", path.display()))?,
        None => Sink::stdout(),
    };
    // Listening before the probes go in: no fork of that moment is missed.
    let mut family = Family::start();
    family.add_root(args.pid);
    let (mut attached, mut libraries) = profile::attach(&opts)?;
    let mut guard = crate::session::guard::Restore::new(&mut attached);
    let chrome = match opts.format {
        Format::Chrome => Some(ChromeTrace::new(Box::new(out.clone()), args.pid).context("writing the trace")?),
        _ => None,
    };
    let mut profiler = Profiler::new(guard.get(), &opts, chrome)?;
    crate::say!(
        "tp: profiling {} functions of {} ({} timed calls each per {} epoch; Ctrl-C to stop){}",
        profiler.functions(),
        args.pid,
        args.sample,
        duration(args.epoch.as_nanos() as u64),
        match guard.get().refused {
            0 => String::new(),
            n => format!("; {n} more cannot be probed"),
        }
    );
    let started = Instant::now();
    let end = observe(guard.get_mut(), opts.duration, &mut profiler, Some(&mut family), Some(&mut libraries))?;
    if end == End::OutputClosed {
        crate::session::observe::say_output_closed();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let d = guard.detach()?;
    match (d.target_gone, d.execd) {
        (true, true) => {
            crate::say!("tp: process {} exec'd another program; its probes went with the old one", args.pid)
        }
        (true, false) => crate::say!("tp: process {} {}", args.pid, family.end_of(args.pid).sentence()),
        _ => {}
    }
    family.restored(args.pid, &d.family);
    libraries.say_never_found(args.pid);
    crate::session::group::say_relatives(args.pid, &d.family);
    let (epochs, samples, toggles) = (profiler.epochs, profiler.samples, profiler.toggles());
    let rows = profiler.finish(&attached, &d)?;
    crate::say!(
        "tp: {epochs} epochs in {elapsed:.1} s: {} toggles/s, {} samples/s",
        thousands((toggles as f64 / elapsed) as u64),
        thousands((samples as f64 / elapsed) as u64),
    );
    let report =
        output::profile::Report { pid: args.pid, elapsed, toggles, samples, rows, libraries: libraries.loaded };
    if opts.format != Format::Chrome {
        output::profile::write(&report, opts.format, opts.view, &mut out)?;
    }
    std::io::Write::flush(&mut out)?;
    Ok(ExitCode::SUCCESS)
}
