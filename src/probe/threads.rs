//! The target's threads while probes change: moving a thread whose PC lies
//! inside a patch window into the detour, and reading the words of a
//! thread's stack, where a return address or a signal frame may point into
//! a window or a code arena.

use std::collections::HashMap;

use anyhow::{Context, Result};
use nix::unistd::Pid;

use super::Request;
use crate::arch::{Arch, Detour, Host};
use crate::process::Mapping;
use crate::process::memory::Memory;
use crate::process::regset;
use crate::process::stop::Stopped;

/// How far up from a thread's stack pointer tp looks for saved PCs.
const STACK_SCAN_BYTES: u64 = 64 << 10;

/// The addresses of instruction boundaries strictly inside the windows of
/// some requests, each with the index of its request: made while the
/// threads still run, looked up while they are stopped.
pub struct Windows {
    interior: HashMap<u64, usize>,
}

impl Windows {
    /// The interior boundaries of the windows of `requests`.
    pub fn of(requests: &[Request]) -> Windows {
        let interior =
            requests.iter().enumerate().flat_map(|(i, r)| r.plan.interior_boundaries().map(move |a| (a, i))).collect();
        Windows { interior }
    }
}

/// The functions whose windows a thread may still need as they are: their
/// requests' positions, the function's own and its exits' (see
/// [`Request::parent`]), with why, in words.
#[derive(Debug, Default)]
pub struct Unpatchable {
    /// Positions in the requests that must not be patched this time.
    pub requests: std::collections::BTreeSet<usize>,
    /// One line per function: its name and why.
    pub why: Vec<String>,
}

impl Unpatchable {
    /// Marks the function of request `i` (all its sites) with `why`.
    fn mark(&mut self, requests: &[Request], i: usize, why: String) {
        let own = requests[i].parent.unwrap_or(i);
        if !self.requests.insert(own) {
            return;
        }
        self.requests.extend((own + 1..requests.len()).take_while(|&k| requests[k].parent == Some(own)));
        self.why.push(why);
    }
}

/// Moves every thread whose PC (or restart PC) lies inside a window to the
/// same instruction in the detour. A function whose window a thread must
/// still see as it is, because the thread's stack holds an address inside
/// it (a return address of a call made from the window, a signal frame) or
/// it stops where its detour has no counterpart, is left unpatched this
/// time: returned with why, its requests skipped by the moves. `windows`
/// is [`Windows::of`] the same `requests`. Returns how many threads moved.
pub fn move_threads_out_of_windows(
    stopped: &mut Stopped,
    mem: &Memory,
    maps: &[Mapping],
    requests: &[Request],
    detours: &[&Detour],
    windows: &Windows,
) -> Result<(usize, Unpatchable)> {
    let tids: Vec<Pid> = stopped.threads().map(|t| t.tid).collect();
    let interior = &windows.interior;
    let mut unpatchable = Unpatchable::default();
    let mut all_regs = Vec::with_capacity(tids.len());
    for &tid in &tids {
        let regs = regset::get_regs(tid).with_context(|| format!("reading the registers of thread {tid}"))?;
        scan_stack(tid, mem, maps, &regs, requests, interior, &mut unpatchable);
        all_regs.push(regs);
    }
    let mut moves = Vec::new();
    for (&tid, mut regs) in tids.iter().zip(all_regs) {
        let pc = Host::pc(&regs);
        for (i, (req, detour)) in requests.iter().zip(detours).enumerate() {
            if unpatchable.requests.contains(&i) {
                continue;
            }
            let site = req.plan.site;
            let inside = |a: u64| a > site && a < site + req.plan.len() as u64;
            let target = if inside(pc) {
                detour.map_pc((pc - site) as u32)
            } else if let Some(restart) = Host::restart_pc(&regs).filter(|&r| inside(r)) {
                // The kernel will rewind the PC onto an instruction inside the window.
                detour.map_pc((restart - site) as u32).map(|d| d + (pc - restart))
            } else {
                continue;
            };
            let Some(target) = target else {
                let why = format!("thread {tid} is stopped inside its first bytes, at {pc:#x}");
                unpatchable.mark(requests, i, format!("`{}`: {why}", req.function.name));
                continue;
            };
            Host::set_pc(&mut regs, target);
            moves.push((tid, regs));
        }
    }
    for (tid, regs) in &moves {
        regset::set_regs(*tid, regs).with_context(|| format!("moving thread {tid} out of a patch window"))?;
    }
    Ok((moves.len(), unpatchable))
}

