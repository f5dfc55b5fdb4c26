//! The events of an attach session (`--args`, `--ret`): drained from the
//! target's rings, decoded with DWARF types, printed as live lines or JSON
//! Lines, written to a Chrome trace file, and summed into latency
//! statistics printed when the session ends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, Write};
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::Options;
use super::StackMode;
use super::attached::Attached;
use crate::events::clock::Clock;
use crate::events::drain::{Drainer, Lost};
use crate::events::predicate;
use crate::events::stacks::{self, Frame, Recorded, StackCounts};
use crate::events::stats::Latency;
use crate::events::values::{self, MAX_STRING, ProbeInfo};
use crate::events::{Kind, RawEvent};
use crate::notes::Notes;
use crate::output::aggregates::{AggRow, ProbeAgg};
use crate::output::chrome::ChromeTrace;
use crate::output::chrome_args::{self, ChromeArgs};
use crate::output::events::Line;
use crate::output::report::ProbeValues;
use crate::output::report::ProcessReport;
use crate::output::results::EventLines;
use crate::output::sink::Sink;
use crate::output::stacks::ProbeStacks;
use crate::output::tree::{Columns, Outcome, Tree};
use crate::output::{Summary, thousands};
use crate::probe::layout::{self, kind};
use crate::symbols::stackwalk::StackWalker;
use crate::symbols::symbolize::Symbolizer;

/// A Chrome trace that the tracers of several processes write into.
pub type SharedChrome = Rc<RefCell<ChromeTrace>>;

/// Starts a Chrome trace on `sink` (the session's results).
pub fn chrome_on(sink: Sink, pid: i32) -> Result<SharedChrome> {
    let c = ChromeTrace::new(Box::new(sink), pid).context("writing the trace")?;
    Ok(Rc::new(RefCell::new(c)))
}

/// Closes a Chrome trace once no tracer holds it any more.
pub fn close_chrome(chrome: SharedChrome) -> Result<()> {
    match Rc::try_unwrap(chrome) {
        Ok(c) => c.into_inner().finish().context("writing the trace file"),
        Err(_) => Ok(()),
    }
}

/// Where a session's tracers write: shared by all of them.
#[derive(Clone)]
pub struct TraceOutput {
    /// Event lines and the summary.
    pub sink: Sink,
    /// The Chrome trace, if one was asked for.
    pub chrome: Option<SharedChrome>,
    /// Lines name the process: a session of several, and from the first
    /// event of a process a target forked on.
    show_pid: Rc<Cell<bool>>,
    /// The text header is printed once per session (again when the PID
    /// column appears).
    header_done: Rc<Cell<bool>>,
}

impl TraceOutput {
    /// Output to `sink`, and to `chrome` if given.
    pub fn new(sink: Sink, chrome: Option<SharedChrome>, show_pid: bool) -> TraceOutput {
        TraceOutput { sink, chrome, show_pid: Rc::new(Cell::new(show_pid)), header_done: Rc::new(Cell::new(false)) }
    }
}

/// How often a tracer looks for processes that ended without being
/// reaped, or exec'd, to free their ring slots (those reaped are freed at
/// every drain).
const FREE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Frees the ring slots of processes that ended, once drained: a server
/// forks on and on, and each child takes rings of its own. At every call,
/// those whose process is gone (one `kill(pid, 0)` each); at most every
/// `FREE_EVERY` (`next`), also those of a zombie with no thread left
/// and of a process that exec'd. A slot is written only by its thread, so
/// a process none of whose threads runs the program any more writes none.
pub fn free_ended_rings(region: &crate::probe::region::Region, next: &mut std::time::Instant) {
    if std::time::Instant::now() < *next {
        Drainer::free_ended(region, |pid| !crate::process::exists(pid as i32));
        return;
    }
    Drainer::free_ended(region, |pid| ended(region, pid as i32));
    *next = std::time::Instant::now() + FREE_EVERY;
}

/// True if no thread of process `pid` can write `region`'s rings again.
fn ended(region: &crate::probe::region::Region, pid: i32) -> bool {
    match crate::process::status(pid) {
        Err(_) => !crate::process::exists(pid),
        // A leader that exited before its threads is a zombie while they run.
        Ok(st) if st.state == 'Z' || st.state == 'X' => crate::process::threads(pid).map_or(true, |t| t.len() <= 1),
        Ok(_) => !crate::probe::family::holds(region, pid),
    }
}

