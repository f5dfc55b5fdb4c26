//! Call stacks recorded with entry events (`--stack`): the words the
//! runtime wrote after an event, decoded ([`decode`]: untrusted bytes,
//! bounded, never a panic), turned into return addresses (a frame-pointer
//! walk's are already; a copy of the stack's top is unwound with the
//! modules' unwind tables by [`crate::symbols::stackwalk`]), and counted per
//! probe and distinct stack ([`StackCounts`]).

use std::collections::HashMap;

use crate::probe::layout::{MAX_STACK_COPY, MAX_STACK_DEPTH, stack_word};
pub use crate::symbols::symbolize::Frame;

/// The most words of a stack tp reads after one event: a full copy and its
/// header (a frame walk is shorter).
pub const MAX_WORDS: usize = 4 + (MAX_STACK_COPY / 8) as usize;

/// A stack as the runtime recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Return addresses from the probed function's caller outwards.
    Frames(Vec<u64>),
    /// The stack's top for tp to unwind: the stack pointer, frame pointer
    /// and return address at the function's entry, and the words from the
    /// stack pointer up.
    Copy {
        /// The stack pointer at entry.
        sp: u64,
        /// The frame pointer at entry.
        fp: u64,
        /// The return address.
        ra: u64,
        /// Words of the stack from `sp` up.
        words: Vec<u64>,
    },
}

/// A decoded stack and how complete it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// What was recorded.
    pub recorded: Recorded,
    /// The walk or the copy stopped at its limit, not at the stack's end.
    pub truncated: bool,
    /// The thread's stack bounds were not known: only the return address
    /// was read.
    pub no_bounds: bool,
}

/// Decodes the words after an event (`words`, as the runtime wrote them;
/// the target can write anything there). None when they make no sense.
pub fn decode(words: &[u64]) -> Option<Stack> {
    let (&head, rest) = words.split_first()?;
    let count = (head >> stack_word::COUNT_SHIFT) as usize;
    let truncated = head & stack_word::TRUNCATED != 0;
    let no_bounds = head & stack_word::NO_BOUNDS != 0;
    let recorded = match head & stack_word::MODE_MASK {
        stack_word::MODE_FRAMES => {
            if count > MAX_STACK_DEPTH as usize || rest.len() < count {
                return None;
            }
            Recorded::Frames(rest[..count].to_vec())
        }
        stack_word::MODE_COPY => {
            if count > (MAX_STACK_COPY / 8) as usize || rest.len() < 3 + count {
                return None;
            }
            Recorded::Copy { sp: rest[0], fp: rest[1], ra: rest[2], words: rest[3..3 + count].to_vec() }
        }
        _ => return None,
    };
    Some(Stack { recorded, truncated, no_bounds })
}

/// The most distinct stacks tp keeps per probe; the calls of others are
/// counted apart ([`StackCounts::dropped`]).
pub const MAX_DISTINCT: usize = 100_000;

/// Calls counted per probe and distinct stack (return addresses, the
/// caller's first).
#[derive(Debug, Default, Clone)]
pub struct StackCounts {
    counts: HashMap<(usize, Vec<u64>), u64>,
    per_probe: HashMap<usize, usize>,
    /// Calls whose stack was not kept: the probe had [`MAX_DISTINCT`] already.
    pub dropped: u64,
    /// Calls whose stack tp could not tell at all.
    pub unreadable: u64,
    /// Stacks cut short at the depth or size asked for.
    pub truncated: u64,
    /// Stacks of threads whose stack bounds the runtime could not know.
    pub no_bounds: u64,
}

impl StackCounts {
    /// Counts one call of probe `probe` (a position in the session's probes)
    /// with return addresses `addrs`; false if its stack was not kept.
    pub fn add(&mut self, probe: usize, addrs: Vec<u64>) -> bool {
        let key = (probe, addrs);
        if let Some(n) = self.counts.get_mut(&key) {
            *n += 1;
            return true;
        }
        let distinct = self.per_probe.entry(probe).or_default();
        if *distinct >= MAX_DISTINCT {
            self.dropped += 1;
            return false;
        }
        *distinct += 1;
        self.counts.insert(key, 1);
        true
    }

    /// Every stack of `probe` with its count, the most frequent last (as
    /// bpftrace prints its maps), ties by addresses.
    pub fn of(&self, probe: usize) -> Vec<(&[u64], u64)> {
        let mut v: Vec<(&[u64], u64)> =
            self.counts.iter().filter(|((p, _), _)| *p == probe).map(|((_, a), &n)| (a.as_slice(), n)).collect();
        v.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        v
    }

    /// True if nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(mode: u64, count: u64) -> u64 {
        mode | (count << stack_word::COUNT_SHIFT)
    }

    #[test]
    fn decodes_both_forms_and_refuses_nonsense() {
        let w = [head(stack_word::MODE_FRAMES, 2) | stack_word::TRUNCATED, 0x1000, 0x2000, 99];
        let s = decode(&w).unwrap();
        assert_eq!(s.recorded, Recorded::Frames(vec![0x1000, 0x2000]));
        assert!(s.truncated && !s.no_bounds);
        let w = [head(stack_word::MODE_COPY, 2) | stack_word::NO_BOUNDS, 0x7ff0, 0x7ff8, 0x1000, 0x1000, 5];
        let s = decode(&w).unwrap();
        assert_eq!(s.recorded, Recorded::Copy { sp: 0x7ff0, fp: 0x7ff8, ra: 0x1000, words: vec![0x1000, 5] });
        assert!(s.no_bounds);
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[head(stack_word::MODE_FRAMES, 3), 1, 2]), None, "fewer words than it says");
        assert_eq!(decode(&[head(stack_word::MODE_FRAMES, 1000)]), None);
        assert_eq!(decode(&[head(7, 0)]), None);
        assert_eq!(decode(&[u64::MAX; 8]), None);
    }

    #[test]
    fn counts_distinct_stacks_per_probe() {
        let mut c = StackCounts::default();
        for _ in 0..3 {
            c.add(0, vec![1, 2]);
        }
        c.add(0, vec![1, 3]);
        c.add(1, vec![1, 2]);
        assert_eq!(c.of(0), [(&[1u64, 3][..], 1), (&[1, 2][..], 3)]);
        assert_eq!(c.of(1), [(&[1u64, 2][..], 1)]);
        assert!(c.of(2).is_empty());
    }
}
