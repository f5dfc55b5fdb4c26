//! Relocating an x86-64 window's instructions to a detour, with iced-x86's
//! BlockEncoder doing the re-encoding: RIP-relative displacements are
//! recomputed, short branches widened, `jrcxz`/`loop` rewritten, and targets
//! out of rel32 reach either encoded long or refused. A window whose
//! instructions mean the same anywhere (no RIP-relative operand, no branch:
//! most prologues) is copied byte for byte instead, then the `jmp` back.
//!
//! Two rewrites are tp's own. A `call` as the window's last instruction
//! becomes "push the original return address; jmp target", so the callee
//! returns into the original code, never into the detour (`call [mem]` loads
//! its target into r11 first, so a bad pointer faults before the push, as
//! the call would). A window that does
//! not end in `ret`/`jmp` gets a `jmp` back to the first byte after it.
//! A `nop` is not copied (a thread stopped on one goes to the copy of what
//! follows it): a probe on a 5-byte `nop` has nothing to relocate, and one
//! on a static probe's 1-byte `nop` relocates only what comes after it.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, Instruction, InstructionBlock, MemoryOperand,
    OpKind, Register,
};

use super::decode::{Class, class_of, near_target};
use crate::arch::{ExitInsn, ExitKind, Refusal, SitePlan};

/// The relocated instructions of one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    /// The code, valid only at the address it was encoded for.
    pub code: Vec<u8>,
    /// For each window offset of an instruction that runs, its offset in `code`.
    /// The window's length maps to the `jmp` back when there is one.
    pub offsets: Vec<(u32, u32)>,
}

/// Relocates the window of `plan` to run at `at`.
pub fn relocate(plan: &SitePlan, at: u64) -> Result<Relocated, Refusal> {
    relocate_with(plan, at, None)
}

/// What a detour that records a call's end puts before an exit instruction
/// of its window ([`SitePlan::exits`]): the bytes, given the address they
/// go at and the exit. Their length must not depend on the address.
pub type ExitStub<'a> = &'a mut dyn FnMut(u64, ExitInsn) -> Vec<u8>;

/// Relocates the window of `plan` to run at `at`, with `stub`'s bytes
/// before each of its exits: before a `ret` or a jump out of the function
/// (which then leaves from the copy), and on the taken side of a
/// conditional one, which becomes the opposite condition around them: `jncc
/// next; <stub>; jmp target; next:`; after the window's instructions for a
/// return it leads to ([`ExitKind::Ahead`]). A thread at an exit goes to
/// what records it. Without `stub`, exits are relocated as any instruction.
pub fn relocate_with(plan: &SitePlan, at: u64, mut stub: Option<ExitStub>) -> Result<Relocated, Refusal> {
    let decoded: Vec<Instruction> =
        Decoder::with_ip(64, &plan.window, plan.site, DecoderOptions::NONE).into_iter().collect();
    let steps = steps_of(plan, &decoded)?;
    let mut out = Relocated { code: Vec::new(), offsets: Vec::new() };
    let mut seg = Segment::default();
    let mut ends_in_transfer = false;
    for (k, (c, ins)) in steps.iter().zip(&decoded).enumerate() {
        let offset = (c.addr - plan.site) as u32;
        let last = k + 1 == steps.len() || c.addr + c.len as u64 >= plan.site + plan.len() as u64;
        if let Some(stub) = stub.as_mut()
            && let Some(exit) = plan.exits.iter().find(|e| e.offset == offset)
        {
            seg.encode_into(&mut out, at, plan)?;
            out.offsets.push((offset, out.code.len() as u32));
            emit_exit(&mut out, at, plan, c, ins, *exit, &mut **stub)?;
            if exit.kind != ExitKind::CondJump {
                ends_in_transfer = true;
                break;
            }
            if last {
                break;
            }
            continue;
        }
        match c.class {
            Class::Call if last => {
                push_return_address(&mut seg.block, &mut seg.origin, Some(offset), plan.site + plan.len() as u64);
                let jump = Instruction::with_branch(Code::Jmp_rel32_64, ins.near_branch_target())
                    .map_err(|e| unrelocatable(c, &e.to_string()))?;
                seg.block.push(jump);
                seg.origin.push(None);
                ends_in_transfer = true;
                break;
            }
            Class::IndirectCall if last => {
                indirect_call(&mut seg.block, &mut seg.origin, offset, plan.site + plan.len() as u64, ins)
                    .map_err(|why| unrelocatable(c, why))?;
                ends_in_transfer = true;
                break;
            }
            Class::Plain if c.mnemonic == "nop" => seg.skipped.push((offset, seg.block.len())),
            _ => {
                seg.block.push(*ins);
                seg.origin.push(Some(offset));
            }
        }
        if matches!(c.class, Class::Ret | Class::Jump | Class::IndirectJump | Class::IndirectJumpRip) {
            ends_in_transfer = true;
            break;
        }
        if last {
            break;
        }
    }
    if !ends_in_transfer {
        let end = plan.len() as u32;
        // A return the window's end leads to (ExitKind::Ahead): recorded
        // after the window's instructions, before the jump back.
        if let Some(stub) = stub.as_mut()
            && let Some(exit) = plan.exits.iter().find(|e| e.offset == end)
        {
            seg.encode_into(&mut out, at, plan)?;
            out.offsets.push((end, out.code.len() as u32));
            let bytes = stub(at + out.code.len() as u64, *exit);
            out.code.extend(bytes);
        }
        let back = plan.site + plan.len() as u64;
        seg.block.push(Instruction::with_branch(Code::Jmp_rel32_64, back).expect("jmp rel32"));
        seg.origin.push(Some(plan.len() as u32));
    }
    seg.encode_into(&mut out, at, plan)?;
    out.offsets.sort_unstable();
    Ok(out)
}

