//! Syscalls made by a stopped thread of the target, on tp's behalf.
//!
//! The thread's registers are saved, its PC is pointed at a syscall
//! instruction that already exists in its executable memory (the vDSO has
//! one), the number and arguments are loaded, and one PTRACE_SINGLESTEP runs
//! exactly that instruction. The registers are restored after every call, so
//! the thread is never left with foreign values for longer than one syscall,
//! and so are the vector registers a syscall discards (AArch64's SVE state,
//! [`Arch::save_vector_state`]): a thread stopped in the middle of an SVE
//! `memcpy` finishes it with the bytes it had loaded.
//! Before each call the architecture cancels syscall restart
//! ([`Arch::prepare_syscall`]), so a thread that was stopped inside a blocking syscall is not
//! rewound onto the wrong instruction.
//!
//! Every call first goes through the thread's seccomp filters as tp reads
//! them ([`super::seccomp`]): a call a filter would not let run is never
//! made, and the error names it and the filter's answer.
//!
//! The caller borrows the [`Stopped`] set its thread belongs to, and stops
//! the worker only when it makes a call ([`Stopped::hold_worker`]); between
//! calls tp may let it run again ([`RemoteCaller::let_run`]), and the next
//! call stops it again, its registers read afresh. Signals that arrive
//! while the thread steps are handed back to the set when the thread is
//! let run or the caller is dropped, and delivered when the thread runs again.

use anyhow::{Context, Result, bail};
use nix::unistd::Pid;

use super::ProcessError;
use super::bpf::SeccompData;
use super::maps::Mapping;
use super::memory::Memory;
use super::ptrace::{self, Wait};
use super::regset;
use super::seccomp::Filters;
use super::stop::Stopped;
use crate::arch::{Arch, Host};

/// A thread that makes syscalls for tp: the worker of a [`Stopped`].
#[derive(Debug)]
pub struct RemoteCaller<'s> {
    stopped: &'s mut Stopped,
    mem: &'s Memory,
    pid: i32,
    /// The worker while this caller holds it stopped, with what each call
    /// gives back.
    held: Option<Held>,
    insn: u64,
    /// Signals that arrived while stepping; handed to `stopped` when the
    /// thread is let run or the caller is dropped.
    deferred_signals: Vec<i32>,
    /// What this caller's `mmap` calls mapped and no `munmap` took back yet.
    mapped: Vec<(u64, u64)>,
}

/// The worker a [`RemoteCaller`] holds stopped: its registers, and the
/// vector registers a syscall discards ([`Arch::save_vector_state`]).
#[derive(Debug)]
struct Held {
    tid: Pid,
    regs: <Host as Arch>::Regs,
    vectors: <Host as Arch>::VectorState,
}

impl Drop for RemoteCaller<'_> {
    fn drop(&mut self) {
        self.hand_back_signals();
    }
}

impl<'s> RemoteCaller<'s> {
    /// A caller of syscalls in the process of `stopped`, through a syscall
    /// instruction of its code (`maps`); it stops the worker at its first call.
    pub fn new(stopped: &'s mut Stopped, mem: &'s Memory, maps: &[Mapping]) -> Result<RemoteCaller<'s>> {
        let pid = stopped.pid();
        let insn = find_syscall_insn(mem, maps)?;
        Ok(RemoteCaller { stopped, mem, pid, held: None, insn, deferred_signals: Vec::new(), mapped: Vec::new() })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Stops the worker if this caller does not hold it yet, and returns it
    /// with its registers; refuses (before any call) a thread whose seccomp
    /// filters tp cannot read or that runs in strict mode, and a process
    /// that no longer runs the program tp opened the memory of (an exec
    /// while the worker ran).
    fn hold(&mut self) -> Result<(Pid, <Host as Arch>::Regs)> {
        if let Some(h) = &self.held {
            return Ok((h.tid, h.regs));
        }
        let tid = self.stopped.hold_worker()?;
        Filters::read(self.pid, tid)?;
        if self.mem.read_vec(self.insn, Host::syscall_insn().len()).ok().as_deref() != Some(Host::syscall_insn()) {
            if !super::is_alive(self.pid) {
                bail!(ProcessError::Exited(self.pid));
            }
            bail!("process {} ran another program (exec) while tp was attaching", self.pid);
        }
        let saved = regset::get_regs(tid).with_context(|| format!("reading the registers of thread {tid}"))?;
        self.held = Some(Held {
            tid,
            regs: saved,
            vectors: regset::save_vector_state(tid)
                .with_context(|| format!("reading the vector registers of thread {tid}"))?,
        });
        Ok((tid, saved))
    }

    /// Lets the worker run again, still seized ([`Stopped::let_worker_run`]),
    /// with the signals that came while it stepped; the next call stops it again.
    pub fn let_run(&mut self) {
        self.hand_back_signals();
        self.held = None;
        self.stopped.let_worker_run();
    }

    /// Passes on the signals that come for the worker while it runs
    /// ([`Stopped::serve`]).
    pub fn serve(&mut self) -> Result<()> {
        match &self.held {
            Some(_) => Ok(()),
            None => self.stopped.serve(),
        }
    }

    fn hand_back_signals(&mut self) {
        if let Some(tid) = self.held.as_ref().map(|h| h.tid) {
            for sig in std::mem::take(&mut self.deferred_signals) {
                self.stopped.defer_signal(tid, sig);
            }
        }
    }

