//! The x86-64 parts of tp's in-target runtime: the per-arena runtime block
//! (the C runtime's functions, the fast paths of entry and exit
//! ([`super::fast`]), the return trampoline, the count stub) and where the
//! TCB keeps the TID.
//!
//! ```text
//! block:  tp_entry, tp_exit, tp_unwind, tp_count, tp_entry_ext, tp_exit_ext,
//!         tp_rendezvous
//!                                  ; (C, runtime.c; tp_step after the exits)
//!                                  ; (C, runtime.c)
//! tramp:  the fast exit, which falls back to the full trampoline
//! full:   lea  rsp, [rsp - 16]     ; a slot for the return address, a pad
//!         push r11, r10, r9, r8, rdi, rsi, rcx, rdx, rax
//!         lahf / seto al / push rax ; the flags, as the detours save them
//!         mov  rdi, [rip + ctx]
//!         lea  rsi, [rsp + 8]      ; saved rax, rdx (the results)
//!         lea  rdx, [rsp + 96]     ; the stack pointer after the `ret`
//!         call tp_exit             ; -> the original return address
//!         mov  [rsp + 88], rax     ; into the slot
//!         pop rax / add al, 0x7f / sahf ; the flags back
//!         pop  rax, rdx, rcx, rsi, rdi, r8, r9, r10, r11
//!         lea  rsp, [rsp + 16]
//!         jmp  [rsp - 8]           ; to the original return address
//! ext:    the same, calling tp_exit_ext (predicates on the return value,
//!         durations kept in the target): no fast path
//! count:  the count stub (below)
//!         .quad ctx, thread cache
//! ```
//!
//! A counting detour that does not find its thread's row in the thread cache
//! calls the count stub, which keeps every register and flag, as the
//! detour must:
//!
//! ```text
//! count:  push rax / lahf / seto al / push rax     ; rax, then the flags
//!         push rcx, rdx, rsi, rdi, r8, r9, r10, r11
//!         push rbx / mov rbx, rsp / and rsp, -16    ; the detour's pushes vary
//!         mov  rdi, [rip + ctx]
//!         mov  esi, [rbx + 96]     ; the probe, pushed by the detour
//!         call tp_count            ; -> the thread's counter row
//!         mov  [rbx + 96], rax     ; for the detour to pop
//!         mov  rsp, rbx / pop rbx
//!         pop  r11, r10, r9, r8, rdi, rsi, rdx, rcx
//!         pop rax / add al, 0x7f / sahf / pop rax
//!         ret
//! ```
//!
//! Every register and flag reaches the caller as the function left it. The
//! ABI lets a callee clobber rcx, rsi, rdi and r8-r11, but GCC's
//! interprocedural register allocation (`-fipa-ra`, on at -O2) lets a
//! caller keep values in the ones a local callee is known not to touch:
//! python3.11's `PySeqIter_New` keeps its argument in rdi across its call
//! to `PySequence_Check`.
//!
//! The trampolines go back to the original return address by an indirect
//! jump through its slot, once the stack pointer is above it, not by
//! `ret`: the function's own `ret` into the trampoline used up the
//! return-stack buffer's prediction of that address, so a second `ret`
//! would take the prediction meant for the caller's own return, and every
//! return up the stack after it would be mispredicted (a probed function
//! two calls deep: 26 ns per call instead of 10.5). The slot is then in the
//! red zone, which signal delivery leaves alone, and no register is needed
//! for the target. At the
//! trampoline rsp is 16-aligned (the `ret` popped a word off the 8-mod-16
//! entry stack); 96 bytes of slot, pad, flags and registers keep it so for
//! the call.

use super::CLEARED_BELOW;
use super::fast::{self, Marks};
use super::reg::Reg;
use super::writer::{Label, Writer};
use crate::arch::{RuntimeAddrs, RuntimeBlobs, RuntimeBlock, RuntimeLayout, ThreadKey, TidOffset};

/// `HWCAP2_FSGSBASE`: the kernel lets user space read the FS base (rdfsbase).
const HWCAP2_FSGSBASE: u64 = 1 << 1;

