//! Targets under their own seccomp filters (targets/sandboxed.c): tp runs
//! the filters on every syscall it would make there and refuses, in one
//! line naming the call and the filter's answer, what would kill the target
//! or fail; the target lives on unchanged. A filter that lets tp's calls
//! through attaches and counts exactly.

use crate::util::*;

/// The target's memory map, and its open descriptors with what they are.
fn maps_of(pid: i32) -> String {
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            format!("{} -> {}", e.file_name().to_string_lossy(), std::fs::read_link(e.path()).unwrap().display())
        })
        .collect();
    fds.sort();
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap() + &fds.join("\n")
}

/// Asserts the target still answers and computes right, then quits cleanly.
fn alive_and_well(mut t: Target) {
    assert_eq!(t.ask("ping", "pong"), "pong");
    assert_eq!(t.call("work", 1000, 1), 1000);
    assert!(t.quit().success());
}

#[test]
fn filters_that_would_kill_or_fail_a_call_are_refused_and_nothing_changes() {
    let cases = [
        ("kill-memfd", "answers memfd_create with KILL_PROCESS: the process would be killed"),
        ("errno-memfd", "answers memfd_create with ERRNO(1): the call would fail: Operation not permitted"),
        (
            "kill-mmap-exec",
            "answers mmap(PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE) with KILL_PROCESS",
        ),
        (
            "errno-mmap-exec",
            "answers mmap(PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE) with ERRNO(1)",
        ),
        ("trap-munmap", "answers munmap with TRAP(0): the thread would get SIGSYS"),
        // Refused only with the call's actual arguments (the memfd's
        // descriptor), after tp mapped its code arena and created the
        // memfd: both are undone.
        (
            "errno-mmap-fd",
            "answers mmap(PROT_READ|PROT_WRITE, MAP_SHARED) with ERRNO(13): the call would fail: Permission denied",
        ),
    ];
    for (mode, why) in cases {
        let t = Target::start_with("sandboxed", |c| {
            c.arg(mode);
        });
        let pid = t.pid.to_string();
        let before = maps_of(t.pid);
        // Each try leaves nothing behind, so a second one finds the same.
        for _ in 0..2 {
            let line = expect_error(&["attach", "-p", &pid, "-f", "work"], why);
            assert!(line.contains(&format!("the seccomp filter of process {pid} (thread {pid})")), "{line}");
            assert!(line.ends_with("tp does not make that call"), "{line}");
            assert_eq!(maps_of(t.pid), before, "{mode}: the target's memory changed");
        }
        assert_code_is_original(&t, &["work"]);
        alive_and_well(t);
    }
}

#[test]
fn a_filter_that_lets_tps_calls_through_attaches_and_counts_exactly() {
    // close is logged (LOG lets it run), reboot and kexec_load are refused:
    // none of it concerns tp.
    let mut t = Target::start_with("sandboxed", |c| {
        c.arg("allow");
    });
    let pid = t.pid.to_string();
    let before = maps_of(t.pid);
    let session = Session::start(&["-p", &pid, "--json", "-f", "work"]);
    let own = t.call("work", 25_000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], own);
    assert_code_is_original(&t, &["work"]);
    assert_eq!(maps_of(t.pid), before, "tp's memory should be gone after the detach");
    alive_and_well(t);
}

#[test]
fn strict_mode_is_refused() {
    let mut t = Target::start_with("sandboxed", |c| {
        c.arg("strict");
    });
    let pid = t.pid.to_string();
    assert_eq!(t.ask("ping", "pong"), "pong", "the target is in strict mode and answers");
    let before = maps_of(t.pid);
    expect_error(
        &["attach", "-p", &pid, "-f", "work"],
        &format!("thread {pid} of process {pid} runs in seccomp strict mode"),
    );
    assert_eq!(maps_of(t.pid), before);
    assert_eq!(t.ask("ping", "pong"), "pong");
    assert!(t.quit().success());
}

/// tp without CAP_SYS_ADMIN cannot read filters: it refuses a filtered
/// target rather than guess, and still attaches to one without filters.
/// (x86-64: the arm64 test VM has no setpriv.)
#[cfg(target_arch = "x86_64")]
#[test]
fn filters_tp_cannot_read_are_a_refusal() {
    need("setpriv");
    let without_sys_admin = |args: &[&str]| {
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args(["--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"]).arg(tp_path()).args(args);
        run(&mut cmd)
    };
    let t = Target::start_with("sandboxed", |c| {
        c.arg("allow");
    });
    let pid = t.pid.to_string();
    let before = maps_of(t.pid);
    let out = without_sys_admin(&["attach", "-p", &pid, "-f", "work", "-d", "0.1"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "tp: cannot read the seccomp filters of thread {pid} of process {pid}: reading them needs CAP_SYS_ADMIN"
        )),
        "{stderr}"
    );
    assert_eq!(maps_of(t.pid), before);
    alive_and_well(t);

    let t = Target::start_with("sandboxed", |c| {
        c.arg("none");
    });
    let pid = t.pid.to_string();
    let out = without_sys_admin(&["attach", "-p", &pid, "-f", "work", "-d", "0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    alive_and_well(t);
}
