//! Classic BPF as seccomp runs it: validating a filter program and running
//! it on one `struct seccomp_data` (the syscall number, the audit
//! architecture, the instruction pointer and six arguments).
//!
//! The programs come from the target (through ptrace), so they are
//! untrusted input: [`Program::parse`] accepts exactly what the kernel's
//! `seccomp_check_filter` and `bpf_check_classic` accept (the seccomp subset
//! of opcodes, aligned loads inside `seccomp_data`, jumps forward and inside
//! the program, no division by a constant zero, no shift by 32 or more,
//! scratch memory read only where it was written on every path, a `ret` at
//! the end, at most 4096 instructions), and anything else is an error, never
//! a panic. Jumps only go forward, so a run takes at most as many steps as
//! the program has instructions.

use std::fmt;

/// Instructions a program may have (BPF_MAXINSNS).
pub const MAX_INSNS: usize = 4096;
/// Bytes of `struct seccomp_data`.
pub const DATA_LEN: u32 = 64;
/// Scratch memory cells (BPF_MEMWORDS).
const MEM_WORDS: u32 = 16;

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant.
    pub k: u32,
}

impl Insn {
    /// Bytes of one instruction.
    pub const SIZE: usize = 8;

    /// Reads one instruction from its 8 bytes in the host's byte order.
    pub fn from_bytes(b: [u8; 8]) -> Insn {
        Insn {
            code: u16::from_ne_bytes([b[0], b[1]]),
            jt: b[2],
            jf: b[3],
            k: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// What a syscall looks like to a filter (`struct seccomp_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeccompData {
    /// The syscall number.
    pub nr: i32,
    /// The audit architecture (AUDIT_ARCH_*).
    pub arch: u32,
    /// The address after the syscall instruction.
    pub instruction_pointer: u64,
    /// The six arguments.
    pub args: [u64; 6],
}

impl SeccompData {
    /// The 32-bit word at byte offset `k` (aligned, inside the struct), as the kernel loads it.
    fn word(&self, k: u32) -> u32 {
        let mut b = [0u8; DATA_LEN as usize];
        b[0..4].copy_from_slice(&self.nr.to_ne_bytes());
        b[4..8].copy_from_slice(&self.arch.to_ne_bytes());
        b[8..16].copy_from_slice(&self.instruction_pointer.to_ne_bytes());
        for (i, a) in self.args.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let k = k as usize;
        u32::from_ne_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]])
    }
}

/// Why a program is not one the kernel would have accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The instruction at fault (or the length, for an empty or long program).
    pub at: usize,
    /// What is wrong.
    pub why: &'static str,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instruction {}: {}", self.at, self.why)
    }
}

impl std::error::Error for Invalid {}

// Opcodes of the seccomp subset (linux/filter.h, linux/bpf_common.h).
const LD_W_ABS: u16 = 0x20;
const LD_W_LEN: u16 = 0x80;
const LDX_W_LEN: u16 = 0x81;
const LD_IMM: u16 = 0x00;
const LDX_IMM: u16 = 0x01;
const LD_MEM: u16 = 0x60;
const LDX_MEM: u16 = 0x61;
const ST: u16 = 0x02;
const STX: u16 = 0x03;
const ALU: u16 = 0x04;
const ALU_NEG: u16 = 0x84;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;
const TAX: u16 = 0x07;
const TXA: u16 = 0x87;
/// Source bit of ALU and JMP: X instead of K.
const SRC_X: u16 = 0x08;
const OP_MASK: u16 = 0xf0;
const ADD: u16 = 0x00;
const SUB: u16 = 0x10;
const MUL: u16 = 0x20;
const DIV: u16 = 0x30;
const OR: u16 = 0x40;
const AND: u16 = 0x50;
const LSH: u16 = 0x60;
const RSH: u16 = 0x70;
const XOR: u16 = 0xa0;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;

/// What an opcode is, for the checks and the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    LoadData,
    LoadLen,
    LoadLenX,
    Imm,
    ImmX,
    LoadMem,
    LoadMemX,
    Store,
    StoreX,
    Alu { op: u16, x: bool },
    Neg,
    Ja,
    Jcond { op: u16, x: bool },
    RetK,
    RetA,
    Tax,
    Txa,
}

