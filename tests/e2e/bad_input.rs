//! More bad input (after errors.rs): zombies, 32-bit and foreign binaries,
//! refused and stripped functions, a thread ID for a PID, an unprivileged
//! user, and values the parser must turn away. Each is one line naming the
//! fix, a non-zero exit, no panic, and the target untouched.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

/// A scratch directory for files a test builds, under cargo's target dir.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad_input");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}", std::process::id()))
}

/// Runs a build command; panics with its output if it fails.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A copy of `counter` with `e_machine` set to `machine`.
fn relabelled_counter(machine: u16) -> PathBuf {
    let mut bytes = std::fs::read(target_path("counter")).unwrap();
    bytes[18..20].copy_from_slice(&machine.to_le_bytes());
    let path = scratch(&format!("counter-machine-{machine}"));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_zombie_is_named() {
    let mut child = Command::new("true").spawn().unwrap();
    wait_until("the child is a zombie", || state_of(child.id()) == Some('Z'));
    let pid = child.id().to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "foo"], "is a zombie");
    assert!(line.contains("nothing left to trace"), "{line}");
    child.wait().unwrap();
}

#[test]
fn a_32_bit_process_and_file_are_refused() {
    // gcc-multilib provides the 32-bit runtime.
    need("multilib");
    let exe = scratch("counter-32");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("targets");
    run(Command::new("cc")
        .args(["-m32", "-O2", "-pthread", "-I"])
        .arg(&src)
        .arg(src.join("counter.c"))
        .arg("-o")
        .arg(&exe));
    let t = Target::start_path(&exe);
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "foo"], "is a 32-bit binary");
    assert!(line.contains("tp traces 64-bit processes only"), "{line}");
    assert!(!has_region(t.pid));
    expect_error(&["list-probes", exe.to_str().unwrap()], "is a 32-bit binary");
    std::fs::remove_file(&exe).unwrap();
}

#[test]
fn a_foreign_architecture_file_is_named() {
    let riscv = relabelled_counter(243);
    let line = expect_error(&["list-probes", riscv.to_str().unwrap()], "is a riscv binary");
    assert!(line.contains("tp knows x86-64 and aarch64"), "{line}");
    std::fs::remove_file(&riscv).unwrap();
    // x86-64 code labelled aarch64: nonsense to decode, but never a panic.
    let arm = relabelled_counter(183);
    let out = tp(&["list-probes", arm.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some() && !stderr.contains("panicked"), "{:?} {stderr}", out.status);
    std::fs::remove_file(&arm).unwrap();
}

#[test]
fn a_refused_function_gives_the_reason() {
    let t = Target::start("hammer");
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "tiny"], "cannot probe `tiny`: too short");
    assert!(line.contains("a probe needs 5"), "{line}");
    assert!(!has_region(t.pid), "nothing may be injected when planning fails");
}

#[test]
fn a_stripped_binary_without_the_symbol_says_so() {
    let exe = scratch("counter-stripped");
    std::fs::copy(target_path("counter"), &exe).unwrap();
    run(Command::new("strip").arg(&exe));
    let t = Target::start_path(&exe);
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "foo"], "function `foo` not found");
    assert!(line.contains("is stripped"), "{line}");
    assert!(!has_region(t.pid));
    // list-probes of the stripped file works: it lists what .dynsym holds.
    let args = ["list-probes", exe.to_str().unwrap()];
    expect_success(&args, &tp(&args));
    drop(t);
    std::fs::remove_file(&exe).unwrap();
}

#[test]
fn a_thread_id_is_not_taken_for_its_process() {
    let mut t = Target::start("counter");
    t.ask("spin 1", "spinning");
    let tid = tp::process::threads(t.pid).unwrap().into_iter().find(|&tid| tid.as_raw() != t.pid).unwrap();
    let line = expect_error(&["attach", "-p", &tid.to_string(), "-f", "foo"], &format!("thread of process {}", t.pid));
    assert!(line.contains(&format!("-p {}", t.pid)), "{line}");
    assert!(!has_region(t.pid));
    t.ask("stop", "stopped");
}

#[test]
fn an_unprivileged_user_is_told_what_is_needed() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    for args in [
        vec!["attach", "-p", pid.as_str(), "-f", "foo"],
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--keep"],
        vec!["status", "-p", pid.as_str()],
        vec!["detach", "-p", pid.as_str()],
    ] {
        // As `nobody`: a process of root's may not be traced.
        let out = Command::new(tp_path())
            .args(&args)
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::null())
            .output()
            .expect("run tp as nobody");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tp {args:?} as nobody: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "tp {args:?}: {stderr}");
        assert!(lines[0].starts_with(&format!("tp: permission denied tracing process {pid}")), "tp {args:?}: {stderr}");
        assert!(lines[0].contains("run as root or with CAP_SYS_PTRACE"), "{stderr}");
    }
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
}

#[test]
fn values_the_parser_must_refuse() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    for args in [
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--duration", "nan"],
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--duration=-1"],
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--duration", "inf"],
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--duration", "1e30"],
        vec!["attach", "-p", "abc", "-f", "foo"],
        vec!["demo", "--duration", "nan"],
    ] {
        let out = tp(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "tp {args:?}: {stderr}");
        assert!(stderr.starts_with("error: invalid value"), "tp {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    for args in [vec!["attach", "-p", "0", "-f", "foo"], vec!["attach", "--pid=-1", "-f", "foo"]] {
        expect_error(&args, "no process with PID");
    }
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid), "a refused command line must not touch the target");
}
