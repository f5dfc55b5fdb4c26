//! The AArch64 counting detour.
//!
//! ```text
//! detour:  ldr   x16, lit_flag            ; this probe's enable flag
//!          ldrb  w16, [x16]
//!          cbz   w16, relocated           ; disabled: just run the displaced code
//!          mrs   x16, tpidr_el0           ; thread pointer
//!          lsr   x16, x16, #12            ; hash it (Fibonacci hashing of
//!          ldr   x17, lit_hash            ;  its page number) ...
//!          mul   x16, x16, x17
//!          lsr   x16, x16, #(64 - SLOT_BITS)  ; ... into a counter row
//!          ldr   x17, lit_counter         ; row 0's counter of this probe
//!          add   x16, x17, x16, lsl #STRIDE_SHIFT
//!          mov   x17, #1                  ; with LSE atomics (HWCAP_ATOMICS):
//!          stadd x17, [x16]
//!                                         ; without: an exclusive loop, which
//!          str   x15, [sp, #-16]!         ;  needs a third register, saved
//!     1:   ldxr  x17, [x16]               ;  below a pre-decremented SP
//!          add   x17, x17, #1             ;  (AAPCS64 has no red zone)
//!          stxr  w15, x17, [x16]
//!          cbnz  w15, 1b
//!          ldr   x15, [sp], #16
//! relocated:
//!          <the displaced instruction, relocated; see relocate.rs>
//!          b     site + 4                 ; unless it branches elsewhere
//!          .quad flag address, hash multiplier, counter address, relocation literals
//! ```
//!
//! At a site inside a function, where x16 and x17 may be live, the detour
//! starts with `stp x16, x17, [sp, #-16]!` and ends its prefix with `ldp
//! x16, x17, [sp], #16` (a disabled probe's `cbz` goes there).
//!
//! The detour is entered by `b` and left by `b` (or by the relocated
//! instruction's own `ret`/`br`), so it never needs a BTI landing pad, and
//! the function's own landing pads stay where they are. It writes only x16,
//! x17 (the intra-procedure-call registers, dead at a function's entry under
//! AAPCS64) and, through the relocated code, what the displaced instruction
//! wrote. Threads hash into rows, so two threads rarely write one cache
//! line; the atomic add keeps the count exact when they do.

use super::writer::{Writer, X16, X17};
use super::{long, relocate};
use crate::arch::{Detour, DetourSpec, Records, Refusal, SitePlan};

/// Multiplier of the thread-pointer hash: 2^64 divided by the golden ratio.
const HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// How the detour increments its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atomics {
    /// ARMv8.1 LSE: `stadd`.
    Lse,
    /// ARMv8.0: an `ldxr`/`stxr` loop.
    Exclusive,
}

impl Atomics {
    /// What the CPU tp runs on (and so the target, on the same machine) has.
    pub fn host() -> Atomics {
        #[cfg(target_arch = "aarch64")]
        {
            const HWCAP_ATOMICS: u64 = 1 << 8;
            // SAFETY: getauxval only reads the process's auxiliary vector.
            let hwcap = unsafe { libc::getauxval(libc::AT_HWCAP) };
            if hwcap & HWCAP_ATOMICS == 0 {
                return Atomics::Exclusive;
            }
        }
        Atomics::Lse
    }

    /// Bytes of the counting prefix before the relocated instruction.
    pub fn prefix_len(self) -> u64 {
        match self {
            Atomics::Lse => 12 * 4,
            Atomics::Exclusive => 16 * 4,
        }
    }
}

