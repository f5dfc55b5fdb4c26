//! Aggregates kept in the target (`--agg 'hist(len), sum(len)'`, `--by
//! tid`): the agg target's threads pass lengths as an argument and as a
//! struct field and keep their own books; tp's counts, sums, minimums,
//! maximums, averages and histograms per thread must equal them, in JSON
//! and in text. Bad expressions are refused in one line.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::*;

/// One thread's books, as its line says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Books {
    t: i64,
    calls: i64,
    sum: i64,
    min: i64,
    max: i64,
    fsum: i64,
    fmin: i64,
    fmax: i64,
}

fn num(line: &str, key: &str) -> i64 {
    let at = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key} in {line}")) + key.len() + 2;
    line[at..].split(' ').next().unwrap().parse().unwrap()
}

/// The books of each thread (by TID) and the run's histograms ("len" and
/// "size": bucket to calls), from the target's lines.
fn books(lines: &[String]) -> (BTreeMap<i64, Books>, BTreeMap<String, BTreeMap<usize, u64>>) {
    let mut threads = BTreeMap::new();
    let mut hists: BTreeMap<String, BTreeMap<usize, u64>> = BTreeMap::new();
    for l in lines {
        if l.starts_with("thread ") {
            let b = Books {
                t: num(l, "t"),
                calls: num(l, "calls"),
                sum: num(l, "sum"),
                min: num(l, "min"),
                max: num(l, "max"),
                fsum: num(l, "fsum"),
                fmin: num(l, "fmin"),
                fmax: num(l, "fmax"),
            };
            threads.insert(num(l, "tid"), b);
        } else if let Some(rest) = l.strip_prefix("hist ") {
            let v: Vec<&str> = rest.split(' ').collect();
            hists.entry(v[0].to_string()).or_default().insert(v[1].parse().unwrap(), v[2].parse().unwrap());
        }
    }
    (threads, hists)
}

/// Runs `run THREADS CALLS` in the agg target while tp records with
/// `args` (and -q); returns the target's lines and tp's stdout.
fn record(args: &[&str], threads: u32, calls: u32) -> (Vec<String>, String) {
    let mut full = vec!["-q"];
    full.extend_from_slice(args);
    record_while(&full, &format!("run {threads} {calls}"), "done run")
}

/// Asks the agg target `command` (answered by `done`) while tp records
/// with `args`; returns the target's lines and tp's stdout.
fn record_while(args: &[&str], command: &str, done: &str) -> (Vec<String>, String) {
    let mut t = Target::start("agg");
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str()];
    full.extend_from_slice(args);
    let session = Session::start(&full);
    let before = t.out.seen.len();
    t.ask(command, done);
    let lines = t.out.seen[before..].to_vec();
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
    (lines, stdout)
}

/// A JSON histogram's buckets as the target numbers them.
fn buckets(hist: &Value) -> BTreeMap<usize, u64> {
    hist.as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let n = b["count"].as_u64().unwrap();
            let b = match b["low"].as_i64() {
                None => 0,
                Some(0) => 1,
                Some(low) => 2 + low.trailing_zeros() as usize,
            };
            (b, n)
        })
        .collect()
}

/// The only aggregate of the one process in a JSON summary.
fn aggregate(stdout: &str) -> Value {
    let p = one_process(stdout);
    let all = p["aggregates"].as_array().unwrap();
    assert_eq!(all.len(), 1, "{p}");
    all[0].clone()
}

