//! A session over a set of processes: `tp attach -p 12,34`, `--name`, and
//! the one process `tp run` starts.
//!
//! Each [`Member`] is one process with its own attached state: the probes
//! in the program it runs now, and what the programs it ran before (an exec
//! followed with `--follow-exec`) counted. Processes attach one after
//! another, each with the ordinary stop-the-world of its own threads. One
//! loop observes them all ([`Group::observe`]): it drains each process's
//! events, redraws the live counts, publishes the metrics for `--listen`,
//! and every check interval looks at each process: whether it exited,
//! exec'd ([`follow::change`]) or lost its probes to another tp, and whether
//! a library it loaded gives a waiting pattern something to probe
//! ([`follow::Follow`]). It ends on a signal, the duration, or when no
//! member is left. [`Group::detach`] restores every process still probed
//! and returns one report per process; dropping the group without it (an
//! error, a panic) restores them quietly, as [`super::guard::Restore`]
//! does for one attach.
//!
//! A member holds a list of programs so that a process's children (forked
//! while probes were in) or a later image can join as members or programs
//! of their own without changing the loop: [`Group::add`] takes any
//! attached process, and [`Member::programs`] any number of images.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Options;
use super::attached::Attached;
use super::exe::ExeFile;
use super::follow::{self, Change, Follow};
use super::forked::Family;
use super::libraries::{Libraries, Probes};
use super::observe::{self, End};
use super::steps::Stepping;
use super::tracer::{TraceOutput, Tracer};
use crate::arch::{Arch, Host};
use crate::escape::text;
use crate::notes::Notes;
use crate::output::live::Live;
use crate::output::openmetrics::{Series, series_of};
use crate::output::report::{self, ProcessReport};
use crate::probe::family::{Outcome, Relative};
use crate::probe::layout::kind;
use crate::probe::remove::Kept;
use crate::probe::rendezvous_wait;
use crate::process;
use crate::process::proc_events::Ended;
use crate::process::regset;
use crate::process::stop::Stopped;
use crate::symbols::{Found, ProcessModules};
use anyhow::Context;

/// How often the loop drains events.
const TICK: Duration = Duration::from_millis(20);

/// How long a wait at a rendezvous lasts at most while new processes of an
/// `--exe` file may start: they are heard between two.
const EXE_SLICE: Duration = Duration::from_millis(1);
/// How often the live display and the published metrics are renewed.
const DRAW_EVERY: Duration = Duration::from_millis(100);
/// The metrics a session publishes for `--listen`: its series, renewed by
/// the observe loop and read by the HTTP server's thread, which renders
/// them in the format each scrape asks for.
pub type Published = Arc<Mutex<Vec<Series>>>;

/// How a session over several processes behaves.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// Several processes were asked for: lines and summaries name them.
    pub several: bool,
    /// How often each process is looked at (exit, exec, new libraries).
    pub check_every: Duration,
    /// Show the live counts on stderr (hidden anyway when it is no terminal).
    pub live: bool,
    /// Print one line per process as it attaches and ends.
    pub announce: bool,
    /// The command, as the JSON summary names it (`attach`, `run`).
    pub command: &'static str,
}

/// One program a member ran, with its probes.
struct Program {
    attached: Attached,
    tracer: Option<Tracer>,
    /// Its probes are in the running process (not ended by exec, exit or detach).
    live: bool,
    /// What it counted, once it ended.
    report: Option<ProcessReport>,
    /// Events read per process (its own and its children's), once it ended.
    events: std::collections::BTreeMap<u32, u64>,
    /// Its calls stepped instruction by instruction (`--steps`).
    stepping: Option<Stepping>,
}

/// How a member left the session before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// The process exited (how, when the kernel said).
    Exited(Ended),
    /// It exec'd another program, which is not followed.
    Execd(String),
    /// Another tp removed its probes.
    Removed,
}

/// One process of the session.
pub struct Member {
    /// The process.
    pub pid: i32,
    programs: Vec<Program>,
    /// The libraries it loads that patterns wait for (`tp run`, `tp
    /// attach` of a library not loaded yet, a program followed after
    /// exec), and those tp probed.
    libs: Libraries,
    /// Set once the process left the session.
    pub left: Option<Left>,
    /// How long the session's end stopped the process to restore its code
    /// (zero if it had ended), once it did.
    pub detach_stop: Option<Duration>,
    /// How the process ended, if it ended during the session (as the
    /// kernel said: [`Ended::Unknown`] where tp does not hear it).
    pub ended: Option<Ended>,
}

