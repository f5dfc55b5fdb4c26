//! Calls keyed by their whole stack (`--by stack`): the `stacks` target
//! calls `leaf` along known call chains a known number of times; tp's rows
//! per stack must count each chain apart (path_b's two call sites in
//! run_paths are two stacks, which `--by caller` merges), name its frames
//! as `--stack` walks them, equal at a function's exits what its entry
//! keys, and survive frame pointers that point anywhere.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::*;

/// Runs `cmds` against the `stacks` target under `tp attach -p PID -q
/// --json ARGS`, checks both end well, and returns the target's answers
/// and the one JSON aggregate of tp's summary.
fn keyed(target: &str, args: &[&str], cmds: &[(&str, &str)]) -> (Vec<String>, Value) {
    let mut t = Target::start(target);
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str(), "-q", "--json"];
    full.extend_from_slice(args);
    let s = Session::start(&full);
    let answers = cmds.iter().map(|(cmd, done)| t.ask(cmd, done)).collect();
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
    let p = one_process(&stdout);
    let all = p["aggregates"].as_array().unwrap();
    assert_eq!(all.len(), 1, "{p}");
    (answers, all[0].clone())
}

/// The function names of a frame list (`name+0x.. (module)`).
fn names(frames: &Value) -> Vec<String> {
    frames.as_array().unwrap().iter().map(|f| f.as_str().unwrap().split(['+', ' ']).next().unwrap().into()).collect()
}

/// Per stack (its frames as tp printed them), its calls; each key is the
/// stack's hash, named once.
fn rows_by_stack(a: &Value) -> BTreeMap<Vec<String>, u64> {
    let mut out = BTreeMap::new();
    for r in a["rows"].as_array().unwrap() {
        let key = r["key"][0].as_str().unwrap_or_else(|| panic!("a stack key is its hash as text: {r}"));
        assert!(key.starts_with("0x") && u64::from_str_radix(&key[2..], 16).is_ok(), "{r}");
        let frames: Vec<String> =
            r["stack"].as_array().unwrap_or_else(|| panic!("no frames in {r}")).iter().map(|f| f.to_string()).collect();
        assert!(out.insert(frames, r["count"].as_u64().unwrap()).is_none(), "one row per stack: {a}");
    }
    out
}

/// The calls of rows whose frames begin with the functions `prefix`.
fn calls_with_prefix(a: &Value, prefix: &[&str]) -> Vec<u64> {
    a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| names(&r["stack"]).starts_with(&prefix.iter().map(|p| p.to_string()).collect::<Vec<_>>()))
        .map(|r| r["count"].as_u64().unwrap())
        .collect()
}

/// `paths 300` on the main thread and `threads 2 100`: leaf's six call
/// chains (path_a's, and path_b's from each of its two call sites, on the
/// main thread and under thread_main), each with exactly its calls; the
/// threads' rows of the same stack are one.
#[test]
fn each_call_chain_is_counted_apart_with_its_frames() {
    let (answers, a) = keyed(
        "stacks",
        &["-f", "leaf", "--by", "stack"],
        &[("paths 300", "done paths"), ("threads 2 100", "done threads")],
    );
    assert_eq!(answers, ["done paths 300 a=300 b=600", "done threads 2 100"]);
    assert_eq!(a["keys"], serde_json::json!(["stack"]));
    let rows = rows_by_stack(&a);
    assert_eq!(rows.len(), 6, "{a}");
    assert_eq!(rows.values().sum::<u64>(), 1500, "{a}");
    assert_eq!(calls_with_prefix(&a, &["a_mid", "path_a", "run_paths", "main"]), [300], "{a}");
    assert_eq!(calls_with_prefix(&a, &["a_mid", "path_a", "run_paths", "thread_main"]), [200], "{a}");
    assert_eq!(calls_with_prefix(&a, &["path_b", "run_paths", "main"]), [300, 300], "{a}");
    assert_eq!(calls_with_prefix(&a, &["path_b", "run_paths", "thread_main"]), [200, 200], "{a}");
    // The stacks with the most calls first.
    let counts: Vec<u64> = a["rows"].as_array().unwrap().iter().map(|r| r["count"].as_u64().unwrap()).collect();
    assert_eq!(counts, [300, 300, 300, 200, 200, 200], "{a}");
}

/// The frames of each stack key are the ones `--stack` walks for the same
/// calls (less the function's own first frame), as often.
#[test]
fn a_stack_keys_frames_are_those_stack_records() {
    let (_, a) = keyed("stacks", &["-f", "leaf", "--by", "stack"], &[("paths 50", "done paths")]);
    let mut t = Target::start("stacks");
    let pid = t.pid.to_string();
    let s = Session::start(&["-p", &pid, "-q", "--json", "-f", "leaf", "--stack"]);
    t.ask("paths 50", "done paths");
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(t.quit().success(), "the target must exit 0");
    let p = one_process(&stdout);
    let walked: BTreeMap<Vec<String>, u64> = p["stacks"][0]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| {
            let frames = st["frames"].as_array().unwrap();
            assert!(frames[0].as_str().unwrap().starts_with("leaf+0x0 "), "{st}");
            (frames[1..].iter().map(|f| f.to_string()).collect(), st["hits"].as_u64().unwrap())
        })
        .collect();
    // The two processes load at different addresses; offsets are the same.
    assert_eq!(rows_by_stack(&a), walked, "--by stack: {a}\n--stack: {p}");
}

