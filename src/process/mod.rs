//! Linux process control: /proc, ptrace stops, remote memory and remote
//! syscalls. Nothing here knows an instruction set except through
//! [`crate::arch::Arch`].

pub mod bpf;
pub mod files;
pub mod launch;
pub mod maps;
pub mod memory;
pub mod proc_events;
pub mod ptrace;
pub mod regset;
pub mod remote;
pub mod seccomp;
pub mod single_step;
pub mod stop;

use std::fmt;

use nix::unistd::Pid;

use crate::arch::{Arch, BlockedIn, Host, Shadow};

pub use maps::Mapping;

/// A condition about the target process that a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessError {
    /// No process with this PID exists.
    NoSuchProcess(i32),
    /// The process exists but is a zombie: it has exited and waits to be reaped.
    Zombie(i32),
    /// Another tracer (gdb, strace, tp) is attached.
    AlreadyTraced {
        /// The target.
        pid: i32,
        /// The tracer's PID.
        tracer: i32,
        /// The tracer's command name.
        tracer_name: String,
    },
    /// ptrace or /proc access was refused.
    PermissionDenied(i32),
    /// The process exited while tp was working on it.
    Exited(i32),
    /// The ID names a thread, not a process.
    NotAProcess {
        /// The thread ID given.
        tid: i32,
        /// Its process.
        pid: i32,
    },
    /// The ID is this tp's own (a process cannot trace itself).
    Itself(i32),
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessError::NoSuchProcess(pid) => write!(f, "no process with PID {pid}; check the PID with `ps`"),
            ProcessError::Zombie(pid) => {
                write!(f, "process {pid} is a zombie (it has exited); there is nothing left to trace")
            }
            ProcessError::AlreadyTraced { pid, tracer, tracer_name } => {
                write!(f, "process {pid} is already traced by PID {tracer} ({tracer_name}); detach that tracer first")
            }
            ProcessError::PermissionDenied(pid) => {
                write!(f, "permission denied tracing process {pid}; run as root or with CAP_SYS_PTRACE")?;
                // Yama's restriction is worth naming only where Yama exists.
                if std::path::Path::new(YAMA_PTRACE_SCOPE).exists() {
                    write!(f, ", or allow it with `sysctl kernel.yama.ptrace_scope=0`")?;
                }
                Ok(())
            }
            ProcessError::Exited(pid) => write!(f, "process {pid} exited while tp was attaching"),
            ProcessError::NotAProcess { tid, pid } => {
                write!(f, "{tid} is a thread of process {pid}, not a process; use -p {pid}")
            }
            ProcessError::Itself(pid) => {
                write!(f, "process {pid} is this tp itself; tp cannot trace itself: give another process's PID")
            }
        }
    }
}

impl std::error::Error for ProcessError {}

/// Yama's ptrace restriction, where the kernel has Yama.
const YAMA_PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// What `/proc/PID/status` says about a process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// Command name.
    pub name: String,
    /// State letter (R, S, D, T, t, Z, X).
    pub state: char,
    /// PID of the tracer, 0 if none.
    pub tracer_pid: i32,
    /// The process (thread group) the thread belongs to.
    pub tgid: i32,
    /// The thread's number in its own PID namespace, the innermost
    /// (`NSpid`'s last; 0 when the kernel does not say).
    pub ns_pid: i32,
    /// Its real and effective user IDs, as tp's namespace sees them.
    pub uids: [u32; 2],
}

/// The syscall thread `tid` of `pid` is blocked in, from
/// `/proc/PID/task/TID/syscall` (`NR ARG1..ARG6 SP PC` in hex): None if it
/// runs, is in none, or the file cannot be read.
pub fn blocked_in(pid: i32, tid: i32) -> Option<BlockedIn> {
    parse_blocked_in(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?)
}

/// Parses the text of `/proc/PID/task/TID/syscall`.
pub fn parse_blocked_in(text: &str) -> Option<BlockedIn> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hex = |w: &str| u64::from_str_radix(w.strip_prefix("0x")?, 16).ok();
    let nr: i64 = words.first()?.parse().ok()?;
    if nr < 0 || words.len() != 9 {
        return None;
    }
    let mut args = [0u64; 6];
    for (a, w) in args.iter_mut().zip(&words[1..7]) {
        *a = hex(w)?;
    }
    Some(BlockedIn { nr: nr as u64, args, sp: hex(words[7])?, pc: hex(words[8])? })
}

