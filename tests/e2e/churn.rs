//! Thread churn: threads are created and exit all the time while tp
//! attaches and detaches (`targets/churn.c`). While tp holds the target,
//! every thread is stopped and traced by it (none escaped the stop); after
//! it lets go, none is stopped or traced, the spawners make progress, and
//! every worker's results and exit were accounted for.

use crate::util::*;

/// Attach/detach cycles: fewer in the arm64 test VM, whose CPU is emulated
/// (TCG) tens of times slower.
#[cfg(target_arch = "x86_64")]
const CYCLES: u32 = 20;
#[cfg(target_arch = "aarch64")]
const CYCLES: u32 = 8;
#[cfg(target_arch = "x86_64")]
const QUICK_CYCLES: u32 = 40;
#[cfg(target_arch = "aarch64")]
const QUICK_CYCLES: u32 = 15;

/// (tid, state, tracer) of every thread of `pid` now listed.
fn thread_states(pid: i32) -> Vec<(i32, char, i32)> {
    tp::process::threads(pid)
        .unwrap()
        .into_iter()
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
            let st = tp::process::parse_status(&text);
            Some((tid.as_raw(), st.state, st.tracer_pid))
        })
        .collect()
}

/// After tp let go: no thread stopped or traced, and the spawners go on.
fn assert_released(t: &mut Target, cycle: u32) {
    for (tid, state, tracer) in thread_states(t.pid) {
        assert_eq!(tracer, 0, "cycle {cycle}: thread {tid} still traced");
        assert!(!matches!(state, 't' | 'T'), "cycle {cycle}: thread {tid} left stopped ({state})");
    }
    let line = t.ask("progress", "progress");
    assert!(!t.out.seen.iter().any(|l| l.starts_with("error")), "cycle {cycle}: {:#?}", t.out.seen);
    assert!(field(&line, "created") > 0);
}

#[test]
fn no_thread_escapes_the_stop_or_stays_stopped() {
    let mut t = Target::start("churn");
    t.ask("churn 4", "churning 4");
    let pid = t.pid.to_string();
    for cycle in 1..=CYCLES {
        let work0 = field(&t.ask("counts", "counts"), "work");
        let mut session = Session::start_with_env(
            &["-p", &pid, "-f", "work", "-f", "measured", "--json"],
            &[("TP_FAULT", "pause:after-seize")],
        );
        // tp holds the target here, all threads stopped: every thread listed
        // is in a ptrace stop of this tp, or has exited.
        wait_paused(&session.child);
        let tracer = session.child.id() as i32;
        for (tid, state, by) in thread_states(t.pid) {
            if matches!(state, 'Z' | 'X') {
                continue;
            }
            assert_eq!((state, by), ('t', tracer), "cycle {cycle}: thread {tid} escaped the stop");
        }
        // SAFETY: plain kill(2) of the tp we started.
        unsafe { libc::kill(tracer, libc::SIGCONT) };
        session.err.wait_for("tp: attached");
        let calls = field(&t.ask("call 5000", "done"), "calls");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "cycle {cycle}: {stderr}");
        let work1 = field(&t.ask("counts", "counts"), "work");
        let hits = hits_from_json(&stdout);
        assert_eq!(hits["measured"], calls, "cycle {cycle}");
        // Workers count their calls after making them: at most one batch per
        // thread alive may be counted by tp and not yet by the target.
        assert!(hits["work"] <= work1 - work0 + 300 * 16, "cycle {cycle}: {hits:?} vs {}", work1 - work0);
        assert_released(&mut t, cycle);
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_eq!(field(&stopped, "created"), field(&stopped, "exited"), "{stopped}");
    assert_code_is_original(&t, &["work", "measured"]);
    assert!(t.quit().success());
}

#[test]
fn quick_attach_detach_cycles_under_churn() {
    let mut t = Target::start("churn");
    t.ask("churn 4", "churning 4");
    let pid = t.pid.to_string();
    for cycle in 1..=QUICK_CYCLES {
        let args = ["attach", "-p", pid.as_str(), "-f", "work", "--duration", "0.02"];
        expect_success(&args, &tp(&args));
        assert_released(&mut t, cycle);
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_code_is_original(&t, &["work"]);
    assert!(t.quit().success());
}

#[test]
fn the_process_runs_while_tp_writes_the_detours() {
    // Between the worker's remote syscalls and the patch tp stops no
    // thread: the worker (the main thread) stays seized, so that no other
    // tracer takes the process, but runs and answers; threads are created
    // and exit meanwhile; the patch then stops every thread there is.
    let mut t = Target::start("churn");
    t.ask("churn 4", "churning 4");
    let pid = t.pid.to_string();
    for step in ["after-inject", "after-detour"] {
        let work0 = field(&t.ask("counts", "counts"), "work");
        let session = Session::start_with_env(
            &["-p", &pid, "-f", "work", "-f", "measured", "--json"],
            &[("TP_FAULT", &format!("pause:{step}"))],
        );
        wait_paused(&session.child);
        let tracer = session.child.id() as i32;
        // Twice: every spawner creates new workers, and the main thread answers.
        for _ in 0..2 {
            let line = t.ask("progress", "progress");
            assert!(field(&line, "created") > 0, "{step}: {line}");
        }
        let states = thread_states(t.pid);
        let traced: Vec<_> = states.iter().filter(|&&(_, _, by)| by == tracer).collect();
        assert_eq!(traced.iter().map(|s| s.0).collect::<Vec<_>>(), vec![t.pid], "{step}: {states:?}");
        assert!(states.iter().all(|&(_, state, _)| !matches!(state, 't' | 'T')), "{step}: {states:?}");
        // SAFETY: plain kill(2) of the tp we started.
        unsafe { libc::kill(tracer, libc::SIGCONT) };
        let mut session = session;
        session.err.wait_for("tp: attached");
        let calls = field(&t.ask("call 5000", "done"), "calls");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{step}: {stderr}");
        let work1 = field(&t.ask("counts", "counts"), "work");
        let hits = hits_from_json(&stdout);
        assert_eq!(hits["measured"], calls, "{step}");
        assert!(hits["work"] <= work1 - work0 + 300 * 16, "{step}: {hits:?} vs {}", work1 - work0);
        assert_released(&mut t, 1);
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_eq!(field(&stopped, "created"), field(&stopped, "exited"), "{stopped}");
    assert_code_is_original(&t, &["work", "measured"]);
    assert!(t.quit().success());
}
