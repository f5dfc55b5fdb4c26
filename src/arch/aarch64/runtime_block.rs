//! The AArch64 parts of tp's in-target runtime: the per-arena runtime block
//! (the C runtime's functions followed by the return trampoline) and where
//! the TCB keeps the TID.
//!
//! ```text
//! tramp:  sub  sp, sp, #160        ; reached by the probed function's `ret`
//!                                  ;  (or `retaa`), with the stack pointer
//!                                  ;  it was entered with
//!         stp  x0, x1, [sp] ... stp x14, x15, [sp, #112]
//!         mrs  x17, nzcv
//!         stp  x17, x18, [sp, #128]
//!         ldr  x0, lit_ctx
//!         mov  x1, sp              ; saved x0, x1 (the results)
//!         add  x2, sp, #160        ; the stack pointer after the return
//!         bl   tp_exit             ; -> the original return address
//!         str  x0, [sp, #152]
//!         ldp  x0, x1, [sp] ... ldp x17, x18, [sp, #128]
//!         msr  nzcv, x17
//!         ldr  x30, [sp, #152]
//!         str  xzr, [sp, #152]
//!         add  sp, sp, #160
//!         ret                      ; to the original return address
//! ```
//!
//! Every register and flag the function returned with reaches the caller
//! (x0-x7 and v0-v7 hold results; a caller may keep values in x8-x15 and
//! x18 across a call of a local function under GCC's `-fipa-ra`); only x16
//! and x17, which GCC never keeps across a call (a linker veneer may
//! clobber them), and x30, which the return itself sets, change. The
//! trampoline is entered by a return, which BTI does not check, lies in an
//! arena no BTI guard covers, and leaves by `ret`, which needs no landing
//! pad where it lands; the address it returns to is the plain one the
//! detour recorded after authenticating it, so pointer authentication
//! plays no part here.

use super::CLEARED_BELOW;
use super::detour::{FRAME, restore, save};
use super::reg::Reg;
use super::writer::Writer;
use crate::arch::{FrameHome, RuntimeAddrs, RuntimeBlobs, RuntimeBlock, TidOffset};

/// Assembles the runtime block at `at`: the runtime's functions, then two
/// trampolines, one calling `tp_exit` and one `tp_exit_ext`, then the exit
/// routine the detours at functions' exits call, which calls `tp_exit_at`,
/// or `tp_exit_at_ext` for a word with a flag of `exit_ext`.
pub fn build(at: u64, ctx: u64, exit_ext: u32, blobs: &RuntimeBlobs) -> RuntimeBlock {
    let mut bytes = Vec::new();
    let addrs = lay_out(&mut Parts { at, len: 0, bytes: Some(&mut bytes) }, ctx, exit_ext, blobs);
    RuntimeBlock { bytes, addrs }
}

/// Bytes of the block [`build`] assembles for `exit_ext` and `blobs` (at
/// any 16-aligned address), without assembling it: laid out as [`build`] lays it out,
/// the runtime's functions only counted (each starts 16-aligned) and the
/// hand-written code (what decides its length) written alone.
pub fn len(exit_ext: u32, blobs: &RuntimeBlobs) -> u64 {
    let mut parts = Parts { at: 0, len: 0, bytes: None };
    lay_out(&mut parts, 0, exit_ext, blobs);
    parts.len
}

/// Where a block's parts go, one after the other, each 16-aligned: into
/// `bytes`, or only counted in `len`.
struct Parts<'a> {
    /// The block's address.
    at: u64,
    /// Its bytes so far.
    len: u64,
    /// The block, if it is being assembled.
    bytes: Option<&'a mut Vec<u8>>,
}

impl Parts<'_> {
    /// The address of the next part.
    fn next(&self) -> u64 {
        self.at + self.len
    }

    /// Appends `part`, padded with zeros to 16 bytes; its address.
    fn place(&mut self, part: &[u8]) -> u64 {
        let addr = self.next();
        self.len = (self.len + part.len() as u64).next_multiple_of(16);
        if let Some(bytes) = self.bytes.as_deref_mut() {
            bytes.extend_from_slice(part);
            bytes.resize(self.len as usize, 0);
        }
        addr
    }
}

