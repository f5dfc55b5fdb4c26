//! The results of `tp profile`: a table of the functions that ran, by their
//! share of time, or one JSON object with all of them.

use std::io::{self, Write};

use super::events::duration;
use super::{json, thousands};
use crate::events::stats::Latency;

/// Rows of the text table.
const TOP: usize = 40;

/// One function's results.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Function name.
    pub func: String,
    /// Module file name.
    pub module: String,
    /// The sampled calls' latencies.
    pub latency: Latency,
    /// Calls counted (all of them).
    pub calls: u64,
}

/// A whole profile.
#[derive(Debug, Clone)]
pub struct Report {
    /// The process.
    pub pid: i32,
    /// Wall-clock seconds profiled.
    pub elapsed: f64,
    /// Stores into the target's region (periods, countdowns, budgets).
    pub toggles: u64,
    /// Calls timed.
    pub samples: u64,
    /// One per profiled function.
    pub rows: Vec<Row>,
}

/// Prints `r` on `out`: the top functions by time as a table, or all that ran as JSON.
pub fn print(r: &Report, json: bool, out: &mut impl Write) -> io::Result<()> {
    let profiles = &r.rows;
    let elapsed = r.elapsed;
    let time = |p: &Row| p.calls as f64 * p.latency.avg_ns() as f64;
    // Inclusive time (callees count in their callers) as a share of the
    // profile's wall-clock time: above 100 % only with several threads.
    let total = (elapsed * 1e9).max(1.0);
    // Every function that ran; one whose calls all left by longjmp or an
    // exception has calls but no samples.
    let mut order: Vec<usize> =
        (0..profiles.len()).filter(|&k| profiles[k].calls + profiles[k].latency.count > 0).collect();
    order.sort_by(|&a, &b| time(&profiles[b]).total_cmp(&time(&profiles[a])));
    if json {
        let rows: Vec<String> = order
            .iter()
            .map(|&k| {
                let p = &profiles[k];
                let ns = |v: u64| if p.latency.count > 0 { v.to_string() } else { "null".into() };
                format!(
                    "{{\"func\":{},\"module\":{},\"samples\":{},\"calls\":{},\"mean_ns\":{},\"p50_ns\":{},\"p99_ns\":{},\"time_share\":{:.4}}}",
                    json::string(&p.func),
                    json::string(&p.module),
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
            r.pid,
            (r.toggles as f64 / elapsed) as u64,
            (r.samples as f64 / elapsed) as u64,
            rows.join(",")
        )?;
        return Ok(());
    }
    let w = super::table::width(order.iter().take(TOP).map(|&k| profiles[k].func.as_str()), 8, 48);
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
            super::table::fit(&p.func, w),
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
