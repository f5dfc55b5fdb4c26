//! The results of a command in the form chosen for them: one [`Output`] per
//! format for the report model (the summary at a session's end, what `tp
//! status` prints) and for a profile (`tp profile`'s), and one
//! [`EventLines`] per format that writes events as they come. The session
//! engine and the commands hand their reports and events to these; none of
//! them matches on the format itself.

use std::io::{self, Write};

use anyhow::{Context, Result, bail};

use super::events::{self, Line};
use super::format::{self, Format};
use super::openmetrics::{self, render};
use super::profile::{self, Report as Profile};
use super::report::{self, ProcessReport, View};
use super::{stacks, steps, tree};

/// What a command's results end with.
#[derive(Debug, Clone, Copy)]
pub struct Results<'a> {
    /// The command (`attach`, `run`, `status`), as the JSON document names it.
    pub command: &'a str,
    /// How long the session observed, when it did.
    pub seconds: Option<f64>,
    /// One report per process, in the order given.
    pub reports: &'a [ProcessReport],
    /// How the text shows its rows.
    pub view: View,
}

/// A format of the report model.
pub trait Output {
    /// Writes `results` to `out` (notes about them to stderr).
    fn results(&self, out: &mut dyn Write, results: &Results) -> Result<()>;

    /// Writes `profile`, shown as `view` says, to `out` (notes about it to
    /// stderr); an error in a format a profile does not take
    /// ([`profile::FORMATS`], which the command line refuses first).
    fn profile(&self, out: &mut dyn Write, profile: &Profile, view: View) -> Result<()>;
}

/// A format of events as they come.
pub trait EventLines {
    /// The line above the events, if the format has one: with a PID column
    /// when `show_pid`, for the call tree's columns when `tree`.
    fn header(&self, show_pid: bool, tree: bool) -> Option<String>;

    /// True if `--tree` draws each thread's calls as a tree ([`tree::Tree`]);
    /// else each event is written with its depth.
    fn draws_tree(&self) -> bool;

    /// Writes `line` of process `pid` (shown when `show_pid`); `origin_ns`
    /// is the session's start.
    fn write(&self, out: &mut dyn Write, origin_ns: u64, pid: (i32, bool), line: &Line) -> io::Result<()>;
}

/// Tables for people; event lines.
struct Text;
/// tp's JSON: JSON Lines of events, then one summary document.
struct JsonLines;
/// A Chrome trace, written as the events come ([`super::chrome`]): nothing at the end.
struct Chrome;
/// Folded stacks, `root;...;leaf count`.
struct Folded;
/// A flame graph of the stacks, as an SVG.
struct Svg;
/// An exposition of the counts and latency: OpenMetrics, or the Prometheus text format.
struct Metrics(Format);

/// The output of `format`.
pub fn output(format: Format) -> &'static dyn Output {
    match format {
        Format::Text => &Text,
        Format::Json => &JsonLines,
        Format::Chrome => &Chrome,
        Format::Folded => &Folded,
        Format::Svg => &Svg,
        Format::OpenMetrics => &Metrics(Format::OpenMetrics),
        Format::Prometheus => &Metrics(Format::Prometheus),
    }
}

/// The event lines of `format`, if it writes events as lines.
pub fn event_lines(format: Format) -> Option<&'static dyn EventLines> {
    match format {
        Format::Text => Some(&Text),
        Format::Json => Some(&JsonLines),
        _ => None,
    }
}

impl Output for Text {
    fn results(&self, mut out: &mut dyn Write, r: &Results) -> Result<()> {
        let hidden = report::write_text(&mut out, r.reports, r.view)?;
        report::say_hidden(hidden);
        Ok(())
    }

    fn profile(&self, out: &mut dyn Write, p: &Profile, view: View) -> Result<()> {
        profile::write_text(out, p, view)?;
        Ok(())
    }
}

impl EventLines for Text {
    fn header(&self, show_pid: bool, with_tree: bool) -> Option<String> {
        Some(if with_tree { tree::header(show_pid) } else { events::header(show_pid) })
    }

    fn draws_tree(&self) -> bool {
        true
    }

    fn write(&self, out: &mut dyn Write, origin_ns: u64, pid: (i32, bool), line: &Line) -> io::Result<()> {
        events::write_text(out, origin_ns, pid, line)
    }
}

