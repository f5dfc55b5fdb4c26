//! `--steps`: calls stepped instruction by instruction, one at a time, in
//! a session whose probes are of kind [`kind::STEP`].
//!
//! The session arms the hand-over in the target's region for the calls it
//! wants ([`crate::probe::step_handoff`]); each tick it looks whether a thread
//! waits there, and if one does, starts a step worker (`tp step-worker`, a
//! process of its own: [`crate::process::single_step`]) on that thread and goes on
//! draining and counting. When the worker has written the trace, the
//! session frees the hand-over for the next call and keeps the call's
//! report: its instructions by source line and by address, named while the
//! process still runs. When the session ends, a worker still stepping is
//! told to stop (it lets the thread go cleanly) before the probes go.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use anyhow::{Context, Result};

use super::attached::Attached;
use crate::arch::{Arch, Host};
use crate::notes::Notes;
use crate::output::steps::{Place, SteppedCall, fold_path};
use crate::probe::layout::{self, StepHandoff, kind};
use crate::probe::step_handoff;
use crate::probe::trap::{self, TrapArea};
use crate::process::memory::Memory;
use crate::process::single_step::End;
use crate::process::single_step::{Job, Trace};
use crate::symbols::symbolize::Symbolizer;

/// Source lines the folded path shows at most.
const PATH_ITEMS: usize = 40;
/// How long a worker told to stop may take to let its thread go.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a call the in-target engine traces may take to see that tp
/// stops (its next instruction, unless it waits in a syscall).
const TRAP_STOP_WAIT: Duration = Duration::from_secs(1);

/// What `--steps` asks for beyond the calls to step (the selection's
/// `step_calls`, which the install arms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOptions {
    /// Instructions a stepped call records at most.
    pub limit: u64,
    /// How deep its calls are stepped (`--step-depth`); None: all.
    pub depth: Option<u32>,
    /// The calls trace themselves in the target (`--step-engine trap`,
    /// [`crate::probe::trap`]) instead of a step worker's ptrace.
    pub in_target: bool,
}

/// The worker stepping a call, and what it will say.
struct Worker {
    child: Child,
    answer: Receiver<(Vec<u8>, String)>,
    tid: i32,
}

/// The stepped calls of one program.
pub struct Stepping {
    opts: StepOptions,
    /// Calls still wanted.
    left: u32,
    worker: Option<Worker>,
    /// The stepped calls so far.
    pub calls: Vec<SteppedCall>,
    failures: u32,
    /// Names the instructions: made while the process runs, so that a
    /// trace that ends with the process is named too.
    sym: Symbolizer,
    /// The in-target engine's trace area, and the process's memory it is
    /// read through (`--step-engine trap`).
    trap: Option<(TrapArea, Memory)>,
    /// Where its notes go.
    notes: Arc<dyn Notes>,
}

/// Failed hand-overs after which a session stops trying.
const MAX_FAILURES: u32 = 3;

impl Stepping {
    /// Serves the calls of `attached`'s process whose hand-over the
    /// attach armed for the selection's `step_calls` calls; says what it
    /// steps to `notes`.
    pub fn start(attached: &Attached, opts: StepOptions, notes: Arc<dyn Notes>) -> Stepping {
        let sym = Symbolizer::new(attached.pid);
        let mut left = attached.selection().step_calls;
        let trap = opts.in_target.then(|| trap::area(&attached.region, opts.limit)).flatten();
        let trap = trap.zip(opts.in_target.then(|| Memory::open(attached.pid).ok()).flatten());
        if opts.in_target && trap.is_none() {
            left = 0;
        }
        Stepping { opts, left, worker: None, calls: Vec::new(), failures: 0, sym, trap, notes }
    }