/// The signal set `key` (`SigPnd`, `SigBlk`, ...) of the text of a
/// `/proc/PID/task/TID/status`, bit n - 1 for signal n; 0 if absent.
pub fn signal_mask(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// True if a signal is pending for thread `tid` of `pid` (for it or its
/// process), or among `also` (signals tp holds back to deliver), not
/// blocked by it, with a handler installed: when the thread goes on, that
/// handler runs.
pub fn handler_pending(pid: i32, tid: i32, also: &[i32]) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else { return false };
    let mask = |key: &str| signal_mask(&text, key);
    let held = also.iter().filter(|&&s| (1..=64).contains(&s)).fold(0u64, |m, &s| m | 1 << (s - 1));
    (mask("SigPnd") | mask("ShdPnd") | held) & !mask("SigBlk") & mask("SigCgt") != 0
}

/// Each thread of `pid` now and the hardware shadow stack it runs with, as
/// far as tp can tell ([`Arch::shadow_stack`]): from its status file, and
/// for the threads in `stopped` (held in a ptrace stop by this tp) from
/// their register sets where the architecture needs them. With
/// `TP_SHADOW_STACK=all`, tp believes every thread runs with the host's
/// shadow stack: the tests of its refusals run on machines without one.
pub fn shadow_stacks(pid: i32, stopped: &[Pid]) -> Vec<(Pid, Shadow)> {
    let hwcap = auxv(pid, libc::AT_HWCAP).unwrap_or(0);
    let forced = std::env::var("TP_SHADOW_STACK").is_ok_and(|v| v == "all");
    threads(pid)
        .unwrap_or_default()
        .into_iter()
        .map(|tid| {
            if forced {
                return (tid, Shadow::On(Host::SHADOW_STACK));
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
            (tid, regset::shadow_stack(tid, &status, hwcap, stopped.contains(&tid)))
        })
        .collect()
}

/// Parses the fields tp needs from the text of `/proc/PID/status`.
pub fn parse_status(text: &str) -> Status {
    let mut st = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match key {
            "Name" => st.name = value.to_string(),
            "State" => st.state = value.chars().next().unwrap_or('?'),
            "TracerPid" => st.tracer_pid = value.parse().unwrap_or(0),
            "Tgid" => st.tgid = value.parse().unwrap_or(0),
            "NSpid" => st.ns_pid = value.split_whitespace().next_back().and_then(|v| v.parse().ok()).unwrap_or(0),
            "Uid" => {
                let mut ids = value.split_whitespace().map(|v| v.parse().unwrap_or(u32::MAX));
                st.uids = [ids.next().unwrap_or(u32::MAX), ids.next().unwrap_or(u32::MAX)];
            }
            _ => {}
        }
    }
    st
}

/// Reads `/proc/PID/status`, mapping a missing process to [`ProcessError::NoSuchProcess`].
pub fn status(pid: i32) -> Result<Status, ProcessError> {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(text) => Ok(parse_status(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(ProcessError::PermissionDenied(pid)),
        Err(_) => Err(ProcessError::NoSuchProcess(pid)),
    }
}

/// Checks that `pid` names a live process that tp may attach to: it exists,
/// is not a zombie, and no other tracer holds it. Another tp is let pass:
/// it holds a target only for milliseconds, and seizing waits for it.
pub fn check_attachable(pid: i32) -> Result<Status, ProcessError> {
    if pid <= 0 {
        return Err(ProcessError::NoSuchProcess(pid));
    }
    let st = status(pid)?;
    if st.tgid == std::process::id() as i32 {
        return Err(ProcessError::Itself(st.tgid));
    }
    if st.tgid != 0 && st.tgid != pid {
        return Err(ProcessError::NotAProcess { tid: pid, pid: st.tgid });
    }
    if st.state == 'Z' || st.state == 'X' {
        return Err(ProcessError::Zombie(pid));
    }
    check_readable(pid)?;
    if st.tracer_pid != 0 {
        let tracer_name = status(st.tracer_pid).map(|s| s.name).unwrap_or_else(|_| "?".into());
        if tracer_name != "tp" {
            return Err(ProcessError::AlreadyTraced { pid, tracer: st.tracer_pid, tracer_name });
        }
    }
    Ok(st)
}

/// Checks that tp may read the process's memory map, which takes the same
/// right as tracing it; a refusal becomes [`ProcessError::PermissionDenied`].
pub fn check_readable(pid: i32) -> Result<(), ProcessError> {
    match std::fs::File::open(format!("/proc/{pid}/maps")) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(ProcessError::PermissionDenied(pid)),
        Err(_) => Err(ProcessError::NoSuchProcess(pid)),
    }
}

/// The thread IDs listed in `/proc/PID/task` right now.
pub fn threads(pid: i32) -> std::io::Result<Vec<Pid>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.push(Pid::from_raw(tid));
        }
    }
    tids.sort();
    Ok(tids)
}

