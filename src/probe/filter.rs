//! The predicate programs the in-target runtime runs (`--if`): their check
//! before tp writes one into the region, and the same interpreter as
//! runtime.c's, for tests and for what tp says about a program.
//!
//! A program is at most [`FILTER_WORDS`] words of [`filter_op`]s for a
//! stack machine of at most [`FILTER_DEPTH`] values ([`super::layout`] documents
//! the encoding). [`validate`] accepts only programs that end, never pop an
//! empty stack, never push past its depth, name only the argument
//! registers and the return value, and leave exactly one value. The
//! runtime checks every step again, since the target can write the region;
//! a program that fails there selects the call.

use super::layout::{FILTER_DEPTH, FILTER_RET, FILTER_STR_MAX, FILTER_WORDS, filter_ext, filter_op};

/// The register and extension of an [`filter_op::ARG`] word.
fn arg_fields(word: u64) -> (u64, u64) {
    ((word >> 8) & 0xff, (word >> 16) & 0xff)
}

/// The words of [`filter_op::STR`] comparing a string with `lit` (at most
/// [`FILTER_STR_MAX`] bytes), or with `prefix` testing that it starts with it.
pub fn str_words(lit: &[u8], prefix: bool) -> Vec<u64> {
    let flag = if prefix { filter_op::STR_PREFIX } else { 0 };
    let mut out = vec![filter_op::STR | ((lit.len() as u64) << 8) | flag];
    out.extend(lit.chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    }));
    out
}

/// An [`filter_op::ARG`] word: register `reg` (0-5, or [`FILTER_RET`]) extended by `ext`.
pub fn arg_word(reg: u64, ext: u64) -> u64 {
    filter_op::ARG | (reg << 8) | (ext << 16)
}

/// Checks `program` as the runtime will run it. `max_reg` is the largest
/// value an [`filter_op::ARG`] may name (5 at entry, [`FILTER_RET`] at exit).
pub fn validate(program: &[u64], max_reg: u64) -> Result<(), String> {
    let mut depth = 0usize;
    let mut pc = 0usize;
    while pc < program.len().min(FILTER_WORDS) {
        let w = program[pc];
        let op = w & 0xff;
        let pops_pushes = match op {
            filter_op::END => {
                return if depth == 1 { Ok(()) } else { Err(format!("ends with {depth} values, not 1")) };
            }
            filter_op::ARG => {
                let (reg, ext) = arg_fields(w);
                if reg > max_reg || ext > filter_ext::LAST || w >> 24 != 0 {
                    return Err(format!("word {pc}: bad argument {reg} (extension {ext})"));
                }
                (0, 1)
            }
            filter_op::IMM => {
                if w >> 8 != 0 || pc + 1 >= program.len().min(FILTER_WORDS) {
                    return Err(format!("word {pc}: bad immediate"));
                }
                pc += 1;
                (0, 1)
            }
            filter_op::NOT => (1, 1),
            filter_op::LOAD => {
                let (ext, width) = ((w >> 8) & 0xff, (w >> 16) & 0xff);
                if ext > filter_ext::LAST || ![1, 2, 4, 8].contains(&width) || w >> 24 != 0 {
                    return Err(format!("word {pc}: bad load"));
                }
                if pc + 1 >= program.len().min(FILTER_WORDS) {
                    return Err(format!("word {pc}: a load without its offset"));
                }
                pc += 1;
                (1, 1)
            }
            filter_op::STR => {
                let len = (w >> 8) & 0xff;
                let words = (len as usize).div_ceil(8);
                if len as usize > FILTER_STR_MAX
                    || w & !(0xffff | filter_op::STR_PREFIX) != 0
                    || pc + words >= program.len().min(FILTER_WORDS)
                {
                    return Err(format!("word {pc}: bad string"));
                }
                pc += words;
                (1, 1)
            }
            op if op <= filter_op::LAST => (2, 1),
            op => return Err(format!("word {pc}: unknown operation {op}")),
        };
        if ![filter_op::ARG, filter_op::IMM, filter_op::STR, filter_op::LOAD].contains(&op) && w >> 8 != 0 {
            return Err(format!("word {pc}: stray bits"));
        }
        if depth < pops_pushes.0 {
            return Err(format!("word {pc}: the stack is empty"));
        }
        depth = depth - pops_pushes.0 + pops_pushes.1;
        if depth > FILTER_DEPTH {
            return Err(format!("word {pc}: more than {FILTER_DEPTH} values"));
        }
        pc += 1;
    }
    Err(format!("no end within {FILTER_WORDS} words"))
}

