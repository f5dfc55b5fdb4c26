//! Stepping one call of one thread with ptrace: every instruction the call
//! executes, from its function's first instruction to its return,
//! including the functions it calls.
//!
//! The thread waits in tp's runtime (runtime.c, tp_step) when tp takes it:
//! tp seizes that one thread (the others run on), answers the hand-over
//! through the target's memory, and single-steps it out of the runtime and
//! through the detour until it reaches the relocated copy of the function's
//! first instruction; from there each stop is one instruction of the call.
//! An instruction executed in a detour's copy of a function's first
//! instructions counts as that instruction ([`Job::map`]); tp's own code
//! is stepped through and not counted. The call ends when the stack shows
//! it left ([`Arch::call_left`]), or at the limit of steps, or at a
//! syscall that does not finish within [`SYSCALL_WAIT`] (the thread is
//! let go there and the syscall restarts as the kernel restarts it after a
//! signal), or when tp is told to stop ([`stop_requested`]). Whatever
//! ends it, the thread is detached, which clears the trap flag; the
//! stepping runs in a process of its own (`tp step-worker`), so that a
//! tp killed meanwhile never leaves the thread with the flag set.
//!
//! Some of the call runs free, not stepped (`Stepper::run_free`: a
//! hardware breakpoint where it comes back, [`Arch::set_exec_breakpoint`],
//! and PTRACE_CONT): a call deeper than [`Job::depth`] allows, until it
//! returns; and a signal's handler, from the signal's stop until the
//! thread is back where the signal found it. The instruction a signal
//! interrupted is recorded once, when it runs. The breakpoint is cleared
//! before the thread is let go, whatever ends the trace.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::memory::Memory;
use super::ptrace::{self, Wait};
use super::regset;
use crate::arch::{Arch, Host};

/// How long a syscall stepped over may take before tp lets the thread go.
pub const SYSCALL_WAIT: Duration = Duration::from_millis(100);
/// Steps from the hand-over to the function's first instruction, at most
/// (the runtime's return and the detour's: a few hundred).
const MAX_APPROACH: u64 = 100_000;

/// What to step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    /// The process.
    pub pid: i32,
    /// The thread, as tp's PID namespace numbers it.
    pub tid: i32,
    /// Instructions to record at most; then the call runs free.
    pub limit: u64,
    /// Where tp answers the hand-over: the address of its `handled` word in
    /// the target, and the arrival to write there.
    pub handled: (u64, u32),
    /// The detour addresses where a stepped call begins (the copy of its
    /// function's first instruction), each with the addresses of the
    /// instructions that ran before the detour (a landing pad: `endbr64`,
    /// `bti c`), the function's first.
    pub entries: HashMap<u64, Vec<u64>>,
    /// Each instruction a detour copied, by its address there: the
    /// original's address.
    pub map: HashMap<u64, u64>,
    /// tp's code in the target, as `[lo, hi)` (its arenas, and the jumps
    /// to the detours at the probes' sites): a step there that
    /// [`Job::map`] does not name is tp's own.
    pub code: Vec<(u64, u64)>,
    /// How deep the calls the stepped call makes are stepped (0: none of
    /// them); a call that would go deeper runs free until it returns.
    /// None: every call is stepped.
    pub depth: Option<u32>,
}

/// Why a stepped call's trace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The call returned (or unwound past its frame).
    Returned,
    /// The limit of steps was reached; the call ran on free.
    Limit,
    /// The thread blocked in a syscall (its number) and was let go there.
    Syscall(u64),
    /// The in-target engine reached a syscall (its number) that could
    /// block SIGTRAP or replace tp's handler, and let the call run on free.
    Masked(u64),
    /// The thread reached an instruction single steps cannot pass (an
    /// exclusive load: [`Arch::stepping_stalls`]) and was let go there.
    Stall,
    /// The thread or its process exited.
    Exited,
    /// The thread was not at the hand-over any more when tp took it.
    Missed,
    /// tp was told to stop.
    Stopped,
}

impl End {
    /// The end as a word (JSON, the worker's answer).
    pub fn word(self) -> String {
        match self {
            End::Returned => "returned".into(),
            End::Limit => "limit".into(),
            End::Syscall(nr) => format!("syscall:{nr}"),
            End::Masked(nr) => format!("masked:{nr}"),
            End::Exited => "exited".into(),
            End::Missed => "missed".into(),
            End::Stopped => "stopped".into(),
            End::Stall => "stall".into(),
        }
    }

