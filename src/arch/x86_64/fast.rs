//! The x86-64 fast paths of the runtime's function entry and exit, written
//! by hand into the runtime block: what an event probe runs on a hit in the
//! common case, without the C runtime's calling convention (saving every
//! register a C function may clobber, a second copy of the arguments, the
//! callee-saved registers the compiler spills). Anything else falls back to
//! `tp_entry` and `tp_exit` in runtime.c, which stay the one description of
//! what an event probe does; each fast path does exactly what they do in
//! its case, and documents which case that is.
//!
//! Both find the thread's state in the thread cache of the private area
//! (see [`crate::arch::cache`]), which the runtime fills for a thread whose
//! word at fs:0 is its key and that counts in a row of its own, in this
//! process (a fork wipes it, so a state found there has been taken in this
//! process).
//!
//! **Entry** (called by an event detour of a C function, which does not
//! count the call itself, with the word `probe | flags` pushed): it counts
//! the call in the thread's row; then, when the thread has no timed call
//! live (depth 0) and, to record the entry, a ring slot with room, it writes
//! the event straight from the argument registers, pushes the shadow frame
//! if the probe times the call, then takes one timestamp for both (after
//! its own work, as `tp_entry` starts a timed call), and publishes the
//! event; else it calls the count stub (`tp_count`), unless it counted
//! already, and `tp_entry` as the detours did:
//!
//! ```text
//! event:  push rax, r10, rbx, rdx, rcx   ; rax holds the detour's flags
//!         rbx = the thread's cache entry (or the one paired with it), else slow
//!         r11 = its state, rax = its row
//!         inc  qword [rax + 8 * probe]
//!         cmp  dword [r11 + depth], 0 ; jne counted
//!         test word, RECORD_ENTRY ; je no_event
//!         mov  r10, [r11 + ring] ; test r10, r10 ; je counted
//!         mov  rbx, [r10 + head] ; (head - cached_tail > mask: counted)
//!         rcx = the event at head: rdi, rsi, rdx, rcx, r8, r9, TID, probe | ENTRY
//!         jmp  frame
//! no_event: xor ecx, ecx
//! frame:  test word, HIJACK_RETURN ; je stamp
//!         shadow[0] = slot, *slot, probe, trampoline, t->overhead
//! stamp:  rdtsc                          ; the entry's time
//!         event->tsc = it ; head + 1     ; published
//!         shadow[0].tsc = it ; depth = 1 ; *slot = trampoline
//!         pop rcx, rdx, rbx, r10, rax ; ret
//! slow:   <pop; call the count stub> ; jmp call
//! counted: <pop>
//! call:   <push the eight registers; tp_entry(ctx, word, registers,
//!         slot, trampoline, 0); pop> ; ret
//! ```
//!
//! **Exit** (the trampoline a timed call returns to): when the returning
//! call is the thread's only timed one (depth 1, its frame's slot the word
//! below the stack pointer) and its ring has room, it takes the timestamp,
//! pops the frame, writes the exit event (return value, entry time, second
//! return register, ticks in tp's probes of its callees) and returns to
//! the original address; else it restores what it touched and goes on to
//! the trampoline that calls `tp_exit`:
//!
//! ```text
//! tramp:  lea  rsp, [rsp - 8]            ; where the return address goes
//!         push rax ; lahf ; seto al ; push rax
//!         push rdx, r10, r11, rbx, rcx
//!         rdtsc ; rcx = the time
//!         <r11 = the thread's state, from its cache entry (or the paired one), else slow>
//!         depth == 1, shadow[0].slot == rsp + 56, ring with room, else slow
//!         depth = 0 ; the event ; head + 1
//!         [rsp + 56] = shadow[0].ret
//!         pop rcx, rbx, r11, r10, rdx ; pop rax ; add al, 0x7f ; sahf ; pop rax
//!         lea  rsp, [rsp + 8] ; jmp [rsp - 8]  ; to the original return address
//! slow:   <pop, as above> ; lea rsp, [rsp + 8] ; jmp the full trampoline
//! ```

use super::writer::Writer;
use crate::arch::{RuntimeLayout, cache};

