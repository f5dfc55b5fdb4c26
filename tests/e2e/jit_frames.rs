//! Frames in JIT code named by the process's perf map (`/tmp/perf-PID.map`):
//! the `jitted` target calls `leaf` from code it copied into anonymous
//! executable memory, and the test writes the map for it (a stale entry
//! and the one that replaces it, lines added while tp runs, a map that is
//! a symbolic link, none at all, one in the /tmp of the target's own PID
//! and mount namespaces); node with `--perf-basic-prof` names its
//! JavaScript functions in the stacks of a native function they call, and
//! a JVM its compiled methods after `jcmd PID Compiler.perfmap`.

use std::io::Write;
#[cfg(target_arch = "x86_64")]
use std::process::{Command, Stdio};

use crate::util::*;

/// `/tmp/perf-PID.map` for process `pid`, removed when dropped.
struct PerfMap(std::path::PathBuf);

impl PerfMap {
    fn of(pid: i32) -> PerfMap {
        let path = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let _ = std::fs::remove_file(&path);
        PerfMap(path)
    }

    fn append(&self, text: &str) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.0).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }
}

impl Drop for PerfMap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Where `jitted` copied its code: (address, size).
fn code_of(t: &mut Target) -> (u64, u64) {
    let line = t.ask("where", "code");
    let word = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap().to_string();
    let at = u64::from_str_radix(word("at=").trim_start_matches("0x"), 16).unwrap();
    (at, word("size=").parse().unwrap())
}

/// `tp attach -p PID ARGS` around `calls N` commands: (stdout, stderr).
fn session(t: &mut Target, args: &[&str], calls: &[u64]) -> (String, String) {
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str(), "-f", "leaf", "--stack"];
    full.extend_from_slice(args);
    let s = Session::start(&full);
    for n in calls {
        t.ask(&format!("calls {n}"), "done calls");
    }
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "{stderr}");
    (stdout, stderr)
}

/// The one folded line that ends with `leaf COUNT`, and its count.
fn folded_leaf(stdout: &str) -> (String, u64) {
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(";leaf ")).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let (stack, n) = lines[0].rsplit_once(' ').unwrap();
    (stack.to_string(), n.parse().unwrap())
}

#[test]
fn frames_in_jit_code_are_named_by_the_latest_entry_of_the_perf_map() {
    let mut t = Target::start("jitted");
    let (at, size) = code_of(&mut t);
    let map = PerfMap::of(t.pid);
    // A stale entry over the same code, replaced by a later line; garbage around them.
    map.append(&format!("{at:x} {size:x} stale_code\nnot a line\n\x1b[2J 5 x\n0x{at:x} 0x{size:x} jit_stub\n"));
    let (stdout, stderr) = session(&mut t, &["--folded"], &[300]);
    let (stack, n) = folded_leaf(&stdout);
    assert!(stack.ends_with(";run_jitted;jit_stub;leaf"), "{stack}\n{stderr}");
    assert_eq!(n, 300);
    assert!(!stderr.contains("perf map"), "{stderr}");

    // In text: the name, its offset, and the map it came from.
    let (stdout, _) = session(&mut t, &[], &[10]);
    let map_name = format!(" (perf-{}.map)", t.pid);
    let named = |l: &str| {
        let offset = l.trim().strip_prefix("jit_stub+0x").and_then(|r| r.strip_suffix(map_name.as_str()));
        offset.and_then(|o| u64::from_str_radix(o, 16).ok()).is_some_and(|o| o > 0 && o <= size)
    };
    assert!(stdout.lines().any(named), "{stdout}");
    assert!(t.quit().success());
}