impl Member {
    /// How many programs the member ran under the session.
    pub fn programs(&self) -> usize {
        self.programs.len()
    }

    /// The probes of the program it runs now, while they are in.
    pub fn attached(&self) -> Option<&Attached> {
        self.programs.last().filter(|p| p.live).map(|p| &p.attached)
    }

    fn current(&mut self) -> Option<&mut Program> {
        self.programs.last_mut().filter(|p| p.live)
    }

    /// The data region of the live program, if tp's probe at the dynamic
    /// linker's rendezvous is in it.
    fn rendezvous(&self) -> Option<&crate::probe::Region> {
        rendezvous_of(&self.programs)
    }

    /// The report of every program so far, merged.
    fn report_now(&self) -> ProcessReport {
        let reports = self
            .programs
            .iter()
            .map(|p| match &p.report {
                Some(r) => r.clone(),
                None => {
                    let summary = p.attached.summary();
                    let blocks = p.attached.blocks(&summary);
                    let mut r = match &p.tracer {
                        Some(t) => {
                            ProcessReport::traced(summary, t.latency(&p.attached), t.aggregate_report(&p.attached))
                        }
                        None => ProcessReport::counts(summary),
                    };
                    r.blocks = blocks;
                    r
                }
            })
            .collect();
        let mut report = report::merge_programs(self.pid, reports);
        report.libraries = self.libs.loaded.clone();
        report
    }
}

/// The processes of one session.
pub struct Group {
    opts: Options,
    output: TraceOutput,
    how: Behaviour,
    /// The members, in the order they joined.
    pub members: Vec<Member>,
    live: Option<(Live, Vec<String>)>,
    published: Option<Published>,
    done: bool,
    /// The processes the members fork, and how each process ends.
    family: Family,
    /// How long the session observed, once it did.
    observed: Option<Duration>,
    /// The file whose new processes join the session (`--exe`).
    exe: Option<ExeFile>,
}

impl Group {
    /// An empty session that probes as `opts` says (its `pid` is ignored)
    /// and writes events and the summary to `output`.
    pub fn new(opts: Options, output: TraceOutput, how: Behaviour) -> Group {
        let family = Family::start();
        Group {
            opts,
            output,
            how,
            members: Vec::new(),
            live: None,
            published: None,
            done: false,
            family,
            observed: None,
            exe: None,
        }
    }

    /// From now on, every process that starts running `exe` (or, for a
    /// library, a program that needs it) joins the session as soon as tp
    /// hears of its exec, and the session goes on while none runs. Needs
    /// the kernel's process events.
    pub fn follow_exe(&mut self, exe: ExeFile) -> Result<()> {
        if !self.family.hears() {
            anyhow::bail!(
                "--exe needs the kernel's process events to see new processes: {} (tp runs as root, \
                 with CAP_NET_ADMIN, in the initial network namespace)",
                self.family.unheard.as_deref().unwrap_or("not heard")
            );
        }
        self.family.keep_execs();
        self.exe = Some(exe);
        Ok(())
    }

