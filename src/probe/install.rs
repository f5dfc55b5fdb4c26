//! Installing probes, in two steps.
//!
//! [`prepare`] needs one seized thread, the worker, which makes the remote
//! syscalls: it creates the data region ([`super::region::create`]) and
//! code arenas ([`super::arena`]), stopping the worker only for those calls
//! ([`RemoteCaller`]), and writes the detours, memory that nothing executes
//! yet, while every thread runs (the worker still seized, so that no other
//! tp takes the process meanwhile, its signals passed on as they come).
//! [`commit`] needs every thread stopped: it moves each thread whose PC, or
//! whose restart PC after an interrupted syscall, lies inside a window to
//! the equivalent instruction of its detour ([`super::threads`]), then
//! patches each site. So the whole process is stopped only for the checks
//! and the patch writes, and the worker besides only for its syscalls.
//!
//! Order matters for what a tracer killed at any step leaves behind:
//! unused memory (region, arenas), then unused code (detours, recorded as
//! Inactive entries), then threads moved into complete detours, then the
//! sites of each page marked Installing, patched with one write of that
//! page's span (a probe-all would otherwise make a write per probe while the
//! process is stopped), marked Active. The target
//! only ever holds complete detours and sites that are either original or
//! fully patched, and the region records enough for `tp detach` to restore
//! them. If a step fails, `PatchGuard` restores every site this commit
//! patched. A static probe's semaphore is incremented just before its site
//! is patched, and taken back by the guard after the restore
//! ([`super::semaphore`]).

use std::collections::HashMap;

use anyhow::{Context, Result, bail};

use super::layout::{self, Arena, Entry, EventCtx, Header, State, kind};
use super::region::Region;
use super::region::create::create_region;
use super::{Request, arena, runtime, runtime_calls, semaphore, shadow, threads};
use crate::addr::RegionOffset;
use crate::arch::{
    Arch, Detour, DetourSpec, ExitWords, Host, Records, Refusal, RuntimeAddrs, RuntimeLayout, ThreadKey, TidOffset,
};
use crate::notes::Notes;
use crate::process::memory::Memory;
use crate::process::regset;
use crate::process::remote::RemoteCaller;
use crate::process::stop::Stopped;
use crate::process::{self, Mapping};
use crate::progress::Progress;

/// A probe that is live after [`commit`].
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its entry in the region.
    pub index: u32,
    /// The request it came from.
    pub request: Request,
    /// Where its detour is.
    pub detour: u64,
    /// The entries of the sites at its function's exits ([`Request::exits`]).
    pub exits: Vec<u32>,
    /// For a probe of calls tp steps ([`kind::STEP`]): where each
    /// instruction of its window runs in the detour (`Detour::pc_map`), so
    /// that a step there counts as the function's own instruction.
    pub pc_map: Vec<(u32, u64)>,
}

/// What an install did.
#[derive(Debug)]
pub struct Report {
    /// The live probes, in request order.
    pub installed: Vec<Installed>,
    /// Threads moved out of a window into a detour.
    pub moved_threads: usize,
    /// The functions left unpatched because a thread may still need their
    /// first bytes as they are, one line each (name and why).
    pub unpatched: Vec<String>,
    /// Where those functions' probes would have been in `installed`
    /// (counted among all the probes requested).
    pub unpatched_at: Vec<usize>,
    /// True if this transaction created the data region.
    pub created_region: bool,
}

/// Probes whose detours are written and recorded, ready to [`commit`].
pub struct Prepared {
    /// The region they are recorded in.
    pub region: Region,
    requests: Vec<Request>,
    placed: Vec<Placed>,
    created_region: bool,
    /// The addresses strictly inside the windows, made before the stop.
    windows: threads::Windows,
    /// The bytes each site holds now where they are not the original's
    /// ([`Options::take_over`]: another probe's patch).
    under: HashMap<u64, Vec<u8>>,
}

impl Prepared {
    /// What the install did, once [`commit`] made the probes live (built
    /// after the threads run again).
    pub fn done(self, committed: Committed) -> (Region, Report) {
        let Prepared { region, requests, placed, created_region, .. } = self;
        let Committed { moved_threads, unpatchable } = committed;
        let mut installed: Vec<Installed> = Vec::with_capacity(placed.len());
        // Where each site's probe went among `installed`.
        let mut probe_of: Vec<usize> = Vec::with_capacity(placed.len());
        let mut unpatched_at = Vec::new();
        let mut probes = 0;
        for (i, (request, p)) in requests.into_iter().zip(&placed).enumerate() {
            if request.parent.is_none() {
                probes += 1;
            }
            if unpatchable.requests.contains(&i) {
                // (Its exits are skipped too: they follow it.)
                if request.parent.is_none() {
                    unpatched_at.push(probes - 1);
                }
                probe_of.push(usize::MAX);
                continue;
            }
            match request.parent {
                Some(parent) => {
                    let k = probe_of[parent];
                    installed[k].exits.push(p.index);
                    probe_of.push(k);
                }
                None => {
                    probe_of.push(installed.len());
                    let pc_map = match request.kind & kind::STEP {
                        0 => Vec::new(),
                        _ => p.detour.pc_map.clone(),
                    };
                    installed.push(Installed { index: p.index, request, detour: p.at, exits: Vec::new(), pc_map });
                }
            }
        }
        (region, Report { installed, moved_threads, unpatched: unpatchable.why, unpatched_at, created_region })
    }
}

/// How to install.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The tp session that owns the probes, or 0 to keep them after tp exits.
    pub owner: u32,
    /// Events per thread ring, for a region created now.
    pub ring_len: u32,
    /// Samples each probe may record before it disables itself (sampling probes).
    pub sample_budget: i32,
    /// The caller found the requested sites that hold probes already to be
    /// kept ones (or those of sessions that died): each new probe goes over
    /// the one there, and records its patch as the bytes to put back.
    pub take_over: bool,
    /// Nanoseconds per timestamp tick times 2^[`layout::NS_SHIFT`], for
    /// the runtime's `--agg` of latency ([`layout::EventCtx::ns_mult`]);
    /// 0 leaves the region's as it is.
    pub ns_mult: u64,
}

