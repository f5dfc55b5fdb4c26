//! The long form of an AArch64 probe, for when no code arena can be placed
//! within `b` reach (±128 MiB) of the module:
//!
//! ```text
//! site:      adrp x16, detour            ; ±4 GiB
//!            add  x16, x16, :lo12:detour
//!            br   x16
//! ```
//!
//! It replaces three instructions, so it is only planned at a function's
//! entry (after its landing pads), where x16 is dead, and only where the
//! three can be moved: none is a call before the last (the callee would
//! return into the patch), no branch of the function and no extra target
//! lands on the second or third, the function has no `br` (a jump table
//! could), and the whole function decodes, so that scan is complete. The
//! `br x16` lands in the arena, which is never BTI-guarded; the detour
//! returns with `ret xS` (xS being x16 or x17, whichever the window does not
//! use), which needs no landing pad in the function.

use super::decode::{Class, decode};
use super::reg::Reg;
use super::relocate::{self, Exit};
use super::writer::Writer;
use crate::arch::{Refusal, SitePlan, WindowInsn};

/// Bytes of the long form's patch.
pub const LONG_PATCH_LEN: usize = 12;

/// How far the long form reaches (`adrp`'s ±4 GiB, less a page either way).
pub const LONG_REACH: u64 = (4 << 30) - (8 << 10);

/// Plans the long form of the probe of the function `code` at `function`.
pub fn plan_long(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
    let insns = decode(code, function);
    let end = function + code.len() as u64;
    let decoded_end = function + 4 * insns.len() as u64;
    if !function.is_multiple_of(4) || (decoded_end < end && end - decoded_end >= 4) {
        return Err(Refusal::Undecodable { at: decoded_end });
    }
    let first = insns.iter().position(|i| i.class != Class::LandingPad).unwrap_or(insns.len());
    let site = function + 4 * first as u64;
    if end - site < LONG_PATCH_LEN as u64 {
        return Err(Refusal::TooShort { have: end - site, need: LONG_PATCH_LEN as u64 });
    }
    let window = &insns[first..first + LONG_PATCH_LEN / 4];
    let mut live = true;
    for (k, insn) in window.iter().enumerate() {
        let why =
            |what: &str| Refusal::Unrelocatable { mnemonic: insn.mnemonic.clone(), at: insn.addr, why: what.into() };
        if !live {
            break;
        }
        match insn.class {
            Class::Unsafe => return Err(Refusal::Unsafe { mnemonic: insn.mnemonic.clone(), at: insn.addr }),
            Class::Exclusive => return Err(why("an exclusive load/store sequence must not be split")),
            Class::System => return Err(why("system register and system instructions are not relocated")),
            Class::Unsupported => return Err(why("authenticated calls are not rewritten")),
            Class::SignsWithPc => {
                return Err(why("it makes the next instruction sign the return address with its own address"));
            }
            Class::LandingPad => return Err(Refusal::LandingPadInWindow { at: insn.addr }),
            Class::Call { .. } | Class::CallRegister { .. } if k + 1 < window.len() => {
                return Err(Refusal::CallInWindow { mnemonic: insn.mnemonic.clone(), at: insn.addr });
            }
            Class::Branch { .. } | Class::IndirectJump => live = false,
            _ => {}
        }
    }
    let inside = |t: u64| t > site && t < site + LONG_PATCH_LEN as u64;
    for (k, insn) in insns.iter().enumerate() {
        if insn.target().is_some_and(inside) {
            return Err(Refusal::BranchIntoWindow { from: insn.addr });
        }
        if let Some(t) = taken_address(&insns, k).filter(|&t| inside(t)) {
            return Err(Refusal::EntersWindow { at: t, from: format!("the code address taken at {:#x}", insn.addr) });
        }
        if insn.class == Class::IndirectJump && !is_return(insn.word) {
            return Err(Refusal::IndirectJump { at: insn.addr });
        }
    }
    if let Some(&t) = extra_targets.iter().find(|&&t| inside(t)) {
        return Err(Refusal::LandingPadInWindow { at: t });
    }
    let offset = (site - function) as usize;
    let plan = SitePlan {
        function,
        site,
        prefix: code[..offset].to_vec(),
        window: code[offset..offset + LONG_PATCH_LEN].to_vec(),
        insns: window
            .iter()
            .map(|i| WindowInsn { offset: (i.addr - site) as u32, len: 4, mnemonic: i.mnemonic.clone() })
            .collect(),
        dead: 0,
        interior: false,
        exits: Vec::new(),
    };
    scratch(&plan)?;
    relocate::relocate_alone(&plan, site.wrapping_add(1 << 30), exit(&plan)?)?;
    Ok(plan)
}

