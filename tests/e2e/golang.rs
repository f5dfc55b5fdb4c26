//! A Go program (targets/goroutines.go, built here with Debian's Go 1.19,
//! standard library only, offline) with goroutines, deep recursion that
//! grows goroutine stacks, and garbage collection. Return probes and tp
//! profile see calls end at the functions' exits (Go's runtime walks
//! goroutine stacks and checks every return address, which stay as they
//! are), paired per goroutine through stack growth; entries count calls
//! exactly, also through stack growth (the probe sits after Go's stack
//! check); probing every function leaves runtime.goexit alone and the
//! program runs on through goroutine exits and collections; arguments
//! follow Go's register ABI.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::util::*;

/// The Go program, built once per test run: pure Go, or with cgo (it then
/// links the C library, whose threads it runs on), or stripped of its
/// symbols and DWARF.
fn build(cgo: bool, stripped: bool) -> PathBuf {
    need("go");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go");
    let targets = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets");
    let name = match (cgo, stripped) {
        (true, _) => "goroutines-cgo",
        (false, true) => "goroutines-stripped",
        (false, false) => "goroutines",
    };
    let out = tmp.join(name);
    let mut cmd = Command::new("go");
    cmd.arg("build");
    if stripped {
        cmd.arg("-ldflags=-s -w");
    }
    cmd.arg("-o").arg(&out).arg(targets.join("goroutines.go"));
    if cgo {
        cmd.arg(targets.join("goroutines_cgo.go"));
    }
    let status = cmd
        .env("GOCACHE", tmp.join("cache"))
        .env("GOPATH", tmp.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .status()
        .expect("run go build");
    assert!(status.success(), "go build of {} failed", out.display());
    out
}

fn program() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build(false, false))
}

fn program_cgo() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build(true, false))
}

fn start() -> Target {
    Target::start_path(program())
}

/// The number after `key=` in the target's answer to `cmd`.
fn ask_field(t: &mut Target, cmd: &str, answer: &str, key: &str) -> u64 {
    field(&t.ask(cmd, answer), key)
}

/// The executable mappings of `pid`: what an injection adds. (Go's runtime
/// maps and unmaps heap and stacks by itself at any time.)
fn code_maps_of(pid: i32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x'))).map(String::from).collect()
}

/// The return values fib(n) gives over the calls of fib(n) itself, as a
/// count per value.
fn fib_returns(n: u64, into: &mut std::collections::BTreeMap<u64, u64>) -> u64 {
    let r = if n < 2 { n } else { fib_returns(n - 1, into) + fib_returns(n - 2, into) };
    *into.entry(r).or_default() += 1;
    r
}

/// `--ret` on Go code: one exit per call, seen at the function's exits
/// (nothing on the goroutine's stack changes), its result from Go's
/// register ABI, a duration on each.
#[test]
fn return_values_of_a_recursive_go_function_are_exact() {
    let mut t = start();
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "--ret", "-f", "main.fib", "--ring-size", "65536"]);
    assert_eq!(ask_field(&mut t, "fib 18", "done fib", "result"), 2584);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let events = json_events(&stdout);
    let exits: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "exit").collect();
    let mut want = std::collections::BTreeMap::new();
    fib_returns(18, &mut want);
    let mut got = std::collections::BTreeMap::new();
    for e in &exits {
        *got.entry(e["ret"].as_u64().unwrap_or_else(|| panic!("no return value in {e}"))).or_default() += 1u64;
        assert!(e["duration_ns"].as_u64().is_some_and(|d| d > 0), "no duration in {e}");
        assert_eq!(e["tail_call"], false, "{e}");
    }
    assert_eq!(got, want, "the return values of fib(18)'s 8361 calls");
    assert_eq!(exits.last().unwrap()["ret"], 2584, "the last return is fib(18)'s");
    let p = &one_process(&stdout)["probes"][0];
    assert_eq!((p["hits"].as_u64(), p["timed"].as_u64()), (Some(8361), Some(8361)), "{p}");
    assert_eq!(one_process(&stdout)["lost_events"], 0);
    assert_code_is_original(&t, &["main.fib"]);
    assert!(!has_region(t.pid));
    assert_eq!(ask_field(&mut t, "fib 15", "done fib", "result"), 610);
    assert!(t.quit().success());
}