/// Marks the function of every request whose window holds an address that
/// the stack above the thread's SP holds, strictly inside the window: a
/// return address or signal frame that would later jump there.
fn scan_stack(
    tid: Pid,
    mem: &Memory,
    maps: &[Mapping],
    regs: &<Host as Arch>::Regs,
    requests: &[Request],
    interior: &HashMap<u64, usize>,
    unpatchable: &mut Unpatchable,
) {
    if interior.is_empty() {
        return;
    }
    for v in thread_stack_words(mem, maps, regs, STACK_SCAN_BYTES) {
        if let Some(&i) = interior.get(&v)
            && let Some(req) = requests.get(i)
        {
            let why = format!("thread {tid} has the address {v:#x} inside its first bytes on its stack");
            unpatchable.mark(requests, i, format!("`{}`: {why}", req.function.name));
        }
    }
}

/// The words of a thread's used stack, from its stack pointer `sp` (rounded
/// down to a word) up to at most `max` bytes: empty if `sp` lies in no
/// mapping, short where the target's memory cannot be read.
pub fn stack_words(mem: &Memory, maps: &[Mapping], sp: u64, max: u64) -> Vec<u64> {
    let Some(stack) = maps.iter().find(|m| m.contains(sp)) else { return Vec::new() };
    let len = (stack.end - (sp & !7)).min(max);
    let bytes = mem.read_partial(sp & !7, len as usize);
    bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect()
}

/// The words of a stopped thread's used stack, up to at most `max` bytes:
/// [`stack_words`], ending where the goroutine stack ends if the thread runs
/// Go code on one. A goroutine stack lies in a mapping of Go's heap, next
/// to other goroutines' stacks and old signal frames that are not this
/// thread's (and reading to that mapping's end would take long).
pub fn thread_stack_words(mem: &Memory, maps: &[Mapping], regs: &<Host as Arch>::Regs, max: u64) -> Vec<u64> {
    let sp = Host::sp(regs);
    let read = |addr: u64, len: usize| mem.read_vec(addr, len).ok();
    let max = match Host::goroutine_stack(regs, &read) {
        Some((_, hi)) => max.min(hi - (sp & !7)),
        None => max,
    };
    stack_words(mem, maps, sp, max)
}

/// Where a stopped thread may go next: a word it holds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Its PC: where it runs.
    Pc,
    /// Its return register: where the function it runs may return.
    ReturnRegister,
    /// The word of its used stack at this address: a return address, a
    /// signal frame's saved PC, or anything else that looks like one.
    Stack(u64),
}

/// A stopped thread's PC, its return register (where a call leaves the
/// return address in one) and every word of its used stack, each with its
/// place: where it runs, and everything it may return or jump to later
/// (return addresses, signal frames), as code addresses
/// ([`Arch::code_address`]: signed ones too).
pub fn pc_and_stack(mem: &Memory, maps: &[Mapping], regs: &<Host as Arch>::Regs) -> Vec<(Place, u64)> {
    let mut words = vec![(Place::Pc, Host::pc(regs))];
    words.extend(Host::return_register(regs).map(|w| (Place::ReturnRegister, w)));
    let base = Host::sp(regs) & !7;
    let stack = thread_stack_words(mem, maps, regs, u64::MAX);
    words.extend(stack.into_iter().enumerate().map(|(i, w)| (Place::Stack(base + 8 * i as u64), w)));
    words.into_iter().map(|(p, w)| (p, Host::code_address(w))).collect()
}
