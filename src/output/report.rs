//! The summary a session prints when it ends. One process: as tp always
//! printed it (the counts table, or the latency table and histograms when
//! returns were timed; one JSON object with `--json`). Several processes:
//! the same section for each process under its PID, then their total per
//! function; with `--json`, `{"processes":[…],"total":[…]}`.

use std::io::{self, Write};

use super::stacks::ProbeStacks;
use super::{Summary, histogram, json, table, thousands};
use crate::escape::text;
use crate::events::stats::Latency;

/// What one process's probes counted and timed.
#[derive(Debug, Clone)]
pub struct ProcessReport {
    /// Counts, one row per user probe.
    pub summary: Summary,
    /// Latency per row, when the session recorded events (`None` for a row
    /// whose returns were not recorded); empty when it only counted.
    pub latency: Vec<Option<Latency>>,
    /// True if the session recorded events (the JSON then has `lost_events`).
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

fn by_json(all: &[ProbeValues]) -> String {
    let each: Vec<String> = all
        .iter()
        .map(|p| {
            let values: Vec<String> =
                p.values.iter().map(|(v, n)| format!("{{\"value\":{v},\"calls\":{n}}}")).collect();
            format!(
                "{{\"function\":{},\"arg\":{},\"overflow\":{},\"values\":[{}]}}",
                json::string(&p.function),
                json::string(&p.arg),
                p.overflow,
                values.join(",")
            )
        })
        .collect();
    format!("[{}]", each.join(","))
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

fn children_json(children: &[Child]) -> String {
    let each: Vec<String> = children
        .iter()
        .map(|c| format!("{{\"pid\":{},\"events\":{},\"end\":{}}}", c.pid, c.events, json::string(&c.end)))
        .collect();
    format!("\"children\":[{}]", each.join(","))
}

/// Writes the end-of-session summary of `reports` to `out`.
pub fn write(out: &mut impl Write, reports: &[ProcessReport], several: bool, as_json: bool) -> io::Result<()> {
    if !several {
        return match reports.first() {
            Some(r) => one(out, r, as_json),
            None => Ok(()),
        };
    }
    let totals = totals(reports);
    if as_json {
        let processes: Vec<String> = reports.iter().map(one_json).collect();
        let total: Vec<String> = totals.iter().map(total_json).collect();
        return writeln!(out, "{{\"processes\":[{}],\"total\":[{}]}}", processes.join(","), total.join(","));
    }
    for r in reports {
        writeln!(out, "process {}:", r.summary.pid)?;
        one(out, r, false)?;
        writeln!(out)?;
    }
    writeln!(out, "total of {} processes:", reports.len())?;
    let name_w = table::width(totals.iter().map(|t| t.func.as_str()), 8, table::NAME_MAX);
    let mod_w = table::width(totals.iter().map(|t| t.module.as_str()), 6, table::MODULE_MAX);
    let timed = totals.iter().any(|t| t.latency.is_some());
    write!(out, "{:<name_w$}  {:<mod_w$}  {:>9}  {:>15}", "FUNCTION", "MODULE", "PROCESSES", "HITS")?;
    writeln!(out, "{}", if timed { format!("  {:>9}  {:>10}  {:>10}", "TIMED", "P50", "P99") } else { String::new() })?;
    for t in &totals {
        write!(
            out,
            "{:<name_w$}  {:<mod_w$}  {:>9}  {:>15}",
            table::fit(&t.func, name_w),
            table::fit(&t.module, mod_w),
            t.processes,
            thousands(t.hits)
        )?;
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
    Ok(())
}

/// One process's section, in the format of a session of one process (and
/// the children it forked, if it did).
fn one(out: &mut impl Write, r: &ProcessReport, as_json: bool) -> io::Result<()> {
    if as_json {
        return writeln!(out, "{}", one_json(r));
    }
    one_table(out, r)?;
    children_text(out, &r.children)?;
    by_text(out, &r.by)?;
    super::stacks::write_text(out, &r.stacks)
}

fn one_table(out: &mut impl Write, r: &ProcessReport) -> io::Result<()> {
    let rows: Vec<(String, u64, &Latency)> = r
        .summary
        .probes
        .iter()
        .zip(&r.latency)
        .filter_map(|(p, l)| Some((p.func.clone(), p.hits, l.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return table::summary(&r.summary, out);
    }
    writeln!(out)?;
    histogram::table(out, &rows)?;
    writeln!(out)?;
    for (name, _, l) in &rows {
        if l.count > 0 {
            histogram::histogram(out, name, l)?;
        }
    }
    Ok(())
}

fn one_json(r: &ProcessReport) -> String {
    let mut o = if r.events {
        let timed: Vec<Option<&Latency>> = r.latency.iter().map(Option::as_ref).collect();
        json::summary_with_latency(&r.summary, &timed, r.lost)
    } else {
        json::summary(&r.summary)
    };
    let mut extra = Vec::new();
    if !r.children.is_empty() {
        extra.push(children_json(&r.children));
    }
    if !r.by.is_empty() {
        extra.push(format!("\"by\":{}", by_json(&r.by)));
    }
    if !r.stacks.is_empty() {
        extra.push(format!("\"stacks\":{}", super::stacks::to_json(&r.stacks)));
    }
    if !extra.is_empty() && o.ends_with('}') {
        o.pop();
        o.push(',');
        o.push_str(&extra.join(","));
        o.push('}');
    }
    o
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
    let mut out = ProcessReport {
        summary: Summary { pid, probes: Vec::new() },
        latency: Vec::new(),
        events: false,
        lost: 0,
        children: Vec::new(),
        stacks: Vec::new(),
        by: Vec::new(),
    };
    for r in reports {
        out.events |= r.events;
        out.lost += r.lost;
        out.children.extend(r.children);
        out.stacks.extend(r.stacks);
        out.by.extend(r.by);
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
    /// Calls counted in all of them.
    pub hits: u64,
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
                out.push(Total { func, module, processes: 0, hits: 0, latency: None });
                out.len() - 1
            });
            let t = &mut out[at];
            t.processes += 1;
            t.hits += p.hits;
            if let Some(l) = l {
                t.latency.get_or_insert_with(Latency::default).merge(l);
            }
        }
    }
    out
}

fn total_json(t: &Total) -> String {
    let mut o = format!(
        "{{\"func\":{},\"module\":{},\"processes\":{},\"hits\":{}",
        json::string(&t.func),
        json::string(&t.module),
        t.processes,
        t.hits
    );
    if let Some(l) = &t.latency {
        o.push_str(&format!(
            ",\"calls_timed\":{},\"total_ns\":{},\"p50_ns\":{},\"p99_ns\":{}",
            l.count,
            l.total_ns,
            l.quantile_ns(0.5),
            l.quantile_ns(0.99)
        ));
    }
    o.push('}');
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ProbeStat;

    fn report(pid: i32, rows: &[(&str, u64)]) -> ProcessReport {
        let probes = rows
            .iter()
            .map(|(f, hits)| ProbeStat {
                func: f.to_string(),
                module: "m".into(),
                address: 0x10,
                hits: *hits,
                enabled: true,
            })
            .collect();
        ProcessReport {
            summary: Summary { pid, probes },
            latency: Vec::new(),
            events: false,
            lost: 0,
            children: Vec::new(),
            stacks: Vec::new(),
            by: Vec::new(),
        }
    }

    #[test]
    fn several_processes_have_a_section_each_and_a_total() {
        let reports = [report(10, &[("foo", 3), ("bar", 1)]), report(11, &[("foo", 4)])];
        let mut out = Vec::new();
        write(&mut out, &reports, true, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("process 10:\nFUNCTION"), "{text}");
        assert!(text.contains("\nprocess 11:\n"), "{text}");
        let total = text.split("total of 2 processes:\n").nth(1).unwrap();
        let lines: Vec<&str> = total.lines().collect();
        assert_eq!(lines[0], "FUNCTION  MODULE  PROCESSES             HITS");
        assert_eq!(lines[1], "foo       m               2                7");
        assert_eq!(lines[2], "bar       m               1                1");
    }

    #[test]
    fn several_processes_in_json() {
        let mut out = Vec::new();
        write(&mut out, &[report(10, &[("foo", 3)]), report(11, &[("foo", 4)])], true, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("{\"processes\":[{\"pid\":10,"), "{text}");
        assert!(
            text.trim_end().ends_with("\"total\":[{\"func\":\"foo\",\"module\":\"m\",\"processes\":2,\"hits\":7}]}")
        );
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
        let mut out = Vec::new();
        write(&mut out, std::slice::from_ref(&r), false, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        let tail = text.split("\nchildren forked while the probes were in: 4 (").nth(1).unwrap();
        assert!(tail.starts_with("2 exited with status 0, 1 killed by SIGSEGV, 1 running)\n"), "{text}");
        assert!(tail.contains("\n       12  killed by SIGSEGV (core dumped), 2 events\n"), "{text}");
        assert!(tail.contains("\n       14  running; probes removed, 2 events\n"), "{text}");
        assert!(!tail.contains("  11  "), "{text}");
        let mut out = Vec::new();
        write(&mut out, std::slice::from_ref(&r), false, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["children"].as_array().unwrap().len(), 4);
        assert_eq!(v["children"][1]["end"], "killed by SIGSEGV (core dumped)");
    }

    #[test]
    fn one_process_prints_as_before() {
        let r = report(10, &[("foo", 3)]);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write(&mut a, std::slice::from_ref(&r), false, false).unwrap();
        table::summary(&r.summary, &mut b).unwrap();
        assert_eq!(a, b);
    }
}
