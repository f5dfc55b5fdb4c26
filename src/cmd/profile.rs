//! `tp profile`: the latency of many functions at once, at a cost the
//! target can live with (the fastinst idea, without cross-modifying code).
//!
//! Every matching function gets a sampling return probe: it counts every
//! call and times one call in `period`, at random (the in-target runtime
//! draws the calls to skip before the next sample). At every epoch tp sets
//! each function's period from its calls in the last epoch, so that it gets
//! about `--sample` samples per epoch, and gives every probe that spent some
//! of its budget (at most twice that many samples per epoch, for functions
//! whose calls suddenly became frequent) a new one: one store each, no stop,
//! no code modification. Timing calls at random among all calls, rather
//! than the first calls of each epoch, keeps the latencies unbiased: the
//! first call after an instant is more likely one that follows a long pause.
//! Calls are counted exactly; latencies come from the samples. A function's share
//! of time is its calls times its mean latency over the wall-clock time of
//! the profile: inclusive (a callee's time counts in its callers' too), and
//! above 100 % only when several threads run it at once.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::attach::{Attached, Selection};
use super::interrupt;
use crate::cli::ProfileArgs;
use crate::events::Kind;
use crate::events::drain::Drainer;
use crate::events::sampling::{FIRST_EPOCH, Sampler};
use crate::events::stats::Latency;
use crate::output::chrome::ChromeTrace;
use crate::output::escape::text;
use crate::output::events::duration;
use crate::output::{json, thousands};
use crate::probe::layout::kind;
use crate::process;

/// Rows of the text table.
const TOP: usize = 40;

/// One function's results.
#[derive(Default, Clone)]
struct Profile {
    latency: Latency,
    calls: u64,
}

