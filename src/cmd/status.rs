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

use super::options::which;
use crate::cli::StatusArgs;
use crate::output::format::{self, Format};
use crate::output::report::View;
use crate::output::results::{self, Results};
use crate::process;
use crate::session::installed;

/// Runs `tp status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let format = format::choose(
        "status",
        &[(args.json, Format::Json), (args.openmetrics, Format::OpenMetrics), (args.prometheus, Format::Prometheus)],
        args.format.map(Format::from),
        args.output.as_deref(),
        &[Format::Text, Format::Json, Format::OpenMetrics, Format::Prometheus],
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let view = View { all: args.all, top: args.top };
    let which = which(&args.targets);
    let mut scan = None;
    let pids = if which.is_empty() {
        let found = installed::scan();
        let pids = found.pids.clone();
        scan = Some(found);
        pids
    } else {
        which.select()?.pids
    };
    if pids.is_empty() {
        crate::say!("tp: {}", scan.unwrap_or_default().nothing_found());
    }
    // Named processes must all answer; in a scan of every process, one
    // that cannot be read (it exited, its region fails validation) is said
    // in one line and left out, and tp exits 1 after printing the rest.
    let mut reports = Vec::new();
    let mut failed = false;
    for pid in pids {
        match installed::report(pid) {
            Ok(report) => reports.push(report),
            // Gone since the scan: nothing to say.
            Err(_) if which.is_empty() && process::has_exited(pid, std::time::Duration::from_millis(100)) => {}
            Err(e) if which.is_empty() => {
                crate::say!("tp: process {pid}: {}", crate::escape::text(&format!("{e:#}")));
                failed = true;
            }
            Err(e) => return Err(e),
        }
    }
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
