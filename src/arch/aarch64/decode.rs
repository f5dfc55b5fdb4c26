//! A64 decoding, reduced to what probe planning needs: what each
//! instruction means for relocation, read from its encoding bits, with
//! capstone as the judge of which encodings exist and for their names.
//!
//! A64 instructions are one 32-bit word each. The PC-relative ones are few
//! and have fixed fields (Arm ARM C4.1): ADR, ADRP, the literal loads (LDR,
//! LDRSW, PRFM, SIMD&FP LDR), B, BL, B.cond, CBZ/CBNZ and TBZ/TBNZ. BLR
//! writes the return address into LR. Everything else computes the same
//! wherever it runs, except what tp refuses: exclusive loads and stores,
//! system register access, exception generation.

use std::cell::RefCell;

use capstone::Capstone;
use capstone::arch::BuildsCapstone;
use capstone::arch::arm64::ArchMode;

use super::reg::Reg;
use super::writer::LoadKind;

/// What an instruction means for relocation and for the probe site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Runs the same anywhere.
    Plain,
    /// `bti c|j|jc`, `paciasp`, `pacibsp`: a landing pad for indirect branches.
    LandingPad,
    /// `adr xd, target`.
    Adr {
        /// Destination.
        rd: Reg,
        /// The address it computes.
        target: u64,
    },
    /// `adrp xd, page`.
    Adrp {
        /// Destination.
        rd: Reg,
        /// The page address it computes.
        target: u64,
    },
    /// A load (or prefetch) from a PC-relative address.
    LoadLiteral {
        /// Which load.
        kind: LoadKind,
        /// Destination (the prefetch operation for `prfm`).
        rt: Reg,
        /// The address it reads.
        addr: u64,
    },
    /// `b target`.
    Branch {
        /// Target.
        target: u64,
    },
    /// `bl target`.
    Call {
        /// Target.
        target: u64,
    },
    /// `b.cond`, `cbz`, `cbnz`, `tbz`, `tbnz`.
    CondBranch {
        /// Target when taken.
        target: u64,
    },
    /// `blr xn`.
    CallRegister {
        /// The register holding the callee.
        rn: Reg,
    },
    /// `br`, `ret` and their authenticating forms: leaves, never falls through.
    IndirectJump,
    /// Exclusive loads and stores (LDXR, STXR, LDAXP, ...): an LL/SC
    /// sequence must not be split.
    Exclusive,
    /// MRS, MSR, SYS, SYSL: system register and system instruction access.
    System,
    /// SVC, HVC, SMC, BRK, HLT, DCPS, UDF, ERET: traps and privileged returns.
    Unsafe,
    /// An authenticated call (`blraa` ...) tp does not rewrite.
    Unsupported,
    /// `pacm` (FEAT_PAuth_LR): the next pointer authentication instruction
    /// also signs with its own address, which a copy elsewhere does not
    /// have. (The `...ppc` forms that do so alone are not decoded, and
    /// refused as undecodable.)
    SignsWithPc,
}

/// One decoded instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    /// Its address.
    pub addr: u64,
    /// Its encoding.
    pub word: u32,
    /// Mnemonic, as capstone prints it.
    pub mnemonic: String,
    /// Operands, as capstone prints them.
    pub operands: String,
    /// What it means for tp.
    pub class: Class,
}

impl Insn {
    /// The direct branch target, if it is a direct branch or call.
    pub fn target(&self) -> Option<u64> {
        match self.class {
            Class::Branch { target } | Class::Call { target } | Class::CondBranch { target } => Some(target),
            _ => None,
        }
    }
}

thread_local! {
    static CAPSTONE: RefCell<Capstone> = RefCell::new(
        Capstone::new().arm64().mode(ArchMode::Arm).detail(false).build().expect("capstone arm64"),
    );
}

