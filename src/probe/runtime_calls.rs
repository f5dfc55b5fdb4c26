//! The syscalls tp's in-target runtime makes, and whether a target's
//! seccomp filters let them run.
//!
//! A probe that does more than count calls the runtime (src/probe/runtime),
//! which makes a few syscalls in the thread that hit it: getpid and gettid
//! on a process's and a thread's first event, gettid as the key of a thread
//! without a thread register, the thread-pointer call where the TCB does not
//! show it, `kill(pid, 0)` when ring slots run out, and, for a return probe
//! whose return address is lost, what ends the process as abort() does.
//! Those calls pass the calling thread's seccomp filters like any of the
//! program's own, and a filter that kills or traps on one of them would
//! make the target pay for the tracer. So before anything is injected, and
//! again with every thread stopped just before the sites are patched, tp
//! runs every thread's filters (each thread has its own) on each call with
//! the arguments the runtime passes (representative where they vary) and
//! refuses in one line if any answer is not one the runtime can take.
//! Counting probes are never refused: where counting calls the runtime
//! (x86-64), a thread's first count in a process takes a counter row of its
//! own, which makes getpid, gettid and `kill(pid, 0)` ([`counting_calls`]);
//! where a thread's filters would not let them run, tp tells the runtime
//! to count every thread in the shared row instead, which makes no syscall
//! ([`counting_may_call`], `EventCtx::may_take_rows`). The runtime's
//! stack check (madvise) is not refused: it is made only where every
//! thread's filters let it run ([`permits_everywhere`]).

use anyhow::Result;

use super::layout::kind;
use crate::arch::{Arch, Host};
use crate::process::bpf::SeccompData;
use crate::process::seccomp::{self, Action, Filters};
use crate::process::stop::Stopped;

/// SIGABRT, with which the runtime ends a process.
const SIGABRT: u64 = 6;
/// rt_sigprocmask's SIG_UNBLOCK.
const SIG_UNBLOCK: u64 = 1;
/// The size of the kernel's signal set, the runtime passes to the signal calls.
const SIGSET_SIZE: u64 = 8;
/// Not a kind of probe: or-ed into the kinds [`calls`] takes where some
/// probe's predicate compares strings, which the runtime reads with
/// process_vm_readv (a failure reads as a string equal to nothing).
pub const READS_STRINGS: u32 = 1 << 31;

/// A stand-in for the address of a variable on a thread's stack.
const SOME_STACK_ADDRESS: u64 = 0x7ffd_0000_0000;

/// What answers other than ALLOW the runtime can take from a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Takes {
    /// An error return (the runtime goes on without the result)...
    errors: bool,
    /// ...but this errno, which would say something the call did not mean.
    but: Option<u16>,
    /// The filter killing the process: the call is on the way to ending it.
    the_end: bool,
}

/// Only the call's result is right: any other answer makes it wrong.
const NOTHING: Takes = Takes { errors: false, but: None, the_end: false };
/// The runtime goes on from any error.
const ERRORS: Takes = Takes { errors: true, but: None, the_end: false };

/// One syscall the runtime makes.
#[derive(Debug, Clone)]
pub struct RuntimeCall {
    /// The call as the refusal names it.
    pub what: String,
    data: SeccompData,
    takes: Takes,
}

impl RuntimeCall {
    fn new(what: impl Into<String>, nr: u64, args: [u64; 6], takes: Takes) -> RuntimeCall {
        let data = SeccompData { nr: nr as i32, arch: Host::SYSCALLS.audit_arch, instruction_pointer: 0, args };
        RuntimeCall { what: what.into(), data, takes }
    }

    /// True if the runtime can take `action` as this call's answer.
    pub fn takes(&self, action: Action) -> bool {
        let errno = match action {
            Action::Allow | Action::Log => return true,
            Action::Errno(e) => e,
            // Without a seccomp tracer the call fails with ENOSYS.
            Action::Trace(_) => libc::ENOSYS as u16,
            Action::KillProcess | Action::Unknown(_) => return self.takes.the_end,
            Action::KillThread | Action::Trap(_) | Action::UserNotif => return false,
        };
        self.takes.errors && self.takes.but != Some(errno)
    }
}

