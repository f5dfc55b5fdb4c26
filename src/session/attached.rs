//! One attach: resolve and plan the probes, install them (the target is
//! stopped for the commit only), and later remove them and, when nothing
//! uses it any more, unmap tp's memory from the target.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::follow::Follow;
use super::{Options, Records, Selection, StackMode, kept, rendezvous, resolve, unwind};
use crate::escape as text;
use crate::events::clock::Clock;
use crate::events::drain::{Drainer, Lost};
use crate::events::predicate;
use crate::events::values::ProbeInfo;
use crate::notes::Notes;
use crate::output::{ProbeStat, Summary};
use crate::probe::Request;
use crate::probe::family::{self, Own, Relative};
use crate::probe::install::{self, Installed, Report};
use crate::probe::layout::{self, State, kind};
use crate::probe::region::{self, Region};
use crate::probe::remove::Kept;
use crate::probe::shadow;
use crate::process::Mapping;
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::symbols::Found;
use crate::symbols::ProcessModules;
use crate::symbols::block_map::BlockMap;

/// A live attach session: probes installed, the target running.
pub struct Attached {
    /// The target.
    pub pid: i32,
    mem: Memory,
    /// The target's data region.
    pub region: Region,
    probes: Vec<Installed>,
    owner: u32,
    /// What the probes record (bits of `probe::layout::kind`).
    kind: u32,
    /// What was asked: predicates, counts by value, stacks of new probes.
    selection: Selection,
    install_opts: install::Options,
    /// The event clock, started with the attach.
    pub clock: Clock,
    /// What tp knows of each probe, for its events (same order as the probes).
    pub infos: Vec<ProbeInfo>,
    /// From the start of the attach until the probes were live.
    pub attach_time: Duration,
    /// How long all of the target's threads were stopped.
    pub stop_time: Duration,
    /// How long some thread was stopped, in all: the worker for the remote
    /// syscalls, every thread for the patch.
    pub worker_time: Duration,
    /// Threads that had to be moved out of a patch window.
    pub moved_threads: usize,
    /// Functions matched by a glob but refused.
    pub refused: usize,
    /// Events lost before this session's probes went live ([`Drainer::lost_parts`]).
    pub lost_at_start: Lost,
    /// Each probe of this session that went over a kept one, with the kept
    /// one's entry ([`super::kept`]).
    over: Vec<(u32, u32)>,
    /// The functions whose blocks are counted (`--blocks`).
    blocks: Vec<BlockMap>,
    /// The probes (by position) whose library the process unloaded, with
    /// their counts then (the calls, those that passed their predicates).
    unloaded: HashMap<usize, (u64, u64)>,
    /// The counts of probes (by position) from the loads of their library
    /// before the current one: a library loaded again at the same address
    /// takes the same entry (counting from 0 again) and the same position.
    earlier: HashMap<usize, (u64, u64)>,
    /// Where what the session's installs and its detach say goes.
    notes: Arc<dyn Notes>,
}

/// How a detach went.
pub struct Detached {
    /// Final counts.
    pub summary: Summary,
    /// How long the target was stopped for the detach (zero if it had exited).
    pub stop_time: Duration,
    /// True if the target had exited (or exec'd) before the detach.
    pub target_gone: bool,
    /// True if it had exec'd: it runs another program, without the probes.
    pub execd: bool,
    /// Why tp's memory stayed in the target, if it did.
    pub kept: Option<Kept>,
    /// The processes it forked while the probes were in, and what the
    /// detach did in each.
    pub family: Vec<Relative>,
}

impl Attached {
    /// Resolves the selection of `opts` in the modules of its process and
    /// installs probes owned by this tp (by none when `opts.keep`).
    pub fn attach(opts: &Options) -> Result<Attached> {
        let (pid, owner) = (opts.pid, opts.owner());
        let what = &opts.selection;
        let run = || {
            let started = Instant::now();
            process::check_attachable(pid)?;
            let maps = process::read_maps(pid).with_context(|| format!("cannot read the memory map of {pid}"))?;
            let modules = ProcessModules::new(pid, &maps)?;
            let shadow = shadow::thread_with(pid, &[]);
            if what.records.ret {
                // The unwinder's modules are read while the user's functions are planned.
                modules.prefetch(&unwind::places(&modules));
            }
            let resolved =
                resolve::requests(&*opts.notes, &modules, &what.funcs, &what.addrs, what.records.bits(), shadow)?;
            Self::install_new(pid, what, owner, &maps, &modules, resolved, None, started, &opts.notes)
        };
        run().map_err(|e| exited_or(pid, e))
    }

    /// Installs probes on `found` (functions the caller resolved in
    /// `modules`, the process's modules now) in process `opts.pid`.
    /// `stopped` is the process's main thread if this tp holds it already
    /// (a program `tp run` started, stopped at its entry point): it becomes
    /// the worker, and the process is not seized again.
    pub fn attach_found(
        opts: &Options,
        modules: &ProcessModules,
        found: Vec<Found>,
        stopped: Option<Stopped>,
    ) -> Result<Attached> {
        Self::attach_found_with(opts, modules, found, Vec::new(), stopped)
    }

