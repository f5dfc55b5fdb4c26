//! Attach, count, detach: the count equals the target's own, the target's
//! checksum holds, its code is byte-identical to the file afterwards, and
//! it exits 0.

use crate::util::*;

/// [`count_exactly_in`], then checks that the target still computes correctly.
fn count_exactly(target: &str, funcs: &[&str], calls: u64, threads: u32) {
    let mut t = count_exactly_in(target, funcs, calls, threads);
    assert_eq!(t.call("foo", 1000, 1), 1000);
    assert!(t.quit().success());
}

#[test]
fn counts_a_single_instruction_window_exactly() {
    count_exactly("counter", &["foo"], 1_000_000, 1);
}

#[test]
fn counts_a_multi_instruction_window_exactly() {
    count_exactly("counter", &["bar"], 300_000, 1);
}

#[test]
fn counts_a_rip_relative_window_exactly() {
    count_exactly("counter", &["baz"], 300_000, 1);
}

#[test]
fn counts_in_a_non_pie_executable() {
    count_exactly("counter-nopie", &["foo", "bar", "baz"], 200_000, 1);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn counts_after_an_endbr64_landing_pad() {
    let t = Target::start("counter-cet");
    let (now, _) = entry_bytes(&t, "foo");
    assert_eq!(now[..4], [0xf3, 0x0f, 0x1e, 0xfa], "the CET build should start with endbr64");
    drop(t);
    count_exactly("counter-cet", &["foo", "bar"], 200_000, 1);
}

#[test]
fn counts_four_threads_on_one_probe_without_losing_any() {
    count_exactly("counter", &["foo", "bar"], 250_000, 4);
}

/// More threads than there are counter rows: the first take rows of their
/// own, the others count in the shared row, atomically (x86-64's detours;
/// AArch64's threads hash into the rows with atomic adds).
#[test]
#[cfg(target_arch = "x86_64")]
fn counts_more_threads_than_counter_rows_exactly() {
    let mut t = Target::start("hammer");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "measured", "--json"]);
    let line = t.ask("burst 20000 90", "burst");
    assert!(line.contains("checksum=ok"), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["measured"], field(&line, "calls"));
    assert!(t.quit().success());
}

#[test]
#[cfg(target_arch = "x86_64")]
fn patch_is_a_jump_and_endbr64_stays() {
    let t = Target::start("counter-cet");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo"]);
    let (now, file) = entry_bytes(&t, "foo");
    assert_eq!(now[..4], file[..4], "endbr64 must stay in place");
    assert_eq!(now[4], 0xe9, "a jmp rel32 follows the landing pad: {now:02x?}");
    let (status, _, _) = session.interrupt();
    assert!(status.success());
    assert_code_is_original(&t, &["foo"]);
}

#[test]
fn duration_ends_the_session_and_prints_a_table() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let args = ["attach", "-p", pid.as_str(), "-f", "foo", "--duration", "0.5", "--all"];
    let out = tp(&args);
    let stdout = expect_success(&args, &out);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("FUNCTION") && lines[0].contains("HITS"), "{stdout}");
    assert!(lines[1].starts_with("foo "), "{stdout}");
    // Without --all, a probe without hits is left out, and stderr says so.
    let args = ["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--duration", "0.2"];
    let out = tp(&args);
    let stdout = expect_success(&args, &out);
    assert_eq!(stdout.lines().count(), 1, "the header alone: {stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tp: 2 probes without hits not shown (--all shows them)"), "{stderr}");
    assert_code_is_original(&t, &["foo"]);
    assert_eq!(t.call("foo", 10, 1), 10);
    assert!(t.quit().success());
}

#[test]
fn target_exit_ends_the_session_with_final_counts() {
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "--json"]);
    let calls = t.call("foo", 123_456, 1);
    assert!(t.quit().success());
    let (status, stdout, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("exited"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], calls);
}

#[test]
fn hot_threads_survive_repeated_attach_and_detach() {
    // Four threads call foo and bar (a three-instruction window) as fast as
    // they can while tp attaches and detaches again and again: threads caught
    // inside a window are moved, and every result still checks out.
    let mut t = Target::start("counter");
    t.ask("spin 4 hot", "spinning");
    let pid = t.pid.to_string();
    for _ in 0..20 {
        let args = ["attach", "-p", pid.as_str(), "-f", "foo", "-f", "bar", "--duration", "0.05"];
        let out = tp(&args);
        expect_success(&args, &out);
    }
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_code_is_original(&t, &["foo", "bar"]);
    assert!(t.quit().success());
}

