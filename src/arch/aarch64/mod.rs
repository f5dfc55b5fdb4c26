//! AArch64: `b imm26` probes of one instruction, bit-level relocation of
//! the PC-relative instructions, an LSE or exclusive-loop counter, and the
//! runtime's entry, return and unwinder paths with pointer authentication.
//!
//! References: the Arm Architecture Reference Manual for A-profile (A64
//! encodings, C4; BTI and PSTATE.BTYPE, D8.4), the Procedure Call Standard
//! for the Arm 64-bit Architecture (x16/x17 and the stack, 6.1 and 6.4), and
//! Linux arch/arm64/include/uapi/asm/ptrace.h for the register layout.

pub mod basic_blocks;
pub mod decode;
pub mod detour;
pub mod exits;
pub mod gcs;
pub mod golang;
pub mod long;
pub mod reg;
pub mod regs;
pub mod relocate;
pub mod runtime_block;
pub mod sdt;
pub mod vector;
pub mod window;
pub mod writer;

use std::io;

use crate::arch::{
    Abi, Arch, BlockedIn, Detour, DetourSpec, FrameHome, ParamClass, Refusal, RegisterSets, RuntimeBlobs, RuntimeBlock,
    RuntimeLayout, SitePlan, Syscalls, ThreadKey, TidOffset,
};

/// What a call of the C runtime may leave written below the stack pointer
/// once it returns (no red zone here: its frames), which each call clears:
/// the link register it saved (an address in tp's code) or the
/// trampoline's address spilled there would lie in the stack the program
/// uses next, in words its frames do not write, where tp's check at
/// detach that nothing refers to its code finds them
/// ([`crate::probe::remove`]), keeping tp's memory mapped for good.
pub const CLEARED_BELOW: u32 = crate::arch::RUNTIME_STACK.next_multiple_of(16);
const _: () = assert!(CLEARED_BELOW <= 512, "one pair store per 16 bytes reaches 512 bytes below SP");

/// The AArch64 architecture.
#[derive(Debug, Clone, Copy)]
pub struct AArch64;

impl Arch for AArch64 {
    const NAME: &'static str = "aarch64";
    const ELF_MACHINE: u16 = 183; // EM_AARCH64
    const BRANCH_REACH: u64 = (128 << 20) - 4;
    const PATCH_LEN: usize = window::PATCH_LEN;
    const INSN_ALIGN: usize = 4;
    const SYSCALLS: Syscalls = super::syscalls::AARCH64;

    type Regs = regs::Regs;
    type VectorState = vector::VectorState;

    fn plan(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
        window::plan(code, function, extra_targets)
    }

    fn plan_at(
        code: &[u8],
        function: u64,
        site: u64,
        extra_targets: &[u64],
        _image: &dyn crate::arch::Image,
    ) -> Result<SitePlan, Refusal> {
        window::plan_at(code, function, site, extra_targets)
    }

    fn plan_exits(
        code: &[u8],
        addr: u64,
        parts: &[(u64, u64)],
        _extra_targets: &[u64],
        taken: &[(u64, u64)],
        _single: bool,
        image: &dyn crate::arch::Image,
    ) -> Result<Vec<crate::arch::ExitPlan>, Refusal> {
        // Every AArch64 window is one instruction.
        exits::plan_exits(code, addr, parts, taken, image)
    }

