//! Loading a static probe's arguments at its site into an event's argument
//! words: code that an event detour runs, inside its call of the runtime,
//! before it sets up the call's own arguments.
//!
//! At that point every general register but rax, r10, r11 and rsp still
//! holds the site's value; the detour keeps the site's rax, r10 and r11 on
//! its stack, and the site's rsp is a known distance above ([`Frame`]). For each
//! operand, last to first, the value goes into rax (a memory operand's
//! address into r11 first) and is pushed, so that the six words end at the
//! stack pointer in order, as `tp_entry` reads them:
//!
//! ```text
//!   mov  rax, rdi                        ; 8@%rdi
//!   push rax
//!   mov  r11, rbp                        ; -4@-20(%rbp)
//!   lea  r11, [r11 - 20]
//!   mov  eax, dword [r11]
//!   push rax
//!   mov  rax, 5                          ; -4@$5
//!   push rax
//! ```
//!
//! A register is taken whole and a memory operand read at its size (zero
//! extended); the tracer truncates and sign-extends each value as its note
//! says. The operands are the program's own (its compiler chose them for
//! the site), so the loads read memory the program reads there.

use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

use super::reg::Reg;
use super::writer::Writer;
use crate::arch::operand::MAX_OPERANDS;
use crate::arch::{Operand, OperandLoc, Operands};

/// Where the site's own rax, r10, r11 and rsp are, as displacements from
/// the stack pointer when [`push`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The saved rax.
    pub rax: i32,
    /// The saved r11.
    pub r11: i32,
    /// The saved r10.
    pub r10: i32,
    /// The site's stack pointer.
    pub rsp: i32,
}

/// Bytes [`push`] pushes: one word per argument the event records.
pub const PUSHED: i32 = 8 * MAX_OPERANDS as i32;

/// Pushes the values of `ops` (and zeros up to [`MAX_OPERANDS`] words), the
/// first operand at the stack pointer. Returns the bytes pushed
/// ([`PUSHED`]).
pub fn push(w: &mut Writer, ops: &Operands, frame: Frame) -> i32 {
    let mut code: Vec<Instruction> = Vec::new();
    let ops = ops.as_slice();
    for k in (0..MAX_OPERANDS).rev() {
        // Bytes pushed so far: every saved value is that much further away.
        let pushed = 8 * (MAX_OPERANDS - 1 - k) as i32;
        let at = Frame {
            rax: frame.rax + pushed,
            r11: frame.r11 + pushed,
            r10: frame.r10 + pushed,
            rsp: frame.rsp + pushed,
        };
        match ops.get(k) {
            Some(op) => load(&mut code, op, at),
            None => code.push(Instruction::with1(Code::Pushq_imm8, 0).expect("push 0")),
        }
        if ops.get(k).is_some() {
            code.push(Instruction::with1(Code::Push_r64, Register::RAX).expect("push rax"));
        }
    }
    let mut encoder = Encoder::new(64);
    for ins in &code {
        // Nothing here is relative to the instruction's address.
        let len = encoder.encode(ins, w.pc()).expect("operand load encodes");
        let bytes = encoder.take_buffer();
        w.put_bytes(&bytes[..len]);
    }
    PUSHED
}

/// Code that puts the value of `op` into rax.
fn load(code: &mut Vec<Instruction>, op: &Operand, at: Frame) {
    match op.loc {
        OperandLoc::Register(r) => {
            site_register(code, Register::RAX, r, at);
            return;
        }
        OperandLoc::Constant(v) => {
            code.push(Instruction::with2(Code::Mov_r64_imm64, Register::RAX, v as u64).expect("mov rax, imm64"));
            return;
        }
        OperandLoc::Unreadable => {
            code.push(Instruction::with2(Code::Xor_r32_rm32, Register::EAX, Register::EAX).expect("xor"));
            return;
        }
        OperandLoc::Absolute(addr) => {
            code.push(Instruction::with2(Code::Mov_r64_imm64, Register::R11, addr).expect("mov r11, imm64"));
        }
        OperandLoc::Memory { base, index, disp } => {
            match base {
                Some(b) => site_register(code, Register::R11, b, at),
                None => code.push(Instruction::with2(Code::Xor_r32_rm32, Register::R11D, Register::R11D).expect("xor")),
            }
            if let Some((i, _)) = index {
                site_register(code, Register::RAX, i, at);
            }
            let scale = index.map_or(1, |(_, s)| s as u32);
            let index_reg = if index.is_some() { Register::RAX } else { Register::None };
            match i32::try_from(disp) {
                Ok(d) => {
                    let m = MemoryOperand::new(Register::R11, index_reg, scale, d as i64, 8, false, Register::None);
                    code.push(Instruction::with2(Code::Lea_r64_m, Register::R11, m).expect("lea r11"));
                }
                Err(_) => {
                    if index.is_some() {
                        let m = MemoryOperand::new(Register::R11, Register::RAX, scale, 0, 0, false, Register::None);
                        code.push(Instruction::with2(Code::Lea_r64_m, Register::R11, m).expect("lea r11"));
                    }
                    code.push(
                        Instruction::with2(Code::Mov_r64_imm64, Register::RAX, disp as u64).expect("mov rax, imm64"),
                    );
                    code.push(Instruction::with2(Code::Add_r64_rm64, Register::R11, Register::RAX).expect("add"));
                }
            }
        }
    }
    // The address is in r11: load the value at its size.
    let m = MemoryOperand::with_base(Register::R11);
    let ins = match op.size {
        1 => Instruction::with2(Code::Movzx_r32_rm8, Register::EAX, m),
        2 => Instruction::with2(Code::Movzx_r32_rm16, Register::EAX, m),
        4 => Instruction::with2(Code::Mov_r32_rm32, Register::EAX, m),
        _ => Instruction::with2(Code::Mov_r64_rm64, Register::RAX, m),
    };
    code.push(ins.expect("load"));
}

