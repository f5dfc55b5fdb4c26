//! A module's analysis as tp caches it ([`crate::cache`]): its symbols
//! (after those of its debug file and its unwind table are taken in), the
//! entries into its code (landing pads, every direct branch target), the
//! code addresses its data holds, its Go function table and its whole DWARF
//! index. That is everything slow to derive from a large binary; what is
//! left to read on a later attach is the file's headers and the bytes of the
//! probed functions.
//!
//! **Key.** An entry is used only for the very file it was made from, by the
//! very tp that made it: the key holds tp's own executable's identity, the
//! file's identity (device, inode, size, modification and change times:
//! [`FileId`]), its build-id and the hash of its headers, and, for every
//! place its debug file could be, that place's identity or its absence. A
//! file rewritten, replaced, or given a debug file since is another key.
//! Nothing is saved for a file that changed while tp read it, or within
//! the two seconds before (see [`FileId::settled`]).
//!
//! **Untrusted.** The files are the target's; the cache's directory is not
//! (see [`crate::cache::store`]). An entry is decoded as untrusted input
//! all the same: counts bounded by the bytes, every list checked to be
//! sorted where lookups depend on it, and any flaw a miss.
//!
//! **When.** A module that missed is queued; its analysis is computed and
//! saved by one background thread at idle priority, started once the probes
//! are live ([`start`]), and waited for before tp exits ([`finish`]). A
//! first attach therefore reads only what it needs (DWARF of one unit, the
//! code that can branch into one window) and pays for the whole analysis
//! after the target runs again.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use crate::cache::{Bad, Reader, Store, Writer, name_for};
use crate::process::files::FileId;

use super::debuginfo;
use super::dwarf::{self, DwFunction, DwarfIndex, Param, Type};
use super::eh::LandingPads;
use super::elf::{ElfFile, FuncSym, Source, Version};
use super::entries::Entries;
use super::golang::GoModule;
use super::image::CodeFacts;
use crate::addr::FileAddr;
use crate::arch::{Abi, Isa};

/// The version of what is saved and how it is computed: part of every key.
const VERSION: u32 = 1;

/// The kind of entry, in its file name.
const KIND: &str = "module";

/// What the cache says of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The functions, as `ElfFile::functions` holds them (sorted).
    pub functions: Vec<FuncSym>,
    /// True if they came from a symbol table (the file's or its debug file's).
    pub has_symtab: bool,
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
    Index(DwarfIndex),
}

impl Saved {
    /// The analysis of `elf` (whose symbols are final) and its debug file.
    pub fn compute(elf: &ElfFile, debug: Option<&ElfFile>) -> Saved {
        let isa = Isa::for_machine(elf.machine);
        let entries = Entries::of(elf, isa);
        let branch_targets = entries.branch_targets(elf).to_vec();
        let facts = CodeFacts::of(elf, isa);
        let go = GoModule::of(elf).map(|g| {
            let (entries, all, returns) = g.parts();
            (entries.to_vec(), all, returns.to_vec())
        });
        let source = [Some(elf), debug].into_iter().flatten().find(|e| e.has_dwarf());
        let dwarf = match source.map(dwarf::index) {
            None => SavedDwarf::None,
            Some(Ok(index)) => SavedDwarf::Index(index),
            Some(Err(_)) => SavedDwarf::Unreadable,
        };
        Saved {
            functions: elf.functions.clone(),
            has_symtab: elf.has_symtab,
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
        w.u32(VERSION).var(self.functions.len() as u64);
        let mut last = 0;
        for f in &self.functions {
            w.str(&f.name).var(f.addr.0.wrapping_sub(last)).var(f.size);
            last = f.addr.0;
            let flags = f.global as u8 | (f.ifunc as u8) << 1 | (f.version.is_some() as u8) << 2;
            let default = f.version.as_ref().is_some_and(|v| v.default);
            w.u8(flags | (default as u8) << 3).u8(source_code(f.source));
            if let Some(v) = &f.version {
                w.str(&v.name);
            }
        }
        w.bool(self.has_symtab);
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
                list(&mut w, entries);
                list(&mut w, returns);
            }
        }
        match &self.dwarf {
            SavedDwarf::None => w.u8(0),
            SavedDwarf::Unreadable => w.u8(1),
            SavedDwarf::Index(index) => w.u8(2).raw(&encode_dwarf(index)),
        };
        w.into_bytes()
    }

    /// The analysis in `bytes`, if they are one, whole and well-formed.
    pub fn decode(bytes: &[u8]) -> Result<Saved, Bad> {
        let mut r = Reader::new(bytes);
        if r.u32()? != VERSION {
            return Err(Bad("another version"));
        }
        let n = r.count(4)?;
        let mut functions = Vec::with_capacity(n);
        let mut last = 0u64;
        for _ in 0..n {
            let name = r.string()?;
            let addr = last.checked_add(r.var()?).ok_or(Bad("an address out of range"))?;
            last = addr;
            let size = r.var()?;
            let flags = r.u8()?;
            let source = source_of(r.u8()?)?;
            if flags & !0xf != 0 {
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
                version,
                source,
            });
        }
        let has_symtab = r.bool()?;
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
            1 => Some((r.bool()?, read_list(&mut r)?, read_list(&mut r)?)).map(|(all, e, s)| (e, all, s)),
            _ => return Err(Bad("an unknown Go table tag")),
        };
        let dwarf = match r.u8()? {
            0 => SavedDwarf::None,
            1 => SavedDwarf::Unreadable,
            2 => SavedDwarf::Index(decode_dwarf(&mut r)?),
            _ => return Err(Bad("an unknown DWARF tag")),
        };
        r.finish()?;
        Ok(Saved {
            functions,
            has_symtab,
            pads: LandingPads::from_parts(pads, unreadable),
            branch_targets,
            facts,
            go,
            dwarf,
        })
    }
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