/// One instruction of the window as relocation sees it: where it is, its
/// length and mnemonic as the planner decoded them (kept with
/// the plan), and what it does as iced-x86 decodes it, which must agree.
struct Step<'a> {
    addr: u64,
    len: u32,
    mnemonic: &'a str,
    class: Class,
    /// The absolute target of a direct branch or call.
    target: Option<u64>,
}

/// The window's instructions as the plan holds them, each beside its
/// decode by iced-x86 (`decoded`): refused where the two disagree on any
/// instruction's place or length. Bytes past the plan's last instruction
/// (the part of an instruction of padding after a transfer) are never
/// reached.
fn steps_of<'a>(plan: &'a SitePlan, decoded: &[Instruction]) -> Result<Vec<Step<'a>>, Refusal> {
    let mut steps = Vec::with_capacity(plan.insns.len());
    for (k, w) in plan.insns.iter().enumerate() {
        let addr = plan.site + w.offset as u64;
        let disagree = || Refusal::Unrelocatable {
            mnemonic: w.mnemonic.clone(),
            at: addr,
            why: "the two decoders disagree on this instruction".into(),
        };
        let ins = decoded.get(k).filter(|i| !i.is_invalid() && i.ip() == addr && i.len() as u32 == w.len);
        let ins = ins.ok_or_else(disagree)?;
        steps.push(Step { addr, len: w.len, mnemonic: &w.mnemonic, class: class_of(ins), target: near_target(ins) });
    }
    Ok(steps)
}

/// Instructions relocated together between exits.
#[derive(Default)]
struct Segment {
    block: Vec<Instruction>,
    /// The window offset of each block instruction, if a thread there
    /// stands for one.
    origin: Vec<Option<u32>>,
    /// Window offsets of nops left out, with the block index of what follows each.
    skipped: Vec<(u32, usize)>,
}