    /// Probes in process `opts.pid` (whose modules are `modules`) what the
    /// patterns of `opts` match now, leniently: those that match nothing
    /// yet wait for a library ([`Follow::start`]). Given `rendezvous_every`
    /// (how often the session looks where it has none), tp's probe at the
    /// dynamic linker's rendezvous goes in beside them while some wait.
    /// `stopped` is the process if this tp holds it; it is let go when
    /// nothing goes in. Returns the probes (None if none went in), the
    /// patterns that follow the process's libraries, and the lines saying
    /// what the waiting ones wait for.
    pub fn attach_following(
        opts: &Options,
        modules: &ProcessModules,
        stopped: Option<Stopped>,
        rendezvous_every: Option<Duration>,
    ) -> Result<(Option<Attached>, Follow, Vec<String>)> {
        let pid = opts.pid;
        let (follow, start) = Follow::start(&*opts.notes, pid, modules, &opts.selection.funcs)?;
        let own = match rendezvous_every {
            Some(every) => rendezvous::own_probes(&*opts.notes, pid, modules, &follow, &start.found, every),
            None => Vec::new(),
        };
        let attached = match start.found.is_empty() && own.is_empty() {
            true => {
                stopped.map(Stopped::resume);
                None
            }
            false => Some(Self::attach_found_with(opts, modules, start.found, own, stopped)?),
        };
        Ok((attached, follow, start.waiting))
    }

    /// [`Attached::attach_found`], with tp's own probes `own` (the
    /// rendezvous with the dynamic linker) installed beside them.
    pub fn attach_found_with(
        opts: &Options,
        modules: &ProcessModules,
        found: Vec<Found>,
        own: Vec<Request>,
        stopped: Option<Stopped>,
    ) -> Result<Attached> {
        let (pid, owner) = (opts.pid, opts.owner());
        // A held program is killed on any error (`Stopped::adopt`): its
        // death is then tp's doing, not the reason.
        let adopted = stopped.is_some();
        let run = || {
            let started = Instant::now();
            if stopped.is_none() {
                process::check_attachable(pid)?;
            }
            let maps = process::read_maps(pid).with_context(|| format!("cannot read the memory map of {pid}"))?;
            let held: Vec<_> = stopped.iter().map(Stopped::worker).collect();
            let shadow = shadow::thread_with(pid, &held);
            let mut resolved = match found.is_empty() && !own.is_empty() {
                // Only tp's own probes, until a library defines what the patterns name.
                true => resolve::Resolved {
                    requests: Vec::new(),
                    refused: Vec::new(),
                    notes: Vec::new(),
                    blocks: Vec::new(),
                },
                false => resolve::plan_found(&*opts.notes, modules, found, opts.selection.records.bits(), shadow)?,
            };
            resolved.requests.extend(own);
            Self::install_new(pid, &opts.selection, owner, &maps, modules, resolved, stopped, started, &opts.notes)
        };
        run().map_err(|e| if adopted { e } else { exited_or(pid, e) })
    }

    #[allow(clippy::too_many_arguments)]
    fn install_new(
        pid: i32,
        what: &Selection,
        owner: u32,
        maps: &[Mapping],
        modules: &ProcessModules,
        resolved: resolve::Resolved,
        stopped: Option<Stopped>,
        started: Instant,
        notes: &Arc<dyn Notes>,
    ) -> Result<Attached> {
        // A session that aggregates latency in the target converts it
        // there with this clock's rate: calibrated first where the CPU
        // does not say it.
        let latency = super::aggregates_latency(what.agg.as_deref());
        let clock = if latency { Clock::calibrated() } else { Clock::start() };
        let existing = region::find(maps).map(|m| Region::open(pid, m)).transpose()?;
        let existing = match existing {
            Some(r) if stopped.is_none() && is_leftover(&r) => reclaim(notes, pid, r)?,
            other => other,
        };
        if what.records != Records::COUNT
            && let Some(r) = &existing
            && let Some((_, e)) = r.entries().into_iter().find(|(_, e)| {
                e.state().maybe_patched() && e.kind & (kind::ARGS | kind::RET) != 0 && kept::session_is_running(e.owner)
            })
        {
            bail!(
                "tp session {} is already recording events in process {pid} (sessions share the rings); \
                 end it first",
                e.owner
            );
        }
        let refused = resolved.refused.len();
        let vetted = kept::vet(pid, existing.as_ref(), resolved.requests, owner == 0)?;
        for note in &vetted.notes {
            crate::note!(notes, "{note}");
        }
        let mem = Memory::open(pid)?;
        if vetted.requests.is_empty()
            && let Some(region) = existing
        {
            // `--keep` of functions kept already: nothing to do.
            return Ok(Attached::nothing_new(pid, mem, region, what, owner, started, refused, notes));
        }
        let blocks = resolved.blocks.clone();
        let resolved = resolve::Resolved { requests: vetted.requests, ..resolved };
        let (requests, infos) = batch(&**notes, modules, resolved, what, existing.as_ref())?;
        let take_over = !vetted.over.is_empty();
        let ns_mult = if latency { layout::ns_mult(clock.ns_per_tick()) } else { 0 };
        let opts =
            install::Options { owner, ring_len: what.ring_len, sample_budget: what.sample_budget, take_over, ns_mult };
        let discard = what.records != Records::COUNT;
        // Where the loader keeps its state, for tp's rendezvous probe: read
        // before the probe goes live, so that no call of it misses it.
        let loader_state = requests
            .iter()
            .find(|r| r.kind & kind::RENDEZVOUS != 0)
            .and_then(|r| rendezvous::state_word(pid, modules, r.function.addr.0));
        let waits = Waits { loader_state, step_calls: what.step_calls, trap_steps: what.trap_steps };
        let done = install(notes, pid, &mem, stopped, existing, requests, opts, discard, waits)?;
        let infos = without_unpatched(&**notes, infos, &done.report);
        let refused = refused + done.report.unpatched.len();
        let over = over_pairs(&done.report.installed, &vetted.over);
        // The probes are live: what tp learnt of the binaries is saved meanwhile.
        crate::symbols::saving::start();
        Ok(Attached {
            pid,
            mem,
            region: done.region,
            probes: done.report.installed,
            owner,
            kind: what.records.bits(),
            selection: what.clone(),
            install_opts: opts,
            clock,
            infos,
            attach_time: started.elapsed(),
            stop_time: done.stop_time,
            worker_time: done.worker_time,
            moved_threads: done.report.moved_threads,
            refused,
            lost_at_start: done.lost_at_start,
            over,
            blocks,
            unloaded: HashMap::new(),
            earlier: HashMap::new(),
            notes: notes.clone(),
        })
    }