    /// Makes members of the processes that exec'd the `--exe` file since
    /// the last look: each is stopped first, at once, so that its probes
    /// go in before it runs far (a dynamically linked program is still in
    /// its dynamic linker); patterns for libraries it has not loaded yet
    /// wait for them as `tp run`'s do.
    fn join_new_processes(&mut self) {
        let Some(exe) = &self.exe else { return };
        self.family.poll();
        let me = std::process::id() as i32;
        // Each is stopped first, all of them, then probed one by one.
        let mut held = Vec::new();
        for pid in self.family.take_execs() {
            // A member that exec'd it again is the session's already: the
            // look at its exec ([`Group::check`]) says what follows.
            if pid == me || !exe.in_new_process(pid) || self.members.iter().any(|m| m.pid == pid && m.left.is_none()) {
                continue;
            }
            match Stopped::hold_new(pid, self.opts.notes.clone()) {
                Ok(stopped) => held.push((pid, stopped, Instant::now())),
                Err(e) => crate::note!(
                    self.opts.notes,
                    "tp: process {pid} started but was not probed: {}",
                    text(&format!("{e:#}"))
                ),
            }
        }
        let path = exe.path.display().to_string();
        for (pid, stopped, heard) in held {
            match self.join(pid, stopped) {
                Ok(n) => crate::note!(
                    self.opts.notes,
                    "tp: process {pid} started {}: {n} probe{} in, {:.1} ms after it was stopped",
                    text(&path),
                    plural(n),
                    heard.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => crate::note!(
                    self.opts.notes,
                    "tp: process {pid} started but was not probed: {}",
                    text(&format!("{e:#}"))
                ),
            }
        }
    }

    /// Probes process `pid`, which `held` holds stopped, and makes it a
    /// member. Returns how many probes went in now.
    fn join(&mut self, pid: i32, held: Stopped) -> Result<usize> {
        let (attached, follow, _) = self.probe_new_program(pid, held)?;
        let n = attached.as_ref().map_or(0, |a| a.names().len());
        self.add(pid, attached, Some(follow));
        Ok(n)
    }

    /// Probes the program process `pid` has just started running (an exec),
    /// which `held` holds stopped, as the session's patterns say: those for
    /// libraries not loaded yet wait for them. Returns its probes (None if
    /// nothing could go in yet), the patterns still waiting, and the lines
    /// saying what they wait for.
    fn probe_new_program(&self, pid: i32, held: Stopped) -> Result<(Option<Attached>, Follow, Vec<String>)> {
        // Caught in its dynamic linker before the thread has its TLS (where
        // the runtime finds its thread's state; the loader calls the
        // rendezvous before it sets it up): run on to the program's entry
        // point first, as `tp run` holds its program there. (A static
        // program, which has no rendezvous, is probed where it is, as
        // `tp run` probes it at its entry.)
        let regs =
            regset::get_regs(held.worker()).with_context(|| format!("reading the registers of process {pid}"))?;
        if Host::thread_pointer(&regs) == 0
            && crate::process::launch::has_interpreter(pid)
            && let Some(exit) = crate::process::launch::run_to_entry(pid)?
        {
            drop(held);
            anyhow::bail!("process {pid} {} before its entry point", exit.describe());
        }
        let maps = process::read_maps(pid)?;
        let modules = ProcessModules::new(pid, &maps)?;
        Attached::attach_following(&self.opts_for(pid), &modules, Some(held), Some(self.how.check_every))
    }

    /// Renews `published` with the session's metrics while it observes.
    pub fn publish(&mut self, published: Published) {
        self.published = Some(published);
    }

    fn opts_for(&self, pid: i32) -> Options {
        Options { pid, ..self.opts.clone() }
    }

    /// Attaches to `pid` with the ordinary attach (names resolved strictly:
    /// an unknown name is an error), and makes it a member. Patterns that
    /// name a library the process has not loaded wait for it, as `tp run`'s
    /// do (at the dynamic linker's rendezvous), unless tp is to leave the
    /// probes in and exit (`--keep`).
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        let opts = self.opts_for(pid);
        if !opts.keep {
            process::check_attachable(pid)?;
            let maps = process::read_maps(pid)?;
            let modules = ProcessModules::new(pid, &maps)?;
            if !follow::waiting_for_libraries(&modules, &opts.selection.funcs)?.is_empty() {
                return self.attach_waiting(pid, opts, &modules);
            }
        }
        let attached = Attached::attach(&opts)?;
        if self.how.announce {
            announce(&attached, &opts);
        }
        self.add(pid, Some(attached), None);
        Ok(())
    }

    /// [`Group::attach`] of `pid` (whose modules are `modules`) where the
    /// patterns `later` name libraries it has not loaded: the others are
    /// resolved strictly, and those wait.
    fn attach_waiting(&mut self, pid: i32, opts: Options, modules: &ProcessModules) -> Result<()> {
        if !opts.selection.addrs.is_empty() {
            anyhow::bail!("--addr probes cannot wait for a library: attach once it is loaded");
        }
        let (attached, follow, waiting) = Attached::attach_following(&opts, modules, None, Some(self.how.check_every))?;
        match &attached {
            Some(a) if self.how.announce && !a.names().is_empty() => announce(a, &opts),
            _ if self.how.announce => crate::note!(self.opts.notes, "tp: attached to {pid}: no probe yet"),
            _ => {}
        }
        for w in &waiting {
            crate::note!(self.opts.notes, "tp: {}; tp probes it when the process loads it", text(w));
        }
        self.add(pid, attached, Some(follow));
        Ok(())
    }

