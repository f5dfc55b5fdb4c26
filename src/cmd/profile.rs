//! `tp profile`: the latency of many functions at once, at a cost the
//! target can live with (the fastinst idea, without cross-modifying code).
//!
//! Every matching function gets a sampling return probe. Each probe has a
//! budget of `--sample` timed calls per epoch; the in-target runtime spends
//! it, and once it is spent the detour stops calling the runtime by itself,
//! so for the rest of the epoch the function pays for its count and one test
//! only. At every epoch tp gives the probes that spent their budget a new
//! one: one store each, no stop, no code modification. Calls are counted
//! exactly throughout; latencies come from the samples.

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
use crate::events::stats::Latency;
use crate::output::chrome::ChromeTrace;
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
    let budget = args.sample as i32;
    let what = Selection {
        funcs: args.funcs.clone(),
        addrs: Vec::new(),
        kind: kind::RET | kind::SAMPLE,
        // Room for every function's samples of an epoch.
        ring_len: (args.sample as usize * 4096).clamp(2048, 1 << 18) as u32,
        sample_budget: budget,
    };
    let attached = Attached::attach(args.pid, &what, std::process::id())?;
    let idx = attached.indexes();
    // Calls are counted from here on (before tp says it is profiling).
    let at_start = attached.region.hits_of(&idx);
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
    let (mut toggles, mut samples, mut epochs) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut batch = Vec::new();
    loop {
        std::thread::sleep(args.epoch);
        clock.refine();
        batch.clear();
        drainer.drain(&attached.region, &mut batch)?;
        for ev in &batch {
            let Some(&k) = position.get(&ev.probe) else { continue };
            if ev.kind != Kind::Exit {
                continue;
            }
            let dur = clock.duration_ns(ev.entry_tsc(), ev.tsc);
            profiles[k].latency.add(dur);
            samples += 1;
            if let Some(c) = &mut chrome {
                c.slice(&names[k], ev.tid, clock.ns(ev.entry_tsc()), dur, "{}")?;
            }
        }
        // A new budget for every probe that spent (some of) its own.
        let spent: Vec<u32> =
            attached.region.budgets_of(&idx).iter().zip(&idx).filter(|(b, _)| **b < budget).map(|(_, &i)| i).collect();
        for &i in &spent {
            attached.region.set_budget(i, budget)?;
        }
        toggles += spent.len() as u64;
        epochs += 1;
        let stop = interrupt::interrupted()
            || args.duration.is_some_and(|d| started.elapsed() >= Duration::from_secs_f64(d))
            || !process::is_alive(args.pid)
            || !attached.still_installed();
        if stop {
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let d = attached.detach()?;
    for (k, p) in profiles.iter_mut().enumerate() {
        p.calls = d.summary.probes.get(k).map_or(0, |s| s.hits).saturating_sub(at_start[k]);
    }
    if d.target_gone {
        eprintln!("tp: process {} exited", args.pid);
    }
    if let Some(c) = chrome {
        c.finish().context("writing the trace file")?;
    }
    eprintln!(
        "tp: {epochs} epochs in {elapsed:.1} s: {} toggles/s, {} samples/s",
        thousands((toggles as f64 / elapsed) as u64),
        thousands((samples as f64 / elapsed) as u64)
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
    let total: f64 = profiles.iter().map(time).sum::<f64>().max(1.0);
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
    let w = order.iter().take(TOP).map(|&k| names[k].len()).max().unwrap_or(8).clamp(8, 48);
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
            names[k],
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
