//! Thin, raw ptrace and waitpid calls.
//!
//! nix's `Signal` enum has no real-time signals and its `WaitStatus` decoder
//! rejects them, but real programs use them (glibc itself uses SIGRTMIN+0 and
//! +1), and a tracer must pass every signal through unchanged. So these
//! wrappers take and return raw signal numbers.

use std::io;

use nix::errno::Errno;
use nix::unistd::Pid;

/// `PTRACE_EVENT_STOP`: the stop that PTRACE_INTERRUPT (or a group-stop) causes.
pub const EVENT_STOP: i32 = 128;
/// `PTRACE_EVENT_CLONE`.
pub const EVENT_CLONE: i32 = 3;
/// `PTRACE_EVENT_EXEC`.
pub const EVENT_EXEC: i32 = 4;

/// What `waitpid` reported for one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The thread exited or was killed; it is gone.
    Gone,
    /// A ptrace event stop (`event` is PTRACE_EVENT_*; `sig` is the stop signal).
    Event {
        /// The PTRACE_EVENT_* number.
        event: i32,
        /// The signal reported with it.
        sig: i32,
    },
    /// A signal-delivery stop (or a single-step trap, as SIGTRAP).
    Signal(i32),
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

fn request(req: libc::c_uint, tid: Pid, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: ptrace with integer addr/data arguments has no memory effects in
    // this process; requests that write through `data` use `request_ptr`.
    check(unsafe { libc::ptrace(req, tid.as_raw(), addr, data) })
}

/// PTRACE_SEIZE with the given PTRACE_O_* options.
pub fn seize(tid: Pid, options: i32) -> io::Result<()> {
    request(libc::PTRACE_SEIZE, tid, 0, options as usize).map(drop)
}

/// PTRACE_SETOPTIONS: the PTRACE_O_* options of a stopped thread.
pub fn set_options(tid: Pid, options: i32) -> io::Result<()> {
    request(libc::PTRACE_SETOPTIONS, tid, 0, options as usize).map(drop)
}

/// PTRACE_INTERRUPT: ask a seized thread to stop.
pub fn interrupt(tid: Pid) -> io::Result<()> {
    request(libc::PTRACE_INTERRUPT, tid, 0, 0).map(drop)
}

/// PTRACE_CONT, delivering `sig` (0 for none).
pub fn cont(tid: Pid, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_CONT, tid, 0, sig as usize).map(drop)
}

/// PTRACE_SINGLESTEP, delivering `sig` (0 for none).
pub fn step(tid: Pid, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_SINGLESTEP, tid, 0, sig as usize).map(drop)
}

/// PTRACE_DETACH, delivering `sig` (0 for none).
pub fn detach(tid: Pid, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_DETACH, tid, 0, sig as usize).map(drop)
}

/// PTRACE_GETEVENTMSG (the new thread's TID after a clone event).
pub fn event_msg(tid: Pid) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: the kernel writes one unsigned long to `msg`, which outlives the call.
    check(unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid.as_raw(), 0usize, &mut msg as *mut libc::c_ulong) })?;
    Ok(msg as u64)
}

/// `PTRACE_SECCOMP_GET_FILTER` (linux/ptrace.h).
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;

/// The raw instructions (8 bytes each) of the stopped thread's seccomp
/// filter number `index`, 0 being the newest.
pub fn seccomp_filter(tid: Pid, index: usize) -> io::Result<Vec<u8>> {
    // Room for the longest program the kernel accepts, so that a filter
    // added (with TSYNC) between two calls can never overrun the buffer:
    // the kernel writes as many instructions as the filter has.
    let mut buf = vec![0u8; crate::process::bpf::MAX_INSNS * crate::process::bpf::Insn::SIZE];
    // SAFETY: the kernel writes at most BPF_MAXINSNS instructions of 8 bytes
    // into `buf`, which is that long and outlives the call.
    let n = check(unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid.as_raw(), index, buf.as_mut_ptr()) })?;
    let n = (n as usize).min(crate::process::bpf::MAX_INSNS);
    buf.truncate(n * crate::process::bpf::Insn::SIZE);
    Ok(buf)
}

