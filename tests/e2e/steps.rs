//! `--steps`: a call stepped instruction by instruction with ptrace, from
//! its function's first instruction to its return, the functions it calls
//! included (targets/steps.c). The instruction count of the hand-written
//! loop is the one the program states; nested calls show with their lines;
//! a call that blocks in a syscall, reaches the limit, or outlives tp (Ctrl-C,
//! kill -9) runs on free and the program's results hold; the other threads
//! run all along; the code is byte-identical after.

use serde_json::Value;

use crate::util::*;

/// The line of targets/steps.c holding `marker`.
fn line_of(marker: &str) -> String {
    // Built in: the AArch64 tests run in a VM without the sources.
    let src = include_str!("../../targets/steps.c");
    let n = src.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker} in steps.c"));
    format!("steps.c:{}", n + 1)
}

/// How often the trace `s` executed the instructions at `at` (`func+0x…`).
fn executed(s: &Value, at: &str) -> u64 {
    s["executed"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["at"].as_str().unwrap().starts_with(at))
        .map(|e| e["count"].as_u64().unwrap())
        .sum()
}

#[test]
fn a_stepped_loop_executes_exactly_the_instructions_the_program_states() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "steploop", "--steps", "--json"]);
    let done = t.ask("loop 1000", "done loop");
    assert_eq!(field(&done, "ret"), 1000, "{done}");
    session.err.wait_for("tp: stepped a call of steploop");
    // The second call runs free: one call was asked for.
    assert_eq!(field(&t.ask("loop 5", "done loop"), "ret"), 5);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let steps = steps_of(&stdout);
    assert_eq!(steps.len(), 1, "{steps:?}");
    let s = &steps[0];
    assert_eq!(s["func"], "steploop");
    assert_eq!(s["end"], "returned", "{s}");
    assert_eq!(s["instructions"].as_u64(), Some(field(&done, "insns")), "{s}");
    // The loop's two instructions, a thousand times each.
    let loop_body: Vec<u64> =
        s["executed"].as_array().unwrap().iter().map(|e| e["count"].as_u64().unwrap()).filter(|&n| n == 1000).collect();
    assert_eq!(loop_body.len(), 2, "{s}");
    assert_eq!(executed(s, "steploop+0x0 "), 1, "the first instruction, run as the detour's copy, counts once: {s}");
    assert_eq!(hits_from_json(&stdout)["steploop"], 2);
    assert_code_is_original(&t, &["steploop"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn calls_a_stepped_call_makes_are_stepped_with_their_lines() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "chain", "--steps", "--json"]);
    let done = t.ask("chain 3", "done chain");
    assert!(!done.contains("BAD"), "{done}");
    session.err.wait_for("tp: stepped a call of chain");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let steps = steps_of(&stdout);
    let s = &steps[0];
    assert_eq!(s["end"], "returned", "{s}");
    // leaf ran three times: each of its instructions three times.
    assert_eq!(executed(s, "leaf+0x0 "), 3, "{s}");
    assert_eq!(executed(s, "chain+0x0 "), 1, "{s}");
    let lines: Vec<&str> = s["lines"].as_array().unwrap().iter().map(|l| l["line"].as_str().unwrap()).collect();
    for marker in ["int x = i * 3;", "sum += leaf(i);", "return sum;"] {
        assert!(lines.contains(&line_of(marker).as_str()), "{marker} ({}) in {lines:?}", line_of(marker));
    }
    let in_lines: u64 = s["lines"].as_array().unwrap().iter().map(|l| l["instructions"].as_u64().unwrap()).sum();
    assert_eq!(in_lines, s["instructions"].as_u64().unwrap(), "every instruction of chain and leaf has a line: {s}");
    assert!(s["path"].as_str().unwrap().contains(&line_of("int x = i * 3;")), "{s}");
    assert_code_is_original(&t, &["chain"]);
    assert!(t.quit().success());
}

#[test]
fn a_call_that_blocks_in_a_syscall_is_let_go_there() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "napper", "--steps", "--json"]);
    let before = field(&t.ask("ticks", "done ticks"), "ticks");
    t.ask("nap 400", "done nap");
    session.err.wait_for("tp: stepped a call of napper");
    let after = field(&t.ask("ticks", "done ticks"), "ticks");
    assert!(after > before + 50, "the ticker ran on: {before} then {after}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    // ARMv8.0's atomics (ldaxr/stlxr in glibc's cancellation check before
    // the syscall) cannot be stepped: the thread is let go there.
    let ll_sc = std::env::var("TP_TEST_ATOMICS").as_deref() == Ok("exclusive");
    let end = s["end"].as_str().unwrap();
    assert!(if ll_sc { end == "stall" } else { end.starts_with("syscall ") }, "{s}");
    assert!(executed(s, "napper+0x0 ") == 1, "{s}");
    assert_code_is_original(&t, &["napper"]);
    assert!(t.quit().success(), "the program survived its stepped syscall");
}

