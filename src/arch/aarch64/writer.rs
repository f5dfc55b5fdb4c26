//! The fixed A64 encodings tp's detours are made of, and a literal pool.
//!
//! Each `put_*` appends one 32-bit instruction. The writer knows the address
//! its first word will run at, so branches are encoded for that address.
//! A branch or `adr` may point at a [`Label`] not bound yet, so code is
//! assembled in one pass: [`Writer::finish`] fills in its offset once the
//! code is whole, and answers [`OutOfRange`] if it does not reach.
//! `put_ldr_literal` loads a 64-bit value from a pool that [`Writer::finish`]
//! appends, 8-byte aligned, after the code; equal values share one slot.
//! Every encoding is checked against capstone's disassembly in the tests.
//!
//! Reference: Arm Architecture Reference Manual for A-profile, section C4
//! (A64 instruction set encoding).

use super::reg::Reg;
use crate::arch::emit::Labels;
pub use crate::arch::emit::{Label, Target};

/// How far a `b`/`bl` reaches: ±128 MiB.
pub const B_REACH: i64 = 1 << 27;
/// How far a `b.cond`/`cbz`/`ldr` literal reaches: ±1 MiB.
pub const IMM19_REACH: i64 = 1 << 20;
/// How far a `tbz`/`tbnz` reaches: ±32 KiB.
pub const IMM14_REACH: i64 = 1 << 15;

/// The encoding of `brk #0`: pads between code and literals, traps if run.
pub const BRK0: u32 = 0xd420_0000;

/// True if a branch at `from` with a signed immediate reaching `reach` bytes
/// can encode a jump to `to` (word-aligned, within `[-reach, reach)`).
pub fn reaches(from: u64, to: u64, reach: i64) -> bool {
    let d = to.wrapping_sub(from) as i64;
    d % 4 == 0 && (-reach..reach).contains(&d)
}

/// Hint-space instructions, by their `hint #imm` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// `paciasp`: signs x30 with key A and SP as modifier.
    Paciasp = 25,
    /// `pacibsp`: signs x30 with key B and SP as modifier.
    Pacibsp = 27,
    /// `autiasp`: authenticates x30 signed by `paciasp`.
    Autiasp = 29,
    /// `autibsp`: authenticates x30 signed by `pacibsp`.
    Autibsp = 31,
}

/// The imm7 field of a 64-bit `stp`/`ldp` with a signed offset.
fn pair_offset(offset: i32) -> u32 {
    assert!(offset % 8 == 0 && (-512..=504).contains(&offset), "stp/ldp offset {offset}");
    ((offset / 8) as u32 & 0x7f) << 15
}

/// The kinds of register a literal load can fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadKind {
    /// `ldr wt`: 32 bits, zero-extended.
    W,
    /// `ldr xt`: 64 bits.
    X,
    /// `ldrsw xt`: 32 bits, sign-extended.
    Sw,
    /// `prfm op`: a prefetch hint; the register field is the operation.
    Prfm,
    /// `ldr st`: 32-bit SIMD&FP.
    S,
    /// `ldr dt`: 64-bit SIMD&FP.
    D,
    /// `ldr qt`: 128-bit SIMD&FP.
    Q,
}

/// A branch, `adr` or literal load whose target lies beyond what its
/// instruction can encode, found when the code is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    /// The instruction's address.
    pub from: u64,
    /// Its target.
    pub to: u64,
}

impl std::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x} does not reach {:#x}", self.from, self.to)
    }
}

impl From<OutOfRange> for crate::arch::Refusal {
    fn from(_: OutOfRange) -> crate::arch::Refusal {
        crate::arch::Refusal::Unsupported("a branch inside tp's code out of its instruction's reach")
    }
}

/// The offset field of an instruction that points at a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// `b`, `bl`: words, bits 0-25.
    Imm26,
    /// `b.cond`, `cbz`, `cbnz`, `ldr` literal: words, bits 5-23.
    Imm19,
    /// `tbz`, `tbnz`: words, bits 5-18.
    Imm14,
    /// `adr`: bytes, the low two in bits 29-30, the rest in bits 5-23.
    Adr,
}