    /// One tick of the in-target engine: a finished trace read, named and
    /// kept, and the hand-over freed for the next call.
    fn serve_in_target(&mut self, attached: &Attached) {
        let Some((area, mem)) = &self.trap else { return };
        if self.left == 0 {
            return;
        }
        let Some(done) = trap::finished(mem, *area) else { return };
        let _ = trap::reset(mem, *area);
        self.left = self.left.saturating_sub(1);
        let _ = step_handoff::done(&attached.region, self.left);
        let tid = global_tid(attached.pid, done.tid).unwrap_or(done.tid as i32);
        let job = job_for(attached, tid, 0, self.opts);
        let mut syscalls: HashMap<u64, bool> = HashMap::new();
        let mut syscall_at = |pc: u64| {
            *syscalls.entry(pc).or_insert_with(|| {
                mem.read_vec(pc, Host::syscall_insn().len()).is_ok_and(|b| b == Host::syscall_insn())
            })
        };
        let (mut pcs, in_tp) = job.traced(&done.raw, done.end == layout::trap::RETURNED, &mut syscall_at);
        let mut end = match done.end {
            layout::trap::RETURNED => End::Returned,
            layout::trap::LIMIT => End::Limit,
            layout::trap::SYSCALL => End::Masked(done.syscall as u64),
            _ => End::Stopped,
        };
        if pcs.len() as u64 > self.opts.limit {
            pcs.truncate(self.opts.limit as usize);
            end = End::Limit;
        }
        // The runtime's timestamps, in the session's clock fitted by now.
        let mut clock = attached.clock.clone();
        clock.refine();
        let trace = Trace {
            pcs,
            end,
            elapsed: Duration::from_nanos(clock.duration_ns(done.start, done.stop)),
            in_tp,
            free: Vec::new(),
            signals: 0,
            signal_time: Duration::ZERO,
        };
        self.keep(attached, tid, &trace);
    }

    /// Keeps the report of a stepped call of thread `tid`, and says so.
    fn keep(&mut self, attached: &Attached, tid: i32, trace: &Trace) {
        let call = report(&mut self.sym, tid, trace, attached, self.opts.depth);
        crate::note!(
            self.notes,
            "tp: stepped a call of {} in thread {}: {} instructions",
            crate::escape::text(&call.func),
            tid,
            crate::output::thousands(call.instructions)
        );
        self.calls.push(call);
    }

    /// One tick: collects a finished worker's trace, or starts a worker on
    /// a thread that waits at the hand-over.
    pub fn serve(&mut self, attached: &Attached) {
        if self.trap.is_some() {
            return self.serve_in_target(attached);
        }
        if let Some(w) = &mut self.worker {
            let Ok((out, err)) = w.answer.try_recv() else { return };
            let w = self.worker.take().expect("a worker");
            self.finish(attached, w, out, err);
            return;
        }
        if self.left == 0 {
            return;
        }
        let Some((ns_tid, arrival)) = step_handoff::waiting(&attached.region) else { return };
        let started = global_tid(attached.pid, ns_tid)
            .context("the waiting thread is not among the process's")
            .and_then(|tid| self.spawn(attached, tid, arrival));
        if let Err(e) = started {
            self.failed(attached, &format!("{e:#}"));
        }
    }

