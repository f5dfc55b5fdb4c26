//! The handful of fixed x86-64 encodings tp's detours are made of.
//!
//! Each `put_*` appends one instruction. The writer knows the address its
//! first byte will run at, so RIP-relative operands and branches are encoded
//! for that address, not for where the buffer lives. A branch or operand
//! may point at a [`Label`] not bound yet: every such use has a 32-bit
//! field, which [`Writer::finish`] fills once the code is whole, so code is
//! assembled in one pass. Every encoding is checked against capstone's
//! disassembly in the tests below.

use super::reg::Reg;
use crate::arch::emit::Labels;
pub use crate::arch::emit::{Label, Target};

/// An instruction buffer that will run at `base`.
#[derive(Debug, Clone)]
pub struct Writer {
    base: u64,
    buf: Vec<u8>,
    /// Where each label is bound, if it is yet.
    labels: Labels,
    /// The rel32 fields (their offsets in `buf`) that point at labels
    /// not bound when they were written.
    uses: Vec<(usize, Label)>,
}

/// The rel32 from the end of an instruction at `end_of_insn` to `target`.
fn rel32(end_of_insn: u64, target: u64) -> [u8; 4] {
    let rel = target.wrapping_sub(end_of_insn) as i64;
    assert!(i32::try_from(rel).is_ok(), "rel32 out of range: {end_of_insn:#x} -> {target:#x}");
    (rel as i32).to_le_bytes()
}

