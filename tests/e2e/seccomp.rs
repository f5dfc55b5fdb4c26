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

/// Runs `tp ARGS`, which must refuse in one line containing `needle` with
/// exit status 1; returns the line.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn refused(args: &[&str], needle: &str) -> String {
    let out = tp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "tp {args:?}: {stderr}");
    expect_one_line(&stderr, needle)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn expect_one_line(stderr: &str, needle: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("tp: ") && lines[0].contains(needle), "{:?} lacks {needle:?}", lines[0]);
    lines[0].to_string()
}

/// The in-target runtime's own syscalls (gettid on a thread's first event)
/// go through the target's filters too: a filter that would kill on one
/// refuses what calls the runtime, before anything is injected, while
/// counting probes, which make no syscall, attach and count exactly.
#[test]
fn a_filter_that_kills_on_a_runtime_call_refuses_recording_and_counting_works() {
    let mut t = Target::start_with("sandboxed", |c| {
        c.arg("kill-gettid");
    });
    let pid = t.pid.to_string();
    let before = maps_of(t.pid);
    let why = format!(
        "tp: cannot record in process {pid}: the seccomp filter of thread {pid} answers gettid, which tp's runtime \
         calls in the target, with KILL_PROCESS: the process would be killed; probes that only count make no \
         syscall there and work"
    );
    let attach = ["attach", "-p", &pid, "-f", "work"];
    let profile = ["profile", "-p", &pid, "-f", "work", "-d", "1"];
    for extra in [&["--args"][..], &["--ret"], &["--stack"], &["--args", "--ret", "--if", "x > 5"], &["--by", "x"]] {
        let args = [&attach[..], extra].concat();
        assert_eq!(refused(&args, "answers gettid"), why, "{extra:?}");
    }
    assert_eq!(refused(&profile, "answers gettid"), why, "tp profile");
    assert_eq!(maps_of(t.pid), before, "the target's memory changed");
    assert_code_is_original(&t, &["work"]);
    assert_eq!(t.ask("ping", "pong"), "pong");

    let session = Session::start(&["-p", &pid, "--json", "-f", "work"]);
    let own = t.call("work", 25_000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], own);
    assert_code_is_original(&t, &["work"]);
    assert_eq!(maps_of(t.pid), before, "tp's memory should be gone after the detach");
    alive_and_well(t);
}