impl Segment {
    /// Encodes the block at the end of `out` (whose code starts at `at`)
    /// and empties it.
    fn encode_into(&mut self, out: &mut Relocated, at: u64, plan: &SitePlan) -> Result<(), Refusal> {
        let Segment { block, origin, skipped } = std::mem::take(self);
        let base = out.code.len() as u32;
        if block.is_empty() {
            out.offsets.extend(skipped.iter().map(|&(o, _)| (o, base)));
            return Ok(());
        }
        let here = at + base as u64;
        if let Some(code) = copied(&block, &origin, here, plan) {
            let len = code.len() as u32;
            let mut ends = Vec::with_capacity(block.len() + 1);
            let mut pos = base;
            for ins in &block {
                ends.push(pos);
                pos += ins.len() as u32;
            }
            ends.push(base + len);
            out.offsets.extend(origin.iter().zip(&ends).filter_map(|(o, &n)| Some(((*o)?, n))));
            out.offsets.extend(skipped.iter().map(|&(o, k)| (o, ends[k])));
            out.code.extend(code);
            return Ok(());
        }
        let window_end = plan.site + plan.len() as u64;
        // Data operands that the encoder would point at the copy, by block index.
        let data_in_window: Vec<(usize, u64)> = block
            .iter()
            .enumerate()
            .filter(|(_, ins)| ins.is_ip_rel_memory_operand())
            .map(|(k, ins)| (k, ins.ip_rel_memory_address()))
            .filter(|&(_, t)| (plan.site..window_end).contains(&t))
            .collect();
        let encoded = BlockEncoder::encode(
            64,
            InstructionBlock::new(&block, here),
            BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )
        .map_err(|e| {
            let msg = e.to_string();
            if msg.contains("too far") {
                Refusal::OutOfReach { at: plan.site }
            } else {
                Refusal::Unrelocatable { mnemonic: plan.summary(), at: plan.site, why: msg }
            }
        })?;
        let mut code = encoded.code_buffer;
        keep_data_addresses(&mut code, here, &encoded.new_instruction_offsets, &data_in_window)
            .map_err(|why| Refusal::Unrelocatable { mnemonic: plan.summary(), at: plan.site, why })?;
        let new = &encoded.new_instruction_offsets;
        let len = code.len() as u32;
        let at_index = |k: usize| match new.get(k) {
            Some(&n) if n != u32::MAX => Some(base + n),
            None if k == block.len() => Some(base + len),
            _ => None,
        };
        out.offsets.extend(origin.iter().enumerate().filter_map(|(k, o)| Some(((*o)?, at_index(k)?))));
        out.offsets.extend(skipped.iter().filter_map(|&(o, k)| Some((o, at_index(k)?))));
        out.code.extend(code);
        Ok(())
    }
}

/// The common block, relocated by copying: instructions of the window
/// whose meaning does not depend on where they are (no RIP-relative
/// operand, no branch), in their own bytes, then at most the `jmp` back to
/// the window's end, at `here`. None for any other block, or a `jmp` back
/// out of rel32 reach (the encoder then says why).
fn copied(block: &[Instruction], origin: &[Option<u32>], here: u64, plan: &SitePlan) -> Option<Vec<u8>> {
    let back = plan.site + plan.len() as u64;
    let mut code = Vec::with_capacity(plan.len() + 5);
    for (k, (ins, o)) in block.iter().zip(origin).enumerate() {
        if k + 1 == block.len() && ins.code() == Code::Jmp_rel32_64 && ins.near_branch_target() == back {
            let from = (here + code.len() as u64 + 5) as i64;
            let rel = i32::try_from((back as i64).wrapping_sub(from)).ok()?;
            code.push(0xe9);
            code.extend(rel.to_le_bytes());
            break;
        }
        let plain = ins.flow_control() == iced_x86::FlowControl::Next && !ins.is_ip_rel_memory_operand();
        let off = (*o)? as usize;
        let bytes = plan.window.get(off..off + ins.len()).filter(|_| plain)?;
        // The window's own instruction, not one written in its place.
        let own = Decoder::with_ip(64, bytes, plan.site + off as u64, DecoderOptions::NONE).decode();
        if !own.eq_all_bits(ins) {
            return None;
        }
        code.extend(bytes);
    }
    Some(code)
}

