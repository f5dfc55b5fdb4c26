//! AArch64 detours.
//!
//! Every detour starts with the counting prefix:
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
//!          ...                            ; event probes: call the runtime
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
//! the function's own landing pads stay where they are. The counting
//! prefix writes only x16, x17 (the intra-procedure-call registers, which
//! any veneer may clobber between a caller and its callee: GCC's
//! interprocedural register allocation never keeps a value in them across
//! a call) and NZCV not at all; through the relocated code, what the
//! displaced instruction wrote. Threads hash into rows, so two threads
//! rarely write one cache line; the atomic add keeps the count exact when
//! they do.
//!
//! A probe that records arguments or returns then calls the runtime's
//! `tp_entry`, with every register a C function may clobber saved below
//! the stack pointer (the function's callee, whose stack it is at entry):
//! x0-x15, x18, NZCV and x30, because under GCC's interprocedural register
//! allocation (`-fipa-ra`) a caller may keep values across a call in any
//! register its local callee does not touch (x86-64 learnt this from
//! glibc's `_dl_fini`); the runtime uses no vector register. The link
//! register lies in the word below the entry stack pointer, which is the
//! slot `tp_entry` reads the return address from and writes the
//! trampoline into; the word below it says where the function saves its
//! link register (its call frame information: see runtime.h):
//!
//! ```text
//!          autiasp | autibsp              ; after paciasp/pacibsp, a return probe:
//!                                         ;  the plain return address
//!          sub   sp, sp, #160
//!          stp   x0, x1, [sp]  ...  stp x14, x15, [sp, #112]
//!          mrs   x17, nzcv
//!          stp   x17, x18, [sp, #128]
//!          ldr   x17, lit_saved_below     ; or xzr
//!          stp   x17, x30, [sp, #144]     ; x30 at entry SP - 8: the slot
//!          ldr   x0, lit_ctx
//!          ldr   x1, lit_entry_word       ; probe index and flags
//!          mov   x2, sp                   ; the argument registers, x0 first
//!          add   x3, sp, #152             ; the slot
//!          ldr   x4, lit_trampoline       ; or xzr: entry events only
//!          bl    tp_entry
//!          ldp   x0, x1, [sp] ...  ldp x17, x18, [sp, #128]
//!          msr   nzcv, x17
//!          ldr   x30, [sp, #152]          ; the trampoline, if it hijacked the return
//!          str   xzr, [sp, #152]          ; no stale trampoline left on the stack
//!          add   sp, sp, #160
//!          paciasp | pacibsp              ; signed again, as the function did
//! ```
//!
//! Pointer authentication: a function that starts with `paciasp` (or
//! `pacibsp`) signs its return address with the key and its entry stack
//! pointer as modifier before the probe site, and authenticates it before
//! it returns. The detour authenticates it (`autiasp`) at that same stack
//! pointer, so the runtime records the plain address, and signs whatever
//! the slot then holds (the trampoline) with the function's own
//! instruction and modifier: the function's `autiasp; ret` (or `retaa`)
//! then returns to the trampoline as it would to its caller. All four are
//! hint-space instructions, which a CPU without PAC runs as NOPs, as it
//! runs the function's own. A function that signs later (shrink-wrapped)
//! signs the trampoline itself.
//!
//! A sampling probe (tp profile) counts down, in the same row, the calls
//! left before its next sample, and calls the runtime out of line when
//! none are left (x5 = the countdown's address):
//!
//! ```text
//!          ldr   x17, lit_countdowns      ; counter row -> countdown row
//!          add   x16, x16, x17
//!          ldr   x17, [x16]
//!          cbz   x17, sample              ; 0: sample this call
//!          sub   x17, x17, #1
//!          str   x17, [x16]
//! relocated: ...
//! sample:  <the call above, with x5 = x16>
//!          b     relocated
//! ```
//!
//! An unwinder probe calls `tp_unwind(ctx, entry stack pointer)` with the
//! same registers saved.

use super::reg::Reg;
use super::writer::{Hint, Label, Writer};
use super::{long, relocate};
use crate::arch::{Abi, Detour, DetourSpec, ExitInsn, ExitKind, ExitWords, Refusal, RuntimeAddrs, SitePlan};

