//! The AArch64 registers tp's code names, by their 5-bit field: x0..x30,
//! and 31, which is the stack pointer or the zero register depending on
//! the instruction. The one register type of the writer, the decoder, the
//! relocation and the detours.

/// A register field: x0..x30, or 31 (SP or XZR). A load's destination
/// may be a SIMD&FP register of the same number ([`super::writer::LoadKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reg(u8);

impl Reg {
    /// Intra-procedure-call scratch register 0: free at a function's entry.
    pub const X16: Reg = Reg(16);
    /// Intra-procedure-call scratch register 1: free at a function's entry.
    pub const X17: Reg = Reg(17);
    /// The platform register, which the detours save.
    pub const X18: Reg = Reg(18);
    /// The link register (x30).
    pub const LR: Reg = Reg(30);
    /// Register number 31 where it means the stack pointer.
    pub const SP: Reg = Reg(31);
    /// Register number 31 where it means the zero register.
    pub const XZR: Reg = Reg(31);

    /// Register `n` (x0..x30; 31 is [`Reg::SP`] or [`Reg::XZR`]).
    pub const fn x(n: u32) -> Reg {
        assert!(n < 32, "a register field has five bits");
        Reg(n as u8)
    }

    /// The register in the five bits of `word` from bit `lsb`.
    pub const fn field_of(word: u32, lsb: u32) -> Reg {
        Reg(((word >> lsb) & 31) as u8)
    }

    /// Its five-bit field.
    pub const fn field(self) -> u32 {
        self.0 as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        assert_eq!(Reg::x(30), Reg::LR);
        assert_eq!((Reg::SP.field(), Reg::XZR.field(), Reg::X16.field()), (31, 31, 16));
        assert_eq!(Reg::field_of(0xd63f_0040, 5), Reg::x(2));
    }
}
