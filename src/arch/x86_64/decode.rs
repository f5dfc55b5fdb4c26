//! x86-64 decoding with capstone, reduced to what probe planning needs:
//! each instruction's length, mnemonic, class and direct branch target.

use std::cell::RefCell;

use capstone::arch::x86::{ArchMode, X86Insn, X86OperandType, X86Reg};
use capstone::arch::{BuildsCapstone, DetailsArchInsn};
use capstone::{Capstone, InsnGroupType};

/// What an instruction means for relocation and for the safety scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Runs the same anywhere.
    Plain,
    /// `endbr64` / `endbr32`: an indirect-branch landing pad.
    LandingPad,
    /// Has a RIP-relative memory operand (and is not a branch).
    RipRelative,
    /// A conditional direct branch (jcc, loop, jrcxz, xbegin).
    CondBranch,
    /// An unconditional direct `jmp`.
    Jump,
    /// An indirect `jmp` through a register or memory.
    IndirectJump,
    /// An indirect `jmp [rip + disp]`: a single pointer, as in tail calls through the GOT.
    IndirectJumpRip,
    /// A direct `call`.
    Call,
    /// An indirect `call`.
    IndirectCall,
    /// `ret` and its variants.
    Ret,
    /// `syscall` / `sysenter`.
    Syscall,
    /// Traps, halts, privileged and far control transfers.
    Unsafe,
}

/// One decoded instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    /// Its address.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Mnemonic, as capstone prints it.
    pub mnemonic: String,
    /// What it means for tp.
    pub class: Class,
    /// The absolute target of a direct branch or call.
    pub target: Option<u64>,
    /// The address a RIP-relative memory operand (or `lea`) refers to.
    pub rip_target: Option<u64>,
    /// An absolute address the instruction may form (not being a direct
    /// branch): an immediate, or the displacement of a memory operand
    /// without a base register. Only position-dependent code forms code
    /// addresses this way.
    pub abs_ref: Option<u64>,
}

impl Insn {
    /// One past its last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.len as u64
    }
}

thread_local! {
    static CAPSTONE: RefCell<Capstone> = RefCell::new(
        Capstone::new().x86().mode(ArchMode::Mode64).detail(true).build().expect("capstone x86-64"),
    );
}

/// Decodes `code` (which starts at `addr`) until its end or the first byte
/// sequence capstone does not know.
pub fn decode(code: &[u8], addr: u64) -> Vec<Insn> {
    CAPSTONE.with(|cs| {
        let cs = cs.borrow();
        let Ok(mut insns) = cs.disasm_iter(code, addr) else { return Vec::new() };
        let mut out = Vec::new();
        while let Some(i) = insns.next() {
            // The details once, for the class and the operands.
            let detail = cs.insn_detail(&i).ok();
            let (mut ops, mut n) = ([Op::Other; 8], 0);
            let arch = detail.as_ref().map(|d| d.arch_detail());
            if let Some(x86) = arch.as_ref().and_then(|a| a.x86()) {
                for o in x86.operands() {
                    if n == ops.len() {
                        break;
                    }
                    ops[n] = Op::of(&o.op_type);
                    n += 1;
                }
            }
            let details = detail.as_ref().map(|d| (d.groups(), &ops[..n]));
            let (class, target) = classify(&i, details);
            let (rip_target, abs_ref) = operand_refs(&i, details.map(|(_, o)| o), target.is_some());
            out.push(Insn {
                addr: i.address(),
                len: i.len() as u32,
                mnemonic: i.mnemonic().unwrap_or("?").to_string(),
                class,
                target,
                rip_target,
                abs_ref,
            });
        }
        out
    })
}

/// What tp reads of an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// An immediate.
    Imm(i64),
    /// A memory operand: its base, index and segment registers (0: none)
    /// and displacement.
    Mem { base: u32, index: u32, segment: u32, disp: i64 },
    /// Anything else.
    Other,
}

impl Op {
    fn of(t: &X86OperandType) -> Op {
        match t {
            X86OperandType::Imm(v) => Op::Imm(*v),
            X86OperandType::Mem(m) => Op::Mem {
                base: u32::from(m.base().0),
                index: u32::from(m.index().0),
                segment: u32::from(m.segment().0),
                disp: m.disp(),
            },
            _ => Op::Other,
        }
    }
}