/// Count, sum, min, max, avg and hist of an argument (a signed long, now
/// and then negative), per thread, equal each thread's own books, and the
/// histograms added over the threads equal the target's.
#[test]
fn an_arguments_aggregates_per_thread_equal_the_targets_books() {
    let (lines, stdout) = record(
        &[
            "-f",
            "consume",
            "--agg",
            "count(), sum(len), min(len), max(len), avg(len), hist(len)",
            "--by",
            "tid",
            "--json",
        ],
        4,
        3000,
    );
    let (threads, hists) = books(&lines);
    assert_eq!(threads.len(), 4, "{lines:?}");
    let a = aggregate(&stdout);
    assert_eq!(a["keys"], serde_json::json!(["tid"]));
    assert_eq!(a["value"], "len");
    assert_eq!(a["funcs"], serde_json::json!(["count", "sum", "min", "max", "avg", "hist"]));
    assert_eq!((a["overflow"].as_u64(), a["unreadable"].as_u64()), (Some(0), Some(0)));
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "one row per thread: {a}\n{lines:?}");
    let mut total: BTreeMap<usize, u64> = BTreeMap::new();
    for r in rows {
        let tid = r["key"][0].as_i64().unwrap();
        let b = threads.get(&tid).unwrap_or_else(|| panic!("tid {tid} is none of the target's threads"));
        assert_eq!(r["count"].as_i64(), Some(b.calls), "{r}");
        assert_eq!(r["sum"].as_i64(), Some(b.sum), "{r}");
        assert_eq!(r["min"].as_i64(), Some(b.min), "{r}");
        assert_eq!(r["max"].as_i64(), Some(b.max), "{r}");
        assert_eq!(r["avg"].as_i64(), Some(b.sum / b.calls), "{r}");
        assert!(b.min < 0, "the target passes negative lengths too");
        for (k, n) in buckets(&r["hist"]) {
            *total.entry(k).or_default() += n;
        }
    }
    assert_eq!(total, hists["len"], "tp's histogram vs the target's");
}

/// The return value (`ret`, a signed long: consume returns its `len`),
/// added at the exits the target times itself (`--ret -q`): per thread,
/// the same books as the argument's.
#[test]
fn the_return_values_aggregates_per_thread_equal_the_targets_books() {
    let (lines, stdout) = record(
        &[
            "-f",
            "consume",
            "--ret",
            "--agg",
            "count(), sum(ret), min(ret), max(ret), hist(ret)",
            "--by",
            "tid",
            "--json",
        ],
        3,
        2500,
    );
    let (threads, hists) = books(&lines);
    let a = aggregate(&stdout);
    assert_eq!(a["value"], "ret");
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "one row per thread: {a}");
    let mut total: BTreeMap<usize, u64> = BTreeMap::new();
    for r in rows {
        let b = &threads[&r["key"][0].as_i64().unwrap()];
        let got = (r["count"].as_i64(), r["sum"].as_i64(), r["min"].as_i64(), r["max"].as_i64());
        assert_eq!(got, (Some(b.calls), Some(b.sum), Some(b.min), Some(b.max)), "{r}");
        for (k, n) in buckets(&r["hist"]) {
            *total.entry(k).or_default() += n;
        }
    }
    assert_eq!(total, hists["len"], "tp's histogram vs the target's");
}

/// A struct field (`m->size`, an unsigned int read through the pointer
/// the call passes), in text: one line per thread with its sum, minimum,
/// maximum and average, and the histogram lines over the threads add up
/// to the target's.
#[test]
fn a_fields_aggregates_in_text_equal_the_targets_books() {
    let (lines, stdout) = record(
        &[
            "-f",
            "submit",
            "--agg",
            "sum(m->size), min(m->size), max(m->size), avg(m->size), hist(m->size)",
            "--by",
            "tid",
        ],
        3,
        2000,
    );
    let (threads, hists) = books(&lines);
    assert!(
        stdout.contains("\nsum(m->size), min(m->size), max(m->size), avg(m->size), hist(m->size) of submit by tid:\n"),
        "{stdout}"
    );
    for (tid, b) in &threads {
        let want = format!("@[{tid}]: sum {}, min {}, max {}, avg {}", b.fsum, b.fmin, b.fmax, b.fsum / b.calls);
        assert!(stdout.lines().any(|l| l == want), "{want:?} not in {stdout}");
    }
    // Histogram lines: `[lo, hi)   count |@@@|`, summed per label.
    let mut shown: BTreeMap<String, u64> = BTreeMap::new();
    for l in stdout.lines().filter(|l| l.starts_with('[') && l.ends_with('|')) {
        let (label, rest) = l.split_at(16);
        let n: u64 = rest.split('|').next().unwrap().trim().parse().unwrap();
        *shown.entry(label.trim().to_string()).or_default() += n;
    }
    let short = |v: u64| match v {
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    };
    let want: BTreeMap<String, u64> = hists["size"]
        .iter()
        .map(|(&b, &n)| {
            let label = match b {
                1 => "[0]".to_string(),
                2 => "[1]".to_string(),
                b => format!("[{}, {})", short(1 << (b - 2)), short(1 << (b - 1))),
            };
            (label, n)
        })
        .collect();
    shown.retain(|_, n| *n > 0);
    assert_eq!(shown, want, "tp's histogram lines vs the target's");
}

