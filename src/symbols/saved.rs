//! A module's analysis as tp caches it ([`crate::cache`]): its symbols
//! (after those of its debug file and its unwind table are taken in), the
//! entries into its code (landing pads, every direct branch target), the
//! code addresses its data holds, its Go function table and its whole DWARF
//! index. That is everything slow to derive from a large binary; what is
//! left to read on a later attach is the file's headers and the bytes of the
//! probed functions.
//!
//! **Key.** An entry is used only for the very file it was made from, by the
//! very tp that made it: its name and key hold tp's own executable's
//! identity and the file's (device, inode, size, modification and change
//! times: [`FileId`]); a file rewritten or replaced is another key. The
//! entry also holds the file's headers (so a file read from the cache is
//! not parsed at all) and, for every place its debug file could be, that
//! place's identity or its absence: an entry whose places differ now (a
//! debug file installed, removed or replaced, another `TP_DEBUG_DIRS`) is
//! a miss. Nothing is saved for a file that changed while tp read it, or
//! within the two seconds before (see [`FileId::settled`]).
//!
//! **Untrusted.** The files are the target's; the cache's directory is not
//! (see [`crate::cache::store`]). An entry is decoded as untrusted input
//! all the same: counts bounded by the bytes, every list checked to be
//! sorted where lookups depend on it, and any flaw a miss.
//!
//! **When.** A module that missed is queued and saved in the background
//! ([`super::saving`]). A first attach therefore reads only what it needs
//! (DWARF of one unit, the code that can branch into one window) and pays
//! for the whole analysis after the target runs again. The DWARF index is
//! stored so that one function is read without the others
//! ([`super::stored_dwarf`]).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::arch::isa_for_machine;
use crate::cache::{Bad, Reader, Store, Writer, name_for};
use crate::process::files::FileId;

use super::debuginfo;
use super::demangle::Names;
use super::dwarf::{self, DwarfIndex};
use super::eh::LandingPads;
use super::elf::{ElfFile, FuncSym, Headers, Section, Segment, Source, Version};
use super::entries::Entries;
use super::go_module::GoModule;
use super::image::CodeFacts;
use crate::addr::FileAddr;

pub use super::stored_dwarf::StoredDwarf;

/// The version of what is saved and how it is computed: part of every key.
const VERSION: u32 = 3;

/// The kind of entry, in its file name.
const KIND: &str = "module";

/// What the cache says of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The file's headers.
    pub headers: Headers,
    /// Where its debug file could be, and what was there.
    pub places: Vec<Place>,
    /// The functions, as `ElfFile::functions` holds them (sorted).
    pub functions: Vec<FuncSym>,
    /// True if they came from a symbol table (the file's or its debug file's).
    pub has_symtab: bool,
    /// For each function, whether its name demangles ([`Names::has_others`]).
    pub mangled: Vec<bool>,
    /// Exception landing pads.
    pub pads: LandingPads,
    /// Every direct branch target of the code, sorted.
    pub branch_targets: Vec<u64>,
    /// Whether code addresses may be absolute, and those the data holds.
    pub facts: (bool, Vec<u64>),
    /// The Go function table, if the module has Go code.
    pub go: Option<(Vec<u64>, bool, Vec<u64>)>,
    /// Its DWARF.
    pub dwarf: SavedDwarf,
}

/// The DWARF of a module, as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavedDwarf {
    /// Neither the file nor its debug file has DWARF.
    None,
    /// It has DWARF that tp could not read.
    Unreadable,
    /// The whole index.
    Index(StoredDwarf),
}

/// A place a debug file could be: its path (relative to the process's root
/// directory, or absolute), and the identity of the file there, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// True if `path` is relative to the process's root directory.
    pub in_root: bool,
    /// The path's bytes.
    pub path: Vec<u8>,
    /// What is there.
    pub file: Option<FileId>,
}