/// Multiplier of the thread-pointer hash: 2^64 divided by the golden ratio.
const HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bytes the detour saves below the stack pointer around a runtime call.
pub const FRAME: u32 = 160;
/// Where x0-x15 go in the frame (the runtime reads the arguments there).
const SAVED_PAIRS: [(Reg, Reg); 8] = [
    (Reg::x(0), Reg::x(1)),
    (Reg::x(2), Reg::x(3)),
    (Reg::x(4), Reg::x(5)),
    (Reg::x(6), Reg::x(7)),
    (Reg::x(8), Reg::x(9)),
    (Reg::x(10), Reg::x(11)),
    (Reg::x(12), Reg::x(13)),
    (Reg::x(14), Reg::x(15)),
];
/// Where NZCV and x18 go.
const NZCV_AT: i32 = 128;
/// The word below the slot: where the function saves its link register.
const SAVED_BELOW_AT: i32 = 144;
/// The slot: the link register, at the entry stack pointer minus 8.
const SLOT_AT: u32 = 152;

/// `paciasp` and `pacibsp`.
const PACIASP: u32 = 0xd503_233f;
const PACIBSP: u32 = 0xd503_237f;

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

    /// Bytes of the counting prefix before anything else.
    pub fn prefix_len(self) -> u64 {
        match self {
            Atomics::Lse => 12 * 4,
            Atomics::Exclusive => 16 * 4,
        }
    }
}

/// The key the function signed its return address with before the probe
/// site (`paciasp`/`pacibsp` among its landing pads), if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedWith {
    /// Key A, SP as modifier.
    KeyA,
    /// Key B, SP as modifier.
    KeyB,
}

/// How `plan`'s function signed its return address before the site.
pub fn signed_with(plan: &SitePlan) -> Option<SignedWith> {
    plan.prefix.chunks_exact(4).rev().find_map(|w| match u32::from_le_bytes(w.try_into().unwrap()) {
        PACIASP => Some(SignedWith::KeyA),
        PACIBSP => Some(SignedWith::KeyB),
        _ => None,
    })
}

/// The parts of a detour that its prefix branches to, bound as the detour
/// is written.
#[derive(Clone, Copy)]
struct Parts {
    /// Where a disabled probe goes: the relocated code, or the restore of
    /// x16 and x17 before it.
    relocated: Label,
    /// The out-of-line call of a sampling probe.
    sample: Label,
}

/// Assembles the detour of `plan` at address `at`, in one pass.
pub fn build(plan: &SitePlan, at: u64, spec: &DetourSpec, atomics: Atomics) -> Result<Detour, Refusal> {
    let runtime = match (spec.records.calls_runtime(), spec.runtime) {
        (true, None) => return Err(Refusal::Unsupported("an event probe needs the runtime block")),
        (true, Some(rt)) => Some(rt),
        (false, _) => None,
    };
    if let (true, Some(rt), Some(words)) = (spec.records.exit, runtime, spec.exit_words) {
        return build_exit(plan, at, rt, words);
    }
    // Inside a function x16 and x17 may be live: the detour keeps them below
    // the stack pointer (nothing else may be there: Linux's signal frames go
    // there at any instruction) and takes them back before the relocated code.
    // Such a probe counts; what calls the runtime starts at a function's entry.
    if plan.interior && runtime.is_some() {
        return Err(Refusal::Unsupported(
            "AArch64 probes inside functions count calls; arguments and latency are recorded at function entries",
        ));
    }
    let exit = long::exit(plan)?;
    let mut w = Writer::new(at);
    let parts = Parts { relocated: w.label(), sample: w.label() };
    if plan.interior {
        w.put_push_ip_registers();
    }
    emit_prefix(&mut w, plan, spec, runtime, atomics, parts)?;
    w.bind(parts.relocated);
    if plan.interior {
        w.put_pop_ip_registers();
    }
    let relocated = w.pc();
    let pc_map = relocate_window(plan, &mut w, exit, spec, runtime)?;
    if let (Some(rt), true) = (runtime, spec.records.sample) {
        w.bind(parts.sample);
        emit_entry_call(&mut w, plan, spec, rt, true)?;
        w.put_b(relocated);
    }
    Ok(Detour { bytes: w.finish()?, pc_map })
}

