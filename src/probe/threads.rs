//! The target's threads while probes change: moving a thread whose PC lies
//! inside a patch window into the detour, and reading the words of a
//! thread's stack, where a return address or a signal frame may point into
//! a window or a code arena.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use nix::unistd::Pid;

use super::Request;
use crate::arch::{Arch, Detour, Host};
use crate::process::Mapping;
use crate::process::memory::Memory;
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

/// Moves every thread whose PC (or restart PC) lies inside a window to the
/// same instruction in the detour, and refuses if a thread's stack holds an
/// address inside a window (a signal frame would return there). `windows`
/// is [`Windows::of`] the same `requests`.
pub fn move_threads_out_of_windows(
    stopped: &mut Stopped,
    mem: &Memory,
    maps: &[Mapping],
    requests: &[Request],
    detours: &[&Detour],
    windows: &Windows,
) -> Result<usize> {
    let tids: Vec<Pid> = stopped.threads().map(|t| t.tid).collect();
    let interior = &windows.interior;
    let mut moves = Vec::new();
    for tid in tids {
        let mut regs = Host::get_regs(tid).with_context(|| format!("reading the registers of thread {tid}"))?;
        let pc = Host::pc(&regs);
        for (req, detour) in requests.iter().zip(detours) {
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
                bail!(
                    "thread {tid} is stopped inside the patch window of `{}` at {pc:#x}; try again",
                    req.function.name
                );
            };
            Host::set_pc(&mut regs, target);
            moves.push((tid, regs));
        }
        scan_stack(tid, mem, maps, &regs, requests, interior)?;
    }
    for (tid, regs) in &moves {
        Host::set_regs(*tid, regs).with_context(|| format!("moving thread {tid} out of a patch window"))?;
    }
    Ok(moves.len())
}

/// Refuses if the stack above the thread's SP holds the address of an
/// instruction strictly inside a window: a signal frame or anything else that
/// would later jump there.
fn scan_stack(
    tid: Pid,
    mem: &Memory,
    maps: &[Mapping],
    regs: &<Host as Arch>::Regs,
    requests: &[Request],
    interior: &HashMap<u64, usize>,
) -> Result<()> {
    if interior.is_empty() {
        return Ok(());
    }
    for v in thread_stack_words(mem, maps, regs, STACK_SCAN_BYTES) {
        if let Some(req) = interior.get(&v).and_then(|&i| requests.get(i)) {
            bail!(
                "thread {tid} has an address inside the patch window of `{}` on its stack \
                 (interrupted by a signal there?); try again",
                req.function.name
            );
        }
    }
    Ok(())
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
