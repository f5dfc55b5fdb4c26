//! The cost of one hit: extra nanoseconds per call of `work()` in the `hot`
//! target (targets/hot.c), probed against unprobed, measured inside the
//! target, the same way for tp and for every peer.
//!
//! One run: start `hot wait`, which times unprobed bursts of calls and says
//! `ready`; start the tracer; the target sees its entry bytes change, times
//! probed bursts and says `probed`; stop the tracer; the target sees its
//! bytes restored and times unprobed bursts again. Extra = probed − the mean
//! of the two unprobed phases, all in one process a few seconds apart. The
//! tracer's own hit count is checked against the calls the target made.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::proc::{Proc, kv_f64, number_before};

/// What a probe records (the tp modes, and the peer rows compared with them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Records {
    /// Counts calls.
    Count,
    /// Records each entry with its arguments and a timestamp.
    Args,
    /// Records each exit with the return value and the call's duration.
    Ret,
    /// Both.
    ArgsRet,
    /// [`Records::Ret`] by replacing the return address (`TP_RETURNS=stack`):
    /// the form tp takes where a function's exits cannot all be patched.
    RetStack,
    /// [`Records::ArgsRet`] by replacing the return address.
    ArgsRetStack,
    /// An installed probe whose enable flag is off.
    Disabled,
    /// Entries with arguments behind a predicate that never holds (`--if`).
    FalsePredicate,
    /// Exits timed into the target's own histograms (`--ret -q`): no event.
    Aggregated,
    /// The argument's sum and histogram per thread, in the target (`--agg
    /// 'sum(x), hist(x)' --by tid`): no event.
    AggValue,
    /// Each call's latency summed and bucketed in nanoseconds per thread,
    /// in the target (`--agg 'sum(latency), hist(latency)' --by tid`).
    AggLatency,
    /// The same keyed by the argument, which the call's frame carries to
    /// its exit (`--by x`).
    AggLatencyByArg,
    /// Calls counted per call site, the return address at entry, in the
    /// target (`--by caller`): no event.
    CountByCaller,
    /// Each call's latency summed and bucketed per call site (`--by
    /// caller`: the key is the return address the call's frame keeps).
    AggLatencyByCaller,
    /// Calls counted per stack, 32 frames walked by frame pointers at each
    /// entry and hashed, in the target (`--by stack`): no event.
    CountByStack,
    /// Each call's latency summed and bucketed per stack (`--by stack`:
    /// the exit walks the stack again).
    AggLatencyByStack,
    /// Each entry with its stack, walked by frame pointers, this many frames.
    StackFp(u32),
    /// Each entry with a copy of this many bytes of its stack, unwound by the tracer.
    StackCopy(u32),
    /// Counts every basic block of the function (`--blocks`).
    Blocks,
}

impl Records {
    /// As the tables write it.
    pub fn label(self) -> String {
        match self {
            Records::Count => "count".into(),
            Records::Args => "entry + args".into(),
            Records::Ret => "exit + latency".into(),
            Records::ArgsRet => "entry + args, exit + latency".into(),
            Records::RetStack => "exit + latency, return address replaced".into(),
            Records::ArgsRetStack => "entry + args, exit + latency, return address replaced".into(),
            Records::Disabled => "disabled (flag off)".into(),
            Records::FalsePredicate => "entry + args, predicate false".into(),
            Records::Aggregated => "exit + latency, histogram in the target".into(),
            Records::AggValue => "aggregate: sum and histogram of an argument by thread".into(),
            Records::AggLatency => "aggregate: sum and histogram of latency by thread".into(),
            Records::AggLatencyByArg => "aggregate: sum and histogram of latency by an argument".into(),
            Records::CountByCaller => "aggregate: count by caller".into(),
            Records::AggLatencyByCaller => "aggregate: sum and histogram of latency by caller".into(),
            Records::CountByStack => "aggregate: count by stack (32 frames)".into(),
            Records::AggLatencyByStack => "aggregate: sum and histogram of latency by stack (32 frames)".into(),
            Records::StackFp(d) => format!("stack, frame pointers, {d} frames"),
            Records::StackCopy(b) => format!("stack, {b}-byte copy unwound (DWARF)"),
            Records::Blocks => "count, every basic block (--blocks)".into(),
        }
    }

    /// The frames a stack row walks through (the target nests its calls this deep).
    pub fn depth(self) -> u32 {
        match self {
            Records::StackFp(_) | Records::StackCopy(_) | Records::CountByStack | Records::AggLatencyByStack => 40,
            _ => 0,
        }
    }

