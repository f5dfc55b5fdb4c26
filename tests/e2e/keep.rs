//! Probes that outlive the tracer: `--keep`, `status`, `detach`, and
//! `detach` after the tracer was killed with SIGKILL; `detach` next to a
//! session that is still running.

use crate::util::*;

#[test]
fn keep_then_status_then_detach() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let args = ["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--keep"];
    let out = tp(&args);
    expect_success(&args, &out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("tp detach -p"));
    let foo = t.call("foo", 100_000, 2);
    let bar = t.call("bar", 7_000, 1);

    let status = tp(&["status", "-p", &pid, "--json"]);
    let counts = hits_from_json(&expect_success(&["status"], &status));
    assert_eq!(counts["foo"], foo);
    assert_eq!(counts["bar"], bar);
    let table = expect_success(&["status"], &tp(&["status", "-p", &pid]));
    assert!(table.lines().any(|l| l.starts_with("foo ") && l.contains("200,000")), "{table}");

    // Probes keep counting while no tp runs at all.
    let more = t.call("foo", 5, 1);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!(counts["foo"], foo + more);

    let out = tp(&["detach", "-p", &pid]);
    expect_success(&["detach"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("restored `foo`") && stderr.contains("restored `bar`"), "{stderr}");
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(!has_region(t.pid));
    assert_eq!(t.call("foo", 10, 1), 10);
    assert!(t.quit().success());
}

#[test]
fn detach_restores_the_code_after_the_tracer_was_killed() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "-f", "baz"]);
    session.kill();
    // The target does not depend on the tracer: it keeps running, and counting.
    let calls = t.call("foo", 50_000, 2);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!(counts["foo"], calls);
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo", "baz"]);
    assert!(t.quit().success());
}

#[test]
fn detach_without_pid_cleans_every_process() {
    let _alone = system_wide();
    let mut a = Target::start_unlocked("counter");
    let mut b = Target::start_unlocked("counter-nopie");
    for t in [&a, &b] {
        let pid = t.pid.to_string();
        expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    }
    let out = tp(&["detach"]);
    expect_success(&["detach"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for t in [&a, &b] {
        assert!(stderr.contains(&format!("detached from {}", t.pid)), "{stderr}");
        assert_code_is_original(t, &["foo"]);
    }
    assert_eq!(a.call("foo", 3, 1), 3);
    assert_eq!(b.call("foo", 3, 1), 3);
    assert!(a.quit().success() && b.quit().success());
}

/// Probes are added next to kept ones, and a `--keep` of a function kept
/// already leaves it counting.
#[test]
fn kept_probes_take_more_beside_them() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    let foo = t.call("foo", 300, 1);
    // foo again, and bar: foo stays as it is, bar is added.
    let out = tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("tp: `foo` is kept in process {pid} already; its count goes on")), "{stderr}");
    assert!(stderr.contains("tp: attached 1 probe"), "{stderr}");
    // foo alone again: nothing to do, and no stop.
    let out =
        run(tp_command().args(["attach", "-p", &pid, "-f", "foo", "--keep"]).env("TP_FAULT", "pause:after-seize"));
    assert!(out.status.success(), "{out:?}");
    let bar = t.call("bar", 40, 1);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!((counts["foo"], counts["bar"], counts.len()), (foo, bar, 2), "{counts:?}");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(!has_region(t.pid));
}

/// A session records the events of a kept probe's function while the
/// kept count goes on: the session sees its calls, and after it the kept
/// probe has counted every call, before, during and after.
#[test]
fn a_session_records_events_of_a_kept_probe_whose_count_goes_on() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    let before = t.call("foo", 1000, 2);
    let session = Session::start(&["-p", &pid, "-f", "foo", "--args", "--json"]);
    let during = t.call("foo", 250, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("tp: detached from {pid}, code restored; 1 kept probe count on")), "{stderr}");
    let entries = json_events(&stdout).iter().filter(|e| e["type"] == "entry" && e["func"] == "foo").count();
    assert_eq!((entries as u64, hits_from_json(&stdout)["foo"]), (during, during), "the session's own calls");
    // The kept probe is in again and has every call.
    let (now, file) = entry_bytes(&t, "foo");
    assert_ne!(now[..5], file[..5], "the kept probe is back");
    let after = t.call("foo", 7, 1);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!(counts["foo"], before + during + after, "{counts:?}");
    // A session with a count only, over it, counts too.
    let out = tp(&["attach", "-p", &pid, "-f", "foo", "-d", "0.3", "--json"]);
    assert_eq!(hits_from_json(&expect_success(&["attach"], &out))["foo"], 0);
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

/// Only a running session's probe is refused to another session, in one
/// line that says how to go on; a session that died leaves probes the next
/// one goes over, and `tp detach` restores everything after either.
#[test]
fn only_a_running_sessions_probe_is_refused() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo"]);
    let owner = session.child.id();
    let line = expect_error(&["attach", "-p", &pid, "-f", "foo"], &format!("probed by tp session {owner}"));
    assert!(line.contains(&format!("`tp detach -p {pid} --force`")) && line.contains("still running"), "{line}");
    session.kill();
    // Its probe is owned by no running tp now: a session goes over it.
    let calls = t.call("foo", 100, 1);
    let session = Session::start(&["-p", &pid, "-f", "foo", "--json"]);
    let more = t.call("foo", 30, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], more);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!(counts["foo"], calls + more, "the dead session's probe counted on: {counts:?}");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
}

