//! Static probes (USDT, SystemTap SDT notes): the bundled `sdt` target's
//! probes (targets/sdt.h) with arguments of every kind, checked against the
//! target's own log; its semaphore, set while tp is attached and taken back
//! at detach, also by `tp detach` after tp was killed; the probes of real
//! binaries: Debian's python3.11 (semaphores) and libstdc++ (exceptions).

use std::os::unix::process::ExitStatusExt;

use serde_json::Value;

use crate::util::*;

/// The events in tp's JSON Lines output.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn events(stdout: &str) -> Vec<Value> {
    json_events(stdout)
}

/// The semaphore's value as the `sdt` target reads it.
fn semaphore(t: &mut Target) -> u64 {
    field(&t.ask("sem", "sem "), "tick")
}

/// An event argument as a number (hex strings for unsigned 8-byte values).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn number(v: &Value) -> i128 {
    match v {
        Value::String(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap() as i128,
        Value::Number(n) => n.as_i64().map(i128::from).unwrap_or_else(|| n.as_u64().unwrap() as i128),
        other => panic!("not a number: {other}"),
    }
}

#[test]
#[cfg(target_arch = "x86_64")] // AArch64 probes count; they record no arguments yet
fn static_probe_arguments_match_the_targets_own_log() {
    let mut t = Target::start("sdt");
    let pid = t.pid.to_string();
    assert_eq!(semaphore(&mut t), 0);
    let session = Session::start(&["-p", &pid, "--json", "--args", "-f", "usdt:tpsdt:tick"]);
    assert_eq!(semaphore(&mut t), 1, "the semaphore is held while tp is attached");
    let n = 500;
    let before = t.out.seen.len();
    let done = t.ask(&format!("tick {n}"), "done tick");
    assert_eq!(field(&done, "fired"), n, "{done}");
    let log: Vec<String> = t.out.seen[before..].iter().filter(|l| l.starts_with("log tick")).cloned().collect();
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_eq!(semaphore(&mut t), 0, "taken back at detach");
    assert_eq!(hits_from_json(&stdout)["usdt:tpsdt:tick"], n);
    let ev = events(&stdout);
    assert_eq!((ev.len(), log.len()), (n as usize, n as usize));
    // i (a register), v (64-bit), d (2-byte, signed), c (the constant -7), g (a global by its symbol).
    for (e, line) in ev.iter().zip(&log) {
        assert_eq!(e["func"], "usdt:tpsdt:tick");
        for (k, key) in ["i", "v", "d", "c", "g"].iter().enumerate() {
            let want: i128 =
                line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).unwrap().parse().unwrap();
            assert_eq!(number(&e["args"][format!("arg{k}")]), want, "{key} in {line} vs {e}");
        }
    }
    // Without tp, the program skips the probe: nothing fires.
    assert_eq!(field(&t.ask("tick 10", "done tick"), "fired"), 0);
    assert_code_is_original(&t, &["tick", "idle", "leaf"]);
    assert!(t.quit().success());
}

#[test]
#[cfg(target_arch = "x86_64")]
fn every_probe_of_a_provider_counts_and_a_leaf_keeps_its_red_zone() {
    let mut t = Target::start("sdt");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "--args", "-f", "usdt:tpsdt:*"]);
    let n = 2000u64;
    let leaf = t.ask(&format!("leaf {n}"), "done leaf");
    assert_eq!(field(&leaf, "bad"), 0, "the probe changed what leaf() computes: {leaf}");
    t.ask(&format!("idle {n}"), "done idle");
    t.ask("tick 30", "done tick");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["usdt:tpsdt:leaf"], hits["usdt:tpsdt:idle"], hits["usdt:tpsdt:tick"]), (n, n, 30), "{hits:?}");
    let leaf_args: Vec<i128> =
        events(&stdout).iter().filter(|e| e["func"] == "usdt:tpsdt:leaf").map(|e| number(&e["args"]["arg0"])).collect();
    assert_eq!(leaf_args, (0..n as i128).collect::<Vec<_>>());
    assert_eq!(semaphore(&mut t), 0);
    assert!(t.quit().success());
}

