//! What stepping a call costs (`--steps`, seed 003's table redone): the
//! instructions per second tp's engines step (ptrace, and on x86-64 the
//! in-target one: the trap flag and tp's SIGTRAP handler), and how much
//! slower the stepped call runs than the same call unprobed. targets/steps.c's
//! `steploop N` executes 2N + 6 instructions (x86-64) and times itself;
//! the stepped count must equal what it states.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::env::Env;

/// One run: (instructions stepped, instructions per second, stepped time
/// over the unprobed call's).
pub type Row = (u64, f64, f64);

/// One run of `--step-depth 0` over `stepcaller(calls)`, each of its calls
/// of `stepleaf` (12 instructions) run free: its own instructions, the
/// stepped call's µs with the bound and without it (every call stepped),
/// and the ns per call run free as the worker timed it (from the callee's
/// first instruction to the breakpoint's hit at the return).
pub type DepthRow = (u64, f64, f64, f64);

/// A fresh targets/steps: the process, its stdin, its lines.
struct Target {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::io::Lines<BufReader<std::process::ChildStdout>>,
    pid: i32,
}

impl Target {
    fn start(env: &Env) -> Result<Target> {
        let mut child = Command::new(env.target("steps"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting targets/steps")?;
        let stdin = child.stdin.take().context("stdin")?;
        let out = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let mut t = Target { child, stdin, out, pid: 0 };
        t.pid = t.answer("ready pid=")?.trim_start_matches("ready pid=").parse()?;
        Ok(t)
    }

    fn answer(&mut self, prefix: &str) -> Result<String> {
        for line in self.out.by_ref() {
            let line = line?;
            if line.starts_with(prefix) {
                return Ok(line);
            }
        }
        bail!("targets/steps ended before `{prefix}`")
    }

    fn ask(&mut self, command: &str, prefix: &str) -> Result<String> {
        writeln!(self.stdin, "{command}")?;
        self.answer(prefix)
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

fn field(line: &str, key: &str) -> Result<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .with_context(|| format!("no {key}= in {line}"))
}

/// Attaches tp to `t` with `args` (after `-p PID`), asks the target
/// `command` and returns its answer (`done`) and the call tp stepped.
fn step_once(
    env: &Env,
    t: &mut Target,
    args: &[&str],
    command: &str,
    done: &str,
) -> Result<(String, serde_json::Value)> {
    let mut tp = Command::new(&env.tp)
        .args(["attach", "-p", &t.pid.to_string()])
        .args(args)
        .args(["--json", "--step-limit", "100000000"])
        .env_remove("DEBUGINFOD_URLS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tp")?;
    let mut err = BufReader::new(tp.stderr.take().context("stderr")?).lines();
    let mut said = |prefix: &str| -> Result<()> {
        for line in err.by_ref() {
            if line?.starts_with(prefix) {
                return Ok(());
            }
        }
        bail!("tp ended before `{prefix}`")
    };
    said("tp: attached")?;
    let answer = t.ask(command, done)?;
    said("tp: stepped a call")?;
    // SAFETY: kill(2) of the tp this started.
    unsafe { libc::kill(tp.id() as i32, libc::SIGINT) };
    let output = tp.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"type\":\"summary\""))
        .and_then(|l| serde_json::from_str(l).ok())
        .context("no summary from tp")?;
    Ok((answer, summary["processes"][0]["steps"][0].clone()))
}

/// The in-target engine's floor on this machine (targets/trapcost): ns per
/// single-step trap delivered to an empty SIGTRAP handler, and ns per
/// signal a thread sends itself and handles, over `n` of each.
pub fn floor(env: &Env, n: u32) -> Result<(f64, f64)> {
    let out = Command::new(env.targets.join("trapcost")).arg(n.to_string()).output().context("running trapcost")?;
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let word = |key: &str| -> Result<f64> {
        let v =
            line.split_whitespace().find_map(|w| w.strip_prefix(key)).with_context(|| format!("{key} in {line}"))?;
        Ok(v.parse()?)
    };
    if !out.status.success() || word("traps=")? < n as f64 {
        bail!("trapcost: {line}");
    }
    Ok((word("trap_ns=")?, word("signal_ns=")?))
}

/// Steps one call of `steploop(iterations)` in a fresh target, with the
/// step engine `engine` (`ptrace`, `trap`).
pub fn measure(env: &Env, iterations: u32, engine: &str) -> Result<Row> {
    let mut t = Target::start(env)?;
    // Unprobed first (the best of three, warm).
    let mut alone = u64::MAX;
    for _ in 0..3 {
        alone = alone.min(field(&t.ask(&format!("loop {iterations}"), "done loop")?, "ns")?);
    }
    let args = ["-f", "steploop", "--steps", "--step-engine", engine];
    let (done, step) = step_once(env, &mut t, &args, &format!("loop {iterations}"), "done loop")?;
    let (insns, us) = (step["instructions"].as_u64().unwrap_or(0), step["us"].as_u64().unwrap_or(0));
    t.quit();
    if step["end"] != "returned" || insns != field(&done, "insns")? || us == 0 {
        bail!("a stepped call of steploop({iterations}): {step}, the program says {done}");
    }
    Ok((insns, insns as f64 / (us as f64 / 1e6), us as f64 * 1e3 / alone.max(1) as f64))
}

/// Steps one call of `stepcaller(calls)` with `--step-depth 0`, then one
/// without a bound, in a fresh target.
pub fn measure_depth(env: &Env, calls: u32) -> Result<DepthRow> {
    let mut t = Target::start(env)?;
    let command = format!("caller {calls}");
    let (done, bounded) =
        step_once(env, &mut t, &["-f", "stepcaller", "--steps", "--step-depth", "0"], &command, "done caller")?;
    let (_, full) = step_once(env, &mut t, &["-f", "stepcaller", "--steps"], &command, "done caller")?;
    t.quit();
    let free = &bounded["unstepped"][0];
    if bounded["end"] != "returned"
        || bounded["instructions"].as_u64() != Some(field(&done, "own")?)
        || free["calls"].as_u64() != Some(calls as u64)
        || full["instructions"].as_u64() != Some(field(&done, "all")?)
    {
        bail!("stepcaller({calls}) with --step-depth 0: {bounded}; without: {full}; the program says {done}");
    }
    let us = |s: &serde_json::Value| s["us"].as_u64().unwrap_or(0) as f64;
    let per_call = free["ns"].as_u64().unwrap_or(0) as f64 / calls as f64;
    Ok((field(&done, "own")?, us(&bounded), us(&full), per_call))
}
