//! Attach on real programs from Debian, as a user meets them: one probe on
//! libc's `malloc` in a running python3 (Debian's, which links libc and
//! libgcc_s), with and without `--ret`, the first time tp sees the binaries
//! (an empty cache directory) and the next time; and every function of a
//! PostgreSQL postmaster (`-f '*'`, a private cluster on loopback), first
//! and cached. Timed from the command's start to its `attached` line, with
//! tp's CPU time until then (its threads' run time, from
//! /proc/PID/task/*/schedstat), the stop windows tp reports, and the probes'
//! hits (every probe must have counted calls: malloc's, and the
//! postmaster's across a few connections). tp saves what it learnt of the
//! binaries in the background while it is attached, and at its exit waits
//! for that only briefly: each attach is ended once its saving thread is
//! done, as a session longer than a moment would be.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::proc::{Proc, number_before};

/// What is attached: a name for the table, the program, the arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// `-f libc:malloc` in python3.
    Malloc,
    /// `-f libc:malloc --ret` in python3.
    MallocRet,
    /// `-f '*'` in a PostgreSQL postmaster.
    PostgresAll,
}

impl Case {
    /// Every case, in table order.
    pub const ALL: [Case; 3] = [Case::Malloc, Case::MallocRet, Case::PostgresAll];

    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Case::Malloc => "python3, `-f libc:malloc`",
            Case::MallocRet => "python3, `-f libc:malloc --ret`",
            Case::PostgresAll => "postgres (postmaster), `-f '*'`",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Case::Malloc => &["-f", "libc:malloc"],
            Case::MallocRet => &["-f", "libc:malloc", "--ret"],
            Case::PostgresAll => &["-f", "*"],
        }
    }
}

/// One attach.
#[derive(Debug, Clone, Default)]
pub struct Attach {
    /// Probes attached (the user's).
    pub probes: usize,
    /// `tp attach` start → its `attached` line, ms.
    pub wall_ms: f64,
    /// tp's own attach time, ms.
    pub tp_ms: f64,
    /// tp's CPU time until its `attached` line, ms.
    pub cpu_ms: f64,
    /// All threads stopped, µs.
    pub stop_us: f64,
    /// The worker thread stopped, µs.
    pub worker_us: f64,
    /// Hits of every probe, summed.
    pub hits: u64,
}

/// The runs of one case: the first time (empty cache) and the next.
#[derive(Debug, Default)]
pub struct Row {
    /// The first attach of each run.
    pub first: Vec<Attach>,
    /// The attach after it, with its cache.
    pub cached: Vec<Attach>,
    /// Why runs failed.
    pub failures: Vec<String>,
}

/// The CPU time of process `pid`'s threads so far, ms.
fn cpu_ms(pid: i32) -> f64 {
    crate::env::cpu_ns(pid) / 1e6
}

/// Runs `tp attach -p PID ARGS -q --json` with its cache in `cache`, lets
/// it count for `dwell` while `activity` runs, stops it with Ctrl-C.
fn attach(
    env: &Env,
    pid: i32,
    args: &[&str],
    cache: &Path,
    dwell: Duration,
    activity: &dyn Fn() -> Result<()>,
) -> Result<Attach> {
    let mut full = vec!["attach".to_string(), "-p".into(), pid.to_string(), "-q".into(), "--json".into()];
    full.extend(args.iter().map(|s| s.to_string()));
    let cache = cache.to_str().context("a cache directory with a UTF-8 path")?;
    let mut tp = Proc::spawn_env("tp attach", &env.tp, &full, false, &[("XDG_CACHE_HOME", cache)])?;
    let line = tp.wait_prefix("tp: attached", Duration::from_secs(300))?;
    let cpu_ms = cpu_ms(tp.pid());
    let wall_ms = line.at.duration_since(tp.started).as_secs_f64() * 1e3;
    let num = |after: &str, unit: &str| {
        number_before(&line.text, after, unit).with_context(|| format!("no `{after}` in `{}`", line.text))
    };
    let probes: usize = line.text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).context("probe count")?;
    let (tp_ms, stop_us, worker_us) = (num(" in ", " ms")?, num("target stopped", " µs")?, num("one thread", " µs")?);
    std::thread::sleep(dwell);
    activity()?;
    saved(tp.pid())?;
    tp.signal(libc::SIGINT);
    let done = tp.wait_prefix("tp: detached from", Duration::from_secs(300))?;
    if !done.text.contains("code restored") {
        bail!("tp did not restore the code: {}", done.text);
    }
    if !tp.wait_exit(Duration::from_secs(120)).is_some_and(|s| s.success()) {
        bail!("tp attach failed:\n{}", tp.text());
    }
    let json = tp.seen.iter().rev().find(|l| !l.stderr && l.text.starts_with('{')).context("no summary")?;
    let v: serde_json::Value = serde_json::from_str(&json.text).context("tp's JSON summary")?;
    let list = v["processes"][0]["probes"].as_array().context("no probes in the summary")?;
    if list.len() != probes {
        bail!("{} probes in the summary, {probes} attached", list.len());
    }
    let hits = list.iter().map(|p| p["hits"].as_u64().unwrap_or(0)).sum();
    Ok(Attach { probes, wall_ms, tp_ms, cpu_ms, stop_us, worker_us, hits })
}