/// Writes detours for `requests`, the worker of `stopped` (seized) making
/// the remote syscalls and running between them. `region` is the process's
/// existing data region, if it has one.
pub fn prepare(
    stopped: &mut Stopped,
    mem: &Memory,
    region: Option<Region>,
    requests: Vec<Request>,
    opts: Options,
) -> Result<Prepared> {
    let pid = stopped.pid();
    let maps = process::read_maps(pid).context("reading the target's memory map")?;
    let sites = sites_of(arena::choose_forms(&maps, region.as_ref(), requests)?);
    let requests = &sites[..];
    let under = match (&region, opts.take_over) {
        (Some(r), true) => bytes_under(r, requests)?,
        (Some(r), false) => {
            check_not_probed(pid, r, requests)?;
            HashMap::new()
        }
        (None, _) => HashMap::new(),
    };
    check_code(mem, requests, &under)?;
    // Before anything is injected: the runtime's own syscalls must pass
    // every thread's seccomp filters.
    runtime_calls::check_before_install(stopped, kinds_of(requests))?;
    // And no thread's hardware shadow stack may reject a probe's detour.
    shadow::check_before_install(stopped, requests)?;

    let mut caller = RemoteCaller::new(stopped, mem, &maps)?;
    let created_region = region.is_none();
    // Signals that arrive while the worker steps go back to `stopped` when
    // it is let run or the caller is dropped, on success or failure.
    let region = match region {
        Some(r) => r,
        None => create_region(&mut caller, mem, &maps, requests, opts.ring_len)
            .map_err(|e| undo_mappings(&mut caller, e))?,
    };
    // Nothing refers to the new memory yet: the process runs while tp
    // writes into it.
    caller.let_run();
    crate::fault::point("after-inject");
    // The region just mapped may sit where an arena for another site would
    // have gone (right below a copy of code that mmap placed at the top).
    let maps = match created_region {
        true => process::read_maps(pid)
            .context("reading the target's memory map")
            .map_err(|e| undo_mappings(&mut caller, e))?,
        false => maps,
    };
    let before = region.header();
    match write_detours(mem, &mut caller, &maps, &region, requests, &opts, &under) {
        Ok(placed) => {
            caller.keep_mapped();
            let windows = threads::Windows::of(requests);
            Ok(Prepared { region, requests: sites, placed, created_region, windows, under })
        }
        Err(e) => {
            // Nothing runs the new detours yet: forget them in the region
            // this attach found, then unmap what this attach mapped.
            if !created_region {
                forget_since(&region, &before);
            }
            Err(undo_mappings(&mut caller, e))
        }
    }
}

/// The sites to patch for `requests`: each request's own, then, for a probe
/// that sees its calls end at the function's exits, one per exit of
/// [`Request::exits`] (kind [`kind::EXIT`], with what its exit records of
/// the probe's kind, and `parent` the function's site).
fn sites_of(requests: Vec<Request>) -> Vec<Request> {
    let mut sites = Vec::with_capacity(requests.len());
    for mut req in requests {
        let parent = sites.len();
        let exits = std::mem::take(&mut req.exits);
        if exits.is_empty() {
            sites.push(req);
            continue;
        }
        sites.push(req.clone());
        for plan in &exits {
            sites.push(Request {
                plan: plan.clone(),
                long: Err(Refusal::Interior("an exit's window has no long form")),
                kind: kind::EXIT | (req.kind & (kind::FILTER_EXIT | kind::AGGREGATE)),
                operands: None,
                semaphore: None,
                config: Default::default(),
                exits: Vec::new(),
                parent: Some(parent),
                ..req.clone()
            });
        }
    }
    sites
}

/// Unmaps what `caller` mapped in a transaction that failed with `err`;
/// says in the error what could not be unmapped.
fn undo_mappings(caller: &mut RemoteCaller, err: anyhow::Error) -> anyhow::Error {
    let left = caller.unmap_mapped();
    // A process that is gone keeps nothing: the error says why it failed.
    if left.is_empty() || !process::is_alive(caller.pid()) {
        return err;
    }
    let list: Vec<String> = left.iter().map(|(a, len)| format!("{a:#x} ({len} bytes)")).collect();
    err.context(format!("tp's memory at {} stays mapped in the target", list.join(", ")))
}

/// Takes the entries and arenas added since `before` out of the region's
/// header again (their memory is about to be unmapped).
fn forget_since(region: &Region, before: &Header) {
    let mut h = region.header();
    for i in before.count..h.count.min(h.capacity) {
        let _ = region.set_entry(i, &Entry::free());
    }
    // (The target can write the header too: bounds are clamped, never trusted.)
    let max = h.arenas.len();
    let (old, new) = ((before.arena_count as usize).min(max), (h.arena_count as usize).min(max));
    for a in h.arenas.iter_mut().take(new).skip(old) {
        *a = Arena { addr: 0, size: 0, used: 0, runtime: 0 };
    }
    // An older arena keeps what it has used: a thread may already run a
    // detour written there, and tp's check that its code is unused at the
    // detach looks only at used bytes (`remove::check_unused`).
    for (a, was) in h.arenas[..old].iter_mut().zip(&before.arenas[..old]) {
        *a = Arena { used: a.used.max(was.used).min(was.size), ..*was };
    }
    h.count = before.count;
    h.arena_count = old as u32;
    let _ = region.set_header(&h);
}

/// What [`commit`] did: for [`Prepared::done`].
pub struct Committed {
    /// Threads moved out of a window into a detour.
    pub moved_threads: usize,
    /// The functions left unpatched, and why.
    pub unpatchable: threads::Unpatchable,
}

