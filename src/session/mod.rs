//! The session engine: what `tp attach`, `tp profile` and `tp demo` share.
//!
//! A session is built from [`Options`], which each subcommand makes once
//! from its command line with `Options::from_cli` (written in
//! `cmd::options`: the engine itself never sees clap's types). It resolves
//! and plans the probes ([`resolve`], [`unwind`]), installs them
//! ([`attached::Attached::attach`]), watches the target in one loop
//! ([`observe::run`], for one process [`observe::observe`], for a group
//! [`group::Group::observe`]) while a [`observe::Watcher`] consumes what the
//! probes produce (the live display and the event [`tracer::Tracer`], or
//! the sampling [`profile::Profiler`]), and removes them again
//! ([`attached::Attached::detach`]). A session over several processes, or
//! one that follows a program through dlopen and exec, is a
//! [`group::Group`] of attached processes ([`targets`] selects them,
//! [`follow`] watches their programs change, [`rendezvous`] probes the
//! dynamic linker's rendezvous where a library is probed before its first
//! call, [`forked`] the processes they fork and how each ends). The
//! libraries a process loads are followed through one path
//! ([`libraries`]), by a group's members and by `tp profile` alike. Each
//! command's session is one call: [`attach::run`] (`tp attach`),
//! [`run::run`] (`tp run`), [`profile::run`] (`tp profile`); `tp demo`
//! drives a group of its own; [`exit_status`] is how one over processes
//! tp did not start ends.
//!
//! Outside any session, [`installed`] reads the probes a process holds and
//! switches them on and off (`tp status`, `tp enable`, `tp disable`),
//! [`restore`] removes them (`tp detach`), [`probeable`] decides what
//! could be probed in a binary or a process (`tp list-probes`), and
//! [`metrics`] serves counts at `/metrics` (`tp serve`, and a session's
//! `--listen`).

pub mod attach;
pub mod attached;
pub mod block_counts;
pub mod exe;
pub mod explain;
pub mod follow;
pub mod forked;
pub mod group;
pub mod guard;
pub mod installed;
pub mod interrupt;
pub mod kept;
pub mod libraries;
pub mod metrics;
pub mod observe;
pub mod probeable;
pub mod profile;
pub mod rendezvous;
pub mod resolve;
pub mod restore;
pub mod results;
pub mod returns;
pub mod run;
pub mod steps;
pub mod targets;
pub mod tracer;
pub mod unwind;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use attached::{Attached, Detached};
pub use kept::session_is_running;
pub use observe::{End, observe};

use crate::addr::RuntimeAddr;
use crate::notes::{Notes, Stderr};
use crate::output::format::Format;
use crate::output::report::View;

/// What a session is asked to do, built once from the command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// The target.
    pub pid: i32,
    /// What to probe and record.
    pub selection: Selection,
    /// Leave the probes in the target when tp exits (`--keep`): they are
    /// owned by no session.
    pub keep: bool,
    /// Stop observing after this long (default: a signal or the target's exit).
    pub duration: Option<Duration>,
    /// Write no event lines, only the results at the end (`--quiet`).
    pub quiet: bool,
    /// The form of the results (`--format`, `-o FILE`'s name).
    pub format: Format,
    /// How the text summary shows its rows (`--all`, `--top`).
    pub view: View,
    /// Write the results to this file instead of stdout (`-o`).
    pub output: Option<PathBuf>,
    /// Sampling (`tp profile`): timed calls per function per epoch, on average.
    pub samples_per_epoch: u32,
    /// Sampling: how often tp adapts the periods and renews the budgets.
    pub epoch: Duration,
    /// Show events as each thread's call tree (`--tree`).
    pub tree: bool,
    /// Step calls instruction by instruction (`--steps`).
    pub steps: Option<steps::StepOptions>,
    /// Probe the same functions again after an exec (`--follow-exec`).
    pub follow_exec: bool,
    /// Serve the session's metrics over HTTP meanwhile (`--listen`).
    pub listen: Option<Listen>,
    /// Where the session's notes and warnings go (the command line's: stderr).
    pub notes: Arc<dyn Notes>,
}

/// Where a session serves its metrics (`--listen ADDR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The address, such as `127.0.0.1:9464`.
    pub addr: String,
    /// Any address, not only loopback (`--listen-any`).
    pub any: bool,
}

impl Options {
    /// Options that probe `selection` in `pid` and print as text.
    pub fn new(pid: i32, selection: Selection) -> Options {
        Options {
            pid,
            selection,
            keep: false,
            duration: None,
            quiet: false,
            format: Format::Text,
            view: View::default(),
            output: None,
            samples_per_epoch: 0,
            epoch: Duration::ZERO,
            tree: false,
            steps: None,
            follow_exec: false,
            listen: None,
            notes: Arc::new(Stderr),
        }
    }

    /// How events are written as they come: in the format's lines, unless
    /// `--quiet` or a format that writes none.
    pub fn event_lines(&self) -> Option<&'static dyn crate::output::results::EventLines> {
        if self.quiet { None } else { crate::output::results::event_lines(self.format) }
    }

    /// The owner recorded in the probes' entries: this tp's PID, or 0 when
    /// they are kept after it exits.
    pub fn owner(&self) -> u32 {
        if self.keep { 0 } else { std::process::id() }
    }
}

