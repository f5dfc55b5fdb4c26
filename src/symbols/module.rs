//! One module (a mapped ELF file) of a process: its symbols with their
//! demangled names and versions, its load bias, copies of its code mapped
//! elsewhere, its separate debug information and DWARF, all parsed on first
//! use; and what a name means in it (every copy of a function so named, the
//! default version of a versioned symbol).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail};

use super::demangle::Names;
use super::dwarf::{self, DwFunction, DwarfIndex};
use super::dwarf_index::LazyDwarf;
use super::eh::ReturnSaves;
use super::elf::{ElfFile, FuncSym, Opened, Version, split_version};
use super::pattern::{Glob, glob};
use super::plan_cache::PlanCache;
use super::planner::{Planner, PlannerParts};
use super::saved::{self, Saved, SavedDwarf};
use super::{Function, cold_targets, debuginfo, suggestions};
use crate::addr::{Bias, FileAddr, RuntimeAddr};
use crate::arch::host_isa;
use crate::arch::{Arch, Host};
use crate::process::Mapping;
use crate::process::maps::Span;

/// Part of a module's code mapped a second time elsewhere, from the same
/// file: V8 (node) maps its embedded builtins again next to its JIT code,
/// so that JIT code reaches them with short calls. Code there runs as well
/// as the original, so a probe on a function there goes on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeCopy {
    /// Where the copy is mapped.
    pub span: Span,
    /// Where the file addresses it holds are at run time in it.
    pub bias: Bias,
}

impl CodeCopy {
    /// True if the copy holds all of `[addr, addr + size)` (file addresses).
    fn holds(&self, addr: FileAddr, size: u64) -> bool {
        let RuntimeAddr(at) = self.bias.runtime(addr);
        self.span.lo <= at && at.checked_add(size.max(1)).is_some_and(|end| end <= self.span.hi)
    }
}

/// A module's file as read: parsed, or its analysis from the cache.
#[derive(Debug)]
pub struct Read(ElfFile, Cached);

/// Functions looked up one unit at a time before the whole DWARF index is
/// built instead.
const WHOLE_DWARF_AFTER: usize = 32;

/// What the cache holds for a file.
#[derive(Debug)]
enum Cached {
    /// Its analysis.
    Hit(Box<Saved>, saved::Key),
    /// Nothing yet: the analysis is to be saved under this key; the places
    /// of its debug file were these before it was read.
    Miss(saved::Key, Vec<saved::Place>),
    /// It cannot be cached.
    Uncachable,
}

/// What one exact name means in a module.
#[derive(Debug, Clone)]
pub struct Named {
    /// Every function so named, with every copy of its code: one probe each.
    pub functions: Vec<Function>,
    /// What was chosen when the name means more than one function (versions
    /// left out, copies of a generic, remapped code), in one line each.
    pub notes: Vec<String>,
}

/// A file mapped into a process, with where it was loaded.
#[derive(Debug)]
pub struct Module {
    /// The file's path as the process sees it.
    pub path: PathBuf,
    /// Its name for display: the file name, e.g. `libc.so.6`, or for the
    /// executable the name the process was started by (`redis-server` for
    /// the file `redis-check-rdb` its symlink points to).
    pub name: String,
    /// Where its file addresses are at run time.
    pub bias: Bias,
    /// The addresses its mappings at that bias cover (copies of its code
    /// elsewhere are in `copies`).
    pub span: Span,
    /// Parts of its code mapped again elsewhere.
    pub copies: Vec<CodeCopy>,
    /// The parsed file (with symbols from its debug file if it is stripped).
    pub elf: Arc<ElfFile>,
    /// Its separate debug file, if one was found; looked for on first need
    /// when the file's analysis came from the cache.
    debug: OnceLock<Option<Arc<ElfFile>>>,
    /// The directory the process's paths are relative to.
    root: PathBuf,
    /// What planning needs, as the cache held it, until the planner takes it.
    saved_planner: Mutex<Option<PlannerParts>>,
    /// Each symbol's names besides its own (None: it has no others).
    names: OnceLock<Vec<Option<Names>>>,
    /// Which symbols demangle, as the cache held it.
    cached_mangled: Option<Vec<bool>>,
    dwarf: Arc<OnceLock<Option<DwarfIndex>>>,
    /// Every branch target of the code, once decoded (shared with the planner
    /// and the analysis being saved).
    branch_targets: Arc<OnceLock<Vec<u64>>>,
    /// DWARF read one unit at a time, until the whole index is built.
    lazy_dwarf: Mutex<Option<LazyDwarf>>,
    /// The DWARF the cache held.
    cached_dwarf: Option<SavedDwarf>,
    planner: OnceLock<Planner>,
    /// Entry plans kept across sessions.
    plans: Arc<PlanCache>,
    return_saves: OnceLock<ReturnSaves>,
}

