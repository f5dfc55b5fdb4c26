//! x86-64 detours.
//!
//! Every detour starts with the counting prefix:
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
//!          shr  r11, 12                   ; Fibonacci hash of its page number ...
//!          imul r11, [rip + lit_hash]
//!          shr  r11, 64 - SLOT_BITS       ; ... into a counter row
//!          shl  r11, STRIDE_SHIFT
//!          add  r11, [rip + lit_counters]
//!          lock inc qword [r11 + 8*probe] ; this row's counter for this probe
//!          ...                            ; event probes: call the runtime
//! restore: add  al, 0x7f                  ; OF back from al
//!          sahf                           ; SF ZF AF PF CF back from ah
//!          pop  r11
//!          pop  rax
//! ```
//!
//! Every register and status flag is preserved. The SysV ABI would let a
//! function's entry clobber r11 and the flags, but GCC's interprocedural
//! register allocation (`-fipa-ra`, on at -O2) lets a caller keep values in
//! registers that a local callee is known not to touch: glibc's `_dl_fini`
//! keeps a pointer in r11 across its call to `dfs_traversal`, whose prologue
//! a detour clobbering r11 broke. `lahf`/`seto` and `add`/`sahf` restore the
//! flags in a few cycles (`popfq` costs tens). Threads hash into rows, so
//! two threads rarely write one cache line; `lock` keeps the count exact
//! when they do.
//!
//! A probe that records arguments or returns calls the runtime's `tp_entry`
//! after counting, saving the registers a C function may clobber and the
//! function may still need (the six argument registers, rax for variadic
//! calls, r10 for a static chain; r11 and the flags are already saved); the
//! runtime uses no vector registers. An unwinder probe calls `tp_unwind` the
//! same way. Then:
//!
//! ```text
//! relocated: <displaced instructions, relocated>
//!            jmp  site + window            ; unless they end in ret/jmp
//! literals:  flag address, counter rows, 0x9e3779b97f4a7c15[, context, trampoline]
//! ```
//!
//! A site inside a function ([`SitePlan::interior`]) may have live data in
//! the 128 bytes below the stack pointer (the System V red zone, which a
//! leaf function uses without moving rsp), and the stack pointer has no
//! known alignment there. Its detour steps over the red zone first (`lea
//! rsp, [rsp - 128]`, which leaves the flags alone) and back after the
//! restore, and an event aligns the stack for its call
//! (`mov rax, rsp; and rsp, -16; push rax; push rax; call; pop rsp`). The
//! event of a static probe records its note's arguments, loaded at the site
//! by [`super::operands`], instead of the argument registers.
//!
//! A sampling probe (tp profile) also counts down, in the same row, the
//! calls left before its next sample, and calls the runtime when none are
//! left (the subtraction borrows). The runtime draws the next countdown at
//! random around the probe's period, so samples are spread over calls
//! without bias. The call sits out of line, after the relocated code, so an
//! unsampled call pays for its count, one subtraction and a branch not
//! taken:
//!
//! ```text
//!          sub  qword [r11 + COUNTDOWNS + 8*probe], 1
//!          jb   sample                    ; the countdown was 0: sample
//! restore: ...
//! relocated: ...
//! sample:  <save, call tp_entry (r9 = the countdown's address), restore>
//!          jmp  restore
//! ```

use super::operands::{self, Frame};
use super::relocate;
use super::writer::Writer;
use crate::arch::{Abi, Detour, DetourSpec, Refusal, RuntimeAddrs, SitePlan};

/// Multiplier of the thread-pointer hash: 2^64 divided by the golden ratio.
const HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bytes the prefix pushes before anything else (rax and r11).
const SAVED: i8 = 16;
/// Bytes of the code that restores them and the flags.
const RESTORE_LEN: u64 = 6;
/// The System V red zone, which an interior site's detour steps over.
const RED_ZONE: i32 = 128;
/// Bytes of `lea rsp, [rsp + 128]`, after an interior site's restore.
const RED_ZONE_BACK_LEN: u64 = 8;

/// Register numbers as the writer takes them.
const RAX: u8 = 0;
const RCX: u8 = 1;
const RBX: u8 = 3;
const RDX: u8 = 2;
const RSI: u8 = 6;
const RDI: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const R10: u8 = 10;

