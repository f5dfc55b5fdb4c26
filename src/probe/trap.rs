//! The in-target stepping engine's pieces in the target (`--step-engine
//! trap`): its trace mapping ([`layout::TrapTrace`], then the addresses),
//! and the SIGTRAP handler (the runtime's `tp_trap`) installed with
//! remote `rt_sigaction` while every thread is stopped, and put back to
//! the default before tp's memory goes.
//!
//! tp installs the handler only where the process's disposition of
//! SIGTRAP is the default (checked again by the answer of the call that
//! replaces it): a process that handles or ignores SIGTRAP, or a debugger
//! beside tp, would see tp's traps. While a call is traced
//! ([`layout::trap::TRACING`]) the memory is never unmapped
//! ([`super::remove::check_unused`]); the handler ends the trace at the
//! next instruction once tp clears `armed`.

use std::mem::offset_of;

use anyhow::{Context, Result, bail};

use super::layout::{self, StepHandoff, TrapTrace, trap};
use super::region::Region;
use crate::arch::{Arch, Host};
use crate::process::memory::Memory;
use crate::process::remote::RemoteCaller;
use crate::process::{self};

/// SIGTRAP.
const SIGTRAP: u64 = 5;
/// `sa_flags`: the handler takes a siginfo and a ucontext; the return is
/// tp's own `rt_sigreturn`.
const SA_SIGINFO: u64 = 4;
const SA_RESTORER: u64 = 0x0400_0000;
/// The size of the kernel's signal set.
const SIGSET_SIZE: u64 = 8;
/// Addresses a trace holds beyond the instructions the user asked for:
/// tp's own (the runtime's return and the detour's, before the function's
/// first instruction; other probes' detours in the call).
const SLACK: u64 = 65_536;
/// The largest `--step-limit`.
const MAX_LIMIT: u64 = 100_000_000;

/// Where the trace mapping is, in the target and for how many addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrapArea {
    /// Its address in the target.
    pub addr: u64,
    /// Addresses it holds after the header.
    pub cap: u64,
}

impl TrapArea {
    /// Bytes of the mapping.
    pub fn bytes(&self) -> u64 {
        (trap::PCS_OFF + self.cap * 8).next_multiple_of(4096)
    }

    fn field(&self, off: usize) -> u64 {
        self.addr + off as u64
    }
}

