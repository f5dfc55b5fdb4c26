//! The metrics exposition formats: OpenMetrics 1.0 (what Prometheus asks
//! for when it scrapes) and the Prometheus text format 0.0.4 (what
//! node_exporter's textfile collector and `promtool check metrics` read,
//! and what a scrape that does not ask for OpenMetrics gets). Both carry
//! one counter for the calls, `tp_calls_total{pid,module,function}`, and,
//! for the probes whose calls a session timed, one histogram,
//! `tp_latency_seconds` with cumulative `_bucket{le=…}`, `_sum` and
//! `_count`. They differ in the counter's family name (`tp_calls` in
//! OpenMetrics, whose samples add `_total`; `tp_calls_total` in the text
//! format), in `# UNIT`, and in OpenMetrics' closing `# EOF`.
//!
//! Bucket bounds are powers of two nanoseconds from 128 ns to 2^34 ns
//! (17.2 s), then `+Inf`: the same bounds in every exposition, so rates and
//! quantiles over time add up, and each bucket's count is exact (the
//! latency statistics count calls of at most 2^k ns: `le` means "at most").
//! Label values are escaped as the format says (`\\`, `\"`, `\n`); the
//! names come from the target, so nothing else in them is trusted either:
//! they are UTF-8 already, and the format allows any other character.

use std::fmt::Write;

use super::aggregates::ProbeAgg;
use super::format::Format;
use super::report::ProcessReport;
use crate::events::predicate::AggFn;
use crate::events::stats::Latency;

/// The smallest and largest finite bucket bound, as powers of two nanoseconds.
const FIRST_BOUND: u32 = 7;
const LAST_BOUND: u32 = 34;

/// One probe's numbers.
#[derive(Debug, Clone)]
pub struct Series {
    /// The process.
    pub pid: i32,
    /// The module's file name.
    pub module: String,
    /// The function.
    pub function: String,
    /// Calls counted.
    pub calls: u64,
    /// Durations of the calls timed, when the session recorded returns.
    pub latency: Option<Latency>,
    /// Its aggregates per key (`--agg`, `--by tid`), when the session keeps them.
    pub aggregate: Option<ProbeAgg>,
}

/// The HTTP Content-Type of `format` ([`Format::OpenMetrics`], else the
/// Prometheus text format).
pub fn content_type(format: Format) -> &'static str {
    match format {
        Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        _ => "text/plain; version=0.0.4; charset=utf-8",
    }
}

/// The format a scrape's `Accept` header asks for: OpenMetrics when it
/// names it (Prometheus does), else the Prometheus text format, as
/// Prometheus's own client libraries choose.
pub fn negotiate(accept: Option<&str>) -> Format {
    match accept {
        Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
        _ => Format::Prometheus,
    }
}

/// The series of one process's report, one per row.
pub fn series_of(r: &ProcessReport) -> Vec<Series> {
    r.summary
        .probes
        .iter()
        .enumerate()
        .map(|(i, p)| Series {
            pid: r.summary.pid,
            module: p.module.clone(),
            function: p.func.clone(),
            calls: p.hits,
            latency: r.latency.get(i).cloned().flatten(),
            // One per row, in the rows' order (not so after an exec).
            aggregate: (r.aggregates.len() == r.summary.probes.len()).then(|| r.aggregates[i].clone()),
        })
        .collect()
}

const CALLS_HELP: &str = "Calls of a probed function, counted by tp's probe in the process.";
const LATENCY_HELP: &str = "Durations of the calls tp timed (return probes).";

/// The exposition of `series` in `format`: [`Format::OpenMetrics`], else
/// the Prometheus text format.
pub fn render(series: &[Series], format: Format) -> String {
    let labels = unique_labels(series);
    let om = format == Format::OpenMetrics;
    let mut out = String::new();
    let family = if om { "tp_calls" } else { "tp_calls_total" };
    let _ = writeln!(out, "# HELP {family} {CALLS_HELP}");
    let _ = writeln!(out, "# TYPE {family} counter");
    for (s, l) in series.iter().zip(&labels) {
        let _ = writeln!(out, "tp_calls_total{{{l}}} {}", s.calls);
    }
    if series.iter().any(|s| s.latency.is_some()) {
        let _ = writeln!(out, "# HELP tp_latency_seconds {LATENCY_HELP}");
        out.push_str("# TYPE tp_latency_seconds histogram\n");
        if om {
            out.push_str("# UNIT tp_latency_seconds seconds\n");
        }
        for (s, l) in series.iter().zip(&labels) {
            let Some(lat) = &s.latency else { continue };
            for k in FIRST_BOUND..=LAST_BOUND {
                let le = (1u64 << k) as f64 / 1e9;
                let _ = writeln!(out, "tp_latency_seconds_bucket{{{l},le=\"{le:e}\"}} {}", lat.at_most_pow2_ns(k));
            }
            let _ = writeln!(out, "tp_latency_seconds_bucket{{{l},le=\"+Inf\"}} {}", lat.count);
            let _ = writeln!(out, "tp_latency_seconds_sum{{{l}}} {}", lat.total_ns as f64 / 1e9);
            let _ = writeln!(out, "tp_latency_seconds_count{{{l}}} {}", lat.count);
        }
    }
    aggregates(&mut out, series, &labels, om);
    if om {
        out.push_str("# EOF\n");
    }
    out
}

