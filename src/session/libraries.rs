//! The libraries one process loads while a session runs, for every
//! session that follows them (`tp attach`, `tp run`, `--follow-exec`,
//! `tp profile`): one path that answers a thread at tp's probe on the
//! dynamic linker's rendezvous ([`super::rendezvous`]), or, where there is
//! none, looks at the process's code sizes at each check, probes what the
//! waiting patterns ([`Follow`]) match in the new libraries, says so, and
//! keeps what it did for the summary (`libraries`).
//!
//! The session gives its probes of the process through [`Probes`]: a
//! group's member ([`super::group`]) installs them into its live program
//! (or starts one), `tp profile` ([`super::observe::observe`]) extends its
//! one attach and tells its sampler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::follow::{self, Follow};
use crate::escape::text;
use crate::notes::Notes;
use crate::output::report;
use crate::probe::region::Region;
use crate::probe::rendezvous_wait;
use crate::process::{self, Mapping};
use crate::symbols::{Found, ProcessModules};

/// The loads in a row of the same library that each get their line.
const SAID_LOADS: u64 = 3;

/// A session's probes in the process whose libraries it follows.
pub trait Probes {
    /// The data region of the process's probes, if tp's probe at the
    /// dynamic linker's rendezvous is among them and live.
    fn rendezvous(&self) -> Option<&Region>;
    /// Lets go of the probes of libraries the process no longer maps
    /// (`maps`, its memory map now).
    fn drop_unloaded(&mut self, maps: &[Mapping]) -> Result<()>;
    /// Probes `found` in `modules` (the process's modules now). Returns how
    /// many of the user's probes went in and how many of the functions
    /// cannot be probed.
    fn install(&mut self, modules: &ProcessModules, found: Vec<Found>) -> Result<(usize, usize)>;
}

/// What a session follows of one process's libraries.
#[derive(Debug)]
pub struct Libraries {
    /// Patterns that may still match in libraries loaded later.
    pub follow: Option<Follow>,
    /// Threads that went on from the rendezvous without tp's answer, as
    /// last seen.
    gave_up: u32,
    /// The libraries it loaded that tp probed.
    pub loaded: Vec<report::Loaded>,
    /// Where its notes go.
    notes: Arc<dyn Notes>,
}

impl Libraries {
    /// Follows the libraries that `follow`'s patterns wait for (none if
    /// None), saying what it does to `notes`.
    pub fn new(follow: Option<Follow>, notes: Arc<dyn Notes>) -> Libraries {
        Libraries { follow, gave_up: 0, loaded: Vec::new(), notes }
    }

    /// Follows `follow`'s patterns from now on, in a new program the
    /// process runs (exec): its rendezvous is a new one; what tp probed in
    /// the old one stays in [`Libraries::loaded`].
    pub fn restart(&mut self, follow: Follow) {
        self.follow = Some(follow);
        self.gave_up = 0;
    }

    /// True while some pattern may still match in a library loaded later.
    pub fn watching(&self) -> bool {
        self.follow.as_ref().is_some_and(Follow::watching)
    }

    /// The look at each of the session's checks: at the rendezvous while it
    /// is armed (a look between two of the loader's mmaps could find a
    /// library half mapped, and patch code the next mmap replaces), else
    /// at the process's code sizes.
    pub fn check(&mut self, pid: i32, probes: &mut dyn Probes) {
        match probes.rendezvous().is_some_and(rendezvous_wait::armed) {
            true => self.serve(pid, probes),
            false => self.load(pid, probes, None),
        }
    }

    /// Answers the thread waiting at the rendezvous of process `pid`, if
    /// one does: probes what the waiting patterns match in the libraries
    /// the loader mapped, then releases it. Says when a thread went on
    /// without tp, and arms the rendezvous again while patterns wait.
    pub fn serve(&mut self, pid: i32, probes: &mut dyn Probes) {
        let watching = self.watching();
        let Some(region) = probes.rendezvous() else { return };
        let gave_up = rendezvous_wait::gave_up(region);
        if gave_up != self.gave_up {
            crate::note!(
                self.notes,
                "tp: process {pid}: a thread at the dynamic linker's rendezvous went on after waiting {} s for tp; \
                 libraries loaded meanwhile were probed when tp saw them",
                rendezvous_wait::WAIT.as_secs()
            );
            if watching {
                let _ = rendezvous_wait::arm(region, pid);
            }
        }
        let waiting = rendezvous_wait::waiting(region);
        let upto = rendezvous_wait::arrived(region);
        self.gave_up = gave_up;
        if !waiting {
            return;
        }
        crate::fault::point("at-rendezvous");
        self.load(pid, probes, Some(Instant::now()));
        let watching = self.watching();
        if let Some(region) = probes.rendezvous() {
            let _ = rendezvous_wait::release(region, upto);
            // No pattern waits any more: threads pass without waiting.
            if !watching {
                let _ = rendezvous_wait::disarm(region);
            }
        }
    }

