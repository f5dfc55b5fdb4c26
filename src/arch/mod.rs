//! Everything that knows an instruction set or an ABI, behind the [`Arch`]
//! trait: planning and relocating windows, assembling detours and the
//! runtime block, registers and syscalls, ELF machine numbers and
//! relocation types, how arguments are passed.
//!
//! Both architectures compile on every host, so their planners, relocators
//! and code generators are unit-tested everywhere; only [`Host`], the
//! architecture tp runs on, is chosen by `cfg`. The rest of tp uses `Host`,
//! [`Isa`] (for files of any architecture) and this trait, never matches on
//! an architecture, and names no register: `.ci/check-arch-boundary` fails
//! the build where it does. This module imports nothing else of tp's.

pub mod aarch64;
pub mod basic_blocks;
pub mod operand;
mod regset;
pub mod shadow_stack;
pub mod stack_unwind;
pub mod syscalls;
pub mod x86_64;

use std::fmt;
use std::io;

use nix::unistd::Pid;

pub use operand::{ArgLoc, ArgSpec, Operand, OperandLoc, Operands};
pub use shadow_stack::{Shadow, ShadowStack};
pub use syscalls::{Syscalls, ThreadPointerCall};

/// The architecture tp was built for and traces.
#[cfg(target_arch = "x86_64")]
pub type Host = x86_64::X86_64;
/// The architecture tp was built for and traces.
#[cfg(target_arch = "aarch64")]
pub type Host = aarch64::AArch64;

/// One past the highest user-space address on the host (TASK_SIZE): 47 bits
/// on x86-64, 48 bits on AArch64 (mmap goes above them only when asked to).
#[cfg(not(target_arch = "aarch64"))]
pub const USER_END: u64 = 0x7fff_ffff_f000;
/// One past the highest user-space address on the host (TASK_SIZE): 47 bits
/// on x86-64, 48 bits on AArch64 (mmap goes above them only when asked to).
#[cfg(target_arch = "aarch64")]
pub const USER_END: u64 = 1 << 48;

/// The most bytes a patch window takes: what a site's entry in the region
/// keeps of the original code ([`crate::layout::WINDOW_BYTES`]).
pub const MAX_WINDOW: usize = crate::layout::WINDOW_BYTES;

/// The most integer argument registers an entry records: six in its event
/// and three in the record before it ([`crate::layout::ENTRY_REGS`] and
/// [`crate::layout::MORE_REGS`]). Go's internal ABI
/// passes nine on x86-64 and sixteen on arm64: its first nine are shown.
pub const MAX_RECORDED_ARGS: usize = crate::layout::ENTRY_REGS + crate::layout::MORE_REGS;