fn kind(code: u16) -> Option<Kind> {
    Some(match code {
        LD_W_ABS => Kind::LoadData,
        LD_W_LEN => Kind::LoadLen,
        LDX_W_LEN => Kind::LoadLenX,
        LD_IMM => Kind::Imm,
        LDX_IMM => Kind::ImmX,
        LD_MEM => Kind::LoadMem,
        LDX_MEM => Kind::LoadMemX,
        ST => Kind::Store,
        STX => Kind::StoreX,
        ALU_NEG => Kind::Neg,
        JA => Kind::Ja,
        RET_K => Kind::RetK,
        RET_A => Kind::RetA,
        TAX => Kind::Tax,
        TXA => Kind::Txa,
        c if c & !(OP_MASK | SRC_X) == ALU
            && matches!(c & OP_MASK, ADD | SUB | MUL | DIV | OR | AND | LSH | RSH | XOR) =>
        {
            Kind::Alu { op: c & OP_MASK, x: c & SRC_X != 0 }
        }
        c if c & !(OP_MASK | SRC_X) == JA && matches!(c & OP_MASK, JEQ | JGT | JGE | JSET) => {
            Kind::Jcond { op: c & OP_MASK, x: c & SRC_X != 0 }
        }
        _ => return None,
    })
}

/// A validated filter program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    insns: Vec<(Kind, Insn)>,
}

impl Program {
    /// Validates `insns` as the kernel does for a seccomp filter.
    pub fn parse(insns: &[Insn]) -> Result<Program, Invalid> {
        let len = insns.len();
        if len == 0 || len > MAX_INSNS {
            return Err(Invalid { at: len, why: "a program has 1 to 4096 instructions" });
        }
        let mut out = Vec::with_capacity(len);
        for (pc, i) in insns.iter().enumerate() {
            let bad = |why| Err(Invalid { at: pc, why });
            let Some(kind) = kind(i.code) else { return bad("an opcode seccomp does not allow") };
            let fits = |off: u32| (pc as u64 + 1 + off as u64) < len as u64;
            match kind {
                Kind::LoadData if i.k >= DATA_LEN || i.k % 4 != 0 => {
                    return bad("a load outside seccomp_data or not aligned");
                }
                Kind::LoadMem | Kind::LoadMemX | Kind::Store | Kind::StoreX if i.k >= MEM_WORDS => {
                    return bad("a scratch memory cell past the 16th");
                }
                Kind::Alu { op: DIV, x: false } if i.k == 0 => return bad("a division by zero"),
                Kind::Alu { op: LSH | RSH, x: false } if i.k >= 32 => return bad("a shift by 32 or more"),
                Kind::Ja if !fits(i.k) => return bad("a jump past the end"),
                Kind::Jcond { .. } if !fits(i.jt as u32) || !fits(i.jf as u32) => return bad("a jump past the end"),
                _ => {}
            }
            out.push((kind, *i));
        }
        if !matches!(out[len - 1].0, Kind::RetK | Kind::RetA) {
            return Err(Invalid { at: len - 1, why: "the last instruction is not a return" });
        }
        check_memory(&out)?;
        Ok(Program { insns: out })
    }

    /// Instructions in the program.
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    /// Never true: a program has at least one instruction.
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }

    /// Runs the program on `data`; returns its 32-bit result.
    pub fn run(&self, data: &SeccompData) -> u32 {
        let (mut a, mut x) = (0u32, 0u32);
        let mut mem = [0u32; MEM_WORDS as usize];
        let mut pc = 0usize;
        // Every jump goes forward, so each step moves pc up: at most len steps.
        for _ in 0..self.insns.len() {
            let Some(&(kind, i)) = self.insns.get(pc) else { break };
            pc += 1;
            match kind {
                Kind::LoadData => a = data.word(i.k),
                Kind::LoadLen => a = DATA_LEN,
                Kind::LoadLenX => x = DATA_LEN,
                Kind::Imm => a = i.k,
                Kind::ImmX => x = i.k,
                Kind::LoadMem => a = mem[i.k as usize],
                Kind::LoadMemX => x = mem[i.k as usize],
                Kind::Store => mem[i.k as usize] = a,
                Kind::StoreX => mem[i.k as usize] = x,
                Kind::Neg => a = a.wrapping_neg(),
                Kind::Tax => x = a,
                Kind::Txa => a = x,
                Kind::RetK => return i.k,
                Kind::RetA => return a,
                Kind::Ja => pc += i.k as usize,
                Kind::Alu { op, x: use_x } => {
                    let src = if use_x { x } else { i.k };
                    a = match op {
                        ADD => a.wrapping_add(src),
                        SUB => a.wrapping_sub(src),
                        MUL => a.wrapping_mul(src),
                        // cBPF's rule, kept by the kernel: dividing by an X of 0 returns 0.
                        DIV if src == 0 => return 0,
                        DIV => a / src,
                        OR => a | src,
                        AND => a & src,
                        LSH => a.wrapping_shl(src & 31),
                        RSH => a.wrapping_shr(src & 31),
                        _ => a ^ src, // XOR: `kind` admits nothing else
                    };
                }
                Kind::Jcond { op, x: use_x } => {
                    let src = if use_x { x } else { i.k };
                    let taken = match op {
                        JEQ => a == src,
                        JGT => a > src,
                        JGE => a >= src,
                        _ => a & src != 0, // JSET
                    };
                    pc += if taken { i.jt } else { i.jf } as usize;
                }
            }
        }
        // Unreachable for a parsed program (it ends in a return); the
        // kernel's answer to a program that does not return is to kill.
        0
    }
}

