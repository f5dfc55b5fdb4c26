//! Turning a live probe off and on without stopping the process: the enable
//! flag every detour reads lies in the shared data region, so a toggle is a
//! store into shared memory, made here through tp's library exactly as
//! `tp enable`/`tp disable` will. The target is never ptrace-stopped for it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::hit::open_region;
use crate::proc::Proc;

/// Toggles one probe `rounds` times (off, then on) in a running `hot step`
/// target and returns the mean ns per toggle.
pub fn measure(env: &Env, rounds: u32) -> Result<f64> {
    let mut target = Proc::spawn("hot step", &env.target("hot"), &["step".into(), "120".into()], false)?;
    target.wait_prefix("ready", Duration::from_secs(30))?;
    let pid = target.pid();
    let args: Vec<String> = ["attach", "-p", &pid.to_string(), "-f", "work", "-q", "--json"].map(String::from).into();
    let mut tp = Proc::spawn("tp", &env.tp, &args, false)?;
    tp.wait_prefix("tp: attached", Duration::from_secs(30))?;
    let region = open_region(pid)?;
    let (i, _) = region
        .entries()
        .into_iter()
        .find(|(_, e)| e.owner == tp.pid() as u32 && e.name() == "work")
        .context("tp's probe on `work` is not in the region")?;
    let hits_before = region.hits(i);
    let started = Instant::now();
    for _ in 0..rounds {
        region.set_enabled(i, false)?;
        region.set_enabled(i, true)?;
    }
    let ns = started.elapsed().as_secs_f64() * 1e9 / f64::from(2 * rounds);
    // The target calls work() every millisecond: the probe must still count.
    std::thread::sleep(Duration::from_millis(50));
    if !region.enabled(i) || region.hits(i) <= hits_before {
        bail!("the probe stopped counting after the toggles");
    }
    tp.stop(libc::SIGINT, Duration::from_secs(30));
    Ok(ns)
}
