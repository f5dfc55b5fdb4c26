//! The seccomp filters of a target's thread, and what they answer to a
//! syscall tp is about to make there.
//!
//! A thread that runs a remote syscall for tp runs it through its own
//! filters, like any syscall of its own: a filter that kills on
//! `memfd_create` or on `mmap` with `PROT_EXEC` would kill the target, one
//! that answers EPERM would make tp fail halfway. So before every remote
//! syscall tp reads the thread's filters (PTRACE_SECCOMP_GET_FILTER: the
//! thread is stopped, tp needs CAP_SYS_ADMIN), runs them as the kernel would
//! ([`crate::process::bpf`]) on the call with its actual arguments, and
//! makes the call only if every filter lets it through (ALLOW, or LOG).
//! Filters belong to threads: the one that counts is the thread making the
//! calls. They are read again before each call, because another thread may
//! add a filter to every thread meanwhile (SECCOMP_FILTER_FLAG_TSYNC).
//! A thread in strict mode (only read, write, exit and sigreturn), or one
//! whose filters tp cannot read, gets a refusal, not a gamble.

use std::fmt;

use nix::unistd::Pid;

use super::bpf::{Insn, Program, SeccompData};
use super::ptrace;

/// Filters a thread may have at most (each costs the kernel's per-path
/// budget of 32768 instructions at least 5).
const MAX_FILTERS: usize = 32768 / 5;

/// What a filter answers (SECCOMP_RET_*), with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The call runs.
    Allow,
    /// The call runs and is logged.
    Log,
    /// The process dies of SIGSYS.
    KillProcess,
    /// The thread dies of SIGSYS.
    KillThread,
    /// The thread gets SIGSYS.
    Trap(u16),
    /// The call fails with this errno.
    Errno(u16),
    /// A seccomp tracer decides; without one the call fails (ENOSYS).
    Trace(u16),
    /// A supervisor process decides.
    UserNotif,
    /// An action the kernel does not know: it kills the process.
    Unknown(u32),
}

impl Action {
    /// The action of a filter's 32-bit result.
    pub fn of(ret: u32) -> Action {
        let data = (ret & 0xffff) as u16;
        match ret & 0xffff_0000 {
            0x7fff_0000 => Action::Allow,
            0x7ffc_0000 => Action::Log,
            0x8000_0000 => Action::KillProcess,
            0x0000_0000 => Action::KillThread,
            0x0003_0000 => Action::Trap(data),
            // The kernel caps the errno at MAX_ERRNO.
            0x0005_0000 => Action::Errno(data.min(4095)),
            0x7ff0_0000 => Action::Trace(data),
            0x7fc0_0000 => Action::UserNotif,
            _ => Action::Unknown(ret),
        }
    }

    /// True if the call runs as if there were no filter.
    pub fn permits(self) -> bool {
        matches!(self, Action::Allow | Action::Log)
    }

    /// What happens to the call, in words.
    pub fn consequence(self) -> String {
        match self {
            Action::Allow | Action::Log => "the call runs".into(),
            Action::KillProcess | Action::Unknown(_) => "the process would be killed".into(),
            Action::KillThread => "the thread would be killed".into(),
            Action::Trap(_) => "the thread would get SIGSYS".into(),
            Action::Errno(e) => format!("the call would fail: {}", std::io::Error::from_raw_os_error(e as i32)),
            Action::Trace(_) => "the call would fail (tp is no seccomp tracer)".into(),
            Action::UserNotif => "a supervisor process would decide the call".into(),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Allow => write!(f, "ALLOW"),
            Action::Log => write!(f, "LOG"),
            Action::KillProcess => write!(f, "KILL_PROCESS"),
            Action::KillThread => write!(f, "KILL_THREAD"),
            Action::Trap(d) => write!(f, "TRAP({d})"),
            Action::Errno(e) => write!(f, "ERRNO({e})"),
            Action::Trace(d) => write!(f, "TRACE({d})"),
            Action::UserNotif => write!(f, "USER_NOTIF"),
            Action::Unknown(r) => write!(f, "{r:#010x} (an unknown action)"),
        }
    }
}