/// Says to `notes` the note `sym` has about frames it could not name, if any.
fn say_note(notes: &dyn Notes, sym: &mut Symbolizer) {
    if let Some(note) = sym.take_note() {
        crate::note!(notes, "tp: {}", crate::escape::text(&note));
    }
}

/// Writes `line` in the form of `lines`, if events are written.
fn write_line(
    lines: Option<&dyn EventLines>,
    out: &mut dyn Write,
    origin_ns: u64,
    pid: (i32, bool),
    line: &Line,
) -> io::Result<()> {
    match lines {
        Some(l) => l.write(out, origin_ns, pid, line),
        None => Ok(()),
    }
}

/// The consumer of one process's events.
pub struct Tracer {
    pid: i32,
    clock: Clock,
    drainer: Drainer,
    batch: Vec<RawEvent>,
    /// Entry index → position in the session's probes.
    index: HashMap<u32, usize>,
    /// How events are written as they come; None: not at all.
    lines: Option<&'static dyn EventLines>,
    /// Where its notes go.
    notes: Arc<dyn Notes>,
    output: TraceOutput,
    /// Per thread, the entries still waiting for their exit: (probe, args JSON).
    pending: HashMap<u32, Vec<(u32, ChromeArgs)>>,
    latency: Vec<Latency>,
    origin_ns: u64,
    lost_at_start: Lost,
    /// Events read per process: the session's and those it forked.
    per_process: std::collections::BTreeMap<u32, u64>,
    next_free: std::time::Instant,
    /// The owner (PID and TID) of each ring slot seen claimed, kept past
    /// the slot's freeing (its process detached or ended), which zeroes
    /// it: the aggregates by thread are read at the end.
    owners: crate::events::aggregates::Owners,
    /// The words of the stacks drained with the batch.
    words: Vec<u64>,
    /// Calls counted per probe and stack (`--stack`).
    stacks: StackCounts,
    /// Names the stacks' addresses while the process lives.
    symbolizer: Option<Symbolizer>,
    /// Names `--by caller`'s return addresses (a report may be made from a
    /// shared reference: `--listen`'s).
    callers: RefCell<Option<Symbolizer>>,
    /// Unwinds copies of stacks (`--stack dwarf`).
    walker: Option<StackWalker>,
    /// Per probe position: calls whose stack was cut, read without bounds, not read.
    stack_notes: HashMap<usize, (u64, u64, u64)>,
    /// Each thread's call tree (`--tree`).
    tree: Option<Tree>,
}

impl Tracer {
    /// Starts consuming the events of `attached`, written to `output`.
    pub fn with_output(attached: &Attached, opts: &Options, output: TraceOutput) -> Tracer {
        let lines = opts.event_lines();
        let index = attached.event_probes().into_iter().collect();
        let clock = attached.clock.clone();
        let origin_ns = crate::events::clock::monotonic_ns();
        // (`--args 'EXPR'` copies the strings it names at the call.)
        if attached.infos.iter().any(|i| {
            i.picks.is_empty()
                && i.dwarf
                    .as_ref()
                    .is_some_and(|d| d.params.iter().any(|p| p.ty == crate::symbols::dwarf::Type::CString))
        }) && opts.selection.records.args
        {
            crate::note!(
                opts.notes,
                "tp: `char *` arguments are read from the target when tp drains events, after the call: best effort \
                 (--args 'NAME, …' copies them at the call)"
            );
        }
        Tracer {
            pid: attached.pid,
            clock,
            drainer: Drainer::default(),
            batch: Vec::new(),
            index,
            lines,
            notes: opts.notes.clone(),
            output,
            pending: HashMap::new(),
            latency: vec![Latency::default(); attached.infos.len()],
            origin_ns,
            lost_at_start: attached.lost_at_start,
            per_process: std::collections::BTreeMap::new(),
            next_free: std::time::Instant::now(),
            owners: Default::default(),
            words: Vec::new(),
            stacks: StackCounts::default(),
            symbolizer: None,
            callers: RefCell::new(None),
            walker: None,
            stack_notes: HashMap::new(),
            tree: opts.tree.then(Tree::default),
        }
    }

    /// The events read so far from each process that recorded some (the
    /// session's own and those it forked while the probes were in).
    pub fn events_per_process(&self) -> &std::collections::BTreeMap<u32, u64> {
        &self.per_process
    }

