//! Every function of a library counted while a real program works: Debian's
//! sqlite3 shell runs a fixed SQL workload (tables, indexes, joins,
//! aggregates, sorting, JSON and text functions) on an in-memory database,
//! once alone and once with `tp attach -f 'libsqlite3:*' -q` counting every
//! function of libsqlite3, alternating. Measured per run: the shell's own
//! CPU time (its schedstat once it has exited, before it is reaped) and,
//! where `perf` can count them, its user-space instructions; with tp, the
//! calls counted. From those: the slowdown and what one counted call costs
//! in nanoseconds and in instructions.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::proc::Proc;
use crate::stats::{Spread, int, num, ratio, show};

/// The workload, `rows` sales over 2,000 items.
fn workload(rows: u32) -> String {
    format!(
        "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, price REAL, tags TEXT);
CREATE TABLE sale(id INTEGER PRIMARY KEY, item_id INTEGER, qty INTEGER, day INTEGER);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
INSERT INTO item SELECT i, printf('item-%05d', i), round((i * 37 % 1000) / 10.0, 2), json_array(i % 3, i % 5) FROM n;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})
INSERT INTO sale SELECT i, (i * 7919) % 2000 + 1, i % 50, i % 365 FROM n;
CREATE INDEX sale_item ON sale(item_id);
CREATE INDEX sale_day ON sale(day, qty);
SELECT count(*), sum(qty), min(day), max(day) FROM sale;
SELECT i.name, sum(s.qty) AS total FROM item i JOIN sale s ON s.item_id = i.id GROUP BY i.id ORDER BY total DESC, i.name LIMIT 5;
SELECT day % 7 AS weekday, round(avg(qty), 3), count(*) FROM sale GROUP BY weekday ORDER BY weekday;
SELECT json_extract(tags, '$[1]') AS t, count(*) FROM item GROUP BY t ORDER BY t;
SELECT count(*) FROM sale WHERE day BETWEEN 100 AND 120 AND qty > 25;
SELECT upper(substr(name, 1, 4)) || '/' || length(name), count(*) FROM item JOIN sale ON sale.item_id = item.id GROUP BY 1 ORDER BY 2 DESC LIMIT 3;
UPDATE sale SET qty = qty + 1 WHERE day % 10 = 0;
DELETE FROM sale WHERE qty > 48;
SELECT count(*), sum(qty) FROM sale;
"
    )
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// The shell's CPU time alone, ms.
    pub plain_ms: f64,
    /// With every function of libsqlite3 counted, ms.
    pub counted_ms: f64,
    /// User-space instructions alone and counted (None without perf).
    pub insns: Option<(f64, f64)>,
    /// The calls tp counted.
    pub calls: u64,
    /// The functions probed.
    pub probes: u64,
}

/// The shell, started and waiting for its input.
fn shell() -> Result<Proc> {
    let sqlite3 = Path::new("/usr/bin/sqlite3");
    Proc::spawn("sqlite3", sqlite3, &[":memory:".to_string()], true)
}

/// `perf stat` counting `pid`'s user-space instructions until it exits;
/// None if perf is missing or cannot count here.
fn perf_on(pid: i32) -> Option<Proc> {
    if !crate::env::has("perf") {
        return None;
    }
    let args = ["stat", "-x", ",", "-e", "instructions:u", "-p", &pid.to_string()].map(String::from);
    let mut p = Proc::spawn("perf", Path::new("perf"), &args, false).ok()?;
    // perf stat opens its counters before it says anything: give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    p.wait_exit(Duration::ZERO).is_none().then_some(p)
}

/// The instructions `perf stat -x,` reported, once it has ended.
fn perf_result(mut p: Proc) -> Option<f64> {
    p.wait_exit(Duration::from_secs(10))?;
    let line = p.seen.iter().find(|l| l.text.contains("instructions"))?;
    line.text.split(',').next()?.trim().parse().ok()
}