impl Module {
    /// A module from the mappings of one file, read through `read_path`;
    /// `path` is the file as the process sees it, and `root` the directory
    /// its paths are relative to (`/proc/PID/root`, or `/`).
    pub fn load(read_path: &Path, path: &Path, root: &Path, mappings: &[&Mapping]) -> Result<Module> {
        Self::load_read(Self::read(read_path, path, root)?, path, root, mappings)
    }

    /// [`Module::load`] of what [`Module::read_file`] read.
    pub fn load_read(read: Read, path: &Path, root: &Path, mappings: &[&Mapping]) -> Result<Module> {
        let Read(elf, saved) = read;
        if elf.machine != Host::ELF_MACHINE {
            bail!(
                "`{}` is {}; this tp traces {} processes",
                path.display(),
                crate::arch::machine_name(elf.machine),
                Host::NAME
            );
        }
        let bias = load_bias(&elf, mappings).context("cannot compute the load bias")?;
        let (span, copies) = images(&elf, bias, mappings);
        let mut m = Module::with(elf, saved, path, root, bias, span);
        m.copies = copies;
        Ok(m)
    }

    /// A module for a file on disk that is not loaded anywhere (bias 0).
    pub fn from_file(path: &Path) -> Result<Module> {
        let root = Path::new("/");
        let Read(elf, saved) = Self::read(path, path, root)?;
        Ok(Module::with(elf, saved, path, root, Bias::ZERO, Span { lo: 0, hi: 0 }))
    }

    /// Reads the file at `read_path` (`path` as the process sees it, under
    /// `root`): from the cache if it holds the analysis of this very file,
    /// reading nothing of it then but what is later asked for; else all of
    /// it, parsed.
    fn read(read_path: &Path, path: &Path, root: &Path) -> Result<Read> {
        let opened = Opened::open(read_path, path)?;
        let key = saved::key(&opened.identity);
        if let Some(k) = key.clone()
            && let Some(mut s) = saved::load(&k, path, root)
        {
            let functions = std::mem::take(&mut s.functions);
            let elf = ElfFile::from_parts(opened, s.headers.clone(), functions, s.has_symtab, read_path);
            return Ok(Read(elf, Cached::Hit(Box::new(s), k)));
        }
        let elf = ElfFile::parse_opened(opened, read_path, path)?;
        // Where its debug file may be, before one is read.
        let places = saved::places(&elf.headers(), path, root);
        Ok(Read(elf, key.map_or(Cached::Uncachable, |k| Cached::Miss(k, places))))
    }

    /// What [`Module::load`] reads of the file at `read_path` (`path` as the
    /// process sees it, under `root`), which a caller may read ahead of
    /// time on another thread.
    pub fn read_file(read_path: &Path, path: &Path, root: &Path) -> Result<Read> {
        Self::read(read_path, path, root)
    }

