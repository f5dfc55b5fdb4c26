//! Stopping threads of a process, up to all of them ("stop the world"), and
//! letting go again.
//!
//! [`Stopped::stop_all`] seizes each thread with PTRACE_SEIZE (with
//! PTRACE_O_TRACECLONE, so threads cloned meanwhile are attached by the
//! kernel), interrupts it, and waits for its stop; it re-lists
//! `/proc/PID/task` until a pass finds no new thread.
//! [`Stopped::seize_worker`] seizes just one thread without stopping it:
//! from then on no other tracer (no other tp) can take the process.
//! [`Stopped::hold_worker`] stops that thread for work that needs no more
//! (remote syscalls), and [`Stopped::let_worker_run`] lets it run again,
//! still seized, while tp writes into memory nothing uses yet; signals that
//! arrive for it meanwhile are passed on by [`Stopped::serve`]. So the
//! whole process is stopped only for the patch, and the worker only for its
//! syscalls. Dropping the [`Stopped`] value detaches every thread, on every
//! path, errors included, so no error can leave the target stopped.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use nix::unistd::Pid;

use super::ProcessError;
use super::memory::Memory;
use super::ptrace::{self, Wait};
use super::regset;
use crate::arch::{Arch, BlockedIn, Host};
use crate::notes::Notes;

/// How long tp waits for another tp to let go of the target.
const ANOTHER_TP_PATIENCE: Duration = Duration::from_secs(5);

/// How often [`Stopped::serve`] looks for a signal the worker waits with.
const SERVE_EVERY: Duration = Duration::from_micros(200);

/// How many times a signal may interrupt one thread's stop before tp gives up.
const MAX_SIGNALS_WHILE_STOPPING: u32 = 1000;

/// One stopped thread.
#[derive(Debug, Clone)]
pub struct StoppedThread {
    /// Its thread ID.
    pub tid: Pid,
    /// False while the thread runs: between PTRACE_SEIZE and the observed
    /// stop, and while the worker runs seized ([`Stopped::let_worker_run`]).
    confirmed: bool,
    /// Signals that arrived while tp worked with the thread, to deliver on release.
    deferred: Vec<i32>,
    /// The syscall it was blocked in just before the interrupt, where the
    /// architecture needs it to restart a wait the stop interrupted
    /// ([`Arch::RESTART_NEEDS_BLOCKED_IN`]).
    blocked_in: Option<BlockedIn>,
    /// Its registers before tp made it restart such a wait itself: put back
    /// on release if a signal handler is to run first (then the program
    /// gets its EINTR, as the kernel's ERESTARTNOHAND would give it).
    unrestarted: Option<<Host as Arch>::Regs>,
}

/// Threads of a process, stopped under ptrace. Dropping it resumes them.
#[derive(Debug)]
pub struct Stopped {
    pid: i32,
    threads: BTreeMap<i32, StoppedThread>,
    worker: Option<Pid>,
    world_stopped_at: Option<Instant>,
    world_stop: Duration,
    /// When the current hold (some thread stopped by tp) began, while one lasts.
    held_since: Option<Instant>,
    /// How long some thread was stopped by tp, over every hold so far.
    held: Duration,
    /// When the worker, running seized, was last seen running.
    seen_running_at: Option<Instant>,
    /// Kill the process rather than let it run, unless [`Stopped::resume`]
    /// lets go: a program `tp run` holds at its entry never runs half set up.
    kill_on_drop: bool,
    /// Keep the worker stopped until [`Stopped::resume`], instead of letting
    /// it run between tp's steps ([`Stopped::let_worker_run`]).
    keep_held: bool,
    /// Where the warnings of a thread tp cannot let go are said.
    notes: Arc<dyn Notes>,
}

impl Stopped {
    /// Seizes and interrupts every thread of `pid` and waits until all are
    /// stopped. Warnings as tp lets them go are said to `notes`.
    pub fn stop(pid: i32, notes: Arc<dyn Notes>) -> Result<Stopped> {
        let mut stopped = Stopped::none(pid, notes);
        stopped.stop_all()?;
        Ok(stopped)
    }

