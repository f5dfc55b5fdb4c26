//! `/proc/PID/maps` as data: one [`Mapping`] per line, and the free gaps
//! between mappings where tp may place its code pages.

use std::fmt;

/// The span of addresses a module occupies (all its mappings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Lowest address.
    pub lo: u64,
    /// One past the highest address.
    pub hi: u64,
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
    /// Shared (as opposed to private copy-on-write).
    pub shared: bool,
    /// Offset of `start` in the mapped file.
    pub offset: u64,
    /// Device of the mapped file, as `st_dev` encodes it (0 for anonymous memory).
    pub dev: u64,
    /// Inode of the mapped file (0 for anonymous memory).
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`, `/memfd:x (deleted)`); empty if anonymous.
    pub path: String,
}

impl Mapping {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True when the mapping has no bytes (never the case for the kernel's output).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// True when `addr` lies inside the mapping.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

impl fmt::Display for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:x}-{:x} {}{}{}{} {}",
            self.start,
            self.end,
            if self.read { 'r' } else { '-' },
            if self.write { 'w' } else { '-' },
            if self.exec { 'x' } else { '-' },
            if self.shared { 's' } else { 'p' },
            self.path
        )
    }
}

/// True if anonymous private read-write memory covers `[lo, hi)` in
/// `maps` (sorted, as the kernel writes them), however the kernel split
/// or merged its mappings: memory tp mapped for itself, not a file's.
pub fn anonymous_covers(maps: &[Mapping], lo: u64, hi: u64) -> bool {
    let mut covered = lo;
    for m in maps.iter().filter(|m| m.inode == 0 && m.path.is_empty() && !m.shared && m.read && m.write) {
        if m.start <= covered && covered < m.end {
            covered = m.end;
        }
    }
    covered >= hi
}

/// Parses the whole text of a maps file. Lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// Parses one maps line:
/// `55d0c0a4e000-55d0c0a50000 r--p 00000000 fd:01 1234   /usr/bin/cat`.
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || -> Option<&str> {
        let trimmed = rest.trim_start_matches(' ');
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = field()?;
    let perms = field()?.as_bytes();
    let offset = field()?;
    let dev = field()?;
    let inode = field()?;
    // The path is the rest of the line after the padding; it may contain spaces.
    let path = rest.trim_start_matches(' ').to_string();
    let (start, end) = range.split_once('-')?;
    if perms.len() < 4 {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        shared: perms[3] == b's',
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: {
            let (major, minor) = dev.split_once(':')?;
            libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?)
        },
        inode: inode.parse().ok()?,
        path,
    })
}

/// A free range of the address space between two mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// First free address.
    pub start: u64,
    /// One past the last free address.
    pub end: u64,
    /// The gap ends where the stack (which grows down into it) begins.
    pub below_stack: bool,
    /// The gap begins where the heap (which grows up into it) ends.
    pub above_heap: bool,
}

/// The lowest address user mappings may use (vm.mmap_min_addr is 64 KiB by default).
pub const MIN_ADDR: u64 = 0x10000;
/// One past the highest user address of the host architecture.
pub const MAX_ADDR: u64 = crate::arch::USER_END;

/// The free gaps between sorted mappings, within [`MIN_ADDR`, `MAX_ADDR`).
pub fn gaps(maps: &[Mapping]) -> Vec<Gap> {
    let mut sorted: Vec<&Mapping> = maps.iter().filter(|m| m.start < MAX_ADDR).collect();
    sorted.sort_by_key(|m| m.start);
    let mut out = Vec::new();
    let mut cursor = MIN_ADDR;
    let mut prev_heap = false;
    for m in sorted {
        if m.start > cursor {
            out.push(Gap { start: cursor, end: m.start, below_stack: m.path == "[stack]", above_heap: prev_heap });
        }
        cursor = cursor.max(m.end);
        prev_heap = m.path == "[heap]";
    }
    if cursor < MAX_ADDR {
        out.push(Gap { start: cursor, end: MAX_ADDR, below_stack: false, above_heap: prev_heap });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
00400000-00401000 r--p 00000000 fd:01 2361                               /work/t/counter-nopie
00401000-00402000 r-xp 00001000 fd:01 2361                               /work/t/counter-nopie
01b6f000-01b90000 rw-p 00000000 00:00 0                                  [heap]
7f2a1c000000-7f2a1c021000 rw-s 00000000 00:01 1043                       /memfd:tp-data (deleted)
7f2a1c400000-7f2a1c428000 r--p 00000000 fd:01 5550                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a1c600000-7f2a1c601000 r-xp 00000000 00:00 0 
7ffd5e4a0000-7ffd5e4c1000 rw-p 00000000 00:00 0                          [stack]
7ffd5e5f2000-7ffd5e5f4000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_every_field() {
        let maps = parse(SAMPLE);
        assert_eq!(maps.len(), 9);
        let text = &maps[1];
        assert_eq!((text.start, text.end, text.offset, text.inode), (0x401000, 0x402000, 0x1000, 2361));
        assert_eq!(text.dev, libc::makedev(0xfd, 0x01));
        assert!(text.read && !text.write && text.exec && !text.shared);
        assert_eq!(text.path, "/work/t/counter-nopie");
        assert!(maps[3].shared);
        assert_eq!(maps[3].path, "/memfd:tp-data (deleted)");
        assert_eq!(maps[5].path, "", "anonymous mapping has no path");
        assert_eq!(maps[8].start, 0xffffffffff600000);
    }

    #[test]
    fn keeps_spaces_inside_paths() {
        let m = parse_line("7f00-8f00 r-xp 00000000 fd:01 7  /tmp/a  b/lib x.so").unwrap();
        assert_eq!(m.path, "/tmp/a  b/lib x.so");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_line("").is_none());
        assert!(parse_line("zz-yy r-xp 0 0 0").is_none());
        assert!(parse_line("1000-2000 r").is_none());
    }

    #[test]
    fn gaps_mark_heap_and_stack_neighbours() {
        let g = gaps(&parse(SAMPLE));
        assert_eq!(g[0], Gap { start: MIN_ADDR, end: 0x400000, below_stack: false, above_heap: false });
        let after_heap = g.iter().find(|g| g.start == 0x1b90000).unwrap();
        assert!(after_heap.above_heap && !after_heap.below_stack);
        let before_stack = g.iter().find(|g| g.end == 0x7ffd5e4a0000).unwrap();
        assert!(before_stack.below_stack);
        // vsyscall lies above MAX_ADDR and does not create a gap or end one.
        assert_eq!(g.last().unwrap().end, MAX_ADDR);
    }
}