/// Assembles the detour of `plan` at address `at`.
pub fn build(plan: &SitePlan, at: u64, spec: &DetourSpec, atomics: Atomics) -> Result<Detour, Refusal> {
    if spec.records != Records::COUNT {
        return Err(Refusal::Unsupported(
            "AArch64 probes count calls; arguments, return values and latency are not recorded there yet",
        ));
    }
    // Inside a function x16 and x17 may be live: the detour keeps them below
    // the stack pointer (nothing else may be there: Linux's signal frames go
    // there at any instruction) and takes them back before the relocated code.
    let saves = if plan.interior { 4 } else { 0 };
    let restore_at = at + saves + atomics.prefix_len();
    let relocated_at = restore_at + saves;
    let mut w = Writer::new(at);
    if plan.interior {
        w.put_push_ip_registers();
    }
    w.put_ldr_literal(X16, spec.flag_addr);
    w.put_ldrb(X16, X16);
    w.put_cbz_w(X16, restore_at);
    w.put_mrs_tpidr_el0(X16);
    w.put_lsr(X16, X16, 12);
    w.put_ldr_literal(X17, HASH);
    w.put_mul(X16, X16, X17);
    w.put_lsr(X16, X16, 64 - spec.slot_bits);
    w.put_ldr_literal(X17, spec.counters + 8 * spec.probe_index as u64);
    w.put_add_lsl(X16, X17, X16, spec.stride_shift);
    match atomics {
        Atomics::Lse => {
            w.put_movz(X17, 1);
            w.put_stadd(X17, X16);
        }
        Atomics::Exclusive => {
            const STATUS: u32 = 15;
            w.put_push(STATUS);
            let again = w.pc();
            w.put_ldxr(X17, X16);
            w.put_add_imm(X17, X17, 1);
            w.put_stxr(STATUS, X17, X16);
            w.put_cbnz_w(STATUS, again);
            w.put_pop(STATUS);
        }
    }
    debug_assert_eq!(w.pc(), restore_at);
    if plan.interior {
        w.put_pop_ip_registers();
    }
    debug_assert_eq!(w.pc(), relocated_at);
    let pc_map = relocate::relocate(plan, &mut w, long::exit(plan)?)?;
    Ok(Detour { bytes: w.finish(), pc_map })
}

/// The row a thread pointer hashes to: what the detour computes.
pub fn slot_of(thread_pointer: u64, slot_bits: u32) -> u64 {
    (thread_pointer >> 12).wrapping_mul(HASH) >> (64 - slot_bits)
}

