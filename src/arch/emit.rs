//! The interface of the code generators: what an architecture's detours
//! and runtime block are built from ([`DetourSpec`], [`Records`],
//! [`ExitWords`], [`RuntimeLayout`], [`RuntimeBlobs`]) and what they give
//! back ([`Detour`], [`RuntimeBlock`], [`RuntimeAddrs`]); how the runtime
//! tells threads apart ([`ThreadKey`], [`TidOffset`]) and where a return
//! frame's trampoline is ([`FrameHome`]).

use super::{Abi, ExitInsn, ExitKind, Operands};
#[cfg(doc)]
use super::{Arch, SitePlan};

/// Where a detour finds the in-target runtime (in its arena's runtime block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeAddrs {
    /// `tp_entry`.
    pub entry: u64,
    /// The return trampoline.
    pub trampoline: u64,
    /// `tp_entry_ext`: `tp_entry` with predicates, counts by value and
    /// stacks, for the probes that have them.
    pub entry_ext: u64,
    /// The return trampoline that calls `tp_exit_ext` (predicates on the
    /// return value, durations kept in the target).
    pub trampoline_ext: u64,
    /// What the detour at an exit of a function calls before the exit runs
    /// (the call's end: `tp_exit_at`, `tp_exit_at_ext`), given the word of
    /// [`DetourSpec::exit_words`]: before a return.
    pub exit: u64,
    /// [`RuntimeAddrs::exit`] before a tail call's jump out of the function.
    /// The same address where the architecture has one exit routine.
    pub exit_tail: u64,
    /// [`RuntimeAddrs::exit`] for the words [`ExitWords::runtime`] marks,
    /// and an exit ahead of its return: what calls the runtime's functions
    /// at once. The same address where the architecture has one exit
    /// routine.
    pub exit_runtime: u64,
    /// `tp_unwind`.
    pub unwind: u64,
    /// `tp_rendezvous`: tp's own probe at the dynamic linker's rendezvous.
    pub rendezvous: u64,
    /// `tp_step`: where a probe of a call tp steps hands the thread over.
    pub step: u64,
    /// The SIGTRAP handler of the in-target stepping engine (`tp_trap`,
    /// entered through a stub that passes the context), or 0 where the
    /// architecture has none.
    pub trap: u64,
    /// The return from that handler: `rt_sigreturn` (the `sa_restorer`).
    pub trap_return: u64,
    /// Where a counting detour calls `tp_count` (x86-64: a stub that keeps
    /// every register and flag).
    pub count: u64,
    /// The runtime's context (`struct tp_ctx`) in the data region.
    pub ctx: u64,
}

/// How the in-target runtime tells a process's threads apart (each thread
/// keys its state by this), chosen once per data region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKey {
    /// The thread register, read in user space: the FS base by `rdfsbase`
    /// on x86-64 (where the kernel enables FSGSBASE), TPIDR_EL0 on AArch64.
    Register,
    /// The word at the thread pointer, which glibc and musl keep equal to
    /// the thread register (the TCB's own address), as every thread the
    /// tracer saw did; where it reads 0 the thread asks the kernel.
    Tcb,
    /// As [`ThreadKey::Tcb`], and where the word reads 0 the thread reads
    /// the register itself (cheaper than the register on every event).
    TcbOrRegister,
    /// The kernel's answer (a system call per event): a runtime that keeps
    /// something else at the thread pointer, on a kernel or CPU without
    /// user-space access to the register.
    Syscall,
}

/// A place in the code a writer emits, bound to an address when the writer
/// reaches it; branches and address operands may use it before (each
/// architecture's writer fills them in when the code is finished).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// A writer's labels: where each is bound, once it is.
#[derive(Debug, Clone, Default)]
pub struct Labels(Vec<Option<u64>>);

impl Labels {
    /// A new label, bound nowhere yet.
    pub fn add(&mut self) -> Label {
        self.0.push(None);
        Label(self.0.len() - 1)
    }