    /// Probes what the waiting patterns match in libraries process `pid`
    /// loaded since the last look, if its code mappings changed, or at once
    /// at the rendezvous (`rendezvous`: when tp saw the thread arrive). Lets
    /// go first of the probes in libraries it unloaded.
    pub fn load(&mut self, pid: i32, probes: &mut dyn Probes, rendezvous: Option<Instant>) {
        let Some(follow) = self.follow.as_mut() else { return };
        let changed = follow.code_changed();
        if !follow.watching() || !(changed || rendezvous.is_some()) {
            return;
        }
        let maps = process::read_maps(pid);
        if let Ok(maps) = &maps
            && let Err(e) = probes.drop_unloaded(maps)
        {
            crate::note!(self.notes, "tp: process {pid}: cannot let go of the probes of an unloaded library: {e:#}");
        }
        let looked = match maps.map_err(anyhow::Error::from).and_then(|maps| follow.new_functions(&maps)) {
            Ok(Some(x)) => x,
            Ok(None) => return,
            // A process on its way out drops its mappings first: not worth a word.
            Err(_) if process::has_exited(pid, Duration::from_millis(100)) => return,
            Err(e) => {
                crate::note!(
                    self.notes,
                    "tp: process {pid}: cannot read its new libraries: {}",
                    text(&format!("{e:#}"))
                );
                return;
            }
        };
        let follow::Loaded { modules, found, names } = looked;
        if found.is_empty() {
            return;
        }
        let started = Instant::now();
        match probes.install(&modules, found) {
            Ok((added, refused)) => {
                let (at, took) = match rendezvous {
                    Some(arrived) => ("rendezvous", arrived.elapsed()),
                    None => ("poll", started.elapsed()),
                };
                let loaded =
                    report::Loaded { modules: names.clone(), probes: added, skipped: refused, at, loads: 1, took };
                report::Loaded::add_to(&mut self.loaded, loaded);
                self.say_loaded(pid, &names, added, refused, rendezvous.is_some(), took);
            }
            Err(_) if process::has_exited(pid, Duration::from_millis(100)) => {}
            Err(e) => crate::note!(
                self.notes,
                "tp: process {pid} loaded {}; cannot probe it: {}",
                text(&names.join(", ")),
                text(&format!("{e:#}"))
            ),
        }
    }

    /// Names the plain names of process `pid`'s patterns that no library defined.
    pub fn say_never_found(&self, pid: i32) {
        if let Some(f) = &self.follow {
            for name in f.never_found() {
                crate::note!(self.notes, "tp: process {pid}: `{}` was never found", text(&name));
            }
        }
    }
}

impl Libraries {
    /// The line for process `pid`'s load of `names`, where tp probed `added`
    /// functions (`refused` more cannot be), at the rendezvous or when seen,
    /// in `took`; the last of [`Libraries::loaded`] is the summary's entry for
    /// it. The same library loaded over and over: its first loads, then at 10,
    /// 100, 1000, … loads in a row (the summary counts them all).
    fn say_loaded(
        &self,
        pid: i32,
        names: &[String],
        added: usize,
        refused: usize,
        at_rendezvous: bool,
        took: Duration,
    ) {
        let loads = self.loaded.last().map_or(1, |l| l.loads);
        let joined = names.join(", ");
        let names = text(&joined);
        if loads > SAID_LOADS {
            if power_of_ten(loads) {
                let when = if at_rendezvous { "at the dynamic linker's rendezvous" } else { "when seen" };
                crate::note!(
                    self.notes,
                    "tp: process {pid} loaded {names} again: {loads} loads in a row, each probed ({added} function{}) \
                 {when}; tp says so at 10, 100, 1000, … loads",
                    plural(added),
                );
            }
            return;
        }
        let skipped =
            if refused > 0 { format!(" ({refused} cannot be probed and are skipped)") } else { String::new() };
        match at_rendezvous {
            true => crate::note!(
                self.notes,
                "tp: process {pid} loaded {names}: probed {added} more function{} at the dynamic linker's \
             rendezvous, before its initializers and its first call (the loading thread waited {:.1} ms){skipped}",
                plural(added),
                took.as_secs_f64() * 1e3
            ),
            false => crate::note!(
                self.notes,
                "tp: process {pid} loaded {names}: probed {added} more function{} in {:.1} ms{skipped}",
                plural(added),
                took.as_secs_f64() * 1e3
            ),
        }
    }
}

/// True for 1, 10, 100, …
fn power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_ten() {
        let found: Vec<u64> = (1..=2000).filter(|&n| power_of_ten(n)).collect();
        assert_eq!(found, [1, 10, 100, 1000]);
    }
}
