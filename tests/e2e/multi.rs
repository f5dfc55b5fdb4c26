//! Sessions over several processes: `-p` as a comma list, `--name` as
//! `pgrep -x` matches, one summary per process and their total, a PID
//! column in event lines; and `--follow-exec`, which probes the same
//! functions again in the program a process execs.

use std::collections::BTreeMap;

use crate::util::*;

/// The JSON summary of a session of several processes: hits per PID per
/// function, and the totals per function.
type PerProcess = BTreeMap<i64, BTreeMap<String, u64>>;

fn several_from_json(stdout: &str) -> (PerProcess, BTreeMap<String, u64>) {
    let v = summary_doc(stdout);
    let funcs = |probes: &serde_json::Value| -> BTreeMap<String, u64> {
        probes
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["func"].as_str().unwrap().to_string(), p["hits"].as_u64().unwrap()))
            .collect()
    };
    let per =
        v["processes"].as_array().unwrap().iter().map(|p| (p["pid"].as_i64().unwrap(), funcs(&p["probes"]))).collect();
    (per, funcs(&v["total"]))
}

#[test]
fn attach_to_several_processes_counts_each_and_the_total() {
    let mut a = Target::start("counter");
    let mut b = Target::start("counter");
    let pids = format!("{},{}", a.pid, b.pid);
    let mut session = Session::start(&["-p", &pids, "-f", "foo", "-f", "bar", "--json"]);
    session.err.wait_for("tp: attached");
    let (fa, ba) = (a.call("foo", 1000, 2), a.call("bar", 10, 1));
    let fb = b.call("foo", 333, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    for t in [&a, &b] {
        assert!(stderr.contains(&format!("tp: detached from {}, code restored", t.pid)), "{stderr}");
        assert_code_is_original(t, &["foo", "bar"]);
        assert!(!has_region(t.pid));
    }
    let (per, total) = several_from_json(&stdout);
    assert_eq!(per[&(a.pid as i64)]["foo"], fa);
    assert_eq!(per[&(a.pid as i64)]["bar"], ba);
    assert_eq!((per[&(b.pid as i64)]["foo"], per[&(b.pid as i64)]["bar"]), (fb, 0));
    assert_eq!((total["foo"], total["bar"]), (fa + fb, ba));
}

#[test]
fn attach_by_name_says_how_many_matched() {
    // A copy of counter under a name no other process has.
    let dir = std::env::temp_dir().join(format!("tp-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("tpn{}", std::process::id() % 100_000);
    let exe = dir.join(&name);
    std::fs::copy(target_path("counter"), &exe).unwrap();
    let mut a = Target::start_path(&exe);
    let mut b = Target::start_path(&exe);
    let mut session = Session::spawn("attach", &["--name", &name, "-f", "foo", "--json"], &[], None);
    let matched = session.err.wait_for("tp: --name");
    let (lo, hi) = (a.pid.min(b.pid), a.pid.max(b.pid));
    assert_eq!(matched, format!("tp: --name {name} matched 2 processes: {lo}, {hi}"));
    session.err.wait_for("tp: attached");
    session.err.wait_for("tp: attached");
    let (fa, fb) = (a.call("foo", 70, 1), b.call("foo", 30, 1));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let (per, total) = several_from_json(&stdout);
    assert_eq!((per[&(a.pid as i64)]["foo"], per[&(b.pid as i64)]["foo"], total["foo"]), (fa, fb, fa + fb));
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
    let line = expect_error(&["attach", "--name", &format!("{name}-none"), "-f", "foo"], "no process is named");
    assert!(line.contains("pgrep -x"), "{line}");
    expect_error(&["attach", "-f", "foo"], "name the processes to attach to with -p PID");
}

#[test]
fn a_failure_on_one_process_restores_the_others() {
    // A PID that names no process: checked before any process is touched.
    let a = Target::start("counter");
    let pids = format!("{},{}", a.pid, i32::MAX);
    expect_error(&["attach", "-p", &pids, "-f", "foo"], &format!("no process with PID {}", i32::MAX));
    assert!(!has_region(a.pid));
    // A function the second process lacks: found after the first attached,
    // which is restored before tp exits with the one error line.
    let b = Target::start("launched");
    let pids = format!("{},{}", a.pid, b.pid);
    let out = tp(&["attach", "-p", &pids, "-f", "bar"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.lines().last().unwrap().starts_with("tp: function `bar` not found in process"), "{stderr}");
    assert_code_is_original(&a, &["bar"]);
    assert!(!has_region(a.pid), "the first process was restored and cleaned");
}

#[test]
fn a_session_ends_when_its_last_process_exits() {
    let mut a = Target::start("counter");
    let b = Target::start("counter");
    let pids = format!("{},{}", a.pid, b.pid);
    let mut session = Session::start(&["-p", &pids, "-f", "foo", "--json"]);
    session.err.wait_for("tp: attached");
    let fa = a.call("foo", 50, 1);
    assert!(a.quit().success());
    session.err.wait_for("tp: process");
    assert!(b.quit().success());
    let (status, stdout, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    let (per, total) = several_from_json(&stdout);
    assert_eq!((per.len(), total["foo"]), (2, fa), "the counts of exited processes stay: {stdout}");
}

/// With `--args` on two processes, every event line names its process.
#[cfg(target_arch = "x86_64")]
#[test]
fn event_lines_name_their_process() {
    let mut a = Target::start("counter");
    let mut b = Target::start("counter");
    let pids = format!("{},{}", a.pid, b.pid);
    let mut session = Session::start(&["-p", &pids, "-f", "foo", "--args"]);
    session.err.wait_for("tp: attached");
    let (na, nb) = (a.call("foo", 7, 1), b.call("foo", 5, 1));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("     TIME(s)     PID     TID CALL"), "{stdout}");
    let mut per_pid: BTreeMap<i32, u64> = BTreeMap::new();
    for l in stdout.lines().filter(|l| l.contains("foo(")) {
        let pid: i32 = l.split_whitespace().nth(1).unwrap().parse().unwrap();
        *per_pid.entry(pid).or_default() += 1;
    }
    assert_eq!(per_pid, BTreeMap::from([(a.pid, na), (b.pid, nb)]), "{stdout}");
}

/// A process that execs another program: with --follow-exec its same
/// functions are probed in the new program, and the ones it lacks named;
/// the counts of both programs add up in its summary.
#[test]
fn follow_exec_probes_the_new_program() {
    let mut t = Target::start("launched");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "foo", "-f", "only_here", "--follow-exec", "--json"]);
    let first = t.ask("call 120", "done");
    assert!(first.contains("calls=120 checksum=ok"), "{first}");
    let counter = target_path("counter");
    t.send(format!("exec {}\n", counter.display()).as_bytes());
    let again = t.out.wait_for("ready pid=");
    assert_eq!(again, format!("ready pid={pid}"), "the same process runs counter now");
    let execd = session.err.wait_for(&format!("tp: process {pid} exec'd"));
    assert!(execd.ends_with("probed 1 function in it"), "{execd}");
    let missing = session.err.wait_for(&format!("tp: process {pid}: not in the new program"));
    assert!(missing.contains("only_here"), "{missing}");
    let calls = t.call("foo", 45, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let v = one_process(&stdout);
    let rows: Vec<(String, String, u64)> = v["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (p["module"].as_str().unwrap().into(), p["func"].as_str().unwrap().into(), p["hits"].as_u64().unwrap())
        })
        .collect();
    assert!(rows.contains(&("launched".into(), "foo".into(), 120)), "{rows:?}");
    assert!(rows.contains(&("launched".into(), "only_here".into(), 0)), "{rows:?}");
    assert!(rows.contains(&("counter".into(), "foo".into(), calls)), "{rows:?}");
    assert_code_is_original(&t, &["foo"]);
}

/// Without --follow-exec, an exec ends the process's part in the session
/// with what its old program counted.
#[test]
fn exec_without_follow_ends_with_the_old_programs_counts() {
    let mut t = Target::start("launched");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "--json"]);
    t.ask("call 64", "done");
    t.send(format!("exec {}\n", target_path("counter").display()).as_bytes());
    t.out.wait_for("ready pid=");
    let (status, stdout, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("tp: process {pid} exec'd ")), "{stderr}");
    assert!(stderr.contains("its probes went with its old program"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], 64);
    assert!(!has_region(t.pid), "the new program never had tp's memory");
}