/// `reg` extended as `ext` says.
fn extend(v: u64, ext: u64) -> u64 {
    match ext {
        filter_ext::I8 => v as i8 as i64 as u64,
        filter_ext::U8 => v as u8 as u64,
        filter_ext::I16 => v as i16 as i64 as u64,
        filter_ext::U16 => v as u16 as u64,
        filter_ext::I32 => v as i32 as i64 as u64,
        filter_ext::U32 => v as u32 as u64,
        _ => v,
    }
}

/// A [`filter_op::LOAD`] word: `width` bytes (1, 2, 4 or 8) extended by
/// `ext`; its offset goes in the next word.
pub fn load_word(width: u64, ext: u64) -> u64 {
    filter_op::LOAD | (ext << 8) | (width << 16)
}

/// True if the programs name a string ([`filter_op::STR`]) or a field
/// ([`filter_op::LOAD`]), which the runtime reads with process_vm_readv.
/// Programs [`validate`] accepted only.
pub fn reads_memory(program: &[u64]) -> bool {
    let mut pc = 0;
    while let Some(&w) = program.get(pc) {
        pc += match w & 0xff {
            filter_op::END => return false,
            filter_op::STR | filter_op::LOAD => return true,
            filter_op::IMM => 2,
            _ => 1,
        };
    }
    false
}

