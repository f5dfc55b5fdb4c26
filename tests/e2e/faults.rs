//! Fault injection (`TP_FAULT`, src/fault.rs): the tracer is killed with
//! SIGKILL at each step of an attach and a detach, and the target keeps
//! running correctly, no thread stays stopped or traced, no site is
//! half-written, and `tp detach -p` brings back byte-identical code; then a
//! new attach counts exactly. And the target is killed at each step: tp
//! says so in one line and exits non-zero, without hanging.

use std::os::unix::process::ExitStatusExt;
use std::process::Output;

use crate::util::*;

/// Runs tp with `TP_FAULT` set.
fn tp_with_fault(fault: &str, args: &[&str]) -> Output {
    run(tp_command().args(args).env("TP_FAULT", fault))
}

/// Asserts no thread of `pid` is stopped or has a tracer.
fn assert_no_thread_held(pid: i32) {
    for tid in tp::process::threads(pid).unwrap() {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else { continue };
        let st = tp::process::parse_status(&text);
        assert_eq!(st.tracer_pid, 0, "thread {tid} still traced");
        assert!(!matches!(st.state, 't' | 'T'), "thread {tid} left stopped (state {})", st.state);
    }
}

/// (anonymous executable mappings, descriptors of a tp-data memfd) in `pid`.
fn tp_leftovers(pid: i32) -> (usize, usize, usize) {
    let maps = tp::process::read_maps(pid).unwrap();
    let arenas = maps.iter().filter(|m| m.exec && m.path.is_empty()).count();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter(|e| {
            std::fs::read_link(e.as_ref().unwrap().path()).is_ok_and(|l| l.to_string_lossy().contains("tp-data"))
        })
        .count();
    // The first page of tp's private area is the target's only mapping
    // that a fork wipes ("wf" in smaps' VmFlags).
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let wiped = smaps.lines().filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "wf")).count();
    (arenas, fds, wiped)
}

/// Each probed function's entry is either the file's bytes or a whole
/// patch after its landing pad.
fn assert_sites_whole(t: &Target, funcs: &[&str]) {
    for f in funcs {
        let (now, file) = entry_bytes(t, f);
        assert!(
            now == file || is_whole_patch(&file, &now),
            "`{f}` is neither original nor patched: {now:02x?} vs {file:02x?}"
        );
    }
}

/// True if `now` is `file` (a function's first bytes) with a whole `jmp`
/// after its `endbr64`, if any.
#[cfg(target_arch = "x86_64")]
fn is_whole_patch(file: &[u8], now: &[u8]) -> bool {
    let site = if file[..4] == [0xf3, 0x0f, 0x1e, 0xfa] { 4 } else { 0 };
    now[..site] == file[..site] && now[site] == 0xe9
}

/// True if `now` is `file` (a function's first bytes) with a `b` (or the
/// long form's `adrp; add; br`) after its landing pads, if any: `bti`,
/// `paciasp` and `pacibsp` are hints whose immediates 25-38 say which.
#[cfg(target_arch = "aarch64")]
fn is_whole_patch(file: &[u8], now: &[u8]) -> bool {
    let word = |b: &[u8], k: usize| u32::from_le_bytes(b[4 * k..4 * k + 4].try_into().unwrap());
    let pad = |w: u32| w & 0xffff_f01f == 0xd503_201f && matches!((w >> 5) & 0x7f, 25 | 27 | 34 | 36 | 38);
    let site = (0..file.len() / 4).find(|&k| !pad(word(file, k))).unwrap_or(0);
    let patch = word(now, site);
    now[..4 * site] == file[..4 * site] && (patch >> 26 == 0b000101 || patch & 0x9f00_001f == 0x9000_0010)
}

/// Kills tp at `fault` while two threads call foo and bar (unless `quiet`),
/// then checks the target and cleans up.
fn tracer_killed_at(fault: &str, quiet: bool) {
    tracer_killed_in(fault, quiet, &[]);
}

