//! ELF files with goblin: function symbols with their versions
//! (`pthread_cond_signal@@GLIBC_2.3.2`) and where each came from, segments,
//! the bytes behind a virtual address, the build-id and debuglink that lead
//! to separate debug information, and section contents, decompressed when
//! SHF_COMPRESSED.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::{SHF_COMPRESSED, SHT_NOBITS};
use goblin::elf::sym::{STT_FUNC, STT_GNU_IFUNC};
use goblin::elf::symver::{VERSYM_HIDDEN, VERSYM_VERSION};

use super::contents::Contents;
use crate::addr::{Bias, FileAddr, RuntimeAddr};
use crate::process::files::{FileId, open_regular};

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
    /// True for an AArch64 function of a variant calling convention
    /// (`STO_AARCH64_VARIANT_PCS`: SVE or vector arguments, more registers
    /// kept across calls), which only counting may probe
    /// ([`crate::arch::Refusal::VariantPcs`]).
    pub variant_pcs: bool,
    /// Its symbol version, if it has one.
    pub version: Option<Version>,
    /// Where it was found.
    pub source: Source,
}

/// A symbol version: `@@GLIBC_2.3.2` (the default, what programs linked
/// now call) or `@GLIBC_2.2.5` (kept for programs linked long ago).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// `GLIBC_2.3.2`.
    pub name: String,
    /// True for the default version (`@@`).
    pub default: bool,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", if self.default { "@@" } else { "@" }, self.name)
    }
}

/// Where a function's name and bounds came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The file's own `.symtab`.
    Symtab,
    /// The `.symtab` of its separate debug file.
    DebugFile,
    /// Its dynamic symbols (`.dynsym`), as a stripped file keeps them.
    Dynsym,
    /// An unnamed function whose bounds an `.eh_frame` FDE gives (`sub_<addr>`).
    EhFrame,
}

impl Source {
    /// How list-probes names it.
    pub fn label(self) -> &'static str {
        match self {
            Source::Symtab => "symtab",
            Source::DebugFile => "debug-file",
            Source::Dynsym => "dynsym",
            Source::EhFrame => "eh_frame",
        }
    }
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
    data: Contents,
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
    /// Indices into `functions` of split-off parts (`foo.cold`,
    /// `foo.cold.1`), by the name of the function they were split from
    /// (`foo`): a lookup per function, where a program has thousands.
    pub cold_parts: HashMap<String, Vec<usize>>,
    /// The GNU build-id note.
    pub build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`: the debug file's name and its CRC-32.
    pub debuglink: Option<(String, u32)>,
    /// The section headers.
    pub sections: Vec<Section>,
    /// The file's identity when it was opened (None for bytes parsed from
    /// elsewhere); its bytes are read only while the file keeps it.
    pub identity: Option<FileId>,
}

/// What parsing an ELF file finds besides its symbols, which is all a
/// module needs of its headers: a cached analysis keeps it, so a file whose
/// analysis is cached is not parsed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headers {
    /// `e_machine`.
    pub machine: u16,
    /// ET_DYN.
    pub position_independent: bool,
    /// The PT_LOAD segments.
    pub segments: Vec<Segment>,
    /// The GNU build-id note.
    pub build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`.
    pub debuglink: Option<(String, u32)>,
    /// The section headers.
    pub sections: Vec<Section>,
}

/// What parsing found, but the bytes.
struct Parsed {
    headers: Headers,
    functions: Vec<FuncSym>,
    has_symtab: bool,
}

/// A regular file opened for reading, nothing read yet.
#[derive(Debug)]
pub struct Opened {
    /// Its bytes, read as they are asked for.
    pub contents: Contents,
    /// Its identity when opened.
    pub identity: FileId,
}

