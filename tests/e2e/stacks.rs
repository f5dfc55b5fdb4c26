//! What a call records beyond its arguments: its stack (`--stack`, by frame
//! pointers in the target and by a copy unwound in tp), predicates that
//! select calls in the target (`--if`), counts by an argument's value
//! (`--by`) and durations kept in the target (`--ret -q`), each checked
//! against the `stacks` target's own count of the calls it made.

use serde_json::Value;

use crate::util::*;

/// Runs `cmds` against `target` under `tp attach -p PID ARGS`; returns the
/// target's answers and tp's (stdout, stderr), after checking both exit 0.
fn session(target: &str, args: &[&str], cmds: &[(&str, &str)]) -> (Vec<String>, String, String) {
    let mut t = Target::start(target);
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str()];
    full.extend_from_slice(args);
    let s = Session::start(&full);
    let answers = cmds.iter().map(|(cmd, done)| t.ask(cmd, done)).collect();
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(t.quit().success(), "the target must exit 0");
    (answers, stdout, stderr)
}

/// The JSON summary of the one process among tp's stdout lines.
fn summary(stdout: &str) -> Value {
    one_process(stdout)
}

/// The function names of a stack's frames (`name+0x.. (module)`), and its count.
fn stacks_of(s: &Value, function: &str) -> Vec<(Vec<String>, u64)> {
    let p = s["stacks"].as_array().unwrap().iter().find(|p| p["func"] == function).expect("the function's stacks");
    p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| {
            let names = st["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().split(['+', ' ']).next().unwrap().to_string())
                .collect();
            (names, st["hits"].as_u64().unwrap())
        })
        .collect()
}

/// The calls of stacks that begin with `prefix` (the function, then its callers).
fn calls_with_prefix(stacks: &[(Vec<String>, u64)], prefix: &[&str]) -> u64 {
    stacks
        .iter()
        .filter(|(names, _)| names.len() >= prefix.len() && names[..prefix.len()] == *prefix)
        .map(|s| s.1)
        .sum()
}

/// The known call paths of `paths N`, exactly as often as the target made
/// them: both ways of taking the stack.
fn known_paths(target: &str, how: &str) {
    // Room for every call's stack: a copy of 4 KiB takes 75 of the ring's events.
    let (answers, stdout, _) =
        session(target, &["-f", "leaf", how, "-q", "--json", "--ring-size", "262144"], &[("paths 300", "done paths")]);
    assert_eq!(answers[0], "done paths 300 a=300 b=600");
    let s = summary(&stdout);
    assert_eq!(s["lost_events"], 0, "{s}");
    assert_eq!(s["probes"][0]["hits"], 900);
    let stacks = stacks_of(&s, "leaf");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "a_mid", "path_a", "run_paths", "main"]), 300, "{stacks:?}");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "path_b", "run_paths", "main"]), 600, "{stacks:?}");
    // path_b is called from two places in run_paths: two stacks of 300 each.
    let b: Vec<u64> = stacks.iter().filter(|(n, _)| n.get(1).is_some_and(|f| f == "path_b")).map(|s| s.1).collect();
    assert_eq!(b, [300, 300], "{stacks:?}");
    assert_eq!(stacks.iter().map(|s| s.1).sum::<u64>(), 900);
}

#[test]
fn frame_pointer_walks_give_the_known_call_paths() {
    known_paths("stacks", "--stack");
}

#[test]
fn unwinding_a_copy_gives_the_known_call_paths_without_frame_pointers() {
    known_paths("stacks-nofp", "--stack=dwarf");
}