/// How the runtime tells threads apart, by their FS base: read as the
/// word at fs:0 when every thread's holds its own FS base (`fs_bases`, as
/// glibc's and musl's TCBs do; Go's threads hold 0 there), a plain load,
/// with `rdfsbase` (where the kernel allows it: `hwcap2`) or the kernel
/// for a thread where it reads 0; else with `rdfsbase`; else the kernel.
pub fn thread_key(hwcap2: u64, fs_bases: &[u64], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> ThreadKey {
    let register = hwcap2 & HWCAP2_FSGSBASE != 0;
    let self_pointer = |base: u64| {
        base != 0 && read(base, 8).and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))) == Some(base)
    };
    let tcb = !fs_bases.is_empty() && fs_bases.iter().all(|&b| self_pointer(b));
    match (tcb, register) {
        (true, true) => ThreadKey::TcbOrRegister,
        (true, false) => ThreadKey::Tcb,
        (false, true) => ThreadKey::Register,
        (false, false) => ThreadKey::Syscall,
    }
}

/// Pushed in this order, so rax and rdx (the results) end up lowest.
const SAVED: [Reg; 9] = [Reg::R11, Reg::R10, Reg::R9, Reg::R8, Reg::Rdi, Reg::Rsi, Reg::Rcx, Reg::Rdx, Reg::Rax];
/// Bytes between the trampoline's stack pointer at the call and at its start.
const FRAME: i8 = 96;
/// Registers the count stub saves after rax and the flags, in this order.
const COUNT_SAVED: [Reg; 8] = [Reg::Rcx, Reg::Rdx, Reg::Rsi, Reg::Rdi, Reg::R8, Reg::R9, Reg::R10, Reg::R11];
/// From the count stub's rbx to the probe the detour pushed: rbx, the eight
/// registers, the flags, rax and the return address.
const COUNT_ARG: i8 = 96;

/// Assembles the runtime block at `at` (16-aligned) for the region `l`
/// describes, in one pass (the writer fills in the branches to its later
/// parts).
pub fn build(at: u64, l: &RuntimeLayout, blobs: &RuntimeBlobs) -> RuntimeBlock {
    let mut w = Writer::new(at);
    let addrs = lay_out(&mut w, l, blobs, &mut |w, blob| {
        let at = w.pc();
        w.put_bytes(blob);
        w.put_align(16);
        at
    });
    RuntimeBlock { bytes: w.finish(), addrs }
}

/// Bytes of the block [`build`] assembles for `l` and `blobs` (at any
/// 16-aligned address), without assembling it: laid out as [`build`] lays
/// it out, the runtime's functions only counted (each starts and ends
/// 16-aligned) and the hand-written code (what decides its length) written
/// alone.
pub fn len(l: &RuntimeLayout, blobs: &RuntimeBlobs) -> u64 {
    let mut w = Writer::new(0);
    let mut counted = 0;
    lay_out(&mut w, l, blobs, &mut |w, blob| {
        assert!(w.pc().is_multiple_of(16), "a runtime function starts 16-aligned");
        let at = w.pc() + counted;
        counted += (blob.len() as u64).next_multiple_of(16);
        at
    });
    w.len() as u64 + counted
}