    /// The module of `elf` (the file `path`, under `root`): with the
    /// analysis the cache held, or with the symbols of its separate debug
    /// file when it lacks its own (its analysis then queued to be saved).
    fn with(elf: ElfFile, cached: Cached, path: &Path, root: &Path, bias: Bias, span: Span) -> Module {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let debug = OnceLock::new();
        let dwarf = Arc::new(OnceLock::new());
        if let Cached::Hit(s, key) = cached {
            let s = *s;
            let plans = PlanCache::new(Some(&key), &s.places);
            let parts = PlannerParts { pads: s.pads, branch_targets: s.branch_targets, facts: s.facts, go: s.go };
            let mut m = Module::assemble(Arc::new(elf), debug, dwarf, Some(parts), path, root, name, bias, span);
            m.plans = Arc::new(plans);
            m.cached_dwarf = Some(s.dwarf);
            m.cached_mangled = Some(s.mangled);
            return m;
        }
        let mut elf = elf;
        let found = if elf.has_symtab && elf.has_dwarf() { None } else { debuginfo::find(&elf, path, root) };
        if let Some(d) = &found {
            elf.adopt_symbols(d);
        }
        if !elf.has_symtab {
            super::eh::add_unwind_functions(&mut elf);
        }
        let found = found.map(Arc::new);
        let _ = debug.set(found.clone());
        let elf = Arc::new(elf);
        let mut m = Module::assemble(elf, debug, dwarf, None, path, root, name, bias, span);
        if let Cached::Miss(key, places) = cached {
            m.plans = Arc::new(PlanCache::new(Some(&key), &places));
            let known = saved::Known { dwarf: m.dwarf.clone(), branch_targets: m.branch_targets.clone() };
            super::saving::enqueue(key, m.elf.clone(), found, places, known, path, root);
        }
        m
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        elf: Arc<ElfFile>,
        debug: OnceLock<Option<Arc<ElfFile>>>,
        dwarf: Arc<OnceLock<Option<DwarfIndex>>>,
        saved_planner: Option<PlannerParts>,
        path: &Path,
        root: &Path,
        name: String,
        bias: Bias,
        span: Span,
    ) -> Module {
        Module {
            path: path.to_path_buf(),
            name,
            bias,
            span,
            copies: Vec::new(),
            elf,
            debug,
            root: root.to_path_buf(),
            saved_planner: Mutex::new(saved_planner),
            names: OnceLock::new(),
            cached_mangled: None,
            dwarf,
            branch_targets: Arc::default(),
            lazy_dwarf: Mutex::new(None),
            cached_dwarf: None,
            planner: OnceLock::new(),
            plans: Arc::new(PlanCache::none()),
            return_saves: OnceLock::new(),
        }
    }

    /// Its separate debug file, if it has one.
    pub fn debug(&self) -> Option<&ElfFile> {
        self.debug
            .get_or_init(|| {
                let needed = !(self.elf.has_symtab && self.elf.has_dwarf());
                needed.then(|| debuginfo::find(&self.elf, &self.path, &self.root)).flatten().map(Arc::new)
            })
            .as_deref()
    }

    /// Where the planner keeps every branch target of the code.
    pub(super) fn branch_targets_cell(&self) -> Arc<OnceLock<Vec<u64>>> {
        self.branch_targets.clone()
    }

