//! DWARF by address: the description of the function entered at one
//! address, read from the compilation unit whose address ranges hold it
//! (`.debug_aranges`, else, for the units it does not list, each unit's
//! own ranges), without reading the rest. A compressed `.debug_info` (as Debian's `-dbg` packages ship it) is
//! inflated only up to the end of that unit; the line, location and macro
//! tables are never read. Probing one function of libc with `--ret` used to
//! inflate and walk all of libc's debugging information.
//!
//! What a unit says is read by the same code as the whole index
//! (`dwarf::unit_functions`), and the first unit (in `.debug_info`
//! order) that describes an address wins, as in the whole index; so the
//! answer is the whole index's wherever each unit's address ranges hold the
//! code it describes, which compilers guarantee.

use std::collections::HashMap;

use anyhow::{Result, bail};
use gimli::{EndianSlice, RunTimeEndian, SectionId};
use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};

use super::dwarf::{self, DwFunction, Foreign, NeedWholeInfo, R, SECTIONS};
use super::elf::ElfFile;
use crate::addr::FileAddr;

/// How much more of a compressed section is inflated at a time.
const STEP: usize = 256 << 10;

/// The most a compressed section may inflate to.
const MAX_INFLATED: usize = 1 << 32;

/// One DWARF section of a file: borrowed from the file's bytes, or
/// inflated as far as it was needed.
#[derive(Default)]
struct Section {
    /// Where its bytes (after the compression header) are in the file.
    raw: std::ops::Range<usize>,
    /// Compressed (zlib), with this many bytes inflated.
    inflated_len: Option<usize>,
    out: Vec<u8>,
    in_pos: usize,
    state: Option<Box<DecompressorOxide>>,
    done: bool,
}

impl Section {
    /// Section `name` of `elf`; empty if it has none.
    fn of(elf: &ElfFile, name: &str) -> Result<Section> {
        let Some(s) = elf.sections.iter().find(|s| s.name == name && !s.nobits) else {
            return Ok(Section { done: true, ..Section::default() });
        };
        let start = usize::try_from(s.offset)?;
        let end = start.checked_add(usize::try_from(s.size)?).filter(|&e| e <= elf.data().len());
        let Some(end) = end else { bail!("section {name} lies outside the file") };
        if s.flags & u64::from(goblin::elf::section_header::SHF_COMPRESSED) == 0 {
            return Ok(Section { raw: start..end, done: true, ..Section::default() });
        }
        // Elf64_Chdr: type, reserved, uncompressed size, alignment.
        let header = &elf.data()[start..end];
        if header.len() < 24 {
            bail!("compressed section {name} is shorter than its header");
        }
        let kind = u32::from_le_bytes(header[0..4].try_into()?);
        if kind != 1 {
            bail!("section {name} is not compressed with zlib");
        }
        let size = usize::try_from(u64::from_le_bytes(header[8..16].try_into()?))?;
        if size > MAX_INFLATED {
            bail!("section {name} says it inflates to {size} bytes");
        }
        let mut out = Vec::new();
        out.try_reserve_exact(size)?;
        Ok(Section {
            raw: start + 24..end,
            inflated_len: Some(size),
            out,
            state: Some(Box::default()),
            ..Section::default()
        })
    }

    /// Inflates until at least `want` bytes are at hand, or all of them.
    fn ensure(&mut self, data: &[u8], want: usize) -> Result<()> {
        let Some(size) = self.inflated_len else { return Ok(()) };
        while self.out.len() < want.min(size) && !self.done {
            let produced = self.out.len();
            let target = want.max(produced + STEP).min(size);
            // The zeroes are overwritten; the capacity was reserved, so
            // the bytes inflated so far stay where they are.
            self.out.resize(target, 0);
            let Some(state) = self.state.as_mut() else { bail!("inflating a section failed before") };
            let flags =
                inflate_flags::TINFL_FLAG_PARSE_ZLIB_HEADER | inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
            let input = data.get(self.raw.start + self.in_pos..self.raw.end).unwrap_or_default();
            let (status, consumed, written) = decompress(state, input, &mut self.out, produced, flags);
            self.in_pos += consumed;
            self.out.truncate(produced + written);
            match status {
                TINFLStatus::Done if self.out.len() == size => self.done = true,
                TINFLStatus::Done => {
                    self.state = None;
                    bail!("a compressed section inflates to {} bytes, its header says {size}", self.out.len());
                }
                TINFLStatus::HasMoreOutput if written > 0 || consumed > 0 => {}
                s => {
                    self.state = None;
                    bail!("corrupt zlib data in a compressed section: {s:?}");
                }
            }
        }
        Ok(())
    }

