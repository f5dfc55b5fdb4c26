//! One attach: resolve and plan the probes, install them (the target is
//! stopped for the commit only), and later remove them and, when nothing
//! uses it any more, unmap tp's memory from the target.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Options, Selection, resolve, unwind};
use crate::events::clock::Clock;
use crate::events::drain::Drainer;
use crate::events::format::ProbeInfo;
use crate::output::{ProbeStat, Summary};
use crate::probe::install::{self, Installed};
use crate::probe::layout::{State, kind};
use crate::probe::region::{self, Region};
use crate::probe::remove::{self, Kept};
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::symbols::ProcessModules;

/// A live attach session: probes installed, the target running.
pub struct Attached {
    /// The target.
    pub pid: i32,
    mem: Memory,
    /// The target's data region.
    pub region: Region,
    probes: Vec<Installed>,
    owner: u32,
    /// The event clock, started with the attach.
    pub clock: Clock,
    /// What tp knows of each probe, for its events (same order as the probes).
    pub infos: Vec<ProbeInfo>,
    /// From the start of the attach until the probes were live.
    pub attach_time: Duration,
    /// How long all of the target's threads were stopped.
    pub stop_time: Duration,
    /// How long the worker thread was stopped (it makes the remote syscalls).
    pub worker_time: Duration,
    /// Threads that had to be moved out of a patch window.
    pub moved_threads: usize,
    /// Functions matched by a glob but refused.
    pub refused: usize,
    /// Events lost before this session's probes went live.
    pub lost_at_start: u64,
}

/// How a detach went.
pub struct Detached {
    /// Final counts.
    pub summary: Summary,
    /// How long the target was stopped for the detach (zero if it had exited).
    pub stop_time: Duration,
    /// True if the target had exited before the detach.
    pub target_gone: bool,
    /// Why tp's memory stayed in the target, if it did.
    pub kept: Option<Kept>,
}

impl Attached {
    /// Resolves the selection of `opts` in the modules of its process and
    /// installs probes owned by this tp (by none when `opts.keep`).
    pub fn attach(opts: &Options) -> Result<Attached> {
        let (pid, owner) = (opts.pid, opts.owner());
        Self::attach_inner(pid, &opts.selection, owner).map_err(|e| exited_or(pid, e))
    }

    fn attach_inner(pid: i32, what: &Selection, owner: u32) -> Result<Attached> {
        let started = Instant::now();
        let clock = Clock::start();
        process::check_attachable(pid)?;
        let maps = process::read_maps(pid).with_context(|| format!("cannot read the memory map of {pid}"))?;
        let modules = ProcessModules::new(pid, &maps)?;
        let resolved = resolve::requests(&modules, &what.funcs, &what.addrs, what.kind)?;
        let mut requests = resolved.requests;
        let existing = region::find(&maps).map(|m| Region::open(pid, m)).transpose()?;
        if what.kind != kind::COUNT
            && let Some(r) = &existing
            && let Some((_, e)) = r.entries().into_iter().find(|(_, e)| {
                e.state().maybe_patched() && e.kind & (kind::ARGS | kind::RET) != 0 && session_is_running(e.owner)
            })
        {
            bail!(
                "tp session {} is already recording events in process {pid} (sessions share the rings); \
                 end it first",
                e.owner
            );
        }
        if what.kind & kind::RET != 0 {
            requests.extend(unwind::unwinder_requests(&modules, existing.as_ref())?);
        }
        let infos = requests
            .iter()
            .map(|r| {
                let dwarf = (r.kind & (kind::ARGS | kind::RET) != 0)
                    .then(|| {
                        let m = modules.get(modules_index(&modules, &r.function.module)?).ok()?;
                        m.dwarf()?.at(m.bias.file(r.function.addr)).cloned()
                    })
                    .flatten();
                // Call lines add their own parentheses: `f(x=1)`, not `f(long)(x=1)`.
                let name = crate::symbols::demangle::strip_arguments(&r.function.name);
                ProbeInfo { name, module: r.function.module.clone(), dwarf }
            })
            .collect();
        let mem = Memory::open(pid)?;
        let worker_started = Instant::now();
        let mut stopped = Stopped::stop_worker(pid)?;
        let opts = install::Options { owner, ring_len: what.ring_len, sample_budget: what.sample_budget };
        let prepared = install::prepare(&mut stopped, &mem, existing, &requests, opts)?;
        stopped.stop_all()?;
        let (region, report) = install::commit(&mut stopped, &mem, prepared)?;
        // Still stopped: the baseline of lost events is exact, and events an
        // earlier session left unread are not this session's.
        let lost_at_start = Drainer::lost(&region);
        if what.kind != kind::COUNT {
            Drainer::discard_unread(&region)?;
        }
        let stop_time = stopped.resume();
        Ok(Attached {
            pid,
            mem,
            region,
            probes: report.installed,
            owner,
            clock,
            infos,
            attach_time: started.elapsed(),
            stop_time,
            worker_time: worker_started.elapsed(),
            moved_threads: report.moved_threads,
            refused: resolved.refused.len(),
            lost_at_start,
        })
    }