/// Decodes the word-aligned `code` at `addr` until its end or the first
/// word capstone does not know.
pub fn decode(code: &[u8], addr: u64) -> Vec<Insn> {
    CAPSTONE.with(|cs| {
        let cs = cs.borrow();
        let mut out = Vec::new();
        for (k, chunk) in code.chunks_exact(4).enumerate() {
            let at = addr + 4 * k as u64;
            let Ok(insns) = cs.disasm_count(chunk, at, 1) else { break };
            let Some(i) = insns.iter().next() else { break };
            let word = u32::from_le_bytes(chunk.try_into().unwrap());
            out.push(Insn {
                addr: at,
                word,
                mnemonic: i.mnemonic().unwrap_or("?").to_string(),
                operands: i.op_str().unwrap_or("").to_string(),
                class: classify(word, at),
            });
        }
        out
    })
}

fn sext(value: u32, bits: u32) -> i64 {
    ((value as i64) << (64 - bits)) >> (64 - bits)
}

fn field(word: u32, lo: u32, bits: u32) -> u32 {
    (word >> lo) & ((1 << bits) - 1)
}

/// The targets of the direct branches among the words of `code` (at
/// `addr`). Every word is looked at, decodable or not (A64 has no
/// misalignment to lose sync with), so data that looks like a branch adds
/// a target: a conservative answer for the window checks that use it.
pub fn branch_targets(code: &[u8], addr: u64) -> Vec<u64> {
    code.chunks_exact(4)
        .enumerate()
        .filter_map(|(k, w)| match classify(u32::from_le_bytes(w.try_into().unwrap()), addr + 4 * k as u64) {
            Class::Branch { target } | Class::Call { target } | Class::CondBranch { target } => Some(target),
            _ => None,
        })
        .collect()
}

/// The class of the instruction `word` at `pc`, from its encoding alone.
pub fn classify(word: u32, pc: u64) -> Class {
    let rel = |imm: i64| pc.wrapping_add((imm * 4) as u64);
    let rd = Reg::field_of(word, 0);
    let imm19 = sext(field(word, 5, 19), 19);
    // Data processing, immediate: PC-relative addressing.
    if word & 0x1f00_0000 == 0x1000_0000 {
        let imm = sext((field(word, 5, 19) << 2) | field(word, 29, 2), 21);
        return if word >> 31 == 0 {
            Class::Adr { rd, target: pc.wrapping_add(imm as u64) }
        } else {
            Class::Adrp { rd, target: (pc & !0xfff).wrapping_add((imm << 12) as u64) }
        };
    }
    // Loads and stores.
    if word & 0x3b00_0000 == 0x1800_0000 {
        let simd = word & (1 << 26) != 0;
        let kind = match (field(word, 30, 2), simd) {
            (0, false) => LoadKind::W,
            (1, false) => LoadKind::X,
            (2, false) => LoadKind::Sw,
            (3, false) => LoadKind::Prfm,
            (0, true) => LoadKind::S,
            (1, true) => LoadKind::D,
            (2, true) => LoadKind::Q,
            _ => return Class::Unsafe, // unallocated
        };
        return Class::LoadLiteral { kind, rt: rd, addr: rel(imm19) };
    }
    if word & 0x3f80_0000 == 0x0800_0000 {
        return Class::Exclusive; // o2 = 0: LDXR/STXR/LDAXR/STLXR, pairs, CASP
    }
    // Branches, exception generation and system instructions.
    match word & 0x7c00_0000 {
        0x1400_0000 => {
            let target = rel(sext(word & 0x03ff_ffff, 26));
            return if word >> 31 == 0 { Class::Branch { target } } else { Class::Call { target } };
        }
        0x3400_0000 if word & (1 << 25) == 0 => return Class::CondBranch { target: rel(imm19) }, // cbz/cbnz
        0x3400_0000 => return Class::CondBranch { target: rel(sext(field(word, 5, 14), 14)) },   // tbz/tbnz
        _ => {}
    }
    if word & 0xff00_0000 == 0x5400_0000 {
        return Class::CondBranch { target: rel(imm19) };
    }
    if word & 0xff00_0000 == 0xd400_0000 {
        return Class::Unsafe; // svc, hvc, smc, brk, hlt, dcps
    }
    if word & 0xffc0_0000 == 0xd500_0000 {
        return system(word);
    }
    if word & 0xfe00_0000 == 0xd600_0000 {
        let rn = Reg::field_of(word, 5);
        return match field(word, 21, 4) {
            0b0001 if word & 0xffff_fc1f == 0xd63f_0000 => Class::CallRegister { rn },
            0b0001 | 0b1001 => Class::Unsupported, // blraa, blrab, blraaz, blrabz
            0b0000 | 0b0010 | 0b1000 => Class::IndirectJump,
            _ => Class::Unsafe, // eret, drps and authenticated forms
        };
    }
    if word >> 16 == 0 {
        return Class::Unsafe; // udf
    }
    Class::Plain
}

