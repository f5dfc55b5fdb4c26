//! Return probes, events and tp profile in a process that forks while they
//! are live (targets/forker.c): the parent and each child return through
//! the same probed frames, each checking every result; every event carries
//! its process and is either printed or counted lost; the session's end
//! restores every process; exec and death by a signal are reported with
//! the final counts.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;

use crate::util::*;

/// The event lines of a `--json` session: (type, func, pid); every line
/// names its process, the member's (`member`) and its children's alike.
fn event_lines(stdout: &str, member: i64) -> Vec<(String, String, i64)> {
    json_events(stdout)
        .into_iter()
        .map(|v| {
            let pid = v["pid"].as_i64().unwrap_or_else(|| panic!("an event without its pid: {v}"));
            assert!(pid > 0, "{member}: {v}");
            (v["type"].as_str().unwrap().to_string(), v["func"].as_str().unwrap().to_string(), pid)
        })
        .collect()
}

/// The summary of the one process of a `--json` session.
fn summary(stdout: &str) -> serde_json::Value {
    one_process(stdout)
}

fn hits(v: &serde_json::Value, func: &str) -> u64 {
    v["probes"].as_array().unwrap().iter().find(|p| p["func"] == func).unwrap_or_else(|| panic!("{func}: {v}"))["hits"]
        .as_u64()
        .unwrap()
}

/// libc's `fork`: in libc (x86-64), or in the program itself (the arm64
/// test VM's targets are static).
#[cfg(target_arch = "x86_64")]
const LIBC_FORK: &str = "libc:fork";
#[cfg(target_arch = "aarch64")]
const LIBC_FORK: &str = "fork";

/// How many forks the storms make: x86-64 runs natively; the arm64 test VM
/// emulates its CPU (TCG), tens of times slower, so fewer, further apart.
#[cfg(target_arch = "x86_64")]
const STORM: (u64, u64) = (1000, 200);
#[cfg(target_arch = "aarch64")]
const STORM: (u64, u64) = (300, 60);
/// The pause between the paced storm's forks, in µs.
#[cfg(target_arch = "x86_64")]
const PACED_US: u64 = 2000;
#[cfg(target_arch = "aarch64")]
const PACED_US: u64 = 20_000;

/// What a run of `forks` forks (`pause` µs apart) under `--ret` showed.
struct Storm {
    forks: u64,
    /// The calls of `level` in the parent (each child returns through them too).
    calls: u64,
    /// `work` calls of each child, on each of its two threads.
    work: u64,
    /// `work` calls of the parent's second thread.
    spins: u64,
    stdout: String,
    stderr: String,
    parent: i64,
}

impl Storm {
    fn run(t: &mut Target, forks: u64, pause_us: u64) -> Storm {
        let pid = t.pid.to_string();
        let mut args =
            vec!["-p", pid.as_str(), "-f", "level", "-f", "spawn", "-f", "work", "-f", LIBC_FORK, "--ret", "--json"];
        // Paced, nothing may be lost: the parent's spinning thread records
        // without pause, so its ring holds what a busy machine (the arm64
        // VM emulates its CPU) keeps tp from reading for a while.
        if pause_us > 0 {
            args.extend(["--ring-size", "32768"]);
        }
        let session = Session::start(&args);
        // A second thread in the parent that the children do not have: its
        // state in the private area is copied into every child, which must
        // not take its frames for a new thread's.
        t.ask("spin", "spinning");
        let done = t.ask(&format!("forks {forks} {pause_us}"), "done");
        assert!(done.ends_with("checksum=ok"), "{done}");
        assert_eq!(field(&done, "children_ok"), forks, "every child returned through the frames and checked: {done}");
        let stopped = t.ask("stop", "stopped");
        assert!(stopped.ends_with("checksum=ok"), "{stopped}");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        Storm {
            forks,
            calls: field(&done, "calls"),
            work: field(&done, "work"),
            spins: field(&stopped, "spins"),
            stdout,
            stderr,
            parent: t.pid as i64,
        }
    }