/// A goroutine's stack that grows (copied whole to a larger one) between a
/// call's entry and its exit: each call still pairs with its own exit,
/// kept by the goroutine and the distance from its stack's top.
#[test]
fn calls_of_go_code_are_timed_through_stack_growth() {
    let mut t = start();
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "--ret", "-f", "main.deep", "--ring-size", "4096"]);
    // deep(100) on a new goroutine: 101 frames of 240 bytes outgrow its
    // first stack (8 KiB) twice; deep(n) returns n.
    assert_eq!(ask_field(&mut t, "deep 100", "done deep", "result"), 100);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let events = json_events(&stdout);
    let rets: Vec<u64> = events.iter().filter(|e| e["type"] == "exit").filter_map(|e| e["ret"].as_u64()).collect();
    assert_eq!(rets, (0..=100).collect::<Vec<u64>>(), "each call's exit, innermost first");
    assert!(!events.iter().any(|e| e["type"] == "unwound"), "{stdout}");
    let p = &one_process(&stdout)["probes"][0];
    assert_eq!((p["hits"].as_u64(), p["timed"].as_u64()), (Some(101), Some(101)), "{p}");
    assert!(t.quit().success());
}

/// `tp profile` on Go code: the sampled calls with their latency and self
/// time, while goroutines come and go; the program's own answers are
/// unchanged.
#[test]
fn tp_profile_times_go_code() {
    let mut t = start();
    let pid = t.pid.to_string();
    let session = Session::spawn("profile", &["-p", &pid, "-f", "main.*", "--json"], &[], Some("tp: profiling"));
    let mut sums = Vec::new();
    for _ in 0..3 {
        assert_eq!(ask_field(&mut t, "fib 20", "done fib", "result"), 6765);
        assert_eq!(ask_field(&mut t, "deep 300", "done deep", "result"), 300);
        sums.push(ask_field(&mut t, "spawn 200", "done spawn", "sum"));
        assert_eq!(ask_field(&mut t, "args 100", "done args", "calls"), 200);
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(sums.iter().all(|&s| s == sums[0]), "{sums:?}");
    let probes = one_process(&stdout)["probes"].as_array().unwrap().clone();
    let row = |f: &str| probes.iter().find(|p| p["func"] == f).unwrap_or_else(|| panic!("no {f} in {stdout}")).clone();
    for f in ["main.fib", "main.deep", "main.args3", "main.spawn.func1"] {
        let r = row(f);
        assert!(r["timed"].as_u64().is_some_and(|n| n > 0), "{f}: {r}");
        assert!(r["p50_ns"].as_u64().is_some_and(|n| n > 0), "{f}: {r}");
    }
    assert_eq!(row("main.args3")["hits"], 300);
    // Self times: never above the durations; deep's timed calls of one
    // recursion nest (each is inside every one timed before it), so the
    // inner ones' time is taken from the outer ones'.
    for r in probes.iter().filter(|r| r["timed"].as_u64().is_some_and(|n| n > 0)) {
        let own = r["self_total_ns"].as_u64().unwrap_or_else(|| panic!("{r}"));
        assert!(own <= r["total_ns"].as_u64().unwrap(), "{r}");
    }
    let deep = row("main.deep");
    assert!(deep["self_total_ns"].as_u64().unwrap() < deep["total_ns"].as_u64().unwrap(), "{deep}");
    assert_code_is_original(&t, &["main.fib", "main.deep", "main.args3"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

/// What Go code cannot time is refused in one line before anything is
/// injected: a leaf without a stack check (it may run with 128 bytes of
/// stack left) and assembly (Go's stack-based ABI).
#[test]
fn go_returns_without_room_or_in_assembly_are_refused_before_anything_is_injected() {
    let mut t = start();
    let pid = t.pid.to_string();
    let before = code_maps_of(t.pid);
    let line = expect_error(&["attach", "-p", &pid, "-f", "main.leaf", "--ret"], "without a stack check");
    assert!(line.starts_with("tp: cannot probe `main.leaf`: "), "{line}");
    expect_error(&["profile", "-p", &pid, "-f", "main.leaf", "-d", "1"], "without a stack check");
    expect_error(&["attach", "-p", &pid, "-f", "internal/bytealg.IndexByte.abi0", "--ret"], "Go assembly");
    assert_eq!(code_maps_of(t.pid), before, "nothing may be injected");
    assert!(!has_region(t.pid));
    assert_eq!(ask_field(&mut t, "fib 15", "done fib", "result"), 610);
    assert!(t.quit().success());
}

#[test]
fn calls_are_counted_exactly_through_stack_growth() {
    let mut t = start();
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "-f", "main.fib", "-f", "main.deep", "-f", "main.leaf"]);
    let fib = ask_field(&mut t, "fib 22", "done fib", "calls");
    // 100,001 calls on a new goroutine: its stack is grown (and copied) many
    // times, each growth re-running the first instructions of main.deep.
    let deep = ask_field(&mut t, "deep 100000", "done deep", "calls");
    let leaf = ask_field(&mut t, "spawn 500", "done spawn", "leaf");
    assert_eq!((fib, deep, leaf), (57_313, 100_001, 500));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["main.fib"], hits["main.deep"], hits["main.leaf"]), (fib, deep, leaf));
    assert_code_is_original(&t, &["main.fib", "main.deep", "main.leaf"]);
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

/// Go's function table says which functions are Go's and where goexit is,
/// also in a stripped binary: the same as the symbols of the full build.
#[test]
fn go_code_is_known_without_symbols() {
    use tp::symbols::ElfFile;
    use tp::symbols::go_module::GoModule;
    let full = ElfFile::open(program(), program()).unwrap();
    let path = build(false, true);
    let stripped = ElfFile::open(&path, &path).unwrap();
    assert!(stripped.functions.is_empty() && !stripped.has_dwarf(), "the build is not stripped");
    let (go_full, go_stripped) = (GoModule::of(&full).unwrap(), GoModule::of(&stripped).unwrap());
    assert!(go_full.functions() > 1000, "{}", go_full.functions());
    assert_eq!(go_full, go_stripped);
    for f in full.functions.iter().filter(|f| f.size > 0) {
        assert!(go_stripped.is_go(f.addr), "{} is Go code", f.name);
    }
    let goexit = full.functions.iter().find(|f| f.name == "runtime.goexit.abi0").expect("goexit");
    assert!(go_stripped.is_stack_return(goexit.addr, ""), "goexit is found by its address");
    let fib = full.functions.iter().find(|f| f.name == "main.fib").unwrap();
    assert!(!go_stripped.is_stack_return(fib.addr, ""));
    // In a cgo build, the C functions are not Go code.
    let cgo = ElfFile::open(program_cgo(), program_cgo()).unwrap();
    let go_cgo = GoModule::of(&cgo).unwrap();
    let c = cgo.functions.iter().find(|f| f.name.ends_with("Cfunc_getpid") && f.size > 0).expect("the C stub");
    assert!(!go_cgo.is_go(c.addr), "{} is C", c.name);
    assert!(go_cgo.is_go(cgo.functions.iter().find(|f| f.name == "main.fib").unwrap().addr));
    // The C program is no Go code.
    let counter = target_path("counter");
    assert_eq!(GoModule::of(&ElfFile::open(&counter, &counter).unwrap()), None);
}

#[test]
fn goexit_is_refused_by_name() {
    let t = start();
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "runtime.goexit.abi0"], "cannot probe `runtime.goexit.abi0`");
    assert!(line.contains("return address at the bottom of every goroutine's stack"), "{line}");
    assert!(!has_region(t.pid));
}

