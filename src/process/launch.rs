//! Starting a program under tp (`tp run`), held at its entry point.
//!
//! tp forks; the child waits on a pipe until tp has seized it
//! (PTRACE_SEIZE with PTRACE_O_TRACEEXEC and PTRACE_O_EXITKILL: no
//! PTRACE_TRACEME, so the child is a tracee like any other), then execs the
//! program. At the exec stop the kernel has mapped the executable and its
//! dynamic loader; tp reads the executable's entry point (`AT_ENTRY` in
//! `/proc/PID/auxv`), puts a breakpoint there and lets the loader run:
//! it maps and relocates every library the program needs, runs their
//! initializers, and jumps to the entry point, where the breakpoint stops
//! the main thread before any instruction of the program's own code.
//! tp puts the original bytes back and moves the PC back to the entry: the
//! program is held exactly where the kernel would have started a static
//! program, with every library mapped, and nothing of tp's is left in it.
//!
//! Signals that arrive meanwhile are delivered unchanged. A program that
//! cannot be executed is reported with the shell's codes (127: not found,
//! 126: not executable); one that ends before its entry point (a missing
//! library) ends with its own status. Until tp lets go of the held thread,
//! the death of tp kills the program (PTRACE_O_EXITKILL), so a program
//! never runs half set up.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::unistd::Pid;

use super::memory::Memory;
use super::ptrace::{self, EVENT_EXEC};
use super::regset;
use crate::arch::{Arch, Host};

/// `AT_ENTRY` in the auxiliary vector: the executable's entry point.
const AT_ENTRY: u64 = 9;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// This signal killed it.
    Signal(i32),
}

impl Exit {
    /// The status a shell reports: the exit status, or 128 + the signal.
    pub fn shell_status(self) -> u8 {
        match self {
            Exit::Code(c) => (c & 0xff) as u8,
            Exit::Signal(s) => (128 + s).clamp(0, 255) as u8,
        }
    }

    /// "exited with status 3", "killed by SIGSEGV".
    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => {
                let name =
                    nix::sys::signal::Signal::try_from(s).map_or_else(|_| format!("signal {s}"), |s| s.to_string());
                format!("killed by {name}")
            }
        }
    }
}

/// What starting a program came to.
#[derive(Debug)]
pub enum Launch {
    /// Held at its entry point: its main thread, the process's only thread
    /// unless the loader or an initializer started others, is in a
    /// ptrace stop of this tp ([`super::stop::Stopped::adopt`]).
    AtEntry {
        /// The process.
        pid: i32,
        /// Where it starts.
        entry: u64,
    },
    /// It ended before its entry point (reaped).
    Ended {
        /// The process it was.
        pid: i32,
        /// How.
        exit: Exit,
    },
    /// It could not be executed; the child is gone.
    Failed {
        /// Why, as one line.
        why: String,
        /// The status a shell would give (127 or 126).
        status: u8,
    },
}