    /// Events each child records: its returns through the frames live at
    /// its fork, and its own `work` calls on two threads.
    fn per_child(&self) -> u64 {
        self.calls / self.forks + 2 + 2 * self.work
    }

    /// Checks the counts (the family's calls) and that every event is
    /// either printed, in its process, or counted lost; returns the events
    /// printed per child.
    fn check(&self) -> BTreeMap<i64, u64> {
        let v = summary(&self.stdout);
        assert_eq!(hits(&v, "level"), self.calls);
        assert_eq!(hits(&v, "spawn"), self.forks);
        assert_eq!(hits(&v, "fork"), self.forks);
        assert_eq!(hits(&v, "work"), self.forks * 2 * self.work + self.spins);
        let lines = event_lines(&self.stdout, self.parent);
        assert!(lines.iter().all(|(ty, _, p)| ty == "exit" && *p > 0), "exits only, each with its process");
        let in_parent = lines.iter().filter(|(_, _, p)| *p == self.parent).count() as u64;
        let lost = v["lost_events"].as_u64().unwrap();
        let expected = 2 * (self.calls + 2 * self.forks) + self.spins + self.forks * 2 * self.work;
        assert_eq!(lines.len() as u64 + lost, expected, "every event printed or counted lost: {}", self.stderr);
        assert!(in_parent <= self.calls + 2 * self.forks + self.spins);
        let mut per_child: BTreeMap<i64, u64> = BTreeMap::new();
        for (_, _, p) in lines.iter().filter(|(_, _, p)| *p != self.parent) {
            *per_child.entry(*p).or_default() += 1;
        }
        assert!(per_child.values().all(|&n| n <= self.per_child()));
        // The summary names every child, with its events and its end.
        let children = v["children"].as_array().unwrap();
        assert_eq!(children.len() as u64, self.forks, "{}", self.stderr);
        for c in children {
            let printed = per_child.get(&c["pid"].as_i64().unwrap()).copied().unwrap_or(0);
            assert_eq!(c["events"].as_u64(), Some(printed), "{c}");
            let end = c["end"].as_str().unwrap();
            assert!(end == "exited with status 0" || (!hears_process_events() && end == "exited"), "{c}");
        }
        if lost > 0 {
            let said = format!("lost {} events", tp::output::thousands(lost));
            assert!(self.stderr.contains(&said), "{}", self.stderr);
        }
        per_child
    }
}