impl Field {
    /// The field holding the offset `d` (bytes from the instruction to its
    /// target), if it fits.
    fn encode(self, d: i64) -> Option<u32> {
        let words = |reach: i64| (d % 4 == 0 && (-reach..reach).contains(&d)).then_some((d / 4) as u32);
        match self {
            Field::Imm26 => words(B_REACH).map(|imm| imm & 0x03ff_ffff),
            Field::Imm19 => words(IMM19_REACH).map(|imm| (imm & 0x7_ffff) << 5),
            Field::Imm14 => words(IMM14_REACH).map(|imm| (imm & 0x3fff) << 5),
            Field::Adr => (-IMM19_REACH..IMM19_REACH)
                .contains(&d)
                .then_some(((d as u32 & 3) << 29) | (((d as u32 >> 2) & 0x7_ffff) << 5)),
        }
    }
}

/// An instruction buffer that will run at `base`, with a literal pool.
#[derive(Debug, Clone)]
pub struct Writer {
    base: u64,
    words: Vec<u32>,
    /// (index of an `ldr` literal in `words`, the value it loads).
    fixups: Vec<(usize, u64)>,
    /// Where each label is bound, if it is yet.
    labels: Labels,
    /// The instructions (their index in `words`) that point at labels,
    /// with the field their offset goes into.
    uses: Vec<(usize, Field, Label)>,
}

impl Writer {
    /// An empty buffer whose first word will run at `base` (4-byte aligned).
    pub fn new(base: u64) -> Writer {
        assert!(base.is_multiple_of(4), "A64 code must be word-aligned: {base:#x}");
        Writer { base, words: Vec::new(), fixups: Vec::new(), labels: Labels::default(), uses: Vec::new() }
    }

    /// A new label, bound nowhere yet.
    pub fn label(&mut self) -> Label {
        self.labels.add()
    }

    /// Binds `label` to the address of the next instruction.
    pub fn bind(&mut self, label: Label) {
        let at = self.pc();
        self.labels.bind(label, at);
    }

    /// Where `label` is bound, if it is yet.
    pub fn address(&self, label: Label) -> Option<u64> {
        self.labels.get(label)
    }

    /// The address of the next instruction.
    pub fn pc(&self) -> u64 {
        self.base + 4 * self.words.len() as u64
    }

    /// Appends one instruction word.
    pub fn put(&mut self, word: u32) {
        self.words.push(word);
    }

    /// Appends `op` with `target`'s offset in `field`: now for an address
    /// (which must be in reach: the caller checks), at [`Writer::finish`]
    /// for a label.
    fn put_to(&mut self, op: u32, field: Field, target: impl Into<Target>, what: &str) {
        match target.into() {
            Target::Addr(to) => {
                let pc = self.pc();
                let bits = field.encode(to.wrapping_sub(pc) as i64);
                self.put(op | bits.unwrap_or_else(|| panic!("{what} out of range: {pc:#x} -> {to:#x}")));
            }
            Target::Label(label) => {
                self.uses.push((self.words.len(), field, label));
                self.put(op);
            }
        }
    }

    /// `b target` (±128 MiB; the caller checks the reach).
    pub fn put_b(&mut self, target: impl Into<Target>) {
        self.put_to(0x1400_0000, Field::Imm26, target, "b");
    }

    /// `cbz wt, target`.
    pub fn put_cbz_w(&mut self, rt: Reg, target: impl Into<Target>) {
        self.put_to(0x3400_0000 | rt.field(), Field::Imm19, target, "cbz");
    }

    /// `cbnz wt, target`.
    pub fn put_cbnz_w(&mut self, rt: Reg, target: impl Into<Target>) {
        self.put_to(0x3500_0000 | rt.field(), Field::Imm19, target, "cbnz");
    }

    /// A conditional branch `word` (b.cond, cbz/cbnz, tbz/tbnz) re-encoded
    /// to branch to `target` from here, with its condition and registers kept.
    pub fn put_cond_branch(&mut self, word: u32, target: impl Into<Target>) {
        if word & 0x7e00_0000 == 0x3600_0000 {
            self.put_to(word & !(0x3fff << 5), Field::Imm14, target, "tbz");
        } else {
            self.put_to(word & !(0x7_ffff << 5), Field::Imm19, target, "b.cond/cbz");
        }
    }