    /// What the cache held for the planner, once.
    pub(super) fn take_saved_planner(&self) -> Option<PlannerParts> {
        self.saved_planner.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The names of each symbol of `elf.functions` besides the one it is
    /// stored under, demangled on first use (only those the cache says
    /// demangle, when it held the module).
    fn names(&self) -> &[Option<Names>] {
        self.names.get_or_init(|| {
            let syms = &self.elf.functions;
            (0..syms.len())
                .map(|i| {
                    if self.cached_mangled.as_ref().is_some_and(|m| !m.get(i).copied().unwrap_or(true)) {
                        return None;
                    }
                    Some(Names::of(&syms[i].name)).filter(Names::has_others)
                })
                .collect()
        })
    }

    /// The name symbol `i` is shown by.
    fn display_name(&self, i: usize) -> &str {
        self.names()[i].as_ref().map_or(&self.elf.functions[i].name, |n| n.display())
    }

    /// True if one of symbol `i`'s names passes `test`.
    fn answers_to(&self, i: usize, test: impl Fn(&str) -> bool) -> bool {
        match &self.names()[i] {
            None => test(&self.elf.functions[i].name),
            Some(n) => n.all().any(test),
        }
    }

    /// What planning a probe needs of this module beyond a function's bytes
    /// (entries, code facts), read on first use.
    pub fn planner(&self) -> &Planner {
        self.planner.get_or_init(|| Planner::of(&self.elf, self.take_saved_planner(), self.branch_targets_cell()))
    }

    /// The entry plans this module's file keeps across sessions.
    pub fn plans(&self) -> &Arc<PlanCache> {
        &self.plans
    }

    /// The module's DWARF index (from the file or its debug file), built on first use.
    pub fn dwarf(&self) -> Option<&DwarfIndex> {
        self.dwarf
            .get_or_init(|| match &self.cached_dwarf {
                Some(SavedDwarf::Index(stored)) => stored.index(),
                Some(SavedDwarf::None | SavedDwarf::Unreadable) => None,
                None => dwarf::index(self.dwarf_file()?).ok(),
            })
            .as_ref()
    }

    /// The file address of the data symbol `name` (`.symtab`, `.dynsym`, or
    /// the debug file's), for static probe arguments that name one.
    pub fn data_symbol(&self, name: &str) -> Option<FileAddr> {
        [Some(&*self.elf), self.debug()].into_iter().flatten().find_map(|e| e.data_symbol(name))
    }

    /// What DWARF says of the function entered at `entry` (a file address):
    /// from the whole index if it was built, else from the cache, else from
    /// the one unit that holds it ([`LazyDwarf`]).
    pub fn dwarf_at(&self, entry: FileAddr) -> Option<DwFunction> {
        if let Some(index) = self.dwarf.get() {
            return index.as_ref()?.at(entry).cloned();
        }
        match &self.cached_dwarf {
            Some(SavedDwarf::Index(stored)) => return stored.at(entry),
            Some(SavedDwarf::None | SavedDwarf::Unreadable) => return None,
            None => {}
        }
        let src = self.dwarf_file()?;
        let mut lazy = self.lazy_dwarf.lock().unwrap_or_else(|e| e.into_inner());
        if lazy.is_none() {
            *lazy = Some(LazyDwarf::new(src).ok()?);
        }
        // Many functions (a glob with --args): the whole index, once.
        if lazy.as_ref().is_some_and(|l| l.lookups() >= WHOLE_DWARF_AFTER) {
            drop(lazy);
            return self.dwarf()?.at(entry).cloned();
        }
        lazy.as_mut()?.function_at(src, entry).ok().flatten()
    }

    /// The field `param` `steps` (`req->uri.len`) of the function entered
    /// at `entry` (a file address), by the module's DWARF types, in at most
    /// `max_loads` loads; or why it cannot be followed, in one line (not
    /// escaped: [`super::fields`]).
    pub fn field_path(
        &self,
        entry: FileAddr,
        param: &str,
        steps: &[super::fields::Step],
        max_loads: usize,
    ) -> Result<super::fields::FieldPath, String> {
        let src = self.dwarf_file().ok_or_else(|| format!("`{}` has no debugging information", self.name))?;
        super::fields::resolve(src, entry, param, steps, max_loads)
    }

    /// The file that holds the module's DWARF: the file itself or its debug
    /// file (looked for now if the module's analysis came from the cache).
    pub fn dwarf_file(&self) -> Option<&ElfFile> {
        [Some(&*self.elf), self.debug()].into_iter().flatten().find(|e| e.has_dwarf())
    }

    /// Symbol `i` as a function in the code at `bias` (the module's own, or a copy's).
    fn function_at(&self, i: usize, bias: Bias) -> Function {
        let sym = &self.elf.functions[i];
        let mut name = self.display_name(i).to_string();
        if let Some(v) = sym.version.as_ref().filter(|v| !v.default) {
            name += &v.to_string();
        }
        Function {
            name,
            symbol: sym.name.clone(),
            module: self.name.clone(),
            addr: bias.runtime(sym.addr),
            size: sym.size,
            ifunc: sym.ifunc,
            version: sym.version.clone(),
            source: sym.source,
            bias,
        }
    }

    /// Symbol `i` where it is mapped: the module's own code, then every copy
    /// that holds all of it.
    fn everywhere(&self, i: usize) -> impl Iterator<Item = Function> + '_ {
        let sym = &self.elf.functions[i];
        let copies = self.copies.iter().filter(|c| c.holds(sym.addr, sym.size));
        std::iter::once(self.bias).chain(copies.map(|c| c.bias)).map(move |b| self.function_at(i, b))
    }

