//! `--blocks`: a count-only probe at the start of each basic block of a
//! function (targets/blocks.c's `shape`, loops and branches at -O0), the
//! blocks without one counted from the flow, and each line's count: equal
//! to gcov's for a --coverage build of the same source and input, with the
//! program's results unchanged, its other threads running on, and the code
//! byte-identical after. `list-probes --blocks` says which blocks have a
//! probe and why the others have none, and no window spans the start of a
//! block it does not count.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::*;

/// True where a probe is longer than some blocks (x86-64's 5-byte jump;
/// AArch64's is one instruction).
#[cfg(target_arch = "x86_64")]
const SHORT_BLOCKS: bool = true;
#[cfg(not(target_arch = "x86_64"))]
const SHORT_BLOCKS: bool = false;

/// The line of targets/blocks.c holding `marker`.
fn line_of(marker: &str) -> u32 {
    // Built in: the AArch64 tests run in a VM without the sources.
    let src = include_str!("../../targets/blocks.c");
    let n = src.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker} in blocks.c"));
    n as u32 + 1
}

/// The `blocks` object of `shape` in the summary on `stdout`.
fn shape_blocks(stdout: &str) -> Value {
    let p = one_process(stdout);
    let all = p["blocks"].as_array().unwrap_or_else(|| panic!("no blocks in {p}"));
    all.iter().find(|b| b["func"] == "shape").unwrap_or_else(|| panic!("no shape in {p}")).clone()
}

/// Line -> count of a `blocks` object (every count known).
fn line_counts(blocks: &Value) -> BTreeMap<u32, u64> {
    blocks["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let count = l["count"].as_u64().unwrap_or_else(|| panic!("a line without its count: {l}"));
            (l["line"].as_u64().unwrap() as u32, count)
        })
        .collect()
}

/// What `shape(n)` does for the calls `run N T` makes: (calls, loop
/// iterations, iterations that xor, calls that return -acc).
fn model(n: u64, threads: u64) -> (u64, u64, u64, u64) {
    let (mut iters, mut xors, mut neg) = (0, 0, 0);
    for i in 0..n {
        let m = i % 23;
        iters += m;
        xors += (0..m).filter(|k| k % 3 != 0 && k % 5 != 0).count() as u64;
        neg += (m > 20) as u64;
    }
    (n * threads, iters * threads, xors * threads, neg * threads)
}

/// `tp attach --blocks -f shape` over `run N T` in the bundled target:
/// the summary's stdout, and the program's answers (sum and bad).
fn blocks_session(n: u64, threads: u64) -> (String, Target, String) {
    let mut t = Target::start("blocks");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--blocks", "-f", "shape", "--json"]);
    let before = field(&t.ask("ticks", "done ticks"), "ticks");
    let done = t.ask(&format!("run {n} {threads}"), "done run");
    assert_eq!(field(&done, "bad"), 0, "the probes changed what shape() computes: {done}");
    // The ticker thread ran on while the blocks were counted.
    wait_until("the ticker to tick", || field(&t.ask("ticks", "done ticks"), "ticks") > before + 5);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_code_is_original(&t, &["shape"]);
    assert!(!has_region(t.pid));
    (stdout, t, done)
}

#[test]
fn blocks_and_lines_are_counted_exactly_and_the_code_restored() {
    let (n, threads) = (2_300u64, 4u64);
    let (stdout, mut t, done) = blocks_session(n, threads);
    let blocks = shape_blocks(&stdout);
    let (calls, iters, xors, neg) = model(n, threads);
    // The entry block runs once per call; every block's count is known,
    // from its probe or from the flow.
    let all = blocks["blocks"].as_array().unwrap();
    assert!(all.len() >= 10, "{blocks}");
    assert_eq!(all[0]["offset"], 0);
    assert_eq!(all[0]["count"].as_u64(), Some(calls), "{blocks}");
    assert!(all[0]["probed"].as_bool().unwrap());
    assert!(all.iter().all(|b| b["count"].is_u64()), "{blocks}");
    assert!(all.iter().filter(|b| b["probed"] == true).count() * 2 > all.len(), "most blocks have a probe: {blocks}");
    for b in all.iter().filter(|b| b["probed"] == false) {
        assert!(b["why"].is_string(), "{b}");
    }
    let lines = line_counts(&blocks);
    assert_eq!(lines[&line_of("TP_PROBED int shape")], calls, "{lines:?}");
    // The loop's line: entered once per call, and again after each iteration.
    assert_eq!(lines[&(line_of("TP_PROBED int shape") + 2)], calls + iters, "{lines:?}");
    assert_eq!(lines[&line_of("LINE_XOR")], xors, "{lines:?}");
    assert_eq!(lines[&line_of("LINE_NEG")], neg, "{lines:?}");
    // The same answers without the probes.
    let again = t.ask(&format!("run {n} {threads}"), "done run");
    assert_eq!(again, done);
    assert!(t.quit().success());
}

