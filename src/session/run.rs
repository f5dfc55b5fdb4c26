//! `tp run`: a program started under tp, probed before its first
//! instruction, and let go.
//!
//! [`crate::process::launch`] holds the new program at its entry point with
//! every library the loader maps at startup in place. The patterns are
//! resolved there, leniently ([`super::follow::Follow::start`]: one that names nothing yet
//! waits for a library loaded later), and the probes go in through the
//! ordinary attach, with the held main thread as its worker
//! ([`Stopped::adopt`]); then tp lets go: the program runs untraced, its
//! probes counting without a trap. A [`Group`] of one member observes it,
//! probes libraries it loads later ([`super::follow`]), follows an exec with
//! `--follow-exec`, and ends when it exits; tp reaps it and hands back its
//! exit status. If tp cannot set the probes up, the program is killed
//! before it runs an instruction of its own.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Options;
use super::attached::Attached;
use super::group::{Behaviour, Group};
use super::{interrupt, metrics, results};
use crate::escape::text;
use crate::output::report::ProcessReport;
use crate::output::sink::Sink;
use crate::process::launch::{self, Exit, Launch};
use crate::process::stop::Stopped;
use crate::process::{self};
use crate::symbols::ProcessModules;

/// How often tp looks at the program: its exit ends the session, so a short
/// program's summary comes this soon after it.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// How a run ended.
#[derive(Debug)]
pub enum Ran {
    /// The program ran and ended so.
    Ended(Exit),
    /// It could not be started: why, and the shell's status for it.
    NotStarted(String, u8),
}

/// Waits for the program when dropped, so that tp never returns before it
/// (an error after the program was let go leaves it running, and tp is
/// its parent).
struct Reaper(Option<i32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = launch::reap(pid);
        }
    }
}

/// Starts `command` (the program and its arguments), probes what `opts`
/// selects in it, observes it until it exits (serving its metrics
/// meanwhile if `opts.listen` asks), and prints the summary to `-o FILE`
/// or stderr: the program owns stdout and the terminal.
pub fn run(opts: &Options, command: &[OsString]) -> Result<Ran> {
    let output = results::open(opts, Sink::stderr(), false)?;
    let published = match &opts.listen {
        Some(l) => Some(metrics::start_session_server(&*opts.notes, &l.addr, l.any)?),
        None => None,
    };
    let how = Behaviour { several: false, check_every: CHECK_EVERY, live: false, announce: false, command: "run" };
    let Some((program, args)) = command.split_first() else { anyhow::bail!("name the program to run after `--`") };
    let started = Instant::now();
    let launched = launch::launch(program, args, interrupt::forward_to)?;
    let pid = match launched {
        Launch::Failed { why, status } => return Ok(Ran::NotStarted(why, status)),
        Launch::Ended { pid, exit } => {
            crate::note!(
                opts.notes,
                "tp: process {pid} ({}) {} before its entry point; nothing was probed",
                text(&program.to_string_lossy()),
                exit.describe()
            );
            return Ok(Ran::Ended(exit));
        }
        Launch::AtEntry { pid, .. } => pid,
    };
    // From here on, the program is tp's child: tp waits for it on every path.
    let mut reaper = Reaper(Some(pid));
    let held = Stopped::adopt(pid, opts.notes.clone());
    let opts = Options { pid, ..opts.clone() };
    let notes = opts.notes.clone();
    let maps = process::read_maps(pid)?;
    let modules = ProcessModules::new(pid, &maps)?;
    // While patterns wait for libraries, tp probes the dynamic linker's
    // rendezvous: a library is probed before its first call.
    let (attached, follow, waiting) = Attached::attach_following(&opts, &modules, Some(held), Some(how.check_every))?;
    let n = attached.as_ref().map_or(0, |a| a.names().len());
    crate::note!(
        opts.notes,
        "tp: started {} as process {pid}; {n} probe{} in before its first instruction ({:.1} ms, stopped {} µs)",
        text(&program.to_string_lossy()),
        if n == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64() * 1e3,
        attached.as_ref().map_or(0, |a| a.stop_time.as_micros())
    );
    if let Some(a) = &attached
        && a.refused > 0
    {
        crate::note!(opts.notes, "tp: {} of the matched functions cannot be probed and are skipped", a.refused);
    }
    for w in &waiting {
        crate::note!(opts.notes, "tp: {}; tp probes it if a library loaded later defines it", text(w));
    }
    let mut group = Group::new(opts, output, how);
    if let Some(p) = published {
        group.publish(p);
    }
    group.add(pid, attached, Some(follow));
    let why = group.observe(None)?;
    let reports: Vec<ProcessReport> = group.detach(why)?;
    reaper.0 = None;
    let exit = launch::reap(pid)?;
    crate::note!(notes, "tp: process {pid} {}; calls counted:", exit.describe());
    // Its output closed, tp still hands back the program's status.
    match group.write_reports(&reports) {
        Err(e) if !crate::streams::closed() => Err(e),
        _ => Ok(Ran::Ended(exit)),
    }
}