/// The calls the runtime may make in process `pid` (thread `tid` for the
/// calls that name one) for probes of kinds `kinds` (bits of
/// [`kind`], or-ed): none for counting probes.
pub fn calls(kinds: u32, pid: i32, tid: i32) -> Vec<RuntimeCall> {
    let sc = Host::SYSCALLS;
    let (pid, tid) = (pid as u64, tid as u64);
    // tp's rendezvous probe wakes tp and waits for it (tp_rendezvous),
    // checking that tp still runs: a failure only ends the wait sooner, but
    // ESRCH, which would say tp is gone. A probe of calls tp steps does the
    // same (tp_step), once it has told tp its TID.
    let mut rendezvous = match kinds & (kind::RENDEZVOUS | kind::STEP) {
        0 => Vec::new(),
        _ => vec![
            RuntimeCall::new("futex", sc.futex, [0; 6], ERRORS),
            RuntimeCall::new(
                "kill(tp, 0)",
                sc.kill,
                [std::process::id() as u64, 0, 0, 0, 0, 0],
                Takes { but: Some(libc::ESRCH as u16), ..ERRORS },
            ),
        ],
    };
    let reads = match kinds & READS_STRINGS {
        0 => Vec::new(),
        _ => vec![RuntimeCall::new(
            "process_vm_readv",
            sc.process_vm_readv,
            [pid, SOME_STACK_ADDRESS, 1, SOME_STACK_ADDRESS, 1, 0],
            ERRORS,
        )],
    };
    if kinds & kind::STEP != 0 {
        rendezvous.push(RuntimeCall::new("gettid", sc.gettid, [0; 6], NOTHING));
        // The in-target stepping engine's SIGTRAP handler returns through
        // tp's own rt_sigreturn.
        rendezvous.push(RuntimeCall::new("rt_sigreturn", sc.rt_sigreturn, [0; 6], NOTHING));
    }
    let kinds = kinds & !(kind::RENDEZVOUS | kind::STEP | READS_STRINGS);
    if kinds == kind::COUNT {
        return rendezvous;
    }
    let mut calls = vec![
        RuntimeCall::new("getpid", sc.getpid, [0; 6], NOTHING),
        RuntimeCall::new("gettid", sc.gettid, [0; 6], NOTHING),
        // ESRCH would say a live owner is gone: its slot would be taken.
        RuntimeCall::new(
            "kill(pid, 0)",
            sc.kill,
            [pid, 0, 0, 0, 0, 0],
            Takes { but: Some(libc::ESRCH as u16), ..ERRORS },
        ),
    ];
    if let Some(t) = sc.thread_pointer {
        // A failure reads as "no thread pointer": the thread's key is its TID.
        calls.push(RuntimeCall::new(t.name, t.nr, [t.arg0, SOME_STACK_ADDRESS, 0, 0, 0, 0], ERRORS));
    }
    // Only a return probe that replaces return addresses may end the
    // process (a frame lost for good: runtime.c, end_process).
    if kinds & kind::RET != 0 && kinds & kind::AT_EXITS == 0 {
        let end = Takes { the_end: true, ..ERRORS };
        calls.extend([
            RuntimeCall::new(
                "rt_sigaction(SIGABRT)",
                sc.rt_sigaction,
                [SIGABRT, SOME_STACK_ADDRESS, 0, SIGSET_SIZE, 0, 0],
                end,
            ),
            RuntimeCall::new(
                "rt_sigprocmask(SIG_UNBLOCK)",
                sc.rt_sigprocmask,
                [SIG_UNBLOCK, SOME_STACK_ADDRESS, 0, SIGSET_SIZE, 0, 0],
                end,
            ),
            RuntimeCall::new("tgkill(pid, tid, SIGABRT)", sc.tgkill, [pid, tid, SIGABRT, 0, 0, 0], end),
            // It is made until it ends the process: a failure would spin.
            RuntimeCall::new(
                "exit_group",
                sc.exit_group,
                [128 + SIGABRT, 0, 0, 0, 0, 0],
                Takes { the_end: true, ..NOTHING },
            ),
        ]);
    }
    calls.extend(rendezvous);
    calls.extend(reads);
    calls
}

