//! What a counting detour may use at a probe site without saving it: the
//! general-purpose registers and status flags that the function's
//! instructions from the site (the window and the straight-line code after
//! it) overwrite before anything reads them.
//!
//! The detour runs just before the relocated window, and the window jumps
//! back to the instructions after it, so a register that those instructions
//! write whole before reading it holds, after them, what they put there,
//! whatever the detour left in it; the same goes for the status flags. Such
//! a value is dead at the site for every caller, also one that GCC's
//! interprocedural register allocation lets keep values in registers the
//! ABI calls scratch: the function itself overwrites them first.
//!
//! Only instructions that cannot trap count as overwriting: a register or
//! moves and arithmetic on registers and immediates, no memory access, no
//! division. An instruction that traps writes nothing, and a signal handler
//! (a crash reporter, a debugger) would see what the detour left where the
//! caller's value was: so the scan stops at the first instruction that may
//! trap, as it does at the first that can go elsewhere (a branch, call,
//! return, system call), after which what is live is unknown. A write of
//! a 32-bit register clears its upper half, so it defines the whole
//! register; a write of 8 or 16 bits, or a conditional one (`cmov`), does
//! not. A flag an instruction leaves undefined (`imul`'s SF ZF AF PF, the
//! AF of `test`, `and`, `xor`) counts as written: after the instruction
//! the program cannot rely on its value, the value the caller had
//! included.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, RflagsBits,
};

use super::reg::Reg;

/// OF SF ZF AF PF CF: the flags `lahf`/`seto` save and `sahf`/`add` restore.
const STATUS: u32 = RflagsBits::OF | RflagsBits::SF | RflagsBits::ZF | RflagsBits::AF | RflagsBits::PF | RflagsBits::CF;

/// Registers and flags dead at a window's first instruction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dead {
    /// The dead general-purpose registers, each as its [`Reg::bit`].
    pub regs: u16,
    /// All six status flags.
    pub flags: bool,
}

/// Bit of [`Dead::bits`] for the status flags.
const FLAGS_BIT: u32 = 1 << 16;

impl Dead {
    /// True if register `r` is dead.
    pub fn reg(&self, r: Reg) -> bool {
        self.regs & r.bit() != 0
    }

    /// As [`crate::arch::SitePlan::dead`] keeps it.
    pub fn bits(&self) -> u32 {
        self.regs as u32 | if self.flags { FLAGS_BIT } else { 0 }
    }

    /// From [`Dead::bits`].
    pub fn from_bits(bits: u32) -> Dead {
        Dead { regs: bits as u16, flags: bits & FLAGS_BIT != 0 }
    }
}

/// What is dead at the start of `code` (a function's bytes from the site
/// on), whose first byte is at `site`.
pub fn dead_at(code: &[u8], site: u64) -> Dead {
    let mut decided: u16 = 0; // registers read or written so far
    let mut dead: u16 = 0;
    let mut flags_written: u32 = 0;
    let mut flags_read_first = false;
    let mut info = InstructionInfoFactory::new();
    for ins in Decoder::with_ip(64, code, site, DecoderOptions::NONE) {
        if ins.is_invalid() {
            break;
        }
        let used = info.info(&ins);
        if used.used_memory().iter().any(|m| m.access() != OpAccess::NoMemAccess) || !cannot_trap(&ins) {
            break;
        }
        // Reads come before the instruction's writes.
        for u in used.used_registers() {
            if let Some(r) = Reg::of_iced(u.register())
                && matches!(
                    u.access(),
                    OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
                )
            {
                decided |= r.bit();
            }
        }
        for u in used.used_registers() {
            let whole = matches!(u.register().size(), 4 | 8);
            if let Some(r) = Reg::of_iced(u.register())
                && u.access() == OpAccess::Write
                && whole
                && decided & r.bit() == 0
            {
                dead |= r.bit();
                decided |= r.bit();
            }
        }
        if ins.rflags_read() & STATUS & !flags_written != 0 {
            flags_read_first = true;
        }
        flags_written |= ins.rflags_modified() & STATUS;
        if ins.flow_control() != FlowControl::Next {
            break;
        }
    }
    Dead { regs: dead, flags: !flags_read_first && flags_written & STATUS == STATUS }
}

/// True for the moves and arithmetic that cannot trap when their operands
/// are registers and immediates (`lea` computes an address it does not
/// access; the caller checks that nothing accesses memory).
fn cannot_trap(ins: &Instruction) -> bool {
    let operands_plain = (0..ins.op_count()).all(|i| match ins.op_kind(i) {
        OpKind::Register => true,
        OpKind::Memory => ins.mnemonic() == Mnemonic::Lea,
        k => is_immediate(k),
    });
    operands_plain
        && matches!(
            ins.mnemonic(),
            Mnemonic::Mov
                | Mnemonic::Movzx
                | Mnemonic::Movsx
                | Mnemonic::Movsxd
                | Mnemonic::Lea
                | Mnemonic::Add
                | Mnemonic::Sub
                | Mnemonic::Adc
                | Mnemonic::Sbb
                | Mnemonic::And
                | Mnemonic::Or
                | Mnemonic::Xor
                | Mnemonic::Cmp
                | Mnemonic::Test
                | Mnemonic::Imul
                | Mnemonic::Shl
                | Mnemonic::Shr
                | Mnemonic::Sar
                | Mnemonic::Rol
                | Mnemonic::Ror
                | Mnemonic::Inc
                | Mnemonic::Dec
                | Mnemonic::Neg
                | Mnemonic::Not
                | Mnemonic::Bswap
                | Mnemonic::Nop
        )
}

