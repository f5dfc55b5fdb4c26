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
//!
//! This file holds the [`Arch`] trait and re-exports the types its files
//! own: `plan` (windows, exits, blocks and [`Refusal`]), `abi` (parameter
//! classes, calling conventions, the Go ABI), `emit` (what detours and the
//! runtime block are built from and give back), `isa` (the byte-only
//! functions of any architecture, the object-safe trait [`Isa`]), `register_sets` (the register
//! sets through which `process`, which issues the ptrace calls, reads and
//! writes registers: [`RegisterSets`]) and `syscalls` (numbers, and the
//! syscall a thread was blocked in).

pub mod aarch64;
mod abi;
pub mod basic_blocks;
mod emit;
mod isa;
pub mod operand;
mod plan;
mod register_sets;
pub mod shadow_stack;
pub mod stack_unwind;
pub mod syscalls;
pub mod x86_64;

use std::fmt;
use std::io;

pub use abi::{Abi, MAX_RECORDED_ARGS, ParamClass, variant_pcs};
use abi::{c_arg_registers, go_arg_registers, goroutine_stack};
pub use emit::{
    Detour, DetourSpec, ExitWords, FrameHome, Records, RuntimeAddrs, RuntimeBlobs, RuntimeBlock, RuntimeLayout,
    ThreadKey, TidOffset,
};
pub(crate) use emit::{RUNTIME_STACK, tid_offset_near};
pub use isa::{Isa, host_isa, isa_for_machine, machine_name};
pub use operand::{ArgLoc, ArgSpec, Operand, OperandLoc, Operands};
#[cfg(test)]
pub(crate) use plan::NoImage;
pub use plan::{Block, ExitInsn, ExitKind, ExitPlan, Image, MAX_WINDOW, Refusal, SitePlan, StoredPointer, WindowInsn};
pub use register_sets::RegisterSets;
pub(crate) use register_sets::{read_into, write_from};
pub use shadow_stack::{Shadow, ShadowStack};
pub use syscalls::{BlockedIn, Syscalls, ThreadPointerCall};

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

    /// Bytes of the runtime block [`Arch::build_runtime`] assembles for
    /// `layout` and `blobs` at any 16-aligned address, known without
    /// assembling it.
    fn runtime_len(layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> u64;

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

    /// The hardware shadow stack a thread runs with ([`shadow_stack`]), from
    /// `status`, the text of its `/proc/PID/task/TID/status`, and `hwcap`,
    /// its process's AT_HWCAP; where the kernel shows it only in a register
    /// set, from that, if the thread is stopped (in a ptrace stop of tp's:
    /// `sets`, its register sets).
    fn shadow_stack(status: &str, hwcap: u64, sets: Option<&dyn RegisterSets>) -> Shadow {
        let _ = (status, hwcap, sets);
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
    /// stopped thread tp traces, through the debug registers in its
    /// register sets `sets` (no byte of the target changes): a hit stops
    /// the thread with SIGTRAP, its PC at the address, before the
    /// instruction runs. The thread gets past it once it is cleared.
    fn set_exec_breakpoint(sets: &dyn RegisterSets, at: &[u64]) -> io::Result<()>;

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

    /// Reads a stopped thread's registers from its register sets `sets`.
    fn read_regs(sets: &dyn RegisterSets) -> io::Result<Self::Regs>;
    /// Writes a stopped thread's registers into its register sets `sets`.
    fn write_regs(sets: &dyn RegisterSets, regs: &Self::Regs) -> io::Result<()>;
    /// Reads the vector state of a stopped thread that a syscall made by
    /// the thread would discard: on AArch64 the SVE registers beyond their
    /// low 128 bits, the predicates and streaming mode (the Linux SVE and
    /// SME ABIs); nothing on x86-64, whose syscalls keep every register but
    /// two that [`Arch::Regs`] holds.
    fn save_vector_state(sets: &dyn RegisterSets) -> io::Result<Self::VectorState>;
    /// Writes back what [`Arch::save_vector_state`] read.
    fn restore_vector_state(sets: &dyn RegisterSets, state: &Self::VectorState) -> io::Result<()>;
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
    /// Points the registers of a stopped thread at a syscall instruction at
    /// `insn` with the given number and arguments, and keeps the kernel
    /// from restarting an interrupted syscall instead (once they are
    /// written back).
    fn prepare_syscall(regs: &mut Self::Regs, insn: u64, nr: u64, args: [u64; 6]);
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