/// A list in its own order.
fn list(w: &mut Writer, values: &[u64]) {
    w.var(values.len() as u64);
    for &v in values {
        w.var(v);
    }
}

fn read_list(r: &mut Reader) -> Result<Vec<u64>, Bad> {
    let n = r.count(1)?;
    (0..n).map(|_| r.var()).collect()
}

/// The DWARF index: its strings once each, then the functions by entry.
fn encode_dwarf(index: &DwarfIndex) -> Vec<u8> {
    let mut table: Vec<String> = Vec::new();
    let mut index_of: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut str_id = |s: &str| -> u64 {
        if let Some(&i) = index_of.get(s) {
            return i;
        }
        let i = table.len() as u64;
        table.push(s.to_string());
        index_of.insert(s.to_string(), i);
        i
    };
    let mut body = Writer::new();
    body.var(index.functions.len() as u64);
    let mut last = 0;
    for f in &index.functions {
        body.var(f.entry.0.wrapping_sub(last)).var(str_id(&f.name));
        last = f.entry.0;
        match &f.linkage_name {
            Some(l) => body.var(str_id(l) + 1),
            None => body.var(0),
        };
        body.u8(abi_code(f.abi));
        match &f.return_type {
            Some((name, ty)) => {
                body.u8(1).var(str_id(name));
                ty_code(&mut body, ty);
            }
            None => {
                body.u8(0);
            }
        }
        body.var(f.params.len() as u64);
        for p in &f.params {
            body.var(str_id(&p.name)).var(str_id(&p.type_name));
            ty_code(&mut body, &p.ty);
            match p.size {
                Some(s) => body.u8(1).var(s),
                None => body.u8(0),
            };
        }
    }
    body.var(index.inlined_only.len() as u64);
    for n in &index.inlined_only {
        body.var(str_id(n));
    }
    let mut w = Writer::new();
    w.var(table.len() as u64);
    for s in &table {
        w.str(s);
    }
    w.raw(body.bytes());
    w.into_bytes()
}

fn decode_dwarf(r: &mut Reader) -> Result<DwarfIndex, Bad> {
    let n = r.count(1)?;
    let mut table: Vec<&str> = Vec::with_capacity(n);
    for _ in 0..n {
        table.push(r.str()?);
    }
    let s = |r: &mut Reader| -> Result<String, Bad> {
        let i = usize::try_from(r.var()?).map_err(|_| Bad("a string out of range"))?;
        table.get(i).map(|s| s.to_string()).ok_or(Bad("a string out of range"))
    };
    let n = r.count(4)?;
    let mut functions = Vec::with_capacity(n);
    let mut last = 0u64;
    for i in 0..n {
        let d = r.var()?;
        if i > 0 && d == 0 {
            return Err(Bad("functions out of order"));
        }
        last = last.checked_add(d).ok_or(Bad("an address out of range"))?;
        let name = s(r)?;
        let linkage_name = match r.var()? {
            0 => None,
            k => Some(table.get(k as usize - 1).ok_or(Bad("a string out of range"))?.to_string()),
        };
        let abi = abi_of(r.u8()?)?;
        let return_type = match r.u8()? {
            0 => None,
            1 => Some((s(r)?, ty_of(r)?)),
            _ => return Err(Bad("an unknown return type tag")),
        };
        let np = r.count(4)?;
        let mut params = Vec::with_capacity(np);
        for _ in 0..np {
            let name = s(r)?;
            let type_name = s(r)?;
            let ty = ty_of(r)?;
            let size = match r.u8()? {
                0 => None,
                1 => Some(r.var()?),
                _ => return Err(Bad("an unknown size tag")),
            };
            params.push(Param { name, type_name, ty, size });
        }
        functions.push(DwFunction { name, linkage_name, entry: FileAddr(last), params, return_type, abi });
    }
    let n = r.count(1)?;
    let mut inlined_only = Vec::with_capacity(n);
    for _ in 0..n {
        inlined_only.push(s(r)?);
    }
    Ok(DwarfIndex { functions, inlined_only })
}

