//! Programs built with musl (Debian's musl-gcc), dynamic and static: musl's
//! dynamic linker has the rendezvous glibc's has (a library a musl program
//! loads is probed before its initializer runs), musl's threads carry the
//! thread pointer tp's runtime reads, and a static musl program is probed
//! from its first instruction under `tp run`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;

use crate::util::*;

/// Builds the bundled target source `source` with musl-gcc into `out`.
fn musl_gcc(source: &str, out: &Path, flags: &[&str]) {
    let targets = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets");
    let status = Command::new("musl-gcc")
        .args(["-O2", "-g", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(targets.join(source))
        .status()
        .expect("run musl-gcc");
    assert!(status.success(), "musl-gcc of {source} failed");
}

/// The musl builds, made once per test run: `counter` static and dynamic,
/// and `dlcycle` with its `libloaded.so` beside it.
fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        need("musl");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("musl");
        std::fs::create_dir_all(&dir).unwrap();
        musl_gcc("counter.c", &dir.join("counter-static"), &["-static"]);
        musl_gcc("counter.c", &dir.join("counter"), &[]);
        musl_gcc("libloaded.c", &dir.join("libloaded.so"), &["-shared", "-fPIC"]);
        musl_gcc("dlcycle.c", &dir.join("dlcycle"), &[]);
        dir
    })
}

/// Runs `tp run --json -o FILE ARGS -- PROGRAM PROGRAM_ARGS` to its end
/// with `input` on the program's stdin: (status, stdout, stderr, the JSON
/// summary).
fn run(args: &[&str], program: &Path, program_args: &[&str], input: &[u8]) -> (ExitStatus, String, String, String) {
    let _shared = shared();
    let name = program.file_name().unwrap().to_string_lossy().into_owned();
    let summary = std::env::temp_dir().join(format!("tp-musl-{name}-{}.json", std::process::id()));
    let mut child = tp_command()
        .args(["run", "--json", "-o", summary.to_str().unwrap()])
        .args(args)
        .arg("--")
        .arg(program)
        .args(program_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tp");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child);
    let json = std::fs::read_to_string(&summary).unwrap_or_default();
    let _ = std::fs::remove_file(&summary);
    (status, out.rest().join("\n"), err.rest().join("\n"), json)
}

/// musl never unloads a library: `dlcycle N` loads libloaded.so once (its
/// initializer calls `loaded_work` once) and calls `loaded_work` N times.
/// Every call is counted, the initializer's included: tp probed the library
/// at musl's rendezvous, once, before anything in it ran.
#[test]
fn a_library_a_musl_program_loads_is_probed_before_its_initializer() {
    let (status, stdout, stderr, json) =
        run(&["-f", "libloaded.so:loaded_work"], &built().join("dlcycle"), &["300"], b"");
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    // The library's own count after each cycle, summed: 2 + 3 + … + 301.
    assert!(stdout.contains(&format!("calls={} checksum=ok ", (2..=301).sum::<u64>())), "{stdout}\n{stderr}");
    assert_eq!(hits_from_json(&json).get("loaded_work"), Some(&301), "{stderr}");
    let at_rendezvous = "loaded libloaded.so: probed 1 more function at the dynamic linker's rendezvous";
    assert_eq!(stderr.lines().filter(|l| l.contains(at_rendezvous)).count(), 1, "{stderr}");
}

/// `tp attach --ret` on musl programs, static and dynamic, whose two threads
/// call the probed functions: counts equal the program's own, every call
/// timed, the code as in the file after.
#[test]
fn musl_programs_static_and_dynamic_are_counted_and_timed_exactly() {
    let dir = built();
    for program in ["counter-static", "counter"] {
        let mut t = Target::start_path(&dir.join(program));
        let pid = t.pid.to_string();
        let session = Session::start(&["-p", &pid, "-f", "foo", "-f", "bar", "--ret", "-q", "--json"]);
        let foo = t.call("foo", 50_000, 2);
        let bar = t.call("bar", 3_000, 2);
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{program}: {stderr}");
        let hits = hits_from_json(&stdout);
        assert_eq!((hits["foo"], hits["bar"]), (foo, bar), "{program}: {stdout}");
        let rows = one_process(&stdout)["probes"].as_array().cloned().unwrap_or_default();
        for row in &rows {
            assert_eq!(row["timed"], row["hits"], "{program}: every call timed: {row}");
        }
        assert_eq!(rows.len(), 2, "{program}: {stdout}");
        assert_code_is_original(&t, &["foo", "bar"]);
        assert!(t.quit().success(), "{program}");
    }
}

/// `tp run` of a static musl program: probed before its first instruction,
/// its calls counted exactly, its exit status handed back.
#[test]
fn a_static_musl_program_is_probed_from_its_first_instruction() {
    let (status, stdout, stderr, json) =
        run(&["-f", "foo"], &built().join("counter-static"), &[], b"call foo 1234 3\nquit\n");
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert!(stdout.contains("done foo calls=3702 checksum=ok"), "{stdout}");
    assert_eq!(hits_from_json(&json).get("foo"), Some(&3702), "{stderr}");
    assert!(stderr.contains("1 probe in before its first instruction"), "{stderr}");
}

/// `tp profile` of a musl program probes a library it loads at musl's
/// rendezvous, as `tp run` and `tp attach` do (the same code): the one
/// load probed before its initializer, every call counted.
#[test]
fn tp_profile_probes_a_library_a_musl_program_loads_at_its_rendezvous() {
    let dir = built();
    let _shared = shared();
    let mut cmd = Command::new(dir.join("dlcycle"));
    cmd.args(["300", "first"]);
    let mut t = Target::spawn(cmd);
    let pid = t.pid.to_string();
    let session = Session::spawn(
        "profile",
        &["-p", &pid, "-f", "libloaded.so:loaded_work", "--json"],
        &[],
        Some("tp: profiling"),
    );
    t.send(b"\n");
    let line = t.out.wait_for("calls=");
    assert!(line.starts_with(&format!("calls={} checksum=ok ", (2..=301).sum::<u64>())), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(t.quit().success());
    assert_eq!(hits_from_json(&stdout).get("loaded_work"), Some(&301), "{stdout}\n{stderr}");
    let at_rendezvous = "loaded libloaded.so: probed 1 more function at the dynamic linker's rendezvous";
    assert_eq!(stderr.lines().filter(|l| l.contains(at_rendezvous)).count(), 1, "{stderr}");
}

/// A static program has no rendezvous: `tp profile` of nothing but a
/// library it has not loaded is refused in one line that says why, and
/// leaves nothing in it.
#[test]
fn tp_profile_of_a_library_a_static_program_lacks_is_refused() {
    let t = Target::start_path(&built().join("counter-static"));
    let pid = t.pid.to_string();
    let line = expect_error(&["profile", "-p", &pid, "-f", "libnope.so:*"], "no function to profile now");
    assert!(line.contains("`libnope.so:*` names a library") && line.contains("a static program"), "{line}");
    assert!(!has_region(t.pid), "a refused profile leaves nothing");
    assert!(t.quit().success());
}
