//! AArch64 thread registers: NT_PRSTATUS (`struct user_pt_regs`) plus
//! NT_ARM_SYSTEM_CALL, the number of the syscall a thread is stopped in,
//! and NT_ARM_TLS, its thread pointer.
//!
//! Writing -1 to NT_ARM_SYSTEM_CALL is how a tracer tells the kernel the
//! thread is no longer in a syscall, so it will not rewind the PC to restart
//! one (arch/arm64/kernel/ptrace.c, system_call_set).

use std::io;

use crate::arch::{BlockedIn, RegisterSets, read_into, write_from};

/// `struct user_pt_regs` of arm64 Linux.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PtRegs {
    /// x0..x30.
    pub regs: [u64; 31],
    /// Stack pointer.
    pub sp: u64,
    /// Program counter.
    pub pc: u64,
    /// PSTATE (NZCV, BTYPE, ...).
    pub pstate: u64,
}

/// A stopped thread's registers and the syscall it is in (-1 if none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Regs {
    /// General registers.
    pub pt: PtRegs,
    /// NT_ARM_SYSTEM_CALL.
    pub syscallno: i32,
    /// TPIDR_EL0, the thread pointer (NT_ARM_TLS); read, never written.
    pub tpidr: u64,
}

const NT_PRSTATUS: u32 = 1;
const NT_ARM_SYSTEM_CALL: u32 = 0x404;
const NT_ARM_TLS: u32 = 0x401;
/// PSTATE.BTYPE (bits 11:10): must be cleared when redirecting a thread, or
/// the first instruction at the new PC must be a BTI landing pad.
pub const PSTATE_BTYPE: u64 = 0b11 << 10;
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

const NT_ARM_HW_BREAK: u32 = 0x402;
/// A breakpoint control word (DBGBCR) as the kernel's ptrace takes it:
/// enabled (bit 0), at EL0 (privilege 2 in bits 2:1), an instruction
/// breakpoint (type 0 in bits 4:3) on all four bytes (length 0xf in bits 12:5).
const BCR_EXEC_EL0: u32 = (0xf << 5) | (2 << 1) | 1;

/// Sets the hardware breakpoints tp uses on a stopped thread (none: clears
/// them): the first two of NT_ARM_HW_BREAK's registers (`struct
/// user_hwdebug_state`: dbg_info and padding, then address, control and
/// padding per register; the kernel reads as many registers as given; the
/// architecture has two at least). The kernel reports a hit as a SIGTRAP
/// with the PC at the address, before the instruction runs, and does not
/// step over it: the breakpoint must be cleared for the thread to get past.
pub fn set_exec_breakpoint(sets: &dyn RegisterSets, at: &[u64]) -> io::Result<()> {
    const REGS: usize = 2;
    if at.len() > REGS {
        return Err(io::Error::other("more than two hardware breakpoints"));
    }
    let mut state = [0u8; 8 + 16 * REGS];
    for (n, &addr) in at.iter().enumerate() {
        let reg = &mut state[8 + 16 * n..8 + 16 * (n + 1)];
        reg[..8].copy_from_slice(&addr.to_le_bytes());
        reg[8..12].copy_from_slice(&BCR_EXEC_EL0.to_le_bytes());
    }
    sets.write(NT_ARM_HW_BREAK, &state)
}

/// Reads the registers of a stopped thread from its register sets.
pub fn get(sets: &dyn RegisterSets) -> io::Result<Regs> {
    let mut r = Regs::default();
    read_into(sets, NT_PRSTATUS, &mut r.pt)?;
    read_into(sets, NT_ARM_SYSTEM_CALL, &mut r.syscallno)?;
    read_into(sets, NT_ARM_TLS, &mut r.tpidr)?;
    Ok(r)
}

/// Writes the registers of a stopped thread into its register sets.
pub fn set(sets: &dyn RegisterSets, r: &Regs) -> io::Result<()> {
    write_from(sets, NT_PRSTATUS, &r.pt)?;
    write_from(sets, NT_ARM_SYSTEM_CALL, &r.syscallno)
}

/// Where the thread resumes if the kernel restarts its interrupted syscall.
pub fn restart_pc(r: &Regs) -> Option<u64> {
    (r.syscallno >= 0 && RESTART_CODES.contains(&(r.pt.regs[0] as i64))).then(|| r.pt.pc.wrapping_sub(4))
}

