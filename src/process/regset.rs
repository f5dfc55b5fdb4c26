//! A stopped thread's registers through ptrace: PTRACE_GETREGSET,
//! PTRACE_SETREGSET and PTRACE_POKEUSER behind
//! [`crate::arch::RegisterSets`], and the host's registers, vector state,
//! hardware breakpoints and shadow stack read or written with them. Which
//! register sets make up the registers, and what their bytes mean, the
//! architecture says ([`Arch::read_regs`] and the rest).

use std::io;

use nix::unistd::Pid;

use crate::arch::{Arch, Host, RegisterSets, Shadow};

/// The registers of the host's stopped threads.
pub type Regs = <Host as Arch>::Regs;

/// The register sets of a thread stopped by tp, reached through ptrace.
#[derive(Debug, Clone, Copy)]
pub struct ThreadRegisters(pub Pid);

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

impl RegisterSets for ThreadRegisters {
    fn read(&self, nt: u32, out: &mut [u8]) -> io::Result<usize> {
        let mut iov = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
        // SAFETY: iov describes `out`, valid for writes of out.len() bytes; the
        // kernel writes at most iov_len bytes and updates iov_len.
        check(unsafe {
            libc::ptrace(libc::PTRACE_GETREGSET, self.0.as_raw(), nt as usize, &mut iov as *mut libc::iovec)
        })?;
        Ok(iov.iov_len)
    }

    fn write(&self, nt: u32, data: &[u8]) -> io::Result<()> {
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        // SAFETY: the kernel only reads iov_len bytes from `data`.
        check(unsafe {
            libc::ptrace(libc::PTRACE_SETREGSET, self.0.as_raw(), nt as usize, &mut iov as *mut libc::iovec)
        })
        .map(drop)
    }

    fn write_user(&self, offset: usize, value: u64) -> io::Result<()> {
        // SAFETY: PTRACE_POKEUSER takes integers and writes nothing in this process.
        check(unsafe { libc::ptrace(libc::PTRACE_POKEUSER, self.0.as_raw(), offset, value as usize) }).map(drop)
    }
}

/// Reads a stopped thread's registers ([`Arch::read_regs`]).
pub fn get_regs(tid: Pid) -> io::Result<Regs> {
    Host::read_regs(&ThreadRegisters(tid))
}

/// Writes a stopped thread's registers ([`Arch::write_regs`]).
pub fn set_regs(tid: Pid, regs: &Regs) -> io::Result<()> {
    Host::write_regs(&ThreadRegisters(tid), regs)
}

/// Reads the vector state of a stopped thread that a syscall made by the
/// thread would discard ([`Arch::save_vector_state`]).
pub fn save_vector_state(tid: Pid) -> io::Result<<Host as Arch>::VectorState> {
    Host::save_vector_state(&ThreadRegisters(tid))
}

/// Writes back what [`save_vector_state`] read.
pub fn restore_vector_state(tid: Pid, state: &<Host as Arch>::VectorState) -> io::Result<()> {
    Host::restore_vector_state(&ThreadRegisters(tid), state)
}

/// Sets hardware breakpoints on executing the instructions at the addresses
/// `at` in a stopped thread ([`Arch::set_exec_breakpoint`]; none: clears them).
pub fn set_exec_breakpoint(tid: Pid, at: &[u64]) -> io::Result<()> {
    Host::set_exec_breakpoint(&ThreadRegisters(tid), at)
}

/// The hardware shadow stack thread `tid` runs with ([`Arch::shadow_stack`]),
/// from `status`, its `/proc/PID/task/TID/status`, and `hwcap`, its
/// process's AT_HWCAP; from its register sets too if it is `stopped` (in a
/// ptrace stop of tp's).
pub fn shadow_stack(tid: Pid, status: &str, hwcap: u64, stopped: bool) -> Shadow {
    let sets = ThreadRegisters(tid);
    Host::shadow_stack(status, hwcap, stopped.then_some(&sets as &dyn RegisterSets))
}
