//! Names of JIT code from a perf map (`/tmp/perf-PID.map`, which node
//! writes with `--perf-basic-prof` and a JVM with `jcmd PID
//! Compiler.perfmap`): its text lines `START SIZE NAME` (START and SIZE in
//! hex, with or without `0x`, NAME to the end of the line) split from
//! chunks as they are read ([`Lines`]), parsed ([`parse_line`]) and kept
//! as address ranges ([`JitNames`]), where a later entry replaces every
//! earlier one it overlaps (code moved, or its memory reused). The process
//! writes the file: every line is untrusted, bounded in length, and a
//! malformed one is skipped, never a panic. Reading the file is
//! [`super::perf_map_file`]'s.

use std::collections::BTreeMap;

/// The longest line kept; a longer one is skipped whole.
pub const MAX_LINE: usize = 4096;

/// The most ranges kept; lines past them are skipped.
pub const MAX_ENTRIES: usize = 1 << 20;

/// One line of a perf map: `[start, start + size)` is `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// First address.
    pub start: u64,
    /// Size in bytes (not zero).
    pub size: u64,
    /// The name, as the process wrote it (not escaped; invalid UTF-8 replaced).
    pub name: String,
}

/// A hex number as perf maps write them, with or without `0x`.
fn hex(word: &str) -> Option<u64> {
    let digits = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")).unwrap_or(word);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// The entry on one line (without its line break); None for a malformed
/// line: a field missing or not hex, an empty range or one past the end
/// of the address space, no name, or longer than [`MAX_LINE`].
pub fn parse_line(line: &[u8]) -> Option<Entry> {
    if line.len() > MAX_LINE {
        return None;
    }
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\r', ' ', '\t']);
    let mut rest = text.trim_start_matches([' ', '\t']);
    let mut field = || {
        let end = rest.find([' ', '\t'])?;
        let word = &rest[..end];
        rest = rest[end..].trim_start_matches([' ', '\t']);
        Some(word)
    };
    let start = hex(field()?)?;
    let size = hex(field()?)?;
    if size == 0 || start.checked_add(size).is_none() || rest.is_empty() {
        return None;
    }
    Some(Entry { start, size, name: rest.to_string() })
}

/// Splits bytes read in chunks into lines, keeping a line cut by the end
/// of a chunk for the next; a line longer than [`MAX_LINE`] is dropped up
/// to its end.
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
    /// Inside a line too long to keep: drop bytes up to its end.
    skipping: bool,
}

impl Lines {
    /// Feeds `chunk`; calls `each` with every line it completes (without
    /// its line break).
    pub fn feed(&mut self, mut chunk: &[u8], mut each: impl FnMut(&[u8])) {
        while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = (&chunk[..nl], &chunk[nl + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.partial.is_empty() {
                if line.len() <= MAX_LINE {
                    each(line);
                }
            } else if self.partial.len() + line.len() <= MAX_LINE {
                self.partial.extend_from_slice(line);
                each(&std::mem::take(&mut self.partial));
            } else {
                self.partial.clear();
            }
            chunk = rest;
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + chunk.len() > MAX_LINE {
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }
}

/// Address ranges and their names, none overlapping another.
#[derive(Debug, Default)]
pub struct JitNames {
    /// By first address: one past the last address, and the name.
    ranges: BTreeMap<u64, (u64, Box<str>)>,
}

impl JitNames {
    /// Adds `e`, replacing every range it overlaps; false (and nothing
    /// added) once [`MAX_ENTRIES`] are kept.
    pub fn insert(&mut self, e: Entry) -> bool {
        let end = e.start.saturating_add(e.size);
        while let Some((&start, &(last_end, _))) = self.ranges.range(..end).next_back() {
            if last_end <= e.start {
                break;
            }
            self.ranges.remove(&start);
        }
        if self.ranges.len() >= MAX_ENTRIES {
            return false;
        }
        self.ranges.insert(e.start, (end, e.name.into_boxed_str()));
        true
    }

    /// The name of the range holding `addr`, and that range's first address.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let (&start, (end, name)) = self.ranges.range(..=addr).next_back()?;
        (addr < *end).then_some((name, start))
    }

    /// How many ranges are kept.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// True when no range is kept.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, size: u64, name: &str) -> Entry {
        Entry { start, size, name: name.into() }
    }

    #[test]
    fn lines_of_node_and_the_jvm_parse() {
        assert_eq!(
            parse_line(b"7f505301dd00 af0 JS:*hashLoop /tmp/pm/hash.js:3:18"),
            Some(entry(0x7f505301dd00, 0xaf0, "JS:*hashLoop /tmp/pm/hash.js:3:18"))
        );
        assert_eq!(
            parse_line(b"0x00007f3c9c0a1a40 0x0000000000000160 void java.lang.Object.<init>()\r"),
            Some(entry(0x7f3c9c0a1a40, 0x160, "void java.lang.Object.<init>()"))
        );
        assert_eq!(parse_line(b"  10\t20   a  b  "), Some(entry(0x10, 0x20, "a  b")));
    }

    #[test]
    fn malformed_lines_are_none() {
        for line in [
            &b""[..],
            b"10",
            b"10 20",
            b"10 20 ",
            b"xyz 20 a",
            b"10 0x a",
            b"10 0 zero-size",
            b"ffffffffffffffff 2 past the end",
            b"11111111111111111 1 seventeen digits",
            b"-1 2 a",
            b"+1 2 a",
            b"0x 1 a",
        ] {
            assert_eq!(parse_line(line), None, "{}", String::from_utf8_lossy(line));
        }
        let long = format!("10 20 {}", "n".repeat(MAX_LINE));
        assert_eq!(parse_line(long.as_bytes()), None);
    }

    #[test]
    fn names_keep_what_the_process_wrote_for_the_output_to_escape() {
        let e = parse_line(b"10 20 \x1b]0;owned\x07\xff").unwrap();
        assert_eq!(e.name, "\x1b]0;owned\x07\u{fffd}");
    }

    /// All lines of `data` fed in chunks of `size`.
    fn split(data: &[u8], size: usize) -> Vec<Vec<u8>> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for chunk in data.chunks(size.max(1)) {
            lines.feed(chunk, |l| out.push(l.to_vec()));
        }
        out
    }