    /// An attach that installs nothing (`--keep` of functions kept already).
    #[allow(clippy::too_many_arguments)]
    fn nothing_new(
        pid: i32,
        mem: Memory,
        region: Region,
        what: &Selection,
        owner: u32,
        started: Instant,
        refused: usize,
        notes: &Arc<dyn Notes>,
    ) -> Attached {
        Attached {
            pid,
            mem,
            region,
            probes: Vec::new(),
            owner,
            kind: what.records.bits(),
            selection: what.clone(),
            install_opts: install::Options {
                owner,
                ring_len: what.ring_len,
                sample_budget: 0,
                take_over: false,
                ns_mult: 0,
            },
            clock: Clock::start(),
            infos: Vec::new(),
            attach_time: started.elapsed(),
            stop_time: Duration::ZERO,
            worker_time: Duration::ZERO,
            moved_threads: 0,
            refused,
            lost_at_start: Lost::default(),
            over: Vec::new(),
            blocks: Vec::new(),
            unloaded: HashMap::new(),
            earlier: HashMap::new(),
            notes: notes.clone(),
        }
    }

    /// Installs probes on more functions of this session's process, `found`
    /// in `modules` (the process's modules now: a library it loaded since,
    /// say), with the same owner and records, in the same data region.
    /// Returns how many of the user's probes were added and how many of the
    /// functions found cannot be probed (skipped).
    pub fn extend(&mut self, modules: &ProcessModules, found: Vec<Found>) -> Result<(usize, usize)> {
        let pid = self.pid;
        let run = || {
            let maps = process::read_maps(pid).with_context(|| format!("cannot read the memory map of {pid}"))?;
            let shadow = shadow::thread_with(pid, &[]);
            let resolved = resolve::plan_found(&*self.notes, modules, found, self.kind, shadow)?;
            let refused = resolved.refused.len();
            let Some(mapping) = region::find(&maps).filter(|m| m.inode == self.region.inode()) else {
                bail!("tp's data region is no longer mapped in process {pid}");
            };
            let existing = Region::open(pid, mapping)?;
            let vetted = kept::vet(pid, Some(&existing), resolved.requests, self.owner == 0)?;
            for note in &vetted.notes {
                crate::note!(self.notes, "{note}");
            }
            let blocks = resolved.blocks.clone();
            let resolved = resolve::Resolved { requests: vetted.requests, ..resolved };
            let (requests, infos) = batch(&*self.notes, modules, resolved, &self.selection, Some(&existing))?;
            let opts = install::Options { take_over: !vetted.over.is_empty(), ..self.install_opts };
            let done =
                install(&self.notes, pid, &self.mem, None, Some(existing), requests, opts, false, Waits::default())?;
            let infos = without_unpatched(&*self.notes, infos, &done.report);
            let refused = refused + done.report.unpatched.len();
            crate::symbols::saving::start();
            let over = over_pairs(&done.report.installed, &vetted.over);
            Ok((done, infos, refused, over, blocks))
        };
        let (done, infos, refused, over, blocks) = run().map_err(|e| exited_or(pid, e))?;
        self.over.extend(over);
        self.blocks.extend(blocks);
        let added = done.report.installed.iter().filter(|p| p.request.kind & kind::OWN_ENTRY == 0).count();
        // Infos follow the probes: tp's own unwinder probes may now sit
        // between the user's, so keep both in install order.
        self.region = done.region;
        for (p, info) in done.report.installed.into_iter().zip(infos) {
            // The same function of a library loaded again, in the entry it had.
            let again = self.probes.iter().position(|q| {
                q.index == p.index
                    && q.request.function.name == p.request.function.name
                    && q.request.function.module == p.request.function.module
            });
            match again.filter(|pos| self.unloaded.contains_key(pos)) {
                Some(pos) => {
                    let counts = self.unloaded.remove(&pos).unwrap_or_default();
                    self.earlier.insert(pos, counts);
                    self.probes[pos] = p;
                }
                None => {
                    self.probes.push(p);
                    self.infos.push(info);
                }
            }
        }
        self.stop_time += done.stop_time;
        Ok((added, refused))
    }

    /// The blocks and lines of the functions whose blocks this session
    /// counts (`--blocks`), with the counts of `summary` (this process's).
    pub fn blocks(&self, summary: &Summary) -> Vec<crate::output::blocks::FunctionBlocks> {
        super::block_counts::report(&self.blocks, summary)
    }

    /// True if tp's probe at the dynamic linker's rendezvous is among this
    /// session's ([`super::rendezvous`]).
    pub fn has_rendezvous(&self) -> bool {
        self.rendezvous_function().is_some()
    }

    /// The address of the function tp's rendezvous probe is on, if it is in.
    fn rendezvous_function(&self) -> Option<u64> {
        self.probes.iter().find(|p| p.request.kind & kind::RENDEZVOUS != 0).map(|p| p.request.function.addr.0)
    }

