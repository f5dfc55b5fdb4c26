//! The results a session prints when it ends, and what `tp status` and
//! `tp profile` print: one model for one process and for many.
//!
//! As text, a session of one process prints its table (the counts, or the
//! latency table and histograms when returns were timed); several print a
//! section per process and their total per function. Rows are sorted by
//! hits (latency tables by total time), rows without hits are left out
//! unless [`View::all`], and [`View::top`] keeps the first N. As JSON, every
//! command writes one document of the same shape whatever the number of
//! processes ([`document`]; docs/output.md): `{"type":"summary",
//! "schema":1,"command":…,"processes":[…],"total":[…]}`, every key present
//! in every row.

use std::io::{self, Write};

use super::aggregates::ProbeAgg;
use super::blocks::FunctionBlocks;
use super::json::{self, Obj};
use super::stacks::ProbeStacks;
use super::steps::SteppedCall;
use super::{ProbeStat, Summary, histogram, table, thousands};
use crate::escape::text;
use crate::events::stats::Latency;

/// The version of the JSON documents' shape (docs/output.md).
pub const SCHEMA: u32 = 1;

/// What one process's probes counted and timed.
#[derive(Debug, Clone)]
pub struct ProcessReport {
    /// Counts, one row per user probe.
    pub summary: Summary,
    /// Latency per row, when the session recorded events (`None` for a row
    /// whose returns were not recorded); empty when it only counted.
    pub latency: Vec<Option<Latency>>,
    /// True if the session recorded events.
    pub events: bool,
    /// Events lost because a ring was full.
    pub lost: u64,
    /// The processes it forked while the probes were in (they ran them
    /// too: their calls are in the counts, their events in the lines).
    pub children: Vec<Child>,
    /// The stacks recorded per function (`--stack`).
    pub stacks: Vec<ProbeStacks>,
    /// The calls counted per argument value (`--by`).
    pub by: Vec<ProbeValues>,
    /// The aggregates per key (`--agg`, `--by tid`).
    pub aggregates: Vec<ProbeAgg>,
    /// The basic blocks and lines counted per function (`--blocks`).
    pub blocks: Vec<FunctionBlocks>,
    /// The calls stepped instruction by instruction (`--steps`).
    pub steps: Vec<SteppedCall>,
    /// The libraries it loaded while the session ran whose functions tp
    /// probed, one entry per look that probed some.
    pub libraries: Vec<Loaded>,
}

/// Libraries a process loaded that tp probed (`tp run`, `--follow-exec`).
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The file names of the modules that were new at that look.
    pub modules: Vec<String>,
    /// The probes added in them.
    pub probes: usize,
    /// The functions matched there that cannot be probed.
    pub skipped: usize,
    /// Where tp saw them: `rendezvous` (the dynamic linker's, before their
    /// initializers and first call) or `poll` (after they were mapped).
    pub at: &'static str,
    /// How many times the same happened (a library loaded and unloaded
    /// over and over is one entry).
    pub loads: u64,
    /// At the rendezvous, how long the loading thread waited for tp; when
    /// polling, how long tp took to probe them once it saw them: the
    /// longest of the `loads`.
    pub took: std::time::Duration,
}

impl Loaded {
    /// Adds `l` to `list`: to its last entry if that is the same load.
    pub fn add_to(list: &mut Vec<Loaded>, l: Loaded) {
        match list.last_mut() {
            Some(last)
                if (&last.modules, last.probes, last.skipped, last.at) == (&l.modules, l.probes, l.skipped, l.at) =>
            {
                last.loads += l.loads;
                last.took = last.took.max(l.took);
            }
            _ => list.push(l),
        }
    }
}

/// One entry of a process's `libraries` (docs/output.md).
pub fn loaded_json(l: &Loaded) -> String {
    Obj::new()
        .list("modules", l.modules.iter().map(|m| super::json::string(m)))
        .num("probes", l.probes)
        .num("skipped", l.skipped)
        .str("at", l.at)
        .num("loads", l.loads)
        .num("took_us", l.took.as_micros())
        .finish()
}