    /// The indices of the symbols called exactly `name` (with or without a
    /// version, `name@@VER` the default version VER, `name@VER` version VER).
    fn called(&self, name: &str) -> Vec<usize> {
        let (base, want) = split_version(name);
        let syms = &self.elf.functions;
        (0..syms.len())
            .filter(|&i| self.answers_to(i, |n| n == base) && version_matches(syms[i].version.as_ref(), want.as_ref()))
            .collect()
    }

    /// Every function called exactly `name` (mangled or demangled, with or
    /// without parameters), with every copy of its code, or what exists
    /// instead. A name without a version means the default version, as
    /// programs linked today call it; a name several functions share (the
    /// copies of a Rust generic, C functions local to their files) means
    /// all of them.
    pub fn named(&self, name: &str) -> Result<Named> {
        let mut hits = self.called(name);
        if hits.is_empty() {
            let hint = suggestions(name, (0..self.elf.functions.len()).map(|i| self.display_name(i)));
            let stripped = if self.elf.has_symtab {
                ""
            } else {
                " (the file is stripped: only its exported functions and, as `sub_<address>`, the functions \
                 its unwind table lists are known; install its debug symbols, point TP_DEBUG_DIRS at them, or name a \
                 debuginfod server in DEBUGINFOD_URLS)"
            };
            bail!("function `{name}` not found in `{}`{stripped}{hint}", self.path.display());
        }
        let syms = &self.elf.functions;
        let mut notes = Vec::new();
        let compat = |i: &usize| syms[*i].version.as_ref().is_some_and(|v| !v.default);
        if split_version(name).1.is_none() && hits.iter().any(|i| !compat(i)) && hits.iter().any(compat) {
            let mut left: Vec<String> = hits.iter().filter(|i| compat(i)).map(|&i| self.version_text(i)).collect();
            left.dedup();
            hits.retain(|i| !compat(i));
            let chosen = hits.iter().find_map(|&i| syms[i].version.as_ref()).map_or(String::new(), |v| format!(" {v}"));
            notes.push(format!(
                "`{name}` in `{}` is its default version{chosen}, which programs call; not probed: {} (name it \
                 `{name}{}` to probe that)",
                self.name,
                left.join(", "),
                left[0]
            ));
        }
        // One function per address (aliases dropped).
        hits.sort_by_key(|&i| syms[i].addr);
        hits.dedup_by_key(|i| syms[*i].addr);
        let functions: Vec<Function> = hits.iter().flat_map(|&i| self.everywhere(i)).collect();
        if hits.len() > 1 {
            let at: Vec<String> = hits.iter().map(|&i| format!("{:#x}", self.bias.runtime(syms[i].addr))).collect();
            notes.push(format!(
                "`{name}` names {} functions in `{}` (at {}: copies of one generic, or functions of one name); \
                 probing all of them",
                hits.len(),
                self.name,
                at.join(", ")
            ));
        }
        let copies = functions.iter().filter(|f| f.bias != self.bias).count();
        if copies > 0 {
            let at: Vec<String> =
                functions.iter().filter(|f| f.bias != self.bias).map(|f| format!("{:#x}", f.addr)).collect();
            notes.push(format!(
                "`{name}` also runs from {} of the code of `{}` mapped elsewhere (at {}); probing every copy",
                if copies == 1 { "a copy".to_string() } else { format!("{copies} copies") },
                self.name,
                at.join(", ")
            ));
        }
        Ok(Named { functions, notes })
    }

    /// `@GLIBC_2.2.5` for a versioned symbol, "" otherwise.
    fn version_text(&self, i: usize) -> String {
        self.elf.functions[i].version.as_ref().map_or(String::new(), |v| v.to_string())
    }

