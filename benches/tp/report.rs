//! The results of one benchmark run as Markdown: the tables printed at the
//! end, written to target/bench/results.md, and with `--doc` put into
//! docs/benchmarks.md between its result markers.

use std::fmt::Write;

use crate::attach::Cycle;
use crate::floor::Floor;
use crate::hit::{Records, Run};
use crate::stats::{Spread, int, num, ratio, show};
use crate::steps::Count;

/// One row of the hit-cost table: a tracer and a thread count.
pub struct HitRow {
    /// The tracer's name.
    pub name: String,
    /// The function of targets/hot.c it probes.
    pub function: &'static str,
    /// What it records.
    pub records: Records,
    /// Threads calling `work()`.
    pub threads: u32,
    /// True for tp's own rows.
    pub tp: bool,
    /// Runs that completed.
    pub runs: Vec<Run>,
    /// Why the other runs failed.
    pub failures: Vec<String>,
}

impl HitRow {
    /// Extra ns per call over the runs.
    pub fn extra(&self) -> Option<Spread> {
        Spread::of(&self.runs.iter().map(Run::extra).collect::<Vec<_>>())
    }
}

/// One row of the instruction counts.
pub struct StepRow {
    /// What the probe records (None: unprobed).
    pub records: Option<Records>,
    /// The function of targets/hot.c.
    pub function: &'static str,
    /// The probed call.
    pub count: Count,
    /// The same call unprobed.
    pub base: usize,
    /// The row's name when it is not the kind of probe alone (tp on a nop site).
    pub label: Option<String>,
}

/// The cycles of one probe count.
pub struct AttachRow {
    /// Probes per attach.
    pub probes: usize,
    /// Cycles that completed.
    pub cycles: Vec<Cycle>,
    /// Why the others failed.
    pub failures: Vec<String>,
}

impl AttachRow {
    fn spread(&self, f: impl Fn(&Cycle) -> f64) -> Option<Spread> {
        Spread::of(&self.cycles.iter().map(f).collect::<Vec<_>>())
    }
}

/// Everything one run measured.
#[derive(Default)]
pub struct Results {
    /// When it started (UTC).
    pub date: String,
    /// The command that produced it.
    pub command: String,
    /// CPU, cores and kernel.
    pub machine: String,
    /// Load averages when the run started and ended.
    pub load: (String, String),
    /// Repetitions.
    pub reps: usize,
    /// A smoke run (CI): too short for the numbers to mean anything.
    pub smoke: bool,
    /// Run on an emulated CPU (QEMU TCG, the arm64 test VM): its times are
    /// the emulator's, only the instruction counts mean something.
    pub emulated: bool,
    /// Hit-cost rows.
    pub hit: Vec<HitRow>,
    /// Instruction counts.
    pub steps: Vec<StepRow>,
    /// Attach and detach rows.
    pub attach: Vec<AttachRow>,
    /// Attach at scale, on generated programs, first and cached.
    pub large: Vec<crate::large::Row>,
    /// Attach on real programs, first and cached.
    pub real: Vec<crate::real::Row>,
    /// Profiling a real server.
    pub server: Vec<crate::server::Row>,
    /// Every function of libsqlite3 counted in the sqlite3 shell, per run.
    pub whole: Vec<crate::whole::Run>,
    /// Its failed runs.
    pub whole_failures: Vec<String>,
    /// ns per toggle, over the runs.
    pub toggle: Vec<f64>,
    /// ms per `tp disable`/`tp enable` command, over the runs.
    pub toggle_command: Vec<f64>,
    /// µs per load, call and unload of a library, for each way of
    /// [`crate::dlopen::HOW`], per run.
    pub dlopen: Vec<Vec<f64>>,
    /// A call stepped with `--steps`, per run.
    pub stepping: Vec<crate::stepping::Row>,
    /// The same, stepped by the in-target engine (`--step-engine trap`).
    pub stepping_trap: Vec<crate::stepping::Row>,
    /// The in-target engine's floor: ns per single-step trap to an empty
    /// handler, ns per signal sent to oneself.
    pub trap_floor: Vec<(f64, f64)>,
    /// A call stepped with `--step-depth 0`, and without, per run.
    pub stepping_depth: Vec<crate::stepping::DepthRow>,
    /// The floor, once per repetition of the hit-cost runs.
    pub floor: Vec<Floor>,
    /// Sections or peers skipped, and why.
    pub notes: Vec<String>,
    /// The functions of targets/hot.c and what `tp list-probes` says of them.
    pub shapes: Vec<(String, String)>,
}

