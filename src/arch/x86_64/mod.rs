//! x86-64: `jmp rel32` probes; iced-x86 decoding and relocation.
//!
//! References: the System V AMD64 psABI (red zone §3.2.2, dead flags and r11
//! at calls §3.2.1), the Intel SDM vol. 2 for encodings, and Linux
//! arch/x86/include/asm/user_64.h for the register layout.

pub mod basic_blocks;
pub mod cet;
pub mod decode;
pub mod detour;
pub mod exits;
pub mod fast;
pub mod golang;
pub mod liveness;
pub mod operands;
pub mod reg;
pub mod regs;
pub mod relocate;
pub mod runtime_block;
pub mod sdt;
pub mod taken;
pub mod window;
pub mod writer;

use std::io;

use crate::arch::{
    Arch, BlockedIn, Detour, DetourSpec, Image, RUNTIME_STACK, Refusal, RegisterSets, RuntimeBlobs, RuntimeBlock,
    RuntimeLayout, SitePlan, StoredPointer, Syscalls, ThreadKey, TidOffset,
};

/// Bytes of `jmp rel32`: the patch at a site.
pub const PATCH_LEN: usize = 5;

/// What a call of the C runtime may leave written below the stack pointer
/// once it returns, which each call clears: the runtime's frames and
/// their red zone (128 bytes), and below the caller's own pushes for the
/// call (operands, Go's arguments: 80 bytes; the alignment: 24). Left
/// there, a return address into tp's code or the trampoline's address
/// that the runtime spilled would lie in the stack the program uses next,
/// in words its frames do not write (padding, a buffer), where tp's
/// check at detach that nothing refers to its code finds them
/// ([`crate::probe::remove`]), keeping tp's memory mapped for good: as in
/// nginx workers idle in `epoll_wait`. 48 stores, on the slow paths only
/// (9-10 ns a call here: docs/benchmarks.md): two a turn of a loop where
/// the code is each detour's, one after the other in the exit routine's
/// path to the C runtime, written once in this block (49 instructions
/// instead of 123).
const CLEARED_BELOW: u32 = (RUNTIME_STACK + 128 + detour::GO_ARGS as u32 + 24).next_multiple_of(16);

/// The x86-64 architecture.
#[derive(Debug, Clone, Copy)]
pub struct X86_64;

impl Arch for X86_64 {
    const NAME: &'static str = "x86_64";
    const ELF_MACHINE: u16 = 62; // EM_X86_64
    const BRANCH_REACH: u64 = (1 << 31) - 1;
    const PATCH_LEN: usize = PATCH_LEN;
    const INSN_ALIGN: usize = 1;
    const SYSCALLS: Syscalls = super::syscalls::X86_64;

    type Regs = regs::Regs;
    type VectorState = ();

    fn plan(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
        window::plan(code, function, extra_targets)
    }

    const PLANS_WITH_IMAGE: bool = true;

    fn plan_in(code: &[u8], function: u64, extra_targets: &[u64], image: &dyn Image) -> Result<SitePlan, Refusal> {
        window::plan_in(code, function, extra_targets, image)
    }

