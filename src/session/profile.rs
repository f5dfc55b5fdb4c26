//! The sampling session of `tp profile`: the latency of many functions at
//! once, at a cost the target can live with (the fastinst idea, without
//! cross-modifying code).
//!
//! Every matching function gets a sampling return probe: it counts every
//! call and times one call in `period`, at random (the in-target runtime
//! draws the calls to skip before the next sample). At every epoch tp sets
//! each function's period from its calls in the last epoch, so that it gets
//! about `--sample` samples per epoch, and gives every probe that spent some
//! of its budget (at most twice that many samples per epoch, for functions
//! whose calls suddenly became frequent) a new one: one store each, no stop,
//! no code modification. Timing calls at random among all calls, rather
//! than the first calls of each epoch, keeps the latencies unbiased: the
//! first call after an instant is more likely one that follows a long pause.
//! Calls are counted exactly; latencies come from the samples. A function's share
//! of time is its calls times its mean latency over the wall-clock time of
//! the profile: inclusive (a callee's time counts in its callers' too), and
//! above 100 % only when several threads run it at once.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::follow;
use super::libraries::Libraries;
use super::observe::Watcher;
use super::{Attached, Detached, Options, Selection};
use crate::events::clock::Clock;
use crate::events::drain::Drainer;
use crate::events::sampling::{FIRST_EPOCH, Sampler};
use crate::events::stats::Latency;
use crate::events::{Kind, RawEvent};
use crate::output::chrome::ChromeTrace;
use crate::output::profile::Row;
use crate::probe::layout::kind;
use crate::process;
use crate::symbols::ProcessModules;

/// What `tp profile` probes: sampling return probes on `funcs`, with room
/// in each thread's ring for every function's samples of an epoch.
pub fn selection(funcs: Vec<String>, samples_per_epoch: u32) -> Selection {
    let budget = Sampler::budget_for(samples_per_epoch);
    Selection {
        // Room for every function's samples of an epoch.
        ring_len: (budget as usize * 4096).clamp(2048, 1 << 18) as u32,
        sample_budget: budget,
        ..Selection::new(funcs, kind::RET | kind::SAMPLE)
    }
}

/// Attaches `tp profile`'s probes to `opts.pid`. Patterns that name a
/// library the process has not loaded wait for it as `tp attach`'s do
/// ([`super::group::Group::attach`]): tp's probe at the dynamic linker's
/// rendezvous goes in beside the others, and the session
/// ([`super::observe::observe`] with the [`Libraries`] returned) probes the
/// library there, before its first call; the other patterns resolve
/// strictly. Where the process has no rendezvous (a static program), tp
/// looks for libraries at each check, and one pattern must match now.
pub fn attach(opts: &Options) -> Result<(Attached, Libraries)> {
    let pid = opts.pid;
    process::check_attachable(pid)?;
    let maps = process::read_maps(pid)?;
    let modules = ProcessModules::new(pid, &maps)?;
    let later = follow::waiting_for_libraries(&modules, &opts.selection.funcs)?;
    if later.is_empty() {
        return Ok((Attached::attach(opts)?, Libraries::new(None)));
    }
    if later.len() == opts.selection.funcs.len()
        && let Some(why) = super::rendezvous::missing(pid, &modules)
    {
        let (names, them) = match later.len() {
            1 => ("names a library", "it"),
            _ => ("name libraries", "them"),
        };
        bail!(
            "no function to profile now: {} {names} process {pid} has not loaded, and tp cannot wait for {them} at \
             the dynamic linker's rendezvous: {why}; profile a function it has loaded, or once the library is loaded",
            later.iter().map(|f| format!("`{}`", crate::escape::text(f))).collect::<Vec<_>>().join(", "),
        );
    }
    let (attached, follow, waiting) =
        Attached::attach_following(opts, &modules, None, Some(super::observe::CHECK_EVERY))?;
    let Some(attached) = attached else {
        bail!(
            "{}; without the dynamic linker's rendezvous tp profile needs a function to profile now",
            waiting.join("; ")
        );
    };
    for w in &waiting {
        crate::say!("tp: {}; tp profiles it when the process loads it", crate::escape::text(w));
    }
    Ok((attached, Libraries::new(Some(follow))))
}