    /// Makes `pid` a member with its probes (if any yet) and the patterns
    /// that still wait for a library.
    pub fn add(&mut self, pid: i32, attached: Option<Attached>, follow: Option<Follow>) {
        self.family.add_root(pid);
        let programs = attached.into_iter().map(|a| self.program(a)).collect();
        self.members.push(Member {
            pid,
            programs,
            libs: Libraries::new(follow, self.opts.notes.clone()),
            left: None,
            detach_stop: None,
            ended: None,
        });
    }

    fn program(&self, attached: Attached) -> Program {
        program(attached, &self.opts, &self.output)
    }

    /// The options of the session.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Observes every member until a signal, `duration`, or until none is
    /// left (each exited, exec'd away or lost its probes).
    pub fn observe(&mut self, duration: Option<Duration>) -> Result<End> {
        let started = Instant::now();
        let end = observe::run(&mut Observing { group: self, next_draw: started }, duration)?;
        if let Some((live, _)) = self.live.take() {
            live.finish();
        }
        self.observed = Some(started.elapsed());
        Ok(end)
    }

    /// Waits `d`, or until a thread arrives at the rendezvous of a member
    /// (the first whose rendezvous is armed), and answers every thread that
    /// waits at one.
    fn pause(&mut self, d: Duration) {
        let armed = self
            .members
            .iter()
            .filter(|m| m.left.is_none())
            .find_map(|m| m.rendezvous().filter(|r| rendezvous_wait::armed(r)));
        match (armed, &self.exe) {
            // New processes are heard within a slice of this.
            (Some(region), Some(_)) => rendezvous_wait::wait_for_arrival(region, d.min(EXE_SLICE)),
            (Some(region), None) => rendezvous_wait::wait_for_arrival(region, d),
            (None, Some(_)) => self.family.wait(d),
            (None, None) => std::thread::sleep(d),
        }
        self.join_new_processes();
        for i in 0..self.members.len() {
            if self.members[i].left.is_none() {
                self.serve_rendezvous(i);
            }
        }
    }

    /// Answers the thread waiting at member `i`'s rendezvous, if one does
    /// ([`Libraries::serve`]).
    fn serve_rendezvous(&mut self, i: usize) {
        let (pid, mut probes, libs) = self.member_libraries(i);
        libs.serve(pid, &mut probes);
    }

    /// Member `i`'s pid, its probes as [`Libraries`] installs into them, and
    /// its libraries.
    fn member_libraries(&mut self, i: usize) -> (i32, MemberProbes<'_>, &mut Libraries) {
        let m = &mut self.members[i];
        let probes = MemberProbes { pid: m.pid, programs: &mut m.programs, opts: &self.opts, output: &self.output };
        (m.pid, probes, &mut m.libs)
    }

    /// Serves the calls stepped in every live program (`--steps`).
    fn serve_steps(&mut self) {
        for m in &mut self.members {
            if let Some(p) = m.current()
                && let Some(s) = &mut p.stepping
            {
                s.serve(&p.attached);
            }
        }
    }

    /// Drains every live program's events. A failure ends the session: the
    /// one line, and every probe restored ([`Group`]'s `Drop`); a closed
    /// stdout or stderr ends it as Ctrl-C does ([`End::OutputClosed`]).
    fn drain(&mut self) -> Result<()> {
        let live = self.live.as_ref().map(|(l, _)| l);
        for m in &mut self.members {
            let Some(p) = m.current() else { continue };
            let Some(t) = &mut p.tracer else { continue };
            let polled = match live {
                Some(l) => l.suspend(|| t.poll(&p.attached)),
                None => t.poll(&p.attached),
            };
            if let Err(e) = polled
                && !crate::streams::closed()
            {
                return Err(e.context(format!("reading the events of process {}", m.pid)));
            }
        }
        Ok(())
    }

    /// The live display: rebuilt when the probes changed, redrawn otherwise.
    fn draw(&mut self) {
        if !self.how.live {
            return;
        }
        let several = self.how.several;
        let mut names = Vec::new();
        let mut hits = Vec::new();
        for m in &mut self.members {
            let pid = m.pid;
            let Some(p) = m.current() else { continue };
            for (n, h) in p.attached.names().into_iter().zip(p.attached.counted()) {
                names.push(if several { format!("{pid} {n}") } else { n });
                hits.push(h);
            }
        }
        let title = match (&self.members[..], several) {
            ([m], false) => format!("tracing process {}", m.pid),
            (ms, _) => format!("tracing {} processes", ms.iter().filter(|m| m.left.is_none()).count()),
        };
        match &mut self.live {
            Some((live, shown)) if *shown != names => {
                live.set_names(title, &names);
                *shown = names;
            }
            Some(_) => {}
            None => self.live = Some((Live::titled(title, &names), names)),
        }
        if let Some((live, _)) = &mut self.live {
            live.update(&hits);
        }
    }

