//! `tp status`: the probes installed in processes and their counts, read
//! from each target's data region without stopping it: a table, tp's JSON
//! document (an empty one when no process holds probes), OpenMetrics
//! (`--openmetrics`), or the Prometheus text format (`--prometheus`: what
//! node_exporter's textfile collector and `promtool check metrics` read). `-o FILE` replaces FILE atomically
//! (a temporary file in the same directory, renamed over it), so a
//! collector never reads half a file.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::options::{status_form, which};
use crate::cli::StatusArgs;
use crate::output::results::{self, Results};
use crate::session::installed;

/// Runs `tp status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let (format, view) = status_form(&args)?;
    let (reports, failed) = installed::reports(&crate::notes::Stderr, &which(&args.targets))?;
    let mut text = Vec::new();
    let results = Results { command: "status", seconds: None, reports: &reports, view };
    results::output(format).results(&mut text, &results)?;
    match &args.output {
        Some(path) => write_atomically(path, &text)?,
        None => {
            let mut out = crate::streams::stdout();
            out.write_all(&text)?;
            out.flush()?;
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Writes `bytes` to a temporary file beside `path` (hidden, not `*.prom`,
/// so the textfile collector skips it), syncs it, and renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().with_context(|| format!("`{}` is not a file name", path.display()))?;
    let tmp = dir.join(format!(".{}.tp-{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write `{}`", path.display()));
    }
    Ok(())
}