    /// Inflates all of it.
    fn ensure_all(&mut self, data: &[u8]) -> Result<()> {
        self.ensure(data, usize::MAX)
    }

    /// The bytes at hand.
    fn bytes<'a>(&'a self, data: &'a [u8]) -> &'a [u8] {
        match self.inflated_len {
            Some(_) => &self.out,
            None => data.get(self.raw.clone()).unwrap_or_default(),
        }
    }
}

/// A module's DWARF, read one unit at a time as functions are asked for.
pub struct LazyDwarf {
    /// The sections of [`SECTIONS`], in its order.
    sections: Vec<Section>,
    aranges: Section,
    /// `[begin, end)` → unit offset, sorted, from `.debug_aranges`; None
    /// until first needed.
    table: Option<Vec<(u64, u64, usize)>>,
    /// The same from the units `.debug_aranges` does not list (all of them
    /// when it is missing; a Go part of a cgo program has none), from each
    /// unit's own ranges; read when an address is in no listed unit.
    rest: Option<Vec<(u64, u64, usize)>>,
    /// The functions of the units read so far, by unit offset.
    units: HashMap<usize, Vec<DwFunction>>,
    /// Functions asked for so far.
    lookups: usize,
}

impl std::fmt::Debug for LazyDwarf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyDwarf").field("units_read", &self.units.len()).finish_non_exhaustive()
    }
}

impl LazyDwarf {
    /// The DWARF of `elf` (which has a `.debug_info`), nothing read yet.
    pub fn new(elf: &ElfFile) -> Result<LazyDwarf> {
        let sections = SECTIONS.iter().map(|id| Section::of(elf, id.name())).collect::<Result<Vec<_>>>()?;
        let aranges = Section::of(elf, SectionId::DebugAranges.name())?;
        Ok(LazyDwarf { sections, aranges, table: None, rest: None, units: HashMap::new(), lookups: 0 })
    }

    /// Functions asked for so far.
    pub fn lookups(&self) -> usize {
        self.lookups
    }

    fn info(&mut self) -> &mut Section {
        let i = SECTIONS.iter().position(|&id| id == SectionId::DebugInfo).expect(".debug_info is read");
        &mut self.sections[i]
    }

    /// The function entered at `entry` (a file address of `elf`, the file
    /// this was made for), as the whole index describes it.
    pub fn function_at(&mut self, elf: &ElfFile, entry: FileAddr) -> Result<Option<DwFunction>> {
        self.lookups += 1;
        let data = elf.data();
        // Every section but .debug_info whole: they are small.
        let info_at = SECTIONS.iter().position(|&id| id == SectionId::DebugInfo).expect(".debug_info is read");
        for (i, s) in self.sections.iter_mut().enumerate() {
            if i != info_at {
                s.ensure_all(data)?;
            }
        }
        if self.table.is_none() {
            self.table = Some(self.listed_ranges(data)?);
        }
        if let Some(f) = self.search(data, entry, false)? {
            return Ok(Some(f));
        }
        if self.rest.is_none() {
            self.rest = Some(self.unlisted_ranges(data)?);
        }
        self.search(data, entry, true)
    }

