//! More bad input (after errors.rs): zombies, 32-bit and foreign binaries,
//! refused and stripped functions, a thread ID for a PID, an unprivileged
//! user, and values the parser must turn away. Each is one line naming the
//! fix, a non-zero exit, no panic, and the target untouched.

use std::os::unix::ffi::OsStrExt;
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
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the 32-bit build is x86-64's
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

/// Writes a 32-bit program to `exe`: the counter built with `-m32`
/// (gcc-multilib provides the 32-bit runtime).
#[cfg(target_arch = "x86_64")]
fn build_32_bit(exe: &Path) {
    need("multilib");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("targets");
    run(Command::new("cc")
        .args(["-m32", "-O2", "-pthread", "-I"])
        .arg(&src)
        .arg(src.join("counter.c"))
        .arg("-o")
        .arg(exe));
}

/// Writes a 32-bit program to `exe`: an AArch32 executable made here (no
/// compiler for it is at hand), one segment whose code waits in pause(2)
/// forever: `mov r7, #29; svc #0; b .-8`.
#[cfg(target_arch = "aarch64")]
fn build_32_bit(exe: &Path) {
    use std::os::unix::fs::PermissionsExt;
    const BASE: u32 = 0x1_0000;
    const CODE: u32 = 52 + 32; // after the ELF and program headers
    let code: [u32; 3] = [0xe3a0_701d, 0xef00_0000, 0xeaff_fffc];
    let size = CODE + 4 * code.len() as u32;
    let mut b: Vec<u8> = b"\x7fELF\x01\x01\x01".to_vec();
    b.resize(16, 0);
    let half = |b: &mut Vec<u8>, v: u16| b.extend(v.to_le_bytes());
    let word = |b: &mut Vec<u8>, v: u32| b.extend(v.to_le_bytes());
    half(&mut b, 2); // ET_EXEC
    half(&mut b, 40); // ARM
    word(&mut b, 1);
    word(&mut b, BASE + CODE); // e_entry
    word(&mut b, 52); // e_phoff
    word(&mut b, 0);
    word(&mut b, 0x0500_0000); // EABI version 5
    for v in [52u16, 32, 1, 40, 0, 0] {
        half(&mut b, v); // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    }
    for v in [1u32, 0, BASE, BASE, size, size, 5, 0x1000] {
        word(&mut b, v); // PT_LOAD of the whole file, R-X
    }
    for w in code {
        word(&mut b, w);
    }
    std::fs::write(exe, &b).unwrap();
    std::fs::set_permissions(exe, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_32_bit_process_and_file_are_refused() {
    let exe = scratch("counter-32");
    build_32_bit(&exe);
    // (The counter waits for commands on its stdin, which the child's handle keeps open.)
    let child =
        KillOnDrop::child(Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap_or_else(|e| {
            panic!("run the 32-bit program {} (a kernel without 32-bit support?): {e}", exe.display())
        }));
    let child_id = child.id();
    let exe_link = format!("/proc/{child_id}/exe");
    wait_until("the 32-bit program runs", || std::fs::read_link(&exe_link).is_ok_and(|l| l == exe));
    let line = expect_error(&["attach", "-p", &child_id.to_string(), "-f", "foo"], "is a 32-bit binary");
    assert!(line.contains("tp traces 64-bit processes only"), "{line}");
    assert!(!has_region(child_id));
    expect_error(&["list-probes", exe.to_str().unwrap()], "is a 32-bit binary");
    drop(child);
    std::fs::remove_file(&exe).unwrap();
}

/// A 32-bit process whose file is mapped nowhere, as in the middle of its
/// exec (the executable is set before the kernel maps it): still named
/// 32-bit, not "no executable mappings".
#[test]
#[cfg(target_arch = "x86_64")]
fn a_32_bit_process_caught_before_its_file_is_mapped_is_named() {
    need("multilib");
    let exe = scratch("unmapped32");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("targets/unmapped32.c");
    run(Command::new("cc").args(["-m32", "-static", "-O2"]).arg(&src).arg("-o").arg(&exe));
    let mut child = KillOnDrop::child(Command::new(&exe).stdout(Stdio::piped()).spawn().unwrap());
    let mut out = Lines::new(child.get_mut().stdout.take().unwrap());
    out.wait_for("ready");
    let id = child.id();
    let maps = std::fs::read_to_string(format!("/proc/{id}/maps")).unwrap();
    assert!(!maps.contains(exe.to_str().unwrap()), "the program should have unmapped its file: {maps}");
    let line = expect_error(&["attach", "-p", &id.to_string(), "-f", "foo"], "is a 32-bit binary");
    assert!(line.contains("tp traces 64-bit processes only"), "{line}");
    assert!(!has_region(id));
    drop(child);
    std::fs::remove_file(&exe).unwrap();
}

/// The other architecture tp knows: its ELF machine number.
#[cfg(target_arch = "x86_64")]
const OTHER_MACHINE: u16 = 183;
#[cfg(target_arch = "aarch64")]
const OTHER_MACHINE: u16 = 62;

#[test]
fn a_foreign_architecture_file_is_named() {
    let riscv = relabelled_counter(243);
    let line = expect_error(&["list-probes", riscv.to_str().unwrap()], "is a riscv binary");
    assert!(line.contains("tp knows x86-64 and aarch64"), "{line}");
    std::fs::remove_file(&riscv).unwrap();
    // Code labelled as the other architecture's: nonsense to decode, but never a panic.
    let other = relabelled_counter(OTHER_MACHINE);
    let out = tp(&["list-probes", other.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some() && !stderr.contains("panicked"), "{:?} {stderr}", out.status);
    std::fs::remove_file(&other).unwrap();
}

/// A function tp refuses, in a bundled target: hammer's `tiny`, a bare
/// `ret`, is shorter than a jump on x86-64; on AArch64 a `ret` is a probe
/// site like any other, and prologues' `p_svc` starts with a syscall.
#[cfg(target_arch = "x86_64")]
const REFUSED: (&str, &str, &str) = ("hammer", "tiny", "cannot probe `tiny`: too short (1 bytes, a probe needs 5)");
#[cfg(target_arch = "aarch64")]
const REFUSED: (&str, &str, &str) = ("prologues", "p_svc", "cannot probe `p_svc`: `svc`");

#[test]
fn a_refused_function_gives_the_reason() {
    let (target, func, why) = REFUSED;
    let t = Target::start(target);
    let pid = t.pid.to_string();
    expect_error(&["attach", "-p", &pid, "-f", func], why);
    assert!(!has_region(t.pid), "nothing may be injected when planning fails");
}

#[test]
fn a_stripped_binary_without_the_symbol_says_so() {
    let exe = scratch("counter-stripped");
    std::fs::copy(target_path("counter-nosyms"), &exe).unwrap();
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
    let yama = std::path::Path::new("/proc/sys/kernel/yama/ptrace_scope").exists();
    for args in [
        vec!["attach", "-p", pid.as_str(), "-f", "foo"],
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--keep"],
        vec!["status", "-p", pid.as_str()],
        vec!["detach", "-p", pid.as_str()],
        vec!["enable", "-p", pid.as_str(), "--all"],
        vec!["disable", "-p", pid.as_str(), "-f", "foo"],
        vec!["list-probes", "-p", pid.as_str()],
        vec!["profile", "-p", pid.as_str(), "-f", "foo"],
    ] {
        // As `nobody`: a process of root's may not be traced.
        let out =
            tp_command().args(&args).uid(65534).gid(65534).stdin(Stdio::null()).output().expect("run tp as nobody");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tp {args:?} as nobody: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "tp {args:?}: {stderr}");
        assert!(lines[0].starts_with(&format!("tp: permission denied tracing process {pid}")), "tp {args:?}: {stderr}");
        assert!(lines[0].contains("run as root or with CAP_SYS_PTRACE"), "{stderr}");
        assert_eq!(lines[0].contains("ptrace_scope"), yama, "the Yama hint only where Yama exists: {stderr}");
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
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "-d", "1e300"],
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "-d", "1e20"],
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "-d", "nan"],
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "-d", "inf"],
    ] {
        let out = tp(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "tp {args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "tp {args:?}: {stderr}");
        assert!(stderr.starts_with("tp: invalid value"), "tp {args:?}: {stderr}");
        assert!(stderr.contains(&format!("see `tp {} --help`", args[0])), "tp {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    for args in [vec!["attach", "-p", "0", "-f", "foo"], vec!["attach", "--pid=-1", "-f", "foo"]] {
        expect_error(&args, "no process with PID");
    }
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid), "a refused command line must not touch the target");
}