    /// A process whose main thread this tp traces already and holds in a
    /// stop (a program `tp run` started, held at its entry point): that
    /// thread is the worker, and [`Stopped::stop_all`] seizes the others.
    pub fn adopt(pid: i32, notes: Arc<dyn Notes>) -> Stopped {
        let mut stopped = Stopped::none(pid, notes);
        let tid = Pid::from_raw(pid);
        stopped.threads.insert(
            pid,
            StoppedThread { tid, confirmed: true, deferred: Vec::new(), blocked_in: None, unrestarted: None },
        );
        stopped.worker = Some(tid);
        stopped.kill_on_drop = true;
        stopped.held_since = Some(Instant::now());
        stopped
    }

    fn none(pid: i32, notes: Arc<dyn Notes>) -> Stopped {
        crate::fault::set_target(pid);
        Stopped {
            pid,
            threads: BTreeMap::new(),
            worker: None,
            world_stopped_at: None,
            world_stop: Duration::ZERO,
            held_since: None,
            held: Duration::ZERO,
            seen_running_at: None,
            kill_on_drop: false,
            keep_held: false,
            notes,
        }
    }

    /// Seizes one thread of `pid`, the one that will make remote syscalls
    /// (the main thread, unless it has exited), without stopping it: it
    /// runs on until [`Stopped::hold_worker`] or [`Stopped::stop_all`]
    /// stops it, and meanwhile no other tracer can take the process.
    pub fn seize_worker(pid: i32, notes: Arc<dyn Notes>) -> Result<Stopped> {
        let mut stopped = Stopped::none(pid, notes);
        let candidates = stopped.candidates().map_err(|_| ProcessError::NoSuchProcess(pid))?;
        for tid in candidates {
            // Without PTRACE_O_TRACECLONE while it runs: a thread it starts
            // is not tp's to stop until stop_all finds it.
            if stopped.seize(tid, 0)? {
                stopped.worker = Some(tid);
                stopped.seen_running_at = Some(Instant::now());
                return Ok(stopped);
            }
        }
        bail!(ProcessError::Exited(pid))
    }

    /// Seizes and stops the main thread of `pid` (a process that has just
    /// exec'd) and keeps it stopped until [`Stopped::resume`]: it does not
    /// run between the steps of an attach, as a program `tp run` holds at
    /// its entry does not; on an error it runs on, untouched.
    pub fn hold_new(pid: i32, notes: Arc<dyn Notes>) -> Result<Stopped> {
        let mut stopped = Stopped::seize_worker(pid, notes)?;
        stopped.hold_worker()?;
        stopped.keep_held = true;
        Ok(stopped)
    }

    /// The threads of the process tp does not hold, alive, the main thread
    /// first.
    fn candidates(&self) -> Result<Vec<Pid>> {
        let pid = self.pid;
        let mut tids: Vec<Pid> = super::threads(pid)?
            .into_iter()
            .filter(|t| !self.threads.contains_key(&t.as_raw()) && !thread_is_dead(pid, *t))
            .collect();
        tids.sort_by_key(|t| (t.as_raw() != pid, t.as_raw()));
        Ok(tids)
    }

    /// True if tp holds `tid` stopped.
    fn is_stopped(&self, tid: Pid) -> bool {
        self.threads.get(&tid.as_raw()).is_some_and(|t| t.confirmed)
    }

    /// Stops the worker if it is not stopped already and returns it: the
    /// thread [`Stopped::seize_worker`] seized, or, if that one has exited,
    /// another (the process may have been taken by another tracer in
    /// between: `Stopped::seize` waits for another tp to let go). With
    /// every thread stopped already, the main thread.
    pub fn hold_worker(&mut self) -> Result<Pid> {
        if let Some(w) = self.worker.filter(|&w| self.is_stopped(w)) {
            return Ok(w);
        }
        if let Some(t) = self.stopped_main_or_first() {
            self.worker = Some(t);
            return Ok(t);
        }
        self.begin_hold()?;
        if let Some(w) = self.worker.filter(|&w| self.is_stopped(w)) {
            // A stop of the whole process (SIGSTOP) came for it meanwhile.
            return Ok(w);
        }
        if let Some(w) = self.worker.filter(|w| self.threads.contains_key(&w.as_raw()))
            && self.stop_one(w)?
        {
            let _ = ptrace::set_options(w, libc::PTRACE_O_TRACECLONE);
            return Ok(w);
        }
        // The worker has exited: another thread.
        for tid in self.candidates().map_err(|_| ProcessError::Exited(self.pid))? {
            if self.seize(tid, libc::PTRACE_O_TRACECLONE)? && self.stop_one(tid)? {
                self.worker = Some(tid);
                return Ok(tid);
            }
        }
        bail!(ProcessError::Exited(self.pid))
    }