impl Results {
    /// tp's row recording `records` on `function` with `threads` threads.
    fn tp_row(&self, function: &str, records: Records, threads: u32) -> Option<&HitRow> {
        self.hit.iter().find(|r| r.tp && r.function == function && r.records == records && r.threads == threads)
    }

    fn tp_extra(&self, records: Records, threads: u32) -> Option<f64> {
        self.tp_extra_on("work", records, threads)
    }

    fn tp_extra_on(&self, function: &str, records: Records, threads: u32) -> Option<f64> {
        self.tp_row(function, records, threads)?.extra().map(|s| s.median)
    }

    fn attach_row(&self, probes: usize) -> Option<&AttachRow> {
        self.attach.iter().find(|r| r.probes == probes)
    }

    /// The whole report.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        let runs = if self.reps == 1 { "1 run".to_string() } else { format!("{} runs", self.reps) };
        let _ = writeln!(o, "Run of {} with `{}`, {runs} of everything.", self.date, self.command);
        if self.smoke {
            let _ = writeln!(o, "**A smoke run: short bursts, one run; the numbers mean nothing.**\n");
        }
        if self.emulated {
            let _ = writeln!(
                o,
                "**The CPU is emulated (QEMU TCG, no KVM): the times are the emulator's, not an AArch64 CPU's, \
                 and mean nothing beside the x86-64 numbers; the instruction counts are exact, and are the \
                 figures to compare.**\n"
            );
        }
        let _ = writeln!(
            o,
            "Machine: {}. Load average (1, 5, 15 min): {} at the start, {} at the end.\n",
            self.machine, self.load.0, self.load.1
        );
        for n in &self.notes {
            let _ = writeln!(o, "- {n}");
        }
        if !self.notes.is_empty() {
            o.push('\n');
        }
        if !self.emulated {
            self.targets(o);
        }
        self.hits(o);
        self.floor(o);
        self.steps(o);
        self.attach(o);
        crate::large::markdown(&self.large, o);
        crate::real::markdown(&self.real, o);
        crate::server::markdown(&self.server, o);
        crate::whole::markdown(&self.whole, &self.whole_failures, o);
        self.toggle(o);
        self.dlopen(o);
        self.stepping(o);
        out
    }

    /// The median over the runs of `f` of the floor.
    fn floor_of(&self, f: impl Fn(&Floor) -> f64) -> Option<f64> {
        Spread::of(&self.floor.iter().map(f).collect::<Vec<_>>()).map(|s| s.median)
    }

    fn targets(&self, o: &mut String) {
        let _ = writeln!(o, "### Targets (issues 7 and 17)\n");
        let _ = writeln!(
            o,
            "\"Floor\" is what the same thing costs at best on this machine in this run, with no tracer \
             (see the floor table below).\n"
        );
        let _ = writeln!(o, "| target | goal | measured (median) | met | floor in this run |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        let mut row = |what: &str, goal: f64, unit: &str, got: Option<f64>, floor: Option<f64>| {
            let (m, met) = match got {
                Some(v) => (format!("{} {unit}", num(v)), if v <= goal { "yes" } else { "**no**" }),
                None => ("–".into(), "–"),
            };
            let floor = floor.map_or(String::new(), |f| format!("{} {unit}", num(f)));
            let _ = writeln!(o, "| {what} | ≤ {} {unit} | {m} | {met} | {floor} |", num(goal));
        };
        let own = |t: usize| self.floor_of(|f| f.own[t] - f.plain[t]);
        for (function, shape) in [
            ("work", "`imul` (hot.c)"),
            ("work_mov", "one 5-byte `mov` of an immediate"),
            ("work_rip", "a RIP-relative load"),
        ] {
            for threads in [1, 2] {
                let what = format!(
                    "count-only hit, `{function}`: {shape}, {threads} thread{}",
                    if threads == 1 { "" } else { "s" }
                );
                let got = self.tp_extra_on(function, Records::Count, threads);
                row(&what, 1.5, "ns", got, own(threads as usize - 1));
            }
        }
        let event = self.floor_of(|f| f.event);
        let timed = self.floor_of(|f| f.timed);
        row("entry event with arguments and timestamp", 15.0, "ns", self.tp_extra(Records::Args, 1), event);
        row("entry event, 2 threads", 15.0, "ns", self.tp_extra(Records::Args, 2), event);
        row("exit with latency (`--ret`)", 25.0, "ns", self.tp_extra(Records::Ret, 1), timed);
        row("entry + exit with latency (`--args --ret`)", 30.0, "ns", self.tp_extra(Records::ArgsRet, 1), timed);
        let a1 = self.attach_row(1);
        let a10k = self.attach_row(10_000);
        let med = |r: Option<&AttachRow>, f: fn(&Cycle) -> f64| r.and_then(|r| r.spread(f)).map(|s| s.median);
        row("attach 1 probe: wall", 10.0, "ms", med(a1, |c| c.attach_wall_ms), None);
        row("attach 1 probe: target stopped", 1000.0, "µs", med(a1, |c| c.attach_stop_us), None);
        row("attach 10,000 probes: wall", 1000.0, "ms", med(a10k, |c| c.attach_wall_ms), None);
        row("attach 10,000 probes: target stopped (in total)", 50_000.0, "µs", med(a10k, |c| c.attach_stop_us), None);
        row(
            "attach 10,000 probes: any thread stopped (in total, the worker's remote syscalls too)",
            50_000.0,
            "µs",
            med(a10k, |c| c.worker_us),
            None,
        );
        use crate::real::{Case, median};
        let real = |case, cached, f| median(&self.real, case, cached, f);
        row(
            "attach 1 probe in libc (python3), seen before: wall",
            10.0,
            "ms",
            real(Case::Malloc, true, |a| a.wall_ms),
            None,
        );
        row(
            "attach 1 probe in libc (python3), first time: wall",
            50.0,
            "ms",
            real(Case::Malloc, false, |a| a.wall_ms),
            None,
        );
        row("… with `--ret`, seen before: wall", 10.0, "ms", real(Case::MallocRet, true, |a| a.wall_ms), None);
        row("… with `--ret`, first time: wall", 50.0, "ms", real(Case::MallocRet, false, |a| a.wall_ms), None);
        let per10k = |cached| {
            let probes = real(Case::PostgresAll, cached, |a| a.probes as f64)?;
            real(Case::PostgresAll, cached, |a| a.wall_ms).map(|w| w * 10_000.0 / probes)
        };
        row("postgres `-f '*'`, first time: wall per 10,000 probes", 1000.0, "ms", per10k(false), None);
        row("postgres `-f '*'`: target stopped", 50_000.0, "µs", real(Case::PostgresAll, false, |a| a.stop_us), None);
        row(
            "postgres `-f '*'`: any thread stopped (in total, the worker's remote syscalls too)",
            50_000.0,
            "µs",
            real(Case::PostgresAll, false, |a| a.worker_us),
            None,
        );
        row("toggle one probe (no stop)", 100.0, "ns", Spread::of(&self.toggle).map(|s| s.median), None);
        o.push('\n');
    }

    fn floor(&self, o: &mut String) {
        if self.floor.is_empty() {
            return;
        }
        let _ = writeln!(o, "### Floor in this run (no tracer; targets/floor.c)\n");
        let _ = writeln!(o, "| | 1 thread | 2 threads |");
        let _ = writeln!(o, "|---|---|---|");
        let s = |f: &dyn Fn(&Floor) -> f64| show(Spread::of(&self.floor.iter().map(f).collect::<Vec<_>>()));
        let _ =
            writeln!(o, "| tiny function, ns per call per thread | {} | {} |", s(&|f| f.plain[0]), s(&|f| f.plain[1]));
        let _ = writeln!(
            o,
            "| extra for a plain `inc` of a thread's own counter (as tp counts in a thread's row) | {} | {} |",
            s(&|f| f.own[0] - f.plain[0]),
            s(&|f| f.own[1] - f.plain[1])
        );
        let _ = writeln!(
            o,
            "| extra for a `lock inc` of a per-thread counter (tp's rows before issue 17) | {} | {} |",
            s(&|f| f.slot[0] - f.plain[0]),
            s(&|f| f.slot[1] - f.plain[1])
        );
        let _ = writeln!(
            o,
            "| extra for one shared `lock inc` | {} | {} |",
            s(&|f| f.shared[0] - f.plain[0]),
            s(&|f| f.shared[1] - f.plain[1])
        );
        let _ = writeln!(o, "| one `rdtsc`, ns | {} | |", s(&|f| f.rdtsc));
        let _ = writeln!(
            o,
            "| extra for one `rdtsc` and a 64-byte event written to a ring (an entry event at best) | {} | |",
            s(&|f| f.event)
        );
        let _ = writeln!(
            o,
            "| the same, its ring found through four dependent loads after the word at fs:0 is hashed (a cache \
             entry, a thread state, a ring slot, its head: how tp found a thread's ring until issue 17's third \
             round) | {} | |",
            s(&|f| f.found)
        );
        let _ = writeln!(
            o,
            "| the same, through three: the word at fs:0 hashed, then the cache entry's ring slot and the slot's \
             head (how tp finds it now) | {} | |",
            s(&|f| f.now)
        );
        let _ = writeln!(
            o,
            "| the same, through one: the head and the ring in a block of the thread's own at a fixed offset from \
             its thread pointer (what tp would pay if it owned such a block, through a segment register, in every \
             thread of the target) | {} | |",
            s(&|f| f.owned)
        );
        let _ = writeln!(
            o,
            "| extra for a return taken over: the function returns to a stub that jumps back | {} | |",
            s(&|f| f.hijack)
        );
        let _ = writeln!(
            o,
            "| extra for both, with a second `rdtsc` at the return (an exit with its latency at best) | {} | |",
            s(&|f| f.timed)
        );
        o.push('\n');
    }

    fn hits(&self, o: &mut String) {
        let _ = writeln!(o, "### Cost of a hit: extra ns per call of `work()`\n");
        let _ = writeln!(
            o,
            "Median [min–max] over the runs; each run compares probed and unprobed phases in one target process. \
             \"tp ÷ peer\" divides tp's extra cost (same records, same threads) by the peer's.\n"
        );
        let _ = writeln!(
            o,
            "| probe | records | threads | extra ns/call | probed ns/call | unprobed ns/call | tp ÷ peer | start → live ms | target stopped µs | counts exact |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.hit {
            let spread = |f: fn(&Run) -> f64| show(Spread::of(&r.runs.iter().map(f).collect::<Vec<_>>()));
            let extra = r.extra();
            let vs = if r.tp {
                String::new()
            } else {
                let tp = self.tp_extra(r.records, r.threads).or_else(|| self.tp_extra(r.records, 1));
                match (tp, extra) {
                    (Some(t), Some(p)) => ratio(t, p.median),
                    _ => "–".into(),
                }
            };
            let stop = if r.tp {
                show(Spread::of(&r.runs.iter().filter_map(|x| x.outcome.tp_stop_us).collect::<Vec<_>>()))
            } else {
                String::new()
            };
            let exact = exactness(r);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {vs} | {} | {stop} | {exact} |",
                r.name,
                r.records.label(),
                r.threads,
                show(extra),
                spread(|x| x.probed),
                spread(|x| x.base),
                spread(|x| x.live_ms),
            );
        }
        o.push('\n');
        for r in &self.hit {
            for f in &r.failures {
                let _ = writeln!(o, "- {} ({} threads), failed run: {}", r.name, r.threads, first_line(f));
            }
        }
        if self.hit.iter().any(|r| !r.failures.is_empty()) {
            o.push('\n');
        }
    }

    fn steps(&self, o: &mut String) {
        if self.steps.is_empty() {
            return;
        }
        let _ = writeln!(o, "### Instructions per hit (exact; single-stepped with ptrace)\n");
        let _ = writeln!(o, "| probe | instructions per call | extra | in the detour | in tp's runtime |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        for s in &self.steps {
            let mut name = match (&s.label, s.records) {
                (Some(l), _) => format!("tp: {l}"),
                (None, Some(r)) => format!("tp: {}", r.label()),
                (None, None) => "unprobed".to_string(),
            };
            if s.function != "work" {
                name = format!("{name}, `{}`", s.function);
            }
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} | {} |",
                s.count.total,
                s.count.total as i64 - s.base as i64,
                s.count.detour,
                s.count.runtime
            );
        }
        o.push('\n');
        if !self.shapes.is_empty() {
            let _ = writeln!(o, "The functions of targets/hot.c, as `tp list-probes` sees them:\n");
            let _ = writeln!(o, "| function | window |");
            let _ = writeln!(o, "|---|---|");
            for (f, verdict) in &self.shapes {
                let _ = writeln!(o, "| `{f}` | {verdict} |");
            }
            o.push('\n');
        }
    }

    fn attach(&self, o: &mut String) {
        if self.attach.is_empty() {
            return;
        }
        let _ = writeln!(o, "### Attach and detach (`tp attach -p PID -f GLOB`, then Ctrl-C)\n");
        let _ = writeln!(
            o,
            "| probes | attach: wall ms | tp's own ms | target stopped µs | one thread stopped µs | detach: wall ms | target stopped µs |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for r in &self.attach {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                int(r.probes as u64),
                show(r.spread(|c| c.attach_wall_ms)),
                show(r.spread(|c| c.attach_tp_ms)),
                show(r.spread(|c| c.attach_stop_us)),
                show(r.spread(|c| c.worker_us)),
                show(r.spread(|c| c.detach_wall_ms)),
                show(r.spread(|c| c.detach_stop_us)),
            );
        }
        o.push('\n');
        let _ = writeln!(o, "Memory tp adds to the target (count-only probes, read from its data region and smaps):\n");
        let _ = writeln!(
            o,
            "| probes | detour code, bytes per probe | code arenas: used / mapped | data reserved per probe | data region: mapped / resident |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|");
        for r in &self.attach {
            let Some(c) = r.cycles.last() else { continue };
            let m = &c.memory;
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {} B | {} / {} |",
                int(r.probes as u64),
                num(m.detour_bytes as f64 / r.probes as f64),
                bytes(m.arena_used),
                bytes(m.arena_mapped),
                m.data_per_probe,
                bytes(m.region_bytes),
                bytes(m.region_rss),
            );
        }
        o.push('\n');
        for r in &self.attach {
            for f in &r.failures {
                let _ = writeln!(o, "- {} probes, failed cycle: {}", r.probes, first_line(f));
            }
        }
    }

    fn dlopen(&self, o: &mut String) {
        if self.dlopen.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "### Loading a library while a session waits for one
"
        );
        let _ = writeln!(o, "| `dlcycle 500` (dlopen, a call, dlclose) | µs per cycle | extra µs per cycle |");
        let _ = writeln!(o, "|---|---|---|");
        let of = |i: usize| Spread::of(&self.dlopen.iter().filter_map(|run| run.get(i).copied()).collect::<Vec<_>>());
        let alone = of(0).map(|s| s.median);
        for (i, (what, _)) in crate::dlopen::HOW.iter().enumerate() {
            let extra = match (i, of(i), alone) {
                (0, _, _) => String::new(),
                (_, Some(s), Some(a)) => num(s.median - a),
                _ => "–".to_string(),
            };
            let _ = writeln!(o, "| {what} | {} | {extra} |", show(of(i)));
        }
        o.push('\n');
    }

    fn stepping(&self, o: &mut String) {
        let Some(&(insns, ..)) = self.stepping.first() else { return };
        let _ = writeln!(o, "### A call stepped instruction by instruction (`--steps`)\n");
        let _ = writeln!(
            o,
            "| `steploop`: {insns} instructions | instructions stepped per second | times slower than unprobed |"
        );
        let _ = writeln!(o, "|---|---|---|");
        let rate = Spread::of(&self.stepping.iter().map(|r| r.1).collect::<Vec<_>>());
        let slower = Spread::of(&self.stepping.iter().map(|r| r.2).collect::<Vec<_>>());
        let _ =
            writeln!(o, "| ptrace (PTRACE_SINGLESTEP, a wait, PTRACE_GETREGS) | {} | {} |", show(rate), show(slower));
        if !self.stepping_trap.is_empty() {
            let rate = Spread::of(&self.stepping_trap.iter().map(|r| r.1).collect::<Vec<_>>());
            let slower = Spread::of(&self.stepping_trap.iter().map(|r| r.2).collect::<Vec<_>>());
            let _ = writeln!(
                o,
                "| in the target (`--step-engine trap`: the trap flag, tp's SIGTRAP handler) | {} | {} |",
                show(rate),
                show(slower)
            );
            // Each run's in-target rate over the ptrace rate of the same repetition.
            let ratios: Vec<f64> =
                self.stepping_trap.iter().zip(&self.stepping).map(|(t, p)| t.1 / p.1.max(1e-9)).collect();
            let _ = writeln!(o, "| in the target over ptrace, per repetition | {} | |", show(Spread::of(&ratios)));
        }
        o.push('\n');
        if !self.trap_floor.is_empty() {
            let _ = writeln!(o, "| the in-target engine's floor (targets/trapcost) | ns each |");
            let _ = writeln!(o, "|---|---|");
            let col = |f: fn(&(f64, f64)) -> f64| show(Spread::of(&self.trap_floor.iter().map(f).collect::<Vec<_>>()));
            let _ = writeln!(o, "| a single-step trap delivered to an empty SIGTRAP handler | {} |", col(|r| r.0));
            let _ = writeln!(o, "| a signal a thread sends itself (tgkill) and handles | {} |", col(|r| r.1));
            o.push('\n');
        }
        let Some(&(own, ..)) = self.stepping_depth.first() else { return };
        let _ = writeln!(
            o,
            "| `stepcaller`: {own} own instructions, each call of `stepleaf` (12) | µs stepped | ns per call of `stepleaf` run free |"
        );
        let _ = writeln!(o, "|---|---|---|");
        let col = |f: fn(&crate::stepping::DepthRow) -> f64| {
            show(Spread::of(&self.stepping_depth.iter().map(f).collect::<Vec<_>>()))
        };
        let _ = writeln!(o, "| `--step-depth 0`: the calls run free | {} | {} |", col(|r| r.1), col(|r| r.3));
        let _ = writeln!(o, "| every call stepped | {} | |", col(|r| r.2));
        o.push('\n');
    }

    fn toggle(&self, o: &mut String) {
        let _ = writeln!(o, "### Toggle\n");
        let _ = writeln!(o, "| how | ns per toggle | target stopped |");
        let _ = writeln!(o, "|---|---|---|");
        let _ = writeln!(
            o,
            "| enable flag store through tp's library (`Region::set_enabled`) | {} | no |",
            show(Spread::of(&self.toggle))
        );
        let _ = writeln!(
            o,
            "| `tp disable` / `tp enable` command, start to exit (ms, not ns) | {} ms | no |",
            show(Spread::of(&self.toggle_command))
        );
        o.push('\n');
    }

    /// The instruction listings of the hit paths (outside the target's code).
    pub fn listings(&self) -> String {
        let mut out = String::new();
        for s in &self.steps {
            let Some(r) = s.records else { continue };
            let name = s.label.clone().unwrap_or_else(|| r.label().to_string());
            let _ = writeln!(
                out,
                "== tp: {name} on `{}` ({} instructions outside the function)",
                s.function,
                s.count.listing.len()
            );
            for l in &s.count.listing {
                let _ = writeln!(out, "  {l}");
            }
            out.push('\n');
        }
        out
    }
}

fn exactness(r: &HitRow) -> String {
    let checked: Vec<bool> = r.runs.iter().filter_map(|x| x.hits_ok).collect();
    let lost: u64 = r.runs.iter().filter_map(|x| x.outcome.lost).sum();
    let mut s = if checked.is_empty() {
        "–".to_string()
    } else if checked.iter().all(|&b| b) {
        "yes".to_string()
    } else {
        format!("**no** ({} of {} runs)", checked.iter().filter(|&&b| !b).count(), checked.len())
    };
    if lost > 0 {
        let _ = write!(s, "; {} events lost", num(lost as f64));
    }
    s
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn bytes(b: u64) -> String {
    match b {
        b if b >= 10 << 20 => format!("{} MiB", b >> 20),
        b if b >= 10 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
