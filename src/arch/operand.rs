//! The arguments of a static probe (USDT, SystemTap SDT): where each value
//! is at the probe's site, as the note's argument string says it
//! (`-4@%eax`, `8@16(%rbp)`, `-4@$5`; AArch64 `8@x0`, `4@[sp, 8]`), and
//! the same once resolved for a detour to load ([`Operand`]). Register
//! numbers are the architecture's own: each architecture parses its
//! strings ([`crate::arch::Isa::sdt_argument`]) and loads its operands.

use std::fmt;

/// Most arguments an event records (its argument words).
pub const MAX_OPERANDS: usize = 6;

/// Where one argument is, as parsed from its note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSpec {
    /// Its size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// True if it is signed (a `-` before the size).
    pub signed: bool,
    /// Where it is.
    pub loc: ArgLoc,
}

/// Where an argument is at the probe's site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgLoc {
    /// In a register.
    Register(u8),
    /// In memory at `base + index * scale + disp`.
    Memory {
        /// The base register, if any.
        base: Option<u8>,
        /// The index register and its scale (1, 2, 4 or 8), if any.
        index: Option<(u8, u8)>,
        /// The displacement.
        disp: i64,
    },
    /// In memory at a symbol's address plus an offset (`counter+8(%rip)`):
    /// the symbol is looked up in the file.
    Symbol {
        /// The symbol's name.
        name: String,
        /// Bytes past it.
        offset: i64,
    },
    /// A constant.
    Constant(i64),
}

/// An argument ready for a detour to load (its symbol, if any, resolved to
/// a runtime address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Its size in bytes (1, 2, 4, 8): what is read of memory, and what the
    /// tracer keeps of the word (a register is recorded whole).
    pub size: u8,
    /// True if it is signed.
    pub signed: bool,
    /// Where it is.
    pub loc: OperandLoc,
}

/// Where an [`Operand`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandLoc {
    /// In a register.
    Register(u8),
    /// In memory at `base + index * scale + disp`.
    Memory {
        /// The base register, if any.
        base: Option<u8>,
        /// The index register and its scale, if any.
        index: Option<(u8, u8)>,
        /// The displacement.
        disp: i64,
    },
    /// In memory at this runtime address.
    Absolute(u64),
    /// A constant.
    Constant(i64),
    /// Nowhere tp can read (its note could not be read): recorded as 0,
    /// shown as unknown.
    Unreadable,
}

/// The operands a detour loads into an event's argument words, in order
/// (at most [`MAX_OPERANDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operands {
    len: u8,
    ops: [Operand; MAX_OPERANDS],
}

impl Operands {
    /// The first [`MAX_OPERANDS`] of `ops`.
    pub fn new(ops: &[Operand]) -> Operands {
        let none = Operand { size: 8, signed: false, loc: OperandLoc::Unreadable };
        let mut out = Operands { len: 0, ops: [none; MAX_OPERANDS] };
        for (slot, op) in out.ops.iter_mut().zip(ops) {
            *slot = *op;
            out.len += 1;
        }
        out
    }

    /// The operands.
    pub fn as_slice(&self) -> &[Operand] {
        &self.ops[..self.len as usize]
    }
}

impl fmt::Display for ArgSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.signed { "signed" } else { "unsigned" };
        write!(f, "{sign} {}-byte", self.size)
    }
}

/// Splits `size@operand` into the signed size and the operand text: `-4`,
/// `8`; sizes other than 1, 2, 4 and 8 (and floats, `4f@`) are refused.
pub fn split_size(arg: &str) -> Result<(u8, bool, &str), String> {
    let (size, rest) = arg.split_once('@').ok_or_else(|| format!("`{arg}` has no `@` after its size"))?;
    let (signed, digits) = match size.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, size),
    };
    let n: u8 = match digits {
        "1" => 1,
        "2" => 2,
        "4" => 4,
        "8" => 8,
        _ if digits.ends_with('f') => return Err(format!("`{arg}` is a floating-point value, which tp does not read")),
        _ => return Err(format!("`{arg}` has a size tp does not know (1, 2, 4 or 8 bytes)")),
    };
    if rest.is_empty() {
        return Err(format!("`{arg}` names no place after `@`"));
    }
    Ok((n, signed, rest))
}

/// A number as an assembler writes it: decimal, `0x` hexadecimal, with an
/// optional sign.
pub fn parse_number(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()? as i64,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits.parse::<u64>().ok()? as i64,
        None => return None,
    };
    Some(if neg { v.wrapping_neg() } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_signs_split_off() {
        assert_eq!(split_size("-4@%eax").unwrap(), (4, true, "%eax"));
        assert_eq!(split_size("8@16(%rbp)").unwrap(), (8, false, "16(%rbp)"));
        assert!(split_size("3@%eax").unwrap_err().contains("size"));
        assert!(split_size("8f@%xmm0").unwrap_err().contains("floating"));
        assert!(split_size("%eax").is_err() && split_size("8@").is_err());
    }

    #[test]
    fn numbers_as_assemblers_write_them() {
        assert_eq!(parse_number("16"), Some(16));
        assert_eq!(parse_number("-0x10"), Some(-16));
        assert_eq!(parse_number("+7"), Some(7));
        assert_eq!(parse_number("x"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("-"), None);
    }

    #[test]
    fn operands_keep_the_first_six() {
        let op = |v| Operand { size: 4, signed: true, loc: OperandLoc::Constant(v) };
        let ops: Vec<Operand> = (0..8).map(op).collect();
        assert_eq!(Operands::new(&ops).as_slice(), &ops[..6]);
        assert!(Operands::new(&[]).as_slice().is_empty());
    }
}