impl ProcessReport {
    /// The report of counts alone (no events were recorded): every other
    /// report starts from it, with what its session recorded besides.
    pub fn counts(summary: Summary) -> ProcessReport {
        ProcessReport {
            summary,
            latency: Vec::new(),
            events: false,
            lost: 0,
            children: Vec::new(),
            stacks: Vec::new(),
            by: Vec::new(),
            aggregates: Vec::new(),
            blocks: Vec::new(),
            steps: Vec::new(),
            libraries: Vec::new(),
        }
    }

    /// The report of a session that recorded events: the `latency` of each
    /// row and the `aggregates` besides the counts.
    pub fn traced(summary: Summary, latency: Vec<Option<Latency>>, aggregates: Vec<ProbeAgg>) -> ProcessReport {
        ProcessReport { latency, events: true, aggregates, ..ProcessReport::counts(summary) }
    }

    /// The report read from a process's region outside any session (`tp
    /// status`): the counts, the latency its threads kept in the target
    /// (`None` for a row that keeps none) and the aggregates.
    pub fn kept(summary: Summary, latency: Vec<Option<Latency>>, aggregates: Vec<ProbeAgg>) -> ProcessReport {
        ProcessReport { latency, aggregates, ..ProcessReport::counts(summary) }
    }

    /// The report with what the events carried besides: how many were
    /// `lost`, the `stacks` recorded (`--stack`) and the counts `by` value.
    pub fn with_events(self, lost: u64, stacks: Vec<ProbeStacks>, by: Vec<ProbeValues>) -> ProcessReport {
        ProcessReport { lost, stacks, by, ..self }
    }

    /// The latency of row `i`, if its returns were timed.
    fn latency_of(&self, i: usize) -> Option<&Latency> {
        self.latency.get(i).and_then(Option::as_ref)
    }
}

/// How the text summary shows its rows; JSON lists every row ([`View::top`] applies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct View {
    /// Show the rows without hits too (`--all`).
    pub all: bool,
    /// Only the first N rows (`--top N`).
    pub top: Option<usize>,
}

impl View {
    /// The rows of `rows` to show, in order: by `key` descending (hits, or
    /// time), the first met first among equals, without those `shown`
    /// leaves out unless [`View::all`], cut at [`View::top`]; and how many
    /// were left out for having no hits.
    pub fn pick<T>(
        &self,
        rows: &[T],
        key: impl Fn(&T) -> (u64, u64),
        shown: impl Fn(&T) -> bool,
    ) -> (Vec<usize>, usize) {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(key(&rows[i])));
        let before = order.len();
        if !self.all {
            order.retain(|&i| shown(&rows[i]));
        }
        let hidden = before - order.len();
        if let Some(n) = self.top {
            order.truncate(n);
        }
        (order, hidden)
    }

    /// The rows of a JSON list: every one, by `key` descending, cut at [`View::top`].
    pub fn pick_all<T>(&self, rows: &[T], key: impl Fn(&T) -> (u64, u64)) -> Vec<usize> {
        View { all: true, top: self.top }.pick(rows, key, |_| true).0
    }
}

/// The line on stderr that says how many rows without hits the text left out.
pub fn say_hidden(hidden: usize) {
    if hidden > 0 {
        crate::say!(
            "tp: {} probe{} without hits not shown (--all shows them)",
            thousands(hidden as u64),
            if hidden == 1 { "" } else { "s" }
        );
    }
}

/// One function's calls counted by an argument's value (`--by`), in the target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeValues {
    /// The function.
    pub function: String,
    /// The argument, as the user named it.
    pub arg: String,
    /// Each value and its calls, by value.
    pub values: Vec<(i128, u64)>,
    /// Calls not counted: a thread's table was full (the process's total).
    pub overflow: u64,
}

/// Writes each function's counts by value, as bpftrace prints `@[arg0] = count()`.
fn by_text(out: &mut impl Write, all: &[ProbeValues]) -> io::Result<()> {
    for p in all {
        writeln!(out, "\ncalls of {} by {}:", text(&p.function), text(&p.arg))?;
        let mut values = p.values.clone();
        values.sort_by_key(|&(v, n)| (n, v));
        for (v, n) in values {
            writeln!(out, "@[{v}]: {}", thousands(n))?;
        }
        if p.overflow > 0 {
            writeln!(out, "({} calls not counted: a thread's table of values was full)", thousands(p.overflow))?;
        }
    }
    Ok(())
}