impl Output for JsonLines {
    fn results(&self, out: &mut dyn Write, r: &Results) -> Result<()> {
        let doc = report::document(r.command, r.seconds, r.reports, r.view);
        out.write_all(format!("{doc}\n").as_bytes())?;
        Ok(())
    }

    fn profile(&self, out: &mut dyn Write, p: &Profile, view: View) -> Result<()> {
        out.write_all(format!("{}\n", profile::document(p, view)).as_bytes())?;
        Ok(())
    }
}

impl EventLines for JsonLines {
    fn header(&self, _: bool, _: bool) -> Option<String> {
        None
    }

    fn draws_tree(&self) -> bool {
        false
    }

    fn write(&self, out: &mut dyn Write, _: u64, (pid, _): (i32, bool), line: &Line) -> io::Result<()> {
        events::write_json(out, pid, line)
    }
}

impl Output for Chrome {
    fn results(&self, _: &mut dyn Write, _: &Results) -> Result<()> {
        Ok(())
    }

    /// Nothing: the trace got the sampled calls as they ended.
    fn profile(&self, _: &mut dyn Write, _: &Profile, _: View) -> Result<()> {
        Ok(())
    }
}

/// The refusal of a profile in `format`, which it does not take.
fn not_a_profile(format: Format) -> Result<()> {
    bail!("`tp profile` writes {}, not {}", format::names(profile::FORMATS), format.name())
}

/// The stacks and the stepped calls of every report.
fn stacks_and_steps(r: &Results) -> (Vec<stacks::ProbeStacks>, Vec<steps::SteppedCall>) {
    let stacks = r.reports.iter().flat_map(|r| r.stacks.iter().cloned()).collect();
    let steps = r.reports.iter().flat_map(|r| r.steps.iter().cloned()).collect();
    (stacks, steps)
}

impl Output for Folded {
    fn results(&self, out: &mut dyn Write, r: &Results) -> Result<()> {
        let (stacks, steps) = stacks_and_steps(r);
        for line in stacks::folded(&stacks).into_iter().chain(steps::folded(&steps)) {
            out.write_all(format!("{line}\n").as_bytes())?;
        }
        Ok(())
    }

    fn profile(&self, _: &mut dyn Write, _: &Profile, _: View) -> Result<()> {
        not_a_profile(Format::Folded)
    }
}

impl Output for Svg {
    fn results(&self, mut out: &mut dyn Write, r: &Results) -> Result<()> {
        let (stacks, steps) = stacks_and_steps(r);
        if steps.is_empty() {
            stacks::flame_svg(&mut out, &stacks, "tp").context("writing the flame graph")
        } else {
            let lines = steps::folded(&steps);
            stacks::flame_svg_of(&mut out, &lines, "tp: stepped calls", "instructions")
                .context("writing the flame graph")
        }
    }

    fn profile(&self, _: &mut dyn Write, _: &Profile, _: View) -> Result<()> {
        not_a_profile(Format::Svg)
    }
}

impl Output for Metrics {
    fn results(&self, out: &mut dyn Write, r: &Results) -> Result<()> {
        let series: Vec<_> = r.reports.iter().flat_map(openmetrics::series_of).collect();
        out.write_all(render(&series, self.0).as_bytes())?;
        Ok(())
    }

    fn profile(&self, _: &mut dyn Write, _: &Profile, _: View) -> Result<()> {
        not_a_profile(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_refused_in_a_format_it_does_not_take() {
        let p = Profile { pid: 1, elapsed: 1.0, toggles: 0, samples: 0, rows: Vec::new(), libraries: Vec::new() };
        for f in [Format::Folded, Format::Svg, Format::OpenMetrics, Format::Prometheus] {
            let mut out = Vec::new();
            let err = output(f).profile(&mut out, &p, View::default()).unwrap_err();
            assert_eq!(err.to_string(), format!("`tp profile` writes text, json or chrome, not {}", f.name()));
            assert!(out.is_empty());
        }
        let mut out = Vec::new();
        output(Format::Chrome).profile(&mut out, &p, View::default()).unwrap();
        assert!(out.is_empty(), "a Chrome trace is written as the calls end");
    }
}