    /// `ldr xt, =value`: a 64-bit load from the literal pool.
    pub fn put_ldr_literal(&mut self, rt: Reg, value: u64) {
        self.fixups.push((self.words.len(), value));
        self.put(0x5800_0000 | rt.field());
    }

    /// A load of `kind` from the address in `rn`: `ldr wt, [xn]`,
    /// `ldr xt, [xn]`, `ldrsw xt, [xn]`, `prfm op, [xn]`, `ldr st|dt|qt, [xn]`.
    pub fn put_load(&mut self, kind: LoadKind, rt: Reg, rn: Reg) {
        let op = match kind {
            LoadKind::W => 0xb940_0000,
            LoadKind::X => 0xf940_0000,
            LoadKind::Sw => 0xb980_0000,
            LoadKind::Prfm => 0xf980_0000,
            LoadKind::S => 0xbd40_0000,
            LoadKind::D => 0xfd40_0000,
            LoadKind::Q => 0x3dc0_0000,
        };
        self.put(op | (rn.field() << 5) | rt.field());
    }

    /// `ldrb wt, [xn]`.
    pub fn put_ldrb(&mut self, rt: Reg, rn: Reg) {
        self.put(0x3940_0000 | (rn.field() << 5) | rt.field());
    }

    /// `mrs xt, tpidr_el0`: the thread pointer.
    pub fn put_mrs_tpidr_el0(&mut self, rt: Reg) {
        self.put(0xd53b_d040 | rt.field());
    }

    /// `lsr xd, xn, #shift`.
    pub fn put_lsr(&mut self, rd: Reg, rn: Reg, shift: u32) {
        assert!(shift < 64);
        self.put(0xd340_fc00 | (shift << 16) | (rn.field() << 5) | rd.field());
    }

    /// `mul xd, xn, xm`.
    pub fn put_mul(&mut self, rd: Reg, rn: Reg, rm: Reg) {
        self.put(0x9b00_7c00 | (rm.field() << 16) | (rn.field() << 5) | rd.field());
    }

    /// `add xd, xn, xm, lsl #shift`.
    pub fn put_add_lsl(&mut self, rd: Reg, rn: Reg, rm: Reg, shift: u32) {
        assert!(shift < 64);
        self.put(0x8b00_0000 | (rm.field() << 16) | (shift << 10) | (rn.field() << 5) | rd.field());
    }

    /// `add xd, xn, #imm` (12-bit unsigned immediate; `xn` may be SP).
    pub fn put_add_imm(&mut self, rd: Reg, rn: Reg, imm: u32) {
        assert!(imm < 4096);
        self.put(0x9100_0000 | (imm << 10) | (rn.field() << 5) | rd.field());
    }

    /// `mov xd, #imm` (movz, 16-bit immediate).
    pub fn put_movz(&mut self, rd: Reg, imm: u16) {
        self.put(0xd280_0000 | ((imm as u32) << 5) | rd.field());
    }

    /// `mov xd, xm` (orr xd, xzr, xm).
    pub fn put_mov(&mut self, rd: Reg, rm: Reg) {
        self.put(0xaa00_03e0 | (rm.field() << 16) | rd.field());
    }

    /// `stadd xs, [xn]`: atomic add without a result (LSE, ARMv8.1).
    pub fn put_stadd(&mut self, rs: Reg, rn: Reg) {
        self.put(0xf820_001f | (rs.field() << 16) | (rn.field() << 5));
    }

    /// `ldxr xt, [xn]`.
    pub fn put_ldxr(&mut self, rt: Reg, rn: Reg) {
        self.put(0xc85f_7c00 | (rn.field() << 5) | rt.field());
    }

    /// `stxr ws, xt, [xn]`.
    pub fn put_stxr(&mut self, rs: Reg, rt: Reg, rn: Reg) {
        assert!(rs != rt && rs != rn, "stxr status register must differ");
        self.put(0xc800_7c00 | (rs.field() << 16) | (rn.field() << 5) | rt.field());
    }

    /// `str xt, [sp, #-16]!`: moves SP down first, so nothing below it is written.
    pub fn put_push(&mut self, rt: Reg) {
        self.put(0xf81f_0fe0 | rt.field());
    }

    /// `ldr xt, [sp], #16`.
    pub fn put_pop(&mut self, rt: Reg) {
        self.put(0xf841_07e0 | rt.field());
    }