    /// Takes in the probes `attached` gained since ([`Attached::extend`]).
    pub fn refresh(&mut self, attached: &Attached) {
        self.index = attached.event_probes().into_iter().collect();
        self.latency.resize(attached.infos.len(), Latency::default());
    }

    /// The latency of each of the user's probes so far, in summary order
    /// (`None` where returns are not recorded).
    pub fn latency(&self, attached: &Attached) -> Vec<Option<Latency>> {
        // Durations kept in the target (`--ret -q`) add to those of events
        // (calls a thread's full table sent through the ring).
        let kept = if attached.records() & kind::AGGREGATE != 0 {
            crate::events::aggregates::latency(&attached.region, &self.clock)
        } else {
            HashMap::new()
        };
        let indexes = attached.all_indexes();
        attached
            .user_positions()
            .into_iter()
            .map(|i| {
                attached_records_returns(attached, i).then(|| {
                    let mut l = self.latency.get(i).cloned().unwrap_or_default();
                    if let Some(k) = indexes.get(i).and_then(|x| kept.get(x)) {
                        l.merge(k);
                    }
                    l
                })
            })
            .collect()
    }

    /// Drains and handles every event published so far.
    pub fn poll(&mut self, attached: &Attached) -> Result<()> {
        self.clock.refine();
        self.batch.clear();
        self.words.clear();
        self.drainer.drain_with_stacks(&attached.region, &mut self.batch, &mut self.words)?;
        if attached.selection().by.is_some() || attached.selection().agg.is_some() {
            self.owners.note(&attached.region);
        }
        free_ended_rings(&attached.region, &mut self.next_free);
        if self.batch.is_empty() {
            return Ok(());
        }
        // Per thread the rings are in order; across threads, by time.
        self.batch.sort_by_key(|e| e.tsc);
        let batch = std::mem::take(&mut self.batch);
        let mut out = self.output.sink.clone();
        let forked = batch.iter().any(|e| e.pid != 0 && e.pid != self.pid as u32);
        if forked && !self.output.show_pid.get() {
            // From the first event of a child on, lines say the process.
            self.output.show_pid.set(true);
            self.output.header_done.set(false);
        }
        if !self.output.header_done.get()
            && let Some(header) = self.lines.and_then(|l| l.header(self.output.show_pid.get(), self.tree.is_some()))
        {
            writeln!(out, "{header}")?;
            self.output.header_done.set(true);
        }
        for ev in &batch {
            *self.per_process.entry(ev.pid).or_default() += 1;
            if let Some(c) = &self.output.chrome {
                c.borrow_mut().set_pid(if ev.pid != 0 { ev.pid as i32 } else { self.pid });
            }
            self.handle(attached, ev, &mut out)?;
        }
        out.flush()?;
        self.batch = batch;
        Ok(())
    }