/// Makes prepared probes live; every thread must be stopped. A function
/// whose first bytes a thread may still need as they are stays unpatched
/// ([`threads::move_threads_out_of_windows`]); its entries are freed.
pub fn commit(stopped: &mut Stopped, mem: &Memory, prepared: &Prepared) -> Result<Committed> {
    let Prepared { region, requests, placed, created_region, windows, under } = prepared;
    match patch_all(stopped, mem, region, requests, placed, windows, under) {
        Ok(moved) => Ok(moved),
        Err(e) if *created_region => {
            // The sites are original again (PatchGuard): the memory this
            // attach mapped goes too, unless a thread was moved into it.
            if let Ok(None) = super::remove::check_unused(stopped, mem, region) {
                let _ = super::remove::unmap(stopped, mem, region);
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Moves threads out of the windows and patches every site but those a
/// thread may still need as they are; on failure the sites patched so far
/// are restored.
fn patch_all(
    stopped: &mut Stopped,
    mem: &Memory,
    region: &Region,
    requests: &[Request],
    placed: &[Placed],
    windows: &threads::Windows,
    under: &HashMap<u64, Vec<u8>>,
) -> Result<Committed> {
    check_code(mem, requests, under)?;
    // Again with every thread stopped: threads started, or filters added,
    // since the first check.
    runtime_calls::check_stopped(stopped, kinds_of(requests))?;
    shadow::check_stopped(stopped, requests)?;
    let maps = process::read_maps(stopped.pid()).context("reading the target's memory map")?;
    learn_threads(stopped, mem, region, requests.iter().any(|r| r.kind != kind::COUNT))?;
    if Host::COUNTING_CALLS_RUNTIME {
        learn_rows(stopped, region)?;
    }
    let walks_stacks =
        |r: &Request| r.kind & kind::STACK != 0 || r.config.by & layout::by_word::REG_MASK == layout::by_word::STACK;
    if requests.iter().any(walks_stacks) {
        learn_stacks(stopped, region, &maps)?;
    }
    let detours: Vec<&Detour> = placed.iter().map(|p| &p.detour).collect();
    let (moved_threads, unpatchable) =
        threads::move_threads_out_of_windows(stopped, mem, &maps, requests, &detours, windows)?;
    if unpatchable.requests.iter().any(|&i| requests[i].kind & kind::RENDEZVOUS != 0) {
        bail!("tp's own probe of the dynamic linker cannot go in now: {}; try again", unpatchable.why.join("; "));
    }
    for &i in &unpatchable.requests {
        region.set_entry(placed[i].index, &Entry::free())?;
    }

    let mut guard = PatchGuard { mem, region, notes: stopped.notes(), patched: Vec::new(), acquired: Vec::new() };
    let patchable: Vec<usize> = (0..requests.len()).filter(|i| !unpatchable.requests.contains(i)).collect();
    for group in page_groups(requests, &patchable) {
        for &i in group {
            let (req, p) = (&requests[i], &placed[i]);
            region.set_state(p.index, State::Installing)?;
            crate::fault::point("before-patch");
            if let Some(sem) = req.semaphore {
                semaphore::acquire(mem, sem)
                    .with_context(|| format!("incrementing the semaphore of `{}`", req.function.name))?;
                guard.acquired.push(sem);
                crate::fault::point("after-semaphore");
            }
        }
        // Every site of the group is Installing: the guard puts back each
        // one's original bytes if the write fails half-way.
        guard.patched.extend(group.iter().map(|&i| placed[i].index));
        patch_group(mem, requests, placed, group)?;
        for &i in group {
            region.set_state(placed[i].index, State::Active)?;
            crate::fault::point("after-patch");
        }
    }
    // A site is patched a page at a time: a process that died meanwhile
    // (killed: it cannot exit while stopped) shows no failed write.
    if !process::is_alive(stopped.pid()) {
        bail!(process::ProcessError::Exited(stopped.pid()));
    }
    guard.patched.clear();
    guard.acquired.clear();
    Ok(Committed { moved_threads, unpatchable })
}

/// `patchable` (positions in `requests`, in order) cut into runs whose
/// windows all lie in one page, each run's sites in ascending order and
/// apart: each run is patched with one write of its page's bytes
/// ([`patch_group`]), so a probe-all does not make a system call per probe
/// while the process is stopped. A site with a semaphore is a run of its own.
fn page_groups<'a>(requests: &[Request], patchable: &'a [usize]) -> Vec<&'a [usize]> {
    let mut groups = Vec::new();
    let mut start = 0;
    let page = |a: u64| a & !(PATCH_PAGE - 1);
    for k in 1..=patchable.len() {
        let cut = match patchable.get(k) {
            None => true,
            Some(&i) => {
                let (first, prev, req) = (&requests[patchable[start]], &requests[patchable[k - 1]], &requests[i]);
                let end = req.plan.site + req.plan.len() as u64;
                req.semaphore.is_some()
                    || first.semaphore.is_some()
                    || page(req.plan.site) != page(first.plan.site)
                    || page(end - 1) != page(first.plan.site)
                    || req.plan.site < prev.plan.site + prev.plan.len() as u64
            }
        };
        if cut {
            groups.push(&patchable[start..k]);
            start = k;
        }
    }
    groups
}

/// Patches sites within one page at a time ([`page_groups`]).
const PATCH_PAGE: u64 = 4096;

/// Writes the patches of `group` (sites in ascending order, within one
/// page) with one write: the bytes between the sites are read back first
/// (every thread is stopped: nothing changes them meanwhile). One site is
/// written alone.
fn patch_group(mem: &Memory, requests: &[Request], placed: &[Placed], group: &[usize]) -> Result<()> {
    let name = |i: usize| &requests[i].function.name;
    if let [i] = group {
        return mem
            .write(requests[*i].plan.site, &placed[*i].patch)
            .with_context(|| format!("patching `{}`", name(*i)));
    }
    let lo = requests[group[0]].plan.site;
    let last = &requests[group[group.len() - 1]].plan;
    let hi = last.site + last.len() as u64;
    let mut bytes =
        mem.read_vec(lo, (hi - lo) as usize).with_context(|| format!("reading the code of `{}`", name(group[0])))?;
    for &i in group {
        let at = (requests[i].plan.site - lo) as usize;
        let patch = &placed[i].patch;
        bytes[at..at + patch.len()].copy_from_slice(patch);
    }
    mem.write(lo, &bytes).with_context(|| format!("patching `{}` and {} more", name(group[0]), group.len() - 1))
}

/// Tells the runtime how to tell the process's threads apart (their
/// thread register, read as the CPU and kernel allow, or as every stopped
/// thread's TCB shows it: [`crate::arch::ThreadKey`]; counting threads
/// take their counter rows by it) and, for `events`, where each thread's
/// TCB keeps its TID, if the stopped threads show it, so events carry the
/// TID without a syscall: a lone thread may show its TID in more than one
/// place, which the runtime tells apart in the process's next thread. Both
/// are learnt once per region (the TID's place at each attach until then).
fn learn_threads(stopped: &Stopped, mem: &Memory, region: &Region, events: bool) -> Result<()> {
    let mut h = region.header();
    if h.ctx.key_how != layout::key_how::UNKNOWN && (h.ctx.tid_offset != 0 || !events) {
        return Ok(());
    }
    let threads: Vec<(i32, <Host as Arch>::Regs)> =
        stopped.threads().filter_map(|t| Some((t.tid.as_raw(), regset::get_regs(t.tid).ok()?))).collect();
    let read = |addr: u64, len: usize| mem.read_vec(addr, len).ok();
    if h.ctx.key_how == layout::key_how::UNKNOWN {
        let hwcap2 = process::auxv(stopped.pid(), libc::AT_HWCAP2).unwrap_or(0);
        h.ctx.key_how = match forced_thread_key(hwcap2).unwrap_or_else(|| Host::thread_key(hwcap2, &threads, &read)) {
            ThreadKey::Register => layout::key_how::REGISTER,
            ThreadKey::Tcb => layout::key_how::TCB,
            ThreadKey::TcbOrRegister => layout::key_how::TCB_REGISTER,
            ThreadKey::Syscall => {
                if events {
                    crate::note!(
                        stopped.notes(),
                        "tp: the threads of process {} do not keep their thread pointer where glibc does, and the \
                     kernel does not let programs read it (FSGSBASE, Linux 5.9): each event costs a system call",
                        stopped.pid()
                    );
                }
                layout::key_how::SYSCALL
            }
        };
    }
    if events && h.ctx.tid_offset == 0 {
        match Host::tid_offset(&threads, &read) {
            TidOffset::At(off) => h.ctx.tid_offset = off,
            TidOffset::OneOf(places) if places.len() <= layout::TID_CANDIDATES => {
                h.ctx.tid_candidates = [0; layout::TID_CANDIDATES];
                h.ctx.tid_candidates[..places.len()].copy_from_slice(&places);
                h.ctx.may_check_memory = may_check_memory(stopped) as u32;
            }
            TidOffset::OneOf(_) | TidOffset::Unknown => {}
        }
    }
    region.set_header(&h)
}

/// Tells the runtime where the main thread's stack is (the `[stack]`
/// mapping: it only grows down from where it is now), and whether a thread
/// may ask the kernel whether its stack is readable (madvise with
/// MADV_POPULATE_READ, Linux 5.14), which the seccomp filters of every
/// thread (all stopped) must let through: a thread whose stack bounds the
/// runtime cannot know records only its caller.
fn learn_stacks(stopped: &Stopped, region: &Region, maps: &[Mapping]) -> Result<()> {
    let mut h = region.header();
    if let Some(stack) = maps.iter().find(|m| m.path == "[stack]") {
        h.ctx.main_stack_lo = stack.start;
        h.ctx.main_stack_hi = stack.end;
    }
    h.ctx.may_check_memory = may_check_memory(stopped) as u32;
    region.set_header(&h)
}

/// Whether the runtime may ask the kernel whether memory is readable
/// (madvise with MADV_POPULATE_READ, Linux 5.14): the seccomp filters of
/// every thread (all stopped) must let it through.
fn may_check_memory(stopped: &Stopped) -> bool {
    let data = crate::process::bpf::SeccompData {
        nr: Host::SYSCALLS.madvise as i32,
        arch: Host::SYSCALLS.audit_arch,
        instruction_pointer: 0,
        args: [0x7f00_0000_0000, 4096, crate::arch::syscalls::MADV_POPULATE_READ, 0, 0, 0],
    };
    runtime_calls::permits_everywhere(stopped, &data)
}

/// Tells the runtime whether a counting thread may take a counter row of
/// its own, which makes syscalls on its first count in the process
/// ([`runtime_calls::counting_calls`]): if a thread's seccomp filters would
/// not let them run, every thread counts in the shared row, without any.
/// Learnt at every attach, with every thread stopped.
fn learn_rows(stopped: &Stopped, region: &Region) -> Result<()> {
    let mut h = region.header();
    h.ctx.may_take_rows = runtime_calls::counting_may_call(stopped) as u32;
    region.set_header(&h)
}

/// `TP_THREAD_KEY` (`tcb`, `register` or `syscall`): how the runtime
/// tells threads apart, other than the machine and the program would have
/// it, so that the tests run every way on one machine. `register` only
/// where the CPU and kernel allow it: the way they would take for a
/// program whose threads tell nothing.
fn forced_thread_key(hwcap2: u64) -> Option<ThreadKey> {
    match std::env::var("TP_THREAD_KEY").ok()?.as_str() {
        "tcb" => Some(ThreadKey::Tcb),
        "register" => Some(Host::thread_key(hwcap2, &[], &|_, _| None)),
        "syscall" => Some(ThreadKey::Syscall),
        _ => None,
    }
}

/// How many bytes of code [`check_code`] reads at once.
const CHECK_SPAN: u64 = 64 << 10;

/// Refuses functions whose code in memory is not what the file holds, or
/// at a site taken over, the patch of the probe there (`under`): the first
/// of them in request order. Sites near one another are read with one read.
fn check_code(mem: &Memory, requests: &[Request], under: &HashMap<u64, Vec<u8>>) -> Result<()> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| requests[i].plan.site);
    let mut wrong: Option<usize> = None;
    let mut k = 0;
    while k < order.len() {
        let lo = requests[order[k]].plan.site;
        let mut hi = lo;
        let mut end = k;
        while let Some(&i) = order.get(end) {
            let plan = &requests[i].plan;
            let top = plan.site + plan.len() as u64;
            if end > k && top - lo > CHECK_SPAN {
                break;
            }
            hi = hi.max(top);
            end += 1;
        }
        // Memory between the sites may be unreadable: then one read each.
        let span = mem.read_vec(lo, (hi - lo) as usize).ok();
        for &i in &order[k..end] {
            let plan = &requests[i].plan;
            let at = (plan.site - lo) as usize;
            let want = under.get(&plan.site).unwrap_or(&plan.window);
            let same = match &span {
                Some(bytes) => bytes[at..at + plan.len()] == want[..],
                None => mem.read_vec(plan.site, plan.len())? == *want,
            };
            if !same && wrong.is_none_or(|w| i < w) {
                wrong = Some(i);
            }
        }
        k = end;
    }
    if let Some(i) = wrong {
        let req = &requests[i];
        bail!("cannot probe `{}`: {}", req.function.name, Refusal::CodeMismatch { at: req.plan.site });
    }
    Ok(())
}