/// The places the debug file of a file with `headers`, which the process
/// sees at `path` with its files under `root`, could be, each as it is now.
///
/// When `DEBUGINFOD_URLS` names a server, two more: the servers (a place
/// whose path names them, with no file), and where tp keeps the debug file
/// a server sent. An entry made with other servers or none, or before a
/// server sent the file, is then a miss.
pub fn places(headers: &Headers, path: &Path, root: &Path) -> Vec<Place> {
    let place = |p: &Path| {
        let file = std::fs::metadata(p).ok().map(|m| FileId::of(&m));
        match p.strip_prefix(root) {
            Ok(rel) => Place { in_root: true, path: rel.as_os_str().as_encoded_bytes().to_vec(), file },
            Err(_) => Place { in_root: false, path: p.as_os_str().as_encoded_bytes().to_vec(), file },
        }
    };
    let local = debuginfo::candidates_for(headers.build_id.as_deref(), headers.debuglink.as_ref(), path, root);
    let mut out: Vec<Place> = local.iter().map(|c| place(&c.path)).collect();
    if let Some((servers, kept)) = headers.build_id.as_deref().and_then(crate::debuginfod::asked) {
        out.push(Place { in_root: false, path: format!("debuginfod {servers}").into_bytes(), file: None });
        out.push(place(&kept));
    }
    out
}

/// What a module computed already of its own analysis, shared with the
/// analysis being saved, which then takes it instead of computing it again.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// The whole DWARF index, once built.
    pub dwarf: Arc<OnceLock<Option<DwarfIndex>>>,
    /// Every branch target, once decoded.
    pub branch_targets: Arc<OnceLock<Vec<u64>>>,
}

impl Saved {
    /// The analysis of `elf` (whose symbols are final) and its debug file,
    /// whose places were `places`; what `known` holds is taken as it is.
    pub fn compute(elf: &ElfFile, debug: Option<&ElfFile>, places: Vec<Place>, known: &Known) -> Saved {
        let isa = isa_for_machine(elf.machine);
        let entries = Entries::sharing(elf, isa, known.branch_targets.clone());
        let branch_targets = entries.branch_targets(elf).to_vec();
        let facts = CodeFacts::of(elf, isa);
        let go = GoModule::of(elf).map(|g| {
            let (entries, all, returns) = g.parts();
            (entries.to_vec(), all, returns.to_vec())
        });
        let source = [Some(elf), debug].into_iter().flatten().find(|e| e.has_dwarf());
        let dwarf = match (source, known.dwarf.get()) {
            (None, _) => SavedDwarf::None,
            (Some(_), Some(Some(index))) => SavedDwarf::Index(StoredDwarf::of(index)),
            (Some(_), Some(None)) => SavedDwarf::Unreadable,
            (Some(s), None) => match dwarf::index(s) {
                Ok(index) => SavedDwarf::Index(StoredDwarf::of(&index)),
                Err(_) => SavedDwarf::Unreadable,
            },
        };
        Saved {
            headers: elf.headers(),
            places,
            functions: elf.functions.clone(),
            has_symtab: elf.has_symtab,
            mangled: elf.functions.iter().map(|f| Names::of(&f.name).has_others()).collect(),
            pads: entries.landing_pads().clone(),
            branch_targets,
            facts: (facts.parts().0, facts.parts().1.to_vec()),
            go,
            dwarf,
        }
    }