/// Runs `tp profile`.
pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    interrupt::install();
    let budget = Sampler::budget_for(args.sample);
    let what = Selection {
        funcs: args.funcs.clone(),
        addrs: Vec::new(),
        kind: kind::RET | kind::SAMPLE,
        // Room for every function's samples of an epoch.
        ring_len: (budget as usize * 4096).clamp(2048, 1 << 18) as u32,
        sample_budget: budget,
    };
    let attached = Attached::attach(args.pid, &what, std::process::id())?;
    let guard = super::guard::Restore::new(&attached);
    let idx = attached.indexes();
    // Calls are counted from here on (before tp says it is profiling).
    let at_start = attached.region.hits_of(&idx);
    let mut sampler = Sampler::new(&attached.region, idx.clone(), args.sample);
    let names = attached.names();
    eprintln!(
        "tp: profiling {} functions of {} ({} timed calls each per {} epoch; Ctrl-C to stop){}",
        idx.len(),
        args.pid,
        args.sample,
        duration(args.epoch.as_nanos() as u64),
        if attached.refused > 0 { format!("; {} more cannot be probed", attached.refused) } else { String::new() }
    );
    let position: HashMap<u32, usize> = idx.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let mut chrome = match &args.output {
        Some(p) => Some(ChromeTrace::create(p, args.pid).with_context(|| format!("cannot create `{}`", p.display()))?),
        None => None,
    };
    let mut clock = attached.clock.clone();
    let mut drainer = Drainer::default();
    let mut profiles = vec![Profile::default(); idx.len()];
    let (mut samples, mut epochs) = (0u64, 0u64);
    let started = Instant::now();
    let mut batch = Vec::new();
    let check_every = (1.0 / args.epoch.as_secs_f64()).max(1.0) as u64;
    loop {
        std::thread::sleep(if epochs == 0 { args.epoch.min(FIRST_EPOCH) } else { args.epoch });
        clock.refine();
        batch.clear();
        drainer.drain(&attached.region, &mut batch)?;
        sampler.end_epoch(&attached.region)?;
        for ev in &batch {
            let Some(&k) = position.get(&ev.probe) else { continue };
            if ev.kind != Kind::Exit {
                continue;
            }
            profiles[k].latency.add(clock.duration_ns(ev.timed_from(), ev.tsc));
            samples += 1;
            if let Some(c) = &mut chrome {
                let span = clock.duration_ns(ev.entry_tsc(), ev.tsc);
                c.slice(&names[k], ev.tid, clock.ns(ev.entry_tsc()), span, "{}")?;
            }
        }
        epochs += 1;
        // Whether someone removed the probes (`tp detach`): once a second.
        let removed = epochs % check_every == 0 && !attached.still_installed();
        let stop = interrupt::interrupted()
            || args.duration.is_some_and(|d| started.elapsed() >= Duration::from_secs_f64(d))
            || !process::is_alive(args.pid)
            || removed;
        if stop {
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let d = guard.detach()?;
    for (k, p) in profiles.iter_mut().enumerate() {
        p.calls = d.summary.probes.get(k).map_or(0, |s| s.hits).saturating_sub(at_start[k]);
    }
    if d.target_gone {
        eprintln!("tp: process {} exited", args.pid);
    }
    if let Some(c) = chrome {
        c.finish().context("writing the trace file")?;
    }
    let toggles = sampler.toggles;
    eprintln!(
        "tp: {epochs} epochs in {elapsed:.1} s: {} toggles/s, {} samples/s",
        thousands((toggles as f64 / elapsed) as u64),
        thousands((samples as f64 / elapsed) as u64),
    );
    print(&args, &attached, &names, &profiles, elapsed, toggles, samples)?;
    Ok(ExitCode::SUCCESS)
}

fn print(
    args: &ProfileArgs,
    attached: &Attached,
    names: &[String],
    profiles: &[Profile],
    elapsed: f64,
    toggles: u64,
    samples: u64,
) -> Result<()> {
    let time = |p: &Profile| p.calls as f64 * p.latency.avg_ns() as f64;
    // Inclusive time (callees count in their callers) as a share of the
    // profile's wall-clock time: above 100 % only with several threads.
    let total = (elapsed * 1e9).max(1.0);
    // Every function that ran; one whose calls all left by longjmp or an
    // exception has calls but no samples.
    let mut order: Vec<usize> =
        (0..profiles.len()).filter(|&k| profiles[k].calls + profiles[k].latency.count > 0).collect();
    order.sort_by(|&a, &b| time(&profiles[b]).total_cmp(&time(&profiles[a])));
    let modules = attached.modules_of_probes();
    let mut out = std::io::stdout().lock();
    if args.json {
        let rows: Vec<String> = order
            .iter()
            .map(|&k| {
                let p = &profiles[k];
                let ns = |v: u64| if p.latency.count > 0 { v.to_string() } else { "null".into() };
                format!(
                    "{{\"func\":{},\"module\":{},\"samples\":{},\"calls\":{},\"mean_ns\":{},\"p50_ns\":{},\"p99_ns\":{},\"time_share\":{:.4}}}",
                    json::string(&names[k]),
                    json::string(&modules[k]),
                    p.latency.count,
                    p.calls,
                    ns(p.latency.avg_ns()),
                    ns(p.latency.quantile_ns(0.5)),
                    ns(p.latency.quantile_ns(0.99)),
                    time(p) / total
                )
            })
            .collect();
        writeln!(
            out,
            "{{\"pid\":{},\"seconds\":{elapsed:.3},\"toggles_per_s\":{},\"samples_per_s\":{},\"functions\":[{}]}}",
            args.pid,
            (toggles as f64 / elapsed) as u64,
            (samples as f64 / elapsed) as u64,
            rows.join(",")
        )?;
        return Ok(());
    }
    let w = order.iter().take(TOP).map(|&k| text(&names[k]).len()).max().unwrap_or(8).clamp(8, 48);
    writeln!(
        out,
        "{:<w$}  {:>9}  {:>14}  {:>10}  {:>10}  {:>10}  {:>6}",
        "FUNCTION", "SAMPLES", "CALLS", "MEAN", "P50", "P99", "TIME%"
    )?;
    for &k in order.iter().take(TOP) {
        let p = &profiles[k];
        let ns = |v: u64| if p.latency.count > 0 { duration(v) } else { "-".into() };
        writeln!(
            out,
            "{:<w$}  {:>9}  {:>14}  {:>10}  {:>10}  {:>10}  {:>5.1}%",
            text(&names[k]),
            thousands(p.latency.count),
            thousands(p.calls),
            ns(p.latency.avg_ns()),
            ns(p.latency.quantile_ns(0.5)),
            ns(p.latency.quantile_ns(0.99)),
            100.0 * time(p) / total
        )?;
    }
    let quiet = profiles.len() - order.len();
    if order.len() > TOP {
        writeln!(out, "({} more functions ran: --json lists them all)", order.len() - TOP)?;
    }
    if quiet > 0 {
        writeln!(out, "({quiet} functions were not called)")?;
    }
    Ok(())
}