/// The kernel's `check_load_and_stores`: a scratch cell is read only where
/// every path to the read wrote it first.
fn check_memory(insns: &[(Kind, Insn)]) -> Result<(), Invalid> {
    let mut masks = vec![u16::MAX; insns.len()];
    let mut valid: u16 = 0;
    for (pc, &(kind, i)) in insns.iter().enumerate() {
        valid &= masks[pc];
        match kind {
            Kind::Store | Kind::StoreX => valid |= 1 << i.k,
            Kind::LoadMem | Kind::LoadMemX if valid & (1 << i.k) == 0 => {
                return Err(Invalid { at: pc, why: "a scratch memory cell read before it is written" });
            }
            Kind::Ja => {
                masks[pc + 1 + i.k as usize] &= valid;
                valid = u16::MAX;
            }
            Kind::Jcond { .. } => {
                masks[pc + 1 + i.jt as usize] &= valid;
                masks[pc + 1 + i.jf as usize] &= valid;
                valid = u16::MAX;
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    const ALLOW: u32 = 0x7fff_0000;
    const KILL: u32 = 0x8000_0000;

    fn data(nr: i32, args: [u64; 6]) -> SeccompData {
        SeccompData { nr, arch: 0xc000_003e, instruction_pointer: 0x7fff_1234_5678, args }
    }

    /// A filter as libseccomp writes one: check the arch, kill `nr`, allow the rest.
    fn kill_one(nr: u32) -> Program {
        Program::parse(&[
            ins(LD_W_ABS, 0, 0, 4),
            ins(0x15, 1, 0, 0xc000_003e),
            ins(RET_K, 0, 0, KILL),
            ins(LD_W_ABS, 0, 0, 0),
            ins(0x15, 0, 1, nr),
            ins(RET_K, 0, 0, KILL),
            ins(RET_K, 0, 0, ALLOW),
        ])
        .unwrap()
    }

    #[test]
    fn runs_a_typical_filter() {
        let p = kill_one(319);
        assert_eq!(p.run(&data(319, [0; 6])), KILL);
        assert_eq!(p.run(&data(9, [0; 6])), ALLOW);
        let mut other_arch = data(9, [0; 6]);
        other_arch.arch = 0x4000_0003;
        assert_eq!(p.run(&other_arch), KILL);
    }

    #[test]
    fn reads_both_halves_of_an_argument_and_the_pc() {
        // ERRNO(1) if mmap's prot (args[2], low word at 16 + 2*8) has PROT_EXEC, and its high word is 0.
        let p = Program::parse(&[
            ins(LD_W_ABS, 0, 0, 36), // args[2] high half
            ins(0x15, 0, 3, 0),
            ins(LD_W_ABS, 0, 0, 32), // args[2] low half
            ins(0x45, 0, 1, 4),      // jset PROT_EXEC
            ins(RET_K, 0, 0, 0x0005_0001),
            ins(LD_W_ABS, 0, 0, 12), // instruction_pointer, high half
            ins(RET_A, 0, 0, 0),
        ])
        .unwrap();
        assert_eq!(p.run(&data(9, [0, 4096, 5, 0, 0, 0])), 0x0005_0001);
        assert_eq!(p.run(&data(9, [0, 4096, 3, 0, 0, 0])), 0x7fff);
        assert_eq!(p.run(&data(9, [0, 4096, 5 | (1 << 32), 0, 0, 0])), 0x7fff);
    }

    #[test]
    fn alu_memory_and_x() {
        let p = Program::parse(&[
            ins(LD_W_ABS, 0, 0, 0), // A = nr
            ins(ST, 0, 0, 3),       // M[3] = nr
            ins(ALU | MUL, 0, 0, 3),
            ins(TAX, 0, 0, 0),               // X = 3 nr
            ins(LD_MEM, 0, 0, 3),            // A = nr
            ins(ALU | SUB | SRC_X, 0, 0, 0), // A = nr - 3 nr
            ins(ALU_NEG, 0, 0, 0),           // 2 nr
            ins(ALU | LSH, 0, 0, 4),         // 32 nr
            ins(ALU | XOR, 0, 0, 1),
            ins(RET_A, 0, 0, 0),
        ])
        .unwrap();
        assert_eq!(p.run(&data(5, [0; 6])), 161);
    }

    #[test]
    fn division_by_an_x_of_zero_returns_zero() {
        let p = Program::parse(&[
            ins(LD_IMM, 0, 0, 7),
            ins(LDX_IMM, 0, 0, 0),
            ins(ALU | DIV | SRC_X, 0, 0, 0),
            ins(RET_K, 0, 0, ALLOW),
        ])
        .unwrap();
        assert_eq!(p.run(&data(0, [0; 6])), 0);
    }

    #[test]
    fn refuses_what_the_kernel_refuses() {
        let cases: Vec<(Vec<Insn>, &str)> = vec![
            (vec![], "1 to 4096"),
            (vec![ins(RET_K, 0, 0, 0); MAX_INSNS + 1], "1 to 4096"),
            (vec![ins(LD_W_ABS, 0, 0, 0)], "not a return"),
            (vec![ins(LD_W_ABS, 0, 0, 64), ins(RET_A, 0, 0, 0)], "outside seccomp_data"),
            (vec![ins(LD_W_ABS, 0, 0, 2), ins(RET_A, 0, 0, 0)], "not aligned"),
            (vec![ins(0x28, 0, 0, 0), ins(RET_A, 0, 0, 0)], "opcode"), // ld half word
            (vec![ins(0x40, 0, 0, 0), ins(RET_A, 0, 0, 0)], "opcode"), // ld indirect
            (vec![ins(ALU | 0x90, 0, 0, 3), ins(RET_A, 0, 0, 0)], "opcode"), // mod
            (vec![ins(ALU | DIV, 0, 0, 0), ins(RET_A, 0, 0, 0)], "division by zero"),
            (vec![ins(ALU | RSH, 0, 0, 32), ins(RET_A, 0, 0, 0)], "shift"),
            (vec![ins(JA, 0, 0, 1), ins(RET_A, 0, 0, 0)], "past the end"),
            (vec![ins(JA, 0, 0, u32::MAX), ins(RET_A, 0, 0, 0)], "past the end"),
            (vec![ins(0x15, 0, 1, 0), ins(RET_A, 0, 0, 0)], "past the end"),
            (vec![ins(LD_MEM, 0, 0, 16), ins(RET_A, 0, 0, 0)], "16th"),
            (vec![ins(LD_MEM, 0, 0, 0), ins(RET_A, 0, 0, 0)], "before it is written"),
            // Written on one path only.
            (
                vec![ins(0x15, 0, 1, 0), ins(ST, 0, 0, 2), ins(LD_MEM, 0, 0, 2), ins(RET_A, 0, 0, 0)],
                "before it is written",
            ),
        ];
        for (p, why) in cases {
            let err = Program::parse(&p).unwrap_err();
            assert!(err.why.contains(why), "{p:?}: {err} should say {why:?}");
        }
        // Written on both paths is fine.
        let both = [ins(0x15, 1, 0, 0), ins(ST, 0, 0, 2), ins(ST, 0, 0, 2), ins(LD_MEM, 0, 0, 2), ins(RET_A, 0, 0, 0)];
        assert!(Program::parse(&both).is_ok());
    }

    /// Random programs: parsing never panics, and every accepted program
    /// runs to a result within its length on random data.
    #[test]
    fn random_programs_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let codes = [
            LD_W_ABS, LD_W_LEN, LDX_W_LEN, LD_IMM, LDX_IMM, LD_MEM, LDX_MEM, ST, STX, ALU_NEG, JA, RET_K, RET_A, TAX,
            TXA, 0x0c, 0x14, 0x24, 0x34, 0x3c, 0x44, 0x54, 0x64, 0x74, 0xa4, 0x15, 0x1d, 0x25, 0x35, 0x45, 0x4d, 0x28,
            0xffff,
        ];
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = 1 + (next() % 12) as usize;
            let p: Vec<Insn> = (0..len)
                .map(|_| {
                    let r = next();
                    let k = if r & 1 == 0 { (r >> 8) as u32 % 70 } else { (r >> 16) as u32 };
                    ins(codes[(r >> 40) as usize % codes.len()], (r >> 48) as u8 % 4, (r >> 56) as u8 % 4, k)
                })
                .collect();
            if let Ok(prog) = Program::parse(&p) {
                accepted += 1;
                let d = SeccompData {
                    nr: next() as i32,
                    arch: next() as u32,
                    instruction_pointer: next(),
                    args: [next(); 6],
                };
                prog.run(&d);
            }
        }
        assert!(accepted > 100, "only {accepted} random programs were valid: the test tests little");
    }
}