/// For [`Options::take_over`]: the patch of the probe each requested site
/// holds now (the last installed there), which the new probe records as
/// the bytes to put back; a probe whose window is not the new one's cannot
/// be gone over.
fn bytes_under(region: &Region, requests: &[Request]) -> Result<HashMap<u64, Vec<u8>>> {
    // The last installed at a site is the one whose patch it holds.
    let sites: std::collections::HashSet<u64> = requests.iter().map(|r| r.plan.site).collect();
    let mut under: HashMap<u64, (u32, Entry)> = HashMap::new();
    for (i, e) in region.entries() {
        if e.state().maybe_patched() && sites.contains(&e.site) {
            let top = under.entry(e.site).or_insert((i, e));
            if i > top.0 {
                *top = (i, e);
            }
        }
    }
    let mut out = HashMap::new();
    let at: HashMap<u64, &Request> = requests.iter().map(|r| (r.plan.site, r)).collect();
    for (site, (_, e)) in under {
        let req = at[&site];
        if e.window_len as usize != req.plan.len() {
            bail!(
                "cannot probe `{}` over the probe there (its window is {} bytes, this one's {}); remove that one \
                 first with `tp detach -p PID`",
                req.function.name,
                e.window_len,
                req.plan.len()
            );
        }
        out.insert(site, e.patch().to_vec());
    }
    Ok(out)
}

