//! What stepping a call costs (`--steps`, seed 003's table redone): the
//! instructions per second tp's ptrace engine steps, and how much slower
//! the stepped call runs than the same call unprobed. targets/steps.c's
//! `steploop N` executes 2N + 6 instructions (x86-64) and times itself;
//! the stepped count must equal what it states.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::env::Env;

/// One run: (instructions stepped, instructions per second, stepped time
/// over the unprobed call's).
pub type Row = (u64, f64, f64);

/// Steps one call of `steploop(iterations)` in a fresh target.
pub fn measure(env: &Env, iterations: u32) -> Result<Row> {
    let mut target = Command::new(env.target("steps"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting targets/steps")?;
    let mut stdin = target.stdin.take().context("stdin")?;
    let mut out = BufReader::new(target.stdout.take().context("stdout")?).lines();
    let mut answer = |prefix: &str| -> Result<String> {
        for line in out.by_ref() {
            let line = line?;
            if line.starts_with(prefix) {
                return Ok(line);
            }
        }
        bail!("targets/steps ended before `{prefix}`")
    };
    let pid: i32 = answer("ready pid=")?.trim_start_matches("ready pid=").parse()?;
    let field = |line: &str, key: &str| -> Result<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .with_context(|| format!("no {key}= in {line}"))
    };
    // Unprobed first (the best of three, warm).
    let mut alone = u64::MAX;
    for _ in 0..3 {
        writeln!(stdin, "loop {iterations}")?;
        alone = alone.min(field(&answer("done loop")?, "ns")?);
    }
    let mut tp = Command::new(&env.tp)
        .args(["attach", "-p", &pid.to_string(), "-f", "steploop", "--steps", "--json"])
        .args(["--step-limit", "100000000"])
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
    writeln!(stdin, "loop {iterations}")?;
    let done = answer("done loop")?;
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
    let step = &summary["processes"][0]["steps"][0];
    let (insns, us) = (step["instructions"].as_u64().unwrap_or(0), step["us"].as_u64().unwrap_or(0));
    writeln!(stdin, "quit")?;
    let _ = target.wait();
    if step["end"] != "returned" || insns != field(&done, "insns")? || us == 0 {
        bail!("a stepped call of steploop({iterations}): {step}, the program says {done}");
    }
    Ok((insns, insns as f64 / (us as f64 / 1e6), us as f64 * 1e3 / alone.max(1) as f64))
}