    /// Checks that the worker's seccomp filters, read now, let syscall `nr`
    /// with `args` run; an error names the call and the filters' answer.
    pub fn check(&mut self, nr: u64, args: [u64; 6]) -> Result<()> {
        let (tid, _) = self.hold()?;
        let filters = Filters::read(self.pid, tid)?;
        let data = SeccompData {
            nr: nr as i32,
            arch: Host::SYSCALLS.audit_arch,
            instruction_pointer: self.insn + Host::syscall_insn().len() as u64,
            args,
        };
        filters.check(|| describe(nr, &args), &data)?;
        Ok(())
    }

    /// Makes syscall `nr` with `args` if the worker's seccomp filters let it
    /// run ([`RemoteCaller::check`]); returns the raw result (negative errno
    /// on failure).
    pub fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64> {
        self.check(nr, args)?;
        let (tid, saved) = self.hold()?;
        let mut regs = saved;
        Host::prepare_syscall(&mut regs, self.insn, nr, args);
        regset::set_regs(tid, &regs).context("setting up a remote syscall")?;
        let result = self.step_over_syscall(tid);
        // Restore even if stepping failed: the thread must not keep our
        // registers, nor lose the vector registers the syscall discarded.
        let restore = regset::set_regs(tid, &saved);
        let vectors = self.held.as_ref().map_or(Ok(()), |h| regset::restore_vector_state(tid, &h.vectors));
        let result = result?;
        restore.context("restoring registers after a remote syscall")?;
        vectors.context("restoring vector registers after a remote syscall")?;
        self.park(tid)?;
        let sc = Host::SYSCALLS;
        if nr == sc.mmap && !(-4095..0).contains(&result) {
            self.mapped.push((result as u64, args[1]));
        } else if nr == sc.munmap && result == 0 {
            self.mapped.retain(|&(a, len)| !(args[0] <= a && a.saturating_add(len) <= args[0].saturating_add(args[1])));
        }
        Ok(result)
    }

    /// Unmaps everything this caller mapped and did not unmap, newest
    /// first: the undo of a transaction that failed. Returns what could not
    /// be unmapped.
    pub fn unmap_mapped(&mut self) -> Vec<(u64, u64)> {
        let mut left = Vec::new();
        while let Some((addr, len)) = self.mapped.pop() {
            match self.syscall(Host::SYSCALLS.munmap, [addr, len, 0, 0, 0, 0]) {
                Ok(0) => {}
                _ => left.push((addr, len)),
            }
        }
        left
    }

    /// Forgets what this caller mapped: the transaction keeps it.
    pub fn keep_mapped(&mut self) {
        self.mapped.clear();
    }

    /// Moves the thread from the SIGTRAP stop that ends a single-step into
    /// an interrupt stop. If tp died while the thread sat in the SIGTRAP
    /// stop, the kernel would deliver that SIGTRAP to the target and kill it;
    /// from an interrupt stop the thread just carries on.
    fn park(&mut self, tid: Pid) -> Result<()> {
        for _ in 0..100 {
            // The interrupt stays pending while the thread is stopped, so
            // PTRACE_CONT (which discards the SIGTRAP) runs no user code: the
            // thread stops again before it returns to user mode.
            ptrace::interrupt(tid).context("PTRACE_INTERRUPT")?;
            ptrace::cont(tid, 0).context("PTRACE_CONT")?;
            match ptrace::wait(tid)? {
                Wait::Gone => bail!(ProcessError::Exited(self.pid)),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => return Ok(()),
                Wait::Event { .. } => {}
                // A signal that arrived meanwhile: keep it for the release.
                Wait::Signal(sig) => self.deferred_signals.push(sig),
            }
        }
        bail!("thread {tid} does not stop")
    }

    fn step_over_syscall(&mut self, tid: Pid) -> Result<i64> {
        let after = self.insn + Host::syscall_insn().len() as u64;
        for _ in 0..100 {
            ptrace::step(tid, 0).context("PTRACE_SINGLESTEP")?;
            match ptrace::wait(tid)? {
                Wait::Gone => bail!(ProcessError::Exited(self.pid)),
                Wait::Signal(libc::SIGTRAP) => {}
                Wait::Signal(sig) => self.deferred_signals.push(sig),
                Wait::Event { .. } => {}
            }
            let regs = regset::get_regs(tid)?;
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

/// A syscall tp makes, as a filter's verdict names it: the name and, for
/// `mmap`, the protection and flags that filters test.
fn describe(nr: u64, args: &[u64; 6]) -> String {
    let sc = Host::SYSCALLS;
    let Some(name) = sc.name(nr) else { return format!("syscall {nr}") };
    if nr != sc.mmap {
        return name.to_string();
    }
    let names = |value: u64, known: &[(i32, &str)]| {
        let set: Vec<&str> = known.iter().filter(|(bit, _)| value & *bit as u64 != 0).map(|(_, n)| *n).collect();
        if set.is_empty() { "0".to_string() } else { set.join("|") }
    };
    let prot = names(
        args[2],
        &[(libc::PROT_READ, "PROT_READ"), (libc::PROT_WRITE, "PROT_WRITE"), (libc::PROT_EXEC, "PROT_EXEC")],
    );
    let flags = names(
        args[3],
        &[
            (libc::MAP_SHARED, "MAP_SHARED"),
            (libc::MAP_PRIVATE, "MAP_PRIVATE"),
            (libc::MAP_ANONYMOUS, "MAP_ANONYMOUS"),
            (libc::MAP_FIXED_NOREPLACE, "MAP_FIXED_NOREPLACE"),
        ],
    );
    format!("{name}({prot}, {flags})")
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
