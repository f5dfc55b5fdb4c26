//! Removing probes from a stopped process, and unmapping tp's memory when
//! nothing can still run in it.
//!
//! Removal writes each site's original bytes back (the region recorded
//! them; the sites of a page with one write), so it needs nothing from the
//! session that installed the probe.
//! Detours stay mapped after removal: a thread may be inside one, or a signal
//! frame may hold an address in one, and the detour still runs correctly,
//! ending with a jump back to the (now original) code. [`unmap`] removes the
//! arenas and the region only when [`check_unused`] found that no probe is
//! live and no thread's PC or stack refers to them.

use anyhow::{Context, Result};

use super::layout::{self, Entry, State};
use super::region::Region;
use super::semaphore;
use super::threads::{self, Place};
use crate::arch::{Arch, Host};
use crate::escape::text;
use crate::notes::Notes;
use crate::process::memory::Memory;
use crate::process::regset;
use crate::process::remote::RemoteCaller;
use crate::process::stop::Stopped;
use crate::process::{self};

/// A probe that [`remove`] took out.
#[derive(Debug, Clone)]
pub struct Removed {
    /// Its entry.
    pub index: u32,
    /// Its entry as it was.
    pub entry: Entry,
    /// Its final hit count.
    pub hits: u64,
    /// False if the site held neither tp's patch nor the original bytes (left alone).
    pub restored: bool,
}

/// Restores every possibly-patched probe that `select` picks. `sharers`
/// are the other processes mapping the same region (`probe::family` finds them):
/// a probe whose patch is still in one of them keeps its entry live, so
/// that process can still be detached (and its detours stay mapped).
///
/// A probe can go over another at the same site (a session over a kept
/// probe: its entry's original bytes are the kept probe's patch), so
/// entries are taken newest first: the session's puts the kept patch back,
/// then the kept one puts the file's bytes back. A probe another one has
/// gone over is taken out of that chain instead: the one over it will put
/// back what it would have. A site tp cannot restore is said to `notes`.
pub fn remove(
    notes: &dyn Notes,
    mem: &Memory,
    region: &Region,
    sharers: &[Memory],
    select: impl Fn(u32, &Entry) -> bool,
) -> Result<Vec<Removed>> {
    let mut out = Vec::new();
    let mut maps: Option<Vec<process::Mapping>> = None;
    let mut entries = region.entries();
    entries.reverse();
    // The sites' code, read a span at a time and written back a page at a
    // time once every selected site is Removing: a probe-all removes tens
    // of thousands, and a read and a write each would cost two system
    // calls per probe while the process is stopped.
    let mut code = Code::around(
        mem,
        entries.iter().filter(|(i, e)| e.state().maybe_patched() && select(*i, e)).map(|(_, e)| (e.site, e.window_len)),
    );
    // The states the sites restored go to, once their bytes are written.
    let mut finally: Vec<(u32, State)> = Vec::new();
    for k in 0..entries.len() {
        let (i, e) = entries[k];
        if !e.state().maybe_patched() || !select(i, &e) {
            continue;
        }
        let now = code.read(mem, e.site, e.window_len as usize).with_context(|| format!("reading `{}`", e.name()))?;
        // Gone over by a newer probe at its site, which holds its patch as
        // its original bytes: that one puts back this one's instead. (Only
        // where the site does not hold this probe's patch: a search, rare.)
        let over = (now != e.patch())
            .then(|| {
                entries[..k]
                    .iter()
                    .find(|(j, n)| *j > i && n.site == e.site && n.state().maybe_patched() && n.original() == e.patch())
            })
            .flatten();
        if let Some(&(j, mut n)) = over {
            n.original[..e.original().len()].copy_from_slice(e.original());
            region.set_entry(j, &n)?;
            let patched_elsewhere =
                sharers.iter().any(|m| m.read_vec(e.site, e.window_len as usize).is_ok_and(|b| b == e.patch()));
            region.set_state(i, if patched_elsewhere { e.state() } else { State::Inactive })?;
            out.push(Removed { index: i, entry: e, hits: 0, restored: true });
            continue;
        }
        let restored = if now == e.patch() {
            region.set_state(i, State::Removing)?;
            crate::fault::point("before-restore");
            code.write(e.site, e.original());
            crate::fault::point("during-detach");
            if e.semaphore != 0 {
                // The site is restored before its semaphore is taken back:
                // a detach cut short in between finds the patch and takes
                // it back then, once.
                code.flush(mem).with_context(|| format!("restoring `{}`", e.name()))?;
                // This process held one increment: its site had the patch.
                let maps = match &mut maps {
                    Some(m) => m,
                    None => maps.insert(process::read_maps(mem.pid())?),
                };
                let released = match semaphore::plausible(e.semaphore, maps) {
                    true => semaphore::release(mem, e.semaphore).map_err(|err| format!("{err:#}")),
                    false => Err("it is not in writable private memory of the process".to_string()),
                };
                if let Err(why) = released {
                    crate::note!(
                        notes,
                        "tp: warning: the semaphore of `{}` at {:#x} was not taken back: {why}",
                        text(&e.name()),
                        e.semaphore
                    );
                }
            }
            true
        } else {
            now == e.original()
        };
        if !restored {
            crate::note!(
                notes,
                "tp: warning: the code of `{}` at {:#x} was changed by something else since tp patched it; left as it is",
                text(&e.name()),
                e.site
            );
        }
        let patched_elsewhere =
            sharers.iter().any(|m| m.read_vec(e.site, e.window_len as usize).is_ok_and(|b| b == e.patch()));
        let state = if patched_elsewhere { e.state() } else { State::Inactive };
        match restored && now == e.patch() {
            // Inactive once its original bytes are back.
            true => finally.push((i, state)),
            false => region.set_state(i, state)?,
        }
        out.push(Removed { index: i, entry: e, hits: 0, restored });
    }
    code.flush(mem).context("restoring the probed functions")?;
    for (i, state) in finally {
        region.set_state(i, state)?;
    }
    out.reverse();
    let indexes: Vec<u32> = out.iter().map(|r| r.index).collect();
    for (r, hits) in out.iter_mut().zip(region.hits_of(&indexes)) {
        r.hits = hits;
    }
    Ok(out)
}