/// Why a function cannot be probed. The text is what `list-probes` and
/// `attach` show after "refused: ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The function is smaller than the branch that would replace its entry.
    TooShort {
        /// Bytes available from the probe site to the function's end.
        have: u64,
        /// Bytes the branch needs.
        need: u64,
    },
    /// The window would be longer than the bytes tp keeps of a site
    /// ([`MAX_WINDOW`]) to put back.
    TooLong {
        /// Its length.
        len: usize,
    },
    /// The decoder does not know the bytes at this address.
    Undecodable {
        /// Address of the unknown bytes.
        at: u64,
    },
    /// An instruction that must not run out of place (trap, halt, privileged, far transfer).
    Unsafe {
        /// Its mnemonic.
        mnemonic: String,
        /// Its address.
        at: u64,
    },
    /// A call or syscall before the end of the window: a thread inside it
    /// would return into the overwritten bytes.
    CallInWindow {
        /// Its mnemonic.
        mnemonic: String,
        /// Its address.
        at: u64,
    },
    /// A direct branch elsewhere in the function targets the window's interior.
    BranchIntoWindow {
        /// Address of the branch.
        from: u64,
    },
    /// An exception landing pad lies inside the window.
    LandingPadInWindow {
        /// The landing pad's address.
        at: u64,
    },
    /// The function has an exception table tp cannot read, so its landing
    /// pads are unknown.
    UnknownLandingPads {
        /// The function's address.
        at: u64,
    },
    /// Something outside the function's own direct branches enters the
    /// window's interior: another symbol, a split-off part, an `endbr64`.
    EntersWindow {
        /// The address inside the window.
        at: u64,
        /// What enters there, e.g. "function `f`".
        from: String,
    },
    /// The last instruction of the window would pass the function's end.
    PastEnd {
        /// Address of the instruction that crosses the end.
        at: u64,
    },
    /// An indirect jump could target the window's interior: a jump table or
    /// a code address the function forms points there, or (planning from
    /// the bytes alone) its targets are unknown.
    IndirectJump {
        /// Address of the jump.
        at: u64,
    },
    /// A PC-relative operand or branch target would be out of reach from the detour.
    OutOfReach {
        /// Address of the instruction.
        at: u64,
    },
    /// The relocator cannot re-encode this instruction at another address.
    Unrelocatable {
        /// Its mnemonic.
        mnemonic: String,
        /// Its address.
        at: u64,
        /// What went wrong.
        why: String,
    },
    /// The function's code is not what the file says (already patched by another tool?).
    CodeMismatch {
        /// The function's address.
        at: u64,
    },
    /// The function has no code of its own: the compiler inlined it everywhere.
    InlinedEverywhere,
    /// The Go runtime keeps an address inside the window as the return
    /// address at the bottom of goroutine stacks (`runtime.goexit`).
    GoStackReturn,
    /// A return probe or sampling in Go code whose exits tp cannot find or
    /// patch (assembly, exits past what it decodes): the Go runtime walks
    /// goroutine stacks and checks every return address on them, so the
    /// return-address form is not for Go.
    GoReturns,
    /// Events or return probes in a Go function without a stack check,
    /// which may run with little stack left.
    GoNoStackCheck,
    /// Go code that Go may preempt asynchronously, where no window of one
    /// instruction fits after the stack check.
    GoPreemptible,
    /// Recording in an AArch64 function of a variant calling convention
    /// (`STO_AARCH64_VARIANT_PCS`): its arguments and the registers it
    /// keeps may live in SVE registers and predicates, which a syscall of
    /// the runtime discards. Counting touches neither.
    VariantPcs,
    /// A thread of the process runs with a hardware shadow stack, and the
    /// probe's detour would break the pairing of calls and returns it checks.
    ShadowStack {
        /// The thread.
        tid: i32,
        /// Its shadow stack.
        stack: ShadowStack,
        /// What the detour would do ([`Arch::unbalances_shadow_stack`]).
        why: &'static str,
    },
    /// The address asked for is not where an instruction of the function starts.
    NotBoundary {
        /// The address asked for.
        at: u64,
        /// The instruction starts before and after it, if any.
        around: (Option<u64>, Option<u64>),
    },
    /// A site inside a function that this architecture's detour cannot take.
    Interior(&'static str),
    /// This architecture has no probe support yet.
    Unsupported(&'static str),
}

impl Refusal {
    /// The reason without addresses, for grouping refusals in summaries.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::TooShort { .. } => "too short",
            Refusal::TooLong { .. } => "window too long",
            Refusal::Undecodable { .. } => "undecodable instruction",
            Refusal::Unsafe { .. } => "instruction cannot run out of place",
            Refusal::CallInWindow { .. } => "call or syscall inside the window",
            Refusal::BranchIntoWindow { .. } => "branch into window",
            Refusal::LandingPadInWindow { .. } => "landing pad inside the window",
            Refusal::UnknownLandingPads { .. } => "unreadable exception table",
            Refusal::EntersWindow { .. } => "entered from outside the function",
            Refusal::PastEnd { .. } => "window passes the function's end",
            Refusal::IndirectJump { .. } => "indirect jump may land inside the window",
            Refusal::OutOfReach { .. } => "PC-relative reference out of reach",
            Refusal::Unrelocatable { .. } => "cannot relocate",
            Refusal::CodeMismatch { .. } => "code differs from the file",
            Refusal::InlinedEverywhere => "inlined everywhere",
            Refusal::GoStackReturn => "Go runtime return address",
            Refusal::GoReturns => "returns of Go code",
            Refusal::GoNoStackCheck => "Go function without a stack check",
            Refusal::GoPreemptible => "Go code without a one-instruction window",
            Refusal::VariantPcs => "variant calling convention",
            Refusal::ShadowStack { .. } => "hardware shadow stack",
            Refusal::NotBoundary { .. } => "not an instruction boundary",
            Refusal::Interior(_) => "cannot probe inside a function here",
            Refusal::Unsupported(_) => "unsupported",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TooShort { have, need } => write!(f, "too short ({have} bytes, a probe needs {need})"),
            Refusal::TooLong { len } => {
                write!(f, "its window would take {len} bytes, more than the {MAX_WINDOW} tp keeps to put back")
            }
            Refusal::Undecodable { at } => write!(f, "undecodable instruction at {at:#x}"),
            Refusal::Unsafe { mnemonic, at } => write!(f, "`{mnemonic}` at {at:#x} cannot run out of place"),
            Refusal::CallInWindow { mnemonic, at } => {
                write!(f, "`{mnemonic}` at {at:#x} is inside the patch window, before its end")
            }
            Refusal::BranchIntoWindow { from } => write!(f, "branch into window from {from:#x}"),
            Refusal::LandingPadInWindow { at } => write!(f, "exception landing pad at {at:#x} inside the window"),
            Refusal::UnknownLandingPads { at } => {
                write!(f, "the exception table of the function at {at:#x} cannot be read (landing pads unknown)")
            }
            Refusal::EntersWindow { at, from } => write!(f, "{from} enters the window at {at:#x}"),
            Refusal::PastEnd { at } => write!(f, "the instruction at {at:#x} passes the function's end"),
            Refusal::IndirectJump { at } => {
                write!(f, "indirect jump at {at:#x} may land inside the window (jump table or code address)")
            }
            Refusal::OutOfReach { at } => write!(f, "PC-relative reference at {at:#x} out of reach of the detour"),
            Refusal::Unrelocatable { mnemonic, at, why } => write!(f, "cannot relocate `{mnemonic}` at {at:#x}: {why}"),
            Refusal::CodeMismatch { at } => {
                write!(f, "code at {at:#x} differs from the file (patched by another tool?)")
            }
            Refusal::InlinedEverywhere => write!(f, "inlined everywhere"),
            Refusal::GoStackReturn => write!(
                f,
                "the Go runtime keeps an address in its first instructions as the return address at the bottom of \
                 every goroutine's stack, where no scan of threads can see it"
            ),
            Refusal::GoReturns => write!(
                f,
                "it is Go code whose exits tp cannot all patch (Go assembly, or an exit without a window), and \
                 Go's runtime checks every return address on goroutine stacks, so tp replaces none; count its \
                 calls, or record its arguments with --args"
            ),
            Refusal::GoNoStackCheck => write!(
                f,
                "a Go function without a stack check may run with 128 bytes of stack left, too few for \
                 timing its calls; count them, or record its arguments with --args (x86-64: tp records those \
                 where the goroutine's stack has room)"
            ),
            Refusal::VariantPcs => write!(
                f,
                "it declares a variant calling convention (STO_AARCH64_VARIANT_PCS: SVE or vector registers \
                 carry its arguments or keep their values across calls), whose upper halves and predicates a \
                 syscall of tp's runtime would discard; count its calls"
            ),
            Refusal::GoPreemptible => write!(
                f,
                "Go may preempt a goroutine between any two of its instructions and park it with that address on \
                 its own stack, out of sight of tp, and no instruction after its stack check is long enough to be \
                 the whole window"
            ),
            Refusal::ShadowStack { tid, stack, why } => {
                write!(f, "thread {tid} runs with a hardware shadow stack ({stack}), and {why}")
            }
            Refusal::NotBoundary { at, around } => {
                write!(f, "{at:#x} is not where an instruction starts")?;
                match around {
                    (Some(b), Some(a)) => write!(f, " (instructions start at {b:#x} and {a:#x})"),
                    (Some(b), None) => write!(f, " (the last instruction starts at {b:#x})"),
                    (None, Some(a)) => write!(f, " (the first instruction starts at {a:#x})"),
                    (None, None) => Ok(()),
                }
            }
            Refusal::Interior(why) => write!(f, "{why}"),
            Refusal::Unsupported(why) => write!(f, "{why}"),
        }
    }
}

/// One decoded instruction of a window, for display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowInsn {
    /// Offset from the probe site.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
    /// Mnemonic, e.g. `push`.
    pub mnemonic: String,
}