    /// The bytes saved.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(VERSION);
        encode_headers(&mut w, &self.headers);
        write_places(&mut w, &self.places);
        // The names in one string, each function then with its name's length.
        let names: String = self.functions.iter().map(|f| f.name.as_str()).collect();
        w.str(&names).var(self.functions.len() as u64);
        let mut last = 0;
        for f in &self.functions {
            w.var(f.name.len() as u64).var(f.addr.0.wrapping_sub(last)).var(f.size);
            last = f.addr.0;
            let flags = f.global as u8 | (f.ifunc as u8) << 1 | (f.version.is_some() as u8) << 2;
            let default = f.version.as_ref().is_some_and(|v| v.default);
            w.u8(flags | (default as u8) << 3 | (f.variant_pcs as u8) << 4).u8(source_code(f.source));
            if let Some(v) = &f.version {
                w.str(&v.name);
            }
        }
        w.bool(self.has_symtab);
        let mangled: Vec<u64> = (0..self.mangled.len()).filter(|&i| self.mangled[i]).map(|i| i as u64).collect();
        sorted(&mut w, &mangled);
        sorted(&mut w, self.pads.pads());
        w.var(self.pads.unreadable_ranges().len() as u64);
        for &(lo, hi) in self.pads.unreadable_ranges() {
            w.var(lo).var(hi);
        }
        sorted(&mut w, &self.branch_targets);
        w.bool(self.facts.0);
        sorted(&mut w, &self.facts.1);
        match &self.go {
            None => {
                w.u8(0);
            }
            Some((entries, all, returns)) => {
                w.u8(1).bool(*all);
                w.list(entries);
                w.list(returns);
            }
        }
        match &self.dwarf {
            SavedDwarf::None => w.u8(0),
            SavedDwarf::Unreadable => w.u8(1),
            SavedDwarf::Index(stored) => w.u8(2).blob(stored.bytes()),
        };
        w.into_bytes()
    }

    /// The analysis in `bytes`, if they are one, whole and well-formed.
    pub fn decode(bytes: &[u8]) -> Result<Saved, Bad> {
        let mut r = Reader::new(bytes);
        if r.u32()? != VERSION {
            return Err(Bad("another version"));
        }
        let headers = decode_headers(&mut r)?;
        let n = r.count(3)?;
        let mut places = Vec::with_capacity(n);
        for _ in 0..n {
            let in_root = r.bool()?;
            let path = r.blob()?.to_vec();
            let file = if r.bool()? { Some(read_identity(&mut r)?) } else { None };
            places.push(Place { in_root, path, file });
        }
        let names = r.str()?;
        let n = r.count(5)?;
        let mut functions = Vec::with_capacity(n);
        let mut last = 0u64;
        let mut at = 0usize;
        for _ in 0..n {
            let len = usize::try_from(r.var()?).map_err(|_| Bad("a name out of range"))?;
            let end = at.checked_add(len).ok_or(Bad("a name out of range"))?;
            let name = names.get(at..end).ok_or(Bad("a name out of range"))?.to_string();
            at = end;
            let addr = last.checked_add(r.var()?).ok_or(Bad("an address out of range"))?;
            last = addr;
            let size = r.var()?;
            let flags = r.u8()?;
            let source = source_of(r.u8()?)?;
            if flags & !0x1f != 0 {
                return Err(Bad("unknown symbol flags"));
            }
            let version =
                if flags & 4 != 0 { Some(Version { name: r.string()?, default: flags & 8 != 0 }) } else { None };
            functions.push(FuncSym {
                name,
                addr: FileAddr(addr),
                size,
                global: flags & 1 != 0,
                ifunc: flags & 2 != 0,
                variant_pcs: flags & 16 != 0,
                version,
                source,
            });
        }
        let has_symtab = r.bool()?;
        let mut mangled = vec![false; functions.len()];
        for i in read_sorted(&mut r)? {
            *mangled.get_mut(i as usize).ok_or(Bad("a symbol out of range"))? = true;
        }
        let pads = read_sorted(&mut r)?;
        let n = r.count(2)?;
        let mut unreadable = Vec::with_capacity(n);
        for _ in 0..n {
            unreadable.push((r.var()?, r.var()?));
        }
        let branch_targets = read_sorted(&mut r)?;
        let facts = (r.bool()?, read_sorted(&mut r)?);
        let go = match r.u8()? {
            0 => None,
            1 => Some((r.bool()?, r.list()?, r.list()?)).map(|(all, e, s)| (e, all, s)),
            _ => return Err(Bad("an unknown Go table tag")),
        };
        let dwarf = match r.u8()? {
            0 => SavedDwarf::None,
            1 => SavedDwarf::Unreadable,
            2 => SavedDwarf::Index(StoredDwarf::from_bytes(r.blob()?.to_vec())),
            _ => return Err(Bad("an unknown DWARF tag")),
        };
        r.finish()?;
        Ok(Saved {
            headers,
            places,
            functions,
            has_symtab,
            mangled,
            pads: LandingPads::from_parts(pads, unreadable),
            branch_targets,
            facts,
            go,
            dwarf,
        })
    }
}

