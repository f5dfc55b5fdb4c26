//! The x86-64 parts of tp's in-target runtime: the per-arena runtime block
//! (the C runtime's functions followed by the return trampoline) and where
//! the TCB keeps the TID.
//!
//! ```text
//! tramp:  lea  rsp, [rsp - 16]     ; reached by the probed function's `ret`:
//!                                  ; a slot for the return address, a pad
//!         push r11, r10, r9, r8, rdi, rsi, rcx, rdx, rax
//!         lahf / seto al / push rax ; the flags, as the detours save them
//!         mov  rdi, [rip + ctx]
//!         lea  rsi, [rsp + 8]      ; saved rax, rdx (the results)
//!         lea  rdx, [rsp + 96]     ; the stack pointer after the `ret`
//!         call tp_exit             ; -> the original return address
//!         mov  [rsp + 88], rax     ; into the slot
//!         pop rax / add al, 0x7f / sahf ; the flags back
//!         pop  rax, rdx, rcx, rsi, rdi, r8, r9, r10, r11
//!         lea  rsp, [rsp + 8]
//!         ret                      ; to the original return address
//! ```
//!
//! Every register and flag reaches the caller as the function left it. The
//! ABI lets a callee clobber rcx, rsi, rdi and r8-r11, but GCC's
//! interprocedural register allocation (`-fipa-ra`, on at -O2) lets a
//! caller keep values in the ones a local callee is known not to touch:
//! python3.11's `PySeqIter_New` keeps its argument in rdi across its call
//! to `PySequence_Check`. The return goes through `ret` rather than an
//! indirect jump so no register is needed for the target. At the
//! trampoline rsp is 16-aligned (the `ret` popped a word off the 8-mod-16
//! entry stack); 96 bytes of slot, pad, flags and registers keep it so for
//! the call.

use super::writer::Writer;
use crate::arch::{RuntimeAddrs, RuntimeBlobs, RuntimeBlock, ThreadKey};

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

const RAX: u8 = 0;
const RDX: u8 = 2;
const RSP: u8 = 4;
const RSI: u8 = 6;
const RDI: u8 = 7;
/// Pushed in this order, so rax and rdx (the results) end up lowest.
const SAVED: [u8; 9] = [11, 10, 9, 8, RDI, RSI, 1, RDX, RAX];
/// Bytes between the trampoline's stack pointer at the call and at its start.
const FRAME: i8 = 96;
/// Bytes of the trampoline: 5 + 13 + 5 + 7 + 5 + 5 + 5 + 5 + 4 + 13 + 5 + 1.
const TRAMPOLINE_LEN: u64 = 73;

/// Assembles the runtime block at `at`: the runtime's functions, then two
/// trampolines, one calling `tp_exit` and one `tp_exit_ext`, which share
/// the context's literal.
pub fn build(at: u64, ctx: u64, blobs: &RuntimeBlobs) -> RuntimeBlock {
    let mut w = Writer::new(at);
    let entry = w.pc();
    w.put_bytes(blobs.entry);
    w.put_align(16);
    let exit = w.pc();
    w.put_bytes(blobs.exit);
    w.put_align(16);
    let unwind = w.pc();
    w.put_bytes(blobs.unwind);
    w.put_align(16);
    let entry_ext = w.pc();
    w.put_bytes(blobs.entry_ext);
    w.put_align(16);
    let exit_ext = w.pc();
    w.put_bytes(blobs.exit_ext);
    w.put_align(16);
    let trampoline = w.pc();
    let trampoline_ext = (trampoline + TRAMPOLINE_LEN).next_multiple_of(16);
    // The literal follows the trampolines, whose length is fixed.
    let lit_ctx = (trampoline_ext + TRAMPOLINE_LEN).next_multiple_of(8);
    put_trampoline(&mut w, exit, lit_ctx);
    w.put_align(16);
    debug_assert_eq!(w.pc(), trampoline_ext);
    put_trampoline(&mut w, exit_ext, lit_ctx);
    w.put_align(8);
    debug_assert_eq!(w.pc(), lit_ctx);
    w.put_u64(ctx);
    let addrs = RuntimeAddrs { entry, trampoline, unwind, entry_ext, trampoline_ext, ctx };
    RuntimeBlock { bytes: w.into_bytes(), addrs }
}

