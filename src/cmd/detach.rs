//! `tp detach`: restore the original code of every tp probe in a process
//! (or in every process that has some), using only what the target's data
//! region records, so it works after the tracer that attached was killed
//! ([`crate::session::restore`]).

use std::process::ExitCode;

use std::sync::Arc;

use anyhow::Result;

use crate::cli::DetachArgs;
use crate::notes::{Notes, Stderr};
use crate::session::restore;

/// Runs `tp detach`.
pub fn run(args: DetachArgs) -> Result<ExitCode> {
    let notes: Arc<dyn Notes> = Arc::new(Stderr);
    let clean = restore::detach(&notes, args.pid, args.force)?;
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
