//! The basic blocks of an x86-64 function ([`crate::arch::Arch::blocks`]):
//! the decoder's classes as control flow; a jump through a register makes
//! every code address the function forms a leader ([`super::taken`]).

use super::decode::{Class, Insn, decode};
use super::taken;
use crate::arch::basic_blocks::{Flow, split};
use crate::arch::{Block, Image, Refusal};

/// See the module doc.
pub fn blocks(code: &[u8], function: u64, extra_targets: &[u64], image: &dyn Image) -> Result<Vec<Block>, Refusal> {
    let insns = decode(code, function);
    let end = function + code.len() as u64;
    let decoded = insns.last().map_or(function, Insn::end);
    if decoded < end {
        return Err(Refusal::Undecodable { at: decoded });
    }
    let flow = |i: &Insn| match (i.class, i.target) {
        (Class::CondBranch, Some(t)) => Flow::Cond(t),
        (Class::Jump, Some(t)) => Flow::Jump(t),
        (Class::CondBranch | Class::Jump | Class::IndirectJump, _) => Flow::Indirect,
        (Class::Ret | Class::IndirectJumpRip, _) => Flow::Leave,
        (Class::Unsafe, _) if matches!(i.mnemonic.as_str(), "ud0" | "ud1" | "ud2" | "hlt") => Flow::Stop,
        _ => Flow::Next,
    };
    let flows: Vec<(u64, u32, Flow)> = insns.iter().map(|i| (i.addr, i.len, flow(i))).collect();
    let mut entries = extra_targets.to_vec();
    if flows.iter().any(|f| f.2 == Flow::Indirect) {
        entries.extend(taken::code_addresses(&insns, function, end, image));
    }
    Ok(split(&flows, function, end, &entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::NoImage;

    #[test]
    fn a_loop_splits_into_its_blocks() {
        const F: u64 = 0x1000;
        let code = [
            0x31, 0xc0, // 0: xor eax, eax
            0x85, 0xff, // 2: test edi, edi
            0x7e, 0x06, // 4: jle 0xc
            0x01, 0xf8, // 6: add eax, edi
            0xff, 0xcf, // 8: dec edi
            0xeb, 0xf6, // a: jmp 2
            0xc3, // c: ret
        ];
        let b = blocks(&code, F, &[], &NoImage).unwrap();
        let spans: Vec<(u64, u64)> = b.iter().map(|b| (b.start - F, b.end - F)).collect();
        assert_eq!(spans, [(0, 2), (2, 6), (6, 0xc), (0xc, 0xd)]);
        assert_eq!(b[0].succs, [F + 2]);
        assert_eq!(b[1].succs, [F + 0xc, F + 6]);
        assert_eq!(b[2].succs, [F + 2]);
        assert!(b[3].leaves && b[3].succs.is_empty());
        assert!(blocks(&[0x31, 0xc0, 0x0f], F, &[], &NoImage).is_err(), "cut short");
    }
}