    /// Binds `label` to address `at`.
    pub fn bind(&mut self, label: Label, at: u64) {
        assert!(self.0[label.0].is_none(), "a label bound twice");
        self.0[label.0] = Some(at);
    }

    /// Where `label` is bound, if it is yet.
    pub fn get(&self, label: Label) -> Option<u64> {
        self.0[label.0]
    }

    /// Where `label` is bound, once the code is finished.
    pub fn bound(&self, label: Label) -> u64 {
        self.get(label).expect("a label used but never bound")
    }
}

/// Where a branch goes or an address operand points: an address, or a
/// label of the same writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// This address.
    Addr(u64),
    /// Where this label is bound.
    Label(Label),
}

impl From<u64> for Target {
    fn from(addr: u64) -> Target {
        Target::Addr(addr)
    }
}

impl From<Label> for Target {
    fn from(label: Label) -> Target {
        Target::Label(label)
    }
}

/// The runtime's functions, compiled for one architecture by build.rs.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeBlobs {
    /// `tp_entry`.
    pub entry: &'static [u8],
    /// `tp_exit`.
    pub exit: &'static [u8],
    /// `tp_unwind`.
    pub unwind: &'static [u8],
    /// `tp_count`.
    pub count: &'static [u8],
    /// `tp_entry_ext`.
    pub entry_ext: &'static [u8],
    /// `tp_exit_ext`.
    pub exit_ext: &'static [u8],
    /// `tp_exit_at`.
    pub exit_at: &'static [u8],
    /// `tp_exit_at_ext`.
    pub exit_at_ext: &'static [u8],
    /// `tp_rendezvous`.
    pub rendezvous: &'static [u8],
    /// `tp_step`.
    pub step: &'static [u8],
    /// `tp_trap`.
    pub trap: &'static [u8],
}

#[cfg(test)]
impl RuntimeBlobs {
    /// Blobs of `sizes` bytes each (in the fields' order) cut from `bytes`,
    /// for the tests that lay out a block.
    pub fn sized(bytes: &'static [u8], sizes: [usize; 11]) -> RuntimeBlobs {
        let s = sizes;
        RuntimeBlobs {
            entry: &bytes[..s[0]],
            exit: &bytes[..s[1]],
            unwind: &bytes[..s[2]],
            count: &bytes[..s[3]],
            entry_ext: &bytes[..s[4]],
            exit_ext: &bytes[..s[5]],
            exit_at: &bytes[..s[6]],
            exit_at_ext: &bytes[..s[7]],
            rendezvous: &bytes[..s[8]],
            step: &bytes[..s[9]],
            trap: &bytes[..s[10]],
        }
    }
}