    /// The function called exactly `name` ([`Module::named`]): the first if
    /// several are.
    pub fn function(&self, name: &str) -> Result<Function> {
        let named = self.named(name)?;
        named.functions.into_iter().next().context("no function")
    }

    /// True if a function is called exactly `name`.
    pub fn has_function(&self, name: &str) -> bool {
        !self.called(name).is_empty()
    }

    /// Every function matching the glob `pattern` (`*@GLIBC_2.2.5` matches
    /// versions too), one per address, and every copy of each.
    pub fn matching(&self, pattern: &str) -> Vec<Function> {
        let (base, want) = split_version(pattern);
        let base = Glob::new(base);
        let syms = &self.elf.functions;
        let mut out: Vec<Function> = Vec::new();
        let mut last: Option<FileAddr> = None;
        for (i, sym) in syms.iter().enumerate() {
            if last == Some(sym.addr) {
                continue;
            }
            let version_ok = match (&sym.version, &want) {
                (_, None) => true,
                (Some(have), Some(want)) => glob(&want.name, &have.name) && (!want.default || have.default),
                (None, Some(_)) => false,
            };
            if version_ok && self.answers_to(i, |n| base.matches(n)) {
                last = Some(sym.addr);
                out.extend(self.everywhere(i));
            }
        }
        out
    }

    /// Every function whose symbol as stored (mangled) matches the glob
    /// `pattern`, without demangling anything.
    pub fn matching_symbols(&self, pattern: &str) -> Vec<Function> {
        let syms = &self.elf.functions;
        let pattern = Glob::new(pattern);
        let mut out: Vec<Function> = Vec::new();
        for s in syms.iter() {
            if !pattern.matches(&s.name) {
                continue;
            }
            let addr = self.bias.runtime(s.addr);
            if out.last().is_none_or(|f: &Function| f.addr != addr) {
                let names = super::demangle::Names::of(&s.name);
                out.push(Function {
                    name: names.display().to_string(),
                    symbol: s.name.clone(),
                    module: self.name.clone(),
                    addr,
                    size: s.size,
                    ifunc: s.ifunc,
                    version: s.version.clone(),
                    source: s.source,
                    bias: self.bias,
                });
            }
        }
        out
    }

    /// Every function, one per address (aliases dropped, globals preferred),
    /// and every copy of each.
    pub fn functions(&self) -> Vec<Function> {
        let syms = &self.elf.functions;
        (0..syms.len())
            .filter(|&i| i == 0 || syms[i - 1].addr != syms[i].addr)
            .flat_map(|i| self.everywhere(i))
            .collect()
    }

    /// The function symbol containing runtime address `addr` (in the
    /// module's own code or in a copy of it).
    pub fn function_containing(&self, addr: RuntimeAddr) -> Option<Function> {
        let bias = self.copies.iter().find(|c| c.span.lo <= addr.0 && addr.0 < c.span.hi).map_or(self.bias, |c| c.bias);
        let link = bias.file(addr).0;
        let syms: &[FuncSym] = &self.elf.functions;
        let i = syms.iter().rposition(|f| f.addr.0 <= link && link < f.addr.0 + f.size.max(1))?;
        Some(self.function_at(i, bias))
    }

    /// The addresses from which a probe on `f` must reach its detour: the
    /// module's own span, or the copy of its code `f` lies in.
    pub fn span_of(&self, f: &Function) -> Span {
        self.copies
            .iter()
            .find(|c| c.bias == f.bias && c.span.lo <= f.addr.0 && f.addr.0 < c.span.hi)
            .map_or(self.span, |c| c.span)
    }

    /// The file bytes of `f` (its code as built, before any patch).
    pub fn code_of(&self, f: &Function) -> Result<&[u8]> {
        self.elf
            .bytes_at(f.bias.file(f.addr), f.size)
            .with_context(|| format!("the code of `{}` is not in `{}`", f.name, self.path.display()))
    }

    /// How far below its stack pointer at entry `f` saves the register
    /// holding its return address, from the module's call frame
    /// information (read on first use): None if it never does, or not at
    /// one place, or the module has no CFI for it.
    pub fn return_saved_below(&self, f: &Function) -> Option<u32> {
        self.return_saves.get_or_init(|| ReturnSaves::of(&self.elf)).below_cfa(f.bias.file(f.addr).0)
    }

