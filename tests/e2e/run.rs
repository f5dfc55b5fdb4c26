//! `tp run`: a program started under tp, probed from its entry point, let
//! go, and summed up at its exit; its exit status, stdin, stdout and stderr
//! are its own. Counts are checked against what the program says it did,
//! against what a real program (ripgrep, python3) must do, and against
//! libraries it loads later.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::util::*;

/// A scratch directory of this test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tp-run-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `tp run ARGS` with `input` on its stdin; (status, stdout, stderr).
fn tp_run(args: &[&str], input: &[u8]) -> (std::process::ExitStatus, String, String) {
    let _shared = shared();
    let mut child = tp_command()
        .arg("run")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tp");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child);
    let join = |l: Vec<String>| l.iter().map(|s| format!("{s}\n")).collect::<String>();
    (status, join(out.rest()), join(err.rest()))
}

/// The hits of each function in the JSON summary tp wrote to `path`.
fn hits_in(path: &Path) -> std::collections::BTreeMap<String, u64> {
    hits_from_json(&std::fs::read_to_string(path).unwrap())
}

#[test]
fn run_counts_a_short_program_exactly_and_hands_back_its_status() {
    let dir = Scratch::new("status");
    let summary = dir.path("summary.json");
    let launched = target_path("launched");
    let (status, stdout, stderr) = tp_run(
        &[
            "-f",
            "foo",
            "--json",
            "-o",
            summary.to_str().unwrap(),
            "--",
            launched.to_str().unwrap(),
            "calls",
            "100000",
            "exit",
            "7",
        ],
        b"",
    );
    assert_eq!(status.code(), Some(7), "the program's status is tp's; stderr: {stderr}");
    assert_eq!(stdout, "foo calls=100000 checksum=ok\n", "stdout is the program's alone");
    assert!(stderr.lines().any(|l| l == "to stderr"), "{stderr}");
    assert!(stderr.contains("probe in before its first instruction"), "{stderr}");
    assert!(stderr.contains("exited with status 7"), "{stderr}");
    assert_eq!(hits_in(&summary)["foo"], 100_000, "every call, from the first");
}

#[test]
fn run_reports_a_death_by_signal_as_a_shell_does() {
    let launched = target_path("launched");
    let (status, stdout, stderr) =
        tp_run(&["-f", "foo", "--", launched.to_str().unwrap(), "calls", "10", "kill", "10"], b"");
    assert_eq!(status.code(), Some(128 + 10), "128 + SIGUSR1; stderr: {stderr}");
    assert_eq!(stdout, "foo calls=10 checksum=ok\n");
    assert!(stderr.contains("killed by SIGUSR1"), "{stderr}");
    // The summary goes to stderr without -o: the table's row for foo.
    let row = stderr.lines().find(|l| l.starts_with("foo ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(row.trim_end().ends_with(" 10"), "{row}");
}

#[test]
fn run_leaves_stdin_to_the_program() {
    let launched = target_path("launched");
    let input = "one\ntwo\nthree\n";
    let dir = Scratch::new("stdin");
    let summary = dir.path("summary.json");
    let (status, stdout, stderr) = tp_run(
        &["-f", "foo", "-o", summary.to_str().unwrap(), "--", launched.to_str().unwrap(), "echo"],
        input.as_bytes(),
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, input, "the program read tp's stdin and wrote tp's stdout");
    assert!(stderr.contains("foo calls=3 checksum=ok"), "{stderr}");
    assert_eq!(hits_in(&summary)["foo"], 3, "the summary (JSON, by the file's name) counts the program's 3 calls");
    // JSON never goes to stdout (the program's) nor stderr (tp's lines).
    let line = expect_error(&["run", "-f", "foo", "--json", "--", launched.to_str().unwrap()], "add -o FILE");
    assert!(line.starts_with("tp: `tp run` writes json results to a file"), "{line}");
}

#[test]
fn run_refuses_a_program_it_cannot_start_in_one_line() {
    let dir = Scratch::new("refuse");
    let not_exec = dir.path("plain.txt");
    std::fs::write(&not_exec, "not a program\n").unwrap();
    for (program, code, needle) in [
        ("/no/such/program", 127, "cannot run `/no/such/program`: cannot execute: No such file or directory"),
        ("no-such-program-in-path", 127, "cannot run `no-such-program-in-path`: command not found in PATH"),
        (not_exec.to_str().unwrap(), 126, "Permission denied"),
    ] {
        let (status, stdout, stderr) = tp_run(&["-f", "foo", "--", program], b"");
        assert_eq!(status.code(), Some(code), "{program}: {stderr}");
        assert!(stdout.is_empty());
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].starts_with("tp: ") && lines[0].contains(needle), "{stderr}");
    }
}

#[test]
fn run_kills_a_program_it_cannot_probe_before_it_runs() {
    // libc's strlen is an IFUNC symbol (its address is the resolver's),
    // and named exactly, a function tp cannot probe is an error. The
    // program must not run one instruction of its own: it prints nothing.
    let launched = target_path("launched");
    let (status, stdout, stderr) =
        tp_run(&["-f", "foo", "-f", "libc:strlen", "--", launched.to_str().unwrap(), "calls", "5"], b"");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stdout, "", "the program never ran");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("tp: cannot probe `strlen`"), "{stderr}");
}

