//! Fault injection for reliability tests: when the environment variable
//! `TP_FAULT` names a step, tp kills itself with SIGKILL when it reaches that
//! step, so tests can prove the target survives a tracer dying anywhere.
//! With the prefix `target:` tp kills the target instead and carries on, so
//! tests can prove tp copes with a target that dies mid-attach. With the
//! prefix `pause:` tp stops itself with SIGSTOP, holding whatever it holds,
//! until a SIGCONT. With the prefix `panic:` tp panics there, as a bug
//! would: the panic must unwind through the guards that restore the target.
//!
//! Steps, in the order an attach and a detach reach them:
//! - `after-seize`: every thread stopped (attach, then detach);
//! - `after-name-write`: the first code arena mapped, the memfd's name in it;
//! - `after-private`: the private area mapped, not yet recorded anywhere;
//! - `after-memfd`: the memfd created, its descriptor open in the target;
//! - `after-inject`: data region mapped, the descriptor closed;
//! - `after-detour-write`: one detour's bytes written, not yet recorded;
//! - `after-detour`: detours written, entries not yet recorded;
//! - `after-entry`: one entry recorded (Inactive);
//! - `after-entries`: entries recorded (Inactive), no site changed;
//! - `before-patch`: an entry marked Installing, its site not yet written;
//! - `after-semaphore`: a static probe's semaphore incremented, its site
//!   not yet written;
//! - `after-patch`: a site patched and its entry marked Active;
//! - `before-restore`: an entry marked Removing, its site still patched;
//! - `during-detach`: a site restored, its entry not yet marked Inactive;
//! - `after-unmap-region`: the data region unmapped, the arenas not yet;
//! - `observing`: a session's probes are live, once per tick of its display;
//! - `at-rendezvous`: a thread of the target waits at the dynamic linker's
//!   rendezvous for tp, which has not looked at the new library yet.
//!
//! Each step may carry a count: `after-patch:3` fires the third time the
//! step is reached, e.g. at the third site.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// What to do at the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Tracer,
    Target,
    Pause,
    Panic,
}

static PLAN: OnceLock<Option<(Victim, String, u32)>> = OnceLock::new();
static SEEN: AtomicU32 = AtomicU32::new(0);
static TARGET: AtomicI32 = AtomicI32::new(0);

fn plan() -> &'static Option<(Victim, String, u32)> {
    PLAN.get_or_init(|| {
        let v = std::env::var("TP_FAULT").ok()?;
        let (victim, v) = if let Some(rest) = v.strip_prefix("target:") {
            (Victim::Target, rest.to_string())
        } else if let Some(rest) = v.strip_prefix("pause:") {
            (Victim::Pause, rest.to_string())
        } else if let Some(rest) = v.strip_prefix("panic:") {
            (Victim::Panic, rest.to_string())
        } else {
            (Victim::Tracer, v)
        };
        let (name, n) = match v.split_once(':') {
            Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
            None => (v, 1),
        };
        Some((victim, name, n.max(1)))
    })
}

/// Names the process tp is working on (for `target:` faults).
pub fn set_target(pid: i32) {
    TARGET.store(pid, Ordering::SeqCst);
}

/// Marks that tp reached `step`; dies here (or kills the target) if
/// `TP_FAULT` asks for it.
pub fn point(step: &str) {
    let Some((victim, name, n)) = plan() else { return };
    if name != step || SEEN.fetch_add(1, Ordering::SeqCst) + 1 != *n {
        return;
    }
    let (pid, sig) = match victim {
        Victim::Tracer => (std::process::id() as i32, libc::SIGKILL),
        Victim::Target => (TARGET.load(Ordering::SeqCst), libc::SIGKILL),
        Victim::Pause => (std::process::id() as i32, libc::SIGSTOP),
        Victim::Panic => panic!("TP_FAULT=panic:{step}"),
    };
    if pid > 0 {
        // SAFETY: kill(2); after SIGKILL to tp itself nothing runs.
        unsafe { libc::kill(pid, sig) };
    }
    if *victim == Victim::Target {
        wait_until_dead(pid);
    }
}

/// Waits (at most 5 s) until every thread of `pid` has exited, so that the
/// steps after a `target:` fault meet a dead target, not a dying one.
fn wait_until_dead(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        let dead = |tid: &std::ffi::OsStr| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{}/stat", tid.to_string_lossy())).map_or(true, |s| {
                matches!(s.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()), Some('Z' | 'X'))
            })
        };
        if tasks.filter_map(Result::ok).all(|t| dead(&t.file_name())) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
