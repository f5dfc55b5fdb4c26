//! tp's benchmark (issue 7): what a probe hit, an attach, a detach and a
//! toggle cost, beside the tools a user would pick instead, measured the
//! same way in one run. `cargo bench --bench tp` runs it (`just bench`);
//! docs/benchmarks.md explains the method and holds the latest numbers.
//!
//! ```text
//! cargo bench --bench tp [-- OPTIONS]
//!   --reps N     runs of every measurement (default 5)
//!   --smoke      one short run of everything, to check that it works (CI)
//!   --only LIST  sections to run, comma-separated:
//!                hit,steps,attach,large,real,profile,whole,toggle,dlopen,
//!                stepping (`--steps`: a call stepped with ptrace)
//!                (whole: every function of libsqlite3 counted in
//!                the sqlite3 shell)
//!                (large: 100,000 and 250,000 probes on programs it
//!                generates; not run unless named)
//!   --no-peers   tp only
//!   --match LIST only the rows of tp (hit cost, instruction counts) and of
//!                its peers whose name contains one of LIST (comma-separated)
//!   --doc        also write the results into docs/benchmarks.md
//!   --emulated   the CPU is emulated (the arm64 test VM): no targets
//!                table, and the report says the times mean nothing
//! ```
//!
//! Needs root (ptrace, tracefs). Results also go to target/bench/.

mod attach;
mod dlopen;
mod env;
mod floor;
mod hit;
mod large;
mod peers;
mod proc;
mod real;
mod report;
mod server;
mod stats;
mod stepping;
mod steps;
mod toggle;
mod whole;

use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::hit::{Records, Tp, Tracer};
use crate::report::{AttachRow, HitRow, Results, StepRow};

/// Command-line options.
struct Options {
    reps: usize,
    smoke: bool,
    sections: Vec<String>,
    peers: bool,
    doc: bool,
    emulated: bool,
    matching: Option<String>,
}

const SECTIONS: [&str; 10] =
    ["steps", "attach", "large", "real", "profile", "whole", "toggle", "dlopen", "stepping", "hit"];

fn options() -> Result<Options> {
    let mut o = Options {
        reps: 5,
        smoke: false,
        // `large` builds programs of 250,000 functions: only when named.
        sections: SECTIONS.iter().filter(|s| **s != "large").map(|s| s.to_string()).collect(),
        peers: true,
        doc: false,
        emulated: false,
        matching: None,
    };
    let mut args = std::env::args().skip(1);
    let mut reps_given = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {} // cargo bench passes it
            "--smoke" => o.smoke = true,
            "--no-peers" => o.peers = false,
            "--doc" => o.doc = true,
            "--emulated" => o.emulated = true,
            "--reps" => {
                let v = args.next().context("--reps needs a number")?;
                o.reps = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--reps: `{v}` is not a positive number"))?;
                reps_given = true;
            }
            "--match" => o.matching = Some(args.next().context("--match needs a list of names")?),
            "--only" => {
                let v = args.next().context("--only needs a list of sections")?;
                o.sections = v.split(',').map(str::to_string).collect();
                if let Some(bad) = o.sections.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    bail!("--only: no section `{bad}` (sections: {})", SECTIONS.join(", "));
                }
            }
            other => bail!(
                "unknown option `{other}` (options: --reps N, --smoke, --only LIST, --no-peers, --match LIST, --doc, \
                 --emulated)"
            ),
        }
    }
    if o.smoke && !reps_given {
        o.reps = 1;
    }
    Ok(o)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the sections; Ok(false) if a measurement of tp failed.
