//! The x86-64 counting detour.
//!
//! ```text
//! detour:  push rax                       ; save the scratch registers and
//!          push r11                       ;  the status flags (below the
//!          lahf                           ;  return address: at a function's
//!          seto al                        ;  entry that stack is the callee's)
//!          mov  r11, [rip + lit_flag]     ; this probe's enable flag
//!          cmp  byte [r11], 0
//!          je   restore                   ; disabled: just run the displaced code
//!          mov  r11, fs:[0]               ; thread pointer
//!          shr  r11, 12                   ; hash it (Fibonacci hashing of
//!          imul r11, [rip + lit_hash]     ;  its page number) ...
//!          shr  r11, 64 - SLOT_BITS       ; ... into a counter row
//!          shl  r11, STRIDE_SHIFT
//!          add  r11, [rip + lit_counters]
//!          lock inc qword [r11 + 8*probe] ; this thread's row, this probe's counter
//! restore: add  al, 0x7f                  ; OF back from al
//!          sahf                           ; SF ZF AF PF CF back from ah
//!          pop  r11
//!          pop  rax
//! relocated:
//!          <displaced instructions, relocated>
//!          jmp  site + window              ; unless they end in ret/jmp
//! lit_flag:     .quad flag address
//! lit_counters: .quad counter rows
//! lit_hash:     .quad 0x9e3779b97f4a7c15
//! ```
//!
//! Every register and status flag is preserved. The SysV ABI would let a
//! function's entry clobber r11 and the flags, but GCC's interprocedural
//! register allocation (`-fipa-ra`, on at -O2) lets a caller keep values in
//! registers that a local callee is known not to touch: glibc's `_dl_fini`
//! keeps a pointer in r11 across its call to `dfs_traversal`, whose prologue
//! a detour clobbering r11 broke. `lahf`/`seto` and `add`/`sahf` restore the
//! flags in a few cycles (`popfq` costs tens). Threads hash into rows, so
//! two threads rarely write one cache line; the `lock` keeps the count exact
//! when they do.

use super::relocate;
use super::writer::Writer;
use crate::arch::{Detour, DetourSpec, Refusal, SitePlan};

/// Multiplier of the thread-pointer hash: 2^64 divided by the golden ratio.
const HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bytes of the code that saves the scratch registers and flags.
const SAVE_LEN: u64 = 7;
/// Bytes of the code that restores them.
const RESTORE_LEN: u64 = 6;

/// Bytes of the counting prefix before the relocated instructions.
pub const PREFIX_LEN: u64 = SAVE_LEN + 7 + 4 + 6 + 9 + 4 + 8 + 4 + 4 + 7 + 8 + RESTORE_LEN;

