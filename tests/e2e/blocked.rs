//! Threads blocked in syscalls while tp attaches and detaches: read on a
//! pipe, clock_nanosleep, FUTEX_WAIT, accept, epoll_wait and wait4, plus the
//! main thread in read on stdin. The target (`targets/blocked.c`) checks
//! every return value itself: no EINTR, no short sleep, no lost wake-up.

use crate::util::*;

/// Asserts the target saw nothing: no error line, every wake-up counted.
fn wake_and_check(t: &mut Target, round: u64) {
    let line = t.ask("wake", "woken");
    assert_eq!(field(&line, "errors"), 0, "{line}; target output: {:#?}", t.out.seen);
    for key in ["read", "futex", "accept", "epoll", "waitpid"] {
        assert_eq!(field(&line, key), round, "{key}: {line}");
    }
    assert!(!t.out.seen.iter().any(|l| l.starts_with("error")), "{:#?}", t.out.seen);
}

#[test]
fn blocked_threads_see_no_eintr_short_sleep_or_lost_wakeup() {
    let mut t = Target::start("blocked");
    let pid = t.pid.to_string();
    for round in 1..=5 {
        // Every thread is inside its blocking syscall when tp stops it.
        t.ask("blocked", "blocked");
        let session = Session::start(&["-p", &pid, "-f", "command_seen", "--json"]);
        // Commands reach the main thread (and count) while probed.
        t.ask("blocked", "blocked");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        assert_eq!(hits_from_json(&stdout)["command_seen"], 1);
        wake_and_check(&mut t, round);
    }
    assert_code_is_original(&t, &["command_seen"]);
    assert!(t.quit().success());
}

#[test]
fn blocked_threads_survive_keep_and_detach() {
    // The same with two separate tp processes: `attach --keep` then `detach -p`.
    let mut t = Target::start("blocked");
    let pid = t.pid.to_string();
    for round in 1..=3 {
        t.ask("blocked", "blocked");
        expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "command_seen", "--keep"]));
        t.ask("blocked", "blocked");
        expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
        wake_and_check(&mut t, round);
    }
    assert_code_is_original(&t, &["command_seen"]);
    assert!(t.quit().success());
}

#[test]
fn a_worker_blocked_in_a_syscall_runs_between_its_calls_and_the_patch() {
    // The worker (the main thread, blocked reading stdin) is stopped for
    // tp's remote syscalls, runs (seized) while tp writes the detours, and
    // is stopped again with every thread for the patch: its read sees none
    // of it. A signal that comes for it while it runs seized waits for tp
    // and is passed on (SIGWINCH: ignored, so the read goes on).
    let mut t = Target::start("blocked");
    let pid = t.pid.to_string();
    t.ask("blocked", "blocked");
    let session =
        Session::start_with_env(&["-p", &pid, "-f", "command_seen", "--json"], &[("TP_FAULT", "pause:after-inject")]);
    wait_paused(&session.child);
    let tracer = session.child.id();
    let status = |tid: i32| {
        let text = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", t.pid)).unwrap();
        tp::process::parse_status(&text)
    };
    // (Back in its read once tp let it run: on an emulated CPU, a moment later.)
    wait_until("the worker runs seized, blocked in read", || {
        let main = status(t.pid);
        (main.state, main.tracer_pid) == ('S', tracer as i32)
    });
    for tid in tp::process::threads(t.pid).unwrap().into_iter().filter(|&tid| tid.as_raw() != t.pid) {
        assert_eq!(status(tid.as_raw()).tracer_pid, 0, "thread {tid} is not tp's while the worker runs");
    }
    // SAFETY: tgkill with plain integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, t.pid, t.pid, libc::SIGWINCH) };
    assert_eq!(rc, 0, "tgkill: {}", std::io::Error::last_os_error());
    wait_until("the signal waits for tp", || status(t.pid).state == 't');
    // SAFETY: plain kill(2) of the tp we started.
    unsafe { libc::kill(tracer as i32, libc::SIGCONT) };
    let mut session = session;
    session.err.wait_for("tp: attached");
    t.ask("blocked", "blocked");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["command_seen"], 1);
    wake_and_check(&mut t, 1);
    assert_code_is_original(&t, &["command_seen"]);
    assert!(t.quit().success());
}

#[test]
fn a_signal_handler_still_interrupts_epoll_wait() {
    // tp restarts an epoll_wait its stop interrupted, but not one a signal
    // handler interrupted: a SIGUSR1 that arrives while tp holds the target
    // must still reach the program as its handler plus EINTR, exactly once.
    let mut t = Target::start("blocked");
    let pid = t.pid.to_string();
    // Every thread has started (and is blocked) before its ID is asked for.
    t.ask("blocked", "blocked");
    let epoll_tid = field(&t.ask("tids", "tids"), "epoll") as i32;
    let mut session =
        Session::start_with_env(&["-p", &pid, "-f", "command_seen"], &[("TP_FAULT", "pause:after-seize")]);
    wait_paused(&session.child);
    // SAFETY: tgkill and kill with plain integer arguments.
    unsafe {
        let rc = libc::syscall(libc::SYS_tgkill, t.pid, epoll_tid, libc::SIGUSR1);
        assert_eq!(rc, 0, "tgkill {}/{epoll_tid}: {}", t.pid, std::io::Error::last_os_error());
        libc::kill(session.child.id() as i32, libc::SIGCONT);
    }
    session.err.wait_for("tp: attached");
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    // The thread is back in epoll_wait once the handler and the EINTR are done.
    t.ask("blocked", "blocked");
    let line = t.ask("signals", "signals");
    assert_eq!((field(&line, "handled"), field(&line, "epoll_eintr")), (1, 1), "{line}");
    wake_and_check(&mut t, 1);
    assert!(t.quit().success());
}