/// Why tp will not make a syscall in the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompError {
    /// A filter answers the call with something other than ALLOW or LOG.
    Refused {
        /// The process.
        pid: i32,
        /// The thread that would make the call.
        tid: i32,
        /// The call, as `name(arguments that matter)`.
        call: String,
        /// The filters' answer.
        action: Action,
    },
    /// The thread runs in strict mode.
    Strict {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// The filters cannot be read, or are not programs tp can run.
    Unreadable {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Why.
        why: String,
    },
}

impl fmt::Display for SeccompError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeccompError::Refused { pid, tid, call, action } => write!(
                f,
                "the seccomp filter of process {pid} (thread {tid}) answers {call} with {action}: {}; \
                 tp does not make that call",
                action.consequence()
            ),
            SeccompError::Strict { pid, tid } => write!(
                f,
                "thread {tid} of process {pid} runs in seccomp strict mode (only read, write, exit and \
                 sigreturn): tp cannot make the syscalls it needs there"
            ),
            SeccompError::Unreadable { pid, tid, why } => write!(
                f,
                "cannot read the seccomp filters of thread {tid} of process {pid}: {why}; tp makes no syscall \
                 in a process whose filters it cannot check"
            ),
        }
    }
}

impl std::error::Error for SeccompError {}

/// The filters of one thread, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filters {
    pid: i32,
    tid: i32,
    programs: Vec<Program>,
}

impl Filters {
    /// Reads the filters of thread `tid` of `pid`, which tp holds stopped.
    pub fn read(pid: i32, tid: Pid) -> Result<Filters, SeccompError> {
        let t = tid.as_raw();
        let unreadable = |why: String| SeccompError::Unreadable { pid, tid: t, why };
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/status"))
            .map_err(|e| unreadable(format!("reading its status: {e}")))?;
        match mode(&status) {
            Some(0) => return Ok(Filters { pid, tid: t, programs: Vec::new() }),
            Some(1) => return Err(SeccompError::Strict { pid, tid: t }),
            Some(2) => {}
            _ => return Err(unreadable("its status has no seccomp mode tp knows".into())),
        }
        let mut programs = Vec::new();
        for index in 0..=MAX_FILTERS {
            let bytes = match ptrace::seccomp_filter(tid, index) {
                Ok(b) => b,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && index > 0 => break,
                Err(e) => return Err(unreadable(describe_error(&e))),
            };
            if index == MAX_FILTERS {
                return Err(unreadable(format!("it has more than {MAX_FILTERS} filters")));
            }
            let insns: Vec<Insn> =
                bytes.chunks_exact(Insn::SIZE).map(|c| Insn::from_bytes(c.try_into().expect("8 bytes"))).collect();
            let program = Program::parse(&insns)
                .map_err(|e| unreadable(format!("filter {index} is not a valid program: {e}")))?;
            programs.push(program);
        }
        Ok(Filters { pid, tid: t, programs })
    }

    /// The filters `programs` (newest first) of thread `tid` of `pid`.
    pub fn of(pid: i32, tid: i32, programs: Vec<Program>) -> Filters {
        Filters { pid, tid, programs }
    }

    /// What the filters answer to `data`: the answer of highest precedence
    /// (lowest action value, as a signed number), the newest filter's among
    /// equals, as the kernel decides.
    pub fn action(&self, data: &SeccompData) -> Action {
        let mut best = 0x7fff_0000u32; // ALLOW
        for p in &self.programs {
            let ret = p.run(data);
            if ((ret & 0xffff_0000) as i32) < ((best & 0xffff_0000) as i32) {
                best = ret;
            }
        }
        Action::of(best)
    }

    /// Checks that the filters let `call` (described for the user as
    /// `what`) run.
    pub fn check(&self, what: impl FnOnce() -> String, data: &SeccompData) -> Result<(), SeccompError> {
        let action = self.action(data);
        if action.permits() {
            return Ok(());
        }
        Err(SeccompError::Refused { pid: self.pid, tid: self.tid, call: what(), action })
    }