fn abi_code(a: Abi) -> u8 {
    match a {
        Abi::C => 0,
        Abi::Go => 1,
        Abi::GoStack => 2,
    }
}

fn abi_of(code: u8) -> Result<Abi, Bad> {
    Ok(match code {
        0 => Abi::C,
        1 => Abi::Go,
        2 => Abi::GoStack,
        _ => return Err(Bad("an unknown calling convention")),
    })
}

fn ty_code(w: &mut Writer, t: &Type) {
    match t {
        Type::Signed(n) => w.u8(0).u8(*n),
        Type::Unsigned(n) => w.u8(1).u8(*n),
        Type::Bool => w.u8(2),
        Type::Char => w.u8(3),
        Type::CString => w.u8(4),
        Type::Pointer => w.u8(5),
        Type::Float => w.u8(6),
        Type::Other => w.u8(7),
    };
}

fn ty_of(r: &mut Reader) -> Result<Type, Bad> {
    Ok(match r.u8()? {
        0 => Type::Signed(r.u8()?),
        1 => Type::Unsigned(r.u8()?),
        2 => Type::Bool,
        3 => Type::Char,
        4 => Type::CString,
        5 => Type::Pointer,
        6 => Type::Float,
        7 => Type::Other,
        _ => return Err(Bad("an unknown type")),
    })
}

/// What identifies a module's analysis in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The key's bytes.
    pub bytes: Vec<u8>,
    /// True if the files it names have not changed lately: an analysis
    /// may be saved under it.
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

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn identity(w: &mut Writer, id: &FileId) {
    w.u64(id.dev).u64(id.ino).u64(id.size);
    w.u64(id.mtime.0 as u64).u64(id.mtime.1 as u64).u64(id.ctime.0 as u64).u64(id.ctime.1 as u64);
}

/// The key of the analysis of `elf` (read from its file, headers parsed),
/// which the process sees at `path` with its files under `root`; None if
/// it cannot be cached (its identity is unknown: it changed while read).
pub fn key(elf: &ElfFile, path: &Path, root: &Path) -> Option<Key> {
    let file = elf.identity?;
    let own = own_identity()?;
    let now = now();
    let mut settled = file.settled(now);
    let mut w = Writer::new();
    w.str("tp module analysis").u32(VERSION);
    identity(&mut w, &own);
    identity(&mut w, &file);
    w.blob(elf.build_id.as_deref().unwrap_or_default()).u64(elf.shape_hash());
    // Where its debug file may be, each there or not: the answer to which
    // one tp would take.
    let candidates = debuginfo::candidates(elf, path, root);
    w.var(candidates.len() as u64);
    for c in &candidates {
        match c.path.strip_prefix(root) {
            Ok(rel) => w.u8(0).blob(rel.as_os_str().as_encoded_bytes()),
            Err(_) => w.u8(1).blob(c.path.as_os_str().as_encoded_bytes()),
        };
        match std::fs::metadata(&c.path) {
            Ok(m) => {
                let id = FileId::of(&m);
                settled &= id.settled(now);
                w.u8(1);
                identity(&mut w, &id);
            }
            Err(_) => {
                w.u8(0);
            }
        }
    }
    Some(Key { bytes: w.into_bytes(), settled })
}

/// The cache, opened once.
fn store() -> Option<&'static Store> {
    static STORE: OnceLock<Option<Store>> = OnceLock::new();
    STORE.get_or_init(Store::open).as_ref()
}

/// The analysis saved under `key`, if there is a good one.
pub fn load(key: &Key) -> Option<Saved> {
    let bytes = store()?.load(&key.name(), &key.bytes)?;
    Saved::decode(&bytes).ok()
}

/// A module whose analysis is to be saved.
struct Job {
    key: Key,
    elf: Arc<ElfFile>,
    debug: Option<Arc<ElfFile>>,
}

