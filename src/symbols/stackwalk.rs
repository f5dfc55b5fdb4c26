//! Return addresses from a copy of a stack's top (`--stack dwarf`): the
//! process's modules give their unwind tables (`.eh_frame` with its
//! `.eh_frame_hdr`, `.debug_frame` from the file or its debug file) to the
//! architecture's unwinder ([`crate::arch::stack_unwind`]), once per module.
//! The copy came from the target: reads outside it are misses, never
//! errors, and the walk is bounded by the depth asked for.

use std::collections::HashSet;

use super::ProcessModules;
use super::module::Module;
use crate::arch::stack_unwind::{StackUnwinder, UnwindStart, UnwindTables};
use crate::arch::{Arch, Host};

/// Unwinds the stacks of one process.
pub struct StackWalker {
    pid: i32,
    unwinder: Box<dyn StackUnwinder>,
    /// Modules whose tables the unwinder has: (path, load bias).
    added: HashSet<(std::path::PathBuf, u64)>,
    rereads: u32,
}

/// Reads of the process's memory map for addresses in no known module, at most.
const MAX_REREADS: u32 = 16;

impl StackWalker {
    /// A walker for process `pid` with the unwind tables of its modules now.
    pub fn new(pid: i32) -> StackWalker {
        let mut w = StackWalker { pid, unwinder: Host::stack_unwinder(), added: HashSet::new(), rereads: 0 };
        w.add_modules();
        w
    }

    fn add_modules(&mut self) {
        let Some(mods) = crate::process::read_maps(self.pid).ok().and_then(|m| ProcessModules::new(self.pid, &m).ok())
        else {
            return;
        };
        for i in 0..mods.len() {
            let Ok(m) = mods.get(i) else { continue };
            if self.added.insert((m.path.clone(), m.bias.runtime(crate::addr::FileAddr(0)).0)) {
                self.unwinder.add(tables(m));
            }
        }
    }

    /// The return addresses above a function entered at `pc` with stack
    /// pointer `sp`, frame pointer `fp` and return address `ra`, from
    /// `words` (the stack from `sp` up), at most `max`.
    pub fn unwind(&mut self, pc: u64, sp: u64, fp: u64, ra: u64, words: &[u64], max: usize) -> Vec<u64> {
        let start = UnwindStart { pc, sp, fp, ra };
        let mut read = |addr: u64| {
            let off = addr.checked_sub(sp)?;
            if !off.is_multiple_of(8) {
                return None;
            }
            words.get(usize::try_from(off / 8).ok()?).copied()
        };
        let out = self.unwinder.unwind(start, &mut read, max);
        if out.is_empty() && self.rereads < MAX_REREADS {
            // A module loaded since: look again once.
            self.rereads += 1;
            self.add_modules();
            return self.unwinder.unwind(start, &mut read, max);
        }
        out
    }
}

/// Module `m`'s unwind tables.
fn tables(m: &Module) -> UnwindTables {
    let section = |name: &str| -> Option<(std::ops::Range<u64>, Vec<u8>)> {
        let s = m.elf.sections.iter().find(|s| s.name == name && !s.nobits)?;
        let data = m.elf.section_data(name).ok()??;
        Some((s.addr..s.addr + s.size, data.into_owned()))
    };
    let debug_frame = section(".debug_frame")
        .map(|(_, d)| d)
        .or_else(|| m.debug().and_then(|d| d.section_data(".debug_frame").ok()?).map(|d| d.into_owned()));
    let got = m.elf.sections.iter().find(|s| s.name == ".got").map(|s| s.addr..s.addr + s.size);
    UnwindTables {
        name: m.name.clone(),
        avma: m.span.lo..m.span.hi,
        base_avma: m.bias.runtime(crate::addr::FileAddr(0)).0,
        text: section(".text"),
        eh_frame: section(".eh_frame"),
        eh_frame_hdr: section(".eh_frame_hdr"),
        debug_frame,
        got,
    }
}
