//! Placing code arenas: where in the target's address space a detour page
//! may go so that every probe site of a module reaches it with one branch,
//! how large it is, mapping it with the stopped worker, and choosing the
//! long form of a probe when no arena can be placed within branch reach.

use anyhow::{Result, bail};

use super::Request;
use super::layout::{Arena, kind};
use super::region::Region;
use crate::arch::{Arch, Host};
use crate::process::maps::{Gap, Mapping, Span, gaps};
use crate::process::remote::RemoteCaller;

/// Room left for the stack to grow down into, and the heap up into.
const GROWTH_ROOM: u64 = 256 << 20;
const PAGE: u64 = 4096;
/// How far above a module's end an arena starts where the gap allows. The
/// page-rounded end of a module is a number programs keep (the dynamic
/// loader computes it for every segment it maps), and one left on a stack
/// would point at the first byte of an arena placed right there, which
/// keeps tp's memory at the detach (`remove::check_unused`); in a program
/// mapped low (not position-independent), small integers a stack holds
/// lie near there too.
const PAST_THE_END: u64 = PAGE;
/// Where small numbers end, for placing arenas: a stack word below this is
/// likelier a count, a size or an offset than an address. An arena placed
/// among them (a program mapped low, not position-independent, gets its
/// arena right after its end, near 4 MiB) would be named by any such number
/// a stack happens to hold, which keeps tp's memory at the detach
/// (`remove::check_unused`); so every candidate at or above it comes before
/// any below it, where branch reach allows one (x86-64's reaches 2 GiB from
/// a program at 4 MiB, AArch64's 128 MiB).
pub const SMALL_NUMBERS: u64 = 64 << 20;
/// The smallest code arena tp maps.
pub const MIN_ARENA: u64 = 64 << 10;
/// A typical detour's size, for sizing arenas: a counting detour, and one
/// that also calls the runtime. Placement checks the real size. (An x86-64
/// counting detour of a window that leaves nothing dead is about 210
/// bytes: its count in the thread's row, the paired entry and the call of
/// the count stub out of line, five literals.)
pub const DETOUR_BUDGET: u64 = 224;
/// The budget of a detour that calls the runtime.
pub const EVENT_DETOUR_BUDGET: u64 = 320;

/// True if every address of `[a, a + size)` is within `reach` of every
/// address of `span`, both ways.
pub fn reaches(span: Span, a: u64, size: u64, reach: u64) -> bool {
    let far_end = (a + size).max(span.hi) - a.min(span.lo);
    far_end <= reach
}

/// Candidate addresses for an arena of `size` bytes near `span`: a hole
/// between the module's own mappings first, then those clear of small
/// numbers ([`SMALL_NUMBERS`]), then the others, each nearest first.
pub fn candidates(maps: &[Mapping], span: Span, size: u64, reach: u64) -> Vec<u64> {
    let size = size.next_multiple_of(PAGE);
    let mut out: Vec<u64> = gaps(maps).iter().flat_map(|g| place_in(g, span, size)).collect();
    out.retain(|&a| reaches(span, a, size, reach));
    // A gap between the module's own mappings (AArch64 linkers align
    // segments to 64 KiB and leave holes) is at distance 0.
    let distance = |a: u64| if a < span.lo { span.lo - a } else { a.saturating_sub(span.hi) };
    out.sort_by_key(|&a| {
        let inside = a >= span.lo && a < span.hi;
        (!inside, !inside && a < SMALL_NUMBERS, distance(a))
    });
    out.dedup();
    out
}

