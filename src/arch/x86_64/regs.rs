//! x86-64 thread registers: NT_PRSTATUS, and the debug registers in `struct
//! user` (read and written by `process` through ptrace).
//!
//! [`Regs`] is this crate's own copy of the kernel's `struct user_regs_struct`
//! (arch/x86/include/asm/user_64.h), so it compiles on every host.

use std::io;

use crate::arch::{RegisterSets, read_into, write_from};

/// `struct user_regs_struct` of x86-64 Linux.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}

const NT_PRSTATUS: u32 = 1;

/// Kernel-internal return values of an interrupted syscall that will be
/// restarted by rewinding the PC over the `syscall` instruction
/// (include/linux/errno.h: ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK).
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

/// Reads the registers of a stopped thread from its register sets.
pub fn get(sets: &dyn RegisterSets) -> io::Result<Regs> {
    let mut r = Regs::default();
    read_into(sets, NT_PRSTATUS, &mut r)?;
    Ok(r)
}

/// Writes the registers of a stopped thread into its register sets.
pub fn set(sets: &dyn RegisterSets, r: &Regs) -> io::Result<()> {
    write_from(sets, NT_PRSTATUS, r)
}

/// Where `struct user` (sys/user.h) keeps the debug registers DR0..DR7,
/// PTRACE_POKEUSER's offset for DR0.
const DEBUGREG_OFF: usize = 848;
/// EFLAGS.RF, the resume flag: the next instruction runs without its
/// instruction breakpoint firing.
pub const EFLAGS_RF: u64 = 1 << 16;
/// DR7's local enable bit for DRn is bit 2n: with its RWn and LENn fields
/// zero, a breakpoint on executing the instruction at DRn's address.
const DR7_L0: u64 = 1;

/// Sets the hardware breakpoints tp uses on a stopped thread (none:
/// clears them): DR0, DR1... at the addresses (four at most), each enabled
/// for execution in DR7. The kernel reports a hit as a SIGTRAP with the PC
/// at the address, before the instruction runs, and sets RF so that the
/// instruction runs once the thread goes on.
pub fn set_exec_breakpoint(sets: &dyn RegisterSets, at: &[u64]) -> io::Result<()> {
    if at.len() > 4 {
        return Err(io::Error::other("more than four hardware breakpoints"));
    }
    // DR7 off first: a new address under an enabled DR7 would be checked
    // against the old length and type.
    sets.write_user(DEBUGREG_OFF + 7 * 8, 0)?;
    let mut dr7 = 0;
    for (n, &addr) in at.iter().enumerate() {
        sets.write_user(DEBUGREG_OFF + n * 8, addr)?;
        dr7 |= DR7_L0 << (2 * n);
    }
    if dr7 != 0 {
        sets.write_user(DEBUGREG_OFF + 7 * 8, dr7)?;
    }
    Ok(())
}

/// Where the thread resumes if the kernel restarts its interrupted syscall.
pub fn restart_pc(r: &Regs) -> Option<u64> {
    ((r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64))).then(|| r.rip.wrapping_sub(2))
}

/// Waits that return EINTR when their thread is stopped, even by a tracer,
/// and are never restarted: epoll_wait, epoll_pwait, epoll_pwait2.
const WAITS_WITHOUT_RESTART: [u64; 3] = [232, 281, 441];
const EINTR: i64 = -4;
const ERESTARTNOHAND: i64 = -514;

/// See [`crate::arch::Arch::restart_interrupted_wait`].
pub fn restart_interrupted_wait(r: &mut Regs) -> bool {
    if WAITS_WITHOUT_RESTART.contains(&r.orig_rax) && r.rax as i64 == EINTR {
        r.rax = ERESTARTNOHAND as u64;
        return true;
    }
    false
}

/// Sets up a syscall at `insn`. orig_rax = -1 tells the kernel the thread is
/// no longer in a syscall, so it does not rewind the PC to restart one.
pub fn prepare_syscall(r: &mut Regs, insn: u64, nr: u64, a: [u64; 6]) {
    r.rip = insn;
    r.rax = nr;
    r.orig_rax = u64::MAX;
    r.rdi = a[0];
    r.rsi = a[1];
    r.rdx = a[2];
    r.r10 = a[3];
    r.r8 = a[4];
    r.r9 = a[5];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_return_after_themselves() {
        use crate::arch::Arch;
        use crate::arch::x86_64::X86_64;
        let ret = |code: &[u8]| <X86_64 as Arch>::call_return(code, 0x1000);
        assert_eq!(ret(&[0xe8, 0, 1, 0, 0]), Some(0x1005), "call rel32");
        assert_eq!(ret(&[0xff, 0xd0, 0x90]), Some(0x1002), "call rax");
        assert_eq!(ret(&[0x41, 0xff, 0x14, 0x24]), Some(0x1004), "call [r12]");
        assert_eq!(ret(&[0xe9, 0, 1, 0, 0]), None, "jmp rel32");
        assert_eq!(ret(&[0xc3]), None, "ret");
        assert_eq!(ret(&[0xe8, 0]), None, "cut short");
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn debug_registers_are_where_struct_user_keeps_them() {
        assert_eq!(std::mem::offset_of!(libc::user, u_debugreg), DEBUGREG_OFF);
    }

    #[test]
    fn layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<Regs>(), 27 * 8);
        assert_eq!(std::mem::offset_of!(Regs, orig_rax), 15 * 8);
        assert_eq!(std::mem::offset_of!(Regs, rip), 16 * 8);
        assert_eq!(std::mem::offset_of!(Regs, fs_base), 21 * 8);
    }

    #[test]
    fn only_an_interrupted_epoll_wait_is_made_restartable() {
        let mut r = Regs { rip: 0x1002, orig_rax: 232, rax: (-4i64) as u64, ..Default::default() };
        assert!(restart_interrupted_wait(&mut r));
        assert_eq!(r.rax as i64, -514);
        assert_eq!(restart_pc(&r), Some(0x1000));
        // A completed epoll_wait, an EINTR from another syscall, no syscall at all.
        for (orig_rax, rax) in [(232, 1), (0, -4i64 as u64), (u64::MAX, -4i64 as u64)] {
            let mut r = Regs { rip: 0x1002, orig_rax, rax, ..Default::default() };
            assert!(!restart_interrupted_wait(&mut r));
            assert_eq!(r.rax, rax);
        }
    }

    #[test]
    fn restart_pc_only_for_restartable_syscalls() {
        let mut r = Regs { rip: 0x1002, orig_rax: 35, rax: (-516i64) as u64, ..Default::default() };
        assert_eq!(restart_pc(&r), Some(0x1000));
        r.rax = (-4i64) as u64; // EINTR is final
        assert_eq!(restart_pc(&r), None);
        r.orig_rax = u64::MAX;
        r.rax = (-512i64) as u64;
        assert_eq!(restart_pc(&r), None);
    }
}