/// Waits until tp `pid` has no thread saving analyses (`tp-cache`): it
/// ends when everything queued is saved.
fn saved(pid: i32) -> Result<()> {
    let saving = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|mut list| {
            list.any(|t| {
                t.is_ok_and(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "tp-cache"))
            })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while saving() {
        if std::time::Instant::now() > deadline {
            bail!("tp was still saving its analyses after 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A fresh cache directory for one run.
fn fresh_cache(env: &Env, name: &str) -> Result<PathBuf> {
    let dir = env.root.join("target/bench/cache").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Installs what a case needs from Debian (tests/deps.txt), as the tests do.
pub fn need(env: &Env, name: &str) -> Result<()> {
    let out = Command::new("bash").arg(env.root.join("tests/deps.sh")).args(["need", name]).output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or("tests/deps.sh need failed"));
    }
    Ok(())
}

/// Runs every case once (a first attach and a cached one each).
pub fn run_once(env: &Env, rep: usize, rows: &mut [Row]) {
    let dwell = Duration::from_millis(if env.smoke { 50 } else { 200 });
    // python3, allocating all the time.
    let python = need(env, "python3").and_then(|()| {
        let script = "import sys,time\nprint('ready', flush=True)\nwhile True:\n    x=[bytearray(4096) for _ in range(100)]\n    time.sleep(0.001)\n";
        let mut p = Proc::spawn("python3", Path::new("/usr/bin/python3"), &["-c".into(), script.into()], false)?;
        p.wait_prefix("ready", Duration::from_secs(30))?;
        Ok(p)
    });
    for (case, row) in Case::ALL.into_iter().zip(rows.iter_mut()) {
        let result = match case {
            Case::Malloc | Case::MallocRet => match &python {
                Ok(p) => {
                    let pid = p.pid();
                    fresh_cache(env, &format!("{rep}-{case:?}")).and_then(|cache| {
                        let none = || Ok(());
                        let first = attach(env, pid, case.args(), &cache, dwell, &none)?;
                        let cached = attach(env, pid, case.args(), &cache, dwell, &none)?;
                        Ok((first, cached))
                    })
                }
                Err(e) => Err(anyhow::anyhow!("python3: {e:#}")),
            },
            Case::PostgresAll => postgres_all(env, rep, dwell),
        };
        match result.and_then(|(first, cached)| {
            for a in [&first, &cached] {
                if a.hits == 0 {
                    bail!("the probes counted no call ({} probes)", a.probes);
                }
            }
            Ok((first, cached))
        }) {
            Ok((first, cached)) => {
                eprintln!(
                    "real: {}, run {}: first {:.1} ms (cpu {:.1}, stopped {:.0} µs), cached {:.1} ms (cpu {:.1}, stopped {:.0} µs), {} probes",
                    case.label(),
                    rep + 1,
                    first.wall_ms,
                    first.cpu_ms,
                    first.stop_us,
                    cached.wall_ms,
                    cached.cpu_ms,
                    cached.stop_us,
                    first.probes
                );
                row.first.push(first);
                row.cached.push(cached);
            }
            Err(e) => {
                eprintln!("real: {}, run {}: {e:#}", case.label(), rep + 1);
                row.failures.push(format!("{e:#}"));
            }
        }
    }
}

/// `-f '*'` on the postmaster of a private cluster, first and cached; a
/// few connections while the probes are in, and one after.
fn postgres_all(env: &Env, rep: usize, dwell: Duration) -> Result<(Attach, Attach)> {
    need(env, "postgresql")?;
    let pg = Postgres::start(env)?;
    let pid = pg.postmaster()?;
    let cache = fresh_cache(env, &format!("{rep}-postgres"))?;
    let connect = || pg.query("select 1").map(|_| ());
    let activity = || (0..3).try_for_each(|_| connect());
    let first = attach(env, pid, Case::PostgresAll.args(), &cache, dwell, &activity)?;
    let cached = attach(env, pid, Case::PostgresAll.args(), &cache, dwell, &activity)?;
    connect().context("postgres answers after the probes are removed")?;
    Ok((first, cached))
}

/// A PostgreSQL cluster of the benchmark's own: initdb in target/bench,
/// listening on 127.0.0.1 on a free port, run by the `postgres` user,
/// stopped when dropped.
struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: String,
    uid: u32,
    gid: u32,
}

impl Postgres {
    fn start(env: &Env) -> Result<Postgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")?
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max()
            .context("no PostgreSQL server under /usr/lib/postgresql")?;
        let (uid, gid) = user("postgres")?;
        let dir = env.root.join("target/bench/pg");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port().to_string();
        let pg = Postgres { bin, dir, port, uid, gid };
        let data = pg.dir.join("data").display().to_string();
        pg.run("initdb", &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"])?;
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=20",
            pg.port,
            pg.dir.display()
        );
        let log = pg.dir.join("server.log").display().to_string();
        pg.run("pg_ctl", &["-D", &data, "-l", &log, "-o", &opts, "-w", "start"])?;
        Ok(pg)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<String> {
        let out = Command::new(self.bin.join(tool))
            .args(args)
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(&self.dir)
            .output()
            .with_context(|| format!("cannot run {tool}"))?;
        if !out.status.success() {
            bail!("{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The postmaster's PID.
    fn postmaster(&self) -> Result<i32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))?;
        text.lines().next().and_then(|l| l.trim().parse().ok()).context("postmaster.pid")
    }

    /// Runs `sql` over a new connection (the postmaster forks a backend).
    fn query(&self, sql: &str) -> Result<String> {
        let psql = self.bin.join("psql");
        let out = Command::new(&psql)
            .args(["-h", "127.0.0.1", "-p", &self.port, "-U", "postgres", "-d", "postgres", "-tAc", sql])
            .output()
            .with_context(|| format!("cannot run {}", psql.display()))?;
        if !out.status.success() {
            bail!("psql: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The uid and gid of user `name`.
fn user(name: &str) -> Result<(u32, u32)> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: getpwnam returns a pointer to static storage or null; read at once.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        bail!("no user {name}: the postgresql package creates it");
    }
    // SAFETY: non-null, as checked.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// The table of the cases, a row each for the first attach and the cached
/// one, medians [min–max] over the runs.
pub fn markdown(rows: &[Row], o: &mut String) {
    use std::fmt::Write;

    use crate::stats::{Spread, int, show};
    if rows.iter().all(|r| r.first.is_empty() && r.failures.is_empty()) {
        return;
    }
    let _ = writeln!(o, "### Attach on real programs (Debian's python3 and PostgreSQL)\n");
    let _ = writeln!(
        o,
        "`tp attach -p PID ARGS`, from its start to its `attached` line; \"first\" with an empty cache directory \
         (the files themselves in the page cache), \"cached\" the attach after it. CPU: tp's threads' run time \
         until that line.\n"
    );
    let _ = writeln!(
        o,
        "| program, probes | cache | probes | attach: wall ms | tp's own ms | tp CPU ms | target stopped µs | one thread stopped µs | hits |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    for (case, r) in Case::ALL.iter().zip(rows) {
        for (which, runs) in [("first", &r.first), ("cached", &r.cached)] {
            let s = |f: fn(&Attach) -> f64| show(Spread::of(&runs.iter().map(f).collect::<Vec<_>>()));
            let probes = runs.iter().map(|a| a.probes).max().map_or("–".into(), |p| int(p as u64));
            let hits = if runs.iter().all(|a| a.hits > 0) && !runs.is_empty() { "all counted" } else { "–" };
            let _ = writeln!(
                o,
                "| {} | {which} | {probes} | {} | {} | {} | {} | {} | {hits} |",
                case.label(),
                s(|a| a.wall_ms),
                s(|a| a.tp_ms),
                s(|a| a.cpu_ms),
                s(|a| a.stop_us),
                s(|a| a.worker_us),
            );
        }
    }
    o.push('\n');
    for (case, r) in Case::ALL.iter().zip(rows) {
        for f in &r.failures {
            let _ = writeln!(o, "- {}, failed run: {}", case.label(), f.lines().next().unwrap_or(""));
        }
    }
    if rows.iter().any(|r| !r.failures.is_empty()) {
        o.push('\n');
    }
}

/// The median over the runs of `f` of `case`'s first or cached attaches.
pub fn median(rows: &[Row], case: Case, cached: bool, f: fn(&Attach) -> f64) -> Option<f64> {
    let r = Case::ALL.iter().position(|&c| c == case).and_then(|i| rows.get(i))?;
    let runs = if cached { &r.cached } else { &r.first };
    crate::stats::Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).map(|s| s.median)
}