fn is_immediate(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate8_2nd
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(bytes: &[u8]) -> Dead {
        dead_at(bytes, 0x1000)
    }

    const RAX: u16 = Reg::Rax.bit();
    const RDI: u16 = Reg::Rdi.bit();

    #[test]
    fn a_register_written_whole_before_any_read_is_dead() {
        // imul eax, edi, 0x9e3779b1: rax is written (its upper half cleared), edi read.
        let d = dead(&[0x69, 0xc7, 0xb1, 0x79, 0x37, 0x9e]);
        assert_eq!(d.regs, RAX);
        assert!(d.flags, "imul writes CF and OF and leaves the other four undefined");
        // mov eax, 0x9e3779b1: rax dead, the flags live.
        assert_eq!(dead(&[0xb8, 0xb1, 0x79, 0x37, 0x9e]), Dead { regs: RAX, flags: false });
        // lea rax, [rip + x]: an address, no access.
        assert_eq!(dead(&[0x48, 0x8d, 0x05, 0, 0, 0, 0]), Dead { regs: RAX, flags: false });
    }

    #[test]
    fn nothing_is_dead_from_an_instruction_that_may_trap_on() {
        // mov rax, [rip + x]: a load that faults writes nothing, and a
        // handler would see the detour's rax.
        assert_eq!(dead(&[0x48, 0x8b, 0x05, 0, 0, 0, 0]), Dead::default());
        // push rbp; mov rbp, rsp; sub rsp, 16: the push may fault (stack
        // overflow) before the sub writes the flags.
        assert_eq!(dead(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10]), Dead::default());
        // xor eax, eax; div ecx: rax is dead before the division.
        assert!(dead(&[0x31, 0xc0, 0xf7, 0xf1]).reg(Reg::Rax));
        // div ecx; mov eax, 1: the division may trap first.
        assert_eq!(dead(&[0xf7, 0xf1, 0xb8, 1, 0, 0, 0]), Dead::default());
        // rdtsc writes rax and rdx, but may trap (PR_SET_TSC).
        assert_eq!(dead(&[0x0f, 0x31, 0x90, 0x90, 0x90]), Dead::default());
    }

    #[test]
    fn a_register_read_first_or_written_in_part_is_live() {
        // add rax, rdi: read then written.
        assert_eq!(dead(&[0x48, 0x01, 0xf8, 0x90, 0x90]).regs, 0);
        // mov al, 1; mov eax, 2: the byte write decides nothing, the whole write does.
        let d = dead(&[0xb0, 0x01, 0xb8, 2, 0, 0, 0]);
        assert_eq!(d.regs & RAX, RAX, "mov eax after mov al: written whole before any read");
        // cmove rax, rdi: a conditional write keeps the old value when the condition fails.
        assert_eq!(dead(&[0x48, 0x0f, 0x44, 0xc7, 0x90]).regs, 0);
        // mov ax, 1 (16 bits): the rest of rax survives.
        assert_eq!(dead(&[0x66, 0xb8, 0x01, 0x00, 0x90]).regs & RAX, 0);
        // mov rdi, [rdi]: the address is read first.
        assert_eq!(dead(&[0x48, 0x8b, 0x3f, 0x90, 0x90]).regs & RDI, 0);
    }

    #[test]
    fn flags_are_dead_when_written_before_read() {
        // sub rsp, 0x18; mov rbp, rsp: all six written; rsp is read first.
        let d = dead(&[0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0xe5]);
        assert!(d.flags);
        assert_eq!(d.regs, 1 << 5, "rbp written whole before any read");
        // test edi, edi; jne: written first (AF undefined).
        assert!(dead(&[0x85, 0xff, 0x75, 0x01]).flags);
        // inc eax leaves CF alone: the caller's CF survives it.
        assert!(!dead(&[0xff, 0xc0, 0x90, 0x90, 0x90]).flags);
        // adc reads CF before writing it.
        assert!(!dead(&[0x48, 0x11, 0xf8, 0x90, 0x90]).flags);
        // push rbx; push rbp; ...: nothing written.
        assert_eq!(dead(&[0x53, 0x55, 0x41, 0x54, 0x41, 0x55]), Dead::default());
    }

    #[test]
    fn the_scan_stops_at_control_flow() {
        // jne first: flags read; mov eax after it is not known to run.
        let d = dead(&[0x75, 0x05, 0xb8, 1, 0, 0, 0]);
        assert_eq!(d, Dead::default());
        // call rel32 as the window: nothing after it counts.
        assert_eq!(dead(&[0xe8, 0, 0, 0, 0, 0xb8, 1, 0, 0, 0]), Dead::default());
        // xor eax, eax; ret: rax written before the return.
        assert!(dead(&[0x31, 0xc0, 0xc3, 0x90, 0x90]).reg(Reg::Rax));
    }

    #[test]
    fn ah_counts_as_rax() {
        // mov ah, 1 reads nothing but writes a byte: rax stays live for a later whole write.
        assert_eq!(dead(&[0xb4, 0x01, 0xb8, 2, 0, 0, 0]).regs & RAX, RAX);
        // add al, ah reads rax.
        assert_eq!(dead(&[0x00, 0xe0, 0xb8, 2, 0, 0, 0]).regs & RAX, 0);
    }
}