#[test]
fn tp_detach_takes_back_the_semaphore_of_a_killed_tracer() {
    for (step, left) in [("after-patch", 0), ("after-semaphore", 1)] {
        let mut t = Target::start("sdt");
        let pid = t.pid.to_string();
        let mut cmd = tp_command();
        cmd.args(["attach", "-p", &pid, "-f", "usdt:tpsdt:tick"]).env("TP_FAULT", step);
        let out = run(&mut cmd);
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{step}: tp must have died there");
        assert_eq!(semaphore(&mut t), 1, "{step}: the increment is made before the patch");
        let fired = field(&t.ask("tick 40", "done tick"), "fired");
        assert_eq!(fired, 40, "{step}");
        let out = tp(&["detach", "-p", &pid]);
        expect_success(&["detach", "-p", &pid], &out);
        // Patched: the detach restores the site and takes the increment back. Killed
        // between the increment and the patch: the increment stays (never taken twice).
        assert_eq!(semaphore(&mut t), left, "{step}");
        assert_code_is_original(&t, &["tick"]);
        // (On AArch64 the code arena lies in a hole between the module's
        // segments, where a stale word of the stack may point: tp then keeps
        // its memory, as it must, and says so.)
        #[cfg(target_arch = "x86_64")]
        assert!(!has_region(t.pid), "{step}");
        assert!(t.quit().success());
    }
}

