//! Two tp processes on one target: the second waits while the first holds
//! the target stopped, then does its work; neither fails.

use std::process::Stdio;

use crate::util::*;

/// The state letter and current syscall of a process (syscall -1 when running).
fn state_and_syscall(pid: u32) -> Option<(char, i64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    Some((state, sc.split_whitespace().next()?.parse().unwrap_or(-1)))
}

#[test]
fn a_second_tp_waits_while_another_holds_the_target() {
    // The first tp holds every thread stopped, or only the worker seized
    // while the process runs and it writes the detours.
    for step in ["after-seize", "after-detour"] {
        waits_while_another_holds(step);
    }
}

fn waits_while_another_holds(step: &str) {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let spawn = |func: &str, fault: Option<&str>| {
        let mut cmd = tp_command();
        cmd.args(["attach", "-p", &pid, "-f", func, "--keep"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(f) = fault {
            cmd.env("TP_FAULT", f);
        }
        KillOnDrop::child(cmd.spawn().expect("run tp"))
    };
    // The first tp stops itself while it holds the target.
    let mut first = spawn("foo", Some(&format!("pause:{step}")));
    let first_pid = first.id() as u32;
    wait_until("the first tp holds the target", || state_and_syscall(first_pid).is_some_and(|(s, _)| s == 'T'));
    // The second one comes in now and must wait (it sleeps between tries).
    let mut second = spawn("bar", None);
    let second_pid = second.id() as u32;
    wait_until("the second tp waits or gives up", || {
        second.get_mut().try_wait().unwrap().is_some()
            || state_and_syscall(second_pid)
                .is_some_and(|(_, nr)| nr == libc::SYS_nanosleep || nr == libc::SYS_clock_nanosleep)
    });
    assert!(
        second.get_mut().try_wait().unwrap().is_none(),
        "{step}: the second tp gave up while the first held the target"
    );
    // SAFETY: plain kill(2) of a child we started.
    unsafe { libc::kill(first_pid as i32, libc::SIGCONT) };
    assert!(wait_timeout(first.get_mut()).success(), "{step}: the first tp failed");
    let mut err = Lines::new(second.get_mut().stderr.take().unwrap());
    let status = wait_timeout(second.get_mut());
    assert!(status.success(), "{step}: the second tp failed: {:?}", err.rest());

    // Both probes are live and count.
    let foo_calls = t.call("foo", 1000, 1);
    let bar_calls = t.call("bar", 700, 1);
    let counts = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"])));
    assert_eq!((counts["foo"], counts["bar"]), (foo_calls, bar_calls));
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(t.quit().success());
}