    /// The metrics now, as OpenMetrics series.
    pub fn series(&self) -> Vec<Series> {
        self.members.iter().flat_map(|m| series_of(&m.report_now())).collect()
    }

    fn publish_now(&self) {
        if let Some(p) = &self.published {
            let series = self.series();
            *p.lock().unwrap_or_else(|e| e.into_inner()) = series;
        }
    }

    /// Looks at every member still in the session, and at the processes
    /// they forked.
    fn check(&mut self) -> Result<()> {
        self.family.poll();
        for m in &mut self.members {
            let root = m.pid;
            for p in &m.programs {
                if let Some(t) = &p.tracer {
                    for &pid in t.events_per_process().keys() {
                        self.family.note(root, pid as i32);
                    }
                }
            }
        }
        for (child, root, how) in self.family.take_news(&*self.opts.notes) {
            crate::note!(
                self.opts.notes,
                "tp: process {child} (forked by {root} while the probes were in) {}",
                how.sentence()
            );
        }
        for i in 0..self.members.len() {
            if self.members[i].left.is_some() {
                continue;
            }
            self.check_member(i)?;
        }
        Ok(())
    }

    fn check_member(&mut self, i: usize) -> Result<()> {
        let pid = self.members[i].pid;
        let several = self.how.several;
        // Removal first: another tp marks the entries removed in the region
        // before it unmaps it, which would otherwise look like an exec.
        let removed = self.members[i].current().is_some_and(|p| !p.attached.still_installed());
        if removed {
            self.end_program(i);
            self.members[i].left = Some(Left::Removed);
            if several {
                crate::note!(self.opts.notes, "tp: the probes in process {pid} were removed by another tp");
            }
            return Ok(());
        }
        let change = match self.members[i].current() {
            Some(p) => follow::change(pid, &p.attached.region),
            None if process::is_alive(pid) => Change::Same,
            None => Change::Exited,
        };
        match change {
            Change::Exited => {
                self.end_program(i);
                let how = self.family.end_of(pid);
                self.members[i].left = Some(Left::Exited(how));
                self.members[i].ended = Some(how);
                // One process: the end of the session says it, with the counts.
                if several {
                    crate::note!(self.opts.notes, "tp: process {pid} {}", how.sentence());
                }
            }
            Change::Execd(exe) => {
                self.end_program(i);
                if self.opts.follow_exec {
                    self.follow_exec(i, &exe)?;
                } else {
                    crate::note!(
                        self.opts.notes,
                        "tp: process {pid} exec'd {}; its probes went with its old program (--follow-exec probes the new one)",
                        text(&exe)
                    );
                    self.members[i].left = Some(Left::Execd(exe));
                }
            }
            Change::Same => {
                let (pid, mut probes, libs) = self.member_libraries(i);
                libs.check(pid, &mut probes);
            }
        }
        Ok(())
    }

    /// Ends the member's live program (exit or exec): drains what is left
    /// of its events and keeps what it counted.
    fn end_program(&mut self, i: usize) {
        let Some(p) = self.members[i].current() else { return };
        p.live = false;
        if let Some(s) = &mut p.stepping {
            s.stop(&p.attached);
        }
        let summary = p.attached.summary();
        let blocks = p.attached.blocks(&summary);
        let mut report = match p.tracer.take() {
            Some(mut t) => {
                let _ = t.poll(&p.attached);
                p.events = t.events_per_process().clone();
                t.end(&p.attached, summary)
            }
            None => ProcessReport::counts(summary),
        };
        report.blocks = blocks;
        report.steps = p.stepping.take().map(|s| s.calls).unwrap_or_default();
        p.report = Some(report);
    }

