//! Source lines from DWARF's line tables (gimli): where each line of a
//! source file starts in the code, for `--line file.c:123`, `func:LINE`
//! and `tp list-probes --lines`.
//!
//! A line *starts* at a row the compiler marked as a statement (`is_stmt`)
//! whose file and line differ from the row before it in its sequence: the
//! places where execution enters the line. A line the compiler split (a
//! loop's condition, code it duplicated, every copy of an inlined function)
//! starts at several addresses, and each is a probe.
//!
//! The tables come from the target's files (or their debug files): gimli
//! reads them bounded and returns errors, never panics
//! (`tests/fuzz/fuzz_targets/line_table.rs`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use anyhow::Result;
use gimli::{EndianSlice, RunTimeEndian};

use super::ElfFile;
use crate::addr::FileAddr;

type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// Where a line starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineStart {
    /// The address (a file address).
    pub addr: FileAddr,
    /// The source file, as the table names it (directory and name).
    pub file: Rc<str>,
    /// The line.
    pub line: u32,
}

/// What to look for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<'a> {
    /// A file name or the end of its path (`counter.c`, `src/counter.c`).
    pub file: Option<&'a str>,
    /// One line.
    pub line: Option<u32>,
    /// Addresses in `[lo, hi)` only.
    pub range: Option<(u64, u64)>,
}

/// True if `path` is the file `want` names: the same path, or a path
/// ending in `/want`.
pub fn file_matches(path: &str, want: &str) -> bool {
    let want = want.trim_start_matches("./");
    path == want || path.strip_suffix(want).is_some_and(|head| head.ends_with('/'))
}

/// `elf`'s DWARF sections, decompressed as needed (empty where it has none).
fn sections_of(elf: &ElfFile) -> Result<gimli::DwarfSections<Cow<'_, [u8]>>> {
    gimli::DwarfSections::load(|id| -> Result<Cow<[u8]>> {
        Ok(elf.section_data(id.name())?.unwrap_or(Cow::Borrowed(&[][..])))
    })
}

/// Where lines start in the code `elf`'s line tables describe, those
/// `query` asks for, sorted by address.
pub fn starts(elf: &ElfFile, query: Query) -> Result<Vec<LineStart>> {
    let sections = sections_of(elf)?;
    starts_in(&sections.borrow(|s| EndianSlice::new(s, RunTimeEndian::Little)), query)
}

/// [`starts`] over loaded DWARF sections.
pub fn starts_in(dwarf: &gimli::Dwarf<R>, query: Query) -> Result<Vec<LineStart>> {
    let mut out = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let Some(program) = unit.line_program.clone() else { continue };
        let mut names: HashMap<u64, Option<Rc<str>>> = HashMap::new();
        let mut rows = program.rows();
        let mut prev: Option<(u64, u64)> = None;
        while let Some((header, row)) = rows.next_row()? {
            if row.end_sequence() {
                prev = None;
                continue;
            }
            let here = (row.file_index(), row.line().map_or(0, |l| l.get()));
            let starts_line = row.is_stmt() && prev != Some(here);
            prev = Some(here);
            let (file_index, line) = here;
            if !starts_line || line == 0 || line > u32::MAX as u64 {
                continue;
            }
            let addr = row.address();
            if query.line.is_some_and(|l| l as u64 != line)
                || query.range.is_some_and(|(lo, hi)| addr < lo || addr >= hi)
            {
                continue;
            }
            let file = names.entry(file_index).or_insert_with(|| file_name(dwarf, &unit, header, file_index)).clone();
            let Some(file) = file else { continue };
            if query.file.is_some_and(|want| !file_matches(&file, want)) {
                continue;
            }
            out.push(LineStart { addr: FileAddr(addr), file, line: line as u32 });
        }
    }
    out.sort_by_key(|s| (s.addr, s.line));
    out.dedup_by(|a, b| a.addr == b.addr && a.line == b.line && a.file == b.file);
    Ok(out)
}

