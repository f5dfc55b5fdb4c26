//! The byte layout of tp's data region: the memfd that the target maps
//! MAP_SHARED and that every tp command reads and writes.
//!
//! The region holds everything needed to undo tp's changes from the target's
//! state alone, so that `tp detach` works after the tracer that attached was
//! killed:
//!
//! ```text
//! offset 0         Header     magic "tp-data\0", layout version, sizes,
//!                             arenas, and the runtime's context (EventCtx)
//! probes_off       Entry[cap] one 256-byte entry per probe: state, kind,
//!                             site, original and patch bytes, detour, name
//! flags_off        u8[cap]    per-probe enable flag, read by every detour
//! budgets_off      i32[cap]   per-probe samples left this epoch (tp profile)
//! periods_off      u32[cap]   per-probe mean calls between samples (tp profile)
//! configs_off      ProbeConfig[cap] per-probe predicates (--if), the argument
//!                             counted by (--by), the stack to record (--stack)
//! counters_off     rows       2^slot_bits rows of 2^stride_shift bytes; row r
//!                             holds one u64 hit counter per probe; row 0 is
//!                             shared (atomic adds), each other row is one
//!                             thread's (x86-64: [`EventCtx::row_owner`]) or
//!                             the threads' that hash to it (AArch64)
//! countdowns_off   rows       as many rows again: per row and probe, calls
//!                             left before the next sample (tp profile)
//! events_off       slots      one slot per thread that recorded an event:
//!                             SlotHead, ring (Event[ring_len]), then the
//!                             thread's aggregates (AggHead, LatEntry[],
//!                             ByEntry[]); see runtime.c
//! ```
//!
//! Beside it, each process holds a *private area* (anonymous, MAP_PRIVATE,
//! so `fork` copies it): its first two pages ([`Proc`], MADV_WIPEONFORK, so
//! a child starts with zeros) say which process the area belongs to and
//! cache, per thread, its counter row and its state for the detours; the
//! next holds [`PRIVATE_MAGIC`], and one [`ThreadState`] per thread holds
//! the thread's shadow stack of return frames, the address of its ring
//! slot and its counter row. See [`PrivateGeometry`].
//!
//! Entries change only while the target is ptrace-stopped by the tp that
//! changes them, and ptrace admits one tracer, so writers never race.
//!
//! This file is the one source of the layout the in-target runtime shares:
//! build.rs compiles it too (`#[path]`), and writes the C declarations of
//! the `shared_struct!` structs and of [`C_CONSTANTS`] into the header
//! runtime.c includes. So it uses nothing but `std`, and it is a module
//! of its own below the rest: `arch` (the detours that read the thread
//! cache) and `probe` (which re-exports it as `probe::layout`) import it.

/// Declares a `repr(C)` struct that the in-target runtime shares, and with
/// it, from the same fields, its C declaration ([`CStruct`]): build.rs
/// writes that into the `layout.h` runtime.c includes, with
/// `_Static_assert`s that the C compiler puts every field at the offset
/// Rust does. `then` adds a C-only last member (a flexible array).
macro_rules! shared_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident as $c:literal $(, then $tail:literal)? {
            $( $(#[doc = $doc:literal])* pub $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl $name {
            /// Its C declaration, for runtime.c.
            pub fn c_struct() -> CStruct {
                CStruct {
                    name: $c,
                    size: std::mem::size_of::<$name>(),
                    fields: vec![$(
                        CField::of::<$ty>(stringify!($field), std::mem::offset_of!($name, $field), &[$($doc),*]),
                    )*],
                    tail: [$($tail)?].first().copied(),
                }
            }
        }
    };
}

/// A struct as C declares it.
#[derive(Debug, Clone)]
pub struct CStruct {
    /// `struct NAME`.
    pub name: &'static str,
    /// `sizeof`.
    pub size: usize,
    /// The members, in order.
    pub fields: Vec<CField>,
    /// A C-only last member, e.g. a flexible array.
    pub tail: Option<&'static str>,
}

/// A member of a [`CStruct`].
#[derive(Debug, Clone)]
pub struct CField {
    /// Its name.
    pub name: &'static str,
    /// Its C type (the element type of an array).
    pub ctype: &'static str,
    /// For an array, its length.
    pub len: Option<usize>,
    /// `offsetof`.
    pub offset: usize,
    /// Its doc comment.
    pub doc: String,
}

impl CField {
    fn of<T: CType>(name: &'static str, offset: usize, doc: &[&str]) -> CField {
        let doc = doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
        CField { name, ctype: T::C, len: T::LEN, offset, doc }
    }

    /// `uint64_t name[3];`.
    pub fn declaration(&self) -> String {
        match self.len {
            Some(n) => format!("{} {}[{n}];", self.ctype, self.name),
            None => format!("{} {};", self.ctype, self.name),
        }
    }
}

impl CStruct {
    /// The declaration and the `_Static_assert`s of its size and offsets.
    pub fn to_c(&self) -> String {
        let name = self.name;
        let mut out = format!("struct {name} {{\n");
        for f in &self.fields {
            out += &format!("\t{} /* {} */\n", f.declaration(), f.doc);
        }
        if let Some(tail) = self.tail {
            out += &format!("\t{tail};\n");
        }
        out += "};\n";
        out += &format!("_Static_assert(sizeof(struct {name}) == {}, \"struct {name}: size\");\n", self.size);
        for f in &self.fields {
            out += &format!(
                "_Static_assert(offsetof(struct {name}, {0}) == {1}, \"struct {name}: offset of {0}\");\n",
                f.name, f.offset
            );
        }
        out
    }
}

/// A Rust type C can name.
pub trait CType {
    /// Its C name.
    const C: &'static str;
    /// For an array, its length.
    const LEN: Option<usize> = None;
}

impl CType for u64 {
    const C: &'static str = "uint64_t";
}
impl CType for u32 {
    const C: &'static str = "uint32_t";
}
impl CType for i32 {
    const C: &'static str = "int32_t";
}
impl CType for u8 {
    const C: &'static str = "uint8_t";
}
impl<T: CType, const N: usize> CType for [T; N] {
    const C: &'static str = T::C;
    const LEN: Option<usize> = Some(N);
}

/// The magic at offset 0.
pub const MAGIC: [u8; 8] = *b"tp-data\0";
/// The layout version; bumped on any incompatible change.
pub const VERSION: u32 = 28;
/// The memfd's name; `/proc/PID/maps` shows it as `/memfd:tp-data (deleted)`.
pub const MEMFD_NAME: &str = "tp-data";
/// How many code arenas the header records.
pub const MAX_ARENAS: usize = 64;
/// log2 of the counter rows (64): on x86-64 a thread takes a row of its
/// own ([`EventCtx::row_owner`]); on AArch64 threads hash their thread
/// pointer into them.
pub const SLOT_BITS: u32 = 6;
/// log2 of the entries of the thread cache in the [`Proc`] pages.
pub const CACHE_BITS: u32 = 7;
/// The multiplier of the thread cache's hash of the word at the thread
/// pointer: entry `(word as u32).wrapping_mul(CACHE_HASH) >> (32 - CACHE_BITS)`.
pub const CACHE_HASH: u32 = 0x9e37_79b1;
/// The check of a [`CacheEntry`] being written.
pub const CACHE_BUSY: u64 = 1;
/// The smallest probe capacity a region is created with.
pub const MIN_CAPACITY: u32 = 4096;
/// The largest: tp probes at most this many functions in one process, and
/// reads no more entries than this from a region.
pub const MAX_CAPACITY: u32 = 1 << 18;
/// The longest event ring (`--ring-size` is rounded into 4..=this).
pub const MAX_RING_LEN: u32 = 1 << 20;
/// log2 of the number of thread slots for events.
pub const EVENT_SLOT_BITS: u32 = 7;
/// Events per thread ring, unless `--ring-size` says otherwise.
pub const DEFAULT_RING_LEN: u32 = 2048;
/// Return addresses a thread's shadow stack holds.
pub const SHADOW_LEN: u32 = 128;
/// Bytes of the private area's first pages ([`Proc`]), which a fork wipes.
pub const PROC_PAGE: u64 = 8192;
/// Where the private area keeps [`PRIVATE_MAGIC`]: the first word of the
/// page after [`Proc`]'s, which a fork copies like the rest.
pub const PRIVATE_MAGIC_OFF: u64 = PROC_PAGE;
/// Where the thread states begin in the private area.
pub const THREADS_OFF: u64 = PROC_PAGE + 4096;
/// The bytes of a site's window its entry keeps ([`Entry::original`]): no
/// planner makes a longer window (`arch::MAX_WINDOW`).
pub const WINDOW_BYTES: usize = 24;
/// Goroutines whose timed calls of Go code tp can keep at once
/// ([`Goroutine`]), and the calls each can keep.
pub const GO_SLOTS: u32 = 1024;
/// See [`GO_SLOTS`].
pub const GO_FRAMES: u32 = 127;
/// What tp writes at [`PRIVATE_MAGIC_OFF`], so that a private area no
/// region records (tp was killed in between) can be recognised.
pub const PRIVATE_MAGIC: u64 = u64::from_le_bytes(*b"tp-priv\0");

/// How the runtime tells threads apart (`EventCtx::key_how`); the thread
/// key identifies a thread within its process, on any runtime.
pub mod key_how {
    /// Not known yet (no event probe was installed).
    pub const UNKNOWN: u32 = 0;
    /// The thread register the CPU reads in user space: the FS base
    /// (`rdfsbase`, when the kernel enables FSGSBASE) on x86-64,
    /// TPIDR_EL0 on AArch64.
    pub const REGISTER: u32 = 1;
    /// The word at the thread pointer (fs:0): glibc and musl keep the
    /// TCB's own address there, which is the FS base. Every thread tp saw
    /// at attach did; a thread where it reads 0 asks the kernel.
    pub const TCB: u32 = 2;
    /// Ask the kernel for the FS base at every event (arch_prctl).
    pub const SYSCALL: u32 = 3;
    /// As [`TCB`], and a thread where the word reads 0 (Go's) reads its
    /// FS base with `rdfsbase`. The word is a plain load; `rdfsbase` costs
    /// several nanoseconds more per event on the CPUs tp was measured on.
    pub const TCB_REGISTER: u32 = 4;
}

/// A code arena: private R-X pages in the target that hold detours.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arena {
    /// Its address in the target.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes used from the start; detours are only ever appended.
    pub used: u64,
    /// Address of the runtime block in this arena (runtime functions and the
    /// return trampoline), or 0 if the arena has none yet.
    pub runtime: u64,
}