/// The best spots for the arena in one gap: as close to the module as the
/// gap allows, but not where the stack or the heap will want to grow, and
/// a page past the module's end ([`PAST_THE_END`]); and, where that one is
/// among small numbers and the gap goes past them, the closest spot clear
/// of them ([`SMALL_NUMBERS`]).
fn place_in(g: &Gap, span: Span, size: u64) -> Vec<u64> {
    let lo = g.start.next_multiple_of(PAGE) + if g.above_heap { GROWTH_ROOM } else { 0 };
    let Some(hi) = (g.end & !(PAGE - 1)).checked_sub(if g.below_stack { GROWTH_ROOM } else { 0 }) else {
        return Vec::new();
    };
    if hi < lo || hi - lo < size {
        return Vec::new();
    }
    // Below the module: the top of the gap; above it: the bottom.
    let nearest = if hi <= span.lo { hi - size } else { lo.max((span.hi + PAST_THE_END).min(hi - size)) };
    // A page past the bound itself: 64 MiB is a size programs keep too
    // (glibc's largest heap of a malloc arena), and one on a stack would
    // name the arena's first byte.
    let clear = nearest.max(SMALL_NUMBERS + PAST_THE_END);
    match nearest < SMALL_NUMBERS && clear <= hi - size {
        true => vec![nearest, clear],
        false => vec![nearest],
    }
}

/// The size of a new arena for `probes` detours of `kind`.
pub fn arena_size(probes: usize, kind: u32) -> u64 {
    let each = if kind == kind::COUNT { DETOUR_BUDGET } else { EVENT_DETOUR_BUDGET };
    (probes as u64 * each).max(MIN_ARENA).next_multiple_of(4096)
}

/// True if the request was switched to the long form of its probe.
pub fn is_long(req: &Request) -> bool {
    req.long.as_ref().is_ok_and(|long| *long == req.plan)
}

/// How far from its module a request's detour may be: the patch's reach.
pub fn reach_of(req: &Request) -> u64 {
    if is_long(req) { Host::LONG_REACH } else { Host::BRANCH_REACH }
}

/// Switches each request whose module has no room for an arena within
/// branch reach, in the region's arenas or in the address space, to the
/// long form of its probe ([`crate::arch::Arch::plan_long`]), or
/// refuses it with the reason it has none.
pub fn choose_forms(maps: &[Mapping], region: Option<&Region>, requests: Vec<Request>) -> Result<Vec<Request>> {
    let h = region.map(Region::header);
    let arenas = h.as_ref().map_or(&[][..], |h| &h.arenas[..h.arena_count as usize]);
    // Requests of one module share their span: each (span, reach) is looked
    // up once (a probe-all has tens of thousands of requests, few modules).
    let mut known: std::collections::HashMap<(u64, u64, u64), bool> = std::collections::HashMap::new();
    let mut near = |span: Span, reach: u64| {
        *known.entry((span.lo, span.hi, reach)).or_insert_with(|| {
            arenas.iter().any(|a| reaches(span, a.addr, a.size, reach) && a.size - a.used >= DETOUR_BUDGET)
                || !candidates(maps, span, MIN_ARENA, reach).is_empty()
        })
    };
    requests
        .into_iter()
        .map(|req| {
            if Host::LONG_REACH == 0 || is_long(&req) || near(req.span, Host::BRANCH_REACH) {
                return Ok(req);
            }
            match &req.long {
                Ok(long) if near(req.span, Host::LONG_REACH) => Ok(Request { plan: long.clone(), ..req }),
                Ok(_) => {
                    bail!("no free address range within reach of {:#x}-{:#x} for tp's code", req.span.lo, req.span.hi)
                }
                Err(why) => bail!(
                    "cannot probe `{}`: no free address range within branch reach of its module for tp's code, \
                     and the long form of the probe is refused: {why}",
                    req.function.name
                ),
            }
        })
        .collect()
}

