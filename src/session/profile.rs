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
//!
//! Its self time is its calls times the mean self time of those sampled. A
//! timed call's self time is its duration minus the durations of the timed
//! calls made while it was the innermost timed call live on its thread:
//! the runtime adds each timed call's duration to the frame below it on the
//! thread's shadow stack, which holds timed calls only, and sends the sum
//! with the call's exit ([`RawEvent::self_from`]). So a callee's time is
//! taken from the one call that contains it, the self times of a thread's
//! timed calls add up to the durations of its outermost ones, and a
//! recursive function's inner calls are taken out of its outer call's self
//! time (its inclusive time counts them in both). Under sampling a call's
//! callees are timed at their own rate: the time of those not timed stays
//! in the self time of the call (an upper bound on its true self time),
//! and a timed call whose caller was not timed takes nothing from it. With
//! a function's every call timed (fewer calls per epoch than `--sample`),
//! its self time is exact.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::follow;
use super::forked::Family;
use super::libraries::Libraries;
use super::observe::Watcher;
use super::{Attached, Detached, End, Options, Records, Selection, observe};
use crate::events::clock::Clock;
use crate::events::drain::Drainer;
use crate::events::sampling::{FIRST_EPOCH, Sampler};
use crate::events::stats::Latency;
use crate::events::{Kind, RawEvent};
use crate::notes::Notes;
use crate::output::chrome::ChromeTrace;
use crate::output::chrome_args::ChromeArgs;
use crate::output::events::duration;
use crate::output::profile::{Report, Row};
use crate::output::thousands;
use crate::process;
use crate::symbols::ProcessModules;

/// What a profile gives: the profile, and how its target ended.
#[derive(Debug)]
pub struct Profiled {
    /// The profile.
    pub report: Report,
    /// The signal that killed the target during the profile, as the
    /// kernel said (None where tp does not hear it: [`super::exit_status`]).
    pub killed_by: Option<i32>,
}

/// Runs `tp profile` as `opts` say: opens where its results go (`-o
/// FILE`, created first, else stdout), profiles, and writes the profile
/// there in the format of `opts` ([`super::results::write_profile`]).
/// Returns the signal that killed the target during the profile, as
/// [`Profiled::killed_by`].
pub fn run(opts: &Options) -> Result<Option<i32>> {
    let (mut out, trace) = super::results::open_profile(opts)?;
    let profiled = profile(opts, trace)?;
    super::results::write_profile(&mut out, opts, &profiled.report)?;
    Ok(profiled.killed_by)
}

