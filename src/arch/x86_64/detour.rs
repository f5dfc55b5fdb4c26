//! x86-64 detours.
//!
//! Every detour starts by counting the call, in a counter row of the
//! thread's own (`layout`: only that thread writes the row, so the
//! add needs no `lock`):
//!
//! ```text
//! detour:  push rax                       ; unless dead or unused (below)
//!          push r11, r10                  ; unless dead registers are free
//!          lahf                           ; the status flags, unless dead:
//!          seto al                        ;  SF ZF AF PF CF in ah, OF in al
//!          mov  S, [rip + lit_flag]       ; this probe's enable flag
//!          cmp  byte [S], 0
//!          je   restore                   ; disabled: just run the displaced code
//!          mov  K, fs:[0]                 ; the word at the thread pointer
//!          imul S32, K32, 0x9e3779b1      ; its entry in the thread cache
//!          shr  S32, 20
//!          and  S32, 0xfe0
//!          add  S, [rip + lit_cache]
//!          not  K
//!          cmp  K, [S]                    ; the entry's check: !word?
//!          jne  way1                      ; else the entry paired with it
//!          mov  K, [S + 8]                ; the thread's counter row
//!          inc  qword [K + 8*probe]       ; one instruction: a signal handler
//! counted: ...                            ;  counting on this thread cannot split it
//! restore: add  al, 0x7f                  ; OF back from al
//!          sahf                           ; SF ZF AF PF CF back from ah
//!          pop  r10, r11
//!          pop  rax
//! relocated:
//!          <displaced instructions, relocated>
//!          jmp  site + window             ; unless they end in ret/jmp
//! way1:    xor  S, 32                     ; the paired entry (index xor 1)
//!          cmp  K, [S]
//!          jne  slow
//!          mov  K, [S + 8]
//!          inc  qword [K + 8*probe]
//!          jmp  counted
//! slow:    push probe
//!          call tp_count                  ; the runtime's stub: keeps everything,
//!          pop  K                         ;  leaves the row's address
//!          jmp  counted
//! literals:
//!          flag address, counter rows, thread cache[, context, trampoline]
//! ```
//!
//! An entry is written once, its check last (`layout::CacheEntry`):
//! once the check matches, the row may be read, and the CPU loads it while
//! it predicts the comparison's branch.
//!
//! Every register and status flag is preserved. The SysV ABI would let a
//! function's entry clobber r11 and the flags, but GCC's interprocedural
//! register allocation (`-fipa-ra`, on at -O2) lets a caller keep values in
//! registers that a local callee is known not to touch: glibc's `_dl_fini`
//! keeps a pointer in r11 across its call to `dfs_traversal`, whose prologue
//! a detour clobbering r11 broke. `lahf`/`seto` and `add`/`sahf` restore the
//! flags in a few cycles (`popfq` costs tens).
//!
//! A counting detour saves only what is live: the scratch registers S and
//! K are ones the window overwrites before reading them (`live`: `imul
//! eax, edi, C` makes rax dead), else r11 and r10, pushed; the flags are
//! saved only if the window does not overwrite them all before reading one,
//! and then in rax, pushed unless dead. A thread the cache does not know
//! (its first call in this process, a thread whose entry another took, a
//! word at fs:0 that does not tell it apart, as Go's 0) is counted by the
//! runtime's `tp_count`, which gives the thread a row of its own and fills
//! its entry. Go code counts in the shared row 0 with `lock inc`: Go's
//! threads keep 0 at fs:0.
//!
//! A probe that records arguments or returns keeps the full frame (rax,
//! r11, r10, the flags; S = r10, K = r11) and, after the enable flag, pushes its word
//! (`probe | flags`) and calls the runtime block's fast entry (`fast.rs`),
//! which keeps every other register, counts the call in the thread's row,
//! records from the argument registers where they are and falls back to
//! `tp_count` and `tp_entry` itself:
//!
//! ```text
//!          je   restore                   ; disabled
//!          push probe | flags
//!          call event
//!          pop  r11
//! restore: ...
//! ```
//!
//! Go's internal ABI passes arguments in other registers: a probe of Go
//! code calls `tp_entry` directly, saving the registers a C function may
//! clobber and the function may still need (the six argument registers,
//! rax for variadic calls, r10 for a static chain; r11 and the flags are
//! already saved); the runtime uses no vector registers. An unwinder probe
//! calls `tp_unwind` the same way.
//!
//! A site inside a function ([`SitePlan::interior`]) may have live data in
//! the 128 bytes below the stack pointer (the System V red zone, which a
//! leaf function uses without moving rsp), and the stack pointer has no
//! known alignment there. Its detour steps over the red zone first (`lea
//! rsp, [rsp - 128]`, which leaves the flags alone) and back after the
//! restore, and its call of `tp_entry` aligns the stack (`mov rax, rsp; and
//! rsp, -16; push rax; push rax; call; pop rsp`); the count stub aligns the
//! stack itself. Neither a site inside a function nor a static probe calls
//! the fast entry (which records the argument registers at a function's
//! entry): their detours count and call `tp_entry` as Go's do, with the
//! argument registers saved, and the event of a static probe records its
//! note's arguments, loaded at the site by [`super::operands`], instead.
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
//! counted: sub  qword [r11 + COUNTDOWNS + 8*probe], 1
//!          jb   sample                    ; the countdown was 0: sample
//! restore: ...
//! relocated: ...
//! slow:    ...
//! sample:  <save, call tp_entry (r9 = the countdown's address), restore>
//!          jmp  restore
//! ```

use super::fast::{self, thread_cache};
use super::liveness;
use super::operands::{self, Frame};
use super::reg::Reg;
use super::relocate::{self, Relocated};
use super::writer::{Label, Writer};
use crate::arch::{
    Abi, Detour, DetourSpec, ExitInsn, ExitKind, ExitWords, Refusal, RuntimeAddrs, RuntimeLayout, SitePlan,
};

/// What the prefix saves, and the registers the count uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Saves {
    /// Registers pushed, in this order (`len` of them).
    pushed: [Reg; 3],
    /// How many of `pushed` are.
    len: usize,
    /// The status flags go to rax (`lahf`/`seto`) and come back from it.
    flags: bool,
    /// The scratch registers S (the cache entry) and K (the counter row).
    s: Reg,
    /// See [`Saves::s`].
    k: Reg,
    /// The prefix steps over the red zone first, and the restore back
    /// after the pops (a site inside a function).
    red_zone: bool,
}

impl Saves {
    /// The frame of a probe that calls the runtime: rax (the flags), r11
    /// (K: the row, which a sampling detour counts down in) and r10 (S).
    const FULL: Saves = Saves {
        pushed: [Reg::Rax, Reg::R11, Reg::R10],
        len: 3,
        flags: true,
        s: Reg::R10,
        k: Reg::R11,
        red_zone: false,
    };

    fn pushed(&self) -> &[Reg] {
        &self.pushed[..self.len]
    }