fn encode_headers(w: &mut Writer, h: &Headers) {
    w.u32(u32::from(h.machine)).bool(h.position_independent).var(h.segments.len() as u64);
    for s in &h.segments {
        w.var(s.vaddr).var(s.memsz).var(s.offset).var(s.filesz).bool(s.exec);
    }
    match &h.build_id {
        Some(id) => w.u8(1).blob(id),
        None => w.u8(0),
    };
    match &h.debuglink {
        Some((name, crc)) => w.u8(1).str(name).u32(*crc),
        None => w.u8(0),
    };
    w.var(h.sections.len() as u64);
    for s in &h.sections {
        w.str(&s.name).var(s.offset).var(s.size).var(s.addr).var(s.flags).bool(s.nobits);
    }
}

fn decode_headers(r: &mut Reader) -> Result<Headers, Bad> {
    let machine = u16::try_from(r.u32()?).map_err(|_| Bad("a machine out of range"))?;
    let position_independent = r.bool()?;
    let n = r.count(5)?;
    let mut segments = Vec::with_capacity(n);
    for _ in 0..n {
        segments.push(Segment {
            vaddr: r.var()?,
            memsz: r.var()?,
            offset: r.var()?,
            filesz: r.var()?,
            exec: r.bool()?,
        });
    }
    let build_id = if r.bool()? { Some(r.blob()?.to_vec()) } else { None };
    let debuglink = if r.bool()? { Some((r.string()?, r.u32()?)) } else { None };
    let n = r.count(6)?;
    let mut sections = Vec::with_capacity(n);
    for _ in 0..n {
        sections.push(Section {
            name: r.string()?,
            offset: r.var()?,
            size: r.var()?,
            addr: r.var()?,
            flags: r.var()?,
            nobits: r.bool()?,
        });
    }
    Ok(Headers { machine, position_independent, segments, build_id, debuglink, sections })
}

fn source_code(s: Source) -> u8 {
    match s {
        Source::Symtab => 0,
        Source::DebugFile => 1,
        Source::Dynsym => 2,
        Source::EhFrame => 3,
    }
}

fn source_of(code: u8) -> Result<Source, Bad> {
    Ok(match code {
        0 => Source::Symtab,
        1 => Source::DebugFile,
        2 => Source::Dynsym,
        3 => Source::EhFrame,
        _ => return Err(Bad("an unknown symbol source")),
    })
}

/// A strictly increasing list, as differences.
fn sorted(w: &mut Writer, values: &[u64]) {
    w.var(values.len() as u64);
    let mut last = 0;
    for &v in values {
        w.var(v.wrapping_sub(last));
        last = v;
    }
}

/// A list written by [`sorted`]: it must be strictly increasing.
fn read_sorted(r: &mut Reader) -> Result<Vec<u64>, Bad> {
    let n = r.count(1)?;
    let mut out = Vec::with_capacity(n);
    let mut last = 0u64;
    for i in 0..n {
        let d = r.var()?;
        if i > 0 && d == 0 {
            return Err(Bad("a list out of order"));
        }
        last = last.checked_add(d).ok_or(Bad("a value out of range"))?;
        out.push(last);
    }
    Ok(out)
}

/// What identifies a module's analysis in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The key's bytes.
    pub bytes: Vec<u8>,
    /// True if the file has not changed lately: an analysis may be saved
    /// under it.
    pub settled: bool,
}

impl Key {
    /// The entry's name.
    pub fn name(&self) -> String {
        name_for(KIND, &self.bytes)
    }
}

/// The identity of tp's own executable: a rebuilt tp does not read what
/// another build saved.
fn own_identity() -> Option<FileId> {
    static OWN: OnceLock<Option<FileId>> = OnceLock::new();
    *OWN.get_or_init(|| std::fs::metadata("/proc/self/exe").ok().map(|m| FileId::of(&m)))
}

