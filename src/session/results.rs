//! Where a session's results go and in what form: `-o FILE` or the
//! command's own stream (stdout for `tp attach`, stderr for `tp run`),
//! in the format chosen once ([`crate::output::format`]). Text and JSON
//! carry the events as they come and the summary at the end; a Chrome trace
//! is written as the events come; folded stacks and a flame graph at the end.
//! A profile (`tp profile`) goes to `-o FILE` or stdout: its table or its
//! document at the end, or its Chrome trace as the sampled calls end.

use std::io::Write;

use anyhow::{Context, Result};

use super::Options;
use super::tracer::{TraceOutput, chrome_on, close_chrome};
use crate::output::format::Format;
use crate::output::profile::Report as Profile;
use crate::output::report::ProcessReport;
use crate::output::results::Results;
use crate::output::sink::Sink;

/// Where the results of a session of `opts` go: `-o FILE` (created now),
/// else `default`; the Chrome trace is started on it when that is the
/// format. `several`: event lines name their process.
pub fn open(opts: &Options, default: Sink, several: bool) -> Result<TraceOutput> {
    let sink = destination(opts, default)?;
    let chrome = (opts.format == Format::Chrome).then(|| chrome_on(sink.clone(), opts.pid)).transpose()?;
    Ok(TraceOutput::new(sink, chrome, several))
}

/// `-o FILE` of `opts`, created now, else `default`.
fn destination(opts: &Options, default: Sink) -> Result<Sink> {
    match &opts.output {
        Some(path) => Sink::create(path).with_context(|| format!("cannot create `{}`", path.display())),
        None => Ok(default),
    }
}

/// Where the results of a profile of `opts` go: `-o FILE` (created now),
/// else stdout; with the writer of its Chrome trace when that is the format.
pub fn open_profile(opts: &Options) -> Result<(Sink, Option<Box<dyn Write>>)> {
    let sink = destination(opts, Sink::stdout())?;
    let trace = (opts.format == Format::Chrome).then(|| Box::new(sink.clone()) as Box<dyn Write>);
    Ok((sink, trace))
}

/// Writes `profile` to `out` in the format of `opts`
/// ([`crate::output::results::Output::profile`]: the table or the JSON
/// document; nothing more in a Chrome trace), shown as `opts.view` says.
pub fn write_profile(out: &mut Sink, opts: &Options, profile: &Profile) -> Result<()> {
    crate::output::results::output(opts.format).profile(out, profile, opts.view)?;
    out.flush()?;
    Ok(())
}

/// Writes the end of the results of a session of `opts` (`command`, which
/// observed for `seconds`) to `output`: `reports` in the form of the
/// session's format ([`crate::output::results::output`]: the summary as
/// text or JSON, the folded stacks, the flame graph), then the end of the
/// Chrome trace.
pub fn write(
    output: &mut TraceOutput,
    opts: &Options,
    command: &str,
    seconds: Option<f64>,
    reports: &[ProcessReport],
) -> Result<()> {
    // Whole blocks, not a write per line: a summary may have 250,000 rows.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, output.sink.clone());
    let results = Results { command, seconds, reports, view: opts.view };
    crate::output::results::output(opts.format).results(&mut out, &results)?;
    if let Some(c) = output.chrome.take() {
        close_chrome(c)?;
    }
    std::io::Write::flush(&mut out)?;
    Ok(())
}
