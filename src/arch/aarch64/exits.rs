//! The ways out of an AArch64 function, each its own window: what a return
//! probe patches to see a call end where it ends, leaving the link
//! register, and every return address saved from it, untouched.
//!
//! A call ends at a return (`ret`, `ret xn`, and `retaa`/`retab`, which
//! authenticate x30 with the stack pointer the function was entered with,
//! as it still is there), or at a jump out of the function: a tail call
//! (`b f`, a conditional branch out, or `br xn`, whose target the detour
//! compares with the function's bounds when it runs: a switch's `br` stays
//! inside). A jump to the function's own entry is a call of its own. Every
//! A64 instruction is as long as the `b` that replaces it, so each exit is a
//! window of one instruction: nothing can enter its middle, and no thread
//! can be stopped inside it. An exit inside the entry's window is recorded
//! by the entry's detour.
//!
//! A function with a word capstone does not decode, or with an
//! authenticated branch (`braa` and its kin, which tp does not relocate),
//! has exits tp cannot all know: refused as a whole.

use super::decode::{Class, Insn, decode};
use super::reg::Reg;
use super::relocate;
use crate::arch::{ExitInsn, ExitKind, ExitPlan, Image, Refusal, SitePlan, WindowInsn};

/// `ret xn`, `br xn`: the encodings without their register.
const RET: u32 = 0xd65f_0000;
const BR: u32 = 0xd61f_0000;
/// `retaa`, `retab`.
const RETAA: u32 = 0xd65f_0bff;
const RETAB: u32 = 0xd65f_0fff;
/// The register field of `ret` and `br`.
const RN_MASK: u32 = 31 << 5;

/// Plans a window at every exit of the part `code` at `addr` of a
/// function: see [`crate::arch::Arch::plan_exits`].
pub fn plan_exits(
    code: &[u8],
    addr: u64,
    parts: &[(u64, u64)],
    taken_windows: &[(u64, u64)],
    image: &dyn Image,
) -> Result<Vec<ExitPlan>, Refusal> {
    if !addr.is_multiple_of(4) || !code.len().is_multiple_of(4) {
        return Err(Refusal::Undecodable { at: addr });
    }
    let insns = decode(code, addr);
    if insns.len() * 4 != code.len() {
        return Err(Refusal::Undecodable { at: addr + 4 * insns.len() as u64 });
    }
    let end = addr + code.len() as u64;
    let entry = parts.first().map_or(addr, |p| p.0);
    let inside = |t: u64| {
        let within = |&(lo, hi): &(u64, u64)| lo <= t && t < hi;
        within(&(addr, end)) || parts.iter().any(within) || image.other_parts().iter().any(within)
    };
    let mut out = Vec::new();
    for insn in &insns {
        let Some(kind) = exit_kind(insn, entry, (addr, end), &inside)? else { continue };
        if taken_windows.iter().any(|&(lo, hi)| lo <= insn.addr && insn.addr < hi) {
            continue;
        }
        let plan = SitePlan {
            function: addr,
            site: insn.addr,
            prefix: Vec::new(),
            window: insn.word.to_le_bytes().to_vec(),
            insns: vec![WindowInsn { offset: 0, len: 4, mnemonic: insn.mnemonic.clone() }],
            dead: 0,
            interior: false,
            exits: vec![ExitInsn { offset: 0, kind }],
        };
        // Its copy must be possible from where an arena may be.
        let plan = relocate::relocate_alone(&plan, insn.addr.wrapping_sub(1 << 20) & !15, relocate::Exit::Branch)
            .map(|_| plan);
        out.push(ExitPlan { at: insn.addr, len: 4, kind, plan });
    }
    Ok(out)
}

