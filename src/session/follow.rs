//! Following a process's program while a session runs: the libraries it
//! loads after the probes went in (dlopen), and the new program it runs
//! after an exec.
//!
//! New libraries are found at the dynamic linker's rendezvous
//! ([`super::rendezvous`]: a thread that maps a library waits there while
//! tp probes it), and by polling where there is none or it gave up:
//! [`Follow::code_changed`] reads the process's code sizes (`VmExe`,
//! `VmLib` in `/proc/PID/status`: the kernel's counters, read without the
//! target's memory-map lock) every tick of the session; at the rendezvous,
//! or when they change, tp reads `/proc/PID/maps` and looks for the
//! patterns in the modules it has not searched yet
//! ([`Follow::new_functions`]), and the session installs those probes with
//! the ordinary stop-the-world attach.
//!
//! A pattern keeps looking in new modules while it can still match there:
//! `module:function` patterns and globs that matched nothing in the
//! executable look in every new module whose name fits; a plain name looks
//! until one module defines it. Static probes (`usdt:`) and source lines
//! (`line:`) look in every new module; `foo+0x1a` as `foo` does.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::notes::Notes;
use crate::probe::region::Region;
use crate::process;
use crate::symbols::pattern::{Pattern, module_matches};
use crate::symbols::site::SitePattern;
use crate::symbols::{Found, NotFound, ProcessModules};

/// Where a pattern still looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Looks {
    /// Nowhere: it matched what it can.
    Done,
    /// In every new module whose name fits.
    EveryNewModule,
    /// In new modules, until one defines it.
    UntilFound,
}

#[derive(Debug, Clone)]
struct Watch {
    text: String,
    pattern: Pattern,
    looks: Looks,
}

/// The patterns of one process's session that may still match in modules
/// it loads later, and the modules already searched.
#[derive(Debug)]
pub struct Follow {
    pid: i32,
    watches: Vec<Watch>,
    searched: Vec<(PathBuf, u64)>,
    code_size: Option<(u64, u64)>,
}

/// What a look at the modules loaded since found.
#[derive(Debug)]
pub struct Loaded {
    /// The process's modules now.
    pub modules: ProcessModules,
    /// The functions to probe in the new ones (none named exactly: one that
    /// cannot be probed is skipped, not an error).
    pub found: Vec<Found>,
    /// The file names of the new modules.
    pub names: Vec<String>,
}

/// What the first resolve of a [`Follow`] found.
#[derive(Debug)]
pub struct Start {
    /// Functions to probe now.
    pub found: Vec<Found>,
    /// Patterns that match nothing yet, with the reason (`did you mean`...).
    pub waiting: Vec<String>,
}

/// The module part of `text` (a pattern of functions, of an offset in
/// one, of a line or a static probe), if it names one.
fn module_part(text: &str) -> Option<String> {
    match SitePattern::parse(text) {
        Some(Ok(SitePattern::Offset { module, .. })) => module,
        Some(Ok(site)) => site.module().map(str::to_string),
        Some(Err(_)) => None,
        None => Pattern::parse(text).module,
    }
}

/// The patterns of `patterns` that name a module the process (whose
/// modules are `modules`) has not loaded: `tp attach` waits for them.
pub fn naming_unloaded_modules(modules: &ProcessModules, patterns: &[String]) -> Vec<String> {
    patterns
        .iter()
        .filter(|text| {
            module_part(text).is_some_and(|m| (0..modules.len()).all(|i| !module_matches(&m, &modules.name(i))))
        })
        .cloned()
        .collect()
}

/// The patterns of `patterns` that wait for a library the process (whose
/// modules are `modules`) has not loaded ([`naming_unloaded_modules`]),
/// once the others resolved strictly: a misspelt name is an error here as
/// in any attach. Empty when none waits (nothing else was resolved then).
pub fn waiting_for_libraries(modules: &ProcessModules, patterns: &[String]) -> Result<Vec<String>> {
    let later = naming_unloaded_modules(modules, patterns);
    if later.is_empty() {
        return Ok(later);
    }
    let now: Vec<String> = patterns.iter().filter(|f| !later.contains(f)).cloned().collect();
    if !now.is_empty() {
        modules.resolve_noted(&now)?;
    }
    Ok(later)
}