/// The detour of an exit's site: the call's end recorded (see
/// [`exit_stub`]), then the exit instruction, relocated. No count: the
/// function's entry counts its calls.
fn build_exit(plan: &SitePlan, at: u64, rt: RuntimeAddrs, words: ExitWords) -> Result<Detour, Refusal> {
    if plan.exits.is_empty() {
        return Err(Refusal::Unsupported("an exit's detour needs its exit"));
    }
    let mut w = Writer::new(at);
    let pc_map = relocate::relocate_with(
        plan,
        &mut w,
        relocate::Exit::Branch,
        Some(&mut |w, e| exit_stub(w, words.of(e), e, plan, rt.exit)),
    )?;
    Ok(Detour { bytes: w.finish()?, pc_map })
}

/// The window of `plan` relocated into `w`, with the call's end recorded
/// before each of its exits when the probe sees its calls end there.
fn relocate_window(
    plan: &SitePlan,
    w: &mut Writer,
    exit: relocate::Exit,
    spec: &DetourSpec,
    runtime: Option<RuntimeAddrs>,
) -> Result<Vec<(u32, u64)>, Refusal> {
    match (spec.exit_words, runtime) {
        (Some(words), Some(rt)) => {
            relocate::relocate_with(plan, w, exit, Some(&mut |w, e| exit_stub(w, words.of(e), e, plan, rt.exit)))
        }
        _ => relocate::relocate(plan, w, exit),
    }
}

/// Bytes the exit stub keeps below the stack pointer: x16, x17, x30 and
/// NZCV (the stack pointer is the function's entry one there, and what
/// lies below it is dead: AAPCS64 has no red zone).
const STUB_FRAME: u32 = 32;

/// What a detour puts before an exit of its window: x16, x17 and x30 kept
/// below the stack pointer, the word in x16 and a call of the runtime's
/// exit routine ([`super::runtime_block`]), which keeps every other register and
/// NZCV, then all of it back:
///
/// ```text
///         sub  sp, sp, #32
///         stp  x16, x17, [sp]
///         str  x30, [sp, #16]
///         ldr  x16, =word
///         bl   exit
///         ldr  x30, [sp, #16]
///         ldp  x16, x17, [sp]
///         add  sp, sp, #32
/// ```
///
/// Before a `br xn` out of the function (a tail call through a register,
/// or a switch's jump inside it), the call is made only when xn lies
/// outside the function's code, compared with NZCV kept in the fourth word
/// and a scratch register that is not xn.
fn exit_stub(w: &mut Writer, word: u64, e: ExitInsn, plan: &SitePlan, exit: u64) -> Result<(), Refusal> {
    w.put_sub_imm(Reg::SP, Reg::SP, STUB_FRAME);
    w.put_stp(Reg::X16, Reg::X17, Reg::SP, 0);
    w.put_str_offset(Reg::LR, Reg::SP, 16);
    let check = match e.kind {
        ExitKind::MaybeJump { lo, hi } => {
            let insn = u32::from_le_bytes(plan.window[e.offset as usize..][..4].try_into().expect("a word"));
            let rn = super::exits::branch_register(insn);
            Some((lo, hi, rn, if rn == Reg::X16 { Reg::X17 } else { Reg::X16 }))
        }
        _ => None,
    };
    let (call, after) = (w.label(), w.label());
    if let Some((lo, hi, rn, scratch)) = check {
        w.put_mrs_nzcv(scratch);
        w.put_str_offset(scratch, Reg::SP, 24);
        w.put_ldr_literal(scratch, lo);
        w.put_cmp(rn, scratch);
        w.put_b_lo(call);
        w.put_ldr_literal(scratch, hi);
        w.put_cmp(rn, scratch);
        w.put_b_lo(after);
    }
    w.bind(call);
    w.put_ldr_literal(Reg::X16, word);
    if !super::writer::reaches(w.pc(), exit, super::writer::B_REACH) {
        return Err(Refusal::Unsupported("the runtime block is out of `bl` reach of the detour"));
    }
    w.put_bl(exit);
    w.bind(after);
    if let Some((.., scratch)) = check {
        w.put_ldr_offset(scratch, Reg::SP, 24);
        w.put_msr_nzcv(scratch);
    }
    w.put_ldr_offset(Reg::LR, Reg::SP, 16);
    w.put_ldp(Reg::X16, Reg::X17, Reg::SP, 0);
    w.put_add_imm(Reg::SP, Reg::SP, STUB_FRAME);
    Ok(())
}

