//! `tp step-worker` (hidden): the process a session starts to step one
//! call ([`crate::process::single_step`]). It reads its job on stdin and writes
//! the trace on stdout; it outlives tp only to let the thread go cleanly.

use std::io::{Read, Write};

use anyhow::{Context, Result, bail};

use crate::process::single_step::{self, Job};

/// Runs the worker.
pub fn run() -> Result<()> {
    let mut text = String::new();
    std::io::stdin().take(64 << 20).read_to_string(&mut text).context("reading the job")?;
    let (job, parent) = Job::parse(&text).map_err(|e| anyhow::anyhow!("a bad job: {e}"))?;
    if !single_step::guard_worker(parent) {
        bail!("tp ended before the step began");
    }
    let trace = single_step::run(&job).with_context(|| format!("stepping thread {}", job.tid))?;
    let mut out = std::io::stdout().lock();
    trace.write(&mut out)?;
    out.flush()?;
    Ok(())
}