shared_struct! {
    /// What the in-target runtime reads (`struct tp_ctx` in runtime.c).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct EventCtx as "tp_ctx" {
        /// Address in the target of thread slot 0.
        pub slots: u64,
        /// Bytes per thread slot.
        pub slot_size: u64,
        /// log2 of the number of thread slots.
        pub slot_bits: u32,
        /// Events per ring, minus one (a power of two minus one).
        pub ring_mask: u32,
        /// Frames per shadow stack.
        pub shadow_len: u32,
        /// Offset from the thread pointer of the TID in the TCB; 0 if unknown.
        pub tid_offset: i32,
        /// Events dropped because every slot was taken.
        pub lost_no_slot: u64,
        /// Address in the target of the enable flags.
        pub flags: u64,
        /// Address in the target of the sample budgets.
        pub budgets: u64,
        /// Address in the target of the sampling periods.
        pub periods: u64,
        /// Bytes from a counter to the matching sampling countdown.
        pub countdowns_from_counters: u64,
        /// Bit i: thread slot i has been claimed. The tracer reads only those
        /// (reading the others would allocate their pages).
        pub claimed: [u64; CLAIMED_WORDS],
        /// Address in the target of the private area (its [`Proc`] page,
        /// then the thread states); the same in every process forked since.
        pub private: u64,
        /// Bytes per thread state in the private area.
        pub thread_size: u64,
        /// How the runtime tells threads apart: a [`key_how`] value.
        pub key_how: u32,
        /// Padding.
        pub pad: u32,
        /// Calls whose return address a return probe could not find: never
        /// expected; the process that had one was ended (SIGABRT).
        pub returns_lost: u64,
        /// Timed calls whose exits went unrecorded because their thread (or
        /// goroutine) had more timed calls live than its frames hold
        /// ([`SHADOW_LEN`]), or no goroutine entry was free.
        pub lost_too_deep: u64,
        /// Entries of Go functions without a stack check not recorded
        /// because their goroutine's stack had less room below the stack
        /// pointer than the runtime's call takes (the detour counts them).
        pub lost_no_room: u64,
        /// Address in the target of the per-probe configurations ([`ProbeConfig`]).
        pub configs: u64,
        /// Bytes from a thread slot to its aggregates ([`AggHead`]).
        pub agg_off: u64,
        /// Nanoseconds per timestamp tick, times 2^[`NS_SHIFT`] (0 until a
        /// session asks for latency in `--agg`): the runtime converts a
        /// call's duration to nanoseconds as `ticks * ns_mult >>
        /// NS_SHIFT`, as the kernel's clocksources do with their mult and
        /// shift, so `--agg 'hist(latency)'` buckets nanoseconds.
        pub ns_mult: u64,
        /// The main thread's stack, as tp saw it at attach: the lowest
        /// address of its mapping (it only grows down from there) ...
        pub main_stack_lo: u64,
        /// ... and its end. A stack walk reads only inside a thread's stack.
        pub main_stack_hi: u64,
        /// 1 if the runtime may ask the kernel whether memory is readable
        /// (madvise MADV_POPULATE_READ: the process's seccomp filters allow
        /// it): another thread's stack, before a walk (else only the main
        /// thread's stack is walked), and the places [`EventCtx::tid_candidates`]
        /// names.
        pub may_check_memory: u32,
        /// log2 of the byte stride between counter rows.
        pub stride_shift: u32,
        /// Address in the target of counter row 0.
        pub counters: u64,
        /// 1 if a thread may take a counter row of its own (x86-64), which
        /// makes getpid, gettid and kill(pid, 0) on its first count in a
        /// process: every thread's seccomp filters let them run. Else every
        /// thread counts in the shared row 0, without a syscall.
        pub may_take_rows: u32,
        /// Padding.
        pub pad3: u32,
        /// Where the TCB may keep the TID when [`EventCtx::tid_offset`] is
        /// 0 (0 where there is none): the places near its thread pointer
        /// where the lone thread tp saw at attach held its TID. The first
        /// other thread to take a state tells them apart: the one place
        /// where it finds its own TID becomes `tid_offset`.
        pub tid_candidates: [i32; TID_CANDIDATES],
        /// Who counts in each counter row (x86-64): 0 if nobody yet, else
        /// the PID (high 32 bits) and TID of the thread that took it, which
        /// alone adds to it, without a lock. Row 0 is never taken: threads
        /// without a row of their own add to it atomically. A row whose
        /// process is gone is taken again.
        pub row_owner: [u64; 1 << SLOT_BITS],
    }
}

/// Places [`EventCtx::tid_candidates`] holds.
pub const TID_CANDIDATES: usize = 4;

/// Words of [`EventCtx::claimed`].
pub const CLAIMED_WORDS: usize = (1 << EVENT_SLOT_BITS) / 64;

shared_struct! {
    /// The head of a thread slot (`struct tp_slot` in runtime.c, where the
    /// ring follows it): the ring one thread of one process writes.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct SlotHead as "tp_slot", then "struct tp_event ring[]" {
        /// 0 if free; else the PID (high 32 bits) and TID (low 32 bits) of
        /// the thread that claimed it. tp frees the slot of a process that
        /// ended once its ring is drained.
        pub key: u64,
        /// Events dropped: the ring was full.
        pub lost: u64,
        /// The `head` at which the ring is full as the thread last saw
        /// `tail` (that `tail` plus the ring's length): below it there is
        /// room, and the thread looks at `tail` again only when it is not.
        pub limit: u64,
        /// Padding to the next cache line.
        pub pad0: [u64; 5],
        /// Next event the thread writes.
        pub head: u64,
        /// Padding.
        pub pad1: [u64; 7],
        /// Next event the tracer reads.
        pub tail: u64,
        /// Padding.
        pub pad2: [u64; 7],
    }
}

shared_struct! {
    /// The rendezvous with the dynamic linker (`struct tp_rendezvous`, at
    /// [`RENDEZVOUS_OFF`] in the region, apart from the header, which tp
    /// rewrites whole): the words a thread at tp's probe on
    /// `_dl_debug_state` and tp hand it over with. The loader calls that
    /// function after it maps a library and before it runs the library's
    /// initializers, and around an unmap. While `armed`, the thread counts
    /// itself in `arrived`, wakes tp (a futex on `arrived`) and waits on
    /// `handled` (a futex, in slices of [`RENDEZVOUS_SLICE_MS`], at most
    /// `slices` of them) until tp has probed what the loader mapped. After
    /// each slice it checks that tp still runs (`kill(tracer, 0)`); a thread
    /// whose tp is gone, or does not answer in time, goes on, clears `armed`
    /// (later rendezvous do not wait until tp arms it again) and counts in
    /// `gave_up`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Rendezvous as "tp_rendezvous" {
        /// 1 while a session waits for libraries; else the probe only counts.
        pub armed: u32,
        /// Arrivals at the rendezvous while armed, wrapping.
        pub arrived: u32,
        /// The last arrival tp has answered.
        pub handled: u32,
        /// How many slices a thread waits for tp at most.
        pub slices: u32,
        /// Threads that went on without tp's answer.
        pub gave_up: u32,
        /// tp's PID as the target's PID namespace numbers it; 0 where tp has
        /// none there (the thread then waits out its slices).
        pub tracer: u32,
        /// Address in the target of the loader's `_r_debug.r_state` (an
        /// int), or 0: where known, a thread waits only when it reads
        /// `RT_CONSISTENT` (0) there, after a map or an unmap, not before.
        pub state: u64,
    }
}

shared_struct! {
    /// The hand-over of a call to be stepped (`struct tp_step`, at
    /// [`STEP_OFF`] in the region, beside the [`Rendezvous`]): the words a
    /// thread at a probe of kind [`kind::STEP`] and tp hand it over with.
    /// While `armed` (calls tp still wants to step), the first thread to
    /// claim `busy` writes its TID, counts itself in `arrived`, wakes tp
    /// and waits on `handled` as at the rendezvous (bounded slices, `kill(tracer,
    /// 0)` after each). tp takes the thread with ptrace while it waits,
    /// answers in `handled` and steps it through the call; then it clears
    /// `busy` for the next. A thread tp does not answer in time goes on,
    /// clears `busy` and counts in `gave_up`; one whose tp is gone clears
    /// `armed` too.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct StepHandoff as "tp_step" {
        /// Calls tp still wants to step; 0: the probes only count.
        pub armed: u32,
        /// 1 while a thread holds the hand-over.
        pub busy: u32,
        /// The TID (as its PID namespace numbers it) of the thread that holds it.
        pub tid: u32,
        /// Arrivals, wrapping.
        pub arrived: u32,
        /// The last arrival tp has answered.
        pub handled: u32,
        /// How many slices a thread waits for tp at most.
        pub slices: u32,
        /// Threads that went on without tp's answer.
        pub gave_up: u32,
        /// tp's PID as the target's PID namespace numbers it, or 0.
        pub tracer: u32,
        /// The in-target engine's [`TrapTrace`] in the target (its own
        /// mapping), or 0: tp steps the calls with ptrace. With one, the
        /// thread that claims `busy` sets the trap flag and traces its own
        /// call in the SIGTRAP handler tp installed (`tp_trap`), not waiting
        /// for tp; tp frees `busy` once it has read the trace.
        pub trap: u64,
    }
}

shared_struct! {
    /// A call traced by the in-target engine (`struct tp_trap_trace`, at
    /// the start of its own mapping, the addresses of the instructions
    /// after it): the runtime's `tp_step` fills in the thread, the stack
    /// pointer at the function's entry and the start, and sets the trap
    /// flag; the SIGTRAP handler (`tp_trap`) appends the address of each
    /// instruction about to run, until the stack pointer is above the
    /// entry's (the call returned or unwound), `cap` addresses, a syscall
    /// that would block SIGTRAP or replace its handler, or tp's end
    /// (`armed` cleared, tp gone); then it clears the flag, writes `end`
    /// and `stop` and sets `state` to [`trap::DONE`]. tp reads the trace
    /// once it is done and sets `state` back to [`trap::IDLE`].
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct TrapTrace as "tp_trap_trace" {
        /// [`trap::IDLE`], [`trap::TRACING`] or [`trap::DONE`].
        pub state: u32,
        /// Why the trace ended ([`trap::RETURNED`], ...).
        pub end: u32,
        /// The traced thread, as the kernel's gettid answers it there.
        pub tid: u32,
        /// The syscall the trace ended at ([`trap::SYSCALL`]).
        pub syscall: u32,
        /// Addresses written after this header.
        pub count: u64,
        /// Addresses the mapping holds after this header.
        pub cap: u64,
        /// The stack pointer at the function's first instruction.
        pub entry_sp: u64,
        /// The runtime's timestamp when the flag was set.
        pub start: u64,
        /// The runtime's timestamp when the trace ended.
        pub stop: u64,
        /// Traps of other threads that had inherited the flag (a thread the
        /// traced one created, a forked child): the flag cleared in each.
        pub strays: u32,
        /// Padding to 64 bytes.
        pub pad: u32,
    }
}

/// The in-target engine's states and ends ([`TrapTrace`]).
pub mod trap {
    /// No call is traced.
    pub const IDLE: u32 = 0;
    /// A call is traced.
    pub const TRACING: u32 = 1;
    /// The trace ended; tp has not read it yet.
    pub const DONE: u32 = 2;
    /// The call returned or unwound past its frame.
    pub const RETURNED: u32 = 1;
    /// The trace holds `cap` addresses; the call ran on free.
    pub const LIMIT: u32 = 2;
    /// At a syscall that would block SIGTRAP or replace its handler: the
    /// call ran on free from there.
    pub const SYSCALL: u32 = 3;
    /// tp stopped stepping or is gone.
    pub const STOPPED: u32 = 4;
    /// Bytes from a [`super::TrapTrace`] to its first address.
    pub const PCS_OFF: u64 = 64;
}

/// Where the [`StepHandoff`] lies in the region: before the [`Rendezvous`].
pub const STEP_OFF: u64 = RENDEZVOUS_OFF - 64;

/// Where the [`Rendezvous`] lies in the region: the end of the header's page.
pub const RENDEZVOUS_OFF: u64 = 4096 - 64;
/// One slice of a thread's wait at the rendezvous, in milliseconds.
pub const RENDEZVOUS_SLICE_MS: u32 = 10;
/// The most slices a thread waits at the rendezvous (the runtime's own bound).
pub const RENDEZVOUS_MAX_SLICES: u32 = 6000;

shared_struct! {
    /// One entry of the thread cache (`struct tp_cache_entry`): where the
    /// detours find, without calling the runtime, a thread's counter row
    /// and its state, by the word at its thread pointer.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct CacheEntry as "tp_cache_entry" {
        /// The word's complement (`!word`); 0 while the entry is empty and
        /// [`CACHE_BUSY`] while a thread writes it, which no word matches.
        /// A thread takes an empty entry (compare-and-swap to `CACHE_BUSY`),
        /// writes `row`, `thread` and `ring`, then this; the check, row and
        /// state never change again in this process: a detour that finds
        /// `!word` here may read the rest afterwards (x86-64 keeps stores
        /// in order).
        pub check: u64,
        /// Address of the thread's own counter row.
        pub row: u64,
        /// Address of the thread's state.
        pub thread: u64,
        /// Address of the ring slot the fast paths write the thread's
        /// events into: its own, once it has one and its TID is in its TCB
        /// at the offset tp found (they read it there); else 0, and its
        /// events go through the runtime. Only the thread writes it (the
        /// runtime, on its calls), so it may change; here the fast paths
        /// find the ring without going through the state first.
        pub ring: u64,
    }
}

impl CType for CacheEntry {
    const C: &'static str = "struct tp_cache_entry";
}