    /// Number of filters.
    pub fn len(&self) -> usize {
        self.programs.len()
    }

    /// True if the thread has no filter.
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty()
    }
}

/// The seccomp mode of thread `tid` of `pid` (0 none, 1 strict, 2
/// filter), if its status says.
pub fn mode_of(pid: i32, tid: Pid) -> Option<u32> {
    mode(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?)
}

/// The `Seccomp:` field of a thread's status (0 none, 1 strict, 2 filter).
fn mode(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

/// What an error of PTRACE_SECCOMP_GET_FILTER means.
fn describe_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) => "reading them needs CAP_SYS_ADMIN (run tp as root)".into(),
        Some(libc::EMEDIUMTYPE) => "the kernel keeps no copy of them (CONFIG_CHECKPOINT_RESTORE)".into(),
        Some(libc::EIO) | Some(libc::EINVAL) => "the kernel cannot read them out (PTRACE_SECCOMP_GET_FILTER)".into(),
        _ => format!("PTRACE_SECCOMP_GET_FILTER: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::bpf::Insn;

    fn program(ret: u32) -> Program {
        Program::parse(&[Insn { code: 0x06, jt: 0, jf: 0, k: ret }]).unwrap()
    }

    fn data() -> SeccompData {
        SeccompData { nr: 9, arch: 0, instruction_pointer: 0, args: [0; 6] }
    }

    #[test]
    fn actions_are_named() {
        assert_eq!(Action::of(0x7fff_0000), Action::Allow);
        assert_eq!(Action::of(0x0005_0001), Action::Errno(1));
        assert_eq!(Action::of(0x0005_ffff), Action::Errno(4095));
        assert_eq!(Action::of(0x8000_0000), Action::KillProcess);
        assert_eq!(Action::of(0), Action::KillThread);
        assert_eq!(Action::of(0x0003_0007), Action::Trap(7));
        assert_eq!(Action::of(0x7ff0_0001), Action::Trace(1));
        assert_eq!(Action::of(0x7fc0_0000), Action::UserNotif);
        assert_eq!(Action::of(0x7ffc_0000), Action::Log);
        assert_eq!(Action::of(0x0001_0000), Action::Unknown(0x0001_0000));
        assert_eq!(Action::Errno(1).to_string(), "ERRNO(1)");
        assert!(Action::Log.permits() && !Action::Errno(0).permits() && !Action::UserNotif.permits());
    }

    #[test]
    fn the_strongest_answer_wins_and_the_newest_among_equals() {
        let f = |rets: &[u32]| Filters { pid: 1, tid: 1, programs: rets.iter().map(|&r| program(r)).collect() };
        assert_eq!(f(&[]).action(&data()), Action::Allow);
        assert_eq!(f(&[0x7fff_0000, 0x0005_0001]).action(&data()), Action::Errno(1));
        assert_eq!(f(&[0x0005_0001, 0x8000_0000, 0x7ffc_0000]).action(&data()), Action::KillProcess);
        assert_eq!(f(&[0x7ffc_0000, 0x7fff_0000]).action(&data()), Action::Log);
        // Two ERRNOs: the newest (first) filter's errno.
        assert_eq!(f(&[0x0005_000d, 0x0005_0001]).action(&data()), Action::Errno(13));
        assert_eq!(f(&[0x7ff0_0000, 0x7fc0_0000]).action(&data()), Action::UserNotif);
    }

    #[test]
    fn refusals_name_the_call_and_the_answer() {
        let f = Filters { pid: 12, tid: 13, programs: vec![program(0x0005_0001)] };
        let e = f.check(|| "mmap(PROT_READ|PROT_EXEC)".into(), &data()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the seccomp filter of process 12 (thread 13) answers mmap(PROT_READ|PROT_EXEC) with ERRNO(1): \
             the call would fail: Operation not permitted (os error 1); tp does not make that call"
        );
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn reads_the_mode() {
        assert_eq!(mode("Name:\tx\nSeccomp:\t2\nSeccomp_filters:\t1\n"), Some(2));
        assert_eq!(mode("Name:\tx\n"), None);
    }
}