/// The counting prefix, and what an event probe does after it.
fn emit_prefix(
    w: &mut Writer,
    plan: &SitePlan,
    spec: &DetourSpec,
    runtime: Option<RuntimeAddrs>,
    atomics: Atomics,
    parts: Parts,
) -> Result<(), Refusal> {
    w.put_ldr_literal(Reg::X16, spec.flag_addr);
    w.put_ldrb(Reg::X16, Reg::X16);
    w.put_cbz_w(Reg::X16, parts.relocated);
    w.put_mrs_tpidr_el0(Reg::X16);
    w.put_lsr(Reg::X16, Reg::X16, 12);
    w.put_ldr_literal(Reg::X17, HASH);
    w.put_mul(Reg::X16, Reg::X16, Reg::X17);
    w.put_lsr(Reg::X16, Reg::X16, 64 - spec.slot_bits);
    w.put_ldr_literal(Reg::X17, spec.counters + 8 * spec.probe_index as u64);
    w.put_add_lsl(Reg::X16, Reg::X17, Reg::X16, spec.stride_shift);
    match atomics {
        Atomics::Lse => {
            w.put_movz(Reg::X17, 1);
            w.put_stadd(Reg::X17, Reg::X16);
        }
        Atomics::Exclusive => {
            const STATUS: Reg = Reg::x(15);
            w.put_push(STATUS);
            let again = w.pc();
            w.put_ldxr(Reg::X17, Reg::X16);
            w.put_add_imm(Reg::X17, Reg::X17, 1);
            w.put_stxr(STATUS, Reg::X17, Reg::X16);
            w.put_cbnz_w(STATUS, again);
            w.put_pop(STATUS);
        }
    }
    let Some(rt) = runtime else { return Ok(()) };
    if let Some(to) = spec.records.own_call(&rt) {
        save(w);
        w.put_stp(Reg::XZR, Reg::LR, Reg::SP, SAVED_BELOW_AT);
        w.put_ldr_literal(Reg::x(0), rt.ctx);
        w.put_add_imm(Reg::x(1), Reg::SP, FRAME);
        put_call(w, to)?;
        restore(w);
    } else if spec.records.sample {
        // x16 holds this thread's counter of the probe: its countdown is as
        // far on as the countdown rows are from the counter rows.
        w.put_ldr_literal(Reg::X17, spec.countdowns_from_counters);
        w.put_add_lsl(Reg::X16, Reg::X16, Reg::X17, 0);
        w.put_ldr_offset(Reg::X17, Reg::X16, 0);
        w.put_cbz_x(Reg::X17, parts.sample);
        w.put_sub_imm(Reg::X17, Reg::X17, 1);
        w.put_str_offset(Reg::X17, Reg::X16, 0);
    } else if spec.records.args || spec.records.ret {
        emit_entry_call(w, plan, spec, rt, false)?;
    }
    Ok(())
}

/// The call of `tp_entry(ctx, probe | flags, registers, slot, trampoline,
/// countdown)`; for a sampling probe x16 holds the countdown's address.
fn emit_entry_call(
    w: &mut Writer,
    plan: &SitePlan,
    spec: &DetourSpec,
    rt: RuntimeAddrs,
    sample: bool,
) -> Result<(), Refusal> {
    // A probe that sees its calls end at the function's exits leaves the
    // link register as it is: nothing to authenticate or sign again.
    let rewrites = spec.records.ret && spec.exit_words.is_none();
    let signed = if rewrites { signed_with(plan) } else { None };
    match signed {
        Some(SignedWith::KeyA) => w.put_hint(Hint::Autiasp),
        Some(SignedWith::KeyB) => w.put_hint(Hint::Autibsp),
        None => {}
    }
    save(w);
    match spec.return_saved_below.filter(|_| rewrites) {
        Some(below) => {
            w.put_ldr_literal(Reg::X17, below as u64);
            w.put_stp(Reg::X17, Reg::LR, Reg::SP, SAVED_BELOW_AT);
        }
        None => w.put_stp(Reg::XZR, Reg::LR, Reg::SP, SAVED_BELOW_AT),
    }
    if sample {
        w.put_mov(Reg::x(5), Reg::X16);
    }
    w.put_ldr_literal(Reg::x(0), rt.ctx);
    w.put_ldr_literal(Reg::x(1), spec.entry_word as u64);
    w.put_add_imm(Reg::x(2), Reg::SP, 0);
    if spec.sp_below_entry != 0 {
        return Err(Refusal::Unsupported("a probe below the entry's stack pointer on AArch64"));
    }
    w.put_add_imm(Reg::x(3), Reg::SP, SLOT_AT);
    if rewrites {
        w.put_ldr_literal(Reg::x(4), rt.trampoline);
    } else if spec.records.ret && spec.abi == Abi::Go {
        // A call of Go code timed at its exits is its goroutine's (x28).
        w.put_mov(Reg::x(4), Reg::x(28));
    } else {
        w.put_movz(Reg::x(4), 0);
    }
    put_call(w, rt.entry)?;
    restore(w);
    match signed {
        Some(SignedWith::KeyA) => w.put_hint(Hint::Paciasp),
        Some(SignedWith::KeyB) => w.put_hint(Hint::Pacibsp),
        None => {}
    }
    Ok(())
}

