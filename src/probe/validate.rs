//! What tp accepts from a data region.
//!
//! A region lives in the target's memory, and the target can write every
//! byte of it, or map a memfd of its own under tp's name: nothing read from
//! it is trusted. [`header`] and [`entry`] accept only what tp itself
//! writes: the geometry [`layout::geometry`] gives for a capacity and ring
//! length tp would choose, code arenas of the sizes tp maps inside the user
//! address space, entries whose windows, detours and strings fit what tp
//! records. Anything else is a one-line reason; a region that fails is
//! never used (see [`super::region::Region::open`]).
//!
//! A region passes once, but the target can change it afterwards. So the
//! region keeps the header it validated and [`sanitize`] rebuilds every
//! later read of the header from it: the fields tp never changes come from
//! the validated copy; the ones that do change (counts, arenas, the
//! runtime's bookkeeping) are clamped or dropped. An entry that stops
//! passing [`entry`] is skipped ([`super::region::Region::entries`]).
//! Memory tp spends on a region is bounded by what it would have created:
//! at most [`layout::MAX_CAPACITY`] entries, rings of at most
//! [`layout::MAX_RING_LEN`] events.

use super::layout::{self, Arena, Entry, Header, kind};
use crate::arch::{Arch, Host, USER_END};

/// The largest code arena tp maps: a detour budget for every probe of a
/// full region and the runtime, with room to spare.
pub const MAX_ARENA: u64 = 64 << 20;
/// The largest PID Linux hands out (PID_MAX_LIMIT).
const PID_MAX: u32 = 1 << 22;
/// Every bit of [`kind`] tp knows.
const KINDS: u32 = kind::COUNT
    | kind::ARGS
    | kind::RET
    | kind::UNWIND
    | kind::SAMPLE
    | kind::STACK
    | kind::FILTER
    | kind::FILTER_EXIT
    | kind::AGGREGATE
    | kind::BY
    | kind::ARGS_MORE
    | kind::AT_EXITS
    | kind::EXIT
    | kind::RENDEZVOUS
    | kind::STEP
    | kind::FIELDS;

