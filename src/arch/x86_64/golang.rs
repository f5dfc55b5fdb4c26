//! Go's stack-bound check at the start of an amd64 function, as the Go
//! assembler writes it (cmd/internal/obj/x86/obj6.go, `stacksplit`):
//!
//! ```text
//! small frame:   cmp  rsp, [g + 16]            ; g: r14 (ABIInternal), or
//!                jbe  morestack                ;  rcx after mov rcx, fs:[-8]
//! larger frame:  lea  r12, [rsp - (frame - 128)]
//!                cmp  r12, [g + 16]
//!                jbe  morestack
//! huge frame:    mov  r12, rsp
//!                sub  r12, frame - 128
//!                jb   morestack
//!                cmp  r12, [g + 16]
//!                jbe  morestack
//! ```
//!
//! (`[g + 24]`, stackguard1, in functions the runtime marks as C functions.)
//! `morestack` lies after the function's `ret`s: it grows the stack and
//! jumps back to the function's first instruction, which checks again.
//!
//! After the check comes the frame (`sub rsp, N; mov [rsp + N-8], rbp; lea
//! rbp, [rsp + N-8]`). [`one_instruction_site`] finds, among those, the
//! first instruction long enough to be a window by itself: a goroutine that
//! Go preempts asynchronously (by a signal) may be parked at any of these
//! instruction boundaries, its PC kept on its own stack, out of reach of
//! any scan of threads, so a window there must have no interior.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

/// The bytes of the check at the start of `code` (at `addr`), if there is one.
pub fn stack_check_len(code: &[u8], addr: u64) -> Option<usize> {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut next = || {
        let i = d.decode();
        (!i.is_invalid()).then_some(i)
    };
    let mut i = next()?;
    let mut g = Register::R14;
    // ABI0 functions load g from thread-local storage first.
    if i.code() == Code::Mov_r64_rm64 && i.segment_prefix() == Register::FS && is_tls_g(&i) {
        g = i.op0_register();
        i = next()?;
    }
    let compared = match i.code() {
        Code::Lea_r64_m if i.op0_register() == Register::R12 && i.memory_base() == Register::RSP => {
            i = next()?;
            Register::R12
        }
        Code::Mov_r64_rm64 | Code::Mov_rm64_r64
            if i.op0_kind() == OpKind::Register
                && i.op0_register() == Register::R12
                && i.op1_kind() == OpKind::Register
                && i.op1_register() == Register::RSP =>
        {
            let sub = next()?;
            let below = next()?;
            let is_sub = matches!(sub.code(), Code::Sub_rm64_imm32 | Code::Sub_rm64_imm8)
                && sub.op0_kind() == OpKind::Register
                && sub.op0_register() == Register::R12;
            if !is_sub || !matches!(below.code(), Code::Jb_rel8_64 | Code::Jb_rel32_64) || below.near_branch64() <= addr
            {
                return None;
            }
            i = next()?;
            Register::R12
        }
        _ => Register::RSP,
    };
    let is_guard = i.code() == Code::Cmp_r64_rm64
        && i.op0_register() == compared
        && i.memory_base() == g
        && i.memory_index() == Register::None
        && matches!(i.memory_displacement64(), 16 | 24);
    if !is_guard {
        return None;
    }
    let jbe = next()?;
    let end = jbe.next_ip();
    let forward = jbe.near_branch64() >= end && jbe.near_branch64() < addr + code.len() as u64;
    (matches!(jbe.code(), Code::Jbe_rel8_64 | Code::Jbe_rel32_64) && forward).then_some((end - addr) as usize)
}