/// The parts of a runtime block in their order (see the module doc),
/// written by `w` but for the runtime's functions, which `put_blob` places
/// (16-aligned, as what follows each) and answers the address of.
fn lay_out(
    w: &mut Writer,
    l: &RuntimeLayout,
    blobs: &RuntimeBlobs,
    put_blob: &mut dyn FnMut(&mut Writer, &[u8]) -> u64,
) -> RuntimeAddrs {
    let m = Marks::new(w);
    let entry = put_blob(w, blobs.entry);
    let exit = put_blob(w, blobs.exit);
    let unwind = put_blob(w, blobs.unwind);
    let tp_count = put_blob(w, blobs.count);
    let entry_ext = put_blob(w, blobs.entry_ext);
    let exit_ext = put_blob(w, blobs.exit_ext);
    let rendezvous = put_blob(w, blobs.rendezvous);
    let trampoline = w.pc();
    w.bind(m.tramp);
    fast::exit(w, l, &m);
    w.put_align(16);
    w.bind(m.tramp_full);
    put_trampoline(w, exit, m.lit_ctx);
    w.put_align(16);
    let trampoline_ext = w.pc();
    put_trampoline(w, exit_ext, m.lit_ctx);
    w.put_align(16);
    let count = w.pc();
    put_count_stub(w, tp_count, m.lit_ctx);
    w.put_align(16);
    let exit_at = put_blob(w, blobs.exit_at);
    let exit_at_ext = put_blob(w, blobs.exit_at_ext);
    let exits = fast::exit_at(w, l, &m, exit_at, exit_at_ext);
    w.put_align(16);
    let step = put_blob(w, blobs.step);
    let tp_trap = put_blob(w, blobs.trap);
    // The SIGTRAP handler's entry: the context as tp_trap's fourth argument.
    let trap = w.pc();
    w.put_mov_reg_rip(Reg::Rcx, m.lit_ctx);
    w.put_jmp(tp_trap);
    w.put_align(16);
    let trap_return = w.pc();
    put_sigreturn(w);
    w.put_align(8);
    let [ctx, cache] = fast::literals(l);
    w.bind(m.lit_ctx);
    w.put_u64(ctx);
    w.bind(m.lit_cache);
    w.put_u64(cache);
    RuntimeAddrs {
        entry,
        trampoline,
        unwind,
        rendezvous,
        step,
        trap,
        trap_return,
        entry_ext,
        trampoline_ext,
        exit: exits.ret,
        exit_tail: exits.tail,
        exit_runtime: exits.runtime,
        count,
        ctx: l.ctx,
    }
}

/// `mov eax, SYS_rt_sigreturn; syscall`: where the SIGTRAP handler returns.
fn put_sigreturn(w: &mut Writer) {
    w.put_bytes(&[0xb8]);
    w.put_bytes(&(crate::arch::syscalls::X86_64.rt_sigreturn as u32).to_le_bytes());
    w.put_bytes(&[0x0f, 0x05]);
}

/// A full return trampoline (see the module doc), calling `exit`.
fn put_trampoline(w: &mut Writer, exit: u64, lit_ctx: Label) {
    w.put_lea_short(Reg::Rsp, Reg::Rsp, -16);
    for r in SAVED {
        w.put_push(r);
    }
    w.put_push_flags_via_rax();
    w.put_mov_reg_rip(Reg::Rdi, lit_ctx);
    w.put_lea_short(Reg::Rsi, Reg::Rsp, 8);
    w.put_lea_short(Reg::Rdx, Reg::Rsp, FRAME as i32);
    w.put_call(exit);
    // tp_exit always answers: a frame lost for good ends the process in
    // the runtime (runtime.c, end_process), never here.
    w.put_store_short(Reg::Rax, Reg::Rsp, i32::from(FRAME - 8));
    w.put_clear_below_rsp(CLEARED_BELOW);
    w.put_pop_flags_via_rax();
    for r in SAVED.iter().rev() {
        w.put_pop(*r);
    }
    // The slot is the word below the stack pointer now: back by an
    // indirect jump through it (see the module doc).
    w.put_lea_short(Reg::Rsp, Reg::Rsp, 16);
    w.put_jmp_mem(Reg::Rsp, -8);
}

/// The count stub (see the module doc), which calls `tp_count`.
fn put_count_stub(w: &mut Writer, tp_count: u64, lit_ctx: Label) {
    w.put_push(Reg::Rax);
    w.put_push_flags_via_rax();
    for r in COUNT_SAVED {
        w.put_push(r);
    }
    w.put_push(Reg::Rbx);
    w.put_mov_reg(Reg::Rbx, Reg::Rsp);
    w.put_and_imm8(Reg::Rsp, -16);
    w.put_mov_reg_rip(Reg::Rdi, lit_ctx);
    w.put_load32_short(Reg::Rsi, Reg::Rbx, i32::from(COUNT_ARG));
    w.put_call(tp_count);
    w.put_store_short(Reg::Rax, Reg::Rbx, i32::from(COUNT_ARG));
    w.put_clear_below_rsp(CLEARED_BELOW);
    w.put_mov_reg(Reg::Rsp, Reg::Rbx);
    w.put_pop(Reg::Rbx);
    for r in COUNT_SAVED.iter().rev() {
        w.put_pop(*r);
    }
    w.put_pop_flags_via_rax();
    w.put_pop(Reg::Rax);
    w.put_ret();
}