/// What the hand-written parts of a runtime block (an architecture's fast
/// paths of the runtime's functions) read and write of the data region and
/// the private area: addresses in the target, and the offsets and constants
/// of [`crate::layout`], the layout's one source, which `probe` fills this in from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeLayout {
    /// The runtime's context (`struct tp_ctx`) in the data region.
    pub ctx: u64,
    /// The process's thread cache ([`crate::layout::Proc`]'s `cache`).
    pub cache: u64,
    /// Events per ring, minus one.
    pub ring_mask: u32,
    /// In a thread state: frames in use, ticks spent in tp, the first
    /// shadow frame. (Its ring slot the fast paths read in its cache entry,
    /// and its TID in its TCB.)
    pub thread_depth: u32,
    /// Offset in a thread state of the word that says it is writing into its ring.
    pub thread_writing: u32,
    /// Offset in the context of the TID's offset in a TCB (0: unknown).
    pub ctx_tid_offset: u32,
    /// See [`RuntimeLayout::thread_depth`].
    pub thread_overhead: u32,
    /// See [`RuntimeLayout::thread_depth`].
    pub thread_shadow: u32,
    /// In a shadow frame: the return-address slot, the original return
    /// address, the entry time, the probe, the trampoline, the thread's
    /// ticks in tp at entry.
    pub frame_slot: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_ret: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_tsc: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_probe: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_tramp: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_overhead: u32,
    /// See [`RuntimeLayout::frame_slot`].
    pub frame_children: u32,
    /// A shadow frame's size, a power of two.
    pub frame_size: u32,
    /// In a ring slot: the next event to write, the `head` at which the
    /// ring is full as the writer last saw the reader's position, the first
    /// event.
    pub slot_head: u32,
    /// See [`RuntimeLayout::slot_head`].
    pub slot_limit: u32,
    /// See [`RuntimeLayout::slot_head`].
    pub slot_ring: u32,
    /// In an event: the probe and kind (32 bits), the TID (32 bits), the
    /// timestamp, the six values; and its size, a power of two.
    pub event_probe: u32,
    /// See [`RuntimeLayout::event_probe`].
    pub event_tid: u32,
    /// See [`RuntimeLayout::event_probe`].
    pub event_tsc: u32,
    /// See [`RuntimeLayout::event_probe`].
    pub event_v: u32,
    /// See [`RuntimeLayout::event_probe`].
    pub event_size: u32,
    /// The probe index in the word a detour passes (and in an event's probe).
    pub probe_mask: u32,
    /// The flags of that word: record an entry event, replace the return address.
    pub record_entry: u32,
    /// See [`RuntimeLayout::record_entry`].
    pub hijack_return: u32,
    /// The flags of an entry's word: time the call to its end, seen at the
    /// function's exits; and of an exit's: a tail call, the runtime's work
    /// (predicates, durations kept in the target).
    pub time_call: u32,
    /// See [`RuntimeLayout::time_call`].
    pub tail_call: u32,
    /// See [`RuntimeLayout::time_call`].
    pub exit_ext: u32,
    /// The flag of a word for Go code, whose calls are its goroutine's.
    pub go_frames: u32,
    /// How far apart two stack addresses may be and still be taken for
    /// the same stack.
    pub stack_span: u64,
    /// An entry event's and an exit event's kind, in an event's probe.
    pub entry_kind: u32,
    /// See [`RuntimeLayout::entry_kind`].
    pub exit_kind: u32,
}

/// A runtime block assembled for one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeBlock {
    /// The code.
    pub bytes: Vec<u8>,
    /// Where its parts are.
    pub addrs: RuntimeAddrs,
}

/// Where a detour finds the shared data it writes on a hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetourSpec {
    /// The probe's index in the shared probe table.
    pub probe_index: u32,
    /// What the probe records beyond its count.
    pub records: Records,
    /// The word the detour passes to the runtime's `tp_entry`: the probe's
    /// index and the runtime's flags for what it records (set by `probe`,
    /// which owns the runtime's interface).
    pub entry_word: u32,
    /// The runtime, for probes that record more than a count.
    pub runtime: Option<RuntimeAddrs>,
    /// Address in the target of this probe's enable flag (one byte; 0 = disabled).
    pub flag_addr: u64,
    /// Address in the target of the per-thread counter rows.
    pub counters: u64,
    /// Address in the target of the process's thread cache (where a thread
    /// finds its own counter row by the word at its thread pointer).
    pub cache: u64,
    /// Bytes from a counter row to the matching countdown row (sampling probes).
    pub countdowns_from_counters: u64,
    /// log2 of the number of counter rows.
    pub slot_bits: u32,
    /// log2 of the byte stride between counter rows.
    pub stride_shift: u32,
    /// The function's calling convention: which registers an entry event
    /// records as its arguments.
    pub abi: Abi,
    /// For a return probe where a call leaves the return address in a
    /// register (AArch64's link register): how far below its stack pointer
    /// at entry the function saves that register while it calls others,
    /// from its call frame information; None if it never does (a leaf),
    /// not always at one place, or tp cannot tell. Unused where the call
    /// puts the return address on the stack.
    pub return_saved_below: Option<u32>,
    /// What an entry event records instead of the argument registers: the
    /// arguments of a static probe, loaded at its site.
    pub operands: Option<Operands>,
    /// Where the thread states, rings and shadow frames are, for a
    /// detour that records into them itself (x86-64: the fast entry of an
    /// event probe); None where the probe calls `tp_entry_ext` or returns
    /// through its trampoline, which keep more than the plain ones.
    pub layout: Option<RuntimeLayout>,
    /// For a probe that sees its calls end at the function's exits: what
    /// the detour passes to the runtime's exit ([`RuntimeAddrs::exit`])
    /// before each exit of its window ([`SitePlan::exits`]).
    pub exit_words: Option<ExitWords>,
    /// How far the stack pointer at the site lies below the function's
    /// entry stack pointer (Go code's probe goes after the frame's set-up):
    /// a call timed at its exits keys its frame that far above.
    pub sp_below_entry: u32,
    /// For an event probe of Go code without a stack check, which may run
    /// with 128 bytes of its goroutine's stack left: where the count of
    /// entries skipped for want of room is. The detour calls the runtime
    /// only when the goroutine's stack has room for the call below the
    /// stack pointer (its bounds at `g`), else it adds one there
    /// ([`Arch::CHECKS_GO_ROOM`]).
    pub go_room_lost: Option<u64>,
}