/// Feeds the workload, waits for the shell to exit (without reaping it),
/// and returns its CPU time in ms and its output.
fn work(shell: &mut Proc, sql: &str) -> Result<f64> {
    shell.send(sql)?;
    shell.close_stdin();
    let pid = shell.pid();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("the shell's stat")?;
        if stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) == Some("Z") {
            break;
        }
        if Instant::now() > deadline {
            bail!("sqlite3 did not finish the workload in 600 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).context("the shell's schedstat")?;
    let ns: f64 = sched.split_whitespace().next().and_then(|w| w.parse().ok()).context("schedstat")?;
    let status = shell.wait_exit(Duration::from_secs(10)).context("sqlite3 did not exit")?;
    if !status.success() {
        bail!("sqlite3 failed ({status}):\n{}", shell.text());
    }
    Ok(ns / 1e6)
}

/// The shell's output lines, for comparing the two runs.
fn output(shell: &Proc) -> Vec<String> {
    shell.seen.iter().filter(|l| !l.stderr).map(|l| l.text.clone()).collect()
}

/// One run: alone, then counted.
fn run_once(env: &Env, sql: &str) -> Result<Run> {
    let mut alone = shell()?;
    let perf = perf_on(alone.pid());
    let plain_ms = work(&mut alone, sql)?;
    let plain_insns = perf.and_then(perf_result);

    let mut counted = shell()?;
    let pid = counted.pid().to_string();
    let args = ["attach", "-p", &pid, "-f", "libsqlite3:*", "-q", "--json"].map(String::from);
    let mut tp = Proc::spawn("tp attach", &env.tp, &args, false)?;
    let attached = tp.wait_prefix("tp: attached", Duration::from_secs(120))?;
    let probes = attached.text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).unwrap_or(0);
    let perf = perf_on(counted.pid());
    let counted_ms = work(&mut counted, sql)?;
    let counted_insns = perf.and_then(perf_result);
    tp.wait_exit(Duration::from_secs(60)).context("tp did not end with its target")?;
    if output(&alone) != output(&counted) {
        bail!("the shell's output differs under tp:\n{}\n---\n{}", alone.text(), counted.text());
    }
    let summary = tp
        .seen
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(&l.text).ok().filter(|v| v["type"] == "summary"))
        .with_context(|| format!("no summary from tp:\n{}", tp.text()))?;
    let probes_of = |p: &serde_json::Value| p["probes"].as_array().cloned().unwrap_or_default();
    let calls = summary["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(probes_of)
        .filter_map(|p| p["hits"].as_u64())
        .sum();
    if calls == 0 {
        bail!("tp counted no call:\n{}", tp.text());
    }
    let insns = plain_insns.zip(counted_insns);
    Ok(Run { plain_ms, counted_ms, insns, calls, probes })
}

/// Every run of the section; failures as notes.
pub fn measure(env: &Env, runs: &mut Vec<Run>, failures: &mut Vec<String>) {
    if let Err(e) = crate::real::need(env, "sqlite3") {
        failures.push(format!("sqlite3: {e:#}"));
        return;
    }
    let sql = workload(if env.smoke { 2_000 } else { 200_000 });
    for rep in 0..env.reps {
        match run_once(env, &sql) {
            Ok(r) => {
                eprintln!(
                    "whole: run {}: sqlite3 {:.1} ms alone, {:.1} ms with {} probes counting {} calls",
                    rep + 1,
                    r.plain_ms,
                    r.counted_ms,
                    r.probes,
                    r.calls
                );
                runs.push(r);
            }
            Err(e) => {
                eprintln!("whole: run {}: {e:#}", rep + 1);
                failures.push(format!("{e:#}"));
            }
        }
    }
}

/// The section's table.
pub fn markdown(runs: &[Run], failures: &[String], o: &mut String) {
    if runs.is_empty() && failures.is_empty() {
        return;
    }
    let _ = writeln!(o, "### Every function of a library counted (sqlite3, issue 31)\n");
    let _ = writeln!(
        o,
        "Debian's sqlite3 shell runs a fixed workload (benches/tp/whole.rs) alone and with `tp attach -f \
         'libsqlite3:*' -q`, alternating; its CPU time once it has exited, its user-space instructions \
         (perf), the calls tp counted.\n"
    );
    let spread = |f: &dyn Fn(&Run) -> Option<f64>| Spread::of(&runs.iter().filter_map(f).collect::<Vec<_>>());
    let plain = spread(&|r| Some(r.plain_ms));
    let counted = spread(&|r| Some(r.counted_ms));
    let slowdown = spread(&|r| Some(r.counted_ms / r.plain_ms));
    let per_call_ns = spread(&|r| Some((r.counted_ms - r.plain_ms) * 1e6 / r.calls as f64));
    let per_call_insns = spread(&|r| r.insns.map(|(a, c)| (c - a) / r.calls as f64));
    let calls = runs.first().map_or("–".to_string(), |r| int(r.calls));
    let probes = runs.first().map_or("–".to_string(), |r| int(r.probes));
    let _ = writeln!(
        o,
        "| probes | calls counted | alone: CPU ms | counted: CPU ms | slowdown | extra ns per call | extra instructions per call |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    let _ = writeln!(
        o,
        "| {probes} | {calls} | {} | {} | {} | {} | {} |",
        show(plain),
        show(counted),
        slowdown.map_or("–".to_string(), |s| format!("{}×", num(s.median))),
        show(per_call_ns),
        show(per_call_insns),
    );
    if let (Some(c), Some(p)) = (counted, plain) {
        let _ = writeln!(o, "\nCounted against alone (medians): {}.", ratio(c.median, p.median));
    }
    for f in failures {
        let _ = writeln!(o, "- failed: {}", f.lines().next().unwrap_or(""));
    }
    o.push('\n');
}
