//! What loading a library costs a program while a session waits for one:
//! `dlcycle N` (targets/dlcycle.c) loads libloaded.so, calls it and
//! unloads it N times and times that itself. Run alone, under `tp run`
//! with a pattern that matches the library (each load waits at the dynamic
//! linker's rendezvous while tp probes it, or takes its entry and detour
//! again), and with one that matches nothing (the rendezvous's round trip:
//! tp reads the new modules and lets the thread go). Each run's counts
//! must be exact.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::env::Env;

/// The ways `dlcycle` runs.
pub const HOW: [(&str, Option<&str>); 3] = [
    ("alone", None),
    ("tp run, the pattern matches the library (probed at each load)", Some("libloaded.so:loaded_work")),
    ("tp run, the pattern matches nothing (the rendezvous's round trip)", Some("libnone.so:none")),
];

/// µs per load, call and unload for each of [`HOW`], one run each.
pub fn measure(env: &Env, cycles: u32) -> Result<Vec<f64>> {
    let dlcycle = env.target("dlcycle");
    let mut out = Vec::new();
    for (what, pattern) in HOW {
        let output = match pattern {
            None => Command::new(&dlcycle).arg(cycles.to_string()).output(),
            Some(p) => Command::new(&env.tp)
                .args(["run", "-f", p, "--"])
                .arg(&dlcycle)
                .arg(cycles.to_string())
                .env_remove("DEBUGINFOD_URLS")
                .output(),
        }
        .with_context(|| format!("running dlcycle {what}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let want = format!("calls={} checksum=ok ", 2 * cycles);
        let Some(line) = stdout.lines().find(|l| l.starts_with(&want)) else {
            bail!("dlcycle {what}: {stdout}{stderr}");
        };
        let counted =
            |l: &str| l.starts_with("loaded_work") && l.replace(',', "").ends_with(&format!(" {}", 2 * cycles));
        if pattern == HOW[1].1 && !stderr.lines().any(counted) {
            bail!("dlcycle {what}: tp did not count {} calls:\n{stderr}", 2 * cycles);
        }
        let ns: f64 =
            line.rsplit("ns_per_cycle=").next().and_then(|n| n.trim().parse().ok()).context("ns_per_cycle")?;
        out.push(ns / 1e3);
    }
    Ok(out)
}