/// `bl target`, or the probe is refused if the runtime is out of reach.
fn put_call(w: &mut Writer, target: u64) -> Result<(), Refusal> {
    if !super::writer::reaches(w.pc(), target, super::writer::B_REACH) {
        return Err(Refusal::Unsupported("the runtime block is out of `bl` reach of the detour"));
    }
    w.put_bl(target);
    // What the call left below the stack pointer (see runtime_block.rs); the
    // restore that follows each call reloads x0 and x1.
    w.put_clear_below_sp(super::CLEARED_BELOW);
    Ok(())
}

/// Moves SP down by [`FRAME`] and saves x0-x15, NZCV and x18 there (x17
/// is scratch); the caller stores the last pair (what the function saves
/// below the slot, and x30 into the slot).
pub fn save(w: &mut Writer) {
    w.put_sub_imm(Reg::SP, Reg::SP, FRAME);
    for (k, (a, b)) in SAVED_PAIRS.into_iter().enumerate() {
        w.put_stp(a, b, Reg::SP, 16 * k as i32);
    }
    w.put_mrs_nzcv(Reg::X17);
    w.put_stp(Reg::X17, Reg::X18, Reg::SP, NZCV_AT);
}

/// Restores what [`save`] saved and x30 from the slot, clears the slot
/// (the function's frame may leave that word as it is, and a trampoline
/// address there would keep tp's memory from ever leaving: the detach
/// scans the used stack for such addresses), and moves SP back.
pub fn restore(w: &mut Writer) {
    for (k, (a, b)) in SAVED_PAIRS.into_iter().enumerate() {
        w.put_ldp(a, b, Reg::SP, 16 * k as i32);
    }
    w.put_ldp(Reg::X17, Reg::X18, Reg::SP, NZCV_AT);
    w.put_msr_nzcv(Reg::X17);
    w.put_ldr_offset(Reg::LR, Reg::SP, SLOT_AT);
    w.put_str_offset(Reg::XZR, Reg::SP, SLOT_AT);
    w.put_add_imm(Reg::SP, Reg::SP, FRAME);
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
    Ok(w.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Records;
    use crate::arch::aarch64::decode::disassemble;
    use crate::arch::aarch64::runtime_block::tests::CLEARING;
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
            cache: 0xffff_8002_0000,
            slot_bits: 6,
            stride_shift: 15,
            abi: crate::arch::Abi::C,
            return_saved_below: None,
            operands: None,
            layout: None,
            exit_words: None,
            sp_below_entry: 0,
            go_room_lost: None,
        }
    }

    fn runtime() -> RuntimeAddrs {
        RuntimeAddrs {
            entry: AT - 0x800,
            trampoline: AT - 0x100,
            unwind: AT - 0x400,
            rendezvous: AT - 0x480,
            step: AT - 0x4c0,
            trap: 0,
            trap_return: 0,
            entry_ext: AT - 0x600,
            trampoline_ext: AT - 0x80,
            exit: AT - 0x40,
            exit_tail: AT - 0x40,
            exit_runtime: AT - 0x40,
            count: 0,
            ctx: 0xffff_8000_0100,
        }
    }

    /// The runtime's flags (layout::entry_flags): the detour passes
    /// whatever word it is given.
    const RECORD_ENTRY: u32 = 1 << 24;
    const HIJACK_RETURN: u32 = 1 << 25;
    const SAMPLE: u32 = 1 << 26;

    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The saves of every runtime call, from `sub sp` to the NZCV pair.
    fn saves() -> Vec<String> {
        let mut v = vec!["sub sp, sp, #0xa0".to_string(), "stp x0, x1, [sp]".into()];
        v.extend((1..8).map(|k| format!("stp x{}, x{}, [sp, #{:#x}]", 2 * k, 2 * k + 1, 16 * k)));
        v.extend(["mrs x17, nzcv".into(), "stp x17, x18, [sp, #0x80]".into()]);
        v
    }

    /// The restores of every runtime call, to `add sp`.
    fn restores() -> Vec<String> {
        let mut v = vec!["ldp x0, x1, [sp]".to_string()];
        v.extend((1..8).map(|k| format!("ldp x{}, x{}, [sp, #{:#x}]", 2 * k, 2 * k + 1, 16 * k)));
        v.extend([
            "ldp x17, x18, [sp, #0x80]".into(),
            "msr nzcv, x17".into(),
            "ldr x30, [sp, #0x98]".into(),
            "str xzr, [sp, #0x98]".into(),
            "add sp, sp, #0xa0".into(),
        ]);
        v
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
    fn event_detour_saves_every_register_a_caller_may_keep_and_calls_tp_entry() {
        let s = DetourSpec {
            records: Records { args: true, ret: true, ..Records::COUNT },
            entry_word: 3 | RECORD_ENTRY | HIJACK_RETURN,
            runtime: Some(runtime()),
            return_saved_below: Some(16),
            ..spec()
        };
        let d = build(&stp_plan(), AT, &s, Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[11], "stadd x17, [x16]", "events still count");
        assert_eq!(asm[12..23], saves(), "no autiasp: the function signs nothing");
        assert!(asm[23].starts_with("ldr x17, #"), "where the function saves x30: {}", asm[23]);
        assert_eq!(asm[24], "stp x17, x30, [sp, #0x90]");
        assert!(asm[25].starts_with("ldr x0, #") && asm[26].starts_with("ldr x1, #"));
        assert_eq!(asm[27..29], ["mov x2, sp", "add x3, sp, #0x98"]);
        assert!(asm[29].starts_with("ldr x4, #"));
        assert_eq!(asm[30], format!("bl #{:#x}", runtime().entry));
        let c = CLEARING;
        super::super::runtime_block::tests::assert_clears_below_sp(&asm[31..31 + c]);
        assert_eq!(asm[31 + c..44 + c], restores());
        assert_eq!(asm[44 + c..46 + c], ["stp x29, x30, [sp, #-0x10]!".to_string(), format!("b #{:#x}", SITE + 4)]);
        let relocated = AT + (44 + c as u64) * 4;
        assert_eq!(asm[2], format!("cbz w16, #{relocated:#x}"), "a disabled probe runs the displaced code");
        let lits = literals(&d.bytes, 7);
        assert_eq!(lits[3..], [16, runtime().ctx, (3 | RECORD_ENTRY | HIJACK_RETURN) as u64, runtime().trampoline]);
        assert_eq!(d.map_pc(0), Some(relocated));
    }

    #[test]
    fn a_function_that_signs_its_return_address_gets_the_trampoline_signed_alike() {
        // paciasp; stp x29, x30, [sp, #-16]!; ...: the detour authenticates
        // the return address at the entry SP, and signs what the slot then
        // holds with the same instruction; pacibsp alike with key B.
        for (pad, auth, sign) in [(0xd503233fu32, "autiasp", "paciasp"), (0xd503237f, "autibsp", "pacibsp")] {
            let plan = window::plan(&code(&[pad, 0xa9bf7bfd, 0xd65f03c0]), SITE - 4, &[]).unwrap();
            let s = DetourSpec {
                records: Records { ret: true, ..Records::COUNT },
                entry_word: 3 | HIJACK_RETURN,
                runtime: Some(runtime()),
                ..spec()
            };
            let asm = disassemble(&build(&plan, AT, &s, Atomics::Lse).unwrap().bytes, AT);
            assert_eq!(asm[12], auth);
            assert_eq!(asm[13..24], saves());
            assert_eq!(asm[24], "stp xzr, x30, [sp, #0x90]", "no CFI: the runtime is told nothing");
            let c = CLEARING;
            super::super::runtime_block::tests::assert_clears_below_sp(&asm[31..31 + c]);
            assert_eq!(asm[31 + c..44 + c], restores());
            assert_eq!(asm[44 + c], sign);
            assert_eq!(asm[45 + c], "stp x29, x30, [sp, #-0x10]!");
            // An entry probe alone leaves the return address as it is.
            let s = DetourSpec { records: Records { args: true, ..Records::COUNT }, ..s };
            let asm = disassemble(&build(&plan, AT, &s, Atomics::Lse).unwrap().bytes, AT);
            assert!(!asm.iter().any(|i| i == auth || i == sign), "{asm:?}");
            assert!(asm.contains(&"mov x4, #0".to_string()), "no trampoline: {asm:?}");
        }
    }

    #[test]
    fn sampling_detour_counts_down_and_calls_the_runtime_out_of_line() {
        let s = DetourSpec {
            records: Records { ret: true, sample: true, ..Records::COUNT },
            entry_word: 3 | HIJACK_RETURN | SAMPLE,
            runtime: Some(runtime()),
            countdowns_from_counters: 0x20_0000,
            ..spec()
        };
        let d = build(&stp_plan(), AT, &s, Atomics::Exclusive).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[15], "ldr x15, [sp], #0x10");
        assert!(asm[16].starts_with("ldr x17, #"));
        assert_eq!(asm[17..19], ["add x16, x16, x17", "ldr x17, [x16]"]);
        let sample = u64::from_str_radix(asm[19].strip_prefix("cbz x17, #0x").unwrap(), 16).unwrap();
        assert_eq!(asm[20..22], ["sub x17, x17, #1", "str x17, [x16]"]);
        let relocated = AT + 22 * 4;
        assert_eq!(d.map_pc(0), Some(relocated));
        assert_eq!(asm[22..24], ["stp x29, x30, [sp, #-0x10]!".to_string(), format!("b #{:#x}", SITE + 4)]);
        assert_eq!(sample, relocated + 8, "the sample block follows the relocated code");
        let block = &asm[24..];
        assert_eq!(block[..11], saves());
        assert_eq!(block[12], "mov x5, x16", "the countdown, for the runtime to reset");
        assert_eq!(block[18], format!("bl #{:#x}", runtime().entry));
        super::super::runtime_block::tests::assert_clears_below_sp(&block[19..19 + CLEARING]);
        assert_eq!(block[32 + CLEARING], format!("b #{relocated:#x}"));
        assert_eq!(literals(&d.bytes, 7)[3], 0x20_0000);
    }

    #[test]
    fn unwinder_probe_calls_tp_unwind_with_its_entry_stack_pointer() {
        let s = DetourSpec { records: Records { unwind: true, ..Records::COUNT }, runtime: Some(runtime()), ..spec() };
        let asm = disassemble(&build(&stp_plan(), AT, &s, Atomics::Lse).unwrap().bytes, AT);
        assert_eq!(asm[12..23], saves());
        assert_eq!(asm[23], "stp xzr, x30, [sp, #0x90]");
        assert!(asm[24].starts_with("ldr x0, #"));
        assert_eq!(asm[25..27], ["add x1, sp, #0xa0".to_string(), format!("bl #{:#x}", runtime().unwind)]);
        super::super::runtime_block::tests::assert_clears_below_sp(&asm[27..27 + CLEARING]);
        assert_eq!(asm[27 + CLEARING..40 + CLEARING], restores());
    }

    #[test]
    fn an_event_probe_needs_a_runtime_within_reach() {
        let s = DetourSpec { records: Records { args: true, ..Records::COUNT }, ..spec() };
        assert!(matches!(build(&stp_plan(), AT, &s, Atomics::Lse), Err(Refusal::Unsupported(_))));
        let far = RuntimeAddrs { entry: AT + (200 << 20), ..runtime() };
        let s = DetourSpec { runtime: Some(far), ..s };
        assert!(matches!(build(&stp_plan(), AT, &s, Atomics::Lse), Err(Refusal::Unsupported(_))));
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

    #[test]
    fn an_exits_detour_records_the_end_then_leaves_as_the_function_did() {
        use crate::arch::ExitWords;
        let exit_spec =
            || DetourSpec { records: Records { exit: true, ..Records::COUNT }, runtime: Some(runtime()), ..spec() };
        let words = ExitWords { ret: 3, tail: 3 | 1 << 21, runtime: false };
        let at = |k: usize| AT + 4 * k as u64;
        let stub = |word: u32| {
            vec![
                "sub sp, sp, #0x20".to_string(),
                "stp x16, x17, [sp]".into(),
                "str x30, [sp, #0x10]".into(),
                format!("ldr x16, #{:#x}", 0), // the literal's address, checked below
                format!("bl #{:#x}", AT - 0x40),
                "ldr x30, [sp, #0x10]".into(),
                "ldp x16, x17, [sp]".into(),
                "add sp, sp, #0x20".into(),
                format!("{word}"),
            ]
        };
        let ret_plan = |word: u32, kind| {
            let mnemonic = crate::arch::aarch64::decode::decode(&word.to_le_bytes(), SITE)[0].mnemonic.clone();
            SitePlan {
                function: SITE - 0x40,
                site: SITE,
                prefix: Vec::new(),
                window: word.to_le_bytes().to_vec(),
                insns: vec![crate::arch::WindowInsn { offset: 0, len: 4, mnemonic }],
                dead: 0,
                interior: false,
                exits: vec![ExitInsn { offset: 0, kind }],
            }
        };
        // ret: the stub, then the ret itself; the literal holds the word.
        let spec = DetourSpec { exit_words: Some(words), ..exit_spec() };
        let d = build(&ret_plan(0xd65f03c0, ExitKind::Return), AT, &spec, Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let want = stub(0);
        for k in [0, 1, 2, 4, 5, 6, 7] {
            assert_eq!(asm[k], want[k], "{asm:#?}");
        }
        assert!(asm[3].starts_with("ldr x16, #"), "{asm:#?}");
        assert_eq!(asm[8], "ret");
        assert_eq!(literals(&d.bytes, 1), [3]);
        assert_eq!(d.map_pc(0), Some(at(0)), "a thread at the ret goes to the stub");
        // retaa authenticates with the stack pointer, which the stub gives back.
        let d = build(&ret_plan(0xd65f0bff, ExitKind::Return), AT, &spec, Atomics::Lse).unwrap();
        assert_eq!(disassemble(&d.bytes, AT)[8], "retaa");
        // A tail call: the word says so, and the jump goes to its target.
        let b = 0x1400_0000 | 0x100;
        let d = build(&ret_plan(b, ExitKind::Jump), AT, &spec, Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[8], format!("b #{:#x}", SITE + 0x400));
        assert_eq!(literals(&d.bytes, 1), [3 | 1 << 21]);
        // br x16: the call only when x16 lies outside the function, compared
        // with x17 and NZCV kept.
        let br = 0xd61f0200;
        let kind = ExitKind::MaybeJump { lo: SITE - 0x40, hi: SITE + 4 };
        let d = build(&ret_plan(br, kind), AT, &spec, Atomics::Lse).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[3..5], ["mrs x17, nzcv", "str x17, [sp, #0x18]"]);
        assert!(asm[5].starts_with("ldr x17, #") && asm[8].starts_with("ldr x17, #"), "{asm:#?}");
        assert_eq!((asm[6].as_str(), asm[9].as_str()), ("cmp x16, x17", "cmp x16, x17"));
        assert_eq!(asm[7], format!("b.lo #{:#x}", at(11)));
        assert_eq!(asm[10], format!("b.lo #{:#x}", at(13)));
        assert_eq!(asm[13..15], ["ldr x17, [sp, #0x18]", "msr nzcv, x17"]);
        assert_eq!(asm[18], "br x16");
        assert_eq!(literals(&d.bytes, 3), [SITE - 0x40, SITE + 4, 3 | 1 << 21]);
    }

    #[test]
    fn a_probe_timed_at_exits_leaves_the_link_register_alone() {
        use crate::arch::ExitWords;
        // paciasp; stp: a return probe would authenticate x30 and sign the
        // trampoline; at exits the detour neither authenticates nor signs.
        let code: Vec<u8> = [PACIASP, 0xa9bf7bfd, 0xd65f03c0].iter().flat_map(|w| w.to_le_bytes()).collect();
        let plan = window::plan(&code, SITE - 4, &[]).unwrap();
        let spec = DetourSpec {
            records: Records { ret: true, ..Records::COUNT },
            runtime: Some(runtime()),
            entry_word: 3 | (1 << 22),
            exit_words: Some(ExitWords { ret: 3, tail: 3 | 1 << 21, runtime: false }),
            ..spec()
        };
        let asm = disassemble(&build(&plan, AT, &spec, Atomics::Lse).unwrap().bytes, AT);
        assert!(!asm.iter().any(|l| l == "autiasp" || l == "paciasp"), "{asm:#?}");
        assert!(asm.iter().any(|l| l == "mov x4, #0"), "no trampoline: {asm:#?}");
    }
}