shared_struct! {
    /// The first pages of the private area (`struct tp_proc`): the process
    /// they belong to, and the thread cache the x86-64 detours read.
    /// MADV_WIPEONFORK: a process forked since reads zeros, learns its PID,
    /// takes its threads' states afresh and fills its cache again.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Proc as "tp_proc" {
        /// The process's PID, once a thread of it ran the runtime; 0 before.
        pub pid: u32,
        /// Padding.
        pub pad: u32,
        /// Padding to the cache's first entry (64-byte aligned, so that an
        /// entry and the one paired with it differ in bit 5 of the address).
        pub pad2: [u64; 7],
        /// By the thread's word at its thread pointer (see [`CACHE_HASH`]):
        /// each thread that counts in a row of its own, and whose word is
        /// its key, in the entry of its index or the one paired with it
        /// (index xor 1); written by the runtime.
        pub cache: [CacheEntry; 1 << CACHE_BITS],
    }
}

impl Default for Proc {
    fn default() -> Proc {
        Proc { pid: 0, pad: 0, pad2: [0; 7], cache: [CacheEntry::default(); 1 << CACHE_BITS] }
    }
}

/// The index in the [`Proc`] thread cache of the thread whose word at the
/// thread pointer is `word`.
pub const fn cache_index(word: u64) -> u64 {
    ((word as u32).wrapping_mul(CACHE_HASH) >> (32 - CACHE_BITS)) as u64
}

shared_struct! {
    /// One thread's state in the private area (`struct tp_thread`, where
    /// its shadow stack follows it). Private memory: a fork copies it, so a
    /// child returns through its own copy of the frames live at the fork.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct ThreadState as "tp_thread", then "struct tp_frame shadow[]" {
        /// The thread's key (see [`key_how`]); 0 if free.
        pub key: u64,
        /// Address of the thread's ring slot in the data region; 0 until
        /// its first event in this process.
        pub ring: u64,
        /// Timestamp ticks the thread spent in the runtime's entry and exit.
        pub overhead: u64,
        /// The process this state was taken in; another value means a fork
        /// copied it, and the thread takes it afresh.
        pub pid: u32,
        /// The thread's TID, from the kernel when it took the state.
        pub tid: u32,
        /// Shadow frames in use.
        pub depth: u32,
        /// Nonzero while the thread writes into its ring: the probes of a
        /// signal handler that interrupts the write count their events lost
        /// rather than write over the event being written.
        pub writing: u32,
        /// Where events read the thread's TID: in its TCB, when its key is
        /// a TCB's address (the word there is the key itself, as glibc and
        /// musl keep it) and tp found the TID's offset; else `tid` above.
        pub tid_at: u64,
        /// The thread's counter row in this process (1 to 63; x86-64), 0
        /// before it takes one or when none was free (row 0, shared).
        pub row: u32,
        /// The TID that `stack_lo` and `stack_hi` were learnt for: a new
        /// thread that takes this state learns its own.
        pub stack_tid: u32,
        /// The part of the thread's stack known readable, from its lowest
        /// address ... (a stack walk reads only in `[stack_lo, stack_hi)`)
        pub stack_lo: u64,
        /// ... to its end; 0 while not known.
        pub stack_hi: u64,
        /// Padding to 128 bytes (the fields a hit reads fill the first 64).
        pub pad2: [u64; 7],
    }
}

shared_struct! {
    /// One shadow frame (`struct tp_frame` in runtime.c).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Frame as "tp_frame" {
        /// Stack address that held the return address.
        pub slot: u64,
        /// The original return address.
        pub ret: u64,
        /// Timestamp at entry.
        pub tsc: u64,
        /// Probe index.
        pub probe: u32,
        /// `--agg` of the latency or the return value keyed by an argument:
        /// the argument's low 32 bits at entry (a key of at most 32 bits,
        /// which the exit extends again as [`ProbeConfig::by`] says).
        pub key: u32,
        /// The trampoline address written into the slot.
        pub tramp: u64,
        /// The slot's `overhead` when the call began.
        pub overhead: u64,
        /// Where the function keeps its return address while it calls
        /// others, where a call leaves it in a register (AArch64's link
        /// register, which the function saves in its frame): the runtime
        /// checks there that the frame is live and puts the address back
        /// when unwinding starts. 0 where the slot itself holds it
        /// (x86-64), or where it is not known (see the architecture's
        /// runtime.h).
        pub ra_at: u64,
        /// Ticks of the timed calls that ended while this frame was the
        /// thread's innermost live one (each call's own duration, without
        /// tp's work): the time of its call spent in timed calls it made,
        /// sent with its exit ([`Event::v`]) so that tp knows its self time.
        pub children: u64,
    }
}

shared_struct! {
    /// The timed calls of Go code live on one goroutine (`struct
    /// tp_goroutine`, its frames after it), in the private area after the
    /// thread states: a goroutine moves between threads, and its stack
    /// moves when it grows (copied whole, each frame at the same distance
    /// from its top), so a call of Go code is its goroutine's, keyed by that
    /// distance. Taken for a goroutine's first timed call, given back when
    /// its last returns.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Goroutine as "tp_goroutine", then "struct tp_go_frame frames[]" {
        /// The goroutine (its `g`); 0 if free.
        pub g: u64,
        /// Frames in use.
        pub depth: u32,
        /// Padding.
        pub pad: u32,
        /// Ticks tp spent in the probes of its timed calls' callees.
        pub overhead: u64,
        /// Padding.
        pub pad2: u64,
    }
}

shared_struct! {
    /// One timed call of Go code (`struct tp_go_frame`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GoFrame as "tp_go_frame" {
        /// Bytes from the top of the goroutine's stack (`g.stack.hi`) down
        /// to the call's slot (where its return address is; AArch64: the
        /// word below the entry stack pointer): below 1 GB, Go's largest
        /// stack.
        pub off: u32,
        /// Probe index.
        pub probe: u32,
        /// Timestamp at entry.
        pub tsc: u64,
        /// The goroutine's `overhead` when the call began.
        pub overhead: u64,
        /// Ticks of the timed calls that ended while this frame was the
        /// goroutine's innermost live one (as [`Frame::children`]).
        pub children: u64,
    }
}

shared_struct! {
    /// One event (`struct tp_event` in runtime.c).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Event as "tp_event" {
        /// Probe index, with the kind in the top byte.
        pub probe: u32,
        /// Thread ID.
        pub tid: u32,
        /// Timestamp (cycle counter).
        pub tsc: u64,
        /// Entry: the first six integer argument registers. Exit: return
        /// value, entry timestamp, second return register, ticks tp spent in
        /// probes of the functions the call made, nonzero for a tail call,
        /// and the ticks of the timed calls made inside the call whose
        /// innermost timed caller it was ([`Frame::children`]).
        pub v: [u64; ENTRY_REGS],
    }
}

/// Integer argument registers an entry event holds; an ABI that passes
/// more in registers records the rest in an event before it
/// ([`event_kind::ARGS_MORE`]).
pub const ENTRY_REGS: usize = 6;
/// Registers an [`event_kind::ARGS_MORE`] record carries: the seventh to
/// ninth argument registers (AArch64 has eight, Go's ABI on x86-64 nine).
pub const MORE_REGS: usize = 3;

/// Where an event's kind ([`event_kind`]) sits in [`Event::probe`], and
/// where the flags ([`entry_flags`]) sit in the word passed to `tp_entry`:
/// above the probe index.
pub const KIND_SHIFT: u32 = 24;
/// The probe index in [`Event::probe`] and in the words passed to
/// `tp_entry` and the exit (whose top bits below the kind are
/// [`entry_flags::RECORD_MORE`], [`entry_flags::TIME_CALL`] and
/// [`entry_flags::TAIL_CALL`], [`entry_flags::GO_FRAMES`]: no index
/// reaches them, [`MAX_CAPACITY`] being far smaller).
pub const PROBE_MASK: u32 = (1 << (KIND_SHIFT - 4)) - 1;

/// Event kinds (the top byte of [`Event::probe`]).
pub mod event_kind {
    /// Function entry.
    pub const ENTRY: u8 = 1;
    /// Function exit.
    pub const EXIT: u8 = 2;
    /// An exception unwound the frame; its exit was not seen.
    pub const UNWOUND: u8 = 3;
    /// Words of a stack that belong to the event before it in the same
    /// ring: the probe field's low bits say how many (1 to
    /// [`super::STACK_WORDS_PER_EVENT`]), held in `tsc` and `v`.
    pub const STACK: u8 = 4;
    /// The integer argument registers after the sixth (AArch64's seventh
    /// and eighth, in `v[0]` and `v[1]`), of the entry event that follows
    /// it in the same ring with the same timestamp.
    pub const ARGS_MORE: u8 = 5;
}

/// Words of a stack one [`Event`] of kind [`event_kind::STACK`] carries.
pub const STACK_WORDS_PER_EVENT: u32 = 7;
/// How far apart two stack addresses may be and still be taken for the
/// same stack: a shadow frame deeper than a call that returns, or at or
/// below one that begins, on the same stack, is dead; one farther away may
/// live on another stack (a coroutine's, a signal stack).
pub const STACK_SPAN: u64 = 8 << 20;

/// The most return addresses a frame-pointer walk records.
pub const MAX_STACK_DEPTH: u32 = 127;
/// The most bytes of the stack's top an event copies for tp to unwind.
pub const MAX_STACK_COPY: u32 = 16 << 10;

/// The first word of a recorded stack: how it was taken and how long it is.
pub mod stack_word {
    /// Bits 0..8: how the stack was taken.
    pub const MODE_MASK: u64 = 0xff;
    /// Return addresses found by following frame pointers (the caller's
    /// first), `count` of them.
    pub const MODE_FRAMES: u64 = 1;
    /// A copy of the stack's top for tp to unwind: the stack pointer, the
    /// frame pointer and the return address at the function's entry, then
    /// `count` words of the stack from the stack pointer up.
    pub const MODE_COPY: u64 = 2;
    /// Bit 8: the walk stopped at the depth asked for (or the copy at its
    /// length), not at the stack's end.
    pub const TRUNCATED: u64 = 1 << 8;
    /// Bit 9: the thread's stack bounds were not known: only the return
    /// address at the stack pointer was read.
    pub const NO_BOUNDS: u64 = 1 << 9;
    /// Where the count of words that follow sits.
    pub const COUNT_SHIFT: u32 = 16;
    /// Values copied from the target's memory at the call's entry
    /// (`--args 'req->len'`, [`super::ProbeConfig::fetch`]), `count` words:
    /// a word with bit `i` set where value `i` was read whole, then for
    /// each value its word (zero-extended; where it could not be read,
    /// the address the read failed at), and after the word of a string's
    /// pointer ([`super::fetch_word::STR_SHIFT`]) how many of its bytes
    /// were read and those bytes, eight to a word, low byte first.
    pub const MODE_FIELDS: u64 = 3;
}

/// The predicate bytecode the runtime interprets (`--if`): a stack machine
/// of at most [`FILTER_DEPTH`] values over a program of at most
/// [`FILTER_WORDS`] words, each word an operation in its low byte (and for
/// [`filter_op::ARG`] a register and how to extend it). tp validates a
/// program before writing it; the runtime checks every step again (the
/// target can write the region), and a program that goes wrong selects
/// the call.
pub mod filter_op {
    /// End: the result is the one value left.
    pub const END: u64 = 0;
    /// Push a value: bits 8..16 say which (0-5 the integer argument
    /// registers, 6 the return value), bits 16..24 how to extend it
    /// ([`super::filter_ext`]).
    pub const ARG: u64 = 1;
    /// Push the next word.
    pub const IMM: u64 = 2;
    /// Pop b, a; push a == b.
    pub const EQ: u64 = 3;
    /// a != b.
    pub const NE: u64 = 4;
    /// a < b as signed integers.
    pub const LT_S: u64 = 5;
    /// a <= b signed.
    pub const LE_S: u64 = 6;
    /// a < b unsigned.
    pub const LT_U: u64 = 7;
    /// a <= b unsigned.
    pub const LE_U: u64 = 8;
    /// Both non-zero.
    pub const AND: u64 = 9;
    /// Either non-zero.
    pub const OR: u64 = 10;
    /// Pop a; push a == 0.
    pub const NOT: u64 = 11;
    /// Pop b, a; push a & b (bitwise).
    pub const BIT_AND: u64 = 12;
    /// a | b (bitwise).
    pub const BIT_OR: u64 = 13;
    /// a ^ b (bitwise).
    pub const BIT_XOR: u64 = 14;
    /// Pop a; push 1 if the C string at address a equals the literal
    /// that follows (bits 8..16: its length, at most
    /// [`super::FILTER_STR_MAX`]; the bytes in the next words, eight to a
    /// word, low byte first), or with bit 16 set starts with it; else 0,
    /// and 0 where the bytes cannot be read (the runtime reads them with
    /// process_vm_readv, which fails instead of faulting).
    pub const STR: u64 = 15;
    /// [`STR`]'s flag: the string starts with the literal.
    pub const STR_PREFIX: u64 = 1 << 16;
    /// Pop a; push the value of bits 16..24 bytes (1, 2, 4 or 8) at the
    /// address a plus the next word, extended as bits 8..16 say
    /// ([`super::filter_ext`]): a struct's field (`req->len`). The runtime
    /// reads it with process_vm_readv; where it cannot, the call is not
    /// selected (the program ends with 0).
    pub const LOAD: u64 = 16;
    /// The largest operation.
    pub const LAST: u64 = LOAD;
}

