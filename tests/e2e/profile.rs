//! `tp profile`: exact call counts, latency samples within the budget of
//! every epoch, known latencies, tail calls and longjmp under sampling
//! return probes, the text table and the trace file.

use serde_json::Value;

use crate::util::*;

/// A running `tp profile`.
fn start(pid: i32, args: &[&str]) -> Session {
    let pid = pid.to_string();
    let mut full = vec!["-p", pid.as_str()];
    full.extend_from_slice(args);
    Session::spawn("profile", &full, &[], Some("tp: profiling"))
}

/// Stops a profile; returns (stdout, epochs it reported, stderr).
fn stop(session: Session) -> (String, u64, String) {
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp profile failed: {stderr}");
    let line = stderr.lines().find(|l| l.contains(" epochs in ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("toggles/s") && line.contains("samples/s"), "{line}");
    let epochs = line.trim_start_matches("tp: ").split(' ').next().unwrap().parse().unwrap();
    (stdout, epochs, stderr)
}

/// The rows of a `--json` profile, by function (every function profiled).
fn rows(stdout: &str) -> std::collections::BTreeMap<String, Value> {
    let v = summary_doc(stdout);
    assert_eq!(v["command"], "profile", "{v}");
    let p = one_process(stdout);
    assert!(p["toggles_per_s"].as_u64().is_some() && p["samples_per_s"].as_u64().is_some(), "{v}");
    p["probes"].as_array().unwrap().iter().map(|f| (f["func"].as_str().unwrap().to_string(), f.clone())).collect()
}

/// The wall-clock seconds a `--json` profile covered.
fn seconds(stdout: &str) -> f64 {
    summary_doc(stdout)["seconds"].as_f64().unwrap()
}

fn num(row: &Value, key: &str) -> u64 {
    row[key].as_u64().unwrap_or_else(|| panic!("no {key} in {row}"))
}

#[test]
fn calls_are_exact_and_samples_stay_within_each_epochs_budget() {
    let mut t = Target::start("events");
    let session = start(
        t.pid,
        &[
            "-f", "add", "-f", "fib", "-f", "nap", "-f", "tail_*", "-f", "jumper", "--sample", "3", "--epoch", "20ms",
            "--json",
        ],
    );
    let quiet = t.ask("quiet 100000", "done quiet");
    assert_eq!(field(&quiet, "sum"), 100_000 * 99_999);
    let fib = t.ask("fib 18", "done fib");
    let tail = t.ask("tail 5000", "done tail");
    assert_eq!(field(&tail, "sum"), 3 * 5000 * 5001 / 2, "tail calls under return probes must return the right values");
    t.ask("jump 50", "done jump");
    for k in 0..3 {
        t.ask("nap 30", "done nap");
        if k == 0 {
            // nap's rate becomes known at the end of the epoch its first
            // call began in (10 ms): give a busy machine, or an emulated
            // VM whose tracer may wait long for the CPU, the time for it.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }
    t.ask("quiet 10", "done quiet");
    let (stdout, epochs, _) = stop(session);
    assert!(t.quit().success(), "the target must exit 0");

    let rows = rows(&stdout);
    let calls = |f: &str| num(&rows[f], "hits");
    assert_eq!(calls("add"), 100_010);
    assert_eq!(calls("fib"), field(&fib, "calls"));
    assert_eq!((calls("tail_outer"), calls("tail_inner")), (5000, 5000));
    assert_eq!(calls("jumper"), 51);
    assert_eq!(calls("nap"), 3);
    for (func, row) in rows.iter().filter(|(_, r)| num(r, "hits") > 0) {
        let samples = num(row, "timed");
        // At most twice --sample per epoch, and one budget more at install.
        assert!(samples <= 6 * (epochs + 1), "{func}: {samples} samples in {epochs} epochs");
        assert!(samples <= num(row, "hits"), "{row}");
        assert!(func == "jumper" || samples >= 1, "{row}");
    }
    // Frames longjmp skipped never return: they are reaped, not timed.
    assert_eq!(num(&rows["jumper"], "timed"), 0, "{}", rows["jumper"]);
    assert!(rows["jumper"]["avg_ns"].is_null());
    // The first call of a function whose rate tp does not know yet is never
    // timed (see events/sampling.rs); once its rate is known (one call per
    // epoch), every call is.
    let nap = &rows["nap"];
    assert_eq!(num(nap, "timed"), 2);
    let mean = num(nap, "avg_ns");
    assert!((30_000_000..300_000_000).contains(&mean), "nap(30) took {mean} ns on average");
    // Shares are of the profile's wall-clock time: nap ran 90 ms of it.
    let seconds = seconds(&stdout);
    let nap_share = rows["nap"]["time_share"].as_f64().unwrap();
    assert!(nap_share * seconds >= 0.085 && nap_share <= 1.0, "nap: {nap_share} of {seconds} s");
}

#[test]
fn threads_racing_for_the_last_sample_never_overspend_it() {
    let mut t = Target::start("counter");
    let session = start(t.pid, &["-f", "foo", "-f", "bar", "--sample", "5", "--epoch", "5ms", "--json"]);
    let foo = t.call("foo", 3_000_000, 2);
    let bar = t.call("bar", 1_000, 2);
    let (stdout, epochs, _) = stop(session);
    assert!(t.quit().success());
    let rows = rows(&stdout);
    assert_eq!((num(&rows["foo"], "hits"), num(&rows["bar"], "hits")), (foo, bar));
    let samples = num(&rows["foo"], "timed");
    assert!(samples >= 5 && samples <= 10 * (epochs + 1), "{samples} samples in {epochs} epochs");
}

#[test]
fn samples_are_spread_over_calls_not_taken_after_pauses() {
    // Each round: a 1 ms pause, one 200 µs call of pulse, 99 that return at
    // once; the true mean is about 2 µs. Timing the first calls after each
    // epoch began would mostly catch the long call that follows the pause
    // (a mean near 20 µs); timing calls at random among all calls does not.
    // The share of long calls among the samples tells it apart from the
    // mean, which a few calls preempted on a busy machine (or a VM) skew.
    let mut t = Target::start("events");
    // The sampled calls, as the results: a Chrome trace (by the file's name).
    let trace = std::env::temp_dir().join(format!("tp-pulse-{}.trace.json", t.pid));
    let session = start(t.pid, &["-f", "pulse", "-o", trace.to_str().unwrap()]);
    t.ask("burst 400", "done burst");
    let (stdout, _, _) = stop(session);
    assert!(t.quit().success());
    assert_eq!(stdout, "", "-o takes the results");
    let text = std::fs::read_to_string(&trace).unwrap();
    let _ = std::fs::remove_file(&trace);
    let v: Value = serde_json::from_str(&text).unwrap();
    let durations: Vec<f64> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "pulse" && e["ph"] == "X")
        .map(|e| e["dur"].as_f64().unwrap())
        .collect();
    let samples = durations.len();
    assert!(samples >= 100, "{samples} samples");
    let mean = durations.iter().sum::<f64>() / samples as f64;
    let long = durations.iter().filter(|&&us| us >= 150.0).count();
    assert!(
        long * 20 <= samples,
        "{long} of {samples} samples (mean {mean:.2} µs) are the long call, one in 100 calls: biased towards the \
         calls after a pause"
    );
}

/// What `tp profile -f` takes for "every function of the program": `*`
/// (x86-64: the program's own functions, libc being a library); the arm64
/// test VM's targets are static, so there `*` would be all of libc too.
#[cfg(target_arch = "x86_64")]
const EVERY_FUNCTION: &[&str] = &["-f", "*"];
#[cfg(target_arch = "aarch64")]
const EVERY_FUNCTION: &[&str] = &["-f", "add", "-f", "mix", "-f", "greet", "-f", "nap", "-f", "fib", "-f", "job_main"];

/// Runs the `events` target's calls and three naps under `tp profile ARGS`;
/// returns tp's (stdout, stderr).
fn naps_profiled(args: &[&str]) -> (String, String) {
    let mut t = Target::start("events");
    let mut full = EVERY_FUNCTION.to_vec();
    full.extend(["--sample", "2"]);
    full.extend_from_slice(args);
    let session = start(t.pid, &full);
    t.ask("call 20 2", "done call");
    for k in 0..3 {
        t.ask("nap 30", "done nap");
        if k == 0 {
            // nap's rate becomes known at the end of the epoch its first
            // call began in (10 ms): give a busy machine, or an emulated
            // VM whose tracer may wait long for the CPU, the time for it.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }
    let (stdout, _, stderr) = stop(session);
    assert!(t.quit().success());
    assert!(stderr.contains("functions of"), "{stderr}");
    (stdout, stderr)
}

#[test]
fn the_table_and_the_trace_file() {
    let (stdout, _) = naps_profiled(&[]);
    let mut lines = stdout.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["FUNCTION", "TIMED", "HITS", "AVG", "P50", "P99", "SELF", "TIME%", "SELF%"]);
    let nap = lines.find(|l| l.starts_with("nap ")).unwrap_or_else(|| panic!("{stdout}"));
    let cols: Vec<&str> = nap.split_whitespace().collect();
    assert_eq!(cols[1..3], ["2", "3"], "{nap}");
    assert!(stdout.lines().any(|l| l.starts_with("greet ")), "{stdout}");
    // Only functions that ran are rows.
    assert!(stdout.lines().skip(1).all(|l| l.split_whitespace().nth(2) != Some("0")), "{stdout}");

    let trace = std::env::temp_dir().join(format!("tp-profile-{}.trace.json", std::process::id()));
    let (stdout, _) = naps_profiled(&["-o", trace.to_str().unwrap()]);
    assert_eq!(stdout, "", "-o takes the results");
    let text = std::fs::read_to_string(&trace).unwrap();
    let _ = std::fs::remove_file(&trace);
    let v: Value = serde_json::from_str(&text).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let naps: Vec<&Value> = events.iter().filter(|e| e["name"] == "nap" && e["ph"] == "X").collect();
    assert_eq!(naps.len(), 2, "{text}");
    assert!(naps[0]["dur"].as_f64().unwrap() >= 30_000.0, "{}", naps[0]);
}

#[test]
fn profile_errors_name_the_fix() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_error(&["profile", "-p", &pid, "-f", "no_such_function"], "no_such_function");
    for (bad, needle) in [("--epoch=soon", "10ms"), ("--sample=0", "--sample")] {
        let out = tp(&["profile", "-p", &pid, "-f", "foo", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.starts_with("tp: ") && stderr.lines().count() == 1 && stderr.contains(needle), "{stderr}");
    }
    assert!(!has_region(t.pid));
}

/// A pattern naming a library the process has not loaded waits for it, as
/// in `tp attach` (one path for both, session/libraries.rs): the profile
/// probes the library at the dynamic linker's rendezvous, before `dlopen`
/// returns, and its calls from then on are counted exactly and timed; a
/// library that is not loaded at all waits too, and is never found.
#[test]
#[cfg(target_arch = "x86_64")] // libuser and its libraries are built for the host only
fn a_library_loaded_during_the_profile_is_profiled() {
    let mut t = Target::start("libuser");
    let mut session =
        start(t.pid, &["-f", "libalpha:alpha_only", "-f", "libgamma:lib_work", "-f", "libnope:*", "--json"]);
    assert_eq!(t.ask("load gamma", "loaded"), "loaded gamma");
    // Probed before `dlopen` returned: the line is there already.
    let line = session.err.wait_for("tp: process");
    assert!(line.contains("loaded libgamma.so: probed 1 more function at the dynamic linker's rendezvous"), "{line}");
    let done = t.ask("call gamma 700", "done");
    assert!(done.ends_with("checksum=ok"), "{done}");
    t.ask("call only 30", "done");
    let (stdout, _, stderr) = stop(session);
    assert!(stderr.contains("no module `libgamma`") && stderr.contains("no module `libnope`"), "{stderr}");
    assert!(stderr.contains("tp profiles it when the process loads it"), "{stderr}");
    let rows = rows(&stdout);
    assert_eq!(num(&rows["lib_work"], "hits"), 700, "{stdout}");
    assert_eq!(num(&rows["alpha_only"], "hits"), 30, "{stdout}");
    assert!(num(&rows["lib_work"], "timed") > 0, "{stdout}");
    let libraries = &one_process(&stdout)["libraries"];
    assert_eq!(libraries.as_array().map(Vec::len), Some(1), "{stdout}");
    let l = &libraries[0];
    assert_eq!(
        (&l["modules"][0], &l["probes"], &l["at"], &l["loads"]),
        (&"libgamma.so".into(), &1.into(), &"rendezvous".into(), &1.into()),
        "{stdout}"
    );
    assert!(t.quit().success());
}

/// The `nested` target's known tree under `tp profile ARGS` (outer, inner
/// and walk profiled, every call timed): the first call of each function,
/// made alone, is the one tp never times (its rate is not known yet); once
/// the rates are, 4 calls of outer, each calling inner 5 times for 2 ms,
/// and 3 walks of 5 nested calls, each level sleeping 1 ms. Returns tp's
/// stdout.
fn known_tree(args: &[&str]) -> String {
    let mut t = Target::start("nested");
    let mut full = vec!["-f", "outer", "-f", "inner", "-f", "walk", "--sample", "1000", "--epoch", "10ms"];
    full.extend_from_slice(args);
    let session = start(t.pid, &full);
    // The calls tp does not time: outer's without inner's, inner's and
    // walk's alone.
    assert_eq!(t.ask("outer 0 0", "done outer"), "done outer calls=0");
    t.ask("inner 0", "done inner");
    assert_eq!(t.ask("walk 0 0", "done walk"), "done walk calls=1");
    // Their rates become known at the end of the epoch they began in: give
    // a busy machine the time for it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    for _ in 0..4 {
        assert_eq!(t.ask("outer 5 2000", "done outer"), "done outer calls=5");
    }
    for _ in 0..3 {
        assert_eq!(t.ask("walk 4 1000", "done walk"), "done walk calls=5");
    }
    let (stdout, _, stderr) = stop(session);
    assert!(t.quit().success(), "the target's own counts must hold");
    assert!(stderr.contains("profiling 3 functions"), "{stderr}");
    stdout
}

/// Self times: outer, which only waits for inner, has next to none; inner
/// has all of its own; the self times of outer and inner add up to outer's
/// inclusive time (inner runs only inside outer), and walk's to the time of
/// its outermost calls, not to its inclusive total, which counts each
/// level again in every level above it.
#[test]
fn self_times_add_up_to_the_outermost_calls() {
    let stdout = known_tree(&["--json"]);
    let rows = rows(&stdout);
    let (outer, inner, walk) = (&rows["outer"], &rows["inner"], &rows["walk"]);
    // Every call but the first of each function was timed.
    assert_eq!((num(outer, "hits"), num(outer, "timed")), (5, 4), "{outer}");
    assert_eq!((num(inner, "hits"), num(inner, "timed")), (21, 20), "{inner}");
    assert_eq!((num(walk, "hits"), num(walk, "timed")), (16, 15), "{walk}");

    // The nanoseconds of each timed call are rounded down on their own, and
    // tp refines its clock's rate at every drain (a callee may be converted
    // at one rate, its caller at the next): a few ns per call, and a few
    // parts per million.
    let close = |a: u64, b: u64, calls: u64| a.abs_diff(b) <= calls + b / 100_000;
    let outer_time = num(outer, "total_ns");
    let (outer_self, inner_self) = (num(outer, "self_total_ns"), num(inner, "self_total_ns"));
    assert!(outer_time >= 4 * 5 * 2_000_000, "{outer}");
    assert!(
        close(outer_self + inner_self, outer_time, 24),
        "outer's self {outer_self} ns + inner's {inner_self} ns != outer's {outer_time} ns"
    );
    // inner calls nothing probed: all its time is its own.
    assert_eq!(inner_self, num(inner, "total_ns"), "{inner}");
    // outer only waits for inner: its loop and tp's work around its callees
    // (under 1 % of its time; on an emulated CPU, the arm64 VM, where every
    // instruction is far slower and the sleeps are not, 1.1 % was seen).
    let small = if std::env::var_os("TP_TEST_CPU").is_some() { 10 } else { 100 };
    assert!(outer_self * small < outer_time, "outer: {outer_self} ns of its own in {outer_time} ns");
    assert!(num(outer, "self_avg_ns") * small < num(outer, "avg_ns"), "{outer}");

    // walk: 3 trees of 5 levels (5, 4, 3, 2 and 1 ms): each call's self
    // time is its own 1 ms sleep; the inclusive total counts 15 ms per tree.
    let (walk_self, walk_time) = (num(walk, "self_total_ns"), num(walk, "total_ns"));
    assert!(walk_self >= 15 * 1_000_000, "{walk}");
    assert!(walk_time >= 3 * 15 * 1_000_000, "{walk}");
    assert!(walk_self * 2 < walk_time, "recursion counted once in self time: {walk}");
    assert!(num(walk, "self_avg_ns") >= 1_000_000, "{walk}");

    let share = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in {r}"));
    assert!(share(outer, "self_share") * (small as f64) < share(outer, "time_share"), "{outer}");
    assert!(share(inner, "self_share") == share(inner, "time_share"), "{inner}");
}

/// A timed call in the trace, in ns: its entry and exit, its duration and
/// self time (both without tp's work).
struct Slice {
    start: u64,
    end: u64,
    timed: u64,
    own: u64,
    name: String,
}

impl Slice {
    /// Within `outer`, give or take a microsecond at either end, and
    /// shorter: the two are placed by the event clock, whose fit a session
    /// refines while it runs, so a call's return may land a few ns past
    /// its caller's.
    fn within(&self, outer: &Slice) -> bool {
        const SLACK: u64 = 1_000;
        outer.start <= self.start + SLACK
            && self.end <= outer.end + SLACK
            && self.end - self.start < outer.end - outer.start
            && !std::ptr::eq(self, outer)
    }
}

/// The trace file: every timed call's slice carries its self time, which
/// is its duration less the durations of the slices directly inside it on
/// its thread; the self times of a thread's slices add up to the durations
/// of its outermost ones.
#[test]
fn each_slice_of_the_trace_has_its_self_time() {
    let trace = std::env::temp_dir().join(format!("tp-self-{}.trace.json", std::process::id()));
    let stdout = known_tree(&["-o", trace.to_str().unwrap()]);
    assert_eq!(stdout, "", "-o takes the results");
    let text = std::fs::read_to_string(&trace).unwrap();
    let _ = std::fs::remove_file(&trace);
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut threads: std::collections::BTreeMap<u64, Vec<Slice>> = Default::default();
    for e in v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
        let ns = |us: &Value| (us.as_f64().unwrap() * 1000.0).round() as u64;
        let (start, span) = (ns(&e["ts"]), ns(&e["dur"]));
        let timed = e["args"]["timed_ns"].as_u64().unwrap_or_else(|| panic!("{e}"));
        let own = e["args"]["self_ns"].as_u64().unwrap_or_else(|| panic!("{e}"));
        assert!(own <= timed && timed <= span + 1, "{e}");
        let name = e["name"].as_str().unwrap().to_string();
        threads.entry(e["tid"].as_u64().unwrap()).or_default().push(Slice {
            start,
            end: start + span,
            timed,
            own,
            name,
        });
    }
    assert_eq!(threads.len(), 1, "one thread ran the calls");
    let mut slices = threads.into_values().next().unwrap();
    let count = |f: &str| slices.iter().filter(|s| s.name == f).count();
    assert_eq!((count("outer"), count("inner"), count("walk")), (4, 20, 15), "{text}");
    // Outermost first where two begin at the same ns.
    slices.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    let (mut outermost, mut selves) = (0u64, 0u64);
    for s in &slices {
        // Directly inside: within it, and within no other slice within it.
        let inside: Vec<&Slice> = slices.iter().filter(|c| c.within(s)).collect();
        let direct = inside.iter().filter(|c| !inside.iter().any(|p| c.within(p)));
        let (children, n) = direct.fold((0, 0), |(sum, n), c| (sum + c.timed, n + 1));
        assert!(
            s.own.abs_diff(s.timed.saturating_sub(children)) <= n + 1 + s.timed / 100_000,
            "{}: self {} ns, duration {} ns, {n} calls inside it of {children} ns",
            s.name,
            s.own,
            s.timed
        );
        let expected = match s.name.as_str() {
            "outer" => 5,
            "walk" => u64::from(inside.iter().any(|c| c.name == "walk")),
            _ => 0,
        };
        assert_eq!(n, expected, "{}'s calls directly inside it", s.name);
        if !slices.iter().any(|p| s.within(p)) {
            outermost += s.timed;
        }
        selves += s.own;
    }
    assert!(outermost >= (4 * 5 * 2 + 3 * 5) * 1_000_000, "{outermost} ns");
    assert!(
        selves.abs_diff(outermost) <= slices.len() as u64 + outermost / 100_000,
        "the self times add up to {selves} ns, the outermost calls to {outermost} ns"
    );
}