/// `tp demo` from a copy of the binary elsewhere (as installed): its target
/// is built in, written to a directory of its own and removed after.
#[test]
fn demo_runs_from_an_installed_binary() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("tp-installed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tp_copy = dir.join("tp");
    std::fs::copy(tp_path(), &tp_copy).unwrap();
    let before = demo_dirs();
    let out = run(std::process::Command::new(&tp_copy).args(["demo", "-d", "0.5"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("tp demo: ✓").count(), 5, "{stderr}");
    assert!(!stderr.contains("✗"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("foo ")), "{out:?}");
    assert_eq!(demo_dirs(), before, "the demo's program is removed after it");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The directories `tp demo` made under the temporary directory.
fn demo_dirs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("tp-demo-"))
        .collect();
    names.sort();
    names
}

/// The live view on a terminal: the title with the time elapsed and how
/// many probes were hit, the busiest probes (none without hits), every
/// line within the terminal's width, and again within it once the
/// terminal is made narrower. (x86-64: the arm64 test VM mounts no devpts,
/// so it has no pseudo-terminal to give tp.)
#[test]
#[cfg(target_arch = "x86_64")]
fn the_live_view_fits_the_terminal_and_follows_a_resize() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut t = Target::start("counter");
    t.ask("spin 2", "spinning");
    let (mut master, mut slave) = (0, 0);
    let size = |cols: u16| libc::winsize { ws_row: 24, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes two descriptors; the window size is read, not kept.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size(60)) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are ours alone from here on.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut tp = KillOnDrop::child(
        tp_command()
            .args(["attach", "-p", &t.pid.to_string(), "-f", "foo", "-f", "bar", "-f", "baz"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(slave)
            .spawn()
            .unwrap(),
    );
    let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let output = output.clone();
        let mut file = std::fs::File::from(master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                output.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let text = || String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    wait_until("the live view draws", || text().matches("probes hit").count() >= 3);
    let wide = text().len();
    // SAFETY: TIOCSWINSZ reads one winsize.
    assert_eq!(unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&master), libc::TIOCSWINSZ, &size(30)) }, 0);
    wait_until("the live view draws again", || text()[wide..].matches("probes hit").count() >= 3);
    // SAFETY: plain kill(2).
    unsafe { libc::kill(tp.id(), libc::SIGINT) };
    assert!(wait_timeout(tp.get_mut()).success());
    drop(master);
    let _ = reader.join();
    let all = text();
    // The drawn lines, without escape sequences, before and after the resize.
    let lines = |s: &str| -> Vec<String> {
        let plain = strip_escapes(s);
        plain
            .split(['\n', '\r'])
            .filter(|l| !l.trim().is_empty() && !l.starts_with("tp: "))
            .map(str::to_string)
            .collect()
    };
    let (before, after) = all.split_at(wide);
    for (drawn, cols) in [(lines(before), 60), (lines(after), 30)] {
        assert!(drawn.iter().any(|l| l.contains(" s · 2 of 3 probes hit")), "{drawn:?}");
        for l in &drawn {
            assert!(l.chars().count() < cols, "wider than {cols} columns: {l:?}");
        }
    }
    let wide_lines = lines(before);
    assert!(wide_lines.iter().any(|l| l.contains("probes hit · tracing process")), "{wide_lines:?}");
    assert!(wide_lines.iter().any(|l| l.trim_end().ends_with(" foo")), "{wide_lines:?}");
    assert!(wide_lines.iter().all(|l| !l.contains("baz")), "a probe without hits is not drawn: {wide_lines:?}");
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    assert_code_is_original(&t, &["foo", "bar", "baz"]);
}

/// `s` without terminal escape sequences (`ESC [ … letter`).
#[cfg(target_arch = "x86_64")]
fn strip_escapes(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Ctrl-C while a large attach is under way (`many`'s 10,000 functions,
/// at moments from its planning to its patch): tp ends on its own, with
/// every function's code as the file has it, its memory gone from the
/// target, and the target alive and computing right.
#[test]
fn ctrl_c_during_a_large_attach_restores_every_function() {
    let mut inside = 0;
    // An emulated CPU (the arm64 VM) starts tp tens of times slower.
    let slower = if std::env::var_os("TP_TEST_CPU").is_some() { 10 } else { 1 };
    for delay_ms in [10, 40, 80, 160].map(|ms| ms * slower) {
        let mut t = Target::start("many");
        let pid = t.pid.to_string();
        let text = executable_code(t.pid);
        let mut tp = KillOnDrop::child(
            tp_command()
                .args(["attach", "-p", &pid, "-f", "fn*", "-q"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: plain kill(2).
        unsafe { libc::kill(tp.id(), libc::SIGINT) };
        let status = wait_timeout(tp.get_mut());
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut tp.get_mut().stderr.take().unwrap(), &mut stderr).unwrap();
        // A signal before tp set its handler (before it touched the
        // target) ends it as a signal does.
        let before_the_handler =
            std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGINT) && stderr.is_empty();
        assert!(
            (status.code().is_some() || before_the_handler) && !stderr.contains("panicked"),
            "{status:?}: {stderr}"
        );
        // The attach had not ended when the signal came: no `attached`
        // line, or one whose time is past the delay.
        let took = stderr.lines().find_map(|l| {
            let ms = l.strip_prefix("tp: attached ")?.split(" in ").nth(1)?.split(" ms").next()?;
            ms.parse::<f64>().ok()
        });
        if !before_the_handler && took.is_none_or(|ms| ms > delay_ms as f64) {
            inside += 1;
        }
        assert_eq!(executable_code(t.pid), text, "after Ctrl-C at {delay_ms} ms: {stderr}");
        wait_until("tp's memory to be gone from the target", || !has_region(t.pid));
        // SAFETY: plain kill(2).
        unsafe { libc::kill(t.pid, libc::SIGUSR1) };
        let exit = t.out.wait_for("exit");
        assert!(exit.ends_with("checksum=ok"), "{exit}");
    }
    assert!(inside > 0, "no Ctrl-C came while tp was attaching: attaching 10,000 probes took under 10 ms");
}