/// Assembles the detour of `plan` at address `at`.
pub fn build(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal> {
    let relocated_at = at + PREFIX_LEN;
    let reloc = relocate::relocate(plan, relocated_at)?;
    let literals = (relocated_at + reloc.code.len() as u64).next_multiple_of(8);
    let lit_flag = literals;
    let lit_counters = literals + 8;
    let lit_hash = literals + 16;

    let restore = relocated_at - RESTORE_LEN;
    let mut w = Writer::new(at);
    w.put_save_scratch_and_flags();
    w.put_mov_r11_rip(lit_flag);
    w.put_cmp_byte_r11_0();
    w.put_je(restore);
    w.put_mov_r11_fs0();
    w.put_shr_r11(12);
    w.put_imul_r11_rip(lit_hash);
    w.put_shr_r11((64 - spec.slot_bits) as u8);
    w.put_shl_r11(spec.stride_shift as u8);
    w.put_add_r11_rip(lit_counters);
    w.put_lock_inc_r11_disp((spec.probe_index * 8) as i32);
    debug_assert_eq!(w.pc(), restore);
    w.put_restore_scratch_and_flags();
    debug_assert_eq!(w.pc(), relocated_at);
    w.put_bytes(&reloc.code);
    w.put_align(8);
    w.put_u64(spec.flag_addr);
    w.put_u64(spec.counters);
    w.put_u64(HASH);

    let pc_map = reloc.offsets.iter().map(|&(window, code)| (window, relocated_at + code as u64)).collect();
    Ok(Detour { bytes: w.into_bytes(), pc_map })
}

/// The row a thread pointer hashes to: what the detour computes, for tests
/// and for tools that want to know which row a thread writes.
pub fn slot_of(thread_pointer: u64, slot_bits: u32) -> u64 {
    (thread_pointer >> 12).wrapping_mul(HASH) >> (64 - slot_bits)
}

/// The bytes replacing the window: `jmp detour`, then `int3` up to the
/// window's end (those bytes are the tail of the last displaced instruction:
/// nothing may run them, and if something did it would trap loudly).
pub fn patch(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal> {
    let rel = detour.wrapping_sub(plan.site + 5) as i64;
    if i32::try_from(rel).is_err() {
        return Err(Refusal::OutOfReach { at: plan.site });
    }
    let mut bytes = vec![0xcc; plan.len()];
    bytes[0] = 0xe9;
    bytes[1..5].copy_from_slice(&(rel as i32).to_le_bytes());
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::decode::disassemble;
    use crate::arch::x86_64::window;

    const SITE: u64 = 0x5555_5555_1630;
    const AT: u64 = 0x5555_5550_0000;

    fn spec() -> DetourSpec {
        DetourSpec {
            probe_index: 3,
            flag_addr: 0x7f00_0000_2003,
            counters: 0x7f00_0001_0000,
            slot_bits: 7,
            stride_shift: 15,
        }
    }

    #[test]
    fn detour_counts_then_runs_the_window_and_jumps_back() {
        // push rbp; mov rbp, rsp; push rbx; mov rbx, rsi
        let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x89, 0xf3, 0xc3];
        let plan = window::plan(&code, SITE, &[]).unwrap();
        let d = build(&plan, AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let relocated = AT + PREFIX_LEN;
        let restore = relocated - 6;
        let expected = [
            "push rax".to_string(),
            "push r11".into(),
            "lahf".into(),
            "seto al".into(),
            format!("mov r11, qword ptr [rip + {:#x}]", (relocated + 10).next_multiple_of(8) - (AT + 7 + 7)),
            "cmp byte ptr [r11], 0".into(),
            format!("je {restore:#x}"),
            "mov r11, qword ptr fs:[0]".into(),
            "shr r11, 0xc".into(),
        ];
        assert_eq!(asm[..9], expected);
        assert!(asm[9].starts_with("imul r11, qword ptr [rip + "));
        assert_eq!(asm[10..12], ["shr r11, 0x39", "shl r11, 0xf"]);
        assert!(asm[12].starts_with("add r11, qword ptr [rip + "));
        assert_eq!(asm[13], "lock inc qword ptr [r11 + 0x18]");
        assert_eq!(asm[14..18], ["add al, 0x7f", "sahf", "pop r11", "pop rax"]);
        assert_eq!(asm[18..22], ["push rbp", "mov rbp, rsp", "push rbx", &format!("jmp {:#x}", SITE + 5)]);
        let lits = d.bytes.len() - 24;
        let lit = |k: usize| u64::from_le_bytes(d.bytes[lits + 8 * k..lits + 8 * k + 8].try_into().unwrap());
        assert_eq!((lit(0), lit(1), lit(2)), (spec().flag_addr, spec().counters, HASH));
        // Threads in the window map to their relocated instruction; the end to the jmp back.
        assert_eq!(d.map_pc(1), Some(relocated + 1));
        assert_eq!(d.map_pc(4), Some(relocated + 4));
        assert_eq!(d.map_pc(5), Some(relocated + 5));
    }

    #[test]
    fn patch_is_a_jump_padded_with_int3() {
        let code = [0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 0xc3];
        let plan = window::plan(&code, SITE, &[]).unwrap();
        let p = patch(&plan, AT).unwrap();
        assert_eq!(p.len(), 10);
        assert_eq!(disassemble(&p[..5], SITE), [format!("jmp {AT:#x}")]);
        assert_eq!(p[5..], [0xcc; 5]);
        assert_eq!(patch(&plan, SITE + (3 << 30)).unwrap_err(), Refusal::OutOfReach { at: SITE });
    }

    #[test]
    fn slot_hash_spreads_typical_thread_pointers() {
        // glibc thread pointers sit one stack (8 MiB by default) plus a guard page apart.
        for stride in [(8 << 20) + 4096, (2 << 20) + 4096, 0x80_1000] {
            let slots: std::collections::BTreeSet<u64> =
                (0..8).map(|i| slot_of(0x7f12_3400_0740 + i * stride, 6)).collect();
            assert!(slots.len() >= 7, "stride {stride:#x}: {slots:?}");
        }
    }
}
