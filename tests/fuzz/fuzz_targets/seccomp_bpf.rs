//! The classic BPF of seccomp filters, read from a target: arbitrary bytes
//! as a program, validated as the kernel does and, when valid, run on a
//! syscall made of more arbitrary bytes. Any panic, or a run that does not
//! end, is a bug: an invalid program must be an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::process::bpf::{Insn, Program, SeccompData};

fuzz_target!(|data: &[u8]| {
    // The first 64 bytes are the syscall (struct seccomp_data), the rest the program.
    if data.len() < 64 {
        return;
    }
    let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
    let call = SeccompData {
        nr: word(0) as i32,
        arch: (word(0) >> 32) as u32,
        instruction_pointer: word(8),
        args: [word(16), word(24), word(32), word(40), word(48), word(56)],
    };
    let insns: Vec<Insn> =
        data[64..].chunks_exact(Insn::SIZE).map(|c| Insn::from_bytes(c.try_into().unwrap())).collect();
    if let Ok(program) = Program::parse(&insns) {
        program.run(&call);
    }
});
