//! The events of an attach session (`--args`, `--ret`): drained from the
//! target's rings, decoded with DWARF types, printed as live lines or JSON
//! Lines, written to a Chrome trace file, and summed into latency
//! statistics printed when the session ends.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};

use super::Options;
use super::attached::Attached;
use crate::events::clock::Clock;
use crate::events::drain::Drainer;
use crate::events::format::{self, MAX_STRING, ProbeInfo};
use crate::events::stats::Latency;
use crate::events::{Kind, RawEvent};
use crate::output::chrome::ChromeTrace;
use crate::output::events::{self as lines, Line, Style};
use crate::output::{Summary, histogram, json, thousands};
use crate::probe::layout::kind;

/// The consumer of one session's events.
pub struct Tracer {
    clock: Clock,
    drainer: Drainer,
    batch: Vec<RawEvent>,
    /// Entry index → position in the session's probes.
    index: HashMap<u32, usize>,
    style: Style,
    chrome: Option<ChromeTrace>,
    /// Per thread, the entries still waiting for their exit: (probe, args JSON).
    pending: HashMap<u32, Vec<(u32, String)>>,
    latency: Vec<Latency>,
    origin_ns: u64,
    lost_at_start: u64,
    header_done: bool,
}

impl Tracer {
    /// Starts consuming the events of `attached`.
    pub fn new(attached: &Attached, opts: &Options) -> Result<Tracer> {
        let style = opts.style;
        let chrome = match &opts.trace_file {
            Some(path) => Some(
                ChromeTrace::create(path, attached.pid)
                    .with_context(|| format!("cannot create `{}`", path.display()))?,
            ),
            None => None,
        };
        let index = attached.event_probes().into_iter().collect();
        let clock = attached.clock.clone();
        let origin_ns = crate::events::clock::monotonic_ns();
        if attached.infos.iter().any(|i| {
            i.dwarf.as_ref().is_some_and(|d| d.params.iter().any(|p| p.ty == crate::symbols::dwarf::Type::CString))
        }) && opts.selection.kind & kind::ARGS != 0
        {
            eprintln!(
                "tp: `char *` arguments are read from the target when tp drains events, after the call: best effort"
            );
        }
        Ok(Tracer {
            clock,
            drainer: Drainer::default(),
            batch: Vec::new(),
            index,
            style,
            chrome,
            pending: HashMap::new(),
            latency: vec![Latency::default(); attached.infos.len()],
            origin_ns,
            lost_at_start: attached.lost_at_start,
            header_done: false,
        })
    }

    /// Drains and handles every event published so far.
    pub fn poll(&mut self, attached: &Attached) -> Result<()> {
        self.clock.refine();
        self.batch.clear();
        self.drainer.drain(&attached.region, &mut self.batch)?;
        if self.batch.is_empty() {
            return Ok(());
        }
        // Per thread the rings are in order; across threads, by time.
        self.batch.sort_by_key(|e| e.tsc);
        let batch = std::mem::take(&mut self.batch);
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        if !self.header_done && self.style == Style::Text {
            writeln!(out, "{:>12} {:>7} CALL", "TIME(s)", "TID")?;
            self.header_done = true;
        }
        for ev in &batch {
            self.handle(attached, ev, &mut out)?;
        }
        out.flush()?;
        self.batch = batch;
        Ok(())
    }