    /// Interrupts seized thread `tid` and waits for its stop; false if it
    /// is gone.
    fn stop_one(&mut self, tid: Pid) -> Result<bool> {
        self.note_blocked_in(tid);
        let _ = ptrace::interrupt(tid);
        let mut cloned = Vec::new();
        self.settle(tid, &mut cloned)?;
        self.settle_cloned(cloned)?;
        Ok(self.is_stopped(tid))
    }

    /// The main thread if tp holds it stopped, else the stopped thread with
    /// the lowest TID.
    fn stopped_main_or_first(&self) -> Option<Pid> {
        match self.threads.get(&self.pid) {
            Some(t) if t.confirmed => Some(t.tid),
            _ => self.threads.values().find(|t| t.confirmed).map(|t| t.tid),
        }
    }

    /// Lets every thread run again, the worker still seized, so that no
    /// other tracer takes the process until [`Stopped::hold_worker`] or
    /// [`Stopped::stop_all`] stops it again; signals that arrive for it
    /// meanwhile are passed on by [`Stopped::serve`]. Signals deferred
    /// while tp held a thread are delivered now. A program held at its
    /// entry ([`Stopped::adopt`]) stays held.
    pub fn let_worker_run(&mut self) {
        if self.kill_on_drop || self.keep_held {
            return;
        }
        let Some(worker) = self.worker.filter(|&w| self.is_stopped(w)).or_else(|| self.stopped_main_or_first()) else {
            return;
        };
        self.worker = Some(worker);
        let others: Vec<StoppedThread> = self.threads.values().filter(|t| t.tid != worker).cloned().collect();
        self.threads.retain(|_, t| t.tid == worker);
        release_threads(&*self.notes, self.pid, &others);
        self.end_world_stop();
        if let Some(t) = self.threads.get_mut(&worker.as_raw()) {
            let _ = ptrace::set_options(worker, 0);
            let (first, rest) = hand_back(self.pid, t);
            if let Err(e) = ptrace::cont(worker, first)
                && !ptrace::is_gone(&e)
            {
                crate::note!(self.notes, "tp: warning: cannot let thread {worker} run: {e}");
            }
            resend(self.pid, worker, &rest);
            *t = StoppedThread {
                tid: worker,
                confirmed: false,
                deferred: Vec::new(),
                blocked_in: None,
                unrestarted: None,
            };
        }
        self.end_hold();
        self.seen_running_at = Some(Instant::now());
    }

    /// Passes on what happened to the worker while it ran seized
    /// ([`Stopped::let_worker_run`]): a signal is delivered at once (the
    /// thread waited for tp in its signal-delivery stop, counted as held
    /// since it was last seen running); a stop of the whole process
    /// (SIGSTOP) leaves it held; a thread that has exited is forgotten.
    /// Call it often while the worker runs: it looks at most every
    /// `SERVE_EVERY`.
    pub fn serve(&mut self) -> Result<()> {
        match self.seen_running_at {
            Some(at) if at.elapsed() < SERVE_EVERY => Ok(()),
            _ => self.serve_now(),
        }
    }

    /// [`Stopped::serve`] now.
    fn serve_now(&mut self) -> Result<()> {
        let Some(w) = self.worker.filter(|w| self.threads.get(&w.as_raw()).is_some_and(|t| !t.confirmed)) else {
            return Ok(());
        };
        let since = self.seen_running_at.unwrap_or_else(Instant::now);
        let mut waited = false;
        // (A storm of signals is passed on at the next call.)
        for _ in 0..MAX_SIGNALS_WHILE_STOPPING {
            match ptrace::try_wait(w)? {
                None => break,
                Some(Wait::Gone) => {
                    self.threads.remove(&w.as_raw());
                    break;
                }
                Some(Wait::Signal(sig)) => {
                    waited = true;
                    match ptrace::cont(w, sig) {
                        Err(e) if !ptrace::is_gone(&e) => return Err(e.into()),
                        _ => {}
                    }
                }
                Some(Wait::Event { event: ptrace::EVENT_STOP, .. }) => {
                    self.held_since.get_or_insert(since);
                    if let Some(t) = self.threads.get_mut(&w.as_raw()) {
                        t.confirmed = true;
                    }
                    let _ = ptrace::set_options(w, libc::PTRACE_O_TRACECLONE);
                    return Ok(());
                }
                Some(Wait::Event { .. }) => {
                    waited = true;
                    match ptrace::cont(w, 0) {
                        Err(e) if !ptrace::is_gone(&e) => return Err(e.into()),
                        _ => {}
                    }
                }
            }
        }
        let now = Instant::now();
        if waited {
            self.held += now - since;
        }
        self.seen_running_at = Some(now);
        Ok(())
    }