/// The offset of the TID from the thread pointer (`fs:0`), found in the
/// TCBs of stopped threads. glibc and musl keep the TCB's own address at
/// fs:0 and the TID in their `struct pthread`; the offset is the one place
/// where every thread's TCB holds that thread's TID (or the places, for a
/// lone thread whose TID appears more than once); unknown for another
/// runtime.
pub fn tid_offset(threads: &[(i32, u64)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset {
    for &(_, fs_base) in threads {
        let own = fs_base != 0 && read(fs_base, 8).is_some_and(|tcb| tcb.get(..8) == Some(&fs_base.to_le_bytes()[..]));
        if !own {
            return TidOffset::Unknown; // fs:0 is not the thread pointer the runtime would read
        }
    }
    crate::arch::tid_offset_near(threads, read)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::arch::x86_64::decode::disassemble;

    const AT: u64 = 0x7f00_0010_0000;

    fn layout() -> RuntimeLayout {
        fast::example_layout()
    }

    #[test]
    fn len_is_the_length_of_the_block_built() {
        static B: [u8; 100] = [0xc3; 100];
        let sizes = [[8, 20, 4, 4, 4, 8, 4, 4, 4, 4, 4], [100, 36, 20, 1, 36, 100, 20, 8, 37, 20, 0], [16; 11]];
        let blobs = sizes.map(|s| RuntimeBlobs::sized(&B, s));
        for blobs in &blobs {
            for l in [RuntimeLayout::default(), layout(), RuntimeLayout { exit_ext: 1, ..layout() }] {
                for at in [0, AT, 0x40_0000] {
                    let b = build(at, &l, blobs);
                    assert_eq!(len(&l, blobs), b.bytes.len() as u64, "{blobs:?} {at:#x}");
                }
            }
        }
    }

    /// The full trampoline: the fast exit's fallback jumps to it last.
    fn full_trampoline(b: &RuntimeBlock) -> u64 {
        let a = b.addrs;
        let asm = disassemble(&b.bytes[(a.trampoline - AT) as usize..(a.trampoline_ext - AT) as usize], a.trampoline);
        let jmp = asm.iter().rfind(|i| i.starts_with("jmp 0x")).expect("the fast exit's fallback");
        u64::from_str_radix(jmp.trim_start_matches("jmp 0x"), 16).unwrap()
    }

    #[test]
    fn trampoline_calls_tp_exit_and_jumps_to_its_answer() {
        let b = build(AT, &layout(), &BLOBS);
        let a = b.addrs;
        assert_eq!((a.entry, a.ctx), (AT, 0x7f00_0000_1040));
        assert_eq!(a.unwind - AT, 32);
        assert_eq!((a.entry_ext - AT, a.rendezvous - AT, a.trampoline - AT), (64, 96, 112));
        let full = full_trampoline(&b);
        let off = (full - AT) as usize;
        let asm = disassemble(&b.bytes[off..(a.trampoline_ext - AT) as usize], full);
        let pushes = ["push r11", "push r10", "push r9", "push r8", "push rdi", "push rsi", "push rcx", "push rdx"];
        assert_eq!(asm[0], "lea rsp, [rsp - 0x10]");
        assert_eq!(asm[1..9], pushes);
        assert_eq!(asm[9..13], ["push rax", "lahf", "seto al", "push rax"]);
        assert!(asm[13].starts_with("mov rdi, qword ptr [rip + "));
        assert_eq!(asm[14..16], ["lea rsi, [rsp + 8]", "lea rdx, [rsp + 0x60]"]);
        assert_eq!(asm[16], format!("call {:#x}", AT + 16));
        assert_eq!(asm[17], "mov qword ptr [rsp + 0x58], rax");
        assert!(!asm.iter().any(|i| i == "ud2"), "no path of the trampoline traps");
        // What tp_exit left below the stack pointer, cleared (see CLEARED_BELOW).
        assert_clears_below(&asm[18..26]);
        assert_eq!(asm[26..29], ["pop rax", "add al, 0x7f", "sahf"]);
        let pops = ["pop rax", "pop rdx", "pop rcx", "pop rsi", "pop rdi", "pop r8", "pop r9", "pop r10", "pop r11"];
        assert_eq!(asm[29..38], pops);
        assert_eq!(asm[38..40], ["lea rsp, [rsp + 0x10]", "jmp qword ptr [rsp - 8]"]);
        assert!(asm[40..].iter().all(|i| i == "int3"), "padding");
        // The literals end the block: the context first.
        let lits = &b.bytes[b.bytes.len() - 16..];
        assert_eq!(u64::from_le_bytes(lits[..8].try_into().unwrap()), 0x7f00_0000_1040);
        let lit_at = AT + b.bytes.len() as u64 - 16;
        assert_eq!(asm[13], format!("mov rdi, qword ptr [rip + {:#x}]", lit_at - (full + 5 + 13 + 5 + 7)));
        // The second full trampoline is the same, calling tp_exit_ext (no fast exit).
        let ext = a.trampoline_ext;
        let asm_ext = disassemble(&b.bytes[(ext - AT) as usize..(a.count - AT) as usize], ext);
        assert_eq!(asm_ext[..13], asm[..13]);
        assert_eq!(asm_ext[16], format!("call {:#x}", AT + 80), "the second trampoline calls tp_exit_ext");
        assert_eq!(asm_ext[13], format!("mov rdi, qword ptr [rip + {:#x}]", lit_at - (ext + 5 + 13 + 5 + 7)));
        // The same, but for where the loop that clears below the stack pointer jumps back to.
        assert_eq!(asm_ext[17..25], asm[17..25]);
        assert_clears_below(&asm_ext[18..26]);
        assert_eq!(asm_ext[26..40], asm[26..40]);
    }

    #[test]
    fn where_the_parts_are_does_not_depend_on_the_layout() {
        let a = build(AT, &layout(), &BLOBS);
        let b = build(AT, &RuntimeLayout { ring_mask: 1 << 20, thread_depth: 1, ..RuntimeLayout::default() }, &BLOBS);
        assert_eq!(
            (a.addrs.trampoline, a.addrs.trampoline_ext, a.addrs.count),
            (b.addrs.trampoline, b.addrs.trampoline_ext, b.addrs.count)
        );
        assert_eq!(a.bytes.len(), b.bytes.len());
    }

    const BLOBS: RuntimeBlobs = RuntimeBlobs {
        entry: &[0xc3; 3],
        exit: &[0xc3; 5],
        unwind: &[0xc3],
        count: &[0xc3; 2],
        entry_ext: &[0xc3; 4],
        exit_ext: &[0xc3; 6],
        exit_at: &[0xc3; 7],
        exit_at_ext: &[0xc3; 8],
        rendezvous: &[0xc3; 9],
        step: &[0xc3; 10],
        trap: &[0xc3; 10],
    };

    #[test]
    fn count_stub_calls_tp_count_and_keeps_everything() {
        let b = build(AT, &layout(), &BLOBS);
        let a = b.addrs;
        let off = (a.count - AT) as usize;
        // Up to tp_exit_at and tp_exit_at_ext (16 bytes each here), which the exit routine follows.
        let asm = disassemble(&b.bytes[off..(a.exit_runtime - AT) as usize - 32], a.count);
        assert_eq!(asm[..4], ["push rax", "lahf", "seto al", "push rax"]);
        let pushes = ["push rcx", "push rdx", "push rsi", "push rdi", "push r8", "push r9", "push r10", "push r11"];
        assert_eq!(asm[4..12], pushes);
        assert_eq!(asm[12..15], ["push rbx", "mov rbx, rsp", "and rsp, 0xfffffffffffffff0"]);
        let lit_at = AT + b.bytes.len() as u64 - 16;
        assert!(asm[15].starts_with("mov rdi, qword ptr [rip + "));
        let next = a.count + 1 + 5 + 4 + 2 * 4 + 1 + 3 + 4 + 7;
        assert_eq!(asm[15], format!("mov rdi, qword ptr [rip + {:#x}]", lit_at - next));
        // The probe: above rbx, the eight registers, the flags, rax and the return address.
        assert_eq!(asm[16], "mov esi, dword ptr [rbx + 0x60]");
        assert_eq!(asm[17], format!("call {:#x}", AT + 48), "tp_count, after the other three functions");
        let stub_end = asm.iter().position(|i| i == "ret").unwrap();
        assert!(asm[stub_end + 1..].iter().all(|i| i == "int3"), "padding up to the next blob");
        assert_eq!(asm[18], "mov qword ptr [rbx + 0x60], rax");
        assert_clears_below(&asm[19..27]);
        assert_eq!(asm[27..29], ["mov rsp, rbx", "pop rbx"]);
        let pops = ["pop r11", "pop r10", "pop r9", "pop r8", "pop rdi", "pop rsi", "pop rdx", "pop rcx"];
        assert_eq!(asm[29..37], pops);
        assert_eq!(asm[37..42], ["pop rax", "add al, 0x7f", "sahf", "pop rax", "ret"]);
    }

    /// How a call of the runtime clears what it left below the stack
    /// pointer: the runtime's largest frame, its red zone, and what a
    /// caller pushes for the call.
    pub(crate) fn assert_clears_below(asm: &[String]) {
        let loop_head = [
            format!("lea rdi, [rsp - {CLEARED_BELOW:#x}]"),
            format!("mov ecx, {:#x}", CLEARED_BELOW / 16),
            "xor eax, eax".into(),
            "mov qword ptr [rdi], rax".into(),
            "mov qword ptr [rdi + 8], rax".into(),
            "add rdi, 0x10".into(),
            "dec ecx".into(),
        ];
        assert_eq!(asm[..7], loop_head);
        assert!(asm[7].starts_with("jne 0x"), "{asm:?}");
    }
    /// The fast exit, as the module doc of `fast` shows it.
    #[test]
    fn fast_exit_reads_the_layout() {
        let b = build(AT, &layout(), &BLOBS);
        let a = b.addrs;
        let exit =
            disassemble(&b.bytes[(a.trampoline - AT) as usize..(full_trampoline(&b) - AT) as usize], a.trampoline);
        assert_eq!(exit[..4], ["lea rsp, [rsp - 8]", "push rax", "lahf", "seto al"]);
        assert_eq!(exit.iter().filter(|i| *i == "rdtsc").count(), 1);
        assert!(exit.contains(&"mov r11, qword ptr [r10 + 0x10]".to_string()), "{exit:#?}");
        assert!(exit.contains(&"xor r10, 0x20".to_string()), "the paired entry: {exit:#?}");
        assert!(exit.contains(&"mov r10, qword ptr [r10 + 0x18]".to_string()), "the ring, from the entry: {exit:#?}");
        assert!(exit.contains(&"add rdx, qword ptr fs:[0]".to_string()), "the TID, from the TCB: {exit:#?}");
        assert!(exit.contains(&"cmp dword ptr [r11 + 0x18], 1".to_string()), "depth 1: {exit:#?}");
        assert!(exit.contains(&"lea rax, [rsp + 0x30]".to_string()), "the slot below the stack pointer: {exit:#?}");
        assert!(exit.contains(&"inc qword ptr [r10 + 0x40]".to_string()), "the head, published: {exit:#?}");
        assert!(exit.contains(&"or edx, 0x2000000".to_string()), "an exit event: {exit:#?}");
        // The event's last word: the durations of the timed calls it made,
        // from its frame.
        let sum = exit.iter().position(|i| i == "mov qword ptr [rax + 0x38], rdx");
        let sum = sum.unwrap_or_else(|| panic!("v[5]: {exit:#?}"));
        assert_eq!(exit[sum - 1], "mov rdx, qword ptr [r11 + 0x78]", "{exit:#?}");
        let back = exit.iter().position(|i| i == "jmp qword ptr [rsp - 8]").expect("back through the slot");
        assert_eq!(exit[back - 1], "lea rsp, [rsp + 8]");
        assert!(!exit.contains(&"ret".to_string()), "no second ret: {exit:#?}");
    }
}