/// Where and how a function is patched, decided from its bytes alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitePlan {
    /// The function's first address.
    pub function: u64,
    /// Where the branch goes (after a landing pad such as `endbr64` or `bti c`).
    pub site: u64,
    /// The function's bytes before the site: the landing pads the window
    /// follows, which stay in place (`endbr64`, `bti c`, `paciasp`).
    pub prefix: Vec<u8>,
    /// The original bytes of the window, `[site, site + window.len())`.
    pub window: Vec<u8>,
    /// The whole instructions of the window.
    pub insns: Vec<WindowInsn>,
    /// What the function's first instructions from the site overwrite
    /// before reading it, so that a detour may use it without saving it
    /// (x86-64: bit n, general-purpose register n; bit 16, the status
    /// flags); 0 where nothing is known.
    pub dead: u32,
    /// True for a site inside the function, past its entry: the detour may
    /// assume nothing of the stack below the stack pointer (x86-64's red
    /// zone) nor of scratch registers, and there is no return address to
    /// replace.
    pub interior: bool,
    /// The ways out of the function among the window's instructions that
    /// run (up to the first that leaves the window for good): a detour
    /// that observes a call's end where it happens records it before each.
    /// An exit site's window ([`Arch::plan_exits`]) ends with its one; an
    /// entry's window holds one only in a function shorter than it.
    pub exits: Vec<ExitInsn>,
}

/// An instruction by which a call of a function ends (its return, or a jump
/// out of the function), in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInsn {
    /// Its offset from the window's site.
    pub offset: u32,
    /// How it leaves.
    pub kind: ExitKind,
}

/// How a call of a function ends at an exit instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// A return to the caller (x86-64 `ret`; AArch64 `ret`, `retaa`, `retab`).
    Return,
    /// A direct jump out of the function: a tail call, whose callee returns
    /// to the caller.
    Jump,
    /// A conditional direct jump out of the function: a tail call when it
    /// is taken (clang writes `jne f`), and nothing when it is not.
    CondJump,
    /// A jump through a register or memory that cannot land inside the
    /// function: a tail call through a pointer (the GOT, a table of
    /// functions).
    IndirectJump,
    /// A jump through a register that leaves the function unless its
    /// target lies in `[lo, hi)`, the function's code (a switch), which the
    /// detour tells when it runs.
    MaybeJump {
        /// The function's code.
        lo: u64,
        /// See [`ExitKind::MaybeJump::lo`].
        hi: u64,
    },
    /// A return that the end of the window leads to, straight and with the
    /// return registers final (Go's `mov rbp, [rsp + d]` before `add rsp,
    /// N; ret`, where the window may be one instruction only): recorded
    /// after the window's last instruction, the return address `sp_above`
    /// bytes above the stack pointer there. Its offset is the window's length.
    Ahead {
        /// See [`ExitKind::Ahead`].
        sp_above: u32,
    },
}

impl ExitKind {
    /// True for a tail call: the function leaves no return value of its own.
    pub fn is_tail_call(self) -> bool {
        !matches!(self, ExitKind::Return | ExitKind::Ahead { .. })
    }
}

/// The window at one exit of a function ([`Arch::plan_exits`]), or why it
/// has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitPlan {
    /// The exit instruction's address.
    pub at: u64,
    /// Its length in bytes.
    pub len: u32,
    /// How it leaves.
    pub kind: ExitKind,
    /// The window that ends with it.
    pub plan: Result<SitePlan, Refusal>,
}

impl SitePlan {
    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// True for an empty window (never produced by a planner).
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// Mnemonics of the displaced instructions, joined for display: `mov, push`.
    pub fn summary(&self) -> String {
        self.insns.iter().map(|i| i.mnemonic.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// True if the window is all `nop`s (a 5-byte one, or the five 1-byte
    /// ones of `-fpatchable-function-entry=5`): the patch replaces them
    /// with nothing left to relocate.
    pub fn is_nop_site(&self) -> bool {
        self.insns.iter().all(|i| i.mnemonic == "nop")
    }

    /// Addresses of instruction starts strictly inside the window: a thread
    /// resuming at one of these would execute the middle of the branch.
    pub fn interior_boundaries(&self) -> impl Iterator<Item = u64> + '_ {
        self.insns.iter().skip(1).map(move |i| self.site + i.offset as u64)
    }
}

/// A basic block of a function's code ([`Arch::blocks`]): straight-line
/// instructions entered only at their first and left only after their last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Its first instruction's address (a leader: the entry, a branch
    /// target, the instruction after a branch).
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// Its instructions.
    pub insns: u32,
    /// The blocks of the function it may go on to (their starts): its
    /// branch's target inside the function, the block after it.
    pub succs: Vec<u64>,
    /// True if it may leave the function: a return, a jump out (a tail
    /// call, a split-off `.cold` part), a jump through a register or
    /// memory, whose targets inside the function are all leaders.
    pub leaves: bool,
    /// True if it may be entered from outside the function's direct
    /// branches: the entry, a jump from a split-off part, a code address
    /// the function forms or data holds (a switch's table).
    pub entered: bool,
}

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

/// How a relocation of a dynamic section stores a code pointer in data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredPointer {
    /// The load bias plus the addend (RELATIVE, IRELATIVE).
    Addend,
    /// The symbol's address plus the addend (absolute 64-bit, GLOB_DAT, JUMP_SLOT).
    Symbol,
}

/// How a parameter is passed, as far as the event decoder needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamClass {
    /// An integer, pointer, bool, char or enum: one integer register.
    Scalar,
    /// A floating-point value: a vector register.
    Float,
    /// A struct or union of this many bytes (if known).
    Aggregate(Option<u64>),
    /// A value made of this many integer words and nothing else (Go's
    /// strings: 2, slices: 3), which Go's ABI passes word by word.
    Words(u8),
}

/// The calling convention of a function, which decides the registers its
/// arguments arrive in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Abi {
    /// The platform's C ABI (System V x86-64, AAPCS64).
    #[default]
    C,
    /// Go's register-based internal ABI (ABIInternal, Go 1.17 and later):
    /// its own sequence of integer argument registers ([`Arch::go_int_args`]).
    Go,
    /// Go's stack-based ABI (ABI0: assembly, and all Go code before the
    /// register ABI): no argument is in a register.
    GoStack,
}

