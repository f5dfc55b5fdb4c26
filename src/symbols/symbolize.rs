//! Addresses in a process as `function+offset (module)`: the return
//! addresses of recorded stacks, with the functions DWARF says were
//! inlined there (addr2line, on the module's debugging information or its
//! separate debug file's). A process's modules are read once and again
//! when an address lies in none of them (a library loaded since); each
//! address is looked up once. An address no module covers (JIT code, in
//! anonymous executable memory) is named by the process's perf map
//! ([`super::perf_map_file`]), read again as it grows, and looked up
//! afresh each time (a later entry replaces an earlier one); a process
//! with JIT code in its stacks and no perf map gets one note
//! ([`Symbolizer::take_note`]) saying how to have one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use super::ProcessModules;
use super::elf::ElfFile;
use super::perf_map_file::{PerfMapFile, State};
use crate::addr::RuntimeAddr;
use crate::process::Mapping;

type Reader = gimli::EndianRcSlice<gimli::RunTimeEndian>;

/// One frame of a stack, named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The function's name (demangled), if a symbol covers the address.
    pub function: Option<String>,
    /// The module's name, if a module maps the address.
    pub module: Option<String>,
    /// From the function's first byte (or, without one, the module's load address).
    pub offset: u64,
    /// The address.
    pub addr: u64,
    /// The functions inlined at the address, innermost first: the call
    /// chain runs from `function` through them, the last one outermost.
    pub inlined: Vec<String>,
}

impl Frame {
    /// `function+0x1f (module)`, `module+0x1234`, or the address alone.
    pub fn text(&self) -> String {
        match (&self.function, &self.module) {
            (Some(f), Some(m)) => format!("{f}+{:#x} ({m})", self.offset),
            (Some(f), None) => format!("{f}+{:#x}", self.offset),
            (None, Some(m)) => format!("{m}+{:#x}", self.offset),
            (None, None) => format!("{:#x}", self.addr),
        }
    }

    /// One line per function at the address, innermost first: the
    /// inlined ones (`name (inlined) (module)`), then [`Frame::text`].
    pub fn lines(&self) -> Vec<String> {
        let module = self.module.as_deref().map_or(String::new(), |m| format!(" ({m})"));
        let mut out: Vec<String> = self.inlined.iter().map(|f| format!("{f} (inlined){module}")).collect();
        out.push(self.text());
        out
    }

    /// The names a flame graph shows, outermost first: the function (else
    /// `module+0x…`), then the functions inlined into it.
    pub fn short_chain(&self) -> Vec<String> {
        let mut out = vec![self.short()];
        out.extend(self.inlined.iter().rev().cloned());
        out
    }

    /// The name a flame graph shows: the function, else `module+0x…`.
    pub fn short(&self) -> String {
        match (&self.function, &self.module) {
            (Some(f), _) => f.clone(),
            (None, Some(m)) => format!("{m}+{:#x}", self.offset),
            (None, None) => format!("{:#x}", self.addr),
        }
    }
}

/// Names the addresses of one process.
pub struct Symbolizer {
    pid: i32,
    modules: Option<ProcessModules>,
    cache: HashMap<u64, Frame>,
    /// Reads of the memory map after the first, bounded.
    rereads: u32,
    /// Each module's DWARF for inlined functions, by path (None: it has none).
    inline: HashMap<PathBuf, Option<addr2line::Context<Reader>>>,
    /// Names of JIT code, from the process's perf map.
    jit: PerfMapFile,
    /// Anonymous executable memory (JIT code), as of the last read of the maps.
    anon_exec: Vec<(u64, u64)>,
    /// The note about JIT code without names was made.
    jit_noted: bool,
    /// That note, until [`Symbolizer::take_note`] takes it.
    note: Option<String>,
}

/// Reads of a process's memory map a symbolizer makes for addresses it
/// could not place (a library loaded later), at most.
const MAX_REREADS: u32 = 16;

impl Symbolizer {
    /// A symbolizer for process `pid`, with its modules as they are now.
    pub fn new(pid: i32) -> Symbolizer {
        let mut s = Symbolizer {
            pid,
            modules: None,
            cache: HashMap::new(),
            rereads: 0,
            inline: HashMap::new(),
            jit: PerfMapFile::new(pid),
            anon_exec: Vec::new(),
            jit_noted: false,
            note: None,
        };
        s.read_modules();
        s
    }

    fn read_modules(&mut self) {
        let maps = crate::process::read_maps(self.pid).ok();
        self.anon_exec = maps.iter().flatten().filter(|m| is_anon_exec(m)).map(|m| (m.start, m.end)).collect();
        self.modules = maps.and_then(|m| ProcessModules::new(self.pid, &m).ok());
    }

    /// The frame at `addr`; `is_return` when it is a return address (looked
    /// up one byte before, in the call, which may be a function's last).
    pub fn frame(&mut self, addr: u64, is_return: bool) -> Frame {
        if let Some(f) = self.cache.get(&addr) {
            return f.clone();
        }
        let look = if is_return { addr.saturating_sub(1) } else { addr };
        let mut found = self.modules.as_ref().and_then(|m| m.index_containing(look));
        if found.is_none() {
            // JIT code the perf map names already: no need to read the modules again.
            if let Some(named) = self.jit_named(addr, look) {
                return named;
            }
            if self.rereads < MAX_REREADS {
                self.rereads += 1;
                self.read_modules();
                found = self.modules.as_ref().and_then(|m| m.index_containing(look));
            }
        }
        if found.is_none() {
            return self.jit_frame(addr, look);
        }
        let frame = match (found, &self.modules) {
            (Some(i), Some(mods)) => match mods.get(i) {
                Ok(m) => {
                    let inlined = context_of(&mut self.inline, m)
                        .map_or_else(Vec::new, |c| inlined_at(c, m.bias.file(RuntimeAddr(look)).0));
                    match m.function_containing(RuntimeAddr(look)) {
                        Some(f) => Frame {
                            function: Some(f.name.clone()),
                            module: Some(m.name.clone()),
                            offset: addr - f.addr.0,
                            addr,
                            inlined,
                        },
                        None => Frame {
                            function: None,
                            module: Some(m.name.clone()),
                            offset: m.bias.file(RuntimeAddr(addr)).0,
                            addr,
                            inlined,
                        },
                    }
                }
                Err(_) => Frame { function: None, module: Some(mods.name(i)), offset: 0, addr, inlined: Vec::new() },
            },
            _ => Frame { function: None, module: None, offset: 0, addr, inlined: Vec::new() },
        };
        self.cache.insert(addr, frame.clone());
        frame
    }