fn run() -> Result<bool> {
    let o = options()?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark needs root (ptrace of other processes, tracefs)");
    }
    let env = Env::new(o.smoke, o.reps);
    let mut r = Results {
        date: env::first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default(),
        command: command_line(),
        machine: env::machine(),
        load: (env::load_average(), String::new()),
        reps: o.reps,
        smoke: o.smoke,
        emulated: o.emulated,
        ..Results::default()
    };
    eprintln!("bench: {} runs; load average {}; {}", o.reps, r.load.0, r.machine);
    if env::load1() > 1.5 && !o.smoke {
        eprintln!("bench: the load average is above 1.5: other work on this machine will show in the numbers");
    }
    let mut ok = true;
    let on = |s: &str| o.sections.iter().any(|x| x == s);
    if on("steps") {
        ok &= steps_section(&env, &o, &mut r);
    }
    if on("attach") {
        ok &= attach_section(&env, &mut r);
    }
    if on("large") {
        ok &= large_section(&env, &mut r);
    }
    if on("real") {
        ok &= real_section(&env, &mut r);
    }
    if on("profile") {
        ok &= profile_section(&env, &mut r);
    }
    if on("whole") {
        whole::measure(&env, &mut r.whole, &mut r.whole_failures);
        ok &= r.whole_failures.is_empty();
    }
    if on("toggle") {
        ok &= toggle_section(&env, &mut r);
    }
    if on("dlopen") {
        ok &= dlopen_section(&env, &mut r);
    }
    if on("stepping") {
        ok &= stepping_section(&env, &mut r);
    }
    if on("hit") {
        ok &= hit_section(&env, &o, &mut r);
    }
    r.load.1 = env::load_average();
    let md = r.markdown();
    if o.emulated {
        // For .ci/aarch64/bench.sh, which reads it off the VM's console.
        println!("\n{EMULATED_BEGIN}\n{md}{EMULATED_END}");
    } else {
        println!("\n{md}");
    }
    let out = env.root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("results.md"), &md)?;
    std::fs::write(out.join("listing.txt"), r.listings())?;
    eprintln!("bench: written to {}", out.display());
    if o.doc {
        write_doc(&env, &md)?;
    }
    if !ok {
        eprintln!("bench: some measurements of tp failed (above)");
    }
    Ok(ok)
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench" && a != "--doc").collect();
    if args.is_empty() {
        "cargo bench --bench tp".into()
    } else {
        format!("cargo bench --bench tp -- {}", args.join(" "))
    }
}

fn steps_section(env: &Env, o: &Options, r: &mut Results) -> bool {
    let mut ok = true;
    let chosen = |(records, _, _): &(Option<Records>, &str, &str)| match (records, &o.matching) {
        (Some(records), Some(m)) => m.split(',').any(|w| format!("tp: {}", records.label()).contains(w)),
        _ => true,
    };
    let mut rows: Vec<(Option<Records>, &'static str, &'static str)> = vec![
        (None, "hot", "work"),
        (Some(Records::Count), "hot", "work"),
        (Some(Records::Disabled), "hot", "work"),
        (Some(Records::Args), "hot", "work"),
        (Some(Records::Ret), "hot", "work"),
        (Some(Records::ArgsRet), "hot", "work"),
        (Some(Records::RetStack), "hot", "work"),
        (Some(Records::ArgsRetStack), "hot", "work"),
        (Some(Records::FalsePredicate), "hot", "work"),
        (Some(Records::Aggregated), "hot", "work"),
        (Some(Records::AggValue), "hot", "work"),
        (Some(Records::AggLatency), "hot", "work"),
        (Some(Records::AggLatencyByArg), "hot", "work"),
        (Some(Records::CountByCaller), "hot", "work"),
        (Some(Records::AggLatencyByCaller), "hot", "work"),
        (Some(Records::CountByStack), "hot-fp", "work"),
        (Some(Records::AggLatencyByStack), "hot-fp", "work"),
        (Some(Records::Count), "hot-nop5", "work"),
    ];
    for f in SHAPES {
        rows.extend([(None, "hot", f), (Some(Records::Count), "hot", f)]);
    }
    for (records, binary, function) in rows.into_iter().filter(chosen) {
        if !env.target(binary).exists() {
            r.notes.push(format!("Instruction counts: no `{binary}` on this architecture, so no row for it."));
            continue;
        }
        match steps::count(env, binary, records, function) {
            Ok((base, probed)) => {
                let count = probed.unwrap_or_else(|| base.clone());
                eprintln!(
                    "steps: {binary} {records:?} on {function}: {} instructions per call (unprobed {})",
                    count.total, base.total
                );
                let label = (binary == "hot-nop5").then(|| hit::NOP5_LABEL.to_string());
                r.steps.push(StepRow { records, function, count, base: base.total, label });
            }
            Err(e) => {
                eprintln!("steps: {binary} {records:?} on {function}: {e:#}");
                // Under an emulated CPU a path whose shared words are
                // updated by load/store-exclusive loops may never get
                // through single-stepping (a step may clear the exclusive
                // monitor): the report says which row, and the timed rows
                // still check that path's counts.
                let stepping = format!("{e:#}");
                if o.emulated && (stepping.contains("did not return within") || stepping.contains("was not reached in"))
                {
                    let what = records.map_or("unprobed".to_string(), |r| format!("tp: {}", r.label()));
                    r.notes.push(format!(
                        "Instruction counts: `{what}` on `{function}` could not be single-stepped to the end \
                         ({stepping}); a load/store-exclusive loop retried at every step is the likely cause."
                    ));
                } else {
                    ok = false;
                }
            }
        }
    }
    match steps::windows(env, &["work", "work_mov", "work_rip"]) {
        Ok(w) => r.shapes = w,
        Err(e) => {
            eprintln!("steps: tp list-probes: {e:#}");
            ok = false;
        }
    }
    ok
}