/// The modules waiting, and the thread that saves them.
struct Queue {
    jobs: Vec<Job>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// The worker's thread ID, to raise its priority when tp waits for it.
    worker_tid: i32,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { jobs: Vec::new(), worker: None, worker_tid: 0 });

fn queue() -> std::sync::MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Queues the analysis of `elf` (symbols final) and its debug file to be
/// saved under `key`, if the key's files are settled and there is a cache.
pub fn enqueue(key: Key, elf: Arc<ElfFile>, debug: Option<Arc<ElfFile>>) {
    if !key.settled || store().is_none() {
        return;
    }
    let mut q = queue();
    if !q.jobs.iter().any(|j| j.key == key) {
        q.jobs.push(Job { key, elf, debug });
    }
}

/// Starts saving what is queued, on a thread of idle priority (it runs
/// only when nothing else wants the CPU). Call once the probes are live.
pub fn start() {
    let mut q = queue();
    if q.jobs.is_empty() || q.worker.as_ref().is_some_and(|w| !w.is_finished()) {
        return;
    }
    if let Some(w) = q.worker.take() {
        let _ = w.join();
    }
    let spawned = std::thread::Builder::new().name("tp-cache".into()).spawn(|| {
        // SAFETY: gettid has no preconditions; sched_setscheduler on the
        // calling thread with a valid policy and parameter.
        unsafe {
            queue().worker_tid = libc::gettid();
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
        loop {
            let Some(job) = queue().jobs.pop() else { break };
            let saved = Saved::compute(&job.elf, job.debug.as_deref());
            if let Some(store) = store() {
                let _ = store.save(&job.key.name(), &job.key.bytes, &saved.encode());
            }
        }
    });
    q.worker = spawned.ok();
}

/// Saves what is queued and waits until it is saved: tp calls it before it
/// exits. The saving thread gets normal priority for it.
pub fn finish() {
    start();
    let (worker, tid) = {
        let mut q = queue();
        (q.worker.take(), q.worker_tid)
    };
    if let Some(w) = worker {
        if tid > 0 {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: a thread of this process, a valid policy and parameter.
            unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
        }
        let _ = w.join();
    }
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
            elf.add_unwind_functions();
        }
        Saved::compute(&elf, debug.as_ref())
    }

    #[test]
    fn an_analysis_reads_back_as_computed() {
        for name in ["counter", "counter-stripped", "shapes", "rusty-v0"] {
            let saved = analysis_of(&target(name));
            assert!(!saved.functions.is_empty() && !saved.branch_targets.is_empty(), "{name}");
            assert_eq!(Saved::decode(&saved.encode()), Ok(saved.clone()), "{name}");
        }
        let counter = analysis_of(&target("counter"));
        let SavedDwarf::Index(index) = &counter.dwarf else { panic!("counter has DWARF") };
        assert!(index.functions.iter().any(|f| f.name == "bar" && f.params.len() == 2));
    }

    #[test]
    fn libc_and_its_debug_file_read_back_as_computed() {
        // The libc this test runs with, and its debug file (libc6-dbg, which
        // the e2e tests install): the largest analysis of the tests.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        let saved = analysis_of(Path::new(libc));
        assert!(saved.functions.iter().any(|f| f.name == "_int_malloc"), "libc6-dbg is installed (see .ci/run)");
        assert!(matches!(&saved.dwarf, SavedDwarf::Index(i) if i.functions.len() > 1000));
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
        // Lists that lookups search must be in order.
        let mut w = Writer::new();
        w.u32(VERSION).var(0).bool(false);
        sorted(&mut w, &[]);
        w.var(0);
        w.var(2).var(5).var(0);
        assert_eq!(Saved::decode(w.bytes()).unwrap_err(), Bad("a list out of order"));
    }

    #[test]
    fn the_key_names_the_file_its_version_and_its_debug_file() {
        let dir = std::env::temp_dir().join(format!("tp-key-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("counter-stripped");
        std::fs::copy(target("counter-stripped"), &file).unwrap();
        let key = || key(&ElfFile::open(&file, &file).unwrap(), &file, Path::new("/")).unwrap();
        let first = key();
        assert!(!first.settled, "a file written a moment ago is not saved");
        assert_eq!(key(), first);
        // Its debug file appears where its debuglink says.
        std::fs::write(dir.join("counter-stripped.debug"), b"not yet").unwrap();
        let with_debug = key();
        assert_ne!(with_debug, first);
        // The file rewritten with the same bytes is another version of it.
        std::fs::copy(target("counter-stripped"), &file).unwrap();
        assert_ne!(key(), with_debug);
        assert_ne!(key().name(), first.name());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