/// Seconds since the epoch.
pub(super) fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Writes `places` (the places of a debug file) as an analysis holds them.
pub(super) fn write_places(w: &mut Writer, places: &[Place]) {
    w.var(places.len() as u64);
    for p in places {
        w.bool(p.in_root).blob(&p.path);
        match &p.file {
            Some(id) => {
                w.u8(1);
                identity(w, id);
            }
            None => {
                w.u8(0);
            }
        }
    }
}

fn identity(w: &mut Writer, id: &FileId) {
    w.u64(id.dev).u64(id.ino).u64(id.size);
    w.u64(id.mtime.0 as u64).u64(id.mtime.1 as u64).u64(id.ctime.0 as u64).u64(id.ctime.1 as u64);
}

fn read_identity(r: &mut Reader) -> Result<FileId, Bad> {
    let (dev, ino, size) = (r.u64()?, r.u64()?, r.u64()?);
    let mtime = (r.u64()? as i64, r.u64()? as i64);
    let ctime = (r.u64()? as i64, r.u64()? as i64);
    Ok(FileId { dev, ino, size, mtime, ctime })
}

/// The key of the analysis of the file whose identity is `file`; None if
/// tp cannot tell its own build apart.
pub fn key(file: &FileId) -> Option<Key> {
    let own = own_identity()?;
    let mut w = Writer::new();
    w.str("tp module analysis").u32(VERSION);
    identity(&mut w, &own);
    identity(&mut w, file);
    Some(Key { bytes: w.into_bytes(), settled: file.settled(now()) })
}

/// The cache, opened once.
pub(super) fn store() -> Option<&'static Store> {
    static STORE: OnceLock<Option<Store>> = OnceLock::new();
    STORE.get_or_init(Store::open).as_ref()
}

