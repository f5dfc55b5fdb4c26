//! Security: tp's code pages are never writable in the target and never
//! RWX, at every step of an attach and a detach; the shared memfd is
//! reachable only by processes allowed to ptrace the target (and tp); tp
//! leaves no file in a world-writable directory. (Running without the
//! privilege to trace is in bad_input.rs.)

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::util::*;

/// Asserts no mapping of `pid` is both writable and executable, and that
/// every executable mapping (tp's arenas and the module's patched text
/// included) is read-only.
fn assert_no_writable_code(pid: i32, when: &str) {
    for m in tp::process::read_maps(pid).unwrap() {
        assert!(!(m.exec && m.write), "{when}: writable code {:#x}-{:#x} {}", m.start, m.end, m.path);
    }
}

#[test]
fn code_pages_are_never_writable_at_any_step() {
    let mut t = Target::start("counter");
    t.ask("spin 2", "spinning");
    let pid = t.pid.to_string();
    assert_no_writable_code(t.pid, "before");
    for step in ["after-inject", "after-detour", "after-entries", "before-patch", "after-patch", "before-restore"] {
        let mut session =
            Session::start_with_env(&["-p", &pid, "-f", "foo", "-f", "bar"], &[("TP_FAULT", &format!("pause:{step}"))]);
        // before-restore is in the detach: let the attach finish and interrupt it.
        if step == "before-restore" {
            session.err.wait_for("tp: attached");
            // SAFETY: plain kill(2) of the tp we started.
            unsafe { libc::kill(session.child.id() as i32, libc::SIGINT) };
        }
        wait_paused(&session.child);
        assert_no_writable_code(t.pid, step);
        let arenas = tp::process::read_maps(t.pid).unwrap().into_iter().filter(|m| m.exec && m.path.is_empty()).count();
        assert_eq!(arenas, 1, "{step}: tp's code arena should be mapped (r-x)");
        // SAFETY: as above.
        unsafe { libc::kill(session.child.id() as i32, libc::SIGCONT) };
        if step == "before-restore" {
            let (status, _, stderr) = session.wait();
            assert!(status.success(), "{stderr}");
        } else {
            session.err.wait_for("tp: attached");
            assert_no_writable_code(t.pid, "live");
            let (status, _, stderr) = session.interrupt();
            assert!(status.success(), "{stderr}");
        }
        assert_no_writable_code(t.pid, "after detach");
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo", "bar"]);
}

/// Tries to open `path` for reading as `nobody`; returns the error text, or
/// "opened" if it could.
fn open_as_nobody(path: &str) -> String {
    let out = Command::new("cat")
        .arg(path)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .expect("run cat as nobody");
    if out.status.success() { "opened".into() } else { String::from_utf8_lossy(&out.stderr).into_owned() }
}

#[test]
fn the_shared_region_is_reachable_only_with_ptrace_rights() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo"]);
    let maps = tp::process::read_maps(t.pid).unwrap();
    let region = tp::probe::region::find(&maps).expect("the target maps tp's region");
    assert!(region.shared && !region.exec, "the region is data: {region:?}");

    // The target holds no descriptor for it: only its mapping.
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let link = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
        assert!(!link.to_string_lossy().contains("tp-data"), "the target keeps an fd to the region: {link:?}");
    }
    // Every way in goes through ptrace access checks, which nobody fails:
    // the target's mapping, its memory, and tp's own descriptor.
    let map_file = format!("/proc/{pid}/map_files/{:x}-{:x}", region.start, region.end);
    assert!(std::fs::File::open(&map_file).is_ok(), "root reaches it: {map_file}");
    let tp_pid = session.child.id();
    let tp_fd = std::fs::read_dir(format!("/proc/{tp_pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_link(p).is_ok_and(|l| l.to_string_lossy().contains("tp-data")))
        .expect("tp holds the memfd");
    for path in [map_file, format!("/proc/{pid}/mem"), tp_fd.to_string_lossy().into_owned()] {
        let err = open_as_nobody(&path);
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "nobody opened {path}: {err}"
        );
    }
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
}

#[test]
fn no_file_is_left_in_world_writable_directories() {
    // tp runs in a mount namespace where /tmp, /var/tmp and /dev/shm are
    // fresh and empty; after a whole attach, status, detach and list-probes
    // they must still be empty.
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let tp = tp_path();
    let counter = target_path("counter");
    // tp and the target's file are copied out first: the checkout itself
    // may live under /tmp, which the fresh mounts hide.
    let script = format!(
        "set -e
        mkdir -p /var/lib /var/tmp /dev/shm
        bin=$(mktemp -d -p /var/lib)
        trap 'rm -rf $bin' EXIT
        cp {tp} {counter} $bin/
        for d in /tmp /var/tmp /dev/shm; do mount -t tmpfs tmpfs $d; done
        $bin/tp attach -p {pid} -f foo --keep
        $bin/tp status -p {pid} > /dev/null
        $bin/tp attach -p {pid} -f bar --duration 0.1 > /dev/null
        $bin/tp detach -p {pid}
        $bin/tp list-probes $bin/counter > /dev/null
        find /tmp /var/tmp /dev/shm -mindepth 1",
        tp = tp.display(),
        counter = counter.display()
    );
    let done = run(Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]));
    let (out, err) = (String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
    assert!(done.status.success(), "{:?}: {err}", done.status);
    assert!(out.is_empty(), "tp left files behind: {out}");
    assert_eq!(t.call("foo", 100, 1), 100);
    assert_code_is_original(&t, &["foo", "bar"]);
}