/// The offset of the first instruction of at least 5 bytes from `from` on,
/// passing over nothing but the instructions that set up a frame (`sub
/// rsp, N`, `add rsp, -N`, `push rbp`, `mov rbp, rsp`, `lea rbp, [rsp +
/// d]`) and store registers on the stack (`mov [rsp + d], rbp`, spills of
/// the arguments), which leave every register but rsp and rbp as it was;
/// None if something else comes first.
pub fn one_instruction_site(code: &[u8], addr: u64, from: usize) -> Option<usize> {
    let rest = code.get(from..)?;
    let mut d = Decoder::with_ip(64, rest, addr + from as u64, DecoderOptions::NONE);
    let mut at = from;
    for _ in 0..8 {
        let i = d.decode();
        if i.is_invalid() {
            return None;
        }
        if i.len() >= 5 {
            return Some(at);
        }
        let reg = |k: u32| i.op_kind(k) == OpKind::Register;
        let on_stack = i.op0_kind() == OpKind::Memory
            && i.memory_base() == Register::RSP
            && i.memory_index() == Register::None
            && i.segment_prefix() == Register::None;
        let frame = match i.code() {
            Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 => reg(0) && i.op0_register() == Register::RSP,
            // Go writes `add rsp, -128` where `sub rsp, 128` would need an imm32.
            Code::Add_rm64_imm8 | Code::Add_rm64_imm32 => {
                reg(0) && i.op0_register() == Register::RSP && i.immediate(1) as i64 <= 0
            }
            Code::Push_r64 => i.op0_register() == Register::RBP,
            Code::Mov_rm64_r64 | Code::Mov_r64_rm64 if reg(0) && reg(1) => {
                i.op0_register() == Register::RBP && i.op1_register() == Register::RSP
            }
            // Saving rbp, or spilling an argument register, to the stack.
            Code::Mov_rm64_r64 | Code::Mov_rm32_r32 | Code::Mov_rm16_r16 | Code::Mov_rm8_r8 => on_stack,
            Code::Lea_r64_m => i.op0_register() == Register::RBP && i.memory_base() == Register::RSP,
            _ => false,
        };
        if !frame {
            return None;
        }
        at += i.len();
    }
    None
}

/// How far below its entry stack pointer the stack pointer of the function
/// `code` (at `addr`) is when it reaches `site`, going straight through:
/// the stack check does not move it, the frame's setup does (`sub rsp, N`,
/// `add rsp, -N`, `push`); None if anything else writes rsp, or `site` is no
/// instruction's start.
pub fn sp_below_entry(code: &[u8], addr: u64, site: u64) -> Option<u32> {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut below: i64 = 0;
    while d.ip() < site {
        let i = d.decode();
        if i.is_invalid() {
            return None;
        }
        // The check compares rsp (`cmp rsp, [g + 16]`) and writes nothing.
        let compares = i.mnemonic() == Mnemonic::Cmp;
        let rsp = !compares && i.op0_kind() == OpKind::Register && i.op0_register() == Register::RSP;
        below += match i.code() {
            Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if rsp => i.immediate(1) as i64,
            Code::Add_rm64_imm8 | Code::Add_rm64_imm32 if rsp => -(i.immediate(1) as i64),
            Code::Push_r64 => 8,
            _ if rsp || i.code() == Code::Pop_r64 => return None,
            _ => 0,
        };
    }
    (d.ip() == site).then_some(u32::try_from(below).ok()?)
}