#[test]
fn return_probes_live_across_a_thousand_forks_in_parent_and_child() {
    let mut t = Target::start("forker");
    let storm = Storm::run(&mut t, STORM.0, 0);
    // As fast as it can fork, a child may find every ring taken by others
    // whose events tp has not read yet: those events are counted, never
    // silently dropped.
    storm.check();
    assert_code_is_original(&t, &["level", "spawn", "work"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn every_event_of_every_child_is_recorded_in_its_process() {
    let mut t = Target::start("forker");
    let storm = Storm::run(&mut t, STORM.1, PACED_US);
    let per_child = storm.check();
    assert_eq!(summary(&storm.stdout)["lost_events"], 0, "{}", storm.stderr);
    assert_eq!(per_child.len() as u64, STORM.1);
    assert!(per_child.values().all(|&n| n == storm.per_child()), "each child: {} events", storm.per_child());
    assert!(t.quit().success());
}

#[test]
fn a_child_killed_by_a_signal_is_named_and_its_parent_lives_on() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", pid.as_str(), "-f", "level", "-f", "spawn", "--ret", "--json"]);
    let reaped = t.ask("doomed 11", "reaped");
    assert_eq!(field(&reaped, "signal"), 11, "{reaped}");
    let child = field(&reaped, "pid");
    let done = t.ask("forks 5", "done");
    assert_eq!(field(&done, "children_ok"), 5, "{done}");
    std::thread::sleep(std::time::Duration::from_millis(250));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let v = summary(&stdout);
    let children = v["children"].as_array().unwrap();
    let doomed = children.iter().find(|c| c["pid"] == child).unwrap_or_else(|| panic!("{v}"));
    if hears_process_events() {
        let said = format!("process {child} (forked by {pid} while the probes were in) was killed by SIGSEGV");
        assert!(stderr.contains(&said), "{stderr}");
        assert_eq!(doomed["end"], "killed by SIGSEGV");
    }
    assert_eq!(doomed["events"], 5, "it returned through the four level frames and spawn first");
    assert_eq!(children.len(), 6);
    assert!(t.quit().success());
}

/// The exit status of `tp attach` and `tp profile` when a signal killed
/// their target: 128 + the signal, as a shell reports it, where tp hears
/// how the process ended (the kernel's process events), else 0.
fn status_when_killed_by(signal: i32) -> i32 {
    if hears_process_events() { 128 + signal } else { 0 }
}

#[test]
fn a_target_killed_by_a_signal_is_reported_with_the_final_counts() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", pid.as_str(), "-f", "level", "-f", "spawn", "--ret", "--json"]);
    let done = t.ask("forks 3", "done");
    t.send(b"die 11\n");
    assert_eq!(wait_timeout(&mut t.child).signal(), Some(libc::SIGSEGV));
    let (status, stdout, stderr) = session.wait();
    assert_eq!(status.code(), Some(status_when_killed_by(libc::SIGSEGV)), "{stderr}");
    assert!(stderr.contains(&format!("{}; final counts", killed_line(t.pid, "SIGSEGV"))), "{stderr}");
    assert!(!stderr.contains("cannot restore"), "{stderr}");
    let v = summary(&stdout);
    assert_eq!(hits(&v, "level"), field(&done, "calls"));
    assert_eq!(hits(&v, "spawn"), 3);
}

/// A target that a signal kills during `tp profile`: the profile of its
/// calls until then, and the status that says it died. (It is dead: no
/// code or memory of its to look at.)
#[test]
fn tp_profile_of_a_target_killed_by_a_signal_exits_128_plus_the_signal() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "level", "-f", "spawn", "-f", "work", "--epoch", "20ms", "--json"];
    let profile = Session::spawn("profile", &args, &[], Some("tp: profiling"));
    let done = t.ask("forks 3", "done");
    assert_eq!(field(&done, "children_ok"), 3, "{done}");
    t.send(b"die 11\n");
    assert_eq!(wait_timeout(&mut t.child).signal(), Some(libc::SIGSEGV));
    let (status, stdout, stderr) = profile.wait();
    assert_eq!(status.code(), Some(status_when_killed_by(libc::SIGSEGV)), "{stderr}");
    let killed = format!("tp: {}", killed_line(t.pid, "SIGSEGV"));
    assert!(stderr.lines().any(|l| l.starts_with(&killed)), "{stderr}");
    assert!(!stderr.contains("cannot restore"), "{stderr}");
    assert_eq!(summary_doc(&stdout)["command"], "profile", "{stdout}");
    let v = summary(&stdout);
    let calls = |f: &str| -> u64 {
        let rows = v["probes"].as_array().unwrap_or_else(|| panic!("{v}"));
        let row = rows.iter().find(|r| r["func"] == f).unwrap_or_else(|| panic!("no {f} in {v}"));
        row["hits"].as_u64().unwrap_or_else(|| panic!("{row}"))
    };
    assert_eq!(calls("level"), field(&done, "calls"));
    assert_eq!(calls("spawn"), 3);
}

