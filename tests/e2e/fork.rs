//! A process that forks while probes are in: the child runs the same patched
//! code and maps the same data region. Detaching either one must leave the
//! other's probes working and removable, a session's end restores both,
//! and both processes' code ends byte-identical to the file.

use crate::util::*;

/// Ends the child with SIGTERM and returns its exit status (via the parent).
fn end_child(t: &mut Target, guard: KillOnDrop) -> u64 {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(guard.id(), libc::SIGTERM) };
    let status = field(&t.ask("reap", "reaped"), "status");
    guard.disarm();
    status
}

#[test]
fn a_forked_child_and_its_parent_are_detached_one_after_the_other() {
    let mut t = Target::start("counter");
    let parent = t.pid.to_string();
    let args = ["attach", "-p", parent.as_str(), "-f", "foo", "--keep"];
    expect_success(&args, &tp(&args));
    let (foo, original) = entry_in_file(&t, "foo");
    assert_ne!(read_mem(t.pid, foo, original.len()), original, "foo is patched in the parent");

    // The child calls foo through the inherited probe.
    let child_pid = field(&t.ask("fork", "forked"), "pid") as i32;
    let guard = KillOnDrop::pid(child_pid); // if the test fails before it ends the child
    let child = child_pid.to_string();
    assert_ne!(read_mem(child_pid, foo, original.len()), original, "the child inherited the patched foo");
    assert!(has_region(child_pid));

    // Detaching the child restores its code, unmaps tp's memory there at
    // once (it has no probe left), and leaves the parent's probe live.
    let out = tp(&["detach", "-p", &child]);
    expect_success(&["detach", "-p", &child], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("shares its probes with {parent}")), "{stderr}");
    assert!(stderr.contains(&format!("detached from {child}: 1 probe removed, tp's memory unmapped")), "{stderr}");
    assert_eq!(read_mem(child_pid, foo, original.len()), original, "the child's foo is restored");
    assert!(!has_region(child_pid), "the child has no probe left: tp's memory is gone from it");
    assert_ne!(read_mem(t.pid, foo, original.len()), original, "the parent's foo is still patched");
    let before = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &parent, "--json"])))["foo"];
    let calls = t.call("foo", 1000, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let after = hits_from_json(&expect_success(&["status"], &tp(&["status", "-p", &parent, "--json"])))["foo"];
    assert_eq!(after - before, calls, "the parent's calls, and only them, are counted");

    // Then the parent: everything restored, nothing left anywhere.
    expect_success(&["detach", "-p", &parent], &tp(&["detach", "-p", &parent]));
    assert_code_is_original(&t, &["foo"]);
    assert!(!has_region(t.pid));
    assert!(!has_region(child_pid));
    assert_eq!(read_mem(child_pid, foo, original.len()), original);

    // The child kept computing correctly all along.
    assert_eq!(end_child(&mut t, guard), 0, "the child's own checksum");
    assert_eq!(t.call("foo", 10, 1), 10);
    assert!(t.quit().success());
}

#[test]
fn a_session_ending_restores_a_forked_child_too() {
    let mut t = Target::start("counter");
    let parent = t.pid.to_string();
    let session = Session::start(&["-p", &parent, "-f", "foo"]);
    let (foo, original) = entry_in_file(&t, "foo");
    let child_pid = field(&t.ask("fork", "forked"), "pid") as i32;
    let guard = KillOnDrop::pid(child_pid); // if the test fails before it ends the child
    assert_ne!(read_mem(child_pid, foo, original.len()), original, "the child inherited the patched foo");
    std::thread::sleep(std::time::Duration::from_millis(20));

    // The session's end restores the parent and the child it forked, and
    // unmaps tp's memory from both.
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("restored the code of 1 process forked by {parent}")), "{stderr}");
    assert_code_is_original(&t, &["foo"]);
    assert_eq!(read_mem(child_pid, foo, original.len()), original, "the child's foo is restored");
    assert!(!has_region(t.pid) && !has_region(child_pid), "tp's memory is gone from both");
    // Nothing is left for a `tp detach` to do.
    let out = tp(&["detach", "-p", &child_pid.to_string()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no tp probes"), "{out:?}");
    assert_eq!(end_child(&mut t, guard), 0, "the child's own checksum");
    assert!(t.quit().success());
}

/// A parent and the child it forked count in one probe at the same
/// moments: every thread counts in a counter row of its own without a
/// lock, and the child's main thread, whose TCB sits where its parent
/// thread's does, takes a row of its own too (the cache the detours read
/// is wiped by the fork). Not one call is lost.
#[test]
fn a_parent_and_its_child_calling_at_once_count_exactly() {
    let mut t = Target::start("hammer");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "measured", "--json"]);
    let mut calls = 0;
    for _ in 0..3 {
        let line = t.ask("forkburst 1000000", "forkburst");
        assert!(line.contains("child=ok checksum=ok"), "{line}");
        calls += field(&line, "calls");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["measured"], calls, "{stderr}");
    assert!(t.quit().success());
}
