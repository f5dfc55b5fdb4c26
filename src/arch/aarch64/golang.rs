//! Go's stack-bound check at the start of an arm64 function, as the Go
//! assembler writes it (cmd/internal/obj/arm64/obj7.go, `stacksplit`):
//!
//! ```text
//! small frame:   ldr  x16, [x28, #16]         ; g.stackguard0 (x28 is g)
//!                cmp  sp, x16
//!                b.ls morestack
//! larger frame:  ldr  x16, [x28, #16]
//!                sub  x17, sp, #(frame - 128)
//!                cmp  x17, x16
//!                b.ls morestack
//! huge frame:    ldr  x16, [x28, #16]
//!                subs x17, sp, #(frame - 128)
//!                b.lo morestack
//!                cmp  x17, x16
//!                b.ls morestack
//! ```
//!
//! (`[x28, #24]`, stackguard1, in functions the runtime marks as C
//! functions.) `morestack` lies after the function's returns: it grows the
//! stack and branches back to the function's first instruction.

/// Where a probe of one instruction can go from `from` on: right there,
/// as every AArch64 window is one instruction.
pub fn one_instruction_site(code: &[u8], _addr: u64, from: usize) -> Option<usize> {
    (from + 4 <= code.len()).then_some(from)
}

/// How far below its entry stack pointer Go function `code` (at `addr`)
/// has moved it at `site`: 0 at its first instruction or right after its
/// stack check (which moves nothing); None anywhere else.
pub fn sp_below_entry(code: &[u8], addr: u64, site: u64) -> Option<u32> {
    let check = stack_check_len(code, addr).unwrap_or(0) as u64;
    (site == addr || site == addr + check).then_some(0)
}

/// `ldr x16, [x28, #16]` and `ldr x16, [x28, #24]`.
const LDR_GUARD: [u32; 2] = [0xf940_0b90, 0xf940_0f90];
/// `cmp sp, x16`.
const CMP_SP: u32 = 0xeb30_63ff;
/// `cmp x17, x16`.
const CMP_X17: u32 = 0xeb10_023f;
/// `b.ls` and `b.lo`: B.cond with its condition.
const LS: u32 = 9;
const LO: u32 = 3;

/// The bytes of the check at the start of `code` (at `addr`), if there is one.
pub fn stack_check_len(code: &[u8], addr: u64) -> Option<usize> {
    let words: Vec<u32> = code.chunks_exact(4).take(5).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let end = addr + code.len() as u64;
    // A forward `b.<cond>` at word k that stays in the function.
    let branch = |k: usize, cond: u32| {
        let w = *words.get(k)?;
        let imm19 = (((w >> 5) & 0x7ffff) as i64) << 45 >> 45;
        let pc = addr + 4 * k as u64;
        let target = pc.wrapping_add((imm19 * 4) as u64);
        (w & 0xff00_001f == 0x5400_0000 | cond && target > pc && target < end).then_some(())
    };
    // `sub x17, sp, #imm` (or `subs`), unshifted or shifted by 12.
    let sub_x17 = |k: usize, s: u32| words.get(k).is_some_and(|&w| w & 0xff80_03ff == 0xd100_03f1 | (s << 29));
    if !LDR_GUARD.contains(words.first()?) {
        return None;
    }
    let len = match words.get(1..)? {
        [CMP_SP, ..] => branch(2, LS).map(|_| 3),
        [_, CMP_X17, ..] if sub_x17(1, 0) => branch(3, LS).map(|_| 4),
        [_, _, CMP_X17, ..] if sub_x17(1, 1) => branch(2, LO).and(branch(4, LS)).map(|_| 5),
        _ => None,
    }?;
    Some(4 * len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x94670;

    fn bytes(words: &[u32]) -> Vec<u8> {
        let mut v: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        v.resize(0x100, 0);
        v
    }

    #[test]
    fn the_three_frame_sizes() {
        // main.fib (Go 1.19): ldr x16, [x28, #16]; cmp sp, x16; b.ls +0xa0; str x30, [sp, #-32]!
        assert_eq!(stack_check_len(&bytes(&[0xf9400b90, 0xeb3063ff, 0x54000509, 0xf81e0ffe]), F), Some(12));
        // main.deep: ldr; sub x17, sp, #0xb0; cmp x17, x16; b.ls +0xc8
        assert_eq!(stack_check_len(&bytes(&[0xf9400b90, 0xd102c3f1, 0xeb10023f, 0x54000649]), F), Some(16));
        // huge: ldr; subs x17, sp, #0x10, lsl #12; b.lo +0x80; cmp x17, x16; b.ls +0x78
        let huge = [0xf9400b90, 0xf14043f1, 0x54000403, 0xeb10023f, 0x540003c9];
        assert_eq!(stack_check_len(&bytes(&huge), F), Some(20));
    }

    #[test]
    fn anything_else_is_no_check() {
        // stp x29, x30, [sp, #-16]! (C)
        assert_eq!(stack_check_len(&bytes(&[0xa9bf7bfd]), F), None);
        // a backward b.ls
        assert_eq!(stack_check_len(&bytes(&[0xf9400b90, 0xeb3063ff, 0x54fffe09]), F), None);
        // b.eq instead of b.ls
        assert_eq!(stack_check_len(&bytes(&[0xf9400b90, 0xeb3063ff, 0x54000500]), F), None);
        // ldr x16, [x27, #16]: not g
        assert_eq!(stack_check_len(&bytes(&[0xf9400b70, 0xeb3063ff, 0x54000509]), F), None);
        assert_eq!(stack_check_len(&[0x90, 0x0b, 0x40, 0xf9], F), None);
    }
}