impl Opened {
    /// Opens `path` (shown as `display` in messages): a regular file of at
    /// most [`crate::process::files::MAX_FILE`] bytes.
    pub fn open(path: &Path, display: &Path) -> Result<Opened> {
        let (file, len) = match open_regular(path) {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                bail!("`{}` {e}; give the path of an executable or a shared library", display.display())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read `{}`", display.display())),
        };
        let identity = FileId::of(&file.metadata().with_context(|| format!("cannot read `{}`", display.display()))?);
        let contents = Contents::lazy(file, identity, usize::try_from(len)?)
            .with_context(|| format!("cannot read `{}`", display.display()))?;
        Ok(Opened { contents, identity })
    }
}

impl ElfFile {
    /// Reads and parses `path` (shown as `display` in messages).
    pub fn open(path: &Path, display: &Path) -> Result<ElfFile> {
        Self::parse_opened(Opened::open(path, display)?, path, display)
    }

    /// Reads all of `opened` (the file `path`) and parses it.
    pub fn parse_opened(opened: Opened, path: &Path, display: &Path) -> Result<ElfFile> {
        if opened.contents.all().len() != opened.contents.len() {
            bail!("`{}` changed while tp read it", display.display());
        }
        let parsed = Self::parse_parts(opened.contents.all(), display)?;
        Ok(ElfFile { identity: Some(opened.identity), ..Self::assemble(parsed, opened.contents, path) })
    }

    /// The file `opened` (the file `path`) as parsed before: its headers
    /// and symbols (sorted as [`ElfFile::open`] sorts them; `has_symtab` as
    /// it says). Its bytes are read as they are asked for.
    pub fn from_parts(
        opened: Opened,
        headers: Headers,
        functions: Vec<FuncSym>,
        has_symtab: bool,
        path: &Path,
    ) -> ElfFile {
        let parsed = Parsed { headers, functions, has_symtab };
        ElfFile { identity: Some(opened.identity), ..Self::assemble(parsed, opened.contents, path) }
    }

    /// Parses ELF bytes.
    pub fn parse(data: Vec<u8>, path: &Path, display: &Path) -> Result<ElfFile> {
        let parsed = Self::parse_parts(&data, display)?;
        Ok(Self::assemble(parsed, Contents::of(&data), path))
    }

    /// What parsing found besides the symbols.
    pub fn headers(&self) -> Headers {
        Headers {
            machine: self.machine,
            position_independent: self.position_independent,
            segments: self.segments.clone(),
            build_id: self.build_id.clone(),
            debuglink: self.debuglink.clone(),
            sections: self.sections.clone(),
        }
    }

    fn assemble(p: Parsed, data: Contents, path: &Path) -> ElfFile {
        let h = p.headers;
        ElfFile {
            path: path.to_path_buf(),
            machine: h.machine,
            position_independent: h.position_independent,
            segments: h.segments,
            cold_parts: cold_parts_of(&p.functions),
            functions: p.functions,
            has_symtab: p.has_symtab,
            build_id: h.build_id,
            debuglink: h.debuglink,
            sections: h.sections,
            identity: None,
            data,
        }
    }

