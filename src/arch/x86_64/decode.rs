//! x86-64 decoding with iced-x86, reduced to what probe planning needs:
//! each instruction's length, mnemonic, class, direct branch target and the
//! addresses its operands form. Capstone, the other decoder tp links (for
//! AArch64), checks it in the tests: the same classes, targets and
//! addresses on every instruction of real code.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

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
    /// Mnemonic, in lower case (`mov`, `jne`, `endbr64`).
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

/// Decodes `code` (which starts at `addr`) until its end or the first byte
/// sequence iced-x86 does not know.
pub fn decode(code: &[u8], addr: u64) -> Vec<Insn> {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    let mut out = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        if ins.is_invalid() {
            break;
        }
        let class = class_of(&ins);
        let target = match class {
            Class::Call | Class::Jump | Class::CondBranch => near_target(&ins),
            _ => None,
        };
        let (rip_target, abs_ref) = operand_refs(&ins, target.is_some());
        let mnemonic = mnemonic_of(&ins);
        out.push(Insn { addr: ins.ip(), len: ins.len() as u32, mnemonic, class, target, rip_target, abs_ref });
    }
    out
}

/// The mnemonic in lower case, with the AT&T name of a 64-bit immediate or
/// absolute address (`movabs`), as disassemblers print it.
fn mnemonic_of(ins: &Instruction) -> String {
    use iced_x86::Code::*;
    let movabs = [
        Mov_r64_imm64,
        Mov_AL_moffs8,
        Mov_AX_moffs16,
        Mov_EAX_moffs32,
        Mov_RAX_moffs64,
        Mov_moffs8_AL,
        Mov_moffs16_AX,
        Mov_moffs32_EAX,
        Mov_moffs64_RAX,
    ];
    if movabs.contains(&ins.code()) {
        return "movabs".to_string();
    }
    let mut m = format!("{:?}", ins.mnemonic());
    m.make_ascii_lowercase();
    m
}

/// What `ins` means for relocation and for the safety scan.
pub fn class_of(ins: &Instruction) -> Class {
    let m = ins.mnemonic();
    if matches!(m, Mnemonic::Syscall | Mnemonic::Sysenter) {
        return Class::Syscall;
    }
    if matches!(m, Mnemonic::Endbr64 | Mnemonic::Endbr32) {
        return Class::LandingPad;
    }
    // Privileged (CPL 0, and the IOPL ones: cli, sti, in, out), far
    // transfers, traps and interrupt returns.
    let far = ins.is_jmp_far() || ins.is_jmp_far_indirect() || ins.is_call_far() || ins.is_call_far_indirect();
    // And those that fault where the kernel enables UMIP.
    let umip = matches!(m, Mnemonic::Sgdt | Mnemonic::Sidt | Mnemonic::Sldt | Mnemonic::Smsw | Mnemonic::Str);
    let traps = matches!(m, Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Ud2 | Mnemonic::Hlt);
    // A segment register loaded (`mov es, [rax]`, `pop fs`).
    let segment = matches!(m, Mnemonic::Mov | Mnemonic::Pop)
        && ins.op_count() > 0
        && ins.op0_kind() == OpKind::Register
        && ins.op0_register().is_segment_register();
    if ins.is_privileged() || far || umip || traps || segment {
        return Class::Unsafe;
    }
    match ins.flow_control() {
        FlowControl::Return if matches!(m, Mnemonic::Ret | Mnemonic::Retf) => Class::Ret,
        FlowControl::Call if near_target(ins).is_some() => Class::Call,
        FlowControl::IndirectCall => Class::IndirectCall,
        FlowControl::Return | FlowControl::Call => Class::Unsafe,
        FlowControl::UnconditionalBranch => Class::Jump,
        FlowControl::ConditionalBranch => Class::CondBranch,
        // `xbegin` branches to its abort handler; `xabort` and `xend` do not branch.
        FlowControl::XbeginXabortXend if m == Mnemonic::Xbegin => Class::CondBranch,
        FlowControl::IndirectBranch if ins.is_ip_rel_memory_operand() => Class::IndirectJumpRip,
        FlowControl::IndirectBranch => Class::IndirectJump,
        FlowControl::Interrupt | FlowControl::Exception => Class::Unsafe,
        _ if ins.is_ip_rel_memory_operand() => Class::RipRelative,
        _ => Class::Plain,
    }
}