/// The address a RIP-relative operand refers to, and an absolute address
/// an operand may hold (see [`Insn::abs_ref`]), from the instruction's
/// operands (None if capstone gave no details).
fn operand_refs(insn: &capstone::Insn, ops: Option<&[Op]>, branch: bool) -> (Option<u64>, Option<u64>) {
    let Some(ops) = ops else { return (None, None) };
    let (mut rip, mut abs) = (None, None);
    for op in ops {
        match *op {
            Op::Mem { base, disp, .. } if base == X86Reg::X86_REG_RIP => {
                rip = Some((insn.address() + insn.len() as u64).wrapping_add(disp as u64));
            }
            Op::Mem { base: 0, segment: 0, disp, .. } => abs = Some(disp as u64),
            Op::Imm(v) if !branch => abs = Some(v as u64),
            _ => {}
        }
    }
    (rip, abs)
}

fn has_group(groups: &[capstone::InsnGroupId], g: u32) -> bool {
    groups.iter().any(|x| u32::from(x.0) == g)
}

/// The class of `insn` and its direct target, from its groups and operands
/// (None if capstone gave no details).
fn classify(insn: &capstone::Insn, details: Option<(&[capstone::InsnGroupId], &[Op])>) -> (Class, Option<u64>) {
    let id = insn.id().0;
    let is = |x: X86Insn| id == x as u32;
    if is(X86Insn::X86_INS_ENDBR64) || is(X86Insn::X86_INS_ENDBR32) {
        return (Class::LandingPad, None);
    }
    let Some((groups, ops)) = details else { return (Class::Unsafe, None) };
    let imm = ops.iter().find_map(|op| match *op {
        Op::Imm(v) => Some(v as u64),
        _ => None,
    });
    let rip_mem = ops.iter().any(|op| matches!(*op, Op::Mem { base, .. } if base == X86Reg::X86_REG_RIP));
    if is(X86Insn::X86_INS_SYSCALL) || is(X86Insn::X86_INS_SYSENTER) {
        return (Class::Syscall, None);
    }
    let unsafe_ids = [
        X86Insn::X86_INS_UD0,
        X86Insn::X86_INS_UD1,
        X86Insn::X86_INS_UD2,
        X86Insn::X86_INS_HLT,
        X86Insn::X86_INS_LJMP,
        X86Insn::X86_INS_LCALL,
        X86Insn::X86_INS_INT,
        X86Insn::X86_INS_INT1,
        X86Insn::X86_INS_INT3,
        X86Insn::X86_INS_INTO,
    ];
    if unsafe_ids.iter().any(|&x| is(x))
        || has_group(groups, InsnGroupType::CS_GRP_INT)
        || has_group(groups, InsnGroupType::CS_GRP_IRET)
        || has_group(groups, InsnGroupType::CS_GRP_PRIVILEGE)
    {
        return (Class::Unsafe, None);
    }
    if has_group(groups, InsnGroupType::CS_GRP_RET) {
        return (Class::Ret, None);
    }
    if has_group(groups, InsnGroupType::CS_GRP_CALL) {
        return match imm {
            Some(t) => (Class::Call, Some(t)),
            None => (Class::IndirectCall, None),
        };
    }
    let loops = [
        X86Insn::X86_INS_XBEGIN,
        X86Insn::X86_INS_LOOP,
        X86Insn::X86_INS_LOOPE,
        X86Insn::X86_INS_LOOPNE,
        X86Insn::X86_INS_JRCXZ,
        X86Insn::X86_INS_JECXZ,
    ];
    if loops.iter().any(|&x| is(x)) {
        return (Class::CondBranch, imm);
    }
    if has_group(groups, InsnGroupType::CS_GRP_JUMP) {
        let unconditional = is(X86Insn::X86_INS_JMP);
        return match (imm, unconditional) {
            (Some(t), true) => (Class::Jump, Some(t)),
            (Some(t), false) => (Class::CondBranch, Some(t)),
            (None, _) if rip_mem && !has_index(ops) => (Class::IndirectJumpRip, None),
            (None, _) => (Class::IndirectJump, None),
        };
    }
    if rip_mem {
        return (Class::RipRelative, None);
    }
    (Class::Plain, None)
}

