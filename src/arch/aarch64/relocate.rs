//! Relocating the displaced A64 instructions into a detour.
//!
//! Each instruction ran at its `pc` in the function; its copy runs
//! elsewhere and must do exactly what it did, then continue with the next
//! one, or leave for `pc + 4` or its branch target. A detour within ±128 MiB
//! leaves with `b` ([`Exit::Branch`]); the long form's detour, anywhere
//! within ±4 GiB, leaves with `ldr xS, =target ; ret xS`
//! ([`Exit::Return`]). Neither uses `br`, which a BTI-guarded page would
//! refuse to land on mid-function. The rewrites (`exit T` is either):
//!
//! | original | relocated |
//! | --- | --- |
//! | `adr xd, A` / `adrp xd, P` | `ldr xd, =A` / `ldr xd, =P` |
//! | `ldr wt/xt, A`, `ldrsw xt, A` | `ldr xt, =A ; ldr wt/xt, [xt]` / `ldrsw xt, [xt]` |
//! | `prfm op, A`, `ldr st/dt/qt, A` | `ldr x16, =A ; prfm op, [x16]` / `ldr st/dt/qt, [x16]` |
//! | `b T` | `exit T` |
//! | `bl T` | `ldr x30, =pc+4 ; exit T` (the callee returns into the function) |
//! | `b.cond T`, `cbz`, `cbnz`, `tbz`, `tbnz` | `b.cond 1f ; exit pc+4 ; 1: exit T` |
//! | `blr xn` | `mov x17, xn ; ldr x30, =pc+4 ; br x17` |
//! | `ret`, `br xn` | copied |
//! | anything else | copied |
//!
//! and after the window's last instruction, if control can fall through,
//! `exit` to the first instruction after the window. A conditional branch
//! that is not the last becomes `b.cond 1f ; b 2f ; 1: exit T ; 2:`.
//! Conditions are kept rather than inverted (inverting `al` would give
//! `nv`, which A64 also executes as always). Only x16 and x17, free at a
//! function's entry under AAPCS64, are used as scratch, and only where the
//! instruction has no destination register to use.

use super::decode::{Class, classify};
use super::reg::Reg;
use super::writer::{B_REACH, LoadKind, Writer, reaches};
use crate::arch::{ExitInsn, ExitKind, Refusal, SitePlan};

/// How relocated code continues in the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `b target`: the detour lies within ±128 MiB of the function.
    Branch,
    /// `ldr xS, =target ; ret xS`, with xS a scratch register the window
    /// does not use: from any distance, and `ret` needs no landing pad.
    Return(Reg),
}

impl Exit {
    fn put(self, w: &mut Writer, target: u64, site: u64) -> Result<(), Refusal> {
        match self {
            Exit::Branch if reaches(w.pc(), target, B_REACH) => w.put_b(target),
            Exit::Branch => return Err(Refusal::OutOfReach { at: site }),
            Exit::Return(scratch) => {
                w.put_ldr_literal(scratch, target);
                w.put_ret(scratch);
            }
        }
        Ok(())
    }
}

/// Appends the relocated window of `plan` to `w`, including the way back.
/// Returns, for each window offset whose instruction was relocated, the
/// address of its copy.
pub fn relocate(plan: &SitePlan, w: &mut Writer, exit: Exit) -> Result<Vec<(u32, u64)>, Refusal> {
    relocate_with(plan, w, exit, None)
}

/// What a detour that records a call's end puts before an exit of its
/// window ([`SitePlan::exits`]), given the writer and the exit.
pub type ExitStub<'a> = &'a mut dyn FnMut(&mut Writer, ExitInsn) -> Result<(), Refusal>;

/// [`relocate`], with `stub`'s code before each exit of the window: before a
/// return, or a jump out of the function, which then leaves from the copy;
/// on the taken side of a conditional branch out (`b.cond 1f ; exit pc+4 ;
/// 1: <stub> ; exit T`). A thread at an exit goes to what records it.
pub fn relocate_with(
    plan: &SitePlan,
    w: &mut Writer,
    exit: Exit,
    mut stub: Option<ExitStub>,
) -> Result<Vec<(u32, u64)>, Refusal> {
    let mut map = Vec::new();
    let end = plan.site + plan.len() as u64;
    for (k, chunk) in plan.window.chunks_exact(4).enumerate() {
        let pc = plan.site + 4 * k as u64;
        map.push((4 * k as u32, w.pc()));
        let word = u32::from_le_bytes(chunk.try_into().unwrap());
        let last = pc + 4 == end;
        let at_exit = plan.exits.iter().find(|e| e.offset == 4 * k as u32);
        if let (Some(stub), Some(&e)) = (stub.as_mut(), at_exit) {
            if !relocate_exit(word, pc, last, w, exit, plan, e, &mut **stub)? {
                return Ok(map);
            }
            continue;
        }
        if !relocate_one(word, pc, last, w, exit, plan)? {
            return Ok(map);
        }
    }
    exit.put(w, end, plan.site)?;
    Ok(map)
}

