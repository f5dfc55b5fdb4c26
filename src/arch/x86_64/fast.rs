//! The x86-64 fast paths of the runtime's function entry and exit, written
//! by hand: what an event probe runs on a hit in the common case, without
//! the C runtime's calling convention (saving every register a C function
//! may clobber, a second copy of the arguments, the callee-saved registers
//! the compiler spills). Anything else falls back to `tp_entry` and
//! `tp_exit` in runtime.c, which stay the one description of what an event
//! probe does; each fast path does exactly what they do in its case, and
//! documents which case that is.
//!
//! Both find the thread's state in the thread cache of the private area
//! (see `thread_cache` below), which the runtime fills for a thread whose
//! word at fs:0 is its key and that counts in a row of its own, in this
//! process (a fork wipes it, so a state found there has been taken in this
//! process), and its ring slot in the same entry, which the runtime puts
//! there for a thread whose TID is in its TCB at the offset tp found: they
//! read the TID there, from the word at fs:0. An `rdtsc` lets no call
//! overlap the next, so what a hit costs beyond it follows its longest
//! chain of loads each waiting for the one before (docs/benchmarks.md):
//! the ring and the TID are found without going through the state.
//!
//! **Entry**, in the detour of each event probe of a C function, which
//! knows what its probe records: after the detour's prefix (rax, r11 and
//! r10 pushed, the flags in rax), the enable flag and its count in the
//! thread's row (as a counting detour's), with r10 the thread's cache
//! entry; when the thread has no timed call live (depth 0) and, to record
//! the entry, a ring slot with room, it writes the event straight from the
//! argument registers, pushes the shadow frame if the probe times the call,
//! then takes one timestamp for both (after its own work, as `tp_entry`
//! starts a timed call) and publishes the event; else it calls `tp_entry`
//! (the count stub first if the thread's entry was not found). A probe
//! that records the entry and does not time the call takes its timestamp
//! first instead, right after its pushes, so that the `rdtsc`'s latency
//! overlaps the ring's checks and the event's stores (about 1 ns less per
//! call here):
//!
//! ```text
//!         r11 = [r10 + RING]                ; the ring slot (to record)
//!         r10 = [r10 + THREAD]              ; the thread's state
//!         depth == 0, writing == 0, else call
//!         push rcx, rdx, rax     ; (rcx only if it records and times the call)
//! record: test r11, r11 ; je full
//!         writing = 1 ; rcx = [r11 + head]
//!         cmp rcx, [r11 + limit] ; jae unmark       ; the ring may be full
//!         rcx = the event at head: rdi, rsi, rdx, rcx, r8, r9, probe | ENTRY,
//!               TID = [fs:0 + the context's TID offset]
//! frame:  shadow[0].slot = the return address's ; shadow[0].children = 0
//!         depth = 1
//!         shadow[0] = slot, *slot, probe, trampoline, t->overhead
//!         rdtsc                              ; the entry's time
//!         event->tsc = it ; inc qword [r11 + head] ; writing = 0   ; published
//!         shadow[0].tsc = it ; *slot = trampoline
//!         pop rax, rdx, rcx                  ; on to the detour's restore
//! ...
//! unmark: writing = 0
//! full:   pop rax, rdx, rcx
//! call:   <push the eight registers; tp_entry(ctx, word, registers,
//!         slot, trampoline, 0); pop> ; jmp restore
//! ```
//!
//! A ring slot keeps the head at which it is full as its writer last saw
//! the reader (`limit`), so that room is one compare.
//!
//! **Exit** (the trampoline a timed call returns to): when the returning
//! call is the thread's only timed one (depth 1, its frame's slot the word
//! below the stack pointer) and its ring has room, it takes the timestamp,
//! pops the frame, writes the exit event (return value, entry time, second
//! return register, ticks in tp's probes of its callees, the durations of
//! the timed calls it made, which the runtime's exits added to its frame) and returns to
//! the original address; else it restores what it touched and goes on to
//! the trampoline that calls `tp_exit`:
//!
//! ```text
//! tramp:  lea  rsp, [rsp - 8]            ; where the return address goes
//!         push rax ; lahf ; seto al ; push rax
//!         push rdx, r10, r11, rcx
//!         rdtsc ; rcx = the time
//!         <r10 = the thread's cache entry (or the paired one), else slow>
//!         r11 = [r10 + THREAD] ; r10 = [r10 + RING]
//!         depth == 1, writing == 0, else slow
//!         shadow[0].slot == rsp + 48, ring with room, else slow
//!         the event ; [rsp + 48] = shadow[0].ret   ; the frame read whole,
//!         depth = 0 ; inc qword [r10 + head] ; writing = 0   ; then let go
//!         pop rcx, r11, r10, rdx ; pop rax ; add al, 0x7f ; sahf ; pop rax
//!         lea  rsp, [rsp + 8] ; jmp [rsp - 8]  ; to the original return address
//! slow:   <pop, as above> ; lea rsp, [rsp + 8] ; jmp the full trampoline
//! ```