    /// True if a symbol at `f`'s address declares a variant calling
    /// convention (AArch64's `STO_AARCH64_VARIANT_PCS`; an alias's mark is
    /// the function's too).
    pub fn variant_pcs(&self, f: &Function) -> bool {
        let at = f.bias.file(f.addr);
        let syms: &[FuncSym] = &self.elf.functions;
        let first = syms.partition_point(|s| s.addr < at);
        syms[first..].iter().take_while(|s| s.addr == at).any(|s| s.variant_pcs)
    }

    /// Branch targets from split-off parts of `f` (`f.cold`), which jump back into it.
    pub fn extra_targets(&self, f: &Function) -> Vec<u64> {
        cold_targets(&self.elf, f.bias, &f.symbol, f.addr, f.size, host_isa())
    }
}

/// True if a symbol of version `have` answers to a name asking for `want`:
/// any version without one, `@@VER` only the default version VER, `@VER`
/// version VER.
fn version_matches(have: Option<&Version>, want: Option<&Version>) -> bool {
    match (have, want) {
        (_, None) => true,
        (Some(h), Some(w)) => h.name == w.name && (!w.default || h.default),
        (None, Some(_)) => false,
    }
}

/// The load bias of `elf` from its mappings: that of the mapping of the
/// lowest file offset (the loader maps the file from its start), among
/// those with which an executable mapping agrees. A mapping of the file
/// made otherwise (a copy of its code, or the file mapped to be read, as a
/// Rust backtrace maps its own executable) is passed over.
fn load_bias(elf: &ElfFile, mappings: &[&Mapping]) -> Option<Bias> {
    let mut by_offset: Vec<&&Mapping> = mappings.iter().collect();
    by_offset.sort_by_key(|m| (m.offset, m.start));
    let agrees = |bias: Bias| {
        let deltas: Vec<u64> =
            elf.segments.iter().map(|s| bias.runtime(FileAddr(s.vaddr)).0.wrapping_sub(s.offset)).collect();
        mappings.iter().any(|m| m.exec && deltas.contains(&m.start.wrapping_sub(m.offset)))
    };
    let biases = by_offset.iter().filter_map(|m| elf.bias_from(RuntimeAddr(m.start), m.offset));
    biases.clone().find(|&b| agrees(b)).or_else(|| biases.into_iter().next())
}

