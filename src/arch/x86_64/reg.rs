//! The sixteen x86-64 general-purpose registers, by the number that
//! encodes them (ModRM, SIB, REX and the `push`/`pop` opcodes): the one
//! register type of the writer, the detours, the runtime block's fast
//! paths, the operand loads and the liveness scan.

/// A 64-bit general-purpose register; its discriminant is its encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Reg {
    /// rax (0).
    Rax = 0,
    /// rcx (1).
    Rcx = 1,
    /// rdx (2).
    Rdx = 2,
    /// rbx (3).
    Rbx = 3,
    /// rsp (4).
    Rsp = 4,
    /// rbp (5).
    Rbp = 5,
    /// rsi (6).
    Rsi = 6,
    /// rdi (7).
    Rdi = 7,
    /// r8.
    R8 = 8,
    /// r9.
    R9 = 9,
    /// r10.
    R10 = 10,
    /// r11.
    R11 = 11,
    /// r12.
    R12 = 12,
    /// r13.
    R13 = 13,
    /// r14.
    R14 = 14,
    /// r15.
    R15 = 15,
}

impl Reg {
    /// Every register, in encoding order.
    pub const ALL: [Reg; 16] = [
        Reg::Rax,
        Reg::Rcx,
        Reg::Rdx,
        Reg::Rbx,
        Reg::Rsp,
        Reg::Rbp,
        Reg::Rsi,
        Reg::Rdi,
        Reg::R8,
        Reg::R9,
        Reg::R10,
        Reg::R11,
        Reg::R12,
        Reg::R13,
        Reg::R14,
        Reg::R15,
    ];

    /// The register numbered `n` (0..16; the numbering of DWARF's and of
    /// static probes' notes is another: see `sdt`).
    pub fn from_num(n: u8) -> Option<Reg> {
        Reg::ALL.get(n as usize).copied()
    }

    /// Its encoding, 0..16.
    pub const fn num(self) -> u8 {
        self as u8
    }

    /// The low three bits of its encoding (the ModRM, SIB or opcode field).
    pub const fn low(self) -> u8 {
        self as u8 & 7
    }

    /// The fourth bit of its encoding (a REX extension bit).
    pub const fn ext(self) -> u8 {
        self as u8 >> 3
    }

    /// Its bit in a set of registers (bit n for register n).
    pub const fn bit(self) -> u16 {
        1 << self as u8
    }

    /// Its name, as disassemblers write it.
    pub const fn name(self) -> &'static str {
        ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"]
            [self as usize]
    }

    /// Its low 32 bits' name.
    pub const fn name32(self) -> &'static str {
        [
            "eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "r8d", "r9d", "r10d", "r11d", "r12d", "r13d",
            "r14d", "r15d",
        ][self as usize]
    }

    /// The same register as iced-x86 names it.
    pub fn iced(self) -> iced_x86::Register {
        use iced_x86::Register as R;
        [
            R::RAX,
            R::RCX,
            R::RDX,
            R::RBX,
            R::RSP,
            R::RBP,
            R::RSI,
            R::RDI,
            R::R8,
            R::R9,
            R::R10,
            R::R11,
            R::R12,
            R::R13,
            R::R14,
            R::R15,
        ][self as usize]
    }

    /// The 64-bit register iced-x86's `r` is or is part of (eax, ax, al
    /// and ah are rax), if it is a general-purpose one.
    pub fn of_iced(r: iced_x86::Register) -> Option<Reg> {
        if !r.is_gpr() {
            return None;
        }
        let full = r.full_register();
        let n = (full as u32).checked_sub(iced_x86::Register::RAX as u32)?;
        (full as u32 <= iced_x86::Register::R15 as u32).then(|| Reg::ALL[n as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_agree_with_iced() {
        for (n, r) in Reg::ALL.into_iter().enumerate() {
            assert_eq!((r.num() as usize, Reg::from_num(n as u8)), (n, Some(r)));
            assert_eq!(format!("{:?}", r.iced()).to_lowercase(), r.name());
            assert_eq!(Reg::of_iced(r.iced()), Some(r));
        }
        assert_eq!(Reg::of_iced(iced_x86::Register::AH), Some(Reg::Rax));
        assert_eq!(Reg::of_iced(iced_x86::Register::R9D), Some(Reg::R9));
        assert_eq!(Reg::of_iced(iced_x86::Register::XMM0), None);
        assert_eq!(Reg::of_iced(iced_x86::Register::RIP), None);
        assert_eq!(Reg::from_num(16), None);
    }
}
