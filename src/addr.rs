//! Addresses that mean different things, as different types, where tp
//! converts one into another, so that a missing or doubled load bias is a
//! compile error rather than a probe in the wrong place.
//!
//! - [`RuntimeAddr`]: an address in the target's address space: a function
//!   as the target runs it, a PC, a mapping, tp's own memory there.
//! - [`FileAddr`]: a link-time address, as an ELF file states it (a
//!   symbol's value, a segment's vaddr, DWARF's low_pc).
//! - [`Bias`]: where a module's file addresses lie at run time; the only
//!   way from one to the other.
//! - [`RegionOffset`]: an offset into tp's data region, which becomes a
//!   runtime address only added to where the region is mapped.
//!
//! Only the APIs that cross these boundaries use the types (symbols to
//! probe requests, list-probes, the detour's view of the region); inside
//! the planners and the relocators addresses are plain `u64`, all runtime.

use std::fmt;
use std::ops::Add;

/// An address in the target's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RuntimeAddr(pub u64);

/// A link-time address, as an ELF file states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FileAddr(pub u64);

/// A module's load bias: runtime address = file address + bias (modulo 2^64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bias(u64);

/// An offset into tp's data region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct RegionOffset(pub u64);

impl Bias {
    /// No bias: a position-dependent executable, or a file read on its own.
    pub const ZERO: Bias = Bias(0);

    /// The bias of a module whose file address `file` is mapped at `runtime`.
    pub fn between(file: FileAddr, runtime: RuntimeAddr) -> Bias {
        Bias(runtime.0.wrapping_sub(file.0))
    }

    /// Where the file address `a` is at run time.
    pub fn runtime(self, a: FileAddr) -> RuntimeAddr {
        RuntimeAddr(a.0.wrapping_add(self.0))
    }

    /// The file address of the runtime address `a`.
    pub fn file(self, a: RuntimeAddr) -> FileAddr {
        FileAddr(a.0.wrapping_sub(self.0))
    }
}

impl Add<RegionOffset> for RuntimeAddr {
    type Output = RuntimeAddr;

    /// The runtime address of `off` in a region mapped at `self`.
    fn add(self, off: RegionOffset) -> RuntimeAddr {
        RuntimeAddr(self.0 + off.0)
    }
}

impl fmt::LowerHex for RuntimeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::LowerHex for FileAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bias_converts_both_ways() {
        let bias = Bias::between(FileAddr(0x1000), RuntimeAddr(0x5555_5555_5000));
        assert_eq!(bias.runtime(FileAddr(0x1630)), RuntimeAddr(0x5555_5555_5630));
        assert_eq!(bias.file(RuntimeAddr(0x5555_5555_5630)), FileAddr(0x1630));
        // A file linked above where it is mapped has a "negative" bias.
        let down = Bias::between(FileAddr(0x40_0000), RuntimeAddr(0x1000));
        assert_eq!(down.runtime(FileAddr(0x40_0010)), RuntimeAddr(0x1010));
        assert_eq!(down.file(RuntimeAddr(0x1010)), FileAddr(0x40_0010));
        assert_eq!(Bias::ZERO.runtime(FileAddr(7)), RuntimeAddr(7));
        assert_eq!(format!("{:#x}", RuntimeAddr(255)), "0xff");
        assert_eq!(RuntimeAddr(0x7000) + RegionOffset(0x10), RuntimeAddr(0x7010));
    }
}