/// [`tracer_killed_at`], with more options for the attach (`records`).
fn tracer_killed_in(fault: &str, quiet: bool, records: &[&str]) {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    if !quiet {
        t.ask("spin 2 hot", "spinning");
    }
    // Long enough for a few looks of the observing loop, which an emulated
    // CPU draining a full ring makes slow (the fault comes first either way).
    let duration = if std::env::var_os("TP_TEST_CPU").is_some() { "2" } else { "0.2" };
    let mut args = vec!["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--duration", duration];
    args.extend(records);
    let out = tp_with_fault(fault, &args);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "TP_FAULT={fault}: tp should have died at the step; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_thread_held(t.pid);
    assert_sites_whole(&t, &["foo", "bar"]);

    // The target keeps computing correctly, whatever tp left in it.
    if !quiet {
        let stopped = t.ask("stop", "stopped");
        assert!(stopped.ends_with("checksum=ok"), "TP_FAULT={fault}: {stopped}");
    }
    assert_eq!(t.call("foo", 10_000, 2), 20_000);
    assert_eq!(t.call("bar", 10_000, 2), 20_000);

    // tp detach brings the code back, and the memory goes (no thread runs in
    // it now), also what a tp killed before the region existed left.
    let out = tp(&["detach", "-p", &pid]);
    expect_success(&["detach", "-p", &pid], &out);
    assert_code_is_original(&t, &["foo", "bar"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!has_region(t.pid), "TP_FAULT={fault}: {stderr}");
    assert_eq!(tp_leftovers(t.pid), (0, 0, 0), "TP_FAULT={fault}: {stderr}");
    assert_no_thread_held(t.pid);

    // A new attach counts exactly.
    let session = Session::start(&["-p", &pid, "-f", "foo", "-f", "bar", "--json"]);
    let calls = t.call("foo", 12_345, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "TP_FAULT={fault}: {stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["foo"], hits["bar"]), (calls, 0), "TP_FAULT={fault}");
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(t.quit().success());
}

#[test]
fn tracer_killed_during_attach() {
    for fault in [
        "after-seize",
        "after-name-write",
        "after-private",
        "after-memfd",
        "after-inject",
        "after-detour-write",
        "after-detour-write:2",
        "after-detour",
        "after-entry",
        "after-entry:2",
        "after-entries",
        "before-patch",
        "after-patch",
        "before-patch:2",
        "after-patch:2",
    ] {
        tracer_killed_at(fault, false);
    }
}

/// An attach that records events: besides the counters, the in-target
/// runtime, the threads' rings and return frames; once the session
/// observes, the threads go on through the runtime and the return
/// trampoline with no tracer to drain their rings.
#[test]
fn tracer_killed_during_an_attach_that_records_events() {
    for fault in [
        "after-name-write",
        "after-private",
        "after-inject",
        "after-detour-write",
        "after-detour",
        "after-entries",
        "before-patch",
        "after-patch",
        "after-patch:2",
        "observing",
        "observing:3",
    ] {
        tracer_killed_in(fault, false, &["--args", "--ret", "-q"]);
    }
}

#[test]
fn tracer_killed_during_detach() {
    // after-seize:2 is the detach's stop of every thread.
    for fault in ["after-seize:2", "before-restore", "during-detach", "before-restore:2", "during-detach:2"] {
        tracer_killed_at(fault, false);
    }
    // The unmap is reached only when no thread runs in a detour: a quiet target.
    tracer_killed_at("after-unmap-region", true);
}
/// Kills the target at `step` of an attach; tp must fail in one line.
fn target_killed_at(step: &str) -> String {
    let mut t = Target::start("counter");
    t.ask("spin 2 hot", "spinning");
    let pid = t.pid.to_string();
    let args = ["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--duration", "0.2"];
    let out = tp_with_fault(&format!("target:{step}"), &args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let status = wait_timeout(&mut t.child);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the fault should have killed the target");
    assert!(out.status.code().is_some(), "target:{step}: tp died of {:?}: {stderr}", out.status.signal());
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && !out.status.success(),
        "target:{step}: want one line and a failure, got {:?}: {stderr}",
        out.status
    );
    lines[0].to_string()
}

#[test]
fn target_killed_during_attach_is_reported_in_one_line() {
    for step in ["after-seize", "after-inject", "after-detour", "after-entries", "before-patch", "after-patch"] {
        let line = target_killed_at(step);
        assert!(line.contains("exited while tp was attaching"), "target:{step}: {line}");
    }
}

#[test]
fn a_target_that_exits_while_tp_writes_the_detours_ends_the_attach_in_one_line() {
    // The process runs between tp's remote syscalls and the patch: it may
    // exit then, on its own, with tp's memory mapped and no site patched.
    for step in ["after-inject", "after-detour", "after-entries"] {
        let mut t = Target::start("counter");
        let pid = t.pid.to_string();
        let session =
            Session::start_with_env(&["-p", &pid, "-f", "foo", "-f", "bar"], &[("TP_FAULT", &format!("pause:{step}"))]);
        wait_paused(&session.child);
        assert_eq!(t.call("foo", 1000, 2), 2000, "{step}: the target runs meanwhile");
        t.send(b"quit\n");
        // Its main thread, seized by tp, exits; the process is reaped once tp lets go.
        wait_until("the target exits", || {
            tp::process::threads(t.pid).map_or(true, |tids| {
                tids.iter().all(|&tid| {
                    std::fs::read_to_string(format!("/proc/{}/task/{tid}/stat", t.pid))
                        .map_or(true, |s| s.contains(") Z") || s.contains(") X"))
                })
            })
        });
        // SAFETY: plain kill(2) of the tp we started.
        unsafe { libc::kill(session.child.id() as i32, libc::SIGCONT) };
        let (status, _, stderr) = session.wait();
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(!status.success() && status.code().is_some(), "{step}: {status:?}: {stderr}");
        assert!(lines.len() == 1 && lines[0].contains("exited while tp was attaching"), "{step}: {stderr}");
        assert!(wait_timeout(&mut t.child).success(), "{step}: the target exited as it wanted");
    }
}

#[test]
fn target_killed_during_detach_still_gives_the_final_counts() {
    for step in ["after-seize:2", "before-restore", "during-detach"] {
        let mut t = Target::start("counter");
        t.ask("spin 2 hot", "spinning");
        let pid = t.pid.to_string();
        let args = ["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--duration", "0.2", "--json"];
        let out = tp_with_fault(&format!("target:{step}"), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // 128 + SIGKILL where tp hears how its target ended.
        let status = if hears_process_events() { 137 } else { 0 };
        assert_eq!(out.status.code(), Some(status), "target:{step}: {stderr}");
        let killed = killed_line(t.pid, "SIGKILL");
        assert!(stderr.contains(&format!("{killed}; final counts")), "target:{step}: {stderr}");
        let hits = hits_from_json(&String::from_utf8_lossy(&out.stdout));
        assert!(hits["foo"] > 0 && hits["bar"] > 0, "target:{step}: the spinning threads were counted: {hits:?}");
        assert_eq!(wait_timeout(&mut t.child).signal(), Some(libc::SIGKILL));
    }
}

#[test]
fn target_killed_during_tp_detach_is_reported_in_one_line() {
    for step in ["after-seize", "before-restore", "during-detach", "after-unmap-region"] {
        let t = Target::start("counter");
        let pid = t.pid.to_string();
        expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]));
        let out = tp_with_fault(&format!("target:{step}"), &["detach", "-p", &pid]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "target:{step}: {stderr}");
        assert_eq!(stderr.trim(), format!("tp: process {pid} exited; nothing left to restore"), "target:{step}");
    }
}

#[test]
fn a_panic_with_probes_installed_restores_them() {
    // A bug that panics while a session's probes are live: one line, a
    // non-zero exit, and the guard restores the code while unwinding.
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let out = tp_with_fault("panic:observing", &["attach", "-p", &pid, "-f", "foo", "-f", "bar"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{:?} {stderr}", out.status.signal());
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("tp: attached")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("tp: internal error: TP_FAULT=panic:observing at src/fault.rs:"), "{stderr}");
    assert!(lines[0].ends_with("; please report it"), "{stderr}");
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(!has_region(t.pid), "tp's memory is unmapped as after a normal detach");
    assert_no_thread_held(t.pid);
    assert_eq!(t.call("foo", 100, 1), 100);
}