fn has_index(ops: &[Op]) -> bool {
    ops.iter().any(|op| matches!(*op, Op::Mem { index, .. } if index != 0))
}

/// Targets of the direct branches and calls in `code` (at `addr`), decoded
/// with iced-x86 (much faster than capstone with details, for scanning whole
/// modules), up to the first byte sequence it does not know.
pub fn branch_targets(code: &[u8], addr: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut decoder = iced_x86::Decoder::with_ip(64, code, addr, iced_x86::DecoderOptions::NONE);
    let mut insn = iced_x86::Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        out.extend(near_target(&insn));
    }
    out
}

/// The absolute target of `insn` (decoded by iced-x86) if it is a direct
/// near branch or call.
pub fn near_target(insn: &iced_x86::Instruction) -> Option<u64> {
    let near = (0..insn.op_count()).any(|k| {
        matches!(
            insn.op_kind(k),
            iced_x86::OpKind::NearBranch16 | iced_x86::OpKind::NearBranch32 | iced_x86::OpKind::NearBranch64
        )
    });
    near.then(|| insn.near_branch_target())
}

/// The targets in `(lo, hi)` (both exclusive) of the direct branches and
/// calls in `code` (at `addr`): exactly those of [`branch_targets`] that
/// lie there, found without decoding `code` at all when none can.
pub fn branch_targets_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> Vec<u64> {
    if hi <= lo.saturating_add(1) || !may_branch_into(code, addr, lo, hi) {
        return Vec::new();
    }
    branch_targets(code, addr).into_iter().filter(|&t| t > lo && t < hi).collect()
}

/// False if no instruction of `code` (at `addr`) can be a direct branch
/// to `(lo, hi)`. In 64-bit code a near branch's displacement is its last
/// byte (rel8), its last two (rel16: `xbegin` with an operand-size prefix)
/// or its last four (rel32), sign-extended, and its target is the address
/// where it ends plus that displacement, modulo 2^64
/// (`branch_displacement_is_the_last_bytes` checks every opcode under
/// every prefix); so every byte boundary is tried as the end of each form.
/// One pass over the bytes, no decoding.
fn may_branch_into(code: &[u8], addr: u64, lo: u64, hi: u64) -> bool {
    let width = hi.wrapping_sub(lo).wrapping_sub(1);
    // With v = end + displacement - lo - 1: the target is inside iff v < width.
    let base = addr.wrapping_sub(lo).wrapping_sub(1);
    let mut rel32 = 0usize;
    for (i, w) in code.windows(4).enumerate() {
        let d = i32::from_le_bytes([w[0], w[1], w[2], w[3]]) as i64 as u64;
        rel32 += (base.wrapping_add(i as u64 + 4).wrapping_add(d) < width) as usize;
    }
    if rel32 > 0 {
        return true;
    }
    // A rel16 reaches 32 KiB either way from its end, a rel8 128 bytes.
    let at = |a: u64| a.saturating_sub(addr).min(code.len() as u64) as usize;
    let (first, last) = (at(lo.saturating_sub(1 << 15)).max(1), at(hi.saturating_add(1 << 15)));
    (first..=last).any(|e| {
        let end = base.wrapping_add(e as u64);
        let rel8 = code[e - 1] as i8 as i64 as u64;
        let rel16 = (e >= 2).then(|| i16::from_le_bytes([code[e - 2], code[e - 1]]) as i64 as u64);
        end.wrapping_add(rel8) < width || rel16.is_some_and(|d| end.wrapping_add(d) < width)
    })
}

