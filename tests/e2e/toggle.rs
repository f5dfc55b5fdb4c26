//! `tp enable` / `tp disable`: kept probes switched off and on by a store
//! into the shared page. A watcher samples every thread's /proc state while
//! tp toggles, and proves no thread was ever traced or stopped; the same
//! watcher does see an attach, so it can tell.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::util::*;

/// What a watcher saw of a process's threads.
#[derive(Debug, Default)]
struct Seen {
    /// /proc reads of every thread.
    samples: u64,
    /// Samples in which some thread had a tracer.
    traced: u64,
    /// Samples in which some thread was in a stop (state `t` or `T`).
    stopped: u64,
}

/// Samples every thread of `pid` in a loop until told to stop.
struct Watcher {
    done: Arc<AtomicBool>,
    thread: JoinHandle<Seen>,
}

impl Watcher {
    fn start(pid: i32) -> Watcher {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Seen::default();
            while !flag.load(Ordering::Relaxed) {
                let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { break };
                let (mut traced, mut stopped) = (false, false);
                for task in tasks.flatten() {
                    let dir = task.path();
                    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
                    let state = status.lines().find_map(|l| l.strip_prefix("State:")).unwrap_or("").trim();
                    let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).unwrap_or("0").trim();
                    traced |= tracer != "0";
                    stopped |= state.starts_with('t') || state.starts_with('T');
                }
                seen.samples += 1;
                seen.traced += traced as u64;
                seen.stopped += stopped as u64;
            }
            seen
        });
        Watcher { done, thread }
    }

    fn finish(self) -> Seen {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn status_of(pid: &str) -> (std::collections::BTreeMap<String, u64>, serde_json::Value) {
    let out = expect_success(&["status"], &tp(&["status", "-p", pid, "--json"]));
    (hits_from_json(&out), one_process(&out))
}

fn enabled(v: &serde_json::Value, func: &str) -> bool {
    let p = v["probes"].as_array().unwrap().iter().find(|p| p["func"] == func).unwrap();
    p["enabled"].as_bool().unwrap()
}

#[test]
fn a_disabled_probe_stops_counting_and_an_enabled_one_counts_again() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]));
    let foo = t.call("foo", 20_000, 2);

    let out = tp(&["disable", "-p", &pid, "-f", "fo*"]);
    expect_success(&["disable"], &out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("disabled `foo`"));
    // Off: the target runs foo (its checksum holds) but the probe does not count it.
    assert_eq!(t.call("foo", 30_000, 2), 60_000);
    let bar = t.call("bar", 500, 1);
    let (hits, v) = status_of(&pid);
    assert_eq!((hits["foo"], hits["bar"]), (foo, bar));
    assert!(!enabled(&v, "foo") && enabled(&v, "bar"));
    let table = expect_success(&["status"], &tp(&["status", "-p", &pid]));
    assert!(table.lines().any(|l| l.starts_with("foo ") && l.ends_with(" off")), "{table}");

    expect_success(&["enable"], &tp(&["enable", "-p", &pid, "-f", "foo"]));
    let more = t.call("foo", 7_000, 2);
    let (hits, v) = status_of(&pid);
    assert_eq!(hits["foo"], foo + more);
    assert!(enabled(&v, "foo"));

    // --all switches every probe of the process.
    expect_success(&["disable"], &tp(&["disable", "-p", &pid, "--all"]));
    t.call("foo", 100, 1);
    t.call("bar", 100, 1);
    let (hits, _) = status_of(&pid);
    assert_eq!((hits["foo"], hits["bar"]), (foo + more, bar));

    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(t.quit().success());
}

#[test]
fn toggling_never_stops_or_traces_the_target() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    // The watcher sees attach and detach: tp traces and stops every thread
    // for them (for a millisecond or so, so allow a few tries on a busy machine).
    let attach = (0..20)
        .map(|_| {
            let watch = Watcher::start(t.pid);
            expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]));
            expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
            watch.finish()
        })
        .find(|seen| seen.traced > 0);
    assert!(attach.is_some(), "the watcher must be able to see tp trace the target");

    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]));
    t.ask("spin 2 hot", "spinning");

    // It sees nothing of a hundred toggles while both threads hit the probes.
    let watch = Watcher::start(t.pid);
    for k in 0..50 {
        let which = if k % 2 == 0 { "foo" } else { "*" };
        expect_success(&["disable"], &tp(&["disable", "-p", &pid, "-f", which]));
        expect_success(&["enable"], &tp(&["enable", "-p", &pid, "-f", which]));
    }
    let toggles = watch.finish();
    assert!(toggles.samples > 100, "{toggles:?}");
    assert_eq!((toggles.traced, toggles.stopped), (0, 0), "toggling must not trace or stop the target: {toggles:?}");

    // The threads ran correctly through it; the probes counted no more than ran.
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    let after = status_of(&pid).0;
    let (foo, bar) = (field(&stopped, "foo"), field(&stopped, "bar"));
    assert!(after["foo"] <= foo && after["bar"] <= bar, "disabled probes must not count more than ran: {after:?}");
    // And, left enabled, they count every call again.
    let more = t.call("foo", 1_000, 2);
    assert_eq!(status_of(&pid).0["foo"], after["foo"] + more);
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert!(t.quit().success());
}

#[test]
fn toggle_errors_name_the_fix() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_error(&["disable", "-p", &pid, "-f", "foo"], "tp attach -p");
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    expect_error(&["enable", "-p", &pid, "-f", "nosuch"], "tp status -p");
    expect_error(&["enable", "-p", "999999999", "-f", "foo"], "999999999");
    assert_eq!(t.call("foo", 10, 1), 10);
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert!(t.quit().success());
}