/// The code address instruction `k` forms: `adr xd, A`, or `adrp xd, P`
/// directly followed by `add xd, xd, #lo12` (a `blr` may call it later).
/// The address itself stays the original's in the detour; only its use as
/// a branch target into the window's interior is unsafe.
fn taken_address(insns: &[super::decode::Insn], k: usize) -> Option<u64> {
    match insns[k].class {
        Class::Adr { target, .. } => Some(target),
        Class::Adrp { rd, target } => {
            let add = insns.get(k + 1)?.word;
            // ADD (immediate), 64-bit, unshifted: sf=1 op=0 S=0 100010 sh=0
            let same = Reg::field_of(add, 5) == rd && Reg::field_of(add, 0) == rd;
            (add & 0xffc0_0000 == 0x9100_0000 && same).then(|| target + ((add >> 10) & 0xfff) as u64)
        }
        _ => None,
    }
}

/// `ret`, `retaa`, `retab` (as opposed to `br` and its authenticated forms).
fn is_return(word: u32) -> bool {
    (word >> 21) & 0xf == 0b0010
}

/// The register the detour leaves through: x16, or x17 if the window names x16.
fn scratch(plan: &SitePlan) -> Result<Reg, Refusal> {
    let names = |r: Reg| {
        let r = r.field();
        decode(&plan.window, plan.site).iter().any(|i| {
            i.operands.split(|c: char| !c.is_ascii_alphanumeric()).any(|t| t == format!("x{r}") || t == format!("w{r}"))
        })
    };
    match (names(Reg::X16), names(Reg::X17)) {
        (false, _) => Ok(Reg::X16),
        (true, false) => Ok(Reg::X17),
        (true, true) => Err(Refusal::Unrelocatable {
            mnemonic: plan.summary(),
            at: plan.site,
            why: "the window uses both x16 and x17, one of which the long form needs".into(),
        }),
    }
}

/// How a detour for `plan` continues in the function: `b` for the one-
/// instruction form, `ret` through a scratch register for the long form.
pub fn exit(plan: &SitePlan) -> Result<Exit, Refusal> {
    if plan.len() == LONG_PATCH_LEN { Ok(Exit::Return(scratch(plan)?)) } else { Ok(Exit::Branch) }
}