pub(super) const RAX: u8 = 0;
pub(super) const RCX: u8 = 1;
pub(super) const RDX: u8 = 2;
pub(super) const RBX: u8 = 3;
pub(super) const RSP: u8 = 4;
pub(super) const RSI: u8 = 6;
pub(super) const RDI: u8 = 7;
pub(super) const R8: u8 = 8;
pub(super) const R9: u8 = 9;
pub(super) const R10: u8 = 10;
pub(super) const R11: u8 = 11;

/// Addresses in the runtime block the fast paths refer to, found by a
/// first assembly (every instruction has a fixed length).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Marks {
    /// `tp_entry` (the C runtime).
    pub tp_entry: u64,
    /// The count stub (which calls `tp_count`).
    pub count_stub: u64,
    /// The trampoline that calls `tp_exit`.
    pub tramp_full: u64,
    /// The fast exit, where a timed call returns: the trampoline.
    pub tramp: u64,
    /// Literals: the context, the thread cache.
    pub lit_ctx: u64,
    /// See [`Marks::lit_ctx`].
    pub lit_cache: u64,
    /// Labels inside the fast paths.
    pub entry_slow: u64,
    /// See [`Marks::entry_slow`].
    pub entry_slow_counted: u64,
    /// See [`Marks::entry_slow`].
    pub entry_frame: u64,
    /// See [`Marks::entry_slow`].
    pub entry_stamp: u64,
    /// See [`Marks::entry_slow`].
    pub entry_no_event: u64,
    /// See [`Marks::entry_slow`].
    pub entry_frame_tsc: u64,
    /// See [`Marks::entry_slow`].
    pub entry_done: u64,
    /// See [`Marks::entry_slow`].
    pub entry_call: u64,
    /// See [`Marks::entry_slow`].
    pub exit_slow: u64,
    /// See [`Marks::entry_slow`].
    pub entry_way1: u64,
    /// See [`Marks::entry_slow`].
    pub entry_found: u64,
    /// See [`Marks::entry_slow`].
    pub exit_way1: u64,
    /// See [`Marks::entry_slow`].
    pub exit_found: u64,
}

impl Marks {
    /// Every mark at `at`: for a first assembly, which only measures.
    pub(super) fn near(at: u64) -> Marks {
        Marks {
            tp_entry: at,
            count_stub: at,
            tramp_full: at,
            tramp: at,
            lit_ctx: at,
            lit_cache: at,
            entry_slow: at,
            entry_slow_counted: at,
            entry_frame: at,
            entry_stamp: at,
            entry_no_event: at,
            entry_frame_tsc: at,
            entry_done: at,
            entry_call: at,
            exit_slow: at,
            entry_way1: at,
            entry_found: at,
            exit_way1: at,
            exit_found: at,
        }
    }
}

/// The literals the fast paths read, in the order [`Marks`] names them.
pub(super) fn literals(l: &RuntimeLayout) -> [u64; 2] {
    [l.ctx, l.cache]
}

/// `entry` = the calling thread's entry in the thread cache, `word` =
/// the complement of the word at fs:0, and a jump to `way1` unless the
/// entry is the thread's ([`paired_entry`] follows there). The same
/// instructions as the counting detours'. An entry is written once, its
/// check last, so once the check matches its other fields may be read.
pub(super) fn cache_entry(w: &mut Writer, entry: u8, word: u8, lit_cache: u64, way1: u64) {
    const _: () = assert!(cache::CHECK == 0);
    w.put_mov_reg_fs0(word);
    w.put_imul32_imm_from(entry, word, cache::HASH);
    w.put_shr32(entry, (32 - cache::BITS - cache::SIZE.trailing_zeros()) as u8);
    w.put_and32_imm(entry, ((1 << cache::BITS) - 1) << cache::SIZE.trailing_zeros());
    w.put_add_reg_rip(entry, lit_cache);
    w.put_not(word);
    w.put_cmp_reg_deref(word, entry);
    w.put_jne(way1);
}

/// At `way1`: the entry paired with the one [`cache_entry`] found (the
/// cache is aligned to two entries); a jump to `miss` unless it is the
/// thread's.
pub(super) fn paired_entry(w: &mut Writer, entry: u8, word: u8, miss: u64) {
    w.put_xor_imm8(entry, cache::SIZE as i8);
    w.put_cmp_reg_deref(word, entry);
    w.put_jne(miss);
}

