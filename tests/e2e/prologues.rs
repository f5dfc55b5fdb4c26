//! The hand-written prologues of targets/prologues_x86_64.S: every rewrite
//! counted exactly in a real process, every refusal named.

use crate::util::*;

/// The pr_* functions (one per rewrite class), as the target names them.
const REWRITES: &[&str] = &[
    "movabs",
    "push",
    "endbr",
    "rip_load",
    "rip_store",
    "rip_imm",
    "rip_lea",
    "rip_sse",
    "fs",
    "nopw",
    "jcc8",
    "jcc32",
    "jmp8",
    "tail",
    "jmp_rip",
    "ret",
    "call",
    "call_next",
    "call_mem",
    "loop",
    "jrcxz",
    "syscall",
    // The function's own address taken in the window (a callback, a
    // comparison): the copy must compute the original's.
    "self",
    "self_cmp",
    // Shorter than the jump: the window takes the padding after it.
    "short",
    // A return that is a branch target, reachable code right after it.
    "shared_ret",
    // Compiled C: a switch (jump table) and a computed goto (stored label
    // addresses), with windows of two instructions.
    "switch",
    "goto",
];

/// The r_* functions and what tp must say about each.
const REFUSALS: &[(&str, &str)] = &[
    ("r_too_short", "too short (3 bytes, a probe needs 5)"),
    ("r_int3", "`int3` at 0x"),
    ("r_ud2", "`ud2` at 0x"),
    ("r_int80", "`int` at 0x"),
    ("r_call_first", "`call` at 0x"),
    ("r_syscall_first", "`syscall` at 0x"),
    ("r_branch_into", "branch into window from 0x"),
    ("r_indirect", "indirect jump at 0x"), // its switch table points into the window
    ("r_undecodable", "undecodable instruction at 0x"),
    ("r_past_end", "passes the function's end"),
    ("r_outer", "function `r_inner` enters the window at 0x"),
    ("r_cold", "a jump from outside the function enters the window at 0x"),
    ("r_landing_pad", "exception landing pad at 0x"),
];

/// What `tp attach` says about each r_* function: the same, with each
/// address named as an offset in the function (the prologues are hand-written).
const ATTACH_REFUSALS: &[(&str, &str)] = &[
    ("r_too_short", "too short (3 bytes, a probe needs 5)"),
    ("r_int3", "`int3` at `r_int3` cannot run out of place"),
    ("r_ud2", "`ud2` at `r_ud2`"),
    ("r_int80", "`int` at `r_int80`"),
    ("r_call_first", "`call` at `r_call_first` is inside"),
    ("r_syscall_first", "`syscall` at `r_syscall_first`"),
    ("r_branch_into", "branch into window from `r_branch_into+0x8`"),
    ("r_indirect", "indirect jump at `r_indirect+0x13`"),
    ("r_undecodable", "undecodable instruction at `r_undecodable+0x6`"),
    ("r_past_end", "the instruction at `r_past_end+0x1` passes the function's end"),
    ("r_outer", "function `r_inner` enters the window at `r_outer+0x2`"),
    ("r_cold", "a jump from outside the function enters the window at `r_cold+0x2`"),
    ("r_landing_pad", "exception landing pad at `r_landing_pad+0x2`"),
];