/// Checks a header read from a region `len` bytes long. The address it
/// records (`target_addr`) is checked to be a possible one; whether it is
/// the mapping's own address is for the caller (a tracer maps the region
/// elsewhere).
pub fn header(h: &Header, len: u64) -> Result<(), String> {
    if h.magic != layout::MAGIC {
        return Err("not a tp data region (bad magic)".into());
    }
    if h.version != layout::VERSION {
        return Err(format!(
            "tp data region has layout version {}, this tp reads version {}; use the tp that attached",
            h.version,
            layout::VERSION
        ));
    }
    let corrupt = |what: String| Err(format!("tp's data region is corrupt: {what}"));
    if h.machine != Host::ELF_MACHINE as u32 {
        return corrupt(format!("ELF machine {} (this tp writes {})", h.machine, Host::ELF_MACHINE));
    }
    let (min, max) = (layout::MIN_CAPACITY, layout::MAX_CAPACITY);
    if !h.capacity.is_power_of_two() || h.capacity < min || h.capacity > max {
        return corrupt(format!("capacity {} (tp makes a power of two from {min} to {max})", h.capacity));
    }
    if h.count > h.capacity {
        return corrupt(format!("{} entries in use, capacity {}", h.count, h.capacity));
    }
    let ring_len = h.ctx.ring_mask.wrapping_add(1);
    if !ring_len.is_power_of_two() || !(4..=layout::MAX_RING_LEN).contains(&ring_len) {
        return corrupt(format!(
            "ring mask {:#x} (tp makes rings of 4 to {} events)",
            h.ctx.ring_mask,
            layout::MAX_RING_LEN
        ));
    }
    let g = layout::geometry(h.capacity, ring_len);
    let sizes_fit = (h.probes_off, h.flags_off, h.budgets_off, h.periods_off, h.configs_off)
        == (g.probes_off, g.flags_off, g.budgets_off, g.periods_off, g.configs_off)
        && h.ctx.agg_off == layout::agg_off_in_slot(g.ring_len)
        && (h.counters_off, h.countdowns_off, h.events_off) == (g.counters_off, g.countdowns_off, g.events_off)
        && (h.stride_shift, h.total_size, h.slot_bits) == (g.stride_shift, g.total_size, layout::SLOT_BITS)
        && (h.ctx.slot_size, h.ctx.slot_bits, h.ctx.shadow_len)
            == (g.slot_size, layout::EVENT_SLOT_BITS, layout::SHADOW_LEN)
        && h.ctx.countdowns_from_counters == g.countdowns_off - g.counters_off;
    if !sizes_fit {
        return corrupt("inconsistent sizes".into());
    }
    if h.total_size > len {
        return corrupt(format!("it says it is {} bytes, its mapping has {len}", h.total_size));
    }
    let at = h.target_addr;
    if at == 0 || !at.is_multiple_of(4096) || at.checked_add(h.total_size).is_none_or(|end| end > USER_END) {
        return corrupt(format!("address {at:#x}"));
    }
    let addresses = (h.ctx.slots, h.ctx.flags, h.ctx.budgets, h.ctx.periods, h.ctx.configs)
        == (at + g.events_off, at + g.flags_off, at + g.budgets_off, at + g.periods_off, at + g.configs_off)
        && (h.ctx.counters, h.ctx.stride_shift) == (at + g.counters_off, g.stride_shift);
    if !addresses {
        return corrupt("the runtime's addresses are not the region's".into());
    }
    let p = layout::private_geometry();
    let private_ok = h.ctx.private >= crate::process::maps::MIN_ADDR
        && h.ctx.private.is_multiple_of(4096)
        && h.ctx.private.checked_add(p.size).is_some_and(|end| end <= USER_END)
        && !overlaps(h.ctx.private, p.size, at, h.total_size)
        && h.ctx.thread_size == p.thread_size;
    if !private_ok {
        return corrupt(format!("private area {:#x}", h.ctx.private));
    }
    if h.ctx.key_how > layout::key_how::TCB_REGISTER {
        return corrupt(format!("thread key {}", h.ctx.key_how));
    }
    if h.arena_count as usize > layout::MAX_ARENAS {
        return corrupt(format!("{} code arenas (at most {})", h.arena_count, layout::MAX_ARENAS));
    }
    for (i, a) in h.arenas[..h.arena_count as usize].iter().enumerate() {
        arena(a, h).map_err(|why| format!("tp's data region is corrupt: code arena {i}: {why}"))?;
    }
    Ok(())
}

/// Checks a code arena record of the region `h`.
pub fn arena(a: &Arena, h: &Header) -> Result<(), String> {
    let end = a.addr.checked_add(a.size).filter(|&e| e <= USER_END);
    if a.addr < crate::process::maps::MIN_ADDR || !a.addr.is_multiple_of(4096) || end.is_none() {
        return Err(format!("address {:#x}, size {:#x}", a.addr, a.size));
    }
    // The size is what tp asked mmap for (an arena with a runtime block is
    // not a whole number of pages); the address is page-aligned.
    if a.size == 0 || a.size > MAX_ARENA {
        return Err(format!("size {:#x} (tp maps up to {MAX_ARENA:#x})", a.size));
    }
    if a.used > a.size {
        return Err(format!("{:#x} bytes used of {:#x}", a.used, a.size));
    }
    if a.runtime != 0 && !(a.addr <= a.runtime && a.runtime < a.addr + a.used) {
        return Err(format!("runtime at {:#x} outside it", a.runtime));
    }
    if overlaps(a.addr, a.size, h.target_addr, h.total_size) {
        return Err("it overlaps the region".into());
    }
    if overlaps(a.addr, a.size, h.ctx.private, layout::private_geometry().size) {
        return Err("it overlaps the private area".into());
    }
    Ok(())
}