/// Counts by thread alone, and by an argument and the thread: exactly each
/// thread's calls (each thread passes one fd of its own).
#[test]
fn counts_by_thread_are_each_threads_calls() {
    let (lines, stdout) = record(&["-f", "consume", "--by", "fd, tid", "--json"], 3, 1500);
    let (threads, _) = books(&lines);
    let a = aggregate(&stdout);
    assert_eq!(a["keys"], serde_json::json!(["fd", "tid"]));
    assert_eq!(a["funcs"], serde_json::json!(["count"]));
    let got: BTreeMap<(i64, i64), i64> = a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| ((r["key"][0].as_i64().unwrap(), r["key"][1].as_i64().unwrap()), r["count"].as_i64().unwrap()))
        .collect();
    let want: BTreeMap<(i64, i64), i64> = threads.iter().map(|(&tid, b)| ((3 + b.t, tid), b.calls)).collect();
    assert_eq!(got, want);

    let (lines, stdout) = record(&["-f", "consume", "--by", "tid"], 2, 1000);
    let (threads, _) = books(&lines);
    assert!(stdout.contains("\ncount() of consume by tid:\n"), "{stdout}");
    for (tid, b) in &threads {
        let want = format!("@[{tid}]: count {}", thousands(b.calls));
        assert!(stdout.lines().any(|l| l == want), "{want:?} not in {stdout}");
    }
}