/// The code around a set of sites, read a span at a time while the
/// process is stopped: reads of a site come from it, and writes go into
/// it until [`Code::flush`] writes each page's changed bytes with one
/// write. Sites whose span cannot be read are read and written one by one.
struct Code {
    /// Spans read: start and bytes, by start.
    spans: Vec<(u64, Vec<u8>)>,
    /// Changed ranges not yet written: (address, length).
    dirty: Vec<(u64, usize)>,
    /// Writes outside every span, not yet made.
    loose: Vec<(u64, Vec<u8>)>,
}

/// The most bytes [`Code::read`] reads at once.
const CODE_SPAN: u64 = 64 << 10;
/// [`Code::flush`] writes a page at a time at most.
const CODE_PAGE: u64 = 4096;

impl Code {
    /// Reads the code around `sites` (address, length).
    fn around(mem: &Memory, sites: impl Iterator<Item = (u64, u32)>) -> Code {
        let mut sites: Vec<(u64, u64)> = sites.map(|(at, len)| (at, at + len as u64)).collect();
        sites.sort_unstable();
        let mut spans = Vec::new();
        let mut k = 0;
        while k < sites.len() {
            let (lo, mut hi) = sites[k];
            k += 1;
            while k < sites.len() && sites[k].1.max(hi) - lo <= CODE_SPAN {
                hi = hi.max(sites[k].1);
                k += 1;
            }
            if let Ok(bytes) = mem.read_vec(lo, (hi - lo) as usize) {
                spans.push((lo, bytes));
            }
        }
        Code { spans, dirty: Vec::new(), loose: Vec::new() }
    }

    /// The span holding `len` bytes at `at`, and their offset in it.
    fn find(&self, at: u64, len: usize) -> Option<(usize, usize)> {
        let k = self.spans.partition_point(|(lo, _)| *lo <= at).checked_sub(1)?;
        let (lo, bytes) = &self.spans[k];
        let off = (at - lo) as usize;
        (off + len <= bytes.len()).then_some((k, off))
    }

    /// `len` bytes at `at`, as the process holds them once the writes so
    /// far are made.
    fn read(&self, mem: &Memory, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
        match self.find(at, len) {
            Some((k, off)) => Ok(self.spans[k].1[off..off + len].to_vec()),
            None => {
                let mut now = mem.read_vec(at, len)?;
                for (w, bytes) in &self.loose {
                    if *w == at && bytes.len() == len {
                        now.clone_from(bytes);
                    }
                }
                Ok(now)
            }
        }
    }

    /// Writes `bytes` at `at` (at the next [`Code::flush`]).
    fn write(&mut self, at: u64, bytes: &[u8]) {
        match self.find(at, bytes.len()) {
            Some((k, off)) => {
                self.spans[k].1[off..off + bytes.len()].copy_from_slice(bytes);
                self.dirty.push((at, bytes.len()));
            }
            None => self.loose.push((at, bytes.to_vec())),
        }
    }