/// The functions of targets/hot.c besides `work` whose count-only hits the
/// benchmark measures (issue 17): other first instructions.
const SHAPES: [&str; 2] = ["work_mov", "work_rip"];

fn attach_section(env: &Env, r: &mut Results) -> bool {
    let mut rows: Vec<AttachRow> = attach::SIZES
        .iter()
        .map(|&(probes, _)| AttachRow { probes, cycles: Vec::new(), failures: Vec::new() })
        .collect();
    for rep in 0..env.reps {
        for (row, &(probes, glob)) in rows.iter_mut().zip(attach::SIZES.iter()) {
            match attach::cycle(env, probes, glob) {
                Ok(c) => {
                    eprintln!(
                        "attach: {probes} probes, run {}: attach {:.1} ms (stopped {} µs), detach {:.1} ms (stopped {} µs)",
                        rep + 1,
                        c.attach_wall_ms,
                        c.attach_stop_us,
                        c.detach_wall_ms,
                        c.detach_stop_us
                    );
                    row.cycles.push(c);
                }
                Err(e) => {
                    eprintln!("attach: {probes} probes, run {}: {e:#}", rep + 1);
                    row.failures.push(format!("{e:#}"));
                }
            }
        }
    }
    let ok = rows.iter().all(|row| row.failures.is_empty());
    r.attach = rows;
    ok
}

fn large_section(env: &Env, r: &mut Results) -> bool {
    let mut ok = true;
    for n in large::SIZES {
        let bin = match large::program(env, n) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("large: {e:#}");
                r.notes.push(format!("attach at scale ({n} functions): {e:#}"));
                ok = false;
                continue;
            }
        };
        let mut rows = [false, true].map(|cached| large::Row { probes: n, cached, ..Default::default() });
        for rep in 0..env.reps {
            let cache = match large::fresh_cache(env, n) {
                Ok(c) => c,
                Err(e) => {
                    rows[0].failures.push(format!("{e:#}"));
                    continue;
                }
            };
            for row in rows.iter_mut() {
                match large::cycle(env, &bin, n, &cache) {
                    Ok(c) => {
                        eprintln!(
                            "large: {n} probes ({}), run {}: attach {:.0} ms (CPU {:.0} ms, stopped {:.0} µs), detach {:.0} ms (stopped {:.0} µs)",
                            if row.cached { "cached" } else { "first" },
                            rep + 1,
                            c.attach_wall_ms,
                            c.attach_cpu_ms,
                            c.attach_stop_us,
                            c.detach_wall_ms,
                            c.detach_stop_us
                        );
                        row.cycles.push(c);
                    }
                    Err(e) => {
                        eprintln!("large: {n} probes, run {}: {e:#}", rep + 1);
                        row.failures.push(format!("{e:#}"));
                        ok = false;
                    }
                }
            }
        }
        r.large.extend(rows);
    }
    ok
}

