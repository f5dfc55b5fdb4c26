//! The ways out of an x86-64 function, and a patch window at each: what a
//! return probe patches to see a call end where it ends, without touching
//! the return address (which the program, its runtime and every stack
//! walker may read).
//!
//! A call ends at a `ret`, or at a jump out of the function: a tail call
//! (`jmp f`, the `jne f` clang writes, `jmp [rip + got]`, or a jump through
//! a register or table in a function that forms no address of its own code,
//! so cannot be a switch). A jump to the function's own entry is a call of
//! its own too (the entry probe counts it). A `ret` is one byte and a `jmp
//! rel32` five, so each exit's window is the exit with as much as it needs
//! of:
//!
//! - the `nop`s and `int3`s after it that nothing reaches (an
//!   unconditional exit never falls through to them): alignment padding,
//!   inside the function or between its last instruction and the next one.
//!   Never other instructions, even ones no branch tp sees reaches: an
//!   interpreter's handlers are reached through a table it builds at run
//!   time (LuaJIT's VM), and look like dead code to any analysis of the file;
//! - the straight-line instructions before it (an epilogue: `pop`, `add
//!   rsp`, `leave`, moves; a system call wrapper's `cmp; jae error`), which
//!   run out of place first: no call or syscall, no unconditional jump,
//!   nothing that cannot run elsewhere.
//!
//! The checks are an entry window's ([`super::window`]): no branch of the
//! function, no jump from its other parts, no code address it takes and no
//! code pointer stored in data may enter a window past its first byte. The
//! module-wide ones (other symbols, other functions' branches, landing pads)
//! are the caller's. Windows never overlap one another or the entry's, and
//! an exit inside the entry's window is recorded by the entry's detour.

use super::decode::{Class, Insn, decode};
use super::{PATCH_LEN, relocate, taken};
use crate::arch::{ExitInsn, ExitKind, ExitPlan, Image, Refusal, SitePlan, WindowInsn};
use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};

/// Instructions before an exit that its window may take.
const MAX_BEFORE: usize = 4;

/// Bytes of padding after a part's last instruction that are looked at.
const MAX_PADDING: u64 = 15;

/// Plans a window at every exit of the part `code` at `addr` of a
/// function: see [`crate::arch::Arch::plan_exits`].
pub fn plan_exits(
    code: &[u8],
    addr: u64,
    parts: &[(u64, u64)],
    extra_targets: &[u64],
    taken_windows: &[(u64, u64)],
    single: bool,
    image: &dyn Image,
) -> Result<Vec<ExitPlan>, Refusal> {
    let insns = decode(code, addr);
    let end = addr + code.len() as u64;
    let decoded_end = insns.last().map_or(addr, Insn::end);
    if decoded_end < end {
        return Err(Refusal::Undecodable { at: decoded_end });
    }
    let function = Function::new(addr, end, parts, &insns, image);
    let mut targets: Vec<u64> = insns.iter().flat_map(|i| [i.target, i.rip_target]).flatten().collect();
    targets.extend(extra_targets);
    targets.extend(&function.own_addresses);
    targets.sort_unstable();
    targets.dedup();
    let padding = padding_after(end, image);
    let mut used: Vec<(u64, u64)> = taken_windows.to_vec();
    let mut out = Vec::new();
    for (k, insn) in insns.iter().enumerate() {
        let Some(kind) = function.exit_kind(insn) else { continue };
        if taken_windows.iter().any(|&(lo, hi)| lo <= insn.addr && insn.addr < hi) {
            continue;
        }
        let part = Part { code, addr, end, insns: &insns, targets: &targets, padding, image };
        let plan = match part.window_at(k, kind, &used, single) {
            Err(why) if single && kind == ExitKind::Return => part.window_ahead(k, &used).ok_or(why),
            plan => plan,
        };
        if let Ok(p) = &plan {
            used.push((p.site, p.site + p.len() as u64));
        }
        out.push(ExitPlan { at: insn.addr, len: insn.len, kind, plan });
    }
    Ok(out)
}