/// Checks entry `e` of the region `h` (whose header passed [`header`]).
/// Free entries are never used and pass.
pub fn entry(e: &Entry, h: &Header) -> Result<(), String> {
    if e.state == 0 {
        return Ok(());
    }
    if e.state > 4 {
        return Err(format!("state {}", e.state));
    }
    if e.kind & !KINDS != 0 {
        return Err(format!("kind {:#x}", e.kind));
    }
    if e.window_len == 0 || e.window_len as usize > e.original.len() {
        return Err(format!("window length {} (tp writes 1 to {})", e.window_len, e.original.len()));
    }
    if e.owner > PID_MAX {
        return Err(format!("owner {}", e.owner));
    }
    let arenas = &h.arenas[..(h.arena_count as usize).min(layout::MAX_ARENAS)];
    let in_arena = arenas.iter().any(|a| {
        a.addr <= e.detour && e.detour.checked_add(e.detour_len as u64).is_some_and(|end| end <= a.addr + a.used)
    });
    if e.detour_len == 0 || !in_arena {
        return Err(format!("detour {:#x} ({} bytes) is not in a code arena", e.detour, e.detour_len));
    }
    let site_ok = e.site >= crate::process::maps::MIN_ADDR
        && e.site.checked_add(e.window_len as u64).is_some_and(|end| end <= USER_END)
        && !overlaps(e.site, e.window_len as u64, h.target_addr, h.total_size)
        && !arenas.iter().any(|a| overlaps(e.site, e.window_len as u64, a.addr, a.size));
    if !site_ok {
        return Err(format!("site {:#x}", e.site));
    }
    let semaphore_ok = e.semaphore == 0
        || (e.semaphore.is_multiple_of(2)
            && e.semaphore >= crate::process::maps::MIN_ADDR
            && e.semaphore.checked_add(2).is_some_and(|end| end <= USER_END)
            && !overlaps(e.semaphore, 2, h.target_addr, h.total_size)
            && !overlaps(e.semaphore, 2, h.ctx.private, layout::private_geometry().size)
            && !arenas.iter().any(|a| overlaps(e.semaphore, 2, a.addr, a.size)));
    if !semaphore_ok {
        return Err(format!("semaphore {:#x}", e.semaphore));
    }
    // An exit's site names its function's probe, which tp wrote before it.
    let parent_ok = if e.kind & kind::EXIT != 0 { e.parent < h.count.min(h.capacity) } else { e.parent == 0 };
    if !parent_ok {
        return Err(format!("parent {}", e.parent));
    }
    string(&e.name).map_err(|why| format!("function name {why}"))?;
    string(&e.module).map_err(|why| format!("module name {why}"))?;
    Ok(())
}

/// Checks a NUL-terminated UTF-8 string field, as tp writes them.
fn string(b: &[u8]) -> Result<&str, String> {
    let end = b.iter().position(|&c| c == 0).ok_or("is not NUL-terminated")?;
    std::str::from_utf8(&b[..end]).map_err(|_| "is not UTF-8".into())
}

/// A header read after `fixed` was validated: the fields tp never changes
/// come from `fixed`, the others from `live`, clamped to what is possible
/// (the entries in use to the capacity, the arenas to their maximum, each
/// arena that no longer passes [`arena`] dropped to an empty record).
pub fn sanitize(live: &Header, fixed: &Header) -> Header {
    let mut h = *fixed;
    h.count = live.count.min(fixed.capacity);
    h.generation = live.generation;
    h.reserved = live.reserved;
    h.arena_count = live.arena_count.min(layout::MAX_ARENAS as u32);
    for (i, a) in live.arenas.iter().enumerate() {
        h.arenas[i] = if i < h.arena_count as usize && arena(a, fixed).is_ok() { *a } else { Arena::default() };
    }
    h.ctx.tid_offset = live.ctx.tid_offset;
    h.ctx.tid_candidates = live.ctx.tid_candidates;
    h.ctx.lost_no_slot = live.ctx.lost_no_slot;
    h.ctx.claimed = live.ctx.claimed;
    h.ctx.returns_lost = live.ctx.returns_lost;
    h.ctx.lost_too_deep = live.ctx.lost_too_deep;
    h.ctx.lost_no_room = live.ctx.lost_no_room;
    // What only changes the numbers `--agg` of latency reports.
    h.ctx.ns_mult = live.ctx.ns_mult;
    h.ctx.row_owner = live.ctx.row_owner;
    if live.ctx.key_how <= layout::key_how::TCB_REGISTER {
        h.ctx.key_how = live.ctx.key_how;
    }
    // Where the main thread's stack is, and whether threads may check
    // theirs: tp writes them at attach; the runtime only reads them.
    let (lo, hi) = (live.ctx.main_stack_lo, live.ctx.main_stack_hi);
    (h.ctx.main_stack_lo, h.ctx.main_stack_hi) = if lo <= hi && hi <= USER_END { (lo, hi) } else { (0, 0) };
    h.ctx.may_check_memory = live.ctx.may_check_memory.min(1);
    h.ctx.may_take_rows = live.ctx.may_take_rows.min(1);
    h
}