    fn handle(&mut self, attached: &Attached, ev: &RawEvent, out: &mut impl Write) -> Result<()> {
        let Some(&i) = self.index.get(&ev.probe) else { return Ok(()) };
        let info: &ProbeInfo = &attached.infos[i];
        let read = |p: u64| attached.read_string(p, MAX_STRING);
        let ts_ns = self.clock.ns(ev.tsc);
        match ev.kind {
            Kind::Entry => {
                let args = format::args(info, &ev.v, &read);
                lines::write(out, self.style, self.origin_ns, &Line::Entry { info, tid: ev.tid, ts_ns, args: &args })?;
                if let Some(c) = &mut self.chrome {
                    let args_json = json::args(&args);
                    if attached_records_returns(attached, i) {
                        self.pending.entry(ev.tid).or_default().push((ev.probe, args_json));
                    } else {
                        c.instant(&info.name, ev.tid, ts_ns, &args_json)?;
                    }
                }
            }
            Kind::Exit | Kind::Unwound => {
                // Durations leave out what tp's probes on its callees spent;
                // the trace's slices keep the wall-clock span, so they nest.
                let duration_ns = self.clock.duration_ns(ev.timed_from(), ev.tsc);
                let span_ns = self.clock.duration_ns(ev.entry_tsc(), ev.tsc);
                let start_ns = self.clock.ns(ev.entry_tsc());
                let unwound = ev.kind == Kind::Unwound;
                let ret = if unwound { None } else { format::ret(info, ev.v[0], &read) };
                if unwound {
                    lines::write(
                        out,
                        self.style,
                        self.origin_ns,
                        &Line::Unwound { info, tid: ev.tid, ts_ns, duration_ns },
                    )?;
                } else {
                    self.latency[i].add(duration_ns);
                    let line = Line::Exit { info, tid: ev.tid, ts_ns, ret: ret.as_ref(), duration_ns };
                    lines::write(out, self.style, self.origin_ns, &line)?;
                }
                if let Some(c) = &mut self.chrome {
                    let mut args = pop_pending(&mut self.pending, ev.tid, ev.probe).unwrap_or_else(|| "{}".into());
                    args.pop();
                    let sep = if args.len() > 1 { "," } else { "" };
                    let extra = match (&ret, unwound) {
                        (_, true) => "\"unwound\":true".to_string(),
                        (Some(v), false) => format!("\"ret\":{}", json::value(v)),
                        (None, false) => String::new(),
                    };
                    let sep = if extra.is_empty() { "" } else { sep };
                    c.slice(&info.name, ev.tid, start_ns, span_ns, &format!("{args}{sep}{extra}}}"))?;
                }
            }
        }
        Ok(())
    }

    /// Prints what the session leaves: lost events, the summary (with latency
    /// and histograms when returns were recorded), and closes the trace file.
    pub fn finish(self, attached: &Attached, summary: &Summary, json_out: bool) -> Result<()> {
        let lost = Drainer::lost(&attached.region).saturating_sub(self.lost_at_start);
        if lost > 0 {
            eprintln!("tp: lost {} events (a thread's ring was full; raise --ring-size)", thousands(lost));
        }
        if let Some(c) = self.chrome {
            c.finish().context("writing the trace file")?;
        }
        // Summary rows follow the user's probes (tp's own come last and are not shown).
        let timed: Vec<Option<&Latency>> = (0..summary.probes.len())
            .map(|i| attached_records_returns(attached, i).then_some(&self.latency[i]))
            .collect();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        if json_out {
            writeln!(out, "{}", json::summary_with_latency(summary, &timed, lost))?;
            return Ok(());
        }
        if timed.iter().any(Option::is_some) {
            writeln!(out)?;
            let rows: Vec<(String, u64, &Latency)> =
                summary.probes.iter().zip(&timed).filter_map(|(p, l)| Some((p.func.clone(), p.hits, (*l)?))).collect();
            histogram::table(&mut out, &rows)?;
            writeln!(out)?;
            for (name, _, l) in &rows {
                if l.count > 0 {
                    histogram::histogram(&mut out, name, l)?;
                }
            }
        } else {
            crate::output::table::summary(summary, &mut out)?;
        }
        Ok(())
    }
}

fn attached_records_returns(attached: &Attached, i: usize) -> bool {
    attached.probe_kind(i) & kind::RET != 0
}

/// The args of the innermost pending entry of `probe` on thread `tid`; entries
/// above it (their exits were lost) are dropped.
fn pop_pending(pending: &mut HashMap<u32, Vec<(u32, String)>>, tid: u32, probe: u32) -> Option<String> {
    let stack = pending.get_mut(&tid)?;
    let at = stack.iter().rposition(|(p, _)| *p == probe)?;
    let (_, args) = stack.remove(at);
    stack.truncate(at);
    Some(args)
}