/// The parts of a runtime block in their order (see [`build`]), made for
/// where `parts` puts them.
fn lay_out(parts: &mut Parts, ctx: u64, exit_ext: u32, blobs: &RuntimeBlobs) -> RuntimeAddrs {
    let entry = parts.place(blobs.entry);
    let exit = parts.place(blobs.exit);
    let unwind = parts.place(blobs.unwind);
    let entry_ext = parts.place(blobs.entry_ext);
    let exit_ext_flags = exit_ext;
    let exit_ext = parts.place(blobs.exit_ext);
    let trampoline = parts.place(&trampoline_code(parts.next(), exit, ctx));
    let trampoline_ext = parts.place(&trampoline_code(parts.next(), exit_ext, ctx));
    let exit_at = parts.place(blobs.exit_at);
    let exit_at_ext = parts.place(blobs.exit_at_ext);
    let exit = parts.place(&exit_routine(parts.next(), ctx, exit_ext_flags, exit_at, exit_at_ext));
    let rendezvous = parts.place(blobs.rendezvous);
    let step = parts.place(blobs.step);
    // No count stub nor fast entry: AArch64 detours count with atomics and call tp_entry.
    // One exit routine takes every word (the runtime's function decides).
    RuntimeAddrs {
        entry,
        trampoline,
        unwind,
        rendezvous,
        step,
        // No in-target stepping engine here (runtime.h says why).
        trap: 0,
        trap_return: 0,
        entry_ext,
        trampoline_ext,
        exit,
        exit_tail: exit,
        exit_runtime: exit,
        count: 0,
        ctx,
    }
}

/// One return trampoline at `at` (see the module doc), calling `exit`,
/// with its literal pool.
fn trampoline_code(at: u64, exit: u64, ctx: u64) -> Vec<u8> {
    let mut w = Writer::new(at);
    save(&mut w);
    w.put_ldr_literal(Reg::x(0), ctx);
    w.put_add_imm(Reg::x(1), Reg::SP, 0);
    w.put_add_imm(Reg::x(2), Reg::SP, FRAME);
    w.put_bl(exit);
    // tp_exit always answers: a frame lost for good ends the process in
    // the runtime (runtime.c, end_process), never here. restore() loads
    // x30 from the word the detours keep it in.
    w.put_str_offset(Reg::x(0), Reg::SP, FRAME - 8);
    w.put_clear_below_sp(CLEARED_BELOW);
    restore(&mut w);
    w.put_ret(Reg::LR);
    w.finish().expect("a block's own code and literals lie within reach")
}

/// The exit routine at `at`, which the detour at an exit of a function
/// calls (`bl`) with the word in x16 and x16, x17, x30 kept in the 32
/// bytes above the stack pointer, which was the function's entry one:
///
/// ```text
///         sub  sp, sp, #160        ; x0-x15, NZCV, x18, x30, as a trampoline
///         stp  x0, x1, [sp] ... stp x17 (nzcv), x18, [sp, #128]
///         str  x30, [sp, #152]
///         ldr  x0, lit_ctx
///         mov  x1, x16             ; the word
///         add  x2, sp, #184        ; the call's slot: the entry stack pointer less 8
///         ldp  x3, x4, [sp]        ; the results
///         mov  x5, x28             ; Go code's goroutine
///         tbnz w1, #FLAG, 1f       ; for each flag of the runtime's work
///         bl   tp_exit_at
///         b    2f
///     1:  bl   tp_exit_at_ext
///     2:  <clear below sp> ; <restore> ; ret
/// ```
///
/// Every register and NZCV reach the exit as the function left them (the
/// stub restores x16, x17 and x30).
fn exit_routine(at: u64, ctx: u64, exit_ext: u32, plain: u64, ext: u64) -> Vec<u8> {
    let mut w = Writer::new(at);
    save(&mut w);
    w.put_str_offset(Reg::LR, Reg::SP, FRAME - 8);
    w.put_ldr_literal(Reg::x(0), ctx);
    w.put_mov(Reg::x(1), Reg::X16);
    w.put_add_imm(Reg::x(2), Reg::SP, FRAME + 24);
    w.put_ldp(Reg::x(3), Reg::x(4), Reg::SP, 0);
    // Go code's goroutine, which C code leaves alone in x28.
    w.put_mov(Reg::x(5), Reg::x(28));
    let (to_ext, done) = (w.label(), w.label());
    for b in (0..32).filter(|b| exit_ext & (1 << b) != 0) {
        w.put_tbnz(Reg::x(1), b, to_ext);
    }
    w.put_bl(plain);
    w.put_b(done);
    w.bind(to_ext);
    w.put_bl(ext);
    w.bind(done);
    w.put_clear_below_sp(CLEARED_BELOW);
    restore(&mut w);
    w.put_ret(Reg::LR);
    w.finish().expect("a block's own code and literals lie within reach")
}

/// Bits of a user-space code address (48-bit virtual addresses): above
/// them a signed address holds its pointer authentication code.
const VA_BITS: u32 = 48;