    fn spawn(&mut self, attached: &Attached, tid: i32, arrival: u32) -> Result<()> {
        let job = job_for(attached, tid, arrival, self.opts);
        let exe = std::env::current_exe().context("finding tp's own executable")?;
        let mut child = Command::new(exe)
            .arg("step-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Away from the terminal's signals: Ctrl-C reaches tp, which
            // tells the worker to let the thread go.
            .process_group(0)
            .spawn()
            .context("starting tp's step worker")?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let text = job.to_text(std::process::id() as i32);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
            drop(stdin);
            let mut out = Vec::new();
            let mut err = String::new();
            let _ = stdout.read_to_end(&mut out);
            let _ = stderr.take(4096).read_to_string(&mut err);
            let _ = tx.send((out, err));
        });
        crate::note!(self.notes, "tp: process {}: stepping a call in thread {tid}", attached.pid);
        self.worker = Some(Worker { child, answer: rx, tid });
        Ok(())
    }

    fn finish(&mut self, attached: &Attached, mut w: Worker, out: Vec<u8>, err: String) {
        let _ = w.child.wait();
        match Trace::read(&out, self.opts.limit) {
            Some(trace) => {
                self.left = self.left.saturating_sub(1);
                let _ = step_handoff::done(&attached.region, self.left);
                self.keep(attached, w.tid, &trace);
            }
            None => {
                let why = err.lines().last().unwrap_or("it ended without a trace").trim_start_matches("tp: ");
                self.failed(attached, why);
            }
        }
    }

    /// A hand-over that failed: the thread goes on; after a few, no more.
    fn failed(&mut self, attached: &Attached, why: &str) {
        self.failures += 1;
        let _ = step_handoff::answer(&attached.region);
        if self.failures >= MAX_FAILURES {
            self.left = 0;
        }
        let _ = step_handoff::done(&attached.region, self.left);
        crate::note!(
            self.notes,
            "tp: process {}: a call could not be stepped: {}{}",
            attached.pid,
            crate::escape::text(why),
            if self.left == 0 { "; no more calls are stepped" } else { "" }
        );
    }

    /// Ends stepping before the probes go: a worker still stepping lets
    /// its thread go (its trace is kept, cut short), and no call waits.
    pub fn stop(&mut self, attached: &Attached) {
        if let Some((area, mem)) = &self.trap {
            // A call traced now ends at its next instruction; one blocked
            // in a syscall keeps tp's memory until it comes back.
            let _ = step_handoff::disarm(&attached.region);
            let until = std::time::Instant::now() + TRAP_STOP_WAIT;
            while trap::tracing(mem, &attached.region).is_some() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
            if trap::finished(mem, *area).is_some() {
                self.left = self.left.max(1);
                self.serve_in_target(attached);
                let _ = step_handoff::disarm(&attached.region);
            }
            return;
        }
        if let Some(mut w) = self.worker.take() {
            // SAFETY: kill with a PID tp started and has not reaped.
            unsafe { libc::kill(w.child.id() as i32, libc::SIGTERM) };
            match w.answer.recv_timeout(STOP_WAIT) {
                Ok((out, err)) => self.finish(attached, w, out, err),
                Err(_) => {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                }
            }
        }
        let _ = step_handoff::disarm(&attached.region);
    }
}

/// The TID in tp's PID namespace of the thread of process `pid` that its
/// own namespace numbers `ns_tid` (`NSpid` in its status: the first is
/// tp's view where tp is in an ancestor namespace, the last its own).
fn global_tid(pid: i32, ns_tid: u32) -> Option<i32> {
    crate::process::threads(pid).ok()?.into_iter().map(|t| t.as_raw()).find(|&tid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
        crate::process::parse_status(&status).ns_pid as u32 == ns_tid
    })
}

/// The worker's job for thread `tid` of `attached`'s process, which
/// arrived at the hand-over as arrival `arrival`.
fn job_for(attached: &Attached, tid: i32, arrival: u32, opts: StepOptions) -> Job {
    let handled = attached.region.target_addr() + layout::STEP_OFF + std::mem::offset_of!(StepHandoff, handled) as u64;
    let mut entries = HashMap::new();
    let mut map = HashMap::new();
    let mut sites = Vec::new();
    for p in attached.installed().iter().filter(|p| p.request.kind & kind::STEP != 0) {
        let plan = &p.request.plan;
        // The jump to the detour at the site is tp's: a call that enters
        // the function there runs its first instructions as the copies.
        sites.push((plan.site, plan.site + plan.window.len() as u64));
        let Some(&(_, first)) = p.pc_map.iter().find(|(off, _)| *off == 0) else { continue };
        // A landing pad before the site ran before the detour: its
        // instructions are four bytes each (`endbr64`, `bti c`, `paciasp`).
        entries.insert(first, (plan.function..plan.site).step_by(4).collect());
        for &(off, at) in p.pc_map.iter().filter(|(off, _)| (*off as usize) < plan.window.len()) {
            map.insert(at, plan.site + off as u64);
        }
    }
    let h = attached.region.header();
    let code = h.arenas[..h.arena_count as usize].iter().map(|a| (a.addr, a.addr + a.size)).chain(sites).collect();
    Job {
        pid: attached.pid,
        tid,
        limit: opts.limit,
        handled: (handled, arrival),
        entries,
        map,
        code,
        depth: opts.depth,
    }
}