    /// Makes the writes: the changed bytes of each page with one write.
    fn flush(&mut self, mem: &Memory) -> std::io::Result<()> {
        for (at, bytes) in std::mem::take(&mut self.loose) {
            mem.write(at, &bytes)?;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        let page = |a: u64| a & !(CODE_PAGE - 1);
        let mut k = 0;
        while k < dirty.len() {
            let lo = dirty[k].0;
            let mut hi = lo + dirty[k].1 as u64;
            k += 1;
            // Ranges of one page, and of one span.
            while let Some(&(at, len)) = dirty.get(k) {
                let top = hi.max(at + len as u64);
                if page(at) != page(lo) || page(top - 1) != page(lo) || self.find(lo, (top - lo) as usize).is_none() {
                    break;
                }
                hi = top;
                k += 1;
            }
            // (Each range was found in a span when it was written.)
            if let Some((s, off)) = self.find(lo, (hi - lo) as usize) {
                mem.write(lo, &self.spans[s].1[off..off + (hi - lo) as usize])?;
            }
        }
        Ok(())
    }
}

/// Why tp's memory stayed mapped after a detach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Some probes are still live.
    LiveProbes,
    /// A thread is running in, or its stack refers to, tp's code.
    InUse {
        /// The thread.
        tid: i32,
        /// Where it holds the address in tp's code.
        place: Place,
        /// The address.
        word: u64,
        /// True if it is a return trampoline's: a call live through a
        /// return probe whose return address tp could not put back.
        trampoline: bool,
    },
    /// Another tp has unmapped it already.
    Gone,
    /// A thread (its TID in its PID namespace) traces a call with the
    /// in-target stepping engine, whose SIGTRAP handler is tp's code.
    Tracing {
        /// The thread.
        tid: u32,
    },
}

impl Kept {
    /// For [`Kept::InUse`] and [`Kept::Tracing`]: how the thread uses tp's code, as a clause
    /// ("thread 12 is running in tp's code (at 0x…)").
    pub fn in_use(&self) -> Option<String> {
        if let &Kept::Tracing { tid } = self {
            return Some(format!(
                "thread {tid} traces a call with the in-target stepping engine, whose SIGTRAP handler is tp's code \
                 (it ends the trace at the call's next instruction, once a syscall it waits in returns)"
            ));
        }
        let &Kept::InUse { tid, place, word, trampoline } = self else { return None };
        if trampoline {
            let held = match place {
                Place::Pc => "runs it".to_string(),
                Place::ReturnRegister => "holds it in its return register".to_string(),
                Place::Stack(at) => format!("holds it at {at:#x}"),
            };
            return Some(format!(
                "thread {tid} will return through tp's return trampoline ({word:#x}; it {held}): a call live \
                 through a return probe whose return address tp cannot put back"
            ));
        }
        Some(match place {
            Place::Pc => format!("thread {tid} is running in tp's code (at {word:#x})"),
            Place::ReturnRegister => {
                format!("thread {tid} may return into tp's code (its return register holds {word:#x})")
            }
            Place::Stack(at) => format!(
                "thread {tid}'s stack holds an address in tp's code ({word:#x}, at {at:#x}): a call that returns \
                 there, a signal frame that resumes there, or a number that only looks like one"
            ),
        })
    }
}

/// Instructions a thread found in tp's code is run for, one at a time, to
/// leave it ([`Stopped::step_out`]): a detour's path is tens, a call
/// into the runtime hundreds.
const STEP_OUT_LIMIT: u32 = 4096;

/// The most time one look spends stepping threads out of tp's code, while
/// every thread is stopped (a step is a few microseconds natively, far
/// more on an emulated CPU); past it, the thread is left where it is, as
/// one that could not be stepped.
const STEP_OUT_BUDGET: std::time::Duration = std::time::Duration::from_millis(20);

