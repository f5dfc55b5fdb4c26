//! Syscalls made by a stopped thread of the target, on tp's behalf.
//!
//! The thread's registers are saved, its PC is pointed at a syscall
//! instruction that already exists in its executable memory (the vDSO has
//! one), the number and arguments are loaded, and one PTRACE_SINGLESTEP runs
//! exactly that instruction. The registers are restored after every call, so
//! the thread is never left with foreign values for longer than one syscall.
//! Before each call the architecture cancels syscall restart
//! ([`Arch::prepare_syscall`]), so a thread that was stopped inside a blocking syscall is not
//! rewound onto the wrong instruction.
//!
//! The caller borrows the [`Stopped`] set its thread belongs to: signals
//! that arrive while the thread steps are handed back to it when the caller
//! is dropped, and delivered when the thread is released.

use anyhow::{Context, Result, bail};
use nix::unistd::Pid;

use super::ProcessError;
use super::maps::Mapping;
use super::memory::Memory;
use super::ptrace::{self, Wait};
use super::stop::Stopped;
use crate::arch::{Arch, Host};

/// A stopped thread that makes syscalls for tp: the worker of a [`Stopped`].
#[derive(Debug)]
pub struct RemoteCaller<'s> {
    stopped: &'s mut Stopped,
    pid: i32,
    tid: Pid,
    saved: <Host as Arch>::Regs,
    insn: u64,
    /// Signals that arrived while stepping; handed to `stopped` on drop.
    deferred_signals: Vec<i32>,
}

impl Drop for RemoteCaller<'_> {
    fn drop(&mut self) {
        for sig in std::mem::take(&mut self.deferred_signals) {
            self.stopped.defer_signal(self.tid, sig);
        }
    }
}

impl<'s> RemoteCaller<'s> {
    /// Prepares the worker thread of `stopped` for remote syscalls.
    pub fn new(stopped: &'s mut Stopped, mem: &Memory, maps: &[Mapping]) -> Result<RemoteCaller<'s>> {
        let (pid, tid) = (stopped.pid(), stopped.worker());
        let saved = Host::get_regs(tid).with_context(|| format!("reading the registers of thread {tid}"))?;
        let insn = find_syscall_insn(mem, maps)?;
        Ok(RemoteCaller { stopped, pid, tid, saved, insn, deferred_signals: Vec::new() })
    }

    /// The thread making the calls.
    pub fn tid(&self) -> Pid {
        self.tid
    }

    /// Makes syscall `nr` with `args`; returns the raw result (negative errno on failure).
    pub fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64> {
        let mut regs = self.saved;
        Host::prepare_syscall(self.tid, &mut regs, self.insn, nr, args).context("setting up a remote syscall")?;
        let result = self.step_over_syscall();
        // Restore even if stepping failed: the thread must not keep our registers.
        let restore = Host::set_regs(self.tid, &self.saved);
        let result = result?;
        restore.context("restoring registers after a remote syscall")?;
        self.park()?;
        Ok(result)
    }

    /// Moves the thread from the SIGTRAP stop that ends a single-step into
    /// an interrupt stop. If tp died while the thread sat in the SIGTRAP
    /// stop, the kernel would deliver that SIGTRAP to the target and kill it;
    /// from an interrupt stop the thread just carries on.
    fn park(&mut self) -> Result<()> {
        for _ in 0..100 {
            // The interrupt stays pending while the thread is stopped, so
            // PTRACE_CONT (which discards the SIGTRAP) runs no user code: the
            // thread stops again before it returns to user mode.
            ptrace::interrupt(self.tid).context("PTRACE_INTERRUPT")?;
            ptrace::cont(self.tid, 0).context("PTRACE_CONT")?;
            match ptrace::wait(self.tid)? {
                Wait::Gone => bail!(ProcessError::Exited(self.pid)),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => return Ok(()),
                Wait::Event { .. } => {}
                // A signal that arrived meanwhile: keep it for the release.
                Wait::Signal(sig) => self.deferred_signals.push(sig),
            }
        }
        bail!("thread {} does not stop", self.tid)
    }

    fn step_over_syscall(&mut self) -> Result<i64> {
        let after = self.insn + Host::syscall_insn().len() as u64;
        for _ in 0..100 {
            ptrace::step(self.tid, 0).context("PTRACE_SINGLESTEP")?;
            match ptrace::wait(self.tid)? {
                Wait::Gone => bail!(ProcessError::Exited(self.pid)),
                Wait::Signal(libc::SIGTRAP) => {}
                Wait::Signal(sig) => self.deferred_signals.push(sig),
                Wait::Event { .. } => {}
            }
            let regs = Host::get_regs(self.tid)?;
            if Host::pc(&regs) == after {
                return Ok(Host::syscall_result(&regs));
            }
            if Host::pc(&regs) != self.insn {
                bail!("remote syscall ended at {:#x}, expected {after:#x}", Host::pc(&regs));
            }
            // A signal stop came before the instruction ran: step again.
        }
        bail!("remote syscall did not complete")
    }

    /// Makes a syscall that returns an address or a small non-negative number,
    /// turning a negative result into an error naming `what`.
    pub fn checked(&mut self, what: &str, nr: u64, args: [u64; 6]) -> Result<u64> {
        let r = self.syscall(nr, args)?;
        if (-4095..0).contains(&r) {
            bail!("{what} in the target failed: {}", std::io::Error::from_raw_os_error(-r as i32));
        }
        Ok(r as u64)
    }
}

/// Finds the bytes of a syscall instruction in executable memory: the vDSO
/// first (always mapped, never written by tp), then the other code mappings.
fn find_syscall_insn(mem: &Memory, maps: &[Mapping]) -> Result<u64> {
    let needle = Host::syscall_insn();
    let mut code: Vec<&Mapping> = maps.iter().filter(|m| m.exec && m.read).collect();
    code.sort_by_key(|m| m.path != "[vdso]");
    for m in code {
        let bytes = mem.read_partial(m.start, m.len().min(1 << 20) as usize);
        // Only aligned positions decode as the instruction on fixed-width ISAs.
        let hit = bytes
            .windows(needle.len())
            .enumerate()
            .find(|(i, w)| i.is_multiple_of(Host::INSN_ALIGN) && *w == needle)
            .map(|(i, _)| i);
        if let Some(i) = hit {
            return Ok(m.start + i as u64);
        }
    }
    bail!("no syscall instruction found in the target's code")
}