/// One row of a line table: the line that the code from `addr` on is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRow {
    /// The address (a file address).
    pub addr: FileAddr,
    /// The source file, as the table names it.
    pub file: Rc<str>,
    /// The line.
    pub line: u32,
}

/// The rows of `elf`'s line tables for the code in `[lo, hi)` (file
/// addresses) that name a line, sorted by address: which line each
/// instruction is.
pub fn rows(elf: &ElfFile, lo: u64, hi: u64) -> Result<Vec<LineRow>> {
    let sections = sections_of(elf)?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, RunTimeEndian::Little));
    let mut out = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let Some(program) = unit.line_program.clone() else { continue };
        let mut names: HashMap<u64, Option<Rc<str>>> = HashMap::new();
        let mut rows = program.rows();
        while let Some((header, row)) = rows.next_row()? {
            let line = row.line().map_or(0, |l| l.get());
            let addr = row.address();
            if row.end_sequence() || addr < lo || addr >= hi || line == 0 || line > u32::MAX as u64 {
                continue;
            }
            let index = row.file_index();
            let file = names.entry(index).or_insert_with(|| file_name(&dwarf, &unit, header, index)).clone();
            let Some(file) = file else { continue };
            out.push(LineRow { addr: FileAddr(addr), file, line: line as u32 });
        }
    }
    // Rows at one address: the last says what the code there is.
    out.sort_by_key(|r| r.addr);
    let mut kept: Vec<LineRow> = Vec::with_capacity(out.len());
    for r in out {
        match kept.last_mut() {
            Some(last) if last.addr == r.addr => *last = r,
            _ => kept.push(r),
        }
    }
    Ok(kept)
}

/// The path of file `index` of a line program: its directory joined with
/// its name, unless the name is absolute.
fn file_name(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    header: &gimli::LineProgramHeader<R>,
    index: u64,
) -> Option<Rc<str>> {
    let entry = header.file(index)?;
    let name = dwarf.attr_string(unit, entry.path_name()).ok()?.to_string_lossy().into_owned();
    if name.starts_with('/') {
        return Some(name.into());
    }
    let dir = entry
        .directory(header)
        .and_then(|d| dwarf.attr_string(unit, d).ok())
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    Some(if dir.is_empty() { name.into() } else { format!("{}/{name}", dir.trim_end_matches('/')).into() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn file_names_match_by_their_end() {
        assert!(file_matches("/src/tp/targets/counter.c", "counter.c"));
        assert!(file_matches("/src/tp/targets/counter.c", "targets/counter.c"));
        assert!(file_matches("/src/tp/targets/counter.c", "./counter.c"));
        assert!(file_matches("counter.c", "counter.c"));
        assert!(!file_matches("/src/tp/targets/mycounter.c", "counter.c"));
        assert!(!file_matches("/src/tp/targets/counter.c", "counter"));
    }

    #[test]
    fn lines_of_a_target_start_inside_its_functions() {
        let path = Path::new(env!("TP_TARGETS_DIR")).join("counter");
        let elf = ElfFile::open(&path, &path).unwrap();
        let all = starts(&elf, Query { file: Some("counter.c"), ..Query::default() }).unwrap();
        assert!(all.len() > 20, "{}", all.len());
        assert!(all.iter().all(|s| s.file.ends_with("/counter.c")));
        let bar = elf.functions.iter().find(|f| f.name == "bar").unwrap();
        let (lo, hi) = (bar.addr.0, bar.addr.0 + bar.size);
        let in_bar = starts(&elf, Query { range: Some((lo, hi)), ..Query::default() }).unwrap();
        assert!(!in_bar.is_empty() && in_bar.iter().all(|s| lo <= s.addr.0 && s.addr.0 < hi));
        // Asking for one of them finds it again.
        let one = starts(&elf, Query { file: Some("counter.c"), line: Some(in_bar[0].line), range: None }).unwrap();
        assert!(one.iter().any(|s| s.addr == in_bar[0].addr));
    }
}
