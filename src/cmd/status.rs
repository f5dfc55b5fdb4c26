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
use crate::output::format::Format;
use crate::output::openmetrics::{self as metrics, render};
use crate::output::report;
use crate::session::group::series_of;
use crate::session::installed;

/// Runs `tp status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let (format, view) = status_form(&args)?;
    let (reports, failed) = installed::reports(&which(&args.targets))?;
    let mut text = Vec::new();
    match format {
        Format::OpenMetrics | Format::Prometheus => {
            let series: Vec<_> = reports.iter().flat_map(series_of).collect();
            let f = if format == Format::OpenMetrics { metrics::Format::OpenMetrics } else { metrics::Format::Text };
            text.extend_from_slice(render(&series, f).as_bytes());
        }
        // Every process's probes, an empty document when there are none.
        Format::Json => writeln!(text, "{}", report::document("status", None, &reports, view))?,
        _ => report::say_hidden(report::write_text(&mut text, &reports, view)?),
    }
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
