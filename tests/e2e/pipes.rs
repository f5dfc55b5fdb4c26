//! tp in a pipeline: a reader that goes away (`tp attach … | head -1`) and
//! an output that cannot be written (`> /dev/full`) end the session as
//! Ctrl-C does, for every output mode, with one and three processes and a
//! short `-d`: every probe removed from every process, tp's memory
//! unmapped, the targets' checksums intact, and exit status 141 (the
//! reader left) or 74 (the output failed), with one line saying so.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// How long tp may take to end once its reader is gone or its output
/// failed: the session checks its streams every 100 ms.
const ENDS_WITHIN: Duration = Duration::from_secs(1);
/// [`ENDS_WITHIN`] on a CPU emulated in a VM (`TP_TEST_CPU` names it:
/// the AArch64 stage), tens of times slower than a real one.
const ENDS_WITHIN_EMULATED: Duration = Duration::from_secs(30);

/// How long tp may take to end here.
fn ends_within() -> Duration {
    if std::env::var_os("TP_TEST_CPU").is_some() { ENDS_WITHIN_EMULATED } else { ENDS_WITHIN }
}

/// The output modes of `tp attach` (after `-p PIDS -f foo`).
const MODES: &[&[&str]] =
    &[&[], &["--args"], &["--args", "--json"], &["--ret", "-q"], &["--stack", "--folded", "--ring-size", "4096"]];

/// `count` counter targets, their threads calling `foo` and `bar` until stopped.
fn spinning(count: usize) -> Vec<Target> {
    (0..count)
        .map(|_| {
            let mut t = Target::start("counter");
            t.ask("spin 2", "spinning");
            t
        })
        .collect()
}

/// Asserts every probe is gone from `targets`, then stops them and checks
/// their results.
fn assert_all_restored(targets: Vec<Target>, what: &str) {
    for mut t in targets {
        assert!(!has_region(t.pid), "{what}: process {} still maps tp's memory", t.pid);
        assert_code_is_original(&t, &["foo", "bar"]);
        let stopped = t.ask("stop", "stopped");
        assert!(stopped.ends_with("checksum=ok"), "{what}: {stopped}");
        assert!(t.quit().success(), "{what}");
    }
}

fn tp_attach(pids: &str, mode: &[&str]) -> Command {
    let mut cmd = tp_command();
    cmd.args(["attach", "-p", pids, "-f", "foo", "-f", "bar"]).args(mode).stdin(Stdio::null());
    cmd
}

/// Waits for `child` at most [`ENDS_WITHIN`] after `since` (and then some
/// for a loaded machine before failing outright), and says how long it took.
fn ends_soon(child: &mut std::process::Child, since: Instant, what: &str) -> ExitStatus {
    let status = wait_timeout(child);
    let took = since.elapsed();
    assert!(took < ends_within(), "{what}: tp took {took:?} to end");
    status
}

fn pids_of(targets: &[Target]) -> String {
    targets.iter().map(|t| t.pid.to_string()).collect::<Vec<_>>().join(",")
}