/// How `insn` leaves the function whose entry is `entry` and whose code
/// `inside` tells (`bounds`, the part it lies in, for a `br`'s check), if it
/// is an exit; Err for a way out tp does not know.
pub(super) fn exit_kind(
    insn: &Insn,
    entry: u64,
    bounds: (u64, u64),
    inside: &dyn Fn(u64) -> bool,
) -> Result<Option<ExitKind>, Refusal> {
    let out = |t: u64| t == entry || !inside(t);
    let word = insn.word;
    Ok(match insn.class {
        Class::IndirectJump if word & !RN_MASK == RET || word == RETAA || word == RETAB => Some(ExitKind::Return),
        Class::IndirectJump if word & !RN_MASK == BR => Some(ExitKind::MaybeJump { lo: bounds.0, hi: bounds.1 }),
        Class::IndirectJump => {
            return Err(Refusal::Unrelocatable {
                mnemonic: insn.mnemonic.clone(),
                at: insn.addr,
                why: "an authenticated branch: its target, and so the function's exits, are not known".into(),
            });
        }
        Class::Branch { target } if out(target) => Some(ExitKind::Jump),
        Class::CondBranch { target } if out(target) => Some(ExitKind::CondJump),
        _ => None,
    })
}

/// The register `br xn` jumps through.
pub(super) fn branch_register(word: u32) -> Reg {
    Reg::field_of(word & RN_MASK, 5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::NoImage;

    const F: u64 = 0x40_1000;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn exits_of(ws: &[u32]) -> Vec<(u64, ExitKind)> {
        let code = words(ws);
        let end = F + code.len() as u64;
        let exits = plan_exits(&code, F, &[(F, end)], &[(F, F + 4)], &NoImage).unwrap();
        assert!(exits.iter().all(|e| e.plan.is_ok()), "{exits:?}");
        exits.iter().map(|e| (e.at, e.kind)).collect()
    }

    const STP: u32 = 0xa9bf7bfd; // stp x29, x30, [sp, #-16]!
    const LDP: u32 = 0xa8c17bfd; // ldp x29, x30, [sp], #16
    const RET_X30: u32 = 0xd65f03c0;
    const CBZ_X0_PLUS8: u32 = 0xb4000040; // cbz x0, +8

    #[test]
    fn returns_and_jumps_out_are_exits() {
        // stp; cbz x0, +8 (inside); ldp; ret; retaa; b out (+0x1000); b.eq out; b F (the entry); br x16
        let b_out = 0x1400_0000 | (0x1000 / 4);
        let beq_out = 0x5400_0000 | ((0x800 / 4) << 5); // b.eq +0x800
        let b_entry = 0x1400_0000 | ((-7i32 as u32) & 0x03ff_ffff); // at F + 28: back to F
        let code = [STP, CBZ_X0_PLUS8, LDP, RET_X30, RETAA, b_out, beq_out, 0, BR | (16 << 5)];
        let mut code = code.to_vec();
        code[7] = b_entry;
        let exits = exits_of(&code);
        assert_eq!(
            exits,
            [
                (F + 12, ExitKind::Return),
                (F + 16, ExitKind::Return),
                (F + 20, ExitKind::Jump),
                (F + 24, ExitKind::CondJump),
                (F + 28, ExitKind::Jump),
                (F + 32, ExitKind::MaybeJump { lo: F, hi: F + 36 }),
            ]
        );
    }

    #[test]
    fn the_entrys_window_records_its_own() {
        // ret alone (glibc's _dl_debug_state): in the entry's window.
        let code = words(&[RET_X30]);
        assert!(plan_exits(&code, F, &[(F, F + 4)], &[(F, F + 4)], &NoImage).unwrap().is_empty());
    }

    #[test]
    fn an_authenticated_branch_or_an_unknown_word_makes_them_unknown() {
        let braa = 0xd71f0800 | (1 << 5) | 2; // braa x1, x2
        assert!(plan_exits(&words(&[STP, braa, RET_X30]), F, &[(F, F + 12)], &[], &NoImage).is_err());
        assert!(matches!(
            plan_exits(&words(&[STP, 0xffff_ffff, RET_X30]), F, &[(F, F + 12)], &[], &NoImage),
            Err(Refusal::Undecodable { at }) if at == F + 4
        ));
    }
}