/// How [`filter_op::ARG`] extends a register's low bytes to 64 bits (a C
/// `int` argument leaves the register's high half undefined).
pub mod filter_ext {
    /// The whole register.
    pub const U64: u64 = 0;
    /// Sign-extend the low byte.
    pub const I8: u64 = 1;
    /// Zero-extend the low byte.
    pub const U8: u64 = 2;
    /// Sign-extend the low 16 bits.
    pub const I16: u64 = 3;
    /// Zero-extend the low 16 bits.
    pub const U16: u64 = 4;
    /// Sign-extend the low 32 bits.
    pub const I32: u64 = 5;
    /// Zero-extend the low 32 bits.
    pub const U32: u64 = 6;
    /// The largest.
    pub const LAST: u64 = U32;
}

/// Words of one predicate program.
pub const FILTER_WORDS: usize = 23;
/// Values a predicate's stack holds.
pub const FILTER_DEPTH: usize = 8;
/// The value [`filter_op::ARG`] names for the return value.
pub const FILTER_RET: u64 = 6;
/// The longest literal [`filter_op::STR`] compares a string with.
pub const FILTER_STR_MAX: usize = 64;

/// Words of a probe's fetch program ([`ProbeConfig::fetch`]).
pub const FETCH_WORDS: usize = 24;
/// Values one fetch program copies.
pub const FETCH_VALUES: usize = 8;
/// Loads one fetched value follows (`a->b->c->d`: pointers read on the way,
/// then the value itself).
pub const FETCH_DEPTH: usize = 4;
/// Bytes of a string a fetched `char *` copies.
pub const FETCH_STR_MAX: usize = 64;

/// One value of a fetch program ([`ProbeConfig::fetch`]): a header word,
/// then one word per load, each an offset added to the address before
/// it is read. From the argument register, each load but the last reads
/// a pointer (8 bytes), and the last the value (`width` bytes); with
/// `loads` 0 the value is the register itself. A value with a string
/// length then copies that many bytes of the string it points at. A zero
/// header ends the program. The runtime reads everything with
/// process_vm_readv, which fails where a load would fault.
pub mod fetch_word {
    /// Bits 0..8: the argument register (0 to 5).
    pub const REG_MASK: u64 = 0xff;
    /// Bits 8..16: how many loads follow (0 to [`super::FETCH_DEPTH`]).
    pub const LOADS_SHIFT: u32 = 8;
    /// Bits 16..24: bytes the last load reads (1, 2, 4 or 8).
    pub const WIDTH_SHIFT: u32 = 16;
    /// Bits 24..32: bytes of the string the value points at to copy (0,
    /// or a multiple of 8 up to [`super::FETCH_STR_MAX`]).
    pub const STR_SHIFT: u32 = 24;
    /// Bit 32: set in every header (a zero word ends the program).
    pub const VALID: u64 = 1 << 32;
    /// In [`super::ProbeConfig::agg`] only, bits 40..48: how the value
    /// read is extended to 64 bits (a `filter_ext`).
    pub const EXT_SHIFT: u32 = 40;
    /// In [`super::ProbeConfig::agg`] only: the value is signed (its
    /// minimum and maximum compare signed, a negative one has a bucket
    /// of its own).
    pub const SIGNED: u64 = 1 << 48;
}

shared_struct! {
    /// What one probe records beyond its kind (`struct tp_probe_config`):
    /// its predicates, the argument its calls are counted by, its stack.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct ProbeConfig as "tp_probe_config" {
        /// The predicate on the arguments, run at entry (`entry_flags::FILTER`).
        pub entry: [u64; FILTER_WORDS],
        /// The predicate on the return value, run at exit (`entry_flags::FILTER_EXIT`).
        pub exit: [u64; FILTER_WORDS],
        /// `--by` and `--agg`: the argument register (bits 0..8, [`by_word`]),
        /// how it is extended (bits 8..16, a `filter_ext`), and whether the
        /// call goes to the thread's table of aggregates ([`AggEntry`]).
        pub by: u32,
        /// `--stack`: frame-pointer walk depth, or 0.
        pub stack_depth: u32,
        /// `--stack`: bytes of the stack's top to copy for tp to unwind, or 0.
        pub stack_copy: u32,
        /// The probe's [`entry_flags`], for `tp_exit_ext` (an exit knows
        /// its probe, not its flags).
        pub flags: u32,
        /// `--if`: the calls that passed the probe's predicates, counted by
        /// the runtime where the last of them passes (the hit counter, in
        /// the detour, counts every call before any predicate runs).
        pub matched: u64,
        /// `--args` with fields: the values the runtime copies at entry
        /// ([`fetch_word`]), sent after the entry event as its stack would
        /// be ([`stack_word::MODE_FIELDS`]); the first word 0 if none.
        pub fetch: [u64; FETCH_WORDS],
        /// `--agg`: the value aggregated at entry ([`fetch_word`]: a header
        /// with [`fetch_word::EXT_SHIFT`] and [`fetch_word::SIGNED`], then
        /// its loads); a zero header counts the calls alone.
        pub agg: [u64; AGG_VALUE_WORDS],
        /// `--by`'s keys in the words that name them (`stack(2),tid`:
        /// [`text_words`]), for `tp status` to name and merge the rows it
        /// reads; nothing reads it in the target.
        pub by_text: [u64; BY_TEXT_WORDS],
        /// `--agg`'s functions and value, the value named once
        /// (`count,hist(latency)`), likewise.
        pub agg_text: [u64; AGG_TEXT_WORDS],
    }
}

/// Words of [`ProbeConfig::by_text`].
pub const BY_TEXT_WORDS: usize = 8;
/// Words of [`ProbeConfig::agg_text`].
pub const AGG_TEXT_WORDS: usize = 32;

/// `text` in `N` words, its bytes in order, NUL-padded; all zeros if it
/// does not fit with a NUL after it.
pub fn text_words<const N: usize>(text: &str) -> [u64; N] {
    let mut out = [0u64; N];
    if text.len() < N * 8 {
        for (i, b) in text.bytes().enumerate() {
            out[i / 8] |= (b as u64) << (8 * (i % 8));
        }
    }
    out
}

/// The text [`text_words`] wrote: its bytes up to the first NUL (the
/// words are the target's to write: the bytes are taken as they are,
/// invalid UTF-8 replaced).
pub fn words_text(words: &[u64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Words of [`ProbeConfig::agg`]: a header and its loads.
pub const AGG_VALUE_WORDS: usize = 1 + FETCH_DEPTH;

/// The bits of [`ProbeConfig::by`].
pub mod by_word {
    /// Bits 0..8: the argument register whose value keys the call,
    /// [`CALLER`], or [`NO_VALUE`].
    pub const REG_MASK: u32 = 0xff;
    /// No value keys the call (`--by tid`, or no `--by`): its key is 0.
    pub const NO_VALUE: u32 = 0xff;
    /// The call's return address keys it (`--by caller`): at entry the
    /// word the call left (`tp_return_address`, the arch's runtime.h), at
    /// the exit the one the call's shadow frame kept (`Frame::ret`).
    pub const CALLER: u32 = 0xfe;
    /// The call's stack keys it (`--by stack`): the hash of its return
    /// addresses ([`super::stack_hash`]), found by following frame
    /// pointers from the call's return address, at most the frames in
    /// bits 8..16 ([`super::STACK_KEY_DEPTH`] at most), at entry and again
    /// at the exit (the function has put the caller's frame pointer back).
    /// A new key's frames go in the thread's [`super::StackKey`] store.
    pub const STACK: u32 = 0xfd;
    /// Bits 8..16: how the argument is extended (a `filter_ext`), or with
    /// [`STACK`] how many frames the key takes.
    pub const EXT_SHIFT: u32 = 8;
    /// The call goes to the thread's [`super::AggEntry`] table (with the
    /// value [`super::ProbeConfig::agg`] reads), not its
    /// [`super::ByEntry`] table of counts.
    pub const AGG: u32 = 1 << 16;
    /// With [`AGG`]: the value is the return value, added at the exit of
    /// a call whose durations are kept in the target
    /// ([`super::entry_flags::AGGREGATE`]); the entry adds nothing.
    pub const AT_EXIT: u32 = 1 << 17;
    /// With [`AT_EXIT`]: the value is the call's duration in nanoseconds
    /// (`--agg 'hist(latency)'`), not its return value.
    pub const LATENCY: u32 = 1 << 18;
    /// With [`AT_EXIT`] and an argument in [`REG_MASK`]: the entry keeps
    /// the argument's low 32 bits in the call's shadow frame
    /// ([`super::Frame::key`]), for the exit to key the value by.
    pub const KEY_IN_FRAME: u32 = 1 << 19;
}

/// The shift of [`EventCtx::ns_mult`].
pub const NS_SHIFT: u32 = 32;

/// `ticks` in nanoseconds by `mult` (what runtime.c computes, `to_ns`).
pub fn ticks_to_ns(ticks: u64, mult: u64) -> u64 {
    ((ticks as u128 * mult as u128) >> NS_SHIFT).min(u64::MAX as u128) as u64
}

/// The [`EventCtx::ns_mult`] of a counter of `ns_per_tick`.
pub fn ns_mult(ns_per_tick: f64) -> u64 {
    (ns_per_tick * (1u64 << NS_SHIFT) as f64).round() as u64
}

/// Log-linear buckets per power of two of a [`LatEntry`] (`2^LAT_SUB_BITS`).
pub const LAT_SUB_BITS: u32 = 3;
/// Buckets of a [`LatEntry`]: every power of two of ticks, each in
/// `2^LAT_SUB_BITS` parts.
pub const LAT_BUCKETS: usize = 64 << LAT_SUB_BITS;
/// Functions a thread aggregates latency for; a call of another one is
/// sent through the ring as an ordinary exit event.
pub const AGG_LAT_ENTRIES: usize = 32;
/// (function, value) pairs a thread counts for `--by`; more are counted as
/// overflow.
pub const AGG_BY_ENTRIES: usize = 512;
/// Places a lookup probes in a thread's aggregate tables before giving up.
pub const AGG_PROBES: u32 = 16;
/// log2 of [`AGG_BY_ENTRIES`].
pub const AGG_BY_BITS: u32 = AGG_BY_ENTRIES.trailing_zeros();
/// The most bytes above the stack pointer a thread's stack may reach for
/// the runtime to take the thread's TCB as its stack's end (glibc and musl
/// keep it at the top of the block the stack lies in).
pub const MAX_THREAD_STACK: u64 = 1 << 30;

shared_struct! {
    /// The head of a thread's aggregates (`struct tp_agg`), after its ring.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct AggHead as "tp_agg" {
        /// Calls `--by` could not count: the thread's table was full.
        pub by_overflow: u64,
        /// Calls `--agg` could not count: the thread's [`AggEntry`] table
        /// was full.
        pub agg_overflow: u64,
        /// Calls `--agg` did not count: their value could not be read (a
        /// bad pointer on the way to a field).
        pub agg_unreadable: u64,
        /// Padding to a cache line.
        pub pad: [u64; 5],
    }
}

shared_struct! {
    /// One function's latency on one thread (`struct tp_lat`): written by
    /// that thread alone, read by tp.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct LatEntry as "tp_lat" {
        /// The probe's index plus one; 0 while free.
        pub probe: u32,
        /// Padding.
        pub pad: u32,
        /// Calls timed.
        pub count: u64,
        /// Sum of their durations, ticks.
        pub sum: u64,
        /// Shortest, ticks.
        pub min: u64,
        /// Longest, ticks.
        pub max: u64,
        /// Padding to a cache line.
        pub pad2: [u64; 3],
        /// Calls per bucket ([`lat_bucket`]).
        pub buckets: [u64; LAT_BUCKETS],
    }
}