/// The long form's patch: `adrp x16, detour ; add x16, x16, :lo12:detour ; br x16`.
pub fn patch(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal> {
    let pages = ((detour >> 12) as i64).wrapping_sub((plan.site >> 12) as i64);
    if !(-(1 << 20)..(1 << 20)).contains(&pages) {
        return Err(Refusal::OutOfReach { at: plan.site });
    }
    let mut w = Writer::new(plan.site);
    w.put_adrp(Reg::X16, detour);
    w.put_add_imm(Reg::X16, Reg::X16, (detour & 0xfff) as u32);
    w.put_br(Reg::X16);
    Ok(w.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::aarch64::decode::disassemble;

    const F: u64 = 0x40_1000;
    const RET: u32 = 0xd65f03c0;
    const STP: u32 = 0xa9bf7bfd; // stp x29, x30, [sp, #-16]!
    const MOV_FP: u32 = 0x910003fd; // mov x29, sp
    const BTI_C: u32 = 0xd503245f;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn long(ws: &[u32]) -> Result<SitePlan, Refusal> {
        plan_long(&words(ws), F, &[])
    }

    #[test]
    fn three_instructions_after_the_landing_pads() {
        let p = long(&[BTI_C, STP, MOV_FP, 0x90000000, RET]).unwrap(); // ..., adrp x0
        assert_eq!((p.site, p.len(), p.summary().as_str()), (F + 4, 12, "stp, mov, adrp"));
        assert_eq!(p.interior_boundaries().collect::<Vec<_>>(), [F + 8, F + 12]);
        assert_eq!(exit(&p).unwrap(), Exit::Return(Reg::X16));
    }

    #[test]
    fn the_patch_is_adrp_add_br() {
        let p = long(&[STP, MOV_FP, 0xd2800020, RET]).unwrap();
        let detour = F + 0x2345_6780;
        let asm = disassemble(&patch(&p, detour).unwrap(), F);
        assert_eq!(asm, ["adrp x16, #0x23857000", "add x16, x16, #0x780", "br x16"]);
        assert_eq!(patch(&p, F + (4 << 30)).unwrap_err(), Refusal::OutOfReach { at: F });
        assert!(patch(&p, F + (4 << 30) - 4096).is_ok());
    }

    #[test]
    fn refusals() {
        assert_eq!(long(&[STP, RET]).unwrap_err(), Refusal::TooShort { have: 8, need: 12 });
        // bl before the window's end: the callee would return into the patch.
        let r = long(&[0x94000010, STP, MOV_FP, RET]).unwrap_err();
        assert!(matches!(r, Refusal::CallInWindow { at: F, .. }), "{r:?}");
        // ... as the last instruction it is fine.
        assert!(long(&[STP, MOV_FP, 0x94000010, RET]).is_ok());
        // b.ne back to F+4, inside the window
        assert_eq!(
            long(&[STP, MOV_FP, 0xd2800020, 0x54ffffc1, RET]).unwrap_err(),
            Refusal::BranchIntoWindow { from: F + 12 }
        );
        // a branch to the site itself is fine
        assert!(long(&[STP, MOV_FP, 0xd2800020, 0x54ffffa1, RET]).is_ok());
        // br x1 anywhere in the function: a jump table could land inside
        assert_eq!(long(&[STP, MOV_FP, 0xd2800020, 0xd61f0020]).unwrap_err(), Refusal::IndirectJump { at: F + 12 });
        // an extra target (a .cold part's jump) inside
        assert_eq!(
            plan_long(&words(&[STP, MOV_FP, 0xd2800020, RET]), F, &[F + 8]).unwrap_err(),
            Refusal::LandingPadInWindow { at: F + 8 }
        );
        // the address of the window's interior taken (adr x1, F+4; adrp+add x2 -> F+8): a blr could go there
        let r = long(&[STP, MOV_FP, 0xd2800020, 0x10ffffc1, RET]).unwrap_err();
        assert!(matches!(r, Refusal::EntersWindow { at, .. } if at == F + 4), "{r:?}");
        let r = long(&[STP, MOV_FP, 0xd2800020, 0x90000002, 0x91002042, RET]).unwrap_err();
        assert!(matches!(r, Refusal::EntersWindow { at, .. } if at == F + 8), "{r:?}");
        // ... while the site's own address (the function's) is data, kept as it is
        assert!(long(&[0x10000000, STP, MOV_FP, RET]).is_ok(), "adr x0, . at the site");
        // undecodable words anywhere
        assert_eq!(long(&[STP, MOV_FP, 0xd2800020, 0xffffffff, RET]).unwrap_err(), Refusal::Undecodable { at: F + 12 });
        // ldxr in the window
        assert!(matches!(long(&[0xc85f7c20, STP, MOV_FP, RET]).unwrap_err(), Refusal::Unrelocatable { .. }));
    }

    #[test]
    fn the_exit_register_is_one_the_window_leaves_alone() {
        // adrp x16, ...; ldr x17, [x16]; br x17 would need both, but has a br.
        // mov x16, #1; add x0, x0, x16; ret: x17 is free.
        let p = long(&[0xd2800030, 0x8b100000, RET]).unwrap();
        assert_eq!(exit(&p).unwrap(), Exit::Return(Reg::X17));
        // mov x16, #1; mov w17, #2; add x0, x16, x17
        let r = long(&[0xd2800030, 0x52800051, 0x8b110200, RET]).unwrap_err();
        assert!(matches!(&r, Refusal::Unrelocatable { why, .. } if why.contains("x16 and x17")), "{r:?}");
    }

    #[test]
    fn code_after_an_unconditional_branch_is_not_relocated() {
        // b +0x40; nop; nop (dead); ...
        let mut code = vec![0x14000010u32, 0xd503201f, 0xd503201f];
        code.extend([0xd503201f; 16]);
        code.push(RET);
        let p = long(&code).unwrap();
        let at = F + (1 << 30);
        let asm = disassemble(&relocate::relocate_alone(&p, at, exit(&p).unwrap()).unwrap(), at);
        assert_eq!(asm[..2], [format!("ldr x16, #{:#x}", at + 8), "ret x16".to_string()]);
    }
}
