//! A perf map as a traced process could write it (`/tmp/perf-PID.map`):
//! split into lines in chunks of a size the input chooses, each parsed
//! and kept ([`tp::symbols::perf_map`]), then looked up. Any panic, a kept
//! range that is empty or past the address space, or a split that depends
//! on the chunks is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::symbols::perf_map::{JitNames, Lines, parse_line};

/// The lines of `data` fed in chunks of `size`, parsed.
fn entries(data: &[u8], size: usize) -> Vec<tp::symbols::perf_map::Entry> {
    let mut lines = Lines::default();
    let mut out = Vec::new();
    for chunk in data.chunks(size) {
        lines.feed(chunk, |l| out.extend(parse_line(l)));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, data)) = data.split_first() else { return };
    let got = entries(data, usize::from(size) + 1);
    assert_eq!(got, entries(data, data.len().max(1)));
    let mut names = JitNames::default();
    for e in got {
        assert!(e.size > 0 && e.start.checked_add(e.size).is_some() && !e.name.is_empty());
        let (start, end) = (e.start, e.start + e.size);
        names.insert(e);
        assert_eq!(names.lookup(start).map(|(_, s)| s), Some(start));
        assert_eq!(names.lookup(end - 1).map(|(_, s)| s), Some(start));
    }
});