/// Maps a fresh R-X arena within `reach` of `span`, trying candidate holes nearest first.
pub fn alloc_arena(caller: &mut RemoteCaller, maps: &[Mapping], span: Span, reach: u64, size: u64) -> Result<Arena> {
    let sc = Host::SYSCALLS;
    let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    for addr in candidates(maps, span, size, reach).into_iter().take(8) {
        // Never map what cannot be unmapped again.
        caller.check(sc.munmap, [addr, size, 0, 0, 0, 0])?;
        let got = caller.syscall(sc.mmap, [addr, size, prot, flags, u64::MAX, 0])?;
        if got as u64 == addr {
            return Ok(Arena { addr, size, used: 0, runtime: 0 });
        }
        if got >= 0 {
            // An old kernel without MAP_FIXED_NOREPLACE treats it as a hint: undo.
            caller.syscall(sc.munmap, [got as u64, size, 0, 0, 0, 0])?;
            continue;
        }
        // Taken meanwhile (EEXIST), or no room: the next candidate. Anything
        // else (EPERM, EACCES) is the answer, not a reason to try elsewhere.
        let errno = -got as i32;
        if errno != libc::EEXIST && errno != libc::ENOMEM {
            bail!("mapping tp's code arena in the target failed: {}", std::io::Error::from_raw_os_error(errno));
        }
    }
    bail!("no free address range within branch reach of {:#x}-{:#x} for tp's code", span.lo, span.hi)
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

    /// A program that is not position-independent (`NOPIE_SPAN`), its heap
    /// far above, and the mappings of `more` (lines of /proc/PID/maps).
    fn nopie_maps(more: &str) -> Vec<Mapping> {
        parse(&format!(
            "400000-401000 r--p 00000000 fd:01 1 /t/nopie\n\
             401000-402000 r-xp 00001000 fd:01 1 /t/nopie\n\
             404000-405000 rw-p 00003000 fd:01 1 /t/nopie\n\
             3d3be000-3d3df000 rw-p 00000000 00:00 0 [heap]\n{more}"
        ))
    }

    const NOPIE_SPAN: Span = Span { lo: 0x400000, hi: 0x405000 };

    #[test]
    fn an_arena_above_a_module_leaves_a_page_after_its_end() {
        let span = NOPIE_SPAN;
        let c = candidates(&nopie_maps(""), span, 0x10000, REACH);
        // Clear of small numbers first (in this gap, and above the heap's
        // growth room, a page past the bound), then right after the module.
        assert_eq!(c[0], SMALL_NUMBERS + PAST_THE_END);
        let after = c.iter().position(|&a| a == 0x406000).expect("right after the module");
        assert!(c[..after].iter().all(|&a| a >= SMALL_NUMBERS), "{c:x?}");
        // A gap just large enough takes the arena right after the module,
        // where nothing clear of small numbers is within reach.
        let tight = parse(
            "400000-405000 r-xp 00000000 fd:01 1 /t/nopie\n\
             415000-416000 rw-p 00000000 00:00 0\n\
             416000-7ffff000000 rw-p 00000000 00:00 0\n",
        );
        let c = candidates(&tight, span, 0x10000, REACH);
        assert_eq!(c[0], 0x405000);
    }

    #[test]
    fn arenas_keep_clear_of_small_numbers_where_reach_allows() {
        // AArch64 reaches 128 MiB from a program mapped at 4 MiB: clear of
        // small numbers, the nearest spot above 64 MiB; with the gap taken
        // past reach, nothing clear is within it: right after the module.
        let span = NOPIE_SPAN;
        let c = candidates(&nopie_maps(""), span, 0x10000, (128 << 20) - 4);
        assert_eq!(c[0], SMALL_NUMBERS + PAST_THE_END);
        let taken = nopie_maps("3ff0000-8500000 rw-p 00000000 00:00 0\n");
        let c = candidates(&taken, span, 0x10000, (128 << 20) - 4);
        assert_eq!(c[0], 0x406000);
        assert!(c.iter().all(|&a| a < SMALL_NUMBERS));
    }

    #[test]
    fn nothing_within_reach_gives_no_candidate() {
        let span = Span { lo: 0x555555554000, hi: 0x555555559000 };
        assert!(candidates(&maps(), span, 0x10000, 0x1000).is_empty());
    }
}
