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

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::memory::Memory;
use super::ptrace::{self, Wait};
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
    /// tp's code in the target, as `[lo, hi)`: a step there that
    /// [`Job::map`] does not name is tp's own.
    pub code: Vec<(u64, u64)>,
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
}

impl Job {
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
    /// the time in ns, the steps in tp, the instructions), then each
    /// instruction's address as 8 bytes, little-endian.
    pub fn write(&self, out: &mut impl io::Write) -> io::Result<()> {
        writeln!(out, "{} {} {} {}", self.end.word(), self.elapsed.as_nanos(), self.in_tp, self.pcs.len())?;
        let mut bytes = Vec::with_capacity(self.pcs.len() * 8);
        for pc in &self.pcs {
            bytes.extend_from_slice(&pc.to_le_bytes());
        }
        out.write_all(&bytes)?;
        out.flush()
    }

    /// [`Trace::write`] read back, with at most `limit` instructions.
    pub fn read(bytes: &[u8], limit: u64) -> Option<Trace> {
        let nl = bytes.iter().position(|&b| b == b'\n')?;
        let head = std::str::from_utf8(&bytes[..nl]).ok()?;
        let w: Vec<&str> = head.split(' ').collect();
        let [end, ns, in_tp, n] = w[..] else { return None };
        let n: u64 = n.parse().ok()?;
        let body = &bytes[nl + 1..];
        if n > limit || body.len() as u64 != n * 8 {
            return None;
        }
        Some(Trace {
            end: End::from_word(end)?,
            elapsed: Duration::from_nanos(ns.parse().ok()?),
            in_tp: in_tp.parse().ok()?,
            pcs: body.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect(),
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
/// once it was seized.
pub fn run(job: &Job) -> io::Result<Trace> {
    let tid = Pid::from_raw(job.tid);
    ptrace::seize(tid, 0)?;
    let mem = Memory::open(job.pid).map_err(io::Error::other)?;
    let mut stepper = Stepper { job, tid, pending: 0, mem, insns: HashMap::new() };
    let trace = stepper.trace();
    let sig = stepper.pending;
    match ptrace::detach(tid, sig) {
        Err(e) if !ptrace::is_gone(&e) && trace.is_ok() => Err(e),
        _ => trace,
    }
}

struct Stepper<'a> {
    job: &'a Job,
    tid: Pid,
    /// A signal the thread stopped with, delivered on the next step.
    pending: i32,
    mem: Memory,
    /// What the instruction at each address stepped so far is.
    insns: HashMap<u64, Insn>,
}

/// What an instruction is, for stepping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Insn {
    Plain,
    Syscall,
    /// One single steps cannot pass ([`Arch::stepping_stalls`]).
    Stalls,
}

/// What one step came to.
enum Stop {
    At(Box<<Host as Arch>::Regs>),
    Gone,
    Blocked(u64),
    Stalled,
}

impl Stepper<'_> {
    fn trace(&mut self) -> io::Result<Trace> {
        let missed = |end| Trace { pcs: Vec::new(), end, elapsed: Duration::ZERO, in_tp: 0 };
        ptrace::interrupt(self.tid)?;
        loop {
            match ptrace::wait(self.tid)? {
                Wait::Gone => return Ok(missed(End::Exited)),
                Wait::Event { event: ptrace::EVENT_STOP, .. } => break,
                Wait::Event { .. } => ptrace::cont(self.tid, 0)?,
                // A signal before the stop: delivered when the thread goes on.
                Wait::Signal(sig) => {
                    self.pending = sig;
                    break;
                }
            }
        }
        let mut regs = Host::get_regs(self.tid)?;
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
            regs = match self.step(Host::pc(&regs))? {
                Stop::At(r) => *r,
                Stop::Gone => return Ok(missed(End::Exited)),
                Stop::Blocked(nr) => return Ok(missed(End::Syscall(nr))),
                Stop::Stalled => return Ok(missed(End::Stall)),
            };
        };
        let started = Instant::now();
        let entry = regs;
        let mut pcs: Vec<u64> = before.clone();
        let mut in_tp = 0;
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
            regs = match self.step(pc)? {
                Stop::At(r) => *r,
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
            if Host::call_left(&entry, &regs) {
                break End::Returned;
            }
        };
        pcs.truncate(self.job.limit as usize);
        Ok(Trace { pcs, end, elapsed: started.elapsed(), in_tp })
    }

    fn in_tp(&self, pc: u64) -> bool {
        self.job.code.iter().any(|&(lo, hi)| lo <= pc && pc < hi)
    }

    /// Executes the instruction at `pc`. A syscall that does not finish in
    /// [`SYSCALL_WAIT`] is interrupted: the thread is left there.
    fn step(&mut self, pc: u64) -> io::Result<Stop> {
        let mem = &self.mem;
        let insn = *self.insns.entry(pc).or_insert_with(|| {
            let code = mem.read_vec(pc, 16).or_else(|_| mem.read_vec(pc, 4)).unwrap_or_default();
            match code {
                c if c.starts_with(Host::syscall_insn()) => Insn::Syscall,
                c if Host::stepping_stalls(&c) => Insn::Stalls,
                _ => Insn::Plain,
            }
        });
        if insn == Insn::Stalls {
            return Ok(Stop::Stalled);
        }
        let is_syscall = insn == Insn::Syscall;
        let sig = std::mem::take(&mut self.pending);
        ptrace::step(self.tid, sig)?;
        let waited = match is_syscall {
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
            Wait::Signal(libc::SIGTRAP) => Ok(Stop::At(Box::new(Host::get_regs(self.tid)?))),
            Wait::Signal(sig) => {
                // Delivered with the next step: the handler runs, stepped.
                self.pending = sig;
                Ok(Stop::At(Box::new(Host::get_regs(self.tid)?)))
            }
            Wait::Event { .. } => Ok(Stop::At(Box::new(Host::get_regs(self.tid)?))),
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
    fn jobs_and_traces_read_back_as_written() {
        let job = Job {
            pid: 12,
            tid: 13,
            limit: 1000,
            handled: (0x7f00_0000_0f90, 7),
            entries: HashMap::from([(0x5000, vec![0x4000]), (0x5100, vec![])]),
            map: HashMap::from([(0x5000, 0x4004), (0x5003, 0x4005)]),
            code: vec![(0x5000, 0x6000)],
        };
        assert_eq!(Job::parse(&job.to_text(99)), Ok((job, 99)));
        assert!(Job::parse("pid 1\ntid 2\n").is_err(), "no entry");
        assert!(Job::parse("pid 1\ntid x\nentry 10\n").is_err());
        assert!(Job::parse("pid 1\ntid 2\nentry 10\nwhat 1\n").is_err());
        let t = Trace { pcs: vec![1, 2, 3], end: End::Syscall(35), elapsed: Duration::from_nanos(1234), in_tp: 9 };
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(Trace::read(&out, 10), Some(t.clone()));
        assert_eq!(Trace::read(&out, 2), None, "more instructions than the limit");
        assert_eq!(Trace::read(&out[..out.len() - 1], 10), None, "cut short");
        assert_eq!(Trace::read(b"returned 1 2\n", 10), None);
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