/// Profiles `opts.pid` until `opts.duration`, Ctrl-C or the target's
/// end, then restores its code: the profile, with what it did said on
/// stderr as it goes. In the Chrome format (`opts.format`) the sampled
/// calls are written to `trace` as they end.
fn profile(opts: &Options, trace: Option<Box<dyn std::io::Write>>) -> Result<Profiled> {
    let pid = opts.pid;
    // Listening before the probes go in: no fork of that moment is missed.
    let mut family = Family::start();
    family.add_root(pid);
    let (mut attached, mut libraries) = attach(opts)?;
    let mut guard = super::guard::Restore::new(&mut attached, &*opts.notes);
    let chrome = trace.map(|out| ChromeTrace::new(out, pid).context("writing the trace")).transpose()?;
    let mut profiler = Profiler::new(guard.get(), opts, chrome)?;
    crate::note!(
        opts.notes,
        "tp: profiling {} functions of {} ({} timed calls each per {} epoch; Ctrl-C to stop){}",
        profiler.functions(),
        pid,
        opts.samples_per_epoch,
        duration(opts.epoch.as_nanos() as u64),
        match guard.get().refused {
            0 => String::new(),
            n => format!("; {n} more cannot be probed"),
        }
    );
    let started = Instant::now();
    let end =
        observe(guard.get_mut(), opts.duration, &mut profiler, Some(&mut family), Some(&mut libraries), &*opts.notes)?;
    if end == End::OutputClosed {
        super::observe::say_output_closed();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let d = guard.detach()?;
    let end = family.end_of(pid);
    match (d.target_gone, d.execd) {
        (true, true) => {
            crate::note!(opts.notes, "tp: process {pid} exec'd another program; its probes went with the old one")
        }
        (true, false) => crate::note!(opts.notes, "tp: process {pid} {}", end.sentence()),
        _ => {}
    }
    family.restored(pid, &d.family);
    libraries.say_never_found(pid);
    super::group::say_relatives(&*opts.notes, pid, &d.family);
    let (epochs, samples, toggles) = (profiler.epochs, profiler.samples, profiler.toggles());
    let rows = profiler.finish(&attached, &d)?;
    crate::note!(
        opts.notes,
        "tp: {epochs} epochs in {elapsed:.1} s: {} toggles/s, {} samples/s",
        thousands((toggles as f64 / elapsed) as u64),
        thousands((samples as f64 / elapsed) as u64),
    );
    let report = Report { pid, elapsed, toggles, samples, rows, libraries: libraries.loaded };
    // Only an end the session saw: not one that came after its detach.
    let killed_by = (d.target_gone && !d.execd).then(|| super::signal_of(end)).flatten();
    Ok(Profiled { report, killed_by })
}

/// What `tp profile` probes: sampling return probes on `funcs`, with room
/// in each thread's ring for every function's samples of an epoch.
pub fn selection(funcs: Vec<String>, samples_per_epoch: u32) -> Selection {
    let budget = Sampler::budget_for(samples_per_epoch);
    Selection {
        // Room for every function's samples of an epoch.
        ring_len: (budget as usize * 4096).clamp(2048, 1 << 18) as u32,
        sample_budget: budget,
        ..Selection::new(funcs, Records { ret: true, sample: true, ..Records::COUNT })
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
        return Ok((Attached::attach(opts)?, Libraries::new(None, opts.notes.clone())));
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
        crate::note!(opts.notes, "tp: {}; tp profiles it when the process loads it", crate::escape::text(w));
    }
    Ok((attached, Libraries::new(Some(follow), opts.notes.clone())))
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
    /// Self times of the same calls.
    own: Vec<Latency>,
    epoch: Duration,
    /// Calls timed so far.
    pub samples: u64,
    /// Epochs ended so far.
    pub epochs: u64,
    next_free: std::time::Instant,
    notes: Arc<dyn Notes>,
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
            own: vec![Latency::default(); idx.len()],
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
            notes: opts.notes.clone(),
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
            .zip(self.own)
            .enumerate()
            .map(|(k, (latency, own))| Row {
                func: self.names[k].clone(),
                module: modules[k].clone(),
                address: detached.summary.probes.get(k).map_or(0, |s| s.address),
                calls: detached.summary.probes.get(k).map_or(0, |s| s.hits).saturating_sub(self.at_start[k]),
                latency,
                own,
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
            crate::note!(self.notes, "tp: process {}: cannot sample a library loaded again: {e:#}", attached.pid);
        }
        self.at_start.extend(new.iter().map(|_| 0));
        self.latency.extend(new.iter().map(|_| Latency::default()));
        self.own.extend(new.iter().map(|_| Latency::default()));
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
            let (timed, own) = durations(ev, |from, to| clock.duration_ns(from, to));
            self.latency[k].add(timed);
            self.own[k].add(own);
            self.samples += 1;
            if let Some(c) = &mut self.chrome {
                let span = clock.duration_ns(ev.entry_tsc(), ev.tsc);
                let mut args = ChromeArgs::default();
                args.push("self_ns", own.into());
                args.push("timed_ns", timed.into());
                c.slice(&self.names[k], ev.tid, clock.ns(ev.entry_tsc()), span, &args)?;
            }
        }
        self.epochs += 1;
        Ok(())
    }
}