#[test]
fn every_rewrite_counts_exactly_and_computes_the_same() {
    let mut t = Target::start("prologues");
    let pid = t.pid.to_string();
    let names: Vec<String> = REWRITES.iter().map(|n| format!("pr_{n}")).collect();
    let mut args = vec!["-p", pid.as_str(), "--json"];
    for n in &names {
        args.extend(["-f", n.as_str()]);
    }
    let session = Session::start(&args);
    let mut own = std::collections::BTreeMap::new();
    for (i, n) in REWRITES.iter().enumerate() {
        // Distinct counts, so a hit counted on the wrong probe shows.
        let calls = if *n == "syscall" { 2_000 } else { 20_000 + i as u64 };
        let mut hits = t.call(n, calls, 1);
        if *n == "self" {
            // Each odd x calls back through the address pr_self computed.
            hits += calls.div_ceil(2);
        }
        own.insert(format!("pr_{n}"), hits);
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_eq!(hits_from_json(&stdout), own, "tp's counts vs the target's own");
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_code_is_original(&t, &refs);
    assert!(!has_region(t.pid));
    assert!(t.quit().success(), "a checksum failed after detach");
}

#[test]
fn every_rewrite_times_every_call_at_its_exits() {
    // Each function's calls end at its exits, each with a window of its own
    // (its padding, its epilogue, a tail call) or in the entry's (a short
    // function); pr_shared_ret's first return, a branch target with code
    // right after it, has none: its calls are timed through the return
    // address. Every call is timed, and every result is the reference's.
    let mut t = Target::start("prologues");
    let pid = t.pid.to_string();
    let names: Vec<String> = REWRITES.iter().map(|n| format!("pr_{n}")).collect();
    let mut args = vec!["-p", pid.as_str(), "--json", "--ret", "-q"];
    for n in &names {
        args.extend(["-f", n.as_str()]);
    }
    let session = Session::start(&args);
    let mut own = std::collections::BTreeMap::new();
    for (i, n) in REWRITES.iter().enumerate() {
        let calls = if *n == "syscall" { 500 } else { 2_000 + i as u64 };
        let mut hits = t.call(n, calls, 1);
        if *n == "self" {
            hits += calls.div_ceil(2);
        }
        own.insert(format!("pr_{n}"), hits);
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(
        stderr.contains("tp: 1 function time their calls through the return address")
            && stderr.contains("`pr_shared_ret`"),
        "{stderr}"
    );
    let summary = one_process(&stdout);
    for p in summary["probes"].as_array().unwrap() {
        let func = p["func"].as_str().unwrap();
        assert_eq!((p["hits"].as_u64(), p["timed"].as_u64()), (Some(own[func]), Some(own[func])), "{p}");
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_code_is_original(&t, &refs);
    assert!(!has_region(t.pid));
    assert!(t.quit().success(), "a checksum failed after detach");
}

#[test]
fn list_probes_names_every_refusal() {
    let path = target_path("prologues");
    let args = ["list-probes", path.to_str().unwrap(), "--json"];
    let stdout = expect_success(&args, &tp(&args));
    let objs: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let find = |name: &str| objs.iter().find(|o| o["func"] == name).unwrap_or_else(|| panic!("no {name}"));
    for n in REWRITES {
        let o = find(&format!("pr_{n}"));
        assert_eq!(o["probeable"], true, "{o}");
        assert!(o["reason"].is_null(), "{o}");
    }
    for (name, why) in REFUSALS {
        let o = find(name);
        assert_eq!(o["probeable"], false, "{o}");
        let reason = o["reason"].as_str().unwrap();
        assert!(reason.contains(why), "{name}: {reason:?} should contain {why:?}");
        assert_eq!(o["module"], "prologues");
    }
}

#[test]
fn attach_refuses_each_unsafe_prologue_and_touches_nothing() {
    let mut t = Target::start("prologues");
    let pid = t.pid.to_string();
    for (name, why) in ATTACH_REFUSALS {
        let line = expect_error(&["attach", "-p", &pid, "-f", name], why);
        assert!(line.contains(&format!("cannot probe `{name}`")), "{line}");
    }
    // Where a window further in can be probed, the refusal names it.
    let line = expect_error(&["attach", "-p", &pid, "-f", "r_branch_into"], "branch into window");
    assert!(
        line.ends_with("; `r_branch_into+0x1` can be probed instead (it counts each time a call reaches it)"),
        "{line}"
    );
    // A refusal among good functions refuses the whole attach, before anything is touched.
    expect_error(&["attach", "-p", &pid, "-f", "pr_push", "-f", "r_int3"], "`int3` at `r_int3`");
    assert!(!has_region(t.pid), "nothing may be injected when a probe is refused");
    let all: Vec<&str> = REFUSALS.iter().map(|(n, _)| *n).collect();
    assert_code_is_original(&t, &all);
    assert_code_is_original(&t, &["pr_push"]);
    assert_eq!(t.call("push", 100, 1), 100);
    assert!(t.quit().success());
}