shared_struct! {
    /// One (function, argument value) count on one thread (`struct tp_by`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct ByEntry as "tp_by" {
        /// The probe's index plus one; 0 while free.
        pub probe: u32,
        /// Padding.
        pub pad: u32,
        /// The argument's value.
        pub value: u64,
        /// Calls with it.
        pub count: u64,
        /// The thread that counted them, as a slot's key says it (PID
        /// high, TID low: [`SlotHead::key`]): the entry is kept under it,
        /// so that a thread taking over the slot of one that ended (glibc
        /// gives a new thread the descriptor of one that ended) counts in
        /// entries of its own.
        pub owner: u64,
    }
}

/// Buckets of an [`AggEntry`]'s histogram: negative values, zero, then one
/// per power of two ([`agg_bucket`]).
pub const AGG_HIST_BUCKETS: usize = 66;
/// (function, key) aggregates a thread keeps for `--agg`; more are counted
/// as overflow.
pub const AGG_VAL_ENTRIES: usize = 128;
/// log2 of [`AGG_VAL_ENTRIES`].
pub const AGG_VAL_BITS: u32 = AGG_VAL_ENTRIES.trailing_zeros();

shared_struct! {
    /// One (function, key) aggregate of a value on one thread (`struct
    /// tp_aggv`): written by that thread alone, read by tp.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct AggEntry as "tp_aggv" {
        /// The probe's index plus one; 0 while free.
        pub probe: u32,
        /// Padding.
        pub pad: u32,
        /// The key's value ([`ProbeConfig::by`]), 0 if none.
        pub key: u64,
        /// Calls counted.
        pub count: u64,
        /// Sum of their values (wrapping).
        pub sum: u64,
        /// Smallest value (signed or not as [`fetch_word::SIGNED`] says).
        pub min: u64,
        /// Largest value.
        pub max: u64,
        /// The thread that counted them (as [`ByEntry::owner`]).
        pub owner: u64,
        /// Padding.
        pub pad2: u64,
        /// Calls per bucket ([`agg_bucket`]).
        pub buckets: [u64; AGG_HIST_BUCKETS],
    }
}

impl Default for AggEntry {
    fn default() -> AggEntry {
        AggEntry {
            probe: 0,
            pad: 0,
            key: 0,
            count: 0,
            sum: 0,
            min: 0,
            max: 0,
            owner: 0,
            pad2: 0,
            buckets: [0; AGG_HIST_BUCKETS],
        }
    }
}

/// The bucket of value `v` in an [`AggEntry`] (what runtime.c computes):
/// 0 for a negative one (`signed`), 1 for zero, `2 + k` for `[2^k, 2^(k+1))`.
pub fn agg_bucket(v: u64, signed: bool) -> usize {
    if signed && (v as i64) < 0 {
        0
    } else if v == 0 {
        1
    } else {
        2 + (63 - v.leading_zeros()) as usize
    }
}

impl Default for LatEntry {
    fn default() -> LatEntry {
        LatEntry { probe: 0, pad: 0, count: 0, sum: 0, min: 0, max: 0, pad2: [0; 3], buckets: [0; LAT_BUCKETS] }
    }
}

/// The most frames a `--by stack` key takes (the return addresses of the
/// call and of its callers).
pub const STACK_KEY_DEPTH: usize = 32;

shared_struct! {
    /// The frames of a `--by stack` key (`struct tp_stack_key`): the
    /// [`AggEntry`] at the same index of the thread's table holds its
    /// calls. Written by the thread when it makes that entry, before the
    /// entry's probe word; tp takes the frames only where [`stack_hash`] of
    /// them is the entry's key (the target can write anything here).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct StackKey as "tp_stack_key" {
        /// The key: [`stack_hash`] of the frames.
        pub hash: u64,
        /// Frames kept, at most [`STACK_KEY_DEPTH`].
        pub n: u64,
        /// Return addresses, the call's own first.
        pub frames: [u64; STACK_KEY_DEPTH],
    }
}

impl Default for StackKey {
    fn default() -> StackKey {
        StackKey { hash: 0, n: 0, frames: [0; STACK_KEY_DEPTH] }
    }
}

/// A `--by stack` key: the hash of a stack's return addresses, as
/// runtime.c computes it (`stack_hash`, record.h).
pub fn stack_hash(frames: &[u64]) -> u64 {
    let mix = |h: u64, v: u64| {
        let h = (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 31)
    };
    mix(frames.iter().fold(0x2545_f491_4f6c_dd1d, |h, &f| mix(h, f)), frames.len() as u64)
}

/// Bytes of a thread's aggregates: [`AggHead`], its [`LatEntry`] table,
/// its [`ByEntry`] table, its [`AggEntry`] table and the [`StackKey`]
/// beside each of those entries.
pub const AGG_SIZE: u64 = (std::mem::size_of::<AggHead>()
    + AGG_LAT_ENTRIES * std::mem::size_of::<LatEntry>()
    + AGG_BY_ENTRIES * std::mem::size_of::<ByEntry>()
    + AGG_VAL_ENTRIES * std::mem::size_of::<AggEntry>()
    + AGG_VAL_ENTRIES * std::mem::size_of::<StackKey>()) as u64;

/// The bucket of a duration of `ticks` in a [`LatEntry`] (what runtime.c computes).
pub fn lat_bucket(ticks: u64) -> usize {
    if ticks < (1 << LAT_SUB_BITS) {
        return ticks as usize;
    }
    let power = 63 - ticks.leading_zeros();
    let sub = (ticks >> (power - LAT_SUB_BITS)) & ((1 << LAT_SUB_BITS) - 1);
    (((power - LAT_SUB_BITS + 1) << LAT_SUB_BITS) as u64 + sub) as usize
}

/// The smallest duration, in ticks, of bucket `b` ([`lat_bucket`]).
pub fn lat_bucket_low(b: usize) -> u64 {
    let sub_n = 1usize << LAT_SUB_BITS;
    if b < sub_n {
        return b as u64;
    }
    let power = (b >> LAT_SUB_BITS) as u32 + LAT_SUB_BITS - 1;
    let sub = (b & (sub_n - 1)) as u64;
    ((1u64 << LAT_SUB_BITS) + sub) << (power - LAT_SUB_BITS)
}

/// Flags passed to the runtime's `tp_entry` with the probe index.
pub mod entry_flags {
    /// Record an entry event with the argument registers.
    pub const RECORD_ENTRY: u32 = 1 << super::KIND_SHIFT;
    /// Replace the return address to see the exit.
    pub const HIJACK_RETURN: u32 = 1 << (super::KIND_SHIFT + 1);
    /// Spend one of the probe's sample budget (the detour calls the runtime
    /// only while the budget is positive).
    pub const SAMPLE: u32 = 1 << (super::KIND_SHIFT + 2);
    /// Record the call's stack with its entry event ([`super::ProbeConfig`]),
    /// or the values its fetch program copies ([`super::kind::FIELDS`]).
    pub const STACK: u32 = 1 << (super::KIND_SHIFT + 3);
    /// Record the call only if its entry predicate holds.
    pub const FILTER: u32 = 1 << (super::KIND_SHIFT + 4);
    /// Record the exit only if its exit predicate holds.
    pub const FILTER_EXIT: u32 = 1 << (super::KIND_SHIFT + 5);
    /// Add the exit's duration to the thread's histogram instead of
    /// sending an exit event.
    pub const AGGREGATE: u32 = 1 << (super::KIND_SHIFT + 6);
    /// Count the call by the value of an argument ([`super::ProbeConfig::by`]).
    pub const BY: u32 = 1 << (super::KIND_SHIFT + 7);
    /// Record the argument registers after the sixth too, in an event of
    /// their own before the entry's ([`super::event_kind::ARGS_MORE`]):
    /// where the ABI passes more than six integer arguments in registers
    /// and the function may have more than six. Below the other flags,
    /// in the probe index's top bit, which no index uses.
    pub const RECORD_MORE: u32 = 1 << (super::KIND_SHIFT - 1);
    /// Time the call to its end, which the detours at the function's exits
    /// see ([`super::kind::AT_EXITS`]): a shadow frame keyed by where the
    /// return address is, which stays untouched.
    pub const TIME_CALL: u32 = 1 << (super::KIND_SHIFT - 2);
    /// In the word an exit's detour passes: the exit is a tail call (a
    /// jump out of the function), which leaves no return value.
    pub const TAIL_CALL: u32 = 1 << (super::KIND_SHIFT - 3);
    /// The flags of an exit's word that make it the runtime's work (a
    /// predicate on the return value, durations kept in the target).
    pub const EXIT_EXT: u32 = FILTER_EXIT | AGGREGATE;
    /// Go code: the call's frame is its goroutine's ([`super::Goroutine`]),
    /// which the detour passes from the register Go keeps it in.
    pub const GO_FRAMES: u32 = 1 << (super::KIND_SHIFT - 4);
}

