//! `tp profile -f '*'` on a real server under its own benchmark: Debian's
//! redis-server (loopback, no persistence) under redis-benchmark (a fixed
//! number of SET and GET requests from 8 connections), measured alone,
//! while tp profiles every function it can probe, and while `perf record`
//! samples it at the rate tp's profile sampled (the `samples_per_s` of its
//! summary): the requests per second, and redis's CPU time per request
//! (its threads' run time, /proc/PID/task/*/schedstat). Counts are checked:
//! tp counts every call of `call`, the function that runs each command, and
//! that equals the commands redis reports for the window (`INFO
//! commandstats`); perf's samples are counted from its output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::proc::Proc;
use crate::real::need;

/// Who watches redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watcher {
    /// Nobody.
    Alone,
    /// `tp profile -p PID -f '*'`.
    Tp,
    /// `perf record -F RATE -p PID`.
    Perf,
}

impl Watcher {
    /// Every row, in table order.
    pub const ALL: [Watcher; 3] = [Watcher::Alone, Watcher::Tp, Watcher::Perf];

    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Watcher::Alone => "redis-server alone",
            Watcher::Tp => "`tp profile -f '*'`",
            Watcher::Perf => "`perf record -F <tp's rate>`",
        }
    }
}

/// One benchmark run under one watcher.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// SET requests per second.
    pub set_rps: f64,
    /// GET requests per second.
    pub get_rps: f64,
    /// redis's CPU time per request, µs.
    pub cpu_us: f64,
    /// Samples per second (tp's latency samples; perf's stack samples).
    pub samples_per_s: f64,
    /// Functions profiled (tp).
    pub functions: usize,
    /// For tp: whether its count of `call` equals the commands redis ran.
    pub exact: Option<bool>,
}

/// The runs of one watcher.
#[derive(Debug, Default)]
pub struct Row {
    /// Runs that completed.
    pub runs: Vec<Run>,
    /// Why the others failed.
    pub failures: Vec<String>,
}

/// redis-server on a free loopback port, killed when dropped.
struct Redis {
    proc: Proc,
    port: String,
}

impl Redis {
    fn start() -> Result<Redis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port().to_string();
        let args: Vec<String> = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]
        .map(String::from)
        .into();
        let proc = Proc::spawn("redis-server", Path::new("/usr/bin/redis-server"), &args, false)?;
        let r = Redis { proc, port };
        for _ in 0..500 {
            if r.cli(&["ping"]).is_ok_and(|s| s == "PONG") {
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("redis-server does not answer PING")
    }

    fn pid(&self) -> i32 {
        self.proc.pid()
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("redis-cli").args(["-p", &self.port]).args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Commands run so far, summed over `INFO commandstats`.
    fn commands(&self) -> Result<u64> {
        let info = self.cli(&["info", "commandstats"])?;
        Ok(info
            .lines()
            .filter(|l| l.starts_with("cmdstat_"))
            .filter_map(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix("calls=")?.parse::<u64>().ok()))
            .sum())
    }

    /// redis-benchmark: `n` SETs and `n` GETs; their requests per second.
    fn benchmark(&self, n: u64) -> Result<(f64, f64)> {
        let out = Command::new("redis-benchmark")
            .args(["-p", &self.port, "-n", &n.to_string(), "-c", "8", "-t", "set,get", "-q", "--csv"])
            .output()
            .context("cannot run redis-benchmark")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("redis-benchmark: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let rps = |test: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("\"{test}\"")))
                .and_then(|l| l.split(',').nth(1)?.trim_matches('"').parse::<f64>().ok())
                .with_context(|| format!("no {test} in redis-benchmark's output: {text}"))
        };
        Ok((rps("SET")?, rps("GET")?))
    }
}

/// The CPU time of process `pid`'s threads so far, µs.
fn cpu_us(pid: i32) -> f64 {
    crate::env::cpu_ns(pid) / 1e3
}

/// A watcher started on redis.
enum Watching {
    Alone,
    Tp(Proc, usize),
    Perf(Proc, PathBuf, Instant),
}