    /// Stops every thread not stopped yet (the worker too, if it runs
    /// seized), until a pass over `/proc/PID/task` finds no new thread.
    pub fn stop_all(&mut self) -> Result<()> {
        let pid = self.pid;
        self.begin_hold()?;
        // Seized threads that run (the worker): stopped with the first pass.
        let mut running: Vec<Pid> = self.threads.values().filter(|t| !t.confirmed).map(|t| t.tid).collect();
        let reset_options = running.clone();
        loop {
            let tids = match super::threads(pid) {
                Ok(t) => t,
                Err(_) if !self.threads.is_empty() => bail!(ProcessError::Exited(pid)),
                Err(_) => bail!(ProcessError::NoSuchProcess(pid)),
            };
            let mut new: Vec<Pid> = tids
                .into_iter()
                .filter(|t| !self.threads.contains_key(&t.as_raw()))
                .filter(|t| !thread_is_dead(pid, *t))
                .collect();
            // The main thread first, as seize_worker does: of two tp processes
            // that stop one target, the one holding it holds the target, and
            // the other waits holding nothing.
            new.sort_by_key(|t| (t.as_raw() != pid, t.as_raw()));
            if new.is_empty() && running.is_empty() {
                break;
            }
            let mut seized = std::mem::take(&mut running);
            for tid in new {
                if self.seize(tid, libc::PTRACE_O_TRACECLONE)? {
                    seized.push(tid);
                }
            }
            self.world_stopped_at.get_or_insert_with(Instant::now);
            for &tid in &seized {
                self.note_blocked_in(tid);
            }
            for &tid in &seized {
                // A thread that vanished between seize and interrupt shows up in wait.
                let _ = ptrace::interrupt(tid);
            }
            let mut cloned = Vec::new();
            for tid in seized {
                self.settle(tid, &mut cloned)?;
            }
            self.settle_cloned(cloned)?;
        }
        for tid in reset_options.into_iter().filter(|&t| self.is_stopped(t)) {
            let _ = ptrace::set_options(tid, libc::PTRACE_O_TRACECLONE);
        }
        if self.threads.is_empty() {
            bail!(ProcessError::Exited(pid));
        }
        self.world_stopped_at.get_or_insert_with(Instant::now);
        crate::fault::point("after-seize");
        Ok(())
    }

