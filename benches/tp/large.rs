//! Attach and detach at the scale of the largest programs (issue 31):
//! `tp attach -f 'fn*'` on every function of a program generated here with
//! 100,000 or 250,000 functions (targets/many.c has 10,000: the normal
//! build stays as fast as it was). Each repetition attaches twice with a
//! fresh cache directory (`XDG_CACHE_HOME`): "first", then "cached" once
//! the first session saved its analysis. Measured: wall time from starting
//! `tp attach` to its `attached` line, tp's own time and its CPU time until
//! then (user and system, all its threads), the stop window tp reports, the detach
//! (SIGINT to the `detached` line) and its stop window, and the memory in
//! the target per probe (data region mapped and resident from
//! /proc/PID/smaps, detour code, code arenas mapped). Every probe must have
//! counted calls and the program's results must be right.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::attach::{Memory, check_counts, memory};
use crate::env::Env;
use crate::proc::{Proc, kv, number_before};

/// The sizes measured.
pub const SIZES: [usize; 2] = [100_000, 250_000];

/// Functions per generated source file (compiled in parallel).
const PER_FILE: usize = 25_000;

/// One attach/detach cycle.
#[derive(Debug, Clone, Default)]
pub struct Cycle {
    /// `tp attach` start → its `attached` line, ms.
    pub attach_wall_ms: f64,
    /// tp's own attach time, ms.
    pub attach_tp_ms: f64,
    /// tp's CPU time until its `attached` line, ms.
    pub attach_cpu_ms: f64,
    /// All threads stopped, µs (tp's report).
    pub attach_stop_us: f64,
    /// SIGINT → `detached` line, ms.
    pub detach_wall_ms: f64,
    /// All threads stopped for the detach, µs.
    pub detach_stop_us: f64,
    /// Memory, read while attached.
    pub memory: Memory,
    /// Bytes of the data region's memfd that hold pages (written by tp or
    /// the target), wherever they are mapped: what the region costs in RAM.
    pub region_allocated: u64,
}

/// The cycles of one size, first or cached.
#[derive(Debug, Default)]
pub struct Row {
    /// Probes.
    pub probes: usize,
    /// True for the attach with the analysis cached.
    pub cached: bool,
    /// Cycles that completed.
    pub cycles: Vec<Cycle>,
    /// Why the others failed.
    pub failures: Vec<String>,
}

/// The program with `n` functions `fn000000`…, built once into
/// target/bench/large/ (again only if its source changes): it prints
/// "ready pid=N", calls every function every 10 ms checking the results,
/// and on SIGUSR1 prints "exit rounds=N checksum=ok|BAD".
pub fn program(env: &Env, n: usize) -> Result<PathBuf> {
    let dir = env.root.join(format!("target/bench/large/many{n}"));
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join("many");
    let mut sources: Vec<(PathBuf, String)> = Vec::new();
    for (k, lo) in (0..n).step_by(PER_FILE).enumerate() {
        let mut c = String::from("#define P __attribute__((noinline, noclone, noipa, used))\n");
        for i in lo..(lo + PER_FILE).min(n) {
            c.push_str(&format!("P unsigned fn{i:06}(unsigned x) {{ return x * 0x9E3779B1u + {i}u; }}\n"));
        }
        sources.push((dir.join(format!("part{k}.c")), c));
    }
    let mut main = String::from("#include <signal.h>\n#include <stdio.h>\n#include <time.h>\n#include <unistd.h>\n");
    for i in 0..n {
        main.push_str(&format!("unsigned fn{i:06}(unsigned);\n"));
    }
    main.push_str(&format!("static unsigned (*const table[{n}])(unsigned) = {{\n"));
    for i in 0..n {
        main.push_str(&format!("fn{i:06},\n"));
    }
    main.push_str(&format!(
        r#"}};
static volatile sig_atomic_t done;
static void on_usr1(int sig) {{ (void)sig; done = 1; }}
int main(void)
{{
	signal(SIGUSR1, on_usr1);
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready pid=%d\n", (int)getpid());
	struct timespec nap = {{0, 10000000}};
	unsigned round;
	int bad = 0;
	for (round = 0; !done; round++) {{
		for (unsigned i = 0; i < {n}u; i++)
			if (table[i](round) != round * 0x9E3779B1u + i)
				bad++;
		nanosleep(&nap, NULL);
	}}
	printf("exit rounds=%u checksum=%s\n", round, bad ? "BAD" : "ok");
	return bad ? 2 : 0;
}}
"#
    ));
    sources.push((dir.join("main.c"), main));
    let fresh = bin.exists() && sources.iter().all(|(p, c)| std::fs::read_to_string(p).is_ok_and(|old| old == *c));
    if fresh {
        return Ok(bin);
    }
    eprintln!("large: building a program with {n} functions in {}", dir.display());
    let mut children = Vec::new();
    let mut objects = Vec::new();
    for (path, c) in &sources {
        std::fs::write(path, c)?;
        let obj = path.with_extension("o");
        // -O0: the build takes seconds per 25,000 functions, and each gets the usual prologue.
        let child = Command::new("gcc")
            .args(["-O0", "-fPIE", "-c", "-o"])
            .arg(&obj)
            .arg(path)
            .spawn()
            .context("cannot run gcc")?;
        children.push(child);
        objects.push(obj);
        // Two at a time: the machine has other work.
        if children.len() >= 2 {
            wait_all(&mut children)?;
        }
    }
    wait_all(&mut children)?;
    let status = Command::new("gcc").args(["-pie", "-o"]).arg(&bin).args(&objects).status()?;
    if !status.success() {
        bail!("linking {} failed", bin.display());
    }
    Ok(bin)
}