/// log2 of the event size.
fn event_shift(l: &RuntimeLayout) -> u8 {
    l.event_size.trailing_zeros() as u8
}

/// The offset of field `f` of shadow frame 0 in a thread state.
fn frame0(l: &RuntimeLayout, f: u32) -> i32 {
    (l.thread_shadow + f) as i32
}

/// `ev` = the event at `head` in the ring of the slot at `slot` (`ev`
/// may be `head`).
fn event_at(w: &mut Writer, l: &RuntimeLayout, ev: u8, slot: u8, head: u8) {
    w.put_mov_reg32(ev, head);
    w.put_and32_imm(ev, l.ring_mask);
    w.put_shl64(ev, event_shift(l));
    w.put_lea_indexed(ev, slot, ev, l.slot_ring as i32);
}

/// Jumps to `full` if the ring of the slot at `slot`, whose head is in
/// `head`, may be full (`tmp` is clobbered): the runtime then looks again
/// at the reader's position, or counts the event lost.
fn full_check(w: &mut Writer, l: &RuntimeLayout, slot: u8, head: u8, tmp: u8, full: u64) {
    w.put_mov_reg(tmp, head);
    w.put_sub_reg_mem(tmp, slot, l.slot_cached_tail as i32);
    w.put_cmp_reg_imm(tmp, l.ring_mask as i32);
    w.put_ja(full);
}

/// Registers the fast entry saves (rax holds the detour's flags).
const ENTRY_SAVED: [u8; 5] = [RAX, R10, RBX, RDX, RCX];
/// Where, above the fast entry's stack pointer after its pushes, the word
/// the detour pushed is, and the probed function's return address (above
/// the return into the detour, the word, and the detour's rax, r11, r10).
const ENTRY_WORD: i32 = 5 * 8 + 8;
const ENTRY_SLOT: i32 = ENTRY_WORD + 8 + 24;

