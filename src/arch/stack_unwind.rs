//! Unwinding a copy of a stack's top with a module's unwind tables
//! (`--stack dwarf`), through framehop, the unwinder samply uses (built on
//! gimli): which registers start the walk is the architecture's business,
//! so each implements [`StackUnwinder`] with framehop's unwinder for it.

use std::ops::Range;

use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

/// A module's unwind tables and where the module is mapped.
#[derive(Debug, Clone, Default)]
pub struct UnwindTables {
    /// Its name, for messages.
    pub name: String,
    /// The addresses its mappings cover.
    pub avma: Range<u64>,
    /// The runtime address of its file address 0 (its load bias).
    pub base_avma: u64,
    /// `.text`: file addresses and bytes (for prologues and epilogues).
    pub text: Option<(Range<u64>, Vec<u8>)>,
    /// `.eh_frame`: file addresses and bytes.
    pub eh_frame: Option<(Range<u64>, Vec<u8>)>,
    /// `.eh_frame_hdr`: file addresses and bytes (its search table).
    pub eh_frame_hdr: Option<(Range<u64>, Vec<u8>)>,
    /// `.debug_frame` bytes (from the file or its separate debug file).
    pub debug_frame: Option<Vec<u8>>,
    /// `.got`'s file addresses (for GOT-relative pointers in the CFI).
    pub got: Option<Range<u64>>,
}

/// Where an unwind starts: the probed function's entry, with the stack
/// pointer, the frame pointer and the return address it had there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindStart {
    /// The function's entry.
    pub pc: u64,
    /// The stack pointer.
    pub sp: u64,
    /// The frame pointer.
    pub fp: u64,
    /// The return address.
    pub ra: u64,
}

/// An unwinder for one process's modules.
pub trait StackUnwinder: Send {
    /// Adds a module's tables.
    fn add(&mut self, tables: UnwindTables);
    /// The return addresses of the frames above `start`, at most `max`,
    /// reading the stack through `read` (None where the copy has no word).
    fn unwind(&mut self, start: UnwindStart, read: &mut dyn FnMut(u64) -> Option<u64>, max: usize) -> Vec<u64>;
}

/// The framehop module for `t`.
pub(crate) fn module(t: UnwindTables) -> Module<Vec<u8>> {
    let (text_svma, text) = t.text.map_or((None, None), |(r, d)| (Some(r), Some(d)));
    let (eh_frame_svma, eh_frame) = t.eh_frame.map_or((None, None), |(r, d)| (Some(r), Some(d)));
    let (eh_frame_hdr_svma, eh_frame_hdr) = t.eh_frame_hdr.map_or((None, None), |(r, d)| (Some(r), Some(d)));
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma,
        text,
        got_svma: t.got,
        eh_frame_svma,
        eh_frame,
        eh_frame_hdr_svma,
        eh_frame_hdr,
        debug_frame: t.debug_frame,
        ..Default::default()
    };
    Module::new(t.name, t.avma, t.base_avma, info)
}

/// The return addresses framehop finds from `pc` with `regs`.
pub(crate) fn walk<U: Unwinder<Module = Module<Vec<u8>>>>(
    unwinder: &U,
    cache: &mut U::Cache,
    pc: u64,
    regs: U::UnwindRegs,
    read: &mut dyn FnMut(u64) -> Option<u64>,
    max: usize,
) -> Vec<u64> {
    let mut read_stack = |addr: u64| read(addr).ok_or(());
    let mut iter = unwinder.iter_frames(pc, regs, cache, &mut read_stack);
    let mut out = Vec::new();
    while out.len() < max {
        match iter.next() {
            Ok(Some(FrameAddress::ReturnAddress(a))) => out.push(a.get()),
            Ok(Some(FrameAddress::InstructionPointer(_))) => {}
            _ => break,
        }
    }
    out
}
