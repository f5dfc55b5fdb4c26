//! What a hardware shadow stack forbids of tp's probes
//! ([`crate::arch::shadow_stack`]), and the checks of a process's threads that
//! refuse it in one line.
//!
//! A thread that runs with a shadow stack faults at a return whose address
//! was rewritten: the return probes' (`--ret`, `tp profile`), whose
//! trampoline takes the return address's place on the stack. It faults too
//! at the return of a call a detour makes without a call instruction, or at
//! a return a detour uses as a jump ([`Arch::unbalances_shadow_stack`]).
//! tp checks every thread: when the session starts, before resolving
//! (where the status files tell it, as on x86-64, return probes are
//! refused and such functions refused, or skipped when a glob matched
//! them, before the target is touched); before anything is injected, with
//! the worker stopped (threads whose state only a stop shows are stopped for
//! the check and let go again); and with every thread stopped, just before
//! the sites are patched (threads started since). Counting and entry events
//! on other functions keep working.

use std::fmt;

use anyhow::Result;
use nix::unistd::Pid;

use super::Request;
use super::layout::kind;
use crate::arch::{Arch, Host, Refusal, Shadow, ShadowStack};
use crate::process::stop::Stopped;

/// What a probe asks that a shadow stack may reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need<'a> {
    /// The function (or site) probed.
    pub name: &'a str,
    /// It replaces return addresses (return probes, sampling).
    pub returns: bool,
    /// Why its detour breaks the pairing of calls and returns, if it does.
    pub unbalances: Option<&'static str>,
}

impl Need<'_> {
    fn of(req: &Request) -> Need<'_> {
        Need {
            name: &req.function.name,
            returns: times_returns(req.kind),
            unbalances: Host::unbalances_shadow_stack(&req.plan),
        }
    }
}

/// True if probes recording `kinds` (bits of [`kind`]) replace return
/// addresses: return probes and sampling ones that do not see their calls
/// end at the function's exits.
pub fn times_returns(kinds: u32) -> bool {
    kinds & (kind::RET | kind::SAMPLE) != 0 && kinds & kind::AT_EXITS == 0
}

/// Why probes cannot go in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The process.
    pub pid: i32,
    /// The thread.
    pub tid: i32,
    /// Its shadow stack (the host's, where tp cannot tell whether it runs with one).
    pub stack: ShadowStack,
    /// What it rejects.
    pub what: What,
}