fn real_section(env: &Env, r: &mut Results) -> bool {
    let mut rows: Vec<real::Row> = real::Case::ALL.iter().map(|_| real::Row::default()).collect();
    for rep in 0..env.reps {
        real::run_once(env, rep, &mut rows);
    }
    let ok = rows.iter().all(|row| row.failures.is_empty());
    r.real = rows;
    ok
}

fn profile_section(env: &Env, r: &mut Results) -> bool {
    let mut rows: Vec<server::Row> = server::Watcher::ALL.iter().map(|_| server::Row::default()).collect();
    let mut rate = 1000.0;
    for _ in 0..env.reps {
        server::run_once(env, &mut rows, &mut rate);
    }
    // perf is a peer: its failures are notes; tp's rows must all succeed.
    let ok =
        rows.iter().zip(server::Watcher::ALL).all(|(row, w)| w == server::Watcher::Perf || row.failures.is_empty());
    r.server = rows;
    ok
}

fn dlopen_section(env: &Env, r: &mut Results) -> bool {
    let cycles = if env.smoke { 20 } else { 500 };
    let mut ok = true;
    for _ in 0..env.reps {
        match dlopen::measure(env, cycles) {
            Ok(us) => {
                eprintln!("dlopen: µs per load, call and unload: {us:.1?}");
                r.dlopen.push(us);
            }
            Err(e) => {
                eprintln!("dlopen: {e:#}");
                ok = false;
            }
        }
    }
    ok
}

fn stepping_section(env: &Env, r: &mut Results) -> bool {
    let iterations = if env.smoke { 1_000 } else { 100_000 };
    let mut ok = true;
    // The in-target engine needs a trap flag user code can set.
    let engines: &[&str] = if cfg!(target_arch = "x86_64") { &["ptrace", "trap"] } else { &["ptrace"] };
    for _ in 0..env.reps {
        for &engine in engines {
            match stepping::measure(env, iterations, engine) {
                Ok(row) => {
                    eprintln!(
                        "stepping ({engine}): {} instructions, {:.0} per second, {:.0} times slower",
                        row.0, row.1, row.2
                    );
                    if engine == "trap" { r.stepping_trap.push(row) } else { r.stepping.push(row) }
                }
                Err(e) => {
                    eprintln!("stepping ({engine}): {e:#}");
                    ok = false;
                }
            }
        }
        if engines.contains(&"trap") {
            match stepping::floor(env, if env.smoke { 1_000 } else { 100_000 }) {
                Ok(row) => {
                    eprintln!("stepping floor: {:.0} ns per trap, {:.0} ns per signal", row.0, row.1);
                    r.trap_floor.push(row);
                }
                Err(e) => {
                    eprintln!("stepping floor: {e:#}");
                    ok = false;
                }
            }
        }
        match stepping::measure_depth(env, if env.smoke { 100 } else { 2_000 }) {
            Ok(row) => {
                eprintln!(
                    "stepping --step-depth 0: {} own instructions, {:.0} µs (all stepped: {:.0} µs), {:.0} ns per call run free",
                    row.0, row.1, row.2, row.3
                );
                r.stepping_depth.push(row);
            }
            Err(e) => {
                eprintln!("stepping --step-depth 0: {e:#}");
                ok = false;
            }
        }
    }
    ok
}