/// The fast entry, then its fallbacks to `tp_count` and `tp_entry`.
/// Records the marks it defines in `out`.
pub(super) fn entry(w: &mut Writer, l: &RuntimeLayout, m: &Marks, out: &mut Marks) {
    for r in ENTRY_SAVED {
        w.put_push(r);
    }
    // The thread's state (r11) and its own counter row (rax), from its
    // entry in the thread cache, else the runtime counts and records.
    cache_entry(w, RBX, RAX, m.lit_cache, m.entry_way1);
    out.entry_found = w.pc();
    w.put_load(R11, RBX, cache::THREAD);
    w.put_load(RAX, RBX, cache::ROW);
    // Count the call. (rdx and rcx hold arguments until the event has them.)
    w.put_load32(RBX, RSP, ENTRY_WORD);
    w.put_and32_imm(RBX, l.probe_mask);
    w.put_inc_mem_indexed8(RAX, RBX);
    w.put_cmp32_mem_imm(R11, l.thread_depth as i32, 0);
    w.put_jne(m.entry_slow_counted);
    // rcx: the event, if one is recorded; rbx its position (the head).
    w.put_test32_mem_imm(RSP, ENTRY_WORD, l.record_entry);
    w.put_je(m.entry_no_event);
    w.put_load(R10, R11, l.thread_ring as i32);
    w.put_test_reg(R10);
    w.put_je(m.entry_slow_counted);
    w.put_load(RBX, R10, l.slot_head as i32);
    full_check(w, l, R10, RBX, RAX, m.entry_slow_counted);
    event_at(w, l, RAX, R10, RBX);
    for (k, r) in [RDI, RSI, RDX, RCX, R8, R9].into_iter().enumerate() {
        w.put_store(r, RAX, (l.event_v + 8 * k as u32) as i32);
    }
    w.put_mov_reg(RCX, RAX);
    w.put_load(RDX, R11, l.thread_tid_at as i32);
    w.put_load32(RDX, RDX, 0);
    w.put_store32(RDX, RCX, l.event_tid as i32);
    w.put_load32(RDX, RSP, ENTRY_WORD);
    w.put_and32_imm(RDX, l.probe_mask);
    w.put_or32_imm(RDX, l.entry_kind);
    w.put_store32(RDX, RCX, l.event_probe as i32);
    w.put_jmp(m.entry_frame);
    out.entry_no_event = w.pc();
    w.put_zero32(RCX);
    // Nothing falls back from here on.
    out.entry_frame = w.pc();
    w.put_test32_mem_imm(RSP, ENTRY_WORD, l.hijack_return);
    w.put_je(m.entry_stamp);
    // Shadow frame 0: the return-address slot, what it holds, the probe,
    // the trampoline, the thread's ticks in tp so far.
    w.put_lea(RDX, RSP, ENTRY_SLOT);
    w.put_store(RDX, R11, frame0(l, l.frame_slot));
    w.put_load(RDX, RDX, 0);
    w.put_store(RDX, R11, frame0(l, l.frame_ret));
    w.put_load32(RDX, RSP, ENTRY_WORD);
    w.put_and32_imm(RDX, l.probe_mask);
    w.put_store32(RDX, R11, frame0(l, l.frame_probe));
    w.put_lea_rip(RDX, m.tramp);
    w.put_store(RDX, R11, frame0(l, l.frame_tramp));
    w.put_load(RDX, R11, l.thread_overhead as i32);
    w.put_store(RDX, R11, frame0(l, l.frame_overhead));
    out.entry_stamp = w.pc();
    // One timestamp, after tp's work, for the event and the timed call.
    w.put_rdtsc();
    w.put_shl64(RDX, 32);
    w.put_or_reg(RAX, RDX);
    w.put_test_reg(RCX);
    w.put_je(m.entry_frame_tsc);
    w.put_store(RAX, RCX, l.event_tsc as i32);
    w.put_inc(RBX);
    w.put_store(RBX, R10, l.slot_head as i32); // published
    out.entry_frame_tsc = w.pc();
    w.put_test32_mem_imm(RSP, ENTRY_WORD, l.hijack_return);
    w.put_je(m.entry_done);
    w.put_store(RAX, R11, frame0(l, l.frame_tsc));
    w.put_store32_imm(R11, l.thread_depth as i32, 1);
    w.put_lea_rip(RDX, m.tramp);
    w.put_store(RDX, RSP, ENTRY_SLOT);
    out.entry_done = w.pc();
    for r in ENTRY_SAVED.iter().rev() {
        w.put_pop(*r);
    }
    w.put_ret();

    out.entry_way1 = w.pc();
    paired_entry(w, RBX, RAX, m.entry_slow);
    w.put_jmp(m.entry_found);

    // The fallbacks: the count stub (tp_count) unless the call is counted
    // already, then tp_entry(ctx, word, registers, slot, trampoline, 0),
    // saving the registers as the Go detours do.
    out.entry_slow = w.pc();
    for r in ENTRY_SAVED.iter().rev() {
        w.put_pop(*r);
    }
    w.put_load32(R11, RSP, 8);
    w.put_and32_imm(R11, l.probe_mask);
    w.put_push(R11);
    w.put_call(m.count_stub);
    w.put_pop(R11);
    w.put_jmp(m.entry_call);
    out.entry_slow_counted = w.pc();
    for r in ENTRY_SAVED.iter().rev() {
        w.put_pop(*r);
    }
    out.entry_call = w.pc();
    // At the detour rsp was 8 mod 16; its three pushes, the word, the
    // return address and eight registers make it 0 mod 16.
    for r in [R10, RAX, R9, R8, RCX, RDX, RSI, RDI] {
        w.put_push(r);
    }
    w.put_mov_reg_rip(RDI, m.lit_ctx);
    w.put_load32(RSI, RSP, 64 + 8);
    w.put_mov_reg(RDX, RSP);
    w.put_lea(RCX, RSP, 64 + 8 + 8 + 24);
    w.put_lea_rip(R8, m.tramp);
    w.put_zero32(R9);
    w.put_call(m.tp_entry);
    for r in [RDI, RSI, RDX, RCX, R8, R9, RAX, R10] {
        w.put_pop(r);
    }
    w.put_ret();
}