    /// tp's options for it (after `attach -p PID -f work`), and its
    /// environment: rows that time exits through events keep them events.
    pub fn tp_args(self) -> (Vec<String>, Vec<(&'static str, &'static str)>) {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let events = vec![("TP_AGGREGATE", "0")];
        let stack = vec![("TP_AGGREGATE", "0"), ("TP_RETURNS", "stack")];
        match self {
            Records::Count | Records::Disabled => (Vec::new(), Vec::new()),
            Records::Args => (s(&["--args"]), Vec::new()),
            Records::Ret => (s(&["--ret"]), events),
            Records::ArgsRet => (s(&["--args", "--ret"]), events),
            Records::RetStack => (s(&["--ret"]), stack),
            Records::ArgsRetStack => (s(&["--args", "--ret"]), stack),
            // work(x) is called with x from 0 up: never negative.
            Records::FalsePredicate => (s(&["--args", "--if", "x < 0"]), Vec::new()),
            Records::Aggregated => (s(&["--ret"]), Vec::new()),
            Records::AggValue => (s(&["--agg", "sum(x), hist(x)", "--by", "tid"]), Vec::new()),
            Records::AggLatency => (s(&["--agg", "sum(latency), hist(latency)", "--by", "tid"]), Vec::new()),
            Records::AggLatencyByArg => (s(&["--agg", "sum(latency), hist(latency)", "--by", "x"]), Vec::new()),
            Records::CountByCaller => (s(&["--by", "caller"]), Vec::new()),
            Records::AggLatencyByCaller => (s(&["--agg", "sum(latency), hist(latency)", "--by", "caller"]), Vec::new()),
            Records::CountByStack => (s(&["--by", "stack"]), Vec::new()),
            Records::AggLatencyByStack => (s(&["--agg", "sum(latency), hist(latency)", "--by", "stack"]), Vec::new()),
            Records::StackFp(d) => (s(&["--stack", "--stack-depth", &d.to_string()]), Vec::new()),
            Records::StackCopy(b) => (s(&["--stack=dwarf", "--stack-size", &b.to_string()]), Vec::new()),
            Records::Blocks => (s(&["--blocks"]), Vec::new()),
        }
    }
}

/// How much a run calls `work()`: `bursts` bursts of `calls` calls per
/// thread, with `pause_us` between bursts for the tracer to drain.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Bursts per phase (the target reports the median burst).
    pub bursts: u32,
    /// Calls per burst per thread.
    pub calls: u64,
    /// Pause after each burst, µs.
    pub pause_us: u64,
}

impl Sizes {
    /// The smoke-test version: a few short bursts.
    pub fn smoke(self) -> Sizes {
        Sizes { bursts: 3, calls: (self.calls / 20).max(50), pause_us: self.pause_us.min(5_000) }
    }
}

/// What a tracer reports when stopped.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Hits the tracer counted (None if it cannot say).
    pub hits: Option<u64>,
    /// Events the tracer lost (tp: a thread's ring was full).
    pub lost: Option<u64>,
    /// tp's own report of how long the target was stopped to attach, µs.
    pub tp_stop_us: Option<f64>,
}

/// A way to probe `work()` in a running process.
pub trait Tracer {
    /// The row's name.
    fn name(&self) -> String;
    /// What it records (rows are compared with tp's row of the same kind).
    fn records(&self) -> Records;
    /// Which build of the target it probes.
    fn binary(&self) -> &'static str {
        match self.records() {
            Records::StackFp(_) | Records::CountByStack | Records::AggLatencyByStack => "hot-fp",
            _ => "hot",
        }
    }
    /// The function of the target it probes and the target calls: `work`,
    /// or one of the other shapes of targets/hot.c.
    fn function(&self) -> &'static str {
        "work"
    }
    /// How much to call `work()` (the slow peers get fewer calls).
    fn sizes(&self) -> Sizes;
    /// Hits the tracer counts per call.
    fn hits_per_call(&self) -> u64 {
        1
    }
    /// Starts probing process `pid` running `binary`.
    fn start(&mut self, env: &Env, pid: i32, binary: &Path) -> Result<()>;
    /// Stops probing (the target has finished its probed phase) and says
    /// what the tracer counted.
    fn stop(&mut self) -> Result<Outcome>;
}

/// The function of targets/hot.c a tracer probes when the target calls
/// `function`: `work_deep` is `work` called two frames deep.
pub fn probed(function: &str) -> &str {
    if function == "work_deep" { "work" } else { function }
}