/// Runs the benchmark once under each watcher; `rate` is perf's sampling
/// rate (tp's, from the run before; 1000 until there is one).
pub fn run_once(env: &Env, rows: &mut [Row], rate: &mut f64) {
    let requests: u64 = if env.smoke { 20_000 } else { 200_000 };
    let redis = match need(env, "redis").and_then(|()| Redis::start()) {
        Ok(r) => r,
        Err(e) => {
            for row in rows.iter_mut() {
                row.failures.push(format!("redis: {e:#}"));
            }
            return;
        }
    };
    for (watcher, row) in Watcher::ALL.into_iter().zip(rows.iter_mut()) {
        match once(env, &redis, watcher, requests, rate) {
            Ok(run) => {
                eprintln!(
                    "profile: {}: SET {:.0}/s, GET {:.0}/s, {:.2} µs CPU per request, {:.0} samples/s{}",
                    watcher.label(),
                    run.set_rps,
                    run.get_rps,
                    run.cpu_us,
                    run.samples_per_s,
                    run.exact.map_or(String::new(), |e| format!(", counts exact: {e}"))
                );
                if watcher == Watcher::Tp && run.samples_per_s > 0.0 {
                    *rate = run.samples_per_s;
                }
                row.runs.push(run);
            }
            Err(e) => {
                eprintln!("profile: {}: {e:#}", watcher.label());
                row.failures.push(format!("{e:#}"));
            }
        }
    }
}

fn once(env: &Env, redis: &Redis, watcher: Watcher, requests: u64, rate: &f64) -> Result<Run> {
    let pid = redis.pid();
    let watching = match watcher {
        Watcher::Alone => Watching::Alone,
        Watcher::Tp => {
            let args: Vec<String> = ["profile", "-p", &pid.to_string(), "-f", "*", "--json"].map(String::from).into();
            let mut tp = Proc::spawn("tp profile", &env.tp, &args, false)?;
            let line = tp.wait_prefix("tp: profiling", Duration::from_secs(300))?;
            let functions =
                line.text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).context("function count")?;
            Watching::Tp(tp, functions)
        }
        Watcher::Perf => {
            need(env, "linux-perf")?;
            let max = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
                .ok()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .unwrap_or(100_000.0);
            let freq = rate.clamp(100.0, max).round().to_string();
            let data = env.root.join("target/bench/perf-redis.data");
            let args: Vec<String> = ["record", "-q", "-F", &freq, "-p", &pid.to_string(), "-o", data.to_str().unwrap()]
                .map(String::from)
                .into();
            let perf = Proc::spawn("perf record", Path::new("perf"), &args, false)?;
            // perf says nothing once it samples: give it a moment to open its events.
            std::thread::sleep(Duration::from_millis(300));
            Watching::Perf(perf, data, Instant::now())
        }
    };
    let commands_before = redis.commands()?;
    let cpu_before = cpu_us(pid);
    let (set_rps, get_rps) = redis.benchmark(requests)?;
    let cpu = cpu_us(pid) - cpu_before;
    let commands_after = redis.commands()?;
    let mut run = Run { set_rps, get_rps, cpu_us: cpu / (2 * requests) as f64, ..Run::default() };
    match watching {
        Watching::Alone => {}
        Watching::Tp(mut tp, profiled) => {
            tp.signal(libc::SIGINT);
            if !tp.wait_exit(Duration::from_secs(120)).is_some_and(|s| s.success()) {
                bail!("tp profile failed:\n{}", tp.text());
            }
            let json = tp.seen.iter().rev().find(|l| !l.stderr && l.text.starts_with('{')).context("no summary")?;
            let v: serde_json::Value = serde_json::from_str(&json.text).context("tp's JSON summary")?;
            let functions = v["processes"][0]["probes"].as_array().context("no functions in the summary")?;
            let calls = functions
                .iter()
                .find(|f| f["func"] == "call")
                .and_then(|f| f["hits"].as_u64())
                .context("no `call` in tp's profile")?;
            // The window holds the first INFO (counted only in the second
            // INFO's answer), the benchmark's commands and the second INFO.
            let ran = commands_after - commands_before + 1;
            if calls != ran || functions.is_empty() {
                bail!("tp counted {calls} calls of `call`, redis ran {ran} commands");
            }
            run.exact = Some(true);
            run.functions = profiled;
            run.samples_per_s = v["samples_per_s"].as_f64().unwrap_or(0.0);
        }
        Watching::Perf(mut perf, data, since) => {
            let seconds = since.elapsed().as_secs_f64();
            perf.signal(libc::SIGINT);
            // It ends with the status of the signal that stopped it; its
            // samples say whether it worked.
            if perf.wait_exit(Duration::from_secs(60)).is_none() {
                bail!("perf record did not stop:\n{}", perf.text());
            }
            let script = Command::new("perf").args(["script", "-i", data.to_str().unwrap()]).output()?;
            let samples = String::from_utf8_lossy(&script.stdout).lines().count();
            let _ = std::fs::remove_file(&data);
            if samples == 0 {
                bail!("perf recorded no sample:\n{}", perf.text());
            }
            run.samples_per_s = samples as f64 / seconds;
        }
    }
    if commands_after - commands_before < 2 * requests {
        bail!("redis ran {} commands for {} requests", commands_after - commands_before, 2 * requests);
    }
    Ok(run)
}