fn thousands(n: i64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A bad aggregation or key: one line naming it, a non-zero exit, the
/// target untouched.
#[test]
fn bad_aggregations_are_refused_in_one_line() {
    let t = Target::start("agg");
    let pid = t.pid.to_string();
    for (args, needle) in [
        (vec!["-f", "consume", "--agg", "median(len)"], "`median` is not a function"),
        (vec!["-f", "consume", "--agg", "hist(len"], "ends with `)`"),
        (vec!["-f", "consume", "--agg", "sum(len), max(fd)"], "one value per function"),
        (vec!["-f", "consume", "--agg", "sum(ret)"], "add --ret and -q"),
        (vec!["-f", "consume", "--agg", "sum(ret)", "--ret", "-q", "--by", "len"], "at most 32 bits"),
        (vec!["-f", "consume", "--agg", "hist(latency)", "--by", "len"], "at most 32 bits"),
        (vec!["-f", "consume", "--agg", "hist(latency)", "--args"], "drop --args"),
        (vec!["-f", "consume", "--agg", "sum(ret + 1)"], "unexpected `+`"),
        (vec!["-f", "consume", "--agg", "sum(nosuch)"], "has no parameter `nosuch`"),
        (vec!["-f", "submit", "--agg", "sum(m->nosuch)"], "no member `nosuch`"),
        (vec!["-f", "consume", "--by", "stack(0)"], "a stack key takes 1 to 32 frames"),
        (vec!["-f", "consume", "--by", "fd, len"], "one of an argument's value, the caller and the stack at most"),
        (vec!["-f", "consume", "--by", "fd, caller"], "one of an argument's value, the caller and the stack at most"),
    ] {
        let mut full = vec!["attach", "-p", pid.as_str(), "-d", "1"];
        full.extend(args);
        expect_error(&full, needle);
        assert!(!has_region(t.pid), "tp's memory left in the target");
    }
    assert!(t.quit().success());
}

/// A field behind a null or unmapped pointer is not read (process_vm_readv
/// fails where a load would fault): the call is counted as unreadable, the
/// others' sum and maximum equal the server's own log, and the server
/// finishes cleanly. Without --by, one row of every call.
#[test]
fn unreadable_fields_are_counted_apart_and_the_target_runs_on() {
    let mut t = Target::start("server");
    let pid = t.pid.to_string();
    let session =
        Session::start(&["-p", &pid, "-f", "handle", "--agg", "count(), sum(req->len), max(req->len)", "-q", "--json"]);
    let before = t.out.seen.len();
    t.ask("serve 40", "done serve");
    t.ask("bad", "done bad");
    let lens: Vec<i64> =
        t.out.seen[before..].iter().filter(|l| l.starts_with("log handle ")).map(|l| num(l, "len")).collect();
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the server must exit 0");
    assert_eq!(lens.len(), 40);
    let a = aggregate(&stdout);
    assert_eq!(a["keys"], serde_json::json!([]));
    assert_eq!(a["unreadable"], 2, "the null and the unmapped request: {a}");
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{a}");
    // The third bad call's request is readable, with len 1.
    assert_eq!(rows[0]["key"], serde_json::json!([]));
    assert_eq!(rows[0]["count"], 41, "{a}");
    assert_eq!(rows[0]["sum"].as_i64(), Some(lens.iter().sum::<i64>() + 1), "{a}");
    assert_eq!(rows[0]["max"].as_i64(), lens.iter().max().copied(), "{a}");
}

/// Aggregates keyed by an argument and the thread, of the calls a
/// predicate selects in the target: each thread passes one fd of its own
/// and a negative length (-1 - its number) on every 97th call from the
/// 6th; only those are counted.
#[test]
fn aggregates_by_an_argument_and_the_thread_of_the_calls_a_predicate_selects() {
    let calls = 1000;
    let (lines, stdout) = record(
        &["-f", "consume", "--agg", "count(), max(len)", "--by", "fd, tid", "--if", "len < 0", "--json"],
        3,
        calls,
    );
    let (threads, _) = books(&lines);
    let a = aggregate(&stdout);
    let got: BTreeMap<(i64, i64), (i64, i64)> = a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let key = (r["key"][0].as_i64().unwrap(), r["key"][1].as_i64().unwrap());
            (key, (r["count"].as_i64().unwrap(), r["max"].as_i64().unwrap()))
        })
        .collect();
    let negative = (0..calls as i64).filter(|i| i % 97 == 5).count() as i64;
    let want: BTreeMap<(i64, i64), (i64, i64)> =
        threads.iter().map(|(&tid, b)| ((3 + b.t, tid), (negative, -1 - b.t))).collect();
    assert_eq!(got, want, "{a}");
}

/// One thread's spins, as its line says: the calls, the sums of their
/// inner time (spin's own clock reads) and outer time (its caller's), the
/// shortest inner and the longest outer.
#[derive(Debug, Clone, Copy)]
struct Spins {
    t: i64,
    calls: i64,
    inner: i64,
    outer: i64,
    imin: i64,
    omax: i64,
}

fn spins(lines: &[String]) -> BTreeMap<i64, Spins> {
    lines
        .iter()
        .filter(|l| l.starts_with("spin "))
        .map(|l| {
            let s = Spins {
                t: num(l, "t"),
                calls: num(l, "calls"),
                inner: num(l, "inner"),
                outer: num(l, "outer"),
                imin: num(l, "imin"),
                omax: num(l, "omax"),
            };
            (num(l, "tid"), s)
        })
        .collect()
}

/// A latency tp measured lies between the call's inner time and its outer
/// time: its entry's timestamp is taken after the caller's clock read and
/// before spin's first, its exit's after spin's last and before the
/// caller's. What it may differ by is the conversion of the runtime's ticks
/// to nanoseconds (the CPU's rate, or a fit over 20 ms) against
/// CLOCK_MONOTONIC, which NTP may slew by up to 0.05%: 1% covers both.
fn between(tp: i64, inner: i64, outer: i64) -> bool {
    tp as f64 >= inner as f64 * 0.99 && tp as f64 <= outer as f64 * 1.01
}