#[test]
fn run_probes_a_library_the_program_loads_later() {
    // libuser dlopens libgamma.so on command; the probe on its lib_work
    // goes in when tp sees the new library, before the test lets it call.
    let _shared = shared();
    let dir = Scratch::new("later");
    let summary = dir.path("summary.json");
    let mut child = KillOnDrop::child(
        tp_command()
            .args(["run", "-f", "libalpha:lib_work", "-f", "libgamma:lib_work", "-o", summary.to_str().unwrap(), "--"])
            .arg(target_path("libuser"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = child.get_mut();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let started = err.wait_for("tp: started");
    let pid = out.wait_for("ready pid=").trim_start_matches("ready pid=").to_string();
    assert!(started.contains(&format!("as process {pid};")), "{started}");
    let waiting = err.wait_for("tp: no module `libgamma`");
    assert!(waiting.ends_with("tp probes it if a library loaded later defines it"), "{waiting}");
    let mut ask = |cmd: &str, answer: &str| {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        out.wait_for(answer)
    };
    assert!(ask("call alpha 300", "done").contains("calls=300 checksum=ok"));
    ask("load gamma", "loaded gamma");
    let loaded = err.wait_for(&format!("tp: process {pid} loaded libgamma.so"));
    assert!(loaded.contains("probed 1 more function"), "{loaded}");
    assert!(ask("call gamma 250", "done").contains("calls=250 checksum=ok"));
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let status = wait_timeout(child);
    let stderr = err.rest().join("\n");
    assert!(status.success(), "{stderr}");
    let summary = std::fs::read_to_string(&summary).unwrap();
    let v = one_process(&summary);
    let hits = |module: &str| {
        v["probes"].as_array().unwrap().iter().find(|p| p["module"].as_str().unwrap().starts_with(module)).unwrap()
            ["hits"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((hits("libalpha"), hits("libgamma")), (300, 250), "{summary}");
}

/// ripgrep over a tree tp made: every directory opened, read to its end
/// and closed once, so libc's opendir and closedir run once per directory
/// and readdir once per entry, once for each of `.` and `..`, and once more
/// for the end; rg's own count of matching files is checked beside them.
#[test]
fn run_traces_ripgrep_over_a_tree_completely() {
    need("ripgrep");
    let dir = Scratch::new("rg");
    let tree = dir.path("tree");
    let mut dirs = 0;
    let mut entries = 0;
    let mut matching = 0;
    for d in ["", "a", "b", "c", "a/x", "a/y", "a/x/deep", "b/z"] {
        let p = tree.join(d);
        std::fs::create_dir_all(&p).unwrap();
        dirs += 1;
        if !d.is_empty() {
            entries += 1; // its entry in its parent
        }
        for f in 0..4 {
            let text = if f % 2 == 0 { format!("needle in {d}/{f}\n") } else { "hay\n".to_string() };
            std::fs::write(p.join(format!("f{f}.txt")), text).unwrap();
            entries += 1;
            matching += usize::from(f % 2 == 0);
        }
    }
    let summary = dir.path("summary.json");
    let (status, stdout, stderr) = tp_run(
        &[
            "-f",
            "libc:opendir",
            "-f",
            "libc:closedir",
            "-f",
            "libc:readdir",
            "--json",
            "-o",
            summary.to_str().unwrap(),
            "--",
            "rg",
            "--no-config",
            "-c",
            "needle",
            tree.to_str().unwrap(),
        ],
        b"",
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), matching, "rg's own count of matching files: {stdout}");
    let hits = hits_in(&summary);
    assert_eq!(hits["opendir"], dirs, "{hits:?}");
    assert_eq!(hits["closedir"], dirs, "{hits:?}");
    assert_eq!(hits["readdir"], entries + 3 * dirs, "{hits:?}");
}

/// python3 -c with a loop of 1,234 os.getppid() calls: libc's getppid runs
/// exactly that often (CPython's startup never calls it).
#[test]
fn run_traces_python_exactly() {
    need("python3");
    let dir = Scratch::new("py");
    let summary = dir.path("summary.json");
    let (status, stdout, stderr) = tp_run(
        &[
            "-f",
            "libc:getppid",
            "--json",
            "-o",
            summary.to_str().unwrap(),
            "--",
            "/usr/bin/python3",
            "-c",
            "import os\nfor _ in range(1234): os.getppid()\nprint('python done')",
        ],
        b"",
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, "python done\n");
    assert_eq!(hits_in(&summary)["getppid"], 1234);
}

/// Returns and latency in `tp run`: the summary times every call.
#[test]
fn run_records_returns_from_the_first_call() {
    let launched = target_path("launched");
    let dir = Scratch::new("ret");
    let file = dir.path("summary.json");
    let path = file.to_str().unwrap();
    let (status, stdout, stderr) =
        tp_run(&["-f", "foo", "--ret", "-q", "-o", path, "--", launched.to_str().unwrap(), "calls", "2000"], b"");
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, "foo calls=2000 checksum=ok\n");
    let summary = std::fs::read_to_string(&file).unwrap();
    assert_eq!(summary_doc(&summary)["command"], "run");
    let v = one_process(&summary);
    let foo = &v["probes"][0];
    assert_eq!((foo["hits"].as_u64(), foo["timed"].as_u64()), (Some(2000), Some(2000)), "{summary}");
    assert_eq!(v["lost_events"].as_u64(), Some(0));
}