/// The constants runtime.c shares, by the names build.rs gives them in its
/// header.
pub const C_CONSTANTS: &[(&str, u64)] = &[
    ("TP_CTX_OFF", std::mem::offset_of!(Header, ctx) as u64),
    ("TP_RENDEZVOUS_OFF", RENDEZVOUS_OFF),
    ("TP_STEP_OFF", STEP_OFF),
    ("TP_TRAP_IDLE", trap::IDLE as u64),
    ("TP_TRAP_TRACING", trap::TRACING as u64),
    ("TP_TRAP_DONE", trap::DONE as u64),
    ("TP_TRAP_RETURNED", trap::RETURNED as u64),
    ("TP_TRAP_LIMIT", trap::LIMIT as u64),
    ("TP_TRAP_SYSCALL", trap::SYSCALL as u64),
    ("TP_TRAP_STOPPED", trap::STOPPED as u64),
    ("TP_TRAP_PCS_OFF", trap::PCS_OFF),
    ("TP_RENDEZVOUS_SLICE_NS", RENDEZVOUS_SLICE_MS as u64 * 1_000_000),
    ("TP_RENDEZVOUS_MAX_SLICES", RENDEZVOUS_MAX_SLICES as u64),
    ("TP_ENTRY", event_kind::ENTRY as u64),
    ("TP_EXIT", event_kind::EXIT as u64),
    ("TP_UNWOUND", event_kind::UNWOUND as u64),
    ("TP_ARGS_MORE", event_kind::ARGS_MORE as u64),
    ("TP_KIND_SHIFT", KIND_SHIFT as u64),
    ("TP_PROBE_MASK", PROBE_MASK as u64),
    ("TP_RECORD_ENTRY", entry_flags::RECORD_ENTRY as u64),
    ("TP_HIJACK_RETURN", entry_flags::HIJACK_RETURN as u64),
    ("TP_SAMPLE", entry_flags::SAMPLE as u64),
    ("TP_STACK", entry_flags::STACK as u64),
    ("TP_FILTER", entry_flags::FILTER as u64),
    ("TP_FILTER_EXIT", entry_flags::FILTER_EXIT as u64),
    ("TP_AGGREGATE", entry_flags::AGGREGATE as u64),
    ("TP_BY", entry_flags::BY as u64),
    ("TP_STACK_RECORD", event_kind::STACK as u64),
    ("TP_STACK_WORDS_PER_EVENT", STACK_WORDS_PER_EVENT as u64),
    ("TP_MAX_STACK_DEPTH", MAX_STACK_DEPTH as u64),
    ("TP_MAX_STACK_COPY", MAX_STACK_COPY as u64),
    ("TP_STACK_FRAMES", stack_word::MODE_FRAMES),
    ("TP_STACK_COPY", stack_word::MODE_COPY),
    ("TP_STACK_TRUNCATED", stack_word::TRUNCATED),
    ("TP_STACK_NO_BOUNDS", stack_word::NO_BOUNDS),
    ("TP_STACK_COUNT_SHIFT", stack_word::COUNT_SHIFT as u64),
    ("TP_FOP_END", filter_op::END),
    ("TP_FOP_ARG", filter_op::ARG),
    ("TP_FOP_IMM", filter_op::IMM),
    ("TP_FOP_EQ", filter_op::EQ),
    ("TP_FOP_NE", filter_op::NE),
    ("TP_FOP_LT_S", filter_op::LT_S),
    ("TP_FOP_LE_S", filter_op::LE_S),
    ("TP_FOP_LT_U", filter_op::LT_U),
    ("TP_FOP_LE_U", filter_op::LE_U),
    ("TP_FOP_AND", filter_op::AND),
    ("TP_FOP_OR", filter_op::OR),
    ("TP_FOP_NOT", filter_op::NOT),
    ("TP_FOP_BIT_AND", filter_op::BIT_AND),
    ("TP_FOP_BIT_OR", filter_op::BIT_OR),
    ("TP_FOP_BIT_XOR", filter_op::BIT_XOR),
    ("TP_FOP_STR", filter_op::STR),
    ("TP_FOP_STR_PREFIX", filter_op::STR_PREFIX),
    ("TP_FILTER_STR_MAX", FILTER_STR_MAX as u64),
    ("TP_FOP_LOAD", filter_op::LOAD),
    ("TP_FETCH_WORDS", FETCH_WORDS as u64),
    ("TP_FETCH_VALUES", FETCH_VALUES as u64),
    ("TP_FETCH_DEPTH", FETCH_DEPTH as u64),
    ("TP_FETCH_STR_MAX", FETCH_STR_MAX as u64),
    ("TP_FETCH_LOADS_SHIFT", fetch_word::LOADS_SHIFT as u64),
    ("TP_FETCH_WIDTH_SHIFT", fetch_word::WIDTH_SHIFT as u64),
    ("TP_FETCH_STR_SHIFT", fetch_word::STR_SHIFT as u64),
    ("TP_STACK_FIELDS", stack_word::MODE_FIELDS),
    ("TP_FEXT_I8", filter_ext::I8),
    ("TP_FEXT_U8", filter_ext::U8),
    ("TP_FEXT_I16", filter_ext::I16),
    ("TP_FEXT_U16", filter_ext::U16),
    ("TP_FEXT_I32", filter_ext::I32),
    ("TP_FEXT_U32", filter_ext::U32),
    ("TP_FILTER_WORDS", FILTER_WORDS as u64),
    ("TP_FILTER_DEPTH", FILTER_DEPTH as u64),
    ("TP_FILTER_RET", FILTER_RET),
    ("TP_LAT_SUB_BITS", LAT_SUB_BITS as u64),
    ("TP_LAT_BUCKETS", LAT_BUCKETS as u64),
    ("TP_AGG_LAT_ENTRIES", AGG_LAT_ENTRIES as u64),
    ("TP_AGG_BY_ENTRIES", AGG_BY_ENTRIES as u64),
    ("TP_AGG_PROBES", AGG_PROBES as u64),
    ("TP_AGG_BY_BITS", AGG_BY_BITS as u64),
    ("TP_AGG_VAL_ENTRIES", AGG_VAL_ENTRIES as u64),
    ("TP_AGG_VAL_BITS", AGG_VAL_BITS as u64),
    ("TP_AGG_HIST_BUCKETS", AGG_HIST_BUCKETS as u64),
    ("TP_AGG_VALUE_WORDS", AGG_VALUE_WORDS as u64),
    ("TP_AGGV_EXT_SHIFT", fetch_word::EXT_SHIFT as u64),
    ("TP_AGGV_SIGNED", fetch_word::SIGNED),
    ("TP_BY_NO_VALUE", by_word::NO_VALUE as u64),
    ("TP_BY_CALLER", by_word::CALLER as u64),
    ("TP_BY_STACK", by_word::STACK as u64),
    ("TP_STACK_KEY_DEPTH", STACK_KEY_DEPTH as u64),
    ("TP_BY_AGG", by_word::AGG as u64),
    ("TP_BY_AT_EXIT", by_word::AT_EXIT as u64),
    ("TP_BY_LATENCY", by_word::LATENCY as u64),
    ("TP_BY_KEY_IN_FRAME", by_word::KEY_IN_FRAME as u64),
    ("TP_NS_SHIFT", NS_SHIFT as u64),
    ("TP_MAX_THREAD_STACK", MAX_THREAD_STACK),
    ("TP_STACK_SPAN", STACK_SPAN),
    ("TP_RECORD_MORE", entry_flags::RECORD_MORE as u64),
    ("TP_TIME_CALL", entry_flags::TIME_CALL as u64),
    ("TP_TAIL_CALL", entry_flags::TAIL_CALL as u64),
    ("TP_EXIT_EXT", entry_flags::EXIT_EXT as u64),
    ("TP_GO_FRAMES", entry_flags::GO_FRAMES as u64),
    ("TP_GO_SLOTS", GO_SLOTS as u64),
    ("TP_GO_FRAME_COUNT", GO_FRAMES as u64),
    ("TP_GOROUTINES_OFF", goroutines_off()),
    ("TP_CLAIMED_WORDS", CLAIMED_WORDS as u64),
    ("TP_TID_CANDIDATES", TID_CANDIDATES as u64),
    ("TP_THREADS_OFF", THREADS_OFF),
    ("TP_EVENT_SLOT_BITS", EVENT_SLOT_BITS as u64),
    ("TP_SHADOW_LEN", SHADOW_LEN as u64),
    ("TP_KEY_REGISTER", key_how::REGISTER as u64),
    ("TP_KEY_TCB", key_how::TCB as u64),
    ("TP_KEY_SYSCALL", key_how::SYSCALL as u64),
    ("TP_KEY_TCB_REGISTER", key_how::TCB_REGISTER as u64),
    ("TP_SLOT_BITS", SLOT_BITS as u64),
    ("TP_CACHE_BITS", CACHE_BITS as u64),
    ("TP_CACHE_HASH", CACHE_HASH as u64),
    ("TP_CACHE_BUSY", CACHE_BUSY),
];

/// The structs runtime.c shares, in the order C needs them declared.
pub fn c_structs() -> Vec<CStruct> {
    vec![
        EventCtx::c_struct(),
        Rendezvous::c_struct(),
        StepHandoff::c_struct(),
        TrapTrace::c_struct(),
        Frame::c_struct(),
        Event::c_struct(),
        SlotHead::c_struct(),
        CacheEntry::c_struct(),
        Proc::c_struct(),
        ThreadState::c_struct(),
        GoFrame::c_struct(),
        Goroutine::c_struct(),
        ProbeConfig::c_struct(),
        AggHead::c_struct(),
        LatEntry::c_struct(),
        ByEntry::c_struct(),
        AggEntry::c_struct(),
        StackKey::c_struct(),
    ]
}

const _: () = assert!(std::mem::size_of::<EventCtx>() == 216 + 8 * (1 << SLOT_BITS));
const _: () = assert!(std::mem::size_of::<CacheEntry>() == 32);
const _: () = assert!(std::mem::offset_of!(Proc, cache) == 64);
const _: () = assert!(
    std::mem::size_of::<ProbeConfig>()
        == 24 + 16 * FILTER_WORDS + 8 * FETCH_WORDS + 8 * AGG_VALUE_WORDS + 8 * (BY_TEXT_WORDS + AGG_TEXT_WORDS)
);
const _: () = assert!(std::mem::size_of::<AggEntry>() == 64 + 8 * AGG_HIST_BUCKETS);
const _: () = assert!(std::mem::size_of::<LatEntry>() == 64 + 8 * LAT_BUCKETS);
const _: () = assert!(std::mem::size_of::<ByEntry>() == 32);
const _: () = assert!(std::mem::size_of::<StackKey>() == 16 + 8 * STACK_KEY_DEPTH);
const _: () = assert!(std::mem::size_of::<AggHead>() == 64);
const _: () = assert!(AGG_LAT_ENTRIES.is_power_of_two() && AGG_BY_ENTRIES.is_power_of_two());
const _: () = assert!(std::mem::size_of::<ThreadState>() == 128);
const _: () = assert!(std::mem::offset_of!(ThreadState, tid_at) + 8 <= 64);
const _: () = assert!(std::mem::size_of::<Proc>() as u64 <= PROC_PAGE);
const _: () = assert!(CLAIMED_WORDS * 64 == 1 << EVENT_SLOT_BITS);
const _: () = assert!(event_kind::ARGS_MORE as u32 <= u32::MAX >> KIND_SHIFT);
const _: () = assert!(
    (entry_flags::RECORD_ENTRY
        | entry_flags::HIJACK_RETURN
        | entry_flags::SAMPLE
        | entry_flags::STACK
        | entry_flags::FILTER
        | entry_flags::FILTER_EXIT
        | entry_flags::AGGREGATE
        | entry_flags::BY
        | entry_flags::RECORD_MORE
        | entry_flags::TIME_CALL
        | entry_flags::TAIL_CALL
        | entry_flags::GO_FRAMES)
        & PROBE_MASK
        == 0
);
const _: () = assert!(MAX_CAPACITY - 1 <= PROBE_MASK);
const _: () = assert!(std::mem::size_of::<SlotHead>() == 192);
const _: () = assert!(std::mem::size_of::<Frame>() == 64);
const _: () = assert!(std::mem::size_of::<Goroutine>() == 32 && std::mem::size_of::<GoFrame>() == 32);
// A goroutine's calls take one page.
const _: () = assert!(goroutine_size() == 4096);
const _: () = assert!(std::mem::size_of::<Event>() == 64);

/// The region header.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// ELF machine of the process (62 x86-64, 183 AArch64).
    pub machine: u32,
    /// Size of the region in bytes.
    pub total_size: u64,
    /// Number of probe entries the region has room for.
    pub capacity: u32,
    /// Entries in use (all entries past it are free).
    pub count: u32,
    /// log2 of the number of counter rows.
    pub slot_bits: u32,
    /// log2 of the byte stride between counter rows.
    pub stride_shift: u32,
    /// Offset of the entry table.
    pub probes_off: u64,
    /// Offset of the enable flags.
    pub flags_off: u64,
    /// Offset of the sample budgets.
    pub budgets_off: u64,
    /// Offset of the sampling periods.
    pub periods_off: u64,
    /// Offset of the counter rows.
    pub counters_off: u64,
    /// Offset of the countdown rows.
    pub countdowns_off: u64,
    /// Offset of the probe configurations.
    pub configs_off: u64,
    /// Address of the region in the target.
    pub target_addr: u64,
    /// Incremented by every change to the entries.
    pub generation: u64,
    /// Arenas in use.
    pub arena_count: u32,
    /// Reserved.
    pub reserved: u32,
    /// Offset of the thread slots.
    pub events_off: u64,
    /// The runtime's context.
    pub ctx: EventCtx,
    /// The code arenas.
    pub arenas: [Arena; MAX_ARENAS],
}

/// The life of a probe entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    /// Never used.
    Free = 0,
    /// Its site is being patched: the site holds either the original or the patch bytes.
    Installing = 1,
    /// Its site holds the patch.
    Active = 2,
    /// Its site is being restored: it holds either the patch or the original bytes.
    Removing = 3,
    /// Its site holds the original bytes; the detour stays and may be reused.
    Inactive = 4,
}

impl State {
    /// Decodes a stored state; unknown values read as `Free`.
    pub fn from_u32(v: u32) -> State {
        match v {
            1 => State::Installing,
            2 => State::Active,
            3 => State::Removing,
            4 => State::Inactive,
            _ => State::Free,
        }
    }

    /// True if the site may hold the patch (and so needs restoring on detach).
    pub fn maybe_patched(self) -> bool {
        matches!(self, State::Installing | State::Active | State::Removing)
    }
}