fn by_json(p: &ProbeValues) -> String {
    let values = p.values.iter().map(|(v, n)| Obj::new().num("value", v).num("hits", n).finish());
    Obj::new().str("func", &p.function).str("arg", &p.arg).num("overflow", p.overflow).list("values", values).finish()
}

/// A process forked by a probed one while the probes were in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// Its PID.
    pub pid: i32,
    /// The events it recorded.
    pub events: u64,
    /// How it ended, or what the session's end did there.
    pub end: String,
}

/// At most this many children are listed one by one in the text summary
/// (a server may fork thousands); the rest are counted. The JSON lists all.
const CHILDREN_LISTED: usize = 20;

/// The text lines about `children`: a count by how they ended, then the
/// children that did not simply exit with status 0 (killed, still running,
/// left with tp's memory), one per line.
fn children_text(out: &mut impl Write, children: &[Child]) -> io::Result<()> {
    if children.is_empty() {
        return Ok(());
    }
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for c in children {
        let kind = c.end.split(" (").next().unwrap_or(&c.end).split(';').next().unwrap_or(&c.end).to_string();
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{} {k}", thousands(*n as u64))).collect();
    writeln!(
        out,
        "\nchildren forked while the probes were in: {} ({})",
        thousands(children.len() as u64),
        kinds.join(", ")
    )?;
    let notable: Vec<&Child> =
        children.iter().filter(|c| c.end != "exited with status 0" && c.end != "exited").collect();
    for c in notable.iter().take(CHILDREN_LISTED) {
        writeln!(out, "  {:>7}  {}, {} events", c.pid, text(&c.end), thousands(c.events))?;
    }
    if notable.len() > CHILDREN_LISTED {
        writeln!(out, "  ... and {} more (--json lists them all)", notable.len() - CHILDREN_LISTED)?;
    }
    Ok(())
}

fn child_json(c: &Child) -> String {
    Obj::new().num("pid", c.pid).num("events", c.events).str("end", &c.end).finish()
}

/// Writes the text summary of `reports` to `out` (a section per process
/// when there are several, and their total); returns how many rows
/// without hits it left out.
pub fn write_text(out: &mut impl Write, reports: &[ProcessReport], view: View) -> io::Result<usize> {
    match reports {
        [] => Ok(0),
        [one] => one_text(out, one, view),
        several => {
            let mut hidden = 0;
            for r in several {
                writeln!(out, "process {}:", r.summary.pid)?;
                hidden += one_text(out, r, view)?;
                writeln!(out)?;
            }
            writeln!(out, "total of {} processes:", several.len())?;
            Ok(hidden + totals_text(out, &totals(several), view)?)
        }
    }
}

fn totals_text(out: &mut impl Write, totals: &[Total], view: View) -> io::Result<usize> {
    let (order, hidden) = view.pick(totals, |t| (t.hits, t.latency.as_ref().map_or(0, |l| l.total_ns)), |t| t.hits > 0);
    let rows: Vec<&Total> = order.iter().map(|&i| &totals[i]).collect();
    let name_w = table::width(rows.iter().map(|t| t.func.as_str()), 8, table::NAME_MAX);
    let mod_w = table::width(rows.iter().map(|t| t.module.as_str()), 6, table::MODULE_MAX);
    let timed = rows.iter().any(|t| t.latency.is_some());
    let filtered = rows.iter().any(|t| t.unfiltered.is_some());
    write!(out, "{:<name_w$}  {:<mod_w$}  {:>9}  {:>15}", "FUNCTION", "MODULE", "PROCESSES", "HITS")?;
    if filtered {
        write!(out, "  {:>15}", "UNFILTERED")?;
    }
    writeln!(out, "{}", if timed { format!("  {:>9}  {:>10}  {:>10}", "TIMED", "P50", "P99") } else { String::new() })?;
    for t in rows {
        write!(
            out,
            "{:<name_w$}  {:<mod_w$}  {:>9}  {:>15}",
            table::fit(&t.func, name_w),
            table::fit(&t.module, mod_w),
            t.processes,
            thousands(t.hits)
        )?;
        if filtered {
            write!(out, "  {:>15}", thousands(t.unfiltered.unwrap_or(t.hits)))?;
        }
        match &t.latency {
            Some(l) if l.count > 0 => writeln!(
                out,
                "  {:>9}  {:>10}  {:>10}",
                thousands(l.count),
                super::events::duration(l.quantile_ns(0.5)),
                super::events::duration(l.quantile_ns(0.99))
            )?,
            Some(_) => writeln!(out, "  {:>9}  {:>10}  {:>10}", 0, "-", "-")?,
            None => writeln!(out)?,
        }
    }
    Ok(hidden)
}

/// One process's section (and the children it forked, if it did).
fn one_text(out: &mut impl Write, r: &ProcessReport, view: View) -> io::Result<usize> {
    let hidden = one_table(out, r, view)?;
    children_text(out, &r.children)?;
    by_text(out, &r.by)?;
    super::aggregates::write_text(out, &r.aggregates)?;
    super::blocks::write_text(out, &r.blocks)?;
    super::steps::write_text(out, &r.steps)?;
    super::stacks::write_text(out, &r.stacks)?;
    Ok(hidden)
}

fn one_table(out: &mut impl Write, r: &ProcessReport, view: View) -> io::Result<usize> {
    let probes = &r.summary.probes;
    let timed = (0..probes.len()).any(|i| r.latency_of(i).is_some());
    if !timed {
        let (order, hidden) = view.pick(probes, |p| (p.hits, 0), |p| p.hits > 0);
        let shown = Summary { pid: r.summary.pid, probes: order.iter().map(|&i| probes[i].clone()).collect() };
        table::summary(&shown, out)?;
        return Ok(hidden);
    }
    // Timed rows by their total time; the others after them.
    let rows: Vec<(usize, &ProbeStat)> = probes.iter().enumerate().collect();
    let (order, hidden) = view.pick(
        &rows,
        |&(i, p)| (r.latency_of(i).map_or(0, |l| l.total_ns), p.hits),
        |&(i, p)| p.hits > 0 || r.latency_of(i).is_some_and(|l| l.count > 0),
    );
    let shown: Vec<(String, u64, Option<u64>, Option<&Latency>)> = order
        .iter()
        .map(|&k| {
            let (i, p) = rows[k];
            (p.func.clone(), p.hits, p.unfiltered, r.latency_of(i))
        })
        .collect();
    writeln!(out)?;
    histogram::table(out, &shown)?;
    writeln!(out)?;
    for (name, _, _, l) in &shown {
        if let Some(l) = l.filter(|l| l.count > 0) {
            histogram::histogram(out, name, l)?;
        }
    }
    Ok(hidden)
}

/// One row of a JSON document: the same keys for every probe, `null` where
/// a value does not apply (a row whose returns were not timed).
pub fn row_json(p: &ProbeStat, l: Option<&Latency>) -> Obj {
    let o = Obj::new()
        .str("func", &p.func)
        .str("module", &p.module)
        .str("address", &json::address(p.address))
        .num("enabled", p.enabled);
    counts_json(o, p.hits, p.unfiltered, l)
}

/// The keys every row has from `hits` on.
pub fn counts_json(o: Obj, hits: u64, unfiltered: Option<u64>, l: Option<&Latency>) -> Obj {
    let o = o.num("hits", hits).num("hits_unfiltered", unfiltered.unwrap_or(hits));
    match l {
        Some(l) => {
            let ns = |v: u64| (l.count > 0).then_some(v);
            let hist = l.log2_buckets().iter().map(|(lo, hi, n)| format!("[{lo},{hi},{n}]")).collect::<Vec<_>>();
            o.num("timed", l.count)
                .opt("total_ns", ns(l.total_ns))
                .opt("avg_ns", ns(l.avg_ns()))
                .opt("p50_ns", ns(l.quantile_ns(0.5)))
                .opt("p99_ns", ns(l.quantile_ns(0.99)))
                .list("histogram", hist)
        }
        None => o
            .num("timed", "null")
            .num("total_ns", "null")
            .num("avg_ns", "null")
            .num("p50_ns", "null")
            .num("p99_ns", "null")
            .num("histogram", "null"),
    }
}

/// One process of a JSON document; `extra` adds keys of its command's own
/// after the common ones (`tp profile`'s rates).
pub fn process_json(
    r: &ProcessReport,
    view: View,
    rows: impl Fn(usize, Obj) -> Obj,
    extra: impl Fn(Obj) -> Obj,
) -> String {
    let probes = &r.summary.probes;
    let order = view.pick_all(probes, |p| (p.hits, 0));
    let rows = order.iter().map(|&i| rows(i, row_json(&probes[i], r.latency_of(i))).finish());
    let o = Obj::new()
        .num("pid", r.summary.pid)
        .list("probes", rows)
        .num("lost_events", r.lost)
        .list("children", r.children.iter().map(child_json))
        .list("stacks", r.stacks.iter().map(super::stacks::probe_json))
        .list("by", r.by.iter().map(by_json))
        .list("aggregates", r.aggregates.iter().map(super::aggregates::to_json))
        .list("blocks", r.blocks.iter().map(super::blocks::to_json))
        .list("steps", r.steps.iter().map(super::steps::to_json))
        .list("libraries", r.libraries.iter().map(loaded_json));
    extra(o).finish()
}

fn total_json(t: &Total) -> String {
    let o = Obj::new().str("func", &t.func).str("module", &t.module).num("processes", t.processes);
    counts_json(o, t.hits, t.unfiltered, t.latency.as_ref()).finish()
}

/// The JSON document of a command's results: `command` (`attach`, `run`,
/// `status`), the seconds it observed, one entry per process (every
/// process, in the order given) and the total per function over them.
pub fn document(command: &str, seconds: Option<f64>, reports: &[ProcessReport], view: View) -> String {
    let totals = totals(reports);
    let order = view.pick_all(&totals, |t| (t.hits, t.latency.as_ref().map_or(0, |l| l.total_ns)));
    document_with(
        command,
        seconds,
        reports.iter().map(|r| process_json(r, view, |_, o| o, |o| o)),
        order.iter().map(|&i| total_json(&totals[i])),
    )
}

/// A summary document from processes and totals already written.
pub fn document_with(
    command: &str,
    seconds: Option<f64>,
    processes: impl IntoIterator<Item = String>,
    total: impl IntoIterator<Item = String>,
) -> String {
    Obj::new()
        .str("type", "summary")
        .num("schema", SCHEMA)
        .str("command", command)
        .opt("seconds", seconds.map(|s| format!("{s:.3}")))
        .list("processes", processes)
        .list("total", total)
        .finish()
}

/// One process's report from the reports of the programs it ran in turn
/// (a process that exec'd, followed with `--follow-exec`): rows of the same
/// module and function add up, latency merges, lost events add up.
pub fn merge_programs(pid: i32, mut reports: Vec<ProcessReport>) -> ProcessReport {
    if reports.len() == 1 {
        let mut r = reports.remove(0);
        r.summary.pid = pid;
        return r;
    }
    let mut out = ProcessReport::counts(Summary { pid, probes: Vec::new() });
    for r in reports {
        out.events |= r.events;
        out.lost += r.lost;
        out.children.extend(r.children);
        out.libraries.extend(r.libraries);
        out.stacks.extend(r.stacks);
        out.by.extend(r.by);
        out.aggregates.extend(r.aggregates);
        out.blocks.extend(r.blocks);
        out.steps.extend(r.steps);
        // A row joins one of an earlier program's; two functions of one name
        // in one program (static functions) stay two rows.
        let earlier = out.summary.probes.len();
        let mut taken = vec![false; earlier];
        let latency =
            if r.latency.len() == r.summary.probes.len() { r.latency } else { vec![None; r.summary.probes.len()] };
        for (p, l) in r.summary.probes.into_iter().zip(latency) {
            let same = (0..earlier).find(|&i| {
                !taken[i] && out.summary.probes[i].func == p.func && out.summary.probes[i].module == p.module
            });
            match same {
                Some(i) => {
                    taken[i] = true;
                    let q = &mut out.summary.probes[i];
                    q.hits += p.hits;
                    q.unfiltered = match (q.unfiltered, p.unfiltered) {
                        (None, None) => None,
                        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(p.hits)),
                    };
                    q.address = p.address;
                    q.enabled = p.enabled;
                    match (&mut out.latency[i], l) {
                        (Some(a), Some(b)) => a.merge(&b),
                        (slot @ None, Some(b)) => *slot = Some(b),
                        (_, None) => {}
                    }
                }
                None => {
                    out.summary.probes.push(p);
                    out.latency.push(l);
                }
            }
        }
    }
    out
}