/// Starts `program` with `args` (argv[1..]) and holds it at its entry
/// point. `after_fork` runs in tp right after the fork, with the child's
/// PID (to route tp's signals to it).
pub fn launch(program: &OsStr, args: &[OsString], after_fork: impl FnOnce(i32)) -> Result<Launch> {
    let Some(path) = find_program(program) else {
        return Ok(Launch::Failed {
            why: format!("`{}`: command not found in PATH", program.to_string_lossy()),
            status: 127,
        });
    };
    let c_path = cstring(path.as_os_str())?;
    let mut argv: Vec<CString> = vec![cstring(program)?];
    for a in args {
        argv.push(cstring(a)?);
    }
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let (go_r, go_w) = pipe()?;
    let (err_r, err_w) = pipe()?;

    // SAFETY: the child only calls async-signal-safe functions (close, read,
    // execv, write, _exit) on memory prepared before the fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error()).context("cannot fork");
    }
    if child == 0 {
        // SAFETY: see above; the pointers stay valid until exec or _exit.
        unsafe {
            libc::close(go_w);
            libc::close(err_r);
            let mut byte = 0u8;
            loop {
                let n = libc::read(go_r, (&raw mut byte).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 || *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
            libc::execv(c_path.as_ptr(), argv_ptrs.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w, (&raw const errno).cast(), std::mem::size_of::<i32>());
            libc::_exit(127);
        }
    }
    after_fork(child);
    // SAFETY: closing the child's ends of the pipes in the parent.
    unsafe {
        libc::close(go_r);
        libc::close(err_w);
    }
    let pid = Pid::from_raw(child);
    let seized = ptrace::seize(pid, libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL);
    // The child reads one byte, or EOF if tp closes without writing: then it exits.
    let go = if seized.is_ok() { write_byte(go_w) } else { Ok(()) };
    // SAFETY: tp's end of the handshake pipe, written once.
    unsafe { libc::close(go_w) };
    if let Err(e) = seized.and(go) {
        // SAFETY: closing our end of the error pipe; kill and reap the child.
        unsafe { libc::close(err_r) };
        kill_and_reap(child);
        return Err(e).context("cannot trace the new process (PTRACE_SEIZE)");
    }
    let result = hold_at_entry(child, err_r);
    // SAFETY: tp's end of the error pipe.
    unsafe { libc::close(err_r) };
    if result.is_err() {
        kill_and_reap(child);
    }
    result
}

/// Waits for the exec, puts the breakpoint at the entry point, and waits
/// until the main thread reaches it.
fn hold_at_entry(pid: i32, err_r: libc::c_int) -> Result<Launch> {
    let tid = Pid::from_raw(pid);
    // Up to the exec: a failed exec shows as the child's exit.
    loop {
        match wait_status(pid)? {
            Status::Ended(exit) => return Ok(exec_failed(pid, err_r, exit)),
            Status::Event(EVENT_EXEC) => break,
            Status::Event(_) => ptrace::cont(tid, 0)?,
            Status::Signal(sig) => ptrace::cont(tid, sig)?,
        }
    }
    let entry = entry_point(pid)?;
    Ok(match run_to(pid, entry)? {
        None => Launch::AtEntry { pid, entry },
        Some(exit) => Launch::Ended { pid, exit },
    })
}

/// `AT_BASE` in the auxiliary vector: where the kernel mapped the
/// program's interpreter (0 for a static program).
const AT_BASE: u64 = 7;

/// True if the program process `pid` runs has a dynamic linker: it runs
/// first, and sets up the main thread's TLS before the program's entry
/// point (a static program's own start code does that after it).
pub fn has_interpreter(pid: i32) -> bool {
    super::auxv(pid, AT_BASE).is_some_and(|b| b != 0)
}

/// Lets the main thread of `pid`, which tp traces and holds stopped
/// before its program's entry point (in the dynamic linker, its thread
/// pointer not set yet), run to that entry point, and holds it there: no
/// probe's code may run in a thread without its TLS. Returns how the
/// process ended if it did first.
pub fn run_to_entry(pid: i32) -> Result<Option<Exit>> {
    run_to(pid, entry_point(pid)?)
}

/// Runs the stopped main thread of `pid` to `entry` (a breakpoint there,
/// the original bytes back and the PC on it once it stops there).
fn run_to(pid: i32, entry: u64) -> Result<Option<Exit>> {
    let tid = Pid::from_raw(pid);
    let mem = Memory::open(pid)?;
    let bp = Host::breakpoint_insn();
    let original = mem.read_vec(entry, bp.len()).context("reading the program's entry point")?;
    mem.write(entry, bp).context("writing the breakpoint at the program's entry point")?;
    ptrace::cont(tid, 0)?;
    loop {
        match wait_status(pid)? {
            Status::Ended(exit) => return Ok(Some(exit)),
            Status::Signal(libc::SIGTRAP) if at_breakpoint(tid, entry) => break,
            Status::Event(_) => ptrace::cont(tid, 0)?,
            Status::Signal(sig) => ptrace::cont(tid, sig)?,
        }
    }
    mem.write(entry, &original).context("restoring the program's entry point")?;
    let mut regs = regset::get_regs(tid)?;
    Host::set_pc(&mut regs, entry);
    regset::set_regs(tid, &regs)?;
    Ok(None)
}

fn at_breakpoint(tid: Pid, entry: u64) -> bool {
    regset::get_regs(tid).is_ok_and(|r| Host::breakpoint_at(Host::pc(&r)) == entry)
}

/// The reason a failed exec wrote to the error pipe, as the shell says it.
fn exec_failed(pid: i32, err_r: libc::c_int, exit: Exit) -> Launch {
    let mut errno = 0i32;
    // SAFETY: reads at most 4 bytes into a local; the write end is closed
    // (the child is gone), so this does not block.
    let n = unsafe { libc::read(err_r, (&raw mut errno).cast(), std::mem::size_of::<i32>()) };
    if n != std::mem::size_of::<i32>() as isize {
        return Launch::Ended { pid, exit };
    }
    let status = if errno == libc::ENOENT { 127 } else { 126 };
    Launch::Failed { why: format!("cannot execute: {}", io::Error::from_raw_os_error(errno)), status }
}

/// The entry point the kernel recorded for the new program, checked to lie
/// in one of its executable mappings.
fn entry_point(pid: i32) -> Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).context("reading the new program's auxiliary vector")?;
    let entry = auxv
        .chunks_exact(16)
        .map(|c| (u64::from_ne_bytes(c[..8].try_into().unwrap()), u64::from_ne_bytes(c[8..].try_into().unwrap())))
        .find(|&(key, _)| key == AT_ENTRY)
        .map(|(_, v)| v);
    let Some(entry) = entry else { bail!("the new program has no entry point in its auxiliary vector") };
    let maps = super::read_maps(pid)?;
    if !maps.iter().any(|m| m.exec && m.contains(entry)) {
        bail!("the new program's entry point {entry:#x} is not in executable memory");
    }
    Ok(entry)
}