/// Waits that return EINTR when their thread is stopped, even by a tracer,
/// and are never restarted: epoll_pwait, epoll_pwait2 (AArch64 has no
/// epoll_wait).
const WAITS_WITHOUT_RESTART: [u64; 2] = [22, 441];
const EINTR: i64 = -4;

/// See [`crate::arch::Arch::restart_interrupted_wait`]. arm64 Linux decides
/// whether to restart a syscall from x0 before the stop (x86-64 does it
/// after), and keeps the first argument, which the result replaced, where
/// no regset shows it: so tp restarts the wait itself, rewinding the PC to
/// the `svc` with the arguments `/proc` showed before the interrupt, if
/// they are still the thread's (the same call site, whose `svc` made it,
/// the same stack pointer and other arguments) and no signal handler is
/// about to run (then the program gets its EINTR, as without tp).
pub fn restart_interrupted_wait(r: &mut Regs, blocked: Option<&BlockedIn>, handler_pending: bool) -> bool {
    let Some(b) = blocked else { return false };
    let nr = r.pt.regs[8];
    if handler_pending
        || r.pt.regs[0] as i64 != EINTR
        || !WAITS_WITHOUT_RESTART.contains(&nr)
        || b.nr != nr
        || b.pc != r.pt.pc
        || b.sp != r.pt.sp
        || b.args[1..] != r.pt.regs[1..6]
    {
        return false;
    }
    r.pt.regs[0] = b.args[0];
    r.pt.pc -= 4;
    r.pt.pstate &= !PSTATE_BTYPE;
    r.syscallno = -1;
    true
}

/// Sets up a syscall at `insn` (an `svc #0`).
pub fn prepare_syscall(r: &mut Regs, insn: u64, nr: u64, a: [u64; 6]) {
    r.pt.pc = insn;
    r.pt.pstate &= !PSTATE_BTYPE;
    r.pt.regs[8] = nr;
    r.pt.regs[..6].copy_from_slice(&a);
    r.syscallno = -1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_epoll_wait_interrupted_by_the_stop_is_restarted_where_it_was() {
        let mut r = Regs::default();
        r.pt.pc = 0x41_0004;
        r.pt.sp = 0xffff_f000;
        r.pt.regs[0] = (-4i64) as u64;
        r.pt.regs[1..6].copy_from_slice(&[0x7000, 1, u64::MAX, 0, 8]);
        r.pt.regs[8] = 22;
        let blocked = BlockedIn { nr: 22, args: [5, 0x7000, 1, u64::MAX, 0, 8], sp: 0xffff_f000, pc: 0x41_0004 };
        let mut w = r;
        assert!(restart_interrupted_wait(&mut w, Some(&blocked), false));
        assert_eq!((w.pt.regs[0], w.pt.pc), (5, 0x41_0000), "the svc again, with the epoll descriptor");
        // A handler about to run, another call site or argument, a result
        // other than EINTR, another syscall, nothing known: left alone.
        assert!(!restart_interrupted_wait(&mut r.clone(), Some(&blocked), true));
        for change in 0..5 {
            let mut b = blocked;
            let mut x = r;
            match change {
                0 => b.pc += 4,
                1 => b.args[2] = 2,
                2 => x.pt.regs[0] = 1,
                3 => {
                    x.pt.regs[8] = 63;
                    b.nr = 63;
                }
                _ => b.sp += 16,
            }
            assert!(!restart_interrupted_wait(&mut x, Some(&b), false), "change {change}");
            assert_eq!(x.pt.pc, r.pt.pc);
        }
        assert!(!restart_interrupted_wait(&mut r.clone(), None, false));
    }

    #[test]
    fn layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<PtRegs>(), 34 * 8);
    }

    #[test]
    fn restart_pc_needs_a_syscall_and_a_restart_code() {
        let mut r = Regs { syscallno: 101, ..Default::default() };
        r.pt.pc = 0x1004;
        r.pt.regs[0] = (-516i64) as u64;
        assert_eq!(restart_pc(&r), Some(0x1000));
        r.syscallno = -1;
        assert_eq!(restart_pc(&r), None);
    }
}