#[test]
fn an_exec_ends_the_session_with_the_final_counts() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "level", "-f", "spawn", "--ret", "--json", "--duration", "30"];
    let session = Session::start(&args);
    let done = t.ask("forks 2", "done");
    let started = std::time::Instant::now();
    t.send(format!("exec {}\n", target_path("counter").display()).as_bytes());
    t.out.wait_for("ready pid=");
    let (status, stdout, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "tp noticed the exec at once");
    assert!(stderr.contains(&format!("process {pid} exec'd")), "{stderr}");
    assert!(!stderr.contains("failed to fill"), "{stderr}");
    let v = summary(&stdout);
    assert_eq!(hits(&v, "level"), field(&done, "calls"));
    assert_eq!(hits(&v, "spawn"), 2);
    assert!(!has_region(t.pid), "the new program has nothing of tp");
}

#[test]
fn tp_profile_survives_a_forking_target_and_restores_its_children() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "level", "-f", "spawn", "-f", "work", "--epoch", "20ms"];
    let profile = Session::spawn("profile", &args, &[], Some("tp: profiling"));
    let done = t.ask("forks 300", "done");
    assert_eq!(field(&done, "children_ok"), 300, "{done}");
    assert!(done.ends_with("checksum=ok"), "{done}");
    let (status, stdout, stderr) = profile.interrupt();
    assert!(status.success(), "{stderr}");
    let calls = |f: &str| -> u64 {
        let row = stdout.lines().find(|l| l.split_whitespace().next() == Some(f)).unwrap_or_else(|| panic!("{stdout}"));
        row.split_whitespace().nth(2).unwrap().replace(',', "").parse().unwrap()
    };
    assert_eq!(calls("level"), field(&done, "calls"));
    assert_eq!(calls("spawn"), 300);
    assert_code_is_original(&t, &["level", "spawn", "work"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn tp_profile_reports_an_exec_with_the_final_counts() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "level", "-f", "spawn", "-d", "30"];
    let profile = Session::spawn("profile", &args, &[], Some("tp: profiling"));
    let done = t.ask("forks 2", "done");
    t.send(format!("exec {}\n", target_path("counter").display()).as_bytes());
    t.out.wait_for("ready pid=");
    let (status, stdout, stderr) = profile.wait();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("process {pid} exec'd another program")), "{stderr}");
    assert!(!stderr.contains("failed to fill"), "{stderr}");
    let level = stdout.lines().find(|l| l.starts_with("level ")).unwrap_or_else(|| panic!("{stdout}"));
    let calls: u64 = level.split_whitespace().nth(2).unwrap().replace(',', "").parse().unwrap();
    assert_eq!(calls, field(&done, "calls"));
}

#[test]
fn tps_own_unwinder_probe_is_neither_shown_nor_left_behind() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", pid.as_str(), "-f", "level", "--ret", "-q"]);
    let status = expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]));
    let shown: Vec<String> = hits_from_json(&status).into_keys().collect();
    assert_eq!(shown, ["level"], "only what the user asked for: {status}");
    t.ask("forks 3", "done");
    let (st, _, stderr) = session.interrupt();
    assert!(st.success(), "{stderr}");
    assert!(!has_region(t.pid), "nothing of tp stays: {stderr}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
    let libc = maps.lines().find(|l| l.contains("/libc.so")).map(|l| l.rsplit(' ').next().unwrap().to_string());
    // libc's code is the file's again, the unwinder's entry points included.
    if let Some(path) = libc {
        let modules = tp::symbols::ProcessModules::new(t.pid, &tp::process::read_maps(t.pid).unwrap()).unwrap();
        let i = (0..modules.len()).find(|&i| modules.name(i).starts_with("libc.so")).unwrap();
        let m = modules.get(i).unwrap();
        for name in ["_Unwind_ForcedUnwind", "__pthread_unwind"] {
            if let Ok(f) = m.function(name) {
                let file = m.code_of(&f).unwrap();
                assert_eq!(read_mem(t.pid, f.addr.0, file.len()), file, "{name} in {path}");
            }
        }
    }
    assert!(t.quit().success());
}