/// Where, above the fast exit's stack pointer after its pushes, the saved
/// rdx and rax are, and the word where the return address goes (the slot
/// the function's `ret` popped it from).
const EXIT_RDX: i32 = 32;
const EXIT_RAX: i32 = 48;
const EXIT_SLOT: i32 = 56;

/// The fast exit (the trampoline), falling back to the full trampoline at
/// `m.tramp_full`. Records the marks it defines in `out`.
pub(super) fn exit(w: &mut Writer, l: &RuntimeLayout, m: &Marks, out: &mut Marks) {
    w.put_lea(RSP, RSP, -8);
    w.put_push(RAX);
    w.put_push_flags_via_rax();
    for r in [RDX, R10, R11, RBX, RCX] {
        w.put_push(r);
    }
    // The call's end, first.
    w.put_rdtsc();
    w.put_shl64(RDX, 32);
    w.put_or_reg(RAX, RDX);
    w.put_mov_reg(RCX, RAX);
    cache_entry(w, RBX, RAX, m.lit_cache, m.exit_way1);
    out.exit_found = w.pc();
    w.put_load(R11, RBX, cache::THREAD);
    w.put_cmp32_mem_imm(R11, l.thread_depth as i32, 1);
    w.put_jne(m.exit_slow);
    w.put_lea(RAX, RSP, EXIT_SLOT);
    w.put_cmp_reg_mem(RAX, R11, frame0(l, l.frame_slot));
    w.put_jne(m.exit_slow);
    w.put_load(R10, R11, l.thread_ring as i32);
    w.put_test_reg(R10);
    w.put_je(m.exit_slow);
    w.put_load(RBX, R10, l.slot_head as i32);
    full_check(w, l, R10, RBX, RAX, m.exit_slow);
    w.put_store32_imm(R11, l.thread_depth as i32, 0);
    event_at(w, l, RAX, R10, RBX);
    w.put_load32(RDX, R11, frame0(l, l.frame_probe));
    w.put_or32_imm(RDX, l.exit_kind);
    w.put_store32(RDX, RAX, l.event_probe as i32);
    w.put_load(RDX, R11, l.thread_tid_at as i32);
    w.put_load32(RDX, RDX, 0);
    w.put_store32(RDX, RAX, l.event_tid as i32);
    w.put_store(RCX, RAX, l.event_tsc as i32);
    let v = |k: u32| (l.event_v + 8 * k) as i32;
    w.put_load(RDX, RSP, EXIT_RAX);
    w.put_store(RDX, RAX, v(0));
    w.put_load(RDX, R11, frame0(l, l.frame_tsc));
    w.put_store(RDX, RAX, v(1));
    w.put_load(RDX, RSP, EXIT_RDX);
    w.put_store(RDX, RAX, v(2));
    w.put_load(RDX, R11, l.thread_overhead as i32);
    w.put_sub_reg_mem(RDX, R11, frame0(l, l.frame_overhead));
    w.put_store(RDX, RAX, v(3));
    w.put_store_imm(RAX, v(4), 0);
    w.put_store_imm(RAX, v(5), 0);
    w.put_inc(RBX);
    w.put_store(RBX, R10, l.slot_head as i32); // published
    w.put_load(RDX, R11, frame0(l, l.frame_ret));
    w.put_store(RDX, RSP, EXIT_SLOT);
    restore_exit(w);
    // Back by an indirect jump through the slot, not `ret` (see runtime.rs).
    w.put_lea(RSP, RSP, 8);
    w.put_jmp_mem(RSP, -8);

    out.exit_way1 = w.pc();
    paired_entry(w, RBX, RAX, m.exit_slow);
    w.put_jmp(m.exit_found);
    out.exit_slow = w.pc();
    restore_exit(w);
    w.put_lea(RSP, RSP, 8);
    w.put_jmp(m.tramp_full);
}

/// Pops what the fast exit pushed but the word for the return address.
fn restore_exit(w: &mut Writer) {
    for r in [RCX, RBX, R11, R10, RDX] {
        w.put_pop(r);
    }
    w.put_pop_flags_via_rax();
    w.put_pop(RAX);
}
