//! Functions by name: ELF symbols of the modules mapped in a process, with
//! each module's load bias, and the code behind each function.

pub mod eh;
pub mod elf;
pub mod entries;
pub mod image;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use elf::{ElfFile, FuncSym};

use crate::arch::{Arch, Host, Isa};
use crate::probe::arena::Span;
use crate::process::Mapping;

/// A file mapped into a process, with where it was loaded.
#[derive(Debug)]
pub struct Module {
    /// The file's path as the process sees it.
    pub path: PathBuf,
    /// Its file name, e.g. `libc.so.6`.
    pub name: String,
    /// Runtime address minus link-time address.
    pub bias: u64,
    /// The addresses its mappings cover.
    pub span: Span,
    /// The parsed file.
    pub elf: ElfFile,
}

/// A function resolved in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The module's file name.
    pub module: String,
    /// Its runtime address.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl Module {
    /// The main executable of process `pid`, located in `maps`.
    pub fn main_executable(pid: i32, maps: &[Mapping]) -> Result<Module> {
        let link = crate::process::exe_path(pid).with_context(|| format!("cannot read the executable of {pid}"))?;
        let via_proc = PathBuf::from(format!("/proc/{pid}/exe"));
        let ino = std::fs::metadata(&via_proc).with_context(|| format!("cannot stat {}", via_proc.display()))?.ino();
        let mine: Vec<&Mapping> = maps.iter().filter(|m| m.inode == ino && !m.path.is_empty()).collect();
        let display = PathBuf::from(link.to_string_lossy().trim_end_matches(" (deleted)"));
        Module::from_mappings(&via_proc, &display, &mine)
    }

    /// A module from the mappings of one file (read through `read_path`).
    pub fn from_mappings(read_path: &Path, display: &Path, mappings: &[&Mapping]) -> Result<Module> {
        let elf = ElfFile::open(read_path, display)?;
        if elf.machine != Host::ELF_MACHINE {
            bail!(
                "`{}` is a {} binary; this tp traces {} processes",
                display.display(),
                elf::machine_name(elf.machine),
                Host::NAME
            );
        }
        let first = mappings.iter().min_by_key(|m| m.offset).context("the module is not mapped")?;
        let bias = elf.bias_from(first.start, first.offset).context("cannot compute the load bias")?;
        let span = Span {
            lo: mappings.iter().map(|m| m.start).min().unwrap_or(0),
            hi: mappings.iter().map(|m| m.end).max().unwrap_or(0),
        };
        let name = display.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Module { path: display.to_path_buf(), name, bias, span, elf })
    }

    /// Resolves function `name`, or explains what exists instead.
    pub fn function(&self, name: &str) -> Result<Function> {
        let Some(sym) = self.elf.functions.iter().find(|f| f.name == name) else {
            let hint = suggestions(name, self.elf.functions.iter().map(|f| f.name.as_str()));
            let stripped =
                if self.elf.has_symtab { "" } else { " (the file is stripped: only exported functions are known)" };
            bail!("function `{name}` not found in `{}`{stripped}{hint}", self.path.display());
        };
        Ok(Function {
            name: sym.name.clone(),
            module: self.name.clone(),
            addr: sym.addr.wrapping_add(self.bias),
            size: sym.size,
        })
    }

    /// The file bytes of `f` (its code as built, before any patch).
    pub fn code_of(&self, f: &Function) -> Result<&[u8]> {
        self.elf
            .bytes_at(f.addr.wrapping_sub(self.bias), f.size)
            .with_context(|| format!("the code of `{}` is not in `{}`", f.name, self.path.display()))
    }

    /// Branch targets from split-off parts of `f` (`f.cold`), which jump back into it.
    pub fn extra_targets(&self, f: &Function) -> Vec<u64> {
        cold_targets(&self.elf, self.bias, &f.name, f.addr, f.size, Isa::host())
    }
}

/// Targets inside `[addr, addr + size)` (runtime addresses, `bias` applied)
/// of the direct branches in the split-off parts `name.cold*` of a function.
pub fn cold_targets(elf: &ElfFile, bias: u64, name: &str, addr: u64, size: u64, isa: Isa) -> Vec<u64> {
    let prefix = format!("{name}.cold");
    elf.functions
        .iter()
        .filter(|s| s.name == prefix || s.name.starts_with(&format!("{prefix}.")))
        .filter_map(|s| Some((s.addr.wrapping_add(bias), elf.bytes_at(s.addr, s.size)?)))
        .flat_map(|(at, code)| (isa.branch_targets)(code, at))
        .filter(|&t| t >= addr && t < addr + size)
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