/// Why the in-target engine cannot serve process `pid`, if it cannot: an
/// architecture without a trap flag user code can set, an engine an
/// earlier session left installed (in `existing`, the process's region),
/// a process that handles or ignores SIGTRAP itself, or one another
/// debugger traces.
pub fn refusal(pid: i32, existing: Option<&Region>) -> Option<String> {
    if !Host::TRAP_FLAG_STEPS {
        return Some(
            "--step-engine trap needs a trap flag user code can set (x86-64's); AArch64 user code cannot \
             single-step itself (the step bit, MDSCR_EL1.SS, is the kernel's): use --step-engine ptrace"
                .into(),
        );
    }
    if existing.is_some_and(|r| named(r) != 0) {
        return Some(format!(
            "an earlier tp session's in-target stepping engine is still installed in process {pid} (its SIGTRAP \
             handler): run `tp detach -p {pid}` first"
        ));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let bit = 1u64 << (SIGTRAP - 1);
    if (process::signal_mask(&status, "SigCgt") | process::signal_mask(&status, "SigIgn")) & bit != 0 {
        return Some(format!(
            "process {pid} handles or ignores SIGTRAP itself, which the in-target engine's traps would reach: \
             use --step-engine ptrace"
        ));
    }
    let tracer = process::parse_status(&status).tracer_pid;
    if tracer != 0 && tracer != std::process::id() as i32 {
        return Some(format!(
            "process {pid} is traced by process {tracer} (a debugger), which would see the in-target engine's \
             traps: use --step-engine ptrace"
        ));
    }
    None
}

/// The trace area the region names, for `limit` instructions (tp's own
/// bound on what it reads), if the region names one.
pub fn area(region: &Region, limit: u64) -> Option<TrapArea> {
    let addr = named(region);
    (addr != 0).then_some(TrapArea { addr, cap: limit + SLACK })
}

/// Maps the trace area for `limit` instructions in the process `caller`
/// holds, installs the SIGTRAP handler at `handler` (returning through
/// `restorer`) and tells the runtime where the area is. The process's
/// threads are stopped. Undone, and refused, if the handler it replaced
/// was not the default.
pub fn install(
    caller: &mut RemoteCaller,
    mem: &Memory,
    region: &Region,
    (handler, restorer): (u64, u64),
    limit: u64,
) -> Result<TrapArea> {
    if handler == 0 {
        bail!("this architecture has no in-target stepping engine");
    }
    let sc = Host::SYSCALLS;
    // The calls the handler and tp_step make in the target's threads.
    for (nr, args) in [
        (sc.gettid, [0; 6]),
        (sc.rt_sigprocmask, [0, 0, 0x7ffd_0000_0000, SIGSET_SIZE, 0, 0]),
        (sc.rt_sigreturn, [0; 6]),
        (sc.kill, [1, 0, 0, 0, 0, 0]),
    ] {
        caller.check(nr, args)?;
    }
    let mut area = TrapArea { addr: 0, cap: limit + SLACK };
    area.addr = caller.checked(
        "mmap",
        sc.mmap,
        [
            0,
            area.bytes(),
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
            u64::MAX,
            0,
        ],
    )?;
    let header = TrapTrace { cap: area.cap, ..TrapTrace::default() };
    let installed = (|| -> Result<()> {
        mem.write(area.addr, layout::bytes_of(&header)).context("writing the trace area's header")?;
        // The new and the old action, where the addresses will go.
        let (act, old) = (area.addr + trap::PCS_OFF, area.addr + trap::PCS_OFF + 32);
        let mut bytes = Vec::with_capacity(32);
        for w in [handler, SA_SIGINFO | SA_RESTORER, restorer, u64::MAX] {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        mem.write(act, &bytes)?;
        caller.checked("rt_sigaction", sc.rt_sigaction, [SIGTRAP, act, old, SIGSET_SIZE, 0, 0])?;
        let before = mem.read_u64(old)?;
        if before != 0 {
            caller.checked("rt_sigaction", sc.rt_sigaction, [SIGTRAP, old, 0, SIGSET_SIZE, 0, 0])?;
            bail!("process {} installed a SIGTRAP handler of its own: use --step-engine ptrace", caller.pid());
        }
        region.store_u64(TRAP_WORD, area.addr)?;
        Ok(())
    })();
    if let Err(e) = installed {
        let _ = caller.syscall(sc.munmap, [area.addr, area.bytes(), 0, 0, 0, 0]);
        return Err(e);
    }
    caller.keep_mapped();
    Ok(area)
}

/// The SIGTRAP handler and its return in the runtime block of the
/// region's first arena that has one (0, 0 if none does).
pub fn handler(region: &Region) -> (u64, u64) {
    let h = region.header();
    let l = super::runtime::layout_of(&h);
    h.arenas[..h.arena_count as usize].iter().find(|a| a.runtime != 0).map_or((0, 0), |a| {
        let addrs = Host::build_runtime(a.runtime, &l, &super::runtime::blobs()).addrs;
        (addrs.trap, addrs.trap_return)
    })
}

/// Where the region names the trace area ([`StepHandoff::trap`]).
const TRAP_WORD: u64 = layout::STEP_OFF + offset_of!(StepHandoff, trap) as u64;

/// The trace area the region names, if any.
fn named(region: &Region) -> u64 {
    region.load_u64(TRAP_WORD)
}

/// Puts SIGTRAP's default disposition back and unmaps the trace area of
/// the process `caller` holds, if the region names one: before tp's code
/// goes from that process. An area the target's maps do not show as tp's (anonymous, private,
/// writable) is left alone.
pub fn uninstall(caller: &mut RemoteCaller, mem: &Memory, region: &Region) -> Result<()> {
    let addr = named(region);
    if addr == 0 {
        return Ok(());
    }
    let sc = Host::SYSCALLS;
    let cap = header(mem, addr).map_or(0, |t| t.cap);
    // The header is the target's to write: the capacity is bounded by the
    // largest tp asks for (`--step-limit` at most 100,000,000).
    let area = TrapArea { addr, cap: cap.min(MAX_LIMIT + SLACK) };
    let maps = process::read_maps(caller.pid())?;
    let ours = process::maps::anonymous_covers(&maps, addr, addr + area.bytes());
    // The default action, written where the area's addresses go.
    let act = addr + trap::PCS_OFF;
    if ours && mem.write(act, &[0u8; 32]).is_ok() {
        caller.checked("rt_sigaction", sc.rt_sigaction, [SIGTRAP, act, 0, SIGSET_SIZE, 0, 0])?;
        caller.checked("munmap", sc.munmap, [addr, area.bytes(), 0, 0, 0, 0])?;
    } else {
        // The handler stays installed, so tp's code must stay too.
        bail!("the in-target stepping engine's area at {addr:#x} is not tp's any more");
    }
    // The word stays: a process this one forked shares the region, and
    // its own copy of the area and of the handler go at its own detach.
    Ok(())
}

/// Makes the runtime hand calls over to tp's ptrace engine: a trace area
/// an earlier session named (in a process of the family that still maps
/// it) is not this session's.
pub fn forget(region: &Region) -> Result<()> {
    region.store_u64(TRAP_WORD, 0)
}

/// True while a thread of the process traces its call (the handler is in
/// use: tp's memory must stay).
pub fn tracing(mem: &Memory, region: &Region) -> Option<u32> {
    let addr = named(region);
    if addr == 0 {
        return None;
    }
    header(mem, addr).filter(|t| t.state == trap::TRACING).map(|t| t.tid)
}

/// The trace area's header at `addr` in the target, as the target left it.
fn header(mem: &Memory, addr: u64) -> Option<TrapTrace> {
    let bytes = mem.read_vec(addr, trap::PCS_OFF as usize).ok()?;
    Some(layout::from_bytes(&bytes))
}

/// A finished trace as the handler left it, read with tp's own bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Every instruction address the handler recorded, tp's code included.
    pub raw: Vec<u64>,
    /// Why it ended ([`trap::RETURNED`], ...; anything else is read as stopped).
    pub end: u32,
    /// The syscall it ended at.
    pub syscall: u32,
    /// The traced thread, as its PID namespace numbers it.
    pub tid: u32,
    /// The runtime's timestamps at its start and end.
    pub start: u64,
    /// See [`Finished::start`].
    pub stop: u64,
}

/// The trace in `area` if it is done ([`trap::DONE`]); None while a call
/// is traced or none was. The count is bounded by tp's own capacity.
pub fn finished(mem: &Memory, area: TrapArea) -> Option<Finished> {
    let t = header(mem, area.addr)?;
    if t.state != trap::DONE {
        return None;
    }
    let n = t.count.min(area.cap);
    let bytes = mem.read_vec(area.addr + trap::PCS_OFF, (n * 8) as usize).ok()?;
    let raw = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Some(Finished { raw, end: t.end, syscall: t.syscall, tid: t.tid, start: t.start, stop: t.stop })
}

/// Makes `area` ready for the next call's trace.
pub fn reset(mem: &Memory, area: TrapArea) -> Result<()> {
    mem.write(area.field(offset_of!(TrapTrace, state)), &trap::IDLE.to_le_bytes())?;
    Ok(())
}