/// Appends exit `e` (the instruction `word`, which ran at `pc`), with
/// `stub` before it; returns true if control falls through to what follows.
#[allow(clippy::too_many_arguments)]
fn relocate_exit(
    word: u32,
    pc: u64,
    last: bool,
    w: &mut Writer,
    exit: Exit,
    plan: &SitePlan,
    e: ExitInsn,
    stub: &mut dyn FnMut(&mut Writer, ExitInsn) -> Result<(), Refusal>,
) -> Result<bool, Refusal> {
    match (e.kind, classify(word, pc)) {
        (ExitKind::Return | ExitKind::MaybeJump { .. } | ExitKind::IndirectJump, Class::IndirectJump) => {
            stub(w, e)?;
            w.put(word);
            Ok(false)
        }
        (ExitKind::Jump, Class::Branch { target }) => {
            stub(w, e)?;
            exit.put(w, target, plan.site)?;
            Ok(false)
        }
        (ExitKind::CondJump, Class::CondBranch { target }) if last => {
            let taken = w.label();
            w.put_cond_branch(word, taken);
            exit.put(w, pc + 4, plan.site)?;
            w.bind(taken);
            stub(w, e)?;
            exit.put(w, target, plan.site)?;
            Ok(false)
        }
        _ => Err(Refusal::Unrelocatable {
            mnemonic: plan.summary(),
            at: pc,
            why: "an exit tp records only as the last instruction of its window".into(),
        }),
    }
}

/// Appends the copy of `word`, which ran at `pc`; returns true if control
/// falls through to what follows it.
fn relocate_one(word: u32, pc: u64, last: bool, w: &mut Writer, exit: Exit, plan: &SitePlan) -> Result<bool, Refusal> {
    let next = pc + 4;
    match classify(word, pc) {
        Class::Plain => w.put(word),
        Class::IndirectJump => {
            w.put(word);
            return Ok(false);
        }
        Class::Adr { rd, target } | Class::Adrp { rd, target } => w.put_ldr_literal(rd, target),
        Class::LoadLiteral { kind, rt, addr } => {
            let base = match kind {
                LoadKind::W | LoadKind::X | LoadKind::Sw if rt != Reg::XZR => rt,
                _ => Reg::X16,
            };
            w.put_ldr_literal(base, addr);
            w.put_load(kind, rt, base);
        }
        Class::Branch { target } => {
            exit.put(w, target, plan.site)?;
            return Ok(false);
        }
        Class::Call { target } => {
            w.put_ldr_literal(Reg::LR, next);
            exit.put(w, target, plan.site)?;
            return Ok(false);
        }
        Class::CondBranch { target } if last => {
            let taken = w.label();
            w.put_cond_branch(word, taken);
            exit.put(w, next, plan.site)?;
            w.bind(taken);
            exit.put(w, target, plan.site)?;
            return Ok(false);
        }
        Class::CondBranch { target } => {
            let (taken, not_taken) = (w.label(), w.label());
            w.put_cond_branch(word, taken);
            w.put_b(not_taken);
            w.bind(taken);
            exit.put(w, target, plan.site)?;
            w.bind(not_taken);
        }
        Class::CallRegister { rn } => {
            w.put_mov(Reg::X17, rn);
            w.put_ldr_literal(Reg::LR, next);
            w.put_br(Reg::X17);
            return Ok(false);
        }
        class @ (Class::LandingPad
        | Class::Exclusive
        | Class::System
        | Class::Unsafe
        | Class::Unsupported
        | Class::SignsWithPc) => {
            return Err(Refusal::Unrelocatable {
                mnemonic: plan.summary(),
                at: pc,
                why: format!("{class:?} instructions are not relocated"),
            });
        }
    }
    Ok(true)
}

/// True if the copy of `plan`'s window writes x16 or x17 where the
/// original does not: a literal load into a register that cannot hold the
/// address (a prefetch, a SIMD register). Dead at a function's entry, x16
/// may be live inside a function. (A call through a register puts its
/// target in x17 first, which the callee may clobber anyway.)
pub fn needs_scratch(plan: &SitePlan) -> bool {
    plan.window.chunks_exact(4).enumerate().any(|(k, chunk)| {
        let word = u32::from_le_bytes(chunk.try_into().unwrap());
        match classify(word, plan.site + 4 * k as u64) {
            Class::LoadLiteral { kind, rt, .. } => {
                !(matches!(kind, LoadKind::W | LoadKind::X | LoadKind::Sw) && rt != Reg::XZR)
            }
            _ => false,
        }
    })
}

/// The relocated window alone, with its literal pool, to run at `at`.
pub fn relocate_alone(plan: &SitePlan, at: u64, exit: Exit) -> Result<Vec<u8>, Refusal> {
    let mut w = Writer::new(at);
    relocate(plan, &mut w, exit)?;
    Ok(w.finish()?)
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
            prefix: Vec::new(),
            window: word.to_le_bytes().to_vec(),
            insns: vec![WindowInsn { offset: 0, len: 4, mnemonic }],
            dead: 0,
            interior: false,
            exits: Vec::new(),
        }
    }

    /// The relocated code's disassembly, then its literals.
    fn relocated(word: u32) -> (Vec<String>, Vec<u64>) {
        let bytes = relocate_alone(&plan_of(word), AT, Exit::Branch).unwrap();
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
        assert_eq!(
            relocate_alone(&plan_of(0x14000010), far, Exit::Branch).unwrap_err(),
            Refusal::OutOfReach { at: SITE }
        );
        assert_eq!(
            relocate_alone(&plan_of(0xa9bf7bfd), far + 0x100, Exit::Branch).unwrap_err(),
            Refusal::OutOfReach { at: SITE }
        );
        // ... while the literal-based rewrites need no reach for their value.
        assert!(relocate_alone(&plan_of(0x10000080), SITE + (100 << 20), Exit::Branch).is_ok());
    }
}
