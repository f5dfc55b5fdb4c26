//! `tp serve --listen ADDR`: the counts of the probes installed in
//! processes, in the OpenMetrics text format at `http://ADDR/metrics`, read
//! afresh from each process's data region at every scrape (`-p`/`--name`,
//! or every process that holds tp probes): [`crate::session::metrics`]
//! serves them.

use std::process::ExitCode;

use anyhow::Result;

use super::options::which;
use crate::cli::ServeArgs;
use crate::session::metrics;

/// Runs `tp serve`.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    metrics::serve_installed(&crate::notes::Stderr, &args.listen, args.listen_any, &which(&args.targets))?;
    Ok(ExitCode::SUCCESS)
}
