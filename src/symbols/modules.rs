//! The modules of a running process, from its memory map, each parsed only
//! when a lookup needs it: attaching to one function of a process with a
//! hundred libraries reads the executable and nothing else. The executable
//! answers to its file's name and to the name the process was started by
//! (`redis-server`, a symlink to `redis-check-rdb`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::module::{Module, Read};
use super::pattern::{Pattern, has_glob, module_matches};
use super::site::{self, Site, SitePattern};
use super::{Function, suggestions};
use crate::addr::RuntimeAddr;
use crate::process::Mapping;

/// A module slot: the mappings of one file, and the module once parsed.
#[derive(Debug)]
struct Slot {
    /// The path as the process sees it (without " (deleted)").
    path: PathBuf,
    /// Where tp reads the file.
    read_path: PathBuf,
    mappings: Vec<Mapping>,
    /// The name the process was started by, for the executable when it
    /// differs from the file's name.
    alias: Option<String>,
    module: std::sync::OnceLock<Result<Module, String>>,
    /// Its file, being read on another thread ([`ProcessModules::prefetch`]).
    ahead: std::sync::Mutex<Option<std::thread::JoinHandle<Result<Read>>>>,
}

/// The modules of process `pid`: the executable first, then the libraries
/// in address order.
#[derive(Debug)]
pub struct ProcessModules {
    pid: i32,
    root: PathBuf,
    slots: Vec<Slot>,
}

/// A pattern that names nothing in the process's modules now (no such
/// module, no such function): a library loaded later may still define it.
/// Other lookup errors (an ambiguous name, a module tp cannot read) are not this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound(pub String);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFound {}

/// What patterns resolved to.
#[derive(Debug, Default)]
pub struct Resolution {
    /// The functions, each once.
    pub found: Vec<Found>,
    /// One line for each name that means more than one function, or whose
    /// other versions were left out.
    pub notes: Vec<String>,
}

/// A function found by a lookup, with the index of its module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index into the process's modules.
    pub module: usize,
    /// The function.
    pub function: Function,
    /// True if the user named it exactly (refusing it is an error), false if a glob matched it.
    pub explicit: bool,
    /// Where in the function the probe goes, when not at its entry.
    pub site: Option<Site>,
}

impl Found {
    /// A function's entry.
    pub fn entry(module: usize, function: Function, explicit: bool) -> Found {
        Found { module, function, explicit, site: None }
    }

    /// The address the probe goes to: its site, or the function's entry.
    pub fn key(&self) -> RuntimeAddr {
        self.site.as_ref().map_or(self.function.addr, |s| s.addr)
    }

    /// The probe's name: its site's label, or the function's name.
    pub fn label(&self) -> &str {
        self.site.as_ref().map_or(&self.function.name, |s| &s.label)
    }
}

/// The probes that count the blocks of `f` (found in `m`): one at the start
/// of each block that can have one ([`super::block_map::map`]).
fn block_sites(m: &Module, f: &Found) -> std::result::Result<Vec<Found>, crate::arch::Refusal> {
    let map = super::block_map::map(m, &f.function, crate::arch::host_isa())?;
    let sites = map.blocks.into_iter().filter_map(|b| b.probe.ok());
    Ok(sites.map(|s| Found { site: Some(s), ..f.clone() }).collect())
}