/// One line per instruction, `mnemonic operands`, for display and tests.
pub fn disassemble(code: &[u8], addr: u64) -> Vec<String> {
    CAPSTONE.with(|cs| {
        let cs = cs.borrow();
        let Ok(insns) = cs.disasm_all(code, addr) else { return Vec::new() };
        insns
            .iter()
            .map(|i| match (i.mnemonic().unwrap_or("?"), i.op_str().unwrap_or("")) {
                (m, "") => m.to_string(),
                (m, ops) => format!("{m} {ops}"),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_of(bytes: &[u8]) -> (Class, Option<u64>) {
        let d = decode(bytes, 0x1000);
        assert_eq!(d.len(), 1, "{bytes:02x?} decodes to {d:?}");
        assert_eq!(d[0].len as usize, bytes.len());
        (d[0].class, d[0].target)
    }

    #[test]
    fn classifies_each_instruction_class() {
        assert_eq!(class_of(&[0x55]), (Class::Plain, None)); // push rbp
        assert_eq!(class_of(&[0xf3, 0x0f, 0x1e, 0xfa]), (Class::LandingPad, None)); // endbr64
        assert_eq!(class_of(&[0x48, 0x8d, 0x05, 0x10, 0, 0, 0]), (Class::RipRelative, None)); // lea rax, [rip+0x10]
        assert_eq!(class_of(&[0x75, 0x10]), (Class::CondBranch, Some(0x1012))); // jne short
        assert_eq!(class_of(&[0xe3, 0x05]), (Class::CondBranch, Some(0x1007))); // jrcxz
        assert_eq!(class_of(&[0xe2, 0xfe]), (Class::CondBranch, Some(0x1000))); // loop
        assert_eq!(class_of(&[0xeb, 0x00]), (Class::Jump, Some(0x1002))); // jmp short
        assert_eq!(class_of(&[0xe9, 0, 1, 0, 0]), (Class::Jump, Some(0x1105))); // jmp near
        assert_eq!(class_of(&[0xff, 0xe0]), (Class::IndirectJump, None)); // jmp rax
        assert_eq!(class_of(&[0x3e, 0xff, 0xe0]), (Class::IndirectJump, None)); // notrack jmp rax
        assert_eq!(class_of(&[0xff, 0x25, 0, 0, 0, 0]), (Class::IndirectJumpRip, None)); // jmp [rip]
        assert_eq!(class_of(&[0xff, 0x24, 0xc5, 0, 0, 0, 0]), (Class::IndirectJump, None)); // jmp [rax*8]
        assert_eq!(class_of(&[0xe8, 0, 1, 0, 0]), (Class::Call, Some(0x1105))); // call
        assert_eq!(class_of(&[0xff, 0xd0]), (Class::IndirectCall, None)); // call rax
        assert_eq!(class_of(&[0xc3]), (Class::Ret, None));
        assert_eq!(class_of(&[0x0f, 0x05]), (Class::Syscall, None));
        for trap in [&[0xcc][..], &[0xcd, 0x80], &[0x0f, 0x0b], &[0xf4], &[0xfa]] {
            assert_eq!(class_of(trap).0, Class::Unsafe, "{trap:02x?}"); // int3, int 0x80, ud2, hlt, cli
        }
    }

    #[test]
    fn rip_relative_operands_resolve_to_absolute_addresses() {
        // lea rax, [rip + 0x10] at 0x1000 (7 bytes) -> 0x1017
        assert_eq!(decode(&[0x48, 0x8d, 0x05, 0x10, 0, 0, 0], 0x1000)[0].rip_target, Some(0x1017));
        // cmp dword ptr [rip - 0x10], 5 at 0x1000 (7 bytes: the immediate counts) -> 0xff7
        assert_eq!(decode(&[0x83, 0x3d, 0xf0, 0xff, 0xff, 0xff, 0x05], 0x1000)[0].rip_target, Some(0xff7));
        // mov rax, [rbx + 0x10]: not RIP-relative
        assert_eq!(decode(&[0x48, 0x8b, 0x43, 0x10], 0x1000)[0].rip_target, None);
    }

    #[test]
    fn absolute_operands_are_possible_addresses() {
        let abs = |bytes: &[u8]| decode(bytes, 0x1000)[0].abs_ref;
        assert_eq!(abs(&[0xbf, 0x10, 0x20, 0x40, 0x00]), Some(0x402010)); // mov edi, 0x402010
        assert_eq!(abs(&[0xff, 0x24, 0xc5, 0x10, 0x20, 0x40, 0x00]), Some(0x402010)); // jmp [rax*8 + 0x402010]
        assert_eq!(abs(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]), None); // mov rax, fs:[0x28]
        assert_eq!(abs(&[0xe8, 0, 1, 0, 0]), None); // call: a direct target, not a formed address
        assert_eq!(abs(&[0x48, 0x8b, 0x43, 0x10]), None); // mov rax, [rbx + 0x10]
    }

    #[test]
    fn branch_targets_agree_with_the_classifier() {
        // jne +0x10; call +0x100; jrcxz +5; jmp rax; xbegin +0x20; ret
        let code = [0x75, 0x10, 0xe8, 0, 1, 0, 0, 0xe3, 0x05, 0xff, 0xe0, 0xc7, 0xf8, 0x20, 0, 0, 0, 0xc3];
        let slow: Vec<u64> = decode(&code, 0x1000).iter().filter_map(|i| i.target).collect();
        assert_eq!(branch_targets(&code, 0x1000), slow);
        assert_eq!(slow, [0x1012, 0x1107, 0x100e, 0x1031]);
    }

    #[test]
    fn branch_displacement_is_the_last_bytes() {
        // Every near branch iced decodes in 64-bit code, under up to three
        // of any prefixes, targets its end plus its last byte or last four
        // bytes: what `may_branch_into` relies on.
        let prefixes = [0x66u8, 0x67, 0xf2, 0xf3, 0x2e, 0x3e, 0x26, 0x64, 0xf0, 0x40, 0x48];
        let mut opcodes: Vec<Vec<u8>> = vec![vec![0xe8], vec![0xe9], vec![0xeb], vec![0xe3], vec![0xc7, 0xf8]];
        opcodes.extend((0xe0..0xe3).map(|o| vec![o]));
        opcodes.extend((0x70..0x80).map(|o| vec![o]));
        opcodes.extend((0x80..0x90).map(|o| vec![0x0f, o]));
        let mut seen = 0;
        for n in 0..=3 {
            for k in 0..prefixes.len().pow(n) {
                let pre: Vec<u8> = (0..n).map(|j| prefixes[k / prefixes.len().pow(j) % prefixes.len()]).collect();
                for op in &opcodes {
                    let code: Vec<u8> =
                        pre.iter().chain(op).chain(&[0x9c, 0xff, 0xff, 0xff, 0x11, 0x22]).copied().collect();
                    let at = 0x7000_1000u64;
                    let mut d = iced_x86::Decoder::with_ip(64, &code, at, iced_x86::DecoderOptions::NONE);
                    let insn = d.decode();
                    let Some(t) = branch_targets(&code[..insn.len()], at).first().copied() else { continue };
                    let b = &code[..insn.len()];
                    let end = at + b.len() as u64;
                    let n = b.len();
                    let d8 = end.wrapping_add(b[n - 1] as i8 as i64 as u64);
                    let d16 = end.wrapping_add(i16::from_le_bytes([b[n - 2], b[n - 1]]) as i64 as u64);
                    let d32 = (n >= 4).then(|| {
                        end.wrapping_add(i32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]) as i64 as u64)
                    });
                    assert!(t == d8 || t == d16 || Some(t) == d32, "{b:02x?}: target {t:#x}");
                    assert!(may_branch_into(b, at, t - 1, t + 1), "{b:02x?}");
                    seen += 1;
                }
            }
        }
        assert!(seen > 10_000, "{seen}");
    }

    #[test]
    fn branches_into_a_window_are_found_without_decoding_the_rest() {
        // jne +0x10; call +0x100; jrcxz +5; jmp rax; xbegin +0x20; ret
        let code = [0x75, 0x10, 0xe8, 0, 1, 0, 0, 0xe3, 0x05, 0xff, 0xe0, 0xc7, 0xf8, 0x20, 0, 0, 0, 0xc3];
        let all = branch_targets(&code, 0x1000);
        for lo in 0x0ff0..0x1120u64 {
            for len in [2u64, 5, 14] {
                let want: Vec<u64> = all.iter().copied().filter(|&t| t > lo && t < lo + len).collect();
                assert_eq!(branch_targets_into(&code, 0x1000, lo, lo + len), want, "({lo:#x}, {:#x})", lo + len);
            }
        }
        // Nothing reaches a window far away: not even decoded.
        assert!(!may_branch_into(&code, 0x1000, 0x9000_0000, 0x9000_0010));
    }

    #[test]
    fn stops_at_unknown_bytes() {
        // push rbp; then 0x06 (invalid in 64-bit mode)
        let d = decode(&[0x55, 0x06, 0x90], 0);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn disassembles_for_display() {
        assert_eq!(disassemble(&[0x55, 0x48, 0x89, 0xe5], 0), ["push rbp", "mov rbp, rsp"]);
    }
}