    /// Bytes the prefix steps over below the site's stack pointer (the
    /// red zone of a site inside a function), before its pushes.
    fn red_zone_bytes(&self) -> i32 {
        if self.red_zone { RED_ZONE } else { 0 }
    }
}

/// Bytes the frame of a probe that calls the runtime pushes first.
const SAVED: i32 = 24;
/// The System V red zone, which the detour of a site inside a function steps over.
const RED_ZONE: i32 = 128;

/// Scratch registers a counting detour may take when the window leaves
/// them dead, r11 first (none needs a SIB byte as a base).
const SCRATCH: [Reg; 9] = [Reg::R11, Reg::R10, Reg::R9, Reg::R8, Reg::Rcx, Reg::Rdx, Reg::Rsi, Reg::Rdi, Reg::Rax];

/// What the prefix of a detour for `plan` must save.
fn saves_for(plan: &SitePlan, spec: &DetourSpec) -> Saves {
    if spec.records.calls_runtime() || spec.records.sample {
        return Saves { red_zone: plan.interior, ..Saves::FULL };
    }
    let dead = liveness::Dead::from_bits(plan.dead);
    let flags = !dead.flags;
    let mut saves = Saves { pushed: [Reg::Rax; 3], len: 0, flags, s: Reg::Rax, k: Reg::Rax, red_zone: plan.interior };
    if flags && !dead.reg(Reg::Rax) {
        saves.pushed[0] = Reg::Rax;
        saves.len = 1;
    }
    // S and K: dead registers (not rax while it holds the flags), else r11
    // and r10, pushed. Go code needs only S.
    let need = if spec.abi == Abi::C { 2 } else { 1 };
    let mut free: Vec<Reg> =
        SCRATCH.into_iter().filter(|&r| dead.reg(r) && !(flags && r == Reg::Rax)).take(need).collect();
    for r in [Reg::R11, Reg::R10] {
        if free.len() < need && !free.contains(&r) {
            saves.pushed[saves.len] = r;
            saves.len += 1;
            free.push(r);
        }
    }
    saves.s = free[0];
    saves.k = *free.last().expect("one register at least");
    saves
}

/// The parts of a detour, which its code refers to before they are written.
#[derive(Clone, Copy)]
struct Labels {
    /// The literals: the enable flag's address, the counter rows, the
    /// thread cache, the context, the trampoline, and the count of entries
    /// skipped for want of room ([`DetourSpec::go_room_lost`]).
    flag: Label,
    /// See [`Labels::flag`].
    counters: Label,
    /// See [`Labels::flag`].
    cache: Label,
    /// See [`Labels::flag`].
    ctx: Label,
    /// See [`Labels::flag`].
    tramp: Label,
    /// See [`Labels::flag`].
    lost_room: Label,
    /// Where such an entry is counted, out of line.
    no_room: Label,
    /// After the count (a slow count comes back here).
    counted: Label,
    /// The restore of what the prefix saved.
    restore: Label,
    /// The out-of-line count in the entry paired with the thread's.
    way1: Label,
    /// The out-of-line call of tp_count.
    slow: Label,
    /// The out-of-line call of a sampling probe.
    sample: Label,
    /// The fast entry of an event probe: the thread's cache entry found.
    found: Label,
    /// The fast entry's fallbacks.
    back: Fallbacks,
}

impl Labels {
    fn new(w: &mut Writer) -> Labels {
        Labels {
            flag: w.label(),
            counters: w.label(),
            cache: w.label(),
            ctx: w.label(),
            tramp: w.label(),
            lost_room: w.label(),
            no_room: w.label(),
            counted: w.label(),
            restore: w.label(),
            way1: w.label(),
            slow: w.label(),
            sample: w.label(),
            found: w.label(),
            back: Fallbacks { unmark: w.label(), full: w.label(), call: w.label() },
        }
    }
}