impl Writer {
    /// An empty buffer whose first byte will run at `base`.
    pub fn new(base: u64) -> Writer {
        Writer { base, buf: Vec::new(), labels: Labels::default(), uses: Vec::new() }
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

    /// A new label, bound nowhere yet.
    pub fn label(&mut self) -> Label {
        self.labels.add()
    }

    /// Binds `label` to the address of the next byte.
    pub fn bind(&mut self, label: Label) {
        let at = self.pc();
        self.labels.bind(label, at);
    }

    /// Where `label` is bound, if it is yet.
    pub fn address(&self, label: Label) -> Option<u64> {
        self.labels.get(label)
    }

    /// The code, with every use of a label filled in (each label used
    /// must be bound by now).
    pub fn finish(mut self) -> Vec<u8> {
        for (at, label) in std::mem::take(&mut self.uses) {
            let to = self.labels.bound(label);
            let d = rel32(self.base + at as u64 + 4, to);
            self.buf[at..at + 4].copy_from_slice(&d);
        }
        self.buf
    }

    /// The rel32 field of an instruction ending at `end_of_insn`, its last
    /// four bytes: for a label not bound yet, zeros that [`Writer::finish`]
    /// fills in.
    fn rel32(&mut self, end_of_insn: u64, target: impl Into<Target>) -> [u8; 4] {
        let to = match target.into() {
            Target::Addr(a) => a,
            Target::Label(l) => match self.labels.get(l) {
                Some(a) => a,
                None => {
                    self.uses.push(((end_of_insn - 4 - self.base) as usize, l));
                    return [0; 4];
                }
            },
        };
        rel32(end_of_insn, to)
    }

    /// A REX prefix with W set if `w`, R from `reg` (the ModRM reg field)
    /// and B from `base` (the ModRM rm field), if one is needed.
    fn rex(&mut self, w: bool, reg: u8, base: u8) {
        let rex = 0x40 | (u8::from(w) << 3) | ((reg >> 3) << 2) | (base >> 3);
        if rex != 0x40 {
            self.buf.push(rex);
        }
    }

    /// A register that can be a ModRM base without a SIB byte or a
    /// displacement: not rsp, rbp, r12, r13.
    fn plain_base(reg: Reg) -> Reg {
        assert!(!matches!(reg.low(), 4 | 5), "register {reg:?} needs another addressing form");
        reg
    }

    /// `cmp byte [reg], 0`.
    pub fn put_cmp_byte_mem_0(&mut self, reg: Reg) {
        let reg = Self::plain_base(reg);
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0x80, 0x38 | reg.low(), 0x00]);
    }

    /// `jb target` (rel32): taken when the last subtraction borrowed.
    pub fn put_jb(&mut self, target: impl Into<Target>) {
        self.put_jcc(0x82, target);
    }

    /// `je target` (rel32).
    pub fn put_je(&mut self, target: impl Into<Target>) {
        self.put_jcc(0x84, target);
    }

    /// `jne target` (rel32).
    pub fn put_jne(&mut self, target: impl Into<Target>) {
        self.put_jcc(0x85, target);
    }

    fn put_jcc(&mut self, op: u8, target: impl Into<Target>) {
        let end = self.pc() + 6;
        let d = self.rel32(end, target);
        self.buf.extend_from_slice(&[0x0f, op]);
        self.buf.extend_from_slice(&d);
    }
    /// `sub qword [base + disp32], imm8` (sign-extended), `lock`ed if
    /// `lock` (sets CF when it borrows).
    pub fn put_sub_mem_imm8(&mut self, base: Reg, disp: i32, imm: i8, lock: bool) {
        if lock {
            self.buf.push(0xf0);
        }
        self.put_mem_op(true, &[0x83], 5, base, disp);
        self.buf.push(imm as u8);
    }

    /// `jmp target` (rel32).
    pub fn put_jmp(&mut self, target: impl Into<Target>) {
        let end = self.pc() + 5;
        let d = self.rel32(end, target);
        self.buf.push(0xe9);
        self.buf.extend_from_slice(&d);
    }

    /// `mov reg, qword fs:[0]`: the word at the thread pointer (glibc and
    /// musl keep the TCB's own address there).
    pub fn put_mov_reg_fs0(&mut self, reg: Reg) {
        self.put_fs0_op(0x8b, reg);
    }

    /// `xor reg, qword fs:[0]`.
    pub fn put_xor_reg_fs0(&mut self, reg: Reg) {
        self.put_fs0_op(0x33, reg);
    }

    /// `add reg, qword fs:[0]`.
    pub fn put_add_reg_fs0(&mut self, reg: Reg) {
        self.put_fs0_op(0x03, reg);
    }

    /// `cmp reg, qword fs:[0]`.
    pub fn put_cmp_reg_fs0(&mut self, reg: Reg) {
        self.put_fs0_op(0x3b, reg);
    }

    /// `not reg`.
    pub fn put_not(&mut self, reg: Reg) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0xf7, 0xd0 | reg.low()]);
    }

    fn put_fs0_op(&mut self, op: u8, reg: Reg) {
        self.buf.push(0x64);
        self.rex(true, reg.num(), 0);
        self.buf.extend_from_slice(&[op, 0x04 | (reg.low() << 3), 0x25, 0, 0, 0, 0]);
    }

    /// `imul reg32, reg32, imm32` (the upper half of the register is cleared).
    pub fn put_imul32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, reg.num(), reg.num());
        self.buf.extend_from_slice(&[0x69, 0xc0 | (reg.low() << 3) | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `imul dst32, src32, imm32` (the upper half of dst is cleared).
    pub fn put_imul32_imm_from(&mut self, dst: Reg, src: Reg, imm: u32) {
        self.rex(false, dst.num(), src.num());
        self.buf.extend_from_slice(&[0x69, 0xc0 | (dst.low() << 3) | src.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `xor reg, imm8` (sign-extended).
    pub fn put_xor_imm8(&mut self, reg: Reg, imm: i8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0x83, 0xf0 | reg.low(), imm as u8]);
    }

    /// `cmp reg, qword [base]`.
    pub fn put_cmp_reg_deref(&mut self, reg: Reg, base: Reg) {
        let base = Self::plain_base(base);
        self.rex(true, reg.num(), base.num());
        self.buf.extend_from_slice(&[0x3b, (reg.low() << 3) | base.low()]);
    }

    /// `shr reg32, imm8`.
    pub fn put_shr32(&mut self, reg: Reg, n: u8) {
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0xc1, 0xe8 | reg.low(), n]);
    }

    /// `shr reg, imm8`.
    pub fn put_shr64(&mut self, reg: Reg, n: u8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0xc1, 0xe8 | reg.low(), n]);
    }

    /// `and reg32, imm32`.
    pub fn put_and32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0x81, 0xe0 | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `add reg, qword [rip + to(addr)]`.
    pub fn put_add_reg_rip(&mut self, reg: Reg, addr: impl Into<Target>) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.rex(true, reg.num(), 0);
        self.buf.extend_from_slice(&[0x03, 0x05 | (reg.low() << 3)]);
        self.buf.extend_from_slice(&d);
    }

    /// `test qword [rip + to(addr)], reg`.
    pub fn put_test_rip_reg(&mut self, addr: impl Into<Target>, reg: Reg) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.rex(true, reg.num(), 0);
        self.buf.extend_from_slice(&[0x85, 0x05 | (reg.low() << 3)]);
        self.buf.extend_from_slice(&d);
    }

    /// `mov reg, qword [reg]`.
    pub fn put_load_self(&mut self, reg: Reg) {
        let reg = Self::plain_base(reg);
        self.rex(true, reg.num(), reg.num());
        self.buf.extend_from_slice(&[0x8b, (reg.low() << 3) | reg.low()]);
    }

    /// `inc reg`.
    pub fn put_inc(&mut self, reg: Reg) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0xff, 0xc0 | reg.low()]);
    }

    /// `inc qword [reg + disp32]`, with a `lock` prefix if `lock`.
    pub fn put_inc_mem(&mut self, reg: Reg, disp: i32, lock: bool) {
        let reg = Self::plain_base(reg);
        if lock {
            self.buf.push(0xf0);
        }
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0xff, 0x80 | reg.low()]);
        self.buf.extend_from_slice(&disp.to_le_bytes());
    }

    /// `inc qword [base + index * 8]`.
    pub fn put_inc_mem_indexed8(&mut self, base: Reg, index: Reg) {
        let base = Self::plain_base(base);
        assert!(index != Reg::Rsp, "rsp cannot be an index");
        self.buf.push(0x48 | (index.ext() << 1) | base.ext());
        self.buf.extend_from_slice(&[0xff, 0x04, 0xc0 | (index.low() << 3) | base.low()]);
    }

    /// `lea reg32, [base + disp32]` (32 bits, the upper half cleared).
    pub fn put_lea32(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(false, &[0x8d], reg.num(), base, disp);
    }

    /// `cmp reg32, imm32`.
    pub fn put_cmp32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0x81, 0xf8 | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `push imm32` (sign-extended to 64 bits).
    pub fn put_push_imm32(&mut self, imm: i32) {
        self.buf.push(0x68);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }
    /// `and reg, imm8` (sign-extended).
    pub fn put_and_imm8(&mut self, reg: Reg, imm: i8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0x83, 0xe0 | reg.low(), imm as u8]);
    }

    /// `add reg, imm8` (sign-extended).
    pub fn put_add_imm8(&mut self, reg: Reg, imm: i8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0x83, 0xc0 | reg.low(), imm as u8]);
    }

    /// `sub reg, imm8` (sign-extended).
    pub fn put_sub_imm8(&mut self, reg: Reg, imm: i8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0x83, 0xe8 | reg.low(), imm as u8]);
    }
    /// An instruction with a ModRM memory operand `[base + disp]` in its
    /// short form: an 8-bit displacement when `disp` fits one, else 32
    /// bits (a SIB byte when base is rsp or r12); otherwise as
    /// [`Writer::put_mem_op`].
    fn put_mem_op_short(&mut self, w: bool, opcode: &[u8], reg: u8, base: Reg, disp: i32) {
        self.rex(w, reg, base.num());
        self.buf.extend_from_slice(opcode);
        let short = i8::try_from(disp).ok();
        let mode = if short.is_some() { 0x40 } else { 0x80 };
        self.buf.push(mode | ((reg & 7) << 3) | base.low());
        if base.low() == 4 {
            self.buf.push(0x24);
        }
        match short {
            Some(d) => self.buf.push(d as u8),
            None => self.buf.extend_from_slice(&disp.to_le_bytes()),
        }
    }

    /// `mov reg32, dword [base + disp]`, short form (clears the upper half).
    pub fn put_load32_short(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op_short(false, &[0x8b], reg.num(), base, disp);
    }

    /// `mov qword [base + disp], reg`, short form.
    pub fn put_store_short(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op_short(true, &[0x89], reg.num(), base, disp);
    }

    /// `lea reg, [base + disp]`, short form (the flags stay as they are).
    pub fn put_lea_short(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op_short(true, &[0x8d], reg.num(), base, disp);
    }

    /// `push qword [base + disp]`, short form (the address is taken
    /// before the push).
    pub fn put_push_mem_short(&mut self, base: Reg, disp: i32) {
        self.put_mem_op_short(false, &[0xff], 6, base, disp);
    }

    /// An instruction with a ModRM memory operand `[base + disp32]` (a SIB
    /// byte when base is rsp or r12; always a 32-bit displacement, so the
    /// length never depends on the offset): the REX prefix (W if `w`, R from
    /// `reg`, B from `base`), `opcode`, ModRM with `reg` (a register, or an
    /// opcode extension), and the displacement.
    fn put_mem_op(&mut self, w: bool, opcode: &[u8], reg: u8, base: Reg, disp: i32) {
        self.rex(w, reg, base.num());
        self.buf.extend_from_slice(opcode);
        self.buf.push(0x80 | ((reg & 7) << 3) | base.low());
        if base.low() == 4 {
            self.buf.push(0x24);
        }
        self.buf.extend_from_slice(&disp.to_le_bytes());
    }

    /// `mov reg, qword [base + disp]`.
    pub fn put_load(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x8b], reg.num(), base, disp);
    }

    /// `mov reg32, dword [base + disp]` (clears the upper half).
    pub fn put_load32(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(false, &[0x8b], reg.num(), base, disp);
    }

    /// `mov qword [base + disp], reg`.
    pub fn put_store(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x89], reg.num(), base, disp);
    }

    /// `mov dword [base + disp], reg32`.
    pub fn put_store32(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(false, &[0x89], reg.num(), base, disp);
    }

    /// `mov qword [base + disp], imm32` (sign-extended).
    pub fn put_store_imm(&mut self, base: Reg, disp: i32, imm: i32) {
        self.put_mem_op(true, &[0xc7], 0, base, disp);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `mov dword [base + disp], imm32`.
    pub fn put_store32_imm(&mut self, base: Reg, disp: i32, imm: u32) {
        self.put_mem_op(false, &[0xc7], 0, base, disp);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `cmp dword [base + disp], imm32`.
    pub fn put_cmp32_mem_imm(&mut self, base: Reg, disp: i32, imm: u32) {
        self.put_mem_op(false, &[0x81], 7, base, disp);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `test dword [base + disp], imm32`.
    pub fn put_test32_mem_imm(&mut self, base: Reg, disp: i32, imm: u32) {
        self.put_mem_op(false, &[0xf7], 0, base, disp);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `movsxd reg, dword [base + disp]`.
    pub fn put_movsxd(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x63], reg.num(), base, disp);
    }

    /// `cmp reg, qword [base + disp]`.
    pub fn put_cmp_reg_mem(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x3b], reg.num(), base, disp);
    }

    /// `cmp reg32, dword [base + disp]`.
    pub fn put_cmp32_reg_mem(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(false, &[0x3b], reg.num(), base, disp);
    }

    /// `add dst, src`.
    pub fn put_add_reg(&mut self, dst: Reg, src: Reg) {
        self.rex(true, src.num(), dst.num());
        self.buf.extend_from_slice(&[0x01, 0xc0 | (src.low() << 3) | dst.low()]);
    }

    /// `test reg32, imm32`.
    pub fn put_test32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0xf7, 0xc0 | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `sub dst, src`.
    pub fn put_sub_reg(&mut self, dst: Reg, src: Reg) {
        self.rex(true, src.num(), dst.num());
        self.buf.extend_from_slice(&[0x29, 0xc0 | (src.low() << 3) | dst.low()]);
    }

    /// `sub reg, qword [base + disp]`.
    pub fn put_sub_reg_mem(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x2b], reg.num(), base, disp);
    }

    /// `lea reg, [base + disp]`.
    pub fn put_lea(&mut self, reg: Reg, base: Reg, disp: i32) {
        self.put_mem_op(true, &[0x8d], reg.num(), base, disp);
    }

    /// `lea reg, [base + index + disp32]`.
    pub fn put_lea_indexed(&mut self, reg: Reg, base: Reg, index: Reg, disp: i32) {
        assert!(index != Reg::Rsp, "rsp cannot be an index");
        let rex = 0x48 | (reg.ext() << 2) | (index.ext() << 1) | base.ext();
        self.buf.extend_from_slice(&[rex, 0x8d, 0x84 | (reg.low() << 3), (index.low() << 3) | base.low()]);
        self.buf.extend_from_slice(&disp.to_le_bytes());
    }

    /// `lea reg, [rip + to(addr)]`.
    pub fn put_lea_rip(&mut self, reg: Reg, addr: impl Into<Target>) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.rex(true, reg.num(), 0);
        self.buf.extend_from_slice(&[0x8d, 0x05 | (reg.low() << 3)]);
        self.buf.extend_from_slice(&d);
    }

    /// `mov dst, src`.
    pub fn put_mov_reg(&mut self, dst: Reg, src: Reg) {
        self.rex(true, src.num(), dst.num());
        self.buf.extend_from_slice(&[0x89, 0xc0 | (src.low() << 3) | dst.low()]);
    }

    /// `mov dst32, src32` (clears the upper half).
    pub fn put_mov_reg32(&mut self, dst: Reg, src: Reg) {
        self.rex(false, src.num(), dst.num());
        self.buf.extend_from_slice(&[0x89, 0xc0 | (src.low() << 3) | dst.low()]);
    }

    /// `or dst, src`.
    pub fn put_or_reg(&mut self, dst: Reg, src: Reg) {
        self.rex(true, src.num(), dst.num());
        self.buf.extend_from_slice(&[0x09, 0xc0 | (src.low() << 3) | dst.low()]);
    }

    /// `test reg, reg`.
    pub fn put_test_reg(&mut self, reg: Reg) {
        self.rex(true, reg.num(), reg.num());
        self.buf.extend_from_slice(&[0x85, 0xc0 | (reg.low() << 3) | reg.low()]);
    }

    /// `cmp reg, imm32` (sign-extended).
    pub fn put_cmp_reg_imm(&mut self, reg: Reg, imm: i32) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0x81, 0xf8 | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `or reg32, imm32`.
    pub fn put_or32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, 0, reg.num());
        self.buf.extend_from_slice(&[0x81, 0xc8 | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `xor reg32, reg32`: zero.
    pub fn put_zero32(&mut self, reg: Reg) {
        self.rex(false, reg.num(), reg.num());
        self.buf.extend_from_slice(&[0x31, 0xc0 | (reg.low() << 3) | reg.low()]);
    }

    /// `shl reg, imm8`.
    pub fn put_shl64(&mut self, reg: Reg, n: u8) {
        self.rex(true, 0, reg.num());
        self.buf.extend_from_slice(&[0xc1, 0xe0 | reg.low(), n]);
    }

    /// `imul reg, reg, imm32` (64 bits).
    pub fn put_imul64_imm(&mut self, reg: Reg, imm: i32) {
        self.rex(true, reg.num(), reg.num());
        self.buf.extend_from_slice(&[0x69, 0xc0 | (reg.low() << 3) | reg.low()]);
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `ja target` (rel32): taken when the last comparison found it above.
    pub fn put_ja(&mut self, target: impl Into<Target>) {
        self.put_jcc(0x87, target);
    }

    /// `jae target` (rel32): taken when the last comparison found it above
    /// or equal (unsigned).
    pub fn put_jae(&mut self, target: impl Into<Target>) {
        self.put_jcc(0x83, target);
    }

    /// `rdtsc`: the time-stamp counter in edx:eax.
    pub fn put_rdtsc(&mut self) {
        self.buf.extend_from_slice(&[0x0f, 0x31]);
    }

    /// `lahf; seto al`: the status flags in rax (SF ZF AF PF CF in ah, OF
    /// in al), whose old value must be saved or dead.
    pub fn put_flags_to_rax(&mut self) {
        self.buf.extend_from_slice(&[0x9f, 0x0f, 0x90, 0xc0]);
    }

    /// `add al, 0x7f; sahf`: the inverse of [`Writer::put_flags_to_rax`]
    /// (`add` sets OF exactly when al was 1, `sahf` restores the other
    /// five flags).
    pub fn put_flags_from_rax(&mut self) {
        self.buf.extend_from_slice(&[0x04, 0x7f, 0x9e]);
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

    /// `push reg`.
    pub fn put_push(&mut self, reg: Reg) {
        if reg.ext() != 0 {
            self.buf.push(0x41);
        }
        self.buf.push(0x50 + reg.low());
    }

    /// `pop reg`.
    pub fn put_pop(&mut self, reg: Reg) {
        if reg.ext() != 0 {
            self.buf.push(0x41);
        }
        self.buf.push(0x58 + reg.low());
    }

    /// `mov reg, qword [rip + to(addr)]`.
    pub fn put_mov_reg_rip(&mut self, reg: Reg, addr: impl Into<Target>) {
        let end = self.pc() + 7;
        let d = self.rel32(end, addr);
        self.buf.push(if reg.ext() != 0 { 0x4c } else { 0x48 });
        self.buf.extend_from_slice(&[0x8b, 0x05 | (reg.low() << 3)]);
        self.buf.extend_from_slice(&d);
    }
    /// `mov reg32, imm32` (clears the upper half).
    pub fn put_mov32_imm(&mut self, reg: Reg, imm: u32) {
        self.rex(false, 0, reg.num());
        self.buf.push(0xb8 + reg.low());
        self.buf.extend_from_slice(&imm.to_le_bytes());
    }

    /// `mov rax, rsp; and rsp, -16; push rax; push rax; call target; pop
    /// rsp`: a call with the stack aligned, from any stack pointer (rax and
    /// the flags are clobbered).
    pub fn put_align_stack_and_call(&mut self, target: impl Into<Target>) {
        self.put_mov_reg(Reg::Rax, Reg::Rsp);
        self.put_and_imm8(Reg::Rsp, -16);
        self.put_push(Reg::Rax);
        self.put_push(Reg::Rax);
        self.put_call(target);
        self.put_pop(Reg::Rsp);
    }

    /// Zeroes the `bytes` below the stack pointer (a multiple of 16), two
    /// words a turn: `lea rdi, [rsp - bytes]; mov ecx, bytes / 16; xor
    /// eax, eax; 1: mov [rdi], rax; mov [rdi + 8], rax; add rdi, 16; dec
    /// ecx; jnz 1b`. rdi, rcx, rax and the flags are clobbered. Plain
    /// stores, not `rep stosq`: on a timed exit that keeps its histogram in
    /// the target, 336 bytes cost 9-10 ns a call here this way and 25 ns
    /// with `rep stosq`, whose microcode start-up dominates.
    pub fn put_clear_below_rsp(&mut self, bytes: u32) {
        assert!(bytes.is_multiple_of(16) && bytes > 0);
        self.put_lea_short(Reg::Rdi, Reg::Rsp, -(bytes as i32));
        self.put_mov32_imm(Reg::Rcx, bytes / 16);
        self.put_zero32(Reg::Rax);
        // 1: mov [rdi], rax; mov [rdi + 8], rax; add rdi, 16; dec ecx; jnz 1b
        self.buf.extend_from_slice(&[0x48, 0x89, 0x07, 0x48, 0x89, 0x47, 0x08, 0x48, 0x83, 0xc7, 0x10, 0xff, 0xc9]);
        self.buf.extend_from_slice(&[0x75, 0xf1]);
    }

    /// Zeroes the `bytes` below the stack pointer (a multiple of 8) as
    /// [`Writer::put_clear_below_rsp`] does, one store a word and no loop:
    /// `xor eax, eax; mov [rsp - 8], rax; ...; mov [rsp - bytes], rax`.
    /// rax and the flags are clobbered. Longer code (about 8 bytes a
    /// word), for the runtime block's shared paths, where it is written
    /// once.
    pub fn put_clear_below_rsp_unrolled(&mut self, bytes: u32) {
        assert!(bytes.is_multiple_of(8) && bytes > 0);
        self.put_zero32(Reg::Rax);
        for k in 1..=bytes / 8 {
            self.put_store_short(Reg::Rax, Reg::Rsp, -(8 * k as i32));
        }
    }

    /// `call target` (rel32).
    pub fn put_call(&mut self, target: impl Into<Target>) {
        let end = self.pc() + 5;
        let d = self.rel32(end, target);
        self.buf.push(0xe8);
        self.buf.extend_from_slice(&d);
    }

    /// `jmp qword [base + disp]` (no REX.W: a near indirect jump is 64-bit).
    pub fn put_jmp_mem(&mut self, base: Reg, disp: i32) {
        self.put_mem_op(false, &[0xff], 4, base, disp);
    }

    /// `ret`.
    pub fn put_ret(&mut self) {
        self.buf.push(0xc3);
    }

    /// `ret imm16`: returns, then drops `bytes` more of the stack (the
    /// words its caller pushed for it).
    pub fn put_ret_pop(&mut self, bytes: u16) {
        self.buf.push(0xc2);
        self.buf.extend_from_slice(&bytes.to_le_bytes());
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
        disassemble(&w.finish(), AT)
    }

    #[test]
    fn each_encoding_disassembles_as_intended() {
        assert_eq!(asm(|w| w.put_je(AT + 0x40)), [format!("je {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_jne(AT + 0x40)), [format!("jne {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_jmp(AT - 0x1000)), [format!("jmp {:#x}", AT - 0x1000)]);
        assert_eq!(asm(|w| w.put_push_imm32(7)), ["push 7"]);
        assert_eq!(asm(|w| w.put_ret_pop(8)), ["ret 8"]);
        let clear = asm(|w| w.put_clear_below_rsp_unrolled(0x90));
        assert_eq!(clear.len(), 1 + 0x90 / 8);
        assert_eq!(clear[..2], ["xor eax, eax", "mov qword ptr [rsp - 8], rax"]);
        assert_eq!(clear[16], "mov qword ptr [rsp - 0x80], rax");
        assert_eq!(clear[18], "mov qword ptr [rsp - 0x90], rax");
        assert_eq!(asm(|w| w.put_flags_to_rax()), ["lahf", "seto al"]);
        assert_eq!(asm(|w| w.put_mov_reg(Reg::Rbx, Reg::Rsp)), ["mov rbx, rsp"]);
        assert_eq!(asm(|w| w.put_mov_reg(Reg::Rsp, Reg::Rbx)), ["mov rsp, rbx"]);
        assert_eq!(asm(|w| w.put_and_imm8(Reg::Rsp, -16)), ["and rsp, 0xfffffffffffffff0"]);
        assert_eq!(asm(|w| w.put_load32_short(Reg::Rsi, Reg::Rbx, 0x60)), ["mov esi, dword ptr [rbx + 0x60]"]);
        assert_eq!(asm(|w| w.put_store_short(Reg::Rax, Reg::Rbx, 0x60)), ["mov qword ptr [rbx + 0x60], rax"]);
        assert_eq!(asm(|w| w.put_flags_from_rax()), ["add al, 0x7f", "sahf"]);
        assert_eq!(asm(|w| w.put_push(Reg::R10)), ["push r10"]);
        assert_eq!(asm(|w| w.put_push(Reg::Rdi)), ["push rdi"]);
        assert_eq!(asm(|w| w.put_pop(Reg::R8)), ["pop r8"]);
        assert_eq!(asm(|w| w.put_pop(Reg::Rax)), ["pop rax"]);
        assert_eq!(asm(|w| w.put_sub_imm8(Reg::Rsp, 8)), ["sub rsp, 8"]);
        assert_eq!(asm(|w| w.put_add_imm8(Reg::Rsp, 8)), ["add rsp, 8"]);
        assert_eq!(asm(|w| w.put_mov_reg_rip(Reg::Rdi, AT + 0x27)), ["mov rdi, qword ptr [rip + 0x20]"]);
        assert_eq!(asm(|w| w.put_mov_reg_rip(Reg::R8, AT + 0x27)), ["mov r8, qword ptr [rip + 0x20]"]);
        assert_eq!(asm(|w| w.put_mov32_imm(Reg::Rsi, 0x0100_0003)), ["mov esi, 0x1000003"]);
        assert_eq!(asm(|w| w.put_lea_short(Reg::Rdx, Reg::Rsp, 8)), ["lea rdx, [rsp + 8]"]);
        assert_eq!(asm(|w| w.put_lea_short(Reg::Rcx, Reg::Rsp, 72)), ["lea rcx, [rsp + 0x48]"]);
        assert_eq!(asm(|w| w.put_zero32(Reg::R8)), ["xor r8d, r8d"]);
        assert_eq!(asm(|w| w.put_push_mem_short(Reg::Rsp, 0x30)), ["push qword ptr [rsp + 0x30]"]);
        assert_eq!(asm(|w| w.put_lea_short(Reg::Rsp, Reg::Rsp, -128)), ["lea rsp, [rsp - 0x80]"]);
        assert_eq!(asm(|w| w.put_lea_short(Reg::R10, Reg::R12, 0x200)), ["lea r10, [r12 + 0x200]"]);
        assert_eq!(asm(|w| w.put_load32_short(Reg::R9, Reg::Rbp, -8)), ["mov r9d, dword ptr [rbp - 8]"]);
        assert_eq!(
            asm(|w| w.put_clear_below_rsp(336)),
            [
                "lea rdi, [rsp - 0x150]".to_string(),
                "mov ecx, 0x15".into(),
                "xor eax, eax".into(),
                "mov qword ptr [rdi], rax".into(),
                "mov qword ptr [rdi + 8], rax".into(),
                "add rdi, 0x10".into(),
                "dec ecx".into(),
                format!("jne {:#x}", AT + 15),
            ]
        );
        assert_eq!(asm(|w| w.put_store_imm(Reg::Rsp, -16, 0)), ["mov qword ptr [rsp - 0x10], 0"]);
        assert_eq!(asm(|w| w.put_call(AT + 0x100)), [format!("call {:#x}", AT + 0x100)]);
        assert_eq!(asm(|w| w.put_store_short(Reg::Rax, Reg::Rsp, 0x58)), ["mov qword ptr [rsp + 0x58], rax"]);
        assert_eq!(asm(|w| w.put_push_flags_via_rax()), ["lahf", "seto al", "push rax"]);
        assert_eq!(asm(|w| w.put_jb(AT + 0x40)), [format!("jb {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_jae(AT + 0x40)), [format!("jae {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_sub_mem_imm8(Reg::R11, 0x20_0018, 1, false)), ["sub qword ptr [r11 + 0x200018], 1"]);
        assert_eq!(
            asm(|w| w.put_sub_mem_imm8(Reg::R11, 0x20_0018, 1, true)),
            ["lock sub qword ptr [r11 + 0x200018], 1"]
        );
        assert_eq!(asm(|w| w.put_lea(Reg::R9, Reg::R11, 0x20_0018)), ["lea r9, [r11 + 0x200018]"]);
        assert_eq!(asm(|w| w.put_pop_flags_via_rax()), ["pop rax", "add al, 0x7f", "sahf"]);
        assert_eq!(asm(|w| w.put_ret()), ["ret"]);
    }

    /// The encodings that take any scratch register a detour may use.
    #[test]
    fn register_encodings_disassemble_as_intended() {
        use Reg::*;
        for r in [Rax, Rcx, Rdx, Rbx, Rsi, Rdi, R8, R9, R10, R11, R14, R15] {
            let (n, d) = (r.name(), r.name32());
            assert_eq!(asm(|w| w.put_cmp_byte_mem_0(r)), [format!("cmp byte ptr [{n}], 0")]);
            assert_eq!(asm(|w| w.put_mov_reg_fs0(r)), [format!("mov {n}, qword ptr fs:[0]")]);
            assert_eq!(asm(|w| w.put_xor_reg_fs0(r)), [format!("xor {n}, qword ptr fs:[0]")]);
            assert_eq!(asm(|w| w.put_cmp_reg_fs0(r)), [format!("cmp {n}, qword ptr fs:[0]")]);
            assert_eq!(asm(|w| w.put_not(r)), [format!("not {n}")]);
            assert_eq!(
                asm(|w| w.put_imul32_imm_from(r, Reg::Rax, 0x9e37_79b1)),
                [format!("imul {d}, eax, 0x9e3779b1")]
            );
            assert_eq!(asm(|w| w.put_imul32_imm_from(Reg::R10, r, 7)), [format!("imul r10d, {d}, 7")]);
            assert_eq!(asm(|w| w.put_xor_imm8(r, 32)), [format!("xor {n}, 0x20")]);
            assert_eq!(asm(|w| w.put_cmp_reg_deref(r, Reg::R10)), [format!("cmp {n}, qword ptr [r10]")]);
            assert_eq!(asm(|w| w.put_load(r, r, 8)), [format!("mov {n}, qword ptr [{n} + 8]")]);
            assert_eq!(asm(|w| w.put_imul32_imm(r, 0x9e37_79b1)), [format!("imul {d}, {d}, 0x9e3779b1")]);
            assert_eq!(asm(|w| w.put_shr32(r, 22)), [format!("shr {d}, 0x16")]);
            assert_eq!(asm(|w| w.put_shr64(r, 41)), [format!("shr {n}, 0x29")]);
            assert_eq!(asm(|w| w.put_and32_imm(r, 0x3f8)), [format!("and {d}, 0x3f8")]);
            assert_eq!(asm(|w| w.put_add_reg_rip(r, AT + 0x47)), [format!("add {n}, qword ptr [rip + 0x40]")]);
            assert_eq!(asm(|w| w.put_test_rip_reg(AT + 0x47, r)), [format!("test qword ptr [rip + 0x40], {n}")]);
            assert_eq!(asm(|w| w.put_load_self(r)), [format!("mov {n}, qword ptr [{n}]")]);
            assert_eq!(asm(|w| w.put_inc(r)), [format!("inc {n}")]);
            assert_eq!(asm(|w| w.put_inc_mem(r, 0x18, false)), [format!("inc qword ptr [{n} + 0x18]")]);
            assert_eq!(asm(|w| w.put_inc_mem(r, 0x18, true)), [format!("lock inc qword ptr [{n} + 0x18]")]);
            assert_eq!(asm(|w| w.put_mov_reg_rip(r, AT + 0x27)), [format!("mov {n}, qword ptr [rip + 0x20]")]);
        }
    }

    /// The memory forms of the runtime block's fast paths.
    #[test]
    fn memory_encodings_disassemble_as_intended() {
        assert_eq!(asm(|w| w.put_load(Reg::Rax, Reg::R11, 8)), ["mov rax, qword ptr [r11 + 8]"]);
        assert_eq!(asm(|w| w.put_load(Reg::R10, Reg::Rsp, 0x38)), ["mov r10, qword ptr [rsp + 0x38]"]);
        assert_eq!(asm(|w| w.put_load(Reg::Rdx, Reg::Rdx, 0)), ["mov rdx, qword ptr [rdx]"]);
        assert_eq!(asm(|w| w.put_load32(Reg::Rdx, Reg::R12, -8)), ["mov edx, dword ptr [r12 - 8]"]);
        assert_eq!(asm(|w| w.put_store(Reg::Rdi, Reg::Rax, 0x10)), ["mov qword ptr [rax + 0x10], rdi"]);
        assert_eq!(asm(|w| w.put_store(Reg::R9, Reg::Rbx, 0x38)), ["mov qword ptr [rbx + 0x38], r9"]);
        assert_eq!(asm(|w| w.put_store32(Reg::Rdx, Reg::Rax, 4)), ["mov dword ptr [rax + 4], edx"]);
        assert_eq!(asm(|w| w.put_store_imm(Reg::Rax, 0x30, 0)), ["mov qword ptr [rax + 0x30], 0"]);
        assert_eq!(asm(|w| w.put_store32_imm(Reg::R11, 0x1c, 1)), ["mov dword ptr [r11 + 0x1c], 1"]);
        assert_eq!(asm(|w| w.put_cmp32_mem_imm(Reg::R11, 0x1c, 0)), ["cmp dword ptr [r11 + 0x1c], 0"]);
        assert_eq!(asm(|w| w.put_movsxd(Reg::Rdx, Reg::Rdx, 0x44)), ["movsxd rdx, dword ptr [rdx + 0x44]"]);
        assert_eq!(asm(|w| w.put_add_reg_fs0(Reg::Rdx)), ["add rdx, qword ptr fs:[0]"]);
        assert_eq!(asm(|w| w.put_inc_mem(Reg::R11, 0x40, false)), ["inc qword ptr [r11 + 0x40]"]);
        assert_eq!(asm(|w| w.put_test32_mem_imm(Reg::Rsp, 0x28, 1 << 24)), ["test dword ptr [rsp + 0x28], 0x1000000"]);
        assert_eq!(asm(|w| w.put_cmp_reg_mem(Reg::Rax, Reg::R11, 0x40)), ["cmp rax, qword ptr [r11 + 0x40]"]);
        assert_eq!(asm(|w| w.put_sub_reg_mem(Reg::Rax, Reg::R10, 0x10)), ["sub rax, qword ptr [r10 + 0x10]"]);
        assert_eq!(asm(|w| w.put_lea(Reg::Rdx, Reg::Rsp, 0x40)), ["lea rdx, [rsp + 0x40]"]);
        assert_eq!(asm(|w| w.put_lea_indexed(Reg::Rax, Reg::R10, Reg::Rax, 0xc0)), ["lea rax, [r10 + rax + 0xc0]"]);
        assert_eq!(asm(|w| w.put_lea_indexed(Reg::Rbx, Reg::Rdx, Reg::R11, 8)), ["lea rbx, [rdx + r11 + 8]"]);
        assert_eq!(asm(|w| w.put_lea_rip(Reg::R8, AT + 0x47)), ["lea r8, [rip + 0x40]"]);
        assert_eq!(asm(|w| w.put_mov_reg(Reg::Rbx, Reg::Rax)), ["mov rbx, rax"]);
        assert_eq!(asm(|w| w.put_mov_reg(Reg::Rcx, Reg::R10)), ["mov rcx, r10"]);
        assert_eq!(asm(|w| w.put_mov_reg32(Reg::Rax, Reg::Rbx)), ["mov eax, ebx"]);
        assert_eq!(asm(|w| w.put_or_reg(Reg::Rax, Reg::Rdx)), ["or rax, rdx"]);
        assert_eq!(asm(|w| w.put_test_reg(Reg::R10)), ["test r10, r10"]);
        assert_eq!(asm(|w| w.put_cmp_reg_imm(Reg::Rax, 0xffff)), ["cmp rax, 0xffff"]);
        assert_eq!(asm(|w| w.put_or32_imm(Reg::Rdx, 1 << 24)), ["or edx, 0x1000000"]);
        assert_eq!(asm(|w| w.put_shl64(Reg::Rdx, 32)), ["shl rdx, 0x20"]);
        assert_eq!(asm(|w| w.put_imul64_imm(Reg::R11, 8256)), ["imul r11, r11, 0x2040"]);
        assert_eq!(asm(|w| w.put_ja(AT + 0x40)), [format!("ja {:#x}", AT + 0x40)]);
        assert_eq!(asm(|w| w.put_rdtsc()), ["rdtsc"]);
        assert_eq!(asm(|w| w.put_inc_mem_indexed8(Reg::Rax, Reg::Rdx)), ["inc qword ptr [rax + rdx*8]"]);
        assert_eq!(asm(|w| w.put_inc_mem_indexed8(Reg::R11, Reg::R10)), ["inc qword ptr [r11 + r10*8]"]);
        assert_eq!(asm(|w| w.put_lea32(Reg::Rdx, Reg::Rax, -1)), ["lea edx, [rax - 1]"]);
        assert_eq!(asm(|w| w.put_cmp32_imm(Reg::Rdx, 62)), ["cmp edx, 0x3e"]);
        assert_eq!(asm(|w| w.put_zero32(Reg::Rbx)), ["xor ebx, ebx"]);
        assert_eq!(asm(|w| w.put_zero32(Reg::R9)), ["xor r9d, r9d"]);
    }

    #[test]
    #[should_panic(expected = "needs another addressing form")]
    fn rsp_rbp_r12_r13_are_no_plain_base() {
        Writer::new(AT).put_load_self(Reg::R13);
    }

    #[test]
    fn align_pads_with_int3() {
        let mut w = Writer::new(AT + 3);
        w.put_align(8);
        assert_eq!(w.finish(), [0xcc; 5]);
    }

    #[test]
    #[should_panic(expected = "rel32 out of range")]
    fn far_branches_are_a_bug() {
        Writer::new(AT).put_jmp(AT + (4 << 30));
    }
}