/// The calls the runtime makes for a counting probe where a thread takes a
/// counter row of its own (`tp_count`: its state, then a row, reclaiming
/// the rows of processes that are gone): the first three of [`calls`].
pub fn counting_calls(pid: i32, tid: i32) -> Vec<RuntimeCall> {
    let mut c = calls(kind::ARGS, pid, tid);
    c.retain(|c| ["getpid", "gettid", "kill(pid, 0)"].contains(&c.what.as_str()));
    c
}

/// True if every thread `stopped` holds (all of the process's) lets the
/// counting calls run, so that threads may take counter rows of their own.
/// A thread without filters needs no reading; an unreadable filter does
/// not let them.
pub fn counting_may_call(stopped: &Stopped) -> bool {
    let pid = stopped.pid();
    stopped.threads().all(|t| {
        seccomp::mode_of(pid, t.tid) == Some(0)
            || Filters::read(pid, t.tid)
                .is_ok_and(|f| counting_calls(pid, t.tid.as_raw()).iter().all(|c| c.takes(f.action(&c.data))))
    })
}

/// Why the runtime cannot run in a process: a filter's answer to one of its calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The process.
    pub pid: i32,
    /// The thread whose filters answer.
    pub tid: i32,
    /// The call.
    pub call: String,
    /// The answer.
    pub action: Action,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot record in process {}: the seccomp filter of thread {} answers {}, which tp's runtime calls in \
             the target, with {}: {}; probes that only count make no syscall there and work",
            self.pid,
            self.tid,
            self.call,
            self.action,
            self.action.consequence()
        )
    }
}

impl std::error::Error for Refused {}

/// The first of the runtime's calls for `kinds` that `filters` (thread
/// `tid` of `pid`) answer in a way the runtime cannot take.
pub fn refusal(filters: &Filters, kinds: u32, pid: i32, tid: i32) -> Option<Refused> {
    calls(kinds, pid, tid).into_iter().find_map(|c| {
        let action = filters.action(&c.data);
        (!c.takes(action)).then_some(Refused { pid, tid, call: c.what, action })
    })
}

/// Checks the filters of every thread `stopped` holds (all of the
/// process's, for the check to mean anything) against the runtime's calls
/// for `kinds`.
pub fn check_stopped(stopped: &Stopped, kinds: u32) -> Result<()> {
    if kinds == kind::COUNT {
        return Ok(());
    }
    let pid = stopped.pid();
    for t in stopped.threads() {
        let filters = Filters::read(pid, t.tid)?;
        if let Some(refused) = refusal(&filters, kinds, pid, t.tid.as_raw()) {
            return Err(refused.into());
        }
    }
    Ok(())
}

/// Checks, before anything is injected for probes of `kinds`, that every
/// thread's filters let the runtime's calls run. Threads without filters
/// need no stop; if any has filters (they can be read only from a stopped
/// thread) the threads not stopped yet are stopped for the check, and all
/// but the worker let go again.
pub fn check_before_install(stopped: &mut Stopped, kinds: u32) -> Result<()> {
    if kinds == kind::COUNT {
        return Ok(());
    }
    let pid = stopped.pid();
    let tids = crate::process::threads(pid).unwrap_or_default();
    if tids.iter().all(|&t| seccomp::mode_of(pid, t) == Some(0)) {
        return Ok(());
    }
    let all_stopped = tids.iter().all(|t| stopped.threads().any(|s| s.tid == *t));
    if !all_stopped {
        stopped.stop_all()?;
    }
    let checked = check_stopped(stopped, kinds);
    if !all_stopped {
        stopped.release_all_but_worker();
    }
    checked
}