    /// `bl target` (±128 MiB; the caller checks the reach).
    pub fn put_bl(&mut self, target: impl Into<Target>) {
        self.put_to(0x9400_0000, Field::Imm26, target, "bl");
    }

    /// `cbz xt, target`.
    pub fn put_cbz_x(&mut self, rt: Reg, target: impl Into<Target>) {
        self.put_to(0xb400_0000 | rt.field(), Field::Imm19, target, "cbz");
    }

    /// `sub xd, xn, #imm` (12-bit unsigned immediate; `xd` and `xn` may be SP).
    pub fn put_sub_imm(&mut self, rd: Reg, rn: Reg, imm: u32) {
        assert!(imm < 4096);
        self.put(0xd100_0000 | (imm << 10) | (rn.field() << 5) | rd.field());
    }

    /// Zeroes the `bytes` below the stack pointer (a multiple of 16, at
    /// most 512), two words an instruction, unrolled: `stp xzr, xzr, [sp,
    /// #-16]`, `[sp, #-32]`, ... No register and no flag changes (a loop
    /// took four instructions a turn and two registers).
    pub fn put_clear_below_sp(&mut self, bytes: u32) {
        assert!(bytes.is_multiple_of(16) && bytes > 0 && bytes <= 512);
        for k in 1..=bytes / 16 {
            self.put_stp(Reg::XZR, Reg::XZR, Reg::SP, -16 * k as i32);
        }
    }

    /// `stp xt, xt2, [xn, #offset]` (a multiple of 8 in [-512, 504]).
    pub fn put_stp(&mut self, rt: Reg, rt2: Reg, rn: Reg, offset: i32) {
        self.put(0xa900_0000 | pair_offset(offset) | (rt2.field() << 10) | (rn.field() << 5) | rt.field());
    }

    /// `ldp xt, xt2, [xn, #offset]` (a multiple of 8 in [-512, 504]).
    pub fn put_ldp(&mut self, rt: Reg, rt2: Reg, rn: Reg, offset: i32) {
        self.put(0xa940_0000 | pair_offset(offset) | (rt2.field() << 10) | (rn.field() << 5) | rt.field());
    }

    /// `str xt, [xn, #offset]` (a multiple of 8 below 32 KiB).
    pub fn put_str_offset(&mut self, rt: Reg, rn: Reg, offset: u32) {
        assert!(offset.is_multiple_of(8) && offset < 1 << 15);
        self.put(0xf900_0000 | ((offset / 8) << 10) | (rn.field() << 5) | rt.field());
    }

    /// `ldr xt, [xn, #offset]` (a multiple of 8 below 32 KiB).
    pub fn put_ldr_offset(&mut self, rt: Reg, rn: Reg, offset: u32) {
        assert!(offset.is_multiple_of(8) && offset < 1 << 15);
        self.put(0xf940_0000 | ((offset / 8) << 10) | (rn.field() << 5) | rt.field());
    }

    /// `mrs xt, nzcv`.
    pub fn put_mrs_nzcv(&mut self, rt: Reg) {
        self.put(0xd53b_4200 | rt.field());
    }

    /// `msr nzcv, xt`.
    pub fn put_msr_nzcv(&mut self, rt: Reg) {
        self.put(0xd51b_4200 | rt.field());
    }

    /// A hint-space instruction (`hint #imm`): BTI and the pointer
    /// authentication instructions that act on x30 with SP as modifier,
    /// which a CPU without the feature runs as NOPs.
    pub fn put_hint(&mut self, hint: Hint) {
        self.put(0xd503_201f | ((hint as u32) << 5));
    }

    /// `stp x16, x17, [sp, #-16]!`.
    pub fn put_push_ip_registers(&mut self) {
        self.put(0xa980_0000 | (0x7e << 15) | (Reg::X17.field() << 10) | (31 << 5) | Reg::X16.field());
    }

    /// `ldp x16, x17, [sp], #16`.
    pub fn put_pop_ip_registers(&mut self) {
        self.put(0xa8c0_0000 | (2 << 15) | (Reg::X17.field() << 10) | (31 << 5) | Reg::X16.field());
    }