/// What a probe records.
pub mod kind {
    /// Counts calls only.
    pub const COUNT: u32 = 0;
    /// Records entry events with the argument registers.
    pub const ARGS: u32 = 1;
    /// Records exits with the return value and duration.
    pub const RET: u32 = 2;
    /// tp's own probe on an unwinder entry point (see runtime.c, tp_unwind).
    pub const UNWIND: u32 = 4;
    /// Samples: times a budget of calls per epoch, then only counts until
    /// tp gives it a new budget (tp profile).
    pub const SAMPLE: u32 = 8;
    /// Records the call's stack with its entry event (`--stack`).
    pub const STACK: u32 = 16;
    /// Records a call only if its arguments satisfy a predicate (`--if`).
    pub const FILTER: u32 = 32;
    /// Records an exit only if its return value satisfies a predicate.
    pub const FILTER_EXIT: u32 = 64;
    /// Keeps exits as per-thread histograms in the region, not as events.
    pub const AGGREGATE: u32 = 128;
    /// Counts calls per value of an argument in the region (`--by`).
    pub const BY: u32 = 256;
    /// With [`ARGS`]: the function may have more integer arguments in
    /// registers than six, as AArch64 passes (eight), and its entries
    /// record them too.
    pub const ARGS_MORE: u32 = 512;
    /// With [`RET`] or [`SAMPLE`]: the call's end is seen by detours at
    /// the function's exits (its returns and the jumps out of it), each an
    /// entry of kind [`EXIT`]; the return address is never replaced.
    pub const AT_EXITS: u32 = 1024;
    /// The detour at one exit of the function of probe [`super::Entry::parent`]:
    /// it records that probe's calls ending there. No count of its own.
    pub const EXIT: u32 = 2048;
    /// tp's own probe at the dynamic linker's rendezvous (`_dl_debug_state`):
    /// the thread that loads or unloads a library waits there, bounded,
    /// while tp probes it ([`super::Rendezvous`], runtime.c's tp_rendezvous).
    pub const RENDEZVOUS: u32 = 4096;
    /// Hands sampled calls to tp, which steps them instruction by
    /// instruction (`--steps`): the detour counts, then calls the
    /// runtime's `tp_step` ([`super::StepHandoff`]).
    pub const STEP: u32 = 8192;
    /// With [`ARGS`]: copies values from memory at the call's entry
    /// (`--args 'req->len'`, [`super::ProbeConfig::fetch`]), sent after
    /// the entry event as a stack is ([`super::entry_flags::STACK`]);
    /// never with [`STACK`].
    pub const FIELDS: u32 = 16384;
    /// Whatever makes a probe call the runtime at a function's entry.
    pub const CALLS_AT_ENTRY: u32 = ARGS | RET | STACK | BY;
    /// Entries that are tp's own, not probes the user asked for: the
    /// unwinder probes, the rendezvous and the exits' sites.
    pub const OWN: u32 = UNWIND | EXIT | RENDEZVOUS;
    /// tp's own probes at a function's entry: the unwinder probes and the rendezvous.
    pub const OWN_ENTRY: u32 = UNWIND | RENDEZVOUS;
}

/// The word a detour passes to the runtime's `tp_entry` for probe `index`
/// recording `k` (bits of [`kind`]): the index and the [`entry_flags`].
pub fn entry_word(index: u32, k: u32) -> u32 {
    let mut word = index;
    if k & kind::ARGS != 0 {
        word |= entry_flags::RECORD_ENTRY;
    }
    if k & (kind::RET | kind::SAMPLE) != 0 && k & kind::AT_EXITS != 0 {
        word |= entry_flags::TIME_CALL;
    } else if k & kind::RET != 0 {
        word |= entry_flags::HIJACK_RETURN;
    }
    if k & kind::SAMPLE != 0 {
        word |= entry_flags::SAMPLE;
    }
    for (bit, flag) in [
        (kind::STACK, entry_flags::STACK),
        (kind::FIELDS, entry_flags::STACK),
        (kind::FILTER, entry_flags::FILTER),
        (kind::FILTER_EXIT, entry_flags::FILTER_EXIT),
        (kind::AGGREGATE, entry_flags::AGGREGATE),
        (kind::BY, entry_flags::BY),
    ] {
        if k & bit != 0 {
            word |= flag;
        }
    }
    if k & kind::ARGS != 0 && k & kind::ARGS_MORE != 0 {
        word |= entry_flags::RECORD_MORE;
    }
    word
}

/// One probe entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// A [`State`].
    pub state: u32,
    /// PID of the tp session that owns the probe, or 0 when kept with `--keep`.
    pub owner: u32,
    /// The probed function's address.
    pub function: u64,
    /// Where the patch is written.
    pub site: u64,
    /// The detour's address.
    pub detour: u64,
    /// The detour's length.
    pub detour_len: u32,
    /// Bytes of the window (of `original` and `patch`).
    pub window_len: u32,
    /// What it records: bits of [`kind`].
    pub kind: u32,
    /// The original bytes of the window.
    pub original: [u8; WINDOW_BYTES],
    /// The bytes written over the window.
    pub patch: [u8; 24],
    /// The function's name, NUL-terminated.
    pub name: [u8; 96],
    /// The module's file name, NUL-terminated.
    pub module: [u8; 56],
    /// For an exit site ([`kind::EXIT`]): the probe whose calls end there.
    pub parent: u32,
    /// A static probe's semaphore (a u16 in the target), 0 for none. Each
    /// process where the site holds the patch holds one increment of it:
    /// made before the patch, taken back after the restore.
    pub semaphore: u64,
}

const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_SIZE as usize);
const _: () = assert!(std::mem::size_of::<Header>() <= STEP_OFF as usize);
const _: () = assert!(STEP_OFF as usize + std::mem::size_of::<StepHandoff>() <= RENDEZVOUS_OFF as usize);
const _: () = assert!(std::mem::size_of::<TrapTrace>() as u64 == trap::PCS_OFF);
const _: () = assert!(RENDEZVOUS_OFF as usize + std::mem::size_of::<Rendezvous>() <= 4096);

/// Bytes per entry.
pub const ENTRY_SIZE: u64 = 256;

impl Entry {
    /// An unused entry.
    pub fn free() -> Entry {
        Entry {
            state: 0,
            owner: 0,
            function: 0,
            site: 0,
            detour: 0,
            detour_len: 0,
            window_len: 0,
            kind: 0,
            original: [0; WINDOW_BYTES],
            patch: [0; 24],
            name: [0; 96],
            module: [0; 56],
            parent: 0,
            semaphore: 0,
        }
    }

    /// The decoded state.
    pub fn state(&self) -> State {
        State::from_u32(self.state)
    }

    /// The original window bytes (at most the whole array, whatever
    /// `window_len` says: see [`crate::probe::validate::entry`]).
    pub fn original(&self) -> &[u8] {
        &self.original[..(self.window_len as usize).min(self.original.len())]
    }

    /// The patch bytes.
    pub fn patch(&self) -> &[u8] {
        &self.patch[..(self.window_len as usize).min(self.patch.len())]
    }

    /// The function name.
    pub fn name(&self) -> String {
        c_string(&self.name)
    }

    /// The module file name.
    pub fn module(&self) -> String {
        c_string(&self.module)
    }

    /// Stores a NUL-terminated copy of `s`, truncated to fit.
    pub fn set_name(&mut self, s: &str) {
        put_c_string(&mut self.name, s);
    }

    /// Stores a NUL-terminated copy of `s`, truncated to fit.
    pub fn set_module(&mut self, s: &str) {
        put_c_string(&mut self.module, s);
    }
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn put_c_string(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let mut n = s.len().min(dst.len() - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Where everything lives in a region of a given capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Offset of the thread slots.
    pub events_off: u64,
    /// Bytes per thread slot.
    pub slot_size: u64,
    /// Events per ring.
    pub ring_len: u32,
    /// Entries.
    pub capacity: u32,
    /// Offset of the entries.
    pub probes_off: u64,
    /// Offset of the flags.
    pub flags_off: u64,
    /// Offset of the sample budgets.
    pub budgets_off: u64,
    /// Offset of the sampling periods.
    pub periods_off: u64,
    /// Offset of the counter rows.
    pub counters_off: u64,
    /// Offset of the countdown rows.
    pub countdowns_off: u64,
    /// Offset of the probe configurations.
    pub configs_off: u64,
    /// log2 of the row stride.
    pub stride_shift: u32,
    /// Total bytes.
    pub total_size: u64,
}

/// The geometry of a region with room for at least `probes` probes (at
/// most [`MAX_CAPACITY`]) and rings of `ring_len` events (rounded up to a
/// power of two).
pub fn geometry(probes: u32, ring_len: u32) -> Geometry {
    let capacity = probes.clamp(MIN_CAPACITY, MAX_CAPACITY).next_power_of_two();
    let page = 4096u64;
    let probes_off = page;
    let flags_off = probes_off + capacity as u64 * ENTRY_SIZE;
    let budgets_off = (flags_off + capacity as u64).next_multiple_of(64);
    let periods_off = budgets_off + 4 * capacity as u64;
    let configs_off = (periods_off + 4 * capacity as u64).next_multiple_of(page);
    let counters_off =
        (configs_off + capacity as u64 * std::mem::size_of::<ProbeConfig>() as u64).next_multiple_of(page);
    // A row holds one u64 per probe; a power-of-two stride lets detours find a row with a shift.
    let stride_shift = (capacity as u64 * 8).trailing_zeros();
    let rows_size = (1u64 << SLOT_BITS) * (1u64 << stride_shift);
    let countdowns_off = counters_off + rows_size;
    let events_off = countdowns_off + rows_size;
    let ring_len = ring_len.clamp(4, MAX_RING_LEN).next_power_of_two();
    let slot_size = (agg_off_in_slot(ring_len) + AGG_SIZE).next_multiple_of(page);
    let total_size = events_off + (1u64 << EVENT_SLOT_BITS) * slot_size;
    Geometry {
        capacity,
        probes_off,
        flags_off,
        budgets_off,
        periods_off,
        counters_off,
        countdowns_off,
        configs_off,
        stride_shift,
        events_off,
        slot_size,
        ring_len,
        total_size,
    }
}

/// Bytes from a thread slot to its aggregates, for rings of `ring_len` events.
pub fn agg_off_in_slot(ring_len: u32) -> u64 {
    (std::mem::size_of::<SlotHead>() as u64 + ring_len as u64 * std::mem::size_of::<Event>() as u64)
        .next_multiple_of(64)
}

/// Where everything lives in a process's private area: the [`Proc`] page,
/// a page that holds [`PRIVATE_MAGIC`], then one [`ThreadState`] with its
/// shadow stack per thread slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateGeometry {
    /// Bytes per thread state (its head and [`SHADOW_LEN`] frames).
    pub thread_size: u64,
    /// Total bytes (whole pages).
    pub size: u64,
}

/// The private area's geometry (the same for every region).
pub const fn private_geometry() -> PrivateGeometry {
    let thread_size =
        std::mem::size_of::<ThreadState>() as u64 + SHADOW_LEN as u64 * std::mem::size_of::<Frame>() as u64;
    let size = (goroutines_off() + GO_SLOTS as u64 * goroutine_size()).next_multiple_of(PROC_PAGE);
    PrivateGeometry { thread_size, size }
}

/// Where the goroutines' timed calls ([`Goroutine`]) begin in the private
/// area: after the thread states.
pub const fn goroutines_off() -> u64 {
    let thread_size =
        std::mem::size_of::<ThreadState>() as u64 + SHADOW_LEN as u64 * std::mem::size_of::<Frame>() as u64;
    THREADS_OFF + (1u64 << EVENT_SLOT_BITS) * thread_size
}

/// Bytes per [`Goroutine`] with its frames.
pub const fn goroutine_size() -> u64 {
    std::mem::size_of::<Goroutine>() as u64 + GO_FRAMES as u64 * std::mem::size_of::<GoFrame>() as u64
}

impl Header {
    /// A fresh header for a region of geometry `g` at `target_addr`, whose
    /// runtime keeps per-process state in the private area at `private`.
    pub fn new(g: &Geometry, machine: u32, target_addr: u64, private: u64) -> Header {
        Header {
            magic: MAGIC,
            version: VERSION,
            machine,
            total_size: g.total_size,
            capacity: g.capacity,
            count: 0,
            slot_bits: SLOT_BITS,
            stride_shift: g.stride_shift,
            probes_off: g.probes_off,
            flags_off: g.flags_off,
            budgets_off: g.budgets_off,
            periods_off: g.periods_off,
            counters_off: g.counters_off,
            countdowns_off: g.countdowns_off,
            configs_off: g.configs_off,
            target_addr,
            generation: 0,
            arena_count: 0,
            reserved: 0,
            events_off: g.events_off,
            ctx: EventCtx {
                slots: target_addr + g.events_off,
                slot_size: g.slot_size,
                slot_bits: EVENT_SLOT_BITS,
                ring_mask: g.ring_len - 1,
                shadow_len: SHADOW_LEN,
                tid_offset: 0,
                lost_no_slot: 0,
                flags: target_addr + g.flags_off,
                budgets: target_addr + g.budgets_off,
                periods: target_addr + g.periods_off,
                countdowns_from_counters: g.countdowns_off - g.counters_off,
                claimed: [0; CLAIMED_WORDS],
                private,
                thread_size: private_geometry().thread_size,
                key_how: key_how::UNKNOWN,
                pad: 0,
                returns_lost: 0,
                lost_too_deep: 0,
                lost_no_room: 0,
                configs: target_addr + g.configs_off,
                agg_off: agg_off_in_slot(g.ring_len),
                ns_mult: 0,
                main_stack_lo: 0,
                main_stack_hi: 0,
                may_check_memory: 0,
                stride_shift: g.stride_shift,
                counters: target_addr + g.counters_off,
                may_take_rows: 0,
                pad3: 0,
                tid_candidates: [0; TID_CANDIDATES],
                row_owner: [0; 1 << SLOT_BITS],
            },
            arenas: [Arena::default(); MAX_ARENAS],
        }
    }

