//! How arguments are passed: the classes of parameters the event decoder
//! knows ([`ParamClass`]), a function's calling convention ([`Abi`]), which
//! recorded register holds each parameter under the C ABI and Go's internal
//! ABI, where a goroutine's stack is, and AArch64's variant calling
//! convention in a symbol.

#[cfg(doc)]
use super::{Arch, Refusal};

/// The most integer argument registers an entry records: six in its event
/// and three in the record before it ([`crate::layout::ENTRY_REGS`] and
/// [`crate::layout::MORE_REGS`]). Go's internal ABI
/// passes nine on x86-64 and sixteen on arm64: its first nine are shown.
pub const MAX_RECORDED_ARGS: usize = crate::layout::ENTRY_REGS + crate::layout::MORE_REGS;

/// How a parameter is passed, as far as the event decoder needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamClass {
    /// An integer, pointer, bool, char or enum: one integer register.
    Scalar,
    /// A floating-point value: a vector register.
    Float,
    /// A struct or union of this many bytes (if known).
    Aggregate(Option<u64>),
    /// A value made of this many integer words and nothing else (Go's
    /// strings: 2, slices: 3), which Go's ABI passes word by word.
    Words(u8),
}

/// The calling convention of a function, which decides the registers its
/// arguments arrive in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Abi {
    /// The platform's C ABI (System V x86-64, AAPCS64).
    #[default]
    C,
    /// Go's register-based internal ABI (ABIInternal, Go 1.17 and later):
    /// its own sequence of integer argument registers ([`Arch::go_int_args`]).
    Go,
    /// Go's stack-based ABI (ABI0: assembly, and all Go code before the
    /// register ABI): no argument is in a register.
    GoStack,
}