#[test]
fn a_perf_map_that_grows_is_read_again() {
    let mut t = Target::start("jitted");
    let (at, size) = code_of(&mut t);
    let map = PerfMap::of(t.pid);
    map.append("1000 10 elsewhere\n");
    let pid = t.pid.to_string();
    let mut s = Session::start(&["-p", &pid, "-f", "leaf", "--stack", "--args", "--json"]);
    t.ask("calls 5", "done calls");
    // tp names those calls' stacks before the map grows; then reads it again.
    for _ in 0..5 {
        s.wait_stdout("{\"type\":\"entry\"");
    }
    map.append(&format!("{at:x} {size:x} jit_stub\n"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    t.ask("calls 5", "done calls");
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "{stderr}");
    let callers: Vec<String> =
        json_events(&stdout).iter().filter_map(|e| e["stack"].get(1)?.as_str().map(String::from)).collect();
    assert_eq!(callers.len(), 10, "{stdout}");
    assert!(callers[..5].iter().all(|c| c.starts_with("0x")), "{callers:?}");
    assert!(callers[5..].iter().all(|c| c.starts_with("jit_stub+")), "{callers:?}");
    assert!(t.quit().success());
}

#[test]
fn jit_frames_without_a_perf_map_say_how_to_get_one() {
    let mut t = Target::start("jitted");
    let (at, size) = code_of(&mut t);
    let map = PerfMap::of(t.pid);
    let (stdout, stderr) = session(&mut t, &["--folded"], &[50]);
    let (stack, _) = folded_leaf(&stdout);
    let caller = stack.strip_suffix(";leaf").and_then(|s| s.rsplit(';').next()).unwrap();
    let caller = u64::from_str_radix(caller.trim_start_matches("0x"), 16).unwrap();
    assert!(caller > at && caller <= at + size && stack.contains(";run_jitted;0x"), "{stack}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("JIT code")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(notes[0].starts_with("tp: ") && notes[0].contains("--perf-basic-prof"), "{stderr}");
    assert!(notes[0].contains("Compiler.perfmap"), "{stderr}");

    // A map that is a symbolic link (to a file the process may not read) is not followed.
    let elsewhere = format!("/tmp/tp-test-perf-elsewhere-{}", t.pid);
    std::fs::write(&elsewhere, format!("{at:x} {size:x} secret_name\n")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &map.0).unwrap();
    let (stdout, stderr) = session(&mut t, &["--folded"], &[50]);
    let _ = std::fs::remove_file(&elsewhere);
    assert!(!stdout.contains("secret_name"), "{stdout}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("JIT code")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(notes[0].contains("is a symbolic link"), "{stderr}");
    assert!(t.quit().success());
}

/// A process in PID and mount namespaces of its own, with a /tmp of its
/// own: its map is `/tmp/perf-NSPID.map` there, NSPID as its namespace
/// numbers it (the test writes it through `/proc/PID/root`), and names its
/// JIT code; the same name in tp's own /tmp is not used.
#[test]
#[cfg(target_arch = "x86_64")] // the arm64 VM has no setpriv or unshare
fn the_perf_map_is_the_processs_own_in_its_namespaces() {
    need("setpriv");
    let _shared = shared();
    let jitted = target_path("jitted");
    let script = format!("mount -t tmpfs tp-jit /tmp && exec {}", jitted.display());
    let mut child = KillOnDrop::child(
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.get_mut().stdin.take().unwrap();
    let mut out = Lines::new(child.get_mut().stdout.take().unwrap());
    let ns_pid: i32 = out.wait_for("ready pid=").trim_start_matches("ready pid=").parse().unwrap();
    // unshare's one child, the shell that exec'd the target.
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap();
    let pid: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    assert_ne!(pid, ns_pid);
    let mut ask = |cmd: &str, answer: &str| {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        out.wait_for(answer)
    };
    let line = ask("where", "code");
    let word = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap().to_string();
    let at = u64::from_str_radix(word("at=").trim_start_matches("0x"), 16).unwrap();
    let size: u64 = word("size=").parse().unwrap();
    std::fs::write(format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map"), format!("{at:x} {size:x} own_stub\n")).unwrap();
    // Names in tp's /tmp under either number are not the process's.
    let decoys = [PerfMap::of(pid), PerfMap::of(ns_pid)];
    for d in &decoys {
        d.append(&format!("{at:x} {size:x} decoy\n"));
    }

    let pid_s = pid.to_string();
    let s = Session::start(&["-p", &pid_s, "-f", "leaf", "--stack", "--folded"]);
    ask("calls 40", "done calls");
    let (status, stdout, stderr) = s.interrupt();
    assert!(status.success(), "{stderr}");
    let (stack, n) = folded_leaf(&stdout);
    assert!(stack.ends_with(";run_jitted;own_stub;leaf") && n == 40, "{stdout}\n{stderr}");
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    assert!(wait_timeout(child.get_mut()).success(), "the target must exit 0");
}

/// node with `--perf-basic-prof` (and its interpreted functions on the
/// native stack too) hashes in a loop from a JavaScript function named
/// `hashLoop`: the stacks of OpenSSL's `EVP_DigestUpdate` name it, from
/// the map node writes as it compiles.
#[test]
#[cfg(target_arch = "x86_64")] // the arm64 VM has no node
fn node_functions_are_named_in_the_stacks_of_what_they_call() {
    need("nodejs");
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("tp-jit-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("hash.js");
    std::fs::write(
        &script,
        "const crypto = require('crypto');\n\
         const data = Buffer.alloc(64, 1);\n\
         function hashLoop(n) {\n\
           let last;\n\
           for (let i = 0; i < n; i++) last = crypto.createHash('sha256').update(data).digest();\n\
           return last;\n\
         }\n\
         hashLoop(1000);\n\
         console.log('ready');\n\
         setInterval(() => hashLoop(20), 5);\n",
    )
    .unwrap();
    let mut child = KillOnDrop::child(
        Command::new("node")
            .args(["--perf-basic-prof", "--interpreted-frames-native-stack"])
            .arg(&script)
            // Where V8 writes its isolate-*.log.
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let _map = PerfMap(format!("/tmp/perf-{}.map", child.id()).into());
    let mut out = Lines::new(child.get_mut().stdout.take().unwrap());
    out.wait_for("ready");
    let pid = child.id().to_string();
    let args = ["attach", "-p", &pid, "-f", "EVP_DigestUpdate", "--stack", "--folded", "-d", "2"];
    // node's code is large: a debug build of tp takes its time over it.
    let got = run_within(tp_command().args(args), std::time::Duration::from_secs(300));
    let stdout = expect_success(&args, &got);
    let _ = std::fs::remove_dir_all(&dir);
    let named: Vec<&str> = stdout
        .lines()
        .filter(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s.ends_with(";EVP_DigestUpdate")))
        .filter(|l| l.split(';').any(|f| f.contains("hashLoop") && f.contains("hash.js")))
        .collect();
    assert!(!named.is_empty(), "{stdout}\n{}", String::from_utf8_lossy(&got.stderr));
    assert!(!String::from_utf8_lossy(&got.stderr).contains("JIT code"), "{}", String::from_utf8_lossy(&got.stderr));
}

/// A JVM (with frame pointers kept in compiled code, as perf needs too)
/// runs `yieldLoop`, compiled, calling `Thread.yield()`; after `jcmd PID
/// Compiler.perfmap` the stacks of libjvm's `JVM_Yield` name the method
/// and the native method's wrapper, from the map's `0x`-prefixed lines.
#[test]
#[cfg(target_arch = "x86_64")] // the arm64 VM has no JVM
fn jvm_methods_are_named_after_jcmd_writes_the_perf_map() {
    let _shared = shared();
    let dir = compile_java("YieldLoop");
    let (mut java, mut out, pid) = start_java(&dir, "YieldLoop", &["-Xmx128m", "-XX:+PreserveFramePointer"]);
    let _map = PerfMap(format!("/tmp/perf-{pid}.map").into());
    let jcmd = run(Command::new("jcmd").args([pid.as_str(), "Compiler.perfmap"]));
    assert!(jcmd.status.success(), "{}", String::from_utf8_lossy(&jcmd.stderr));

    let args = ["attach", "-p", &pid, "-f", "JVM_Yield", "--stack", "--folded", "-d", "2"];
    let got = run_within(tp_command().args(args), std::time::Duration::from_secs(300));
    let stdout = expect_success(&args, &got);
    let named = stdout.lines().any(|l| {
        let frames: Vec<&str> = l.rsplit_once(' ').map_or(l, |(s, _)| s).split(';').collect();
        frames.ends_with(&["void YieldLoop.yieldLoop(int)", "void java.lang.Thread.yield()", "JVM_Yield"])
    });
    assert!(named, "{stdout}\n{}", String::from_utf8_lossy(&got.stderr));

    java.get_mut().stdin.take().unwrap().write_all(b"quit\n").unwrap();
    out.wait_for("calls ");
    let status = wait_timeout(java.get_mut());
    assert!(status.success(), "java: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
