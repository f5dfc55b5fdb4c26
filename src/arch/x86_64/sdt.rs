//! The arguments of x86-64 static probes, as `<sys/sdt.h>` writes them in
//! AT&T syntax: `-4@%eax` (a register), `8@16(%rbp)` and
//! `8@-8(%rbp,%rax,8)` (memory), `-4@$5` (a constant), `4@counter(%rip)`
//! and `8@table+16(%rip)` (memory at a symbol). Register numbers are the
//! encoding's: rax 0 … r15 15.

use crate::arch::operand::{parse_number, split_size};
use crate::arch::{ArgLoc, ArgSpec};

/// Register names by encoding number, in their 64-, 32-, 16- and 8-bit forms.
const NAMES: [[&str; 4]; 16] = [
    ["rax", "eax", "ax", "al"],
    ["rcx", "ecx", "cx", "cl"],
    ["rdx", "edx", "dx", "dl"],
    ["rbx", "ebx", "bx", "bl"],
    ["rsp", "esp", "sp", "spl"],
    ["rbp", "ebp", "bp", "bpl"],
    ["rsi", "esi", "si", "sil"],
    ["rdi", "edi", "di", "dil"],
    ["r8", "r8d", "r8w", "r8b"],
    ["r9", "r9d", "r9w", "r9b"],
    ["r10", "r10d", "r10w", "r10b"],
    ["r11", "r11d", "r11w", "r11b"],
    ["r12", "r12d", "r12w", "r12b"],
    ["r13", "r13d", "r13w", "r13b"],
    ["r14", "r14d", "r14w", "r14b"],
    ["r15", "r15d", "r15w", "r15b"],
];

/// The number of register `name` (without `%`), if it is a general one
/// whose value starts at bit 0.
fn register(name: &str) -> Option<u8> {
    let name = name.strip_prefix('%')?;
    NAMES.iter().position(|forms| forms.contains(&name)).map(|i| i as u8)
}

/// The name of register `n` as a 64-bit register, for messages.
pub fn register_name(n: u8) -> &'static str {
    NAMES.get(n as usize).map_or("?", |forms| forms[0])
}

/// Parses one argument: `size@place`.
pub fn argument(arg: &str) -> Result<ArgSpec, String> {
    let (size, signed, place) = split_size(arg)?;
    let loc = location(place).ok_or_else(|| format!("`{arg}`: tp does not read an argument at `{place}`"))?;
    Ok(ArgSpec { size, signed, loc })
}

fn location(place: &str) -> Option<ArgLoc> {
    if let Some(imm) = place.strip_prefix('$') {
        return parse_number(imm).map(ArgLoc::Constant);
    }
    if place.starts_with('%') {
        return register(place).map(ArgLoc::Register);
    }
    let (disp, inner) = match place.find('(') {
        Some(open) => {
            let inner = place[open + 1..].strip_suffix(')')?;
            (&place[..open], Some(inner))
        }
        None => (place, None),
    };
    let Some(inner) = inner else {
        // An absolute address (no register).
        return parse_number(disp).map(|d| ArgLoc::Memory { base: None, index: None, disp: d });
    };
    if inner == "%rip" {
        // Only a symbol makes sense RIP-relative: a number would be relative
        // to an instruction the note does not name.
        let (name, offset) = symbol(disp)?;
        return Some(ArgLoc::Symbol { name: name.to_string(), offset });
    }
    let disp = if disp.is_empty() { 0 } else { parse_number(disp)? };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    let base = match parts[0] {
        "" => None,
        b => Some(register_64(b)?),
    };
    let index = match parts.len() {
        1 => None,
        2 | 3 => {
            let scale = match parts.get(2) {
                None => 1,
                Some(s) => parse_number(s).filter(|s| matches!(s, 1 | 2 | 4 | 8))? as u8,
            };
            Some((register_64(parts[1]).filter(|&r| r != 4)?, scale))
        }
        _ => return None,
    };
    if base.is_none() && index.is_none() {
        return None;
    }
    Some(ArgLoc::Memory { base, index, disp })
}

/// A 64-bit register as an address part.
fn register_64(name: &str) -> Option<u8> {
    let n = register(name)?;
    (NAMES[n as usize][0] == &name[1..]).then_some(n)
}

/// `name`, `name+8`, `name-8`: a symbol and an offset.
fn symbol(text: &str) -> Option<(&str, i64)> {
    let cut = text.find(['+', '-']).unwrap_or(text.len());
    let (name, rest) = text.split_at(cut);
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '@');
    if name.is_empty() || !name.chars().all(ok) || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let offset = if rest.is_empty() { 0 } else { parse_number(rest)? };
    Some((name, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(arg: &str) -> ArgLoc {
        argument(arg).unwrap().loc
    }

    #[test]
    fn registers_in_every_width() {
        assert_eq!(argument("-4@%eax").unwrap(), ArgSpec { size: 4, signed: true, loc: ArgLoc::Register(0) });
        assert_eq!(loc("8@%rdi"), ArgLoc::Register(7));
        assert_eq!(loc("2@%r9w"), ArgLoc::Register(9));
        assert_eq!(loc("1@%sil"), ArgLoc::Register(6));
        assert_eq!(loc("8@%r15"), ArgLoc::Register(15));
        assert!(argument("1@%ah").is_err(), "high-byte registers are not read");
        assert!(argument("8@%xmm0").is_err());
    }

    #[test]
    fn memory_constants_and_symbols() {
        assert_eq!(loc("8@16(%rbp)"), ArgLoc::Memory { base: Some(5), index: None, disp: 16 });
        assert_eq!(loc("-4@-20(%rbp)"), ArgLoc::Memory { base: Some(5), index: None, disp: -20 });
        assert_eq!(loc("-4@112(%rsp)"), ArgLoc::Memory { base: Some(4), index: None, disp: 112 });
        assert_eq!(loc("8@(%rax)"), ArgLoc::Memory { base: Some(0), index: None, disp: 0 });
        assert_eq!(loc("8@8(%rax,%rdx,8)"), ArgLoc::Memory { base: Some(0), index: Some((2, 8)), disp: 8 });
        assert_eq!(loc("8@(,%rcx,4)"), ArgLoc::Memory { base: None, index: Some((1, 4)), disp: 0 });
        assert_eq!(loc("-4@$5"), ArgLoc::Constant(5));
        assert_eq!(loc("8@$-1"), ArgLoc::Constant(-1));
        assert_eq!(loc("4@counter(%rip)"), ArgLoc::Symbol { name: "counter".into(), offset: 0 });
        assert_eq!(loc("8@table+16(%rip)"), ArgLoc::Symbol { name: "table".into(), offset: 16 });
        assert_eq!(loc("8@0x601040"), ArgLoc::Memory { base: None, index: None, disp: 0x601040 });
    }

    #[test]
    fn what_is_not_an_operand_is_refused() {
        for bad in [
            "8@16(%rip)",
            "8@(%eax)",
            "8@(%rax,%rsp,1)",
            "8@(%rax,%rbx,3)",
            "8@%fs:8",
            "8@()",
            "8@(%rax",
            "8@$x",
            "8@1(%rax,%rbx,1,2)",
        ] {
            assert!(argument(bad).is_err(), "{bad}");
        }
    }
}