/// One return trampoline (see the module doc), calling `exit`.
fn put_trampoline(w: &mut Writer, exit: u64, lit_ctx: u64) {
    let start = w.pc();
    w.put_lea_rsp(RSP, -16);
    for r in SAVED {
        w.put_push(r);
    }
    w.put_push_flags_via_rax();
    w.put_mov_reg_rip(RDI, lit_ctx);
    w.put_lea_rsp(RSI, 8);
    w.put_lea_rsp(RDX, FRAME as i32);
    w.put_call(exit);
    // tp_exit always answers: a frame lost for good ends the process in
    // the runtime (runtime.c, end_process), never here.
    w.put_store_rax(FRAME - 8);
    w.put_pop_flags_via_rax();
    for r in SAVED.iter().rev() {
        w.put_pop(*r);
    }
    w.put_lea_rsp(RSP, 8);
    w.put_ret();
    debug_assert_eq!(w.pc(), start + TRAMPOLINE_LEN);
}

/// The offset of the TID from the thread pointer (`fs:0`), found in the
/// TCBs of stopped threads. glibc and musl keep the TCB's own address at
/// fs:0 and the TID in their `struct pthread`; the offset is the one place
/// where every thread's TCB holds that thread's TID. None when no single
/// offset fits (another runtime, or a lone thread whose TID appears twice).
pub fn tid_offset(threads: &[(i32, u64)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> Option<i32> {
    const SPAN: i64 = 4096;
    let mut candidates: Option<Vec<i64>> = None;
    for &(tid, fs_base) in threads {
        if fs_base == 0 {
            return None;
        }
        let tcb = read(fs_base, 8)?;
        if u64::from_le_bytes(tcb[..8].try_into().ok()?) != fs_base {
            return None; // fs:0 is not the thread pointer the runtime would read
        }
        let bytes = read(fs_base - SPAN as u64, 2 * SPAN as usize)?;
        let here: Vec<i64> = (0..bytes.len() - 3)
            .step_by(4)
            .filter(|&i| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) == tid as u32)
            .map(|i| i as i64 - SPAN)
            .filter(|&off| off != 0)
            .collect();
        candidates = Some(match candidates {
            None => here,
            Some(prev) => prev.into_iter().filter(|o| here.contains(o)).collect(),
        });
    }
    match candidates?.as_slice() {
        [one] => i32::try_from(*one).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::decode::disassemble;

    const AT: u64 = 0x7f00_0010_0000;

    #[test]
    fn trampoline_calls_tp_exit_and_jumps_to_its_answer() {
        let blobs = RuntimeBlobs {
            entry: &[0xc3; 3],
            exit: &[0xc3; 5],
            unwind: &[0xc3],
            entry_ext: &[0xc3; 2],
            exit_ext: &[0xc3; 4],
        };
        let b = build(AT, 0x7f00_0000_1040, &blobs);
        let a = b.addrs;
        assert_eq!((a.entry, a.ctx), (AT, 0x7f00_0000_1040));
        assert_eq!(a.unwind - AT, 32);
        assert_eq!((a.entry_ext - AT, a.trampoline - AT, a.trampoline_ext - AT), (48, 80, 160));
        let ext = disassemble(&b.bytes[160..160 + TRAMPOLINE_LEN as usize], a.trampoline_ext);
        assert_eq!(ext[16], format!("call {:#x}", AT + 64), "the second trampoline calls tp_exit_ext");
        assert_eq!(ext[13], {
            let first = disassemble(&b.bytes[80..80 + TRAMPOLINE_LEN as usize], a.trampoline);
            // Both load the one literal: the same address, from 80 bytes further on.
            let d = |s: &str, at: u64| {
                at + u64::from_str_radix(s.rsplit("0x").next().unwrap().trim_end_matches(']'), 16).unwrap()
            };
            assert_eq!(d(&first[13], a.trampoline + 30), d(&ext[13], a.trampoline_ext + 30));
            ext[13].clone()
        });
        let off = (a.trampoline - AT) as usize;
        let asm = disassemble(&b.bytes[off..off + TRAMPOLINE_LEN as usize], a.trampoline);
        let pushes = ["push r11", "push r10", "push r9", "push r8", "push rdi", "push rsi", "push rcx", "push rdx"];
        assert_eq!(asm[0], "lea rsp, [rsp - 0x10]");
        assert_eq!(asm[1..9], pushes);
        assert_eq!(asm[9..13], ["push rax", "lahf", "seto al", "push rax"]);
        assert!(asm[13].starts_with("mov rdi, qword ptr [rip + "));
        assert_eq!(asm[14..16], ["lea rsi, [rsp + 8]", "lea rdx, [rsp + 0x60]"]);
        assert_eq!(asm[16], format!("call {:#x}", AT + 16));
        assert_eq!(asm[17], "mov qword ptr [rsp + 0x58], rax");
        assert!(!asm.iter().any(|i| i == "ud2"), "no path of the trampoline traps");
        assert_eq!(asm[18..21], ["pop rax", "add al, 0x7f", "sahf"]);
        let pops = ["pop rax", "pop rdx", "pop rcx", "pop rsi", "pop rdi", "pop r8", "pop r9", "pop r10", "pop r11"];
        assert_eq!(asm[21..30], pops);
        assert_eq!(asm[30..], ["lea rsp, [rsp + 8]", "ret"]);
        let lit = &b.bytes[b.bytes.len() - 8..];
        assert_eq!(u64::from_le_bytes(lit.try_into().unwrap()), 0x7f00_0000_1040);
    }

    #[test]
    fn threads_are_told_apart_by_their_fs_base() {
        let (a, b) = (0x7f00_1000_0740u64, 0x7f00_2000_0740u64);
        let tcb = |addr: u64, _len: usize| match addr {
            x if x == a || x == b => Some(x.to_le_bytes().to_vec()),
            0x7f00_3000_0000 => Some(vec![0; 8]), // Go: fs:0 holds 0
            _ => None,
        };
        assert_eq!(thread_key(HWCAP2_FSGSBASE, &[0x7f00_3000_0000], &tcb), ThreadKey::Register);
        assert_eq!(thread_key(HWCAP2_FSGSBASE, &[a, b], &tcb), ThreadKey::TcbOrRegister);
        assert_eq!(thread_key(0, &[a, b], &tcb), ThreadKey::Tcb);
        assert_eq!(thread_key(0, &[a, 0x7f00_3000_0000], &tcb), ThreadKey::Syscall);
        assert_eq!(thread_key(0, &[a, 0], &tcb), ThreadKey::Syscall);
    }

    #[test]
    fn tid_offset_is_where_every_tcb_holds_its_tid() {
        // Two fake TCBs: self pointer at 0, the TID at +0x2d0, noise elsewhere.
        let tcb = |base: u64, tid: u32| {
            let mut m = vec![0u8; 8192];
            m[4096..4104].copy_from_slice(&base.to_le_bytes());
            m[4096 + 0x2d0..4096 + 0x2d4].copy_from_slice(&tid.to_le_bytes());
            m
        };
        let (a, b) = (0x7f00_1000_0000u64, 0x7f00_2000_0000u64);
        let (mut ma, mb) = (tcb(a, 501), tcb(b, 502));
        ma[100..104].copy_from_slice(&501u32.to_le_bytes()); // a stray copy in one of them
        let read = |addr: u64, len: usize| -> Option<Vec<u8>> {
            for (base, m) in [(a, &ma), (b, &mb)] {
                let start = base - 4096;
                if addr >= start && addr + len as u64 <= start + 8192 {
                    let o = (addr - start) as usize;
                    return Some(m[o..o + len].to_vec());
                }
            }
            None
        };
        assert_eq!(tid_offset(&[(501, a), (502, b)], &read), Some(0x2d0));
        // A lone thread with its TID twice is ambiguous.
        assert_eq!(tid_offset(&[(501, a)], &read), None);
        // A thread pointer that is not its own fs:0 means another runtime.
        assert_eq!(tid_offset(&[(501, a + 8)], &read), None);
    }
}
