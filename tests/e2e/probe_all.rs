//! Probe-all: every probeable function of a real program and of a library
//! it uses, attached at once (thousands of probes, one stop of the world)
//! while the program runs a real workload. Its output must be identical to
//! an uninstrumented run, its exit status 0, and the functions the workload
//! is known to call must have been counted.
//!
//! The programs come from Debian packages (tests/deps.txt; need() installs them): the
//! python3 interpreter, perl, and the sqlite3 shell with libsqlite3. Each
//! workload (targets/workloads/) waits for its first line of input, so tp
//! attaches before the work starts.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util::*;

fn workload(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/workloads").join(name);
    p.to_str().unwrap().to_string()
}

/// A program from a Debian package, by its entry in tests/deps.txt.
fn program(path: &str, dep: &str) -> String {
    need(dep);
    path.to_string()
}

/// Runs `cmd` with `input` on stdin and returns its stdout; it must exit 0.
fn reference(cmd: &[String], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    assert!(wait_timeout(&mut child).success(), "{cmd:?} failed without tp");
    out
}

/// What tp counted: (module, function) -> hits.
type Hits = BTreeMap<(String, String), u64>;

/// Waits until the process has mapped a file whose name starts with each of
/// `modules` (the dynamic loader maps the libraries after the exec).
fn wait_for_modules(pid: u32, modules: &[&str]) {
    poll_until(&format!("{pid} maps {modules:?}"), std::time::Duration::from_millis(1), || {
        let maps = tp::process::read_maps(pid as i32).unwrap();
        let mapped = |m: &&str| maps.iter().any(|x| x.path.rsplit('/').next().is_some_and(|name| name.starts_with(*m)));
        modules.iter().all(mapped)
    });
}

/// Starts `cmd`, attaches tp with `patterns` once `modules` are mapped and
/// before giving it `input`, lets it finish; returns its stdout, tp's
/// stderr, tp's counts and its number of probes.
fn probed(cmd: &[String], input: &[u8], patterns: &[&str], modules: &[&str]) -> (Vec<u8>, String, Hits, usize) {
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).unwrap();
        out
    });
    wait_for_modules(child.id(), modules);
    let pid = child.id().to_string();
    let mut args = vec!["-p", pid.as_str(), "--json"];
    for p in patterns {
        args.extend(["-f", p]);
    }
    let session = Session::start(&args);
    stdin.write_all(input).unwrap();
    drop(stdin);
    let status = wait_timeout(&mut child);
    let out = reader.join().unwrap();
    let (tp_status, tp_out, tp_err) = session.wait();
    assert!(status.success(), "{cmd:?} under {} probes ended with {status:?}; tp said:\n{tp_err}", patterns.join(" "));
    assert!(tp_status.success(), "tp failed: {tp_err}");
    let v = one_process(&tp_out);
    let probes = v["probes"].as_array().unwrap();
    let hits = probes
        .iter()
        .map(|p| {
            let key = (p["module"].as_str().unwrap().to_string(), p["func"].as_str().unwrap().to_string());
            (key, p["hits"].as_u64().unwrap())
        })
        .collect();
    (out, tp_err, hits, probes.len())
}

/// One probe-all run at a time: planning thousands of functions in a debug
/// build is heavy, and three at once on a small machine nears the timeouts.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the workload with and without probes and checks everything.
fn probe_all(cmd: &[String], input: &[u8], patterns: &[&str], modules: &[&str], called: &[(&str, &str)]) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let want = reference(cmd, input);
    assert!(!want.is_empty());
    let (got, tp_err, hits, probes) = probed(cmd, input, patterns, modules);
    assert!(got == want, "output differs under probes:\n{}\n---\n{}", String::from_utf8_lossy(&got), tp_err);
    // One attach, one stop of the world, for all of them.
    let attached: Vec<&str> = tp_err.lines().filter(|l| l.starts_with("tp: attached ")).collect();
    assert_eq!(attached.len(), 1, "{tp_err}");
    assert_eq!(attached[0].matches("target stopped").count(), 1, "{tp_err}");
    let n: usize = attached[0].split_whitespace().nth(2).unwrap().parse().unwrap();
    assert_eq!(n, probes, "{tp_err}");
    assert!(n >= 3000, "only {n} probes: {tp_err}");
    for m in modules {
        let n = hits.keys().filter(|(module, _)| module.starts_with(m)).count();
        assert!(n >= 1000, "only {n} probes in `{m}`: {tp_err}");
    }
    for (m, f) in called {
        let n = hits.iter().find(|((module, func), _)| module.starts_with(m) && func == f).map(|(_, &n)| n);
        assert!(n.is_some_and(|n| n > 0), "`{m}:{f}` should have been counted: {n:?}");
    }
}

#[test]
fn python_and_libc_every_function_at_once() {
    let python = program("/usr/bin/python3", "python3");
    let cmd = [python, workload("probe_all.py")];
    probe_all(
        &cmd,
        b"go\n",
        &["python3*:*", "libc:*"],
        &["python3", "libc.so.6"],
        &[
            ("python3", "_PyEval_EvalFrameDefault"),
            ("python3", "PyList_Append"),
            ("python3", "PyDict_SetItem"),
            ("libc.so.6", "malloc"),
        ],
    );
}

#[test]
fn perl_and_libc_every_function_at_once() {
    let perl = program("/usr/bin/perl", "perl");
    let cmd = [perl, workload("probe_all.pl")];
    probe_all(
        &cmd,
        b"go\n",
        &["perl:*", "libc:*"],
        &["perl", "libc.so.6"],
        &[
            ("perl", "Perl_regexec_flags"),
            ("perl", "Perl_hv_common"),
            ("perl", "Perl_pp_sort"),
            ("libc.so.6", "malloc"),
        ],
    );
}

#[test]
fn sqlite3_with_libsqlite3_and_libc_every_function_at_once() {
    let sqlite3 = program("/usr/bin/sqlite3", "sqlite3");
    let cmd = [sqlite3, ":memory:".to_string()];
    let sql = std::fs::read(workload("probe_all.sql")).unwrap();
    probe_all(
        &cmd,
        &sql,
        &["libsqlite3:*", "libc:*"],
        &["libsqlite3", "libc.so.6"],
        &[
            ("libsqlite3", "sqlite3_prepare_v2"),
            ("libsqlite3", "sqlite3_step"),
            ("libsqlite3", "sqlite3_column_text"),
            ("libc.so.6", "malloc"),
        ],
    );
}