/// [`Arch::goroutine_stack`] of the goroutine `g` with stack pointer `sp`.
/// Go's `g` starts with `stack.lo`, `stack.hi` and `stackguard0`, which is
/// `lo` plus the guard (under a page), or a sentinel asking for preemption
/// (`stackPreempt`, `stackFork`).
fn goroutine_stack(g: u64, sp: u64, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> Option<(u64, u64)> {
    if g == 0 || !g.is_multiple_of(8) {
        return None;
    }
    let b = read(g, 24)?;
    let word = |k: usize| Some(u64::from_le_bytes(b.get(8 * k..8 * k + 8)?.try_into().ok()?));
    let (lo, hi, guard) = (word(0)?, word(1)?, word(2)?);
    let guard_ok = matches!(guard, 0xffff_ffff_ffff_fade | 0xffff_ffff_ffff_fb2e) || (guard > lo && guard - lo <= 4096);
    (lo < hi && hi - lo <= 1 << 30 && (lo..hi).contains(&sp) && guard_ok).then_some((lo, hi))
}

/// [`Arch::arg_registers`] for the C ABI, with `recorded` integer registers
/// recorded; an aggregate larger than 16 bytes goes in memory, or with
/// `large_by_reference` (AAPCS64) its copy's address takes the next
/// integer register.
fn c_arg_registers(params: &[ParamClass], recorded: usize, large_by_reference: bool) -> Vec<Option<usize>> {
    let mut next = 0;
    let mut lost_track = false;
    params
        .iter()
        .map(|p| {
            if lost_track {
                return None;
            }
            match p {
                ParamClass::Float => None,
                ParamClass::Aggregate(size) if size.is_some_and(|s| s > 16) => {
                    if large_by_reference {
                        next += 1; // the address of a copy: not the value, not shown
                    }
                    None
                }
                ParamClass::Aggregate(_) | ParamClass::Words(_) => {
                    lost_track = true; // small aggregates: registers not modelled
                    None
                }
                ParamClass::Scalar if next < recorded => {
                    next += 1;
                    Some(next - 1)
                }
                ParamClass::Scalar => None,
            }
        })
        .collect()
}

/// [`Arch::arg_registers`] for Go's internal ABI, with `ints` integer
/// argument registers of which the first `recorded` are recorded.
fn go_arg_registers(params: &[ParamClass], ints: usize, recorded: usize) -> Vec<Option<usize>> {
    let mut next = 0;
    let mut lost_track = false;
    params
        .iter()
        .map(|p| {
            if lost_track {
                return None;
            }
            let words = match p {
                ParamClass::Scalar => 1,
                ParamClass::Words(n) => *n as usize,
                ParamClass::Float => return None,
                ParamClass::Aggregate(Some(0)) => return None, // zero-sized: no register
                ParamClass::Aggregate(_) => {
                    lost_track = true;
                    return None;
                }
            };
            if next + words > ints {
                return None; // on the stack; the registers stay for the next ones
            }
            next += words;
            // A scalar is shown from its register; a value of several words is not.
            (words == 1 && next - 1 < recorded).then_some(next - 1)
        })
        .collect()
}

/// True if a function symbol's `st_other` (in a file of ELF machine `m`)
/// declares a calling convention other than the base one: AArch64's
/// `STO_AARCH64_VARIANT_PCS`, which the assembler's `.variant_pcs` sets for
/// SVE and vector-PCS functions ([`Refusal::VariantPcs`]).
pub fn variant_pcs(m: u16, st_other: u8) -> bool {
    const STO_AARCH64_VARIANT_PCS: u8 = 0x80;
    m == goblin::elf::header::EM_AARCH64 && st_other & STO_AARCH64_VARIANT_PCS != 0
}

/// What a file of ELF machine `m` is, for messages: `an x86-64 binary`,
/// `a riscv binary`, `a binary for ELF machine 0, which tp does not know`.
pub fn machine_name(m: u16) -> String {
    let name = match m {
        3 => "i386",
        40 => "arm",
        62 => "x86-64",
        183 => "aarch64",
        243 => "riscv",
        _ => return format!("a binary for ELF machine {m}, which tp does not know"),
    };
    let article = if name.starts_with(['a', 'e', 'i', 'o', 'u', 'x']) { "an" } else { "a" };
    format!("{article} {name} binary")
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

/// [`Arch::plan`] as a function pointer.
pub type PlanFn = fn(&[u8], u64, &[u64]) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_in`] as a function pointer.
pub type PlanInFn = fn(&[u8], u64, &[u64], &dyn Image) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_at`] as a function pointer.
pub type PlanAtFn = fn(&[u8], u64, u64, &[u64], &dyn Image) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_to`] as a function pointer.
pub type PlanToFn = fn(&[u8], u64, &[u64], &dyn Image, u64) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_exits`] as a function pointer.
pub type PlanExitsFn =
    fn(&[u8], u64, &[(u64, u64)], &[u64], &[(u64, u64)], bool, &dyn Image) -> Result<Vec<ExitPlan>, Refusal>;

/// [`Arch::blocks`].
pub type BlocksFn = fn(&[u8], u64, &[u64], &dyn Image) -> Result<Vec<Block>, Refusal>;

/// The module around a function, as a planner may read it (runtime
/// addresses): to follow jump tables and find code addresses that data holds.
pub trait Image {
    /// The file's bytes at `[addr, addr + len)`, if it holds them.
    fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]>;
    /// True if `addr` lies in an executable segment.
    fn is_code(&self, addr: u64) -> bool;
    /// True if code may hold absolute code addresses as immediates
    /// (position-dependent code, or text relocations); false when code
    /// addresses come only from PC-relative operands and data.
    fn absolute_code(&self) -> bool;
    /// Code addresses in `[lo, hi)` that data may hold (pointer tables,
    /// computed-goto tables, function pointers): relocation targets, or for
    /// position-dependent files every data word that is a code address.
    fn stored_targets(&self, lo: u64, hi: u64) -> Vec<u64>;
    /// The other parts (`[lo, hi)`) of the function being planned: code
    /// the compiler split off it (`.cold`), which a jump there does not
    /// leave.
    fn other_parts(&self) -> &[(u64, u64)] {
        &[]
    }
}

/// A module the planner can read nothing more of, for the planners' tests.
#[cfg(test)]
pub(crate) struct NoImage;

#[cfg(test)]
impl Image for NoImage {
    fn bytes(&self, _: u64, _: u64) -> Option<&[u8]> {
        None
    }
    fn is_code(&self, _: u64) -> bool {
        false
    }
    fn absolute_code(&self) -> bool {
        false
    }
    fn stored_targets(&self, _: u64, _: u64) -> Vec<u64> {
        Vec::new()
    }
}

