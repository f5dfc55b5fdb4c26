//! The handful of fixed x86-64 encodings tp's detours are made of.
//!
//! Each `put_*` appends one instruction. The writer knows the address its
//! first byte will run at, so RIP-relative operands and branches are encoded
//! for that address, not for where the buffer lives. Every encoding is
//! checked against capstone's disassembly in the tests below.

/// An instruction buffer that will run at `base`.
#[derive(Debug, Clone)]
pub struct Writer {
    base: u64,
    buf: Vec<u8>,
}

impl Writer {
    /// An empty buffer whose first byte will run at `base`.
    pub fn new(base: u64) -> Writer {
        Writer { base, buf: Vec::new() }
    }

    /// The address of the next byte.
    pub fn pc(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The code.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn rel32(&self, end_of_insn: u64, target: u64) -> [u8; 4] {
        let rel = target.wrapping_sub(end_of_insn) as i64;
        assert!(i32::try_from(rel).is_ok(), "rel32 out of range: {end_of_insn:#x} -> {target:#x}");
        (rel as i32).to_le_bytes()
    }

    /// `mov r11, qword [rip + to(addr)]`.
    pub fn put_mov_r11_rip(&mut self, addr: u64) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.buf.extend_from_slice(&[0x4c, 0x8b, 0x1d]);
        self.buf.extend_from_slice(&d);
    }