/// Durations keyed by stack at the function's exits: the exit walks the
/// stack again (the function has put its caller's frame pointer back) and
/// finds the entry's stacks, each with its calls.
#[test]
fn latency_by_stack_at_exits_keys_the_entrys_stacks() {
    let (_, at_entry) = keyed("stacks", &["-f", "leaf", "--by", "stack"], &[("paths 200", "done paths")]);
    let (_, at_exit) = keyed(
        "stacks",
        &["-f", "leaf", "--ret", "--agg", "count(), avg(latency), hist(latency)", "--by", "stack"],
        &[("paths 200", "done paths")],
    );
    assert_eq!(rows_by_stack(&at_exit), rows_by_stack(&at_entry), "exit: {at_exit}\nentry: {at_entry}");
    for r in at_exit["rows"].as_array().unwrap() {
        let hist: u64 = r["hist"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).sum();
        assert_eq!(hist, 200, "{r}");
    }
}

/// `stack(N)` keys by the first N frames: with 2, path_b's two call sites
/// stay apart; with 1, the key is the call site (`--by caller`'s rows).
#[test]
fn stack_n_keys_by_the_first_n_frames() {
    let (_, two) = keyed("stacks", &["-f", "leaf", "--by", "stack(2)"], &[("paths 100", "done paths")]);
    assert_eq!(calls_with_prefix(&two, &["a_mid", "path_a"]), [100], "{two}");
    assert_eq!(calls_with_prefix(&two, &["path_b", "run_paths"]), [100, 100], "{two}");
    assert!(two["rows"].as_array().unwrap().iter().all(|r| r["stack"].as_array().unwrap().len() == 2), "{two}");
    let (_, one) = keyed("stacks", &["-f", "leaf", "--by", "ustack(1)"], &[("paths 100", "done paths")]);
    assert_eq!(calls_with_prefix(&one, &["a_mid"]), [100], "{one}");
    assert_eq!(calls_with_prefix(&one, &["path_b"]), [200], "{one}");
}

/// A stack deeper than a key takes (32 frames) keys by its first 32: the
/// calls under 50 levels of descend() are one row of 32 frames.
#[test]
fn a_deep_stack_keys_by_its_first_frames() {
    let (_, a) = keyed("stacks", &["-f", "leaf", "--by", "stack"], &[("deep 50 40", "done deep")]);
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{a}");
    assert_eq!(rows[0]["count"], 40, "{a}");
    assert_eq!(names(&rows[0]["stack"]), vec!["descend".to_string(); 32], "{a}");
}

/// Frame pointers that point anywhere (misaligned, at a page that cannot
/// be read, in a loop, at the stack's last word): every call is counted,
/// the target lives, and code without frame pointers keys by what it has.
#[test]
fn hostile_frame_pointers_and_code_without_them_count_every_call() {
    let (answers, a) = keyed("stacks", &["-f", "leaf", "--by", "stack"], &[("wild 20", "done wild")]);
    let calls = field(&answers[0], "calls");
    assert!(calls >= 20, "{answers:?}");
    let rows = rows_by_stack(&a);
    assert_eq!(rows.values().sum::<u64>(), calls, "{a}");
    let (_, a) = keyed("stacks-nofp", &["-f", "leaf", "--by", "stack"], &[("paths 100", "done paths")]);
    assert_eq!(rows_by_stack(&a).values().sum::<u64>(), 300, "{a}");
}

/// `tp status` of a running session keyed by stack and thread: the
/// session's rows with their frames (JSON), and each stack folded as an
/// OpenMetrics label.
#[test]
fn status_shows_a_running_sessions_stacks() {
    let mut t = Target::start("stacks");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-q", "-f", "leaf", "--by", "stack, tid", "--json"]);
    t.ask("paths 25", "done paths");
    let status = expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]));
    let om = expect_success(&["status"], &tp(&["status", "-p", &pid, "--openmetrics"]));
    let (code, stdout, stderr) = session.interrupt();
    assert!(code.success(), "tp failed: {stderr}");
    let agg = |s: &str| one_process(s)["aggregates"][0].clone();
    let status = agg(&format!("{status}\n"));
    assert_eq!(status, agg(&stdout), "tp status vs the session's summary");
    assert_eq!(status["keys"], serde_json::json!(["stack", "tid"]));
    let rows = status["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{status}");
    for r in rows {
        assert_eq!(r["count"], 25, "{r}");
        assert_eq!(r["key"][1].as_u64(), Some(t.pid as u64), "{r}");
        let folded: Vec<&str> = r["stack"].as_array().unwrap().iter().rev().map(|f| f.as_str().unwrap()).collect();
        let label = format!("key_stack=\"{}\",key_tid=\"{}\"}} 25", folded.join(";"), t.pid);
        assert!(
            om.lines().any(|l| l.starts_with("tp_aggregate_calls_total{") && l.ends_with(&label)),
            "{label} in {om}"
        );
    }
    assert!(!has_region(t.pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
}