use super::CLEARED_BELOW;
use super::reg::Reg;
use super::writer::{Label, Target, Writer};
use crate::arch::RuntimeLayout;

/// The places in the runtime block the fast exits refer to, bound as the
/// block is written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Marks {
    /// The trampoline that calls `tp_exit`.
    pub tramp_full: Label,
    /// The fast exit, where a timed call returns: the trampoline.
    pub tramp: Label,
    /// Literals: the context, the thread cache.
    pub lit_ctx: Label,
    /// See [`Marks::lit_ctx`].
    pub lit_cache: Label,
    /// Labels inside the fast exit.
    pub exit_slow: Label,
    /// See [`Marks::exit_slow`].
    pub exit_way1: Label,
    /// See [`Marks::exit_slow`].
    pub exit_found: Label,
    /// See [`Marks::exit_slow`].
    pub exit_unmark: Label,
    /// Labels inside the exit routine ([`exit_at`]).
    pub at_found: Label,
    /// See [`Marks::at_found`].
    pub at_way1: Label,
    /// See [`Marks::at_found`].
    pub at_found_tail: Label,
    /// See [`Marks::at_found`].
    pub at_way1_tail: Label,
    /// See [`Marks::at_found`].
    pub at_done: Label,
    /// See [`Marks::at_found`].
    pub at_not_one: Label,
    /// See [`Marks::at_found`].
    pub at_other0: Label,
    /// See [`Marks::at_found`].
    pub at_other: Label,
    /// See [`Marks::at_found`].
    pub at_unmark: Label,
    /// See [`Marks::at_found`].
    pub at_slow: Label,
    /// See [`Marks::at_found`].
    pub at_ext: Label,
    /// See [`Marks::at_found`].
    pub at_called: Label,
}

impl Marks {
    /// Every mark, bound nowhere yet.
    pub(super) fn new(w: &mut Writer) -> Marks {
        Marks {
            tramp_full: w.label(),
            tramp: w.label(),
            lit_ctx: w.label(),
            lit_cache: w.label(),
            exit_slow: w.label(),
            exit_way1: w.label(),
            exit_found: w.label(),
            exit_unmark: w.label(),
            at_found: w.label(),
            at_way1: w.label(),
            at_found_tail: w.label(),
            at_way1_tail: w.label(),
            at_done: w.label(),
            at_not_one: w.label(),
            at_other0: w.label(),
            at_other: w.label(),
            at_unmark: w.label(),
            at_slow: w.label(),
            at_ext: w.label(),
            at_called: w.label(),
        }
    }
}

/// How a detour finds a thread's entry in its process's thread cache (the
/// private area's first pages, [`crate::layout::Proc`]), in the layout's
/// terms, which are its one source: the entry of the thread whose word at
/// the thread pointer is `w` is number
/// `(w as u32).wrapping_mul(HASH) >> (32 - BITS)`
/// ([`crate::layout::cache_index`]), or the one after it paired
/// with it (number xor 1), of `SIZE` bytes: `!w` at `CHECK`, the thread's
/// counter row at `ROW`, its state at `THREAD`, the ring slot the fast
/// paths write its events into at `RING` (0: none). The cache is `SIZE * 2`
/// aligned. An entry's check goes from 0 (empty) to
/// [`crate::layout::CACHE_BUSY`] (being written) to `!w`, after the row,
/// the state and the ring, and then neither it nor the row nor the state
/// changes again in the process; the ring is the thread's own to change.
pub(super) mod thread_cache {
    use crate::layout::{self, CacheEntry, Proc};
    use std::mem::{offset_of, size_of};

    /// log2 of the entries.
    pub const BITS: u32 = layout::CACHE_BITS;
    /// The multiplier of the index's hash.
    pub const HASH: u32 = layout::CACHE_HASH;
    /// Bytes per entry.
    pub const SIZE: u32 = size_of::<CacheEntry>() as u32;
    /// Offsets in an entry.
    pub const CHECK: i32 = offset_of!(CacheEntry, check) as i32;
    /// See [`CHECK`].
    pub const ROW: i32 = offset_of!(CacheEntry, row) as i32;
    /// See [`CHECK`].
    pub const THREAD: i32 = offset_of!(CacheEntry, thread) as i32;
    /// See [`CHECK`].
    pub const RING: i32 = offset_of!(CacheEntry, ring) as i32;