    /// Lets go of the probes whose code the process no longer maps (it
    /// unloaded their library: `maps` is its memory map now): their counts
    /// are kept, and their entries become Inactive, since nothing is left
    /// to restore at their sites (a library loaded there later holds its
    /// file's bytes). The same library loaded at the same address takes
    /// them again with their detours (`install`'s reuse), so loading and
    /// unloading it over and over does not grow tp's memory. Returns how
    /// many of the user's probes went.
    pub fn drop_unloaded(&mut self, maps: &[Mapping]) -> Result<usize> {
        let mapped = |addr: u64| maps.iter().any(|m| m.exec && m.start <= addr && addr < m.end);
        let mut gone = 0;
        for (pos, p) in self.probes.iter().enumerate() {
            if self.unloaded.contains_key(&pos) || mapped(p.request.plan.site) {
                continue;
            }
            let (before, passed_before) = self.earlier.remove(&pos).unwrap_or_default();
            let hits = self.region.hits_of(&[p.index])[0];
            let (passed, _) = filtered(&self.region, p.index, p.request.kind, hits);
            let (hits, passed) = (hits + before, passed + passed_before);
            for &i in std::iter::once(&p.index).chain(&p.exits) {
                if self.region.state(i).maybe_patched() {
                    self.region.set_state(i, State::Inactive)?;
                }
            }
            self.unloaded.insert(pos, (hits, passed));
            gone += usize::from(p.request.kind & kind::OWN_ENTRY == 0);
        }
        Ok(gone)
    }

    /// The user's probes with their positions among all probes.
    fn user_probes_at(&self) -> impl Iterator<Item = (usize, &Installed)> {
        self.probes.iter().enumerate().filter(|(_, p)| p.request.kind & kind::OWN_ENTRY == 0)
    }

    /// Probe `pos`'s calls, and those that passed its predicates: as kept
    /// when its library was unloaded, else from the region.
    fn calls_of(&self, pos: usize, p: &Installed, hits: u64) -> (u64, Option<u64>) {
        let (all, passed) = match self.unloaded.get(&pos) {
            Some(&counts) => counts,
            None => {
                let (before, passed_before) = self.earlier.get(&pos).copied().unwrap_or_default();
                let (passed, _) = filtered(&self.region, p.index, p.request.kind, hits);
                (hits + before, passed + passed_before)
            }
        };
        match p.request.kind & (kind::FILTER | kind::FILTER_EXIT) {
            0 => (all, None),
            _ => (passed, Some(all)),
        }
    }

    /// How many of this session's probes went over kept ones, which count
    /// on when it ends ([`super::kept`]).
    pub fn went_over(&self) -> usize {
        self.over.len()
    }

    /// The probes the user asked for (not tp's own unwinder probes).
    fn user_probes(&self) -> impl Iterator<Item = &Installed> {
        self.probes.iter().filter(|p| p.request.kind & kind::OWN_ENTRY == 0)
    }

    /// What the probes record (bits of `probe::layout::kind`).
    pub fn records(&self) -> u32 {
        self.kind
    }

    /// The probes installed, tp's own among them.
    pub fn installed(&self) -> &[Installed] {
        &self.probes
    }

    /// The position in [`Attached::infos`] of each of the user's probes, in
    /// summary order.
    pub fn user_positions(&self) -> Vec<usize> {
        self.probes.iter().enumerate().filter(|(_, p)| p.request.kind & kind::OWN_ENTRY == 0).map(|(i, _)| i).collect()
    }

    /// The probed functions' names, in request order.
    pub fn names(&self) -> Vec<String> {
        self.user_probes().map(|p| p.request.function.name.clone()).collect()
    }

    /// Current hit counts, in request order (of a library unloaded, as
    /// they were then).
    pub fn hits(&self) -> Vec<u64> {
        let idx: Vec<u32> = self.user_probes().map(|p| p.index).collect();
        let live = self.region.hits_of(&idx);
        self.user_probes_at()
            .zip(live)
            .map(|((pos, p), h)| {
                let (passed, all) = self.calls_of(pos, p, h);
                all.unwrap_or(passed)
            })
            .collect()
    }

    /// The module of each of the user's probes, in request order.
    pub fn modules_of_probes(&self) -> Vec<String> {
        self.user_probes().map(|p| p.request.function.module.clone()).collect()
    }

    /// The entry indexes of the user's probes, in request order.
    pub fn indexes(&self) -> Vec<u32> {
        self.user_probes().map(|p| p.index).collect()
    }

    /// The entry index of every probe, tp's own included, in [`Attached::infos`] order.
    pub fn all_indexes(&self) -> Vec<u32> {
        self.probes.iter().map(|p| p.index).collect()
    }

    /// The runtime address of probe `i`'s function (in [`Attached::infos`] order).
    pub fn function_addr(&self, i: usize) -> u64 {
        self.probes.get(i).map_or(0, |p| p.request.function.addr.0)
    }

    /// The configuration of probe `i` (in [`Attached::infos`] order).
    pub fn probe_config(&self, i: usize) -> crate::probe::layout::ProbeConfig {
        self.probes.get(i).map_or_else(Default::default, |p| *p.request.config)
    }

    /// What was asked: predicates, counts by value, stacks.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// What probe `i` (in [`Attached::infos`] order) records.
    pub fn probe_kind(&self, i: usize) -> u32 {
        self.probes.get(i).map_or(0, |p| p.request.kind)
    }

    /// Entry index → position in [`Attached::infos`], for the probes with events.
    pub fn event_probes(&self) -> Vec<(u32, usize)> {
        self.probes.iter().enumerate().map(|(i, p)| (p.index, i)).collect()
    }