/// `mov reg, fs:[-8]`: Go's g in thread-local storage.
fn is_tls_g(i: &Instruction) -> bool {
    i.op0_kind() == OpKind::Register
        && i.memory_base() == Register::None
        && i.memory_index() == Register::None
        && i.memory_displacement64() as i64 == -8
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x485e60;

    #[test]
    fn small_frame_check() {
        // main.fib (Go 1.19): cmp rsp, [r14+0x10]; jbe +0x68; sub rsp, 0x18
        let code = [0x49, 0x3b, 0x66, 0x10, 0x76, 0x68, 0x48, 0x83, 0xec, 0x18];
        let mut padded = code.to_vec();
        padded.resize(0x80, 0xcc);
        assert_eq!(stack_check_len(&padded, F), Some(6));
    }

    #[test]
    fn larger_and_huge_frame_checks() {
        // lea r12, [rsp-0x88]; cmp r12, [r14+0x10]; jbe rel32
        let mut code = vec![0x4c, 0x8d, 0xa4, 0x24, 0x78, 0xff, 0xff, 0xff, 0x4d, 0x3b, 0x66, 0x10];
        code.extend([0x0f, 0x86, 0x00, 0x01, 0x00, 0x00]);
        code.resize(0x200, 0xcc);
        assert_eq!(stack_check_len(&code, F), Some(18));
        // mov r12, rsp; sub r12, 0x10000; jb +0x70; cmp r12, [r14+0x10]; jbe +0x6a
        let mut code = vec![0x49, 0x89, 0xe4, 0x49, 0x81, 0xec, 0x00, 0x00, 0x01, 0x00, 0x72, 0x70];
        code.extend([0x4d, 0x3b, 0x66, 0x10, 0x76, 0x6a]);
        code.resize(0x100, 0xcc);
        assert_eq!(stack_check_len(&code, F), Some(18));
    }

    #[test]
    fn abi0_loads_g_from_tls() {
        // mov rcx, fs:[-8]; cmp rsp, [rcx+0x10]; jbe +0x20
        let mut code = vec![0x64, 0x48, 0x8b, 0x0c, 0x25, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x3b, 0x61, 0x10, 0x76, 0x20];
        code.resize(0x40, 0xcc);
        assert_eq!(stack_check_len(&code, F), Some(15));
    }

    #[test]
    fn the_site_is_the_first_long_instruction_of_the_frame() {
        // sub rsp, 0x18; mov [rsp+0x10], rbp; lea rbp, [rsp+0x10]; mov ecx, 1
        let code =
            [0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0x6c, 0x24, 0x10, 0x48, 0x8d, 0x6c, 0x24, 0x10, 0xb9, 1, 0, 0, 0];
        assert_eq!(one_instruction_site(&code, F, 0), Some(4));
        // sub rsp, 0xe8 (7 bytes) is one already.
        assert_eq!(one_instruction_site(&[0x48, 0x81, 0xec, 0xe8, 0, 0, 0, 0x90], F, 0), Some(0));
        // push rbp; mov rbp, rsp; then a short instruction that is not frame setup: none.
        assert_eq!(one_instruction_site(&[0x55, 0x48, 0x89, 0xe5, 0x31, 0xc0, 0xb8, 1, 0, 0, 0], F, 0), None);
        // push rbp; mov rbp, rsp; mov eax, 1 (5 bytes)
        assert_eq!(one_instruction_site(&[0x55, 0x48, 0x89, 0xe5, 0xb8, 1, 0, 0, 0], F, 0), Some(4));
        // add rsp, -0x80; mov [rsp+0x78], rbp (5 bytes)
        assert_eq!(one_instruction_site(&[0x48, 0x83, 0xc4, 0x80, 0x48, 0x89, 0x6c, 0x24, 0x78], F, 0), Some(4));
        // sub rsp, 8; mov [rsp], rbp; lea rbp, [rsp]; mov [rsp+0x18], rax (5 bytes): spills pass too.
        let code =
            [0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0x2c, 0x24, 0x48, 0x8d, 0x2c, 0x24, 0x48, 0x89, 0x44, 0x24, 0x18];
        assert_eq!(one_instruction_site(&code, F, 0), Some(12));
        // ... but not add rsp, 8 (a frame given back), nor a load.
        assert_eq!(one_instruction_site(&[0x48, 0x83, 0xc4, 0x08, 0xb8, 1, 0, 0, 0], F, 0), None);
        assert_eq!(one_instruction_site(&[0x48, 0x8b, 0x04, 0x24, 0xb8, 1, 0, 0, 0], F, 0), None);
        // mov rcx, rax first: it changes a register, so nothing may pass over it.
        assert_eq!(one_instruction_site(&[0x48, 0x89, 0xc1, 0xb8, 1, 0, 0, 0], F, 0), None);
        assert_eq!(one_instruction_site(&[0x90], F, 5), None);
    }

    #[test]
    fn anything_else_is_no_check() {
        let pad = |mut v: Vec<u8>| {
            v.resize(0x40, 0xcc);
            v
        };
        // push rbp; mov rbp, rsp (C)
        assert_eq!(stack_check_len(&pad(vec![0x55, 0x48, 0x89, 0xe5]), F), None);
        // cmp rsp, [r14+0x10] with a backward jbe, or no jbe
        assert_eq!(stack_check_len(&pad(vec![0x49, 0x3b, 0x66, 0x10, 0x76, 0xf0]), F), None);
        assert_eq!(stack_check_len(&pad(vec![0x49, 0x3b, 0x66, 0x10, 0x74, 0x10]), F), None);
        // cmp rsp, [r13+0x10]: not g
        assert_eq!(stack_check_len(&pad(vec![0x49, 0x3b, 0x65, 0x10, 0x76, 0x10]), F), None);
        // a jbe past the function's end
        assert_eq!(stack_check_len(&[0x49, 0x3b, 0x66, 0x10, 0x76, 0x68], F), None);
        assert_eq!(stack_check_len(&[], F), None);
    }
}