    /// `add r11, qword [rip + to(addr)]`.
    pub fn put_add_r11_rip(&mut self, addr: u64) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.buf.extend_from_slice(&[0x4c, 0x03, 0x1d]);
        self.buf.extend_from_slice(&d);
    }

    /// `cmp byte [r11], 0`.
    pub fn put_cmp_byte_r11_0(&mut self) {
        self.buf.extend_from_slice(&[0x41, 0x80, 0x3b, 0x00]);
    }

    /// `jb target` (rel32): taken when the last subtraction borrowed.
    pub fn put_jb(&mut self, target: u64) {
        let end = self.pc() + 6;
        let d = self.rel32(end, target);
        self.buf.extend_from_slice(&[0x0f, 0x82]);
        self.buf.extend_from_slice(&d);
    }

    /// `sub qword [r11 + disp], 1` (sets CF when the value was 0).
    pub fn put_sub_r11_disp_1(&mut self, disp: i32) {
        self.buf.extend_from_slice(&[0x49, 0x83, 0xab]);
        self.buf.extend_from_slice(&disp.to_le_bytes());
        self.buf.push(1);
    }

    /// `lea r9, [r11 + disp]`.
    pub fn put_lea_r9_r11_disp(&mut self, disp: i32) {
        self.buf.extend_from_slice(&[0x4d, 0x8d, 0x8b]);
        self.buf.extend_from_slice(&disp.to_le_bytes());
    }

    /// `je target` (rel32).
    pub fn put_je(&mut self, target: u64) {
        let end = self.pc() + 6;
        let d = self.rel32(end, target);
        self.buf.extend_from_slice(&[0x0f, 0x84]);
        self.buf.extend_from_slice(&d);
    }

    /// `jmp target` (rel32).
    pub fn put_jmp(&mut self, target: u64) {
        let end = self.pc() + 5;
        let d = self.rel32(end, target);
        self.buf.push(0xe9);
        self.buf.extend_from_slice(&d);
    }

    /// `mov r11, qword fs:[0]`: the thread pointer (glibc and musl keep the
    /// TCB's own address at fs:0).
    pub fn put_mov_r11_fs0(&mut self) {
        self.buf.extend_from_slice(&[0x64, 0x4c, 0x8b, 0x1c, 0x25, 0, 0, 0, 0]);
    }

    /// `imul r11, qword [rip + to(addr)]`.
    pub fn put_imul_r11_rip(&mut self, addr: u64) {
        let end = self.pc() + 8;
        let d = self.rel32(end, addr);
        self.buf.extend_from_slice(&[0x4c, 0x0f, 0xaf, 0x1d]);
        self.buf.extend_from_slice(&d);
    }

    /// `shr r11, imm8`.
    pub fn put_shr_r11(&mut self, n: u8) {
        self.buf.extend_from_slice(&[0x49, 0xc1, 0xeb, n]);
    }

    /// `shl r11, imm8`.
    pub fn put_shl_r11(&mut self, n: u8) {
        self.buf.extend_from_slice(&[0x49, 0xc1, 0xe3, n]);
    }

    /// `lock inc qword [r11 + disp32]`.
    pub fn put_lock_inc_r11_disp(&mut self, disp: i32) {
        self.buf.extend_from_slice(&[0xf0, 0x49, 0xff, 0x83]);
        self.buf.extend_from_slice(&disp.to_le_bytes());
    }

    /// `push rax; push r11; lahf; seto al`: saves the two scratch registers
    /// and the status flags (SF ZF AF PF CF in ah, OF in al).
    pub fn put_save_scratch_and_flags(&mut self) {
        self.buf.extend_from_slice(&[0x50, 0x41, 0x53, 0x9f, 0x0f, 0x90, 0xc0]);
    }

    /// `add al, 0x7f; sahf; pop r11; pop rax`: the inverse of
    /// [`Writer::put_save_scratch_and_flags`] (`add` sets OF exactly when
    /// al was 1, `sahf` restores the other five flags).
    pub fn put_restore_scratch_and_flags(&mut self) {
        self.buf.extend_from_slice(&[0x04, 0x7f, 0x9e, 0x41, 0x5b, 0x58]);
    }

    /// `lahf; seto al; push rax`: pushes the status flags as a word (SF ZF
    /// AF PF CF in ah, OF in al), for a few cycles where `pushfq` and
    /// `popfq` cost tens. rax must be saved already.
    pub fn put_push_flags_via_rax(&mut self) {
        self.buf.extend_from_slice(&[0x9f, 0x0f, 0x90, 0xc0, 0x50]);
    }

    /// `pop rax; add al, 0x7f; sahf`: the inverse of
    /// [`Writer::put_push_flags_via_rax`]; rax is to be restored after it.
    pub fn put_pop_flags_via_rax(&mut self) {
        self.buf.extend_from_slice(&[0x58, 0x04, 0x7f, 0x9e]);
    }

    /// `push reg` for a register number 0..15 (rax=0 … r15=15).
    pub fn put_push(&mut self, reg: u8) {
        if reg >= 8 {
            self.buf.push(0x41);
        }
        self.buf.push(0x50 + (reg & 7));
    }

    /// `push qword [rsp + disp8]` (the address is taken before the push).
    pub fn put_push_rsp_disp(&mut self, disp: i8) {
        self.buf.extend_from_slice(&[0xff, 0x74, 0x24, disp as u8]);
    }

    /// `mov rdx, rsp`.
    pub fn put_mov_rdx_rsp(&mut self) {
        self.buf.extend_from_slice(&[0x48, 0x89, 0xe2]);
    }

    /// `pop reg` for a register number 0..15.
    pub fn put_pop(&mut self, reg: u8) {
        if reg >= 8 {
            self.buf.push(0x41);
        }
        self.buf.push(0x58 + (reg & 7));
    }

    /// `sub rsp, imm8`.
    pub fn put_sub_rsp(&mut self, n: i8) {
        self.buf.extend_from_slice(&[0x48, 0x83, 0xec, n as u8]);
    }

    /// `add rsp, imm8`.
    pub fn put_add_rsp(&mut self, n: i8) {
        self.buf.extend_from_slice(&[0x48, 0x83, 0xc4, n as u8]);
    }

    /// `mov reg, qword [rip + to(addr)]` for rdi (7), r8 (8) and similar.
    pub fn put_mov_reg_rip(&mut self, reg: u8, addr: u64) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.buf.push(if reg >= 8 { 0x4c } else { 0x48 });
        self.buf.extend_from_slice(&[0x8b, 0x05 | ((reg & 7) << 3)]);
        self.buf.extend_from_slice(&d);
    }

    /// `mov esi, imm32`.
    pub fn put_mov_esi_imm32(&mut self, imm: u32) {
        self.buf.push(0xbe);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `lea reg, [rsp + disp]` for rsi (6), rdx (2), rcx (1).
    pub fn put_lea_rsp(&mut self, reg: u8, disp: i32) {
        assert!(reg < 8);
        match i8::try_from(disp) {
            Ok(d) => self.buf.extend_from_slice(&[0x48, 0x8d, 0x44 | (reg << 3), 0x24, d as u8]),
            Err(_) => {
                self.buf.extend_from_slice(&[0x48, 0x8d, 0x84 | (reg << 3), 0x24]);
                self.buf.extend_from_slice(&disp.to_le_bytes());
            }
        }
    }

    /// `lea rsp, [rsp + disp]` (the flags stay as they are).
    pub fn put_lea_rsp_rsp(&mut self, disp: i32) {
        match i8::try_from(disp) {
            Ok(d) => self.buf.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, d as u8]),
            Err(_) => {
                self.buf.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24]);
                self.buf.extend_from_slice(&disp.to_le_bytes());
            }
        }
    }

    /// `mov rax, rsp; and rsp, -16; push rax; push rax; call target; pop
    /// rsp`: a call with the stack aligned, from any stack pointer (rax and
    /// the flags are clobbered).
    pub fn put_align_stack_and_call(&mut self, target: u64) {
        self.buf.extend_from_slice(&[0x48, 0x89, 0xe0, 0x48, 0x83, 0xe4, 0xf0, 0x50, 0x50]);
        self.put_call(target);
        self.buf.push(0x5c);
    }

    /// `xor r8d, r8d`.
    pub fn put_zero_r8(&mut self) {
        self.buf.extend_from_slice(&[0x45, 0x31, 0xc0]);
    }

    /// `call target` (rel32).
    pub fn put_call(&mut self, target: u64) {
        let end = self.pc() + 5;
        let d = self.rel32(end, target);
        self.buf.push(0xe8);
        self.buf.extend_from_slice(&d);
    }

    /// `mov [rsp + disp], rax`.
    pub fn put_store_rax(&mut self, disp: i8) {
        self.buf.extend_from_slice(&[0x48, 0x89, 0x44, 0x24, disp as u8]);
    }

    /// `ret`.
    pub fn put_ret(&mut self) {
        self.buf.push(0xc3);
    }

    /// Raw bytes (relocated code produced elsewhere for this same address).
    pub fn put_bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// `int3` padding up to an address aligned to `align`.
    pub fn put_align(&mut self, align: u64) {
        while !self.pc().is_multiple_of(align) {
            self.buf.push(0xcc);
        }
    }

    /// A little-endian 64-bit literal.
    pub fn put_u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::decode::disassemble;

    const AT: u64 = 0x7f00_0000_1000;

    fn asm(f: impl FnOnce(&mut Writer)) -> Vec<String> {
        let mut w = Writer::new(AT);
        f(&mut w);
        disassemble(&w.into_bytes(), AT)
    }

    #[test]
    fn each_encoding_disassembles_as_intended() {
        assert_eq!(asm(|w| w.put_mov_r11_rip(AT + 0x107)), ["mov r11, qword ptr [rip + 0x100]"]);
        assert_eq!(asm(|w| w.put_add_r11_rip(AT - 0x10 + 7)), ["add r11, qword ptr [rip - 0x10]"]);
        assert_eq!(asm(|w| w.put_cmp_byte_r11_0()), ["cmp byte ptr [r11], 0"]);
        assert_eq!(asm(|w| w.put_je(AT + 0x40)), [format!("je {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_jmp(AT - 0x1000)), [format!("jmp {:#x}", AT - 0x1000)]);
        assert_eq!(asm(|w| w.put_mov_r11_fs0()), ["mov r11, qword ptr fs:[0]"]);
        assert_eq!(asm(|w| w.put_imul_r11_rip(AT + 0x48)), ["imul r11, qword ptr [rip + 0x40]"]);
        assert_eq!(asm(|w| w.put_shr_r11(57)), ["shr r11, 0x39"]);
        assert_eq!(asm(|w| w.put_shl_r11(15)), ["shl r11, 0xf"]);
        assert_eq!(asm(|w| w.put_lock_inc_r11_disp(0x18)), ["lock inc qword ptr [r11 + 0x18]"]);
        assert_eq!(asm(|w| w.put_push(10)), ["push r10"]);
        assert_eq!(asm(|w| w.put_push(7)), ["push rdi"]);
        assert_eq!(asm(|w| w.put_pop(8)), ["pop r8"]);
        assert_eq!(asm(|w| w.put_pop(0)), ["pop rax"]);
        assert_eq!(asm(|w| w.put_sub_rsp(8)), ["sub rsp, 8"]);
        assert_eq!(asm(|w| w.put_add_rsp(8)), ["add rsp, 8"]);
        assert_eq!(asm(|w| w.put_mov_reg_rip(7, AT + 0x27)), ["mov rdi, qword ptr [rip + 0x20]"]);
        assert_eq!(asm(|w| w.put_mov_reg_rip(8, AT + 0x27)), ["mov r8, qword ptr [rip + 0x20]"]);
        assert_eq!(asm(|w| w.put_mov_esi_imm32(0x0100_0003)), ["mov esi, 0x1000003"]);
        assert_eq!(asm(|w| w.put_lea_rsp(2, 8)), ["lea rdx, [rsp + 8]"]);
        assert_eq!(asm(|w| w.put_lea_rsp(1, 72)), ["lea rcx, [rsp + 0x48]"]);
        assert_eq!(asm(|w| w.put_zero_r8()), ["xor r8d, r8d"]);
        assert_eq!(asm(|w| w.put_call(AT + 0x100)), [format!("call {:#x}", AT + 0x100)]);
        assert_eq!(asm(|w| w.put_store_rax(0x58)), ["mov qword ptr [rsp + 0x58], rax"]);
        assert_eq!(asm(|w| w.put_push_flags_via_rax()), ["lahf", "seto al", "push rax"]);
        assert_eq!(asm(|w| w.put_jb(AT + 0x40)), [format!("jb {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_sub_r11_disp_1(0x20_0018)), ["sub qword ptr [r11 + 0x200018], 1"]);
        assert_eq!(asm(|w| w.put_lea_r9_r11_disp(0x20_0018)), ["lea r9, [r11 + 0x200018]"]);
        assert_eq!(asm(|w| w.put_pop_flags_via_rax()), ["pop rax", "add al, 0x7f", "sahf"]);
        assert_eq!(asm(|w| w.put_ret()), ["ret"]);
    }

    #[test]
    fn align_pads_with_int3() {
        let mut w = Writer::new(AT + 3);
        w.put_align(8);
        assert_eq!(w.into_bytes(), [0xcc; 5]);
    }

    #[test]
    #[should_panic(expected = "rel32 out of range")]
    fn far_branches_are_a_bug() {
        Writer::new(AT).put_jmp(AT + (4 << 30));
    }
}