/// The architecture-specific functions that work on bytes alone, for any
/// binary tp can read (list-probes inspects files of other architectures).
#[derive(Clone, Copy)]
pub struct Isa {
    /// Its name.
    pub name: &'static str,
    /// [`Arch::plan`].
    pub plan: PlanFn,
    /// [`Arch::branch_targets`].
    pub branch_targets: fn(&[u8], u64) -> Vec<u64>,
    /// [`Arch::branch_targets_into`].
    pub branch_targets_into: fn(&[u8], u64, u64, u64) -> Vec<u64>,
    /// [`Arch::plan_in`].
    pub plan_in: PlanInFn,
    /// [`Arch::PLANS_WITH_IMAGE`].
    pub plans_with_image: bool,
    /// [`Arch::stored_pointer`].
    pub stored_pointer: fn(u32) -> Option<StoredPointer>,
    /// [`Arch::go_stack_check`].
    pub go_stack_check: fn(&[u8], u64) -> Option<usize>,
    /// [`Arch::go_one_instruction_site`].
    pub go_one_instruction_site: fn(&[u8], u64, usize) -> Option<usize>,
    /// [`Arch::go_sp_below_entry`].
    pub go_sp_below_entry: fn(&[u8], u64, u64) -> Option<u32>,
    /// [`Arch::plan_at`].
    pub plan_at: PlanAtFn,
    /// [`Arch::plan_exits`].
    pub plan_exits: PlanExitsFn,
    /// [`Arch::plan_to`].
    pub plan_to: PlanToFn,
    /// [`Arch::sdt_argument`].
    pub sdt_argument: fn(&str) -> Result<ArgSpec, String>,
    /// [`Arch::blocks`].
    pub blocks: BlocksFn,
    /// [`Arch::PATCH_LEN`].
    pub patch_len: usize,
}

impl std::fmt::Debug for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Isa").field(&self.name).finish()
    }
}

impl Isa {
    fn of<A: Arch>() -> Isa {
        Isa {
            name: A::NAME,
            plan: A::plan,
            branch_targets: A::branch_targets,
            branch_targets_into: A::branch_targets_into,
            plan_in: A::plan_in,
            plans_with_image: A::PLANS_WITH_IMAGE,
            stored_pointer: A::stored_pointer,
            go_stack_check: A::go_stack_check,
            go_one_instruction_site: A::go_one_instruction_site,
            go_sp_below_entry: A::go_sp_below_entry,
            plan_at: A::plan_at,
            plan_exits: A::plan_exits,
            plan_to: A::plan_to,
            sdt_argument: A::sdt_argument,
            blocks: A::blocks,
            patch_len: A::PATCH_LEN,
        }
    }

    /// The functions for ELF machine `machine`, if tp knows it.
    pub fn for_machine(machine: u16) -> Option<Isa> {
        [Isa::of::<x86_64::X86_64>(), Isa::of::<aarch64::AArch64>()]
            .into_iter()
            .zip([x86_64::X86_64::ELF_MACHINE, aarch64::AArch64::ELF_MACHINE])
            .find(|(_, m)| *m == machine)
            .map(|(isa, _)| isa)
    }

    /// The host's functions.
    pub fn host() -> Isa {
        Isa::of::<Host>()
    }
}

/// The hardware breakpoints [`Arch::set_exec_breakpoint`] sets at most
/// (x86-64 has four debug address registers, AArch64 two breakpoint
/// registers at least).
pub const MAX_BREAKPOINTS: usize = 2;

/// An instruction set tp can probe.
pub trait Arch {
    /// Name, as Rust's `target_arch` spells it.
    const NAME: &'static str;
    /// The ELF `e_machine` of this architecture's binaries.
    const ELF_MACHINE: u16;
    /// How far the patched branch reaches (either way), in bytes.
    const BRANCH_REACH: u64;
    /// Bytes the patched branch occupies.
    const PATCH_LEN: usize;
    /// Instruction alignment: 1 for variable-length encodings, 4 for A64.
    const INSN_ALIGN: usize;
    /// Syscall numbers.
    const SYSCALLS: Syscalls;

    /// The registers of a stopped thread.
    type Regs: Copy + Default + fmt::Debug;
    /// What a syscall discards of a thread's registers beyond [`Arch::Regs`],
    /// saved before tp's syscalls run on the thread and written back after
    /// each ([`Arch::save_vector_state`]).
    type VectorState: fmt::Debug;