#[test]
#[cfg(target_arch = "x86_64")] // a compiler and gcov on the host
fn line_counts_equal_gcovs_for_the_same_source_and_input() {
    use std::path::Path;
    use std::process::Command;
    need("cc");
    need("gcov");
    let (n, threads) = (2_300u64, 4u64);
    // gcov: the same source built with --coverage (counters updated
    // atomically: several threads), run on the same input.
    let dir = std::env::temp_dir().join(format!("tp-blocks-gcov-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("targets");
    for f in ["blocks.c", "common.h"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let sh = |cmd: &str| {
        let out = run(Command::new("sh").arg("-c").arg(cmd).current_dir(&dir));
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    sh(
        "cc -O0 --coverage -fprofile-update=atomic -c blocks.c -o blocks.o && cc --coverage -o blocks-cov blocks.o -lpthread",
    );
    let mut cov = Target::start_path(&dir.join("blocks-cov"));
    let cov_done = cov.ask(&format!("run {n} {threads}"), "done run");
    assert!(cov.quit().success());
    let report: Value = serde_json::from_str(&sh("gcov -j -t blocks.c")).unwrap();
    let gcov: BTreeMap<u32, u64> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["lines"].as_array().unwrap().iter())
        .filter(|l| l["function_name"] == "shape")
        .map(|l| (l["line_number"].as_u64().unwrap() as u32, l["count"].as_u64().unwrap()))
        .collect();
    assert!(gcov.len() >= 10, "gcov's lines of shape: {report}");

    let (stdout, t, done) = blocks_session(n, threads);
    // The program computes what it computes unprobed, and under gcov.
    assert_eq!(done, cov_done);
    let ours = line_counts(&shape_blocks(&stdout));
    for (line, count) in &gcov {
        assert_eq!(ours.get(line), Some(count), "line {line}: gcov {gcov:?}, tp {ours:?}");
    }
    // Beyond gcov's lines, tp's has only the closing brace (gcov puts the
    // return on the line of the `return`).
    let extra: Vec<&u32> = ours.keys().filter(|l| !gcov.contains_key(l)).collect();
    assert!(extra.len() <= 1, "{extra:?}: gcov {gcov:?}, tp {ours:?}");
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_probes_says_which_blocks_are_counted_and_no_window_spans_another() {
    let path = target_path("blocks");
    let out = tp(&["list-probes", path.to_str().unwrap(), "--blocks", "shape", "--json"]);
    let text = expect_success(&["list-probes", "--blocks", "shape"], &out);
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(rows.len() >= 10, "{text}");
    let addr = |r: &Value| u64::from_str_radix(r["address"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    // Blocks cover the function in order.
    for w in rows.windows(2) {
        assert_eq!(addr(&w[0]) + w[0]["size"].as_u64().unwrap(), addr(&w[1]), "{text}");
    }
    for (k, r) in rows.iter().enumerate() {
        assert!(r["lines"].as_array().is_some_and(|l| !l.is_empty()), "{r}");
        if r["probeable"] == false {
            assert!(r["reason"].is_string() && r["window"].is_null(), "{r}");
            continue;
        }
        // A window may reach past its block only into blocks it leaves uncounted.
        let end = addr(r) + r["window"].as_u64().unwrap();
        for later in rows[k + 1..].iter().take_while(|l| addr(l) < end) {
            assert_eq!(later["probeable"], false, "{r} spans {later}");
            assert!(later["reason"].as_str().unwrap().contains("inside the window"), "{later}");
        }
    }
    // A block too short for a probe, before a block that is jumped to, says so.
    if SHORT_BLOCKS {
        let short = |r: &Value| r["reason"].as_str().is_some_and(|w| w.contains("shorter than a probe"));
        assert!(rows.iter().any(short), "{text}");
    }
    // The table names the same.
    let out = tp(&["list-probes", path.to_str().unwrap(), "--blocks", "shape"]);
    let table = expect_success(&["list-probes", "--blocks", "shape"], &out);
    assert!(table.starts_with("ADDRESS") && table.contains("shape+0x0") && table.contains("counted ("), "{table}");
    assert!(table.contains("blocks.c:"), "{table}");
    // A name that is no function, one line.
    let err = expect_error(&["list-probes", path.to_str().unwrap(), "--blocks", "nosuch"], "nosuch");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn run_counts_the_blocks_from_the_first_instruction() {
    use std::io::Write;
    use std::process::Stdio;
    let _shared = shared();
    let (n, threads) = (460u64, 2u64);
    let file = std::env::temp_dir().join(format!("tp-blocks-run-{}.json", std::process::id()));
    let path = target_path("blocks");
    let mut child = tp_command()
        .args(["run", "--blocks", "-f", "shape", "-o", file.to_str().unwrap(), "--"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tp");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("run {n} {threads}\nquit\n").as_bytes()).unwrap();
    drop(stdin);
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child);
    let (stdout, stderr) = (out.rest().join("\n"), err.rest().join("\n"));
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains(&format!("done run {n} {threads} ")) && stdout.contains("bad=0"), "{stdout}");
    let json = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let blocks = shape_blocks(&json);
    let (calls, iters, xors, neg) = model(n, threads);
    assert_eq!(blocks["blocks"][0]["count"].as_u64(), Some(calls), "{blocks}");
    let lines = line_counts(&blocks);
    assert_eq!(lines[&(line_of("TP_PROBED int shape") + 2)], calls + iters, "{lines:?}");
    assert_eq!((lines[&line_of("LINE_XOR")], lines[&line_of("LINE_NEG")]), (xors, neg), "{lines:?}");
}

/// How often each case of `dispatch`'s switch runs in `mix N T` (cases 0
/// to 7, then the default).
#[cfg(target_arch = "x86_64")]
fn dispatch_model(n: u64, threads: u64) -> [u64; 9] {
    let mut cases = [0u64; 9];
    for call in 0..n {
        let m = call % 13;
        for i in 0..m {
            cases[((i * 7 + m) % 9) as usize] += threads;
        }
    }
    cases
}

#[test]
#[cfg(target_arch = "x86_64")] // AArch64: tp does not read switch tables, the blocks are refused
fn a_switch_through_a_jump_table_counts_each_case_exactly() {
    let (n, threads) = (2_600u64, 3u64);
    let mut t = Target::start("blocks");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--blocks", "-f", "dispatch", "--json"]);
    let done = t.ask(&format!("mix {n} {threads}"), "done mix");
    assert_eq!(field(&done, "bad"), 0, "the probes changed what dispatch() computes: {done}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_code_is_original(&t, &["dispatch"]);
    let p = one_process(&stdout);
    let blocks = p["blocks"].as_array().unwrap().iter().find(|b| b["func"] == "dispatch").unwrap().clone();
    let all = blocks["blocks"].as_array().unwrap();
    assert_eq!(all[0]["count"].as_u64(), Some(n * threads), "{blocks}");
    // Each case's code is a block of its own line, entered through the table only.
    let want = dispatch_model(n, threads);
    let src = include_str!("../../targets/blocks.c");
    for (k, expect) in want.iter().enumerate() {
        let text = if k < 8 { format!("case {k}:") } else { "default:".to_string() };
        let line = src.lines().position(|l| l.trim_start().starts_with(&text)).unwrap() as u32 + 1;
        let name = format!("blocks.c:{line}");
        let block = all
            .iter()
            .find(|b| b["lines"].as_array().unwrap().first().is_some_and(|l| *l == name.as_str()))
            .unwrap_or_else(|| panic!("no block starts {name} ({text}): {blocks}"));
        assert_eq!(block["count"].as_u64(), Some(*expect), "{text} {block}");
    }
    // Every block's count is known: the padding after a jump runs never.
    assert!(all.iter().all(|b| b["count"].is_u64()), "{blocks}");
    assert_eq!(t.ask(&format!("mix {n} {threads}"), "done mix"), done);
    assert!(t.quit().success());
}