#[test]
fn list_probes_puts_go_probes_after_the_stack_check_and_leaves_goexit_alone() {
    let args = ["list-probes", program().to_str().unwrap(), "--json"];
    let stdout = expect_success(&args, &tp(&args));
    let rows: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let row = |name: &str| rows.iter().find(|r| r["func"] == name).unwrap_or_else(|| panic!("no {name}"));
    for f in ["main.fib", "main.deep"] {
        let r = row(f);
        assert_eq!(r["probeable"], true, "{r}");
        assert_eq!(r["note"], "after Go's stack check", "{r}");
        assert_ne!(r["site"], r["address"], "{r}");
    }
    let goexit = row("runtime.goexit.abi0");
    assert_eq!(goexit["probeable"], false);
    assert!(goexit["reason"].as_str().unwrap().contains("return address at the bottom of every goroutine's stack"));
}

/// What `spawn N` answers as its sum: leaf(i) & 0xff plus the byte i
/// wrote, over i < N.
fn spawn_sum(n: u64) -> u64 {
    (0..n).map(|i| ((i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i >> 29)) & 0xff) + (i & 0xff)).sum()
}

/// `-f '*'` on a Go program, idle and then busy: it attaches (goexit left
/// out), and the program runs through goroutine exits and collections with
/// exact results.
#[test]
fn probing_every_function_keeps_goroutines_and_collections_running() {
    let mut t = start();
    let pid = t.pid.to_string();
    for phase in ["idle", "busy"] {
        if phase == "busy" {
            t.ask("busy 4", "busy 4");
        }
        let leaf_before = ask_field(&mut t, "counts", "counts", "leaf");
        let session = Session::start(&["-p", &pid, "--json", "-f", "*"]);
        assert_eq!(ask_field(&mut t, "spawn 2000", "done spawn", "sum"), spawn_sum(2000), "{phase}");
        let fib = t.ask("fib 18", "done fib");
        assert_eq!((field(&fib, "calls"), field(&fib, "result")), (8361, 2584));
        assert_eq!(ask_field(&mut t, "deep 20000", "done deep", "result"), 20000);
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{phase}: {stderr}");
        assert!(stderr.contains("code restored"), "{phase}: {stderr}");
        let leaf_after = ask_field(&mut t, "counts", "counts", "leaf");
        let hits = hits_from_json(&stdout);
        assert!(!hits.contains_key("runtime.goexit.abi0"), "goexit must not be probed");
        assert_eq!(hits["main.fib"], 8361, "{phase}");
        assert_eq!(hits["main.deep"], 20_001, "{phase}");
        if phase == "idle" {
            assert_eq!(hits["main.leaf"], 2000);
        } else {
            // The busy goroutines call leaf while tp attaches and detaches too.
            let leaf = hits["main.leaf"];
            assert!((2000..=leaf_after - leaf_before).contains(&leaf), "{leaf} of {}", leaf_after - leaf_before);
            t.ask("idle", "idle");
        }
        // Goroutines end and collections run after the detach as well.
        assert_eq!(ask_field(&mut t, "spawn 300", "done spawn", "sum"), spawn_sum(300));
    }
    // A busy thread may have been inside a detour at the detach: tp's memory
    // then stays, unused, until a detach finds no thread in it.
    if has_region(t.pid) {
        expect_success(&["detach", "-p", &pid], &tp(&["detach", "-p", &pid]));
    }
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

/// `--args` on Go functions of `program`: the values as Go's register ABI
/// passes them, named from DWARF, without the result `~r0`.
fn arguments_follow_the_go_register_abi(program: &std::path::Path) {
    let mut t = Target::start_path(program);
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--args", "-f", "main.args3", "-f", "main.mixed"]);
    assert_eq!(ask_field(&mut t, "args 3", "done args", "calls"), 6);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let out = format!("{stdout}\n{stderr}");
    for i in 1..=3i64 {
        let want = format!("main.args3(a={i}, b={}, c={})", 2 * i, -i);
        assert!(out.contains(&want), "no `{want}` in:\n{out}");
        // s: a string (two registers, not shown), then n, odd and u.
        let want = format!("main.mixed(s=?, n={i}, odd={}, u={i})", i % 2 == 1);
        assert!(out.contains(&want), "no `{want}` in:\n{out}");
    }
    assert!(!out.contains("~r0"), "a result is not an argument:\n{out}");
    assert!(t.quit().success());
}

#[test]
fn go_arguments_follow_the_go_register_abi_in_a_cgo_build() {
    arguments_follow_the_go_register_abi(program_cgo());
}

/// Go's own threads keep no C library thread block (their word at fs:0 is
/// 0): events there need a thread identity that does not assume one.
#[test]
fn go_arguments_follow_the_go_register_abi_in_a_pure_go_build() {
    arguments_follow_the_go_register_abi(program());
}

/// `--args` on a Go function without a stack check (a small leaf, which
/// may run with little of its goroutine's stack left): the detour calls
/// the runtime only where the stack has room for the call below the stack
/// pointer, and counts the other entries lost, as such. add9 is called at
/// every depth of a recursion, through a function that takes most of what
/// Go lets functions without stack checks take: some calls have too little
/// room, and the goroutine's neighbours in Go's heap are never written.
#[test]
fn arguments_of_go_functions_without_a_stack_check_are_recorded_where_the_stack_has_room() {
    let mut t = start();
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "--args", "-f", "main.add9", "--ring-size", "16384"]);
    let answer = t.ask("add9 3000", "done add9");
    assert_eq!(answer, "done add9 calls=3001 sum=1485495", "the program's results hold");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let summary = one_process(&stdout);
    assert_eq!(summary["probes"][0]["hits"], 3001, "every call counted");
    let entries: Vec<serde_json::Value> = json_events(&stdout).into_iter().filter(|e| e["type"] == "entry").collect();
    let lost = summary["lost_events"].as_u64().unwrap();
    assert_eq!(entries.len() as u64 + lost, 3001, "{stderr}");
    assert!(lost > 0, "some calls ran with little stack left: {stderr}");
    assert!(entries.len() > 2000, "most calls have room: {stderr}");
    let why = format!("tp: lost {lost} events ({lost}: entries of Go functions without a stack check");
    assert!(stderr.contains(&why), "{stderr}");
    // All nine, in Go's register ABI: 11, 22, ... 99.
    for e in &entries {
        let args = &e["args"];
        let nine = ["a", "b", "c", "d", "e", "f", "g", "h", "i"].map(|k| args[k].as_i64());
        assert_eq!(nine, [11, 22, 33, 44, 55, 66, 77, 88, 99].map(Some), "{e}");
    }
    assert_code_is_original(&t, &["main.add9"]);
    assert!(t.quit().success());
}
