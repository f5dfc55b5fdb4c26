//! Basic blocks from decoded instructions, for any instruction set: each
//! architecture says how control leaves each instruction ([`Flow`]), and
//! [`split`] cuts the function at its leaders and links the blocks.

use std::collections::BTreeSet;

use super::Block;

/// How control leaves one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// To the next instruction (calls too: they come back).
    Next,
    /// A direct jump to its target.
    Jump(u64),
    /// A conditional direct branch: to its target, or on.
    Cond(u64),
    /// Out of the function for good (a return, a jump through a pointer
    /// that cannot land inside it).
    Leave,
    /// A jump through a register that may land inside the function, where
    /// only the code addresses the function forms may be its targets.
    Indirect,
    /// Nowhere: a trap (`ud2`, `brk`), after which nothing runs on.
    Stop,
}

/// The blocks of the function `[function, end)` whose instructions are
/// `insns` (address, length, flow), in order and covering it; `entries`
/// are addresses entered from outside the function's direct branches (a
/// split-off part's jumps back, code addresses it forms or data holds).
pub fn split(insns: &[(u64, u32, Flow)], function: u64, end: u64, entries: &[u64]) -> Vec<Block> {
    let inside = |t: u64| function <= t && t < end;
    let starts: BTreeSet<u64> = insns.iter().map(|i| i.0).collect();
    let mut leaders = BTreeSet::from([function]);
    let entered: BTreeSet<u64> =
        entries.iter().copied().filter(|t| starts.contains(t)).chain(std::iter::once(function)).collect();
    leaders.extend(entered.iter().copied());
    for &(at, len, flow) in insns {
        let next = at + len as u64;
        match flow {
            Flow::Next => {}
            Flow::Jump(t) | Flow::Cond(t) => {
                if inside(t) && starts.contains(&t) {
                    leaders.insert(t);
                }
                leaders.insert(next);
            }
            Flow::Leave | Flow::Indirect | Flow::Stop => {
                leaders.insert(next);
            }
        }
    }
    let mut blocks: Vec<Block> = Vec::new();
    for (k, &(at, len, flow)) in insns.iter().enumerate() {
        let next = at + len as u64;
        if leaders.contains(&at) || blocks.is_empty() {
            blocks.push(Block {
                start: at,
                end: next,
                insns: 0,
                succs: Vec::new(),
                leaves: false,
                entered: entered.contains(&at),
            });
        }
        let b = blocks.last_mut().expect("a block");
        b.end = next;
        b.insns += 1;
        let last = k + 1 == insns.len() || leaders.contains(&next);
        if !last {
            continue;
        }
        // Where control goes from the block's last instruction.
        let to = |t: u64, b: &mut Block| match inside(t) && starts.contains(&t) {
            true if !b.succs.contains(&t) => b.succs.push(t),
            true => {}
            // A branch to the middle of an instruction or out of the function.
            false => b.leaves = true,
        };
        match flow {
            Flow::Next => to(next, b),
            Flow::Jump(t) => to(t, b),
            Flow::Cond(t) => {
                to(t, b);
                to(next, b);
            }
            Flow::Leave | Flow::Indirect => b.leaves = true,
            Flow::Stop => {}
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_split_at_targets_and_after_branches() {
        // 0: a; 2: cond -> 8; 4: b; 6: jmp 0; 8: ret
        let insns =
            [(0, 2, Flow::Next), (2, 2, Flow::Cond(8)), (4, 2, Flow::Next), (6, 2, Flow::Jump(0)), (8, 2, Flow::Leave)];
        let b = split(&insns, 0, 10, &[]);
        let spans: Vec<(u64, u64, u32)> = b.iter().map(|b| (b.start, b.end, b.insns)).collect();
        assert_eq!(spans, [(0, 4, 2), (4, 8, 2), (8, 10, 1)]);
        assert_eq!(b[0].succs, [8, 4]);
        assert_eq!(b[1].succs, [0]);
        assert!(b[2].succs.is_empty() && b[2].leaves);
        assert!(b[0].entered && !b[1].entered);
    }

    #[test]
    fn entries_from_outside_are_leaders_and_jumps_out_leave() {
        let insns = [(0, 4, Flow::Next), (4, 4, Flow::Next), (8, 2, Flow::Cond(0x100)), (10, 1, Flow::Stop)];
        // 5 is inside an instruction: not a leader.
        let b = split(&insns, 0, 11, &[4, 5]);
        let spans: Vec<(u64, bool)> = b.iter().map(|b| (b.start, b.entered)).collect();
        assert_eq!(spans, [(0, true), (4, true), (10, false)]);
        assert_eq!(b[0].succs, [4]);
        assert!(b[1].leaves && b[1].succs == [10]);
        assert!(!b[2].leaves && b[2].succs.is_empty());
    }
}
