//! Relocating the displaced A64 instruction into a detour.
//!
//! The instruction ran at `pc` (the probe site); its copy runs elsewhere and
//! must do exactly what it did, then continue at `pc + 4` or at its branch
//! target, reached with `b` (never `br`, which a BTI-guarded page would
//! refuse to land on). The rewrites:
//!
//! | original | relocated |
//! | --- | --- |
//! | `adr xd, A` / `adrp xd, P` | `ldr xd, =A` / `ldr xd, =P` |
//! | `ldr wt/xt, A`, `ldrsw xt, A` | `ldr xt, =A ; ldr wt/xt, [xt]` / `ldrsw xt, [xt]` |
//! | `prfm op, A`, `ldr st/dt/qt, A` | `ldr x16, =A ; prfm op, [x16]` / `ldr st/dt/qt, [x16]` |
//! | `b T` | `b T` |
//! | `bl T` | `ldr x30, =pc+4 ; b T` (the callee returns into the function) |
//! | `b.cond T`, `cbz`, `cbnz`, `tbz`, `tbnz` | `b.cond 1f ; b pc+4 ; 1: b T` |
//! | `blr xn` | `mov x17, xn ; ldr x30, =pc+4 ; br x17` |
//! | `ret`, `br xn` | copied |
//! | anything else | copied, then `b pc+4` |
//!
//! The conditional form keeps the original condition rather than inverting
//! it (inverting `al` would give `nv`, which A64 also executes as always).
//! Only x16 and x17, free at a function's entry under AAPCS64, are used as
//! scratch, and only where the instruction has no destination to use.

use super::decode::{Class, classify};
use super::writer::{B_REACH, LR, LoadKind, Writer, X16, X17, XZR, reaches};
use crate::arch::{Refusal, SitePlan};

/// Appends the relocated window of `plan` to `w`, including the branch back.
pub fn relocate(plan: &SitePlan, w: &mut Writer) -> Result<(), Refusal> {
    let pc = plan.site;
    let next = pc + 4;
    let word = u32::from_le_bytes(plan.window[..4].try_into().expect("a 4-byte window"));
    let far = Refusal::OutOfReach { at: pc };
    let b = |w: &mut Writer, target: u64| -> Result<(), Refusal> {
        if !reaches(w.pc(), target, B_REACH) {
            return Err(far.clone());
        }
        w.put_b(target);
        Ok(())
    };
    match classify(word, pc) {
        Class::Plain => {
            w.put(word);
            b(w, next)?;
        }
        Class::IndirectJump => w.put(word),
        Class::Adr { rd, target } | Class::Adrp { rd, target } => {
            w.put_ldr_literal(rd, target);
            b(w, next)?;
        }
        Class::LoadLiteral { kind, rt, addr } => {
            let base = match kind {
                LoadKind::W | LoadKind::X | LoadKind::Sw if rt != XZR => rt,
                _ => X16,
            };
            w.put_ldr_literal(base, addr);
            w.put_load(kind, rt, base);
            b(w, next)?;
        }
        Class::Branch { target } => b(w, target)?,
        Class::Call { target } => {
            w.put_ldr_literal(LR, next);
            b(w, target)?;
        }
        Class::CondBranch { target } => {
            let taken = w.pc() + 8;
            w.put_cond_branch(word, taken);
            b(w, next)?;
            b(w, target)?;
        }
        Class::CallRegister { rn } => {
            w.put_mov(X17, rn);
            w.put_ldr_literal(LR, next);
            w.put_br(X17);
        }
        class @ (Class::LandingPad | Class::Exclusive | Class::System | Class::Unsafe | Class::Unsupported) => {
            return Err(Refusal::Unrelocatable {
                mnemonic: plan.summary(),
                at: pc,
                why: format!("{class:?} instructions are not relocated"),
            });
        }
    }
    Ok(())
}

