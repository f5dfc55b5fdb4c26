//! `--steps --step-engine trap`: a call traced in the target by the trap
//! flag and tp's SIGTRAP handler (targets/steps.c). The loop's count is
//! the one the program states, through signals too; a syscall inside the
//! call counts the instruction after it; a call that creates a thread or
//! forks ends its trace before glibc blocks every signal, and the thread
//! and the child run; a traced call outlives tp interrupted or killed,
//! even one that waits in a syscall at the detach; a process with a
//! SIGTRAP handler of its own is refused in one line; after the detach
//! the process catches SIGTRAP no more and its code is byte-identical.
//! AArch64 user code cannot single-step itself: there the engine is
//! refused in one line.

#[cfg(target_arch = "x86_64")]
use serde_json::Value;

use crate::util::*;

#[cfg(target_arch = "x86_64")]
/// True if process `pid` has a SIGTRAP handler.
fn catches_sigtrap(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cgt = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap().trim();
    u64::from_str_radix(cgt, 16).unwrap() & (1 << 4) != 0
}

#[cfg(target_arch = "x86_64")]
/// The executed instructions of a steps object: address, count.
fn executed(s: &Value) -> Vec<(u64, u64)> {
    s["executed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let a = e["address"].as_str().unwrap().trim_start_matches("0x");
            (u64::from_str_radix(a, 16).unwrap(), e["count"].as_u64().unwrap())
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
fn trap_session(pid: &str, func: &str) -> Session {
    Session::start(&["-p", pid, "-f", func, "--steps", "--step-engine", "trap", "--json"])
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_traced_loop_executes_exactly_the_instructions_the_program_states() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = trap_session(&pid, "steploop");
    assert!(catches_sigtrap(t.pid), "tp's handler is installed");
    let done = t.ask("loop 1000", "done loop");
    assert_eq!(field(&done, "ret"), 1000, "{done}");
    session.err.wait_for("tp: stepped a call of steploop");
    assert_eq!(field(&t.ask("loop 5", "done loop"), "ret"), 5);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let steps = steps_of(&stdout);
    assert_eq!(steps.len(), 1, "{steps:?}");
    let s = &steps[0];
    assert_eq!((s["func"].as_str(), s["end"].as_str()), (Some("steploop"), Some("returned")), "{s}");
    assert_eq!(s["instructions"].as_u64(), Some(field(&done, "insns")), "{s}");
    let body = executed(s).iter().filter(|&&(_, n)| n == 1000).count();
    assert_eq!(body, 2, "the loop's two instructions, a thousand times each: {s}");
    assert_eq!(hits_from_json(&stdout)["steploop"], 2);
    assert_code_is_original(&t, &["steploop"]);
    assert!(!has_region(t.pid));
    assert!(!catches_sigtrap(t.pid), "the default disposition is back");
    assert!(t.quit().success());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn signals_during_a_traced_call_count_nothing_twice() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = trap_session(&pid, "steploop");
    let done = t.ask("sigloop 20000 1000", "done sigloop");
    assert_eq!(field(&done, "ret"), 20000, "{done}");
    assert!(field(&done, "handled") >= 1, "{done}");
    session.err.wait_for("tp: stepped a call of steploop");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    assert_eq!(s["end"], "returned", "{s}");
    // The handler ran with the flag clear; the instruction each signal
    // interrupted ran once after it.
    assert_eq!(s["instructions"].as_u64(), Some(field(&done, "insns")), "{s}");
    assert_code_is_original(&t, &["steploop"]);
    assert!(t.quit().success());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_syscall_in_a_traced_call_is_followed_by_the_instruction_after_it() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = trap_session(&pid, "napper");
    let before = field(&t.ask("ticks", "done ticks"), "ticks");
    t.ask("nap 300", "done nap");
    session.err.wait_for("tp: stepped a call of napper");
    let after = field(&t.ask("ticks", "done ticks"), "ticks");
    assert!(after > before + 50, "the ticker ran on: {before} then {after}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    // The thread slept in the syscall with the flag set, and went on traced.
    assert_eq!(s["end"], "returned", "{s}");
    let ran = executed(s);
    let code = |at: u64| read_target(t.pid, at, 2);
    let syscalls: Vec<u64> = ran.iter().map(|&(a, _)| a).filter(|&a| code(a) == [0x0f, 0x05]).collect();
    assert!(!syscalls.is_empty(), "nanosleep's syscall was traced: {s}");
    for at in syscalls {
        assert!(ran.iter().any(|&(a, n)| a == at + 2 && n >= 1), "the instruction after the syscall at {at:#x}: {s}");
    }
    assert_code_is_original(&t, &["napper"]);
    assert!(t.quit().success());
}

#[cfg(target_arch = "x86_64")]
/// `len` bytes of process `pid` at `at`.
fn read_target(pid: i32, at: u64, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).map(|_| buf).unwrap_or_default()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn threads_and_children_made_in_a_traced_call_run_and_the_trace_ends_before_signals_are_blocked() {
    for (func, cmd, answer) in [("stepspawn", "spawn", "ran"), ("stepfork", "fork", "status")] {
        let mut t = Target::start("steps");
        let pid = t.pid.to_string();
        let mut session = trap_session(&pid, func);
        let done = t.ask(cmd, &format!("done {cmd}"));
        assert_eq!(field(&done, answer), if cmd == "spawn" { 1 } else { 7 }, "{done}");
        session.err.wait_for(&format!("tp: stepped a call of {func}"));
        // Again, untraced (one call was asked for).
        assert_eq!(field(&t.ask(cmd, &format!("done {cmd}")), answer), if cmd == "spawn" { 1 } else { 7 });
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        let s = &steps_of(&stdout)[0];
        // pthread_create blocks every signal (rt_sigprocmask, 14) before
        // its clone; fork need not, and its child, which inherits the
        // flag, has it cleared at its first instruction.
        let ends: &[&str] = if cmd == "spawn" { &["masked 14"] } else { &["masked 14", "returned"] };
        assert!(ends.contains(&s["end"].as_str().unwrap()), "{s}");
        assert!(s["instructions"].as_u64().unwrap() > 10, "{s}");
        assert_code_is_original(&t, &[func]);
        assert!(!has_region(t.pid));
        assert!(t.quit().success(), "{func}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_traced_call_outlives_tp_interrupted_or_killed() {
    for kill in [false, true] {
        let mut t = Target::start("steps");
        let pid = t.pid.to_string();
        let session = trap_session(&pid, "steploop");
        t.send(b"loop 2000000\n");
        std::thread::sleep(std::time::Duration::from_millis(500));
        if kill {
            session.kill();
        } else {
            let (status, stdout, stderr) = session.interrupt();
            assert!(status.success(), "{stderr}");
            let s = &steps_of(&stdout)[0];
            assert_eq!(s["end"], "stopped", "{s}");
            assert!(s["instructions"].as_u64().unwrap() > 100, "{s}");
        }
        // The handler sees tp gone (or told to stop) within a few thousand
        // instructions: the call runs on at full speed.
        let done = t.out.wait_for("done loop");
        assert_eq!(field(&done, "ret"), 2_000_000, "killed tp: {kill}");
        if kill {
            // The killed session's handler is still there: a new one is
            // refused in one line until a detach takes it out.
            let out = tp(&["attach", "-p", &pid, "-f", "steploop", "--steps", "--step-engine", "trap", "-d", "1"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success() && err.lines().count() == 1, "{err}");
            assert!(err.contains("still installed") && err.contains("tp detach -p"), "{err}");
            let out = tp(&["detach", "-p", &pid]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        assert_code_is_original(&t, &["steploop"]);
        assert!(!has_region(t.pid), "killed tp: {kill}");
        assert!(!catches_sigtrap(t.pid), "killed tp: {kill}");
        assert!(t.quit().success(), "the program outlived tp (killed: {kill})");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_call_waiting_in_a_syscall_at_the_detach_keeps_tps_memory_until_it_is_done() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let session = trap_session(&pid, "napper");
    t.send(b"nap 3000\n");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("still maps tp's memory: thread") && stderr.contains("in-target stepping engine"),
        "{stderr}"
    );
    assert!(!stdout.is_empty());
    assert!(has_region(t.pid), "the handler is tp's code: kept");
    assert!(catches_sigtrap(t.pid));
    t.out.wait_for("done nap");
    let out = tp(&["detach", "-p", &pid]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!has_region(t.pid));
    assert!(!catches_sigtrap(t.pid));
    assert_code_is_original(&t, &["napper"]);
    assert!(t.quit().success());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_process_with_a_sigtrap_handler_of_its_own_is_refused() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    t.ask("sigtrap", "done sigtrap");
    let out = tp(&["attach", "-p", &pid, "-f", "steploop", "--steps", "--step-engine", "trap", "-d", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tp: ") && err.contains("handles or ignores SIGTRAP"), "{err}");
    assert!(!has_region(t.pid));
    assert_code_is_original(&t, &["steploop"]);
    assert!(t.quit().success());
}

#[cfg(target_arch = "aarch64")]
#[test]
fn the_engine_is_refused_where_user_code_cannot_single_step_itself() {
    let t = Target::start("steps");
    let pid = t.pid.to_string();
    let out = tp(&["attach", "-p", &pid, "-f", "steploop", "--steps", "--step-engine", "trap", "-d", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tp: ") && err.contains("MDSCR_EL1.SS"), "{err}");
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn a_depth_bound_needs_the_ptrace_engine() {
    let out = tp(&["attach", "-p", "1", "-f", "x", "--steps", "--step-engine", "trap", "--step-depth", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--step-depth needs --step-engine ptrace"), "{err}");
}