/// Every process ID in /proc but this process's own.
pub fn other_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id() as i32;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&pid| pid != me).collect()
}

/// The process's memory mappings.
pub fn read_maps(pid: i32) -> std::io::Result<Vec<Mapping>> {
    Ok(maps::parse(&std::fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

/// The value of entry `key` (`AT_*`) of the process's auxiliary vector:
/// what the kernel told the program when it started (the CPU's and the
/// kernel's capabilities, where its entry point is).
pub fn auxv(pid: i32, key: u64) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16)
        .map(|c| (u64::from_ne_bytes(c[..8].try_into().unwrap()), u64::from_ne_bytes(c[8..].try_into().unwrap())))
        .take_while(|&(k, _)| k != 0)
        .find(|&(k, _)| k == key)
        .map(|(_, v)| v)
}

/// True while a process with this PID exists, a zombie included (one
/// `kill(pid, 0)`, no `/proc` read): false once it was reaped.
pub fn exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// True while the process exists and has not become a zombie.
pub fn is_alive(pid: i32) -> bool {
    matches!(status(pid), Ok(st) if st.state != 'Z' && st.state != 'X')
}

/// The time thread `tid` of `pid` has run on a CPU, in nanoseconds (the
/// first field of its `schedstat`), if the kernel says.
fn run_time(pid: i32, tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Waits until thread `tid` of `pid` has run since the call (its CPU time
/// grew), it is gone, or `limit` has passed; at least a millisecond. On a
/// loaded machine a thread let go may not run for a while: what it was
/// about to do is then still undone.
pub fn wait_until_run(pid: i32, tid: i32, limit: std::time::Duration) {
    let start = std::time::Instant::now();
    let before = run_time(pid, tid);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(1));
        let now = run_time(pid, tid);
        // Without schedstat (or once the thread is gone) only the limit, or a
        // short wait, tells.
        let ran = match (before, now) {
            (Some(b), Some(n)) => n > b,
            (_, None) => true,
            (None, Some(_)) => start.elapsed() >= std::time::Duration::from_millis(10),
        };
        if ran || start.elapsed() >= limit {
            return;
        }
    }
}

/// True if the process is gone or a zombie, or becomes one within `grace`:
/// a killed process takes a moment to become a zombie after its threads and
/// memory go, so a failure caused by its death can be told apart this way.
pub fn has_exited(pid: i32, grace: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + grace;
    loop {
        if !is_alive(pid) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_in_reads_the_syscall_its_arguments_and_where() {
        let text = "22 0x5 0xffffd0f0 0x1 0xffffffffffffffff 0x0 0x8 0xffffd0a0 0xaaaab6c4a104\n";
        let b = parse_blocked_in(text).unwrap();
        assert_eq!((b.nr, b.args, b.sp, b.pc), (22, [5, 0xffffd0f0, 1, u64::MAX, 0, 8], 0xffffd0a0, 0xaaaab6c4a104));
        assert_eq!(parse_blocked_in("running\n"), None);
        assert_eq!(parse_blocked_in("-1 0xffffd0a0 0xaaaab6c4a104\n"), None);
        assert_eq!(parse_blocked_in("22 0x5\n"), None);
    }

    #[test]
    fn parses_status_fields() {
        let st = parse_status("Name:\tcounter\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t5\nTracerPid:\t42\n");
        assert_eq!(st, Status { name: "counter".into(), state: 'S', tracer_pid: 42, tgid: 5, ..Default::default() });
        let st = parse_status("Tgid:\t9\nNSpid:\t9\t3\t1\nUid:\t1000\t0\t0\t0\n");
        assert_eq!((st.ns_pid, st.uids), (1, [1000, 0]));
        let st = parse_status("Uid:\tx\nNSpid:\t\n");
        assert_eq!((st.ns_pid, st.uids), (0, [u32::MAX, u32::MAX]));
    }

    #[test]
    fn own_process_is_attachable_shape() {
        let me = std::process::id() as i32;
        let st = status(me).unwrap();
        assert!(matches!(st.state, 'R' | 'S'));
        assert!(threads(me).unwrap().contains(&Pid::from_raw(me)));
        assert!(read_maps(me).unwrap().iter().any(|m| m.path == "[stack]"));
    }

    #[test]
    fn missing_process_is_named() {
        assert_eq!(check_attachable(0), Err(ProcessError::NoSuchProcess(0)));
        assert_eq!(check_attachable(i32::MAX), Err(ProcessError::NoSuchProcess(i32::MAX)));
    }
}