/// `--exe PATH` probes the process that runs the file now and every one
/// that starts running it during the session, each as soon as tp hears of
/// its exec: one summary with every run's counts, and no process of
/// another file. (Each run sleeps 100 ms before its calls, so that a
/// loaded machine cannot make tp miss them: how soon tp stops a new
/// process is what its line says.)
#[test]
fn exe_probes_every_process_that_starts_running_the_file() {
    let dir = std::env::temp_dir().join(format!("tp-exe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("launched");
    std::fs::copy(target_path("launched"), &exe).unwrap();
    // One runs it already; the original file's processes are not its.
    let mut running = Target::start_path(&exe);
    let mut other = Target::start("launched");
    let exe_arg = exe.to_str().unwrap();
    let mut session = Session::spawn("attach", &["--exe", exe_arg, "-f", "foo", "--json"], &[], None);
    let line = session.err.wait_for("tp: --exe");
    assert!(line.contains(&format!(": 1 process runs it now ({})", running.pid)), "{line}");
    session.err.wait_for("tp: attached");
    assert_eq!(running.ask("call 123", "done"), "done foo calls=123 checksum=ok");
    assert_eq!(other.ask("call 7", "done"), "done foo calls=7 checksum=ok");
    const RUNS: usize = 20;
    let mut pids = Vec::new();
    for _ in 0..RUNS {
        let out = run(std::process::Command::new(&exe).args(["after", "100", "calls", "1000"]));
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), "foo calls=1000 checksum=ok");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    for l in stderr.lines().filter(|l| l.contains(" started ")) {
        let pid: i64 = l.split_whitespace().nth(2).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{l}"));
        assert!(l.contains(&format!("started {exe_arg}: 1 probe in,")), "{stderr}");
        pids.push(pid);
    }
    assert_eq!(pids.len(), RUNS, "every run joined the session: {stderr}");
    let (per, total) = several_from_json(&stdout);
    for pid in &pids {
        assert_eq!(per.get(pid).map(|f| f["foo"]), Some(1000), "process {pid}: {stdout}");
    }
    assert_eq!(per[&(running.pid as i64)]["foo"], 123);
    assert!(!per.contains_key(&(other.pid as i64)), "{stdout}");
    assert_eq!(total["foo"], 123 + 1000 * RUNS as u64);
    assert_code_is_original(&running, &["foo"]);
    assert!(!has_region(running.pid));
    drop((running, other));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--exe` of a shared library: every process that maps it now, and every
/// program started later that needs it, whatever the program; a process
/// of another copy of the library is not one of them.
#[test]
#[cfg(target_arch = "x86_64")] // libuser and its libraries are built for the host only
fn exe_of_a_library_probes_the_programs_that_need_it() {
    let dir = std::env::temp_dir().join(format!("tp-exe-lib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["libuser", "libalpha.so", "libbeta.so", "libgamma.so"] {
        std::fs::copy(target_path(f), dir.join(f)).unwrap();
    }
    let lib = dir.join("libalpha.so");
    let mut before = Target::start_path(&dir.join("libuser"));
    let mut other = Target::start("libuser");
    let mut session =
        Session::spawn("attach", &["--exe", lib.to_str().unwrap(), "-f", "libalpha:lib_work", "--json"], &[], None);
    let line = session.err.wait_for("tp: --exe");
    assert!(line.contains(&format!(": 1 process runs it now ({})", before.pid)), "{line}");
    session.err.wait_for("tp: attached");
    let mut after = Target::start_path(&dir.join("libuser"));
    let joined = session.err.wait_for(&format!("tp: process {} started", after.pid));
    assert!(joined.contains(": 1 probe in,") || joined.contains(": 0 probes in,"), "{joined}");
    for (t, n) in [(&mut before, 300), (&mut after, 500), (&mut other, 70)] {
        assert_eq!(t.ask(&format!("call alpha {n}"), "done"), format!("done alpha calls={n} checksum=ok"));
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let (per, total) = several_from_json(&stdout);
    assert_eq!(per[&(before.pid as i64)]["lib_work"], 300, "{stdout}");
    assert_eq!(per[&(after.pid as i64)]["lib_work"], 500, "{stdout}\n{stderr}");
    assert!(!per.contains_key(&(other.pid as i64)), "{stdout}");
    assert_eq!(total["lib_work"], 800);
    for t in [&before, &after] {
        assert!(!has_region(t.pid));
    }
    drop((before, after, other));
    let _ = std::fs::remove_dir_all(&dir);
}