    /// After an exec: the same patterns, resolved leniently in the new
    /// program, probed now; those it lacks are named.
    fn follow_exec(&mut self, i: usize, exe: &str) -> Result<()> {
        let pid = self.members[i].pid;
        let opts = self.opts_for(pid);
        // Held from the start: a process still in its dynamic linker goes
        // no further until its probes are in (and none before its TLS).
        let started =
            Stopped::hold_new(pid, self.opts.notes.clone()).and_then(|held| self.probe_new_program(pid, held));
        match started {
            Ok((attached, follow, waiting)) => {
                let n = attached.as_ref().map_or(0, |a| a.names().len());
                crate::note!(
                    self.opts.notes,
                    "tp: process {pid} exec'd {}; probed {n} function{} in it",
                    text(exe),
                    plural(n)
                );
                for w in &waiting {
                    crate::note!(self.opts.notes, "tp: process {pid}: not in the new program: {}", text(w));
                }
                if !opts.selection.addrs.is_empty() {
                    crate::note!(
                        self.opts.notes,
                        "tp: process {pid}: --addr probes are not followed across exec (addresses change)"
                    );
                }
                let program = attached.map(|a| self.program(a));
                let m = &mut self.members[i];
                m.programs.extend(program);
                m.libs.restart(follow);
            }
            Err(e) if !process::is_alive(pid) => {
                let _ = e;
                let how = self.family.end_of(pid);
                self.members[i].left = Some(Left::Exited(how));
                self.members[i].ended = Some(how);
            }
            Err(e) => {
                crate::note!(
                    self.opts.notes,
                    "tp: process {pid} exec'd {}; cannot probe it: {}",
                    text(exe),
                    text(&format!("{e:#}"))
                );
                self.members[i].left = Some(Left::Execd(exe.to_string()));
            }
        }
        Ok(())
    }