    /// Decides the patch window of the function whose code is `code` at
    /// `function`, and checks the whole function: no branch, and no address in
    /// `extra_targets` (landing pads, jumps from split-off parts), may enter
    /// the window's interior.
    fn plan(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal>;

    /// True if [`Arch::plan_in`] reads the module (the [`Image`]); false if
    /// it plans from the bytes alone.
    const PLANS_WITH_IMAGE: bool = false;

    /// How a dynamic relocation of type `r_type` stores a code pointer in
    /// data, if it does.
    fn stored_pointer(r_type: u32) -> Option<StoredPointer> {
        let _ = r_type;
        None
    }

    /// Integer argument registers an entry event records: the first ones
    /// the ABI passes arguments in.
    const ARG_REGS: usize = 6;

    /// For each parameter of a call of ABI `abi`, which of the recorded
    /// integer argument registers (0..[`Arch::ARG_REGS`]) holds it, if one
    /// does. An entry event records the first [`Arch::ARG_REGS`] integer
    /// argument registers of the function's ABI, in that ABI's order.
    ///
    /// C: scalars take the integer registers in order; a floating-point
    /// parameter travels in a vector register and takes none; an aggregate
    /// larger than 16 bytes is passed in memory; the passing of smaller
    /// aggregates is not modelled, so the parameters from one on are
    /// unknown. (The System V x86-64 ABI; AAPCS64 agrees but for large
    /// aggregates, passed by reference, which AArch64 overrides.)
    ///
    /// Go: each parameter goes wholly into the next integer registers
    /// ([`Arch::go_int_args`] of them in all) or wholly onto the stack, and
    /// a parameter that does not fit leaves the registers to the next ones;
    /// floats take floating-point registers; an aggregate whose makeup is
    /// not known (a struct, an interface) ends what can be told.
    fn arg_registers(abi: Abi, params: &[ParamClass]) -> Vec<Option<usize>> {
        match abi {
            Abi::C => c_arg_registers(params, Self::ARG_REGS, false),
            Abi::Go => go_arg_registers(params, Self::go_int_args(), MAX_RECORDED_ARGS),
            Abi::GoStack => vec![None; params.len()],
        }
    }

    /// How many integer registers Go's internal ABI passes arguments in
    /// (amd64: rax, rbx, rcx, rdi, rsi, r8, r9, r10, r11; arm64: x0-x15).
    fn go_int_args() -> usize;

    /// The length of Go's stack-bound check at the start of `code` (a Go
    /// function's first bytes): `cmp rsp, [r14 + 16]; jbe morestack` and
    /// its variants for larger frames, or `ldr x16, [x28, #16]; cmp sp,
    /// x16; b.ls morestack`. A function whose check fails calls morestack
    /// and comes back to its first instruction, so a probe after the check
    /// counts calls, not entries. None if `code` does not start with one.
    fn go_stack_check(code: &[u8], addr: u64) -> Option<usize> {
        let _ = (code, addr);
        None
    }

    /// The offset, from `from` on in Go function `code` (at `addr`), of the
    /// first place where a window of one instruction fits, passing over
    /// only instructions that set up the frame (they leave the arguments
    /// alone, and run once per call). A goroutine Go preempts
    /// asynchronously is parked with its PC on its own stack, where no scan
    /// of threads sees it, so windows in such Go code have no interior.
    fn go_one_instruction_site(code: &[u8], addr: u64, from: usize) -> Option<usize> {
        let _ = (code, addr, from);
        None
    }

    /// How far below its entry stack pointer Go function `code` (at
    /// `addr`) has moved the stack pointer when it reaches `site` (where
    /// [`Arch::go_one_instruction_site`] puts its probe, after the stack
    /// check): what a probe there adds to find the call's return address.
    /// None if the instructions before `site` do not say.
    fn go_sp_below_entry(code: &[u8], addr: u64, site: u64) -> Option<u32> {
        let _ = (code, addr, site);
        None
    }

    /// [`Arch::plan`] with the module around the function, which lets a
    /// planner prove more windows safe (e.g. by reading jump tables).
    fn plan_in(code: &[u8], function: u64, extra_targets: &[u64], image: &dyn Image) -> Result<SitePlan, Refusal> {
        let _ = image;
        Self::plan(code, function, extra_targets)
    }

    /// [`Arch::plan_in`] with a window that reaches `end` at least (more
    /// instructions than the patch needs): an entry window that takes in an
    /// exit right after it, which has no window of its own (a function of
    /// three instructions and no padding).
    fn plan_to(
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
        end: u64,
    ) -> Result<SitePlan, Refusal> {
        let _ = end;
        Self::plan_in(code, function, extra_targets, image)
    }

    /// Plans a probe at `site`, an address inside the function `code` at
    /// `function` (its entry is [`Arch::plan_in`]'s), with the same checks
    /// over the whole function: `site` must be where an instruction starts,
    /// and the plan is [`SitePlan::interior`].
    fn plan_at(
        code: &[u8],
        function: u64,
        site: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal> {
        let _ = (code, function, site, extra_targets, image);
        Err(Refusal::Interior("tp does not probe inside functions on this architecture"))
    }

    /// The ways out of a function, each with a window of its own ending
    /// with it, for return probes that see a call end where it ends (the
    /// return address stays untouched): `code` at `addr` is one part of the
    /// function (its body, or a split-off `.cold` part); `parts` is every
    /// part's range `[lo, hi)`, the entry's first (a jump between parts
    /// stays inside; a jump to the entry is a call of its own);
    /// `extra_targets` are the jumps into this part from the others;
    /// `taken` are the windows planned already in it (the entry's), which
    /// the exit windows must not overlap and whose own exits their detours
    /// record. With `single`, a window is one instruction that runs (code
    /// Go preempts between any two), which may be one before the exit
    /// ([`ExitKind::Ahead`]). Err if the part does not decode to its end, so
    /// that its exits cannot all be known; an exit without a window is an
    /// [`ExitPlan`] whose plan says why.
    fn plan_exits(
        code: &[u8],
        addr: u64,
        parts: &[(u64, u64)],
        extra_targets: &[u64],
        taken: &[(u64, u64)],
        single: bool,
        image: &dyn Image,
    ) -> Result<Vec<ExitPlan>, Refusal> {
        let _ = (code, addr, parts, extra_targets, taken, single, image);
        Err(Refusal::Unsupported("tp does not patch the exits of functions on this architecture"))
    }

    /// The basic blocks of the function `code` at `function`, in address
    /// order, covering it: the leaders are its entry, the targets of its
    /// branches inside it, the instructions after its branches, the
    /// addresses in `extra_targets` (jumps from its split-off parts) and
    /// the code addresses inside it that it forms or data holds (which a
    /// jump through a register may reach). Calls do not end a block. Err
    /// if it does not decode to its end, or jumps where tp cannot tell.
    fn blocks(code: &[u8], function: u64, extra_targets: &[u64], image: &dyn Image) -> Result<Vec<Block>, Refusal> {
        let _ = (code, function, extra_targets, image);
        Err(Refusal::Unsupported("tp does not find basic blocks on this architecture"))
    }

    /// Parses one argument of a static probe's note (`-4@%eax`, `8@x0`).
    fn sdt_argument(arg: &str) -> Result<ArgSpec, String> {
        Err(format!("`{arg}`: tp does not read static probe arguments on this architecture"))
    }

    /// Targets of the direct branches in `code` (at `addr`), for jumps into a
    /// function from its split-off parts.
    fn branch_targets(code: &[u8], addr: u64) -> Vec<u64>;

    /// The targets of [`Arch::branch_targets`] that lie in `(lo, hi)` (both
    /// exclusive): a patch window's interior. An architecture may find them
    /// without decoding code that cannot branch there.
    fn branch_targets_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> Vec<u64> {
        Self::branch_targets(code, addr).into_iter().filter(|&t| t > lo && t < hi).collect()
    }

    /// Assembles the detour for `plan`, to run at address `at`.
    fn build_detour(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal>;

    /// Reads, in the tracer, the counter the runtime stamps events with.
    fn timestamp() -> u64;

    /// The counter's frequency when the hardware says it (AArch64's CNTFRQ_EL0).
    fn timestamp_hz() -> Option<u64>;

    /// Assembles an arena's runtime block at `at`: the runtime's functions
    /// and the return trampoline, for the region `layout` describes. Where
    /// its parts are does not depend on `layout`.
    fn build_runtime(at: u64, layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> RuntimeBlock;

    /// True if a counting detour may call the runtime block (which must
    /// then be in its arena): x86-64's detours count in a row of the
    /// thread's own, which the runtime gives a thread on its first call.
    const COUNTING_CALLS_RUNTIME: bool = false;

    /// True if user code can single-step itself (x86-64's trap flag, which
    /// the in-target stepping engine sets): the runtime block then has a
    /// SIGTRAP handler ([`RuntimeAddrs::trap`]).
    const TRAP_FLAG_STEPS: bool = false;

    /// An unwinder for copies of this architecture's stacks (`--stack dwarf`).
    fn stack_unwinder() -> Box<dyn stack_unwind::StackUnwinder>;

    /// Where the TCB keeps each thread's TID, as an offset from the thread
    /// pointer the runtime uses, found by reading the TCBs of stopped
    /// threads (`threads`: TID and registers).
    fn tid_offset(threads: &[(i32, Self::Regs)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset;

    /// How the runtime should tell the threads of a process apart, given
    /// the process's `AT_HWCAP2` and its stopped threads (`threads`: TID
    /// and registers), whose memory `read` reads.
    fn thread_key(
        hwcap2: u64,
        threads: &[(i32, Self::Regs)],
        read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    ) -> ThreadKey;

    /// The bytes that replace the window: a branch from the site to `detour`,
    /// padded to the window's length.
    fn patch_bytes(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal>;

    /// Where a return frame's trampoline is, read in a stopped process:
    /// the frame's `slot` (entry stack pointer minus 8) on the stack, or
    /// `ra_at`, where the runtime noted that the function saves the
    /// register a call leaves its return address in (0 where the slot
    /// holds it, or where that is not known), with `tramp` the trampoline
    /// written there. `read` reads the process's memory.
    fn frame_home(slot: u64, ra_at: u64, tramp: u64, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> FrameHome {
        let _ = ra_at;
        match read(slot, 8) {
            Some(b) if b.len() == 8 && u64::from_le_bytes(b[..8].try_into().unwrap()) == tramp => FrameHome::At(slot),
            _ => FrameHome::Dead,
        }
    }

    /// A code address as a stack word or register holds it, without
    /// anything the CPU adds to it there (AArch64's pointer authentication
    /// code): what it points at.
    fn code_address(word: u64) -> u64 {
        word
    }

    /// The register a call leaves the return address in, where there is
    /// one (AArch64's link register): a thread stopped in a function that
    /// has not saved it may return through it.
    fn return_register(regs: &Self::Regs) -> Option<u64> {
        let _ = regs;
        None
    }

    /// True once the call that was at its function's first instruction
    /// with registers `entry` has ended at `now` (returned, or unwound past
    /// its frame): the stack pointer above the entry's, or, where a call
    /// leaves the return address in a register, back at that address with
    /// the entry's stack pointer.
    fn call_left(entry: &Self::Regs, now: &Self::Regs) -> bool {
        let (sp0, sp) = (Self::sp(entry), Self::sp(now));
        sp > sp0 || (sp == sp0 && Self::return_register(entry).is_some_and(|ra| Self::pc(now) == ra))
    }

    /// This architecture's hardware shadow stack.
    const SHADOW_STACK: ShadowStack;

    /// The hardware shadow stack thread `tid` runs with ([`shadow_stack`]), from
    /// `status`, the text of its `/proc/PID/task/TID/status`, and `hwcap`,
    /// its process's AT_HWCAP; where the kernel shows it only in a register
    /// set, from that, if the thread is `stopped` (in a ptrace stop of tp's).
    fn shadow_stack(tid: Pid, status: &str, hwcap: u64, stopped: bool) -> Shadow {
        let _ = (tid, status, hwcap, stopped);
        Shadow::Off
    }

    /// Why the detour of `plan` would break the pairing of calls and
    /// returns that a hardware shadow stack checks (a call made without a
    /// call instruction, a return used as a jump), if it would.
    fn unbalances_shadow_stack(plan: &SitePlan) -> Option<&'static str> {
        let _ = plan;
        None
    }

    /// How far the long form of the patch reaches, where there is one
    /// (see [`Arch::plan_long`]); 0 where there is none.
    const LONG_REACH: u64 = 0;

    /// True where an event detour of Go code without a stack check checks
    /// its goroutine's room before calling the runtime
    /// ([`DetourSpec::go_room_lost`]); elsewhere such probes are refused.
    const CHECKS_GO_ROOM: bool = false;

    /// Plans the long form of the probe, used at a function's entry when no
    /// code arena can be placed within [`Arch::BRANCH_REACH`] of its module:
    /// a longer patch that reaches [`Arch::LONG_REACH`]. [`Arch::build_detour`]
    /// and [`Arch::patch_bytes`] accept the plan it returns.
    fn plan_long(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
        let _ = (code, extra_targets);
        Err(Refusal::OutOfReach { at: function })
    }

    /// The syscall instruction's encoding.
    fn syscall_insn() -> &'static [u8];

    /// True if single steps cannot get past the instruction `code` begins
    /// with: an exclusive load (AArch64's LDXR), whose store-exclusive
    /// always fails when a step's exception comes between the two, so
    /// that an LL/SC loop stepped would retry for good.
    fn stepping_stalls(code: &[u8]) -> bool {
        let _ = code;
        false
    }

    /// If the instruction `code` begins with (at `pc`) is a call, direct or
    /// indirect, the address it returns to: `--step-depth` lets a call
    /// that would go deeper than its bound run free until the thread is
    /// back there.
    fn call_return(code: &[u8], pc: u64) -> Option<u64>;

    /// Sets hardware breakpoints on executing the instructions at the
    /// addresses `at` (at most [`MAX_BREAKPOINTS`]; none: clears them), in a
    /// stopped thread tp traces, through the debug registers (no byte of
    /// the target changes): a hit stops the thread with SIGTRAP, its PC at
    /// the address, before the instruction runs. The thread gets past it
    /// once it is cleared.
    fn set_exec_breakpoint(tid: Pid, at: &[u64]) -> io::Result<()>;

    /// Makes the registers of a thread stopped where a breakpoint of
    /// [`Arch::set_exec_breakpoint`] hit let the breakpoint fire there
    /// again; false if they do already. x86-64 clears RF, which the
    /// kernel sets so that the instruction runs when the thread goes on:
    /// a signal's frame would keep it, and its handler's return would then
    /// pass the breakpoint once.
    fn rearm_breakpoint(regs: &mut Self::Regs) -> bool {
        let _ = regs;
        false
    }

    /// The breakpoint instruction's encoding (`tp run` holds a new program
    /// at its entry point with one, for as long as the loader runs).
    fn breakpoint_insn() -> &'static [u8];

    /// Where a breakpoint at `pc_after` trapped: the PC the kernel reports
    /// after the trap, mapped back to the breakpoint's address.
    fn breakpoint_at(pc_after: u64) -> u64;

    /// Reads a stopped thread's registers.
    fn get_regs(tid: Pid) -> io::Result<Self::Regs>;
    /// Writes a stopped thread's registers.
    fn set_regs(tid: Pid, regs: &Self::Regs) -> io::Result<()>;
    /// Reads the vector state of a stopped thread that a syscall made by
    /// the thread would discard: on AArch64 the SVE registers beyond their
    /// low 128 bits, the predicates and streaming mode (the Linux SVE and
    /// SME ABIs); nothing on x86-64, whose syscalls keep every register but
    /// two that [`Arch::Regs`] holds.
    fn save_vector_state(tid: Pid) -> io::Result<Self::VectorState>;
    /// Writes back what [`Arch::save_vector_state`] read.
    fn restore_vector_state(tid: Pid, state: &Self::VectorState) -> io::Result<()>;
    /// The register that holds the current goroutine (`g`) in Go code.
    fn go_g(regs: &Self::Regs) -> u64;
    /// The bounds `[lo, hi)` of the goroutine stack a stopped thread runs
    /// on, if it runs Go code: read from `g` ([`Arch::go_g`]), whose first
    /// fields are the stack's bounds and its guard, and believed only when
    /// they hold the stack pointer and the guard is where Go puts it.
    fn goroutine_stack(regs: &Self::Regs, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> Option<(u64, u64)> {
        goroutine_stack(Self::go_g(regs), Self::sp(regs), read)
    }
    /// The program counter.
    fn pc(regs: &Self::Regs) -> u64;
    /// Sets the program counter.
    fn set_pc(regs: &mut Self::Regs, pc: u64);
    /// The stack pointer.
    fn sp(regs: &Self::Regs) -> u64;
    /// The thread pointer (where its TLS is): 0 until the thread's C
    /// library or dynamic linker sets it up.
    fn thread_pointer(regs: &Self::Regs) -> u64;
    /// Where the thread resumes if the kernel restarts the syscall it was
    /// stopped in; `None` if it was not stopped in a restartable syscall.
    fn restart_pc(regs: &Self::Regs) -> Option<u64>;
    /// Points a stopped thread at a syscall instruction at `insn` with the
    /// given number and arguments, and keeps the kernel from restarting an
    /// interrupted syscall instead.
    fn prepare_syscall(tid: Pid, regs: &mut Self::Regs, insn: u64, nr: u64, args: [u64; 6]) -> io::Result<()>;
    /// The return value of a syscall that just completed.
    fn syscall_result(regs: &Self::Regs) -> i64;
    /// For a thread stopped on its way out of a wait that the kernel never
    /// restarts (epoll_wait returns EINTR after any stop, even a tracer's),
    /// turns the result into "restart unless a signal handler runs", the
    /// kernel's ERESTARTNOHAND: the program sees EINTR only if a handler ran,
    /// as it would without tp. `blocked` is what the thread was blocked in
    /// before tp interrupted it, read only where
    /// [`Arch::RESTART_NEEDS_BLOCKED_IN`] says so; `handler_pending` says
    /// whether a signal with a handler is pending for the thread. Returns
    /// true if it changed `regs`.
    fn restart_interrupted_wait(regs: &mut Self::Regs, blocked: Option<&BlockedIn>, handler_pending: bool) -> bool {
        let _ = (regs, blocked, handler_pending);
        false
    }

    /// True if [`Arch::restart_interrupted_wait`] needs to know what a
    /// thread was blocked in before the interrupt (its first argument
    /// register is gone by the stop, where the kernel keeps no copy a
    /// tracer can read).
    const RESTART_NEEDS_BLOCKED_IN: bool = false;
}

/// The syscall a thread was blocked in, as `/proc/PID/task/TID/syscall`
/// shows it: its number, arguments, stack pointer and program counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedIn {
    /// The syscall number.
    pub nr: u64,
    /// Its six arguments.
    pub args: [u64; 6],
    /// The thread's stack pointer.
    pub sp: u64,
    /// Its program counter (after the syscall instruction).
    pub pc: u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_arguments_take_go_registers_whole_or_not_at_all() {
        use ParamClass::*;
        // 9 integer registers, 6 recorded: a slice that no longer fits goes
        // on the stack and leaves the registers to the next scalar.
        let params = [Scalar, Words(3), Float, Words(2), Scalar, Words(3), Scalar, Scalar];
        // Scalar: 0; slice: 1-3; string: 4-5; scalar: 6 (not recorded);
        // slice: does not fit (7-9); the scalars after it: 7, 8 (not recorded).
        assert_eq!(go_arg_registers(&params, 9, 6), [Some(0), None, None, None, None, None, None, None]);
        assert_eq!(go_arg_registers(&params, 16, 8), [Some(0), None, None, None, Some(6), None, None, None]);
        assert_eq!(
            go_arg_registers(&[Scalar; 8], 9, 6),
            [Some(0), Some(1), Some(2), Some(3), Some(4), Some(5), None, None]
        );
        // Zero-sized values take nothing; a struct of unknown makeup ends what is known.
        let params = [Aggregate(Some(0)), Scalar, Aggregate(Some(16)), Scalar];
        assert_eq!(go_arg_registers(&params, 9, 6), [None, Some(0), None, None]);
        // C: the System V order, small aggregates unknown.
        assert_eq!(c_arg_registers(&[Scalar, Float, Words(2), Scalar], 6, false), [Some(0), None, None, None]);
        // A struct of 24 bytes: in memory (System V), or by reference in the
        // next register (AAPCS64); eight registers recorded on AArch64.
        let params = [Scalar, Aggregate(Some(24)), Scalar, Scalar, Scalar, Scalar, Scalar, Scalar, Scalar];
        let sysv = [Some(0), None, Some(1), Some(2), Some(3), Some(4), Some(5), None, None];
        assert_eq!(c_arg_registers(&params, 6, false), sysv);
        let aapcs = [Some(0), None, Some(2), Some(3), Some(4), Some(5), Some(6), Some(7), None];
        assert_eq!(c_arg_registers(&params, 8, true), aapcs);
    }

    #[test]
    fn goroutine_stacks_are_believed_only_with_their_guard() {
        let g = 0xc0_0000_0100u64;
        let memory = |lo: u64, hi: u64, guard: u64| {
            move |addr: u64, len: usize| {
                (addr == g && len == 24).then(|| [lo, hi, guard].iter().flat_map(|w| w.to_le_bytes()).collect())
            }
        };
        let (lo, hi) = (0xc0_0005_0000u64, 0xc0_0005_2000u64);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, lo + 928)), Some((lo, hi)));
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, 0xffff_ffff_ffff_fade)), Some((lo, hi)));
        // The stack pointer outside, a guard elsewhere, bounds upside down, not g.
        assert_eq!(goroutine_stack(g, hi + 8, &memory(lo, hi, lo + 928)), None);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(lo, hi, lo + 0x10000)), None);
        assert_eq!(goroutine_stack(g, hi - 0x100, &memory(hi, lo, lo + 928)), None);
        assert_eq!(goroutine_stack(g + 8, hi - 0x100, &memory(lo, hi, lo + 928)), None);
        assert_eq!(goroutine_stack(0, hi - 0x100, &memory(lo, hi, lo + 928)), None);
    }
}
