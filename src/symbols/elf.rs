//! ELF files with goblin: function symbols, segments, the bytes behind a
//! virtual address, the build-id and debuglink that lead to separate debug
//! information, and section contents, decompressed when SHF_COMPRESSED.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::{SHF_COMPRESSED, SHT_NOBITS};
use goblin::elf::sym::{STT_FUNC, STT_GNU_IFUNC};

use crate::addr::{Bias, FileAddr, RuntimeAddr};

/// A function symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncSym {
    /// Its name as stored (mangled, if it is).
    pub name: String,
    /// Its link-time address.
    pub addr: FileAddr,
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

/// A section's place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Its name.
    pub name: String,
    /// File offset.
    pub offset: u64,
    /// Size in the file.
    pub size: u64,
    /// Link-time address.
    pub addr: u64,
    /// SHF_* flags.
    pub flags: u64,
    /// True for SHT_NOBITS (no bytes in the file, as `.text` in a debug file).
    pub nobits: bool,
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
    /// Indices into `functions` of split-off parts (`foo.cold`, `foo.cold.1`).
    pub cold_parts: Vec<usize>,
    /// The GNU build-id note.
    pub build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`: the debug file's name and its CRC-32.
    pub debuglink: Option<(String, u32)>,
    /// The section headers.
    pub sections: Vec<Section>,
}

impl ElfFile {
    /// Reads and parses `path` (shown as `display` in messages).
    pub fn open(path: &Path, display: &Path) -> Result<ElfFile> {
        let data = match crate::process::files::read_regular(path) {
            Ok(data) => data,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                bail!("`{}` {e}; give the path of an executable or a shared library", display.display())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read `{}`", display.display())),
        };
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
        match elf.header.e_type {
            goblin::elf::header::ET_EXEC | goblin::elf::header::ET_DYN => {}
            goblin::elf::header::ET_CORE => {
                bail!("`{}` is a core dump; give the executable or a shared library it ran", display.display())
            }
            goblin::elf::header::ET_REL => bail!(
                "`{}` is an object file (.o), not linked yet; give the executable or library it is linked into",
                display.display()
            ),
            t => {
                bail!("`{}` is an ELF file of type {t}, neither an executable nor a shared library", display.display())
            }
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
                // `.symtab` of glibc's debug files names versioned symbols
                // `pthread_mutex_init@@GLIBC_2.2.5`: the version is not part of the name.
                let name = strtab.get_at(s.st_name)?.split('@').next()?;
                (!name.is_empty()).then(|| FuncSym {
                    name: name.to_string(),
                    addr: FileAddr(s.st_value),
                    size: s.st_size,
                    global: s.st_bind() != goblin::elf::sym::STB_LOCAL,
                    ifunc: s.st_type() == STT_GNU_IFUNC,
                })
            })
            .collect();
        // Per address, the preferred name first: global, then without a leading underscore.
        functions.sort_by(|a, b| {
            (a.addr, !a.global, a.name.starts_with('_'), &a.name).cmp(&(
                b.addr,
                !b.global,
                b.name.starts_with('_'),
                &b.name,
            ))
        });
        let cold_parts = cold_parts_of(&functions);
        // The note section first: in a debug file made by `objcopy
        // --only-keep-debug`, the PT_NOTE segment still points at the
        // stripped-away file offsets.
        let is_build_id =
            |n: &goblin::elf::note::Note| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID && n.name == "GNU";
        let build_id = elf
            .iter_note_sections(&data, Some(".note.gnu.build-id"))
            .and_then(|mut notes| notes.find_map(|n| n.ok().filter(is_build_id).map(|n| n.desc.to_vec())))
            .or_else(|| {
                elf.iter_note_headers(&data)
                    .and_then(|mut notes| notes.find_map(|n| n.ok().filter(is_build_id).map(|n| n.desc.to_vec())))
            });
        let sections: Vec<Section> = elf
            .section_headers
            .iter()
            .map(|sh| Section {
                name: elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("").to_string(),
                offset: sh.sh_offset,
                size: sh.sh_size,
                addr: sh.sh_addr,
                flags: sh.sh_flags,
                nobits: sh.sh_type == SHT_NOBITS,
            })
            .collect();
        let debuglink = sections.iter().find(|s| s.name == ".gnu_debuglink").and_then(|s| {
            let b = data.get(s.offset as usize..(s.offset + s.size) as usize)?;
            let end = b.iter().position(|&c| c == 0)?;
            let name = std::str::from_utf8(&b[..end]).ok()?.to_string();
            let crc_at = (end + 1).next_multiple_of(4);
            let crc = u32::from_le_bytes(b.get(crc_at..crc_at + 4)?.try_into().ok()?);
            Some((name, crc))
        });
        Ok(ElfFile {
            path: path.to_path_buf(),
            machine: elf.header.e_machine,
            position_independent: elf.header.e_type == goblin::elf::header::ET_DYN,
            segments,
            functions,
            has_symtab,
            cold_parts,
            build_id,
            debuglink,
            sections,
            data,
        })
    }

    /// The bytes of section `name`, decompressed if it is SHF_COMPRESSED;
    /// None if there is no such section or it has no bytes in the file.
    pub fn section_data(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>> {
        let Some(s) = self.sections.iter().find(|s| s.name == name && !s.nobits) else { return Ok(None) };
        let raw = self
            .data
            .get(s.offset as usize..(s.offset + s.size) as usize)
            .with_context(|| format!("section {name} of `{}` lies outside the file", self.path.display()))?;
        if s.flags & SHF_COMPRESSED as u64 == 0 {
            return Ok(Some(Cow::Borrowed(raw)));
        }
        decompress(raw)
            .map(|v| Some(Cow::Owned(v)))
            .with_context(|| format!("section {name} of `{}`", self.path.display()))
    }

    /// True if the file has DWARF debugging information.
    pub fn has_dwarf(&self) -> bool {
        self.sections.iter().any(|s| s.name == ".debug_info" && !s.nobits && s.size > 0)
    }

    /// Takes the function symbols of `debug`, a separate debug file for this
    /// file (same addresses), when this file has only dynamic symbols.
    pub fn adopt_symbols(&mut self, debug: &ElfFile) {
        if !self.has_symtab && debug.has_symtab {
            self.functions = debug.functions.clone();
            self.cold_parts = debug.cold_parts.clone();
            self.has_symtab = true;
        }
    }

    /// The file bytes of `[vaddr, vaddr + len)`, if a segment holds them all.
    /// Sizes and addresses come from the file, so the sums are checked.
    pub fn bytes_at(&self, vaddr: FileAddr, len: u64) -> Option<&[u8]> {
        let FileAddr(vaddr) = vaddr;
        let end = vaddr.checked_add(len)?;
        let seg = self
            .segments
            .iter()
            .find(|s| s.vaddr <= vaddr && s.vaddr.checked_add(s.filesz).is_some_and(|seg_end| end <= seg_end))?;
        let off = usize::try_from(seg.offset.checked_add(vaddr - seg.vaddr)?).ok()?;
        self.data.get(off..off.checked_add(usize::try_from(len).ok()?)?)
    }

    /// The file bytes from `vaddr` to the end of the segment holding it.
    pub fn bytes_from(&self, vaddr: u64) -> Option<&[u8]> {
        let seg = self.segments.iter().find(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.filesz)?;
        let off = (seg.offset + (vaddr - seg.vaddr)) as usize;
        self.data.get(off..(seg.offset + seg.filesz) as usize)
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The segment containing file offset `offset`.
    pub fn segment_at_offset(&self, offset: u64) -> Option<&Segment> {
        self.segments.iter().find(|s| s.offset <= offset && offset - s.offset < s.filesz.max(1))
    }

    /// The load bias implied by a mapping at `start` of this file from file
    /// offset `offset`.
    pub fn bias_from(&self, start: RuntimeAddr, offset: u64) -> Option<Bias> {
        let seg = self.segment_at_offset(offset).or_else(|| self.segments.first())?;
        // The file address that file offset `offset` has in that segment.
        let file = FileAddr(offset.wrapping_add(seg.vaddr.wrapping_sub(seg.offset)));
        Some(Bias::between(file, start))
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

fn cold_parts_of(functions: &[FuncSym]) -> Vec<usize> {
    (0..functions.len()).filter(|&i| functions[i].name.contains(".cold")).collect()
}

/// Decompresses an SHF_COMPRESSED section: an Elf64_Chdr (type, reserved,
/// uncompressed size, alignment), then the compressed stream.
fn decompress(raw: &[u8]) -> Result<Vec<u8>> {
    const ELFCOMPRESS_ZLIB: u32 = 1;
    const ELFCOMPRESS_ZSTD: u32 = 2;
    if raw.len() < 24 {
        bail!("compressed section is shorter than its header");
    }
    let kind = u32::from_le_bytes(raw[0..4].try_into().unwrap());
    let size = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
    match kind {
        ELFCOMPRESS_ZLIB => {
            let out = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&raw[24..], size)
                .map_err(|e| anyhow::anyhow!("corrupt zlib data: {e:?}"))?;
            if out.len() != size {
                bail!("zlib data inflates to {} bytes, the header says {size}", out.len());
            }
            Ok(out)
        }
        ELFCOMPRESS_ZSTD => {
            bail!("compressed with zstd, which tp does not read; decompress with `objcopy --decompress-debug-sections`")
        }
        k => bail!("unknown compression type {k}"),
    }
}

/// CRC-32 (IEEE, as `.gnu_debuglink` uses).
pub fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
        *t = c;
    }
    !data.iter().fold(!0u32, |c, &b| table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
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
        assert!(elf.segments.iter().any(|s| s.exec && s.vaddr <= main.addr.0 && main.addr.0 < s.vaddr + s.memsz));
    }

    #[test]
    fn bias_matches_our_own_mapping() {
        let elf = own_exe();
        let maps = crate::process::read_maps(std::process::id() as i32).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(std::env::current_exe().unwrap()).unwrap().ino();
        let m = maps.iter().find(|m| m.inode == ino && m.offset == 0).unwrap();
        let bias = elf.bias_from(RuntimeAddr(m.start), m.offset).unwrap();
        // The runtime address of a function we know equals its symbol plus the bias.
        // The function itself, not one of its closures (whose order in the table varies).
        let sym = elf
            .functions
            .iter()
            .find(|f| f.name.contains("reads_our_own_symbols_and_code") && !f.name.contains("closure"))
            .unwrap();
        let runtime = reads_our_own_symbols_and_code as *const () as u64;
        assert_eq!(bias.runtime(sym.addr), RuntimeAddr(runtime));
    }

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    #[cfg(target_arch = "x86_64")] // reads the x86-64 libc and its libc6-dbg file
    fn reads_build_id_and_compressed_sections() {
        // libc's build-id leads to its separate debug file (libc6-dbg), whose
        // DWARF sections are SHF_COMPRESSED.
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let elf = ElfFile::open(libc, libc).unwrap();
        let id = elf.build_id.as_ref().expect("libc has a build-id");
        assert_eq!(id.len(), 20);
        assert!(elf.debuglink.is_some());
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let debug = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
        let dbg = ElfFile::open(&debug, &debug).expect("libc6-dbg is installed (see .ci/run)");
        let info = dbg.sections.iter().find(|s| s.name == ".debug_info").unwrap();
        assert_ne!(info.flags & SHF_COMPRESSED as u64, 0, "Debian compresses debug sections");
        let data = dbg.section_data(".debug_info").unwrap().unwrap();
        assert!(data.len() as u64 > info.size, "inflated {} from {}", data.len(), info.size);
        // DWARF unit header: version 2..5 at offset 4.
        assert!((2..=5).contains(&u16::from_le_bytes([data[4], data[5]])));
    }

    #[test]
    fn non_elf_and_missing_files_are_named() {
        let err = ElfFile::parse(b"#!/bin/sh\n".to_vec(), Path::new("x"), Path::new("script.sh")).unwrap_err();
        assert_eq!(err.to_string(), "`script.sh` is not an ELF file");
        let err = ElfFile::open(Path::new("/nonexistent/tp"), Path::new("/nonexistent/tp")).unwrap_err();
        assert!(format!("{err:#}").starts_with("cannot read `/nonexistent/tp`"));
    }
}