/// What the prefix refers to.
#[derive(Clone, Copy)]
struct Literals {
    /// Where the restore of the scratch registers and the flags starts.
    restore: u64,
    /// True for an interior site (see the module doc).
    interior: bool,
    flag: u64,
    counters: u64,
    hash: u64,
    ctx: u64,
    tramp: u64,
    /// The out-of-line call of a sampling probe.
    sample: u64,
}

/// Assembles the detour of `plan` at address `at`.
pub fn build(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal> {
    let needs_runtime = spec.records.calls_runtime();
    if needs_runtime && spec.runtime.is_none() {
        return Err(Refusal::Unsupported("an event probe needs the runtime block"));
    }
    // The prefix and the sample block have a fixed length for a given kind: measure them first.
    let interior = plan.interior;
    let dummy = Literals { restore: at, interior, flag: at, counters: at, hash: at, ctx: at, tramp: at, sample: at };
    let mut w = Writer::new(at);
    emit_prefix(&mut w, spec, &dummy);
    let relocated_at = w.pc();
    let reloc = relocate::relocate(plan, relocated_at)?;
    let sample_at = relocated_at + reloc.code.len() as u64;
    let mut w = Writer::new(sample_at);
    emit_sample_block(&mut w, spec, &dummy);
    let literals = w.pc().next_multiple_of(8);
    let restore_len = RESTORE_LEN + if interior { RED_ZONE_BACK_LEN } else { 0 };
    let lits = Literals {
        restore: relocated_at - restore_len,
        interior,
        sample: sample_at,
        flag: literals,
        counters: literals + 8,
        hash: literals + 16,
        ctx: literals + 24,
        tramp: literals + 32,
    };

    let mut w = Writer::new(at);
    emit_prefix(&mut w, spec, &lits);
    debug_assert_eq!(w.pc(), relocated_at);
    w.put_bytes(&reloc.code);
    emit_sample_block(&mut w, spec, &lits);
    w.put_align(8);
    w.put_u64(spec.flag_addr);
    w.put_u64(spec.counters);
    w.put_u64(HASH);
    if let Some(rt) = spec.runtime {
        w.put_u64(rt.ctx);
        w.put_u64(rt.trampoline);
    }
    let pc_map = reloc.offsets.iter().map(|&(window, code)| (window, relocated_at + code as u64)).collect();
    Ok(Detour { bytes: w.into_bytes(), pc_map })
}

fn emit_prefix(w: &mut Writer, spec: &DetourSpec, l: &Literals) {
    if l.interior {
        w.put_lea_rsp_rsp(-RED_ZONE);
    }
    w.put_save_scratch_and_flags();
    w.put_mov_r11_rip(l.flag);
    w.put_cmp_byte_r11_0();
    w.put_je(l.restore);
    w.put_mov_r11_fs0();
    w.put_shr_r11(12);
    w.put_imul_r11_rip(l.hash);
    w.put_shr_r11((64 - spec.slot_bits) as u8);
    w.put_shl_r11(spec.stride_shift as u8);
    w.put_add_r11_rip(l.counters);
    w.put_lock_inc_r11_disp((spec.probe_index * 8) as i32);
    emit_runtime_call(w, spec, l);
    w.put_restore_scratch_and_flags();
    if l.interior {
        w.put_lea_rsp_rsp(RED_ZONE);
    }
}

/// The call into the runtime of an event or unwinder probe, if any.
fn emit_runtime_call(w: &mut Writer, spec: &DetourSpec, l: &Literals) {
    let Some(rt) = spec.runtime else { return };
    if spec.records.unwind {
        call_runtime(w, |w| {
            w.put_mov_reg_rip(RDI, l.ctx);
            w.put_call(rt.unwind);
        });
    } else if spec.records.sample {
        // Count down to the next sample in this thread's row; the call of
        // the runtime is out of line.
        w.put_sub_r11_disp_1(countdown_disp(spec));
        w.put_jb(l.sample);
    } else if spec.records.args || spec.records.ret {
        emit_entry_call(w, spec, l, rt);
    }
}

/// A sampling probe's call of the runtime, after the relocated code (which
/// never falls through into it); it returns to the restore.
fn emit_sample_block(w: &mut Writer, spec: &DetourSpec, l: &Literals) {
    if let (Some(rt), true) = (spec.runtime, spec.records.sample) {
        emit_entry_call(w, spec, l, rt);
        w.put_jmp(l.restore);
    }
}

/// Bytes the Go ABI's copy of the argument registers takes on the stack.
const GO_ARGS: i32 = 48;

/// The call of `tp_entry` of an event probe. Its registers argument points
/// at the six integer argument registers the function's ABI passes first:
/// rdi, rsi, rdx, rcx, r8, r9 where `call_runtime` saved them (C), or a copy
/// of rax, rbx, rcx, rdi, rsi, r8 pushed below them (Go's internal ABI).
fn emit_entry_call(w: &mut Writer, spec: &DetourSpec, l: &Literals, rt: RuntimeAddrs) {
    let flags = spec.entry_word;
    call_runtime(w, |w| {
        let extra = if let Some(ops) = &spec.operands {
            // The site's rax and r11 as the prefix pushed them, above the
            // alignment word and the eight saved registers; its rsp above them.
            let red_zone = if l.interior { RED_ZONE } else { 0 };
            operands::push(w, ops, Frame { rax: 8 + 64 + 8, r11: 8 + 64, rsp: 8 + 64 + SAVED as i32 + red_zone })
        } else if spec.abi == Abi::Go {
            // Pushed last to first. The original rax is the prefix's, above
            // the alignment word, the eight saved registers and r11; rbx,
            // which C code preserves, is still the function's.
            for r in [R8, RSI, RDI, RCX, RBX] {
                w.put_push(r);
            }
            w.put_push_rsp_disp(8 + 64 + 8 + 40);
            GO_ARGS
        } else {
            0
        };
        // tp_entry(ctx, probe | flags, saved registers, return-address slot, trampoline, countdown)
        w.put_mov_reg_rip(RDI, l.ctx);
        w.put_mov_esi_imm32(flags);
        if extra == 0 {
            w.put_lea_rsp(RDX, 8);
        } else {
            w.put_mov_rdx_rsp();
        }
        w.put_lea_rsp(RCX, extra + 8 + 64 + SAVED as i32);
        if spec.records.ret {
            w.put_mov_reg_rip(R8, l.tramp);
        } else {
            w.put_zero_r8();
        }
        if spec.records.sample {
            // r11 still holds this thread's counter row.
            w.put_lea_r9_r11_disp(countdown_disp(spec));
        }
        if l.interior {
            // The stack pointer's alignment inside a function is unknown.
            w.put_align_stack_and_call(rt.entry);
        } else {
            w.put_call(rt.entry);
        }
        if extra != 0 {
            w.put_add_rsp(extra as i8);
        }
    });
}

/// Displacement from a counter row to the probe's countdown in that row.
fn countdown_disp(spec: &DetourSpec) -> i32 {
    (spec.countdowns_from_counters + spec.probe_index as u64 * 8) as i32
}

/// Saves rdi, rsi, rdx, rcx, r8, r9, rax, r10 (in that order upwards from
/// rsp + 8), aligns the stack for a call, runs `call`, and restores them.
/// The saved rax holds the status flags (see the module doc).
fn call_runtime(w: &mut Writer, call: impl FnOnce(&mut Writer)) {
    for r in [R10, RAX, R9, R8, RCX, RDX, RSI, RDI] {
        w.put_push(r);
    }
    // At entry rsp is 8 mod 16; the two words of the prefix and eight pushes
    // keep it so; one more word aligns it.
    w.put_sub_rsp(8);
    call(w);
    w.put_add_rsp(8);
    for r in [RDI, RSI, RDX, RCX, R8, R9, RAX, R10] {
        w.put_pop(r);
    }
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
    use crate::arch::{Records, RuntimeAddrs};

    const SITE: u64 = 0x5555_5555_1630;
    const AT: u64 = 0x5555_5550_0000;
    /// The runtime's flags (probe::layout::entry_flags): the detour passes
    /// whatever word it is given.
    const RECORD_ENTRY: u32 = 1 << 24;
    const HIJACK_RETURN: u32 = 1 << 25;
    const SAMPLE: u32 = 1 << 26;
    const ARGS_RET: Records = Records { args: true, ret: true, sample: false, unwind: false };
    /// Length of the counting prefix.
    const COUNT_PREFIX: u64 = 7 + 7 + 4 + 6 + 9 + 4 + 8 + 4 + 4 + 7 + 8 + 6;

    fn spec() -> DetourSpec {
        DetourSpec {
            probe_index: 3,
            records: Records::COUNT,
            entry_word: 3,
            runtime: None,
            flag_addr: 0x7f00_0000_2003,
            counters: 0x7f00_0001_0000,
            countdowns_from_counters: 0x20_0000,
            slot_bits: 7,
            stride_shift: 15,
            abi: Abi::C,
            operands: None,
        }
    }

    fn runtime() -> RuntimeAddrs {
        RuntimeAddrs {
            entry: AT + 0x100,
            trampoline: AT + 0x800,
            unwind: AT + 0x600,
            entry_ext: AT + 0x200,
            trampoline_ext: AT + 0x900,
            ctx: 0x7f00_0000_0100,
        }
    }

    /// push rbp; mov rbp, rsp; push rbx; mov rbx, rsi
    const PROLOGUE: [u8; 9] = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x89, 0xf3, 0xc3];

    #[test]
    fn detour_counts_then_runs_the_window_and_jumps_back() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let d = build(&plan, AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let relocated = AT + COUNT_PREFIX;
        let expected = [
            "push rax".to_string(),
            "push r11".into(),
            "lahf".into(),
            "seto al".into(),
            format!("mov r11, qword ptr [rip + {:#x}]", (relocated + 10).next_multiple_of(8) - (AT + 7 + 7)),
            "cmp byte ptr [r11], 0".into(),
            format!("je {:#x}", relocated - 6),
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
    fn event_detour_saves_registers_and_calls_the_runtime() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec {
            records: ARGS_RET,
            entry_word: 3 | RECORD_ENTRY | HIJACK_RETURN,
            runtime: Some(runtime()),
            ..spec()
        };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[13], "lock inc qword ptr [r11 + 0x18]", "events still count");
        let saves = ["push r10", "push rax", "push r9", "push r8", "push rcx", "push rdx", "push rsi", "push rdi"];
        assert_eq!(asm[14..22], saves);
        assert_eq!(asm[22], "sub rsp, 8");
        assert!(asm[23].starts_with("mov rdi, qword ptr [rip + "));
        let flags = 3 | RECORD_ENTRY | HIJACK_RETURN;
        assert_eq!(asm[24], format!("mov esi, {flags:#x}"));
        // The return address sits above the eight saved registers, the
        // alignment word and the prefix's rax and r11.
        assert_eq!(asm[25..27], ["lea rdx, [rsp + 8]", "lea rcx, [rsp + 0x58]"]);
        assert!(asm[27].starts_with("mov r8, qword ptr [rip + "));
        assert_eq!(asm[28], format!("call {:#x}", runtime().entry));
        assert_eq!(asm[29], "add rsp, 8");
        let restores = ["pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop r8", "pop r9", "pop rax", "pop r10"];
        assert_eq!(asm[30..38], restores);
        assert_eq!(asm[38..42], ["add al, 0x7f", "sahf", "pop r11", "pop rax"]);
        assert_eq!(asm[42..45], ["push rbp", "mov rbp, rsp", "push rbx"]);
        // The je of a disabled probe skips the count and the call, straight to the restore.
        assert_eq!(asm[6], format!("je {:#x}", d.map_pc(1).unwrap() - 1 - 6));
        // Literals: flag, counters, hash, context, trampoline.
        let lits = d.bytes.len() - 40;
        let lit = |k: usize| u64::from_le_bytes(d.bytes[lits + 8 * k..lits + 8 * k + 8].try_into().unwrap());
        assert_eq!((lit(3), lit(4)), (runtime().ctx, runtime().trampoline));
    }

    #[test]
    fn sampling_detour_counts_down_to_its_next_sample() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec {
            records: Records { ret: true, sample: true, ..Records::COUNT },
            entry_word: 3 | HIJACK_RETURN | SAMPLE,
            runtime: Some(runtime()),
            ..spec()
        };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[13], "lock inc qword ptr [r11 + 0x18]", "sampling probes count every call");
        // The countdown of probe 3 in the same row, 2 MiB on.
        assert_eq!(asm[14], "sub qword ptr [r11 + 0x200018], 1");
        // A borrow (the countdown was 0) jumps out of line to the call;
        // otherwise on to the restore of rax, r11 and the flags.
        let sample = u64::from_str_radix(asm[15].strip_prefix("jb 0x").unwrap(), 16).unwrap();
        assert_eq!(asm[16..20], ["add al, 0x7f", "sahf", "pop r11", "pop rax"]);
        assert_eq!(asm[20..24], ["push rbp", "mov rbp, rsp", "push rbx", &format!("jmp {:#x}", SITE + 5)]);
        // The sample block follows the relocated code's jump back.
        let block = disassemble(&d.bytes[(sample - AT) as usize..], sample);
        assert_eq!(block[0], "push r10");
        let flags = 3 | HIJACK_RETURN | SAMPLE;
        assert_eq!(block[10], format!("mov esi, {flags:#x}"));
        assert_eq!(block[14], "lea r9, [r11 + 0x200018]", "the countdown, for the runtime to reset");
        assert_eq!(block[15], format!("call {:#x}", runtime().entry));
        assert_eq!(block[25], format!("jmp {:#x}", d.map_pc(1).unwrap() - 1 - 6), "back to the restore");
    }

    #[test]
    fn entry_only_event_passes_no_trampoline() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec {
            records: Records { args: true, ..Records::COUNT },
            entry_word: 3 | RECORD_ENTRY,
            runtime: Some(runtime()),
            ..spec()
        };
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert_eq!(asm[24], format!("mov esi, {:#x}", 3 | RECORD_ENTRY));
        assert_eq!(asm[27], "xor r8d, r8d");
    }

    #[test]
    fn unwinder_probe_calls_tp_unwind() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { records: Records { unwind: true, ..Records::COUNT }, runtime: Some(runtime()), ..spec() };
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert!(asm[23].starts_with("mov rdi, qword ptr [rip + "));
        assert_eq!(asm[24], format!("call {:#x}", runtime().unwind));
    }

    #[test]
    fn interior_detours_step_over_the_red_zone() {
        let plan = SitePlan { interior: true, ..window::plan(&PROLOGUE, SITE, &[]).unwrap() };
        let d = build(&plan, AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[0], "lea rsp, [rsp - 0x80]");
        assert_eq!(asm[1..3], ["push rax", "push r11"]);
        let restore = asm.iter().position(|l| l == "add al, 0x7f").unwrap();
        assert_eq!(asm[restore..restore + 5], ["add al, 0x7f", "sahf", "pop r11", "pop rax", "lea rsp, [rsp + 0x80]"]);
        // A disabled probe still steps back over the red zone.
        let restore_at = AT + (d.map_pc(1).unwrap() - 1 - AT) - 6 - 8;
        assert_eq!(asm[7], format!("je {restore_at:#x}"));
        assert_eq!(asm[restore + 5..restore + 8], ["push rbp", "mov rbp, rsp", "push rbx"]);
    }

    #[test]
    fn a_static_probe_event_records_its_operands_with_the_stack_aligned() {
        use crate::arch::{Operand, OperandLoc, Operands};
        let plan = SitePlan { interior: true, ..window::plan(&PROLOGUE, SITE, &[]).unwrap() };
        let ops = [
            Operand { size: 8, signed: false, loc: OperandLoc::Register(RDI) },
            Operand { size: 4, signed: true, loc: OperandLoc::Register(RAX) },
        ];
        let s = DetourSpec {
            records: Records { args: true, ..Records::COUNT },
            entry_word: 3 | RECORD_ENTRY,
            runtime: Some(runtime()),
            operands: Some(Operands::new(&ops)),
            ..spec()
        };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let saves = asm.iter().position(|l| l == "sub rsp, 8").unwrap();
        // Four unused words, the site's rax (saved by the prefix: 80 bytes up, plus 32 pushed), rdi.
        assert_eq!(asm[saves + 1..saves + 5], ["push 0", "push 0", "push 0", "push 0"]);
        assert_eq!(
            asm[saves + 5..saves + 9],
            ["mov rax, qword ptr [rsp + 0x70]", "push rax", "mov rax, rdi", "push rax"]
        );
        let call = asm.iter().position(|l| l.starts_with("call")).unwrap();
        assert_eq!(asm[call - 4..call], ["mov rax, rsp", "and rsp, 0xfffffffffffffff0", "push rax", "push rax"]);
        assert_eq!(asm[call + 1..call + 3], ["pop rsp", "add rsp, 0x30"]);
        // The argument words are the pushed operands.
        assert!(asm[saves + 9..call].contains(&"mov rdx, rsp".to_string()), "{asm:?}");
    }

    #[test]
    fn event_probe_without_runtime_is_refused() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { records: Records { ret: true, ..Records::COUNT }, ..spec() };
        assert!(matches!(build(&plan, AT, &s), Err(Refusal::Unsupported(_))));
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