/// The words (probe index and flags) a detour passes to the runtime's exit
/// ([`RuntimeAddrs::exit`]), set by `probe`, which owns the runtime's
/// interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitWords {
    /// Before a return.
    pub ret: u32,
    /// Before a jump out of the function (a tail call: no return value).
    pub tail: u32,
    /// The words carry flags that only the runtime's functions handle (Go
    /// code's goroutine frames, a predicate on the return value, durations
    /// kept in the target): the detour calls [`RuntimeAddrs::exit_runtime`].
    pub runtime: bool,
}

impl ExitWords {
    /// The word the detour passes at exit `e`: the probe's word, and in its
    /// top half how far above the stack pointer there the call's return
    /// address is ([`ExitKind::Ahead`]; 0 at the exit itself).
    pub fn of(&self, e: ExitInsn) -> u64 {
        match e.kind {
            ExitKind::Ahead { sp_above } => (sp_above as u64) << 32 | self.ret as u64,
            k if k.is_tail_call() => self.tail as u64,
            _ => self.ret as u64,
        }
    }
}

/// What a detour does beyond counting the hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Records {
    /// Record an entry event with the argument registers.
    pub args: bool,
    /// Replace the return address, to record the exit.
    pub ret: bool,
    /// Time only a budget of calls per epoch (sampling), counting down in
    /// the thread's row.
    pub sample: bool,
    /// tp's own probe where a thread starts unwinding: call `tp_unwind`.
    pub unwind: bool,
    /// The detour of an exit of a function: no count, nothing at an entry;
    /// the call's end is recorded before the exit runs.
    pub exit: bool,
    /// tp's own probe at the dynamic linker's rendezvous: call
    /// `tp_rendezvous`, as an unwinder probe calls `tp_unwind`.
    pub rendezvous: bool,
    /// A probe of calls tp steps: count, then call `tp_step`, as the
    /// rendezvous probe calls `tp_rendezvous`.
    pub step: bool,
}

impl Records {
    /// Counting only.
    pub const COUNT: Records =
        Records { args: false, ret: false, sample: false, unwind: false, exit: false, rendezvous: false, step: false };

    /// True if the detour calls the in-target runtime.
    pub fn calls_runtime(&self) -> bool {
        self.args || self.ret || self.unwind || self.exit || self.rendezvous || self.step
    }

    /// The runtime function a probe of tp's own calls after counting
    /// (unwinder, rendezvous, step), if it is one.
    pub fn own_call(&self, rt: &RuntimeAddrs) -> Option<u64> {
        match (self.unwind, self.rendezvous, self.step) {
            (true, _, _) => Some(rt.unwind),
            (_, true, _) => Some(rt.rendezvous),
            (_, _, true) => Some(rt.step),
            _ => None,
        }
    }
}