/// What tells the exits of a function from its other branches.
pub(super) struct Function<'a> {
    /// The function's entry (a jump there is a call of its own).
    entry: u64,
    /// Every part's range, `[lo, hi)`.
    parts: &'a [(u64, u64)],
    /// The range of the part being planned, if it is not among `parts`.
    this: (u64, u64),
    /// Code addresses of the function that the part can form (where its
    /// indirect jumps may land inside it).
    own_addresses: Vec<u64>,
    /// The function's other parts as the module shows them ([`Image::other_parts`]).
    other: Vec<(u64, u64)>,
}

impl<'a> Function<'a> {
    /// The function whose part `[addr, end)`, decoded as `insns`, is
    /// planned; `parts` as [`plan_exits`] takes it (the first part is the
    /// one the entry starts).
    pub(super) fn new(addr: u64, end: u64, parts: &'a [(u64, u64)], insns: &[Insn], image: &dyn Image) -> Self {
        let entry = parts.first().map_or(addr, |p| p.0);
        let indirect = insns.iter().any(|i| matches!(i.class, Class::IndirectJump | Class::IndirectJumpRip));
        let mut own_addresses = if indirect { taken::code_addresses(insns, addr, end, image) } else { Vec::new() };
        // A jump to the entry is a call of its own: that address (a
        // pointer to the function, stored or taken) does not make a switch.
        own_addresses.retain(|&a| a != entry);
        let other = image.other_parts().to_vec();
        Function { entry, parts, this: (addr, end), own_addresses, other }
    }

    fn inside(&self, t: u64) -> bool {
        let within = |&(lo, hi): &(u64, u64)| lo <= t && t < hi;
        within(&self.this) || self.parts.iter().any(within) || self.other.iter().any(within)
    }

    /// How `insn` leaves the function, if it is an exit.
    pub(super) fn exit_kind(&self, insn: &Insn) -> Option<ExitKind> {
        let out = |t: u64| t == self.entry || !self.inside(t);
        match insn.class {
            Class::Ret => Some(ExitKind::Return),
            Class::Jump => insn.target.filter(|&t| out(t)).map(|_| ExitKind::Jump),
            // Only a `jcc` can be a tail call (not `loop`, `jrcxz`, `xbegin`).
            Class::CondBranch if insn.mnemonic.starts_with('j') && !insn.mnemonic.ends_with("cxz") => {
                insn.target.filter(|&t| out(t)).map(|_| ExitKind::CondJump)
            }
            Class::IndirectJump | Class::IndirectJumpRip if self.own_addresses.is_empty() => {
                Some(ExitKind::IndirectJump)
            }
            _ => None,
        }
    }
}

/// The exits among the instructions of an entry window that run, `insns`
/// (up to the first that leaves for good), as window offsets from `site`.
pub(super) fn exits_in(function: &Function, insns: &[&Insn], site: u64) -> Vec<ExitInsn> {
    let mut exits = Vec::new();
    for insn in insns {
        if let Some(kind) = function.exit_kind(insn) {
            exits.push(ExitInsn { offset: (insn.addr - site) as u32, kind });
        }
        if matches!(insn.class, Class::Ret | Class::Jump | Class::IndirectJump | Class::IndirectJumpRip) {
            break;
        }
    }
    exits
}

/// The bytes of padding at `end` (after a part's last instruction): `nop`s
/// and `int3`s in an executable segment, before anything else. Whether
/// they may join a window is the caller's to decide (nothing may reach them).
pub(super) fn padding_after(end: u64, image: &dyn Image) -> u64 {
    if !image.is_code(end) {
        return 0;
    }
    let Some(bytes) = (1..=MAX_PADDING).rev().find_map(|n| image.bytes(end, n)) else { return 0 };
    let mut len = 0;
    for i in decode(bytes, end) {
        if i.mnemonic != "nop" && i.mnemonic != "int3" {
            break;
        }
        len += i.len as u64;
    }
    len
}

/// The part of a function being planned.
struct Part<'a> {
    code: &'a [u8],
    addr: u64,
    end: u64,
    insns: &'a [Insn],
    /// Every address that may enter a window (sorted).
    targets: &'a [u64],
    /// Bytes of padding after `end`.
    padding: u64,
    image: &'a dyn Image,
}