    /// [`End::word`] read back.
    pub fn from_word(w: &str) -> Option<End> {
        Some(match w {
            "returned" => End::Returned,
            "limit" => End::Limit,
            "exited" => End::Exited,
            "missed" => End::Missed,
            "stopped" => End::Stopped,
            "stall" => End::Stall,
            _ if w.starts_with("masked:") => End::Masked(w.strip_prefix("masked:")?.parse().ok()?),
            _ => End::Syscall(w.strip_prefix("syscall:")?.parse().ok()?),
        })
    }
}

/// One stepped call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The addresses of the instructions it executed, in order (each the
    /// original's, for one a detour executed as a copy).
    pub pcs: Vec<u64>,
    /// Why the trace ended.
    pub end: End,
    /// From its first instruction to its end.
    pub elapsed: Duration,
    /// Steps through tp's own code during the call (other probes' detours).
    pub in_tp: u64,
    /// The calls that ran free, deeper than [`Job::depth`], by the address
    /// called: how many and their time.
    pub free: Vec<Free>,
    /// Signals delivered during the call (their handlers ran free).
    pub signals: u64,
    /// The time from their stops until the thread was back where each
    /// signal found it.
    pub signal_time: Duration,
}

/// Calls to one address that ran free ([`Job::depth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Free {
    /// The address called (the callee's first instruction).
    pub callee: u64,
    /// How many calls.
    pub calls: u64,
    /// Their time, from the callee's first instruction to the return.
    pub time: Duration,
}

impl Job {
    /// True if `pc` is in tp's code ([`Job::code`]).
    fn in_tp(&self, pc: u64) -> bool {
        self.code.iter().any(|&(lo, hi)| lo <= pc && pc < hi)
    }

    /// The instructions of a call the in-target engine traced, from every
    /// address it recorded (`raw`, tp's own included, from the runtime on):
    /// from the function's first instruction, each copy a detour executed
    /// as the original, tp's own counted apart. A syscall instruction is
    /// followed by the one after it, which the trap after the syscall
    /// skips (the kernel returns to user space with the flag set by an
    /// `iret`, which lets one instruction run before the trap), unless
    /// the next address recorded is that instruction; at the end of the
    /// trace only if the call went on (`ran_on`). `syscall_at` says whether
    /// an address holds a syscall instruction. Returns the instructions
    /// and the steps through tp's code.
    pub fn traced(&self, raw: &[u64], ran_on: bool, syscall_at: &mut dyn FnMut(u64) -> bool) -> (Vec<u64>, u64) {
        let mut pcs = Vec::new();
        let mut in_tp = 0;
        let Some(start) = raw.iter().position(|pc| self.entries.contains_key(pc)) else { return (pcs, 0) };
        pcs.extend_from_slice(&self.entries[&raw[start]]);
        let mut record = |pc: u64| match self.map.get(&pc) {
            Some(&original) => pcs.push(original),
            None if self.in_tp(pc) => in_tp += 1,
            None => pcs.push(pc),
        };
        let after = Host::syscall_insn().len() as u64;
        for (k, &pc) in raw.iter().enumerate().skip(start) {
            record(pc);
            if syscall_at(pc) && raw.get(k + 1).map_or(ran_on, |&next| next != pc + after) {
                record(pc + after);
            }
        }
        (pcs, in_tp)
    }

    /// The job as the worker reads it on its stdin, for a worker whose
    /// parent is `parent`.
    pub fn to_text(&self, parent: i32) -> String {
        let mut s = format!(
            "pid {}\ntid {}\nparent {parent}\nlimit {}\nhandled {:x} {}\n",
            self.pid, self.tid, self.limit, self.handled.0, self.handled.1
        );
        for (at, before) in &self.entries {
            s += &format!("entry {at:x}");
            for b in before {
                s += &format!(" {b:x}");
            }
            s += "\n";
        }
        for (at, original) in &self.map {
            s += &format!("map {at:x} {original:x}\n");
        }
        for (lo, hi) in &self.code {
            s += &format!("code {lo:x} {hi:x}\n");
        }
        if let Some(d) = self.depth {
            s += &format!("depth {d}\n");
        }
        s
    }