/// What to probe and record.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Function patterns.
    pub funcs: Vec<String>,
    /// Function addresses.
    pub addrs: Vec<RuntimeAddr>,
    /// What to record.
    pub records: Records,
    /// Ring size for a region created now.
    pub ring_len: u32,
    /// Samples per epoch for sampling probes.
    pub sample_budget: i32,
    /// `--if`: the predicate a call must satisfy to be recorded.
    pub predicate: Option<String>,
    /// `--args EXPR`: the values each entry shows (parameters, fields).
    pub picks: Option<String>,
    /// `--by`: the keys the calls are counted by (an argument or `caller`, `tid`, `pid`).
    pub by: Option<String>,
    /// `--agg`: the functions of a value aggregated per key.
    pub agg: Option<String>,
    /// `--stack`: how each recorded call's stack is taken.
    pub stack: Option<StackMode>,
    /// `--steps`: calls to step, from the probes' first call on.
    pub step_calls: u32,
    /// `--step-engine trap`: the calls trace themselves in the target
    /// (the trap flag and tp's SIGTRAP handler), each at most this many
    /// instructions; None: tp steps them with ptrace.
    pub trap_steps: Option<u64>,
}

impl Selection {
    /// A selection of `funcs` recording `records`, with nothing else asked.
    pub fn new(funcs: Vec<String>, records: Records) -> Selection {
        Selection {
            funcs,
            addrs: Vec::new(),
            records,
            ring_len: crate::probe::layout::DEFAULT_RING_LEN,
            sample_budget: 0,
            predicate: None,
            picks: None,
            by: None,
            agg: None,
            stack: None,
            step_calls: 0,
            trap_steps: None,
        }
    }
}

/// What a selection's probes record, as the command line asks it: each
/// field one of `probe::layout::kind`'s bits, which [`Records::bits`]
/// gives where the probes' entries are planned ([`attached::Attached`]);
/// none set, the calls are counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Records {
    /// An entry event with each call's arguments (`--args`, and what needs
    /// the entry's event: `--tree`, `--stack`, `--if` alone).
    pub args: bool,
    /// An exit event with each call's return value and duration (`--ret`).
    pub ret: bool,
    /// Each entry event's user stack (`--stack`).
    pub stack: bool,
    /// The calls counted or aggregated per key, in the target (`--by`, `--agg`).
    pub by: bool,
    /// Calls handed to tp to step (`--steps`).
    pub step: bool,
    /// A budget of timed calls per epoch (`tp profile`).
    pub sample: bool,
    /// The durations kept in the target's histograms, not sent as events.
    pub aggregate: bool,
}

impl Records {
    /// Counts alone.
    pub const COUNT: Records =
        Records { args: false, ret: false, stack: false, by: false, step: false, sample: false, aggregate: false };

    /// The bits of `probe::layout::kind` the probes' entries record.
    pub fn bits(self) -> u32 {
        use crate::probe::layout::kind;
        [
            (self.args, kind::ARGS),
            (self.ret, kind::RET),
            (self.stack, kind::STACK),
            (self.by, kind::BY),
            (self.step, kind::STEP),
            (self.sample, kind::SAMPLE),
            (self.aggregate, kind::AGGREGATE),
        ]
        .into_iter()
        .filter(|r| r.0)
        .fold(kind::COUNT, |k, r| k | r.1)
    }

    /// Whether a probe calls the runtime at the function's entry
    /// (`probe::layout::kind::CALLS_AT_ENTRY`).
    pub fn calls_at_entry(self) -> bool {
        self.bits() & crate::probe::layout::kind::CALLS_AT_ENTRY != 0
    }
}

/// tp's exit status after a session over processes it attached to (`tp
/// attach`, `tp profile`): 0, or 128 + the signal that killed one of them
/// while the probes were in (`killed_by`), as a shell reports a process
/// killed by a signal and as `tp run` exits for its program. The results
/// are printed as ever; the status lets a script tell that its target
/// died.
pub fn exit_status(killed_by: Option<i32>) -> u8 {
    killed_by.map_or(0, |s| crate::process::launch::Exit::Signal(s).shell_status())
}

/// The signal of a process's end, if a signal ended it.
fn signal_of(end: crate::process::proc_events::Ended) -> Option<i32> {
    match end {
        crate::process::proc_events::Ended::Signal { signal, .. } => Some(signal),
        _ => None,
    }
}

/// Checks `--by KEYS` and `--agg EXPR` before anything is touched: one
/// line naming what is wrong (what each function has is checked when it
/// is resolved).
pub fn check_aggregation(by: Option<&str>, agg: Option<&str>) -> anyhow::Result<()> {
    use crate::events::predicate;
    if let Some(text) = by {
        predicate::parse_keys(text).map_err(|why| anyhow::anyhow!("--by `{}`: {why}", crate::escape::text(text)))?;
    }
    if let Some(text) = agg {
        predicate::parse_agg(text).map_err(|why| anyhow::anyhow!("--agg `{}`: {why}", crate::escape::text(text)))?;
    }
    Ok(())
}

/// True if `--agg EXPR` aggregates the calls' latency (`hist(latency)`):
/// the probes then time the calls, and keep the durations in the target.
pub fn aggregates_latency(agg: Option<&str>) -> bool {
    use crate::events::predicate;
    agg.and_then(|a| predicate::parse_agg(a).ok()).is_some_and(|a| predicate::agg_latency(&a))
}

/// How a recorded call's stack is taken (`--stack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    /// Return addresses found by following frame pointers in the target,
    /// at most `depth` of them.
    FramePointers {
        /// The most return addresses.
        depth: u32,
    },
    /// A copy of `bytes` of the stack's top, unwound by tp with the
    /// modules' unwind tables (`.eh_frame`, `.debug_frame`), to at most
    /// `depth` frames.
    Unwind {
        /// Bytes copied.
        bytes: u32,
        /// The most frames.
        depth: u32,
    },
}