#[test]
fn the_limit_lets_the_call_run_free_and_other_threads_run_all_along() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    // An emulated CPU (the arm64 VM) steps a hundred times slower.
    let limit = if std::env::var_os("TP_TEST_CPU").is_some() { 2_000 } else { 20_000 };
    let mut session =
        Session::start(&["-p", &pid, "-f", "steploop", "--steps", "--step-limit", &limit.to_string(), "--json"]);
    let before = field(&t.ask("ticks", "done ticks"), "ticks");
    let done = t.ask("loop 1000000", "done loop");
    assert_eq!(field(&done, "ret"), 1_000_000);
    session.err.wait_for("tp: stepped a call of steploop");
    let after = field(&t.ask("ticks", "done ticks"), "ticks");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    assert_eq!((s["end"].as_str(), s["instructions"].as_u64()), (Some("limit"), Some(limit)), "{s}");
    // The ticker sleeps 1 ms a round: while the call was stepped it ran a
    // round for every few ms, never stopped for long.
    let stepped_ms = s["us"].as_u64().unwrap() / 1000;
    assert!(
        after - before >= stepped_ms / 10,
        "{} rounds of the ticker in {stepped_ms} ms of stepping",
        after - before
    );
    assert_code_is_original(&t, &["steploop"]);
    assert!(t.quit().success());
}

#[test]
fn a_stepped_call_outlives_tp_interrupted_or_killed() {
    for kill in [false, true] {
        let mut t = Target::start("steps");
        let pid = t.pid.to_string();
        let mut session = Session::start(&["-p", &pid, "-f", "steploop", "--steps", "--json"]);
        t.send(b"loop 2000000\n");
        session.err.wait_for("tp: process");
        std::thread::sleep(std::time::Duration::from_millis(300));
        if kill {
            session.kill();
            // The probes stay behind a killed tp: a detach takes them out.
            let out = tp(&["detach", "-p", &pid]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        } else {
            let (status, stdout, stderr) = session.interrupt();
            assert!(status.success(), "{stderr}");
            let s = &steps_of(&stdout)[0];
            assert_eq!(s["end"], "stopped", "{s}");
        }
        let done = t.out.wait_for("done loop");
        assert_eq!(field(&done, "ret"), 2_000_000, "killed tp: {kill}");
        assert_code_is_original(&t, &["steploop"]);
        assert!(t.quit().success(), "the program outlived tp (killed: {kill})");
    }
}

#[test]
fn folded_output_weighs_each_call_path_by_its_instructions() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "chain", "--steps", "--folded"]);
    t.ask("chain 4", "done chain");
    let said = session.err.wait_for("tp: stepped a call of chain");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let instructions: u64 =
        said.rsplit(": ").next().unwrap().trim_end_matches(" instructions").replace(',', "").parse().unwrap();
    let lines: Vec<(&str, u64)> = stdout
        .lines()
        .map(|l| {
            let (path, n) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not a folded line: {l:?}"));
            (path, n.parse().unwrap())
        })
        .collect();
    assert_eq!(lines.iter().map(|(_, n)| n).sum::<u64>(), instructions, "{stdout}");
    assert_eq!(lines.iter().map(|(p, _)| *p).collect::<Vec<_>>(), ["chain", "chain;leaf"], "{stdout}");
    // leaf's instructions, four calls' worth.
    assert_eq!(lines[1].1 % 4, 0, "{stdout}");
    assert_code_is_original(&t, &["chain"]);
    assert!(t.quit().success());
}

/// The `unstepped` entries of a stepped call: (function, calls).
fn unstepped(s: &Value) -> Vec<(String, u64)> {
    s["unstepped"]
        .as_array()
        .unwrap_or_else(|| panic!("no unstepped in {s}"))
        .iter()
        .map(|u| (u["func"].as_str().unwrap().to_string(), u["calls"].as_u64().unwrap()))
        .collect()
}

#[test]
fn a_depth_bound_steps_the_callers_own_instructions_and_lets_its_calls_run_free() {
    // (--step-depth, what the call records): 0 the caller's own, 1 with
    // its calls of stepleaf, none given: the same.
    for depth in [Some("0"), Some("1"), None] {
        let mut t = Target::start("steps");
        let pid = t.pid.to_string();
        let mut args = vec!["-p", &pid, "-f", "stepcaller", "--steps", "--json"];
        if let Some(d) = depth {
            args.extend(["--step-depth", d]);
        }
        let mut session = Session::start(&args);
        let done = t.ask("caller 40", "done caller");
        assert_eq!(field(&done, "ret"), 40, "{done}");
        session.err.wait_for("tp: stepped a call of stepcaller");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        let s = &steps_of(&stdout)[0];
        assert_eq!(s["end"], "returned", "{s}");
        let want = if depth == Some("0") { field(&done, "own") } else { field(&done, "all") };
        assert_eq!(s["instructions"].as_u64(), Some(want), "--step-depth {depth:?}: {s}");
        match depth {
            Some("0") => {
                assert_eq!(unstepped(s), [("stepleaf".to_string(), 40)], "{s}");
                assert_eq!(executed(s, "stepleaf"), 0, "{s}");
            }
            _ => {
                assert_eq!(unstepped(s), [], "{s}");
                assert_eq!(executed(s, "stepleaf+0x0 "), 40, "{s}");
            }
        }
        assert_eq!(s["step_depth"].as_u64(), depth.map(|d| d.parse().unwrap()), "{s}");
        assert_eq!(hits_from_json(&stdout)["stepcaller"], 1);
        assert_code_is_original(&t, &["stepcaller"]);
        assert!(t.quit().success());
    }
}

