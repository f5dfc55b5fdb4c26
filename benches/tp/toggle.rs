//! Turning a live probe off and on without stopping the process: the enable
//! flag every detour reads lies in the shared data region, so a toggle is a
//! store into shared memory, made here through tp's library as `tp enable`
//! and `tp disable` make it; the commands themselves are timed too (their
//! time is mostly starting tp and finding the region). The target is never
//! ptrace-stopped for either.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::env::Env;
use crate::hit::open_region;
use crate::proc::Proc;

/// One run's figures.
pub struct Toggle {
    /// Mean ns per store through the library.
    pub store_ns: f64,
    /// Mean ms per `tp disable` or `tp enable` command, start to exit.
    pub command_ms: f64,
}

/// Toggles one probe `rounds` times (off, then on) in a running `hot step`
/// target through the library, then `commands` times with the commands.
pub fn measure(env: &Env, rounds: u32, commands: u32) -> Result<Toggle> {
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
    let command_ms = time_commands(env, pid, &region, i, commands)?;
    tp.stop(libc::SIGINT, Duration::from_secs(30));
    Ok(Toggle { store_ns: ns, command_ms })
}

/// Runs `tp disable` and `tp enable` on the probe `rounds` times each,
/// checks that each took effect, and returns the mean ms per command.
fn time_commands(env: &Env, pid: i32, region: &tp::probe::region::Region, i: u32, rounds: u32) -> Result<f64> {
    let mut total = Duration::ZERO;
    for _ in 0..rounds {
        for (cmd, on) in [("disable", false), ("enable", true)] {
            let started = Instant::now();
            let out = std::process::Command::new(&env.tp)
                .args([cmd, "-p", &pid.to_string(), "-f", "work"])
                .output()
                .with_context(|| format!("running tp {cmd}"))?;
            total += started.elapsed();
            if !out.status.success() || region.enabled(i) != on {
                bail!("tp {cmd} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
        }
    }
    Ok(total.as_secs_f64() * 1e3 / f64::from(2 * rounds))
}
