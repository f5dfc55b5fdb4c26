//! The basic blocks of an AArch64 function ([`crate::arch::Arch::blocks`]):
//! the decoder's classes as control flow. A `br` (not a return) may be a
//! switch's jump, whose targets tp does not read on this architecture: such
//! a function's blocks are not known.

use super::decode::{Class, decode};
use crate::arch::basic_blocks::{Flow, split};
use crate::arch::{Block, Image, Refusal};

/// See the module doc.
pub fn blocks(code: &[u8], function: u64, extra_targets: &[u64], _image: &dyn Image) -> Result<Vec<Block>, Refusal> {
    let insns = decode(code, function);
    let end = function + code.len() as u64;
    let decoded = insns.last().map_or(function, |i| i.addr + 4);
    if decoded < end {
        return Err(Refusal::Undecodable { at: decoded });
    }
    let mut flows = Vec::with_capacity(insns.len());
    for i in &insns {
        let flow = match i.class {
            Class::Branch { target } => Flow::Jump(target),
            Class::CondBranch { target } => Flow::Cond(target),
            // ret, retaa, retab: opc 0b0010.
            Class::IndirectJump if (i.word >> 21) & 0xf == 0b0010 => Flow::Leave,
            Class::IndirectJump => {
                return Err(Refusal::Unsupported(
                    "it jumps through a register (a switch's table, which tp does not read on this architecture)",
                ));
            }
            Class::Unsafe if i.mnemonic == "brk" || i.mnemonic == "udf" || i.mnemonic == "hlt" => Flow::Stop,
            _ => Flow::Next,
        };
        flows.push((i.addr, 4, flow));
    }
    Ok(split(&flows, function, end, extra_targets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::NoImage;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn a_loop_splits_into_its_blocks() {
        const F: u64 = 0x1000;
        let code = words(&[
            0x52800000, // 0: mov w0, #0
            0x7100003f, // 4: cmp w1, #0
            0x5400008d, // 8: b.le 0x18
            0x0b010000, // c: add w0, w0, w1
            0x51000421, // 10: sub w1, w1, #1
            0x17fffffc, // 14: b 0x4
            0xd65f03c0, // 18: ret
        ]);
        let b = blocks(&code, F, &[], &NoImage).unwrap();
        let spans: Vec<(u64, u64)> = b.iter().map(|b| (b.start - F, b.end - F)).collect();
        assert_eq!(spans, [(0, 4), (4, 0xc), (0xc, 0x18), (0x18, 0x1c)]);
        assert_eq!(b[1].succs, [F + 0x18, F + 0xc]);
        assert_eq!(b[2].succs, [F + 4]);
        assert!(b[3].leaves);
        // br x1: a jump tp cannot follow.
        assert!(blocks(&words(&[0xd61f0020]), F, &[], &NoImage).is_err());
    }
}
