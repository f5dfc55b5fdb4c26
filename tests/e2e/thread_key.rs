//! Threads are told apart by their thread register, whatever runtime set
//! it up: a thread whose TLS is not glibc's (its thread pointer at a block
//! of zeros, as on Go's threads: no TCB, no TID where glibc keeps it)
//! records every event, each with its own TID, none dropped silently
//! (targets/forker.c, `foreign`).

use crate::util::*;

#[test]
fn a_thread_without_glibcs_tcb_records_every_event() {
    foreign_thread_records_every_event(&[]);
}

/// In a glibc program on x86-64 tp reads the word at the thread pointer,
/// which glibc keeps equal to the FS base, and a thread where it reads 0
/// reads its FS base with `rdfsbase` where the kernel allows it
/// (FSGSBASE), else asks the kernel; a program whose threads keep
/// something else there is told apart by `rdfsbase` alone, or by asking
/// the kernel at every event. `TP_THREAD_KEY` makes tp take each of those
/// ways here. (AArch64 reads its thread register in user space whatever
/// the program: every way is that one.)
#[test]
fn every_way_of_telling_threads_apart_records_every_event() {
    for how in ["tcb", "register", "syscall"] {
        foreign_thread_records_every_event(&[("TP_THREAD_KEY", how)]);
    }
}

fn foreign_thread_records_every_event(env: &[(&str, &str)]) {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "work", "--args", "--ret", "--json"];
    let mut session = Session::spawn("attach", &args, env, None);
    session.err.wait_for("tp: attached");
    let line = t.ask("foreign 1000", "foreign");
    assert!(line.ends_with("checksum=ok"), "{line}");
    let tid = field(&line, "tid");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let events: Vec<serde_json::Value> = json_events(&stdout);
    let of = |ty: &str| events.iter().filter(|e| e["type"] == ty && e["tid"].as_u64() == Some(tid)).count();
    assert_eq!((of("entry"), of("exit")), (1000, 1000), "every call's entry and exit, on the thread's own TID");
    assert_eq!(events.len(), 2000, "no event on another TID");
    let v = one_process(&stdout);
    assert_eq!(v["lost_events"], 0);
    assert_eq!(v["probes"][0]["hits"], 1000);
    assert_eq!(v["probes"][0]["timed"], 1000);
    assert!(t.quit().success());
}

/// Counting alone: a thread whose word at fs:0 is 0 finds no row of its
/// own in the detour's cache; the runtime counts each of its calls, in
/// the shared row, atomically, while a glibc thread counts in its own.
#[test]
fn a_thread_without_glibcs_tcb_counts_every_call() {
    let mut t = Target::start("forker");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", pid.as_str(), "-f", "work", "--json"]);
    t.ask("spin", "spinning");
    let line = t.ask("foreign 100000", "foreign");
    assert!(line.ends_with("checksum=ok"), "{line}");
    let stopped = t.ask("stop", "stopped");
    assert!(stopped.ends_with("checksum=ok"), "{stopped}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], field(&line, "calls") + field(&stopped, "spins"));
    assert!(t.quit().success());
}