const AGG_CALLS_HELP: &str = "Calls per key of --by (--agg's count), kept in the process.";

/// The aggregates' families: `tp_aggregate_calls` (a counter) per key, and
/// per key and value `tp_aggregate_sum_value`, `_min_value`, `_max_value` (gauges: a sum
/// of signed values can go down), with the session's keys as labels
/// `key_NAME` and the value's text as `value`. Their histograms are not
/// exposed.
fn aggregates(out: &mut String, series: &[Series], labels: &[String], om: bool) {
    let rows = |s: &Series, l: &String| -> Vec<(String, crate::output::aggregates::AggRow)> {
        let Some(a) = &s.aggregate else { return Vec::new() };
        let names: Vec<String> = a
            .keys
            .iter()
            .map(|k| {
                format!(
                    "key_{}",
                    k.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>()
                )
            })
            .collect();
        a.rows
            .iter()
            .map(|r| {
                let keys: String =
                    names.iter().zip(a.key_texts(r)).map(|(n, v)| format!(",{n}=\"{}\"", escape(&v))).collect();
                (format!("{l}{keys}"), r.clone())
            })
            .collect()
    };
    if !series.iter().any(|s| s.aggregate.is_some()) {
        return;
    }
    let family = if om { "tp_aggregate_calls" } else { "tp_aggregate_calls_total" };
    let _ = writeln!(out, "# HELP {family} {AGG_CALLS_HELP}");
    let _ = writeln!(out, "# TYPE {family} counter");
    for (s, l) in series.iter().zip(labels) {
        for (l, r) in rows(s, l) {
            let _ = writeln!(out, "tp_aggregate_calls_total{{{l}}} {}", r.count);
        }
    }
    for (f, name, help) in [
        (AggFn::Sum, "tp_aggregate_sum_value", "Sum of --agg's value per key of --by, kept in the process."),
        (AggFn::Min, "tp_aggregate_min_value", "Smallest of --agg's value per key of --by, kept in the process."),
        (AggFn::Max, "tp_aggregate_max_value", "Largest of --agg's value per key of --by, kept in the process."),
    ] {
        let with: Vec<(&Series, &String)> = series
            .iter()
            .zip(labels)
            .filter(|(s, _)| s.aggregate.as_ref().is_some_and(|a| a.value.is_some() && a.funcs.contains(&f)))
            .collect();
        if with.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (s, l) in with {
            let value = escape(s.aggregate.as_ref().and_then(|a| a.value.as_deref()).unwrap_or(""));
            for (l, r) in rows(s, l) {
                let v = match f {
                    AggFn::Sum => r.sum,
                    AggFn::Min => r.min,
                    _ => r.max,
                };
                let _ = writeln!(out, "{name}{{{l},value=\"{value}\"}} {v}");
            }
        }
    }
}

/// The label set of each series. Two functions of one name in one module
/// (static functions of different files) would give two series one label
/// set, which the format forbids: the later ones are numbered, `name#2`,
/// `name#3`.
fn unique_labels(series: &[Series]) -> Vec<String> {
    // How often each (pid, module, function) was seen: linear in the
    // series, as a probe-all of tens of thousands of functions needs.
    let mut seen: std::collections::HashMap<(i32, &str, &str), usize> = std::collections::HashMap::new();
    series
        .iter()
        .map(|s| {
            let count = seen.entry((s.pid, &s.module, &s.function)).or_default();
            let n = *count;
            *count += 1;
            let function = if n == 0 { s.function.clone() } else { format!("{}#{}", s.function, n + 1) };
            format!("pid=\"{}\",module=\"{}\",function=\"{}\"", s.pid, escape(&s.module), escape(&function))
        })
        .collect()
}