    /// Remembers the syscall `tid` is blocked in, where the architecture
    /// needs it ([`Arch::RESTART_NEEDS_BLOCKED_IN`]); call it right before
    /// the interrupt.
    fn note_blocked_in(&mut self, tid: Pid) {
        if !Host::RESTART_NEEDS_BLOCKED_IN {
            return;
        }
        let blocked = super::blocked_in(self.pid, tid.as_raw());
        if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
            t.blocked_in = blocked;
        }
    }

    /// PTRACE_SEIZE; false if the thread is gone. Another tp holds a target
    /// for milliseconds at a time, so while the tracer is a tp, seizing is
    /// retried for up to [`ANOTHER_TP_PATIENCE`]; any other tracer is an error.
    fn seize(&mut self, tid: Pid, options: i32) -> Result<bool> {
        let deadline = Instant::now() + ANOTHER_TP_PATIENCE;
        loop {
            match self.seize_once(tid, options) {
                Err(e) if Instant::now() < deadline && held_by_another_tp(&e) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }

    fn seize_once(&mut self, tid: Pid, options: i32) -> Result<bool> {
        let pid = self.pid;
        match ptrace::seize(tid, options) {
            Ok(()) => {
                // Held from here on, so that an error below still detaches it.
                self.threads.insert(
                    tid.as_raw(),
                    StoppedThread { tid, confirmed: false, deferred: Vec::new(), blocked_in: None, unrestarted: None },
                );
                Ok(true)
            }
            Err(e) if ptrace::is_gone(&e) => Ok(false),
            // A thread that is exiting (its exit_state set) answers EPERM too.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && thread_is_dead(pid, tid) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                // EPERM: not allowed, or another tracer holds the thread. One
                // that let go since gets one more try.
                let st = super::status(pid)?;
                if st.tracer_pid == 0 && ptrace::seize(tid, options).is_ok() {
                    self.threads.insert(
                        tid.as_raw(),
                        StoppedThread {
                            tid,
                            confirmed: false,
                            deferred: Vec::new(),
                            blocked_in: None,
                            unrestarted: None,
                        },
                    );
                    return Ok(true);
                }
                if st.tracer_pid != 0 && st.tracer_pid != std::process::id() as i32 {
                    let tracer_name = super::status(st.tracer_pid).map(|s| s.name).unwrap_or_else(|_| "?".into());
                    bail!(ProcessError::AlreadyTraced { pid, tracer: st.tracer_pid, tracer_name });
                }
                bail!(ProcessError::PermissionDenied(pid));
            }
            Err(e) => bail!("PTRACE_SEIZE of thread {tid} failed: {e}"),
        }
    }

    /// Threads cloned by a thread seized but not yet stopped were attached by
    /// the kernel (TRACECLONE) and start in a stop of their own.
    fn settle_cloned(&mut self, mut cloned: Vec<Pid>) -> Result<()> {
        while let Some(tid) = cloned.pop() {
            if self.threads.get(&tid.as_raw()).is_some_and(|t| t.confirmed) {
                continue;
            }
            self.settle(tid, &mut cloned)?;
        }
        Ok(())
    }

    /// Waits for `tid` to stop and records it as stopped, or forgets it if it is gone.
    fn settle(&mut self, tid: Pid, cloned: &mut Vec<Pid>) -> Result<()> {
        if self.wait_for_stop(tid, cloned)? {
            if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
                t.confirmed = true;
            }
        } else {
            self.threads.remove(&tid.as_raw());
        }
        Ok(())
    }

    /// Waits until `tid` is in a stop tp may work with; false if it is gone.
    fn wait_for_stop(&mut self, tid: Pid, cloned: &mut Vec<Pid>) -> Result<bool> {
        let mut signals = 0;
        loop {
            match ptrace::wait(tid)? {
                Wait::Gone => return Ok(false),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => {
                    let blocked = self.threads.get_mut(&tid.as_raw()).and_then(|t| t.blocked_in.take());
                    let before = restart_interrupted_wait(self.pid, tid, blocked);
                    if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
                        t.unrestarted = before;
                    }
                    return Ok(true);
                }
                Wait::Event { event: ptrace::EVENT_CLONE, .. } => {
                    if let Ok(child) = ptrace::event_msg(tid) {
                        let child = Pid::from_raw(child as i32);
                        self.threads.entry(child.as_raw()).or_insert(StoppedThread {
                            tid: child,
                            confirmed: false,
                            deferred: Vec::new(),
                            blocked_in: None,
                            unrestarted: None,
                        });
                        cloned.push(child);
                    }
                    resume_and_reinterrupt(tid, 0)?;
                }
                Wait::Event { .. } => resume_and_reinterrupt(tid, 0)?,
                Wait::Signal(sig) => {
                    // A signal arrived before our interrupt: deliver it unchanged
                    // and stop again right after.
                    signals += 1;
                    if signals > MAX_SIGNALS_WHILE_STOPPING {
                        bail!("thread {tid} keeps receiving signals; cannot stop it");
                    }
                    resume_and_reinterrupt(tid, sig)?;
                }
            }
        }
    }

    /// Where warnings about the process are said, as the caller said.
    pub fn notes(&self) -> &dyn Notes {
        &*self.notes
    }

    /// The PID of the process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The stopped threads, in TID order.
    pub fn threads(&self) -> impl Iterator<Item = &StoppedThread> {
        self.threads.values().filter(|t| t.confirmed)
    }

    /// The thread to use for remote syscalls: the worker if it is stopped
    /// ([`Stopped::hold_worker`]), else the main thread if it is stopped,
    /// else the stopped thread with the lowest TID.
    pub fn worker(&self) -> Pid {
        self.worker
            .filter(|&w| self.is_stopped(w))
            .or_else(|| self.stopped_main_or_first())
            .expect("at least one stopped thread")
    }

    /// Remembers a signal that arrived for `tid` while tp held it; it is
    /// delivered when the thread is released.
    pub fn defer_signal(&mut self, tid: Pid, sig: i32) {
        if let Some(t) = self.threads.get_mut(&tid.as_raw()) {
            t.deferred.push(sig);
        }
    }

    /// Runs stopped thread `tid` one instruction at a time while its PC is
    /// in the code `inside` says is tp's, at most `limit` instructions and
    /// until `deadline`, and returns whether it left. A detour ends with a
    /// jump back to its function, so a thread caught in one leaves it in a
    /// few steps (in tp's runtime, in more). It is not stepped where it could block: a
    /// thread that will restart an interrupted syscall, or one before a
    /// syscall instruction (tp's runtime waits in futexes). Signals that
    /// come meanwhile are kept for its release.
    pub fn step_out(
        &mut self,
        tid: Pid,
        mem: &Memory,
        inside: &dyn Fn(u64) -> bool,
        limit: u32,
        deadline: Instant,
    ) -> Result<bool> {
        if !self.is_stopped(tid) {
            return Ok(false);
        }
        let syscall = Host::syscall_insn();
        for _ in 0..limit {
            let regs = regset::get_regs(tid)?;
            let pc = Host::pc(&regs);
            if !inside(pc) {
                return Ok(true);
            }
            if Host::restart_pc(&regs).is_some()
                || mem.read_vec(pc, syscall.len()).map_or(true, |b| b == syscall)
                || Instant::now() >= deadline
            {
                return Ok(false);
            }
            ptrace::step(tid, 0)?;
            match ptrace::wait(tid)? {
                Wait::Gone => bail!(ProcessError::Exited(self.pid)),
                Wait::Signal(libc::SIGTRAP) | Wait::Event { .. } => {}
                // Delivered when the thread is let go; the step is taken again.
                Wait::Signal(sig) => self.defer_signal(tid, sig),
            }
        }
        Ok(false)
    }

    /// Lets every thread but the worker run again; returns how long all
    /// threads were stopped (over every stop of them so far).
    pub fn release_all_but_worker(&mut self) -> Duration {
        let worker = self.worker();
        self.worker = Some(worker);
        let others: Vec<StoppedThread> = self.threads.values().filter(|t| t.tid != worker).cloned().collect();
        self.threads.retain(|_, t| t.tid == worker);
        release_threads(&*self.notes, self.pid, &others);
        self.end_world_stop();
        self.world_stop
    }

    /// Detaches from every thread; returns how long tp stopped them (over
    /// every stop of them).
    pub fn resume(mut self) -> Holds {
        self.kill_on_drop = false;
        self.release();
        Holds { world: self.world_stop, any: self.held }
    }

    fn release(&mut self) {
        let threads: Vec<StoppedThread> = std::mem::take(&mut self.threads).into_values().collect();
        release_threads(&*self.notes, self.pid, &threads);
        self.end_world_stop();
        self.end_hold();
    }

    fn end_world_stop(&mut self) {
        if let Some(at) = self.world_stopped_at.take() {
            self.world_stop += at.elapsed();
        }
    }

    /// Starts a hold if none lasts. The worker, if it runs seized, is
    /// served first ([`Stopped::serve_now`]): a signal it waited with counts.
    fn begin_hold(&mut self) -> Result<()> {
        self.serve_now()?;
        self.held_since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Ends the current hold if no thread is stopped any more.
    fn end_hold(&mut self) {
        if !self.threads.values().any(|t| t.confirmed)
            && let Some(at) = self.held_since.take()
        {
            self.held += at.elapsed();
        }
    }
}