    // An entry and the one paired with it differ in the bit of `SIZE`.
    const _: () = assert!(offset_of!(Proc, cache).is_multiple_of(2 * SIZE as usize));
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
pub(super) fn cache_entry(w: &mut Writer, entry: Reg, word: Reg, lit_cache: Target, way1: Target) {
    const _: () = assert!(thread_cache::CHECK == 0);
    w.put_mov_reg_fs0(word);
    w.put_imul32_imm_from(entry, word, thread_cache::HASH);
    w.put_shr32(entry, (32 - thread_cache::BITS - thread_cache::SIZE.trailing_zeros()) as u8);
    w.put_and32_imm(entry, ((1 << thread_cache::BITS) - 1) << thread_cache::SIZE.trailing_zeros());
    w.put_add_reg_rip(entry, lit_cache);
    w.put_not(word);
    w.put_cmp_reg_deref(word, entry);
    w.put_jne(way1);
}

/// At `way1`: the entry paired with the one [`cache_entry`] found (the
/// cache is aligned to two entries); a jump to `miss` unless it is the
/// thread's.
pub(super) fn paired_entry(w: &mut Writer, entry: Reg, word: Reg, miss: Target) {
    w.put_xor_imm8(entry, thread_cache::SIZE as i8);
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

/// The thread whose state is at `state` may take the fast path: it has no
/// timed call live (its depth is `depth`: 0 at an entry, 1 at the exit of
/// its only one) and is not writing into its ring (a signal interrupted
/// the write: the runtime counts this event lost); else a jump to `slow`.
/// Two 32-bit compares, not one of the 64 bits both fields fill: the fast
/// paths write them 32 bits at a time, and a wider load of stores still
/// in flight waits for them to reach the cache (2 ns more per entry and 7
/// ns more per exit, measured here).
fn check_thread(w: &mut Writer, l: &RuntimeLayout, state: Reg, depth: u32, slow: Target) {
    w.put_cmp32_mem_imm(state, l.thread_depth as i32, depth);
    w.put_jne(slow);
    w.put_cmp32_mem_imm(state, l.thread_writing as i32, 0);
    w.put_jne(slow);
}

/// The next event of the ring of the thread whose state is at `state`, for
/// it to write: `slot` holds its ring slot (from its cache entry, which
/// the fast paths read it from without going through the state first),
/// `ev` = the event at the slot's head (the thread marked as writing).
/// Jumps to `busy` if the entry has no ring, to `unmark` if the ring may be
/// full (the mark set). The thread was seen not writing ([`check_thread`]).
fn reserve_event(w: &mut Writer, l: &RuntimeLayout, state: Reg, slot: Reg, ev: Reg, busy: Target, unmark: Target) {
    w.put_test_reg(slot);
    w.put_je(busy);
    w.put_store32_imm(state, l.thread_writing as i32, 1);
    w.put_load(ev, slot, l.slot_head as i32);
    // Below the slot's limit there is room; at it the runtime looks at the
    // reader's position again, or counts the event lost.
    w.put_cmp_reg_mem(ev, slot, l.slot_limit as i32);
    w.put_jae(unmark);
    w.put_and32_imm(ev, l.ring_mask);
    w.put_shl64(ev, event_shift(l));
    w.put_lea_indexed(ev, slot, ev, l.slot_ring as i32);
}

/// Publishes the event [`reserve_event`] gave (its head moves on: one
/// writer, so a plain increment; the reader sees the old or the new value,
/// and x86-64 makes the event's stores visible before it), then clears the
/// thread's writing mark.
fn publish(w: &mut Writer, l: &RuntimeLayout, state: Reg, slot: Reg) {
    w.put_inc_mem(slot, l.slot_head as i32, false);
    w.put_store32_imm(state, l.thread_writing as i32, 0);
}

/// `into` (32 bits) = the calling thread's TID, from its TCB: the word at
/// fs:0 (the thread's key, for a thread the fast paths take) plus the
/// offset tp found, which the context holds. The runtime gives a ring in
/// the cache entry ([`reserve_event`]) only to a thread whose TID is there.
/// None of these loads waits for the thread's state.
fn thread_tid(w: &mut Writer, l: &RuntimeLayout, lit_ctx: Target, into: Reg) {
    w.put_mov_reg_rip(into, lit_ctx);
    w.put_movsxd(into, into, l.ctx_tid_offset as i32);
    w.put_add_reg_fs0(into);
    w.put_load32(into, into, 0);
}

/// `into` (rax or rdx) = the time stamp counter; the other is clobbered.
fn timestamp(w: &mut Writer, into: Reg) {
    let other = if into == Reg::Rax { Reg::Rdx } else { Reg::Rax };
    w.put_rdtsc();
    w.put_shl64(Reg::Rdx, 32);
    w.put_or_reg(into, other);
}

/// The registers the fast entry of a probe pushes after the detour's own
/// three (rax, now the flags, last): rdx and rax for the timestamp, and rcx
/// for the event when the probe also times the call.
fn event_saved(l: &RuntimeLayout, word: u32) -> &'static [Reg] {
    if word & l.record_entry != 0 && timed(l, word) { &[Reg::Rcx, Reg::Rdx, Reg::Rax] } else { &[Reg::Rdx, Reg::Rax] }
}

/// True if the probe whose entry word is `word` times its calls: by
/// replacing the return address, or to the end its exits' detours see.
fn timed(l: &RuntimeLayout, word: u32) -> bool {
    word & (l.hijack_return | l.time_call) != 0
}

/// Where the probed function's return address is above the stack pointer
/// once the fast entry has pushed: above the detour's three words and its own.
fn event_slot(saved: &[Reg]) -> i32 {
    (3 + saved.len() as i32) * 8
}

/// Where the fast entry's fallbacks are in its detour.
#[derive(Debug, Clone, Copy)]
pub(super) struct EventExits {
    /// Pops what [`event`] pushed, then goes on to `call`.
    pub full: Label,
    /// Clears the thread's writing mark, then goes on to `full`.
    pub unmark: Label,
    /// Calls `tp_entry` (the call is counted already).
    pub call: Label,
    /// The literal holding the trampoline's address.
    pub lit_tramp: Label,
    /// The literal holding the context's address.
    pub lit_ctx: Label,
}

/// The fast entry of an event probe of a C function, which its detour
/// emits after counting the call: r10 holds the thread's cache entry, and
/// every register but r10, r11 and rax (the flags) is the function's.
/// `word` is the probe's entry word: what it records is known here, so
/// nothing is tested at run time but the thread's state. See the module
/// doc; it falls through to the detour's restore, or jumps to a fallback.
pub(super) fn event(w: &mut Writer, l: &RuntimeLayout, word: u32, x: &EventExits) {
    let record = word & l.record_entry != 0;
    let hijack = word & l.hijack_return != 0;
    let timed = timed(l, word);
    let probe = word & l.probe_mask;
    let saved = event_saved(l, word);
    if record {
        w.put_load(Reg::R11, Reg::R10, thread_cache::RING);
    }
    w.put_load(Reg::R10, Reg::R10, thread_cache::THREAD);
    check_thread(w, l, Reg::R10, 0, x.call.into());
    for &r in saved {
        w.put_push(r);
    }
    if record && !timed {
        entry_event_only(w, l, probe, x);
        return;
    }
    let v = |k: u32| (l.event_v + 8 * k) as i32;
    if record {
        // r11: the thread's ring slot; rcx the event at its head.
        reserve_event(w, l, Reg::R10, Reg::R11, Reg::Rcx, x.full.into(), x.unmark.into());
        for (k, r) in [(0, Reg::Rdi), (1, Reg::Rsi), (2, Reg::Rdx), (4, Reg::R8), (5, Reg::R9)] {
            w.put_store(r, Reg::Rcx, v(k));
        }
        w.put_load(Reg::Rax, Reg::Rsp, 16); // the function's rcx, pushed
        w.put_store(Reg::Rax, Reg::Rcx, v(3));
        thread_tid(w, l, x.lit_ctx.into(), Reg::Rdx);
        w.put_store32(Reg::Rdx, Reg::Rcx, l.event_tid as i32);
        w.put_store32_imm(Reg::Rcx, l.event_probe as i32, probe | l.entry_kind);
    }
    let slot = event_slot(saved);
    // Shadow frame 0. Its slot is written before the depth that publishes
    // it and again after: a signal handler whose probes run on this thread
    // before the depth is 1 takes frame 0 itself and leaves it as it found
    // the depth, and one after sees a frame that is this call's.
    w.put_lea(Reg::Rdx, Reg::Rsp, slot);
    w.put_store(Reg::Rdx, Reg::R10, frame0(l, l.frame_slot));
    w.put_store_imm(Reg::R10, frame0(l, l.frame_children), 0);
    w.put_store32_imm(Reg::R10, l.thread_depth as i32, 1);
    w.put_store(Reg::Rdx, Reg::R10, frame0(l, l.frame_slot));
    w.put_load(Reg::Rdx, Reg::Rdx, 0);
    w.put_store(Reg::Rdx, Reg::R10, frame0(l, l.frame_ret));
    w.put_store32_imm(Reg::R10, frame0(l, l.frame_probe), probe);
    // The trampoline it puts in the return address's place; none for a
    // call timed to the end its function's exits see.
    if hijack {
        w.put_mov_reg_rip(Reg::Rdx, x.lit_tramp);
        w.put_store(Reg::Rdx, Reg::R10, frame0(l, l.frame_tramp));
    } else {
        w.put_store_imm(Reg::R10, frame0(l, l.frame_tramp), 0);
    }
    w.put_load(Reg::Rdx, Reg::R10, l.thread_overhead as i32);
    w.put_store(Reg::Rdx, Reg::R10, frame0(l, l.frame_overhead));
    // One timestamp, after tp's work, for the event and the timed call.
    timestamp(w, Reg::Rax);
    if record {
        w.put_store(Reg::Rax, Reg::Rcx, l.event_tsc as i32);
        publish(w, l, Reg::R10, Reg::R11);
    }
    w.put_store(Reg::Rax, Reg::R10, frame0(l, l.frame_tsc));
    if hijack {
        w.put_mov_reg_rip(Reg::Rdx, x.lit_tramp);
        w.put_store(Reg::Rdx, Reg::Rsp, slot);
    }
    for r in saved.iter().rev() {
        w.put_pop(*r);
    }
}

/// [`event`] for a probe that records the entry and does not time the
/// call: its timestamp is taken first, so that its latency overlaps the
/// rest (nothing waits for it but the event's word). rdx holds it; the
/// function's rdx is read back from where [`event`] pushed it, and rax
/// (the flags, pushed) holds the event.
fn entry_event_only(w: &mut Writer, l: &RuntimeLayout, probe: u32, x: &EventExits) {
    timestamp(w, Reg::Rdx);
    reserve_event(w, l, Reg::R10, Reg::R11, Reg::Rax, x.full.into(), x.unmark.into());
    let v = |k: u32| (l.event_v + 8 * k) as i32;
    for (k, r) in [(0, Reg::Rdi), (1, Reg::Rsi), (3, Reg::Rcx), (4, Reg::R8), (5, Reg::R9)] {
        w.put_store(r, Reg::Rax, v(k));
    }
    w.put_store(Reg::Rdx, Reg::Rax, l.event_tsc as i32);
    w.put_load(Reg::Rdx, Reg::Rsp, 8); // the function's rdx, pushed
    w.put_store(Reg::Rdx, Reg::Rax, v(2));
    thread_tid(w, l, x.lit_ctx.into(), Reg::Rdx);
    w.put_store32(Reg::Rdx, Reg::Rax, l.event_tid as i32);
    w.put_store32_imm(Reg::Rax, l.event_probe as i32, probe | l.entry_kind);
    publish(w, l, Reg::R10, Reg::R11);
    w.put_pop(Reg::Rax);
    w.put_pop(Reg::Rdx);
}

/// The fast entry's fallbacks once it has pushed: at `x.unmark` (a full
/// ring) it clears the writing mark, at `x.full` pops what the fast entry
/// of the probe with entry word `word` pushed, then goes on to the call of
/// `tp_entry`, which the detour emits next. Binds `x.unmark` and `x.full`.
pub(super) fn event_full(w: &mut Writer, l: &RuntimeLayout, word: u32, x: &EventExits) {
    w.bind(x.unmark);
    w.put_store32_imm(Reg::R10, l.thread_writing as i32, 0);
    w.bind(x.full);
    for r in event_saved(l, word).iter().rev() {
        w.put_pop(*r);
    }
}

/// Where, above the fast exit's stack pointer after its pushes, the saved
/// rdx and rax are, and the word where the return address goes (the slot
/// the function's `ret` popped it from).
const EXIT_RDX: i32 = 24;
const EXIT_RAX: i32 = 40;
const EXIT_SLOT: i32 = 48;

/// The fast exit (the trampoline), falling back to the full trampoline at
/// `m.tramp_full`. Binds the marks it defines.
pub(super) fn exit(w: &mut Writer, l: &RuntimeLayout, m: &Marks) {
    w.put_lea(Reg::Rsp, Reg::Rsp, -8);
    w.put_push(Reg::Rax);
    w.put_push_flags_via_rax();
    for r in [Reg::Rdx, Reg::R10, Reg::R11, Reg::Rcx] {
        w.put_push(r);
    }
    // The call's end, first.
    timestamp(w, Reg::Rax);
    w.put_mov_reg(Reg::Rcx, Reg::Rax);
    cache_entry(w, Reg::R10, Reg::Rax, m.lit_cache.into(), m.exit_way1.into());
    w.bind(m.exit_found);
    w.put_load(Reg::R11, Reg::R10, thread_cache::THREAD);
    w.put_load(Reg::R10, Reg::R10, thread_cache::RING);
    check_thread(w, l, Reg::R11, 1, m.exit_slow.into());
    w.put_lea(Reg::Rax, Reg::Rsp, EXIT_SLOT);
    w.put_cmp_reg_mem(Reg::Rax, Reg::R11, frame0(l, l.frame_slot));
    w.put_jne(m.exit_slow);
    // r10: the thread's ring slot; rax the event at its head.
    reserve_event(w, l, Reg::R11, Reg::R10, Reg::Rax, m.exit_slow.into(), m.exit_unmark.into());
    // The frame is read whole before the depth lets it go: a signal
    // handler whose probes run on this thread from then on take frame 0.
    w.put_load32(Reg::Rdx, Reg::R11, frame0(l, l.frame_probe));
    w.put_or32_imm(Reg::Rdx, l.exit_kind);
    w.put_store32(Reg::Rdx, Reg::Rax, l.event_probe as i32);
    thread_tid(w, l, m.lit_ctx.into(), Reg::Rdx);
    w.put_store32(Reg::Rdx, Reg::Rax, l.event_tid as i32);
    w.put_store(Reg::Rcx, Reg::Rax, l.event_tsc as i32);
    let v = |k: u32| (l.event_v + 8 * k) as i32;
    w.put_load(Reg::Rdx, Reg::Rsp, EXIT_RAX);
    w.put_store(Reg::Rdx, Reg::Rax, v(0));
    w.put_load(Reg::Rdx, Reg::R11, frame0(l, l.frame_tsc));
    w.put_store(Reg::Rdx, Reg::Rax, v(1));
    w.put_load(Reg::Rdx, Reg::Rsp, EXIT_RDX);
    w.put_store(Reg::Rdx, Reg::Rax, v(2));
    w.put_load(Reg::Rdx, Reg::R11, l.thread_overhead as i32);
    w.put_sub_reg_mem(Reg::Rdx, Reg::R11, frame0(l, l.frame_overhead));
    w.put_store(Reg::Rdx, Reg::Rax, v(3));
    w.put_store_imm(Reg::Rax, v(4), 0);
    // The timed calls it made (nested ones end in the runtime's exit).
    w.put_load(Reg::Rdx, Reg::R11, frame0(l, l.frame_children));
    w.put_store(Reg::Rdx, Reg::Rax, v(5));
    w.put_load(Reg::Rdx, Reg::R11, frame0(l, l.frame_ret));
    w.put_store(Reg::Rdx, Reg::Rsp, EXIT_SLOT);
    w.put_store32_imm(Reg::R11, l.thread_depth as i32, 0);
    publish(w, l, Reg::R11, Reg::R10);
    restore_exit(w);
    // Back by an indirect jump through the slot, not `ret` (see runtime_block.rs).
    w.put_lea(Reg::Rsp, Reg::Rsp, 8);
    w.put_jmp_mem(Reg::Rsp, -8);

    w.bind(m.exit_way1);
    paired_entry(w, Reg::R10, Reg::Rax, m.exit_slow.into());
    w.put_jmp(m.exit_found);
    w.bind(m.exit_unmark);
    w.put_store32_imm(Reg::R11, l.thread_writing as i32, 0);
    w.bind(m.exit_slow);
    restore_exit(w);
    w.put_lea(Reg::Rsp, Reg::Rsp, 8);
    w.put_jmp(m.tramp_full);
}

/// Where, above the exit routine's stack pointer after its pushes (those
/// of the fast exit but the word for the return address), the word its
/// detour pushed is, and the slot of the call that ends: where its return
/// address is, which its frame is keyed by.
const AT_WORD: i32 = 56;
const AT_SLOT: i32 = 64;
/// Registers the exit routine's slow path saves besides the fast path's:
/// with those, every one a C function may clobber.
const AT_SAVED: [Reg; 4] = [Reg::Rsi, Reg::Rdi, Reg::R8, Reg::R9];

/// Where the exit routine's three ways in are (see [`exit_at`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ExitRoutines {
    /// Before a return: the word is the probe alone.
    pub ret: u64,
    /// Before a tail call's jump out: the probe and the tail call's flag.
    pub tail: u64,
    /// Straight to the runtime's functions: a word with their flags (Go
    /// code's goroutine frames, a predicate on the return value, durations
    /// kept in the target), or whose top half says the return address is
    /// above the stack pointer.
    pub runtime: u64,
}