    /// True while all of this session's probes are still installed (another
    /// `tp detach` may have removed them).
    pub fn still_installed(&self) -> bool {
        self.user_probes_at()
            .filter(|(pos, _)| !self.unloaded.contains_key(pos))
            .all(|(_, p)| self.region.state(p.index) == State::Active)
    }

    /// Reads a NUL-terminated string from the target (for `char *` arguments).
    pub fn read_string(&self, addr: u64, max: usize) -> Option<String> {
        let bytes = self.mem.read_partial(addr, max);
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let s = String::from_utf8_lossy(&bytes[..end]).into_owned();
        (!bytes.is_empty()).then_some(s)
    }

    /// The counts now, read from tp's own mapping of the data region (so
    /// they stay readable after the process exited or exec'd): with
    /// `--if`, the calls that passed, and every call beside them.
    pub fn summary(&self) -> Summary {
        let hits = self.hits();
        Summary {
            pid: self.pid,
            probes: self
                .user_probes_at()
                .zip(hits)
                .map(|((pos, p), hits)| {
                    let f = &p.request.function;
                    // A probe inside a function is at its site.
                    let address = if p.request.plan.interior { p.request.plan.site } else { f.addr.0 };
                    ProbeStat::new(f.name.clone(), f.module.clone(), address, self.calls_of(pos, p, hits))
                        .switched(self.region.enabled(p.index))
                })
                .collect(),
        }
    }

    /// The calls counted so far, in request order: with `--if`, those that passed.
    pub fn counted(&self) -> Vec<u64> {
        let hits = self.hits();
        self.user_probes_at().zip(hits).map(|((pos, p), hits)| self.calls_of(pos, p, hits).0).collect()
    }

    /// Removes this session's probes, from its process and from every
    /// process it forked while they were in ([`family::restore_family`];
    /// each is stopped for it), and, where nothing else uses them, unmaps
    /// tp's memory. tp's own unwinder probes go with the last return probe.
    pub fn detach(&self) -> Result<Detached> {
        // A thread waiting at the rendezvous goes on before the probes go.
        if self.has_rendezvous() {
            let _ = crate::probe::rendezvous_wait::disarm(&self.region);
        }
        // A set: the select below runs for every entry with the target stopped.
        let mine: std::collections::HashSet<u32> =
            self.probes.iter().flat_map(|p| std::iter::once(p.index).chain(p.exits.clone())).collect();
        let owner = self.owner;
        // The unwinder probes serve every return probe that replaces return
        // addresses: they stay while another session's (or kept ones) remain.
        let keep_unwinders = self.region.entries().iter().any(|(i, e)| {
            e.state().maybe_patched() && replaces_returns(e.kind) && !(mine.contains(i) && e.owner == owner)
        });
        let select = |i: u32, e: &crate::probe::layout::Entry| {
            if e.kind & kind::UNWIND != 0 {
                return !keep_unwinders;
            }
            mine.contains(&i) && e.owner == owner
        };
        let (own, family) = family::restore_family(&self.notes, self.pid, &self.mem, &self.region, &select)?;
        let summary = self.summary();
        // The kept probes this session went over count on with its calls.
        kept::give_back_counts(&self.region, &self.over, |i| self.region.hits_of(&[i])[0]);
        Ok(match own {
            Own::Restored { kept, stop_time } => {
                Detached { summary, stop_time, target_gone: false, execd: false, kept, family }
            }
            Own::Exited => {
                Detached { summary, stop_time: Duration::ZERO, target_gone: true, execd: false, kept: None, family }
            }
            Own::Execd => {
                Detached { summary, stop_time: Duration::ZERO, target_gone: true, execd: true, kept: None, family }
            }
        })
    }
}