impl ProcessModules {
    /// The modules of `pid` according to `maps`: files with an executable mapping.
    pub fn new(pid: i32, maps: &[Mapping]) -> Result<ProcessModules> {
        let exe_ino = std::fs::metadata(format!("/proc/{pid}/exe"))
            .with_context(|| format!("cannot read the executable of process {pid}"))?
            .ino();
        let mut slots: Vec<Slot> = Vec::new();
        for m in maps.iter().filter(|m| m.path.starts_with('/') && m.inode != 0) {
            let path = PathBuf::from(m.path.trim_end_matches(" (deleted)"));
            if let Some(s) = slots.iter_mut().find(|s| s.path == path && s.mappings[0].inode == m.inode) {
                s.mappings.push(m.clone());
                continue;
            }
            let read_path = if m.inode == exe_ino {
                PathBuf::from(format!("/proc/{pid}/exe"))
            } else {
                PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            };
            slots.push(Slot {
                path,
                read_path,
                mappings: vec![m.clone()],
                alias: None,
                module: std::sync::OnceLock::new(),
                ahead: std::sync::Mutex::new(None),
            });
        }
        slots.retain(|s| s.mappings.iter().any(|m| m.exec));
        // The executable first.
        slots.sort_by_key(|s| s.read_path != Path::new(&format!("/proc/{pid}/exe")));
        if slots.is_empty() {
            refuse_32_bit(pid)?;
            bail!("process {pid} has no executable mappings (if it is in the middle of an exec, try again)");
        }
        if slots[0].read_path == Path::new(&format!("/proc/{pid}/exe")) {
            let file = file_name(&slots[0].path);
            slots[0].alias = started_as(pid).filter(|a| *a != file);
        }
        Ok(ProcessModules { pid, root: PathBuf::from(format!("/proc/{pid}/root")), slots })
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True if there are none (never, for a live process).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The name of module `i`: its file name, or for the executable the
    /// name the process was started by.
    pub fn name(&self, i: usize) -> String {
        self.slots[i].alias.clone().unwrap_or_else(|| file_name(&self.slots[i].path))
    }

    /// `name (file name)` when module `i` was started by another name than its file's.
    fn described(&self, i: usize) -> String {
        match &self.slots[i].alias {
            Some(a) => format!("{a} ({})", file_name(&self.slots[i].path)),
            None => self.name(i),
        }
    }

    /// What tells module `i` apart from a module loaded later: its path and
    /// its file's inode.
    pub fn identity(&self, i: usize) -> Option<(PathBuf, u64)> {
        let slot = self.slots.get(i)?;
        Some((slot.path.clone(), slot.mappings.first()?.inode))
    }

    /// Module `i`, parsed on first use.
    pub fn get(&self, i: usize) -> Result<&Module> {
        let slot = &self.slots[i];
        let loaded = slot.module.get_or_init(|| {
            let maps: Vec<&Mapping> = slot.mappings.iter().collect();
            let ahead = slot.ahead.lock().unwrap_or_else(|e| e.into_inner()).take().and_then(|h| h.join().ok());
            let read = match ahead {
                Some(read) => read,
                None => Module::read_file(&slot.read_path, &slot.path, &self.root),
            };
            let mut m =
                read.and_then(|r| Module::load_read(r, &slot.path, &self.root, &maps)).map_err(|e| format!("{e:#}"))?;
            if let Some(a) = &slot.alias {
                m.name = a.clone();
            }
            Ok(m)
        });
        loaded.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Starts reading modules `indices` (their files, or their analyses
    /// from the cache) on another thread, for a caller that will need them
    /// after other work: on a machine with a core to spare, that work and
    /// the reading overlap.
    pub fn prefetch(&self, indices: &[usize]) {
        for &i in indices {
            let Some(slot) = self.slots.get(i) else { continue };
            if slot.module.get().is_some() || slot.ahead.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                continue;
            }
            let (read_path, path, root) = (slot.read_path.clone(), slot.path.clone(), self.root.clone());
            let spawned = std::thread::Builder::new()
                .name("tp-read".into())
                .spawn(move || Module::read_file(&read_path, &path, &root));
            *slot.ahead.lock().unwrap_or_else(|e| e.into_inner()) = spawned.ok();
        }
    }

    /// The module that maps runtime address `addr`, if any.
    pub fn index_containing(&self, addr: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.mappings.iter().any(|m| m.contains(addr)))
    }

    /// The main executable.
    pub fn main(&self) -> Result<&Module> {
        self.get(0)
    }

    /// Modules whose file name (or, for the executable, the name it was
    /// started by) the module part of a pattern names.
    fn named(&self, module: &str) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| {
                module_matches(module, &file_name(&self.slots[i].path))
                    || self.slots[i].alias.as_deref().is_some_and(|a| module_matches(module, a))
            })
            .collect()
    }

    /// Resolves each pattern (`foo`, `libc:malloc`, `'sqlite3_*'`, `'libz:*'`).
    ///
    /// A name without a module is looked up in the executable first; if the
    /// executable has no match, in every library: a plain name found in
    /// several libraries is ambiguous, a glob matches in all of them.
    pub fn resolve(&self, patterns: &[String]) -> Result<Vec<Found>> {
        Ok(self.resolve_noted(patterns)?.found)
    }

    /// [`ProcessModules::resolve`], with a line for each name that means
    /// more than one function (or left a version out).
    pub fn resolve_noted(&self, patterns: &[String]) -> Result<Resolution> {
        let mut out = Resolution::default();
        let mut taken = std::collections::HashSet::new();
        for text in patterns {
            let found = match SitePattern::parse(text) {
                Some(site) => self.resolve_site(text, &site.map_err(anyhow::Error::msg)?, &mut out.notes)?,
                None => self.resolve_functions(text, &Pattern::parse(text), &mut out.notes)?,
            };
            out.found.extend(found.into_iter().filter(|f| taken.insert(f.key())));
        }
        Ok(out)
    }

    /// The functions pattern `p` (written `text`) names.
    fn resolve_functions(&self, text: &str, p: &Pattern, notes: &mut Vec<String>) -> Result<Vec<Found>> {
        match &p.module {
            Some(m) => self.resolve_in_named(text, m, p, notes),
            None => self.resolve_anywhere(text, p, notes),
        }
    }

    /// The sites `pattern` (written `text`) names: see [`super::site`].
    fn resolve_site(&self, text: &str, pattern: &SitePattern, notes: &mut Vec<String>) -> Result<Vec<Found>> {
        match pattern {
            SitePattern::Offset { module, function, offset } => {
                let p = Pattern { module: module.clone(), function: function.clone() };
                let mut out = self.resolve_functions(function, &p, notes)?;
                for f in &mut out {
                    if *offset != 0 {
                        f.site = Some(site::at_offset(&f.function, *offset).map_err(anyhow::Error::msg)?);
                    }
                }
                Ok(out)
            }
            SitePattern::Line { module, place, line } => {
                self.resolve_line(text, module.as_deref(), place, *line, notes)
            }
            SitePattern::Usdt { module, provider, name } => {
                self.resolve_usdt(text, module.as_deref(), provider, name, notes)
            }
            SitePattern::Blocks { module, function } => {
                let p = Pattern { module: module.clone(), function: function.clone() };
                let mut out = Vec::new();
                for f in self.resolve_functions(function, &p, notes)? {
                    let m = self.get(f.module)?;
                    match block_sites(m, &f) {
                        Ok(sites) => out.extend(sites),
                        Err(why) if f.explicit => {
                            bail!("cannot count the blocks of `{}`: {why}", f.function.name)
                        }
                        Err(why) => notes.push(format!("the blocks of `{}` are not counted: {why}", f.function.name)),
                    }
                }
                Ok(out)
            }
        }
    }

    /// What the site pattern `text` names in module `i` alone (nothing when
    /// it names nothing there, or is no site pattern), none named exactly:
    /// for a library loaded later.
    pub fn sites_in(&self, text: &str, i: usize) -> Vec<Found> {
        let Some(Ok(pattern)) = SitePattern::parse(text) else { return Vec::new() };
        let Ok(m) = self.get(i) else { return Vec::new() };
        if pattern.module().is_some_and(|want| !module_matches(want, &self.name(i))) {
            return Vec::new();
        }
        let found = |function, site| Found { module: i, function, explicit: false, site };
        let mut out = Vec::new();
        match &pattern {
            SitePattern::Offset { function, offset, .. } => {
                for f in m.named(function).map(|n| n.functions).unwrap_or_default() {
                    match site::at_offset(&f, *offset) {
                        Ok(s) if *offset != 0 => out.push(found(f, Some(s))),
                        Ok(_) => out.push(found(f, None)),
                        Err(_) => {}
                    }
                }
            }
            SitePattern::Line { place, line, .. } if site::is_file(place) => {
                for (f, s) in site::lines_in_file(m, place, *line).unwrap_or_default() {
                    out.push(found(f, Some(s)));
                }
            }
            SitePattern::Line { place, line, .. } => {
                for f in m.named(place).map(|n| n.functions).unwrap_or_default() {
                    for (f, s) in site::lines_in_function(m, &f, *line).unwrap_or_default() {
                        out.push(found(f, Some(s)));
                    }
                }
            }
            SitePattern::Usdt { provider, name, .. } => {
                for (f, s) in site::usdt_in(m, provider, name).into_iter().flatten() {
                    out.push(found(f, Some(s)));
                }
            }
            SitePattern::Blocks { function, .. } => {
                for f in m.named(function).map(|n| n.functions).unwrap_or_default() {
                    out.extend(block_sites(m, &Found::entry(i, f, false)).unwrap_or_default());
                }
            }
        }
        out
    }

    /// Modules to look in for `module` (every module when None; the
    /// executable first).
    fn modules_for(&self, module: Option<&str>) -> Result<Vec<usize>> {
        match module {
            None => Ok((0..self.len()).collect()),
            Some(m) => {
                let found = self.named(m);
                if found.is_empty() {
                    let names: Vec<String> = (0..self.len()).map(|i| self.described(i)).collect();
                    let msg = format!("no module `{m}` in process {} (it has: {})", self.pid, names.join(", "));
                    return Err(NotFound(msg).into());
                }
                Ok(found)
            }
        }
    }

    fn resolve_line(
        &self,
        text: &str,
        module: Option<&str>,
        place: &str,
        line: u32,
        notes: &mut Vec<String>,
    ) -> Result<Vec<Found>> {
        let what = text.strip_prefix("line:").unwrap_or(text);
        let mut out = Vec::new();
        // The lines that do start code, where the one asked for starts none.
        let mut known: Vec<u32> = Vec::new();
        let is_file = site::is_file(place);
        if is_file {
            for i in self.modules_for(module)? {
                let m = match self.get(i) {
                    Ok(m) => m,
                    Err(e) if module.is_some() => return Err(e),
                    Err(_) => continue,
                };
                if m.dwarf_file().is_none() && module.is_none() {
                    continue;
                }
                for (function, site) in site::lines_in_file(m, place, line)? {
                    out.push(Found { module: i, function, explicit: false, site: Some(site) });
                }
                if !out.is_empty() && i == 0 {
                    break;
                }
                if out.is_empty() {
                    known.extend(site::line_numbers(m, Some(place), None)?);
                }
            }
        } else {
            let p = Pattern { module: module.map(str::to_string), function: place.to_string() };
            for f in self.resolve_functions(place, &p, notes)? {
                let m = self.get(f.module)?;
                for (function, site) in site::lines_in_function(m, &f.function, line)? {
                    out.push(Found { module: f.module, function, explicit: false, site: Some(site) });
                }
                if out.is_empty() {
                    known.extend(site::line_numbers(m, None, Some(&f.function))?);
                }
            }
        }
        if out.is_empty() {
            let pid = self.pid;
            if is_file && known.is_empty() {
                return Err(NotFound(format!(
                    "no source file `{place}` in the line tables of process {pid}'s modules (`tp list-probes -p \
                     {pid} --lines FUNCTION` shows a function's file and lines)"
                ))
                .into());
            }
            known.sort_unstable();
            known.dedup();
            let near: Vec<String> = site::nearest(&known, line).iter().map(|l| format!("`{place}:{l}`")).collect();
            let near = match near.len() {
                0 => String::new(),
                _ => format!("; the nearest lines that do: {}", near.join(", ")),
            };
            return Err(NotFound(format!(
                "line `{what}` starts no code in process {pid} (a comment, a declaration, or code the compiler \
                 removed){near}"
            ))
            .into());
        }
        if out.len() == 1 {
            out[0].explicit = true;
        } else {
            notes.push(format!("line `{what}` starts at {} places; probing each", out.len()));
        }
        Ok(out)
    }

    fn resolve_usdt(
        &self,
        text: &str,
        module: Option<&str>,
        provider: &str,
        name: &str,
        notes: &mut Vec<String>,
    ) -> Result<Vec<Found>> {
        let mut out = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for i in self.modules_for(module)? {
            let m = match self.get(i) {
                Ok(m) => m,
                Err(e) if module.is_some() => return Err(e),
                Err(_) => continue,
            };
            for hit in site::usdt_in(m, "*", "*") {
                let (function, s) = match hit {
                    Ok(found) => found,
                    Err(n) => {
                        if super::pattern::glob(provider, &n.provider) && super::pattern::glob(name, &n.name) {
                            notes.push(format!(
                                "static probe `{}:{}` in `{}` at {:#x} lies in no function tp knows; skipped",
                                n.provider,
                                n.name,
                                m.name,
                                m.bias.runtime(n.pc)
                            ));
                        }
                        continue;
                    }
                };
                let u = s.usdt.as_ref().expect("a static probe");
                if super::pattern::glob(provider, &u.provider) && super::pattern::glob(name, &u.name) {
                    out.push(Found { module: i, function, explicit: false, site: Some(s) });
                } else if seen.len() < 12 {
                    let known = format!("{}:{}", u.provider, u.name);
                    if !seen.contains(&known) {
                        seen.push(known);
                    }
                }
            }
        }
        if out.is_empty() {
            let have = if seen.is_empty() {
                "it has none".to_string()
            } else {
                format!("it has {}", seen.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "))
            };
            return Err(NotFound(format!("no static probe matches `{text}` in process {} ({have})", self.pid)).into());
        }
        if out.len() == 1 && !has_glob(provider) && !has_glob(name) {
            out[0].explicit = true;
        }
        Ok(out)
    }

    /// What `name` means in module `i`, as [`Found`]s: one named function
    /// must be probed, several are probed where they can be.
    fn named_in(&self, i: usize, name: &str, notes: &mut Vec<String>) -> Result<Vec<Found>> {
        let named = self.get(i)?.named(name)?;
        notes.extend(named.notes);
        let explicit = named.functions.len() == 1;
        Ok(named.functions.into_iter().map(|function| Found::entry(i, function, explicit)).collect())
    }

    fn resolve_in_named(&self, text: &str, module: &str, p: &Pattern, notes: &mut Vec<String>) -> Result<Vec<Found>> {
        let modules = self.named(module);
        if modules.is_empty() {
            let names: Vec<String> = (0..self.len()).map(|i| self.described(i)).collect();
            let msg = format!("no module `{module}` in process {} (it has: {})", self.pid, names.join(", "));
            return Err(NotFound(msg).into());
        }
        let mut out = Vec::new();
        for &i in &modules {
            let m = self.get(i)?;
            if p.is_glob() {
                out.extend(m.matching(&p.function).into_iter().map(|function| Found::entry(i, function, false)));
            } else if m.has_function(&p.function) || modules.len() == 1 {
                out.extend(self.named_in(i, &p.function, notes)?);
            }
        }
        if out.is_empty() {
            if p.is_glob() {
                return Err(NotFound(format!("no function matches `{text}` in process {}", self.pid)).into());
            }
            return Err(NotFound(format!("function `{}` not found in any module named `{module}`", p.function)).into());
        }
        Ok(out)
    }

    fn resolve_anywhere(&self, text: &str, p: &Pattern, notes: &mut Vec<String>) -> Result<Vec<Found>> {
        let exe = self.main()?;
        if p.is_glob() {
            let here = exe.matching(&p.function);
            if !here.is_empty() {
                return Ok(here.into_iter().map(|function| Found::entry(0, function, false)).collect());
            }
            let mut out = Vec::new();
            for i in 1..self.len() {
                if let Ok(m) = self.get(i) {
                    out.extend(m.matching(&p.function).into_iter().map(|function| Found::entry(i, function, false)));
                }
            }
            if out.is_empty() {
                return Err(NotFound(format!("no function matches `{text}` in process {}", self.pid)).into());
            }
            return Ok(out);
        }
        if exe.has_function(&p.function) {
            return self.named_in(0, &p.function, notes);
        }
        let defining: Vec<usize> =
            (1..self.len()).filter(|&i| self.get(i).is_ok_and(|m| m.has_function(&p.function))).collect();
        match defining.len() {
            0 => {
                let names: Vec<String> = exe.functions().into_iter().map(|f| f.name).collect();
                let hint = suggestions(&p.function, names.iter().map(String::as_str));
                let stripped = if exe.elf.has_symtab {
                    String::new()
                } else {
                    format!(
                        "; `{}` is stripped, so only its exported functions and, as `sub_<address>`, the \
                         functions its unwind table lists are known: install its debug symbols (the -dbg or \
                         -dbgsym package), point TP_DEBUG_DIRS at them, or name a debuginfod server in \
                         DEBUGINFOD_URLS",
                        exe.name
                    )
                };
                Err(NotFound(format!(
                    "function `{}` not found in process {} (searched {} modules){stripped}{hint}",
                    p.function,
                    self.pid,
                    self.len()
                ))
                .into())
            }
            1 => self.named_in(defining[0], &p.function, notes),
            _ => {
                let names: Vec<String> =
                    defining.iter().map(|&i| format!("`{}:{}`", self.name(i), p.function)).collect();
                bail!("`{}` is defined in several modules; name one: {}", p.function, names.join(", "))
            }
        }
    }

    /// The module and function at runtime address `addr`: the function's
    /// entry, or a site inside it.
    pub fn at_address(&self, addr: RuntimeAddr) -> Result<Found> {
        let Some(i) = self.slots.iter().position(|s| s.mappings.iter().any(|m| m.contains(addr.0))) else {
            bail!("address {addr:#x} is not inside any module of process {}", self.pid);
        };
        let m = self.get(i)?;
        let Some(f) = m.function_containing(addr) else {
            let why = if m.elf.has_symtab {
                String::new()
            } else {
                format!(
                    " (`{}` is stripped, and its unwind table lists no function there: its code was built \
                     without unwind tables; install its debug symbols or point TP_DEBUG_DIRS at them)",
                    m.name
                )
            };
            bail!("address {addr:#x} in `{}` is not inside a known function{why}", m.name);
        };
        let site =
            (f.addr != addr).then(|| Site { addr, label: site::offset_label(&f, addr), usdt: None, block: false });
        Ok(Found { module: i, function: f, explicit: true, site })
    }
}