/// The exit routine, which the detour at an exit of a function calls
/// before the exit runs (`push word; call exit`), with every register and
/// flag kept, and which returns with `ret 8` (the word dropped). The detour
/// calls one of three ways in, by what its word says (known when it is
/// built): the fast path of a return and that of a tail call record the
/// end of the thread's only timed call, and return at once where the call
/// was not timed (no timed call on the thread, or an outer one of the same
/// stack on top); anything else, and the third way in, calls `plain`
/// (`tp_exit_at`) or, for a word with the runtime's flags, `ext`
/// (`tp_exit_at_ext`). Nothing is tested at run time that the word's way
/// in says already.
///
/// ```text
/// ret:    push rax ; lahf ; seto al ; push rax ; push rdx, r10, r11, rcx
///         <r10 = the thread's cache entry (or the paired one), else slow>
///         r11 = [r10 + THREAD]
///         depth == 1, else not_one
///         shadow[0].slot == rsp + 64, else other0      ; this call's slot
///         shadow[0].probe == the word (tail: its probe bits), else slow
///         writing == 0, else slow
///         rdtsc ; the event from the frame read whole ; depth = 0 ; publish
/// done:   pop rcx, r11, r10, rdx ; pop rax ; add al, 0x7f ; sahf ; pop rax
///         ret 8
/// ```
pub(super) fn exit_at(w: &mut Writer, l: &RuntimeLayout, m: &Marks, plain: u64, ext: u64) -> ExitRoutines {
    // The runtime's way in, then what every way ends in.
    let runtime = w.pc();
    save_exit(w);
    w.bind(m.at_slow);
    for r in AT_SAVED {
        w.put_push(r);
    }
    let above = 8 * AT_SAVED.len() as i32;
    w.put_mov_reg_rip(Reg::Rdi, m.lit_ctx);
    // The whole word: its top half is how far above the slot's stack
    // pointer the return address is (an exit ahead of its return).
    w.put_load(Reg::Rsi, Reg::Rsp, above + AT_WORD);
    w.put_lea(Reg::Rdx, Reg::Rsp, above + AT_SLOT);
    w.put_load(Reg::Rcx, Reg::Rsp, above + EXIT_RAX);
    w.put_load(Reg::R8, Reg::Rsp, above + EXIT_RDX);
    // Go code's goroutine, which C code leaves alone in r14.
    w.put_mov_reg(Reg::R9, Reg::R14);
    w.put_test32_imm(Reg::Rsi, l.exit_ext);
    w.put_jne(m.at_ext);
    // The stack pointer's alignment at an exit is the caller's: aligned here.
    w.put_align_stack_and_call(plain);
    w.put_jmp(m.at_called);
    w.bind(m.at_ext);
    w.put_align_stack_and_call(ext);
    w.bind(m.at_called);
    w.put_clear_below_rsp_unrolled(CLEARED_BELOW);
    for r in AT_SAVED.iter().rev() {
        w.put_pop(*r);
    }
    w.bind(m.at_done);
    restore_exit(w);
    w.put_ret_pop(8);

    // The depth is not 1 (in rcx once loaded): none, or more than one timed
    // call live, where the same test is made on the top frame; this call's
    // own (nested) goes to the runtime, which keeps tp's time.
    w.bind(m.at_not_one);
    w.put_load32(Reg::Rcx, Reg::R11, l.thread_depth as i32);
    w.put_test_reg(Reg::Rcx);
    w.put_je(m.at_done);
    w.put_lea32(Reg::Rax, Reg::Rcx, -1);
    w.put_shl64(Reg::Rax, l.frame_size.trailing_zeros() as u8);
    w.put_add_reg(Reg::Rax, Reg::R11);
    w.put_load(Reg::Rax, Reg::Rax, frame0(l, l.frame_slot));
    w.put_lea(Reg::Rdx, Reg::Rsp, AT_SLOT);
    w.put_sub_reg(Reg::Rax, Reg::Rdx);
    w.put_je(m.at_slow);
    w.put_jmp(m.at_other);
    // One timed call live, in frame 0, not at this call's slot (rdx).
    w.bind(m.at_other0);
    w.put_load(Reg::Rax, Reg::R11, frame0(l, l.frame_slot));
    w.put_sub_reg(Reg::Rax, Reg::Rdx);
    // rax: the top frame's slot less this call's, not 0. Above it within a
    // stack's span: an outer call of this stack, and this one was not timed.
    w.bind(m.at_other);
    w.put_cmp_reg_imm(Reg::Rax, l.stack_span as i32);
    w.put_jb(m.at_done);
    w.put_jmp(m.at_slow);
    w.bind(m.at_unmark);
    w.put_store32_imm(Reg::R11, l.thread_writing as i32, 0);
    w.put_jmp(m.at_slow);

    let ret = w.pc();
    exit_at_fast(w, l, m, (m.at_way1, m.at_found), false);
    let tail = w.pc();
    exit_at_fast(w, l, m, (m.at_way1_tail, m.at_found_tail), true);
    ExitRoutines { ret, tail, runtime }
}