fn check_not_probed(pid: i32, region: &Region, requests: &[Request]) -> Result<()> {
    let at: HashMap<u64, &Request> = requests.iter().map(|r| (r.plan.site, r)).collect();
    for (_, e) in region.entries() {
        if e.state().maybe_patched()
            && let Some(req) = at.get(&e.site)
        {
            let who = match e.owner {
                0 => "kept with --keep".to_string(),
                pid => format!("by tp session {pid}"),
            };
            bail!("`{}` is already probed ({who}); remove it with `tp detach -p {pid}` first", req.function.name);
        }
    }
    Ok(())
}

/// The kinds of `requests`, or-ed; [`kind::AT_EXITS`] only if every return
/// probe among them sees its calls end at the function's exits.
fn kinds_of(requests: &[Request]) -> u32 {
    let mut k = requests.iter().fold(kind::COUNT, |k, r| k | r.kind);
    if requests.iter().any(|r| {
        super::filter::reads_memory(&r.config.entry)
            || super::filter::reads_memory(&r.config.exit)
            || r.config.fetch[0] != 0
    }) {
        k |= runtime_calls::READS_STRINGS;
    }
    match requests.iter().any(|r| shadow::times_returns(r.kind)) {
        true => k & !kind::AT_EXITS,
        false => k,
    }
}

/// What a detour of `k` (bits of [`kind`]) does beyond counting.
pub fn records_of(k: u32) -> Records {
    if k & kind::EXIT != 0 {
        return Records { exit: true, ..Records::COUNT };
    }
    Records {
        // The runtime is called at entry for a stack or a count by value too.
        args: k & (kind::ARGS | kind::STACK | kind::FIELDS | kind::BY) != 0,
        ret: k & kind::RET != 0,
        sample: k & kind::SAMPLE != 0,
        unwind: k & kind::UNWIND != 0,
        exit: false,
        rendezvous: k & kind::RENDEZVOUS != 0,
        step: k & kind::STEP != 0,
    }
}

/// The words the detour of site `req` (entry `index`) passes to the
/// runtime's exit before the exits of its window: its probe (its own, or
/// its function's for an exit's site, whose entry is `parent`) and the
/// flags that make the exit the runtime's work. None for a probe that does
/// not see its calls end at the function's exits.
fn exit_words_of(req: &Request, index: u32, parent: Option<u32>) -> Option<ExitWords> {
    let probe = match parent {
        Some(p) => p,
        None if req.kind & kind::AT_EXITS != 0 => index,
        None => return None,
    };
    let ret = probe | (layout::entry_word(0, req.kind) & layout::entry_flags::EXIT_EXT) | go_frames(req);
    let runtime = ret & !layout::PROBE_MASK != 0;
    Some(ExitWords { ret, tail: ret | layout::entry_flags::TAIL_CALL, runtime })
}

/// [`layout::entry_flags::GO_FRAMES`] for Go code: its calls timed at their
/// function's exits are its goroutines'.
fn go_frames(req: &Request) -> u32 {
    match req.abi {
        crate::arch::Abi::Go => layout::entry_flags::GO_FRAMES,
        _ => 0,
    }
}