    /// `cmp xn, xm` (`subs xzr, xn, xm`).
    pub fn put_cmp(&mut self, rn: Reg, rm: Reg) {
        self.put(0xeb00_001f | (rm.field() << 16) | (rn.field() << 5));
    }

    /// `b.lo target` (unsigned lower, carry clear).
    pub fn put_b_lo(&mut self, target: impl Into<Target>) {
        self.put_to(0x5400_0003, Field::Imm19, target, "b.lo");
    }

    /// `tbnz wt, #bit, target`.
    pub fn put_tbnz(&mut self, rt: Reg, bit: u32, target: impl Into<Target>) {
        assert!(bit < 32);
        self.put_to(0x3700_0000 | (bit << 19) | rt.field(), Field::Imm14, target, "tbnz");
    }

    /// `tbz wt, #bit, target`.
    pub fn put_tbz(&mut self, rt: Reg, bit: u32, target: impl Into<Target>) {
        assert!(bit < 32);
        self.put_to(0x3600_0000 | (bit << 19) | rt.field(), Field::Imm14, target, "tbz");
    }

    /// `adr xd, target` (±1 MiB).
    pub fn put_adr(&mut self, rd: Reg, target: impl Into<Target>) {
        self.put_to(0x1000_0000 | rd.field(), Field::Adr, target, "adr");
    }

    /// `br xn`.
    pub fn put_br(&mut self, rn: Reg) {
        self.put(0xd61f_0000 | (rn.field() << 5));
    }

    /// `ret xn`: an indirect branch that, unlike `br`, needs no BTI landing pad.
    pub fn put_ret(&mut self, rn: Reg) {
        self.put(0xd65f_0000 | (rn.field() << 5));
    }

    /// `adrp xd, target` (the 4 KiB page of `target`, ±4 GiB).
    pub fn put_adrp(&mut self, rd: Reg, target: u64) {
        let pages = ((target & !0xfff) as i64).wrapping_sub((self.pc() & !0xfff) as i64) >> 12;
        assert!((-(1 << 20)..(1 << 20)).contains(&pages), "adrp out of range: {:#x} -> {target:#x}", self.pc());
        let imm = pages as u32;
        self.put(0x9000_0000 | ((imm & 3) << 29) | (((imm >> 2) & 0x7_ffff) << 5) | rd.field());
    }