impl Follow {
    /// Resolves `patterns` in `modules` (process `pid`'s modules now),
    /// leniently: a pattern that names nothing yet waits for a module that
    /// defines it instead of failing. Any other lookup error is an error.
    /// What the look-up notes is said to `notes`.
    pub fn start(
        notes: &dyn Notes,
        pid: i32,
        modules: &ProcessModules,
        patterns: &[String],
    ) -> Result<(Follow, Start)> {
        let mut found: Vec<Found> = Vec::new();
        // Probes already found, by site: a pattern over a whole large
        // library finds tens of thousands.
        let mut seen = std::collections::HashSet::new();
        let mut watches = Vec::new();
        let mut waiting = Vec::new();
        for text in patterns {
            let site = SitePattern::parse(text).and_then(Result::ok);
            let pattern = match &site {
                Some(SitePattern::Offset { module, function, .. }) => {
                    Pattern { module: module.clone(), function: function.clone() }
                }
                // Sites in a file or of a static probe may be in any module.
                Some(s) => Pattern { module: s.module().map(str::to_string), function: "*".into() },
                None => Pattern::parse(text),
            };
            let qualified = pattern.module.is_some();
            let looks = match modules.resolve_noted(std::slice::from_ref(text)) {
                Ok(resolution) => {
                    for note in &resolution.notes {
                        crate::note!(notes, "tp: {}", crate::escape::text(note));
                    }
                    let hits = resolution.found;
                    let in_exe = hits.iter().any(|f| f.module == 0);
                    for f in hits {
                        if seen.insert(f.key()) {
                            found.push(f);
                        }
                    }
                    if qualified || (pattern.is_glob() && !in_exe) { Looks::EveryNewModule } else { Looks::Done }
                }
                Err(e) if e.downcast_ref::<NotFound>().is_some() => {
                    waiting.push(format!("{e}"));
                    if qualified || pattern.is_glob() { Looks::EveryNewModule } else { Looks::UntilFound }
                }
                Err(e) => return Err(e),
            };
            watches.push(Watch { text: text.clone(), pattern, looks });
        }
        let searched = (0..modules.len()).filter_map(|i| modules.identity(i)).collect();
        let follow = Follow { pid, watches, searched, code_size: code_size(pid) };
        Ok((follow, Start { found, waiting }))
    }

    /// True if the process's code mappings changed size since the last
    /// call (or since [`Follow::start`]): a library came or went.
    pub fn code_changed(&mut self) -> bool {
        let now = code_size(self.pid);
        let changed = now.is_some() && now != self.code_size;
        self.code_size = now.or(self.code_size);
        changed
    }

    /// True while some pattern may still match in a module loaded later.
    pub fn watching(&self) -> bool {
        self.watches.iter().any(|w| w.looks != Looks::Done)
    }

    /// The patterns that never matched (plain names still looking).
    pub fn never_found(&self) -> Vec<String> {
        self.watches.iter().filter(|w| w.looks == Looks::UntilFound).map(|w| w.text.clone()).collect()
    }