    /// The function at `entry` in the units whose ranges (listed in
    /// `.debug_aranges`, or the `rest`) hold it, the first unit first.
    fn search(&mut self, data: &[u8], entry: FileAddr, rest: bool) -> Result<Option<DwFunction>> {
        let table = if rest { &self.rest } else { &self.table };
        let mut candidates: Vec<usize> = table
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|&&(lo, hi, _)| lo <= entry.0 && entry.0 < hi)
            .map(|&(_, _, unit)| unit)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for unit in candidates {
            if !self.units.contains_key(&unit) {
                let functions = self.read_unit(data, unit)?;
                self.units.insert(unit, functions);
            }
            if let Some(f) = self.units[&unit].iter().find(|f| f.entry == entry) {
                return Ok(Some(f.clone()));
            }
        }
        Ok(None)
    }

    /// The address ranges `.debug_aranges` lists, by unit.
    fn listed_ranges(&mut self, data: &[u8]) -> Result<Vec<(u64, u64, usize)>> {
        self.aranges.ensure_all(data)?;
        let mut table = Vec::new();
        let aranges = gimli::DebugAranges::new(self.aranges.bytes(data), RunTimeEndian::Little);
        let mut headers = aranges.headers();
        while let Some(h) = headers.next()? {
            let unit = h.debug_info_offset().0;
            let mut entries = h.entries();
            while let Some(e) = entries.next()? {
                let r = e.range();
                if r.begin < r.end {
                    table.push((r.begin, r.end, unit));
                }
            }
        }
        table.sort_unstable();
        Ok(table)
    }

    /// The address ranges of the units `.debug_aranges` does not list, from
    /// each unit's own ranges (all of `.debug_info` inflated).
    fn unlisted_ranges(&mut self, data: &[u8]) -> Result<Vec<(u64, u64, usize)>> {
        let listed: std::collections::HashSet<usize> =
            self.table.as_deref().unwrap_or_default().iter().map(|&(_, _, unit)| unit).collect();
        self.info().ensure_all(data)?;
        let dwarf = self.dwarf(data);
        let mut table = Vec::new();
        let mut units = dwarf.units();
        while let Some(h) = units.next()? {
            let offset = h.offset().0;
            if listed.contains(&offset) {
                continue;
            }
            let unit = dwarf::unit_of(&dwarf, h)?;
            let mut ranges = dwarf.unit_ranges(&unit)?;
            while let Some(r) = ranges.next()? {
                if r.begin < r.end {
                    table.push((r.begin, r.end, offset));
                }
            }
        }
        table.sort_unstable();
        Ok(table)
    }

    /// The functions of the unit at `offset` in `.debug_info`, inflating
    /// the section as far as that unit's end.
    fn read_unit(&mut self, data: &[u8], offset: usize) -> Result<Vec<DwFunction>> {
        // The unit's length: 4 bytes, or 0xffffffff and 8 more (64-bit DWARF).
        let info = self.info();
        info.ensure(data, offset.saturating_add(12))?;
        let bytes = info.bytes(data);
        let Some(word) = bytes.get(offset..offset + 4) else { bail!("no unit at {offset:#x} in .debug_info") };
        let end = match u32::from_le_bytes(word.try_into()?) {
            0xffff_ffff => {
                let Some(len) = bytes.get(offset + 4..offset + 12) else { bail!("a unit cut short") };
                usize::try_from(u64::from_le_bytes(len.try_into()?))?.checked_add(offset + 12)
            }
            len => (len as usize).checked_add(offset + 4),
        };
        info.ensure(data, end.unwrap_or(usize::MAX))?;
        match self.walk(data, offset, false) {
            Err(e) if e.downcast_ref::<NeedWholeInfo>().is_some() => {
                self.info().ensure_all(data)?;
                self.walk(data, offset, true)
            }
            other => other,
        }
    }

    /// Reads the unit at `offset`; `whole` if all of `.debug_info` is at hand.
    fn walk(&self, data: &[u8], offset: usize, whole: bool) -> Result<Vec<DwFunction>> {
        let dwarf = self.dwarf(data);
        let mut foreign = if whole { Foreign::whole() } else { Foreign::partial() };
        let header = dwarf.debug_info.header_from_offset(gimli::DebugInfoOffset(offset))?;
        let unit = dwarf::unit_of(&dwarf, header)?;
        Ok(dwarf::unit_functions(&dwarf, &unit, &mut foreign)?.functions)
    }

    /// The sections as gimli reads them (`.debug_info` as far as inflated).
    fn dwarf<'a>(&'a self, data: &'a [u8]) -> gimli::Dwarf<R<'a>> {
        let slice = |id: SectionId| -> R<'a> {
            let bytes = SECTIONS.iter().position(|&s| s == id).map_or(&[][..], |i| self.sections[i].bytes(data));
            EndianSlice::new(bytes, RunTimeEndian::Little)
        };
        gimli::Dwarf::load(|id| Ok::<_, gimli::Error>(slice(id))).expect("loading borrowed slices cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every function of the whole index, and every symbol, looked up one
    /// at a time: the same answer.
    fn agrees_with_the_whole_index(path: &Path) -> usize {
        let mut elf = ElfFile::open(path, path).unwrap();
        let debug = super::super::debuginfo::find(&elf, path, Path::new("/"));
        if let Some(d) = &debug {
            elf.adopt_symbols(d);
        }
        let src = [Some(&elf), debug.as_ref()].into_iter().flatten().find(|e| e.has_dwarf()).expect("DWARF");
        let whole = dwarf::index(src).unwrap();
        let mut lazy = LazyDwarf::new(src).unwrap();
        let mut entries: Vec<FileAddr> = whole.functions.iter().map(|f| f.entry).collect();
        entries.extend(elf.functions.iter().map(|f| f.addr));
        entries.sort();
        entries.dedup();
        // Entry 0 is where a linker leaves the DWARF of code it dropped, in
        // many units at once; no symbol is there, so it is never asked for.
        entries.retain(|&e| e != FileAddr(0));
        for &e in &entries {
            assert_eq!(lazy.function_at(src, e).unwrap().as_ref(), whole.at(e), "{} at {e:?}", path.display());
        }
        whole.functions.len()
    }

    #[test]
    fn one_unit_at_a_time_answers_as_the_whole_index() {
        let dir = Path::new(env!("TP_TARGETS_DIR"));
        for name in ["counter", "shapes", "rusty-v0", "many"] {
            assert!(agrees_with_the_whole_index(&dir.join(name)) > 0, "{name}");
        }
        // Without .debug_aranges (as clang builds): each unit's own ranges.
        let bare = std::env::temp_dir().join(format!("tp-noaranges-{}", std::process::id()));
        let out = std::process::Command::new("objcopy")
            .args(["--remove-section", ".debug_aranges"])
            .arg(dir.join("rusty-v0"))
            .arg(&bare)
            .output()
            .expect("objcopy (binutils) runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let elf = ElfFile::open(&bare, &bare).unwrap();
        assert!(!elf.sections.iter().any(|s| s.name == ".debug_aranges"));
        assert!(agrees_with_the_whole_index(&bare) > 100);
        std::fs::remove_file(&bare).unwrap();
        // .debug_aranges listing some units only (a cgo program: gcc's units
        // are listed, Go's linker lists none of its own): the others by
        // their own ranges.
        let full = ElfFile::open(&dir.join("rusty-v0"), &dir.join("rusty-v0")).unwrap();
        let aranges = full.section_data(".debug_aranges").unwrap().unwrap();
        let first = u32::from_le_bytes(aranges[..4].try_into().unwrap()) as usize + 4;
        let one = std::env::temp_dir().join(format!("tp-onearange-{}", std::process::id()));
        std::fs::write(&one, &aranges[..first]).unwrap();
        let some = std::env::temp_dir().join(format!("tp-somearanges-{}", std::process::id()));
        let out = std::process::Command::new("objcopy")
            .arg(format!("--update-section=.debug_aranges={}", one.display()))
            .arg(dir.join("rusty-v0"))
            .arg(&some)
            .output()
            .expect("objcopy (binutils) runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(agrees_with_the_whole_index(&some) > 100);
        std::fs::remove_file(&some).unwrap();
        std::fs::remove_file(&one).unwrap();
    }

    #[test]
    fn one_unit_of_libc_answers_as_the_whole_index() {
        // Debian's libc debug file: compressed sections, thousands of units.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        assert!(agrees_with_the_whole_index(Path::new(libc)) > 1000, "libc6-dbg is installed (see .ci/run)");
    }

    #[test]
    fn one_function_inflates_only_as_far_as_its_unit() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        let path = Path::new(libc);
        let elf = ElfFile::open(path, path).unwrap();
        let debug = super::super::debuginfo::find(&elf, path, Path::new("/")).expect("libc6-dbg is installed");
        let first = debug.functions.iter().find(|f| f.name == "_dl_start").expect("_dl_start");
        let mut lazy = LazyDwarf::new(&debug).unwrap();
        assert!(lazy.function_at(&debug, first.addr).unwrap().is_some());
        let info = lazy.info();
        let (read, size) = (info.out.len(), info.inflated_len.expect("Debian compresses .debug_info"));
        assert!(read < size / 4, "inflated {read} of {size} bytes");
    }
}