    /// [`Job::to_text`] read back: the job and the parent's PID.
    pub fn parse(text: &str) -> Result<(Job, i32), String> {
        let mut job = Job::default();
        let mut parent = 0;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let key = words.next().unwrap_or("");
            let words: Vec<&str> = words.collect();
            let hex = |i: usize| words.get(i).and_then(|w| u64::from_str_radix(w, 16).ok()).ok_or(line);
            let dec = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok()).ok_or(line);
            match key {
                "pid" => job.pid = dec(0)? as i32,
                "tid" => job.tid = dec(0)? as i32,
                "parent" => parent = dec(0)? as i32,
                "limit" => job.limit = dec(0)?,
                "handled" => job.handled = (hex(0)?, dec(1)? as u32),
                "entry" => {
                    let before = (1..words.len()).map(hex).collect::<Result<Vec<_>, _>>()?;
                    job.entries.insert(hex(0)?, before);
                }
                "map" => {
                    job.map.insert(hex(0)?, hex(1)?);
                }
                "code" => job.code.push((hex(0)?, hex(1)?)),
                "depth" => job.depth = Some(dec(0)?.min(u32::MAX as u64) as u32),
                "" => {}
                _ => return Err(format!("an unknown line: {line}")),
            }
        }
        if job.pid <= 0 || job.tid <= 0 || job.entries.is_empty() {
            return Err("no process, thread or entry".into());
        }
        Ok((job, parent))
    }
}

impl Trace {
    /// The trace as the worker writes it on its stdout: one line (the end,
    /// the time in ns, the steps in tp, the instructions, the signals and
    /// their time in ns, the callees that ran free), then each
    /// instruction's address as 8 bytes, little-endian, then each free
    /// callee as three such words (address, calls, ns).
    pub fn write(&self, out: &mut impl io::Write) -> io::Result<()> {
        writeln!(
            out,
            "{} {} {} {} {} {} {}",
            self.end.word(),
            self.elapsed.as_nanos(),
            self.in_tp,
            self.pcs.len(),
            self.signals,
            self.signal_time.as_nanos(),
            self.free.len()
        )?;
        let mut bytes = Vec::with_capacity(self.pcs.len() * 8 + self.free.len() * 24);
        for pc in &self.pcs {
            bytes.extend_from_slice(&pc.to_le_bytes());
        }
        for f in &self.free {
            for w in [f.callee, f.calls, f.time.as_nanos() as u64] {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        out.write_all(&bytes)?;
        out.flush()
    }

    /// [`Trace::write`] read back, with at most `limit` instructions.
    pub fn read(bytes: &[u8], limit: u64) -> Option<Trace> {
        let nl = bytes.iter().position(|&b| b == b'\n')?;
        let head = std::str::from_utf8(&bytes[..nl]).ok()?;
        let w: Vec<&str> = head.split(' ').collect();
        let [end, ns, in_tp, n, signals, signal_ns, nfree] = w[..] else { return None };
        let n: u64 = n.parse().ok()?;
        let nfree: u64 = nfree.parse().ok()?;
        let body = &bytes[nl + 1..];
        // Each free callee is a distinct address called: fewer than the steps.
        if n > limit || nfree > n || body.len() as u64 != n * 8 + nfree * 24 {
            return None;
        }
        let words: Vec<u64> = body.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let (pcs, free) = words.split_at(n as usize);
        Some(Trace {
            end: End::from_word(end)?,
            elapsed: Duration::from_nanos(ns.parse().ok()?),
            in_tp: in_tp.parse().ok()?,
            pcs: pcs.to_vec(),
            free: free
                .chunks_exact(3)
                .map(|f| Free { callee: f[0], calls: f[1], time: Duration::from_nanos(f[2]) })
                .collect(),
            signals: signals.parse().ok()?,
            signal_time: Duration::from_nanos(signal_ns.parse().ok()?),
        })
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

/// True once a signal told this process to stop ([`guard_worker`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes this process (the step worker) end its trace cleanly, never die,
/// on SIGTERM, SIGINT, SIGHUP or SIGPIPE, and get SIGTERM when its parent
/// (tp) dies. Returns false if the parent `parent` is gone already.
pub fn guard_worker(parent: i32) -> bool {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0) };
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() == parent }
}

/// Steps the call `job` describes. The thread is detached whatever happens
/// once it was seized, and without tp's breakpoint.
pub fn run(job: &Job) -> io::Result<Trace> {
    let tid = Pid::from_raw(job.tid);
    ptrace::seize(tid, 0)?;
    let mem = Memory::open(job.pid).map_err(io::Error::other)?;
    let mut stepper = Stepper { job, tid, pending: 0, mem, insns: HashMap::new(), breakpoint: false };
    let trace = stepper.trace();
    stepper.take_out_breakpoint();
    let sig = stepper.pending;
    match ptrace::detach(tid, sig) {
        Err(e) if !ptrace::is_gone(&e) && trace.is_ok() => Err(e),
        _ => trace,
    }
}

type Regs = <Host as Arch>::Regs;

struct Stepper<'a> {
    job: &'a Job,
    tid: Pid,
    /// A signal the thread stopped with, delivered when it is let go.
    pending: i32,
    mem: Memory,
    /// What the instruction at each address stepped so far is.
    insns: HashMap<u64, Insn>,
    /// True while tp's hardware breakpoint is set in the thread.
    breakpoint: bool,
}

