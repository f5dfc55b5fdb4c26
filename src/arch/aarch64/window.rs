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
use crate::arch::{Refusal, SitePlan, WindowInsn};

/// Bytes of `b imm26`, and of every A64 instruction.
pub const PATCH_LEN: usize = 4;

/// Plans the probe of the function `code` at `function`; see the module doc.
/// `extra_targets` cannot enter a one-instruction window, so it is unused.
pub fn plan(code: &[u8], function: u64, _extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
    if !function.is_multiple_of(4) {
        return Err(Refusal::Undecodable { at: function });
    }
    let mut site = function;
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
    let plan = SitePlan {
        function,
        site,
        prefix: code[..offset].to_vec(),
        window: code[offset..offset + PATCH_LEN].to_vec(),
        insns: vec![WindowInsn { offset: 0, len: PATCH_LEN as u32, mnemonic: insn.mnemonic }],
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
    fn pc_relative_first_instructions_are_accepted() {
        for w in [0x90000010u32, 0x10000080, 0x58000101, 0x14000010, 0x94000010, 0x54000201, 0xb4000200] {
            assert!(plan(&words(&[w, RET]), F, &[]).is_ok(), "{w:#x}");
        }
    }
}