#[test]
fn list_probes_shows_static_probes_with_semaphores_and_arguments() {
    let path = target_path("sdt");
    let out = tp(&["list-probes", path.to_str().unwrap(), "--usdt", "--json"]);
    let text = expect_success(&["list-probes", "--usdt"], &out);
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r["site"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let tick = rows.iter().find(|r| r["site"] == "usdt:tpsdt:tick").unwrap();
    assert!(tick["semaphore"].as_str().unwrap().starts_with("0x") && tick["probeable"].as_bool().unwrap(), "{tick}");
    assert_eq!(tick["args"].as_array().unwrap().len(), 5, "{tick}");
    assert!(tick["where"].as_str().unwrap().starts_with("tick+0x"), "{tick}");
    let t = Target::start("sdt");
    let pid = t.pid.to_string();
    let err = expect_error(&["attach", "-p", &pid, "-f", "usdt:"], "write a static probe as");
    assert_eq!(err.lines().count(), 1);
}

#[test]
fn an_unknown_static_probe_is_named_with_what_exists() {
    let t = Target::start("sdt");
    let pid = t.pid.to_string();
    let err = expect_error(&["attach", "-p", &pid, "-f", "usdt:tpsdt:nothere"], "no static probe matches");
    assert!(err.contains("`tpsdt:tick`") && err.contains("`tpsdt:idle`"), "{err}");
    assert!(!has_region(t.pid));
}

/// `/usr/bin/python3.11` runs `code` (which prints `ready pid=N`, then
/// `waiting`); returns the child (killed on drop) and the tests' shared lock.
#[cfg(target_arch = "x86_64")]
fn python(code: &str) -> (Target, Held) {
    let held = shared();
    let mut cmd = std::process::Command::new("/usr/bin/python3.11");
    cmd.args(["-c", code]);
    let mut t = Target::spawn(cmd);
    t.out.wait_for("waiting");
    (t, held)
}

#[test]
#[cfg(target_arch = "x86_64")]
fn python_function_returns_count_exactly_with_their_semaphore() {
    need("python3");
    // f's `return` line is the 3rd line of the program.
    let code = "import os, sys\ndef f(n):\n    return n + 1\n\
                print('ready pid=%d' % os.getpid(), flush=True)\nprint('waiting', flush=True)\n\
                while True:\n    n = int(sys.stdin.readline())\n    s = 0\n    for i in range(n):\n        s = f(s)\n    \
                print('done %d' % s, flush=True)\n";
    let (mut t, _held) = python(code);
    let pid = t.pid.to_string();
    // Where python's semaphore is: from its note (python3.11 is position-dependent).
    let out = tp(&["list-probes", "/usr/bin/python3.11", "--usdt", "--json"]);
    let rows: Vec<Value> =
        expect_success(&["list-probes"], &out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ret = rows.iter().find(|r| r["site"] == "usdt:python:function__return").expect("python3.11 has the probe");
    let sem = u64::from_str_radix(ret["semaphore"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let word = |pid: i32| u16::from_le_bytes(read_mem(pid, sem, 2).try_into().unwrap());
    assert_eq!(word(t.pid), 0);
    let session =
        Session::start(&["-p", &pid, "--json", "--args", "--ring-size", "16384", "-f", "usdt:python:function__return"]);
    assert_eq!(word(t.pid), 1, "python's semaphore is held while tp is attached");
    let n = 3000;
    assert_eq!(t.ask(&n.to_string(), "done"), format!("done {n}"));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_eq!(word(t.pid), 0);
    // Every return of a Python function: f's, and those of what python runs
    // in Python to read its input. arg1 is the function's name (a C string
    // in the target), arg2 the line of the return.
    let ev = events(&stdout);
    assert_eq!(hits_from_json(&stdout)["usdt:python:function__return"], ev.len() as u64);
    let name = |e: &Value| {
        let bytes = read_mem(t.pid, number(&e["args"]["arg1"]) as u64, 16);
        String::from_utf8_lossy(&bytes[..bytes.iter().position(|&b| b == 0).unwrap()]).into_owned()
    };
    let of_f: Vec<&Value> = ev.iter().filter(|e| name(e) == "f").collect();
    assert_eq!(of_f.len() as u64, n, "{} returns in all", ev.len());
    assert!(of_f.iter().all(|e| number(&e["args"]["arg2"]) == 3), "{}", of_f[0]);
    assert!(ev.len() as u64 - n < 10, "{} returns besides f's", ev.len() as u64 - n);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn libstdcxx_throw_and_catch_probes_count_exceptions() {
    need("libstdc++");
    let mut t = Target::start("exceptions");
    let pid = t.pid.to_string();
    let session =
        Session::start(&["-p", &pid, "--json", "--args", "-f", "usdt:libstdcxx:throw", "-f", "usdt:libstdcxx:catch"]);
    let n = 400;
    let done = t.ask(&format!("throw {n}"), "done throw");
    assert_eq!(field(&done, "caught"), n, "{done}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["usdt:libstdcxx:throw"], hits["usdt:libstdcxx:catch"]), (n, n), "{hits:?}");
    // throw's second argument is the thrown type's typeinfo, std::runtime_error's:
    // the program's copy of it (a copy relocation), else libstdc++'s.
    let maps = tp::process::read_maps(t.pid).unwrap();
    let modules = tp::symbols::ProcessModules::new(t.pid, &maps).unwrap();
    let typeinfo = (0..modules.len())
        .find_map(|i| {
            let m = modules.get(i).ok()?;
            Some(m.bias.runtime(m.data_symbol("_ZTISt13runtime_error")?).0)
        })
        .expect("the typeinfo's symbol");
    let thrown: Vec<i128> = events(&stdout)
        .iter()
        .filter(|e| e["func"] == "usdt:libstdcxx:throw")
        .map(|e| number(&e["args"]["arg1"]))
        .collect();
    assert_eq!(thrown.len(), n as usize);
    assert!(thrown.iter().all(|&a| a == typeinfo as i128), "{:#x} vs {typeinfo:#x}", thrown[0]);
    assert!(t.quit().success());
}