/// What an instruction is, for stepping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Insn {
    Plain,
    Syscall,
    /// One single steps cannot pass ([`Arch::stepping_stalls`]).
    Stalls,
    /// A call, returning to the address.
    Call(u64),
}

/// What one step came to.
enum Stop {
    /// The instruction ran: the thread is at the next.
    Ran(Box<Regs>),
    /// The thread stopped for a signal (its number), or a ptrace event (0),
    /// before the step ended: the instruction did not run, unless the
    /// thread is past it (a syscall the signal interrupted).
    Signal(i32, Box<Regs>),
    Gone,
    Blocked(u64),
    Stalled,
}

/// What running free came to.
enum Freed {
    /// The thread is back, stopped there, after running this long.
    Back(Box<Regs>, Duration),
    /// The thread or its process exited.
    Gone,
    /// tp was told to stop; the thread is stopped where it was.
    Stopped,
}

impl Stepper<'_> {
    fn trace(&mut self) -> io::Result<Trace> {
        let missed = |end| Trace {
            pcs: Vec::new(),
            end,
            elapsed: Duration::ZERO,
            in_tp: 0,
            free: Vec::new(),
            signals: 0,
            signal_time: Duration::ZERO,
        };
        ptrace::interrupt(self.tid)?;
        loop {
            match ptrace::wait(self.tid)? {
                Wait::Gone => return Ok(missed(End::Exited)),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => break,
                Wait::Event { .. } => ptrace::cont(self.tid, 0)?,
                // A signal before the stop: its handler runs once the
                // hand-over is answered.
                Wait::Signal(sig) => {
                    self.pending = sig;
                    break;
                }
            }
        }
        let mut regs = regset::get_regs(self.tid)?;
        if !self.in_tp(Host::pc(&regs)) {
            return Ok(missed(End::Missed));
        }
        // The thread is held: the hand-over's answer lets it leave the runtime.
        let (at, arrival) = self.job.handled;
        self.mem.write(at, &arrival.to_ne_bytes())?;
        let mut approach = 0;
        let before = loop {
            if let Some(before) = self.job.entries.get(&Host::pc(&regs)) {
                break before;
            }
            approach += 1;
            if approach > MAX_APPROACH || stop_requested() {
                return Ok(missed(if stop_requested() { End::Stopped } else { End::Missed }));
            }
            let stop = match std::mem::take(&mut self.pending) {
                0 => {
                    let insn = self.insn(Host::pc(&regs));
                    self.step(insn)?
                }
                sig => Stop::Signal(sig, Box::new(regs)),
            };
            regs = match stop {
                Stop::Ran(r) | Stop::Signal(0, r) => *r,
                Stop::Signal(sig, r) => match self.after_signal(sig, &r)? {
                    Freed::Back(r, _) => *r,
                    Freed::Gone => return Ok(missed(End::Exited)),
                    Freed::Stopped => return Ok(missed(End::Stopped)),
                },
                Stop::Gone => return Ok(missed(End::Exited)),
                Stop::Blocked(nr) => return Ok(missed(End::Syscall(nr))),
                Stop::Stalled => return Ok(missed(End::Stall)),
            };
        };
        let started = Instant::now();
        // The stepped call's frame, then each stepped call it made that has
        // not returned yet (with a depth bound only).
        let mut frames: Vec<Regs> = vec![regs];
        let mut pcs: Vec<u64> = before.clone();
        let mut in_tp = 0;
        let mut free: Vec<Free> = Vec::new();
        let (mut signals, mut signal_time) = (0, Duration::ZERO);
        let end = loop {
            let pc = Host::pc(&regs);
            let recorded = match self.job.map.get(&pc) {
                Some(&original) => Some(original),
                None if self.in_tp(pc) => None,
                None => Some(pc),
            };
            match recorded {
                Some(at) => pcs.push(at),
                None => in_tp += 1,
            }
            if pcs.len() as u64 >= self.job.limit {
                break End::Limit;
            }
            if stop_requested() {
                break End::Stopped;
            }
            let insn = self.insn(pc);
            regs = match self.step(insn)? {
                Stop::Ran(r) => match (insn, self.job.depth) {
                    // A call to the next instruction (an address taken) is none.
                    (Insn::Call(ret), Some(depth)) if Host::pc(&r) != ret => {
                        if frames.len() <= depth as usize {
                            frames.push(*r);
                            *r
                        } else {
                            // Deeper than the bound: the callee runs free to its return.
                            let (callee, entry) = (Host::pc(&r), *r);
                            match self.run_free(&[ret], 0, &|now| Host::call_left(&entry, now))? {
                                Freed::Back(back, took) => {
                                    // tp's own calls (a detour's into the runtime) are not the call's.
                                    if recorded.is_some() {
                                        match free.iter_mut().find(|f| f.callee == callee) {
                                            Some(f) => {
                                                f.calls += 1;
                                                f.time += took;
                                            }
                                            None => free.push(Free { callee, calls: 1, time: took }),
                                        }
                                    }
                                    *back
                                }
                                Freed::Gone => break End::Exited,
                                Freed::Stopped => break End::Stopped,
                            }
                        }
                    }
                    _ => *r,
                },
                Stop::Signal(sig, r) => {
                    // The instruction did not run (a syscall the signal
                    // interrupted did: the thread is past it): it is
                    // recorded when it runs.
                    let undone = Host::pc(&r) == pc;
                    if undone {
                        match recorded {
                            Some(_) => drop(pcs.pop()),
                            None => in_tp -= 1,
                        }
                    }
                    // Where AArch64 stops a syscall the signal interrupted
                    // (at the `svc`, rewound to restart it) the handler may
                    // return past it instead (EINTR): the syscall ran.
                    let past = (undone && insn == Insn::Syscall).then(|| pc + Host::syscall_insn().len() as u64);
                    if sig == 0 {
                        *r
                    } else {
                        match self.after_signal(sig, &r)? {
                            Freed::Back(back, took) => {
                                signals += 1;
                                signal_time += took;
                                if past.is_some_and(|p| Host::pc(&back) == p) {
                                    match recorded {
                                        Some(at) => pcs.push(at),
                                        None => in_tp += 1,
                                    }
                                }
                                *back
                            }
                            Freed::Gone => break End::Exited,
                            Freed::Stopped => break End::Stopped,
                        }
                    }
                }
                Stop::Gone => break End::Exited,
                Stop::Blocked(nr) => break End::Syscall(nr),
                Stop::Stalled => {
                    // The instruction did not run: not one of the call's.
                    match recorded {
                        Some(_) => drop(pcs.pop()),
                        None => in_tp -= 1,
                    }
                    break End::Stall;
                }
            };
            while frames.len() > 1 && Host::call_left(frames.last().expect("a frame"), &regs) {
                frames.pop();
            }
            if Host::call_left(&frames[0], &regs) {
                break End::Returned;
            }
        };
        pcs.truncate(self.job.limit as usize);
        Ok(Trace { pcs, end, elapsed: started.elapsed(), in_tp, free, signals, signal_time })
    }

    fn in_tp(&self, pc: u64) -> bool {
        self.job.in_tp(pc)
    }

    /// What the instruction at `pc` is (read once per address).
    fn insn(&mut self, pc: u64) -> Insn {
        let mem = &self.mem;
        *self.insns.entry(pc).or_insert_with(|| {
            let code = mem.read_vec(pc, 16).or_else(|_| mem.read_vec(pc, 4)).unwrap_or_default();
            match code {
                c if c.starts_with(Host::syscall_insn()) => Insn::Syscall,
                c if Host::stepping_stalls(&c) => Insn::Stalls,
                c => Host::call_return(&c, pc).map_or(Insn::Plain, Insn::Call),
            }
        })
    }

    /// Executes the instruction `insn` the thread is at. A syscall that does not
    /// finish in [`SYSCALL_WAIT`] is interrupted: the thread is left there.
    fn step(&mut self, insn: Insn) -> io::Result<Stop> {
        if insn == Insn::Stalls {
            return Ok(Stop::Stalled);
        }
        ptrace::step(self.tid, 0)?;
        let waited = match insn == Insn::Syscall {
            false => ptrace::wait(self.tid)?,
            true => match next_stop(self.tid, Instant::now() + SYSCALL_WAIT, true)? {
                Some(w) => w,
                None => {
                    let blocked = super::blocked_in(self.job.pid, self.tid.as_raw());
                    ptrace::interrupt(self.tid)?;
                    if !self.settle()? || !self.take_step_trap()? {
                        return Ok(Stop::Gone);
                    }
                    super::stop::restart_interrupted_wait(self.job.pid, self.tid, blocked);
                    return Ok(Stop::Blocked(blocked.map_or(u64::MAX, |b| b.nr)));
                }
            },
        };
        match waited {
            Wait::Gone => Ok(Stop::Gone),
            Wait::Signal(libc::SIGTRAP) => Ok(Stop::Ran(Box::new(regset::get_regs(self.tid)?))),
            Wait::Signal(sig) => Ok(Stop::Signal(sig, Box::new(regset::get_regs(self.tid)?))),
            Wait::Event { .. } => Ok(Stop::Signal(0, Box::new(regset::get_regs(self.tid)?))),
        }
    }

    /// Delivers signal `sig`, which stopped the thread with registers `at`,
    /// and lets its handler run free until the thread is back where the
    /// signal found it (the PC and the stack pointer there: a handler on
    /// the same stack runs below it, and one that reaches the PC again
    /// deeper goes on), or, stopped at a syscall instruction, just past it
    /// with that stack pointer: AArch64 stops a syscall the signal
    /// interrupted there (rewound to restart it), and a handler without
    /// SA_RESTART (or a wait with a timeout) returns past it with EINTR.
    /// A signal without a handler comes back at once.
    fn after_signal(&mut self, sig: i32, at: &Regs) -> io::Result<Freed> {
        let sp = Host::sp(at);
        // Stopped where a breakpoint of tp's hit, before the instruction
        // ran: the breakpoint must fire there when the handler returns.
        let mut regs = *at;
        if Host::rearm_breakpoint(&mut regs) {
            regset::set_regs(self.tid, &regs)?;
        }
        let pc = Host::pc(at);
        let past = (self.insn(pc) == Insn::Syscall).then(|| pc + Host::syscall_insn().len() as u64);
        let pcs: Vec<u64> = std::iter::once(pc).chain(past).collect();
        self.run_free(&pcs, sig, &|now| Host::sp(now) == sp)
    }

    /// Lets the stopped thread run free, delivering `sig` (0: none), until
    /// it reaches one of `at` where `back` says it is back: hardware
    /// breakpoints there ([`Arch::set_exec_breakpoint`]; a hit where `back` says no,
    /// a recursion's deeper frame, is stepped past without it and goes on).
    /// Nothing is stepped or recorded meanwhile. The breakpoint is gone
    /// when this returns, but after an error (then [`Self::take_out_breakpoint`]).
    fn run_free(&mut self, at: &[u64], sig: i32, back: &dyn Fn(&Regs) -> bool) -> io::Result<Freed> {
        self.set_breakpoint(at)?;
        let started = Instant::now();
        let freed = self.run_to(at, sig, back)?;
        let took = started.elapsed();
        if !matches!(freed, Freed::Gone) {
            self.set_breakpoint(&[])?;
        }
        Ok(match freed {
            Freed::Back(regs, _) => Freed::Back(regs, took),
            f => f,
        })
    }

    fn run_to(&mut self, at: &[u64], mut sig: i32, back: &dyn Fn(&Regs) -> bool) -> io::Result<Freed> {
        loop {
            ptrace::cont(self.tid, std::mem::take(&mut sig))?;
            let Some(waited) = self.wait_running()? else { return self.stop_running() };
            match waited {
                Wait::Gone => return Ok(Freed::Gone),
                Wait::Signal(libc::SIGTRAP) => {
                    let regs = regset::get_regs(self.tid)?;
                    if !at.contains(&Host::pc(&regs)) {
                        // The program's own SIGTRAP: delivered.
                        sig = libc::SIGTRAP;
                        continue;
                    }
                    if back(&regs) {
                        return Ok(Freed::Back(Box::new(regs), Duration::ZERO));
                    }
                    // A deeper frame at the address: one step past it
                    // without the breakpoint, then on with it.
                    self.set_breakpoint(&[])?;
                    ptrace::step(self.tid, 0)?;
                    match self.wait_running()? {
                        None => return self.stop_running(),
                        Some(Wait::Gone) => return Ok(Freed::Gone),
                        Some(Wait::Signal(libc::SIGTRAP) | Wait::Event { .. }) => {}
                        Some(Wait::Signal(s)) => sig = s,
                    }
                    self.set_breakpoint(at)?;
                }
                Wait::Signal(s) => sig = s,
                Wait::Event { .. } => {}
            }
        }
    }

    /// Stops the thread running free, for tp was told to stop.
    fn stop_running(&mut self) -> io::Result<Freed> {
        ptrace::interrupt(self.tid)?;
        Ok(if self.settle()? { Freed::Stopped } else { Freed::Gone })
    }

    /// The next stop of the thread, which runs free; None if tp is told to
    /// stop first. Polled, so that the end of a trace never waits on the
    /// program: at once a hundred times (a short callee), then after 50 µs,
    /// doubling to 5 ms.
    fn wait_running(&self) -> io::Result<Option<Wait>> {
        let mut pause = Duration::from_micros(50);
        let mut polls = 0;
        loop {
            if let Some(w) = ptrace::try_wait(self.tid)? {
                return Ok(Some(w));
            }
            if stop_requested() {
                return Ok(None);
            }
            polls += 1;
            if polls < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
    }

    fn set_breakpoint(&mut self, at: &[u64]) -> io::Result<()> {
        regset::set_exec_breakpoint(self.tid, at)?;
        self.breakpoint = !at.is_empty();
        Ok(())
    }

    /// Takes tp's breakpoint out of the thread if a trace that failed left
    /// it set, stopping the thread for it if it runs: let go with it, the
    /// thread would die of the SIGTRAP its next hit sends.
    fn take_out_breakpoint(&mut self) {
        if !self.breakpoint || self.set_breakpoint(&[]).is_ok() {
            return;
        }
        if ptrace::interrupt(self.tid).is_ok() && self.settle().unwrap_or(false) {
            let _ = self.set_breakpoint(&[]);
        }
    }

    /// Takes back the SIGTRAP the kernel queued for a syscall stepped into
    /// and interrupted (its single-step report at the syscall's exit): let
    /// go with it pending, the thread would die of it. Leaves the thread
    /// stopped; false if it is gone.
    fn take_step_trap(&mut self) -> io::Result<bool> {
        if !trap_pending(self.job.pid, self.tid.as_raw()) {
            return Ok(true);
        }
        ptrace::cont(self.tid, 0)?;
        // Bounded: a trap the kernel took back meanwhile never comes.
        let until = Instant::now() + SYSCALL_WAIT;
        loop {
            let Some(waited) = next_stop(self.tid, until, false)? else {
                ptrace::interrupt(self.tid)?;
                return self.settle();
            };
            match waited {
                Wait::Gone => return Ok(false),
                // Dropped: the detach does not deliver it.
                Wait::Signal(libc::SIGTRAP) => return Ok(true),
                Wait::Signal(sig) => {
                    self.pending = sig;
                    ptrace::cont(self.tid, 0)?;
                }
                Wait::Event { .. } => ptrace::cont(self.tid, 0)?,
            }
        }
    }

    /// Waits for the stop an interrupt asked for; false if the thread is gone.
    fn settle(&mut self) -> io::Result<bool> {
        loop {
            match ptrace::wait(self.tid)? {
                Wait::Gone => return Ok(false),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => return Ok(true),
                Wait::Event { .. } => ptrace::cont(self.tid, 0)?,
                Wait::Signal(libc::SIGTRAP) => return Ok(true),
                Wait::Signal(sig) => {
                    self.pending = sig;
                    return Ok(true);
                }
            }
        }
    }
}

