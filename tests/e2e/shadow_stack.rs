//! Hardware shadow stacks: a thread that runs with one (x86-64 CET) would
//! fault at a rewritten return address and at the return of a call a
//! detour copies as a push and a jump. tp reads every thread's state (its
//! status file): return probes see calls end at the functions' exits there
//! (those that leave by an exit without a window are counted as unwound,
//! never timed through the return address), and a probe whose detour
//! copies a call is refused in one line, naming the thread; counting and
//! entry events on other functions work.
//!
//! The machines the tests run on have no kernel with user shadow stacks
//! (CONFIG_X86_USER_SHADOW_STACK), so no target can run with one here:
//! `TP_SHADOW_STACK=all` makes tp believe every thread of the target does,
//! which tests the refusals and that nothing is touched; without it, the
//! same probes go in (no false refusal), as every other test of return
//! probes shows too. How tp reads the real state is unit-tested on the
//! kernel's own text (src/arch/x86_64/cet.rs, src/arch/aarch64/gcs.rs).

use std::process::Output;

use crate::util::*;

const BELIEVE: (&str, &str) = ("TP_SHADOW_STACK", "all");

/// Runs `tp ARGS` believing in shadow stacks.
fn tp_believing(args: &[&str]) -> Output {
    run(tp_command().env(BELIEVE.0, BELIEVE.1).args(args))
}

/// Asserts `tp ARGS`, believing in shadow stacks, refused in one line
/// `tp: LINE` with exit status 1.
fn refused(args: &[&str], line: &str) {
    let out = tp_believing(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "tp {args:?}: {stderr}");
    assert_eq!(stderr.trim_end(), format!("tp: {line}"), "tp {args:?}");
}

#[test]
fn copied_calls_are_refused_and_returns_seen_at_exits_where_a_thread_has_a_shadow_stack() {
    let mut t = Target::start("prologues");
    let pid = t.pid.to_string();

    // pr_call's window ends in a call, which its detour makes as a push of
    // the return address and a jump; so do pr_call_mem's and pr_call_next's.
    let call = "runs with a hardware shadow stack (x86 CET), and the probe's copy of the call in its patch window \
                pushes the return address and jumps, a call the shadow stack does not record, so the callee's \
                return would fault";
    refused(&["attach", "-p", &pid, "-f", "pr_call"], &format!("cannot probe `pr_call`: thread {pid} {call}"));
    assert!(!has_region(t.pid), "nothing may be injected when a probe is refused");
    assert_code_is_original(&t, &["pr_push", "pr_call"]);

    // Returns seen at the function's exits leave the return address alone:
    // every call of pr_push is timed. pr_shared_ret's first return has no
    // window: the calls that leave by it (x = 1..3) are counted as unwound,
    // not timed through a rewritten return address, which the shadow stack
    // would reject.
    let args = ["-p", &pid, "--json", "--ret", "-q", "-f", "pr_push", "-f", "pr_shared_ret"];
    let session = Session::spawn("attach", &args, &[BELIEVE], Some("tp: attached"));
    let own = (t.call("push", 3_000, 1), t.call("shared_ret", 2_000, 1));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("tp: 1 function count the calls that leave by an exit without a window as unwound"),
        "{stderr}"
    );
    let summary = one_process(&stdout);
    let timed =
        |f: &str| summary["probes"].as_array().unwrap().iter().find(|p| p["func"] == f).unwrap()["timed"].as_u64();
    assert_eq!((timed("pr_push"), timed("pr_shared_ret")), (Some(own.0), Some(own.1 - 3)), "{summary}");

    // Counting and entry events work; a glob skips the functions refused
    // (pr_call, pr_call_mem, pr_call_next and each one's twin pr_*_ref).
    let args = ["-p", &pid, "--json", "--args", "-f", "pr_push", "-f", "pr_call*"];
    let session = Session::spawn("attach", &args, &[BELIEVE], Some("tp: attached"));
    let own = t.call("push", 1_000, 1);
    assert_eq!(t.call("call", 1_000, 1), 1_000);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("tp: 6 of the matched functions cannot be probed and are skipped"), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!(hits.into_iter().collect::<Vec<_>>(), [("pr_push".to_string(), own)]);
    let entries = json_events(&stdout).iter().filter(|e| e["type"] == "entry" && e["func"] == "pr_push").count();
    assert_eq!(entries as u64, own, "every call's entry event");
    // list-probes says why.
    let out = tp_believing(&["list-probes", "-p", &pid, "--json"]);
    let listed = expect_success(&["list-probes"], &out);
    let pr_call = listed.lines().find(|l| l.contains("\"pr_call\"")).expect("pr_call listed");
    assert!(pr_call.contains(&format!("thread {pid} {call}")), "{pr_call}");
    assert_code_is_original(&t, &["pr_push", "pr_call"]);

    // Without a shadow stack, the same probes go in and time every call.
    let session = Session::start(&["-p", &pid, "--json", "--ret", "-f", "pr_push", "-f", "pr_call"]);
    let own = (t.call("push", 20_000, 1), t.call("call", 20_001, 1));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["pr_push"], hits["pr_call"]), own);
    assert_code_is_original(&t, &["pr_push", "pr_call"]);
    assert!(t.quit().success(), "a checksum failed after detach");
}