/// True if the filters of every thread `stopped` holds let `data` run (an
/// unreadable filter does not).
pub fn permits_everywhere(stopped: &Stopped, data: &SeccompData) -> bool {
    stopped.threads().all(|t| Filters::read(stopped.pid(), t.tid).is_ok_and(|f| f.action(data).permits()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::bpf::{Insn, Program};

    /// A filter that answers `ret` to syscall `nr` and allows the rest.
    fn deny(nr: u64, ret: u32) -> Program {
        let insns = [
            Insn { code: 0x20, jt: 0, jf: 0, k: 0 },           // ld [nr]
            Insn { code: 0x15, jt: 0, jf: 1, k: nr as u32 },   // jeq nr
            Insn { code: 0x06, jt: 0, jf: 0, k: ret },         // ret
            Insn { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 }, // ret ALLOW
        ];
        Program::parse(&insns).unwrap()
    }

    fn answer(nr: u64, ret: u32, kinds: u32) -> Option<Refused> {
        refusal(&Filters::of(7, 8, vec![deny(nr, ret)]), kinds, 7, 8)
    }

    const KILL_PROCESS: u32 = 0x8000_0000;
    const KILL_THREAD: u32 = 0;
    const TRAP: u32 = 0x0003_0000;
    const ERRNO: u32 = 0x0005_0000;

    #[test]
    fn counting_probes_make_no_call() {
        assert!(calls(kind::COUNT, 1, 1).is_empty());
        assert_eq!(answer(Host::SYSCALLS.gettid, KILL_PROCESS, kind::COUNT), None);
    }

    #[test]
    fn counting_calls_are_those_of_a_threads_state_and_row() {
        let sc = Host::SYSCALLS;
        let c = counting_calls(40, 41);
        let nrs: Vec<i32> = c.iter().map(|c| c.data.nr).collect();
        assert_eq!(nrs, [sc.getpid as i32, sc.gettid as i32, sc.kill as i32]);
        let filters = |nr: u64, ret: u32| Filters::of(40, 41, vec![deny(nr, ret)]);
        let all_take = |f: &Filters| c.iter().all(|c| c.takes(f.action(&c.data)));
        assert!(!all_take(&filters(sc.gettid, KILL_PROCESS)));
        assert!(!all_take(&filters(sc.kill, ERRNO | libc::ESRCH as u32)));
        assert!(all_take(&filters(sc.kill, ERRNO | libc::EPERM as u32)));
        assert!(all_take(&filters(sc.exit_group, KILL_PROCESS)));
    }

    #[test]
    fn kills_and_traps_on_the_identity_calls_are_refused() {
        let sc = Host::SYSCALLS;
        for kinds in [kind::ARGS, kind::RET, kind::SAMPLE, kind::STACK, kind::BY, kind::ARGS | kind::FILTER] {
            for (nr, name) in [(sc.gettid, "gettid"), (sc.getpid, "getpid")] {
                for ret in [KILL_PROCESS, KILL_THREAD, TRAP, ERRNO | 1, 0x7fc0_0000, 0x7ff0_0000] {
                    let r = answer(nr, ret, kinds).expect("refused");
                    assert_eq!(r.call, name);
                    assert_eq!(r.action, Action::of(ret));
                }
            }
        }
        let r = answer(sc.gettid, KILL_PROCESS, kind::ARGS).unwrap();
        assert_eq!(
            r.to_string(),
            "cannot record in process 7: the seccomp filter of thread 8 answers gettid, which tp's runtime calls \
             in the target, with KILL_PROCESS: the process would be killed; probes that only count make no syscall \
             there and work"
        );
    }

    #[test]
    fn errors_the_runtime_goes_on_from_are_taken() {
        let sc = Host::SYSCALLS;
        assert_eq!(answer(sc.kill, ERRNO | libc::EPERM as u32, kind::ARGS), None);
        assert_eq!(answer(sc.kill, ERRNO | libc::ESRCH as u32, kind::ARGS).unwrap().call, "kill(pid, 0)");
        assert_eq!(answer(sc.kill, KILL_THREAD, kind::ARGS).unwrap().action, Action::KillThread);
        if let Some(t) = sc.thread_pointer {
            assert_eq!(answer(t.nr, ERRNO | 1, kind::ARGS), None);
            assert_eq!(answer(t.nr, TRAP, kind::ARGS).unwrap().call, t.name);
        }
        // Ending the process: errors, or a kill of the process, end it all the same.
        for nr in [sc.rt_sigaction, sc.rt_sigprocmask, sc.tgkill] {
            assert_eq!(answer(nr, ERRNO | 1, kind::RET), None);
            assert_eq!(answer(nr, KILL_PROCESS, kind::RET), None);
            assert!(answer(nr, KILL_THREAD, kind::RET).is_some());
            assert!(answer(nr, TRAP, kind::RET).is_some());
            // Only return probes end the process.
            assert_eq!(answer(nr, TRAP, kind::ARGS), None);
        }
        assert_eq!(answer(sc.exit_group, KILL_PROCESS, kind::RET), None);
        assert_eq!(answer(sc.exit_group, ERRNO | 1, kind::RET).unwrap().call, "exit_group");
        // The stack check is not refused: it is made only where it runs.
        assert_eq!(answer(sc.madvise, KILL_PROCESS, kind::STACK), None);
    }

    #[test]
    fn arguments_are_the_runtimes() {
        let sc = Host::SYSCALLS;
        let kill = calls(kind::RET, 40, 41).into_iter().find(|c| c.data.nr == sc.kill as i32).unwrap();
        assert_eq!(kill.data.args[..2], [40, 0]);
        let tgkill = calls(kind::RET, 40, 41).into_iter().find(|c| c.data.nr == sc.tgkill as i32).unwrap();
        assert_eq!(tgkill.data.args[..3], [40, 41, 6]);
        assert!(calls(kind::ARGS, 40, 41).iter().all(|c| c.data.arch == sc.audit_arch));
    }

    /// The `TP_SYS_*` and `TP_MADV_*` names in C source.
    fn names_in(c: &str) -> Vec<&str> {
        let mut names: Vec<&str> = c
            .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .filter(|w| (w.starts_with("TP_SYS_") || w.starts_with("TP_MADV_")) && !w.ends_with('_'))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn only_returns_through_replaced_addresses_may_end_the_process() {
        let names = |kinds| calls(kinds, 1, 1).into_iter().map(|c| c.what.to_string()).collect::<Vec<_>>();
        assert!(names(kind::RET).iter().any(|w| w == "exit_group"));
        assert!(!names(kind::RET | kind::AT_EXITS).iter().any(|w| w.starts_with("tgkill") || *w == "exit_group"));
        assert!(!names(kind::SAMPLE | kind::RET | kind::AT_EXITS).iter().any(|w| w == "exit_group"));
    }

    #[test]
    fn every_syscall_of_the_runtime_is_generated_and_checked() {
        use crate::arch::syscalls;
        let runtime = [
            include_str!("runtime/runtime.c"),
            include_str!("runtime/threads.h"),
            include_str!("runtime/events.h"),
            include_str!("runtime/record.h"),
            include_str!("runtime/goroutines.h"),
        ]
        .concat();
        let checked: Vec<String> = calls(kind::ARGS | kind::RET | kind::RENDEZVOUS | kind::STEP | READS_STRINGS, 1, 1)
            .iter()
            .map(|c| c.what.split('(').next().unwrap().to_string())
            .collect();
        let arches = [
            (syscalls::X86_64, include_str!("../arch/x86_64/runtime.h")),
            (syscalls::AARCH64, include_str!("../arch/aarch64/runtime.h")),
        ];
        for (table, header) in arches {
            // The thread-pointer call of that architecture's runtime (the
            // host's is among `checked`).
            let mut checked = checked.clone();
            checked.extend(table.thread_pointer.map(|t| t.name.to_string()));
            let defined: Vec<String> = table.c_defines().into_iter().map(|(n, _)| n).collect();
            let source = runtime.clone() + header;
            let used = names_in(&source);
            assert!(used.contains(&"TP_SYS_GETTID"), "{used:?}");
            for name in used {
                assert!(defined.iter().any(|d| d == name), "{name} is not generated from src/arch/syscalls.rs");
                let Some(call) = name.strip_prefix("TP_SYS_").filter(|n| !n.ends_with("_ARG0")) else { continue };
                let call = call.to_lowercase();
                // What is checked is the host's list: the other header only
                // has to be generated.
                if table.audit_arch != Host::SYSCALLS.audit_arch {
                    continue;
                }
                // The stack check is made only where every thread's filters allow it.
                assert!(
                    call == "madvise" || checked.contains(&call),
                    "the runtime makes {call}, which is not checked against the filters"
                );
            }
        }
    }
}
