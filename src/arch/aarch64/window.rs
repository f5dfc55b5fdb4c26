//! Choosing an AArch64 probe site.
//!
//! A64 instructions are all 4 bytes, and so is `b`, so the window is always
//! one instruction: the function's first, or the first after its landing
//! pads (`bti c|j|jc`, `paciasp`, `pacibsp`), which stay in place so that
//! indirect calls into a BTI-guarded page still land on one. A window of one
//! instruction has no interior: no branch can enter the middle of the patch,
//! and a thread stopped in the function is either before it or after it.
//!
//! Refused: functions with no instruction after their landing pads,
//! undecodable words, exclusive loads and stores (an LL/SC sequence must not
//! be split), MRS/MSR/SYS, and traps (SVC, HVC, BRK, HLT, UDF, ...).

use super::decode::{Class, decode};
use super::relocate;
use crate::arch::{ExitInsn, Refusal, SitePlan, WindowInsn};

/// Bytes of `b imm26`, and of every A64 instruction.
pub const PATCH_LEN: usize = 4;

/// Plans the probe of the function `code` at `function`; see the module doc.
/// `extra_targets` cannot enter a one-instruction window, so it is unused.
pub fn plan(code: &[u8], function: u64, _extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
    plan_from(code, function, function)
}

/// Plans a probe at `at` inside the function: the instruction there (after
/// a `bti` there, which stays in place) is the window. Its detour keeps x16
/// and x17, which may be live inside a function, so an instruction whose
/// copy needs a scratch register is refused.
pub fn plan_at(code: &[u8], function: u64, at: u64, _extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
    let end = function + code.len() as u64;
    if at < function || at >= end {
        return Err(Refusal::PastEnd { at });
    }
    if !(at - function).is_multiple_of(4) {
        let before = function + (at - function) / 4 * 4;
        let after = Some(before + 4).filter(|&a| a < end);
        return Err(Refusal::NotBoundary { at, around: (Some(before), after) });
    }
    let entry = plan(code, function, &[]).map(|p| p.site);
    if at == function || entry.as_ref().is_ok_and(|&s| s == at) {
        return plan(code, function, &[]);
    }
    let mut p = plan_from(code, function, at)?;
    p.interior = true;
    if super::relocate::needs_scratch(&p) {
        return Err(Refusal::Unrelocatable {
            mnemonic: p.summary(),
            at: p.site,
            why: "its copy needs a scratch register, and x16 may be live inside a function".into(),
        });
    }
    Ok(p)
}