/// Where a return frame's trampoline is in a stopped process
/// ([`Arch::frame_home`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameHome {
    /// In this word, as the plain address: tp may write the original
    /// return address there.
    At(u64),
    /// Nowhere: the frame died earlier (longjmp) and its stack was reused.
    Dead,
    /// Somewhere tp cannot write it back: in a register, or signed with a
    /// key only the process can use. The frame stays.
    Kept,
}

/// A detour assembled for one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detour {
    /// The code, to be written at the address it was built for.
    pub bytes: Vec<u8>,
    /// For a PC at `site + offset` (a window instruction boundary), the
    /// equivalent PC in the detour; `offset == window length` maps the window's end.
    pub pc_map: Vec<(u32, u64)>,
}

impl Detour {
    /// The detour address equivalent to the window PC `site + offset`, if any.
    pub fn map_pc(&self, offset: u32) -> Option<u64> {
        self.pc_map.iter().find(|(o, _)| *o == offset).map(|(_, pc)| *pc)
    }
}

/// The most stack a function of the C runtime uses, return address, saved
/// registers and frame (GCC's -fstack-usage, read by build.rs for the
/// architecture built): what a call of the runtime may leave written
/// below the stack pointer, besides x86-64's red zone.
pub(crate) const RUNTIME_STACK: u32 = match u32::from_str_radix(env!("TP_RUNTIME_STACK"), 10) {
    Ok(bytes) => bytes,
    Err(_) => panic!("TP_RUNTIME_STACK (from build.rs) is not a number"),
};
// A return address and a pushed register at least: build.rs read a real report.
const _: () = assert!(RUNTIME_STACK >= 16);

/// Where the threads of a process keep their TIDs, as an offset from the
/// thread pointer the runtime reads ([`Arch::tid_offset`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TidOffset {
    /// The one place where every stopped thread holds its own TID.
    At(i32),
    /// One of these places (two or more): a lone thread held its TID at
    /// each. The runtime tells them apart in the first other thread that
    /// finds its own TID at only one of them.
    OneOf(Vec<i32>),
    /// No place (another runtime) or unreadable memory.
    Unknown,
}

/// Where, within 4 KiB either side of the thread pointer (the pages that
/// can be read), every thread in `threads` (TID, thread pointer) holds its
/// own TID as a 32-bit word: how the runtime tells threads apart by the
/// thread's own memory. The architectures check first that the pointers
/// are what their runtime reads.
pub(crate) fn tid_offset_near(threads: &[(i32, u64)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset {
    const SPAN: i64 = 4096;
    let mut candidates: Option<Vec<i64>> = None;
    for &(tid, tp) in threads {
        let Some(from) = tp.checked_sub(SPAN as u64).filter(|f| f.checked_add(2 * SPAN as u64).is_some()) else {
            return TidOffset::Unknown;
        };
        // Page by page: the span may reach past the mapping the thread
        // pointer lies in (a static program's TLS at the start of its heap).
        let mut here: Vec<i64> = Vec::new();
        let mut at = from;
        while at < from + 2 * SPAN as u64 {
            let end = ((at | 4095) + 1).min(from + 2 * SPAN as u64);
            if let Some(bytes) = read(at, (end - at) as usize) {
                let base = (at - from) as i64 - SPAN;
                here.extend(
                    (0..bytes.len().saturating_sub(3))
                        .step_by(4)
                        .filter(|&i| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) == tid as u32)
                        .map(|i| base + i as i64)
                        .filter(|&off| off != 0),
                );
            }
            at = end;
        }
        candidates = Some(match candidates {
            None => here,
            Some(prev) => prev.into_iter().filter(|o| here.contains(o)).collect(),
        });
    }
    let mut offsets: Vec<i32> =
        candidates.unwrap_or_default().into_iter().filter_map(|o| i32::try_from(o).ok()).collect();
    match offsets.len() {
        0 => TidOffset::Unknown,
        1 => TidOffset::At(offsets.remove(0)),
        _ => TidOffset::OneOf(offsets),
    }
}