/// The final wait statuses of the processes [`wait`] and [`try_wait`]
/// reaped: a child of tp's (`tp run`'s program) can end while a session
/// waits on its threads, and its exit status is then collected there, not
/// where tp waits for the program ([`reaped_status`] hands it on).
static REAPED: std::sync::Mutex<Vec<(i32, i32)>> = std::sync::Mutex::new(Vec::new());

/// How many final statuses [`REAPED`] keeps.
const MAX_REAPED: usize = 256;

/// Notes the raw status `status` that waitpid returned for `pid` if it is
/// a final one (the thread or process is gone).
fn note_end(pid: libc::pid_t, status: i32) {
    if pid > 0 && (libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
        let mut reaped = REAPED.lock().unwrap_or_else(|e| e.into_inner());
        reaped.retain(|&(p, _)| p != pid);
        // Threads end here too; a program's own end comes after its
        // threads', so the newest are the ones kept.
        if reaped.len() >= MAX_REAPED {
            reaped.remove(0);
        }
        reaped.push((pid, status));
    }
}

/// The final raw wait status of `pid` if [`wait`] or [`try_wait`] reaped
/// it (taken: asked once).
pub fn reaped_status(pid: i32) -> Option<i32> {
    let mut reaped = REAPED.lock().unwrap_or_else(|e| e.into_inner());
    let at = reaped.iter().position(|&(p, _)| p == pid)?;
    Some(reaped.swap_remove(at).1)
}

/// Waits for a state change of one traced thread (`__WALL`), retrying on EINTR.
pub fn wait(tid: Pid) -> io::Result<Wait> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status to a local.
        let rc = unsafe { libc::waitpid(tid.as_raw(), &mut status, libc::__WALL) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if err.raw_os_error() == Some(libc::ECHILD) {
                return Ok(Wait::Gone);
            }
            return Err(err);
        }
        note_end(rc, status);
        return Ok(decode(status));
    }
}

/// The state change of one traced thread if it has one to report
/// (`WNOHANG`), without waiting: None while it runs.
pub fn try_wait(tid: Pid) -> io::Result<Option<Wait>> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status to a local.
        let rc = unsafe { libc::waitpid(tid.as_raw(), &mut status, libc::__WALL | libc::WNOHANG) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => return Ok(Some(Wait::Gone)),
                _ => return Err(err),
            }
        }
        note_end(rc, status);
        return Ok((rc != 0).then(|| decode(status)));
    }
}

/// Decodes a raw wait status.
pub fn decode(status: i32) -> Wait {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Wait::Gone;
    }
    if libc::WIFSTOPPED(status) {
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if event != 0 {
            return Wait::Event { event, sig };
        }
        return Wait::Signal(sig);
    }
    // WIFCONTINUED is not requested; treat anything else as a spurious stop.
    Wait::Signal(0)
}

/// True if the error means the thread no longer exists.
pub fn is_gone(err: &io::Error) -> bool {
    err.raw_os_error() == Some(Errno::ESRCH as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_wait_statuses() {
        // exit(0), killed by SIGKILL, SIGTRAP stop, PTRACE_EVENT_STOP, clone event.
        assert_eq!(decode(0), Wait::Gone);
        assert_eq!(decode(9), Wait::Gone);
        assert_eq!(decode(0x057f), Wait::Signal(5));
        assert_eq!(decode((EVENT_STOP << 16) | 0x057f), Wait::Event { event: EVENT_STOP, sig: 5 });
        assert_eq!(decode((EVENT_CLONE << 16) | 0x057f), Wait::Event { event: EVENT_CLONE, sig: 5 });
        // a real-time signal stop (SIGRTMIN+2 = 36) decodes with its number.
        assert_eq!(decode((36 << 8) | 0x7f), Wait::Signal(36));
    }
}