    /// Lists the process's modules from `maps` (its memory map now) and
    /// looks for the waiting patterns in the ones not searched yet; `None`
    /// when there is no new module. A module the process no longer maps
    /// (unloaded) is searched again if it comes back.
    pub fn new_functions(&mut self, maps: &[process::Mapping]) -> Result<Option<Loaded>> {
        let modules = ProcessModules::new(self.pid, maps)?;
        let now: Vec<(PathBuf, u64)> = (0..modules.len()).filter_map(|i| modules.identity(i)).collect();
        self.searched.retain(|id| now.contains(id));
        let new: Vec<usize> = (0..modules.len())
            .filter(|&i| modules.identity(i).is_some_and(|id| !self.searched.contains(&id)))
            .collect();
        if new.is_empty() {
            return Ok(None);
        }
        self.searched.extend(new.iter().filter_map(|&i| modules.identity(i)));
        let mut found: Vec<Found> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut push = |f: Found| {
            if seen.insert(f.key()) {
                found.push(f);
            }
        };
        for w in self.watches.iter_mut().filter(|w| w.looks != Looks::Done) {
            for &i in &new {
                if w.pattern.module.as_ref().is_some_and(|m| !module_matches(m, &modules.name(i))) {
                    continue;
                }
                if SitePattern::parse(&w.text).is_some() {
                    let sites = modules.sites_in(&w.text, i);
                    let any = !sites.is_empty();
                    sites.into_iter().for_each(&mut push);
                    if any && w.looks == Looks::UntilFound {
                        w.looks = Looks::Done;
                        break;
                    }
                    continue;
                }
                let Ok(m) = modules.get(i) else { continue };
                if w.pattern.is_glob() {
                    for function in m.matching(&w.pattern.function) {
                        push(Found::entry(i, function, false));
                    }
                } else if m.has_function(&w.pattern.function)
                    && let Ok(named) = m.named(&w.pattern.function)
                {
                    for function in named.functions {
                        push(Found::entry(i, function, false));
                    }
                    if w.looks == Looks::UntilFound {
                        w.looks = Looks::Done;
                        break;
                    }
                }
            }
        }
        let names = new.iter().map(|&i| modules.name(i)).collect();
        Ok(Some(Loaded { modules, found, names }))
    }
}

/// `VmExe` and `VmLib` of the process, in kB.
fn code_size(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| -> Option<u64> {
        status.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
    };
    Some((field("VmExe:")?, field("VmLib:")?))
}

/// True once the program a process exec'd is loaded: the kernel writes
/// the new program's auxiliary vector (its entry point among it) after it
/// has mapped the executable and its interpreter. Before that, in the
/// middle of the exec, the new memory map may hold only the stack.
fn exec_loaded(pid: i32) -> bool {
    const AT_ENTRY: u64 = 9;
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| !m.is_empty())
        && process::auxv(pid, AT_ENTRY).is_some_and(|entry| entry != 0)
}

/// What became of a process whose probes tp observes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// It still runs the program tp probed.
    Same,
    /// It exited (or is exiting).
    Exited,
    /// It runs another program (exec); the path of its executable.
    Execd(String),
}

/// Whether process `pid` still runs the program whose data region is
/// `region`: one `stat` of the region's `/proc/PID/map_files/` entry (a
/// look-up of one mapping), or, without the privilege that needs, a read
/// of its memory map. A process that no longer maps the region exited or
/// exec'd: an exit drops the memory before the process becomes a zombie,
/// so an empty map for a moment is an exit in progress, and a map without
/// the new program's auxiliary vector an exec in progress.
pub fn change(pid: i32, region: &Region) -> Change {
    if !process::is_alive(pid) {
        return Change::Exited;
    }
    let range = format!("{:x}-{:x}", region.target_addr(), region.target_addr() + region.len());
    let maps_region = match std::fs::metadata(format!("/proc/{pid}/map_files/{range}")) {
        Ok(m) => m.ino() == region.inode(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            process::read_maps(pid).is_ok_and(|maps| region.is_mapped_in(&maps))
        }
        Err(_) => false,
    };
    if maps_region {
        return Change::Same;
    }
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        match process::status(pid) {
            Ok(st) if st.state == 'Z' || st.state == 'X' => return Change::Exited,
            Ok(_) if exec_loaded(pid) => {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
                    .map_or_else(|_| "another program".into(), |p| p.display().to_string());
                return Change::Execd(exe);
            }
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => return Change::Exited,
        }
    }
}