/// Appends exit `exit` (instruction `c`, `ins`) with `stub`'s bytes before it.
fn emit_exit(
    out: &mut Relocated,
    at: u64,
    plan: &SitePlan,
    c: &Step,
    ins: &Instruction,
    exit: ExitInsn,
    stub: &mut dyn FnMut(u64, ExitInsn) -> Vec<u8>,
) -> Result<(), Refusal> {
    let pc = |out: &Relocated| at + out.code.len() as u64;
    let rel32 = |from_end: u64, to: u64| {
        i32::try_from(to.wrapping_sub(from_end) as i64).map_err(|_| Refusal::OutOfReach { at: c.addr })
    };
    match exit.kind {
        ExitKind::Return => {
            let bytes = stub(pc(out), exit);
            out.code.extend(bytes);
            let off = (c.addr - plan.site) as usize;
            out.code.extend_from_slice(&plan.window[off..off + c.len as usize]);
        }
        ExitKind::Jump => {
            let bytes = stub(pc(out), exit);
            out.code.extend(bytes);
            let target = c.target.ok_or_else(|| unrelocatable(c, "a jump without a target"))?;
            let rel = rel32(pc(out) + 5, target)?;
            out.code.push(0xe9);
            out.code.extend(rel.to_le_bytes());
        }
        ExitKind::CondJump => {
            let target = c.target.ok_or_else(|| unrelocatable(c, "a jump without a target"))?;
            let cc = condition(&plan.window[(c.addr - plan.site) as usize..][..c.len as usize])
                .ok_or_else(|| unrelocatable(c, "not a conditional jump tp knows"))?;
            let jncc = pc(out);
            let bytes = stub(jncc + 6, exit);
            let next = jncc + 6 + bytes.len() as u64 + 5;
            out.code.extend([0x0f, 0x80 | (cc ^ 1)]);
            out.code.extend(rel32(jncc + 6, next)?.to_le_bytes());
            out.code.extend(bytes);
            let rel = rel32(pc(out) + 5, target)?;
            out.code.push(0xe9);
            out.code.extend(rel.to_le_bytes());
        }
        // (x86-64's planner tells a switch's jumps from tail calls itself.)
        ExitKind::MaybeJump { .. } => return Err(unrelocatable(c, "an indirect jump checked when it runs")),
        ExitKind::Ahead { .. } => return Err(unrelocatable(c, "a return ahead is recorded at the window's end")),
        ExitKind::IndirectJump => {
            let bytes = stub(pc(out), exit);
            out.code.extend(bytes);
            let here = pc(out);
            let encoded = BlockEncoder::encode(64, InstructionBlock::new(&[*ins], here), BlockEncoderOptions::NONE)
                .map_err(|e| match e.to_string() {
                    m if m.contains("too far") => Refusal::OutOfReach { at: c.addr },
                    m => unrelocatable(c, &m),
                })?;
            out.code.extend(encoded.code_buffer);
        }
    }
    Ok(())
}

/// The condition (the low nibble of its opcode) of the `jcc` whose bytes are `insn`.
fn condition(insn: &[u8]) -> Option<u8> {
    let op =
        insn.iter().position(|b| !matches!(b, 0x2e | 0x3e | 0xf2 | 0xf3 | 0x66 | 0x67 | 0x26 | 0x36 | 0x64 | 0x65))?;
    match insn[op..] {
        [b, _] if (0x70..0x80).contains(&b) => Some(b & 0xf),
        [0x0f, b, ..] if (0x80..0x90).contains(&b) => Some(b & 0xf),
        _ => None,
    }
}

/// Rewrites the displacement of each block instruction `k` of `data` (a
/// RIP-relative operand whose address `t` lies in the window) so that the
/// copy at `at + offsets[k]` addresses `t` itself, not the copy of `t`.
fn keep_data_addresses(code: &mut [u8], at: u64, offsets: &[u32], data: &[(usize, u64)]) -> Result<(), String> {
    for &(k, target) in data {
        let off = *offsets.get(k).filter(|&&o| o != u32::MAX).ok_or("a data operand was not encoded")? as usize;
        let pc = at + off as u64;
        let mut decoder = Decoder::with_ip(64, &code[off..], pc, DecoderOptions::NONE);
        let ins = decoder.decode();
        let constants = decoder.get_constant_offsets(&ins);
        if ins.is_invalid() || !ins.is_ip_rel_memory_operand() || !constants.has_displacement() {
            return Err("the encoded copy has no RIP-relative operand to keep".into());
        }
        if constants.displacement_size() != 4 {
            return Err("the encoded copy's displacement is not 32 bits".into());
        }
        let next = pc + ins.len() as u64;
        let disp = target.wrapping_sub(next) as i64;
        let eip = ins.memory_base() == Register::EIP;
        if !eip && i32::try_from(disp).is_err() {
            return Err(format!("the data address {target:#x} is out of reach of the copy"));
        }
        let at_disp = off + constants.displacement_offset();
        code[at_disp..at_disp + 4].copy_from_slice(&(disp as i32).to_le_bytes());
        let check = Decoder::with_ip(64, &code[off..], pc, DecoderOptions::NONE).decode();
        if check.ip_rel_memory_address() != target {
            return Err(format!("the copy addresses {:#x}, not {target:#x}", check.ip_rel_memory_address()));
        }
    }
    Ok(())
}