/// Frame pointers on code built without them end the walks early: tp says
/// so and offers --stack=dwarf; where the walks reach a thread's first
/// function it says nothing. (x86-64 only: in the AArch64 stage's VM the
/// hint was not given for `stacks-nofp`, whose walks there did not end
/// early on most stacks.)
#[cfg(target_arch = "x86_64")]
#[test]
fn walks_that_end_early_suggest_unwinding_a_copy() {
    let cmds = [("paths 30", "done paths")];
    let (_, _, stderr) = session("stacks-nofp", &["-f", "leaf", "--stack", "-q"], &cmds);
    let hint = stderr.lines().find(|l| l.contains("--stack=dwarf")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(hint.starts_with("tp: 90 of the 90 stacks of `leaf` end before a thread's first function (at `"), "{hint}");
    for (target, how) in [("stacks", "--stack"), ("stacks-nofp", "--stack=dwarf")] {
        let (_, _, stderr) = session(target, &["-f", "leaf", how, "-q"], &cmds);
        assert!(!stderr.contains("--stack=dwarf unwinds"), "{target} {how}: {stderr}");
    }
}

/// Stacks 10 and 30 calls deep, walked whole, and cut where asked.
#[test]
fn deep_stacks_have_every_frame_up_to_the_depth_asked() {
    for (target, how) in [("stacks", "--stack"), ("stacks-nofp", "--stack=dwarf")] {
        let (_, stdout, _) = session(
            target,
            &["-f", "leaf", how, "--stack-depth", "40", "-q", "--json", "--ring-size", "65536"],
            &[("deep 10 50", "done deep"), ("deep 30 50", "done deep")],
        );
        let stacks = stacks_of(&summary(&stdout), "leaf");
        for depth in [10usize, 30] {
            let mut want = vec!["leaf"];
            want.extend(std::iter::repeat_n("descend", depth + 1));
            want.extend(["run_deep", "main"]);
            assert_eq!(calls_with_prefix(&stacks, &want), 50, "{target} depth {depth}: {stacks:?}");
        }
        // Cut at 5 frames: the function and 5 callers.
        let (_, stdout, _) =
            session(target, &["-f", "leaf", how, "--stack-depth", "5", "-q", "--json"], &[("deep 30 20", "done deep")]);
        let stacks = stacks_of(&summary(&stdout), "leaf");
        assert_eq!(
            stacks,
            [(vec!["leaf".to_string()].into_iter().chain(vec!["descend".to_string(); 5]).collect(), 20)]
        );
    }
}

#[test]
fn folded_lines_and_the_flame_graph_show_the_paths() {
    let dir = std::env::temp_dir().join(format!("tp-flame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("flame.svg");
    let (_, stdout, _) = session(
        "stacks",
        &["-f", "leaf", "--stack", "--folded", "--ring-size", "65536"],
        &[("paths 100", "done paths")],
    );
    // Folded lines are the whole output: flamegraph.pl reads nothing else.
    let folded: Vec<&str> = stdout.lines().collect();
    assert_eq!(folded.len(), 3, "{stdout}");
    assert!(folded.iter().all(|l| l.contains(";leaf ")), "{stdout}");
    assert_eq!(folded.iter().filter(|l| l.ends_with("main;run_paths;path_a;a_mid;leaf 100")).count(), 1, "{stdout}");
    assert_eq!(folded.iter().filter(|l| l.ends_with("main;run_paths;path_b;leaf 100")).count(), 2, "{stdout}");
    let (_, stdout, _) = session(
        "stacks",
        &["-f", "leaf", "--stack", "--ring-size", "65536", "-o", svg.to_str().unwrap()],
        &[("paths 100", "done paths")],
    );
    assert_eq!(stdout, "", "-o takes the results");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("<svg"), "not an SVG");
    for name in ["a_mid", "path_a", "path_b", "run_paths", "main"] {
        assert!(svg.contains(name), "the flame graph has no {name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stacks_are_in_the_chrome_trace() {
    let dir = std::env::temp_dir().join(format!("tp-chrome-stack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.json");
    // The JSON Lines carry each call's stack.
    let (_, stdout, _) =
        session("stacks", &["-f", "leaf", "--stack", "--json", "--ring-size", "65536"], &[("paths 10", "done paths")]);
    let lines: Vec<Value> = json_events(&stdout).into_iter().filter(|e| e["type"] == "entry").collect();
    assert_eq!(lines.len(), 30);
    assert!(lines.iter().all(|e| e["stack"][0].as_str().unwrap().starts_with("leaf+0x0 ")), "{lines:?}");
    // So does the Chrome trace, named by --format (the file's name says JSON).
    let args = ["-f", "leaf", "--stack", "--format", "chrome", "--ring-size", "65536", "-o", trace.to_str().unwrap()];
    session("stacks", &args, &[("paths 10", "done paths")]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events: Vec<&Value> =
        v["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "leaf" && e["ph"] == "i").collect();
    assert_eq!(events.len(), 30);
    for e in events {
        let stack: Vec<&str> = e["args"]["stack"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        assert!(stack[0].starts_with("leaf+0x0 "), "{stack:?}");
        assert!(stack[1].starts_with("a_mid+") || stack[1].starts_with("path_b+"), "{stack:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Stack probes that also time their calls enter through `tp_entry_ext`
/// and return through the plain trampoline: its fast path when the call is
/// the thread's only timed one (`leaf` from `path_b`), `tp_exit` when it is
/// nested (`leaf` under `a_mid` under `path_a`). Every call's exit is there
/// with the function's own return value, and the stacks are the known
/// paths, with the return addresses the probes replaced given back.
#[test]
fn stack_probes_that_time_their_calls_record_every_exit() {
    let (answers, stdout, _) = session(
        "stacks",
        &["-f", "leaf", "-f", "a_mid", "-f", "path_a", "--stack", "--ret", "--json", "--ring-size", "262144"],
        &[("paths 300", "done paths")],
    );
    assert_eq!(answers[0], "done paths 300 a=300 b=600");
    let exits: Vec<Value> =
        stdout.lines().filter(|l| l.contains("\"type\":\"exit\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    // path_a(1) = a_mid(1) + 1 = leaf(1) + 2 = 5; path_b(2) calls leaf(2) = 5.
    for (func, rets) in [("leaf", vec![(3, 300), (5, 600)]), ("a_mid", vec![(4, 300)]), ("path_a", vec![(5, 300)])] {
        let mut got: std::collections::BTreeMap<i64, usize> = Default::default();
        for e in exits.iter().filter(|e| e["func"] == func) {
            *got.entry(e["ret"].as_i64().unwrap_or_else(|| panic!("{e}"))).or_default() += 1;
        }
        assert_eq!(got.into_iter().collect::<Vec<_>>(), rets, "{func}");
    }
    let s = summary(&stdout);
    assert_eq!(s["lost_events"], 0, "{s}");
    let stacks = stacks_of(&s, "leaf");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "a_mid", "path_a", "run_paths", "main"]), 300, "{stacks:?}");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "path_b", "run_paths", "main"]), 600, "{stacks:?}");
}

#[test]
fn predicates_select_exactly_the_calls_that_satisfy_them() {
    // values 200 calls leaf(i % 10): n < 3 holds for 60 of them.
    let (_, stdout, _) =
        session("stacks", &["-f", "leaf", "--if", "n < 3", "--json"], &[("values 200", "done values")]);
    let entries: Vec<Value> =
        stdout.lines().filter(|l| l.contains("\"type\":\"entry\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(entries.len(), 60);
    assert!(entries.iter().all(|e| e["args"]["n"].as_i64().unwrap() < 3), "{entries:?}");
    // The hits are the calls that passed, every call beside them.
    let s = summary(&stdout);
    let p = &s["probes"][0];
    assert_eq!((p["hits"].as_u64(), p["hits_unfiltered"].as_u64()), (Some(60), Some(200)), "{s}");
    assert_eq!(s["lost_events"].as_u64(), Some(0), "{s}");
    // On the return value: leaf returns 2n + 1, above 10 for n >= 5; and
    // both at once: n != 7 at entry, ret > 10 at exit.
    // Bitwise: odd n; n of 6 and 7; 2n + 1 with bit 2 set (n of 2, 3, 6, 7);
    // n | 8 == 8 (n of 0 and 8).
    let bitwise = [("n & 1", 100), ("n & 6 == 6", 40), ("ret & 4", 80), ("(n | 8) ^ 1 == 9", 40)];
    let plain = [("ret > 10", 100), ("n != 7 && ret > 10", 80), ("arg0 == 4 || arg0 == 9", 40)];
    for (expr, exits) in plain.into_iter().chain(bitwise) {
        let (_, stdout, _) =
            session("stacks", &["-f", "leaf", "--ret", "--if", expr, "--json"], &[("values 200", "done values")]);
        let n = stdout.lines().filter(|l| l.contains("\"type\":\"exit\"")).count();
        assert_eq!(n, exits, "{expr}: {stdout}");
        let p = &summary(&stdout)["probes"][0];
        let counts = (p["hits"].as_u64(), p["hits_unfiltered"].as_u64(), p["timed"].as_u64());
        assert_eq!(counts, (Some(exits as u64), Some(200), Some(exits as u64)), "{expr}: {p}");
    }
    // Kept in the target (--ret -q), and as the text shows it: HITS, then UNFILTERED.
    let (_, stdout, _) =
        session("stacks", &["-f", "leaf", "--ret", "-q", "--if", "ret > 10"], &[("values 200", "done values")]);
    let head = stdout.lines().find(|l| l.starts_with("FUNCTION")).unwrap_or_else(|| panic!("{stdout}"));
    let row = stdout.lines().find(|l| l.starts_with("leaf ")).unwrap_or_else(|| panic!("{stdout}"));
    let cols: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(cols[..4], ["FUNCTION", "HITS", "UNFILTERED", "TIMED"], "{stdout}");
    assert_eq!(row.split_whitespace().take(4).collect::<Vec<_>>(), ["leaf", "100", "200", "100"], "{stdout}");
}

#[test]
fn predicates_that_cannot_be_compiled_are_one_line_and_touch_nothing() {
    let t = Target::start("stacks");
    let pid = t.pid.to_string();
    for (expr, why) in [
        ("m == 1", "has no parameter `m` (it has: n)"),
        ("n ==", "ends early"),
        ("n == 1 || ret == 3", "can name only `ret`"),
        ("n == 99999999999", "out of the range"),
        ("ret > 1", "needs --ret"),
    ] {
        let ret = if expr.contains("||") { "--ret" } else { "--args" };
        let line = expect_error(&["attach", "-p", &pid, "-f", "leaf", ret, "--if", expr], why);
        assert!(line.contains("--if"), "{line}");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("tp-data"), "nothing was injected");
    assert!(t.quit().success());
}

#[test]
fn counts_by_argument_value_are_the_targets() {
    let (_, stdout, _) = session("stacks", &["-f", "leaf", "--by", "n", "--json"], &[("values 1000", "done values")]);
    let s = summary(&stdout);
    let by = &s["by"][0];
    assert_eq!((by["func"].as_str(), by["arg"].as_str(), by["overflow"].as_u64()), (Some("leaf"), Some("n"), Some(0)));
    let values: Vec<(i64, u64)> = by["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["value"].as_i64().unwrap(), v["hits"].as_u64().unwrap()))
        .collect();
    assert_eq!(values, (0..10).map(|v| (v, 100)).collect::<Vec<_>>());
}

/// The sleeps of the histogram test: 40 short and 15 long ones, each about
/// halfway between two powers of two of ns once the kernel's overshoot is
/// added. The arm64 test VM (an emulated CPU, its timers late by up to a
/// millisecond under load) sleeps 20 times longer, so the overshoot is a
/// small part of each sleep.
#[cfg(target_arch = "x86_64")]
const NAPS: [(&str, &str); 2] = [("naps 1200 40", "done naps"), ("naps 6000 15", "done naps")];
#[cfg(target_arch = "aarch64")]
const NAPS: [(&str, &str); 2] = [("naps 24000 40", "done naps"), ("naps 96000 15", "done naps")];

/// `--ret -q` keeps durations in the target: a ring of 4 events loses
/// none of 10,000 calls, and the histogram is the target's own.
#[test]
fn durations_kept_in_the_target_lose_nothing_and_match_the_targets_histogram() {
    let (_, stdout, _) = session(
        "stacks",
        &["-f", "leaf", "--ret", "-q", "--json", "--ring-size", "4"],
        &[("values 10000", "done values")],
    );
    let s = summary(&stdout);
    let p = &s["probes"][0];
    assert_eq!(
        (p["hits"].as_u64(), p["timed"].as_u64(), s["lost_events"].as_u64()),
        (Some(10000), Some(10000), Some(0))
    );

    // The target times each call too. tp leaves its own work out and keeps
    // durations in eighths of a power of two of timer ticks, so a call
    // within 8% of a power of two of ns may fall on either side of it for
    // tp; every other call must be on the target's side. So for every power
    // of two B, tp's calls below B are at least the target's calls below
    // B - 7.5% and at most its calls below B + 8%.
    let (answers, stdout, _) = session("stacks", &["-f", "nap", "--ret", "-q", "--json"], &NAPS);
    let own: Vec<f64> = answers
        .iter()
        .flat_map(|a| a.split("ns=").nth(1).unwrap().split(',').map(|d| d.parse::<f64>().unwrap()))
        .collect();
    assert_eq!(own.len(), 55, "{answers:?}");
    let p = &summary(&stdout)["probes"][0];
    assert_eq!(p["timed"].as_u64(), Some(55));
    let tps: Vec<(u64, u64)> =
        p["histogram"].as_array().unwrap().iter().map(|b| (b[0].as_u64().unwrap(), b[2].as_u64().unwrap())).collect();
    assert_eq!(tps.iter().map(|&(_, n)| n).sum::<u64>(), 55, "{tps:?}");
    let mut sides_checked = 0;
    for k in 1..48 {
        let b = (1u64 << k) as f64;
        let tp_below: u64 = tps.iter().filter(|&&(lower, _)| (lower as f64) < b).map(|&(_, n)| n).sum();
        // The first call also pays for the runtime's first steps on the
        // thread (taking its state, with system calls: milliseconds on an
        // emulated CPU), which the target's clock counts and tp's duration,
        // timed from the end of tp's own work, leaves out: it may be below.
        let surely = own.iter().filter(|&&d| d < b * 0.925).count() as u64;
        let maybe = own[1..].iter().filter(|&&d| d < b * 1.08).count() as u64 + 1;
        assert!(
            (surely..=maybe).contains(&tp_below),
            "below 2^{k} ns tp has {tp_below} calls, the target {surely}..={maybe}: tp {tps:?}, target {own:?}"
        );
        sides_checked += (surely == maybe && surely > 0 && surely < 55) as u32;
    }
    // The sleeps are chosen halfway between powers of two: at least one
    // boundary splits the calls with none near it.
    assert!(sides_checked > 0, "every call was near a power of two: {own:?}");
}

/// Frame pointers a program without them leaves anywhere (misaligned, a
/// PROT_NONE page, records pointing there, to themselves, past the stack's
/// end): the walk reads only inside the thread's stack, so the target runs
/// on, every call counted and its caller named; threads other than the
/// main one are walked inside their own stacks.
#[test]
fn hostile_frame_pointers_never_fault_and_threads_are_walked() {
    let (answers, stdout, _) = session(
        "stacks",
        &["-f", "leaf", "--stack", "-q", "--json", "--ring-size", "65536"],
        &[("wild 100", "done wild"), ("threads 3 100", "done threads")],
    );
    assert_eq!(answers[0], "done wild 100 calls=800");
    let s = summary(&stdout);
    assert_eq!((s["probes"][0]["hits"].as_u64(), s["lost_events"].as_u64()), (Some(1700), Some(0)), "{s}");
    let stacks = stacks_of(&s, "leaf");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "call_with_fp"]), 800, "{stacks:?}");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "a_mid", "path_a", "run_paths", "thread_main"]), 300, "{stacks:?}");
    assert_eq!(calls_with_prefix(&stacks, &["leaf", "path_b", "run_paths", "thread_main"]), 600, "{stacks:?}");
}

/// A function inlined on the path is a frame of its own, from DWARF.
#[test]
fn inlined_functions_are_frames_of_their_own() {
    for (target, how) in [("stacks", "--stack"), ("stacks-nofp", "--stack=dwarf")] {
        let (_, stdout, _) = session(
            target,
            &["-f", "leaf", how, "-q", "--json", "--ring-size", "65536"],
            &[("inlined 50", "done inlined")],
        );
        let stacks = stacks_of(&summary(&stdout), "leaf");
        assert_eq!(
            calls_with_prefix(&stacks, &["leaf", "inner_helper", "run_inlined", "main"]),
            50,
            "{target}: {stacks:?}"
        );
        let line = stacks.iter().find(|(n, _)| n.len() > 1).map(|(n, _)| n.clone()).unwrap();
        assert_eq!(line[1], "inner_helper");
        let (_, stdout, _) = session(
            target,
            &["-f", "leaf", how, "--folded", "--ring-size", "65536"],
            &[("inlined 50", "done inlined")],
        );
        assert!(stdout.lines().any(|l| l.ends_with("main;run_inlined;inner_helper;leaf 50")), "{target}: {stdout}");
    }
}