/// [`Arch::goroutine_stack`] of the goroutine `g` with stack pointer `sp`.
/// Go's `g` starts with `stack.lo`, `stack.hi` and `stackguard0`, which is
/// `lo` plus the guard (under a page), or a sentinel asking for preemption
/// (`stackPreempt`, `stackFork`).
pub(super) fn goroutine_stack(g: u64, sp: u64, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> Option<(u64, u64)> {
    if g == 0 || !g.is_multiple_of(8) {
        return None;
    }
    let b = read(g, 24)?;
    let word = |k: usize| Some(u64::from_le_bytes(b.get(8 * k..8 * k + 8)?.try_into().ok()?));
    let (lo, hi, guard) = (word(0)?, word(1)?, word(2)?);
    let guard_ok = matches!(guard, 0xffff_ffff_ffff_fade | 0xffff_ffff_ffff_fb2e) || (guard > lo && guard - lo <= 4096);
    (lo < hi && hi - lo <= 1 << 30 && (lo..hi).contains(&sp) && guard_ok).then_some((lo, hi))
}

/// [`Arch::arg_registers`] for the C ABI, with `recorded` integer registers
/// recorded; an aggregate larger than 16 bytes goes in memory, or with
/// `large_by_reference` (AAPCS64) its copy's address takes the next
/// integer register.
pub(super) fn c_arg_registers(params: &[ParamClass], recorded: usize, large_by_reference: bool) -> Vec<Option<usize>> {
    let mut next = 0;
    let mut lost_track = false;
    params
        .iter()
        .map(|p| {
            if lost_track {
                return None;
            }
            match p {
                ParamClass::Float => None,
                ParamClass::Aggregate(size) if size.is_some_and(|s| s > 16) => {
                    if large_by_reference {
                        next += 1; // the address of a copy: not the value, not shown
                    }
                    None
                }
                ParamClass::Aggregate(_) | ParamClass::Words(_) => {
                    lost_track = true; // small aggregates: registers not modelled
                    None
                }
                ParamClass::Scalar if next < recorded => {
                    next += 1;
                    Some(next - 1)
                }
                ParamClass::Scalar => None,
            }
        })
        .collect()
}

/// [`Arch::arg_registers`] for Go's internal ABI, with `ints` integer
/// argument registers of which the first `recorded` are recorded.
pub(super) fn go_arg_registers(params: &[ParamClass], ints: usize, recorded: usize) -> Vec<Option<usize>> {
    let mut next = 0;
    let mut lost_track = false;
    params
        .iter()
        .map(|p| {
            if lost_track {
                return None;
            }
            let words = match p {
                ParamClass::Scalar => 1,
                ParamClass::Words(n) => *n as usize,
                ParamClass::Float => return None,
                ParamClass::Aggregate(Some(0)) => return None, // zero-sized: no register
                ParamClass::Aggregate(_) => {
                    lost_track = true;
                    return None;
                }
            };
            if next + words > ints {
                return None; // on the stack; the registers stay for the next ones
            }
            next += words;
            // A scalar is shown from its register; a value of several words is not.
            (words == 1 && next - 1 < recorded).then_some(next - 1)
        })
        .collect()
}

/// True if a function symbol's `st_other` (in a file of ELF machine `m`)
/// declares a calling convention other than the base one: AArch64's
/// `STO_AARCH64_VARIANT_PCS`, which the assembler's `.variant_pcs` sets for
/// SVE and vector-PCS functions ([`Refusal::VariantPcs`]).
pub fn variant_pcs(m: u16, st_other: u8) -> bool {
    const STO_AARCH64_VARIANT_PCS: u8 = 0x80;
    m == goblin::elf::header::EM_AARCH64 && st_other & STO_AARCH64_VARIANT_PCS != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_arguments_take_go_registers_whole_or_not_at_all() {
        use ParamClass::*;
        // 9 integer registers, 6 recorded: a slice that no longer fits goes
        // on the stack and leaves the registers to the next scalar.
        let params = [Scalar, Words(3), Float, Words(2), Scalar, Words(3), Scalar, Scalar];
        // Scalar: 0; slice: 1-3; string: 4-5; scalar: 6 (not recorded);
        // slice: does not fit (7-9); the scalars after it: 7, 8 (not recorded).
        assert_eq!(go_arg_registers(&params, 9, 6), [Some(0), None, None, None, None, None, None, None]);
        assert_eq!(go_arg_registers(&params, 16, 8), [Some(0), None, None, None, Some(6), None, None, None]);
        assert_eq!(
            go_arg_registers(&[Scalar; 8], 9, 6),
            [Some(0), Some(1), Some(2), Some(3), Some(4), Some(5), None, None]
        );
        // Zero-sized values take nothing; a struct of unknown makeup ends what is known.
        let params = [Aggregate(Some(0)), Scalar, Aggregate(Some(16)), Scalar];
        assert_eq!(go_arg_registers(&params, 9, 6), [None, Some(0), None, None]);
        // C: the System V order, small aggregates unknown.
        assert_eq!(c_arg_registers(&[Scalar, Float, Words(2), Scalar], 6, false), [Some(0), None, None, None]);
        // A struct of 24 bytes: in memory (System V), or by reference in the
        // next register (AAPCS64); eight registers recorded on AArch64.
        let params = [Scalar, Aggregate(Some(24)), Scalar, Scalar, Scalar, Scalar, Scalar, Scalar, Scalar];
        let sysv = [Some(0), None, Some(1), Some(2), Some(3), Some(4), Some(5), None, None];
        assert_eq!(c_arg_registers(&params, 6, false), sysv);
        let aapcs = [Some(0), None, Some(2), Some(3), Some(4), Some(5), Some(6), Some(7), None];
        assert_eq!(c_arg_registers(&params, 8, true), aapcs);
    }

    #[test]
    fn goroutine_stacks_are_believed_only_with_their_guard() {
        let g = 0xc0_0000_0100u64;
        let memory = |lo: u64, hi: u64, guard: u64| {
            move |addr: u64, len: usize| {
                (addr == g && len == 24).then(|| [lo, hi, guard].iter().flat_map(|w| w.to_le_bytes()).collect())
            }
        };
        let (lo, hi) = (0xc0_0005_0000u64, 0xc0_0005_2000u64);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, lo + 928)), Some((lo, hi)));
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, 0xffff_ffff_ffff_fade)), Some((lo, hi)));
        // The stack pointer outside, a guard elsewhere, bounds upside down, not g.
        assert_eq!(goroutine_stack(g, hi + 8, &memory(lo, hi, lo + 928)), None);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, lo + 0x10000)), None);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(hi, lo, lo + 928)), None);
        assert_eq!(goroutine_stack(g + 8, hi - 0x100, &memory(lo, hi, lo + 928)), None);
        assert_eq!(goroutine_stack(0, hi - 0x100, &memory(lo, hi, lo + 928)), None);
    }
}
