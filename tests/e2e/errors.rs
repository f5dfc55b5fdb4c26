//! Bad input: one line naming the problem and the fix, exit code != 0, no
//! panic, and the target left untouched.

use std::os::unix::process::CommandExt;

use crate::util::*;

#[test]
fn no_such_process() {
    expect_error(&["attach", "-p", "999999999", "-f", "foo"], "no process with PID 999999999");
    expect_error(&["status", "-p", "999999999"], "no process with PID");
    expect_error(&["detach", "-p", "999999999"], "no process with PID");
}

#[test]
fn unknown_function_suggests_close_names() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "fooo"], "function `fooo` not found");
    assert!(line.contains("did you mean `foo`"), "{line}");
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid), "nothing may be injected when resolution fails");
}

#[test]
fn process_already_traced_is_named_with_its_tracer() {
    let t = Target::start("counter");
    // This test process becomes the target's tracer.
    // SAFETY: plain ptrace calls on a child we own.
    let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, t.pid, 0, 0) };
    assert_eq!(rc, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "foo"], "already traced by PID");
    assert!(line.contains("detach that tracer first"), "{line}");
    // SAFETY: as above.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, t.pid, 0, 0) };
}

#[test]
fn status_of_a_process_without_probes() {
    let t = Target::start("counter");
    expect_error(&["status", "-p", &t.pid.to_string()], "has no tp probes");
}

#[test]
fn list_probes_of_missing_and_non_elf_files() {
    expect_error(&["list-probes", "/nonexistent/binary"], "cannot read `/nonexistent/binary`");
    let script = std::env::temp_dir().join(format!("tp-not-elf-{}", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    expect_error(&["list-probes", script.to_str().unwrap()], "is not an ELF file");
    std::fs::remove_file(&script).unwrap();
}

#[test]
fn conflicting_flags_are_rejected_by_the_parser() {
    let out = tp(&["attach", "-p", "1", "-f", "foo", "--keep", "--duration", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

/// Parse errors keep clap's content (the missing arguments, the allowed
/// values) in one line, exit 2.
#[test]
fn parse_errors_say_what_is_missing_in_one_line() {
    for (args, needle) in [
        (&["attach", "-p", "402"][..], "not provided: --func <NAME>; see `tp attach --help`"),
        (&["run"], "not provided: --func <NAME>, <PROGRAM>..."),
        (&["serve"], "not provided: --listen <ADDR>"),
        (&["disable"], "not provided: --pid <PID>, --func <NAME>"),
        (&["list-probes"], "not provided: <BINARY>"),
        (&["attach", "-p", "1", "-f", "foo", "--stack=lbr"], "'lbr' for '--stack [<HOW>]'; possible values: fp, dwarf"),
        (
            &["attach", "-p", "1", "-f", "foo", "--ring-size", "1000"],
            "1000 is not a power of two from 4 to 1048576; try 512 or 1024",
        ),
        (&["attach", "-p", "1", "-f", "foo", "--ring-size", "0"], "0 is not a power of two from 4 to 1048576; try 4"),
    ] {
        let out = tp(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "tp {args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "tp {args:?}: {stderr}");
        assert!(stderr.starts_with("tp: ") && stderr.contains(needle), "tp {args:?}: {stderr}");
    }
}

/// A user who may not read other users' processes is told tp cannot see
/// them, not that no process holds probes.
#[test]
fn status_and_detach_say_what_they_cannot_see() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "--keep"]));
    for args in [&["status"][..], &["detach"]] {
        let out = tp_command()
            .args(args)
            .uid(65534)
            .gid(65534)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run tp as nobody");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tp {args:?} as nobody: {stderr}");
        assert!(stderr.starts_with("tp: no process that tp can see holds tp probes; it cannot see into "), "{stderr}");
        assert!(stderr.contains("run tp as root, or with CAP_SYS_PTRACE"), "{stderr}");
    }
    assert!(has_region(t.pid), "the kept probe is still there");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo"]);
}

/// `-o FILE` is the results in one format, said by a flag or the file's
/// name; a file whose name says none, two formats, and a format the
/// session cannot produce are refused in one line before anything is
/// touched, and no file is left.
#[test]
fn an_output_format_that_cannot_be_is_refused_before_the_attach() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    let dir = std::env::temp_dir().join(format!("tp-formats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
    for (extra, needle) in [
        (vec!["-o".to_string(), file("out.dat")], "cannot tell the format of"),
        (vec!["-o".to_string(), file("out")], "add --format text|json|chrome|folded|svg"),
        (vec!["-o".to_string(), file("flame.svg")], "a flame graph shows stacks: add --stack"),
        (vec!["--format".to_string(), "folded".to_string(), "--args".to_string()], "folded output shows stacks"),
        (vec!["-o".to_string(), file("t.trace.json")], "a Chrome trace shows calls: add --args or --ret"),
        (vec!["--json".to_string(), "--folded".to_string(), "--stack".to_string()], "two formats (json or folded)"),
        (
            vec!["-o".to_string(), file("m.prom")],
            "`tp attach` writes text, json, chrome, folded or svg, not prometheus",
        ),
    ] {
        let mut args = vec!["attach", "-p", pid.as_str(), "-f", "foo"];
        args.extend(extra.iter().map(String::as_str));
        expect_error(&args, needle);
    }
    expect_error(
        &["profile", "-p", &pid, "-f", "foo", "-o", &file("p.svg")],
        "`tp profile` writes text, json or chrome",
    );
    expect_error(&["status", "-o", &file("s.dat")], "cannot tell the format of");
    let launched = target_path("launched");
    expect_error(
        &["run", "-f", "foo", "--json", "--", launched.to_str().unwrap()],
        "`tp run` writes json results to a file",
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file was made");
    assert!(!has_region(t.pid));
    assert_code_is_original(&t, &["foo"]);
    let _ = std::fs::remove_dir_all(&dir);
}