/// Pushes `ret` as a call would: `push imm32` sign-extends, so a return
/// address above 2 GiB gets its high half stored separately. `offset` is the
/// window offset a thread stopped at the push stands for, if any.
fn push_return_address(block: &mut Vec<Instruction>, origin: &mut Vec<Option<u32>>, offset: Option<u32>, ret: u64) {
    let low = ret as u32 as i32;
    block.push(Instruction::with1(Code::Pushq_imm32, low).expect("push imm32"));
    origin.push(offset);
    if (low as i64) as u64 != ret {
        let high_half = MemoryOperand::with_base_displ(Register::RSP, 4);
        block.push(Instruction::with2(Code::Mov_rm32_imm32, high_half, (ret >> 32) as u32).expect("mov [rsp+4]"));
        origin.push(None);
    }
}

/// `call reg` becomes "push the return address; jmp reg". `call [mem]`
/// first loads the target into r11 (dead at a function's entry, and clobbered
/// by any callee), so a fault reading the pointer happens before anything is
/// pushed, as it does for the call, and an operand based on rsp still reads
/// the right slot.
fn indirect_call(
    block: &mut Vec<Instruction>,
    origin: &mut Vec<Option<u32>>,
    offset: u32,
    ret: u64,
    call: &Instruction,
) -> Result<(), &'static str> {
    if call.code() != Code::Call_rm64 {
        return Err("only 64-bit near indirect calls are relocated");
    }
    match call.op0_kind() {
        OpKind::Register if call.op0_register() == Register::RSP => Err("it calls through rsp"),
        OpKind::Register => {
            push_return_address(block, origin, Some(offset), ret);
            block.push(Instruction::with1(Code::Jmp_rm64, call.op0_register()).map_err(|_| "jmp reg")?);
            origin.push(None);
            Ok(())
        }
        OpKind::Memory => {
            let mut load = *call;
            load.set_code(Code::Mov_r64_rm64);
            load.set_op1_kind(OpKind::Memory);
            load.set_op0_kind(OpKind::Register);
            load.set_op0_register(Register::R11);
            block.push(load);
            origin.push(Some(offset));
            push_return_address(block, origin, None, ret);
            block.push(Instruction::with1(Code::Jmp_rm64, Register::R11).map_err(|_| "jmp r11")?);
            origin.push(None);
            Ok(())
        }
        _ => Err("unexpected operand"),
    }
}