/// The file name of `path`.
fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Refuses a process whose executable is a 32-bit ELF file, as reading the
/// file itself would: a process caught in its exec has the file as its
/// executable before it has mapped it.
fn refuse_32_bit(pid: i32) -> Result<()> {
    let exe = format!("/proc/{pid}/exe");
    let mut ident = [0u8; 5];
    let read = std::fs::File::open(&exe).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut ident));
    if read.is_ok() && ident[..4] == *b"\x7fELF" && ident[4] == goblin::elf::header::ELFCLASS32 {
        let path = std::fs::read_link(&exe).unwrap_or_else(|_| PathBuf::from(exe));
        return Err(super::elf::thirty_two_bit(&path));
    }
    Ok(())
}

/// The name process `pid` was started by: the file name of its `argv[0]`
/// (up to a space: a server that retitles itself, as redis does, writes
/// `redis-server *:6379` there) when its `comm` (the name the kernel took
/// from the path exec'd, cut to 15 bytes) agrees. The process wrote both,
/// so they are only names to match and show, and only when they agree.
fn started_as(pid: i32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let comm = String::from_utf8(comm).ok()?.trim_end_matches('\n').to_string();
    let mut cmdline = Vec::new();
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 4096), &mut cmdline).ok()?;
    let argv0 = String::from_utf8(cmdline.split(|&b| b == 0).next()?.to_vec()).ok()?;
    let name = argv0.split(' ').next()?.rsplit('/').next()?;
    let agree = !comm.is_empty() && name.starts_with(&comm) && (name == comm || comm.len() == 15);
    (agree && name.len() <= 255 && !name.contains(':')).then(|| name.to_string())
}