    fn sdt_argument(arg: &str) -> Result<crate::arch::ArgSpec, String> {
        sdt::argument(arg)
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

    /// x0-x7.
    const ARG_REGS: usize = 8;

    fn arg_registers(abi: Abi, params: &[ParamClass]) -> Vec<Option<usize>> {
        match abi {
            // AAPCS64 passes a composite larger than 16 bytes by reference:
            // its copy's address takes the next integer register.
            Abi::C => crate::arch::c_arg_registers(params, Self::ARG_REGS, true),
            Abi::Go => crate::arch::go_arg_registers(params, Self::go_int_args(), Self::ARG_REGS),
            Abi::GoStack => vec![None; params.len()],
        }
    }

    fn go_int_args() -> usize {
        16
    }

    fn go_stack_check(code: &[u8], addr: u64) -> Option<usize> {
        golang::stack_check_len(code, addr)
    }

    fn go_one_instruction_site(code: &[u8], addr: u64, from: usize) -> Option<usize> {
        golang::one_instruction_site(code, addr, from)
    }

    fn go_sp_below_entry(code: &[u8], addr: u64, site: u64) -> Option<u32> {
        golang::sp_below_entry(code, addr, site)
    }

    fn build_detour(plan: &SitePlan, at: u64, spec: &DetourSpec) -> Result<Detour, Refusal> {
        detour::build(plan, at, spec, detour::Atomics::host())
    }

    fn timestamp() -> u64 {
        #[cfg(target_arch = "aarch64")]
        {
            let v: u64;
            // SAFETY: reading the virtual counter, which Linux lets user space read.
            unsafe { core::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) v) };
            v
        }
        #[cfg(not(target_arch = "aarch64"))]
        0
    }

    fn timestamp_hz() -> Option<u64> {
        #[cfg(target_arch = "aarch64")]
        {
            let v: u64;
            // SAFETY: reading the counter's frequency register.
            unsafe { core::arch::asm!("mrs {}, cntfrq_el0", out(reg) v) };
            Some(v)
        }
        #[cfg(not(target_arch = "aarch64"))]
        None
    }

    fn stack_unwinder() -> Box<dyn crate::arch::stack_unwind::StackUnwinder> {
        stack_unwinder()
    }

    fn build_runtime(at: u64, layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> RuntimeBlock {
        runtime_block::build(at, layout.ctx, layout.exit_ext, blobs)
    }

    fn runtime_len(layout: &RuntimeLayout, blobs: &RuntimeBlobs) -> u64 {
        runtime_block::len(layout.exit_ext, blobs)
    }

    fn tid_offset(threads: &[(i32, regs::Regs)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset {
        let pointers: Vec<(i32, u64)> = threads.iter().map(|(tid, r)| (*tid, r.tpidr)).collect();
        runtime_block::tid_offset(&pointers, read)
    }

    fn thread_key(
        _hwcap2: u64,
        _threads: &[(i32, regs::Regs)],
        _read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    ) -> ThreadKey {
        // TPIDR_EL0 is readable in user space on every AArch64 CPU.
        ThreadKey::Register
    }

    fn patch_bytes(plan: &SitePlan, detour: u64) -> Result<Vec<u8>, Refusal> {
        detour::patch(plan, detour)
    }

    fn frame_home(slot: u64, ra_at: u64, tramp: u64, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> FrameHome {
        runtime_block::frame_home(ra_at, slot + 8, tramp, read)
    }

    fn code_address(word: u64) -> u64 {
        runtime_block::strip(word)
    }

    fn return_register(r: &regs::Regs) -> Option<u64> {
        Some(r.pt.regs[30])
    }

    const LONG_REACH: u64 = long::LONG_REACH;

    fn plan_long(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
        long::plan_long(code, function, extra_targets)
    }

    fn syscall_insn() -> &'static [u8] {
        &[0x01, 0x00, 0x00, 0xd4] // svc #0
    }

    fn stepping_stalls(code: &[u8]) -> bool {
        let Some(word) = code.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else { return false };
        matches!(decode::classify(word, 0), decode::Class::Exclusive)
    }

    fn call_return(code: &[u8], pc: u64) -> Option<u64> {
        let word = u32::from_le_bytes(code.get(..4)?.try_into().ok()?);
        // Unsupported: the authenticated calls (blraa ...), calls all the same.
        matches!(
            decode::classify(word, pc),
            decode::Class::Call { .. } | decode::Class::CallRegister { .. } | decode::Class::Unsupported
        )
        .then_some(pc + 4)
    }

    fn set_exec_breakpoint(sets: &dyn RegisterSets, at: &[u64]) -> io::Result<()> {
        regs::set_exec_breakpoint(sets, at)
    }

    fn breakpoint_insn() -> &'static [u8] {
        &[0x00, 0x00, 0x20, 0xd4] // brk #0
    }

    fn breakpoint_at(pc_after: u64) -> u64 {
        // brk traps before the instruction: the PC is the breakpoint's.
        pc_after
    }

    const SHADOW_STACK: crate::arch::ShadowStack = gcs::GCS;

    fn shadow_stack(_status: &str, hwcap: u64, sets: Option<&dyn RegisterSets>) -> crate::arch::Shadow {
        gcs::of_thread(hwcap, sets)
    }

    fn unbalances_shadow_stack(plan: &SitePlan) -> Option<&'static str> {
        gcs::unbalances(plan)
    }

    fn read_regs(sets: &dyn RegisterSets) -> io::Result<regs::Regs> {
        regs::get(sets)
    }

    fn write_regs(sets: &dyn RegisterSets, r: &regs::Regs) -> io::Result<()> {
        regs::set(sets, r)
    }

    fn save_vector_state(sets: &dyn RegisterSets) -> io::Result<vector::VectorState> {
        vector::save(sets)
    }

    fn restore_vector_state(sets: &dyn RegisterSets, state: &vector::VectorState) -> io::Result<()> {
        vector::restore(sets, state)
    }

    fn go_g(r: &regs::Regs) -> u64 {
        r.pt.regs[28]
    }

    fn pc(r: &regs::Regs) -> u64 {
        r.pt.pc
    }

    fn set_pc(r: &mut regs::Regs, pc: u64) {
        r.pt.pc = pc;
        r.pt.pstate &= !regs::PSTATE_BTYPE;
    }

    fn sp(r: &regs::Regs) -> u64 {
        r.pt.sp
    }

    fn thread_pointer(r: &regs::Regs) -> u64 {
        r.tpidr
    }

    fn restart_pc(r: &regs::Regs) -> Option<u64> {
        regs::restart_pc(r)
    }

    fn prepare_syscall(r: &mut regs::Regs, insn: u64, nr: u64, args: [u64; 6]) {
        regs::prepare_syscall(r, insn, nr, args);
    }

    fn syscall_result(r: &regs::Regs) -> i64 {
        r.pt.regs[0] as i64
    }

    const RESTART_NEEDS_BLOCKED_IN: bool = true;

    fn restart_interrupted_wait(r: &mut regs::Regs, blocked: Option<&BlockedIn>, handler_pending: bool) -> bool {
        regs::restart_interrupted_wait(r, blocked, handler_pending)
    }
}