/// The relocated window alone, with its literal pool, to run at `at`.
pub fn relocate_alone(plan: &SitePlan, at: u64) -> Result<Vec<u8>, Refusal> {
    let mut w = Writer::new(at);
    relocate(plan, &mut w)?;
    Ok(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::WindowInsn;
    use crate::arch::aarch64::decode::disassemble;

    const SITE: u64 = 0x41_2340;
    const AT: u64 = 0x40_0000;

    fn plan_of(word: u32) -> SitePlan {
        let mnemonic = crate::arch::aarch64::decode::decode(&word.to_le_bytes(), SITE)[0].mnemonic.clone();
        SitePlan {
            function: SITE,
            site: SITE,
            window: word.to_le_bytes().to_vec(),
            insns: vec![WindowInsn { offset: 0, len: 4, mnemonic }],
        }
    }

    /// The relocated code's disassembly, then its literals.
    fn relocated(word: u32) -> (Vec<String>, Vec<u64>) {
        let bytes = relocate_alone(&plan_of(word), AT).unwrap();
        let asm = disassemble(&bytes, AT);
        let code_words = asm.iter().take_while(|l| !l.starts_with("brk") && !l.starts_with("udf")).count();
        let lits_at = (code_words * 4).next_multiple_of(8);
        let lits = bytes[lits_at.min(bytes.len())..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (asm[..code_words].to_vec(), lits)
    }

    fn b(target: u64) -> String {
        format!("b #{target:#x}")
    }

    #[test]
    fn each_rewrite_class() {
        let back = b(SITE + 4);
        let rows: Vec<(u32, Vec<String>, Vec<u64>)> = vec![
            // stp x29, x30, [sp, #-16]!
            (0xa9bf7bfd, vec!["stp x29, x30, [sp, #-0x10]!".into(), back.clone()], vec![]),
            // adr x0, .+0x10
            (0x10000080, vec!["ldr x0, #0x400008".into(), back.clone()], vec![SITE + 0x10]),
            // adrp x16, .  (page of the site)
            (0x90000010, vec!["ldr x16, #0x400008".into(), back.clone()], vec![SITE & !0xfff]),
            // ldr x1, .+0x20
            (0x58000101, vec!["ldr x1, #0x400010".into(), "ldr x1, [x1]".into(), back.clone()], vec![SITE + 0x20]),
            // ldr w3, .-4
            (0x18ffffe3, vec!["ldr x3, #0x400010".into(), "ldr w3, [x3]".into(), back.clone()], vec![SITE - 4]),
            // ldrsw x4, .+8
            (0x98000044, vec!["ldr x4, #0x400010".into(), "ldrsw x4, [x4]".into(), back.clone()], vec![SITE + 8]),
            // ldr wzr, .+8: no register to hold the address, so x16
            (0x1800005f, vec!["ldr x16, #0x400010".into(), "ldr wzr, [x16]".into(), back.clone()], vec![SITE + 8]),
            // prfm pldl1keep, .+8
            (
                0xd8000040,
                vec!["ldr x16, #0x400010".into(), "prfm pldl1keep, [x16]".into(), back.clone()],
                vec![SITE + 8],
            ),
            // ldr q7, .+8
            (0x9c000047, vec!["ldr x16, #0x400010".into(), "ldr q7, [x16]".into(), back.clone()], vec![SITE + 8]),
            // b .+0x40
            (0x14000010, vec![b(SITE + 0x40)], vec![]),
            // bl .+0x40
            (0x94000010, vec!["ldr x30, #0x400008".into(), b(SITE + 0x40)], vec![SITE + 4]),
            // b.ne .+0x40
            (0x54000201, vec!["b.ne #0x400008".into(), back.clone(), b(SITE + 0x40)], vec![]),
            // cbz x0, .+0x40
            (0xb4000200, vec!["cbz x0, #0x400008".into(), back.clone(), b(SITE + 0x40)], vec![]),
            // tbnz x3, #62, .-0x40
            (0xb7f7fe03, vec!["tbnz x3, #0x3e, #0x400008".into(), back.clone(), b(SITE - 0x40)], vec![]),
            // blr x2
            (0xd63f0040, vec!["mov x17, x2".into(), "ldr x30, #0x400010".into(), "br x17".into()], vec![SITE + 4]),
            // ret
            (0xd65f03c0, vec!["ret".into()], vec![]),
        ];
        for (word, asm, lits) in rows {
            assert_eq!(relocated(word), (asm, lits), "{word:#010x}");
        }
    }

    #[test]
    fn branches_out_of_reach_are_refused() {
        // b .+0x40 from a detour 128 MiB away cannot reach the target or the way back.
        let far = SITE + (129 << 20);
        assert_eq!(relocate_alone(&plan_of(0x14000010), far).unwrap_err(), Refusal::OutOfReach { at: SITE });
        assert_eq!(relocate_alone(&plan_of(0xa9bf7bfd), far + 0x100).unwrap_err(), Refusal::OutOfReach { at: SITE });
        // ... while the literal-based rewrites need no reach for their value.
        assert!(relocate_alone(&plan_of(0x10000080), SITE + (100 << 20)).is_ok());
    }
}