/// The plan whose window is the first instruction from `start` on that is
/// not a landing pad.
fn plan_from(code: &[u8], function: u64, start: u64) -> Result<SitePlan, Refusal> {
    if !function.is_multiple_of(4) {
        return Err(Refusal::Undecodable { at: function });
    }
    let mut site = start;
    let end = function + code.len() as u64;
    let insn = loop {
        let offset = (site - function) as usize;
        if end - site < PATCH_LEN as u64 {
            return Err(Refusal::TooShort { have: end - site, need: PATCH_LEN as u64 });
        }
        let Some(insn) = decode(&code[offset..offset + PATCH_LEN], site).pop() else {
            return Err(Refusal::Undecodable { at: site });
        };
        if insn.class != Class::LandingPad {
            break insn;
        }
        site += PATCH_LEN as u64;
    };
    let why = |what: &str| Refusal::Unrelocatable { mnemonic: insn.mnemonic.clone(), at: site, why: what.into() };
    match insn.class {
        Class::Unsafe => return Err(Refusal::Unsafe { mnemonic: insn.mnemonic, at: site }),
        Class::Exclusive => return Err(why("an exclusive load/store sequence must not be split")),
        Class::System => return Err(why("system register and system instructions are not relocated")),
        Class::Unsupported => return Err(why("authenticated calls are not rewritten")),
        Class::SignsWithPc => {
            return Err(why("it makes the next instruction sign the return address with its own address"));
        }
        _ => {}
    }
    let offset = (site - function) as usize;
    // A function whose first instruction leaves it (a `ret`, a tail call):
    // its entry's window holds that exit.
    let inside = |t: u64| (function..end).contains(&t);
    let exits = match super::exits::exit_kind(&insn, function, (function, end), &inside) {
        Ok(Some(kind)) => vec![ExitInsn { offset: 0, kind }],
        _ => Vec::new(),
    };
    let plan = SitePlan {
        function,
        site,
        prefix: code[..offset].to_vec(),
        window: code[offset..offset + PATCH_LEN].to_vec(),
        insns: vec![WindowInsn { offset: 0, len: PATCH_LEN as u32, mnemonic: insn.mnemonic }],
        dead: 0,
        interior: false,
        exits,
    };
    // Prove the window relocates to where an arena may be (right below the
    // module); the real detour address is checked when the detour is built.
    relocate::relocate_alone(&plan, site.wrapping_sub(1 << 20) & !15, relocate::Exit::Branch)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x40_1000;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn refusal(ws: &[u32]) -> Refusal {
        plan(&words(ws), F, &[]).unwrap_err()
    }

    const RET: u32 = 0xd65f03c0;
    const STP: u32 = 0xa9bf7bfd; // stp x29, x30, [sp, #-16]!
    const BTI_C: u32 = 0xd503245f;
    const PACIASP: u32 = 0xd503233f;

    #[test]
    fn the_window_is_the_first_instruction() {
        let p = plan(&words(&[STP, RET]), F, &[]).unwrap();
        assert_eq!((p.function, p.site, p.len()), (F, F, 4));
        assert_eq!(p.window, STP.to_le_bytes());
        assert_eq!(p.summary(), "stp");
        assert_eq!(p.interior_boundaries().count(), 0);
    }

    #[test]
    fn landing_pads_stay_in_place() {
        let p = plan(&words(&[BTI_C, STP, RET]), F, &[]).unwrap();
        assert_eq!((p.site, p.summary().as_str()), (F + 4, "stp"));
        let p = plan(&words(&[PACIASP, STP, RET]), F, &[]).unwrap();
        assert_eq!(p.site, F + 4);
        let p = plan(&words(&[BTI_C, PACIASP, STP]), F, &[]).unwrap();
        assert_eq!(p.site, F + 8);
    }

    #[test]
    fn too_short_functions_are_refused() {
        assert_eq!(refusal(&[BTI_C]), Refusal::TooShort { have: 0, need: 4 });
        assert_eq!(plan(&[0x1f, 0x20], F, &[]).unwrap_err(), Refusal::TooShort { have: 2, need: 4 });
        // A lone `ret` is a whole function and can be probed.
        assert!(plan(&words(&[RET]), F, &[]).is_ok());
    }

    #[test]
    fn refusals_name_the_instruction() {
        assert_eq!(refusal(&[0xd4000001, RET]), Refusal::Unsafe { mnemonic: "svc".into(), at: F });
        assert_eq!(refusal(&[BTI_C, 0xd4200000]), Refusal::Unsafe { mnemonic: "brk".into(), at: F + 4 });
        let r = refusal(&[0xc85f7c20, RET]); // ldxr x0, [x1]
        assert!(
            matches!(&r, Refusal::Unrelocatable { mnemonic, why, .. } if mnemonic == "ldxr" && why.contains("exclusive"))
        );
        let r = refusal(&[0xd53bd040, RET]); // mrs x0, tpidr_el0
        assert!(matches!(&r, Refusal::Unrelocatable { mnemonic, .. } if mnemonic == "mrs"), "{r:?}");
        assert_eq!(refusal(&[0xffff_ffff]), Refusal::Undecodable { at: F });
        // Signing with the PC as a modifier (FEAT_PAuth_LR) cannot move:
        // pacm; paciasp, and paciasppc (which capstone does not decode).
        let r = refusal(&[0xd50324ff, PACIASP, STP, RET]);
        assert!(matches!(&r, Refusal::Unrelocatable { why, at: F, .. } if why.contains("its own address")), "{r:?}");
        assert_eq!(refusal(&[0xdac1a3fe, STP, RET]), Refusal::Undecodable { at: F });
        assert_eq!(plan(&words(&[STP]), F + 2, &[]).unwrap_err(), Refusal::Undecodable { at: F + 2 });
    }

    #[test]
    fn interior_sites_are_one_instruction_and_keep_their_scratch() {
        const NOP: u32 = 0xd503201f;
        let code = words(&[BTI_C, STP, NOP, 0x91000400, RET]); // ...; add x0, x0, #1; ret
        let p = plan_at(&code, F, F + 8, &[]).unwrap();
        assert_eq!((p.site, p.summary().as_str(), p.interior), (F + 8, "nop", true));
        assert!(p.is_nop_site());
        // The entry's own site is the entry.
        let p = plan_at(&code, F, F + 4, &[]).unwrap();
        assert!(!p.interior && p.site == F + 4);
        assert_eq!(
            plan_at(&code, F, F + 6, &[]).unwrap_err(),
            Refusal::NotBoundary { at: F + 6, around: (Some(F + 4), Some(F + 8)) }
        );
        assert!(matches!(plan_at(&code, F, F + 20, &[]).unwrap_err(), Refusal::PastEnd { .. }));
        // prfm pldl1keep, <literal> relocates through x16, which may be live here.
        let code = words(&[STP, 0xd8000040, RET]);
        assert!(plan(&code[4..], F + 4, &[]).is_ok(), "at an entry x16 is free");
        let r = plan_at(&code, F, F + 4, &[]).unwrap_err();
        assert!(matches!(&r, Refusal::Unrelocatable { why, .. } if why.contains("x16")), "{r:?}");
    }

    #[test]
    fn pc_relative_first_instructions_are_accepted() {
        for w in [0x90000010u32, 0x10000080, 0x58000101, 0x14000010, 0x94000010, 0x54000201, 0xb4000200] {
            assert!(plan(&words(&[w, RET]), F, &[]).is_ok(), "{w:#x}");
        }
    }
}