/// A predicate on strings makes the runtime read them with
/// process_vm_readv: a filter that kills on it refuses that predicate in one
/// line naming the call, and a predicate on integers records as before.
#[test]
fn a_filter_that_kills_on_reading_strings_refuses_string_predicates_only() {
    let mut t = Target::start_with("sandboxed", |c| {
        c.arg("kill-process-vm-readv");
    });
    let pid = t.pid.to_string();
    let before = maps_of(t.pid);
    let args = ["attach", "-p", &pid, "-f", "work", "--if", "str(x) == \"GET\""];
    let line = refused(&args, "answers process_vm_readv, which tp's runtime calls in the target, with KILL_PROCESS");
    assert!(line.contains("the process would be killed"), "{line}");
    assert_eq!(maps_of(t.pid), before, "the target's memory changed");
    let session = Session::start(&["-p", &pid, "--json", "-f", "work", "--if", "x > 5"]);
    let own = t.call("work", 1000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!((own, json_events(&stdout).iter().filter(|e| e["type"] == "entry").count()), (1000, 995));
    alive_and_well(t);
}

/// Filters belong to threads: one filtered thread among unfiltered ones
/// (the main thread, which makes tp's remote calls, has none) is enough
/// for a refusal naming that thread.
#[test]
fn a_runtime_call_killed_in_another_thread_only_is_refused() {
    let t = Target::start_with("sandboxed", |c| {
        c.arg("thread-kill-gettid");
    });
    let pid = t.pid.to_string();
    let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(tids.len(), 2, "{tids:?}");
    let other = tids.iter().find(|t| **t != pid).unwrap();
    let status = |tid: &str| std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    assert!(status(&pid).contains("Seccomp:\t0"), "the main thread has no filter");
    assert!(status(other).contains("Seccomp:\t2"), "the second thread has one");
    let before = maps_of(t.pid);
    let line = refused(
        &["attach", "-p", &pid, "-f", "work", "--args", "--ret"],
        &format!("cannot record in process {pid}: the seccomp filter of thread {other} answers gettid"),
    );
    assert!(line.contains("with KILL_PROCESS: the process would be killed"), "{line}");
    assert_eq!(maps_of(t.pid), before);
    assert_code_is_original(&t, &["work"]);
    alive_and_well(t);
}

/// Return probes that see calls end at the functions' exits make no call
/// that ends a process: where the filters fail exit_group, which the
/// runtime would need to end a process whose replaced return address it
/// lost, they time every call, and only the return-address form is refused.
#[test]
fn returns_at_exits_need_no_call_that_ends_the_process() {
    let mut t = Target::start_with("sandboxed", |c| {
        c.arg("errno-exit-group");
    });
    let pid = t.pid.to_string();
    let before = maps_of(t.pid);
    let out = run(tp_command().env("TP_RETURNS", "stack").args(["attach", "-p", &pid, "-f", "work", "--ret"]));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let needle = format!("cannot record in process {pid}: the seccomp filter of thread {pid} answers exit_group");
    let line = expect_one_line(&stderr, &needle);
    assert!(line.contains("with ERRNO(1)"), "{line}");
    assert_eq!(maps_of(t.pid), before);
    let args = ["-p", pid.as_str(), "-f", "work", "--ret", "-q", "--json"];
    let session = Session::start(&args);
    assert_eq!(t.call("work", 1000, 1), 1000);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let summary = one_process(&stdout);
    assert_eq!(summary["probes"][0]["timed"].as_u64(), Some(1000), "{summary}");
    assert_code_is_original(&t, &["work"]);
    alive_and_well(t);
}

/// The filters of `sandboxed errno-runtime`: one for kill, one for
/// arch_prctl where there is such a call.
#[cfg(target_arch = "x86_64")]
const ERRNO_RUNTIME_FILTERS: u32 = 2;
#[cfg(not(target_arch = "x86_64"))]
const ERRNO_RUNTIME_FILTERS: u32 = 1;

/// Errors the runtime goes on from are no reason to refuse: under a filter
/// that answers EPERM to `kill` and to the thread-pointer call, events are
/// recorded, every one, also where each event asks the kernel for the
/// thread pointer (`TP_THREAD_KEY=syscall`: it fails, and the thread is
/// told apart by its TID).
#[test]
fn errors_the_runtime_goes_on_from_are_no_refusal() {
    for env in [&[][..], &[("TP_THREAD_KEY", "syscall")]] {
        let mut t = Target::start_with("sandboxed", |c| {
            c.arg("errno-runtime");
        });
        let pid = t.pid.to_string();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains(&format!("Seccomp_filters:\t{ERRNO_RUNTIME_FILTERS}")), "{status}");
        let before = maps_of(t.pid);
        let args = ["-p", pid.as_str(), "-f", "work", "--args", "--ret", "--json"];
        let mut session = Session::spawn("attach", &args, env, None);
        session.err.wait_for("tp: attached");
        assert_eq!(t.call("work", 1000, 1), 1000);
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{env:?}: {stderr}");
        let events: Vec<serde_json::Value> = json_events(&stdout);
        let of = |ty: &str| events.iter().filter(|e| e["type"] == ty && e["tid"] == t.pid).count();
        assert_eq!((of("entry"), of("exit"), events.len()), (1000, 1000, 2000), "{env:?}");
        assert_code_is_original(&t, &["work"]);
        assert_eq!(maps_of(t.pid), before, "{env:?}: tp's memory should be gone after the detach");
        alive_and_well(t);
    }
}