#[test]
fn parse_errors_are_one_line() {
    let not_utf8 = std::ffi::OsStr::from_bytes(b"\xff\xfe");
    let text_cases = [
        vec!["attach", "-p", "-1", "-f", "foo"],
        vec!["profile", "-p", "1", "-f", "foo", "-d", "-1"],
        vec!["attach", "-p", "1", "-f", "foo", "--bogus"],
        vec!["frobnicate"],
        vec!["attach", "-p", "\x1b[2J", "-f", "foo"],
    ];
    let mut cases: Vec<Vec<&std::ffi::OsStr>> =
        text_cases.iter().map(|v| v.iter().map(std::ffi::OsStr::new).collect()).collect();
    cases.push(vec!["attach".as_ref(), "-p".as_ref(), not_utf8, "-f".as_ref(), "foo".as_ref()]);
    for args in cases {
        let out = crate::util::run(tp_command().args(&args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "tp {args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "tp {args:?}: {stderr}");
        assert!(stderr.starts_with("tp: ") && stderr.contains("--help`"), "tp {args:?}: {stderr}");
        assert!(!stderr.contains('\x1b'), "the echoed argument is escaped: {stderr:?}");
    }
    // Help and version are not errors.
    for args in [["--help"], ["--version"]] {
        let out = tp(&args);
        assert!(out.status.success() && !out.stdout.is_empty(), "tp {args:?}");
    }
}

#[test]
fn tp_cannot_trace_itself() {
    // `exec` keeps the shell's PID, which `$$` names: tp is given its own.
    let script = format!("exec {} attach -p $$ -f foo", tp_path().display());
    let out = crate::util::run(Command::new("sh").args(["-c", &script]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("tp: process ") && stderr.contains("tp cannot trace itself"), "{stderr}");
}

#[test]
fn list_probes_reads_only_regular_binaries() {
    expect_error(&["list-probes", "/dev/zero"], "`/dev/zero` is a character device, not a regular file");
    expect_error(&["list-probes", "/"], "`/` is a directory, not a regular file");
    let fifo = scratch("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Opening a FIFO for reading blocks until a writer comes: tp must not.
    expect_error(&["list-probes", fifo.to_str().unwrap()], "is a FIFO, not a regular file");
    std::fs::remove_file(&fifo).unwrap();
    // A core dump: the counter relabelled ET_CORE.
    let mut core = std::fs::read(target_path("counter")).unwrap();
    core[16..18].copy_from_slice(&4u16.to_le_bytes());
    let core_path = scratch("core");
    std::fs::write(&core_path, core).unwrap();
    expect_error(&["list-probes", core_path.to_str().unwrap()], "is a core dump");
    std::fs::remove_file(&core_path).unwrap();
    // A bare 64-bit ELF header: an executable of no machine, nothing after it.
    let mut bare = vec![0u8; 64];
    bare[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    bare[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    bare[20..24].copy_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    bare[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    let bare_path = scratch("bare-elf");
    std::fs::write(&bare_path, bare).unwrap();
    let line = expect_error(&["list-probes", bare_path.to_str().unwrap()], "ELF machine 0, which tp does not know");
    assert!(line.contains("tp knows x86-64 and aarch64") && !line.contains("a an"), "{line}");
    std::fs::remove_file(&bare_path).unwrap();
    // An object file, not linked yet.
    let object = target_path("counter.o");
    expect_error(&["list-probes", object.to_str().unwrap()], "is an object file (.o), not linked yet");
}

#[test]
fn an_output_file_that_cannot_be_created_is_refused_before_the_attach() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    let bad = "/nonexistent/dir/trace.json";
    for args in [
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--args", "-o", bad],
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "-d", "5", "-o", bad],
    ] {
        expect_error(&args, "cannot create `/nonexistent/dir/trace.json`");
        assert_code_is_original(&t, &["foo"]);
        assert!(!has_region(t.pid), "nothing was injected: {args:?}");
    }
}

#[test]
fn an_error_after_the_attach_restores_the_probes() {
    // The results go to a file that takes no bytes: the first write of
    // the session's events fails once the probes are live, and the probes
    // come out again before tp reports it.
    let mut t = Target::start("counter");
    t.ask("spin 2", "spinning");
    let pid = t.pid.to_string();
    for args in [
        vec!["attach", "-p", pid.as_str(), "-f", "foo", "--args", "--format", "json", "-o", "/dev/full"],
        vec!["profile", "-p", pid.as_str(), "-f", "foo", "--format", "chrome", "-o", "/dev/full"],
    ] {
        let out = tp(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tp {args:?}: {stderr}");
        // The error, after the status lines of the attach, and nothing else.
        let lines: Vec<&str> = stderr.lines().collect();
        let (error, status) = lines.split_last().unwrap_or_else(|| panic!("tp {args:?} printed nothing"));
        assert!(error.contains("writing `/dev/full`: No space left on device"), "{stderr}");
        assert!(status.iter().all(|l| l.starts_with("tp: attached") || l.starts_with("tp: profiling")), "{stderr}");
        assert_code_is_original(&t, &["foo"]);
        assert!(!has_region(t.pid), "tp's memory is gone too: {args:?}");
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
}