/// What a shadow stack rejects of the probes asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A rewritten return address.
    Returns,
    /// The detour of this function.
    Probe {
        /// The function.
        name: String,
        /// Why ([`Arch::unbalances_shadow_stack`]).
        why: &'static str,
    },
    /// Either, where tp cannot tell whether the thread runs with one.
    Unknown,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Refused { pid, tid, stack, what } = self;
        match what {
            What::Returns => write!(
                f,
                "cannot time returns in process {pid}: thread {tid} runs with a hardware shadow stack ({stack}), \
                 which rejects a rewritten return address (--ret, tp profile); probes without --ret work"
            ),
            What::Probe { name, why } => {
                let refusal = Refusal::ShadowStack { tid: *tid, stack: *stack, why };
                write!(f, "cannot probe `{name}` in process {pid}: {refusal}")
            }
            What::Unknown => write!(
                f,
                "cannot record in process {pid}: tp cannot read whether thread {tid} runs with a hardware shadow \
                 stack ({stack}), which would reject a rewritten return address (--ret, tp profile) or a call a \
                 probe copies"
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// The first thread of `threads` that runs with a shadow stack.
pub fn first(threads: &[(Pid, Shadow)]) -> Option<(i32, ShadowStack)> {
    threads.iter().find_map(|&(tid, s)| match s {
        Shadow::On(stack) => Some((tid.as_raw(), stack)),
        _ => None,
    })
}

/// What the shadow stacks of `threads` (of process `pid`) reject of probes
/// that ask `needs`, if anything: return probes first, then the first
/// function whose detour breaks the pairing. A thread whose state is
/// unknown is refused only if `all_known` (every thread was stopped to
/// tell) and some probe needs what a shadow stack would reject.
pub fn verdict(pid: i32, threads: &[(Pid, Shadow)], needs: &[Need], all_known: bool) -> Option<Refused> {
    let returns = needs.iter().any(|n| n.returns);
    let unbalanced = needs.iter().find_map(|n| Some((n.name, n.unbalances?)));
    if let Some((tid, stack)) = first(threads) {
        let what = match (returns, unbalanced) {
            (true, _) => What::Returns,
            (false, Some((name, why))) => What::Probe { name: name.to_string(), why },
            (false, None) => return None,
        };
        return Some(Refused { pid, tid, stack, what });
    }
    let unknown = threads.iter().find(|(_, s)| *s == Shadow::Unknown)?;
    (all_known && (returns || unbalanced.is_some())).then(|| Refused {
        pid,
        tid: unknown.0.as_raw(),
        stack: Host::SHADOW_STACK,
        what: What::Unknown,
    })
}

/// The thread of process `pid` that runs with a shadow stack, as far as
/// its status file tells (and, for the threads this tp holds in `held`,
/// their register sets), if there is one, for the planning of each function
/// ([`Refusal::ShadowStack`]): return probes see their calls end at the
/// function's exits there, and a function whose exits cannot all be found
/// is refused, as one whose detour copies a call.
pub fn thread_with(pid: i32, held: &[Pid]) -> Option<(i32, ShadowStack)> {
    first(&crate::process::shadow_stacks(pid, held))
}

/// Checks `requests` against the shadow stacks of every thread `stopped`
/// holds (all of the process's, for the check to mean anything).
pub fn check_stopped(stopped: &Stopped, requests: &[Request]) -> Result<()> {
    let held: Vec<Pid> = stopped.threads().map(|t| t.tid).collect();
    check(stopped.pid(), &crate::process::shadow_stacks(stopped.pid(), &held), requests, true)
}

/// Checks `requests`, before anything is injected, against the shadow
/// stacks of the process's threads. Where a thread's state shows only in a
/// stop, and a probe needs what a shadow stack rejects, the threads not
/// stopped yet are stopped for the check, and all but the worker let go again.
pub fn check_before_install(stopped: &mut Stopped, requests: &[Request]) -> Result<()> {
    let held: Vec<Pid> = stopped.threads().map(|t| t.tid).collect();
    let threads = crate::process::shadow_stacks(stopped.pid(), &held);
    check(stopped.pid(), &threads, requests, false)?;
    let needs_a_look =
        || requests.iter().any(|r| times_returns(r.kind) || Host::unbalances_shadow_stack(&r.plan).is_some());
    if !threads.iter().any(|(_, s)| *s == Shadow::Unknown) || !needs_a_look() {
        return Ok(());
    }
    stopped.stop_all()?;
    let checked = check_stopped(stopped, requests);
    stopped.release_all_but_worker();
    checked
}

/// [`verdict`] on `requests`, whose detours are decoded only where a thread
/// runs with a shadow stack, or may.
fn check(pid: i32, threads: &[(Pid, Shadow)], requests: &[Request], all_known: bool) -> Result<()> {
    if threads.iter().all(|(_, s)| *s == Shadow::Off) {
        return Ok(());
    }
    let needs: Vec<Need> = requests.iter().map(Need::of).collect();
    match verdict(pid, threads, &needs, all_known) {
        Some(refused) => Err(refused.into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "its copy of a call pushes the return address";

    fn threads(states: &[Shadow]) -> Vec<(Pid, Shadow)> {
        states.iter().enumerate().map(|(k, &s)| (Pid::from_raw(100 + k as i32), s)).collect()
    }

    fn need(name: &'static str, kinds: u32, unbalances: Option<&'static str>) -> Need<'static> {
        Need { name, returns: times_returns(kinds), unbalances }
    }

    #[test]
    fn a_shadow_stack_refuses_return_probes_and_unbalanced_detours_only() {
        let cet = ShadowStack("x86 CET");
        let on = threads(&[Shadow::Off, Shadow::On(cet), Shadow::Off]);
        // Counting and entry events on functions whose detour keeps calls paired.
        let fine = [need("f", kind::COUNT, None), need("g", kind::ARGS | kind::STACK, None)];
        assert_eq!(verdict(7, &on, &fine, true), None);
        // Return probes and sampling (tp profile), named by the thread that has one.
        for k in [kind::RET, kind::ARGS | kind::RET, kind::RET | kind::SAMPLE] {
            let refused = verdict(7, &on, &[need("f", k, None)], false).unwrap();
            assert_eq!(refused, Refused { pid: 7, tid: 101, stack: cet, what: What::Returns });
            assert_eq!(
                refused.to_string(),
                "cannot time returns in process 7: thread 101 runs with a hardware shadow stack (x86 CET), which \
                 rejects a rewritten return address (--ret, tp profile); probes without --ret work"
            );
        }
        // A counting probe whose detour copies a call.
        let refused = verdict(7, &on, &[need("f", kind::COUNT, None), need("h", kind::COUNT, Some(CALL))], true);
        let refused = refused.unwrap();
        assert_eq!(refused.what, What::Probe { name: "h".into(), why: CALL });
        assert_eq!(
            refused.to_string(),
            format!(
                "cannot probe `h` in process 7: thread 101 runs with a hardware shadow stack (x86 CET), and {CALL}"
            )
        );
        // Without a shadow stack, nothing is refused.
        let off = threads(&[Shadow::Off, Shadow::Off]);
        assert_eq!(verdict(7, &off, &[need("f", kind::RET, Some(CALL))], true), None);
    }

    #[test]
    fn a_thread_not_known_is_refused_only_once_all_were_stopped_to_tell() {
        let unknown = threads(&[Shadow::Off, Shadow::Unknown]);
        let ret = [need("f", kind::RET, None)];
        assert_eq!(verdict(7, &unknown, &ret, false), None);
        let refused = verdict(7, &unknown, &ret, true).unwrap();
        assert_eq!((refused.tid, refused.what), (101, What::Unknown));
        assert_eq!(verdict(7, &unknown, &[need("f", kind::ARGS, None)], true), None);
        assert!(verdict(7, &unknown, &[need("f", kind::COUNT, Some(CALL))], true).is_some());
    }
}
