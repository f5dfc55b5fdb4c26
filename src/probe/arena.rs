//! Placing code arenas: where in the target's address space a detour page
//! may go so that every probe site of a module reaches it with one branch.

use crate::process::maps::{Gap, Mapping, gaps};

/// Room left for the stack to grow down into, and the heap up into.
const GROWTH_ROOM: u64 = 256 << 20;
const PAGE: u64 = 4096;

/// The span of addresses a module occupies (all its mappings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Lowest address.
    pub lo: u64,
    /// One past the highest address.
    pub hi: u64,
}

/// True if every address of `[a, a + size)` is within `reach` of every
/// address of `span`, both ways.
pub fn reaches(span: Span, a: u64, size: u64, reach: u64) -> bool {
    let far_end = (a + size).max(span.hi) - a.min(span.lo);
    far_end <= reach
}

/// Candidate addresses for an arena of `size` bytes near `span`, nearest first.
pub fn candidates(maps: &[Mapping], span: Span, size: u64, reach: u64) -> Vec<u64> {
    let size = size.next_multiple_of(PAGE);
    let mut out: Vec<u64> = gaps(maps).iter().filter_map(|g| place_in(g, span, size)).collect();
    out.retain(|&a| reaches(span, a, size, reach));
    // A gap between the module's own mappings (AArch64 linkers align
    // segments to 64 KiB and leave holes) is at distance 0.
    out.sort_by_key(|&a| if a < span.lo { span.lo - a } else { a.saturating_sub(span.hi) });
    out
}

/// The best spot for the arena in one gap: as close to the module as the
/// gap allows, but not where the stack or the heap will want to grow.
fn place_in(g: &Gap, span: Span, size: u64) -> Option<u64> {
    let lo = g.start.next_multiple_of(PAGE) + if g.above_heap { GROWTH_ROOM } else { 0 };
    let hi = (g.end & !(PAGE - 1)).checked_sub(if g.below_stack { GROWTH_ROOM } else { 0 })?;
    if hi < lo || hi - lo < size {
        return None;
    }
    // Below the module: the top of the gap; above it: the bottom.
    Some(if hi <= span.lo { hi - size } else { lo.max(span.hi.min(hi - size)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::maps::parse;

    const REACH: u64 = (1 << 31) - 1;

    fn maps() -> Vec<Mapping> {
        parse(
            "555555554000-555555556000 r--p 00000000 fd:01 1 /t/counter\n\
             555555556000-555555557000 r-xp 00002000 fd:01 1 /t/counter\n\
             555555557000-555555559000 rw-p 00003000 fd:01 1 /t/counter\n\
             555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]\n\
             7ffff7d80000-7ffff7f80000 r-xp 00000000 fd:01 2 /lib/libc.so.6\n\
             7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]\n",
        )
    }

    #[test]
    fn arena_goes_right_below_the_module() {
        let span = Span { lo: 0x555555554000, hi: 0x555555559000 };
        let c = candidates(&maps(), span, 0x10000, REACH);
        assert_eq!(c[0], 0x555555554000 - 0x10000);
        assert!(c.iter().all(|&a| reaches(span, a, 0x10000, REACH)));
    }

    #[test]
    fn arena_keeps_clear_of_heap_growth() {
        let span = Span { lo: 0x555555554000, hi: 0x555555559000 };
        let c = candidates(&maps(), span, 0x10000, REACH);
        let above: Vec<_> = c.iter().filter(|&&a| a > span.hi).collect();
        assert!(above.iter().all(|&&a| a >= 0x55555557a000 + GROWTH_ROOM), "{above:x?}");
    }

    #[test]
    fn libraries_get_arenas_within_reach() {
        let span = Span { lo: 0x7ffff7d80000, hi: 0x7ffff7f80000 };
        let c = candidates(&maps(), span, 0x10000, REACH);
        assert_eq!(c[0], 0x7ffff7d80000 - 0x10000);
        // None lands in the stack's growth room (on AArch64 hosts, user space
        // and so the gaps extend above this x86-64 stack).
        let stack = 0x7ffffffde000..0x7ffffffff000;
        assert!(c.iter().all(|&a| a + 0x10000 <= stack.start - GROWTH_ROOM || a >= stack.end || a < span.lo));
    }

    #[test]
    fn a_hole_between_the_modules_segments_comes_first() {
        let maps = parse(
            "400000-470000 r-xp 00000000 fd:01 1 /t/static\n\
             490000-4a0000 rw-p 00080000 fd:01 1 /t/static\n\
             4a0000-4c0000 rw-p 00000000 00:00 0 [heap]\n",
        );
        let span = Span { lo: 0x400000, hi: 0x4a0000 };
        let c = candidates(&maps, span, 0x10000, (128 << 20) - 4);
        assert_eq!(c[0], 0x480000);
        assert_eq!(c[1], 0x400000 - 0x10000);
    }

    #[test]
    fn nothing_within_reach_gives_no_candidate() {
        let span = Span { lo: 0x555555554000, hi: 0x555555559000 };
        assert!(candidates(&maps(), span, 0x10000, 0x1000).is_empty());
    }
}
