//! Addresses in a process as `function+offset (module)`: the return
//! addresses of recorded stacks. A process's modules are read once and
//! again when an address lies in none of them (a library loaded since);
//! each address is looked up once.

use std::collections::HashMap;

use super::ProcessModules;
use crate::addr::RuntimeAddr;

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
}

/// Reads of a process's memory map a symbolizer makes for addresses it
/// could not place (a library loaded later), at most.
const MAX_REREADS: u32 = 16;

impl Symbolizer {
    /// A symbolizer for process `pid`, with its modules as they are now.
    pub fn new(pid: i32) -> Symbolizer {
        let mut s = Symbolizer { pid, modules: None, cache: HashMap::new(), rereads: 0 };
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
                Ok(m) => match m.function_containing(RuntimeAddr(look)) {
                    Some(f) => Frame {
                        function: Some(f.name.clone()),
                        module: Some(m.name.clone()),
                        offset: addr - f.addr.0,
                        addr,
                    },
                    None => Frame {
                        function: None,
                        module: Some(m.name.clone()),
                        offset: m.bias.file(RuntimeAddr(addr)).0,
                        addr,
                    },
                },
                Err(_) => Frame { function: None, module: Some(mods.name(i)), offset: 0, addr },
            },
            _ => Frame { function: None, module: None, offset: 0, addr },
        };
        self.cache.insert(addr, frame.clone());
        frame
    }
}