/// The configuration written for probe `index` of `req`: the request's,
/// with the flags its exit reads.
fn config_for(req: &Request, index: u32) -> layout::ProbeConfig {
    let mut c = *req.config;
    c.flags = layout::entry_word(index, req.kind) & !layout::PROBE_MASK;
    // A value added at the exit alone (`--agg 'hist(latency)' --by tid`)
    // leaves the entry plain: only the exit's flags say it.
    let at_exit = layout::by_word::AGG | layout::by_word::AT_EXIT;
    if c.by & at_exit == at_exit {
        c.flags |= layout::entry_flags::BY;
    }
    c
}

/// The runtime's parts a probe of kind `k` calls: the `_ext` entry for a
/// predicate, a count by value or a stack, the `_ext` trampoline for a
/// predicate on the return value or durations kept in the target. Other
/// probes call the plain ones, which have none of that code.
pub fn runtime_for(k: u32, rt: RuntimeAddrs) -> RuntimeAddrs {
    let mut rt = rt;
    if k & (kind::FILTER | kind::STACK | kind::FIELDS | kind::BY) != 0 {
        rt.entry = rt.entry_ext;
    }
    if k & (kind::FILTER_EXIT | kind::AGGREGATE) != 0 {
        rt.trampoline = rt.trampoline_ext;
    }
    rt
}

/// True if a probe of kind `k` may record with the arch's hand-written
/// fast entry (the plain `tp_entry`'s common case, whose frames return
/// through the plain trampoline): none of the `_ext` parts of the entry,
/// and none of the exit's where the return address is replaced. A call
/// timed at its exits puts no trampoline anywhere (its exits' detours
/// call the `_ext` exit themselves), so its exit's parts leave its entry
/// as plain as any.
pub fn fast_entry_for(k: u32) -> bool {
    let exit_parts = if k & kind::AT_EXITS != 0 { 0 } else { kind::FILTER_EXIT | kind::AGGREGATE };
    k & (kind::FILTER | kind::STACK | kind::FIELDS | kind::BY | exit_parts) == 0
}

/// Where probe `index`'s detour finds its flag, counters and runtime;
/// `parent` is the entry of its function's probe, for an exit's site.
fn spec_for(
    region: &Region,
    h: &Header,
    index: u32,
    req: &Request,
    runtime: Option<RuntimeAddrs>,
    parent: Option<u32>,
) -> DetourSpec {
    let kind = req.kind;
    let runtime = runtime.map(|rt| runtime_for(kind, rt));
    DetourSpec {
        probe_index: index,
        records: records_of(kind),
        entry_word: layout::entry_word(index, kind)
            | if kind & kind::AT_EXITS != 0 && kind & kind::EXIT == 0 { go_frames(req) } else { 0 },
        runtime,
        flag_addr: region.flag_addr(index).0,
        counters: region.addr_of(RegionOffset(h.counters_off)).0,
        cache: runtime::cache_of(h),
        countdowns_from_counters: h.countdowns_off - h.counters_off,
        slot_bits: h.slot_bits,
        stride_shift: h.stride_shift,
        abi: req.abi,
        return_saved_below: req.return_saved_below,
        operands: req.operands,
        layout: fast_entry_for(kind).then(|| runtime::layout_of(h)),
        exit_words: exit_words_of(req, index, parent),
        sp_below_entry: req.sp_below_entry,
        go_room_lost: (req.go_room && kind & kind::EXIT == 0).then(|| {
            region.addr_of(RegionOffset(Header::ctx_off() + std::mem::offset_of!(EventCtx, lost_no_room) as u64)).0
        }),
    }
}

/// A detour planned for one request: where it goes and whether it must be
/// written, and the bytes that patch its site.
struct Placed {
    index: u32,
    detour: Detour,
    at: u64,
    patch: Vec<u8>,
}

/// Writes (or reuses) a detour for each request and records its entry as Inactive.
fn write_detours(
    mem: &Memory,
    caller: &mut RemoteCaller,
    maps: &[Mapping],
    region: &Region,
    requests: &[Request],
    opts: &Options,
    under: &HashMap<u64, Vec<u8>>,
) -> Result<Vec<Placed>> {
    let mut h = region.header();
    let mut inactive: HashMap<u64, Vec<(u32, Entry)>> = HashMap::new();
    for (i, e) in region.entries() {
        if e.state() == State::Inactive && e.detour != 0 {
            inactive.entry(e.site).or_default().push((i, e));
        }
    }

    // Detours: reuse an identical one left by an earlier session, or append a new one.
    let progress = Progress::new(requests.len() as u64, "writing detours");
    let mut placed: Vec<Placed> = Vec::new();
    // Detours follow one another in an arena: written a run at a time.
    let mut run = Run::default();
    for (k, req) in requests.iter().enumerate() {
        progress.inc();
        caller.serve()?;
        let parent = req.parent.map(|p| placed[p].index);
        if let Some(p) = reuse(region, mem, req, &h, inactive.get_mut(&req.plan.site), parent)? {
            placed.push(p);
            continue;
        }
        if h.count >= h.capacity {
            let pid = mem.pid();
            bail!("tp's data region in process {pid} is full ({} probes); run `tp detach -p {pid}` first", h.capacity);
        }
        let index = h.count;
        let (at, detour) = place_detour(caller, mem, maps, region, &mut h, req, index, parent, requests.len() - k)?;
        run.add(mem, at, &detour.bytes).with_context(|| format!("writing the detour of `{}`", req.function.name))?;
        crate::fault::point("after-detour-write");
        h.count += 1;
        region.set_header(&h)?;
        placed.push(Placed { index, detour, at, patch: Vec::new() });
    }
    run.flush(mem).context("writing the detours")?;
    progress.finish();
    if opts.ns_mult != 0 {
        // Before any probe that converts a duration goes live.
        h.ctx.ns_mult = opts.ns_mult;
        region.set_header(&h)?;
    }
    crate::fault::point("after-detour");

    // Entries, recorded before any site changes.
    region.zero_hits_of(&placed.iter().map(|p| p.index).collect::<Vec<_>>())?;
    let parents: Vec<u32> = placed.iter().map(|p| p.index).collect();
    for (req, p) in requests.iter().zip(&mut placed) {
        caller.serve()?;
        let mut e = Entry::free();
        e.state = State::Inactive as u32;
        e.owner = opts.owner;
        e.function = req.function.addr.0;
        e.site = req.plan.site;
        e.detour = p.at;
        e.detour_len = p.detour.bytes.len() as u32;
        e.window_len = req.plan.len() as u32;
        e.kind = req.kind;
        // What goes back at the removal: the file's bytes, or the patch of
        // the probe this one goes over (which then counts again).
        e.original[..req.plan.len()].copy_from_slice(under.get(&req.plan.site).unwrap_or(&req.plan.window));
        let patch = Host::patch_bytes(&req.plan, p.at).map_err(|r| anyhow::anyhow!("`{}`: {r}", req.function.name))?;
        e.patch[..patch.len()].copy_from_slice(&patch);
        p.patch = patch;
        e.set_name(&req.function.name);
        e.set_module(&req.function.module);
        e.semaphore = req.semaphore.unwrap_or(0);
        e.parent = req.parent.map_or(0, |k| parents[k]);
        region.set_budget(p.index, opts.sample_budget)?;
        // Nothing reads a count-only probe's configuration (only the
        // runtime's `_ext` paths and tp's `--if` counts do): left unwritten,
        // its bytes take no memory in the target.
        let config = config_for(req, p.index);
        if req.kind != kind::COUNT || layout::bytes_of(&config).iter().any(|&b| b != 0) {
            region.set_config(p.index, &config)?;
        }
        region.set_enabled(p.index, true)?;
        region.set_entry(p.index, &e)?;
        crate::fault::point("after-entry");
    }
    crate::fault::point("after-entries");

    Ok(placed)
}

