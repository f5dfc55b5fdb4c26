//! ELF files with goblin: function symbols, segments, and the bytes behind a
//! virtual address.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::sym::{STT_FUNC, STT_GNU_IFUNC};

/// A function symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncSym {
    /// Its name as stored (mangled, if it is).
    pub name: String,
    /// Its link-time address.
    pub addr: u64,
    /// Its size in bytes (0 if the symbol has none).
    pub size: u64,
    /// True for global and weak symbols.
    pub global: bool,
    /// True for GNU indirect functions: the address is the resolver's.
    pub ifunc: bool,
}

/// A PT_LOAD segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Link-time address.
    pub vaddr: u64,
    /// Size in memory.
    pub memsz: u64,
    /// Offset in the file.
    pub offset: u64,
    /// Size in the file.
    pub filesz: u64,
    /// Executable.
    pub exec: bool,
}

/// A parsed ELF file and its bytes.
#[derive(Debug)]
pub struct ElfFile {
    /// Where it was read from.
    pub path: PathBuf,
    data: Vec<u8>,
    /// `e_machine`.
    pub machine: u16,
    /// True for ET_DYN (PIE executables and shared libraries).
    pub position_independent: bool,
    /// The PT_LOAD segments.
    pub segments: Vec<Segment>,
    /// Function symbols from .symtab, or from .dynsym when there is no .symtab.
    pub functions: Vec<FuncSym>,
    /// True when the symbols came from .symtab (the file is not stripped).
    pub has_symtab: bool,
}

/// The name of an ELF machine number, for messages.
pub fn machine_name(m: u16) -> &'static str {
    match m {
        3 => "i386",
        40 => "arm",
        62 => "x86-64",
        183 => "aarch64",
        243 => "riscv",
        _ => "an unknown architecture",
    }
}

impl ElfFile {
    /// Reads and parses `path` (shown as `display` in messages).
    pub fn open(path: &Path, display: &Path) -> Result<ElfFile> {
        let data = std::fs::read(path).with_context(|| format!("cannot read `{}`", display.display()))?;
        Self::parse(data, path, display)
    }

    /// Parses ELF bytes.
    pub fn parse(data: Vec<u8>, path: &Path, display: &Path) -> Result<ElfFile> {
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            bail!("`{}` is not an ELF file", display.display());
        }
        let elf = goblin::elf::Elf::parse(&data)
            .map_err(|e| anyhow::anyhow!("`{}` is not a valid ELF file: {e}", display.display()))?;
        if !elf.is_64 {
            bail!("`{}` is a 32-bit binary; tp traces 64-bit processes only", display.display());
        }
        let segments = elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| Segment {
                vaddr: p.p_vaddr,
                memsz: p.p_memsz,
                offset: p.p_offset,
                filesz: p.p_filesz,
                exec: p.is_executable(),
            })
            .collect();
        let has_symtab = elf.syms.iter().any(|s| s.st_type() == STT_FUNC);
        let (syms, strtab) = if has_symtab { (&elf.syms, &elf.strtab) } else { (&elf.dynsyms, &elf.dynstrtab) };
        let mut functions: Vec<FuncSym> = syms
            .iter()
            .filter(|s| (s.st_type() == STT_FUNC || s.st_type() == STT_GNU_IFUNC) && s.st_shndx != 0 && s.st_value != 0)
            .filter_map(|s| {
                let name = strtab.get_at(s.st_name)?;
                (!name.is_empty()).then(|| FuncSym {
                    name: name.to_string(),
                    addr: s.st_value,
                    size: s.st_size,
                    global: s.st_bind() != goblin::elf::sym::STB_LOCAL,
                    ifunc: s.st_type() == STT_GNU_IFUNC,
                })
            })
            .collect();
        functions.sort_by(|a, b| (a.addr, !a.global, &a.name).cmp(&(b.addr, !b.global, &b.name)));
        Ok(ElfFile {
            path: path.to_path_buf(),
            machine: elf.header.e_machine,
            position_independent: elf.header.e_type == goblin::elf::header::ET_DYN,
            segments,
            functions,
            has_symtab,
            data,
        })
    }

    /// The file bytes of `[vaddr, vaddr + len)`, if a segment holds them all.
    /// Sizes and addresses come from the file, so the sums are checked.
    pub fn bytes_at(&self, vaddr: u64, len: u64) -> Option<&[u8]> {
        let end = vaddr.checked_add(len)?;
        let seg = self
            .segments
            .iter()
            .find(|s| s.vaddr <= vaddr && s.vaddr.checked_add(s.filesz).is_some_and(|seg_end| end <= seg_end))?;
        let off = usize::try_from(seg.offset.checked_add(vaddr - seg.vaddr)?).ok()?;
        self.data.get(off..off.checked_add(usize::try_from(len).ok()?)?)
    }

    /// The segment containing file offset `offset`.
    pub fn segment_at_offset(&self, offset: u64) -> Option<&Segment> {
        self.segments.iter().find(|s| s.offset <= offset && offset - s.offset < s.filesz.max(1))
    }

    /// The load bias implied by a mapping of this file: runtime address minus link-time address.
    pub fn bias_from(&self, start: u64, offset: u64) -> Option<u64> {
        let seg = self.segment_at_offset(offset).or_else(|| self.segments.first())?;
        Some(start.wrapping_sub(offset).wrapping_sub(seg.vaddr.wrapping_sub(seg.offset)))
    }

    /// Function symbols with one entry per address (aliases dropped, globals preferred).
    pub fn unique_functions(&self) -> Vec<&FuncSym> {
        let mut out: Vec<&FuncSym> = Vec::new();
        for f in &self.functions {
            if out.last().is_none_or(|l| l.addr != f.addr) {
                out.push(f);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_exe() -> ElfFile {
        let p = std::env::current_exe().unwrap();
        ElfFile::open(&p, &p).unwrap()
    }

    #[test]
    fn reads_our_own_symbols_and_code() {
        let elf = own_exe();
        assert!(elf.has_symtab);
        assert!(elf.functions.iter().any(|f| f.name == "main"));
        let main = elf.functions.iter().find(|f| f.name == "main").unwrap();
        let code = elf.bytes_at(main.addr, main.size).unwrap();
        assert_eq!(code.len() as u64, main.size);
        assert!(elf.segments.iter().any(|s| s.exec && s.vaddr <= main.addr && main.addr < s.vaddr + s.memsz));
    }

    #[test]
    fn bias_matches_our_own_mapping() {
        let elf = own_exe();
        let maps = crate::process::read_maps(std::process::id() as i32).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(std::env::current_exe().unwrap()).unwrap().ino();
        let m = maps.iter().find(|m| m.inode == ino && m.offset == 0).unwrap();
        let bias = elf.bias_from(m.start, m.offset).unwrap();
        // The runtime address of a function we know equals its symbol plus the bias.
        let sym = elf.functions.iter().find(|f| f.name.contains("reads_our_own_symbols_and_code")).unwrap();
        let runtime = reads_our_own_symbols_and_code as *const () as u64;
        assert_eq!(sym.addr.wrapping_add(bias), runtime);
    }

    #[test]
    fn non_elf_and_missing_files_are_named() {
        let err = ElfFile::parse(b"#!/bin/sh\n".to_vec(), Path::new("x"), Path::new("script.sh")).unwrap_err();
        assert_eq!(err.to_string(), "`script.sh` is not an ELF file");
        let err = ElfFile::open(Path::new("/nonexistent/tp"), Path::new("/nonexistent/tp")).unwrap_err();
        assert!(format!("{err:#}").starts_with("cannot read `/nonexistent/tp`"));
    }
}