/// A code address without its pointer authentication code: a user-space
/// address has bit 55 clear, and with PAC its bits from 48 up hold the code.
pub fn strip(word: u64) -> u64 {
    if word >> 55 & 1 == 0 { word & ((1 << VA_BITS) - 1) } else { word }
}

/// Where a return frame's trampoline is in a stopped process (what the
/// runtime's `tp_frame_live` looks at, runtime.h): in the word where the
/// function saves its link register (`ra_at`), or, after a tail call, in
/// the frame it left, between there and its entry stack pointer
/// `entry_sp`. Every other frame is kept: one whose function keeps the
/// address in the register (`ra_at` 0), one where it is signed (tp cannot
/// sign with the process's keys), and one where it is found nowhere (dead,
/// or saved by a tail callee beyond the frame): a kept frame costs nothing
/// once nothing refers to tp's memory, which is then unmapped with it.
pub fn frame_home(ra_at: u64, entry_sp: u64, tramp: u64, read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> FrameHome {
    if ra_at == 0 || !ra_at.is_multiple_of(8) || ra_at >= entry_sp || entry_sp - ra_at > 1 << 20 {
        return FrameHome::Kept;
    }
    let Some(bytes) = read(ra_at, (entry_sp - ra_at) as usize) else { return FrameHome::Kept };
    let words = bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap()));
    for (k, w) in words.enumerate() {
        if w == tramp {
            return FrameHome::At(ra_at + 8 * k as u64);
        }
        if strip(w) == tramp {
            break;
        }
    }
    FrameHome::Kept
}