/// Detours placed one after another in an arena, written with one write
/// per run (a write each would cost a system call per probe). A detour
/// starts 16-aligned: the few bytes between two, never written (an arena
/// is used upward from where it was used to, and is anonymous memory), are
/// written as the zeros they hold. A run ends where the next detour does
/// not follow, or at [`Run::MAX`] bytes.
#[derive(Default)]
struct Run {
    at: u64,
    bytes: Vec<u8>,
}

impl Run {
    const MAX: usize = 1 << 20;
    /// The most bytes between two detours of one run: less than the
    /// alignment, so never a runtime block written between them.
    const GAP: u64 = 15;

    fn add(&mut self, mem: &Memory, at: u64, bytes: &[u8]) -> std::io::Result<()> {
        let end = self.at + self.bytes.len() as u64;
        if !self.bytes.is_empty() && (at < end || at - end > Self::GAP || self.bytes.len() >= Self::MAX) {
            self.flush(mem)?;
        }
        if self.bytes.is_empty() {
            self.at = at;
        }
        let gap = (at - (self.at + self.bytes.len() as u64)) as usize;
        self.bytes.resize(self.bytes.len() + gap, 0);
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self, mem: &Memory) -> std::io::Result<()> {
        if !self.bytes.is_empty() {
            mem.write(self.at, &self.bytes)?;
            self.bytes.clear();
        }
        Ok(())
    }
}

/// Takes an inactive entry for the same site (from `candidates`) whose
/// detour, rebuilt for that entry, is byte-identical to what the target holds.
fn reuse(
    region: &Region,
    mem: &Memory,
    req: &Request,
    h: &Header,
    candidates: Option<&mut Vec<(u32, Entry)>>,
    parent: Option<u32>,
) -> Result<Option<Placed>> {
    let Some(candidates) = candidates else { return Ok(None) };
    for k in 0..candidates.len() {
        let (i, e) = candidates[k];
        if e.kind != req.kind {
            continue;
        }
        let runtime = if !runtime::needs_runtime(req) {
            None
        } else {
            match h.arenas[..h.arena_count as usize].iter().find(|a| a.addr <= e.detour && e.detour < a.addr + a.size) {
                Some(a) if a.runtime != 0 => Some(runtime_addrs(region, a.runtime)),
                _ => continue,
            }
        };
        let Ok(detour) = Host::build_detour(&req.plan, e.detour, &spec_for(region, h, i, req, runtime, parent)) else {
            continue;
        };
        if detour.bytes.len() == e.detour_len as usize && mem.read_vec(e.detour, detour.bytes.len())? == detour.bytes {
            candidates.swap_remove(k);
            return Ok(Some(Placed { index: i, detour, at: e.detour, patch: Vec::new() }));
        }
    }
    Ok(None)
}

/// Where the runtime block at `at` keeps its parts. Assembling the block
/// to learn them costs as much as a hundred detours, and every detour of
/// an arena asks: the last few answers are kept.
fn runtime_addrs(region: &Region, at: u64) -> RuntimeAddrs {
    type Known = Vec<((u64, RuntimeLayout), RuntimeAddrs)>;
    static KNOWN: std::sync::Mutex<Known> = std::sync::Mutex::new(Vec::new());
    let layout = runtime::layout_of(&region.header());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, addrs)) = known.iter().find(|(k, _)| *k == (at, layout)) {
        return *addrs;
    }
    let addrs = Host::build_runtime(at, &layout, &runtime::blobs()).addrs;
    if known.len() >= 16 {
        known.remove(0);
    }
    known.push(((at, layout), addrs));
    addrs
}