/// Latency aggregated in the target, per thread (`--agg '…(latency)' --by
/// tid`): each thread's count is exactly its calls; its sum, minimum,
/// maximum and average lie between what the target measured inside and
/// around the calls; the histogram holds every call, from the bucket of
/// the minimum to that of the maximum.
#[test]
fn latency_per_thread_lies_between_the_targets_inner_and_outer_times() {
    let (lines, stdout) = record_while(
        &[
            "-q",
            "-f",
            "spin",
            "--agg",
            "count(), sum(latency), avg(latency), min(latency), max(latency), hist(latency)",
            "--by",
            "tid",
            "--json",
        ],
        "spin 2 300 20000",
        "done spin",
    );
    let threads = spins(&lines);
    assert_eq!(threads.len(), 2, "{lines:?}");
    let a = aggregate(&stdout);
    assert_eq!(a["value"], "latency");
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "one row per thread: {a}");
    for r in rows {
        let s = threads[&r["key"][0].as_i64().unwrap()];
        let (count, sum, min, max) = (
            r["count"].as_i64().unwrap(),
            r["sum"].as_i64().unwrap(),
            r["min"].as_i64().unwrap(),
            r["max"].as_i64().unwrap(),
        );
        assert_eq!(count, s.calls, "{r}");
        assert!(between(sum, s.inner, s.outer), "sum {sum} vs inner {} outer {}: {r}", s.inner, s.outer);
        assert!(between(min, s.imin, s.omax) && between(max, s.imin, s.omax), "{r} vs {s:?}");
        assert!(min >= 20_000 * 99 / 100, "spin runs 20 us at least: {r}");
        assert_eq!(r["avg"].as_i64(), Some(sum / count), "{r}");
        let hist = buckets(&r["hist"]);
        assert_eq!(hist.values().sum::<u64>(), count as u64, "{r}");
        let bucket = |v: i64| 2 + (63 - (v as u64).leading_zeros()) as usize;
        assert_eq!(hist.keys().next(), Some(&bucket(min)), "{r}");
        assert_eq!(hist.keys().last(), Some(&bucket(max)), "{r}");
    }
}

/// Threads that start after others ended, in one session: glibc hands a
/// new thread the descriptor of one that ended, and with it the ended
/// one's slot in tp's region. Each thread's calls stay its own, in the
/// table of aggregates (`--by tid`) and in the table of counts (`--by
/// 'fd, tid'`): one row per thread, with its own count.
#[test]
fn threads_that_follow_ended_ones_count_in_rows_of_their_own() {
    for by in ["tid", "fd, tid"] {
        let mut t = Target::start("agg");
        let pid = t.pid.to_string();
        let session = Session::start(&["-p", &pid, "-q", "-f", "spin", "--by", by, "--json"]);
        let before = t.out.seen.len();
        t.ask("spin 2 50 1000", "done spin");
        t.ask("spin 1 20 1000", "done spin");
        let threads = spins(&t.out.seen[before..]);
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "tp failed: {stderr}");
        assert_eq!(threads.len(), 3, "three threads, one after two that ended: {threads:?}");
        let a = aggregate(&stdout);
        let rows = a["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "--by {by}: one row per thread: {a}");
        for r in rows {
            let key = r["key"].as_array().unwrap();
            let tid = key.last().unwrap().as_i64().unwrap();
            let s = threads.get(&tid).unwrap_or_else(|| panic!("--by {by}: a row of no thread: {r}"));
            assert_eq!(r["count"].as_i64(), Some(s.calls), "--by {by}: {r}");
        }
        assert!(!has_region(t.pid), "tp's memory left in the target");
        assert!(t.quit().success(), "the target must exit 0");
    }
}