/// The exit routine's fast path for a return's word (the probe alone) or,
/// with `tail`, a tail call's (the probe and its flag): `marks` are its own
/// labels (the paired cache entry, the entry found), bound here.
fn exit_at_fast(w: &mut Writer, l: &RuntimeLayout, m: &Marks, marks: (Label, Label), tail: bool) {
    let (way1, found) = marks;
    save_exit(w);
    cache_entry(w, Reg::R10, Reg::Rax, m.lit_cache.into(), way1.into());
    w.bind(found);
    w.put_load(Reg::R11, Reg::R10, thread_cache::THREAD);
    w.put_cmp32_mem_imm(Reg::R11, l.thread_depth as i32, 1);
    w.put_jne(m.at_not_one);
    // One timed call live, in frame 0: this call's, an outer one's, or neither?
    w.put_lea(Reg::Rdx, Reg::Rsp, AT_SLOT);
    w.put_cmp_reg_mem(Reg::Rdx, Reg::R11, frame0(l, l.frame_slot));
    w.put_jne(m.at_other0);
    w.put_load32(Reg::Rax, Reg::Rsp, AT_WORD);
    if tail {
        w.put_and32_imm(Reg::Rax, l.probe_mask);
    }
    w.put_cmp32_reg_mem(Reg::Rax, Reg::R11, frame0(l, l.frame_probe));
    w.put_jne(m.at_slow);
    w.put_cmp32_mem_imm(Reg::R11, l.thread_writing as i32, 0);
    w.put_jne(m.at_slow);
    // This call's: its end (rax), then the event (rcx) from the frame read whole.
    w.put_load(Reg::R10, Reg::R10, thread_cache::RING);
    timestamp(w, Reg::Rax);
    reserve_event(w, l, Reg::R11, Reg::R10, Reg::Rcx, m.at_slow.into(), m.at_unmark.into());
    w.put_load32(Reg::Rdx, Reg::R11, frame0(l, l.frame_probe));
    w.put_or32_imm(Reg::Rdx, l.exit_kind);
    w.put_store32(Reg::Rdx, Reg::Rcx, l.event_probe as i32);
    thread_tid(w, l, m.lit_ctx.into(), Reg::Rdx);
    w.put_store32(Reg::Rdx, Reg::Rcx, l.event_tid as i32);
    w.put_store(Reg::Rax, Reg::Rcx, l.event_tsc as i32);
    let v = |k: u32| (l.event_v + 8 * k) as i32;
    w.put_load(Reg::Rdx, Reg::Rsp, EXIT_RAX);
    w.put_store(Reg::Rdx, Reg::Rcx, v(0));
    w.put_load(Reg::Rdx, Reg::R11, frame0(l, l.frame_tsc));
    w.put_store(Reg::Rdx, Reg::Rcx, v(1));
    w.put_load(Reg::Rdx, Reg::Rsp, EXIT_RDX);
    w.put_store(Reg::Rdx, Reg::Rcx, v(2));
    w.put_load(Reg::Rdx, Reg::R11, l.thread_overhead as i32);
    w.put_sub_reg_mem(Reg::Rdx, Reg::R11, frame0(l, l.frame_overhead));
    w.put_store(Reg::Rdx, Reg::Rcx, v(3));
    // A tail call leaves no return value of its own: its flag says so.
    w.put_store_imm(Reg::Rcx, v(4), if tail { l.tail_call as i32 } else { 0 });
    w.put_load(Reg::Rdx, Reg::R11, frame0(l, l.frame_children));
    w.put_store(Reg::Rdx, Reg::Rcx, v(5));
    w.put_store32_imm(Reg::R11, l.thread_depth as i32, 0);
    publish(w, l, Reg::R11, Reg::R10);
    restore_exit(w);
    w.put_ret_pop(8);

    w.bind(way1);
    paired_entry(w, Reg::R10, Reg::Rax, m.at_slow.into());
    w.put_jmp(found);
}