/// Assembles the detour of `plan` at address `at`, in one pass: the
/// relocated window goes where the head ends, and the writer fills in the
/// branches to what follows when the detour is whole.
pub fn build(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal> {
    let Some(rt) = spec.runtime else {
        return Err(Refusal::Unsupported("a probe needs the runtime block"));
    };
    if spec.records.exit {
        return build_exit(plan, at, spec, &rt);
    }
    let saves = saves_for(plan, spec);
    let fast = fast_event(plan, spec);
    let mut w = Writer::new(at);
    let l = Labels::new(&mut w);
    emit_head(&mut w, spec, fast, rt, saves, &l);
    let relocated_at = w.pc();
    let reloc = relocate_window(plan, relocated_at, spec, &rt)?;
    w.put_bytes(&reloc.code);
    emit_tail(&mut w, spec, fast, rt, saves, &l);
    w.put_align(8);
    for (label, value) in [
        (l.flag, spec.flag_addr),
        (l.counters, spec.counters),
        (l.cache, spec.cache),
        (l.ctx, rt.ctx),
        (l.tramp, rt.trampoline),
    ] {
        w.bind(label);
        w.put_u64(value);
    }
    if let Some(lost) = spec.go_room_lost {
        w.bind(l.lost_room);
        w.put_u64(lost);
    }
    let pc_map = reloc.offsets.iter().map(|&(window, code)| (window, relocated_at + code as u64)).collect();
    Ok(Detour { bytes: w.finish(), pc_map })
}

/// The detour of an exit's site: the window relocated, the call's end
/// recorded before its exit (see [`exit_stub`]), nothing else. No count: the
/// function's entry counts its calls.
fn build_exit(plan: &SitePlan, at: u64, spec: &DetourSpec, rt: &RuntimeAddrs) -> Result<Detour, Refusal> {
    if spec.exit_words.is_none() || plan.exits.is_empty() {
        return Err(Refusal::Unsupported("an exit's detour needs its exit and its probe"));
    }
    let reloc = relocate_window(plan, at, spec, rt)?;
    let pc_map = reloc.offsets.iter().map(|&(window, code)| (window, at + code as u64)).collect();
    Ok(Detour { bytes: reloc.code, pc_map })
}

/// The window of `plan` relocated to `at`, with the call's end recorded
/// before each of its exits when the probe sees its calls end there.
fn relocate_window(plan: &SitePlan, at: u64, spec: &DetourSpec, rt: &RuntimeAddrs) -> Result<Relocated, Refusal> {
    match spec.exit_words {
        Some(words) => relocate::relocate_with(
            plan,
            at,
            Some(&mut |pc, e| exit_stub(pc, words.of(e), exit_routine(&words, e, rt))),
        ),
        None => relocate::relocate(plan, at),
    }
}

/// Which of the runtime's ways into its exit routine ([`super::fast::exit_at`])
/// the detour calls before exit `e`: the runtime's functions at once for a
/// word with their flags or an exit ahead of its return (whose word's top
/// half the fast paths do not read), else the fast path of a return or of
/// a tail call.
fn exit_routine(words: &ExitWords, e: ExitInsn, rt: &RuntimeAddrs) -> u64 {
    match e.kind {
        ExitKind::Ahead { .. } => rt.exit_runtime,
        _ if words.runtime => rt.exit_runtime,
        k if k.is_tail_call() => rt.exit_tail,
        _ => rt.exit,
    }
}

/// What a detour puts before an exit of its window: `push word; call exit;
/// mov qword [rsp - 16], 0`, where a `mov dword [rsp + 4], high` after the
/// push makes the pushed word `word` whole ([`ExitWords::of`]) when sign
/// extension does not. The runtime's exit ([`super::fast::exit_at`]) keeps
/// every register and flag and returns with `ret 8`, the word dropped; the
/// return address into the detour that its call left below the stack
/// pointer is cleared (see [`super::CLEARED_BELOW`]). The same
/// length wherever it goes.
fn exit_stub(pc: u64, word: u64, exit: u64) -> Vec<u8> {
    let mut w = Writer::new(pc);
    w.put_push_imm32(word as u32 as i32);
    if (word as u32 as i32 as i64) as u64 != word {
        w.put_store32_imm(Reg::Rsp, 4, (word >> 32) as u32);
    }
    w.put_call(exit);
    w.put_store_imm(Reg::Rsp, -16, 0);
    w.finish()
}

/// The prefix, the count, the runtime call and the restore; binds
/// `counted`, `restore` and (a fast event probe's) `found`.
fn emit_head(
    w: &mut Writer,
    spec: &DetourSpec,
    fast: Option<RuntimeLayout>,
    rt: RuntimeAddrs,
    saves: Saves,
    l: &Labels,
) {
    let (s, k) = (saves.s, saves.k);
    if saves.red_zone {
        w.put_lea_short(Reg::Rsp, Reg::Rsp, -RED_ZONE);
    }
    for &r in saves.pushed() {
        w.put_push(r);
    }
    if saves.flags {
        w.put_flags_to_rax();
    }
    w.put_mov_reg_rip(s, l.flag);
    w.put_cmp_byte_mem_0(s);
    w.put_je(l.restore);
    let disp = (spec.probe_index * 8) as i32;
    if spec.abi == Abi::C {
        // The thread's entry in the thread cache, by the word at fs:0 (S);
        // K: the word's complement, then the thread's row.
        fast::cache_entry(w, s, k, l.cache.into(), l.way1.into());
        w.bind(l.found);
        w.put_load(k, s, thread_cache::ROW);
        w.put_inc_mem(k, disp, false);
    } else {
        // Go's threads keep 0 at fs:0: the shared row, atomically; a
        // sampling probe counts down there too (K: the row).
        w.put_mov_reg_rip(s, l.counters);
        w.put_inc_mem(s, disp, true);
        if spec.records.sample {
            w.put_mov_reg(k, s);
        }
    }
    w.bind(l.counted);
    if let Some(to) = spec.records.own_call(&rt) {
        call_runtime(w, |w| {
            w.put_mov_reg_rip(Reg::Rdi, l.ctx);
            if spec.records.step {
                // tp_step(ctx, the stack pointer at the function's entry):
                // above the eight registers call_runtime saved, the frame.
                w.put_lea_short(Reg::Rsi, Reg::Rsp, 64 + SAVED + saves.red_zone_bytes() + spec.sp_below_entry as i32);
            }
            w.put_call(to);
        });
    } else if spec.records.sample {
        // Count down to the next sample in this thread's row (K = r11);
        // the call of the runtime is out of line.
        w.put_sub_mem_imm8(Reg::R11, countdown_disp(spec), 1, spec.abi != Abi::C);
        w.put_jb(l.sample);
    } else if let Some(layout) = fast {
        // The fast entry, with S (r10) the thread's cache entry.
        fast::event(w, &layout, spec.entry_word, &event_exits(l));
    } else if spec.records.args || spec.records.ret {
        if spec.go_room_lost.is_some() {
            // Go code without a stack check: the call only where the
            // goroutine's stack (its lowest address at g, r14) has room.
            w.put_mov_reg(s, Reg::Rsp);
            w.put_sub_reg_mem(s, Reg::R14, 0);
            w.put_cmp_reg_imm(s, GO_ROOM as i32);
            w.put_jb(l.no_room);
        }
        emit_entry_call(w, spec, l, rt, saves);
    }
    w.bind(l.restore);
    if saves.flags {
        w.put_flags_from_rax();
    }
    for &r in saves.pushed().iter().rev() {
        w.put_pop(r);
    }
    if saves.red_zone {
        w.put_lea_short(Reg::Rsp, Reg::Rsp, RED_ZONE);
    }
}

/// Bytes of the goroutine's stack below the stack pointer that an event
/// detour of Go code without a stack check needs before it calls the
/// runtime: the eight registers it saves, and what the call may write below
/// them (the arguments' copy, the runtime's frames and red zone).
const GO_ROOM: u32 = 64 + super::CLEARED_BELOW + 64;

/// What follows the relocated code (which never falls through into it):
/// the count in the entry paired with the thread's, else the call of
/// tp_count; a fast event probe's fallbacks, to `tp_entry`; a sampling
/// probe's call of the runtime, which returns to the restore; and the count
/// of an entry of Go code skipped for want of room. Binds `way1`, `slow`,
/// `sample`, `no_room` and the fallbacks.
fn emit_tail(
    w: &mut Writer,
    spec: &DetourSpec,
    fast: Option<RuntimeLayout>,
    rt: RuntimeAddrs,
    saves: Saves,
    l: &Labels,
) {
    w.bind(l.way1);
    if spec.abi == Abi::C {
        let disp = (spec.probe_index * 8) as i32;
        fast::paired_entry(w, saves.s, saves.k, l.slow.into());
        if fast.is_some() {
            w.put_jmp(l.found);
        } else {
            w.put_load(saves.k, saves.s, thread_cache::ROW);
            w.put_inc_mem(saves.k, disp, false);
            w.put_jmp(l.counted);
        }
        w.bind(l.slow);
        w.put_push_imm32(spec.probe_index as i32);
        w.put_call(rt.count);
        w.put_pop(saves.k);
        // The return address into this detour, which the count stub left
        // below its argument (the stub clears below that itself).
        w.put_store_imm(Reg::Rsp, -16, 0);
        w.put_jmp(if fast.is_some() { l.back.call } else { l.counted });
    }
    if let Some(layout) = fast {
        fast::event_full(w, &layout, spec.entry_word, &event_exits(l));
        w.bind(l.back.call);
        emit_entry_call(w, spec, l, rt, saves);
        w.put_jmp(l.restore);
    }
    w.bind(l.sample);
    if spec.records.sample {
        emit_entry_call(w, spec, l, rt, saves);
        w.put_jmp(l.restore);
    }
    w.bind(l.no_room);
    if spec.go_room_lost.is_some() {
        w.put_mov_reg_rip(saves.s, l.lost_room);
        w.put_inc_mem(saves.s, 0, true);
        w.put_jmp(l.restore);
    }
}

/// A fast event probe's fallbacks.
#[derive(Clone, Copy)]
struct Fallbacks {
    unmark: Label,
    full: Label,
    call: Label,
}

/// Where the fast entry of a detour goes back to it.
fn event_exits(l: &Labels) -> fast::EventExits {
    fast::EventExits { full: l.back.full, unmark: l.back.unmark, call: l.back.call, lit_tramp: l.tramp, lit_ctx: l.ctx }
}

/// The layout for the fast entry if the detour records with it: an event
/// probe at a C function's entry (the stack 8 mod 16, the return address
/// at rsp, the arguments in their registers) that calls the plain runtime.
fn fast_event(plan: &SitePlan, spec: &DetourSpec) -> Option<RuntimeLayout> {
    let event = spec.records.args || spec.records.ret;
    let plain = !spec.records.sample
        && !spec.records.unwind
        && !spec.records.rendezvous
        && !spec.records.step
        && spec.operands.is_none()
        && !plan.interior;
    spec.layout.filter(|_| event && plain && spec.abi == Abi::C)
}

/// Bytes the Go ABI's copy of its nine argument registers takes on the
/// stack (ten words: the stack stays 16-aligned).
pub(super) const GO_ARGS: i32 = 80;

/// The call of `tp_entry` of an event probe. Its registers argument points
/// at the six integer argument registers the function's ABI passes first:
/// rdi, rsi, rdx, rcx, r8, r9 where `call_runtime` saved them (C), or a copy
/// of rax, rbx, rcx, rdi, rsi, r8, r9, r10, r11 below them (Go's internal ABI),
/// or the operands of a static probe pushed below them.
fn emit_entry_call(w: &mut Writer, spec: &DetourSpec, l: &Labels, rt: RuntimeAddrs, saves: Saves) {
    let flags = spec.entry_word;
    call_runtime(w, |w| {
        let extra = if let Some(ops) = &spec.operands {
            // The site's rax, r11 and r10 as the prefix pushed them, above
            // the eight saved registers; its rsp above them (and above the
            // red zone a site inside a function steps over).
            let frame = Frame { rax: 64 + 16, r11: 64 + 8, r10: 64, rsp: 64 + SAVED + saves.red_zone_bytes() };
            operands::push(w, ops, frame)
        } else if spec.abi == Abi::Go {
            // The nine registers in the ABI's order, first lowest: rax, r10
            // and r11 as the prefix saved them, above the eight registers
            // call_runtime saved (rax free now: its copy of the flags is
            // there too); rbx, which C code preserves, is still the
            // function's. A tenth word keeps the stack 16-aligned.
            w.put_sub_imm8(Reg::Rsp, GO_ARGS as i8);
            let prefix = |r: i32| GO_ARGS + 64 + r;
            w.put_load(Reg::Rax, Reg::Rsp, prefix(16));
            w.put_store(Reg::Rax, Reg::Rsp, 0);
            for (k, r) in [Reg::Rbx, Reg::Rcx, Reg::Rdi, Reg::Rsi, Reg::R8, Reg::R9].into_iter().enumerate() {
                w.put_store(r, Reg::Rsp, 8 * (k as i32 + 1));
            }
            w.put_load(Reg::Rax, Reg::Rsp, prefix(0));
            w.put_store(Reg::Rax, Reg::Rsp, 56);
            w.put_load(Reg::Rax, Reg::Rsp, prefix(8));
            w.put_store(Reg::Rax, Reg::Rsp, 64);
            GO_ARGS
        } else {
            0
        };
        // tp_entry(ctx, probe | flags, saved registers, return-address slot, trampoline, countdown)
        w.put_mov_reg_rip(Reg::Rdi, l.ctx);
        w.put_mov32_imm(Reg::Rsi, flags);
        w.put_mov_reg(Reg::Rdx, Reg::Rsp);
        w.put_lea_short(Reg::Rcx, Reg::Rsp, extra + 64 + SAVED + spec.sp_below_entry as i32);
        if spec.records.ret && spec.exit_words.is_some() && spec.abi == Abi::Go {
            // A call of Go code timed at its exits is its goroutine's.
            w.put_mov_reg(Reg::R8, Reg::R14);
        } else if spec.records.ret {
            w.put_mov_reg_rip(Reg::R8, l.tramp);
        } else {
            w.put_zero32(Reg::R8);
        }
        if spec.records.sample {
            // r11 still holds this thread's counter row (Go: the shared one).
            w.put_lea(Reg::R9, Reg::R11, countdown_disp(spec));
        }
        if saves.red_zone {
            // The stack pointer's alignment inside a function is unknown.
            w.put_align_stack_and_call(rt.entry);
        } else {
            w.put_call(rt.entry);
        }
        if extra != 0 {
            w.put_add_imm8(Reg::Rsp, extra as i8);
        }
    });
}

/// Displacement from a counter row to the probe's countdown in that row.
fn countdown_disp(spec: &DetourSpec) -> i32 {
    (spec.countdowns_from_counters + spec.probe_index as u64 * 8) as i32
}

/// Saves rdi, rsi, rdx, rcx, r8, r9, rax, r10 (in that order upwards from
/// rsp), runs `call`, and restores them. The saved rax holds the status
/// flags (see the module doc). At entry rsp was 8 mod 16; the three words
/// of the prefix and eight pushes make it 0 mod 16, as a call needs.
fn call_runtime(w: &mut Writer, call: impl FnOnce(&mut Writer)) {
    for r in [Reg::R10, Reg::Rax, Reg::R9, Reg::R8, Reg::Rcx, Reg::Rdx, Reg::Rsi, Reg::Rdi] {
        w.put_push(r);
    }
    call(w);
    // What the call left below the stack pointer: the runtime's spills and
    // the return address into this detour (see runtime_block.rs).
    w.put_clear_below_rsp(super::CLEARED_BELOW);
    for r in [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9, Reg::Rax, Reg::R10] {
        w.put_pop(r);
    }
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
    /// The runtime's flags (layout::entry_flags): the detour passes
    /// whatever word it is given.
    const RECORD_ENTRY: u32 = 1 << 24;
    const HIJACK_RETURN: u32 = 1 << 25;
    const SAMPLE: u32 = 1 << 26;
    const ARGS_RET: Records = Records { args: true, ret: true, ..Records::COUNT };

    fn spec() -> DetourSpec {
        DetourSpec {
            probe_index: 3,
            records: Records::COUNT,
            entry_word: 3,
            runtime: Some(runtime()),
            flag_addr: 0x7f00_0000_2003,
            counters: 0x7f00_0001_0000,
            cache: 0x7f10_0000_0020,
            countdowns_from_counters: 0x20_0000,
            slot_bits: 6,
            stride_shift: 15,
            abi: Abi::C,
            return_saved_below: None,
            operands: None,
            layout: Some(fast::example_layout()),
            exit_words: None,
            sp_below_entry: 0,
            go_room_lost: None,
        }
    }

    fn runtime() -> RuntimeAddrs {
        RuntimeAddrs {
            entry: AT + 0x100,
            trampoline: AT + 0x800,
            unwind: AT + 0x600,
            rendezvous: AT + 0x680,
            step: AT + 0x6c0,
            trap: 0,
            trap_return: 0,
            entry_ext: AT + 0x200,
            trampoline_ext: AT + 0x880,
            exit: AT + 0x900,
            exit_tail: AT + 0x900,
            exit_runtime: AT + 0x900,
            count: AT + 0x700,
            ctx: 0x7f00_0000_0100,
        }
    }

    /// push rbp; mov rbp, rsp; push rbx; mov rbx, rsi: nothing dead.
    const PROLOGUE: [u8; 9] = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x89, 0xf3, 0xc3];

    /// The count of probe 3 with scratch registers `s` and `k`, from the
    /// load of the word at fs:0 to the increment.
    fn count(s: &str, s32: &str, k: &str, k32: &str) -> Vec<String> {
        vec![
            format!("mov {k}, qword ptr fs:[0]"),
            format!("imul {s32}, {k32}, 0x9e3779b1"),
            format!("shr {s32}, 0x14"),
            format!("and {s32}, 0xfe0"),
            format!("add {s}, qword ptr [rip + "),
            format!("not {k}"),
            format!("cmp {k}, qword ptr [{s}]"),
            "jne ".into(),
            format!("mov {k}, qword ptr [{s} + 8]"),
            format!("inc qword ptr [{k} + 0x18]"),
        ]
    }

    /// The count in the entry paired with the thread's, out of line.
    fn paired(s: &str, k: &str) -> Vec<String> {
        vec![
            format!("xor {s}, 0x20"),
            format!("cmp {k}, qword ptr [{s}]"),
            "jne ".into(),
            format!("mov {k}, qword ptr [{s} + 8]"),
            format!("inc qword ptr [{k} + 0x18]"),
            "jmp ".into(),
        ]
    }

    /// Checks `asm` against `expected`, where an expected line may be a prefix.
    fn check(asm: &[String], expected: &[String]) {
        assert!(asm.len() >= expected.len(), "{asm:#?}");
        for (a, e) in asm.iter().zip(expected) {
            assert!(a.starts_with(e.as_str()), "`{a}` is not `{e}…` in {asm:#?}");
        }
    }

    fn literal(d: &Detour, k: usize) -> u64 {
        let lits = d.bytes.len() - 40;
        u64::from_le_bytes(d.bytes[lits + 8 * k..lits + 8 * k + 8].try_into().unwrap())
    }

    /// The address of the `k`th instruction of detour `d` (built at AT).
    fn address_of(d: &Detour, k: usize) -> u64 {
        let decoder = iced_x86::Decoder::with_ip(64, &d.bytes, AT, iced_x86::DecoderOptions::NONE);
        decoder.into_iter().nth(k).unwrap().ip()
    }

    fn target(insn: &str) -> u64 {
        u64::from_str_radix(insn.rsplit_once("0x").unwrap().1, 16).unwrap()
    }

    #[test]
    fn detour_counts_in_the_threads_row_then_runs_the_window_and_jumps_back() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let d = build(&plan, AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let mut expected: Vec<String> =
            ["push rax", "push r11", "push r10", "lahf", "seto al", "mov r11, qword ptr [rip + "]
                .map(String::from)
                .to_vec();
        expected.extend(["cmp byte ptr [r11], 0".into(), "je ".into()]);
        expected.extend(count("r11", "r11d", "r10", "r10d"));
        expected.extend(["add al, 0x7f", "sahf", "pop r10", "pop r11", "pop rax"].map(String::from));
        expected.extend(["push rbp", "mov rbp, rsp", "push rbx", &format!("jmp {:#x}", SITE + 5)].map(String::from));
        expected.extend(paired("r11", "r10"));
        let call = format!("call {:#x}", runtime().count);
        // The return address into the detour, cleared once the stub is back.
        expected.extend(["push 3", &call, "pop r10", "mov qword ptr [rsp - 0x10], 0", "jmp "].map(String::from));
        check(&asm, &expected);
        // The disabled probe and the count both end at the restore; the
        // runtime's count comes back after the increment.
        let restore = d.map_pc(0).unwrap() - 8;
        assert_eq!(target(&asm[7]), restore);
        assert_eq!(target(&asm[15]), d.map_pc(5).unwrap() + 5, "jne to the paired entry");
        assert_eq!(target(&asm[29]), address_of(&d, 33), "then to the call of tp_count");
        assert_eq!((target(&asm[32]), target(&asm[37])), (restore, restore), "back to what follows the count");
        assert_eq!((literal(&d, 0), literal(&d, 1), literal(&d, 2)), (spec().flag_addr, spec().counters, spec().cache));
        // Threads in the window map to their relocated instruction; the end to the jmp back.
        let relocated = d.map_pc(0).unwrap();
        assert_eq!(asm[23], "push rbp");
        assert_eq!(
            (d.map_pc(1), d.map_pc(4), d.map_pc(5)),
            (Some(relocated + 1), Some(relocated + 4), Some(relocated + 5))
        );
    }

    #[test]
    fn a_counting_detour_saves_only_what_the_window_does_not_overwrite() {
        // imul eax, edi, 0x9e3779b1 (targets/hot.c): rax and the flags are
        // dead; rax is S, r11 is K, pushed.
        let imul = [0x69, 0xc7, 0xb1, 0x79, 0x37, 0x9e, 0xc3];
        let d = build(&window::plan(&imul, SITE, &[]).unwrap(), AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let mut expected = vec![
            "push r11".to_string(),
            "mov rax, qword ptr [rip + ".into(),
            "cmp byte ptr [rax], 0".into(),
            "je ".into(),
        ];
        expected.extend(count("rax", "eax", "r11", "r11d"));
        expected.extend(["pop r11".into(), "imul eax, edi, 0x9e3779b1".into(), format!("jmp {:#x}", SITE + 6)]);
        expected.extend(paired("rax", "r11"));
        expected.extend(["push 3".to_string(), format!("call {:#x}", runtime().count), "pop r11".into()]);
        check(&asm, &expected);
        // xor ecx, ecx; mov eax, 1 (7 bytes): two registers and the flags dead: nothing saved.
        let two = [0x31, 0xc9, 0xb8, 1, 0, 0, 0, 0xc3];
        let asm = disassemble(&build(&window::plan(&two, SITE, &[]).unwrap(), AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["mov rcx, qword ptr [rip + ", "cmp byte ptr [rcx], 0"].map(String::from));
        check(&asm[3..], &count("rcx", "ecx", "rax", "eax"));
        check(&asm[13..], &["xor ecx, ecx", "mov eax, 1"].map(String::from));
        // mov eax, imm32; ret: rax is dead but the flags live: they go to
        // rax, and r11 and r10 are saved for the count.
        let mov = [0xb8, 0xb1, 0x79, 0x37, 0x9e, 0xc3];
        let asm = disassemble(&build(&window::plan(&mov, SITE, &[]).unwrap(), AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["push r11", "push r10", "lahf", "seto al", "mov r11, qword ptr [rip + "].map(String::from));
        check(&asm[17..], &["add al, 0x7f", "sahf", "pop r10", "pop r11", "mov eax, 0x9e3779b1"].map(String::from));
        // mov eax, imm32; imul rax, rdi: the flags are written after the
        // window, before any read: dead too (work_mov in targets/hot.c).
        let mov_imul = [0xb8, 0xb1, 0x79, 0x37, 0x9e, 0x48, 0x0f, 0xaf, 0xc7, 0xc3];
        let asm = disassemble(&build(&window::plan(&mov_imul, SITE, &[]).unwrap(), AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["push r11", "mov rax, qword ptr [rip + "].map(String::from));
        // lea rcx, [rip + x]: rcx is S, r11 K; rax keeps the flags.
        let load = [0x48, 0x8d, 0x0d, 0x10, 0, 0, 0, 0xc3];
        let asm = disassemble(&build(&window::plan(&load, SITE, &[]).unwrap(), AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["push rax", "push r11", "lahf", "seto al", "mov rcx, qword ptr [rip + "].map(String::from));
        check(&asm[17..], &["add al, 0x7f", "sahf", "pop r11", "pop rax", "lea rcx, [rip + "].map(String::from));
        // mov rcx, [rip + x] may fault before it writes rcx: the full frame.
        let load = [0x48, 0x8b, 0x0d, 0x10, 0, 0, 0, 0xc3];
        let asm = disassemble(&build(&window::plan(&load, SITE, &[]).unwrap(), AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["push rax", "push r11", "push r10", "lahf", "seto al"].map(String::from));
    }

    #[test]
    fn go_code_counts_in_the_shared_row() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let d = build(&plan, AT, &DetourSpec { abi: Abi::Go, ..spec() }).unwrap();
        let asm = disassemble(&d.bytes, AT);
        check(
            &asm[7..],
            &["mov r11, qword ptr [rip + ", "lock inc qword ptr [r11 + 0x18]", "add al, 0x7f"].map(String::from),
        );
        assert!(!asm.iter().any(|i| i.contains("fs:")), "{asm:#?}");
    }

    #[test]
    fn go_code_without_a_stack_check_calls_the_runtime_only_with_room() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let args = Records { args: true, ..Records::COUNT };
        let s = DetourSpec { abi: Abi::Go, records: args, entry_word: 3 | RECORD_ENTRY, ..spec() };
        let lost = 0x7000_1234_5678;
        let d = build(&plan, AT, &DetourSpec { go_room_lost: Some(lost), ..s }).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let at = |i: &str| asm.iter().position(|a| a.starts_with(i)).unwrap_or_else(|| panic!("no {i}: {asm:#?}"));
        // After the count, with r10 free: the stack pointer above g.stack.lo.
        let room = format!("cmp r10, {GO_ROOM:#x}");
        assert!(at("lock inc qword ptr [r10 + 0x18]") + 1 == at("mov r10, rsp"), "{asm:#?}");
        assert!(at("mov r10, rsp") + 1 == at("sub r10, qword ptr [r14]"), "{asm:#?}");
        assert!(at("sub r10, qword ptr [r14]") + 1 == at(&room), "{asm:#?}");
        assert!(at(&room) + 1 == at("jb ") && at("jb ") < at("call "), "{asm:#?}");
        assert!(asm.iter().any(|i| i == "lock inc qword ptr [r10]"), "{asm:#?}");
        assert!(d.bytes.windows(8).any(|w| w == lost.to_le_bytes()), "the count's address is a literal");
        // Without a check, none of it.
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert!(!asm.iter().any(|i| i.contains("[r14]")), "{asm:#?}");
    }

    #[test]
    fn event_detour_counts_then_records_in_its_own_fast_entry() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let flags = 3 | RECORD_ENTRY | HIJACK_RETURN;
        let s = DetourSpec { records: ARGS_RET, entry_word: flags, ..spec() };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        let has = |i: &str| asm.iter().any(|a| a == i);
        // Counted as a counting detour counts, then the thread's ring slot
        // and state, both from its cache entry.
        check(&asm[8..18], &count("r10", "r10d", "r11", "r11d"));
        assert_eq!(asm[18..20], ["mov r11, qword ptr [r10 + 0x18]", "mov r10, qword ptr [r10 + 0x10]"]);
        // Its depth and its writing mark.
        assert_eq!(asm[20], "cmp dword ptr [r10 + 0x18], 0");
        assert_eq!(asm[22], "cmp dword ptr [r10 + 0x1c], 0");
        assert_eq!(asm[24..27], ["push rcx", "push rdx", "push rax"]);
        // The TID from the thread's TCB, at the offset the context holds.
        let tid = asm.iter().position(|i| i == "movsxd rdx, dword ptr [rdx + 0x44]").expect("the TID's offset");
        assert!(asm[tid - 1].starts_with("mov rdx, qword ptr [rip + "), "the context: {asm:#?}");
        assert_eq!(
            asm[tid + 1..tid + 4],
            ["add rdx, qword ptr fs:[0]", "mov edx, dword ptr [rdx]", "mov dword ptr [rcx + 4], edx"]
        );
        // The event, straight from the argument registers (rcx from where it
        // was pushed), with its probe and kind.
        for (k, r) in [(0, "rdi"), (1, "rsi"), (2, "rdx"), (4, "r8"), (5, "r9")] {
            assert!(has(&format!("mov qword ptr [rcx + {:#x}], {r}", 16 + 8 * k)), "{r}: {asm:#?}");
        }
        let rcx = asm.iter().position(|i| i == "mov rax, qword ptr [rsp + 0x10]").expect("rcx read back");
        assert_eq!(asm[rcx + 1], "mov qword ptr [rcx + 0x28], rax");
        assert!(has("mov dword ptr [rcx], 0x1000003"), "{asm:#?}");
        assert!(has("cmp rcx, qword ptr [r11 + 0x10]"), "the head against the slot's limit: {asm:#?}");
        assert!(has("inc qword ptr [r11 + 0x40]"), "the head, published: {asm:#?}");
        // The frame: its slot before and after the depth that publishes it,
        // and its sum of timed callees cleared before.
        let depth = asm.iter().position(|i| i == "mov dword ptr [r10 + 0x18], 1").expect("the depth");
        assert_eq!(asm[depth - 2], "mov qword ptr [r10 + 0x40], rdx");
        assert_eq!(asm[depth - 1], "mov qword ptr [r10 + 0x78], 0");
        assert_eq!(asm[depth + 1], "mov qword ptr [r10 + 0x40], rdx");
        assert_eq!(asm[depth - 3], "lea rdx, [rsp + 0x30]", "the return address above six pushes");
        assert!(has("mov qword ptr [rsp + 0x30], rdx"), "the trampoline in its place: {asm:#?}");
        assert_eq!(asm.iter().filter(|i| *i == "rdtsc").count(), 1, "one timestamp for the event and the frame");
        // The fallbacks: the count stub, then tp_entry with the word.
        assert!(has(&format!("call {:#x}", runtime().count)));
        let call = asm.iter().position(|i| *i == format!("call {:#x}", runtime().entry)).expect("tp_entry");
        assert_eq!(asm[call - 4], format!("mov esi, {flags:#x}"));
        assert!(!asm.iter().any(|i| i.starts_with("push 0x")), "{asm:#?}");
    }

    #[test]
    fn an_entry_event_alone_pushes_no_frame_and_a_return_alone_no_event() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let args = Records { args: true, ..Records::COUNT };
        let d = build(&plan, AT, &DetourSpec { records: args, entry_word: 3 | RECORD_ENTRY, ..spec() }).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert!(asm.iter().any(|i| i == "mov qword ptr [rax + 0x10], rdi"), "{asm:#?}");
        assert!(!asm.iter().any(|i| i.contains("[r10 + 0x18], 1") || i.contains("[rsp + 0x28]")), "{asm:#?}");
        // Its timestamp first, the function's rdx read back from the stack.
        let at = |i: &str| asm.iter().position(|a| a == i).unwrap_or_else(|| panic!("no {i}: {asm:#?}"));
        assert!(at("rdtsc") < at("mov qword ptr [rax + 0x10], rdi"));
        assert!(at("mov rdx, qword ptr [rsp + 8]") < at("mov qword ptr [rax + 0x20], rdx"));
        let ret = Records { ret: true, ..Records::COUNT };
        let d = build(&plan, AT, &DetourSpec { records: ret, entry_word: 3 | HIJACK_RETURN, ..spec() }).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert!(!asm.iter().any(|i| i.ends_with("], rdi")), "{asm:#?}");
        assert!(asm.iter().any(|i| i == "mov qword ptr [rsp + 0x28], rdx"), "above five pushes: {asm:#?}");
    }

    #[test]
    fn without_the_layout_an_event_detour_calls_tp_entry() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { records: ARGS_RET, entry_word: 3 | RECORD_ENTRY | HIJACK_RETURN, layout: None, ..spec() };
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert!(!asm.iter().any(|i| i == "rdtsc"), "{asm:#?}");
        assert!(asm.iter().any(|i| *i == format!("call {:#x}", runtime().entry)), "{asm:#?}");
    }

    #[test]
    fn go_event_detour_saves_registers_and_calls_tp_entry() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { records: ARGS_RET, entry_word: 3 | RECORD_ENTRY | HIJACK_RETURN, abi: Abi::Go, ..spec() };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[9], "lock inc qword ptr [r10 + 0x18]", "events still count, in the shared row");
        let saves = ["push r10", "push rax", "push r9", "push r8", "push rcx", "push rdx", "push rsi", "push rdi"];
        assert_eq!(asm[10..18], saves);
        // Go's nine argument registers, copied below them in the ABI's order:
        // rax (as the prefix saved it), rbx, rcx, rdi, rsi, r8, r9, then r10
        // and r11 as the prefix saved them.
        let copy = [
            "sub rsp, 0x50",
            "mov rax, qword ptr [rsp + 0xa0]",
            "mov qword ptr [rsp], rax",
            "mov qword ptr [rsp + 8], rbx",
            "mov qword ptr [rsp + 0x10], rcx",
            "mov qword ptr [rsp + 0x18], rdi",
            "mov qword ptr [rsp + 0x20], rsi",
            "mov qword ptr [rsp + 0x28], r8",
            "mov qword ptr [rsp + 0x30], r9",
            "mov rax, qword ptr [rsp + 0x90]",
            "mov qword ptr [rsp + 0x38], rax",
            "mov rax, qword ptr [rsp + 0x98]",
            "mov qword ptr [rsp + 0x40], rax",
        ];
        assert_eq!(asm[18..31], copy);
        assert!(asm[31].starts_with("mov rdi, qword ptr [rip + "));
        let flags = 3 | RECORD_ENTRY | HIJACK_RETURN;
        assert_eq!(asm[32], format!("mov esi, {flags:#x}"));
        // The return address sits above the copy, the eight saved registers
        // and the prefix's r10, r11 and rax.
        assert_eq!(asm[33..35], ["mov rdx, rsp", "lea rcx, [rsp + 0xa8]"]);
        assert!(asm[35].starts_with("mov r8, qword ptr [rip + "));
        assert_eq!(asm[36], format!("call {:#x}", runtime().entry));
        assert_eq!(asm[37], "add rsp, 0x50");
        super::super::runtime_block::tests::assert_clears_below(&asm[38..46]);
        let restores = ["pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop r8", "pop r9", "pop rax", "pop r10"];
        assert_eq!(asm[46..54], restores);
        assert_eq!(asm[54..59], ["add al, 0x7f", "sahf", "pop r10", "pop r11", "pop rax"]);
        // The je of a disabled probe skips the count and the call, straight to the restore.
        assert_eq!(target(&asm[7]), d.map_pc(0).unwrap() - 8);
        assert_eq!((literal(&d, 3), literal(&d, 4)), (runtime().ctx, runtime().trampoline));
    }

    #[test]
    fn sampling_detour_counts_down_to_its_next_sample() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec {
            records: Records { ret: true, sample: true, ..Records::COUNT },
            entry_word: 3 | HIJACK_RETURN | SAMPLE,
            ..spec()
        };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        check(&asm[8..18], &count("r10", "r10d", "r11", "r11d"));
        // The countdown of probe 3 in the same row, 2 MiB on.
        assert_eq!(asm[18], "sub qword ptr [r11 + 0x200018], 1");
        // A borrow (the countdown was 0) jumps out of line to the call;
        // otherwise on to the restore of rax, r11, r10 and the flags.
        let sample = target(&asm[19]);
        assert_eq!(asm[20..25], ["add al, 0x7f", "sahf", "pop r10", "pop r11", "pop rax"]);
        assert_eq!(asm[25..29], ["push rbp", "mov rbp, rsp", "push rbx", &format!("jmp {:#x}", SITE + 5)]);
        // The paired entry, then tp_count, leave the row in r11 and come
        // back to the countdown.
        check(&asm[29..35], &paired("r10", "r11"));
        assert_eq!(
            asm[35..39],
            ["push 3", &format!("call {:#x}", runtime().count), "pop r11", "mov qword ptr [rsp - 0x10], 0"]
        );
        assert_eq!((target(&asm[34]), target(&asm[39])), (address_of(&d, 18), address_of(&d, 18)));
        // The sample block follows.
        let block = disassemble(&d.bytes[(sample - AT) as usize..], sample);
        assert_eq!(block[0], "push r10");
        let flags = 3 | HIJACK_RETURN | SAMPLE;
        assert_eq!(block[9], format!("mov esi, {flags:#x}"));
        assert_eq!(block[10..12], ["mov rdx, rsp", "lea rcx, [rsp + 0x58]"]);
        assert_eq!(block[13], "lea r9, [r11 + 0x200018]", "the countdown, for the runtime to reset");
        assert_eq!(block[14], format!("call {:#x}", runtime().entry));
        super::super::runtime_block::tests::assert_clears_below(&block[15..23]);
        assert_eq!(target(&block[31]), d.map_pc(0).unwrap() - 8, "back to the restore");
    }

    #[test]
    fn entry_only_go_event_passes_no_trampoline() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec {
            records: Records { args: true, ..Records::COUNT },
            entry_word: 3 | RECORD_ENTRY,
            abi: Abi::Go,
            ..spec()
        };
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert_eq!(asm[32], format!("mov esi, {:#x}", 3 | RECORD_ENTRY));
        assert_eq!(asm[35], "xor r8d, r8d");
    }

    #[test]
    fn unwinder_probe_calls_tp_unwind() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { records: Records { unwind: true, ..Records::COUNT }, ..spec() };
        let asm = disassemble(&build(&plan, AT, &s).unwrap().bytes, AT);
        assert!(asm[26].starts_with("mov rdi, qword ptr [rip + "));
        assert_eq!(asm[27], format!("call {:#x}", runtime().unwind));
    }

    #[test]
    fn interior_detours_step_over_the_red_zone() {
        let plan = SitePlan { interior: true, ..window::plan(&PROLOGUE, SITE, &[]).unwrap() };
        let d = build(&plan, AT, &spec()).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert_eq!(asm[0], "lea rsp, [rsp - 0x80]");
        assert_eq!(asm[1..4], ["push rax", "push r11", "push r10"]);
        let restore = asm.iter().position(|l| l == "add al, 0x7f").unwrap();
        assert_eq!(
            asm[restore..restore + 6],
            ["add al, 0x7f", "sahf", "pop r10", "pop r11", "pop rax", "lea rsp, [rsp + 0x80]"]
        );
        assert_eq!(asm[restore + 6..restore + 9], ["push rbp", "mov rbp, rsp", "push rbx"]);
        // A disabled probe, the count and the runtime's count all step back over the red zone.
        assert_eq!(target(&asm[8]), address_of(&d, restore));
        let backs: Vec<u64> = asm.iter().filter(|l| l.starts_with("jmp 0x")).map(|l| target(l)).collect();
        assert!(backs.iter().filter(|&&t| t == address_of(&d, restore)).count() == 2, "{asm:#?}");
        // A count whose registers are dead pushes nothing, yet steps over the red zone:
        // the runtime's count pushes the probe and calls.
        let two = [0x31, 0xc9, 0xb8, 1, 0, 0, 0, 0xc3];
        let plan = SitePlan { interior: true, ..window::plan(&two, SITE, &[]).unwrap() };
        let asm = disassemble(&build(&plan, AT, &spec()).unwrap().bytes, AT);
        check(&asm, &["lea rsp, [rsp - 0x80]", "mov rcx, qword ptr [rip + "].map(String::from));
        check(&asm[14..], &["lea rsp, [rsp + 0x80]", "xor ecx, ecx", "mov eax, 1"].map(String::from));
    }

    #[test]
    fn a_static_probe_event_records_its_operands_with_the_stack_aligned() {
        use crate::arch::{Operand, OperandLoc, Operands};
        let plan = SitePlan { interior: true, ..window::plan(&PROLOGUE, SITE, &[]).unwrap() };
        let ops = [
            Operand { size: 8, signed: false, loc: OperandLoc::Register(Reg::Rdi.num()) },
            Operand { size: 4, signed: true, loc: OperandLoc::Register(Reg::Rax.num()) },
            Operand { size: 8, signed: false, loc: OperandLoc::Register(Reg::R10.num()) },
        ];
        let s = DetourSpec {
            records: Records { args: true, ..Records::COUNT },
            entry_word: 3 | RECORD_ENTRY,
            operands: Some(Operands::new(&ops)),
            ..spec()
        };
        let d = build(&plan, AT, &s).unwrap();
        let asm = disassemble(&d.bytes, AT);
        assert!(!asm.iter().any(|l| *l == "rdtsc"), "no fast entry: {asm:#?}");
        check(&asm[9..], &count("r10", "r10d", "r11", "r11d"));
        let zeros = asm.iter().position(|l| l == "push 0").unwrap();
        // Three unused words, then r10, rax and rdi as the prefix saved them
        // (64 and 80 bytes up, past the eight saved registers) or as they are.
        assert_eq!(asm[zeros..zeros + 3], ["push 0", "push 0", "push 0"]);
        assert_eq!(
            asm[zeros + 3..zeros + 9],
            [
                "mov rax, qword ptr [rsp + 0x58]",
                "push rax",
                "mov rax, qword ptr [rsp + 0x70]",
                "push rax",
                "mov rax, rdi",
                "push rax"
            ]
        );
        let call = asm.iter().position(|l| *l == format!("call {:#x}", runtime().entry)).unwrap();
        assert_eq!(asm[call - 4..call], ["mov rax, rsp", "and rsp, 0xfffffffffffffff0", "push rax", "push rax"]);
        assert_eq!(asm[call + 1..call + 3], ["pop rsp", "add rsp, 0x30"]);
        assert!(asm[zeros + 9..call].contains(&"mov rdx, rsp".to_string()), "{asm:#?}");
        // At a function's entry too, a static probe's event loads its operands.
        let entry = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let asm = disassemble(&build(&entry, AT, &s).unwrap().bytes, AT);
        assert!(asm.contains(&format!("call {:#x}", runtime().entry)), "{asm:#?}");
        assert!(!asm.iter().any(|l| *l == "rdtsc"), "no fast entry: {asm:#?}");
    }

    #[test]
    fn a_probe_without_runtime_is_refused() {
        let plan = window::plan(&PROLOGUE, SITE, &[]).unwrap();
        let s = DetourSpec { runtime: None, ..spec() };
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
    fn the_cache_index_spreads_typical_thread_pointers() {
        // glibc thread pointers sit one stack (8 MiB by default) plus a
        // guard page apart; musl's 128 KiB stacks; 64 KiB-aligned blocks.
        for stride in [(8 << 20) + 4096, (2 << 20) + 4096, 0x80_1000, 0x2_1000, 0x1_0000] {
            let entries: std::collections::BTreeSet<u64> =
                (0..16).map(|i| crate::layout::cache_index(0x7f12_3400_0740 + i * stride)).collect();
            assert!(entries.len() >= 14, "stride {stride:#x}: {entries:?}");
        }
    }
}
