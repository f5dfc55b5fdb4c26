//! The results of `tp profile`: a table of the functions that ran, by their
//! share of time, or tp's JSON summary document with all of them; the
//! formats' [`super::results::Output::profile`] writes one or the other.

use std::io::{self, Write};

use super::events::duration;
use super::format::Format;
use super::json::Obj;
use super::report::{self, View};
use super::{ProbeStat, thousands};
use crate::events::stats::Latency;

/// Rows of the text table unless `--top` or `--all` says otherwise.
const TOP: usize = 40;

/// The formats of a profile: the table, the JSON document, and a Chrome
/// trace of the sampled calls (written as they end).
pub const FORMATS: &[Format] = &[Format::Text, Format::Json, Format::Chrome];

/// One function's results.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Function name.
    pub func: String,
    /// Module file name.
    pub module: String,
    /// Its address in the target.
    pub address: u64,
    /// The sampled calls' latencies.
    pub latency: Latency,
    /// The same calls' self times: without the time of the timed calls
    /// made inside them ([`crate::session::profile`] says which).
    pub own: Latency,
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
    /// The libraries the process loaded while profiled in which tp probed
    /// functions.
    pub libraries: Vec<report::Loaded>,
}

impl Report {
    /// A function's inclusive time (callees count in their callers): its
    /// calls times the mean of those sampled, in ns.
    fn time(p: &Row) -> f64 {
        p.calls as f64 * p.latency.avg_ns() as f64
    }

    /// Its self time: its calls times the mean self time of those
    /// sampled, in ns.
    fn own_time(p: &Row) -> f64 {
        p.calls as f64 * p.own.avg_ns() as f64
    }

    /// Its share of the profile's wall-clock time: above 1 only with
    /// several threads.
    fn share(&self, p: &Row) -> f64 {
        Self::time(p) / (self.elapsed * 1e9).max(1.0)
    }

    /// The share of its self time.
    fn own_share(&self, p: &Row) -> f64 {
        Self::own_time(p) / (self.elapsed * 1e9).max(1.0)
    }

    /// The rows by time, then calls (as integers, for [`View::pick`]).
    fn key(p: &Row) -> (u64, u64) {
        (Self::time(p) as u64, p.calls)
    }
}

/// Writes `r` to `out` as text: the top functions by time, as `view`
/// says; notes on what the text left out go to stderr.
pub fn write_text(out: &mut dyn Write, r: &Report, view: View) -> io::Result<()> {
    let profiles = &r.rows;
    // Every function that ran; one whose calls all left by longjmp or an
    // exception has calls but no samples.
    let view = View { top: view.top.or((!view.all).then_some(TOP)), ..view };
    let (order, quiet) = view.pick(profiles, Report::key, |p| p.calls + p.latency.count > 0);
    let w = super::table::width(order.iter().map(|&k| profiles[k].func.as_str()), 8, 48);
    writeln!(
        out,
        "{:<w$}  {:>9}  {:>14}  {:>10}  {:>10}  {:>10}  {:>10}  {:>6}  {:>6}",
        "FUNCTION", "TIMED", "HITS", "AVG", "P50", "P99", "SELF", "TIME%", "SELF%"
    )?;
    for &k in &order {
        let p = &profiles[k];
        let ns = |v: u64| if p.latency.count > 0 { duration(v) } else { "-".into() };
        writeln!(
            out,
            "{:<w$}  {:>9}  {:>14}  {:>10}  {:>10}  {:>10}  {:>10}  {:>5.1}%  {:>5.1}%",
            super::table::fit(&p.func, w),
            thousands(p.latency.count),
            thousands(p.calls),
            ns(p.latency.avg_ns()),
            ns(p.latency.quantile_ns(0.5)),
            ns(p.latency.quantile_ns(0.99)),
            ns(p.own.avg_ns()),
            100.0 * r.share(p),
            100.0 * r.own_share(p)
        )?;
    }
    let ran = profiles.len() - quiet;
    if ran > order.len() {
        crate::say!(
            "tp: {} more functions ran (--top N or --all shows them, --json lists them all)",
            ran - order.len()
        );
    }
    if quiet > 0 && !view.all {
        crate::say!("tp: {quiet} functions were not called (--all shows them)");
    }
    Ok(())
}

/// The profile as tp's JSON document (docs/output.md): a summary whose
/// rows' `timed` calls are the sampled ones, each with its `time_share`,
/// and the process's `toggles_per_s` and `samples_per_s`.
pub fn document(r: &Report, view: View) -> String {
    let stat = |p: &Row| ProbeStat::new(p.func.clone(), p.module.clone(), p.address, (p.calls, None));
    let order = view.pick_all(&r.rows, Report::key);
    let rows = order.iter().map(|&k| {
        let p = &r.rows[k];
        own_json(report::row_json(&stat(p), Some(&p.latency)), p)
            .num("time_share", format!("{:.4}", r.share(p)))
            .num("self_share", format!("{:.4}", r.own_share(p)))
            .finish()
    });
    let process = Obj::new()
        .num("pid", r.pid)
        .list("probes", rows)
        .num("lost_events", 0)
        .list("children", [])
        .list("stacks", [])
        .list("by", [])
        .list("libraries", r.libraries.iter().map(report::loaded_json))
        .num("toggles_per_s", (r.toggles as f64 / r.elapsed) as u64)
        .num("samples_per_s", (r.samples as f64 / r.elapsed) as u64)
        .finish();
    let total = order.iter().map(|&k| {
        let p = &r.rows[k];
        let o = Obj::new().str("func", &p.func).str("module", &p.module).num("processes", 1);
        report::counts_json(o, p.calls, None, Some(&p.latency)).finish()
    });
    report::document_with("profile", Some(r.elapsed), [process], total)
}

/// A row's self times: the sum and mean over its timed calls (null
/// without any).
fn own_json(o: Obj, p: &Row) -> Obj {
    let ns = |v: u64| (p.own.count > 0).then_some(v);
    o.opt("self_total_ns", ns(p.own.total_ns)).opt("self_avg_ns", ns(p.own.avg_ns()))
}