    #[test]
    fn lines_cut_by_chunks_are_whole_and_long_ones_are_dropped() {
        let long = vec![b'x'; MAX_LINE + 1];
        let mut data = b"a 1 one\nb 2 two\n".to_vec();
        data.extend_from_slice(&long);
        data.extend_from_slice(b"\nc 3 three\nunfinished");
        for size in [1, 2, 3, 7, 100, MAX_LINE, data.len()] {
            assert_eq!(split(&data, size), [&b"a 1 one"[..], b"b 2 two", b"c 3 three"], "chunks of {size}");
        }
    }

    #[test]
    fn later_entries_replace_the_ranges_they_overlap() {
        let mut names = JitNames::default();
        names.insert(entry(0x1000, 0x100, "old"));
        names.insert(entry(0x1100, 0x100, "next"));
        names.insert(entry(0x2000, 0x10, "far"));
        assert_eq!(names.lookup(0x10ff), Some(("old", 0x1000)));
        assert_eq!(names.lookup(0x1100), Some(("next", 0x1100)));
        assert_eq!(names.lookup(0x1200), None);
        assert_eq!(names.lookup(0xfff), None);
        names.insert(entry(0x10f0, 0x20, "new"));
        assert_eq!((names.lookup(0x1000), names.lookup(0x1100)), (None, Some(("new", 0x10f0))));
        assert_eq!(names.lookup(0x2005), Some(("far", 0x2000)));
        names.insert(entry(0, u64::MAX, "everything"));
        assert_eq!((names.len(), names.lookup(0x2005)), (1, Some(("everything", 0))));
    }

    /// A small deterministic generator (xorshift), for garbage.
    struct Garbage(u64);

    impl Garbage {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Bytes that look like perf map lines often and like anything else otherwise.
        fn bytes(&mut self, len: usize) -> Vec<u8> {
            const PIECES: [&[u8]; 12] =
                [b" ", b"\n", b"\t", b"0x", b"ff", b"7f5053", b"0", b"JS:*f", b"\r\n", b"\xff\xfe", b"\x1b[2J", b"-"];
            let mut out = Vec::with_capacity(len);
            while out.len() < len {
                let r = self.next();
                if r % 4 == 1 {
                    // A good line, then maybe a byte of it changed.
                    let (start, size) = (self.next() >> (r % 64), self.next() % 0x1000);
                    let mut line = format!("{start:x} {size:x} f{}\n", r % 100).into_bytes();
                    if r % 8 == 1 {
                        let at = (self.next() as usize) % line.len();
                        line[at] = self.next() as u8;
                    }
                    out.extend_from_slice(&line);
                } else if r.is_multiple_of(3) {
                    out.push((r >> 8) as u8);
                } else {
                    out.extend_from_slice(PIECES[(r >> 8) as usize % PIECES.len()]);
                }
            }
            out
        }
    }

    #[test]
    fn garbage_never_panics_and_every_kept_range_is_sound() {
        let mut g = Garbage(0x9e37_79b9_7f4a_7c15);
        let mut parsed = 0;
        for round in 0..2000 {
            let len = (g.next() % 600) as usize;
            let data = g.bytes(len);
            let chunk = 1 + (g.next() % 64) as usize;
            let mut names = JitNames::default();
            let mut lines = Lines::default();
            for c in data.chunks(chunk) {
                lines.feed(c, |l| {
                    if let Some(e) = parse_line(l) {
                        assert!(e.size > 0 && e.start.checked_add(e.size).is_some() && !e.name.is_empty());
                        assert!(!e.name.contains('\n'), "round {round}");
                        names.insert(e);
                        parsed += 1;
                    }
                });
            }
            let probe = g.next();
            if let Some((_, start)) = names.lookup(probe) {
                assert!(start <= probe);
            }
            // The whole input at once splits into the same lines.
            assert_eq!(split(&data, chunk), split(&data, data.len()), "round {round}");
        }
        assert!(parsed > 100, "the garbage should hold some lines that parse: {parsed}");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut names = JitNames::default();
        for i in 0..MAX_ENTRIES as u64 {
            assert!(names.insert(entry(i * 2, 1, "f")));
        }
        assert!(!names.insert(entry(u64::MAX - 10, 1, "one too many")));
        // One that replaces others still goes in.
        assert!(names.insert(entry(0, 4, "g")));
        assert_eq!(names.lookup(2), Some(("g", 0)));
    }
}
