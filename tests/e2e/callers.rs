//! Calls keyed by their call site (`--by caller`): the callers target
//! calls `work` from three functions a known number of times each and
//! notes the return address of every call itself; tp's rows per caller
//! must equal those books (the address, its function, the calls), in
//! JSON, in text with latency, and in `tp status` (JSON, OpenMetrics)
//! while the session runs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::*;

/// The target's books of one `calls A B C`: per function, its call
/// site's return address and its calls.
fn sites(lines: &[String]) -> BTreeMap<String, (u64, u64)> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("site "))
        .map(|l| {
            let mut parts = l.split(' ');
            let name = parts.next().unwrap().to_string();
            let ret = u64::from_str_radix(parts.next().unwrap().trim_start_matches("ret=0x"), 16).unwrap();
            let calls = parts.next().unwrap().trim_start_matches("calls=").parse().unwrap();
            (name, (ret, calls))
        })
        .collect()
}

/// The only aggregate of a JSON summary (or `tp status --json`).
fn aggregate(stdout: &str) -> Value {
    let p = one_process(stdout);
    let all = p["aggregates"].as_array().unwrap();
    assert_eq!(all.len(), 1, "{p}");
    all[0].clone()
}

/// Per row of a JSON aggregate keyed by caller alone: its function and
/// address (from the row's `caller`), and its count; the key's text is
/// checked against them.
fn rows_by_caller(a: &Value) -> BTreeMap<String, (u64, u64)> {
    assert_eq!(a["keys"], serde_json::json!(["caller"]), "{a}");
    a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let c = &r["caller"];
            let func = c["func"].as_str().unwrap_or_else(|| panic!("no function in {r}")).to_string();
            let addr = u64::from_str_radix(c["addr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
            assert_eq!(c["module"], "callers", "{r}");
            let text = format!("{func}+{:#x} (callers)", c["offset"].as_u64().unwrap());
            assert_eq!(r["key"][0].as_str(), Some(text.as_str()), "{r}");
            (func, (addr, r["count"].as_u64().unwrap()))
        })
        .collect()
}

/// `--by caller` counts: one row per call site, its return address the
/// one the target saw, named by its function, with the target's calls.
#[test]
fn counts_by_caller_equal_the_targets_books_per_call_site() {
    let mut t = Target::start("callers");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-q", "-f", "work", "--by", "caller", "--json"]);
    let before = t.out.seen.len();
    t.ask("calls 300 500 700", "done calls");
    let books = sites(&t.out.seen[before..]);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_eq!(books.values().map(|b| b.1).collect::<Vec<_>>(), [300, 500, 700], "{books:?}");
    let a = aggregate(&stdout);
    assert_eq!(rows_by_caller(&a), books, "{a}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}

/// `--agg 'count(), avg(latency)' --by caller` in text: the exit keys the
/// duration by the return address the call's frame kept; one line per
/// call site, named, with its calls.
#[test]
fn latency_by_caller_in_text_counts_each_call_site() {
    let mut t = Target::start("callers");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "work", "--agg", "count(), avg(latency)", "--by", "caller"]);
    let before = t.out.seen.len();
    t.ask("calls 40 20 60", "done calls");
    let books = sites(&t.out.seen[before..]);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(stdout.contains("\ncount(), avg(latency) of work by caller:\n"), "{stdout}");
    for (name, (_, calls)) in &books {
        let prefix = format!("@[{name}+0x");
        let line = stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{prefix} in {stdout}"));
        assert!(line.contains(&format!(" (callers)]: count {calls}, avg ")), "{line}");
    }
    assert_eq!(stdout.lines().filter(|l| l.starts_with("@[")).count(), 3, "{stdout}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}

/// `tp status` of a running session keyed by caller: the session's own
/// rows (JSON), and the callers named as OpenMetrics labels.
#[test]
fn status_names_a_running_sessions_callers() {
    let mut t = Target::start("callers");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-q", "-f", "work", "--by", "caller, tid", "--json"]);
    let before = t.out.seen.len();
    t.ask("calls 7 11 13", "done calls");
    let books = sites(&t.out.seen[before..]);
    let status = aggregate(&format!("{}\n", expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]))));
    let om = expect_success(&["status"], &tp(&["status", "-p", &pid, "--openmetrics"]));
    let (code, stdout, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    assert_eq!(status, aggregate(&stdout), "tp status vs the session's summary");
    assert_eq!(status["keys"], serde_json::json!(["caller", "tid"]));
    let rows = status["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{status}");
    for r in rows {
        assert_eq!(r["key"][1].as_u64(), Some(t.pid as u64), "the main thread's: {r}");
        let (ret, calls) = books[r["caller"]["func"].as_str().unwrap()];
        assert_eq!(r["caller"]["addr"], format!("{ret:#x}"), "{r}");
        assert_eq!(r["count"].as_u64(), Some(calls), "{r}");
        let label = format!("key_caller=\"{}\",key_tid=\"{}\"}} {calls}", r["key"][0].as_str().unwrap(), t.pid);
        assert!(
            om.lines().any(|l| l.starts_with("tp_aggregate_calls_total{") && l.ends_with(&label)),
            "{label} in {om}"
        );
    }
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}

/// A static probe sits inside its function, where no return address is
/// at the stack pointer: `--by caller` and `--by stack` (which starts
/// from it) there are refused in one line, the target untouched.
#[test]
fn a_static_probe_is_not_keyed_by_caller_or_stack() {
    let t = Target::start("sdt");
    let pid = t.pid.to_string();
    for key in ["caller", "stack"] {
        let err = expect_error(
            &["attach", "-p", &pid, "-d", "1", "-f", "usdt:tpsdt:tick", "--by", key],
            &format!("--by {key} keys by the return address"),
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!has_region(t.pid), "tp's memory left in the target");
    }
    assert!(t.quit().success(), "the target must exit 0");
}

/// Return values keyed by caller (`--ret -q --agg 'sum(ret)' --by
/// caller`): work(i) returns 3i + 1 and each site calls it for i below
/// its count, so each row's sum is known exactly; the exit takes the key
/// from the return address the call's frame kept.
#[test]
fn return_values_by_caller_sum_exactly_per_call_site() {
    let mut t = Target::start("callers");
    let pid = t.pid.to_string();
    let session = Session::start(&[
        "-p",
        &pid,
        "-q",
        "-f",
        "work",
        "--ret",
        "--agg",
        "count(), sum(ret)",
        "--by",
        "caller",
        "--json",
    ]);
    let before = t.out.seen.len();
    t.ask("calls 100 250 30", "done calls");
    let books = sites(&t.out.seen[before..]);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let a = aggregate(&stdout);
    assert_eq!(rows_by_caller(&a), books, "{a}");
    for r in a["rows"].as_array().unwrap() {
        let n = r["count"].as_i64().unwrap();
        assert_eq!(r["sum"].as_i64(), Some(3 * n * (n - 1) / 2 + n), "{r}");
    }
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}