/// One function's total over the processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Total {
    /// Function name.
    pub func: String,
    /// Module file name.
    pub module: String,
    /// How many processes had it probed.
    pub processes: usize,
    /// Calls counted in all of them (those that passed `--if`).
    pub hits: u64,
    /// With `--if`: every call in all of them.
    pub unfiltered: Option<u64>,
    /// Their latency, merged, if any of them timed it.
    pub latency: Option<Latency>,
}
/// Totals per (module, function), in the order functions first appear.
/// The k-th function of a name in a module (static functions) adds to the
/// k-th total of that name.
pub fn totals(reports: &[ProcessReport]) -> Vec<Total> {
    let mut out: Vec<Total> = Vec::new();
    // Where each (function, module, how many of that name came before) is
    // in `out`: linear in the probes, as a probe-all needs.
    let mut keys: std::collections::HashMap<(&str, &str, usize), usize> = std::collections::HashMap::new();
    for r in reports {
        let none = vec![None; r.summary.probes.len()];
        let latency = if r.latency.len() == r.summary.probes.len() { &r.latency } else { &none };
        let mut seen: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
        for (p, l) in r.summary.probes.iter().zip(latency) {
            let before = seen.entry((&p.func, &p.module)).or_default();
            let k = *before;
            *before += 1;
            let at = *keys.entry((&p.func, &p.module, k)).or_insert_with(|| {
                let (func, module) = (p.func.clone(), p.module.clone());
                out.push(Total { func, module, processes: 0, hits: 0, unfiltered: None, latency: None });
                out.len() - 1
            });
            let t = &mut out[at];
            t.processes += 1;
            t.hits += p.hits;
            if let Some(u) = p.unfiltered {
                t.unfiltered = Some(t.unfiltered.unwrap_or(0) + u);
            }
            if let Some(l) = l {
                t.latency.get_or_insert_with(Latency::default).merge(l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_load_over_and_over_is_one_entry_with_its_longest_wait() {
        let load = |m: &str, ms: u64| Loaded {
            modules: vec![m.to_string()],
            probes: 1,
            skipped: 0,
            at: "rendezvous",
            loads: 1,
            took: std::time::Duration::from_millis(ms),
        };
        let mut list = Vec::new();
        for (m, ms) in [("liba.so", 3), ("liba.so", 7), ("liba.so", 2), ("libb.so", 1), ("liba.so", 1)] {
            Loaded::add_to(&mut list, load(m, ms));
        }
        let seen: Vec<(&str, u64, u128)> =
            list.iter().map(|l| (l.modules[0].as_str(), l.loads, l.took.as_millis())).collect();
        assert_eq!(seen, [("liba.so", 3, 7), ("libb.so", 1, 1), ("liba.so", 1, 1)]);
    }

    fn report(pid: i32, rows: &[(&str, u64)]) -> ProcessReport {
        let probes =
            rows.iter().map(|(f, hits)| ProbeStat::new(f.to_string(), "m".into(), 0x10, (*hits, None))).collect();
        ProcessReport::counts(Summary { pid, probes })
    }

    fn text(reports: &[ProcessReport], view: View) -> (String, usize) {
        let mut out = Vec::new();
        let hidden = write_text(&mut out, reports, view).unwrap();
        (String::from_utf8(out).unwrap(), hidden)
    }

    #[test]
    fn several_processes_have_a_section_each_and_a_total() {
        let reports = [report(10, &[("foo", 3), ("bar", 1)]), report(11, &[("foo", 4)])];
        let (text, _) = text(&reports, View::default());
        assert!(text.starts_with("process 10:\nFUNCTION"), "{text}");
        assert!(text.contains("\nprocess 11:\n"), "{text}");
        let total = text.split("total of 2 processes:\n").nth(1).unwrap();
        let lines: Vec<&str> = total.lines().collect();
        assert_eq!(lines[0], "FUNCTION  MODULE  PROCESSES             HITS");
        assert_eq!(lines[1], "foo       m               2                7");
        assert_eq!(lines[2], "bar       m               1                1");
    }

    #[test]
    fn rows_come_by_hits_without_the_zeros_unless_asked() {
        let r = report(10, &[("idle", 0), ("warm", 5), ("hot", 900), ("cold", 0), ("also", 5)]);
        let (t, hidden) = text(std::slice::from_ref(&r), View::default());
        let names: Vec<&str> = t.lines().skip(1).map(|l| l.split_whitespace().next().unwrap()).collect();
        assert_eq!((names, hidden), (vec!["hot", "warm", "also"], 2));
        let (t, hidden) = text(std::slice::from_ref(&r), View { all: true, top: None });
        assert_eq!((t.lines().count(), hidden), (6, 0));
        let (t, _) = text(std::slice::from_ref(&r), View { all: false, top: Some(1) });
        assert_eq!(t.lines().nth(1).unwrap().split_whitespace().next(), Some("hot"));
        assert_eq!(t.lines().count(), 2);
    }

    #[test]
    fn one_and_several_processes_have_one_json_shape() {
        let keys = |doc: &str| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(doc).unwrap();
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.extend(v["processes"][0].as_object().unwrap().keys().cloned());
            k.extend(v["processes"][0]["probes"][0].as_object().unwrap().keys().cloned());
            k.extend(v["total"][0].as_object().unwrap().keys().cloned());
            k
        };
        let one = document("attach", Some(1.0), &[report(10, &[("foo", 3)])], View::default());
        let two =
            document("attach", Some(1.0), &[report(10, &[("foo", 3)]), report(11, &[("foo", 4)])], View::default());
        assert_eq!(keys(&one), keys(&two));
        let v: serde_json::Value = serde_json::from_str(&two).unwrap();
        assert_eq!((v["type"].as_str(), v["schema"].as_u64()), (Some("summary"), Some(1)));
        assert_eq!(v["total"][0]["hits"], 7);
        assert_eq!(v["processes"][1]["lost_events"], 0);
        // Nothing at all is still a document.
        let empty: serde_json::Value = serde_json::from_str(&document("status", None, &[], View::default())).unwrap();
        assert_eq!(empty["processes"].as_array().unwrap().len(), 0);
        assert!(empty["seconds"].is_null());
    }

    #[test]
    fn programs_of_one_process_add_up() {
        let merged = merge_programs(10, vec![report(10, &[("foo", 3), ("bar", 1)]), report(10, &[("foo", 4)])]);
        let rows: Vec<(&str, u64)> = merged.summary.probes.iter().map(|p| (p.func.as_str(), p.hits)).collect();
        assert_eq!(rows, [("foo", 7), ("bar", 1)]);
        assert_eq!(merged.latency.len(), 2);
        // Static functions of one name stay apart, in one program and across two.
        let one = merge_programs(10, vec![report(10, &[("f", 1), ("f", 2)])]);
        assert_eq!(one.summary.probes.len(), 2);
        let two = merge_programs(10, vec![report(10, &[("f", 1), ("f", 2)]), report(10, &[("f", 10), ("f", 20)])]);
        let hits: Vec<u64> = two.summary.probes.iter().map(|p| p.hits).collect();
        assert_eq!(hits, [11, 22]);
    }

    #[test]
    fn children_are_counted_and_the_notable_ones_listed() {
        let mut r = report(10, &[("foo", 3)]);
        let child = |pid, end: &str| Child { pid, events: 2, end: end.into() };
        r.children = vec![
            child(11, "exited with status 0"),
            child(12, "killed by SIGSEGV (core dumped)"),
            child(13, "exited with status 0"),
            child(14, "running; probes removed"),
        ];
        let (text, _) = text(std::slice::from_ref(&r), View::default());
        let tail = text.split("\nchildren forked while the probes were in: 4 (").nth(1).unwrap();
        assert!(tail.starts_with("2 exited with status 0, 1 killed by SIGSEGV, 1 running)\n"), "{text}");
        assert!(tail.contains("\n       12  killed by SIGSEGV (core dumped), 2 events\n"), "{text}");
        assert!(tail.contains("\n       14  running; probes removed, 2 events\n"), "{text}");
        assert!(!tail.contains("  11  "), "{text}");
        let doc = document("attach", None, std::slice::from_ref(&r), View::default());
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["processes"][0]["children"].as_array().unwrap().len(), 4);
        assert_eq!(v["processes"][0]["children"][1]["end"], "killed by SIGSEGV (core dumped)");
    }

    #[test]
    fn one_process_prints_its_table() {
        let r = report(10, &[("foo", 3)]);
        let (a, _) = text(std::slice::from_ref(&r), View::default());
        let mut b = Vec::new();
        table::summary(&r.summary, &mut b).unwrap();
        assert_eq!(a.as_bytes(), b);
    }
}