/// How long tp stopped a process's threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Holds {
    /// All of them at once.
    pub world: Duration,
    /// Any of them: the sum of every interval in which some thread could
    /// not run because of tp (the worker's remote syscalls, signals it
    /// waited with for tp to pass them on, the stops of every thread).
    pub any: Duration,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.kill_on_drop {
            // SAFETY: kill(2) with plain integers; the process is stopped under us.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        self.release();
    }
}

fn release_threads(notes: &dyn Notes, pid: i32, threads: &[StoppedThread]) {
    for t in threads {
        if !t.confirmed {
            // Seized but running (never seen stopped, or the worker let
            // run): PTRACE_DETACH needs a stopped tracee, so stop it before
            // letting go.
            match ptrace::interrupt(t.tid) {
                Ok(()) => match ptrace::wait(t.tid) {
                    Ok(Wait::Signal(sig)) => drop(ptrace::detach(t.tid, sig)),
                    Ok(Wait::Event { .. }) => drop(ptrace::detach(t.tid, 0)),
                    Ok(Wait::Gone) | Err(_) => {}
                },
                // A traced thread that exited waits for its tracer to reap it.
                Err(_) => drop(ptrace::try_wait(t.tid)),
            }
            continue;
        }
        let (first, rest) = hand_back(pid, t);
        // The first deferred signal goes with the detach (the thread sits in a
        // signal-delivery stop after tp's single-steps); any others are re-sent.
        if let Err(e) = ptrace::detach(t.tid, first)
            && !ptrace::is_gone(&e)
        {
            crate::note!(notes, "tp: warning: cannot detach from thread {}: {e}", t.tid);
        }
        resend(pid, t.tid, &rest);
    }
}