    fn handle(&mut self, attached: &Attached, ev: &RawEvent, out: &mut impl Write) -> Result<()> {
        let Some(&i) = self.index.get(&ev.probe) else { return Ok(()) };
        let read = |p: u64| attached.read_string(p, MAX_STRING);
        let ts_ns = self.clock.ns(ev.tsc);
        let pid = (if ev.pid != 0 { ev.pid as i32 } else { self.pid }, self.output.show_pid.get());
        let stack = if ev.kind == Kind::Entry && attached.probe_kind(i) & kind::STACK != 0 {
            self.stack_of(attached, i, ev)
        } else {
            None
        };
        // The values copied at the call (`--args 'req->len'`), where its stack would be.
        let fetched: Vec<u64> = match ev.kind == Kind::Entry && attached.probe_kind(i) & kind::FIELDS != 0 {
            true => {
                let (start, len) = (ev.stack.0 as usize, ev.stack.1 as usize);
                self.words.get(start..start + len).unwrap_or(&[]).to_vec()
            }
            false => Vec::new(),
        };
        let info: &ProbeInfo = &attached.infos[i];
        // `--tree` as text draws the tree; else each line has its depth.
        let draws_tree = self.lines.is_some_and(|l| l.draws_tree());
        let mut chrome = self.output.chrome.as_ref().map(|c| c.borrow_mut());
        match ev.kind {
            Kind::Entry => {
                let args = values::args(info, &ev.v, &fetched, &read);
                let lines_of_stack: Option<Vec<String>> =
                    stack.as_ref().map(|frames| frames.iter().flat_map(Frame::lines).collect());
                let depth = match &mut self.tree {
                    Some(tree) => {
                        let depth = tree.depth(pid.0, ev.tid);
                        let cols = Columns { origin_ns: self.origin_ns, pid: pid.0, show_pid: pid.1 };
                        // (In JSON the tree only counts the depth.)
                        let mut sink = io::sink();
                        let mut w: &mut dyn Write = if draws_tree { &mut *out } else { &mut sink };
                        tree.entry(&mut w, &cols, ev.tid, ts_ns, ev.probe, info, &args)?;
                        Some(depth)
                    }
                    None => None,
                };
                if !(self.tree.is_some() && draws_tree) {
                    let stack = lines_of_stack.as_deref();
                    let line = Line::Entry { info, tid: ev.tid, ts_ns, args: &args, stack, depth };
                    write_line(self.lines, out, self.origin_ns, pid, &line)?;
                }
                if let Some(c) = &mut chrome {
                    let mut call_args = ChromeArgs::of_call(&args);
                    if let Some(lines) = &lines_of_stack {
                        // The stack as the call's argument `stack`, innermost first.
                        call_args.push("stack", lines.clone().into());
                    }
                    if attached_records_returns(attached, i) {
                        self.pending.entry(ev.tid).or_default().push((ev.probe, call_args));
                    } else {
                        c.instant(&info.name, ev.tid, ts_ns, &call_args)?;
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
                let tail_call = !unwound && ev.tail_call();
                let ret = if unwound || tail_call { None } else { values::ret(info, ev.v[0], &read) };
                if !unwound {
                    self.latency[i].add(duration_ns);
                }
                let depth = match &mut self.tree {
                    Some(tree) => {
                        let cols = Columns { origin_ns: self.origin_ns, pid: pid.0, show_pid: pid.1 };
                        let outcome = match (unwound, tail_call) {
                            (true, _) => Outcome::Unwound,
                            (false, true) => Outcome::TailCall,
                            (false, false) => Outcome::Returned(ret.as_ref()),
                        };
                        let mut sink = io::sink();
                        let mut w: &mut dyn Write = if draws_tree { &mut *out } else { &mut sink };
                        tree.exit(&mut w, &cols, ev.tid, ts_ns, ev.probe, info, outcome, duration_ns)?;
                        // The call's own depth, now that it is closed.
                        Some(tree.depth(pid.0, ev.tid))
                    }
                    None => None,
                };
                if !(self.tree.is_some() && draws_tree) {
                    let line = match unwound {
                        true => Line::Unwound { info, tid: ev.tid, ts_ns, duration_ns, depth },
                        false => {
                            Line::Exit { info, tid: ev.tid, ts_ns, ret: ret.as_ref(), tail_call, duration_ns, depth }
                        }
                    };
                    write_line(self.lines, out, self.origin_ns, pid, &line)?;
                }
                if let Some(c) = &mut chrome {
                    let mut args = pop_pending(&mut self.pending, ev.tid, ev.probe).unwrap_or_default();
                    match (&ret, unwound) {
                        (_, true) => args.push("unwound", true.into()),
                        (Some(v), false) => args.push("ret", chrome_args::value(v)),
                        (None, false) if tail_call => args.push("tail_call", true.into()),
                        (None, false) => {}
                    }
                    c.slice(&info.name, ev.tid, start_ns, span_ns, &args)?;
                }
            }
        }
        Ok(())
    }

    /// The stack recorded with entry event `ev` of probe `i`, counted, and
    /// named (the function first, then its callers); None if it has none
    /// tp can read.
    fn stack_of(&mut self, attached: &Attached, i: usize, ev: &RawEvent) -> Option<Vec<Frame>> {
        let (start, len) = (ev.stack.0 as usize, ev.stack.1 as usize);
        let note = self.stack_notes.entry(i).or_default();
        let Some(stack) = self.words.get(start..start + len).and_then(stacks::decode) else {
            note.2 += 1;
            return None;
        };
        note.0 += (stack.truncated && matches!(stack.recorded, Recorded::Frames(_))) as u64;
        note.1 += stack.no_bounds as u64;
        let addrs = match stack.recorded {
            Recorded::Frames(a) => a,
            Recorded::Copy { sp, fp, ra, words } => {
                let depth = match attached.selection().stack {
                    Some(StackMode::Unwind { depth, .. }) => depth,
                    _ => crate::probe::layout::MAX_STACK_DEPTH,
                };
                let walker = self.walker.get_or_insert_with(|| StackWalker::new(self.pid));
                walker.unwind(attached.function_addr(i), sp, fp, ra, &words, depth as usize)
            }
        };
        let sym = self.symbolizer.get_or_insert_with(|| Symbolizer::new(self.pid));
        let mut frames = Vec::with_capacity(addrs.len() + 1);
        let f = attached.function_addr(i);
        let info = &attached.infos[i];
        frames.push(Frame {
            function: Some(info.name.clone()),
            module: Some(info.module.clone()),
            offset: 0,
            addr: f,
            inlined: Vec::new(),
        });
        frames.extend(addrs.iter().map(|&a| sym.frame(a, true)));
        say_note(&*self.notes, sym);
        if !self.stacks.add(i, addrs) {
            self.stack_notes.entry(i).or_default().2 += 1;
        }
        Some(frames)
    }

    /// Each of the user's probes' stacks, named, with their counts.
    fn stack_report(&mut self, attached: &Attached) -> Vec<ProbeStacks> {
        if self.stacks.is_empty() && self.stack_notes.is_empty() {
            return Vec::new();
        }
        let sym = self.symbolizer.get_or_insert_with(|| Symbolizer::new(self.pid));
        attached
            .user_positions()
            .into_iter()
            .filter(|&i| attached.probe_kind(i) & kind::STACK != 0)
            .map(|i| {
                let info = &attached.infos[i];
                let f = attached.function_addr(i);
                let leaf = Frame {
                    function: Some(info.name.clone()),
                    module: Some(info.module.clone()),
                    offset: 0,
                    addr: f,
                    inlined: Vec::new(),
                };
                let stacks = self
                    .stacks
                    .of(i)
                    .into_iter()
                    .map(|(addrs, n)| {
                        let mut frames = vec![leaf.clone()];
                        frames.extend(addrs.iter().map(|&a| sym.frame(a, true)));
                        (frames, n)
                    })
                    .collect();
                say_note(&*self.notes, sym);
                let (truncated, no_bounds, unreadable) = self.stack_notes.get(&i).copied().unwrap_or_default();
                ProbeStacks {
                    function: info.name.clone(),
                    module: info.module.clone(),
                    stacks,
                    truncated,
                    no_bounds,
                    unreadable,
                }
            })
            .collect()
    }

    /// The calls of each of the user's probes counted by an argument's value (`--by`).
    fn by_report(&self, attached: &Attached) -> Vec<ProbeValues> {
        let Some(arg) = attached.selection().by.clone() else { return Vec::new() };
        // Other keys, or values aggregated, are aggregate_report's.
        if attached.selection().agg.is_some()
            || !matches!(predicate::parse_keys(&arg).as_deref(), Ok([predicate::Key::Value(_)]))
        {
            return Vec::new();
        }
        let (counts, overflow) = crate::events::aggregates::by_value(&attached.region);
        let indexes = attached.all_indexes();
        let mut out: Vec<ProbeValues> = attached
            .user_positions()
            .into_iter()
            .map(|i| {
                let word = attached.probe_config(i).by;
                let index = indexes.get(i).copied().unwrap_or(u32::MAX);
                let mut values: Vec<(i128, u64)> = counts
                    .iter()
                    .filter(|((p, _), _)| *p == index)
                    .map(|((_, v), &n)| (predicate::by_value(word, *v), n))
                    .collect();
                values.sort();
                ProbeValues { function: attached.infos[i].name.clone(), arg: arg.clone(), values, overflow: 0 }
            })
            .collect();
        if let Some(first) = out.first_mut() {
            first.overflow = overflow;
        }
        out
    }

    /// Each of the user's probes' aggregates (`--agg`), or counts by keys
    /// that name the thread or process (`--by 'fd, tid'`), from the
    /// threads' tables: each thread's rows under their keys, merged (the
    /// summary's, and the live ones `--listen` publishes).
    pub fn aggregate_report(&self, attached: &Attached) -> Vec<ProbeAgg> {
        let sel = attached.selection();
        let indexes = attached.all_indexes();
        let probes: Vec<AggProbe> = attached
            .user_positions()
            .into_iter()
            .map(|i| AggProbe {
                function: attached.infos[i].name.clone(),
                index: indexes.get(i).copied().unwrap_or(u32::MAX),
                config: attached.probe_config(i),
            })
            .collect();
        // Callers are named while the process runs (its modules as mapped).
        let mut sym = self.callers.borrow_mut();
        let mut name = |a: u64| sym.get_or_insert_with(|| Symbolizer::new(self.pid)).frame(a, true);
        let agg = match sel.agg.as_deref().map(predicate::parse_agg) {
            Some(Ok(a)) => Some(a.names()),
            Some(Err(_)) => return Vec::new(),
            None => None,
        };
        aggregates_of(&attached.region, &self.owners, &probes, sel.by.as_deref(), agg.as_ref(), &mut name)
    }

    /// Ends consuming: says how many events were lost, and returns this
    /// process's report (its counts in `summary`, with latency).
    pub fn end(mut self, attached: &Attached, summary: Summary) -> ProcessReport {
        if let Some(tree) = &mut self.tree
            && self.lines.is_some_and(|l| l.draws_tree())
        {
            // Calls still open when the session ends.
            let cols = Columns { origin_ns: self.origin_ns, pid: self.pid, show_pid: self.output.show_pid.get() };
            let mut out = self.output.sink.clone();
            let _ = tree.flush(&mut out, &cols).and_then(|()| out.flush());
        }
        let parts = Drainer::lost_parts(&attached.region).since(&self.lost_at_start);
        let lost = parts.total();
        let mut why = Vec::new();
        if parts.ring_full > 0 {
            why.push(format!("{}: a thread's ring was full; raise --ring-size", thousands(parts.ring_full)));
        }
        if parts.no_ring > 0 {
            why.push(format!(
                "{}: no ring was free, more threads recorded at once (forked children's included) than tp has \
                 rings ({})",
                thousands(parts.no_ring),
                1u32 << crate::probe::layout::EVENT_SLOT_BITS
            ));
        }
        if parts.too_deep > 0 {
            why.push(format!(
                "{}: exits of calls nested deeper in timed calls than tp follows ({} per thread, {} per \
                 goroutine) or of goroutines past the {} tp follows",
                thousands(parts.too_deep),
                crate::probe::layout::SHADOW_LEN,
                crate::probe::layout::GO_FRAMES,
                crate::probe::layout::GO_SLOTS
            ));
        }
        if parts.no_room > 0 {
            why.push(format!(
                "{}: entries of Go functions without a stack check whose goroutine had too little stack left \
                 for tp's call",
                thousands(parts.no_room)
            ));
        }
        // Nobody reads the events once tp's output is closed.
        if lost > 0 && !crate::streams::closed() {
            crate::note!(self.notes, "tp: lost {} events ({})", thousands(lost), why.join("; "));
        }
        let latency = self.latency(attached);
        let stacks = self.stack_report(attached);
        if matches!(attached.selection().stack, Some(StackMode::FramePointers { .. })) {
            stacks.iter().filter_map(super::explain::stack_hint).for_each(|h| crate::note!(self.notes, "{h}"));
        }
        let by = self.by_report(attached);
        self.owners.note(&attached.region);
        let aggregates = self.aggregate_report(attached);
        ProcessReport::traced(summary, latency, aggregates).with_events(lost, stacks, by)
    }
}

fn attached_records_returns(attached: &Attached, i: usize) -> bool {
    attached.probe_kind(i) & kind::RET != 0
}

/// The args of the innermost pending entry of `probe` on thread `tid`; entries
/// above it (their exits were lost) are dropped.
fn pop_pending(pending: &mut HashMap<u32, Vec<(u32, ChromeArgs)>>, tid: u32, probe: u32) -> Option<ChromeArgs> {
    let stack = pending.get_mut(&tid)?;
    let at = stack.iter().rposition(|(p, _)| *p == probe)?;
    let (_, args) = stack.remove(at);
    stack.truncate(at);
    Some(args)
}

/// A probe whose aggregates [`aggregates_of`] reads.
#[derive(Debug, Clone)]
pub struct AggProbe {
    /// Its function's name.
    pub function: String,
    /// Its entry index in the region.
    pub index: u32,
    /// Its configuration (`--by`'s word, `--agg`'s program).
    pub config: layout::ProbeConfig,
}

/// The aggregates (`--agg`), or counts by keys that name the thread or
/// process (`--by 'fd, tid'`), of `probes`, which share `--by` and `--agg`
/// (`by` as written, `agg`'s names), from the threads' tables in `region`:
/// each thread's rows under the keys asked, merged. None if neither asks
/// for them (`--by` of an argument alone has its own table and output), or
/// if `by` does not parse (text the target could have written). `name`
/// names a `caller` key's return addresses, and a `stack` key's.
pub fn aggregates_of(
    region: &crate::probe::region::Region,
    owners: &crate::events::aggregates::Owners,
    probes: &[AggProbe],
    by: Option<&str>,
    agg: Option<&predicate::AggNames>,
    name: &mut dyn FnMut(u64) -> Frame,
) -> Vec<ProbeAgg> {
    let keys = match by.map(predicate::parse_keys) {
        Some(Ok(k)) => k,
        Some(Err(_)) => return Vec::new(),
        None => Vec::new(),
    };
    if agg.is_none() && (keys.is_empty() || matches!(keys[..], [predicate::Key::Value(_)])) {
        return Vec::new();
    }
    let names: Vec<String> = keys
        .iter()
        .map(|k| match k {
            predicate::Key::Value(v) => v.clone(),
            predicate::Key::Tid => "tid".into(),
            predicate::Key::Pid => "pid".into(),
            predicate::Key::Caller => crate::output::aggregates::CALLER.into(),
            predicate::Key::Stack(_) => crate::output::aggregates::STACK.into(),
        })
        .collect();
    let caller = keys.iter().position(|k| *k == predicate::Key::Caller);
    let stack = keys.iter().position(|k| matches!(k, predicate::Key::Stack(_)));
    let stack_frames = match stack {
        Some(_) => crate::events::aggregates::stack_keys(region),
        None => Default::default(),
    };
    let (values, overflow, unreadable) = crate::events::aggregates::values(region, owners);
    let (counts, by_overflow) = crate::events::aggregates::by_thread(region, owners);
    let key_of = |word: u32, value: u64, pid: u32, tid: u32| -> Vec<i128> {
        keys.iter()
            .map(|k| match k {
                predicate::Key::Value(_) => predicate::by_value(word, value),
                predicate::Key::Tid => tid as i128,
                predicate::Key::Pid => pid as i128,
                predicate::Key::Caller | predicate::Key::Stack(_) => value as i128,
            })
            .collect()
    };
    let mut out: Vec<ProbeAgg> = probes
        .iter()
        .map(|p| {
            let (config, index) = (&p.config, p.index);
            let head = config.agg[0];
            let rows: Vec<AggRow> = match config.by & layout::by_word::AGG != 0 {
                true => values
                    .iter()
                    .filter(|v| v.probe == index)
                    .map(|v| {
                        let e = &v.entry;
                        AggRow {
                            key: key_of(config.by, e.key, v.pid, v.tid),
                            count: e.count,
                            sum: predicate::agg_value(head, e.sum),
                            min: predicate::agg_value(head, e.min),
                            max: predicate::agg_value(head, e.max),
                            hist: e.buckets.to_vec(),
                        }
                    })
                    .collect(),
                false => counts
                    .iter()
                    .filter(|c| c.probe == index)
                    .map(|c| AggRow {
                        key: key_of(config.by, c.value, c.pid, c.tid),
                        count: c.count,
                        ..AggRow::default()
                    })
                    .collect(),
            };
            let mut rows = crate::output::aggregates::merged(rows);
            // A stack's key is a hash, whose order says nothing: the
            // stacks with the most calls first (ties in key order).
            if stack.is_some() {
                rows.sort_by_key(|r| std::cmp::Reverse(r.count));
            }
            let callers = caller
                .map(|k| rows.iter().filter_map(|r| r.key.get(k)).map(|&v| (v, name(v as u64))).collect())
                .unwrap_or_default();
            let stacks = stack
                .map(|k| {
                    rows.iter()
                        .filter_map(|r| r.key.get(k))
                        .filter_map(|&v| {
                            stack_frames.get(&(v as u64)).map(|f| (v, f.iter().map(|&a| name(a)).collect()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            ProbeAgg {
                function: p.function.clone(),
                keys: names.clone(),
                value: agg.and_then(|a| a.value.clone()),
                funcs: agg.map_or(vec![predicate::AggFn::Count], |a| a.funcs.clone()),
                rows,
                overflow: 0,
                unreadable: 0,
                callers,
                stacks,
            }
        })
        .collect();
    if let Some(first) = out.first_mut() {
        first.overflow = overflow.saturating_add(if agg.is_none() { by_overflow } else { 0 });
        first.unreadable = unreadable;
    }
    out
}