/// The report of one stepped call: its instructions named by function and
/// source line while the process still runs.
fn report(sym: &mut Symbolizer, tid: i32, trace: &Trace, attached: &Attached, depth: Option<u32>) -> SteppedCall {
    let first = trace.pcs.first().copied().unwrap_or(0);
    let (func, module) = match attached.installed().iter().find(|p| p.request.function.addr.0 == first) {
        Some(p) => (p.request.function.name.clone(), p.request.function.module.clone()),
        None => {
            let f = sym.frame(first, false);
            (f.short(), f.module.unwrap_or_default())
        }
    };
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for &pc in &trace.pcs {
        *counts.entry(pc).or_insert(0) += 1;
    }
    let mut line_of: HashMap<u64, String> = HashMap::new();
    for &pc in counts.keys() {
        line_of.insert(pc, sym.line(pc).unwrap_or_default());
    }
    let mut lines: Vec<(String, u64)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut path: Vec<String> = Vec::new();
    for pc in &trace.pcs {
        let line = &line_of[pc];
        if line.is_empty() {
            continue;
        }
        let i = *index.entry(line.clone()).or_insert_with(|| {
            lines.push((line.clone(), 0));
            lines.len() - 1
        });
        lines[i].1 += 1;
        if path.last() != Some(line) {
            path.push(line.clone());
        }
    }
    let mut hot: Vec<(u64, String, String, u64)> = Vec::with_capacity(counts.len());
    let mut names: HashMap<u64, (String, Place)> = HashMap::new();
    for (&pc, &n) in &counts {
        let f = sym.frame(pc, false);
        hot.push((pc, f.text(), line_of[&pc].clone(), n));
        let named = match (&f.function, f.offset) {
            (Some(name), 0) => (name.clone(), Place::Entry),
            (Some(name), _) => (name.clone(), Place::Body),
            // A stub is named by its module alone: its instructions are one.
            (None, _) => (format!("[{}]", f.module.as_deref().unwrap_or("?")), Place::Stub),
        };
        names.insert(pc, named);
    }
    hot.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(&b.0)));
    let by_path = crate::output::steps::call_paths(trace.pcs.iter().map(|pc| names[pc].clone()));
    // The calls that ran free, by the function called (one name for the
    // addresses of one function), in the order first called.
    let mut unstepped: Vec<(String, u64, u64)> = Vec::new();
    for f in &trace.free {
        let name = sym.frame(f.callee, false).short();
        let ns = f.time.as_nanos() as u64;
        match unstepped.iter_mut().find(|u| u.0 == name) {
            Some(u) => {
                u.1 += f.calls;
                u.2 += ns;
            }
            None => unstepped.push((name, f.calls, ns)),
        }
    }
    SteppedCall {
        func,
        module,
        tid,
        instructions: trace.pcs.len() as u64,
        micros: trace.elapsed.as_micros() as u64,
        end: trace.end.word().replace(':', " "),
        in_tp: trace.in_tp,
        path: fold_path(&path, PATH_ITEMS),
        lines,
        hot,
        by_path,
        depth,
        unstepped,
        signals: trace.signals,
        signal_ns: trace.signal_time.as_nanos() as u64,
    }
}