    /// The code, then the literal pool at the next 8-byte boundary (padded
    /// with `brk #0`), with every use of a label filled in (each label used
    /// must be bound by now) and every `ldr` literal pointing at its value;
    /// [`OutOfRange`] if one of them does not reach.
    pub fn finish(mut self) -> Result<Vec<u8>, OutOfRange> {
        for (index, field, label) in std::mem::take(&mut self.uses) {
            let from = self.base + 4 * index as u64;
            let to = self.labels.bound(label);
            self.words[index] |= field.encode(to.wrapping_sub(from) as i64).ok_or(OutOfRange { from, to })?;
        }
        if !self.fixups.is_empty() && !self.pc().is_multiple_of(8) {
            self.put(BRK0);
        }
        let mut pool: Vec<u64> = Vec::new();
        let pool_at = self.pc();
        for &(index, value) in &self.fixups {
            let slot = pool.iter().position(|&v| v == value).unwrap_or_else(|| {
                pool.push(value);
                pool.len() - 1
            });
            let from = self.base + 4 * index as u64;
            let to = pool_at + 8 * slot as u64;
            self.words[index] |= Field::Imm19.encode(to.wrapping_sub(from) as i64).ok_or(OutOfRange { from, to })?;
        }
        let mut bytes: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(pool.iter().flat_map(|v| v.to_le_bytes()));
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::aarch64::decode::disassemble;

    const AT: u64 = 0x7f00_0000_1000;

    fn asm(f: impl FnOnce(&mut Writer)) -> Vec<String> {
        let mut w = Writer::new(AT);
        f(&mut w);
        disassemble(&w.finish().unwrap(), AT)
    }

    #[test]
    fn each_encoding_disassembles_as_intended() {
        let rows: Vec<(Vec<String>, &str)> = vec![
            (asm(|w| w.put_b(AT + 0x7ff_fffc)), "b #0x7f0008000ffc"),
            (asm(|w| w.put_b(AT - 0x800_0000)), "b #0x7efff8001000"),
            (asm(|w| w.put_cbz_w(Reg::X16, AT + 0x30)), "cbz w16, #0x7f0000001030"),
            (asm(|w| w.put_cbnz_w(Reg::x(15), AT - 8)), "cbnz w15, #0x7f0000000ff8"),
            (asm(|w| w.put_load(LoadKind::W, Reg::x(3), Reg::x(3))), "ldr w3, [x3]"),
            (asm(|w| w.put_load(LoadKind::X, Reg::x(0), Reg::x(0))), "ldr x0, [x0]"),
            (asm(|w| w.put_load(LoadKind::Sw, Reg::x(7), Reg::x(7))), "ldrsw x7, [x7]"),
            (asm(|w| w.put_load(LoadKind::Prfm, Reg::x(1), Reg::X16)), "prfm pldl1strm, [x16]"),
            (asm(|w| w.put_load(LoadKind::S, Reg::x(2), Reg::X16)), "ldr s2, [x16]"),
            (asm(|w| w.put_load(LoadKind::D, Reg::x(31), Reg::X16)), "ldr d31, [x16]"),
            (asm(|w| w.put_load(LoadKind::Q, Reg::x(4), Reg::X16)), "ldr q4, [x16]"),
            (asm(|w| w.put_ldrb(Reg::X16, Reg::X16)), "ldrb w16, [x16]"),
            (asm(|w| w.put_mrs_tpidr_el0(Reg::X16)), "mrs x16, tpidr_el0"),
            (asm(|w| w.put_lsr(Reg::X16, Reg::X16, 12)), "lsr x16, x16, #0xc"),
            (asm(|w| w.put_lsr(Reg::X16, Reg::X16, 58)), "lsr x16, x16, #0x3a"),
            (asm(|w| w.put_mul(Reg::X16, Reg::X16, Reg::X17)), "mul x16, x16, x17"),
            (asm(|w| w.put_add_lsl(Reg::X16, Reg::X17, Reg::X16, 15)), "add x16, x17, x16, lsl #15"),
            (asm(|w| w.put_add_imm(Reg::X16, Reg::X16, 0x123)), "add x16, x16, #0x123"),
            (asm(|w| w.put_movz(Reg::X17, 1)), "mov x17, #1"),
            (asm(|w| w.put_mov(Reg::X17, Reg::x(5))), "mov x17, x5"),
            (asm(|w| w.put_stadd(Reg::X17, Reg::X16)), "stadd x17, [x16]"),
            (asm(|w| w.put_ldxr(Reg::X17, Reg::X16)), "ldxr x17, [x16]"),
            (asm(|w| w.put_stxr(Reg::x(15), Reg::X17, Reg::X16)), "stxr w15, x17, [x16]"),
            (asm(|w| w.put_push(Reg::x(15))), "str x15, [sp, #-0x10]!"),
            (asm(|w| w.put_pop(Reg::x(15))), "ldr x15, [sp], #0x10"),
            (asm(|w| w.put_br(Reg::X17)), "br x17"),
            (asm(|w| w.put_ret(Reg::X16)), "ret x16"),
            (asm(|w| w.put_adrp(Reg::X16, AT + 0x1234_5678)), "adrp x16, #0x7f0012346000"),
            (asm(|w| w.put_adrp(Reg::X16, AT - 0xffff_f000)), "adrp x16, #0x7eff00002000"),
            (asm(|w| w.put_bl(AT + 0x100)), "bl #0x7f0000001100"),
            (asm(|w| w.put_cbz_x(Reg::X17, AT + 0x30)), "cbz x17, #0x7f0000001030"),
            (asm(|w| w.put_sub_imm(Reg::SP, Reg::SP, 0xa0)), "sub sp, sp, #0xa0"),
            (asm(|w| w.put_sub_imm(Reg::X17, Reg::X17, 1)), "sub x17, x17, #1"),
            (asm(|w| w.put_add_imm(Reg::SP, Reg::SP, 0xa0)), "add sp, sp, #0xa0"),
            (asm(|w| w.put_add_imm(Reg::x(2), Reg::SP, 0)), "mov x2, sp"),
            (asm(|w| w.put_stp(Reg::x(0), Reg::x(1), Reg::SP, 0)), "stp x0, x1, [sp]"),
            (asm(|w| w.put_stp(Reg::x(17), Reg::LR, Reg::SP, 144)), "stp x17, x30, [sp, #0x90]"),
            (asm(|w| w.put_stp(Reg::x(29), Reg::LR, Reg::SP, -512)), "stp x29, x30, [sp, #-0x200]"),
            (asm(|w| w.put_ldp(Reg::x(14), Reg::x(15), Reg::SP, 112)), "ldp x14, x15, [sp, #0x70]"),
            (asm(|w| w.put_str_offset(Reg::X17, Reg::X16, 0)), "str x17, [x16]"),
            (asm(|w| w.put_str_offset(Reg::LR, Reg::SP, 152)), "str x30, [sp, #0x98]"),
            (asm(|w| w.put_ldr_offset(Reg::LR, Reg::SP, 152)), "ldr x30, [sp, #0x98]"),
            (asm(|w| w.put_mrs_nzcv(Reg::X17)), "mrs x17, nzcv"),
            (asm(|w| w.put_msr_nzcv(Reg::X17)), "msr nzcv, x17"),
            (asm(|w| w.put_hint(Hint::Paciasp)), "paciasp"),
            (asm(|w| w.put_hint(Hint::Pacibsp)), "pacibsp"),
            (asm(|w| w.put_hint(Hint::Autiasp)), "autiasp"),
            (asm(|w| w.put_hint(Hint::Autibsp)), "autibsp"),
            (asm(|w| w.put_tbz(Reg::x(3), 31, AT + 0x7ffc)), "tbz w3, #0x1f, #0x7f0000008ffc"),
            (asm(|w| w.put_tbnz(Reg::x(1), 0, AT - 0x8000)), "tbnz w1, #0, #0x7effffff9000"),
            (asm(|w| w.put_adr(Reg::x(7), AT + 0xf_ffff)), "adr x7, #0x7f0000100fff"),
            (asm(|w| w.put_adr(Reg::X16, AT - 0x10_0000)), "adr x16, #0x7efffff01000"),
            (asm(|w| w.put_adr(Reg::x(0), AT + 3)), "adr x0, #0x7f0000001003"),
        ];
        for (got, want) in rows {
            assert_eq!(got, [want]);
        }
    }

    #[test]
    fn clearing_below_sp_is_one_pair_store_per_16_bytes() {
        let want = ["stp xzr, xzr, [sp, #-0x10]", "stp xzr, xzr, [sp, #-0x20]", "stp xzr, xzr, [sp, #-0x30]"];
        assert_eq!(asm(|w| w.put_clear_below_sp(48)), want);
        let far = asm(|w| w.put_clear_below_sp(512));
        assert_eq!((far.len(), far[31].as_str()), (32, "stp xzr, xzr, [sp, #-0x200]"));
    }

    #[test]
    fn conditional_branches_keep_condition_and_registers() {
        // b.ne, cbz x3, tbnz w5, #3 (capstone prints targets as absolute addresses)
        assert_eq!(asm(|w| w.put_cond_branch(0x5400_0001, AT + 8)), ["b.ne #0x7f0000001008"]);
        assert_eq!(asm(|w| w.put_cond_branch(0xb400_0003, AT + 8)), ["cbz x3, #0x7f0000001008"]);
        assert_eq!(asm(|w| w.put_cond_branch(0x3718_0005, AT + 8)), ["tbnz w5, #3, #0x7f0000001008"]);
        // the old offset bits are cleared
        assert_eq!(asm(|w| w.put_cond_branch(0x54ff_ffe1, AT + 8)), ["b.ne #0x7f0000001008"]);
    }

    #[test]
    fn literals_go_to_an_aligned_deduplicated_pool() {
        let mut w = Writer::new(AT);
        w.put_ldr_literal(Reg::X16, 0x1122_3344_5566_7788);
        w.put_ldr_literal(Reg::X17, 0x99);
        w.put_ldr_literal(Reg::x(0), 0x1122_3344_5566_7788);
        let bytes = w.finish().unwrap();
        // 3 instructions, a brk pad to 8 bytes, then 2 literals
        assert_eq!(bytes.len(), 16 + 16);
        let asm = disassemble(&bytes[..16], AT);
        assert_eq!(asm, ["ldr x16, #0x7f0000001010", "ldr x17, #0x7f0000001018", "ldr x0, #0x7f0000001010", "brk #0"]);
        assert_eq!(bytes[16..24], 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(bytes[24..32], 0x99u64.to_le_bytes());
    }

    #[test]
    fn reach_is_checked_both_ways() {
        assert!(reaches(0x1000, 0x1000 + (B_REACH as u64) - 4, B_REACH));
        assert!(!reaches(0x1000, 0x1000 + B_REACH as u64, B_REACH));
        assert!(reaches(B_REACH as u64, 0, B_REACH));
        assert!(!reaches(B_REACH as u64 + 4, 0, B_REACH));
        assert!(!reaches(0x1000, 0x1002, B_REACH));
    }

    #[test]
    fn labels_are_filled_in_when_the_code_is_finished() {
        // Forward and backward uses of every kind of field, and an address
        // and a label of the same place encoding alike.
        let mut w = Writer::new(AT);
        let (back, fwd) = (w.label(), w.label());
        w.bind(back);
        w.put_b(fwd);
        w.put_bl(fwd);
        w.put_cbz_w(Reg::X16, fwd);
        w.put_cbnz_w(Reg::x(15), back);
        w.put_cbz_x(Reg::X17, fwd);
        w.put_cond_branch(0x5400_0001, fwd);
        w.put_cond_branch(0x3718_0005, back);
        w.put_b_lo(fwd);
        w.put_tbnz(Reg::x(1), 29, fwd);
        w.put_tbz(Reg::x(2), 3, back);
        w.put_adr(Reg::x(4), fwd);
        w.put_ldr_literal(Reg::X16, 7);
        assert_eq!((w.address(back), w.address(fwd)), (Some(AT), None));
        w.bind(fwd);
        assert_eq!(w.address(fwd), Some(AT + 48));
        w.put_b(AT);
        let bytes = w.finish().unwrap();
        let (b, f) = (format!("#{AT:#x}"), format!("#{:#x}", AT + 48));
        assert_eq!(
            disassemble(&bytes[..52], AT),
            [
                format!("b {f}"),
                format!("bl {f}"),
                format!("cbz w16, {f}"),
                format!("cbnz w15, {b}"),
                format!("cbz x17, {f}"),
                format!("b.ne {f}"),
                format!("tbnz w5, #3, {b}"),
                format!("b.lo {f}"),
                format!("tbnz w1, #0x1d, {f}"),
                format!("tbz w2, #3, {b}"),
                format!("adr x4, {f}"),
                format!("ldr x16, #{:#x}", AT + 56),
                format!("b {b}"),
            ]
        );
    }

    #[test]
    fn a_label_out_of_reach_is_an_answer_not_a_panic() {
        let mut w = Writer::new(AT);
        let far = w.label();
        w.put_tbnz(Reg::x(1), 0, far);
        for _ in 0..IMM14_REACH / 4 - 2 {
            w.put(BRK0);
        }
        w.bind(far);
        assert!(w.finish().is_ok(), "32 KiB less 4 is in reach");
        let mut w = Writer::new(AT);
        let far = w.label();
        w.put_tbnz(Reg::x(1), 0, far);
        for _ in 0..IMM14_REACH / 4 - 1 {
            w.put(BRK0);
        }
        w.bind(far);
        assert_eq!(w.finish(), Err(OutOfRange { from: AT, to: AT + IMM14_REACH as u64 }));
        let mut w = Writer::new(AT);
        let back = w.label();
        w.bind(back);
        for _ in 0..IMM19_REACH / 4 + 1 {
            w.put(BRK0);
        }
        w.put_cbz_x(Reg::X17, back);
        let from = AT + IMM19_REACH as u64 + 4;
        assert_eq!(w.finish(), Err(OutOfRange { from, to: AT }));
    }

    #[test]
    #[should_panic(expected = "a label used but never bound")]
    fn a_label_used_must_be_bound() {
        let mut w = Writer::new(AT);
        let nowhere = w.label();
        w.put_b(nowhere);
        let _ = w.finish();
    }

    #[test]
    #[should_panic(expected = "b out of range")]
    fn far_branches_are_a_bug() {
        Writer::new(AT).put_b(AT + (1 << 27));
    }
}
