//! Probes inside functions: by source line (`--line file.c:N`,
//! `--line function:N`), by offset (`-f 'work+0x13'`), at nop sites (a
//! patchable entry, a 5-byte nop, seed 000's tracepoint), each counted
//! exactly against the target's own books, with the function's results
//! checked (a leaf keeps its locals in the red zone, under the probes), the
//! code byte-identical after, and the refusals in one line.

use serde_json::Value;

use crate::util::*;

/// The line of targets/lines.c holding `marker`.
fn line_of(marker: &str) -> u32 {
    // Built in: the AArch64 tests run in a VM without the sources.
    let src = include_str!("../../targets/lines.c");
    let n = src.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker} in lines.c"));
    n as u32 + 1
}

/// `tp list-probes --lines FUNCTION --json` on the bundled `lines`.
fn line_sites(function: &str) -> Vec<Value> {
    let path = target_path("lines");
    let out = tp(&["list-probes", path.to_str().unwrap(), "--lines", function, "--json"]);
    let text = expect_success(&["list-probes", "--lines", function], &out);
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `work+0x13`: where the line with `marker` starts in `work`.
fn offset_of(function: &str, marker: &str) -> String {
    let want = format!("lines.c:{}", line_of(marker));
    let sites = line_sites(function);
    let site = sites.iter().find(|s| s["site"] == want.as_str()).unwrap_or_else(|| panic!("{want} in {sites:?}"));
    site["where"].as_str().unwrap().to_string()
}

#[test]
fn lines_and_offsets_count_exactly_inside_a_leaf() {
    let (a, c) = (line_of("LINE_A"), line_of("LINE_C"));
    // The `if` line, by its offset from the function's entry.
    let if_site = offset_of("work", "if (i % 3 == 0)");
    assert!(if_site.starts_with("work+0x"), "{if_site}");
    let mut t = Target::start("lines");
    let pid = t.pid.to_string();
    let line_a = format!("lines.c:{a}");
    let line_c = format!("work:{c}");
    let args = ["-p", &pid, "--json", "--line", &line_a, "--line", &line_c, "-f", &if_site];
    let session = Session::start(&args);
    let (n, threads) = (30_000u64, 4u64);
    let done = t.ask(&format!("run {n} {threads}"), "done run");
    assert_eq!(field(&done, "bad"), 0, "the probes changed what work() computes: {done}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let hits = hits_from_json(&stdout);
    let every = n * threads;
    let thirds = n.div_ceil(3) * threads;
    assert_eq!(hits[&line_a], every, "{hits:?}");
    assert_eq!(hits[&format!("work:{c}")], thirds, "{hits:?}");
    assert_eq!(hits[&if_site], every, "{hits:?}");
    assert_code_is_original(&t, &["work"]);
    assert!(!has_region(t.pid));
    assert_eq!(field(&t.ask("run 1000 2", "done run"), "bad"), 0);
    assert!(t.quit().success());
}

#[test]
fn an_offset_between_instructions_is_refused_in_one_line() {
    let t = Target::start("lines");
    let pid = t.pid.to_string();
    let site = offset_of("work", "LINE_C");
    let (name, off) = site.split_once('+').unwrap();
    let inside = format!("{name}+{:#x}", u64::from_str_radix(off.trim_start_matches("0x"), 16).unwrap() + 1);
    let err = expect_error(&["attach", "-p", &pid, "-f", &inside], "is not where an instruction starts");
    // In the user's terms: the offsets around it that can be probed, no runtime address.
    assert!(err.contains(&format!("cannot probe `{inside}`: `{inside}` is not where")), "{err}");
    assert!(err.contains(&format!("the nearest places that can be probed: `{site}` and `{name}+0x")), "{err}");
    let runtime_address = |w: &str| w.starts_with("0x") && w.len() > 10;
    assert!(!err.split(|c: char| !c.is_ascii_alphanumeric()).any(runtime_address), "{err}");
    let err = expect_error(&["attach", "-p", &pid, "-f", "work+0x10000"], "past the end of `work`");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A line that starts no code: the nearest that do; a file that is not there: said so.
    let err = expect_error(&["attach", "-p", &pid, "--line", "lines.c:1"], "starts no code");
    assert!(err.contains("the nearest lines that do: `lines.c:"), "{err}");
    let err = expect_error(&["attach", "-p", &pid, "--line", "nosuch.c:20"], "no source file `nosuch.c`");
    assert!(err.contains("tp list-probes -p"), "{err}");
    assert_code_is_original(&t, &["work"]);
    assert!(!has_region(t.pid));
}

#[test]
#[cfg(target_arch = "x86_64")] // AArch64 probes count; they record no arguments yet
fn inside_a_function_ret_is_refused_and_args_are_not_recorded() {
    let mut t = Target::start("lines");
    let pid = t.pid.to_string();
    let line_c = format!("lines.c:{}", line_of("LINE_C"));
    let err =
        expect_error(&["attach", "-p", &pid, "--line", &line_c, "--ret"], "a return probe goes at a function's entry");
    assert_eq!(err.lines().count(), 1, "{err}");
    expect_error(&["attach", "-p", &pid, "--line", &line_c, "--stack"], "a stack is taken at a function's entry");
    expect_error(&["attach", "-p", &pid, "--line", &line_c, "--by", "arg0"], "--by counts by an argument");
    expect_error(&["attach", "-p", &pid, "--line", &line_c, "--if", "arg0 > 1"], "--if tests the arguments");
    // --args: the entry of `work` records its argument; the line inside only counts.
    let session = Session::start(&["-p", &pid, "--json", "--args", "-f", "work", "--line", &line_c]);
    let n = 300u64;
    assert_eq!(field(&t.ask(&format!("run {n} 1"), "done run"), "bad"), 0);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(stderr.contains(&format!("`{line_c}` inside functions: counted, without arguments")), "{stderr}");
    let events: Vec<Value> = json_events(&stdout);
    assert_eq!(events.len() as u64, n, "one entry event per call of work, none for the line");
    assert!(events.iter().all(|e| e["func"] == "work"));
    let args: Vec<u64> = events.iter().map(|e| e["args"]["i"].as_u64().unwrap()).collect();
    assert_eq!(args, (0..n).collect::<Vec<_>>());
    assert_eq!(hits_from_json(&stdout)[&line_c], n.div_ceil(3));
    assert!(t.quit().success());
}

#[test]
#[cfg(target_arch = "x86_64")]
fn nop_sites_are_patched_with_nothing_to_relocate() {
    let mut t = Target::start("lines");
    let pid = t.pid.to_string();
    // list-probes marks them, in the running process too.
    let out = tp(&["list-probes", "-p", &pid]);
    let text = expect_success(&["list-probes", "-p"], &out);
    for f in ["pfe_entry", "nop5_entry"] {
        let row = text.lines().find(|l| l.split_whitespace().any(|w| w == f)).unwrap_or_else(|| panic!("{f}: {text}"));
        assert!(row.contains("a nop site: nothing to relocate"), "{row}");
    }
    let trace = line_of("LINE_TRACE");
    let sites = line_sites("traced");
    let at_nop: Vec<&Value> = sites.iter().filter(|s| s["site"] == format!("lines.c:{trace}").as_str()).collect();
    assert_eq!(at_nop.len(), 2, "the tracepoint's nop, and the code it would jump to: {sites:?}");
    assert!(at_nop[0]["nop"].as_bool().unwrap() && at_nop[0]["probeable"].as_bool().unwrap(), "{at_nop:?}");
    let nop_site = at_nop[0]["where"].as_str().unwrap().to_string();
    let printf_site = at_nop[1]["where"].as_str().unwrap().to_string();

    let line = format!("lines.c:{trace}");
    let session = Session::start(&["-p", &pid, "--json", "-f", "pfe_entry", "-f", "nop5_entry", "--line", &line]);
    // The patch is a jmp where the nops were.
    for f in ["pfe_entry", "nop5_entry"] {
        let (now, file) = entry_bytes(&t, f);
        assert_eq!(now[0], 0xe9, "{f}: {now:02x?}");
        assert!(file[..5].iter().all(|&b| b == 0x90) || file[..5] == [0x0f, 0x1f, 0x44, 0x00, 0x00], "{file:02x?}");
    }
    let n = 20_000u64;
    assert_eq!(field(&t.ask(&format!("nops {n}"), "done nops"), "bad"), 0);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!(hits["pfe_entry"], n, "{hits:?}");
    assert_eq!(hits["nop5_entry"], n, "{hits:?}");
    assert_eq!(hits[&format!("{line} at {nop_site}")], n, "{hits:?}");
    assert_eq!(hits[&format!("{line} at {printf_site}")], 0, "the tracepoint is off: {hits:?}");
    assert_code_is_original(&t, &["pfe_entry", "nop5_entry", "traced"]);
    assert!(t.quit().success());
}

#[test]
fn list_probes_lists_the_lines_of_a_function() {
    let sites = line_sites("work");
    let lines: Vec<&str> = sites.iter().map(|s| s["site"].as_str().unwrap()).collect();
    for marker in ["LINE_A", "LINE_C", "if (i % 3 == 0)"] {
        let want = format!("lines.c:{}", line_of(marker));
        let row = sites.iter().find(|s| s["site"] == want.as_str()).unwrap_or_else(|| panic!("{want} in {lines:?}"));
        assert!(row["probeable"].as_bool().unwrap(), "{row}");
        assert!(row["where"].as_str().unwrap().starts_with("work+0x"), "{row}");
    }
    // The text form says the same.
    let path = target_path("lines");
    let out = tp(&["list-probes", path.to_str().unwrap(), "--lines", "work"]);
    let text = expect_success(&["list-probes", "--lines"], &out);
    assert!(text.starts_with("ADDRESS") && text.contains(&format!("lines.c:{}", line_of("LINE_C"))), "{text}");
    let err = expect_error(&["list-probes", path.to_str().unwrap(), "--lines", "nothere"], "not found");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
#[cfg(target_arch = "x86_64")]
fn two_names_for_one_site_make_one_probe() {
    // counter-cet's foo starts with endbr64: its probe goes at foo+4.
    let mut t = Target::start("counter-cet");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "-f", "foo", "-f", "foo+4"]);
    let before = session.err.seen.join("\n");
    assert!(before.contains("`foo+0x4` is where `foo` is probed already"), "{before}");
    let calls = t.call("foo", 10_000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits["foo"], calls);
    assert_code_is_original(&t, &["foo"]);
    assert!(t.quit().success());
}

/// A thread interrupted by a signal inside a function's first bytes
/// resumes there when its handler returns: that function is left
/// unpatched while the handler runs, with one line saying why, and every
/// other probe goes in and counts exactly. Once the thread is out, the next
/// attach probes the function.
#[test]
#[cfg(target_arch = "x86_64")]
fn a_function_a_thread_must_resume_inside_is_left_unpatched_and_the_rest_count() {
    let mut t = Target::start("interrupted");
    let pid = t.pid.to_string();
    t.send(b"block\n");
    t.out.wait_for("inside");
    let session = Session::start(&["-p", &pid, "-f", "stops_inside", "-f", "foo", "--json"]);
    t.send(b"go\n");
    assert_eq!(t.out.wait_for("returned"), "returned 42 ok");
    let line = t.ask("call 500", "done");
    assert!(line.ends_with("checksum=ok"), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("tp: not probed this time: `stops_inside`: thread ")
            && l.contains("inside its first bytes on its stack")),
        "{stderr}"
    );
    let hits = hits_from_json(&stdout);
    assert_eq!(hits.get("foo"), Some(&500), "{stdout}");
    assert_eq!(hits.get("stops_inside"), None, "{stdout}");
    assert_code_is_original(&t, &["stops_inside", "foo"]);

    // The thread is out of the handler now: the function is probed.
    let session = Session::start(&["-p", &pid, "-f", "stops_inside", "--json"]);
    let line = t.ask("call 300", "done");
    assert!(line.ends_with("checksum=ok"), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout).get("stops_inside"), Some(&300), "{stdout}");
    assert_code_is_original(&t, &["stops_inside"]);
    assert!(t.quit().success());
}