    /// Restores every process still probed and returns one report per
    /// member, in the order they joined. `why` is how observing ended.
    pub fn detach(&mut self, why: End) -> Result<Vec<ProcessReport>> {
        self.done = true;
        match (why, self.how.command) {
            // `tp run`'s stdout is its program's: the line goes to stderr or nowhere.
            (End::OutputClosed, "run") => {
                if let Some(f) = crate::streams::failure() {
                    crate::note!(self.opts.notes, "tp: {}; removing every probe", f.describe());
                }
            }
            (End::OutputClosed, _) => super::observe::say_output_closed(),
            _ => {}
        }
        let several = self.how.several;
        let mut first_error = None;
        for i in 0..self.members.len() {
            let pid = self.members[i].pid;
            let left = self.members[i].left.clone();
            let Some(p) = self.members[i].current() else {
                if !several && self.how.announce {
                    match left {
                        Some(Left::Removed) => {
                            crate::note!(self.opts.notes, "tp: the probes were removed by another tp; final counts:")
                        }
                        Some(Left::Exited(how)) => {
                            crate::note!(self.opts.notes, "tp: process {pid} {}; final counts:", how.sentence())
                        }
                        _ => {}
                    }
                }
                continue;
            };
            p.live = false;
            if let Some(s) = &mut p.stepping {
                s.stop(&p.attached);
            }
            let detached = match p.attached.detach() {
                Ok(d) => d,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            let stop_time = detached.stop_time;
            let ended = (detached.target_gone && !detached.execd).then(|| self.family.end_of(pid));
            self.family.restored(pid, &detached.family);
            say_relatives(&*self.opts.notes, pid, &detached.family);
            if self.how.announce {
                let gone = match detached.execd {
                    true => "exec'd another program; its probes went with the old one".to_string(),
                    false => self.family.end_of(pid).sentence(),
                };
                match (detached.target_gone, why, several) {
                    (true, _, false) => crate::note!(self.opts.notes, "tp: process {pid} {gone}; final counts:"),
                    (true, _, true) => crate::note!(self.opts.notes, "tp: process {pid} {gone}"),
                    (false, End::Removed, false) => {
                        crate::note!(self.opts.notes, "tp: the probes were removed by another tp; final counts:")
                    }
                    (false, _, _) => crate::note!(
                        self.opts.notes,
                        "tp: detached from {pid}, code restored{} (target stopped {} µs)",
                        match p.attached.went_over() {
                            0 => String::new(),
                            n => format!("; {n} kept probe{} count on", plural(n)),
                        },
                        detached.stop_time.as_micros()
                    ),
                }
            }
            if let Some(used) = detached.kept.as_ref().and_then(Kept::in_use) {
                crate::note!(
                    self.opts.notes,
                    "tp: process {pid} still maps tp's memory: {used}; `tp detach -p {pid}` removes it once unused"
                );
            }
            let summary = detached.summary;
            let blocks = p.attached.blocks(&summary);
            let mut report = match p.tracer.take() {
                Some(mut t) => {
                    // The last events; a failure (its output closed) must not
                    // keep the other members from being restored.
                    if let Err(e) = t.poll(&p.attached)
                        && !crate::streams::closed()
                    {
                        first_error.get_or_insert(e);
                    }
                    p.events = t.events_per_process().clone();
                    t.end(&p.attached, summary)
                }
                None => ProcessReport::counts(summary),
            };
            report.blocks = blocks;
            report.steps = p.stepping.take().map(|s| s.calls).unwrap_or_default();
            p.report = Some(report);
            self.members[i].detach_stop = Some(stop_time);
            if ended.is_some() {
                self.members[i].ended = ended;
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        for m in &self.members {
            m.libs.say_never_found(m.pid);
        }
        let mut reports: Vec<ProcessReport> = self.members.iter().map(Member::report_now).collect();
        for (m, r) in self.members.iter().zip(&mut reports) {
            let mut events = std::collections::BTreeMap::new();
            for p in &m.programs {
                for (&pid, &n) in &p.events {
                    *events.entry(pid).or_insert(0) += n;
                }
            }
            r.children = self.family.children(m.pid, &events);
        }
        Ok(reports)
    }

    /// Writes the end of the session's results (the summary of `reports`,
    /// in the session's format) to its output.
    pub fn write_reports(&mut self, reports: &[ProcessReport]) -> Result<()> {
        let seconds = self.observed.map(|d| d.as_secs_f64());
        super::results::write(&mut self.output, &self.opts, self.how.command, seconds, reports)
    }

    /// The signal that killed one of the members during the session, as
    /// the kernel said (the first member's, in the order they joined, that
    /// a signal killed), for [`super::exit_status`]. None where tp does not
    /// hear the kernel's process events: it cannot tell how a process it
    /// did not start ended.
    pub fn killed_by(&self) -> Option<i32> {
        self.members.iter().find_map(|m| m.ended.and_then(super::signal_of))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.done || self.opts.keep {
            return;
        }
        for m in &mut self.members {
            let pid = m.pid;
            let Some(p) = m.current() else { continue };
            p.live = false;
            if let Some(s) = &mut p.stepping {
                s.stop(&p.attached);
            }
            // Quiet when it works: the error (or the panic) is the one line.
            if let Err(e) = p.attached.detach() {
                crate::note!(
                    self.opts.notes,
                    "tp: cannot restore the code of process {pid}: {}; run `tp detach -p {pid}`",
                    text(&format!("{e:#}"))
                );
            }
        }
    }
}

/// Says what the end of a session could not do cleanly in the processes
/// `pid` forked while the probes were in: each one that still maps tp's
/// memory, and why, with the command that removes it; each one tp could
/// not restore. Those restored cleanly are counted.
pub fn say_relatives(notes: &dyn Notes, pid: i32, relatives: &[Relative]) {
    let restored = relatives.iter().filter(|r| r.outcome == Outcome::Restored).count();
    if restored > 0 {
        crate::note!(
            notes,
            "tp: restored the code of {restored} process{} forked by {pid} while the probes were in",
            if restored == 1 { "" } else { "es" }
        );
    }
    for r in relatives {
        let child = r.pid;
        match &r.outcome {
            Outcome::Kept(used @ (Kept::InUse { .. } | Kept::Tracing { .. })) => crate::note!(
                notes,
                "tp: process {child} (forked by {pid}) still maps tp's memory: its code is restored, but {}; \
                 `tp detach -p {child}` removes it once unused",
                used.in_use().unwrap_or_default()
            ),
            Outcome::Kept(Kept::LiveProbes) => crate::note!(
                notes,
                "tp: process {child} (forked by {pid}) still maps tp's memory for other probes (`tp status -p {child}`); \
                 `tp detach -p {child}` removes them"
            ),
            Outcome::Failed(why) => crate::note!(
                notes,
                "tp: cannot restore process {child} (forked by {pid} while the probes were in): {}; run `tp detach -p {child}`",
                text(why)
            ),
            Outcome::Restored | Outcome::Gone | Outcome::Kept(Kept::Gone) => {}
        }
    }
}

/// The line `tp attach` prints for each process it attached to.
pub fn announce(attached: &Attached, opts: &Options) {
    let n = attached.names().len();
    let pid = attached.pid;
    if n == 0 {
        // `--keep` of functions kept already: said by each.
        return;
    }
    if attached.refused > 0 {
        crate::note!(
            opts.notes,
            "tp: {} of the matched functions cannot be probed and are skipped (`tp list-probes -p {pid}` says why)",
            attached.refused
        );
    }
    crate::note!(
        opts.notes,
        "tp: attached {n} probe{} to {pid} in {:.1} ms (target stopped {} µs; one thread {} µs in all)",
        plural(n),
        attached.attach_time.as_secs_f64() * 1e3,
        attached.stop_time.as_micros(),
        attached.worker_time.as_micros()
    );
    if opts.keep {
        crate::note!(
            opts.notes,
            "tp: probes stay in {pid} after tp exits; `tp status -p {pid}` shows counts, `tp detach -p {pid}` removes them"
        );
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A group as the observe loop ([`observe::run`]) drives it.
struct Observing<'g> {
    group: &'g mut Group,
    /// When the live display and the published series are next redrawn.
    next_draw: Instant,
}

impl observe::Observed for Observing<'_> {
    fn check(&mut self) -> Result<Option<End>> {
        let g = &mut *self.group;
        // `tp run`'s stdout is its program's: tp's own is stderr.
        let closed = match g.how.command {
            "run" => crate::streams::check_only(&[crate::streams::Stream::Stderr]),
            _ => crate::streams::check(),
        };
        if closed {
            return Ok(Some(End::OutputClosed));
        }
        g.check()?;
        if g.exe.is_none() && g.members.iter().all(|m| m.left.is_some()) {
            let removed = g.members.iter().all(|m| m.left == Some(Left::Removed));
            return Ok(Some(if removed { End::Removed } else { End::TargetExited }));
        }
        Ok(None)
    }

    fn check_every(&self) -> Duration {
        self.group.how.check_every
    }

    fn step(&mut self) -> Result<()> {
        let g = &mut *self.group;
        g.pause(TICK.min(g.how.check_every));
        g.drain()?;
        g.serve_steps();
        if Instant::now() >= self.next_draw {
            g.draw();
            g.publish_now();
            self.next_draw = Instant::now() + DRAW_EVERY;
        }
        Ok(())
    }
}

/// A program of the session's with its probes `attached`, and the tracer
/// that reads their events if they record any.
fn program(attached: Attached, opts: &Options, output: &TraceOutput) -> Program {
    let tracer =
        (attached.records() & !kind::STEP != kind::COUNT).then(|| Tracer::with_output(&attached, opts, output.clone()));
    let stepping = opts.steps.map(|s| Stepping::start(&attached, s, opts.notes.clone()));
    Program { attached, tracer, live: true, report: None, events: Default::default(), stepping }
}

/// The data region of the live program of `programs` (the last), if tp's
/// probe at the dynamic linker's rendezvous is in it.
fn rendezvous_of(programs: &[Program]) -> Option<&crate::probe::Region> {
    programs.last().filter(|p| p.live && p.attached.has_rendezvous()).map(|p| &p.attached.region)
}

/// A member's probes as [`Libraries`] sees them: those of its live
/// program, or a program of its own for the first functions a library
/// gives it.
struct MemberProbes<'g> {
    pid: i32,
    programs: &'g mut Vec<Program>,
    opts: &'g Options,
    output: &'g TraceOutput,
}

impl MemberProbes<'_> {
    fn current(&mut self) -> Option<&mut Program> {
        self.programs.last_mut().filter(|p| p.live)
    }
}

impl Probes for MemberProbes<'_> {
    fn rendezvous(&self) -> Option<&crate::probe::Region> {
        rendezvous_of(self.programs)
    }

    fn drop_unloaded(&mut self, maps: &[process::Mapping]) -> Result<()> {
        match self.current() {
            Some(p) => p.attached.drop_unloaded(maps).map(|_| ()),
            None => Ok(()),
        }
    }

    fn install(&mut self, modules: &ProcessModules, found: Vec<Found>) -> Result<(usize, usize)> {
        if let Some(p) = self.current() {
            let added = p.attached.extend(modules, found)?;
            if let Some(t) = &mut p.tracer {
                t.refresh(&p.attached);
            }
            return Ok(added);
        }
        let opts = Options { pid: self.pid, ..self.opts.clone() };
        let attached = Attached::attach_found(&opts, modules, found, None)?;
        let added = (attached.names().len(), attached.refused);
        self.programs.push(program(attached, self.opts, self.output));
        Ok(added)
    }
}
