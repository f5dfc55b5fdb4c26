//! What planning a probe decides and why it may refuse: the patch window
//! ([`SitePlan`]) and its instructions, the exits of a function
//! ([`ExitPlan`]), its basic blocks ([`Block`]), the module a planner may
//! read ([`Image`]), how data stores code pointers ([`StoredPointer`]) and
//! [`Refusal`], the reasons a function cannot be probed.

use std::fmt;

#[cfg(doc)]
use super::Arch;
use super::ShadowStack;

/// The most bytes a patch window takes: what a site's entry in the region
/// keeps of the original code ([`crate::layout::WINDOW_BYTES`]).
pub const MAX_WINDOW: usize = crate::layout::WINDOW_BYTES;

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

/// How a relocation of a dynamic section stores a code pointer in data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredPointer {
    /// The load bias plus the addend (RELATIVE, IRELATIVE).
    Addend,
    /// The symbol's address plus the addend (absolute 64-bit, GLOB_DAT, JUMP_SLOT).
    Symbol,
}

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