/// Builds the detour of probe `index` in an arena within reach (allocating
/// one if needed, and writing the arena's runtime block first when the probe
/// needs it) and reserves its bytes in the header.
#[allow(clippy::too_many_arguments)]
fn place_detour(
    caller: &mut RemoteCaller,
    mem: &Memory,
    maps: &[Mapping],
    region: &Region,
    h: &mut Header,
    req: &Request,
    index: u32,
    parent: Option<u32>,
    remaining: usize,
) -> Result<(u64, Detour)> {
    let refused = |r: Refusal| anyhow::anyhow!("cannot probe `{}`: {r}", req.function.name);
    let needs_runtime = runtime::needs_runtime(req);
    // A multiple of 16, as every arena's size and use then are (detours
    // start 16-aligned).
    let runtime_len = runtime::block_len();
    let reachable = |a: &Arena| arena::reaches(req.span, a.addr, a.size, arena::reach_of(req));
    // Arenas within reach first, then a new one: the detour goes in the
    // first where it really fits (its size depends on where it goes).
    let mut tried_new = false;
    let mut slot = 0;
    loop {
        if slot == h.arena_count as usize {
            if tried_new {
                bail!("the detour of `{}` does not fit a new code arena", req.function.name);
            }
            if h.arena_count as usize == layout::MAX_ARENAS {
                bail!("tp's data region has no room for another code arena; run `tp detach` first");
            }
            // Whole pages: an arena's last bytes are its mapping's last.
            let size = (arena::arena_size(remaining, req.kind) + if needs_runtime { runtime_len } else { 0 })
                .next_multiple_of(4096);
            // `maps` was read before this transaction mapped its arenas:
            // without them every new arena would try the places they took.
            let mut now = maps.to_vec();
            now.extend(h.arenas[..slot].iter().map(|a| Mapping {
                start: a.addr,
                end: a.addr + a.size.next_multiple_of(4096),
                read: true,
                write: false,
                exec: true,
                shared: false,
                offset: 0,
                dev: 0,
                inode: 0,
                path: String::new(),
            }));
            h.arenas[slot] = arena::alloc_arena(caller, &now, req.span, arena::reach_of(req), size)?;
            caller.let_run();
            h.arena_count += 1;
            tried_new = true;
        }
        let a = h.arenas[slot];
        let runtime_still_needed = if needs_runtime && a.runtime == 0 { runtime_len } else { 0 };
        let room = a.size.saturating_sub(a.used).saturating_sub(runtime_still_needed);
        if !reachable(&a) || room < arena::DETOUR_BUDGET {
            slot += 1;
            continue;
        }
        // Where the detour would go, after a runtime block the arena may still need.
        let (runtime_at, at) = match (needs_runtime, a.runtime) {
            (true, 0) => (a.addr + a.used, (a.addr + a.used + runtime_len).next_multiple_of(16)),
            (_, r) => (r, a.addr + a.used),
        };
        let runtime = needs_runtime.then(|| runtime_addrs(region, runtime_at));
        let spec = spec_for(region, h, index, req, runtime, parent);
        let detour = Host::build_detour(&req.plan, at, &spec).map_err(refused)?;
        if at + detour.bytes.len() as u64 > a.addr + a.size {
            slot += 1;
            continue;
        }
        let layout = runtime::layout_of(h);
        let a = &mut h.arenas[slot];
        if needs_runtime && a.runtime == 0 {
            let block = Host::build_runtime(runtime_at, &layout, &runtime::blobs());
            mem.write(runtime_at, &block.bytes).context("writing tp's runtime into the target")?;
            a.runtime = runtime_at;
        }
        a.used = (at + detour.bytes.len() as u64).next_multiple_of(16) - a.addr;
        return Ok((at, detour));
    }
}

/// Restores the sites a failed transaction had patched, then takes back
/// the semaphores it had incremented; says to `notes` what it cannot.
struct PatchGuard<'a> {
    mem: &'a Memory,
    region: &'a Region,
    notes: &'a dyn Notes,
    patched: Vec<u32>,
    acquired: Vec<u64>,
}

impl Drop for PatchGuard<'_> {
    fn drop(&mut self) {
        for &i in self.patched.iter().rev() {
            let e = self.region.entry(i);
            if let Err(err) = self.mem.write(e.site, e.original()) {
                if process::has_exited(self.mem.pid(), std::time::Duration::from_millis(200)) {
                    return; // nothing left to restore; the caller reports the exit
                }
                crate::note!(
                    self.notes,
                    "tp: warning: cannot restore `{}` at {:#x}: {err}",
                    crate::escape::text(&e.name()),
                    e.site
                );
                continue;
            }
            let _ = self.region.set_state(i, State::Inactive);
        }
        for &sem in self.acquired.iter().rev() {
            if let Err(err) = semaphore::release(self.mem, sem) {
                crate::note!(self.notes, "tp: warning: cannot take back the semaphore at {sem:#x}: {err:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_probes_call_the_fast_entry() {
        let rt = RuntimeAddrs {
            entry: 1,
            trampoline: 2,
            entry_ext: 3,
            trampoline_ext: 4,
            exit: 7,
            exit_tail: 7,
            exit_runtime: 7,
            unwind: 5,
            rendezvous: 9,
            step: 10,
            trap: 0,
            trap_return: 0,
            count: 6,
            ctx: 8,
        };
        assert_eq!(runtime_for(kind::ARGS | kind::RET, rt), rt);
        assert_eq!(runtime_for(kind::COUNT, rt), rt);
        assert!(fast_entry_for(kind::ARGS | kind::RET));
        for k in [kind::STACK, kind::FILTER, kind::BY] {
            let r = runtime_for(kind::ARGS | k, rt);
            assert_eq!((r.entry, r.trampoline), (3, 2), "{k}");
            assert!(!fast_entry_for(kind::ARGS | k));
        }
        for k in [kind::FILTER_EXIT, kind::AGGREGATE] {
            let r = runtime_for(kind::RET | k, rt);
            assert_eq!((r.entry, r.trampoline), (1, 4), "{k}");
            assert!(!fast_entry_for(kind::RET | k));
            assert!(fast_entry_for(kind::RET | kind::AT_EXITS | k));
            assert!(!fast_entry_for(kind::RET | kind::AT_EXITS | kind::FILTER | k));
        }
    }
}