    /// What `data` holds.
    fn parse_parts(data: &[u8], display: &Path) -> Result<Parsed> {
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            bail!("`{}` is not an ELF file", display.display());
        }
        let elf = goblin::elf::Elf::parse(data)
            .map_err(|e| anyhow::anyhow!("`{}` is not a valid ELF file: {e}", display.display()))?;
        if !elf.is_64 {
            return Err(thirty_two_bit(display));
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
        let mut functions = if has_symtab { symtab_functions(&elf) } else { dynsym_functions(&elf) };
        sort_functions(&mut functions);
        // The note section first: in a debug file made by `objcopy
        // --only-keep-debug`, the PT_NOTE segment still points at the
        // stripped-away file offsets.
        let is_build_id =
            |n: &goblin::elf::note::Note| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID && n.name == "GNU";
        let build_id = elf
            .iter_note_sections(data, Some(".note.gnu.build-id"))
            .and_then(|mut notes| notes.find_map(|n| n.ok().filter(is_build_id).map(|n| n.desc.to_vec())))
            .or_else(|| {
                elf.iter_note_headers(data)
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
        let headers = Headers {
            machine: elf.header.e_machine,
            position_independent: elf.header.e_type == goblin::elf::header::ET_DYN,
            segments,
            build_id,
            debuglink,
            sections,
        };
        Ok(Parsed { headers, functions, has_symtab })
    }

    /// The bytes of section `name`, decompressed if it is SHF_COMPRESSED;
    /// None if there is no such section or it has no bytes in the file.
    pub fn section_data(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>> {
        let Some(s) = self.sections.iter().find(|s| s.name == name && !s.nobits) else { return Ok(None) };
        let raw = self
            .range(s.offset, s.offset.checked_add(s.size).unwrap_or(0))
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
            for f in &mut self.functions {
                f.source = Source::DebugFile;
            }
            self.cold_parts = debug.cold_parts.clone();
            self.has_symtab = true;
        }
    }

    /// Adds a function `sub_<addr>` for every range `(start, len)` of
    /// `ranges` (link-time addresses) that lies in executable code, outside
    /// the PLT, and that no symbol covers: given the FDEs of `.eh_frame`
    /// (`eh::add_unwind_functions`), what a stripped file without a debug
    /// file still tells.
    pub fn add_unwind_ranges(&mut self, ranges: &[(u64, u64)]) {
        let mut added = Vec::new();
        {
            let mut covered: Vec<(u64, u64)> =
                self.functions.iter().map(|f| (f.addr.0, f.addr.0.saturating_add(f.size.max(1)))).collect();
            covered.sort_unstable();
            let is_covered = |a: u64| {
                let i = covered.partition_point(|&(lo, _)| lo <= a);
                covered[..i].iter().rev().take(64).any(|&(lo, hi)| lo <= a && a < hi)
            };
            let plt: Vec<(u64, u64)> = self
                .sections
                .iter()
                .filter(|s| s.name.starts_with(".plt"))
                .map(|s| (s.addr, s.addr.saturating_add(s.size)))
                .collect();
            for &(lo, len) in ranges {
                let in_code = self.segments.iter().any(|s| {
                    s.exec
                        && s.vaddr <= lo
                        && s.vaddr.checked_add(s.filesz).is_some_and(|end| lo.saturating_add(len) <= end)
                });
                if len == 0 || !in_code || is_covered(lo) || plt.iter().any(|&(a, b)| a <= lo && lo < b) {
                    continue;
                }
                added.push(FuncSym {
                    name: format!("sub_{lo:x}"),
                    addr: FileAddr(lo),
                    size: len,
                    global: false,
                    ifunc: false,
                    variant_pcs: false,
                    version: None,
                    source: Source::EhFrame,
                });
            }
        }
        if added.is_empty() {
            return;
        }
        added.sort_by_key(|f| f.addr);
        added.dedup_by_key(|f| f.addr);
        self.functions.extend(added);
        sort_functions(&mut self.functions);
        self.cold_parts = cold_parts_of(&self.functions);
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
        let off = seg.offset.checked_add(vaddr - seg.vaddr)?;
        self.range(off, off.checked_add(len)?)
    }

    /// The file's bytes `[from, to)`, read if need be.
    fn range(&self, from: u64, to: u64) -> Option<&[u8]> {
        let len = to.checked_sub(from)?;
        self.data.get(usize::try_from(from).ok()?, usize::try_from(len).ok()?)
    }

    /// The file bytes from `vaddr` to the end of the segment holding it.
    pub fn bytes_from(&self, vaddr: u64) -> Option<&[u8]> {
        let seg = self.segments.iter().find(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.filesz)?;
        self.range(seg.offset.checked_add(vaddr - seg.vaddr)?, seg.offset.checked_add(seg.filesz)?)
    }

    /// The whole file (read whole if it was not yet; empty if the file
    /// changed since it was opened).
    pub fn data(&self) -> &[u8] {
        self.data.all()
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

    /// The address of the defined data object `name` (`.symtab`, else `.dynsym`).
    pub fn data_symbol(&self, name: &str) -> Option<FileAddr> {
        let elf = goblin::elf::Elf::parse(self.data()).ok()?;
        let object = |s: &goblin::elf::Sym| {
            matches!(s.st_type(), goblin::elf::sym::STT_OBJECT | goblin::elf::sym::STT_NOTYPE) && s.st_shndx != 0
        };
        let find = |syms: &goblin::elf::Symtab, strtab: &goblin::strtab::Strtab| {
            syms.iter().find(|s| object(s) && strtab.get_at(s.st_name) == Some(name)).map(|s| FileAddr(s.st_value))
        };
        find(&elf.syms, &elf.strtab).or_else(|| find(&elf.dynsyms, &elf.dynstrtab))
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

/// The refusal of the 32-bit ELF file `path` (the same whether tp read
/// the file or only its class, as for a process caught in its exec).
pub(super) fn thirty_two_bit(path: &Path) -> anyhow::Error {
    anyhow::anyhow!("`{}` is a 32-bit binary; tp traces 64-bit processes only", path.display())
}

/// Function symbols of `.symtab`. Versioned names, as glibc's debug file
/// has them (`pthread_cond_signal@@GLIBC_2.3.2`), are split into the name
/// and the version.
fn symtab_functions(elf: &goblin::elf::Elf) -> Vec<FuncSym> {
    elf.syms
        .iter()
        .filter(is_defined_function)
        .filter_map(|s| {
            let full = elf.strtab.get_at(s.st_name)?;
            let (name, version) = split_version(full);
            function(&s, name, version, Source::Symtab, elf.header.e_machine)
        })
        .collect()
}

/// Function symbols of `.dynsym`, with the versions `.gnu.version` gives
/// them (`.gnu.version_d` names them).
fn dynsym_functions(elf: &goblin::elf::Elf) -> Vec<FuncSym> {
    // Each version's name, read once (a file may hold many symbols and many versions).
    let mut names: std::collections::HashMap<u16, &str> = std::collections::HashMap::new();
    for def in elf.verdef.iter().flat_map(|v| v.iter()) {
        if let Some(name) = def.iter().next().and_then(|aux| elf.dynstrtab.get_at(aux.vda_name)) {
            names.entry(def.vd_ndx).or_insert(name);
        }
    }
    let version_name = |ndx: u16| names.get(&ndx).map(|n| n.to_string());
    elf.dynsyms
        .iter()
        .enumerate()
        .filter(|(_, s)| is_defined_function(s))
        .filter_map(|(i, s)| {
            let name = elf.dynstrtab.get_at(s.st_name)?;
            let versym = elf.versym.as_ref().and_then(|v| v.get_at(i)).map(|v| v.vs_val);
            // Indices 0 and 1 are "local" and "global, unversioned".
            let version = versym.filter(|v| v & VERSYM_VERSION > 1).and_then(|v| {
                Some(Version { name: version_name(v & VERSYM_VERSION)?, default: v & VERSYM_HIDDEN == 0 })
            });
            function(&s, name, version, Source::Dynsym, elf.header.e_machine)
        })
        .collect()
}

fn is_defined_function(s: &goblin::elf::Sym) -> bool {
    (s.st_type() == STT_FUNC || s.st_type() == STT_GNU_IFUNC) && s.st_shndx != 0 && s.st_value != 0
}

fn function(
    s: &goblin::elf::Sym,
    name: &str,
    version: Option<Version>,
    source: Source,
    machine: u16,
) -> Option<FuncSym> {
    (!name.is_empty()).then(|| FuncSym {
        name: name.to_string(),
        addr: FileAddr(s.st_value),
        size: s.st_size,
        global: s.st_bind() != goblin::elf::sym::STB_LOCAL,
        ifunc: s.st_type() == STT_GNU_IFUNC,
        variant_pcs: crate::arch::variant_pcs(machine, s.st_other),
        version,
        source,
    })
}

/// `name@@VER` as (`name`, the default version VER), `name@VER` as (`name`,
/// VER), a name without `@` as itself.
pub fn split_version(full: &str) -> (&str, Option<Version>) {
    match full.split_once('@') {
        Some((name, rest)) => match rest.strip_prefix('@') {
            Some(v) => (name, Some(Version { name: v.to_string(), default: true })),
            None => (name, Some(Version { name: rest.to_string(), default: false })),
        },
        None => (full, None),
    }
}

/// Per address, the preferred name first: global, the default version,
/// then without a leading underscore.
fn sort_functions(functions: &mut [FuncSym]) {
    let key = |f: &FuncSym| {
        let compat = f.version.as_ref().is_some_and(|v| !v.default);
        (f.addr, !f.global, compat, f.name.starts_with('_'), f.source == Source::EhFrame)
    };
    functions.sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name)));
}

fn cold_parts_of(functions: &[FuncSym]) -> HashMap<String, Vec<usize>> {
    let mut out: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, f) in functions.iter().enumerate() {
        // Under each name it may be a part of: `a.cold.b.cold` is a part
        // of `a.cold.b`, and of `a` (a part `.b` of `a`'s cold part).
        for (at, _) in f.name.match_indices(".cold") {
            let rest = &f.name[at + ".cold".len()..];
            if rest.is_empty() || rest.starts_with('.') {
                out.entry(f.name[..at].to_string()).or_default().push(i);
            }
        }
    }
    out
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
    fn cold_parts_are_found_by_the_function_they_were_split_from() {
        let sym = |name: &str| FuncSym {
            name: name.into(),
            addr: FileAddr(0),
            size: 0,
            global: false,
            ifunc: false,
            variant_pcs: false,
            version: None,
            source: Source::Symtab,
        };
        let names = ["foo", "foo.cold", "foo.cold.1", "foo.coldish", "bar.cold.b", "bar.cold.b.cold", "foobar.cold"];
        let parts = cold_parts_of(&names.map(sym));
        let of = |name: &str| parts.get(name).cloned().unwrap_or_default();
        assert_eq!(of("foo"), [1, 2]);
        assert_eq!(of("bar.cold.b"), [5]);
        assert_eq!(of("bar"), [4, 5]);
        assert_eq!(of("foobar"), [6]);
        assert!(of("foo.cold").is_empty() && of("fo").is_empty());
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
    fn versions_are_split_from_names() {
        assert_eq!(split_version("malloc"), ("malloc", None));
        let (name, v) = split_version("pthread_cond_signal@@GLIBC_2.3.2");
        assert_eq!((name, v.unwrap().to_string()), ("pthread_cond_signal", "@@GLIBC_2.3.2".to_string()));
        let (name, v) = split_version("pthread_cond_signal@GLIBC_2.2.5");
        assert_eq!((name, v.unwrap().to_string()), ("pthread_cond_signal", "@GLIBC_2.2.5".to_string()));
    }

    #[test]
    #[cfg(target_arch = "x86_64")] // x86-64 glibc keeps an old version of pthread_cond_signal
    fn dynamic_symbols_keep_their_versions() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let elf = ElfFile::open(libc, libc).unwrap();
        assert!(!elf.has_symtab);
        let mut versions: Vec<String> = elf
            .functions
            .iter()
            .filter(|f| f.name == "pthread_cond_signal")
            .map(|f| f.version.as_ref().unwrap().to_string())
            .collect();
        versions.sort();
        assert_eq!(versions, ["@@GLIBC_2.3.2", "@GLIBC_2.2.5"]);
        assert!(elf.functions.iter().all(|f| f.source == Source::Dynsym));
    }

    #[test]
    fn non_elf_and_missing_files_are_named() {
        let err = ElfFile::parse(b"#!/bin/sh\n".to_vec(), Path::new("x"), Path::new("script.sh")).unwrap_err();
        assert_eq!(err.to_string(), "`script.sh` is not an ELF file");
        let err = ElfFile::open(Path::new("/nonexistent/tp"), Path::new("/nonexistent/tp")).unwrap_err();
        assert!(format!("{err:#}").starts_with("cannot read `/nonexistent/tp`"));
    }
}