/// framehop's unwinder for this architecture, with its rule cache.
struct FramehopUnwinder {
    unwinder: framehop::aarch64::UnwinderAarch64<Vec<u8>>,
    cache: framehop::aarch64::CacheAarch64,
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
        // The runtime records the stack from its slot, one word below the
        // stack pointer the function was entered with (runtime.h): the
        // CFA rules count from the latter.
        let regs = framehop::aarch64::UnwindRegsAarch64::new(start.ra, start.sp + 8, start.fp);
        crate::arch::stack_unwind::walk(&self.unwinder, &mut self.cache, start.pc, regs, read, max)
    }
}

/// A new unwinder for copies of this architecture's stacks.
pub(crate) fn stack_unwinder() -> Box<dyn crate::arch::stack_unwind::StackUnwinder> {
    Box::new(FramehopUnwinder {
        unwinder: framehop::aarch64::UnwinderAarch64::new(),
        cache: framehop::aarch64::CacheAarch64::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_steps_stall_at_exclusive_loads_only() {
        let stalls = |w: u32| <AArch64 as Arch>::stepping_stalls(&w.to_le_bytes());
        assert!(stalls(0xc85f_7c20), "ldxr x0, [x1]");
        assert!(stalls(0x885f_fc20), "ldaxr w0, [x1]");
        assert!(!stalls(0xc8e0_fc41), "casal x0, x1, [x2] (LSE) steps as any instruction");
        assert!(!stalls(0xd400_0001), "svc #0");
        assert!(!stalls(0x9100_0421), "add x1, x1, #1");
        assert!(!<AArch64 as Arch>::stepping_stalls(&[0x20, 0x7c]), "too short to tell");
    }

    #[test]
    fn calls_return_after_themselves() {
        let ret = |w: u32| <AArch64 as Arch>::call_return(&w.to_le_bytes(), 0x1000);
        assert_eq!(ret(0x9400_0010), Some(0x1004), "bl");
        assert_eq!(ret(0xd63f_0020), Some(0x1004), "blr x1");
        assert_eq!(ret(0xd73f_081f), Some(0x1004), "blraa x0, sp");
        assert_eq!(ret(0x1400_0010), None, "b");
        assert_eq!(ret(0xd65f_03c0), None, "ret");
        assert_eq!(<AArch64 as Arch>::call_return(&[0x10, 0x00], 0x1000), None, "too short to tell");
    }
}