    fn plan_at(
        code: &[u8],
        function: u64,
        site: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal> {
        window::plan_at(code, function, site, extra_targets, image)
    }

    fn plan_to(
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
        end: u64,
    ) -> Result<SitePlan, Refusal> {
        window::plan_to(code, function, extra_targets, image, end)
    }

    fn plan_exits(
        code: &[u8],
        addr: u64,
        parts: &[(u64, u64)],
        extra_targets: &[u64],
        taken: &[(u64, u64)],
        single: bool,
        image: &dyn Image,
    ) -> Result<Vec<crate::arch::ExitPlan>, Refusal> {
        exits::plan_exits(code, addr, parts, extra_targets, taken, single, image)
    }

    fn sdt_argument(arg: &str) -> Result<crate::arch::ArgSpec, String> {
        sdt::argument(arg)
    }

    fn stored_pointer(r_type: u32) -> Option<StoredPointer> {
        use goblin::elf::reloc::{
            R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE,
        };
        match r_type {
            R_X86_64_RELATIVE | R_X86_64_IRELATIVE => Some(StoredPointer::Addend),
            R_X86_64_64 | R_X86_64_GLOB_DAT | R_X86_64_JUMP_SLOT => Some(StoredPointer::Symbol),
            _ => None,
        }
    }

    fn blocks(
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn crate::arch::Image,
    ) -> Result<Vec<crate::arch::Block>, Refusal> {
        basic_blocks::blocks(code, function, extra_targets, image)
    }

    fn branch_targets(code: &[u8], addr: u64) -> Vec<u64> {
        decode::branch_targets(code, addr)
    }

    fn branch_targets_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> Vec<u64> {
        decode::branch_targets_into(code, addr, lo, hi)
    }

    fn go_int_args() -> usize {
        9
    }

    fn go_stack_check(code: &[u8], addr: u64) -> Option<usize> {
        golang::stack_check_len(code, addr)
    }

    fn go_one_instruction_site(code: &[u8], addr: u64, from: usize) -> Option<usize> {
        golang::one_instruction_site(code, addr, from)
    }

    const CHECKS_GO_ROOM: bool = true;

    fn go_sp_below_entry(code: &[u8], addr: u64, site: u64) -> Option<u32> {
        golang::sp_below_entry(code, addr, site)
    }

    fn build_detour(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal> {
        detour::build(plan, at, spec)
    }

    fn timestamp() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no memory effects; every x86-64 CPU has it.
        return unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        0
    }

    fn timestamp_hz() -> Option<u64> {
        None
    }

    fn stack_unwinder() -> Box<dyn crate::arch::stack_unwind::StackUnwinder> {
        stack_unwinder()
    }

    fn build_runtime(at: u64, layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> RuntimeBlock {
        runtime_block::build(at, layout, blobs)
    }

    fn runtime_len(layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> u64 {
        runtime_block::len(layout, blobs)
    }

    const COUNTING_CALLS_RUNTIME: bool = true;
    const TRAP_FLAG_STEPS: bool = true;

    fn tid_offset(threads: &[(i32, regs::Regs)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset {
        let tps: Vec<(i32, u64)> = threads.iter().map(|(tid, r)| (*tid, r.fs_base)).collect();
        runtime_block::tid_offset(&tps, read)
    }

    fn thread_key(
        hwcap2: u64,
        threads: &[(i32, regs::Regs)],
        read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    ) -> ThreadKey {
        let bases: Vec<u64> = threads.iter().map(|(_, r)| r.fs_base).collect();
        runtime_block::thread_key(hwcap2, &bases, read)
    }

    fn patch_bytes(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal> {
        detour::patch(plan, detour)
    }

    fn syscall_insn() -> &'static [u8] {
        &[0x0f, 0x05]
    }

    fn call_return(code: &[u8], pc: u64) -> Option<u64> {
        let insn = decode::decode(code, pc).into_iter().next()?;
        matches!(insn.class, decode::Class::Call | decode::Class::IndirectCall).then(|| insn.end())
    }

    fn set_exec_breakpoint(sets: &dyn RegisterSets, at: &[u64]) -> io::Result<()> {
        regs::set_exec_breakpoint(sets, at)
    }

    fn rearm_breakpoint(r: &mut regs::Regs) -> bool {
        let had = r.eflags & regs::EFLAGS_RF != 0;
        r.eflags &= !regs::EFLAGS_RF;
        had
    }

    fn breakpoint_insn() -> &'static [u8] {
        &[0xcc] // int3
    }

    fn breakpoint_at(pc_after: u64) -> u64 {
        // int3 traps after the instruction: the PC is one past it.
        pc_after.wrapping_sub(1)
    }

    const SHADOW_STACK: crate::arch::ShadowStack = cet::CET;

    fn shadow_stack(status: &str, _hwcap: u64, _sets: Option<&dyn RegisterSets>) -> crate::arch::Shadow {
        cet::from_status(status)
    }

    fn unbalances_shadow_stack(plan: &SitePlan) -> Option<&'static str> {
        cet::unbalances(plan)
    }

    fn read_regs(sets: &dyn RegisterSets) -> io::Result<regs::Regs> {
        regs::get(sets)
    }

    fn write_regs(sets: &dyn RegisterSets, r: &regs::Regs) -> io::Result<()> {
        regs::set(sets, r)
    }

    fn save_vector_state(_sets: &dyn RegisterSets) -> io::Result<()> {
        Ok(())
    }

    fn restore_vector_state(_sets: &dyn RegisterSets, _state: &()) -> io::Result<()> {
        Ok(())
    }

    fn go_g(r: &regs::Regs) -> u64 {
        r.r14
    }

    fn pc(r: &regs::Regs) -> u64 {
        r.rip
    }

    fn set_pc(r: &mut regs::Regs, pc: u64) {
        r.rip = pc;
    }

    fn sp(r: &regs::Regs) -> u64 {
        r.rsp
    }

    fn thread_pointer(r: &regs::Regs) -> u64 {
        r.fs_base
    }

    fn restart_pc(r: &regs::Regs) -> Option<u64> {
        regs::restart_pc(r)
    }

    fn prepare_syscall(r: &mut regs::Regs, insn: u64, nr: u64, args: [u64; 6]) {
        regs::prepare_syscall(r, insn, nr, args);
    }

    fn syscall_result(r: &regs::Regs) -> i64 {
        r.rax as i64
    }

    fn restart_interrupted_wait(r: &mut regs::Regs, _: Option<&BlockedIn>, _: bool) -> bool {
        // The kernel decides about the restart after the stop, from rax.
        regs::restart_interrupted_wait(r)
    }
}

/// framehop's unwinder for this architecture, with its rule cache.
struct FramehopUnwinder {
    unwinder: framehop::x86_64::UnwinderX86_64<Vec<u8>>,
    cache: framehop::x86_64::CacheX86_64,
}

impl crate::arch::stack_unwind::StackUnwinder for FramehopUnwinder {
    fn add(&mut self, tables: crate::arch::stack_unwind::UnwindTables) {
        use framehop::Unwinder;
        self.unwinder.add_module(crate::arch::stack_unwind::module(tables));
    }

    fn unwind(
        &mut self,
        start: crate::arch::stack_unwind::UnwindStart,
        read: &mut dyn FnMut(u64) -> Option<u64>,
        max: usize,
    ) -> Vec<u64> {
        let regs = framehop::x86_64::UnwindRegsX86_64::new(start.pc, start.sp, start.fp);
        crate::arch::stack_unwind::walk(&self.unwinder, &mut self.cache, start.pc, regs, read, max)
    }
}

/// A new unwinder for copies of this architecture's stacks.
pub(crate) fn stack_unwinder() -> Box<dyn crate::arch::stack_unwind::StackUnwinder> {
    Box::new(FramehopUnwinder {
        unwinder: framehop::x86_64::UnwinderX86_64::new(),
        cache: framehop::x86_64::CacheX86_64::new(),
    })
}