/// True if `[a, a + alen)` and `[b, b + blen)` share a byte.
fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::layout::{DEFAULT_RING_LEN, State, geometry};

    const AT: u64 = 0x7f00_0000_0000;
    const PRIVATE: u64 = 0x7f10_0000_0000;

    fn good() -> (Header, u64) {
        let g = geometry(1, DEFAULT_RING_LEN);
        let mut h = Header::new(&g, Host::ELF_MACHINE as u32, AT, PRIVATE);
        h.arenas[0] = Arena { addr: 0x5555_0000_0000, size: 65536, used: 4096, runtime: 0 };
        h.arena_count = 1;
        h.count = 1;
        (h, g.total_size)
    }

    fn good_entry() -> Entry {
        let mut e = Entry::free();
        e.state = State::Active as u32;
        e.site = 0x5555_1000_0000;
        e.detour = 0x5555_0000_0100;
        e.detour_len = 64;
        e.window_len = 5;
        e.set_name("foo");
        e.set_module("counter");
        e
    }

    fn header_err(f: impl FnOnce(&mut Header)) -> String {
        let (mut h, len) = good();
        f(&mut h);
        header(&h, len).unwrap_err()
    }

    fn entry_err(f: impl FnOnce(&mut Entry)) -> String {
        let (h, _) = good();
        let mut e = good_entry();
        f(&mut e);
        entry(&e, &h).unwrap_err()
    }

    #[test]
    fn what_tp_writes_passes() {
        let (h, len) = good();
        assert_eq!(header(&h, len), Ok(()));
        assert_eq!(entry(&good_entry(), &h), Ok(()));
        assert_eq!(entry(&Entry::free(), &h), Ok(()));
        let big = geometry(layout::MAX_CAPACITY, layout::MAX_RING_LEN);
        assert_eq!(header(&Header::new(&big, Host::ELF_MACHINE as u32, AT, PRIVATE), big.total_size), Ok(()));
    }

    #[test]
    fn headers_tp_never_writes_are_refused() {
        assert!(header_err(|h| h.magic[0] = b'x').contains("magic"));
        assert!(header_err(|h| h.version = 99).contains("version 99"));
        assert!(header_err(|h| h.machine = 3).contains("ELF machine 3"));
        for cap in [0, 3, 1 << 20, 1 << 31, u32::MAX] {
            assert!(header_err(|h| h.capacity = cap).contains(&format!("capacity {cap}")), "{cap}");
        }
        assert!(header_err(|h| h.count = h.capacity + 1).contains("entries in use"));
        for mask in [0, 2, 1000, u32::MAX, (1 << 21) - 1] {
            assert!(header_err(|h| h.ctx.ring_mask = mask).contains("ring mask"), "{mask:#x}");
        }
        assert!(header_err(|h| h.counters_off += 8).contains("inconsistent sizes"));
        assert!(header_err(|h| h.ctx.slot_size *= 2).contains("inconsistent sizes"));
        assert!(header_err(|h| h.ctx.shadow_len = 1 << 30).contains("inconsistent sizes"));
        assert!(header_err(|h| h.target_addr = !4095).contains("address"));
        assert!(header_err(|h| h.ctx.slots = 0x1000).contains("runtime's addresses"));
        assert!(header_err(|h| h.ctx.configs += 8).contains("runtime's addresses"));
        assert!(header_err(|h| h.configs_off += 8).contains("inconsistent sizes"));
        assert!(header_err(|h| h.ctx.agg_off = 0).contains("inconsistent sizes"));
        assert!(header_err(|h| h.arena_count = 65).contains("65 code arenas"));
        assert!(header_err(|h| h.arenas[0].used = h.arenas[0].size + 1).contains("code arena 0"));
        assert!(header_err(|h| h.arenas[0].size = 1 << 40).contains("code arena 0"));
        assert!(header_err(|h| h.arenas[0].size = 0).contains("code arena 0"));
        assert!(header_err(|h| h.arenas[0].addr += 8).contains("code arena 0"));
        let (mut h, len) = good();
        h.arenas[0].size = 65536 + 1234;
        assert_eq!(header(&h, len), Ok(()), "an arena with a runtime block is not whole pages");
        assert!(header_err(|h| h.arenas[0].addr = u64::MAX - 4095).contains("code arena 0"));
        assert!(header_err(|h| h.arenas[0].addr = AT).contains("overlaps the region"));
        assert!(header_err(|h| h.arenas[0].addr = PRIVATE).contains("overlaps the private area"));
        assert!(header_err(|h| h.ctx.private = 0).contains("private area"));
        assert!(header_err(|h| h.ctx.private = AT + 4096).contains("private area"));
        assert!(header_err(|h| h.ctx.private = PRIVATE + 8).contains("private area"));
        assert!(header_err(|h| h.ctx.thread_size = 64).contains("private area"));
        assert!(header_err(|h| h.ctx.key_how = 9).contains("thread key 9"));
        let (h, len) = good();
        assert!(header(&h, len - 1).unwrap_err().contains("its mapping has"));
    }

    #[test]
    fn entries_tp_never_writes_are_refused() {
        assert!(entry_err(|e| e.window_len = 1000).contains("window length 1000"));
        assert!(entry_err(|e| e.window_len = 0).contains("window length 0"));
        assert!(entry_err(|e| e.state = 9).contains("state 9"));
        assert!(entry_err(|e| e.kind = 1 << 30).contains("kind"));
        assert!(entry_err(|e| e.owner = u32::MAX).contains("owner"));
        assert!(entry_err(|e| e.detour = 0x1000).contains("not in a code arena"));
        assert!(entry_err(|e| e.detour_len = 1 << 20).contains("not in a code arena"));
        assert!(entry_err(|e| e.site = u64::MAX - 2).contains("site"));
        assert!(entry_err(|e| e.site = AT + 8).contains("site"));
        assert!(entry_err(|e| e.site = 0x5555_0000_0010).contains("site"));
        assert!(entry_err(|e| e.semaphore = 0x5555_6000_0001).contains("semaphore"), "unaligned");
        assert!(entry_err(|e| e.semaphore = u64::MAX - 1).contains("semaphore"));
        assert!(entry_err(|e| e.semaphore = AT + 8).contains("semaphore"), "inside the region");
        assert!(entry_err(|e| e.name = [b'a'; 96]).contains("function name is not NUL-terminated"));
        assert!(entry_err(|e| e.module[0] = 0xff).contains("module name is not UTF-8"));
    }

    #[test]
    fn a_changed_header_is_rebuilt_from_the_validated_one() {
        let (fixed, _) = good();
        let mut live = fixed;
        live.capacity = u32::MAX;
        live.count = u32::MAX;
        live.stride_shift = 63;
        live.ctx.slot_bits = 63;
        live.ctx.ring_mask = u32::MAX;
        live.arena_count = 1000;
        live.arenas[1] = Arena { addr: 0x1000, size: 0, used: 5, runtime: 0 };
        live.generation = 7;
        live.ctx.main_stack_lo = 0x7ffc_0000_0000;
        live.ctx.main_stack_hi = 0x7ffb_0000_0000;
        live.ctx.may_check_memory = 9;
        let h = sanitize(&live, &fixed);
        assert_eq!((h.ctx.main_stack_lo, h.ctx.main_stack_hi, h.ctx.may_check_memory), (0, 0, 1));
        assert_eq!((h.capacity, h.count, h.stride_shift), (fixed.capacity, fixed.capacity, fixed.stride_shift));
        assert_eq!((h.ctx.slot_bits, h.ctx.ring_mask, h.generation), (fixed.ctx.slot_bits, fixed.ctx.ring_mask, 7));
        assert_eq!(h.arena_count as usize, layout::MAX_ARENAS);
        assert_eq!(h.arenas[0], fixed.arenas[0]);
        assert_eq!(h.arenas[1], Arena::default());
    }
}
