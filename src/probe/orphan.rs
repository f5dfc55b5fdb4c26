//! What a tracer killed while creating or unmapping the data region leaves
//! behind, and its release.
//!
//! The first code arena is mapped, and the memfd's name written into its
//! last 64 bytes, before the memfd exists; the memfd's descriptor is open in
//! the target from memfd_create until tp maps the region and closes it. A
//! detach unmaps the region before the arenas. A tracer killed in between
//! leaves an arena (`r-x`) and maybe a close-on-exec descriptor, and no
//! region that records them. Both are recognised by what tp wrote: an
//! anonymous `r-x` mapping with the name, NUL-terminated, at that spot, and
//! a descriptor of a memfd named `tp-data`. The private area is mapped
//! after the arena and before the memfd, and unmapped after the region: it
//! is recognised by [`layout::PRIVATE_MAGIC`] at the start of its second
//! page. An arena is released only if no thread's PC or stack refers to it,
//! checked with every thread stopped; nothing runs in a private area.

use anyhow::Result;

use super::layout::{self, MEMFD_NAME};
use super::threads;
use crate::arch::{Arch, Host};
use crate::process::Mapping;
use crate::process::memory::Memory;
use crate::process::regset;
use crate::process::remote::RemoteCaller;
use crate::process::stop::Stopped;

/// Where the name sits in an arena: this many bytes before its end.
pub const NAME_FROM_END: u64 = 64;
/// Arenas larger than this are not tp's first arena.
const MAX_FIRST_ARENA: u64 = 1 << 20;

/// tp's memory in a process without a data region.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    /// Code arenas: (address, size).
    pub arenas: Vec<(u64, u64)>,
    /// Open descriptors of a `tp-data` memfd.
    pub fds: Vec<u64>,
    /// Private areas: (address, size).
    pub privates: Vec<(u64, u64)>,
}

impl Orphans {
    /// True if there is nothing to release.
    pub fn is_empty(&self) -> bool {
        self.arenas.is_empty() && self.fds.is_empty() && self.privates.is_empty()
    }
}

/// True if `bytes` (a whole mapping) end like tp's first arena: the
/// memfd's name, then zeros, from [`NAME_FROM_END`] bytes before the end.
pub fn is_first_arena(bytes: &[u8]) -> bool {
    let Some(at) = bytes.len().checked_sub(NAME_FROM_END as usize) else { return false };
    let name = MEMFD_NAME.as_bytes();
    let tail = &bytes[at..];
    tail.starts_with(name) && tail[name.len()..].iter().all(|&b| b == 0)
}

/// Finds tp's orphaned memory in process `pid`, which has no data region.
pub fn find(pid: i32, maps: &[Mapping], mem: &Memory) -> Orphans {
    let arenas = maps
        .iter()
        .filter(|m| m.read && m.exec && !m.write && !m.shared && m.path.is_empty() && m.inode == 0)
        .filter(|m| m.len() >= 4096 && m.len() <= MAX_FIRST_ARENA)
        .filter(|m| {
            let bytes = mem.read_partial(m.start, m.len() as usize);
            bytes.len() as u64 == m.len() && is_first_arena(&bytes)
        })
        .map(|m| (m.start, m.len()))
        .collect();
    let target = format!("/memfd:{MEMFD_NAME} (deleted)");
    let mut fds: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            (link.to_str() == Some(target.as_str())).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect();
    fds.sort();
    // The first pages of a private area are a mapping of their own (their
    // MADV_WIPEONFORK flag sets it apart), and the mark opens the next.
    let privates = maps
        .iter()
        .filter(|m| m.read && m.write && !m.exec && !m.shared && m.path.is_empty() && m.inode == 0)
        .filter(|m| m.len() == layout::PROC_PAGE)
        .filter(|m| super::remove::is_private_area(mem, maps, m.start))
        .map(|m| (m.start, layout::private_geometry().size))
        .collect();
    Orphans { arenas, fds, privates }
}

/// Drops from `orphans` every arena that a thread's PC, or a word of its
/// used stack, points into; every thread must be stopped.
pub fn keep_referenced(stopped: &Stopped, mem: &Memory, maps: &[Mapping], orphans: &mut Orphans) -> Result<()> {
    for t in stopped.threads() {
        let words = threads::pc_and_stack(mem, maps, &regset::get_regs(t.tid)?);
        orphans.arenas.retain(|&(a, size)| !words.iter().any(|&(_, w)| w >= a && w < a + size));
    }
    Ok(())
}

/// Closes the descriptors and unmaps the arenas with the stopped worker.
/// The descriptors were opened by tp and never handed to the program.
pub fn release(stopped: &mut Stopped, mem: &Memory, maps: &[Mapping], orphans: &Orphans) -> Result<()> {
    let mut caller = RemoteCaller::new(stopped, mem, maps)?;
    let sc = Host::SYSCALLS;
    for &fd in &orphans.fds {
        caller.checked("close", sc.close, [fd, 0, 0, 0, 0, 0])?;
    }
    for &(addr, size) in orphans.arenas.iter().chain(&orphans.privates) {
        caller.checked("munmap", sc.munmap, [addr, size, 0, 0, 0, 0])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena_with_name(len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        let at = len - NAME_FROM_END as usize;
        b[at..at + MEMFD_NAME.len()].copy_from_slice(MEMFD_NAME.as_bytes());
        b
    }

    #[test]
    fn recognises_an_arena_by_the_name_at_its_end() {
        assert!(is_first_arena(&arena_with_name(65536)));
        let mut with_detours = arena_with_name(65536);
        with_detours[0] = 0x4c;
        assert!(is_first_arena(&with_detours));
        let mut other = arena_with_name(4096);
        other[4096 - 64 + 7] = b'x'; // "tp-datax"
        assert!(!is_first_arena(&other));
        let mut moved = vec![0; 4096];
        moved[4096 - 65..4096 - 58].copy_from_slice(b"tp-data");
        assert!(!is_first_arena(&moved));
        assert!(!is_first_arena(&[0; 4096]));
        assert!(!is_first_arena(&[0; 10]));
    }
}