fn wait_all(children: &mut Vec<std::process::Child>) -> Result<()> {
    for mut c in children.drain(..) {
        if !c.wait()?.success() {
            bail!("gcc failed on a generated source");
        }
    }
    Ok(())
}

/// A fresh cache directory for one repetition.
pub fn fresh_cache(env: &Env, n: usize) -> Result<PathBuf> {
    let dir = env.root.join(format!("target/bench/cache/large{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// One cycle on `bin` (`n` functions) with cache directory `cache`.
pub fn cycle(env: &Env, bin: &Path, n: usize, cache: &Path) -> Result<Cycle> {
    let mut target = Proc::spawn("many (generated)", bin, &[], false)?;
    target.wait_prefix("ready", Duration::from_secs(30))?;
    let pid = target.pid();
    let args: Vec<String> = ["attach", "-p", &pid.to_string(), "-f", "fn*", "-q", "--json"].map(String::from).into();
    let cache = cache.to_str().context("a cache directory with a UTF-8 path")?;
    let mut session = Proc::spawn_env("tp attach", &env.tp, &args, false, &[("XDG_CACHE_HOME", cache)])?;
    let line = session.wait_prefix("tp: attached", Duration::from_secs(600))?;
    let attach_cpu_ms = cpu_ms(session.pid())?;
    let attach_wall_ms = line.at.duration_since(session.started).as_secs_f64() * 1e3;
    let got: usize = line.text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).context("probe count")?;
    if got != n {
        bail!("tp attached {got} probes, expected {n}: {}", line.text);
    }
    let num = |after: &str, unit: &str| {
        number_before(&line.text, after, unit).with_context(|| format!("no `{after}` in `{}`", line.text))
    };
    let (attach_tp_ms, attach_stop_us) = (num(" in ", " ms")?, num("target stopped", " µs")?);
    let memory = memory(pid, session.pid() as u32).context("reading tp's memory in the target")?;
    let region_allocated = allocated(pid).context("reading the data region's pages")?;
    // Every function runs every 10 ms; and the analysis is saved for the cached attach.
    std::thread::sleep(Duration::from_millis(300));
    saved(session.pid())?;
    let started = Instant::now();
    session.signal(libc::SIGINT);
    let done = session.wait_prefix("tp: detached from", Duration::from_secs(600))?;
    let detach_wall_ms = done.at.duration_since(started).as_secs_f64() * 1e3;
    let detach_stop_us = number_before(&done.text, "target stopped", " µs").context("detach stop time")?;
    if !session.wait_exit(Duration::from_secs(120)).is_some_and(|s| s.success()) {
        bail!("tp attach failed:\n{}", session.text());
    }
    check_counts(&session, n)?;
    target.signal(libc::SIGUSR1);
    let exit = target.wait_prefix("exit", Duration::from_secs(30))?;
    if kv(&exit.text, "checksum") != Some("ok") {
        bail!("the target computed wrong results while probed: {}", exit.text);
    }
    Ok(Cycle {
        attach_wall_ms,
        attach_tp_ms,
        attach_cpu_ms,
        attach_stop_us,
        detach_wall_ms,
        detach_stop_us,
        memory,
        region_allocated,
    })
}

/// The CPU time of process `pid` so far, ms: user and system time of all
/// its threads, those that ended too (tp plans on a thread per core), from
/// /proc/PID/stat (in clock ticks).
fn cpu_ms(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    let ticks: u64 = fields.get(11..13).context("/proc/PID/stat")?.iter().map(|f| f.parse::<u64>().unwrap_or(0)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 * 1e3 / hz)
}

/// The bytes of process `pid`'s data region (a memfd) that hold pages:
/// its data extents (SEEK_DATA / SEEK_HOLE), through
/// /proc/PID/map_files. The target's smaps counts only the pages the
/// target itself touched; the pages tp wrote through its own mapping are
/// the memfd's all the same.
fn allocated(pid: i32) -> Result<u64> {
    use std::os::fd::AsRawFd;
    let maps = tp::process::read_maps(pid)?;
    let m = tp::probe::region::find(&maps).context("no tp data region")?;
    let file = std::fs::File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))?;
    let fd = file.as_raw_fd();
    let len = file.metadata()?.len() as i64;
    let mut total = 0u64;
    let mut at = 0i64;
    while at < len {
        // SAFETY: lseek on a descriptor this function owns.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data past `at`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole };
        total += (end - data) as u64;
        at = end;
    }
    Ok(total)
}