impl Part<'_> {
    /// The first target in `(lo, hi)`.
    fn target_in(&self, lo: u64, hi: u64) -> Option<u64> {
        let first = self.targets.partition_point(|&t| t <= lo);
        self.targets.get(first).copied().filter(|&t| t < hi)
    }

    /// Bytes of padding after instruction `k` that nothing reaches, if it
    /// never falls through: the `nop`s and `int3`s that follow it, up to the
    /// first target, and past the part's end into its padding. Never an
    /// instruction of another kind, even one no branch tp sees reaches: code
    /// reached only through addresses computed at run time (an interpreter's
    /// dispatch table, built from offsets) looks the same as dead code.
    fn unreachable_after(&self, k: usize, kind: ExitKind) -> u64 {
        if kind == ExitKind::CondJump {
            return 0;
        }
        let from = self.insns[k].end();
        let first = self.targets.partition_point(|&t| t < from);
        let limit = match self.targets.get(first).copied().filter(|&t| t < self.end) {
            Some(t) => t - from,
            None => self.end - from + self.padding,
        };
        let mut len = 0;
        for i in self.insns[k + 1..].iter().take_while(|i| i.addr < self.end) {
            if i.mnemonic != "nop" && i.mnemonic != "int3" {
                return len.min(limit);
            }
            len += i.len as u64;
        }
        (len + self.padding).min(limit)
    }

    /// The window of exit `k`, not overlapping `used`; with `single`, of
    /// the exit and the bytes after it that nothing reaches only.
    fn window_at(&self, k: usize, kind: ExitKind, used: &[(u64, u64)], single: bool) -> Result<SitePlan, Refusal> {
        let exit = &self.insns[k];
        let after = self.unreachable_after(k, kind);
        let mut why = Refusal::TooShort { have: exit.len as u64 + after, need: PATCH_LEN as u64 };
        let before = if single { 0 } else { MAX_BEFORE.min(k) };
        for back in 0..=before {
            let first = &self.insns[k - back];
            if back > 0 && !runs_anywhere(first) {
                why = why_not_before(first).unwrap_or(why);
                break;
            }
            let start = first.addr;
            if let Some(t) = self.target_in(start, exit.end()) {
                let from = self.insns.iter().find(|i| i.target == Some(t)).map(|i| i.addr);
                why = match from {
                    Some(from) => Refusal::BranchIntoWindow { from },
                    None => Refusal::EntersWindow { at: t, from: "a code address the function forms".into() },
                };
                break;
            }
            let short = (start + PATCH_LEN as u64).saturating_sub(exit.end());
            if short > after {
                continue;
            }
            let hi = exit.end() + short;
            if let Some(&(lo, _)) = used.iter().find(|&&(lo, uhi)| lo < hi && start < uhi) {
                return Err(Refusal::EntersWindow { at: lo, from: "another probe's window".into() });
            }
            if let Some(&t) = self.image.stored_targets(start + 1, hi).first() {
                return Err(Refusal::EntersWindow { at: t, from: "a code pointer stored in data".into() });
            }
            let exit = ExitInsn { offset: (exit.addr - start) as u32, kind };
            return self.plan(start, hi, exit);
        }
        Err(why)
    }

    /// A window of one instruction ahead of `ret` `k`, where the window
    /// may be one instruction only: the last instruction of at least 5 bytes
    /// before it, when nothing but `add rsp, N` and `pop rbp` (which leave
    /// the return registers alone) lies between them and nothing enters
    /// past its first byte. Go's epilogue: `mov rbp, [rsp + d]; add rsp, N;
    /// ret`. The detour records the return after the instruction, N bytes
    /// below its return address ([`ExitKind::Ahead`]).
    fn window_ahead(&self, k: usize, used: &[(u64, u64)]) -> Option<SitePlan> {
        let exit = &self.insns[k];
        let mut sp_above = 0u32;
        let mut j = k.checked_sub(1)?;
        loop {
            let i = &self.insns[j];
            let bytes = &self.code[(i.addr - self.addr) as usize..][..i.len as usize];
            match stack_adjustment(bytes) {
                Some(n) => sp_above = sp_above.checked_add(n)?,
                None if i.len as usize >= PATCH_LEN && matches!(i.class, Class::Plain | Class::RipRelative) => break,
                None => return None,
            }
            j = j.checked_sub(1)?;
        }
        let w = &self.insns[j];
        let overlaps = used.iter().any(|&(lo, hi)| lo < w.end() && w.addr < hi);
        let entered = self.target_in(w.addr, exit.end()).is_some()
            || !self.image.stored_targets(w.addr + 1, exit.end()).is_empty();
        if overlaps || entered {
            return None;
        }
        let exit = ExitInsn { offset: w.len, kind: ExitKind::Ahead { sp_above } };
        self.plan(w.addr, w.end(), exit).ok()
    }

    /// The plan of the window `[start, hi)` with `exit`.
    fn plan(&self, start: u64, hi: u64, exit: ExitInsn) -> Result<SitePlan, Refusal> {
        let mut window = self.code[(start - self.addr) as usize..(hi.min(self.end) - self.addr) as usize].to_vec();
        if hi > self.end {
            let pad = self.image.bytes(self.end, hi - self.end).ok_or(Refusal::PastEnd { at: self.end })?;
            window.extend_from_slice(pad);
        }
        let insns = decode(&window, start)
            .into_iter()
            .map(|i| WindowInsn { offset: (i.addr - start) as u32, len: i.len, mnemonic: i.mnemonic })
            .collect();
        let plan = SitePlan {
            function: self.addr,
            site: start,
            prefix: Vec::new(),
            window,
            insns,
            dead: 0,
            interior: false,
            exits: vec![exit],
        };
        // Prove that the window relocates, at a distance any detour may
        // have, with room for what the detour records; the real detour
        // address is checked again when the detour is built.
        relocate::relocate_with(&plan, start.wrapping_add(1 << 30), Some(&mut |_, _| vec![0x90; 32]))?;
        Ok(plan)
    }
}