/// The address a RIP-relative operand refers to, and an absolute address
/// an operand may hold (see [`Insn::abs_ref`]). `branch`: a direct branch,
/// whose immediate is its target, not a formed address.
fn operand_refs(ins: &Instruction, branch: bool) -> (Option<u64>, Option<u64>) {
    let (mut rip, mut abs) = (None, None);
    for k in 0..ins.op_count() {
        match ins.op_kind(k) {
            OpKind::Memory if ins.is_ip_rel_memory_operand() => rip = Some(ins.ip_rel_memory_address()),
            OpKind::Memory if ins.memory_base() == Register::None && ins.segment_prefix() == Register::None => {
                abs = Some(ins.memory_displacement64())
            }
            // As wide as the operation: `and edx, -33` forms 0xffffffdf.
            OpKind::Immediate8to16 if !branch => abs = Some(ins.immediate(k) & 0xffff),
            OpKind::Immediate8to32 if !branch => abs = Some(ins.immediate(k) & 0xffff_ffff),
            OpKind::Immediate8
            | OpKind::Immediate8_2nd
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
                if !branch =>
            {
                abs = Some(ins.immediate(k))
            }
            _ => {}
        }
    }
    (rip, abs)
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

thread_local! {
    /// Capstone, for display and for the tests' oracle; planning and
    /// relocation never use it.
    static CAPSTONE: std::cell::RefCell<capstone::Capstone> = std::cell::RefCell::new({
        use capstone::arch::BuildsCapstone;
        capstone::Capstone::new()
            .x86()
            .mode(capstone::arch::x86::ArchMode::Mode64)
            .detail(true)
            .build()
            .expect("capstone x86-64")
    });
}

/// One line per instruction, `mnemonic operands`, as capstone prints them
/// in Intel syntax: for display and for the tests (benches/tp and
/// tests/reloc read emitted code with it), by a decoder other than the one
/// tp plans and relocates with.
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

/// Capstone's reading of x86-64 code, for the tests: the classes, targets
/// and operand addresses [`decode`] must agree with.
#[cfg(test)]
mod oracle {
    // The comparison reads x86-64 code where the host's is.
    #![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

    use capstone::InsnGroupType;
    use capstone::arch::DetailsArchInsn;
    use capstone::arch::x86::{X86Insn, X86OperandType, X86Reg};

    use super::{CAPSTONE, Class, Insn};

    /// [`super::decode`] done with capstone.
    pub fn decode(code: &[u8], addr: u64) -> Vec<Insn> {
        CAPSTONE.with(|cs| {
            let cs = cs.borrow();
            let Ok(mut insns) = cs.disasm_iter(code, addr) else { return Vec::new() };
            let mut out = Vec::new();
            while let Some(i) = insns.next() {
                let detail = cs.insn_detail(&i).ok();
                let mut ops = Vec::new();
                let arch = detail.as_ref().map(|d| d.arch_detail());
                if let Some(x86) = arch.as_ref().and_then(|a| a.x86()) {
                    ops.extend(x86.operands().map(|o| Op::of(&o.op_type)));
                }
                let details = detail.as_ref().map(|d| (d.groups(), &ops[..]));
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

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Op {
        Imm(i64),
        Mem { base: u32, index: u32, segment: u32, disp: i64 },
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
            let indexed = ops.iter().any(|op| matches!(*op, Op::Mem { index, .. } if index != 0));
            return match (imm, unconditional) {
                (Some(t), true) => (Class::Jump, Some(t)),
                (Some(t), false) => (Class::CondBranch, Some(t)),
                (None, _) if rip_mem && !indexed => (Class::IndirectJumpRip, None),
                (None, _) => (Class::IndirectJump, None),
            };
        }
        if rip_mem {
            return (Class::RipRelative, None);
        }
        (Class::Plain, None)
    }
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

    /// The `.text` of an ELF file on this machine, and its address.
    #[cfg(target_arch = "x86_64")]
    fn text_of(path: &str) -> (Vec<u8>, u64) {
        let file = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let elf = goblin::elf::Elf::parse(&file).expect("an ELF file");
        let text = elf.section_headers.iter().find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".text"));
        let text = text.expect("a .text section");
        let range = text.file_range().expect("in the file");
        (file[range].to_vec(), text.sh_addr)
    }

    /// iced-x86's reading equals capstone's on every instruction both
    /// decode alike (both start again at each 4 KiB): class, direct target,
    /// RIP-relative address and formed address, in the first 2 MiB of this
    /// test's own code and in the whole of libc.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn decoding_agrees_with_capstone_on_real_code() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("libc.so.6 (the libc6 package)");
        for path in ["/proc/self/exe", libc] {
            let (text, addr) = text_of(path);
            let (mut compared, mut differ) = (0, Vec::new());
            for (k, chunk) in text[..text.len().min(2 << 20)].chunks(4096).enumerate() {
                let at = addr + k as u64 * 4096;
                let ours = decode(chunk, at);
                let mut ours = ours.iter().peekable();
                for c in oracle::decode(chunk, at) {
                    while ours.peek().is_some_and(|i| i.addr < c.addr) {
                        ours.next();
                    }
                    let Some(i) = ours.peek().filter(|i| i.addr == c.addr && i.len == c.len) else { continue };
                    compared += 1;
                    // A negative immediate is formed at the operation's width by
                    // one decoder and sign-extended by the other, and capstone
                    // leaves out some small immediates: no code is mapped in the
                    // first 64 KiB, or just below 4 GiB or 2^64, to tell apart.
                    let formed = |a: Option<u64>| a.filter(|&a| a >= 0x10000 && (a as u32) < 0xffff_0000);
                    // `in`, `out` (and `ins`, `outs`) fault in user space without I/O permission:
                    // iced-x86 calls them privileged, capstone plain. The UMIP ones (`sldt`,
                    // `str`, ...) tp refuses in every form; capstone's privileged group holds
                    // some of their encodings only.
                    let io = |i: &Insn| {
                        i.class == Class::Unsafe
                            && [
                                "in", "out", "insb", "insw", "insd", "outsb", "outsw", "outsd", "sgdt", "sidt", "sldt",
                                "smsw", "str",
                            ]
                            .contains(&i.mnemonic.as_str())
                    };
                    let class = |i: &Insn| if io(i) { Class::Plain } else { i.class };
                    let off = (c.addr - at) as usize;
                    // With an address-size prefix the operand is EIP-relative,
                    // which capstone does not resolve.
                    let prefix = |b: &u8| matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0x64..=0x67 | 0xf0 | 0xf2 | 0xf3 | 0x40..=0x4f);
                    let eip = chunk[off..].iter().take_while(|b| prefix(b)).any(|&b| b == 0x67);
                    let rip = |i: &Insn| i.rip_target.filter(|_| !eip);
                    // `ff /3` and `ff /5` through memory are far calls and jumps, which tp
                    // refuses (Unsafe); capstone names some of them as near ones.
                    let mut body = chunk[off..].iter().skip_while(|b| prefix(b));
                    let far = body.next() == Some(&0xff) && body.next().is_some_and(|m| matches!((m >> 3) & 7, 3 | 5));
                    let key = |i: &Insn, class: Class| (class, i.target, rip(i), formed(i.abs_ref));
                    let theirs = if far && i.class == Class::Unsafe { Class::Unsafe } else { class(&c) };
                    if key(i, class(i)) != key(&c, theirs) {
                        differ.push(format!(
                            "{} {:02x?}: {:?} vs {:?}",
                            c.mnemonic,
                            &chunk[off..off + c.len as usize],
                            key(i, class(i)),
                            key(&c, theirs)
                        ));
                    }
                }
            }
            assert!(compared > 100_000, "{path}: only {compared} instructions compared");
            assert!(
                differ.is_empty(),
                "{path}: {} of {compared} differ: {:#?}",
                differ.len(),
                &differ[..differ.len().min(12)]
            );
        }
    }

    #[test]
    fn disassembles_for_display() {
        assert_eq!(disassemble(&[0x55, 0x48, 0x89, 0xe5], 0), ["push rbp", "mov rbp, rsp"]);
    }
}