/// The bytes replacing the window: `b detour`, or the long form's three
/// instructions for a window of three.
pub fn patch(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal> {
    if plan.len() == long::LONG_PATCH_LEN {
        return long::patch(plan, detour);
    }
    let mut w = Writer::new(plan.site);
    if !super::writer::reaches(plan.site, detour, super::writer::B_REACH) {
        return Err(Refusal::OutOfReach { at: plan.site });
    }
    w.put_b(detour);
    Ok(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::aarch64::decode::disassemble;
    use crate::arch::aarch64::window;

    const SITE: u64 = 0x41_2344;
    const AT: u64 = 0x3f_0000;

    fn spec() -> DetourSpec {
        DetourSpec {
            probe_index: 3,
            records: Records::COUNT,
            entry_word: 3,
            runtime: None,
            countdowns_from_counters: 0,
            flag_addr: 0xffff_8000_2003,
            counters: 0xffff_8001_0000,
            slot_bits: 6,
            stride_shift: 15,
            abi: crate::arch::Abi::C,
            operands: None,
        }
    }

    fn stp_plan() -> SitePlan {
        // bti c; stp x29, x30, [sp, #-16]!; ret
        let code: Vec<u8> = [0xd503245fu32, 0xa9bf7bfd, 0xd65f03c0].iter().flat_map(|w| w.to_le_bytes()).collect();
        window::plan(&code, SITE - 4, &[]).unwrap()
    }

    fn literals(bytes: &[u8], n: usize) -> Vec<u64> {
        bytes[bytes.len() - 8 * n..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn interior_detours_keep_x16_and_x17() {
        let plan = SitePlan { interior: true, ..stp_plan() };
        let d = build(&plan, AT, &spec(), Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[0], "stp x16, x17, [sp, #-0x10]!");
        let restore = AT + 4 + 48;
        assert_eq!(asm[3], format!("cbz w16, #{restore:#x}"));
        assert_eq!(asm[13..15], ["ldp x16, x17, [sp], #0x10".to_string(), "stp x29, x30, [sp, #-0x10]!".into()]);
        assert_eq!(d.map_pc(0), Some(restore + 4));
    }

    #[test]
    fn lse_detour_counts_then_runs_the_instruction_and_branches_back() {
        let d = build(&stp_plan(), AT, &spec(), Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let relocated = AT + 48;
        let lit = |k: u64| format!("{:#x}", AT + 56 + 8 * k);
        assert_eq!(
            asm[..14],
            [
                format!("ldr x16, #{}", lit(0)),
                "ldrb w16, [x16]".into(),
                format!("cbz w16, #{relocated:#x}"),
                "mrs x16, tpidr_el0".into(),
                "lsr x16, x16, #0xc".into(),
                format!("ldr x17, #{}", lit(1)),
                "mul x16, x16, x17".into(),
                "lsr x16, x16, #0x3a".into(),
                format!("ldr x17, #{}", lit(2)),
                "add x16, x17, x16, lsl #15".into(),
                "mov x17, #1".into(),
                "stadd x17, [x16]".into(),
                "stp x29, x30, [sp, #-0x10]!".into(),
                format!("b #{:#x}", SITE + 4),
            ]
        );
        assert_eq!(d.bytes.len(), 56 + 24);
        assert_eq!(literals(&d.bytes, 3), [spec().flag_addr, HASH, spec().counters + 24]);
        assert_eq!(d.map_pc(0), Some(relocated));
    }

    #[test]
    fn exclusive_detour_saves_its_third_register_below_a_moved_sp() {
        let d = build(&stp_plan(), AT, &spec(), Atomics::Exclusive).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let again = AT + 44;
        assert_eq!(
            asm[10..18],
            [
                "str x15, [sp, #-0x10]!".to_string(),
                "ldxr x17, [x16]".into(),
                "add x17, x17, #1".into(),
                "stxr w15, x17, [x16]".into(),
                format!("cbnz w15, #{again:#x}"),
                "ldr x15, [sp], #0x10".into(),
                "stp x29, x30, [sp, #-0x10]!".into(),
                format!("b #{:#x}", SITE + 4),
            ]
        );
        assert_eq!(asm[2], format!("cbz w16, #{:#x}", AT + 64));
        assert_eq!(d.map_pc(0), Some(AT + 64));
    }

    #[test]
    fn relocation_literals_share_the_pool() {
        // adrp x0, page: the page address becomes a fourth literal
        let code = 0x90000000u32.to_le_bytes();
        let plan = window::plan(&code, SITE, &[]).unwrap();
        let d = build(&plan, AT, &spec(), Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[12], format!("ldr x0, #{:#x}", AT + 56 + 24));
        assert_eq!(literals(&d.bytes, 4)[3], SITE & !0xfff);
    }

    #[test]
    fn long_form_detour_returns_with_ret_and_maps_every_window_instruction() {
        // bti c; stp x29, x30, [sp, #-16]!; mov x29, sp; b.ne .+0x40; ret
        let code: Vec<u8> = [0xd503245fu32, 0xa9bf7bfd, 0x910003fd, 0x54000201, 0xd65f03c0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let plan = crate::arch::aarch64::long::plan_long(&code, SITE - 4, &[]).unwrap();
        let far = (SITE + (3 << 30)) & !15;
        let d = build(&plan, far, &spec(), Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, far);
        let r = far + 48;
        assert_eq!(
            asm[12..20],
            [
                "stp x29, x30, [sp, #-0x10]!".to_string(),
                "mov x29, sp".into(),
                format!("b.ne #{:#x}", r + 8 + 12),
                format!("ldr x16, #{:#x}", far + 80 + 24),
                "ret x16".into(),
                format!("ldr x16, #{:#x}", far + 80 + 32),
                "ret x16".into(),
                "brk #0".into(),
            ]
        );
        assert_eq!(literals(&d.bytes, 5)[3..], [SITE + 12, SITE + 8 + 0x40]);
        assert_eq!(d.pc_map, [(0, r), (4, r + 4), (8, r + 8)]);
        assert_eq!(
            disassemble(&patch(&plan, far).unwrap(), SITE),
            [format!("adrp x16, #{:#x}", far & !0xfff), format!("add x16, x16, #{:#x}", far & 0xfff), "br x16".into()]
        );
    }

    #[test]
    fn event_probes_are_refused() {
        let spec = DetourSpec { records: Records { args: true, ret: true, ..Records::COUNT }, ..spec() };
        assert!(matches!(build(&stp_plan(), AT, &spec, Atomics::Lse), Err(Refusal::Unsupported(_))));
    }

    #[test]
    fn patch_is_one_branch_within_reach() {
        let plan = stp_plan();
        assert_eq!(disassemble(&patch(&plan, AT).unwrap(), SITE), [format!("b #{AT:#x}")]);
        assert_eq!(patch(&plan, SITE + (128 << 20)).unwrap_err(), Refusal::OutOfReach { at: SITE });
    }

    #[test]
    fn slot_hash_spreads_typical_thread_pointers() {
        // glibc's arm64 thread pointers sit one stack (8 MiB) plus a guard page apart.
        for stride in [(8 << 20) + 4096, (2 << 20) + 4096, 0x80_1000] {
            let slots: std::collections::BTreeSet<u64> =
                (0..8).map(|i| slot_of(0xffff_8a3f_f8c0 + i * stride, 6)).collect();
            assert!(slots.len() >= 6, "stride {stride:#x}: {slots:?}");
        }
    }
}