/// The next stop of thread `tid`, waited for until `until` (and, if
/// `or_told`, until tp is told to stop): None if none came by then.
fn next_stop(tid: Pid, until: Instant, or_told: bool) -> io::Result<Option<Wait>> {
    loop {
        if let Some(w) = ptrace::try_wait(tid)? {
            return Ok(Some(w));
        }
        if Instant::now() >= until || (or_told && stop_requested()) {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// True if SIGTRAP is pending for thread `tid` of process `pid`.
fn trap_pending(pid: i32, tid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    super::signal_mask(&status, "SigPnd") & (1 << (libc::SIGTRAP - 1)) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_from_the_target_starts_at_the_copy_maps_it_and_adds_what_follows_a_syscall() {
        let job = Job {
            entries: HashMap::from([(0x5000, vec![0x4000])]),
            map: HashMap::from([(0x5000, 0x4004), (0x5003, 0x4007)]),
            code: vec![(0x5000, 0x6000), (0x9000, 0x9100)],
            ..Job::default()
        };
        let len = Host::syscall_insn().len() as u64;
        // tp's runtime first (not counted), the copies, a jump back through
        // the site, the function, a syscall at 0x4010 whose next instruction
        // the trap skipped, another probe's detour, a syscall last.
        let raw = [0x9000, 0x9004, 0x5000, 0x5003, 0x5008, 0x400c, 0x4010, 0x4010 + len + 3, 0x9010, 0x4020];
        let mut syscall_at = |pc: u64| pc == 0x4010 || pc == 0x4020;
        let (pcs, in_tp) = job.traced(&raw, false, &mut syscall_at);
        assert_eq!(pcs, vec![0x4000, 0x4004, 0x4007, 0x400c, 0x4010, 0x4010 + len, 0x4010 + len + 3, 0x4020]);
        assert_eq!(in_tp, 2, "the jump back and the other detour");
        // A call that returned right after its last syscall ran the next instruction.
        let (pcs, _) = job.traced(&raw, true, &mut syscall_at);
        assert_eq!(pcs.last(), Some(&(0x4020 + len)));
        // The instruction after a syscall recorded as the next is not added twice.
        let (pcs, _) = job.traced(&[0x5000, 0x4010, 0x4010 + len], false, &mut syscall_at);
        assert_eq!(pcs, vec![0x4000, 0x4004, 0x4010, 0x4010 + len]);
        // Nothing before the copy: no trace.
        assert_eq!(job.traced(&[0x9000, 0x4010], false, &mut syscall_at), (vec![], 0));
    }

    #[test]
    fn jobs_and_traces_read_back_as_written() {
        let job = Job {
            pid: 12,
            tid: 13,
            limit: 1000,
            handled: (0x7f00_0000_0f90, 7),
            entries: HashMap::from([(0x5000, vec![0x4000]), (0x5100, vec![])]),
            map: HashMap::from([(0x5000, 0x4004), (0x5003, 0x4005)]),
            code: vec![(0x5000, 0x6000)],
            depth: Some(2),
        };
        assert_eq!(Job::parse(&job.to_text(99)), Ok((job.clone(), 99)));
        let unbounded = Job { depth: None, ..job };
        assert_eq!(Job::parse(&unbounded.to_text(99)), Ok((unbounded, 99)));
        assert!(Job::parse("pid 1\ntid 2\n").is_err(), "no entry");
        assert!(Job::parse("pid 1\ntid x\nentry 10\n").is_err());
        assert!(Job::parse("pid 1\ntid 2\nentry 10\nwhat 1\n").is_err());
        let t = Trace {
            pcs: vec![1, 2, 3],
            end: End::Syscall(35),
            elapsed: Duration::from_nanos(1234),
            in_tp: 9,
            free: vec![Free { callee: 0x4100, calls: 2, time: Duration::from_nanos(800) }],
            signals: 4,
            signal_time: Duration::from_nanos(5678),
        };
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(Trace::read(&out, 10), Some(t.clone()));
        assert_eq!(Trace::read(&out, 2), None, "more instructions than the limit");
        assert_eq!(Trace::read(&out[..out.len() - 1], 10), None, "cut short");
        assert_eq!(Trace::read(b"returned 1 2\n", 10), None);
        let no_steps = Trace { pcs: vec![], ..t };
        let mut out = Vec::new();
        no_steps.write(&mut out).unwrap();
        assert_eq!(Trace::read(&out, 10), None, "a free callee without a call stepped");
    }

    #[test]
    fn ends_read_back_as_written() {
        for e in [End::Returned, End::Limit, End::Syscall(7), End::Exited, End::Missed, End::Stopped, End::Stall] {
            assert_eq!(End::from_word(&e.word()), Some(e));
        }
        assert_eq!(End::from_word("syscall:x"), None);
        assert_eq!(End::from_word(""), None);
    }
}