/// One run's result.
#[derive(Debug, Clone)]
pub struct Run {
    /// Mean of the unprobed phases before and after, ns per call per thread.
    pub base: f64,
    /// The probed phase, ns per call per thread.
    pub probed: f64,
    /// Tracer start → the target saw its entry bytes change, ms.
    pub live_ms: f64,
    /// What the tracer said.
    pub outcome: Outcome,
    /// The tracer's count matched (None: it does not count).
    pub hits_ok: Option<bool>,
}

impl Run {
    /// Extra ns per call.
    pub fn extra(&self) -> f64 {
        self.probed - self.base
    }
}

/// Runs `tracer` once against a fresh target with `threads` threads.
pub fn run_once(env: &Env, tracer: &mut dyn Tracer, threads: u32) -> Result<Run> {
    let sizes = if env.smoke { tracer.sizes().smoke() } else { tracer.sizes() };
    let binary = env.target(tracer.binary());
    let args: Vec<String> = vec![
        "wait".into(),
        threads.to_string(),
        sizes.bursts.to_string(),
        sizes.calls.to_string(),
        sizes.pause_us.to_string(),
        "60".into(),
        tracer.records().depth().to_string(),
        tracer.function().into(),
    ];
    let mut target = Proc::spawn(tracer.binary(), &binary, &args, false)?;
    let long = Duration::from_secs(120);
    target.wait_prefix("ready", long)?;
    let started = Instant::now();
    if let Err(e) = tracer.start(env, target.pid(), &binary) {
        let _ = tracer.stop();
        return Err(e.context(format!("starting {}", tracer.name())));
    }
    let patched = match target.wait_prefix("patched", Duration::from_secs(60)) {
        Ok(l) => l,
        Err(e) => {
            let _ = tracer.stop();
            return Err(e);
        }
    };
    let live_ms = patched.at.duration_since(started).as_secs_f64() * 1e3;
    let probed = target.wait_prefix("probed", long);
    let outcome = tracer.stop().with_context(|| format!("stopping {}", tracer.name()))?;
    probed?;
    let result = target.wait_prefix("result", long)?;
    let status = target.wait_exit(Duration::from_secs(10));
    let line = &result.text;
    if !line.contains("checksum=ok") {
        bail!("{}: the target computed wrong results while probed: {line}", tracer.name());
    }
    if !status.is_some_and(|s| s.success()) {
        bail!("{}: the target did not exit cleanly ({status:?})", tracer.name());
    }
    let get = |k: &str| kv_f64(line, k).with_context(|| format!("no {k} in `{line}`"));
    let calls = get("probed_calls")? as u64;
    let hits_ok = outcome.hits.map(|h| h == calls * tracer.hits_per_call());
    Ok(Run { base: (get("base_pre")? + get("base_post")?) / 2.0, probed: get("probed")?, live_ms, outcome, hits_ok })
}

/// tp itself, as a user runs it: `tp attach -p PID -f work [--args] [--ret]`,
/// stopped with Ctrl-C (SIGINT). `Disabled` attaches the same way and then
/// turns the probe's enable flag off in the shared data region.
pub struct Tp {
    records: Records,
    function: &'static str,
    binary: &'static str,
    session: Option<Proc>,
}

impl Tp {
    /// tp recording `records` on `work`.
    pub fn new(records: Records) -> Tp {
        Tp::on(records, "work")
    }

    /// tp recording `records` on `function` of targets/hot.c.
    pub fn on(records: Records, function: &'static str) -> Tp {
        Tp { records, function, binary: "hot", session: None }
    }

    /// tp counting on `hot-nop5`, whose `work()` starts with a 5-byte nop: a
    /// site with nothing to relocate (the detour's copy is only its jump back).
    pub fn nop5() -> Tp {
        Tp { records: Records::Count, function: "work", binary: "hot-nop5", session: None }
    }
}

/// How the row of tp on a 5-byte nop site is named (the table and the instruction counts).
pub const NOP5_LABEL: &str = "count, on a 5-byte nop (nothing relocated)";

/// Events per thread ring: room for several bursts, so the ring is never
/// full when the tracer drains between bursts.
const RING: u32 = 1 << 16;

impl Tracer for Tp {
    fn name(&self) -> String {
        match (self.binary, self.function) {
            ("hot-nop5", _) => format!("tp: {NOP5_LABEL}"),
            (_, "work") => format!("tp: {}", self.records.label()),
            (_, f) => format!("tp: {}, `{f}`", self.records.label()),
        }
    }