/// The requests of one install, tp's unwinder probes added when returns
/// are recorded, and what tp knows of each for its events. Each request
/// gets its configuration: the predicate compiled for its function (a
/// false one costs the target no event), the argument it is counted by,
/// the stack it records. What the plans noted is said to `notes`.
fn batch(
    notes: &dyn Notes,
    modules: &ProcessModules,
    resolved: resolve::Resolved,
    what: &Selection,
    existing: Option<&Region>,
) -> Result<(Vec<Request>, Vec<ProbeInfo>)> {
    let noted = resolved.notes;
    let mut requests = resolved.requests;
    if requests.iter().any(|r| replaces_returns(r.kind)) {
        requests.extend(unwind::unwinder_requests(modules, existing)?);
    }
    let predicate = what
        .predicate
        .as_deref()
        .map(|text| predicate::parse(text).map_err(|why| anyhow::anyhow!("--if `{}`: {why}", text::text(text))))
        .transpose()?;
    let picks = what
        .picks
        .as_deref()
        .map(|text| predicate::parse_picks(text).map_err(|why| anyhow::anyhow!("--args `{}`: {why}", text::text(text))))
        .transpose()?;
    let agg = what
        .agg
        .as_deref()
        .map(|text| predicate::parse_agg(text).map_err(|why| anyhow::anyhow!("--agg `{}`: {why}", text::text(text))))
        .transpose()?;
    // The fields they name, looked up once per function.
    let mut chains = Vec::new();
    if let Some(e) = &predicate {
        predicate::fields_of(e, &mut chains);
    }
    if let Some(p) = &picks {
        predicate::fields_of_picks(p, &mut chains);
    }
    if let Some(a) = &agg {
        predicate::fields_of_agg(a, &mut chains);
    }
    let mut infos = Vec::with_capacity(requests.len());
    for r in &mut requests {
        // Inside a function, and at a static probe, DWARF's parameters are
        // not where the entry has them (a static probe records its own).
        let wants_dwarf = (r.kind & (kind::ARGS | kind::RET) != 0
            || (r.kind & kind::OWN_ENTRY == 0
                && (what.predicate.is_some() || what.by.is_some() || what.agg.is_some())))
            && !r.plan.interior
            && r.operands.is_none();
        let dwarf = wants_dwarf
            .then(|| {
                let m = modules.get(modules_index(modules, &r.function.module)?).ok()?;
                m.dwarf_at(r.function.bias.file(r.function.addr))
            })
            .flatten();
        // Call lines add their own parentheses: `f(x=1)`, not `f(long)(x=1)`.
        let name = crate::symbols::demangle::strip_arguments(&r.function.name);
        let module = modules_index(modules, &r.function.module).and_then(|i| modules.get(i).ok());
        let fields = match (&dwarf, module) {
            (Some(_), Some(m)) if r.kind & kind::OWN_ENTRY == 0 => chains
                .iter()
                .map(|(p, steps)| {
                    let key = predicate::Operand::field_key(p, steps);
                    let path = m.field_path(r.function.bias.file(r.function.addr), p, steps, layout::FETCH_DEPTH);
                    (key, path.map_err(|why| text::text(&why).into_owned()))
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut info = ProbeInfo {
            name,
            module: r.function.module.clone(),
            dwarf,
            operands: r.operands,
            picks: Vec::new(),
            fields,
        };
        if r.plan.interior && r.operands.is_none() && picks.is_some() {
            bail!(
                "cannot probe `{}`: --args EXPR shows arguments, which a probe inside a function does not have (a \
                 static probe's are arg0..arg5)",
                text::text(&r.function.name)
            );
        }
        if let Some(p) = picks.as_ref().filter(|_| r.kind & kind::OWN_ENTRY == 0) {
            let (prog, shown) = predicate::fetch_program(p, &info).map_err(|why| {
                anyhow::anyhow!(
                    "--args `{}` in `{}`: {why}",
                    text::text(what.picks.as_deref().unwrap_or("")),
                    text::text(&info.name)
                )
            })?;
            info.picks = shown;
            if !prog.is_empty() {
                if r.kind & kind::STACK != 0 {
                    bail!("--args with fields and --stack each send words after the entry: use one of them");
                }
                r.kind |= kind::FIELDS;
                r.config.fetch[..prog.len()].copy_from_slice(&prog);
            }
        }
        if r.plan.interior && r.operands.is_none() && what.predicate.is_some() {
            bail!(
                "cannot probe `{}`: --if tests the arguments, which a probe inside a function does not have (a \
                 static probe's are arg0..arg5)",
                text::text(&r.function.name)
            );
        }
        let keys = what.by.as_deref().and_then(|b| predicate::parse_keys(b).ok()).unwrap_or_default();
        if let Some(key) = keys.iter().find(|k| r.plan.interior && k.at_entry_only()) {
            bail!(
                "cannot probe `{}`: --by {} keys by the return address, which is where a call leaves it at a \
                 function's entry only (a static probe is inside its function): key by tid, pid or an argument",
                text::text(&r.function.name),
                if *key == predicate::Key::Caller { "caller" } else { "stack" }
            );
        }
        if r.abi == crate::arch::Abi::Go && keys.iter().any(|k| matches!(k, predicate::Key::Stack(_))) {
            bail!(
                "cannot probe `{}`: --by stack walks frames on the thread's stack, and a goroutine's is not one \
                 tp knows the bounds of: key by caller, tid or pid",
                text::text(&r.function.name)
            );
        }
        if r.kind & kind::OWN_ENTRY == 0 {
            configure(r, &info, what, predicate.as_ref(), agg.as_ref())?;
        }
        // Entries record the registers after the sixth only where the ABI
        // has them and the function may take an argument there.
        if r.kind & kind::ARGS != 0 && crate::events::values::registers_needed(&info) > layout::ENTRY_REGS {
            r.kind |= kind::ARGS_MORE;
        }
        infos.push(info);
    }
    for note in noted {
        crate::note!(notes, "{note}");
    }
    Ok((requests, infos))
}

/// Sets `r`'s configuration and the kind bits that go with it.
fn configure(
    r: &mut Request,
    info: &ProbeInfo,
    what: &Selection,
    predicate: Option<&predicate::Expr>,
    agg: Option<&predicate::Agg>,
) -> Result<()> {
    let function = text::text(&info.name);
    if let Some(e) = predicate {
        let c = predicate::compile(e, info, r.kind & kind::RET != 0).map_err(|why| {
            anyhow::anyhow!("--if `{}` in `{function}`: {why}", text::text(what.predicate.as_deref().unwrap_or("")))
        })?;
        if !c.entry.is_empty() {
            r.kind |= kind::FILTER;
            r.config.entry[..c.entry.len()].copy_from_slice(&c.entry);
        }
        if !c.exit.is_empty() {
            r.kind |= kind::FILTER_EXIT;
            r.config.exit[..c.exit.len()].copy_from_slice(&c.exit);
        }
    }
    let keys = match &what.by {
        Some(text) => {
            predicate::parse_keys(text).map_err(|why| anyhow::anyhow!("--by `{}`: {why}", text::text(text)))?
        }
        None => Vec::new(),
    };
    let value = keys.iter().find_map(|k| match k {
        predicate::Key::Value(v) => Some(v),
        _ => None,
    });
    let caller = keys.contains(&predicate::Key::Caller);
    let stack = keys.iter().find_map(|k| match k {
        predicate::Key::Stack(depth) => Some(*depth),
        _ => None,
    });
    if what.by.is_some() || agg.is_some() {
        r.config.by = match (value, stack) {
            (Some(arg), _) => predicate::by_word(arg, info)
                .map_err(|why| anyhow::anyhow!("--by `{}` in `{function}`: {why}", text::text(arg)))?,
            (None, Some(depth)) => layout::by_word::STACK | depth << layout::by_word::EXT_SHIFT,
            (None, None) if caller => layout::by_word::CALLER,
            (None, None) => layout::by_word::NO_VALUE,
        };
        // Calls counted by an argument alone, or by it and the thread or
        // process (each thread's table is its own), go to the table of
        // counts; an aggregate of a value, or a count by the caller, the
        // stack, the thread or process alone, to the table of aggregates
        // (whose keys are 64 bits wide, as a return address or a stack's
        // hash is).
        if agg.is_some() || value.is_none() {
            r.config.by |= layout::by_word::AGG;
        }
        // For `tp status`, which has only the region to name the rows by:
        // the keys and the aggregate in their short forms.
        r.config.by_text = layout::text_words(&predicate::keys_text(&keys));
        let agg_text = agg.map(|a| a.names().stored(8 * layout::AGG_TEXT_WORDS)).unwrap_or_default();
        r.config.agg_text = layout::text_words(&agg_text);
    }
    if let Some(a) = agg.filter(|a| predicate::agg_at_exit(a)) {
        let text = text::text(what.agg.as_deref().unwrap_or(""));
        let latency = predicate::agg_latency(a);
        if r.kind & kind::AGGREGATE == 0 {
            match latency {
                true => bail!(
                    "--agg `{text}` keeps durations in the target, at the exits it times there: drop --args, \
                     --stack and the trace file, and unset TP_AGGREGATE"
                ),
                false => bail!(
                    "--agg `{text}` keeps return values in the target, at the exits it times there: add --ret and \
                     -q (without --args, --stack or a trace file)"
                ),
            }
        }
        if let Some(v) = value {
            // The argument is gone at the exit: the call's shadow frame
            // carries its low 32 bits from the entry.
            let ext = (r.config.by >> layout::by_word::EXT_SHIFT) as u64 & 0xff;
            if !matches!(
                ext,
                layout::filter_ext::I8
                    | layout::filter_ext::U8
                    | layout::filter_ext::I16
                    | layout::filter_ext::U16
                    | layout::filter_ext::I32
                    | layout::filter_ext::U32
            ) {
                bail!(
                    "--agg `{text}` in `{function}`: `{}` is not an integer of at most 32 bits, which is what a \
                     call carries from its entry to its exit: key it by such an argument, tid or pid",
                    text::text(v)
                );
            }
            if r.abi == crate::arch::Abi::Go {
                bail!(
                    "--agg `{text}` in `{function}`: a Go call carries no key from its entry to its exit: key it \
                     by tid or pid"
                );
            }
            r.config.by |= layout::by_word::KEY_IN_FRAME;
        }
        if caller && r.abi == crate::arch::Abi::Go {
            bail!(
                "--agg `{text}` in `{function}`: a Go call carries no caller from its entry to its exit: key it by \
                 tid or pid"
            );
        }
        r.config.by |= layout::by_word::AT_EXIT | if latency { layout::by_word::LATENCY } else { 0 };
        if value.is_none() {
            // Nothing to do at entry: the probe keeps the plain (and on
            // x86-64 the detour's fast) entry; its exit still adds the
            // value (`install::config_for` gives the exit the flag).
            r.kind &= !kind::BY;
        }
    }
    if let Some(a) = agg {
        r.config.agg = predicate::agg_program(a, info).map_err(|why| {
            anyhow::anyhow!("--agg `{}` in `{function}`: {why}", text::text(what.agg.as_deref().unwrap_or("")))
        })?;
    }
    match what.stack {
        Some(StackMode::FramePointers { depth }) => r.config.stack_depth = depth,
        Some(StackMode::Unwind { bytes, .. }) => r.config.stack_copy = bytes,
        None => {}
    }
    Ok(())
}

/// What one install transaction left.
struct Done {
    region: Region,
    report: Report,
    stop_time: Duration,
    worker_time: Duration,
    lost_at_start: Lost,
}

/// Seizes the worker (unless `stopped` holds it already), prepares, stops
/// the world, commits and lets go. With `discard`, events an earlier session
/// left unread in the rings are dropped while the threads are stopped.
/// Arms the rendezvous if tp's probe on it is among `requests`, with the
/// address of the loader's state if tp found it (`loader_state`).
#[allow(clippy::too_many_arguments)]
/// What tp's hand-overs wait for from the first call of the probes a
/// first install puts in: the loader's state word for the rendezvous, the
/// calls to step.
#[derive(Debug, Clone, Copy, Default)]
struct Waits {
    loader_state: Option<u64>,
    step_calls: u32,
    trap_steps: Option<u64>,
}

#[allow(clippy::too_many_arguments)]
fn install(
    notes: &Arc<dyn Notes>,
    pid: i32,
    mem: &Memory,
    stopped: Option<Stopped>,
    existing: Option<Region>,
    requests: Vec<Request>,
    opts: install::Options,
    discard: bool,
    waits: Waits,
) -> Result<Done> {
    let mut stopped = match stopped {
        Some(s) => s,
        None => Stopped::seize_worker(pid, notes.clone())?,
    };
    let rendezvous = requests.iter().any(|r| r.kind & kind::RENDEZVOUS != 0);
    let trap_steps = waits.trap_steps.filter(|_| waits.step_calls > 0);
    if let Some(why) = trap_steps.and_then(|_| crate::probe::trap::refusal(pid, existing.as_ref())) {
        bail!(why);
    }
    let prepared = install::prepare(&mut stopped, mem, existing, requests, opts)?;
    // The in-target stepping engine's handler and trace area, before any
    // call is armed to use them.
    if waits.step_calls > 0 && trap_steps.is_none() {
        crate::probe::trap::forget(&prepared.region)?;
    }
    if let Some(limit) = trap_steps {
        let maps = process::read_maps(pid)?;
        let mut caller = crate::process::remote::RemoteCaller::new(&mut stopped, mem, &maps)?;
        let handler = crate::probe::trap::handler(&prepared.region);
        crate::probe::trap::install(&mut caller, mem, &prepared.region, handler, limit)?;
    }
    // Threads wait at the rendezvous, and calls to step, from the first call on.
    if rendezvous {
        crate::probe::rendezvous_wait::set_state_word(&prepared.region, waits.loader_state.unwrap_or(0))?;
        crate::probe::rendezvous_wait::arm(&prepared.region, pid)?;
    }
    if waits.step_calls > 0 {
        crate::probe::step_handoff::arm(&prepared.region, pid, waits.step_calls)?;
    }
    stopped.stop_all()?;
    let committed = install::commit(&mut stopped, mem, &prepared)?;
    // Still stopped: the baseline of lost events is exact, and events an
    // earlier session left unread are not this session's.
    let lost_at_start = Drainer::lost_parts(&prepared.region);
    if discard {
        Drainer::discard_unread(&prepared.region)?;
        crate::events::aggregates::clear(&prepared.region)?;
    }
    let holds = stopped.resume();
    let (region, report) = prepared.done(committed);
    Ok(Done { region, report, stop_time: holds.world, worker_time: holds.any, lost_at_start })
}

/// True if `region` holds no probe anyone may still want: it has entries
/// (a region without any is one a running tp is setting up), none of them
/// may be patched, none is kept (a disabled kept probe is), and no running
/// session owns one. What an ended session left when a thread was inside
/// tp's code at its detach ("tp's memory kept").
fn is_leftover(region: &Region) -> bool {
    let entries = region.entries();
    !entries.is_empty()
        && entries
            .iter()
            .all(|(_, e)| !e.state().maybe_patched() && e.owner != 0 && !super::session_is_running(e.owner))
}

/// Unmaps the `region` an ended session left in process `pid`, as `tp
/// detach -p` would, if no thread is inside it now (a short stop of every
/// thread): the session starts with a region of its own size, not the
/// rest of the old one. Returns the region if it is still in use; says to
/// `notes` when it unmapped it.
fn reclaim(notes: &Arc<dyn Notes>, pid: i32, region: Region) -> Result<Option<Region>> {
    let mem = Memory::open(pid)?;
    let stopped = Stopped::stop(pid, notes.clone())?;
    let (kept, _) = crate::probe::remove::finish(stopped, &mem, &region)?;
    if kept.is_none() {
        crate::note!(
            notes,
            "tp: process {pid}: unmapped the memory an ended session left there (a thread was in it then)"
        );
    }
    Ok(kept.map(|_| region))
}

/// `infos` (one per probe requested) without those of the functions the
/// install left unpatched, which it names to `notes`, with why.
fn without_unpatched<T>(notes: &dyn Notes, infos: Vec<T>, report: &install::Report) -> Vec<T> {
    const SHOWN: usize = 3;
    for why in report.unpatched.iter().take(SHOWN) {
        crate::note!(notes, "tp: not probed this time: {}; attach again to probe it", crate::escape::text(why));
    }
    if report.unpatched.len() > SHOWN {
        crate::note!(
            notes,
            "tp: {} more functions not probed this time, for the same reason",
            report.unpatched.len() - SHOWN
        );
    }
    infos.into_iter().enumerate().filter(|(i, _)| !report.unpatched_at.contains(i)).map(|(_, info)| info).collect()
}

/// `err`, or "the process exited" if that is why tp failed: a target that
/// dies mid-attach makes the next ptrace call or memory access fail with
/// whatever the kernel says about a vanished thread.
fn exited_or(pid: i32, err: anyhow::Error) -> anyhow::Error {
    if err.downcast_ref::<process::ProcessError>().is_some() {
        return err;
    }
    if process::has_exited(pid, Duration::from_millis(200)) {
        return process::ProcessError::Exited(pid).into();
    }
    err
}

/// The pairs (this install's entry, the kept entry it went over) of the
/// probes `installed` at the sites of `over`.
fn over_pairs(installed: &[Installed], over: &[(u64, u32)]) -> Vec<(u32, u32)> {
    installed
        .iter()
        .filter_map(|p| over.iter().find(|(site, _)| *site == p.request.plan.site).map(|&(_, kept)| (p.index, kept)))
        .collect()
}

/// The calls of probe `index` (of kind `k`) that passed its predicates and
/// every call (`hits`, from the detour's counter), when it has a predicate
/// (`--if`); else `hits` alone.
pub fn filtered(region: &Region, index: u32, k: u32, hits: u64) -> (u64, Option<u64>) {
    match k & (kind::FILTER | kind::FILTER_EXIT) {
        0 => (hits, None),
        _ => (region.matched(index), Some(hits)),
    }
}

/// True for a probe of kind `k` that sees its calls end by replacing their
/// return addresses (not at the function's exits): the unwinder probes
/// serve it.
fn replaces_returns(k: u32) -> bool {
    k & (kind::RET | kind::SAMPLE) != 0 && k & kind::AT_EXITS == 0
}

fn modules_index(modules: &ProcessModules, name: &str) -> Option<usize> {
    (0..modules.len()).find(|&i| modules.name(i) == name)
}