/// Pushes what the exit routine keeps of the registers it uses: rax, the
/// flags, rdx, r10, r11 and rcx.
fn save_exit(w: &mut Writer) {
    w.put_push(Reg::Rax);
    w.put_push_flags_via_rax();
    for r in [Reg::Rdx, Reg::R10, Reg::R11, Reg::Rcx] {
        w.put_push(r);
    }
}

/// Pops what the fast exit pushed but the word for the return address.
fn restore_exit(w: &mut Writer) {
    for r in [Reg::Rcx, Reg::R11, Reg::R10, Reg::Rdx] {
        w.put_pop(r);
    }
    w.put_pop_flags_via_rax();
    w.put_pop(Reg::Rax);
}

/// A layout as `probe::runtime::layout_of` makes one, for tests.
#[cfg(test)]
pub(super) fn example_layout() -> RuntimeLayout {
    RuntimeLayout {
        ctx: 0x7f00_0000_1040,
        cache: 0x7f10_0000_0020,
        ring_mask: 2047,
        thread_depth: 24,
        thread_writing: 28,
        ctx_tid_offset: 0x44,
        thread_overhead: 16,
        thread_shadow: 64,
        frame_slot: 0,
        frame_ret: 8,
        frame_tsc: 16,
        frame_probe: 24,
        frame_tramp: 32,
        frame_overhead: 40,
        frame_children: 56,
        frame_size: 64,
        slot_head: 64,
        slot_limit: 16,
        slot_ring: 192,
        event_probe: 0,
        event_tid: 4,
        event_tsc: 8,
        event_v: 16,
        event_size: 64,
        probe_mask: (1 << 24) - 1,
        record_entry: 1 << 24,
        hijack_return: 1 << 25,
        time_call: 1 << 22,
        tail_call: 1 << 21,
        exit_ext: (1 << 29) | (1 << 30),
        go_frames: 1 << 20,
        stack_span: 8 << 20,
        entry_kind: 1 << 24,
        exit_kind: 2 << 24,
    }
}