/// The span of the mappings of `elf` at `bias` (the module as the loader
/// mapped it), and the copies of its code mapped elsewhere: executable
/// mappings of the file whose address and offset agree with no segment at
/// `bias`.
fn images(elf: &ElfFile, bias: Bias, mappings: &[&Mapping]) -> (Span, Vec<CodeCopy>) {
    // Where the loader put each segment's file offset 0: a mapping of the
    // module itself has its start and offset that far apart.
    let deltas: Vec<u64> =
        elf.segments.iter().map(|s| bias.runtime(FileAddr(s.vaddr)).0.wrapping_sub(s.offset)).collect();
    let own = |m: &Mapping| deltas.is_empty() || deltas.contains(&m.start.wrapping_sub(m.offset));
    let mine: Vec<&&Mapping> = mappings.iter().filter(|m| own(m)).collect();
    let span =
        Span { lo: mine.iter().map(|m| m.start).min().unwrap_or(0), hi: mine.iter().map(|m| m.end).max().unwrap_or(0) };
    let mut copies: Vec<CodeCopy> = Vec::new();
    let mut others: Vec<&&Mapping> = mappings.iter().filter(|m| m.exec && !own(m)).collect();
    others.sort_by_key(|m| m.start);
    for m in others {
        // The executable segment its offset falls in gives its file addresses.
        let Some(seg) = elf
            .segments
            .iter()
            .find(|s| s.exec && s.offset & !0xfff <= m.offset && m.offset < s.offset.saturating_add(s.filesz))
        else {
            continue;
        };
        let file = FileAddr(seg.vaddr.wrapping_add(m.offset.wrapping_sub(seg.offset)));
        let bias = Bias::between(file, RuntimeAddr(m.start));
        match copies.last_mut() {
            Some(c) if c.bias == bias && c.span.hi == m.start => c.span.hi = m.end,
            _ => copies.push(CodeCopy { span: Span { lo: m.start, hi: m.end }, bias }),
        }
    }
    (span, copies)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary's own mappings, and its parsed file.
    fn own() -> (ElfFile, Vec<Mapping>) {
        let exe = std::env::current_exe().unwrap();
        let elf = ElfFile::open(&exe, &exe).unwrap();
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&exe).unwrap();
        let maps = crate::process::read_maps(std::process::id() as i32).unwrap();
        (elf, maps.into_iter().filter(|m| m.inode == meta.ino() && m.dev == meta.dev()).collect())
    }

    #[test]
    fn a_module_as_loaded_has_no_copies() {
        let (elf, maps) = own();
        let refs: Vec<&Mapping> = maps.iter().collect();
        let first = maps.iter().min_by_key(|m| m.offset).unwrap();
        let bias = elf.bias_from(RuntimeAddr(first.start), first.offset).unwrap();
        let (span, copies) = images(&elf, bias, &refs);
        // Every mapping the loader made is in the span; a mapping of the
        // file made otherwise (a backtrace's symbolizer maps it to read its
        // debug information) is neither in it nor a copy of its code.
        assert!(maps.iter().filter(|m| m.exec).all(|m| span.lo <= m.start && m.end <= span.hi));
        assert!(copies.is_empty(), "{copies:?}");
        assert_eq!(load_bias(&elf, &refs), Some(bias));
    }

    #[test]
    fn code_mapped_again_elsewhere_is_a_copy_with_its_own_bias() {
        let (elf, mut maps) = own();
        let first = maps.iter().min_by_key(|m| m.offset).unwrap().clone();
        let bias = elf.bias_from(RuntimeAddr(first.start), first.offset).unwrap();
        let code = maps.iter().find(|m| m.exec).unwrap().clone();
        // The file mapped whole to be read, below the module: not where it was loaded.
        let low = 0x10_0000u64;
        maps.push(Mapping { start: low, end: low + 0x1000, offset: 0, exec: false, ..code.clone() });
        // Two pages of its code mapped again, terabytes away (as V8 maps node's builtins).
        let far = 0x7e00_0000_0000u64;
        let copy = Mapping { start: far, end: far + 0x2000, offset: code.offset + 0x1000, ..code.clone() };
        maps.push(copy.clone());
        let refs: Vec<&Mapping> = maps.iter().collect();
        assert_eq!(load_bias(&elf, &refs), Some(bias));
        let (span, copies) = images(&elf, bias, &refs);
        assert!(span.lo > low && span.hi < far, "the module's own span leaves the others out: {span:?}");
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].span, Span { lo: far, hi: far + 0x2000 });
        // The same file address lies at `code.start + 0x1000` in the module and at `far` in the copy.
        let file = bias.file(RuntimeAddr(code.start + 0x1000));
        assert_eq!(copies[0].bias.runtime(file), RuntimeAddr(far));
        assert!(copies[0].holds(file, 0x100) && !copies[0].holds(file, 0x3000));
    }

    #[test]
    fn versions_match_as_written() {
        let default = Version { name: "GLIBC_2.3.2".into(), default: true };
        let old = Version { name: "GLIBC_2.2.5".into(), default: false };
        let want = |s: &str| split_version(s).1;
        assert!(version_matches(Some(&default), None) && version_matches(None, None));
        assert!(version_matches(Some(&default), want("x@@GLIBC_2.3.2").as_ref()));
        assert!(version_matches(Some(&default), want("x@GLIBC_2.3.2").as_ref()));
        assert!(!version_matches(Some(&old), want("x@@GLIBC_2.2.5").as_ref()));
        assert!(version_matches(Some(&old), want("x@GLIBC_2.2.5").as_ref()));
        assert!(!version_matches(None, want("x@GLIBC_2.2.5").as_ref()));
    }
}
