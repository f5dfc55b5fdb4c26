//! `tp attach`: probe functions of a running process, show live counts (and
//! events, with `--args`/`--ret`), and on Ctrl-C, `--duration` or the
//! target's exit, restore the code and print a summary. With `--keep`,
//! install and exit instead.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::trace::Tracer;
use super::{interrupt, resolve};
use crate::cli::AttachArgs;
use crate::events::clock::Clock;
use crate::events::drain::Drainer;
use crate::events::format::ProbeInfo;
use crate::output::{self, ProbeStat, Summary, live::Live};
use crate::probe::Request;
use crate::probe::install::{self, Installed, Options};
use crate::probe::layout::{State, kind};
use crate::probe::region::{self, Region};
use crate::probe::remove::{self, Kept};
use crate::process::memory::Memory;
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::symbols::ProcessModules;

/// Ways a thread starts unwinding its stack, and the functions where tp can
/// see each start. When one of them runs, tp's runtime puts back the return
/// addresses that return probes replaced (runtime.c, tp_unwind), so the
/// unwinder finds the real callers. A way is covered when the unwinder's own
/// entry point, or every one of the language-level starts, is probed.
const UNWIND_PATHS: &[UnwindPath] = &[
    UnwindPath {
        what: "C++ exceptions",
        present_if: "__cxa_throw",
        unwinder: "_Unwind_RaiseException",
        // std::rethrow_exception(std::exception_ptr)
        starts: &["__cxa_throw", "__cxa_rethrow", "_ZSt17rethrow_exceptionNSt15__exception_ptr13exception_ptrE"],
    },
    UnwindPath {
        what: "Rust panics",
        present_if: "*__rust_start_panic",
        unwinder: "_Unwind_RaiseException",
        starts: &["*__rust_start_panic"],
    },
    UnwindPath {
        what: "pthread_exit and thread cancellation",
        present_if: "__pthread_unwind",
        unwinder: "_Unwind_ForcedUnwind",
        starts: &["__pthread_unwind"],
    },
];

/// One way of starting to unwind.
struct UnwindPath {
    /// For messages.
    what: &'static str,
    /// A symbol (glob, as stored) that exists only where this way exists.
    present_if: &'static str,
    /// The unwinder entry point that covers it alone.
    unwinder: &'static str,
    /// The starts (symbols as stored) that cover it together.
    starts: &'static [&'static str],
}