/// A timed call's duration and self time in ns, from its exit event
/// (`ns` converts counter values to the nanoseconds between them).
fn durations(ev: &RawEvent, ns: impl Fn(u64, u64) -> u64) -> (u64, u64) {
    (ns(ev.timed_from(), ev.tsc), ns(ev.self_from(), ev.tsc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Kind;

    /// A call on one thread: its probe, entry and exit counter values, and
    /// whether its sample was taken.
    type Call = (u32, u64, u64, bool);

    /// The exits the runtime sends for `calls` (properly nested, in entry
    /// order), with no time of tp's own: a timed call pushes a frame; at
    /// its exit its duration goes to the frame below it, the innermost
    /// timed call live, and the frame's sum goes with the exit.
    fn exits(calls: &[Call]) -> Vec<RawEvent> {
        // (tick, is exit, call): exits before entries at the same tick.
        let mut points: Vec<(u64, bool, usize)> = Vec::new();
        for (k, c) in calls.iter().enumerate().filter(|(_, c)| c.3) {
            points.push((c.1, false, k));
            points.push((c.2, true, k));
        }
        points.sort_by_key(|&(t, exit, k)| (t, !exit, if exit { usize::MAX - k } else { k }));
        let (mut frames, mut out): (Vec<(usize, u64)>, Vec<RawEvent>) = (Vec::new(), Vec::new());
        for (tsc, exit, k) in points {
            if !exit {
                frames.push((k, 0));
                continue;
            }
            let (top, children) = frames.pop().unwrap();
            assert_eq!(top, k, "calls must nest");
            let (probe, entry, _, _) = calls[k];
            if let Some(below) = frames.last_mut() {
                below.1 += tsc - entry;
            }
            out.push(RawEvent {
                kind: Kind::Exit,
                probe,
                pid: 1,
                tid: 1,
                tsc,
                v: [0, entry, 0, 0, 0, children, 0, 0, 0],
                stack: (0, 0),
            });
        }
        out
    }

    /// Sums of (duration, self time) by probe, at 1 ns a tick.
    fn sums(calls: &[Call]) -> HashMap<u32, (u64, u64)> {
        let mut by: HashMap<u32, (u64, u64)> = HashMap::new();
        for ev in exits(calls) {
            let (timed, own) = durations(&ev, |from, to| to - from);
            let s = by.entry(ev.probe).or_default();
            *s = (s.0 + timed, s.1 + own);
        }
        by
    }

    #[test]
    fn a_callee_is_taken_from_the_caller_that_contains_it_only() {
        // outer (1) [0, 1000) calls inner (2) twice; inner [1100, 1300)
        // runs after it, at the top level.
        let calls = [(1, 0, 1000, true), (2, 100, 300, true), (2, 400, 700, true), (2, 1100, 1300, true)];
        let by = sums(&calls);
        assert_eq!(by[&1], (1000, 500), "outer: 1000 ns, less inner's 200 and 300");
        assert_eq!(by[&2], (700, 700), "inner calls nothing probed");
        // The self times add up to the outermost calls' durations.
        assert_eq!(by[&1].1 + by[&2].1, 1000 + 200);
    }

    #[test]
    fn a_recursive_function_counts_its_time_once_in_self_time() {
        // f [0, 1000) ⊃ f [100, 900) ⊃ f [200, 300).
        let calls = [(7, 0, 1000, true), (7, 100, 900, true), (7, 200, 300, true)];
        let by = sums(&calls);
        assert_eq!(by[&7].1, 1000, "self: 200 + 700 + 100, the outermost call's 1000");
        assert_eq!(by[&7].0, 1000 + 800 + 100, "inclusive: each level counts again in those above it");
    }

    #[test]
    fn under_sampling_a_callee_goes_to_the_innermost_timed_caller() {
        // a [0, 1000) ⊃ b [100, 900), not timed, ⊃ c [200, 300): c's 100
        // ns are taken from a, whose self time keeps b's other 700 (an
        // upper bound on its true 200).
        let calls = [(1, 0, 1000, true), (2, 100, 900, false), (3, 200, 300, true)];
        let by = sums(&calls);
        assert_eq!(by[&1], (1000, 900));
        assert_eq!(by[&3], (100, 100));
        assert!(!by.contains_key(&2));
        // A timed callee of a call not timed takes nothing from anyone.
        let by = sums(&[(1, 0, 1000, false), (3, 200, 300, true)]);
        assert_eq!(by[&3], (100, 100));
        assert_eq!(by.len(), 1);
    }

    #[test]
    fn tps_own_ticks_count_in_neither() {
        // 30 ticks of tp's work inside the call (its callees' probes): the
        // duration is 970, and the callee's 200 leave 770 of its own.
        let ev = RawEvent {
            kind: Kind::Exit,
            probe: 1,
            pid: 1,
            tid: 1,
            tsc: 1000,
            v: [0, 0, 0, 30, 0, 200, 0, 0, 0],
            stack: (0, 0),
        };
        assert_eq!(durations(&ev, |from, to| to - from), (970, 770));
        // Words from the target are untrusted: never below zero.
        let ev = RawEvent { v: [0, 0, 0, 30, 0, 5000, 0, 0, 0], ..ev };
        assert_eq!(durations(&ev, |from, to| to.saturating_sub(from)), (970, 0));
    }
}