/// `tp attach … | head -1`: the reader takes one line (or none, when tp
/// prints nothing until its end) and goes away.
fn reader_goes_away(processes: usize, mode: &[&str], duration: Option<&str>) {
    let targets = spinning(processes);
    let mut cmd = tp_attach(&pids_of(&targets), mode);
    if let Some(d) = duration {
        cmd.args(["-d", d]);
    }
    let what = format!("{processes} processes, {mode:?}, -d {duration:?}");
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run tp");
    let mut err = Lines::new(child.stderr.take().unwrap());
    for _ in 0..processes {
        err.wait_for("tp: attached");
    }
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // Events come at once; a session that only counts prints at its end.
    let prints_early = mode.contains(&"--args") || mode.contains(&"--json") || mode.contains(&"json");
    if prints_early || duration.is_some() {
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(!first.is_empty(), "{what}: no line");
    }
    let closed = Instant::now();
    drop(out);
    let status = ends_soon(&mut child, closed, &what);
    let stderr = err.rest().join("\n");
    match (duration, status.code()) {
        // It may have written everything before the reader left.
        (Some(_), Some(0)) => {}
        // The reader left while the summary was written: the session had ended.
        (Some(_), Some(141)) => {}
        (None, Some(141)) => {
            assert!(
                stderr.contains("tp: standard output is closed (Broken pipe); removing every probe"),
                "{what}: {stderr}"
            );
        }
        _ => panic!("{what}: exit {status:?} (signal {:?}); stderr: {stderr}", status.signal()),
    }
    assert!(!stderr.contains("Broken pipe (os error"), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    for t in &targets {
        let restored = format!("tp: detached from {}, code restored", t.pid);
        let exited = status.code() == Some(0) || stderr.contains(&restored);
        assert!(exited, "{what}: {stderr}");
    }
    assert_all_restored(targets, &what);
}

/// `tp attach … > /dev/full`.
fn output_fails(processes: usize, mode: &[&str], duration: Option<&str>) {
    let targets = spinning(processes);
    let mut cmd = tp_attach(&pids_of(&targets), mode);
    if let Some(d) = duration {
        cmd.args(["-d", d]);
    }
    let what = format!("> /dev/full: {processes} processes, {mode:?}, -d {duration:?}");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("open /dev/full");
    let mut child = cmd.stdout(full).stderr(Stdio::piped()).spawn().expect("run tp");
    let mut err = Lines::new(child.stderr.take().unwrap());
    for _ in 0..processes {
        err.wait_for("tp: attached");
    }
    let started = Instant::now();
    // Without -d, a session that only counts writes nothing until Ctrl-C.
    let writes_early = mode.contains(&"--args") || mode.contains(&"--json") || mode.contains(&"json");
    if !writes_early && duration.is_none() {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let status = ends_soon(&mut child, started + duration.map_or(Duration::ZERO, secs), &what);
    let stderr = err.rest().join("\n");
    assert_eq!(status.code(), Some(74), "{what}: {stderr}");
    assert!(stderr.contains("tp: standard output cannot be written (No space left on device)"), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert_all_restored(targets, &what);
}

fn secs(s: &str) -> Duration {
    Duration::from_secs_f64(s.parse().unwrap())
}

#[test]
fn a_reader_that_goes_away_ends_the_session_of_one_process() {
    for mode in MODES {
        reader_goes_away(1, mode, None);
        reader_goes_away(1, mode, Some("0.05"));
    }
}

#[test]
fn a_reader_that_goes_away_ends_the_session_of_three_processes() {
    for mode in MODES {
        reader_goes_away(3, mode, None);
        reader_goes_away(3, mode, Some("0.05"));
    }
}

#[test]
fn a_full_output_ends_the_session_of_one_process() {
    for mode in MODES {
        output_fails(1, mode, None);
        output_fails(1, mode, Some("0.05"));
    }
}

#[test]
fn a_full_output_ends_the_session_of_three_processes() {
    for mode in MODES {
        output_fails(3, mode, None);
        output_fails(3, mode, Some("0.05"));
    }
}

/// `tp attach … 2>/dev/full`: stderr fails; the one line goes to stdout.
#[test]
fn a_full_stderr_ends_the_session_with_the_line_on_stdout() {
    let targets = spinning(1);
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let mut child =
        tp_attach(&pids_of(&targets), &["--args"]).stdout(Stdio::piped()).stderr(full).spawn().expect("run tp");
    let mut out = Lines::new(child.stdout.take().unwrap());
    let status = wait_timeout(&mut child);
    let stdout = out.rest();
    assert_eq!(status.code(), Some(74), "{stdout:?}");
    // The session ends as on Ctrl-C: the summary follows on stdout.
    let line = "tp: standard error cannot be written (No space left on device); removing every probe";
    assert!(stdout.iter().any(|l| l == line), "{stdout:?}");
    assert!(stdout.iter().any(|l| l.starts_with("foo ")), "{stdout:?}");
    assert_all_restored(targets, "2>/dev/full");
}

/// A listing whose reader goes away ends in silence, as if killed by SIGPIPE.
#[test]
fn a_listing_into_head_ends_with_141_in_silence() {
    let mut child = tp_command()
        .args(["list-probes", target_path("counter").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    drop(out);
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child);
    let stderr = err.rest();
    assert!(matches!(status.code(), Some(0 | 141)), "{status:?} {stderr:?}");
    assert!(stderr.is_empty(), "{stderr:?}");
}

/// `tp run` whose stderr fails removes its probes, lets the program run
/// on, and exits with the program's status.
#[test]
fn a_full_stderr_leaves_tp_run_with_its_programs_status() {
    let _shared = shared();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let launched = target_path("launched");
    let mut child = tp_command()
        .args(["run", "-f", "foo", "--args", "--"])
        .arg(&launched)
        .args(["calls", "5000", "exit", "3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(full)
        .spawn()
        .expect("run tp");
    let mut out = Lines::new(child.stdout.take().unwrap());
    let status = wait_timeout(&mut child);
    assert_eq!(status.code(), Some(3), "the program's status");
    assert_eq!(out.rest(), ["foo calls=5000 checksum=ok"], "the program ran on, and tp wrote nothing on its stdout");
}