/// Runs `program` on `values` (the six argument registers, then the return
/// value) as runtime.c does: true when the call is recorded. Whatever goes
/// wrong (the target rewrote the program) selects the call. `read` reads
/// the process's memory at an address into a buffer and says how many
/// bytes it read, as process_vm_readv does.
pub fn eval(program: &[u64], values: &[u64; 7], read: &dyn Fn(u64, &mut [u8]) -> usize) -> bool {
    let mut stack = [0u64; FILTER_DEPTH];
    let mut sp = 0usize;
    let mut pc = 0usize;
    while pc < program.len().min(FILTER_WORDS) {
        let w = program[pc];
        pc += 1;
        let op = w & 0xff;
        match op {
            filter_op::END => return sp != 1 || stack[0] != 0,
            filter_op::ARG | filter_op::IMM => {
                if sp >= FILTER_DEPTH {
                    return true;
                }
                stack[sp] = if op == filter_op::IMM {
                    let Some(&v) = program.get(pc).filter(|_| pc < FILTER_WORDS) else { return true };
                    pc += 1;
                    v
                } else {
                    let (reg, ext) = arg_fields(w);
                    extend(values[(reg as usize).min(FILTER_RET as usize)], ext)
                };
                sp += 1;
            }
            filter_op::NOT => {
                if sp < 1 {
                    return true;
                }
                stack[sp - 1] = (stack[sp - 1] == 0) as u64;
            }
            filter_op::STR => {
                let len = ((w >> 8) & 0xff) as usize;
                let words = len.div_ceil(8);
                if sp < 1 || len > FILTER_STR_MAX || pc + words > FILTER_WORDS {
                    return true;
                }
                let Some(lit) = program.get(pc..pc + words) else { return true };
                let lit: Vec<u8> = lit.iter().flat_map(|w| w.to_le_bytes()).take(len).collect();
                pc += words;
                let prefix = w & filter_op::STR_PREFIX != 0;
                let mut buf = vec![0u8; if prefix { len } else { len + 1 }];
                let got = read(stack[sp - 1], &mut buf);
                stack[sp - 1] = (got == buf.len() && buf[..len] == lit[..] && (prefix || buf[len] == 0)) as u64;
            }
            filter_op::LOAD => {
                let (ext, width) = ((w >> 8) & 0xff, ((w >> 16) & 0xff) as usize);
                let Some(&off) = program.get(pc).filter(|_| pc < FILTER_WORDS) else { return true };
                pc += 1;
                if sp < 1 || ![1, 2, 4, 8].contains(&width) {
                    return true;
                }
                let mut b = [0u8; 8];
                if read(stack[sp - 1].wrapping_add(off), &mut b[..width]) != width {
                    return false;
                }
                stack[sp - 1] = extend(u64::from_le_bytes(b), ext);
            }
            op if op <= filter_op::LAST => {
                if sp < 2 {
                    return true;
                }
                let (a, b) = (stack[sp - 2], stack[sp - 1]);
                sp -= 1;
                stack[sp - 1] = match op {
                    filter_op::EQ => (a == b) as u64,
                    filter_op::NE => (a != b) as u64,
                    filter_op::LT_S => ((a as i64) < (b as i64)) as u64,
                    filter_op::LE_S => ((a as i64) <= (b as i64)) as u64,
                    filter_op::LT_U => (a < b) as u64,
                    filter_op::LE_U => (a <= b) as u64,
                    filter_op::AND => (a != 0 && b != 0) as u64,
                    filter_op::BIT_AND => a & b,
                    filter_op::BIT_OR => a | b,
                    filter_op::BIT_XOR => a ^ b,
                    _ => (a != 0 || b != 0) as u64,
                };
            }
            _ => return true,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use filter_op::*;

    #[test]
    fn a_comparison_runs_and_validates() {
        // arg1 (int) < -3
        let p = [arg_word(1, filter_ext::I32), IMM, (-3i64) as u64, LT_S, END];
        assert_eq!(validate(&p, 5), Ok(()));
        let mut v = [0u64; 7];
        v[1] = 0xdead_beef_ffff_fff0; // -16 as an int, with garbage above
        assert!(eval(&p, &v, &|_, _| 0));
        v[1] = 7;
        assert!(!eval(&p, &v, &|_, _| 0));
    }

    #[test]
    fn bitwise_operations_run_and_validate() {
        // (arg0 & 0x6) ^ 0x1 | 0x8 == 0xb
        let p = [arg_word(0, filter_ext::U64), IMM, 6, BIT_AND, IMM, 1, BIT_XOR, IMM, 8, BIT_OR, IMM, 0xb, EQ, END];
        assert_eq!(validate(&p, 5), Ok(()));
        let mut v = [0u64; 7];
        v[0] = 0x2;
        assert!(eval(&p, &v, &|_, _| 0));
        v[0] = 0x4;
        assert!(!eval(&p, &v, &|_, _| 0));
    }

    #[test]
    fn strings_are_compared_whole_or_as_prefixes_where_they_read() {
        let memory = b"GET /index.html\0POST\0";
        let read = |addr: u64, buf: &mut [u8]| {
            let from = (addr as usize).min(memory.len());
            let n = buf.len().min(memory.len() - from);
            buf[..n].copy_from_slice(&memory[from..from + n]);
            n
        };
        let run = |lit: &[u8], prefix: bool, at: u64| {
            let mut p = vec![arg_word(0, filter_ext::U64)];
            p.extend(str_words(lit, prefix));
            p.push(END);
            assert_eq!(validate(&p, 5), Ok(()), "{p:?}");
            assert!(reads_memory(&p));
            let mut v = [0u64; 7];
            v[0] = at;
            eval(&p, &v, &read)
        };
        assert!(run(b"GET /index.html", false, 0));
        assert!(!run(b"GET", false, 0));
        assert!(run(b"GET", true, 0));
        assert!(run(b"POST", false, 16));
        assert!(!run(b"POSTS", false, 16));
        // Past the end of what can be read: not equal.
        assert!(!run(b"POST", false, 18));
        assert!(run(b"", false, 20));
        // The longest literal fits; one cut short by the program's end does not.
        let long = [b'x'; FILTER_STR_MAX];
        let mut p = vec![arg_word(0, 0)];
        p.extend(str_words(&long, false));
        p.push(END);
        assert_eq!(validate(&p, 5), Ok(()));
        p.truncate(5);
        p.push(END);
        assert_eq!(validate(&p, 5).unwrap_err(), "word 1: bad string");
        assert!(eval(&p, &[0; 7], &read), "a program that goes wrong selects the call");
        let too_long = [filter_op::STR | (65 << 8), END];
        assert!(validate(&[&[arg_word(0, 0)][..], &too_long].concat(), 5).unwrap_err().contains("bad string"));
        assert!(!reads_memory(&[arg_word(0, 0), IMM, STR, END]), "an immediate is not an operation");
    }

    #[test]
    fn loads_read_fields_and_an_unreadable_one_selects_nothing() {
        // struct { int pad; short len; } at 0x1000: len == -2.
        let read = |addr: u64, buf: &mut [u8]| {
            let memory: [u8; 8] = [0, 0, 0, 0, 0xfe, 0xff, 0, 0];
            let from = addr.wrapping_sub(0x1000) as usize;
            match memory.get(from..from + buf.len()) {
                Some(m) => {
                    buf.copy_from_slice(m);
                    buf.len()
                }
                None => 0,
            }
        };
        let p = [arg_word(1, filter_ext::U64), load_word(2, filter_ext::I16), 4, IMM, (-2i64) as u64, EQ, END];
        assert_eq!(validate(&p, 5), Ok(()));
        assert!(reads_memory(&p));
        let mut v = [0u64; 7];
        v[1] = 0x1000;
        assert!(eval(&p, &v, &read));
        v[1] = 0x2000;
        assert!(!eval(&p, &v, &read), "a field that cannot be read selects nothing");
        let not = [arg_word(1, 0), load_word(2, filter_ext::I16), 4, NOT, END];
        assert!(!eval(&not, &v, &read), "not even under a !");
        for bad in [load_word(3, 0), load_word(2, 9), load_word(2, 0) | (1 << 24)] {
            assert!(validate(&[arg_word(1, 0), bad, 4, END], 5).unwrap_err().contains("bad load"));
        }
        assert!(validate(&[arg_word(1, 0), load_word(8, 0)], 5).unwrap_err().contains("without its offset"));
    }

    #[test]
    fn bad_programs_are_refused_and_select_the_call() {
        let bad: &[(&[u64], &str)] = &[
            (&[EQ, END], "empty"),
            (&[IMM], "immediate"),
            (&[IMM, 1, IMM, 2, END], "2 values"),
            (&[arg_word(6, 0), END], "bad argument 6"),
            (&[arg_word(1, 9), END], "extension 9"),
            (&[99, END], "unknown operation 99"),
            (&[IMM | 0x100, 1, END], "bad immediate"),
            (&[IMM, 1, NOT | 0x100, END], "stray bits"),
            (&[IMM, 1], "no end"),
        ];
        // An end one word past the longest program is no end.
        let long: Vec<u64> =
            [IMM, 1].into_iter().chain(std::iter::repeat_n(NOT, FILTER_WORDS - 2)).chain([END]).collect();
        assert!(validate(&long, 5).unwrap_err().contains("no end"));
        let _ = eval(&long, &[0; 7], &|_, _| 0);
        for (p, why) in bad {
            let e = validate(p, 5).unwrap_err();
            assert!(e.contains(why), "{p:?}: {e}");
            let _ = eval(p, &[0; 7], &|_, _| 0); // never panics
        }
        let deep: Vec<u64> = std::iter::repeat_n(arg_word(0, 0), 9).chain([END]).collect();
        assert!(validate(&deep, 5).unwrap_err().contains("more than 8"));
        assert!(eval(&deep, &[0; 7], &|_, _| 0), "a program that goes wrong selects the call");
        assert_eq!(validate(&[arg_word(6, 0), END], FILTER_RET), Ok(()));
    }
}