/// Waits until tp `pid` has no thread saving analyses (`tp-cache`).
fn saved(pid: i32) -> Result<()> {
    let saving = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|mut list| {
            list.any(|t| {
                t.is_ok_and(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "tp-cache"))
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while saving() {
        if Instant::now() > deadline {
            bail!("tp was still saving its analyses after 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The table of `rows` (none: nothing).
pub fn markdown(rows: &[Row], o: &mut String) {
    use std::fmt::Write;

    use crate::stats::{Spread, int, num, show};
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "### Attach at scale (every function of a generated program)\n");
    let _ = writeln!(
        o,
        "`tp attach -p PID -f 'fn*'` on a program of 100,000 or 250,000 functions (`benches/tp/large.rs`), then \
         Ctrl-C. \"first\": a fresh cache directory; \"cached\": the attach after it. CPU: tp's user and system \
         time until its `attached` line (all its threads). Probes per second: probes ÷ attach wall time.\n"
    );
    let _ = writeln!(
        o,
        "| probes | cache | attach: wall ms | probes per s | tp's own ms | tp CPU ms | target stopped µs | detach: wall ms | target stopped µs |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    let spread = |r: &Row, f: fn(&Cycle) -> f64| Spread::of(&r.cycles.iter().map(f).collect::<Vec<_>>());
    for r in rows {
        let rate = spread(r, |c| c.attach_wall_ms)
            .map_or("–".to_string(), |s| int((r.probes as f64 / s.median * 1e3) as u64));
        let _ = writeln!(
            o,
            "| {} | {} | {} | {rate} | {} | {} | {} | {} | {} |",
            int(r.probes as u64),
            if r.cached { "cached" } else { "first" },
            show(spread(r, |c| c.attach_wall_ms)),
            show(spread(r, |c| c.attach_tp_ms)),
            show(spread(r, |c| c.attach_cpu_ms)),
            show(spread(r, |c| c.attach_stop_us)),
            show(spread(r, |c| c.detach_wall_ms)),
            show(spread(r, |c| c.detach_stop_us)),
        );
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "Memory per probe in the target (count-only probes): the data region mapped, its pages (the memfd's, \
         however mapped: tp writes most of them), the part of those the target's own smaps counts (pages it \
         touched), detour code and code arenas mapped.\n"
    );
    let _ = writeln!(
        o,
        "| probes | data region mapped, B per probe | data region pages, B per probe | of which in the target's smaps | detour code, B per probe | code arenas mapped, B per probe |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| !r.cached) {
        let Some(c) = r.cycles.last() else { continue };
        let (m, n) = (&c.memory, r.probes as f64);
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            int(r.probes as u64),
            num(m.region_bytes as f64 / n),
            num(c.region_allocated as f64 / n),
            num(m.region_rss as f64 / n),
            num(m.detour_bytes as f64 / n),
            num(m.arena_mapped as f64 / n),
        );
    }
    o.push('\n');
    for r in rows {
        for f in &r.failures {
            let _ = writeln!(
                o,
                "- {} probes ({}), failed cycle: {}",
                r.probes,
                if r.cached { "cached" } else { "first" },
                f.lines().next().unwrap_or("")
            );
        }
    }
}