    fn binary(&self) -> &'static str {
        match self.records {
            Records::StackFp(_) | Records::CountByStack | Records::AggLatencyByStack => "hot-fp",
            _ => self.binary,
        }
    }

    fn records(&self) -> Records {
        self.records
    }

    fn function(&self) -> &'static str {
        self.function
    }

    fn hits_per_call(&self) -> u64 {
        // A disabled probe counts nothing (the target makes no call between
        // the patch and the flag going off).
        u64::from(self.records != Records::Disabled)
    }

    fn sizes(&self) -> Sizes {
        match self.records {
            Records::Count
            | Records::Disabled
            | Records::FalsePredicate
            | Records::Aggregated
            | Records::AggValue
            | Records::AggLatency
            | Records::AggLatencyByArg
            | Records::CountByCaller
            | Records::AggLatencyByCaller
            | Records::CountByStack
            | Records::AggLatencyByStack
            | Records::Blocks => Sizes { bursts: 31, calls: 2_000_000, pause_us: 0 },
            // A stack takes several of the ring's events.
            Records::StackFp(_) | Records::StackCopy(_) => Sizes { bursts: 31, calls: 1_024, pause_us: 25_000 },
            // Bursts that fit in the ring, and pauses longer than tp's
            // 20 ms drain period.
            _ => Sizes { bursts: 31, calls: 8_192, pause_us: 25_000 },
        }
    }

    fn start(&mut self, env: &Env, pid: i32, _binary: &Path) -> Result<()> {
        let mut args: Vec<String> =
            vec!["attach".into(), "-p".into(), pid.to_string(), "-f".into(), probed(self.function).into()];
        let (extra, vars) = self.records.tp_args();
        args.extend(extra);
        let ring = match self.records {
            Records::StackFp(_) | Records::StackCopy(_) => 1 << 20,
            _ => RING,
        };
        args.extend(["-q".into(), "--json".into(), "--ring-size".into(), ring.to_string()]);
        let mut p = Proc::spawn_env("tp", &env.tp, &args, false, &vars)?;
        if self.records == Records::Disabled {
            p.wait_prefix("tp: attached", Duration::from_secs(30))?;
            set_enabled(pid, probed(self.function), false)?;
        }
        self.session = Some(p);
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let Some(mut p) = self.session.take() else { bail!("tp was not started") };
        p.stop(libc::SIGINT, Duration::from_secs(60));
        let attached = p.last("tp: attached").map(|l| l.text.clone());
        let Some(attached) = attached else { bail!("tp did not attach:\n{}", p.text()) };
        let json = p.seen.iter().rev().find(|l| !l.stderr && l.text.starts_with('{')).map(|l| l.text.clone());
        let Some(json) = json else { bail!("tp printed no summary:\n{}", p.text()) };
        let v: serde_json::Value = serde_json::from_str(&json).context("tp's JSON summary")?;
        // With --blocks, the calls are the entry block's count.
        let row = match self.records {
            Records::Blocks => format!("{}+0x0", self.function),
            _ => probed(self.function).to_string(),
        };
        let rows = v["processes"][0]["probes"].as_array();
        let hits = rows.and_then(|ps| ps.iter().find(|p| p["func"] == row.as_str())).and_then(|p| p["hits"].as_u64());
        if self.records == Records::Blocks
            && let (Some(ps), Some(calls)) = (rows, hits.filter(|&h| h > 0))
        {
            let all: u64 = ps.iter().filter_map(|p| p["hits"].as_u64()).sum();
            eprintln!("tp --blocks on {}: {} probes hit per call", self.function, all as f64 / calls as f64);
        }
        Ok(Outcome {
            hits,
            lost: v["processes"][0]["lost_events"].as_u64(),
            tp_stop_us: number_before(&attached, "target stopped", " µs"),
        })
    }
}

/// Turns the enable flag of the probe on `func` in process `pid` on or off,
/// through tp's shared data region (what `tp enable`/`tp disable` do).
pub fn set_enabled(pid: i32, func: &str, on: bool) -> Result<()> {
    let region = open_region(pid)?;
    let (i, _) = region
        .entries()
        .into_iter()
        .find(|(_, e)| e.state() == tp::probe::layout::State::Active && e.name() == func)
        .with_context(|| format!("no active probe on `{func}` in {pid}"))?;
    region.set_enabled(i, on)
}

/// tp's data region in process `pid`.
pub fn open_region(pid: i32) -> Result<tp::probe::region::Region> {
    let maps = tp::process::read_maps(pid)?;
    let m = tp::probe::region::find(&maps).with_context(|| format!("process {pid} has no tp data region"))?;
    tp::probe::region::Region::open(pid, m)
}