/// A label value: backslash, double quote and line feed escaped.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(function: &str, calls: u64, latency: Option<Latency>) -> Series {
        Series { pid: 7, module: "m".into(), function: function.into(), calls, latency, aggregate: None }
    }

    #[test]
    fn counters_then_eof() {
        let text = render(&[series("foo", 3, None), series("a\"b\\c\nd", 1, None)], Format::OpenMetrics);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "# TYPE tp_calls counter");
        assert_eq!(lines[2], "tp_calls_total{pid=\"7\",module=\"m\",function=\"foo\"} 3");
        assert_eq!(lines[3], "tp_calls_total{pid=\"7\",module=\"m\",function=\"a\\\"b\\\\c\\nd\"} 1");
        assert_eq!(*lines.last().unwrap(), "# EOF");
        assert!(!text.contains("tp_latency"), "no histogram without latency");
    }

    #[test]
    fn histograms_are_cumulative_and_exact() {
        let mut l = Latency::default();
        for ns in [100, 128, 129, 1000, 5_000_000_000, 40_000_000_000] {
            l.add(ns);
        }
        let text = render(&[series("foo", 6, Some(l))], Format::OpenMetrics);
        let bucket = |le: &str| -> u64 {
            let key = format!("tp_latency_seconds_bucket{{pid=\"7\",module=\"m\",function=\"foo\",le=\"{le}\"}} ");
            text.lines().find_map(|x| x.strip_prefix(&key)).unwrap_or_else(|| panic!("{le}: {text}")).parse().unwrap()
        };
        assert_eq!(bucket("1.28e-7"), 2, "100 ns and 128 ns are at most 128 ns");
        assert_eq!(bucket("2.56e-7"), 3);
        assert_eq!(bucket("1.024e-6"), 4);
        assert_eq!(bucket("8.589934592e0"), 5);
        assert_eq!(bucket("1.7179869184e1"), 5);
        assert_eq!(bucket("+Inf"), 6);
        assert!(text.contains("tp_latency_seconds_count{pid=\"7\",module=\"m\",function=\"foo\"} 6\n"));
        assert!(text.contains("tp_latency_seconds_sum{pid=\"7\",module=\"m\",function=\"foo\"} 45.000001357\n"));
        assert!(text.contains("# UNIT tp_latency_seconds seconds\n"));
    }

    #[test]
    fn the_text_format_names_the_counter_by_its_samples() {
        let text = render(&[series("foo", 3, Some(Latency::default()))], Format::Prometheus);
        assert!(text.starts_with("# HELP tp_calls_total Calls"), "{text}");
        assert!(text.contains("# TYPE tp_calls_total counter\ntp_calls_total{"), "{text}");
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(text.contains("tp_latency_seconds_count{pid=\"7\",module=\"m\",function=\"foo\"} 0\n"), "{text}");
        assert_eq!(negotiate(Some("application/openmetrics-text;version=1.0.0,*/*;q=0.1")), Format::OpenMetrics);
        assert_eq!(negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(negotiate(None), Format::Prometheus);
    }

    #[test]
    fn one_label_set_per_series() {
        let text = render(&[series("f", 1, None), series("f", 2, None)], Format::OpenMetrics);
        assert!(text.contains("function=\"f\"} 1\n") && text.contains("function=\"f#2\"} 2\n"), "{text}");
    }
    #[test]
    fn aggregates_are_a_counter_and_gauges_per_key() {
        use crate::output::aggregates::AggRow;
        let row = |tid: i128, count, sum| AggRow { key: vec![3, tid], count, sum, min: -1, max: 9, hist: Vec::new() };
        let mut s = series("f", 5, None);
        s.aggregate = Some(ProbeAgg {
            function: "f".into(),
            keys: vec!["fd".into(), "tid".into()],
            value: Some("m->size".into()),
            funcs: vec![AggFn::Sum, AggFn::Max],
            rows: vec![row(11, 2, -7), row(12, 3, 40)],
            overflow: 0,
            unreadable: 0,
            callers: Default::default(),
            stacks: Default::default(),
        });
        let text = render(&[s, series("g", 1, None)], Format::OpenMetrics);
        let l = "pid=\"7\",module=\"m\",function=\"f\",key_fd=\"3\",key_tid=\"11\"";
        assert!(text.contains("# TYPE tp_aggregate_calls counter\n"), "{text}");
        assert!(text.contains(&format!("tp_aggregate_calls_total{{{l}}} 2\n")), "{text}");
        assert!(text.contains(&format!("tp_aggregate_sum_value{{{l},value=\"m->size\"}} -7\n")), "{text}");
        assert!(text.contains(&format!("tp_aggregate_max_value{{{l},value=\"m->size\"}} 9\n")), "{text}");
        assert!(!text.contains("tp_aggregate_min_value"), "min was not asked: {text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