/// The analysis saved under `key` for the file the process sees at `path`
/// (its files under `root`), if there is a good one and the places of the
/// debug file are as they were.
pub fn load(key: &Key, path: &Path, root: &Path) -> Option<Saved> {
    let bytes = store()?.load(&key.name(), &key.bytes)?;
    let saved = Saved::decode(&bytes).ok()?;
    (places(&saved.headers, path, root) == saved.places).then_some(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn target(name: &str) -> PathBuf {
        Path::new(env!("TP_TARGETS_DIR")).join(name)
    }

    fn analysis_of(path: &Path) -> Saved {
        let mut elf = ElfFile::open(path, path).unwrap();
        let debug = debuginfo::find(&elf, path, Path::new("/"));
        if let Some(d) = &debug {
            elf.adopt_symbols(d);
        }
        if !elf.has_symtab {
            super::super::eh::add_unwind_functions(&mut elf);
        }
        let places = places(&elf.headers(), path, Path::new("/"));
        Saved::compute(&elf, debug.as_ref(), places, &Known::default())
    }

    #[test]
    fn an_analysis_reads_back_as_computed() {
        for name in ["counter", "counter-stripped", "shapes", "rusty-v0"] {
            let saved = analysis_of(&target(name));
            assert!(!saved.functions.is_empty() && !saved.branch_targets.is_empty(), "{name}");
            assert_eq!(Saved::decode(&saved.encode()), Ok(saved.clone()), "{name}");
        }
        let counter = analysis_of(&target("counter"));
        let SavedDwarf::Index(stored) = &counter.dwarf else { panic!("counter has DWARF") };
        let index = stored.index().unwrap();
        assert!(index.functions.iter().any(|f| f.name == "bar" && f.params.len() == 2));
        // One function read from the saved bytes is the whole index's.
        for f in &index.functions {
            assert_eq!(stored.at(f.entry).as_ref(), Some(f));
        }
        assert_eq!(stored.at(FileAddr(1)), None);
    }

    #[test]
    fn libc_and_its_debug_file_read_back_as_computed() {
        // The libc this test runs with, and its debug file (libc6-dbg, which
        // the e2e tests install): the largest analysis of the tests.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        let saved = analysis_of(Path::new(libc));
        assert!(saved.functions.iter().any(|f| f.name == "_int_malloc"), "libc6-dbg is installed (see .ci/run)");
        let source =
            debuginfo::find(&ElfFile::open(Path::new(libc), Path::new(libc)).unwrap(), Path::new(libc), Path::new("/"));
        let whole = dwarf::index(&source.unwrap()).unwrap();
        assert!(whole.functions.len() > 1000);
        assert!(matches!(&saved.dwarf, SavedDwarf::Index(stored) if stored.index() == Some(whole)));
        assert_eq!(Saved::decode(&saved.encode()), Ok(saved));
    }

    #[test]
    fn damaged_analyses_are_errors_not_panics() {
        let bytes = analysis_of(&target("counter")).encode();
        for n in 0..bytes.len() {
            assert!(Saved::decode(&bytes[..n]).is_err(), "a prefix of {n} bytes");
        }
        // Bytes changed here and there decode to something or to an error,
        // never a panic, and never allocate beyond what the bytes can hold.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut damaged = bytes.clone();
            for _ in 0..1 + x % 4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % damaged.len() as u64) as usize;
                damaged[at] = (x >> 32) as u8;
            }
            let _ = Saved::decode(&damaged);
        }
        // The DWARF index is checked when first read: damaged, it says nothing.
        let saved = analysis_of(&target("counter"));
        let SavedDwarf::Index(good) = &saved.dwarf else { panic!("counter has DWARF") };
        let bar = good.index().unwrap().functions.iter().find(|f| f.name == "bar").unwrap().entry;
        for n in 0..good.bytes().len() {
            let cut = StoredDwarf::from_bytes(good.bytes()[..n].to_vec());
            assert!(cut.index().is_none() && cut.at(bar).is_none(), "a prefix of {n} bytes");
        }
        for k in 0..good.bytes().len() {
            let mut bytes = good.bytes().to_vec();
            bytes[k] ^= 0x55;
            let damaged = StoredDwarf::from_bytes(bytes);
            let _ = (damaged.index(), damaged.at(bar));
        }
        // Lists that lookups search must be in order.
        let mut w = Writer::new();
        w.u32(VERSION);
        let headers = Headers {
            machine: 62,
            position_independent: true,
            segments: vec![],
            build_id: None,
            debuglink: None,
            sections: vec![],
        };
        encode_headers(&mut w, &headers);
        w.var(0).str("").var(0).bool(false);
        sorted(&mut w, &[]);
        sorted(&mut w, &[]);
        w.var(0);
        w.var(2).var(5).var(0);
        assert_eq!(Saved::decode(w.bytes()).unwrap_err(), Bad("a list out of order"));
    }

    #[test]
    fn the_key_names_the_file_and_the_places_its_debug_file() {
        let dir = std::env::temp_dir().join(format!("tp-key-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("counter-stripped");
        std::fs::copy(target("counter-stripped"), &file).unwrap();
        let id = || FileId::of(&std::fs::metadata(&file).unwrap());
        let first = key(&id()).unwrap();
        assert!(!first.settled, "a file written a moment ago is not saved");
        assert_eq!(key(&id()).unwrap(), first);
        // The file rewritten with the same bytes is another version of it.
        std::fs::copy(target("counter-stripped"), &file).unwrap();
        assert_ne!(key(&id()).unwrap().name(), first.name());
        // Its debug file appears where its debuglink says.
        let headers = ElfFile::open(&file, &file).unwrap().headers();
        let before = places(&headers, &file, Path::new("/"));
        assert!(before.iter().all(|p| p.file.is_none()) && !before.is_empty());
        std::fs::write(dir.join("counter-stripped.debug"), b"not yet").unwrap();
        let after = places(&headers, &file, Path::new("/"));
        assert_ne!(after, before);
        assert_eq!(after.iter().filter(|p| p.file.is_some()).count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