/// Aggregates of probes kept after tp exits (`--keep --agg`): the target
/// keeps them, `tp status` shows them while no session runs (each thread's
/// calls, threads that followed ended ones apart), and `tp detach` takes
/// everything out.
#[test]
fn kept_probes_keep_their_aggregates_for_tp_status() {
    let mut t = Target::start("agg");
    let pid = t.pid.to_string();
    let out = tp(&["attach", "-p", &pid, "-f", "spin", "--agg", "count(), max(latency)", "--by", "tid", "--keep"]);
    expect_success(&["attach"], &out);
    let before = t.out.seen.len();
    t.ask("spin 2 40 1000", "done spin");
    t.ask("spin 1 30 1000", "done spin");
    let spun = spins(&t.out.seen[before..]);
    let out = tp(&["status", "-p", &pid, "--json"]);
    let status = aggregate(&format!("{}\n", expect_success(&["status"], &out)));
    assert_eq!((status["value"].as_str(), &status["keys"]), (Some("latency"), &serde_json::json!(["tid"])));
    let got: BTreeMap<i64, i64> = status["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"][0].as_i64().unwrap(), r["count"].as_i64().unwrap()))
        .collect();
    let want: BTreeMap<i64, i64> = spun.iter().map(|(&tid, s)| (tid, s.calls)).collect();
    assert_eq!(got, want, "{status}");
    // A session that comes and goes clears the tables for its own counts,
    // but not what the kept probes keep.
    let session = Session::start(&["-p", &pid, "-q", "-f", "consume", "--by", "tid", "--json"]);
    t.ask("run 1 100", "done run");
    let (code, stdout, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    assert_eq!(aggregate(&stdout)["rows"][0]["count"].as_i64(), Some(100), "{stdout}");
    let out = tp(&["status", "-p", &pid, "--json"]);
    let again = aggregate(&format!("{}\n", expect_success(&["status"], &out)));
    assert_eq!(again, status, "the kept probes' aggregates after a session came and went");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}

/// Latency keyed by an argument (`--by fd`: the call's frame carries it
/// from the entry to the exit), in text, without -q as a user types it:
/// one row per fd (each thread passes its own) with the thread's calls and
/// an average between its inner and outer times, and no event lines.
#[test]
fn latency_keyed_by_an_argument_in_text() {
    let (lines, stdout) = record_while(
        &["-f", "spin", "--agg", "count(), avg(latency), hist(latency)", "--by", "fd"],
        "spin 2 200 20000",
        "done spin",
    );
    let threads = spins(&lines);
    assert!(stdout.contains("\ncount(), avg(latency), hist(latency) of spin by fd:\n"), "{stdout}");
    for s in threads.values() {
        let prefix = format!("@[{}]: count {}, avg ", 3 + s.t, s.calls);
        let line = stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{prefix:?} in {stdout}"));
        let avg: i64 = line[prefix.len()..].parse().unwrap();
        assert!(between(avg, s.inner / s.calls, s.outer / s.calls), "{line} vs {s:?}");
    }
    let rows = stdout.lines().filter(|l| l.starts_with("@[")).count();
    assert_eq!(rows, 2, "{stdout}");
    assert!(!stdout.contains("spin("), "no event lines: {stdout}");
}

/// The return value keyed by an argument (`--ret -q --agg 'sum(ret)' --by
/// fd`): spin returns its inner time, so each fd's sum is exactly its
/// thread's inner total.
#[test]
fn the_return_value_keyed_by_an_argument_equals_the_targets_books() {
    let (lines, stdout) = record_while(
        &["-q", "-f", "spin", "--ret", "--agg", "count(), sum(ret)", "--by", "fd", "--json"],
        "spin 3 100 5000",
        "done spin",
    );
    let threads = spins(&lines);
    let a = aggregate(&stdout);
    let got: BTreeMap<i64, (i64, i64)> = a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"][0].as_i64().unwrap(), (r["count"].as_i64().unwrap(), r["sum"].as_i64().unwrap())))
        .collect();
    let want: BTreeMap<i64, (i64, i64)> = threads.values().map(|s| (3 + s.t, (s.calls, s.inner))).collect();
    assert_eq!(got, want, "{a}");
}