    /// Offset of the runtime's context.
    pub fn ctx_off() -> u64 {
        std::mem::offset_of!(Header, ctx) as u64
    }

    /// Offset of thread slot `i`.
    pub fn slot_off(&self, i: u64) -> u64 {
        self.events_off + i * self.ctx.slot_size
    }

    /// Offset of event `i` (modulo the ring) in the ring of the slot at `slot_off`.
    pub fn event_off(&self, slot_off: u64, i: u64) -> u64 {
        slot_off
            + std::mem::size_of::<SlotHead>() as u64
            + (i & self.ctx.ring_mask as u64) * std::mem::size_of::<Event>() as u64
    }

    /// Offset of entry `i`.
    pub fn entry_off(&self, i: u32) -> u64 {
        self.probes_off + i as u64 * ENTRY_SIZE
    }

    /// Offset of probe `i`'s configuration.
    pub fn config_off(&self, i: u32) -> u64 {
        self.configs_off + i as u64 * std::mem::size_of::<ProbeConfig>() as u64
    }

    /// Offset of the aggregates of the thread slot at `slot_off`.
    pub fn agg_off(&self, slot_off: u64) -> u64 {
        slot_off + self.ctx.agg_off
    }

    /// Offset of probe `i`'s counter in row `row`.
    pub fn counter_off(&self, row: u64, i: u32) -> u64 {
        self.counters_off + (row << self.stride_shift) + i as u64 * 8
    }
}

/// Marker for plain data types that may be copied to and from raw bytes.
///
/// # Safety
/// Implementors must be `repr(C)`, contain no padding that matters and no
/// pointers, and be valid for every bit pattern.
pub unsafe trait Plain: Copy {}
// SAFETY: all three are repr(C) structs of integers and byte arrays.
unsafe impl Plain for Header {}
// SAFETY: as above.
unsafe impl Plain for Entry {}
// SAFETY: as above.
unsafe impl Plain for Arena {}
// SAFETY: as above.
unsafe impl Plain for SlotHead {}
// SAFETY: as above.
unsafe impl Plain for Event {}
// SAFETY: as above.
unsafe impl Plain for ThreadState {}
// SAFETY: as above.
unsafe impl Plain for Frame {}
// SAFETY: as above.
unsafe impl Plain for ProbeConfig {}
// SAFETY: as above.
unsafe impl Plain for AggHead {}
// SAFETY: as above.
unsafe impl Plain for LatEntry {}
// SAFETY: as above.
unsafe impl Plain for ByEntry {}
// SAFETY: as above.
unsafe impl Plain for TrapTrace {}
// SAFETY: plain integers.
unsafe impl Plain for AggEntry {}
// SAFETY: plain integers.
unsafe impl Plain for StackKey {}

/// The bytes of a plain value.
pub fn bytes_of<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: T is Plain: any of its bytes may be read.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// A plain value read from the start of `b` (which must be long enough).
pub fn from_bytes<T: Plain>(b: &[u8]) -> T {
    assert!(b.len() >= std::mem::size_of::<T>());
    // SAFETY: T is Plain (valid for any bits) and b holds enough bytes; the
    // read is unaligned-safe.
    unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_rounds_capacity_and_aligns_rows() {
        let g = geometry(10, DEFAULT_RING_LEN);
        assert_eq!(g.capacity, MIN_CAPACITY);
        assert_eq!(g.probes_off, 4096);
        assert_eq!(g.flags_off, 4096 + 4096 * 256);
        assert_eq!(g.counters_off % 4096, 0);
        assert_eq!(1u64 << g.stride_shift, 4096 * 8);
        assert_eq!(g.countdowns_off, g.counters_off + 64 * 4096 * 8);
        assert_eq!(g.events_off, g.countdowns_off + 64 * 4096 * 8);
        assert_eq!(g.slot_size % 4096, 0);
        assert!(g.slot_size >= 192 + 2048 * 64 + AGG_SIZE);
        assert_eq!(g.configs_off % 4096, 0);
        assert!(g.counters_off >= g.configs_off + 4096 * std::mem::size_of::<ProbeConfig>() as u64);
        let p = private_geometry();
        assert_eq!(p.thread_size, 128 + 128 * 64);
        assert_eq!(p.size % 4096, 0);
        assert!(p.size >= THREADS_OFF + 128 * p.thread_size);
        assert_eq!((PRIVATE_MAGIC_OFF, THREADS_OFF), (8192, 12288));
        assert_eq!(g.total_size, g.events_off + 128 * g.slot_size);
        assert_eq!(geometry(10_000, 1000).capacity, 16384);
        assert_eq!(geometry(1, 1000).ring_len, 1024);
        assert_eq!(geometry(u32::MAX, u32::MAX).capacity, MAX_CAPACITY);
        assert_eq!(geometry(u32::MAX, u32::MAX).ring_len, MAX_RING_LEN);
    }

    #[test]
    fn header_round_trips() {
        let g = geometry(1, DEFAULT_RING_LEN);
        let h = Header::new(&g, 62, 0x7f00_0000_0000, 0x7f10_0000_0000);
        assert_eq!(h.ctx.slots, 0x7f00_0000_0000 + g.events_off);
        assert_eq!(h.ctx.ring_mask, DEFAULT_RING_LEN - 1);
        let back: Header = from_bytes(bytes_of(&h));
        assert_eq!(back, h);
    }

    #[test]
    fn entry_strings_truncate_on_char_boundaries() {
        let mut e = Entry::free();
        e.set_name("foo");
        assert_eq!(e.name(), "foo");
        let long = "é".repeat(60); // 120 bytes
        e.set_name(&long);
        assert_eq!(e.name().len(), 94);
        assert!(e.name().chars().all(|c| c == 'é'));
        e.window_len = 1000;
        assert_eq!((e.original().len(), e.patch().len()), (24, 24), "never past the arrays");
    }

    #[test]
    fn shared_structs_declare_their_c_fields() {
        let ctx = EventCtx::c_struct().to_c();
        assert!(ctx.starts_with("struct tp_ctx {\n\tuint64_t slots; /* Address in the target of thread slot 0. */"));
        assert!(ctx.contains(&format!("\tuint64_t claimed[{CLAIMED_WORDS}];")), "{ctx}");
        assert!(ctx.contains("_Static_assert(offsetof(struct tp_ctx, claimed) == 72, "), "{ctx}");
        let slot = SlotHead::c_struct().to_c();
        assert!(slot.contains("\tstruct tp_event ring[];\n};"), "{slot}");
        let thread = ThreadState::c_struct().to_c();
        assert!(thread.contains("\tstruct tp_frame shadow[];\n};"), "{thread}");
        assert!(slot.contains("_Static_assert(sizeof(struct tp_slot) == 192, "), "{slot}");
    }

    #[test]
    fn the_entry_word_carries_the_index_and_the_flags() {
        assert_eq!(entry_word(3, kind::COUNT), 3);
        assert_eq!(entry_word(3, kind::ARGS | kind::RET), 3 | entry_flags::RECORD_ENTRY | entry_flags::HIJACK_RETURN);
        assert_eq!(entry_word(7, kind::RET | kind::SAMPLE), 7 | entry_flags::HIJACK_RETURN | entry_flags::SAMPLE);
        let more = kind::ARGS | kind::ARGS_MORE;
        assert_eq!(entry_word(2, more), 2 | entry_flags::RECORD_ENTRY | entry_flags::RECORD_MORE);
        assert_eq!(entry_word(PROBE_MASK, kind::UNWIND) & PROBE_MASK, PROBE_MASK);
    }

    #[test]
    fn latency_buckets_are_log_linear_and_monotonic() {
        for t in 0..16 {
            assert_eq!(lat_bucket(t), t as usize, "below 2 << LAT_SUB_BITS every tick has its bucket");
        }
        assert_eq!((lat_bucket(16), lat_bucket(17), lat_bucket(18), lat_bucket(31)), (16, 16, 17, 23));
        let mut last = 0;
        for t in (0..20).chain((5..64).flat_map(|p| [1u64 << p, (1u64 << p) + 1, (3u64 << (p - 1)) - 1])) {
            let b = lat_bucket(t);
            assert!(b < LAT_BUCKETS && b >= last, "{t}");
            assert!(lat_bucket_low(b) <= t && t < lat_bucket_low(b + 1), "{t}");
            last = b;
        }
        assert_eq!(lat_bucket(u64::MAX), ((65 - LAT_SUB_BITS as usize) << LAT_SUB_BITS) - 1);
    }

    #[test]
    fn texts_go_into_words_and_back_when_they_fit() {
        let w: [u64; BY_TEXT_WORDS] = text_words("fd, tid");
        assert_eq!(words_text(&w), "fd, tid");
        let long = "x".repeat(BY_TEXT_WORDS * 8);
        assert_eq!(text_words::<BY_TEXT_WORDS>(&long), [0; BY_TEXT_WORDS], "no room for its NUL");
        assert_eq!(words_text(&text_words::<BY_TEXT_WORDS>(&long[1..])), &long[1..]);
        assert_eq!(words_text(&[u64::MAX; 2]), "\u{fffd}".repeat(16), "no NUL: the words' bytes, bounded");
    }

    #[test]
    fn ticks_convert_to_ns_by_a_multiplier_and_a_shift() {
        // A 3 GHz counter, a 24 MHz one (AArch64's usual), a 1 GHz one.
        for (ns_per_tick, ticks, ns) in [(1.0 / 3.0, 3_000_000u64, 1_000_000u64), (1e9 / 24e6, 24, 1000), (1.0, 7, 7)] {
            let got = ticks_to_ns(ticks, ns_mult(ns_per_tick));
            assert!(got.abs_diff(ns) <= 1, "{ticks} ticks at {ns_per_tick} ns: {got}");
        }
        // Ten minutes of a 3 GHz counter, within 10^-9 relative.
        let ticks = 1_800_000_000_000u64;
        assert!(ticks_to_ns(ticks, ns_mult(1.0 / 3.0)).abs_diff(600_000_000_000) < 600);
        assert_eq!(ticks_to_ns(u64::MAX, u64::MAX), u64::MAX, "saturates, never wraps");
        assert_eq!(ticks_to_ns(u64::MAX, 0), 0);
    }

    #[test]
    fn new_kinds_set_their_flags() {
        let w = entry_word(5, kind::ARGS | kind::STACK | kind::FILTER | kind::BY);
        assert_eq!(w, 5 | entry_flags::RECORD_ENTRY | entry_flags::STACK | entry_flags::FILTER | entry_flags::BY);
        let w = entry_word(5, kind::RET | kind::AGGREGATE | kind::FILTER_EXIT);
        assert_eq!(w, 5 | entry_flags::HIJACK_RETURN | entry_flags::AGGREGATE | entry_flags::FILTER_EXIT);
    }

    #[test]
    fn states_decode() {
        for s in [State::Free, State::Installing, State::Active, State::Removing, State::Inactive] {
            assert_eq!(State::from_u32(s as u32), s);
        }
        assert!(State::Installing.maybe_patched() && !State::Inactive.maybe_patched());
        assert_eq!(State::from_u32(77), State::Free);
    }
}