/// What to probe and record.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Function patterns.
    pub funcs: Vec<String>,
    /// Function addresses.
    pub addrs: Vec<u64>,
    /// What to record: bits of `probe::layout::kind`.
    pub kind: u32,
    /// Ring size for a region created now.
    pub ring_len: u32,
    /// Samples per epoch for sampling probes.
    pub sample_budget: i32,
}

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
    /// Resolves the request in the modules of `pid` and installs probes
    /// owned by `owner` (0: kept after tp exits).
    pub fn attach(pid: i32, what: &Selection, owner: u32) -> Result<Attached> {
        Self::attach_inner(pid, what, owner).map_err(|e| exited_or(pid, e))
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
            requests.extend(unwinder_requests(&modules, existing.as_ref())?);
        }
        let infos = requests
            .iter()
            .map(|r| {
                let dwarf = (r.kind & (kind::ARGS | kind::RET) != 0)
                    .then(|| {
                        let m = modules.get(modules_index(&modules, &r.function.module)?).ok()?;
                        m.dwarf()?.at(r.function.addr.wrapping_sub(m.bias)).cloned()
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
        let opts = Options { owner, ring_len: what.ring_len, sample_budget: what.sample_budget };
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
                    address: p.request.function.addr,
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

/// tp's own probes where unwinding starts (see [`UNWIND_PATHS`]), shared by
/// every session (owner 0). They are looked for in the executable (static
/// runtimes, Rust's std) and in the libraries that unwind: libgcc_s,
/// libunwind, libstdc++ and libc. Errs when a way of unwinding that exists in
/// the process cannot be covered: a return probe would crash it.
fn unwinder_requests(modules: &ProcessModules, region: Option<&Region>) -> Result<Vec<Request>> {
    let places: Vec<usize> = (0..modules.len())
        .filter(|&i| {
            let n = modules.name(i);
            i == 0 || ["libgcc_s", "libunwind", "libstdc++", "libc.so"].iter().any(|p| n.starts_with(p))
        })
        .collect();
    let find = |pattern: &str| -> Vec<(usize, crate::symbols::Function)> {
        places
            .iter()
            .filter_map(|&i| Some((i, modules.get(i).ok()?)))
            .flat_map(|(i, m)| m.matching_symbols(pattern).into_iter().map(move |f| (i, f)))
            .collect()
    };
    let already = |addr: u64| {
        region.is_some_and(|r| r.entries().iter().any(|(_, e)| e.state().maybe_patched() && e.function == addr))
    };
    let mut out: Vec<Request> = Vec::new();
    let mut hooked = |pattern: &str| -> bool {
        let found = find(pattern);
        !found.is_empty()
            && found.into_iter().all(|(i, f)| {
                if already(f.addr) || out.iter().any(|r| r.function.addr == f.addr) {
                    return true;
                }
                let Ok(m) = modules.get(i) else { return false };
                match resolve::plan(m, &f) {
                    Ok(plan) => {
                        let long = resolve::plan_long(m, &f);
                        out.push(Request { function: f, plan, long, span: m.span, kind: kind::UNWIND });
                        true
                    }
                    Err(_) => false,
                }
            })
    };
    for path in UNWIND_PATHS {
        if find(path.present_if).is_empty() {
            continue;
        }
        if hooked(path.unwinder) {
            continue;
        }
        let missing: Vec<&str> = path.starts.iter().copied().filter(|s| !hooked(s)).collect();
        if !missing.is_empty() {
            bail!(
                "return probes are unsafe in this process: tp cannot probe `{}` (nor `{}`), so {} could unwind \
                 through a probed call and crash it; use --args without --ret",
                missing.join("`, `"),
                path.unwinder,
                path.what
            );
        }
    }
    Ok(out)
}

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    let owner = if args.keep { 0 } else { std::process::id() };
    let mut k = kind::COUNT;
    if args.args {
        k |= kind::ARGS;
    }
    if args.ret {
        k |= kind::RET;
    }
    let what = Selection {
        funcs: args.funcs.clone(),
        addrs: args.addrs.clone(),
        kind: k,
        ring_len: args.ring_size,
        sample_budget: 0,
    };
    let attached = Attached::attach(args.pid, &what, owner)?;
    let n = attached.names().len();
    if attached.refused > 0 {
        eprintln!(
            "tp: {} of the matched functions cannot be probed and are skipped (`tp list-probes -p {}` says why)",
            attached.refused, args.pid
        );
    }
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
    let guard = super::guard::Restore::new(&attached);
    let mut tracer = if k != kind::COUNT { Some(Tracer::new(&attached, &args)?) } else { None };
    let why = observe(&attached, args.duration.map(Duration::from_secs_f64), tracer.as_mut());
    let d = guard.detach()?;
    match (d.target_gone, why) {
        (true, _) => eprintln!("tp: process {} exited; final counts:", args.pid),
        (false, End::Removed) => eprintln!("tp: the probes were removed by another tp; final counts:"),
        (false, _) => {
            eprintln!("tp: detached from {}, code restored (target stopped {} µs)", args.pid, d.stop_time.as_micros())
        }
    }
    match tracer {
        Some(mut t) => {
            t.poll(&attached)?;
            t.finish(&attached, &d.summary, args.json)?;
        }
        None => print_summary(&d.summary, args.json)?,
    }
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

/// Shows live counts (and drains events) until a signal, the duration, the
/// target's exit, or the probes' removal.
pub fn observe(attached: &Attached, duration: Option<Duration>, mut tracer: Option<&mut Tracer>) -> End {
    let mut live = Live::new(attached.pid, &attached.names());
    let tick = Duration::from_millis(20);
    let mut next_draw = Instant::now();
    let end = loop {
        crate::fault::point("observing");
        if interrupt::interrupted() {
            break End::Interrupted;
        }
        if duration.is_some_and(|d| live.elapsed() >= d) {
            break End::Duration;
        }
        if let Some(t) = tracer.as_deref_mut()
            && let Err(e) = live.suspend(|| t.poll(attached))
        {
            eprintln!("tp: reading events: {e:#}");
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