/// Gets a stopped thread ready to run again: a wait tp restarted itself is
/// left interrupted after all if a signal handler runs first (a signal came
/// while tp held the thread). Returns the first deferred signal, to deliver
/// as the thread resumes, and the others, to send again after.
fn hand_back(pid: i32, t: &StoppedThread) -> (i32, Vec<i32>) {
    if let Some(before) = &t.unrestarted
        && super::handler_pending(pid, t.tid.as_raw(), &t.deferred)
    {
        let _ = regset::set_regs(t.tid, before);
    }
    let first = t.deferred.first().copied().unwrap_or(0);
    (first, t.deferred.iter().skip(1).copied().collect())
}

/// Sends `signals` to thread `tid` again.
fn resend(pid: i32, tid: Pid, signals: &[i32]) {
    for &sig in signals {
        // SAFETY: tgkill with plain integer arguments.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid.as_raw(), sig) };
    }
}

/// Our interrupt woke a thread out of a wait that would now return EINTR
/// (epoll_wait): make the kernel restart it instead, unless a signal handler
/// runs first. Best effort: a thread that vanished needs nothing. Returns
/// the registers before, where tp (not the kernel) restarts the wait: see
/// [`StoppedThread::unrestarted`].
pub(crate) fn restart_interrupted_wait(pid: i32, tid: Pid, blocked: Option<BlockedIn>) -> Option<<Host as Arch>::Regs> {
    let before = regset::get_regs(tid).ok()?;
    let mut regs = before;
    let handler_pending = blocked.is_some() && super::handler_pending(pid, tid.as_raw(), &[]);
    if Host::restart_interrupted_wait(&mut regs, blocked.as_ref(), handler_pending) {
        let _ = regset::set_regs(tid, &regs);
        return blocked.map(|_| before);
    }
    None
}

fn resume_and_reinterrupt(tid: Pid, sig: i32) -> io::Result<()> {
    match ptrace::cont(tid, sig) {
        Ok(()) => {}
        Err(e) if ptrace::is_gone(&e) => return Ok(()),
        Err(e) => return Err(e),
    }
    match ptrace::interrupt(tid) {
        Err(e) if !ptrace::is_gone(&e) => Err(e),
        _ => Ok(()),
    }
}

/// True if `e` says another tp process traces the target.
fn held_by_another_tp(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<ProcessError>(), Some(ProcessError::AlreadyTraced { tracer_name, .. }) if tracer_name == "tp")
}

/// True if the thread has exited (state Z or X) but is still listed,
/// as a thread-group leader that called pthread_exit is.
fn thread_is_dead(pid: i32, tid: Pid) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else { return true };
    // The state follows the command name, which is in parentheses and may contain any byte.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z') | Some('X'))
}