/// Hints, barriers, PSTATE, SYS and MRS/MSR.
fn system(word: u32) -> Class {
    let op0 = field(word, 19, 2);
    let crn = field(word, 12, 4);
    if op0 == 0 && field(word, 21, 1) == 0 && word & 31 == 31 {
        match crn {
            // HINT #imm: bti c/j/jc (34, 36, 38) and paciasp/pacibsp (25, 27)
            // are landing pads; pacm (39) makes the next signing use the PC;
            // every other hint runs the same anywhere.
            0b0010 => {
                return match field(word, 5, 7) {
                    25 | 27 | 34 | 36 | 38 => Class::LandingPad,
                    39 => Class::SignsWithPc,
                    _ => Class::Plain,
                };
            }
            0b0011 => return Class::Plain, // clrex, dsb, dmb, isb, sb
            _ => {}
        }
    }
    Class::System
}

/// One line per instruction, `mnemonic operands`, for display and tests.
pub fn disassemble(code: &[u8], addr: u64) -> Vec<String> {
    decode(code, addr)
        .into_iter()
        .map(|i| if i.operands.is_empty() { i.mnemonic } else { format!("{} {}", i.mnemonic, i.operands) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PC: u64 = 0x40_1000;

    fn class_of(word: u32) -> Class {
        let d = decode(&word.to_le_bytes(), PC);
        assert_eq!(d.len(), 1, "{word:#010x} does not decode");
        d[0].class
    }

    #[test]
    fn classifies_each_instruction_class() {
        let rows: &[(u32, &str, Class)] = &[
            (0xa9bf7bfd, "stp x29, x30, [sp, #-0x10]!", Class::Plain),
            (0xd2800020, "mov x0, #1", Class::Plain),
            (0xf9400420, "ldr x0, [x1, #8]", Class::Plain),
            (0xd503201f, "nop", Class::Plain),
            (0xd5033bbf, "dmb ish", Class::Plain),
            (0xd503245f, "bti c", Class::LandingPad),
            (0xd503249f, "bti j", Class::LandingPad),
            (0xd50324df, "bti jc", Class::LandingPad),
            (0xd503233f, "paciasp", Class::LandingPad),
            (0xd503237f, "pacibsp", Class::LandingPad),
            (0xd50323bf, "autiasp", Class::Plain),
            (0x10000080, "adr x0, #0x401010", Class::Adr { rd: Reg::x(0), target: PC + 0x10 }),
            (0x70ffffe2, "adr x2, #0x400fff", Class::Adr { rd: Reg::x(2), target: PC - 1 }),
            (0x90000010, "adrp x16, #0x401000", Class::Adrp { rd: Reg::x(16), target: PC }),
            (0xf0fffff1, "adrp x17, #0x400000", Class::Adrp { rd: Reg::x(17), target: PC - 0x1000 }),
            (0x58000101, "ldr x1, #0x401020", Class::LoadLiteral { kind: LoadKind::X, rt: Reg::x(1), addr: PC + 0x20 }),
            (0x18ffffe3, "ldr w3, #0x400ffc", Class::LoadLiteral { kind: LoadKind::W, rt: Reg::x(3), addr: PC - 4 }),
            (0x98000044, "ldrsw x4, #0x401008", Class::LoadLiteral { kind: LoadKind::Sw, rt: Reg::x(4), addr: PC + 8 }),
            (
                0xd8000040,
                "prfm pldl1keep, #0x401008",
                Class::LoadLiteral { kind: LoadKind::Prfm, rt: Reg::x(0), addr: PC + 8 },
            ),
            (0x1c000045, "ldr s5, #0x401008", Class::LoadLiteral { kind: LoadKind::S, rt: Reg::x(5), addr: PC + 8 }),
            (0x5c000046, "ldr d6, #0x401008", Class::LoadLiteral { kind: LoadKind::D, rt: Reg::x(6), addr: PC + 8 }),
            (0x9c000047, "ldr q7, #0x401008", Class::LoadLiteral { kind: LoadKind::Q, rt: Reg::x(7), addr: PC + 8 }),
            (0x14000010, "b #0x401040", Class::Branch { target: PC + 0x40 }),
            (0x17ffffff, "b #0x400ffc", Class::Branch { target: PC - 4 }),
            (0x94000010, "bl #0x401040", Class::Call { target: PC + 0x40 }),
            (0x54000201, "b.ne #0x401040", Class::CondBranch { target: PC + 0x40 }),
            (0x54fffe0e, "b.al #0x400fc0", Class::CondBranch { target: PC - 0x40 }),
            (0xb4000200, "cbz x0, #0x401040", Class::CondBranch { target: PC + 0x40 }),
            (0x35fffe01, "cbnz w1, #0x400fc0", Class::CondBranch { target: PC - 0x40 }),
            (0x36180202, "tbz w2, #3, #0x401040", Class::CondBranch { target: PC + 0x40 }),
            (0xb7f7fe03, "tbnz x3, #0x3e, #0x400fc0", Class::CondBranch { target: PC - 0x40 }),
            (0xd63f0040, "blr x2", Class::CallRegister { rn: Reg::x(2) }),
            (0xd61f0200, "br x16", Class::IndirectJump),
            (0xd65f03c0, "ret", Class::IndirectJump),
            (0xd65f0bff, "retaa", Class::IndirectJump),
            (0xd73f081f, "blraa x0, sp", Class::Unsupported),
            (0xd50324ff, "hint #0x27", Class::SignsWithPc),
            (0xc85f7c20, "ldxr x0, [x1]", Class::Exclusive),
            (0x885ffc20, "ldaxr w0, [x1]", Class::Exclusive),
            (0xc8027c20, "stxr w2, x0, [x1]", Class::Exclusive),
            (0xc8dffc20, "ldar x0, [x1]", Class::Plain),
            (0xd53bd040, "mrs x0, tpidr_el0", Class::System),
            (0xd51bd040, "msr tpidr_el0, x0", Class::System),
            (0xd50b7420, "dc zva, x0", Class::System),
            (0xd4000001, "svc #0", Class::Unsafe),
            (0xd4000002, "hvc #0", Class::Unsafe),
            (0xd4200000, "brk #0", Class::Unsafe),
            (0xd4400000, "hlt #0", Class::Unsafe),
            (0x00000000, "udf #0", Class::Unsafe),
        ];
        for &(word, text, class) in rows {
            assert_eq!(disassemble(&word.to_le_bytes(), PC), [text], "{word:#010x}");
            assert_eq!(class_of(word), class, "{text}");
        }
    }

    #[test]
    fn branch_targets_look_past_unknown_words() {
        // b .+8; an unallocated word; cbz x0, .-8
        let code = [0x14000002u32, 0xffff_ffff, 0xb4ffffc0];
        let bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(branch_targets(&bytes, PC), [PC + 8, PC]);
    }

    #[test]
    fn stops_at_unknown_words() {
        // mov x0, #1; then an unallocated encoding
        let code = [0xd2800020u32, 0xffff_ffff, 0xd65f03c0];
        let bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(decode(&bytes, 0).len(), 1);
    }
}