/// While a session records over a kept probe: a plain `tp detach -p`
/// removes the kept probe and spares the session's, whose end then
/// restores the file's code; a session killed meanwhile leaves both, which
/// `tp detach -p` removes.
#[test]
fn detaching_under_a_session_over_a_kept_probe_leaves_nothing() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    let session = Session::start(&["-p", &pid, "-f", "foo", "--args", "-q"]);
    let out = tp(&["detach", "-p", &pid]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("restored `foo`"), "{stderr}");
    assert!(!stderr.contains("changed by something else"), "{stderr}");
    assert_eq!(t.call("foo", 20, 1), 20);
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid), "{stderr}");

    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    let session = Session::start(&["-p", &pid, "-f", "foo", "--args", "-q"]);
    session.kill();
    assert_eq!(t.call("foo", 20, 1), 20);
    let out = tp(&["detach", "-p", &pid]);
    assert!(out.status.success(), "{out:?}");
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn detach_without_pid_spares_a_running_session() {
    let _alone = system_wide();
    let mut t = Target::start_unlocked("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "--json"]);
    expect_success(&["detach"], &tp(&["detach"]));
    let (now, file) = entry_bytes(&t, "foo");
    assert_ne!(now[..5], file[..5], "the running session's probe must stay");
    let calls = t.call("foo", 1000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], calls);
    assert_code_is_original(&t, &["foo"]);
}

#[test]
fn detach_leaves_a_running_session_alone_unless_forced() {
    let _alone = system_wide();
    let mut t = Target::start_unlocked("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "--json"]);
    let owner = session.child.id();
    // Plain detach must not even stop the process: were it to seize it,
    // this fault would pause it there, holding the target, and it would
    // never exit.
    let out = run(tp_command().arg("detach").env("TP_FAULT", "pause:after-seize"));
    expect_success(&["detach"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "tp: process {pid}: left alone: its probes belong to tp session {owner} (`foo`), still running"
        )),
        "{stderr}"
    );
    // Named, it says whose they are, and fails.
    let line = expect_error(&["detach", "-p", &pid], &format!("belong to tp session {owner} (`foo`), still running"));
    assert!(line.contains(&format!("tp detach -p {pid} --force")), "{line}");
    let (now, file) = entry_bytes(&t, "foo");
    assert_ne!(now[..5], file[..5], "the session's probe is still in");
    let calls = t.call("foo", 100, 1);
    // --force removes them; the session sees it and ends with its counts.
    let out = tp(&["detach", "--force"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains(&format!("detached from {pid}")), "{stderr}");
    assert_code_is_original(&t, &["foo"]);
    let (status, stdout, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("the probes were removed by another tp"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], calls);
}

/// `--ret --keep`: the kept probe times every call at the function's exits
/// with no tp running, the threads keeping the durations in the target;
/// `tp status` shows them (text, JSON, OpenMetrics), and `tp detach` names
/// only the user's probes.
#[test]
fn kept_return_probes_time_every_call_without_tp() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let args = ["attach", "-p", pid.as_str(), "-f", "foo", "--ret", "--keep"];
    expect_success(&args, &tp(&args));
    let calls = t.call("foo", 30_000, 2);
    let status = expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]));
    let probe = &one_process(&status)["probes"][0];
    assert_eq!((probe["func"].as_str(), probe["hits"].as_u64()), (Some("foo"), Some(calls)), "{status}");
    assert_eq!(probe["timed"].as_u64(), Some(calls), "every call timed: {status}");
    let in_buckets: u64 = probe["histogram"].as_array().unwrap().iter().map(|b| b[2].as_u64().unwrap()).sum();
    assert_eq!(in_buckets, calls, "{status}");
    assert!(probe["avg_ns"].as_u64().is_some_and(|ns| ns > 0), "{status}");
    let table = expect_success(&["status"], &tp(&["status", "-p", &pid]));
    assert!(table.contains("TIMED") && table.contains("P99"), "{table}");
    let metrics = expect_success(&["status"], &tp(&["status", "-p", &pid, "--openmetrics"]));
    assert!(
        metrics.contains(&format!(
            "tp_latency_seconds_count{{pid=\"{pid}\",module=\"counter\",function=\"foo\"}} {calls}"
        )),
        "{metrics}"
    );
    let out = tp(&["detach", "-p", &pid]);
    expect_success(&["detach"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1 probe removed"), "{stderr}");
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

/// A thread that calls the probed functions all the time is often in a
/// detour (or tp's runtime, or an exit's routine) when `tp detach` stops
/// it: tp runs it on, one instruction at a time, back to the program's
/// code, and unmaps its memory in the same detach, every time. The
/// thread's results stay right.
#[test]
fn detach_runs_a_thread_out_of_a_detour_and_unmaps_at_once() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    t.ask("spin 1 hot", "spinning 1");
    for round in 0..12 {
        // Counts alone, and durations kept in the target: a detour that
        // calls tp's runtime, and exits at the functions' returns.
        let mut args = vec!["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--keep", "-q"];
        if round % 2 == 1 {
            args.push("--ret");
        }
        expect_success(&args, &tp(&args));
        let out = tp(&["detach", "-p", &pid]);
        let stderr = expect_success(&["detach"], &out);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string() + &stderr;
        assert!(stderr.contains("tp's memory unmapped"), "round {round}: {stderr}");
        assert!(!has_region(t.pid), "round {round}: tp's memory left in the target");
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(t.quit().success());
}