/// `tp status` of a process a session aggregates in (`--agg … --by tid`),
/// while the session runs: the same rows as the session's own summary,
/// each thread's count and sum equal to its books, in JSON and in text;
/// and latency (`--by fd`) with each thread's calls.
#[test]
fn status_shows_a_running_sessions_aggregates() {
    let mut t = Target::start("agg");
    let pid = t.pid.to_string();
    let session = Session::start(&[
        "-p",
        &pid,
        "-q",
        "-f",
        "consume",
        "--agg",
        "count(), sum(len), hist(len)",
        "--by",
        "tid",
        "--json",
    ]);
    let before = t.out.seen.len();
    t.ask("run 2 1000", "done run");
    let (threads, _) = books(&t.out.seen[before..]);
    let out = tp(&["status", "-p", &pid, "--json"]);
    let status = aggregate(&format!("{}\n", expect_success(&["status"], &out)));
    let text = expect_success(&["status"], &tp(&["status", "-p", &pid]));
    let (code, stdout, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    let summary = aggregate(&stdout);
    assert_eq!(status, summary, "tp status vs the session's summary");
    assert_eq!(status["keys"], serde_json::json!(["tid"]));
    let rows = status["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{status}");
    for r in rows {
        let b = &threads[&r["key"][0].as_i64().unwrap()];
        assert_eq!((r["count"].as_i64(), r["sum"].as_i64()), (Some(b.calls), Some(b.sum)), "{r}");
        let line = format!("@[{}]: count {}, sum {}", r["key"][0], thousands(b.calls), b.sum);
        assert!(text.lines().any(|l| l == line), "{line:?} not in {text}");
    }
    assert!(text.contains("\ncount(), sum(len), hist(len) of consume by tid:\n"), "{text}");

    let session = Session::start(&["-p", &pid, "-f", "spin", "--agg", "count(), max(latency)", "--by", "fd"]);
    let before = t.out.seen.len();
    t.ask("spin 2 50 10000", "done spin");
    let spun = spins(&t.out.seen[before..]);
    let out = tp(&["status", "-p", &pid, "--json"]);
    let status = aggregate(&format!("{}\n", expect_success(&["status"], &out)));
    let (code, _, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    assert_eq!(status["value"], "latency");
    let got: BTreeMap<i64, i64> = status["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"][0].as_i64().unwrap(), r["count"].as_i64().unwrap()))
        .collect();
    let want: BTreeMap<i64, i64> = spun.values().map(|s| (3 + s.t, s.calls)).collect();
    assert_eq!(got, want, "{status}");
    for r in status["rows"].as_array().unwrap() {
        let s = spun.values().find(|s| 3 + s.t == r["key"][0].as_i64().unwrap()).unwrap();
        assert!(between(r["max"].as_i64().unwrap(), s.imin, s.omax), "{r} vs {s:?}");
    }
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}

/// An `--agg` written in more than the 256 bytes the region keeps for its
/// text (six functions of a struct field, spaced out): `tp status` names it
/// as the session does (the region keeps the functions and the value once)
/// and shows the same rows, each thread's sum equal to its books.
#[test]
fn status_names_an_aggregate_written_long() {
    let funcs = ["count()", "sum(m -> size)", "min(m -> size)", "max(m -> size)", "avg(m -> size)", "hist(m -> size)"];
    let long = funcs.join(&format!(",{}", " ".repeat(40)));
    assert!(long.len() >= 256, "the text must not fit the region: {} bytes", long.len());
    let mut t = Target::start("agg");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-q", "-f", "submit", "--agg", &long, "--by", "tid", "--json"]);
    let before = t.out.seen.len();
    t.ask("run 2 1000", "done run");
    let (threads, _) = books(&t.out.seen[before..]);
    let status = aggregate(&format!("{}\n", expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]))));
    let text = expect_success(&["status"], &tp(&["status", "-p", &pid]));
    let (code, stdout, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    assert_eq!(status, aggregate(&stdout), "tp status vs the session's summary");
    assert_eq!(status["value"], "m -> size", "{status}");
    let rows = status["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{status}");
    for r in rows {
        let b = &threads[&r["key"][0].as_i64().unwrap()];
        assert_eq!((r["count"].as_i64(), r["sum"].as_i64()), (Some(b.calls), Some(b.fsum)), "{r}");
    }
    let title =
        "count(), sum(m -> size), min(m -> size), max(m -> size), avg(m -> size), hist(m -> size) of submit by tid:";
    assert!(text.lines().any(|l| l == title), "{title:?} not in {text}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}