    /// The probes the user asked for (not tp's own unwinder probes).
    fn user_probes(&self) -> impl Iterator<Item = &Installed> {
        self.probes.iter().filter(|p| p.request.kind & kind::UNWIND == 0)
    }

    /// The probed functions' names, in request order.
    pub fn names(&self) -> Vec<String> {
        self.user_probes().map(|p| p.request.function.name.clone()).collect()
    }

    /// Current hit counts, in request order.
    pub fn hits(&self) -> Vec<u64> {
        let idx: Vec<u32> = self.user_probes().map(|p| p.index).collect();
        self.region.hits_of(&idx)
    }

    /// The module of each of the user's probes, in request order.
    pub fn modules_of_probes(&self) -> Vec<String> {
        self.user_probes().map(|p| p.request.function.module.clone()).collect()
    }

    /// The entry indexes of the user's probes, in request order.
    pub fn indexes(&self) -> Vec<u32> {
        self.user_probes().map(|p| p.index).collect()
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
        self.user_probes().all(|p| self.region.state(p.index) == State::Active)
    }

    /// Reads a NUL-terminated string from the target (for `char *` arguments).
    pub fn read_string(&self, addr: u64, max: usize) -> Option<String> {
        let bytes = self.mem.read_partial(addr, max);
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let s = String::from_utf8_lossy(&bytes[..end]).into_owned();
        (!bytes.is_empty()).then_some(s)
    }

    fn summary(&self) -> Summary {
        let hits = self.hits();
        Summary {
            pid: self.pid,
            probes: self
                .user_probes()
                .zip(hits)
                .map(|(p, hits)| ProbeStat {
                    func: p.request.function.name.clone(),
                    module: p.request.function.module.clone(),
                    address: p.request.function.addr.0,
                    hits,
                    enabled: self.region.enabled(p.index),
                })
                .collect(),
        }
    }

    /// Removes this session's probes (the target is stopped for it) and, when
    /// nothing else uses them, unmaps tp's memory from the target. tp's own
    /// unwinder probes go with the last return probe.
    pub fn detach(&self) -> Result<Detached> {
        let sharers: Vec<Memory> =
            region::sharers(&self.region, self.pid).into_iter().filter_map(|p| Memory::open(p).ok()).collect();
        let stopped = match Stopped::stop(self.pid) {
            Ok(s) => s,
            Err(_) if !process::is_alive(self.pid) => {
                return Ok(Detached {
                    summary: self.summary(),
                    stop_time: Duration::ZERO,
                    target_gone: true,
                    kept: None,
                });
            }
            Err(e) => return Err(e),
        };
        let mine: Vec<u32> = self.probes.iter().map(|p| p.index).collect();
        let owner = self.owner;
        let done = (|| {
            remove::remove(&self.mem, &self.region, &sharers, |i, e| {
                mine.contains(&i) && e.owner == owner && e.kind & kind::UNWIND == 0
            })?;
            let ret_left =
                self.region.entries().iter().any(|(_, e)| e.state().maybe_patched() && e.kind & kind::RET != 0);
            if !ret_left {
                remove::remove(&self.mem, &self.region, &sharers, |_, e| e.kind & kind::UNWIND != 0)?;
            }
            remove::finish(stopped, &self.mem, &self.region)
        })();
        match done {
            Ok((kept, stop_time)) => Ok(Detached { summary: self.summary(), stop_time, target_gone: false, kept }),
            // The target died under our hands: its counts are still in our mapping.
            Err(_) if process::has_exited(self.pid, Duration::from_millis(200)) => {
                Ok(Detached { summary: self.summary(), stop_time: Duration::ZERO, target_gone: true, kept: None })
            }
            Err(e) => Err(e),
        }
    }
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

/// True if `owner` is a tp process that is still running (not this one).
pub fn session_is_running(owner: u32) -> bool {
    owner != 0
        && owner != std::process::id()
        && process::status(owner as i32).is_ok_and(|st| st.name == "tp" && st.state != 'Z')
}

fn modules_index(modules: &ProcessModules, name: &str) -> Option<usize> {
    (0..modules.len()).find(|&i| modules.name(i) == name)
}