/// The offset of the TID from TPIDR_EL0, found in the TCBs of stopped
/// threads (`threads`: TID and thread pointer). glibc and musl keep their
/// thread descriptor, with the TID, at a fixed distance below the TCB that
/// TPIDR_EL0 points at (TLS variant I); the offset is the one place near
/// it where every thread's memory holds that thread's TID (or the places,
/// for a lone thread whose TID appears more than once); unknown for
/// another runtime.
pub fn tid_offset(threads: &[(i32, u64)], read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> TidOffset {
    if threads.iter().any(|&(_, tp)| tp == 0 || !tp.is_multiple_of(8)) {
        return TidOffset::Unknown;
    }
    crate::arch::tid_offset_near(threads, read)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::arch::aarch64::decode::disassemble;

    const AT: u64 = 0x7f00_0010_0000;

    #[test]
    fn trampoline_saves_what_a_caller_may_keep_and_returns_where_tp_exit_says() {
        let blobs = RuntimeBlobs {
            entry: &[0; 8],
            exit: &[0; 20],
            unwind: &[0; 4],
            count: &[0; 4],
            entry_ext: &[0; 4],
            exit_ext: &[0; 8],
            exit_at: &[0; 4],
            exit_at_ext: &[0; 4],
            rendezvous: &[0; 4],
            step: &[0; 4],
            trap: &[0; 4],
        };
        let b = build(AT, 0x7f00_0000_1040, (1 << 29) | (1 << 30), &blobs);
        let a = b.addrs;
        assert_eq!((a.entry - AT, a.unwind - AT, a.entry_ext - AT, a.trampoline - AT), (0, 48, 64, 96));
        // The second trampoline is the first's, calling tp_exit_ext.
        let (one, two) = ((a.trampoline - AT) as usize, (a.trampoline_ext - AT) as usize);
        let ext = disassemble(&b.bytes[two..], a.trampoline_ext);
        assert_eq!(ext[14], format!("bl #{:#x}", AT + 80));
        assert_eq!(b.bytes[two..two + 14 * 4], b.bytes[one..one + 14 * 4], "the same saves and arguments");
        let off = (a.trampoline - AT) as usize;
        let asm = disassemble(&b.bytes[off..], a.trampoline);
        assert_eq!(asm[0], "sub sp, sp, #0xa0");
        let saves: Vec<String> = (0..8)
            .map(|k| match k {
                0 => "stp x0, x1, [sp]".to_string(),
                _ => format!("stp x{}, x{}, [sp, #{:#x}]", 2 * k, 2 * k + 1, 16 * k),
            })
            .collect();
        assert_eq!(asm[1..9], saves);
        assert_eq!(asm[9..11], ["mrs x17, nzcv", "stp x17, x18, [sp, #0x80]"]);
        assert!(asm[11].starts_with("ldr x0, #"));
        assert_eq!(asm[12..15], ["mov x1, sp".to_string(), "add x2, sp, #0xa0".into(), format!("bl #{:#x}", AT + 16)]);
        assert_eq!(asm[15], "str x0, [sp, #0x98]");
        assert_clears_below_sp(&asm[16..16 + CLEARING]);
        let c = CLEARING;
        assert_eq!(asm[16 + c], "ldp x0, x1, [sp]");
        let tail = [
            "ldp x17, x18, [sp, #0x80]",
            "msr nzcv, x17",
            "ldr x30, [sp, #0x98]",
            "str xzr, [sp, #0x98]",
            "add sp, sp, #0xa0",
            "ret",
        ];
        assert_eq!(asm[24 + c..30 + c], tail);
        // The context, from the trampoline's literal pool.
        let lit = u64::from_str_radix(asm[11].strip_prefix("ldr x0, #0x").unwrap(), 16).unwrap();
        let at = (lit - AT) as usize;
        assert_eq!(u64::from_le_bytes(b.bytes[at..at + 8].try_into().unwrap()), 0x7f00_0000_1040);
    }

    #[test]
    fn len_is_the_length_of_the_block_built() {
        static B: [u8; 100] = [0x1f; 100];
        let sizes = [[8, 20, 4, 4, 4, 8, 4, 4, 4, 4, 4], [100, 36, 20, 8, 36, 100, 20, 8, 36, 20, 0], [4; 11]];
        for s in sizes {
            let blobs = RuntimeBlobs::sized(&B, s);
            // Each flag of the runtime's work takes a tbnz in the exit routine.
            for exit_ext in [0, 1 << 29, (1 << 29) | (1 << 30), 0xf000_000f] {
                for at in [0, AT, 0x40_0000] {
                    let b = build(at, 0x7f00_0000_1040, exit_ext, &blobs);
                    assert_eq!(len(exit_ext, &blobs), b.bytes.len() as u64, "{s:?} {exit_ext:#x} {at:#x}");
                }
            }
        }
    }

    /// How many instructions clear what a call of the runtime left below
    /// the stack pointer (see CLEARED_BELOW).
    pub(crate) const CLEARING: usize = (CLEARED_BELOW / 16) as usize;

    /// The clearing after a call of the runtime: `asm` is its [`CLEARING`]
    /// instructions.
    pub(crate) fn assert_clears_below_sp(asm: &[String]) {
        let want: Vec<String> = (1..=CLEARING).map(|k| format!("stp xzr, xzr, [sp, #-{:#x}]", 16 * k)).collect();
        assert_eq!(asm, want);
    }

    #[test]
    fn tid_offset_is_where_every_thread_keeps_its_tid() {
        // glibc on arm64: the TID lies below the TCB (TLS variant I).
        let mem = |base: u64, tid: u32| {
            let mut m = vec![0u8; 8192];
            m[4096 - 0x6f0..4096 - 0x6f0 + 4].copy_from_slice(&tid.to_le_bytes());
            (base, m)
        };
        let (a, b) = (0xffff_8000_1000u64, 0xffff_9000_2000u64);
        let (mut ma, mb) = (mem(a, 501), mem(b, 502));
        ma.1[100..104].copy_from_slice(&501u32.to_le_bytes());
        let read = |addr: u64, len: usize| -> Option<Vec<u8>> {
            for (base, m) in [&ma, &mb] {
                let start = base - 4096;
                if addr >= start && addr + len as u64 <= start + 8192 {
                    let o = (addr - start) as usize;
                    return Some(m[o..o + len].to_vec());
                }
            }
            None
        };
        assert_eq!(tid_offset(&[(501, a), (502, b)], &read), TidOffset::At(-0x6f0));
        // A lone thread with its TID twice: the places, lowest first, for
        // the runtime to tell apart.
        assert_eq!(tid_offset(&[(501, a)], &read), TidOffset::OneOf(vec![100 - 4096, -0x6f0]));
        assert_eq!(tid_offset(&[(502, b)], &read), TidOffset::At(-0x6f0));
        assert_eq!(tid_offset(&[(501, 0)], &read), TidOffset::Unknown, "no thread pointer");
        assert_eq!(tid_offset(&[(503, b)], &read), TidOffset::Unknown, "no place holds the TID");
        // The span reaches below the mapping the thread pointer lies in (a
        // static program's TLS at the start of its heap): the rest counts.
        let c = 0xffff_a000_0000u64; // page-aligned: the page below is unmapped
        let mut mc = vec![0u8; 4096];
        mc[0x100..0x104].copy_from_slice(&504u32.to_le_bytes());
        let read_c = |addr: u64, len: usize| -> Option<Vec<u8>> {
            let o = addr.checked_sub(c)? as usize;
            mc.get(o..o + len).map(<[u8]>::to_vec)
        };
        assert_eq!(tid_offset(&[(504, c)], &read_c), TidOffset::At(0x100));
    }
}
