//! The arguments of AArch64 static probes, as `<sys/sdt.h>` writes them:
//! `8@x0`, `-4@w1` (a register), `4@[sp, 8]`, `8@[x29, -16]`, `8@[x0]`
//! (memory), `-4@5` (a constant). Register numbers are the encoding's: x0
//! 0 … x30 30, sp 31.

use crate::arch::operand::{parse_number, split_size};
use crate::arch::{ArgLoc, ArgSpec};

/// The number of `xN`/`wN` (N up to 30) or `sp`.
fn register(name: &str) -> Option<u8> {
    if name == "sp" || name == "wsp" {
        return Some(31);
    }
    let digits = name.strip_prefix('x').or_else(|| name.strip_prefix('w'))?;
    if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u8>().ok().filter(|&n| n <= 30)
}

/// Parses one argument: `size@place`.
pub fn argument(arg: &str) -> Result<ArgSpec, String> {
    let (size, signed, place) = split_size(arg)?;
    let loc = location(place).ok_or_else(|| format!("`{arg}`: tp does not read an argument at `{place}`"))?;
    Ok(ArgSpec { size, signed, loc })
}

fn location(place: &str) -> Option<ArgLoc> {
    if let Some(inner) = place.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        let (base, disp) = match inner.split_once(',') {
            Some((b, d)) => (b.trim(), parse_number(d.trim().trim_start_matches('#'))?),
            None => (inner.trim(), 0),
        };
        let base = register(base).filter(|_| base.starts_with('x') || base == "sp")?;
        return Some(ArgLoc::Memory { base: Some(base), index: None, disp });
    }
    if let Some(r) = register(place).filter(|&r| r != 31 || place == "sp") {
        return Some(ArgLoc::Register(r));
    }
    parse_number(place.trim_start_matches('#')).map(ArgLoc::Constant)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(arg: &str) -> ArgLoc {
        argument(arg).unwrap().loc
    }

    #[test]
    fn registers_memory_and_constants() {
        assert_eq!(argument("8@x0").unwrap(), ArgSpec { size: 8, signed: false, loc: ArgLoc::Register(0) });
        assert_eq!(argument("-4@w1").unwrap(), ArgSpec { size: 4, signed: true, loc: ArgLoc::Register(1) });
        assert_eq!(loc("8@x30"), ArgLoc::Register(30));
        assert_eq!(loc("4@[sp, 8]"), ArgLoc::Memory { base: Some(31), index: None, disp: 8 });
        assert_eq!(loc("8@[x29, -16]"), ArgLoc::Memory { base: Some(29), index: None, disp: -16 });
        assert_eq!(loc("8@[x0]"), ArgLoc::Memory { base: Some(0), index: None, disp: 0 });
        assert_eq!(loc("-4@5"), ArgLoc::Constant(5));
        assert_eq!(loc("4@#12"), ArgLoc::Constant(12));
    }

    #[test]
    fn what_is_not_an_operand_is_refused() {
        for bad in ["8@x31", "8@[w0]", "8@[x0, x1]", "8@[x0", "8@q0", "8@x", "8@[sp, z]"] {
            assert!(argument(bad).is_err(), "{bad}");
        }
    }
}