/// Adapts the sampling at every epoch and sums the sampled latencies.
pub struct Profiler {
    idx: Vec<u32>,
    names: Vec<String>,
    /// Entry index → position in `idx`.
    position: HashMap<u32, usize>,
    at_start: Vec<u64>,
    sampler: Sampler,
    chrome: Option<ChromeTrace>,
    clock: Clock,
    drainer: Drainer,
    batch: Vec<RawEvent>,
    latency: Vec<Latency>,
    epoch: Duration,
    /// Calls timed so far.
    pub samples: u64,
    /// Epochs ended so far.
    pub epochs: u64,
    next_free: std::time::Instant,
}

impl Profiler {
    /// Starts profiling the probes of `attached`; calls are counted from
    /// here on, and the sampled calls go to `chrome` if given.
    pub fn new(attached: &Attached, opts: &Options, chrome: Option<ChromeTrace>) -> Result<Profiler> {
        let idx = attached.indexes();
        // Calls are counted from here on (before tp says it is profiling).
        let at_start = attached.region.hits_of(&idx);
        let sampler = Sampler::new(&attached.region, idx.clone(), opts.samples_per_epoch);
        let position: HashMap<u32, usize> = idx.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        Ok(Profiler {
            latency: vec![Latency::default(); idx.len()],
            names: attached.names(),
            idx,
            position,
            at_start,
            sampler,
            chrome,
            clock: attached.clock.clone(),
            drainer: Drainer::default(),
            batch: Vec::new(),
            epoch: opts.epoch,
            samples: 0,
            epochs: 0,
            next_free: std::time::Instant::now(),
        })
    }

    /// How many functions are profiled.
    pub fn functions(&self) -> usize {
        self.idx.len()
    }

    /// Stores into the target's region so far (periods, countdowns, budgets).
    pub fn toggles(&self) -> u64 {
        self.sampler.toggles
    }

    /// Closes the trace file and gives each function's calls (from the final
    /// counts of `detached`) and sampled latency, in probe order.
    pub fn finish(self, attached: &Attached, detached: &Detached) -> Result<Vec<Row>> {
        if let Some(c) = self.chrome {
            c.finish().context("writing the trace")?;
        }
        let modules = attached.modules_of_probes();
        Ok(self
            .latency
            .into_iter()
            .enumerate()
            .map(|(k, latency)| Row {
                func: self.names[k].clone(),
                module: modules[k].clone(),
                address: detached.summary.probes.get(k).map_or(0, |s| s.address),
                calls: detached.summary.probes.get(k).map_or(0, |s| s.hits).saturating_sub(self.at_start[k]),
                latency,
            })
            .collect())
    }
}

impl Watcher for Profiler {
    fn grown(&mut self, attached: &Attached) {
        let all = attached.indexes();
        let names = attached.names();
        let new: Vec<u32> = all.get(self.idx.len()..).unwrap_or_default().to_vec();
        for (k, &i) in new.iter().enumerate() {
            self.position.insert(i, self.idx.len() + k);
        }
        self.sampler.add(&attached.region, &new);
        // A library loaded again: its probes sample as before from its first call.
        if let Err(e) = self.sampler.reinstalled(&attached.region) {
            crate::say!("tp: process {}: cannot sample a library loaded again: {e:#}", attached.pid);
        }
        self.at_start.extend(new.iter().map(|_| 0));
        self.latency.extend(new.iter().map(|_| Latency::default()));
        self.names.extend(names.into_iter().skip(self.idx.len()));
        self.idx.extend(new);
    }

    fn pause(&self) -> Duration {
        if self.epochs == 0 { self.epoch.min(FIRST_EPOCH) } else { self.epoch }
    }

    fn tick(&mut self, attached: &Attached) -> Result<()> {
        let clock = &mut self.clock;
        clock.refine();
        self.batch.clear();
        self.drainer.drain(&attached.region, &mut self.batch)?;
        super::tracer::free_ended_rings(&attached.region, &mut self.next_free);
        self.sampler.end_epoch(&attached.region)?;
        for ev in &self.batch {
            let Some(&k) = self.position.get(&ev.probe) else { continue };
            if ev.kind != Kind::Exit {
                continue;
            }
            self.latency[k].add(clock.duration_ns(ev.timed_from(), ev.tsc));
            self.samples += 1;
            if let Some(c) = &mut self.chrome {
                let span = clock.duration_ns(ev.entry_tsc(), ev.tsc);
                c.slice(&self.names[k], ev.tid, clock.ns(ev.entry_tsc()), span, "{}")?;
            }
        }
        self.epochs += 1;
        Ok(())
    }
}