#[test]
fn a_recursive_call_run_free_passes_its_return_address_in_deeper_frames() {
    // steprec(6) stepped two frames deep: the call from the second frame
    // runs free through five more frames, each returning to the address
    // where the second frame's call returns, deeper; only the shallowest
    // return ends the free run.
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "steprec", "--steps", "--step-depth", "1", "--json"]);
    let done = t.ask("rec 6 1", "done rec");
    assert_eq!(field(&done, "ret"), 6, "{done}");
    session.err.wait_for("tp: stepped a call of steprec");
    // The breakpoint is gone: the same calls run on, unstepped, many times.
    for _ in 0..3 {
        assert_eq!(field(&t.ask("rec 6 -1", "done rec"), "ret"), 6);
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    // Without ARMv8.1's atomics the count in the probe's detour (the second
    // frame's call of steprec, stepped) is a load/store-exclusive loop,
    // which single steps cannot pass: the thread is let go there.
    match std::env::var("TP_TEST_ATOMICS").as_deref() == Ok("exclusive") {
        true => assert_eq!(s["end"], "stall", "{s}"),
        false => {
            assert_eq!(s["end"], "returned", "{s}");
            assert_eq!(s["instructions"].as_u64(), Some(field(&done, "insns")), "{s}");
            assert_eq!(unstepped(s), [("steprec".to_string(), 1)], "{s}");
        }
    }
    assert_eq!(hits_from_json(&stdout)["steprec"], 4 * 7);
    assert_code_is_original(&t, &["steprec"]);
    assert!(t.quit().success());
}

#[test]
fn signals_during_a_stepped_call_run_their_handler_free_and_count_nothing_twice() {
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    // An emulated CPU (the arm64 VM) steps a hundred times slower: fewer
    // steps, and fewer signals (one each millisecond, about a step's time
    // there, would stop every step before its instruction ran).
    let (n, every_us) = if std::env::var_os("TP_TEST_CPU").is_some() { ("1000", 30_000) } else { ("20000", 1_000) };
    let mut session = Session::start(&["-p", &pid, "-f", "steploop", "--steps", "--json"]);
    let done = t.ask(&format!("sigloop {n} {every_us}"), "done sigloop");
    assert_eq!(field(&done, "ret"), n.parse::<u64>().unwrap(), "{done}");
    session.err.wait_for("tp: stepped a call of steploop");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let s = &steps_of(&stdout)[0];
    assert_eq!(s["end"], "returned", "{s}");
    // Exactly the loop's instructions: none twice, none of the handler's.
    assert_eq!(s["instructions"].as_u64(), Some(field(&done, "insns")), "{s}");
    let signals = s["signals"].as_u64().unwrap();
    assert!(signals >= 1 && signals <= field(&done, "handled"), "{signals} signals in the call: {done}");
    assert_code_is_original(&t, &["steploop"]);
    assert!(t.quit().success());
}

#[test]
fn a_callee_running_free_outlives_tp_interrupted_or_killed_without_its_breakpoint() {
    for kill in [false, true] {
        let mut t = Target::start("steps");
        let pid = t.pid.to_string();
        // napper's call of usleep runs free (depth 0) for two seconds, a
        // hardware breakpoint where it returns.
        let mut session = Session::start(&["-p", &pid, "-f", "napper", "--steps", "--step-depth", "0", "--json"]);
        t.send(b"nap 2000\n");
        session.err.wait_for("tp: process");
        std::thread::sleep(std::time::Duration::from_millis(500));
        if kill {
            session.kill();
            let out = tp(&["detach", "-p", &pid]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        } else {
            let (status, stdout, stderr) = session.interrupt();
            assert!(status.success(), "{stderr}");
            let s = &steps_of(&stdout)[0];
            assert_eq!(s["end"], "stopped", "{s}");
        }
        t.out.wait_for("done nap 2000");
        // The return address again, untraced: a breakpoint left there would
        // kill the program with SIGTRAP.
        for _ in 0..3 {
            t.ask("nap 1", "done nap 1");
        }
        assert_code_is_original(&t, &["napper"]);
        assert!(t.quit().success(), "the program outlived tp (killed: {kill})");
    }
}
