//! Addresses in a process as `function+offset (module)`: the return
//! addresses of recorded stacks, with the functions DWARF says were
//! inlined there (addr2line, on the module's debugging information or its
//! separate debug file's). A process's modules are read once and again
//! when an address lies in none of them (a library loaded since); each
//! address is looked up once.

use std::collections::HashMap;
use std::path::PathBuf;

use super::ProcessModules;
use super::elf::ElfFile;
use crate::addr::RuntimeAddr;

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
}

/// Reads of a process's memory map a symbolizer makes for addresses it
/// could not place (a library loaded later), at most.
const MAX_REREADS: u32 = 16;

impl Symbolizer {
    /// A symbolizer for process `pid`, with its modules as they are now.
    pub fn new(pid: i32) -> Symbolizer {
        let mut s = Symbolizer { pid, modules: None, cache: HashMap::new(), rereads: 0, inline: HashMap::new() };
        s.read_modules();
        s
    }

    fn read_modules(&mut self) {
        self.modules = crate::process::read_maps(self.pid).ok().and_then(|m| ProcessModules::new(self.pid, &m).ok());
    }

    /// The frame at `addr`; `is_return` when it is a return address (looked
    /// up one byte before, in the call, which may be a function's last).
    pub fn frame(&mut self, addr: u64, is_return: bool) -> Frame {
        if let Some(f) = self.cache.get(&addr) {
            return f.clone();
        }
        let look = if is_return { addr.saturating_sub(1) } else { addr };
        let mut found = self.modules.as_ref().and_then(|m| m.index_containing(look));
        if found.is_none() && self.rereads < MAX_REREADS {
            self.rereads += 1;
            self.read_modules();
            found = self.modules.as_ref().and_then(|m| m.index_containing(look));
        }
        let frame = match (found, &self.modules) {
            (Some(i), Some(mods)) => match mods.get(i) {
                Ok(m) => {
                    let inlined = {
                        let ctx = self.inline.entry(m.path.clone()).or_insert_with(|| {
                            let dwarf = m.debug().filter(|d| d.has_dwarf()).unwrap_or(&m.elf);
                            context(dwarf)
                        });
                        ctx.as_ref().map_or_else(Vec::new, |c| inlined_at(c, m.bias.file(RuntimeAddr(look)).0))
                    };
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