fn toggle_section(env: &Env, r: &mut Results) -> bool {
    let (rounds, commands) = if env.smoke { (1_000, 1) } else { (100_000, 10) };
    let mut ok = true;
    for _ in 0..env.reps {
        match toggle::measure(env, rounds, commands) {
            Ok(t) => {
                eprintln!("toggle: {:.1} ns per store, {:.2} ms per command", t.store_ns, t.command_ms);
                r.toggle.push(t.store_ns);
                r.toggle_command.push(t.command_ms);
            }
            Err(e) => {
                eprintln!("toggle: {e:#}");
                ok = false;
            }
        }
    }
    ok
}

/// The rows of the hit table: tp's, then the peers' that are available.
fn tracers(o: &Options, notes: &mut Vec<String>) -> Vec<(Box<dyn Tracer>, u32)> {
    let mut v: Vec<(Box<dyn Tracer>, u32)> = Vec::new();
    for (records, threads) in [
        (Records::Count, 1),
        (Records::Count, 2),
        (Records::Disabled, 1),
        (Records::Args, 1),
        (Records::Args, 2),
        (Records::Ret, 1),
        (Records::Ret, 2),
        (Records::ArgsRet, 1),
        (Records::RetStack, 1),
        (Records::ArgsRetStack, 1),
        (Records::FalsePredicate, 1),
        (Records::Aggregated, 1),
        (Records::AggValue, 1),
        (Records::AggLatency, 1),
        (Records::AggLatencyByArg, 1),
        (Records::CountByCaller, 1),
        (Records::AggLatencyByCaller, 1),
        (Records::CountByStack, 1),
        (Records::AggLatencyByStack, 1),
        (Records::StackFp(10), 1),
        (Records::StackFp(30), 1),
        (Records::StackCopy(1024), 1),
        (Records::StackCopy(4096), 1),
    ] {
        v.push((Box::new(Tp::new(records)), threads));
    }
    if cfg!(target_arch = "x86_64") {
        v.push((Box::new(Tp::nop5()), 1));
    }
    for f in SHAPES {
        for threads in [1, 2] {
            v.push((Box::new(Tp::on(Records::Count, f)), threads));
        }
    }
    // Returns taken over where the callers return too, as in real programs.
    v.push((Box::new(Tp::on(Records::Ret, "work_deep")), 1));
    // Every block of a loop counted: the cost per block.
    v.push((Box::new(Tp::on(Records::Blocks, "work_blocks")), 1));
    if !o.peers {
        return v;
    }
    match peers::tracefs_ready() {
        Ok(()) => {
            v.push((Box::new(peers::Uprobe::int3()), 1));
            v.push((Box::new(peers::Uprobe::int3()), 2));
            if cfg!(target_arch = "x86_64") {
                v.push((Box::new(peers::Uprobe::nop5()), 1));
            }
            v.push((Box::new(peers::Uprobe::args()), 1));
            v.push((Box::new(peers::Uprobe::ret()), 1));
        }
        Err(e) => notes.push(format!("uprobes skipped: {e:#}")),
    }
    match peers::Gdb::new() {
        Ok(g) => v.push((Box::new(g), 1)),
        Err(e) => notes.push(format!("gdb skipped: {e:#}")),
    }
    for depth in [10, 30] {
        match peers::Bpftrace::ustack(depth) {
            Ok(b) => v.push((Box::new(b), 1)),
            Err(e) => {
                notes.push(format!("bpftrace skipped: {e:#}"));
                break;
            }
        }
    }
    for records in [Records::StackFp(30), Records::StackCopy(1024), Records::StackCopy(4096)] {
        match peers::Perf::call_graph(records) {
            Ok(p) => v.push((Box::new(p), 1)),
            Err(e) => {
                notes.push(format!("perf skipped: {e:#}"));
                break;
            }
        }
    }
    for records in [Records::Count, Records::Args, Records::Ret] {
        match peers::Frida::new(records) {
            Ok(f) => v.push((Box::new(f), 1)),
            Err(e) => {
                notes.push(format!("Frida skipped: {e:#}"));
                break;
            }
        }
    }
    v
}