/// How far the instruction `bytes` moves the stack pointer up while
/// leaving every return register alone, if it is `add rsp, N` or `pop rbp`.
fn stack_adjustment(bytes: &[u8]) -> Option<u32> {
    let i = Decoder::new(64, bytes, DecoderOptions::NONE).decode();
    let rsp = i.op0_kind() == OpKind::Register && i.op0_register() == Register::RSP;
    match i.code() {
        _ if i.is_invalid() || i.len() != bytes.len() => None,
        Code::Pop_r64 if i.op0_register() == Register::RBP => Some(8),
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 if rsp => u32::try_from(i.immediate(1) as i64).ok(),
        _ => None,
    }
}

/// True if `insn` may run before an exit, out of place, in its window: a
/// conditional branch too (its copy goes to the same target, which the
/// window's checks keep out of its interior), as in a system call's
/// wrapper, `cmp rax, -4095; jae error; ret`.
fn runs_anywhere(insn: &Insn) -> bool {
    matches!(insn.class, Class::Plain | Class::RipRelative | Class::CondBranch)
}

/// Why `insn` cannot join an exit's window before it, when that says more
/// than "too short".
fn why_not_before(insn: &Insn) -> Option<Refusal> {
    match insn.class {
        Class::Call | Class::IndirectCall | Class::Syscall => {
            Some(Refusal::CallInWindow { mnemonic: insn.mnemonic.clone(), at: insn.addr })
        }
        Class::Unsafe => Some(Refusal::Unsafe { mnemonic: insn.mnemonic.clone(), at: insn.addr }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x401000;

    /// A module with `after` at the function's end, `pointers` stored in data.
    struct Module {
        end: u64,
        after: Vec<u8>,
        pointers: Vec<u64>,
    }

    impl Image for Module {
        fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
            let off = addr.checked_sub(self.end)? as usize;
            self.after.get(off..off + len as usize)
        }
        fn is_code(&self, addr: u64) -> bool {
            (F..F + 0x1000).contains(&addr)
        }
        fn absolute_code(&self) -> bool {
            false
        }
        fn stored_targets(&self, lo: u64, hi: u64) -> Vec<u64> {
            self.pointers.iter().copied().filter(|&t| lo <= t && t < hi).collect()
        }
    }

    fn exits_of(code: &[u8], after: &[u8]) -> Vec<ExitPlan> {
        let m = Module { end: F + code.len() as u64, after: after.to_vec(), pointers: vec![] };
        plan_exits(code, F, &[(F, F + code.len() as u64)], &[], &[(F, F + 5)], false, &m).unwrap()
    }

    fn window(e: &ExitPlan) -> (u64, usize, String) {
        let p = e.plan.as_ref().unwrap();
        (p.site, p.len(), p.summary())
    }

    // push rbx; mov ebx, edi; call +0; mov eax, ebx; pop rbx; ret
    const EPILOGUE: [u8; 13] = [0x53, 0x89, 0xfb, 0xe8, 0, 0, 0, 0, 0x89, 0xd8, 0x5b, 0xc3, 0x90];

    #[test]
    fn a_ret_takes_the_padding_after_it() {
        // The last ret, with 15 bytes of nop padding after the function.
        let code = &EPILOGUE[..12];
        let padding = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x0f, 0x1f, 0x40, 0x00, 0x90];
        let exits = exits_of(code, &padding);
        assert_eq!(exits.len(), 1);
        assert_eq!((exits[0].at, exits[0].kind), (F + 11, ExitKind::Return));
        let (site, len, summary) = window(&exits[0]);
        assert_eq!((site, len, summary.as_str()), (F + 11, 5, "ret"));
        assert_eq!(exits[0].plan.as_ref().unwrap().exits, [ExitInsn { offset: 0, kind: ExitKind::Return }]);
        // int3 padding (Go, some linkers) too.
        let exits = exits_of(code, &[0xcc; 8]);
        assert_eq!(window(&exits[0]), (F + 11, 5, "ret, int3, int3, int3, int3".into()));
    }

    #[test]
    fn without_padding_a_ret_takes_its_epilogue() {
        // No padding after: mov eax, ebx; pop rbx; ret (4 bytes) is one short,
        // and the window cannot take the call before.
        let code = &EPILOGUE[..12];
        let exits = exits_of(code, &[0x55]);
        assert!(matches!(exits[0].plan, Err(Refusal::CallInWindow { .. })), "{:?}", exits[0].plan);
        // With one byte of padding the epilogue does.
        let exits = exits_of(code, &[0x90, 0x55]);
        assert_eq!(window(&exits[0]), (F + 8, 5, "mov, pop, ret, nop".into()));
        assert_eq!(exits[0].plan.as_ref().unwrap().exits[0].offset, 3);
    }

    #[test]
    fn a_ret_that_is_a_branch_target_starts_its_window() {
        // 0: test edi, edi; 2: je 10; 4: mov eax, 1; 9: pop rbx; 10: ret
        let code = [0x85, 0xff, 0x74, 0x06, 0xb8, 1, 0, 0, 0, 0x5b, 0xc3];
        let exits = exits_of(&code, &[0x90; 4]);
        assert_eq!(window(&exits[0]), (F + 10, 5, "ret, nop, nop, nop, nop".into()));
        // Without padding, the window cannot start before the ret (a branch lands there).
        let exits = exits_of(&code, &[]);
        assert_eq!(exits[0].plan, Err(Refusal::BranchIntoWindow { from: F + 2 }));
    }

    #[test]
    fn a_ret_followed_by_reachable_code_takes_what_comes_before() {
        // 0: test edi, edi; 2: jne 14; 4: add rsp, 8; 8: pop rbx; 9: pop rbp; 10: ret;
        // 11: nop; 12: nop; 13: nop; 14: xor eax, eax; 16: ret
        let code =
            [0x85, 0xff, 0x75, 0x0a, 0x48, 0x83, 0xc4, 0x08, 0x5b, 0x5d, 0xc3, 0x90, 0x90, 0x90, 0x31, 0xc0, 0xc3];
        let exits = exits_of(&code, &[0xcc; 6]);
        assert_eq!(exits.len(), 2);
        // The first ret: the three nops after it are dead (the jne lands past
        // them), one short of a window: pop rbp joins it.
        assert_eq!(window(&exits[0]), (F + 9, 5, "pop, ret, nop, nop, nop".into()));
        assert_eq!(exits[0].plan.as_ref().unwrap().exits[0].offset, 1);
        // The last: the ret and the padding.
        assert_eq!(window(&exits[1]), (F + 16, 5, "ret, int3, int3, int3, int3".into()));
    }

    #[test]
    fn a_ret_never_takes_code_after_it_that_no_branch_reaches() {
        // An interpreter's handlers, reached through a dispatch table built
        // at run time: 0: mov eax, 1 (the entry's window); 5: pop rbx;
        // 6: ret; 7: mov eax, [rbx]; 9: jmp rax; 11: ret. No branch tp sees
        // reaches offset 7, and the window of the first ret must not cover
        // it; before it, pop rbx and the entry's window leave no room.
        let code = [0xb8, 1, 0, 0, 0, 0x5b, 0xc3, 0x8b, 0x03, 0xff, 0xe0, 0xc3];
        let exits = exits_of(&code, &[0xcc; 4]);
        let first = exits.iter().find(|e| e.at == F + 6).unwrap_or_else(|| panic!("{exits:?}"));
        assert!(first.plan.is_err(), "{:?}", first.plan);
        // The last ret takes the padding after the function.
        let last = exits.iter().find(|e| e.at == F + 11).unwrap_or_else(|| panic!("{exits:?}"));
        assert_eq!(window(last), (F + 11, 5, "ret, int3, int3, int3, int3".into()));
    }

    #[test]
    fn a_ret_between_a_branch_and_its_target_takes_the_branch() {
        // A system call's wrapper: 0: mov eax, 0x3e; 5: syscall; 7: cmp rax, -4095; 13: jae 16; 15: ret;
        // 16: neg eax; 18: ret
        let code =
            [0xb8, 0x3e, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01, 0xc3, 0xf7, 0xd8, 0xc3];
        let exits = exits_of(&code, &[0xcc; 4]);
        assert_eq!(window(&exits[0]), (F + 7, 9, "cmp, jae, ret".into()));
        assert_eq!(exits[0].plan.as_ref().unwrap().exits[0].offset, 8);
        assert_eq!(window(&exits[1]).0, F + 18);
    }

    /// main.fib as Go 1.19 builds it: cmp rsp, [r14+0x10]; jbe morestack;
    /// sub rsp, 0x18; mov [rsp+0x10], rbp; lea rbp, [rsp+0x10]; ...; then two
    /// epilogues `mov rbp, [rsp+0x10]; add rsp, 0x18; ret`, each followed by
    /// code a branch reaches, and the morestack call with its jump back.
    const GO_FIB: [u8; 127] = [
        0x49, 0x3b, 0x66, 0x10, 0x76, 0x68, 0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0x6c, 0x24, 0x10, 0x48, 0x8d, 0x6c,
        0x24, 0x10, 0xb9, 0x01, 0x00, 0x00, 0x00, 0x48, 0x8d, 0x15, 0x50, 0xd4, 0x0d, 0x00, 0xf0, 0x48, 0x0f, 0xc1,
        0x0a, 0x48, 0x83, 0xf8, 0x02, 0x7d, 0x0a, 0x48, 0x8b, 0x6c, 0x24, 0x10, 0x48, 0x83, 0xc4, 0x18, 0xc3, 0x48,
        0x89, 0x44, 0x24, 0x20, 0x48, 0x8d, 0x48, 0xff, 0x48, 0x89, 0xc8, 0xe8, 0xba, 0xff, 0xff, 0xff, 0x48, 0x89,
        0x44, 0x24, 0x08, 0x48, 0x8b, 0x4c, 0x24, 0x20, 0x48, 0x83, 0xc1, 0xfe, 0x48, 0x89, 0xc8, 0xe8, 0xa4, 0xff,
        0xff, 0xff, 0x48, 0x8b, 0x4c, 0x24, 0x08, 0x48, 0x01, 0xc8, 0x48, 0x8b, 0x6c, 0x24, 0x10, 0x48, 0x83, 0xc4,
        0x18, 0xc3, 0x48, 0x89, 0x44, 0x24, 0x08, 0xe8, 0x08, 0x53, 0xfd, 0xff, 0x48, 0x8b, 0x44, 0x24, 0x08, 0xeb,
        0x81,
    ];

    #[test]
    fn a_go_epilogue_has_a_window_ahead_of_its_return() {
        let m = Module { end: F + GO_FIB.len() as u64, after: vec![0xcc], pointers: vec![] };
        let parts = [(F, F + GO_FIB.len() as u64)];
        let exits = plan_exits(&GO_FIB, F, &parts, &[], &[(F + 10, F + 15)], true, &m).unwrap();
        // Both rets, and the morestack path's jump back to the entry.
        let at: Vec<u64> = exits.iter().map(|e| e.at).collect();
        assert_eq!(at, [F + 0x34, F + 0x6d, F + 0x7d]);
        for (e, mov) in exits.iter().zip([F + 0x2b, F + 0x64]) {
            // One instruction, `mov rbp, [rsp+0x10]`: the return is
            // recorded after it, 0x18 below the return address.
            let p = e.plan.as_ref().unwrap();
            assert_eq!((p.site, p.len(), p.summary()), (mov, 5, "mov".into()));
            assert_eq!(p.exits, [ExitInsn { offset: 5, kind: ExitKind::Ahead { sp_above: 0x18 } }]);
            // Relocated: the mov, the stub, the jump back to the `add`.
            let stub = [0x90; 7];
            let r = relocate::relocate_with(p, 0x7000_0000, Some(&mut |_, _| stub.to_vec())).unwrap();
            let copy: Vec<String> = decode(&r.code, 0x7000_0000).iter().map(|i| i.mnemonic.clone()).collect();
            assert_eq!(copy, ["mov", "nop", "nop", "nop", "nop", "nop", "nop", "nop", "jmp"]);
            let back = decode(&r.code, 0x7000_0000).last().unwrap().target;
            assert_eq!(back, Some(mov + 5));
        }
        // A two-byte jump has no window of one instruction.
        assert!(exits[2].plan.is_err());
        // Where windows may hold several instructions, the epilogue is one.
        let exits = plan_exits(&GO_FIB, F, &parts, &[], &[(F + 10, F + 15)], false, &m).unwrap();
        assert_eq!(window(&exits[0]), (F + 0x30, 5, "add, ret".into()));
    }

    #[test]
    fn a_window_ahead_needs_a_straight_way_to_its_return() {
        // mov rbp, [rsp+0x10]; add rsp, 0x18; ret, where a branch lands on the add.
        let code = [0x48, 0x8b, 0x6c, 0x24, 0x10, 0x48, 0x83, 0xc4, 0x18, 0xc3, 0x31, 0xc0];
        let m = Module { end: F + code.len() as u64, after: vec![], pointers: vec![] };
        let exits = plan_exits(&code, F, &[(F, F + 12)], &[F + 5], &[], true, &m).unwrap();
        assert!(exits[0].plan.is_err());
        // ... or a `pop rbx` (a return register of Go's) between.
        let code = [0x48, 0x8b, 0x6c, 0x24, 0x10, 0x5b, 0xc3, 0x31, 0xc0];
        let exits = plan_exits(&code, F, &[(F, F + 9)], &[F + 7], &[], true, &m).unwrap();
        assert!(exits[0].plan.is_err());
        // With `pop rbp` it is one.
        let code = [0x48, 0x8b, 0x6c, 0x24, 0x10, 0x5d, 0xc3, 0x31, 0xc0];
        let exits = plan_exits(&code, F, &[(F, F + 9)], &[F + 7], &[], true, &m).unwrap();
        let p = exits[0].plan.as_ref().unwrap();
        assert_eq!(p.exits, [ExitInsn { offset: 5, kind: ExitKind::Ahead { sp_above: 8 } }]);
    }

    #[test]
    fn tail_calls_are_exits_and_internal_jumps_are_not() {
        // 0: test edi, edi; 2: jne F+0x100 (out: a conditional tail call, 6 bytes); 8: jmp 2 (a
        // loop, 2 bytes); 10: jmp F+0x200 (out, 5 bytes); 15: jmp F (the entry: a call of its own)
        let mut code = vec![0x85, 0xff, 0x0f, 0x85];
        code.extend(((0x100i64 - 8) as i32).to_le_bytes());
        code.extend([0xeb, 0xf8, 0xe9]);
        code.extend(((0x200i64 - 15) as i32).to_le_bytes());
        code.extend([0xe9]);
        code.extend((-20i32).to_le_bytes());
        let m = Module { end: F + code.len() as u64, after: vec![0xcc; 4], pointers: vec![] };
        let exits = plan_exits(&code, F, &[(F, F + 20)], &[], &[], false, &m).unwrap();
        let kinds: Vec<(u64, ExitKind)> = exits.iter().map(|e| (e.at, e.kind)).collect();
        assert_eq!(kinds, [(F + 2, ExitKind::CondJump), (F + 10, ExitKind::Jump), (F + 15, ExitKind::Jump)]);
        assert_eq!(window(&exits[0]), (F + 2, 6, "jne".into()));
        // With the entry's window over the jne, its detour records that exit.
        let planned = plan_exits(&code, F, &[(F, F + 20)], &[], &[(F, F + 8)], false, &m).unwrap();
        assert_eq!(planned.iter().map(|e| e.at).collect::<Vec<_>>(), [F + 10, F + 15]);
        // Each direct jump is a window of its own.
        assert_eq!(window(&planned[0]), (F + 10, 5, "jmp".into()));
        assert_eq!(window(&planned[1]), (F + 15, 5, "jmp".into()));
    }

    #[test]
    fn indirect_jumps_are_exits_only_where_the_function_has_no_switch() {
        // 0: push rbx; 1: mov rax, [rdi]; 4: pop rbx; 5: jmp rax (a tail call through a pointer)
        let code = [0x53, 0x48, 0x8b, 0x07, 0x5b, 0xff, 0xe0];
        let exits = exits_of(&code, &[0xcc; 4]);
        assert_eq!((exits[0].at, exits[0].kind), (F + 5, ExitKind::IndirectJump));
        assert_eq!(window(&exits[0]).0, F + 5);
        // A function that forms an address of its own code (lea rdx, [rip + 2] = F + 9: a
        // switch table or a label) may jump inside itself: its indirect jumps are not exits.
        let code = [0x48, 0x8d, 0x15, 0x02, 0x00, 0x00, 0x00, 0xff, 0xe2, 0xc3];
        let exits = exits_of(&code, &[0xcc; 4]);
        assert_eq!(exits.iter().map(|e| e.kind).collect::<Vec<_>>(), [ExitKind::Return]);
    }

    #[test]
    fn a_jump_to_the_functions_own_entry_is_a_call_of_its_own() {
        // lea rdx, [rip - 7] (F, the entry: a pointer to the function); jmp rdx
        let code = [0x48, 0x8d, 0x15, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xe2];
        let exits = exits_of(&code, &[0xcc; 4]);
        assert_eq!(exits.iter().map(|e| (e.at, e.kind)).collect::<Vec<_>>(), [(F + 7, ExitKind::IndirectJump)]);
    }

    #[test]
    fn stored_pointers_and_other_windows_refuse() {
        let code = &EPILOGUE[..12];
        let m = Module { end: F + 12, after: vec![0x90; 8], pointers: vec![F + 12] };
        let exits = plan_exits(code, F, &[(F, F + 12)], &[], &[(F, F + 5)], false, &m).unwrap();
        assert!(matches!(exits[0].plan, Err(Refusal::EntersWindow { at, .. }) if at == F + 12), "{:?}", exits[0].plan);
        // Two rets close together: the second window cannot overlap the first.
        // 0..5: entry; 5: ret; 6: nop*4 (dead); 10: pop rbx; 11: ret
        let code = [0x53, 0x48, 0x89, 0xfb, 0x90, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x5b, 0xc3];
        let exits = exits_of(&code, &[]);
        assert_eq!(window(&exits[0]), (F + 5, 5, "ret, nop, nop, nop, nop".into()));
        assert!(exits[1].plan.is_err(), "{:?}", exits[1].plan);
    }

    #[test]
    fn code_that_does_not_decode_has_no_known_exits() {
        let m = Module { end: F + 3, after: vec![], pointers: vec![] };
        assert_eq!(
            plan_exits(&[0x53, 0x06, 0xc3], F, &[(F, F + 3)], &[], &[], false, &m),
            Err(Refusal::Undecodable { at: F + 1 })
        );
    }
}