enum Status {
    Ended(Exit),
    Event(i32),
    Signal(i32),
}

fn wait_status(pid: i32) -> Result<Status> {
    let raw = wait_raw(pid, libc::__WALL)?;
    if libc::WIFEXITED(raw) {
        return Ok(Status::Ended(Exit::Code(libc::WEXITSTATUS(raw))));
    }
    if libc::WIFSIGNALED(raw) {
        return Ok(Status::Ended(Exit::Signal(libc::WTERMSIG(raw))));
    }
    Ok(match ptrace::decode(raw) {
        ptrace::Wait::Event { event, .. } => Status::Event(event),
        ptrace::Wait::Signal(sig) => Status::Signal(sig),
        ptrace::Wait::Gone => Status::Ended(Exit::Code(0)),
    })
}

fn wait_raw(pid: i32, flags: libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status to a local.
        let rc = unsafe { libc::waitpid(pid, &mut status, flags) };
        if rc >= 0 {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Waits for the child `pid` (no longer traced) to end, and reaps it.
pub fn reap(pid: i32) -> Result<Exit> {
    let raw = match wait_raw(pid, 0) {
        Ok(raw) => raw,
        // A session waiting on the program's threads reaped it first.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
            ptrace::reaped_status(pid).ok_or(e).with_context(|| format!("waiting for process {pid}"))?
        }
        Err(e) => return Err(e).with_context(|| format!("waiting for process {pid}")),
    };
    if libc::WIFSIGNALED(raw) {
        return Ok(Exit::Signal(libc::WTERMSIG(raw)));
    }
    Ok(Exit::Code(libc::WEXITSTATUS(raw)))
}

/// Kills the child `pid` and reaps it.
pub fn kill_and_reap(pid: i32) {
    // SAFETY: kill and waitpid with plain integers.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let _ = wait_raw(pid, libc::__WALL);
}

/// The file `program` names: itself when it has a `/`, else the first
/// file of that name in `$PATH` (as execvp looks).
fn find_program(program: &OsStr) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    find_in(program, &path)
}

/// [`find_program`] with `path` as `$PATH`.
fn find_in(program: &OsStr, path: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    if program.is_empty() {
        return None;
    }
    std::env::split_paths(path).map(|dir| dir.join(program)).find(|p| is_executable_file(p))
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes()).with_context(|| format!("`{}` contains a NUL byte", s.to_string_lossy()))
}

fn pipe() -> Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error()).context("cannot create a pipe");
    }
    Ok((fds[0], fds[1]))
}

fn write_byte(fd: libc::c_int) -> io::Result<()> {
    // SAFETY: writes one byte from a local.
    if unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) } == 1 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shells_statuses() {
        assert_eq!(Exit::Code(3).shell_status(), 3);
        assert_eq!(Exit::Signal(libc::SIGKILL).shell_status(), 137);
        assert_eq!(Exit::Signal(libc::SIGSEGV).describe(), "killed by SIGSEGV");
        assert_eq!(Exit::Code(0).describe(), "exited with status 0");
    }

    #[test]
    fn finds_programs_as_execvp_does() {
        assert_eq!(find_program(OsStr::new("./x")), Some(PathBuf::from("./x")));
        let me = std::env::current_exe().unwrap();
        let (dir, name) = (me.parent().unwrap(), me.file_name().unwrap());
        let path = std::env::join_paths(["/no/such/dir", dir.to_str().unwrap()]).unwrap();
        assert_eq!(find_in(name, &path), Some(me.clone()), "the first directory that has it");
        assert_eq!(find_in(OsStr::new("no-such-program-anywhere"), &path), None);
        assert_eq!(find_in(OsStr::new(""), &path), None);
    }
}
