//! Functions by name: the modules mapped in a process ([`modules`]), each
//! an ELF file ([`elf`]) with its load bias, demangled names ([`demangle`]),
//! separate debug information ([`debuginfo`]), DWARF ([`dwarf`]), line
//! tables ([`lines`]) and static probes ([`sdt_notes`]); and the names users
//! write ([`pattern`], and sites inside functions: [`site`]); JIT code
//! by the names its runtime writes to a perf map ([`perf_map`]).

pub mod block_map;
pub mod contents;
pub mod debuginfo;
pub mod demangle;
pub mod dwarf;
pub mod dwarf_index;
pub mod eh;
pub mod elf;
pub mod entries;
pub mod fields;
pub mod go_module;
pub mod image;
pub mod lines;
pub mod module;
pub mod modules;
pub mod pattern;
pub mod perf_map;
pub mod perf_map_file;
pub mod plan_cache;
pub mod planner;
pub mod saved;
pub mod saving;
pub mod sdt_notes;
pub mod site;
pub mod stackwalk;
pub mod stored_dwarf;
pub mod symbolize;
pub mod verdict;

pub use elf::{ElfFile, FuncSym, Source, Version};
pub use module::{Module, Named};
pub use modules::{Found, NotFound, ProcessModules, Resolution};
pub use site::{Site, Usdt};

use crate::addr::{Bias, RuntimeAddr};
use crate::arch::Isa;

/// A function resolved in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Its name for display (demangled when it is Rust or C++).
    pub name: String,
    /// Its symbol as stored (mangled).
    pub symbol: String,
    /// The module's file name.
    pub module: String,
    /// Its runtime address.
    pub addr: RuntimeAddr,
    /// Its size in bytes.
    pub size: u64,
    /// True for a GNU indirect function: the symbol is its resolver.
    pub ifunc: bool,
    /// Its symbol version (`@@GLIBC_2.3.2`), if it has one.
    pub version: Option<Version>,
    /// Where its name and bounds came from.
    pub source: Source,
    /// Where the file addresses of the code it lies in are at run time: its
    /// module's bias, or that of a copy of the module's code mapped elsewhere.
    pub bias: Bias,
}

/// Targets inside `[addr, addr + size)` (runtime addresses, `bias` applied)
/// of the direct branches in the split-off parts `name.cold*` of a function.
pub fn cold_targets(elf: &ElfFile, bias: Bias, name: &str, addr: RuntimeAddr, size: u64, isa: &dyn Isa) -> Vec<u64> {
    let RuntimeAddr(addr) = addr;
    cold_parts(elf, bias, name)
        .into_iter()
        .flat_map(|(at, code)| isa.branch_targets(code, at))
        .filter(|&t| t >= addr && t < addr + size)
        .collect()
}

/// The split-off parts `name.cold*` of a function: each one's runtime
/// address (`bias` applied) and code.
pub fn cold_parts<'a>(elf: &'a ElfFile, bias: Bias, name: &str) -> Vec<(u64, &'a [u8])> {
    elf.cold_parts
        .get(name)
        .into_iter()
        .flatten()
        .filter_map(|&i| elf.functions.get(i))
        .filter_map(|s| Some((bias.runtime(s.addr).0, elf.bytes_at(s.addr, s.size)?)))
        .collect()
}

/// ", did you mean `a`, `b`?" with the names closest to `name`, or "".
pub fn suggestions<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let mut scored: Vec<(usize, &str)> = candidates
        .map(|c| {
            let d = edit_distance(name, c);
            let d = if c.contains(name) || name.contains(c) { d.min(name.len().abs_diff(c.len()) / 2 + 1) } else { d };
            (d, c)
        })
        .filter(|&(d, _)| d <= 2 + name.len() / 3)
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    if scored.is_empty() {
        return String::new();
    }
    let names: Vec<String> = scored.iter().take(3).map(|(_, c)| format!("`{c}`")).collect();
    format!("; did you mean {}?", names.join(", "))
}

/// Levenshtein distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + (ca != *cb) as usize).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("foo", "foo"), 0);
        assert_eq!(edit_distance("foo", "fob"), 1);
        assert_eq!(edit_distance("foo", "fooo"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn suggests_close_names_only() {
        let names = ["foo", "bar", "baz", "main", "foo_helper"];
        assert_eq!(suggestions("fo", names.iter().copied()), "; did you mean `foo`?");
        assert_eq!(suggestions("helper", names.iter().copied()), "; did you mean `foo_helper`?");
        assert_eq!(suggestions("ba", names.iter().copied()), "; did you mean `bar`, `baz`?");
        assert_eq!(suggestions("zzzzzzzz", names.iter().copied()), "");
    }
}