/// Decides, with every thread stopped, whether tp's memory can go: no probe
/// is live in this process and no thread's PC or stack refers to a code
/// arena; a thread whose PC is in one is first run out of it, one
/// instruction at a time, where it can be without blocking. Calls live
/// through a return probe are given their return addresses back first
/// ([`super::frames::give_back`]), once no probe is left and no thread runs
/// tp's code. Once that holds it stays true (nothing can create a new
/// reference), so the unmap itself ([`unmap`]) needs only the worker thread
/// stopped.
pub fn check_unused(stopped: &mut Stopped, mem: &Memory, region: &Region) -> Result<Option<Kept>> {
    // Live here: a site of this process that holds the patch (or cannot be
    // read). An entry stays live while another process of the family holds
    // its patch; this one's copy of tp's memory can go all the same.
    let patched_here = |e: &Entry| mem.read_vec(e.site, e.window_len as usize).map_or(true, |b| b == e.patch());
    if region.entries().iter().any(|(_, e)| e.state().maybe_patched() && patched_here(e)) {
        return Ok(Some(Kept::LiveProbes));
    }
    let maps = process::read_maps(stopped.pid())?;
    if !region.is_mapped_in(&maps) {
        // Another tp unmapped it already; its addresses may hold something else now.
        return Ok(Some(Kept::Gone));
    }
    if let Some(tid) = super::trap::tracing(mem, region) {
        return Ok(Some(Kept::Tracing { tid }));
    }
    let h = region.header();
    let arenas = &h.arenas[..h.arena_count as usize];
    // Code lies only in the bytes an arena has used (the header was
    // validated: `used` is within the arena, the detours within `used`).
    let in_arena = |a: u64| arenas.iter().any(|r| a >= r.addr && a < r.addr + r.used);
    let mut regs = Vec::new();
    let tids: Vec<_> = stopped.threads().map(|t| t.tid).collect();
    let deadline = std::time::Instant::now() + STEP_OUT_BUDGET;
    for tid in tids {
        let mut r = regset::get_regs(tid)?;
        let pc = Host::pc(&r);
        // A thread caught in a detour (a loop that calls a probed function
        // all the time is, often) runs on to the jump back to its function.
        if in_arena(pc) {
            if !stopped.step_out(tid, mem, &in_arena, STEP_OUT_LIMIT, deadline)? {
                return Ok(Some(Kept::InUse { tid: tid.as_raw(), place: Place::Pc, word: pc, trampoline: false }));
            }
            r = regset::get_regs(tid)?;
        }
        regs.push((tid, r));
    }
    // No thread runs tp's code and no probe is left: calls that would
    // return through the trampoline return to their callers instead.
    super::frames::give_back(mem, region)?;
    for (tid, r) in &regs {
        // The whole used stack: a return address or a signal frame anywhere
        // in it may come back into a detour.
        if let Some((place, word)) = threads::pc_and_stack(mem, &maps, r).into_iter().find(|&(_, w)| in_arena(w)) {
            // Assembled again only on this rare path (give_back has its own).
            let trampoline = super::frames::trampolines(region).contains(&word);
            return Ok(Some(Kept::InUse { tid: tid.as_raw(), place, word, trampoline }));
        }
    }
    Ok(None)
}

/// Ends a detach: with every thread still stopped, checks whether tp's memory
/// is unused; lets all threads but the worker go; unmaps the memory if it
/// was unused; lets the worker go. Returns why the memory was kept, if it
/// was, and how long all threads were stopped.
pub fn finish(mut stopped: Stopped, mem: &Memory, region: &Region) -> Result<(Option<Kept>, std::time::Duration)> {
    let kept = check_unused(&mut stopped, mem, region)?;
    let world = stopped.release_all_but_worker();
    if kept.is_none() {
        unmap(&mut stopped, mem, region)?;
    }
    stopped.resume();
    Ok((kept, world))
}

/// True if the private area the header records at `at` is one: anonymous
/// private read-write memory over its whole size (the kernel may have
/// split or merged its mappings), with tp's mark in it. A header the
/// target changed never makes tp unmap anything else.
pub fn is_private_area(mem: &Memory, maps: &[process::Mapping], at: u64) -> bool {
    process::maps::anonymous_covers(maps, at, at + layout::private_geometry().size)
        && mem.read_u64(at + layout::PRIVATE_MAGIC_OFF).is_ok_and(|w| w == layout::PRIVATE_MAGIC)
}

/// Unmaps the data region, the private area and the code arenas, after
/// [`check_unused`] said so.
pub fn unmap(stopped: &mut Stopped, mem: &Memory, region: &Region) -> Result<()> {
    let h = region.header();
    let arenas = &h.arenas[..h.arena_count as usize];
    let maps = process::read_maps(stopped.pid())?;
    let mut caller = RemoteCaller::new(stopped, mem, &maps)?;
    let sc = Host::SYSCALLS;
    // The in-target stepping engine's handler is tp's code: it goes first.
    super::trap::uninstall(&mut caller, mem, region)?;
    // The region first: once its header is gone no later tp will look for the
    // arenas, so dying between the two calls leaks pages but breaks nothing
    // (`tp detach` finds them by what tp wrote into them: `orphan`).
    caller.checked("munmap", sc.munmap, [region.target_addr(), region.len(), 0, 0, 0, 0])?;
    crate::fault::point("after-unmap-region");
    let private = (h.ctx.private, layout::private_geometry().size);
    if is_private_area(mem, &maps, private.0) {
        caller.checked("munmap", sc.munmap, [private.0, private.1, 0, 0, 0, 0])?;
    }
    // An arena record the target damaged reads as empty (validate::sanitize): nothing to unmap.
    for a in arenas.iter().filter(|a| a.size > 0) {
        caller.checked("munmap", sc.munmap, [a.addr, a.size, 0, 0, 0, 0])?;
    }
    Ok(())
}