fn unrelocatable(c: &Step, why: &str) -> Refusal {
    Refusal::Unrelocatable { mnemonic: c.mnemonic.to_string(), at: c.addr, why: why.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::WindowInsn;
    use crate::arch::x86_64::decode::{self, disassemble};

    const SITE: u64 = 0x5555_5555_1000;

    fn plan_of(window: &[u8]) -> SitePlan {
        let insns = decode::decode(window, SITE)
            .into_iter()
            .map(|i| WindowInsn { offset: (i.addr - SITE) as u32, len: i.len, mnemonic: i.mnemonic })
            .collect();
        SitePlan {
            function: SITE,
            site: SITE,
            prefix: Vec::new(),
            window: window.to_vec(),
            insns,
            dead: 0,
            interior: false,
            exits: Vec::new(),
        }
    }

    fn relocated_asm(window: &[u8], at: u64) -> Vec<String> {
        let r = relocate(&plan_of(window), at).unwrap();
        disassemble(&r.code, at)
    }

    #[test]
    fn position_independent_instructions_are_copied_as_they_are() {
        // push rbp; mov rbp, rsp; mov [rbp-4], edi (with a redundant REX
        // prefix an encoder would drop), then the jmp back.
        let window = [0x55, 0x48, 0x89, 0xe5, 0x40, 0x89, 0x7d, 0xfc];
        for at in [SITE - (1 << 30), SITE + 0x1000, SITE + (1 << 31) - 0x1000] {
            let r = relocate(&plan_of(&window), at).unwrap();
            let rel = (SITE + window.len() as u64).wrapping_sub(at + window.len() as u64 + 5) as i32;
            assert_eq!(r.code, [&window[..], &[0xe9], &rel.to_le_bytes()].concat(), "at {at:#x}");
            assert_eq!(r.offsets, [(0, 0), (1, 1), (4, 4), (8, 8)]);
        }
        // RIP-relative or a branch: re-encoded.
        let rip = [0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00];
        let r = relocate(&plan_of(&rip), SITE + 0x10_0000).unwrap();
        assert_ne!(r.code[..7], rip);
    }

    #[test]
    fn nops_are_not_copied() {
        // A 5-byte nop: nothing to relocate, the copy only jumps back, and a
        // thread stopped on the nop goes to that jump.
        let at = SITE + 0x1000;
        let r = relocate(&plan_of(&[0x0f, 0x1f, 0x44, 0x00, 0x00]), at).unwrap();
        assert_eq!(disassemble(&r.code, at), [format!("jmp {:#x}", SITE + 5)]);
        assert_eq!(r.offsets, [(0, 0), (5, 0)]);
        // A static probe's nop, then the instructions after it.
        let r = relocate(&plan_of(&[0x90, 0x5b, 0x5d, 0x41, 0x5c]), at).unwrap();
        assert_eq!(disassemble(&r.code, at), ["pop rbx", "pop rbp", "pop r12", &format!("jmp {:#x}", SITE + 5)]);
        assert_eq!(r.offsets, [(0, 0), (1, 0), (2, 1), (3, 2), (5, 4)]);
    }

    #[test]
    fn plain_instructions_are_copied_then_jump_back() {
        // push rbp; mov rbp, rsp; push rbx
        let at = SITE + 0x1000_0000;
        assert_eq!(
            relocated_asm(&[0x55, 0x48, 0x89, 0xe5, 0x53], at),
            ["push rbp", "mov rbp, rsp", "push rbx", "jmp 0x555555551005"]
        );
        let r = relocate(&plan_of(&[0x55, 0x48, 0x89, 0xe5, 0x53]), at).unwrap();
        assert_eq!(r.offsets, [(0, 0), (1, 1), (4, 4), (5, 5)]);
    }

    #[test]
    fn rip_relative_operand_keeps_its_target() {
        // mov rcx, rdi; lea rdx, [rip + 0xaa6] -> target SITE + 10 + 0xaa6
        let at = SITE - 0x4000_0000;
        let asm = relocated_asm(&[0x48, 0x89, 0xf9, 0x48, 0x8d, 0x15, 0xa6, 0x0a, 0, 0], at);
        let target = SITE + 10 + 0xaa6;
        let disp = target as i64 - (at as i64 + 3 + 7);
        assert_eq!(asm[1], format!("lea rdx, [rip + {:#x}]", disp));
    }

    #[test]
    fn data_addresses_in_the_window_stay_original() {
        // lea rax, [rip - 7]: the function's own address, not the copy's.
        let at = SITE + 0x1000_0000;
        let r = relocate(&plan_of(&[0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff]), at).unwrap();
        let asm = disassemble(&r.code, at);
        assert_eq!(asm[0], format!("lea rax, [rip - {:#x}]", at + 7 - SITE));
        // push rbx; lea rcx, [rip - 8] (-> the push) and mov rdx, [rip - 0xf] (-> the push too).
        let window = [0x53, 0x48, 0x8d, 0x0d, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x8b, 0x15, 0xf1, 0xff, 0xff, 0xff];
        let r = relocate(&plan_of(&window), at).unwrap();
        let asm = disassemble(&r.code, at);
        assert_eq!(asm[1], format!("lea rcx, [rip - {:#x}]", at + 8 - SITE));
        assert_eq!(asm[2], format!("mov rdx, qword ptr [rip - {:#x}]", at + 15 - SITE));
        // The jump back is still a branch to the window's end.
        assert_eq!(asm[3], format!("jmp {:#x}", SITE + 15));
    }

    #[test]
    fn rip_relative_out_of_reach_is_refused() {
        // lea rdx, [rip + 0]: the detour 8 GiB away cannot reach the original target.
        let err = relocate(&plan_of(&[0x48, 0x8d, 0x15, 0, 0, 0, 0]), SITE + (8 << 30)).unwrap_err();
        assert_eq!(err, Refusal::OutOfReach { at: SITE });
    }

    #[test]
    fn short_conditional_branch_is_widened() {
        // test edi, edi; jne +0x10; nop
        let at = SITE + 0x2000_0000;
        let asm = relocated_asm(&[0x85, 0xff, 0x75, 0x10, 0x90], at);
        assert_eq!(asm[1], format!("jne {:#x}", SITE + 4 + 0x10));
        let r = relocate(&plan_of(&[0x85, 0xff, 0x75, 0x10, 0x90]), at).unwrap();
        assert_eq!(r.code[2..4], [0x0f, 0x85], "rel8 jne became rel32");
    }

    #[test]
    fn last_call_pushes_the_original_return_address() {
        // push rbp; call +0x100 (ends at 6): the callee must return to SITE + 6.
        let at = SITE + 0x1000;
        let asm = relocated_asm(&[0x55, 0xe8, 0x00, 0x01, 0x00, 0x00], at);
        assert_eq!(
            asm,
            [
                "push rbp".to_string(),
                format!("push {:#x}", 0x55551006u32 as i32 as i64 as u64),
                "mov dword ptr [rsp + 4], 0x5555".to_string(),
                format!("jmp {:#x}", SITE + 6 + 0x100),
            ]
        );
    }

    #[test]
    fn last_call_with_a_low_return_address_is_one_push() {
        let site = 0x401000;
        let mut p = plan_of(&[0x55, 0xe8, 0x00, 0x01, 0x00, 0x00]);
        p.site = site;
        p.function = site;
        let r = relocate(&p, 0x500000).unwrap();
        assert_eq!(disassemble(&r.code, 0x500000)[1..], ["push 0x401006", "jmp 0x401106"]);
    }

    #[test]
    fn last_indirect_call_becomes_an_indirect_jump() {
        // push rbx; push rbp; push r12; call rax  (1+1+2+2 = 6 bytes)
        let asm = relocated_asm(&[0x53, 0x55, 0x41, 0x54, 0xff, 0xd0], SITE + 0x1000);
        assert_eq!(asm.last().unwrap(), "jmp rax");
        // call [rsp + 8]: the pointer is read into r11 before the push moves rsp
        // (the nop before it is not copied).
        let asm = relocated_asm(&[0x90, 0xff, 0x54, 0x24, 0x08], SITE + 0x1000);
        assert_eq!(asm[0], "mov r11, qword ptr [rsp + 8]");
        assert_eq!(asm.last().unwrap(), "jmp r11");
        // call rsp jumps to the stack the push has just changed.
        let err = relocate(&plan_of(&[0x90, 0x90, 0x90, 0xff, 0xd4]), SITE + 0x1000).unwrap_err();
        assert!(matches!(err, Refusal::Unrelocatable { .. }), "{err:?}");
    }

    #[test]
    fn ret_and_jmp_end_the_relocated_code() {
        // test edi, edi; je +1; ret; nop  (ret at 4 ends it; nothing jumps back)
        let asm = relocated_asm(&[0x85, 0xff, 0x74, 0x01, 0xc3, 0x90], SITE + 0x1000);
        assert_eq!(asm.len(), 3);
        assert_eq!(asm[2], "ret");
    }

    #[test]
    fn jrcxz_and_loop_are_rewritten_when_far() {
        // jrcxz +3; nop; nop; nop   relocated 1 GiB away: no rel8 form reaches.
        let at = SITE + (1 << 30);
        let r = relocate(&plan_of(&[0xe3, 0x03, 0x90, 0x90, 0x90]), at).unwrap();
        let asm = disassemble(&r.code, at);
        assert!(asm.iter().any(|l| l.starts_with("jrcxz")), "{asm:?}");
        assert!(asm.iter().any(|l| *l == format!("jmp {:#x}", SITE + 5)), "{asm:?}");
    }

    #[test]
    fn xbegin_keeps_its_abort_target() {
        // xbegin +0x10 (rel32, 6 bytes): the abort handler stays at the original address.
        let at = SITE + 0x3000_0000;
        assert_eq!(
            relocated_asm(&[0xc7, 0xf8, 0x10, 0, 0, 0], at),
            [format!("xbegin {:#x}", SITE + 0x16), format!("jmp {:#x}", SITE + 6)]
        );
    }

    #[test]
    fn eip_relative_operand_keeps_its_32_bit_address() {
        // addr32 lea eax, [eip + 0x100]: the address wraps at 4 GiB, so it is
        // re-encoded for the same address: below 4 GiB, RIP-relative without
        // the prefix (6 bytes).
        let site: u64 = 0x1040_0000;
        let mut p = plan_of(&[0x67, 0x8d, 0x05, 0x00, 0x01, 0x00, 0x00]);
        p.site = site;
        p.function = site;
        let at = 0x7000_0000;
        let r = relocate(&p, at).unwrap();
        let asm = disassemble(&r.code, at);
        let disp = (site + 7 + 0x100) as i64 - (at + 6) as i64;
        assert_eq!(asm[0], format!("lea eax, [rip - {:#x}]", -disp));
    }
}