/// Code that puts the site's value of register `r` into `dst` (rax or r11).
fn site_register(code: &mut Vec<Instruction>, dst: Register, r: u8, at: Frame) {
    let saved = |disp: i32| MemoryOperand::with_base_displ(Register::RSP, disp as i64);
    // Operands number registers as the encoding does (`sdt`).
    let ins = match Reg::from_num(r & 15).expect("a register") {
        Reg::Rax => Instruction::with2(Code::Mov_r64_rm64, dst, saved(at.rax)),
        Reg::R11 => Instruction::with2(Code::Mov_r64_rm64, dst, saved(at.r11)),
        Reg::R10 => Instruction::with2(Code::Mov_r64_rm64, dst, saved(at.r10)),
        Reg::Rsp => Instruction::with2(Code::Lea_r64_m, dst, saved(at.rsp)),
        r => Instruction::with2(Code::Mov_r64_rm64, dst, r.iced()),
    };
    code.push(ins.expect("register"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::decode::disassemble;

    const AT: u64 = 0x7f00_0000_1000;
    const FRAME: Frame = Frame { rax: 80, r11: 72, r10: 64, rsp: 88 };

    fn asm(ops: &[Operand]) -> Vec<String> {
        let mut w = Writer::new(AT);
        assert_eq!(push(&mut w, &Operands::new(ops), FRAME), 48);
        disassemble(&w.finish(), AT)
    }

    fn reg(r: u8) -> Operand {
        Operand { size: 8, signed: false, loc: OperandLoc::Register(r) }
    }

    #[test]
    fn registers_constants_and_zeros() {
        let code = asm(&[reg(7), Operand { size: 4, signed: true, loc: OperandLoc::Constant(-5) }]);
        // Four unused words first, then the second operand, then the first.
        assert_eq!(code[..4], ["push 0", "push 0", "push 0", "push 0"]);
        assert_eq!(code[4..], ["movabs rax, 0xfffffffffffffffb", "push rax", "mov rax, rdi", "push rax"]);
    }

    #[test]
    fn the_site_rax_r11_and_rsp_come_from_the_frame() {
        let code = asm(&[reg(0), reg(11), reg(4)]);
        // Three zeros pushed (24 bytes) before the third operand, 32 before the second, 40 before the first.
        assert_eq!(code[3], format!("lea rax, [rsp + {:#x}]", 88 + 24));
        assert_eq!(code[5], format!("mov rax, qword ptr [rsp + {:#x}]", 72 + 32));
        assert_eq!(code[7], format!("mov rax, qword ptr [rsp + {:#x}]", 80 + 40));
    }

    #[test]
    fn the_site_r10_comes_from_the_frame() {
        // Five zeros pushed (40 bytes) before the first operand.
        let code = asm(&[reg(10)]);
        assert_eq!(code[5], format!("mov rax, qword ptr [rsp + {:#x}]", 64 + 40));
    }

    #[test]
    fn memory_at_its_size() {
        let mem =
            |size, base, index, disp| Operand { size, signed: false, loc: OperandLoc::Memory { base, index, disp } };
        let code = asm(&[mem(4, Some(5), None, -20), mem(8, Some(4), Some((2, 8)), 16), mem(1, None, None, 0x601040)]);
        let tail: Vec<&str> = code[3..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "xor r11d, r11d",
                "lea r11, [r11 + 0x601040]",
                "movzx eax, byte ptr [r11]",
                "push rax",
                "lea r11, [rsp + 0x78]",
                "mov rax, rdx",
                "lea r11, [r11 + rax*8 + 0x10]",
                "mov rax, qword ptr [r11]",
                "push rax",
                "mov r11, rbp",
                "lea r11, [r11 - 0x14]",
                "mov eax, dword ptr [r11]",
                "push rax",
            ]
        );
        let abs = asm(&[Operand { size: 2, signed: false, loc: OperandLoc::Absolute(0x5555_0000_1234) }]);
        assert_eq!(abs[5..], ["movabs r11, 0x555500001234", "movzx eax, word ptr [r11]", "push rax"]);
    }
}
