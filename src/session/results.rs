//! Where a session's results go and in what form: `-o FILE` or the
//! command's own stream (stdout for `tp attach`, stderr for `tp run`),
//! in the format chosen once ([`crate::output::format`]). Text and JSON
//! carry the events as they come and the summary at the end; a Chrome trace
//! is written as the events come; folded stacks and a flame graph at the end.

use anyhow::{Context, Result};

use super::Options;
use super::tracer::{TraceOutput, chrome_on, close_chrome};
use crate::output::format::Format;
use crate::output::report::{self, ProcessReport};
use crate::output::sink::Sink;

/// Where the results of a session of `opts` go: `-o FILE` (created now),
/// else `default`; the Chrome trace is started on it when that is the
/// format. `several`: event lines name their process.
pub fn open(opts: &Options, default: Sink, several: bool) -> Result<TraceOutput> {
    let sink = match &opts.output {
        Some(path) => Sink::create(path).with_context(|| format!("cannot create `{}`", path.display()))?,
        None => default,
    };
    let chrome = (opts.format == Format::Chrome).then(|| chrome_on(sink.clone(), opts.pid)).transpose()?;
    Ok(TraceOutput::new(sink, chrome, several))
}

/// Writes the end of the results of a session of `opts` (`command`, which
/// observed for `seconds`) to `output`: the summary of `reports` (text or
/// JSON), the folded stacks, the flame graph, or the end of the Chrome trace.
pub fn write(
    output: &mut TraceOutput,
    opts: &Options,
    command: &str,
    seconds: Option<f64>,
    reports: &[ProcessReport],
) -> Result<()> {
    // Whole blocks, not a write per line: a summary may have 250,000 rows.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, output.sink.clone());
    let stacks: Vec<crate::output::stacks::ProbeStacks> =
        reports.iter().flat_map(|r| r.stacks.iter().cloned()).collect();
    let steps: Vec<crate::output::steps::SteppedCall> = reports.iter().flat_map(|r| r.steps.iter().cloned()).collect();
    match opts.format {
        Format::Text => {
            let hidden = report::write_text(&mut out, reports, opts.view)?;
            report::say_hidden(hidden);
        }
        Format::Json => {
            let doc = report::document(command, seconds, reports, opts.view);
            std::io::Write::write_all(&mut out, format!("{doc}\n").as_bytes())?;
        }
        Format::Folded => {
            for line in crate::output::stacks::folded(&stacks).into_iter().chain(crate::output::steps::folded(&steps)) {
                std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes())?;
            }
        }
        Format::Svg if !steps.is_empty() => {
            let lines = crate::output::steps::folded(&steps);
            crate::output::stacks::flame_svg_of(&mut out, &lines, "tp: stepped calls", "instructions")
                .context("writing the flame graph")?
        }
        Format::Svg => crate::output::stacks::flame_svg(&mut out, &stacks, "tp").context("writing the flame graph")?,
        Format::Chrome | Format::OpenMetrics | Format::Prometheus => {}
    }
    if let Some(c) = output.chrome.take() {
        close_chrome(c)?;
    }
    std::io::Write::flush(&mut out)?;
    Ok(())
}