    /// The source line of the instruction at `addr`, as `file.c:12` (the
    /// file's name without its directories), if its module's DWARF says.
    pub fn line(&mut self, addr: u64) -> Option<String> {
        let mods = self.modules.as_ref()?;
        let m = mods.get(mods.index_containing(addr)?).ok()?;
        let loc = context_of(&mut self.inline, m)?.find_location(m.bias.file(RuntimeAddr(addr)).0).ok()??;
        let file = loc.file?.rsplit('/').next()?;
        Some(format!("{file}:{}", loc.line?))
    }

    /// The frame at `addr` (looked up at `look`) that no module covers: by
    /// the perf map, read again if it does not name `look` yet; else the
    /// address alone.
    fn jit_frame(&mut self, addr: u64, look: u64) -> Frame {
        if let Some(named) = self.jit_named(addr, look) {
            return named;
        }
        self.jit.refresh(Instant::now());
        if let Some(named) = self.jit_named(addr, look) {
            return named;
        }
        self.note_unnamed_jit(look);
        Frame { function: None, module: None, offset: 0, addr, inlined: Vec::new() }
    }

    /// The frame at `addr` if the perf map as read so far names `look`.
    fn jit_named(&self, addr: u64, look: u64) -> Option<Frame> {
        let (name, start) = self.jit.lookup(look)?;
        let module = self.jit.shown().trim_start_matches("/tmp/").to_string();
        Some(Frame {
            function: Some(name.to_string()),
            module: Some(module),
            offset: addr - start,
            addr,
            inlined: Vec::new(),
        })
    }

    /// Notes once, when `look` lies in anonymous executable memory and
    /// the process has no perf map tp reads, how to have one.
    fn note_unnamed_jit(&mut self, look: u64) {
        if self.jit_noted || !self.anon_exec.iter().any(|&(lo, hi)| lo <= look && look < hi) {
            return;
        }
        let (pid, shown) = (self.pid, self.jit.shown());
        self.note = match self.jit.state() {
            State::Missing => Some(format!(
                "frames in JIT code of process {pid} show as addresses: it writes no perf map ({shown}); \
                 start node with --perf-basic-prof, or run `jcmd {pid} Compiler.perfmap` for a JVM"
            )),
            State::Refused(why) => Some(format!(
                "frames in JIT code of process {pid} show as addresses: its perf map {shown} is not read: {why}"
            )),
            State::Unread | State::Read => return,
        };
        self.jit_noted = true;
    }

    /// A note for the user, once, about frames it could not name (the
    /// caller says it: one line after `tp: `, escaped).
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }
}

/// True for anonymous executable memory, where JIT compilers put code
/// (unnamed, or named by the process: `[anon:NAME]`).
fn is_anon_exec(m: &Mapping) -> bool {
    m.exec && m.inode == 0 && (m.path.is_empty() || m.path.starts_with("[anon:"))
}

/// The DWARF of `elf` for looking up inlined functions; None without any.
fn context(elf: &ElfFile) -> Option<addr2line::Context<Reader>> {
    if !elf.has_dwarf() {
        return None;
    }
    let endian = gimli::RunTimeEndian::Little;
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let data = elf.section_data(id.name()).ok().flatten().map(|c| c.into_owned()).unwrap_or_default();
        Ok(gimli::EndianRcSlice::new(std::rc::Rc::from(data), endian))
    };
    let dwarf = gimli::Dwarf::load(load).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// Module `m`'s DWARF context in `contexts` (read on first use: its
/// separate debug file's where that has DWARF), or None if it has none.
fn context_of<'a>(
    contexts: &'a mut HashMap<PathBuf, Option<addr2line::Context<Reader>>>,
    m: &super::module::Module,
) -> Option<&'a addr2line::Context<Reader>> {
    contexts
        .entry(m.path.clone())
        .or_insert_with(|| context(m.debug().filter(|d| d.has_dwarf()).unwrap_or(&m.elf)))
        .as_ref()
}

/// The functions inlined at file address `at`, innermost first (the
/// function they are inlined into, which DWARF lists last, left out).
fn inlined_at(ctx: &addr2line::Context<Reader>, at: u64) -> Vec<String> {
    let Ok(mut frames) = ctx.find_frames(at).skip_all_loads() else { return Vec::new() };
    let mut names = Vec::new();
    // A few levels at most in practice; bounded whatever the DWARF says.
    while let Ok(Some(f)) = frames.next() {
        if names.len() > 64 {
            break;
        }
        let name = f.function.as_ref().and_then(|n| n.raw_name().ok().map(|r| r.into_owned())).unwrap_or_default();
        names.push(super::demangle::demangle(&name).unwrap_or(name));
    }
    names.pop();
    names
}