fn hit_section(env: &Env, o: &Options, r: &mut Results) -> bool {
    let mut list = tracers(o, &mut r.notes);
    if let Some(m) = &o.matching {
        list.retain(|(t, _)| m.split(',').any(|w| t.name().contains(w)));
    }
    for n in &r.notes {
        eprintln!("bench: {n}");
    }
    let mut rows: Vec<HitRow> = list
        .iter()
        .map(|(t, threads)| HitRow {
            name: t.name(),
            function: t.function(),
            records: t.records(),
            threads: *threads,
            tp: t.name().starts_with("tp:"),
            runs: Vec::new(),
            failures: Vec::new(),
        })
        .collect();
    // Repetitions outside, so the noise of a given minute spreads over every row.
    for rep in 0..env.reps {
        if cfg!(target_arch = "x86_64") {
            match floor::measure(env) {
                Ok(f) => {
                    eprintln!(
                        "floor: run {}: thread's own inc +{:.2} ns (1 thread), +{:.2} ns (2 threads); per-thread \
                         lock inc +{:.2} ns, +{:.2} ns; rdtsc {:.2} ns; event +{:.2} ns, return taken over \
                         +{:.2} ns, timed exit +{:.2} ns",
                        rep + 1,
                        f.own[0] - f.plain[0],
                        f.own[1] - f.plain[1],
                        f.slot[0] - f.plain[0],
                        f.slot[1] - f.plain[1],
                        f.rdtsc,
                        f.event,
                        f.hijack,
                        f.timed
                    );
                    r.floor.push(f);
                }
                Err(e) => eprintln!("floor: {e:#}"),
            }
        }
        for ((tracer, threads), row) in list.iter_mut().zip(rows.iter_mut()) {
            let result = hit::run_once(env, tracer.as_mut(), *threads);
            peers::tracefs_cleanup();
            match result {
                Ok(run) => {
                    eprintln!(
                        "hit: {} ({} threads), run {}: {:+.2} ns/call (probed {:.2}, unprobed {:.2}), live in {:.1} ms",
                        row.name,
                        threads,
                        rep + 1,
                        run.extra(),
                        run.probed,
                        run.base,
                        run.live_ms
                    );
                    row.runs.push(run);
                }
                Err(e) => {
                    eprintln!("hit: {} ({} threads), run {}: {e:#}", row.name, threads, rep + 1);
                    row.failures.push(format!("{e:#}"));
                }
            }
        }
    }
    let ok = rows.iter().filter(|row| row.tp).all(|row| row.failures.is_empty());
    r.hit = rows;
    ok
}

/// The lines around the report of an `--emulated` run on stdout.
const EMULATED_BEGIN: &str = "<!-- emulated results -->";
const EMULATED_END: &str = "<!-- end of emulated results -->";

/// Puts `md` into docs/benchmarks.md between its result markers.
fn write_doc(env: &Env, md: &str) -> Result<()> {
    const BEGIN: &str = "<!-- results: written by `cargo bench --bench tp -- --doc` -->";
    const END: &str = "<!-- end of results -->";
    let path = env.root.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    // The end marker that closes this section: the first after its start.
    let b = doc.find(BEGIN);
    let e = b.and_then(|b| doc[b..].find(END).map(|e| b + e));
    let (Some(b), Some(e)) = (b, e) else {
        bail!("{} has no result markers", path.display());
    };
    let updated = format!("{}{BEGIN}\n\n{md}{}", &doc[..b], &doc[e..]);
    std::fs::write(&path, updated)?;
    eprintln!("bench: results written into {}", path.display());
    Ok(())
}