/// The table of the rows, one per watcher, medians [min–max] over the runs.
pub fn markdown(rows: &[Row], o: &mut String) {
    use std::fmt::Write;

    use crate::stats::{Spread, num, show};
    if rows.iter().all(|r| r.runs.is_empty() && r.failures.is_empty()) {
        return;
    }
    let _ = writeln!(o, "### Profiling a real server (redis-server under redis-benchmark)\n");
    let _ = writeln!(
        o,
        "SET and GET requests from 8 connections on loopback; redis's CPU time per request from its threads' run \
         time. perf samples at the rate tp's profile sampled in the same run. \"vs alone\" divides the median \
         throughput by redis alone's (1.00: no loss).\n"
    );
    let _ = writeln!(
        o,
        "| watcher | SET req/s | GET req/s | vs alone | redis CPU µs per request | samples/s | counts exact |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    let alone =
        rows.first().and_then(|r| Spread::of(&r.runs.iter().map(|x| x.set_rps + x.get_rps).collect::<Vec<_>>()));
    for (w, r) in Watcher::ALL.iter().zip(rows) {
        let s = |f: fn(&Run) -> f64| Spread::of(&r.runs.iter().map(f).collect::<Vec<_>>());
        let both = s(|x| x.set_rps + x.get_rps);
        let vs = match (both, alone) {
            (Some(b), Some(a)) if a.median > 0.0 => format!("{:.2}", b.median / a.median),
            _ => "–".into(),
        };
        let functions = r.runs.iter().map(|x| x.functions).max().unwrap_or(0);
        let label = if functions > 0 {
            format!("{} ({} functions)", w.label(), num(functions as f64))
        } else {
            w.label().into()
        };
        let exact = match (r.runs.iter().filter_map(|x| x.exact).count(), *w) {
            (0, Watcher::Tp) => "–".to_string(),
            (n, Watcher::Tp) => format!("yes ({n} runs)"),
            _ => String::new(),
        };
        let samples = if *w == Watcher::Alone { String::new() } else { show(s(|x| x.samples_per_s)) };
        let _ = writeln!(
            o,
            "| {label} | {} | {} | {vs} | {} | {samples} | {exact} |",
            show(s(|x| x.set_rps)),
            show(s(|x| x.get_rps)),
            show(s(|x| x.cpu_us))
        );
    }
    o.push('\n');
    for (w, r) in Watcher::ALL.iter().zip(rows) {
        for f in &r.failures {
            let _ = writeln!(o, "- {}, failed run: {}", w.label(), f.lines().next().unwrap_or(""));
        }
    }
    if rows.iter().any(|r| !r.failures.is_empty()) {
        o.push('\n');
    }
}
