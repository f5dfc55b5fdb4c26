//! `tp attach`: probe functions of a running process, show live counts,
//! and on Ctrl-C, `--duration` or the target's exit, restore the code and
//! print a summary. With `--keep`, install and exit instead.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{interrupt, resolve};
use crate::cli::AttachArgs;
use crate::output::{self, ProbeStat, Summary, live::Live};
use crate::probe::install::{self, Installed};
use crate::probe::layout::State;
use crate::probe::region::{self, Region};
use crate::probe::remove::{self, Kept};
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::symbols::Module;

/// A live attach session: probes installed, the target running.
pub struct Attached {
    /// The target.
    pub pid: i32,
    mem: Memory,
    region: Region,
    probes: Vec<Installed>,
    owner: u32,
    /// From the start of the attach until the probes were live.
    pub attach_time: Duration,
    /// How long all of the target's threads were stopped.
    pub stop_time: Duration,
    /// How long the worker thread was stopped (it makes the remote syscalls).
    pub worker_time: Duration,
    /// Threads that had to be moved out of a patch window.
    pub moved_threads: usize,
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
    /// Resolves `funcs` in the main executable of `pid` and installs probes
    /// owned by `owner` (0: kept after tp exits).
    pub fn attach(pid: i32, funcs: &[String], owner: u32) -> Result<Attached> {
        Self::attach_inner(pid, funcs, owner).map_err(|e| exited_or(pid, e))
    }

    fn attach_inner(pid: i32, funcs: &[String], owner: u32) -> Result<Attached> {
        let started = Instant::now();
        process::check_attachable(pid)?;
        let maps = process::read_maps(pid).with_context(|| format!("cannot read the memory map of {pid}"))?;
        let module = Module::main_executable(pid, &maps)?;
        let requests = resolve::requests(&module, funcs)?;
        let mem = Memory::open(pid)?;
        let existing = region::find(&maps).map(|m| Region::open(pid, m)).transpose()?;
        let worker_started = Instant::now();
        let mut stopped = Stopped::stop_worker(pid)?;
        let prepared = install::prepare(&mut stopped, &mem, existing, &requests, owner)?;
        stopped.stop_all()?;
        let (region, report) = install::commit(&mut stopped, &mem, prepared)?;
        let stop_time = stopped.resume();
        Ok(Attached {
            pid,
            mem,
            region,
            probes: report.installed,
            owner,
            attach_time: started.elapsed(),
            stop_time,
            worker_time: worker_started.elapsed(),
            moved_threads: report.moved_threads,
        })
    }

    /// The probed functions' names, in request order.
    pub fn names(&self) -> Vec<String> {
        self.probes.iter().map(|p| p.request.function.name.clone()).collect()
    }

    /// Current hit counts, in request order.
    pub fn hits(&self) -> Vec<u64> {
        self.probes.iter().map(|p| self.region.hits(p.index)).collect()
    }

    /// True while all of this session's probes are still installed (another
    /// `tp detach` may have removed them).
    pub fn still_installed(&self) -> bool {
        self.probes.iter().all(|p| self.region.entry(p.index).state() == State::Active)
    }

    fn summary(&self) -> Summary {
        Summary {
            pid: self.pid,
            probes: self
                .probes
                .iter()
                .map(|p| ProbeStat {
                    func: p.request.function.name.clone(),
                    module: p.request.function.module.clone(),
                    address: p.request.function.addr,
                    hits: self.region.hits(p.index),
                })
                .collect(),
        }
    }

    /// Removes this session's probes (the target is stopped for it) and, when
    /// nothing else uses them, unmaps tp's memory from the target.
    pub fn detach(self) -> Result<Detached> {
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
        let done = remove::remove(&self.mem, &self.region, |i, e| mine.contains(&i) && e.owner == owner)
            .and_then(|_| remove::finish(stopped, &self.mem, &self.region));
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

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    let owner = if args.keep { 0 } else { std::process::id() };
    let attached = Attached::attach(args.pid, &args.funcs, owner)?;
    let n = attached.probes.len();
    eprintln!(
        "tp: attached {n} probe{} to {} in {:.1} ms (target stopped {} µs; one thread {} µs for injection)",
        if n == 1 { "" } else { "s" },
        args.pid,
        attached.attach_time.as_secs_f64() * 1e3,
        attached.stop_time.as_micros(),
        attached.worker_time.as_micros()
    );
    if args.keep {
        eprintln!(
            "tp: probes stay in {pid} after tp exits; `tp status -p {pid}` shows counts, `tp detach -p {pid}` removes them",
            pid = args.pid
        );
        return Ok(ExitCode::SUCCESS);
    }
    let why = observe(&attached, args.duration.map(Duration::from_secs_f64));
    let d = attached.detach()?;
    match (d.target_gone, why) {
        (true, _) => eprintln!("tp: process {} exited; final counts:", args.pid),
        (false, End::Removed) => eprintln!("tp: the probes were removed by another tp; final counts:"),
        (false, _) => {
            eprintln!("tp: detached from {}, code restored (target stopped {} µs)", args.pid, d.stop_time.as_micros())
        }
    }
    print_summary(&d.summary, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// Why observing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Ctrl-C or a termination signal.
    Interrupted,
    /// `--duration` elapsed.
    Duration,
    /// The target exited.
    TargetExited,
    /// Someone removed the probes.
    Removed,
}

/// Shows live counts until a signal, the duration, the target's exit, or the
/// probes' removal.
pub fn observe(attached: &Attached, duration: Option<Duration>) -> End {
    let mut live = Live::new(attached.pid, &attached.names());
    let tick = Duration::from_millis(20);
    let mut next_draw = Instant::now();
    let end = loop {
        if interrupt::interrupted() {
            break End::Interrupted;
        }
        if duration.is_some_and(|d| live.elapsed() >= d) {
            break End::Duration;
        }
        if Instant::now() >= next_draw {
            if !process::is_alive(attached.pid) {
                break End::TargetExited;
            }
            if !attached.still_installed() {
                break End::Removed;
            }
            live.update(&attached.hits());
            next_draw = Instant::now() + Duration::from_millis(100);
        }
        std::thread::sleep(tick);
    };
    live.finish();
    end
}

/// Prints the summary on stdout, as a table or one JSON object.
pub fn print_summary(s: &Summary, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", output::json::summary(s))?;
    } else {
        output::table::summary(s, &mut out)?;
    }
    Ok(())
}
