//! Watching a target while its probes are live: one loop ([`run`]), shared
//! by every session, that ends on a signal, tp's output closed or the
//! duration, and otherwise when what it observes says so at one of its
//! periodic checks (the target's exit, the probes' removal), and between
//! those checks lets it consume what the probes produce: one attached
//! process and a [`Watcher`] ([`observe`]), or a group of them
//! (`super::group::Group::observe`).

use std::time::{Duration, Instant};

use anyhow::Result;

use super::attached::Attached;
use super::follow;
use super::forked::Family;
use super::interrupt;
use super::libraries::{Libraries, Probes};
use super::tracer::Tracer;
use crate::notes::Notes;
use crate::output::live::Live;
use crate::probe::region::Region;
use crate::probe::rendezvous_wait;
use crate::process::Mapping;
use crate::symbols::{Found, ProcessModules};

/// How often the loop looks whether the target is alive and its probes installed.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How often the live display drains events.
const LIVE_TICK: Duration = Duration::from_millis(20);
/// How often the live display redraws the counts.
const DRAW_EVERY: Duration = Duration::from_millis(100);

/// Why observing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Ctrl-C or a termination signal.
    Interrupted,
    /// `--duration` elapsed.
    Duration,
    /// The target exited.
    TargetExited,
    /// Someone removed the probes.
    Removed,
    /// tp's stdout or stderr is closed or cannot be written
    /// ([`crate::streams`]): nobody reads what the session says.
    OutputClosed,
}

/// Says, on the stream that still works, that the session ends because
/// tp's stdout or stderr is closed ([`End::OutputClosed`]).
pub fn say_output_closed() {
    if let Some(f) = crate::streams::failure() {
        crate::streams::last_word(&format!("tp: {}; removing every probe", f.describe()));
    }
}

/// What the loop of [`run`] observes.
pub trait Observed {
    /// The checks made at the loop's start and then every
    /// [`Observed::check_every`]: the end they find, if any. An error ends
    /// the loop.
    fn check(&mut self) -> Result<Option<End>>;
    /// How long from one check to the next.
    fn check_every(&self) -> Duration;
    /// Waits a little, then consumes what the probes produced meanwhile.
    /// An error ends the loop.
    fn step(&mut self) -> Result<()>;
}

/// The observe loop: until a signal, tp's stdout or stderr closed, the
/// `duration` or the end a check of `observed` finds, checks and steps it.
pub fn run(observed: &mut dyn Observed, duration: Option<Duration>) -> Result<End> {
    let started = Instant::now();
    let mut next_check = started;
    loop {
        crate::fault::point("observing");
        if interrupt::interrupted() {
            return Ok(End::Interrupted);
        }
        if crate::streams::closed() {
            return Ok(End::OutputClosed);
        }
        if duration.is_some_and(|d| started.elapsed() >= d) {
            return Ok(End::Duration);
        }
        if Instant::now() >= next_check {
            if let Some(end) = observed.check()? {
                return Ok(end);
            }
            next_check = Instant::now() + observed.check_every();
        }
        observed.step()?;
    }
}

/// What a session does while it observes.
pub trait Watcher {
    /// How long to sleep before the next tick.
    fn pause(&self) -> Duration;
    /// Consumes what the probes produced since the last tick. An error ends
    /// the observation.
    fn tick(&mut self, attached: &Attached) -> Result<()>;
    /// Called once when observing ends.
    fn finish(&mut self) {}
    /// Called when the session probed more functions (a library loaded):
    /// they follow the others in `attached`'s probes; or installed some of
    /// them again (the same library loaded again, where it was), before
    /// the loading thread goes on.
    fn grown(&mut self, _attached: &Attached) {}
    /// Runs `say`, which writes a line to stderr, around the watcher's own
    /// drawing (a live display hides itself meanwhile).
    fn suspended(&mut self, say: &mut dyn FnMut()) {
        say()
    }
}

/// Lets `watcher` tick until a signal, the duration, the target's exit or
/// exec, or the probes' removal. With `family`, says at once (to `notes`) when a child
/// the target forked is killed by a signal. With `libraries`, probes what
/// its patterns match in the libraries the target loads, as a group's
/// member does ([`Libraries`]): at the dynamic linker's rendezvous, where
/// tp's probe is among `attached`'s (a thread that arrives there is
/// answered between two ticks), else as tp sees them at each check.
pub fn observe(
    attached: &mut Attached,
    duration: Option<Duration>,
    watcher: &mut dyn Watcher,
    family: Option<&mut Family>,
    libraries: Option<&mut Libraries>,
    notes: &dyn Notes,
) -> Result<End> {
    let next_tick = Instant::now() + watcher.pause();
    let mut single = Single { attached: &mut *attached, watcher: &mut *watcher, family, libraries, next_tick, notes };
    let end = run(&mut single, duration);
    // What the probes produced since the last tick (a call that returned
    // just before the signal) is consumed too, while the probes are in.
    let last = match end {
        Ok(End::Interrupted | End::Duration) => watcher.tick(attached),
        _ => Ok(()),
    };
    watcher.finish();
    let end = end?;
    last.map(|()| end)
}

/// One attached process observed, with what [`observe`] was given.
struct Single<'a, 'w> {
    attached: &'a mut Attached,
    watcher: &'a mut (dyn Watcher + 'w),
    family: Option<&'a mut Family>,
    libraries: Option<&'a mut Libraries>,
    /// When the watcher ticks next.
    next_tick: Instant,
    /// Where the session's notes go.
    notes: &'a dyn Notes,
}

/// The one attached process of [`observe`] as [`Libraries`] sees it: new
/// probes go into its attach, and the watcher hears of them.
struct Grown<'a, 'w> {
    attached: &'a mut Attached,
    watcher: &'a mut (dyn Watcher + 'w),
}

impl Probes for Grown<'_, '_> {
    fn rendezvous(&self) -> Option<&Region> {
        self.attached.has_rendezvous().then_some(&self.attached.region)
    }

    fn drop_unloaded(&mut self, maps: &[Mapping]) -> Result<()> {
        self.attached.drop_unloaded(maps).map(|_| ())
    }

    fn install(&mut self, modules: &ProcessModules, found: Vec<Found>) -> Result<(usize, usize)> {
        let added = self.attached.extend(modules, found)?;
        self.watcher.grown(self.attached);
        Ok(added)
    }
}

impl Observed for Single<'_, '_> {
    fn check(&mut self) -> Result<Option<End>> {
        crate::streams::check();
        if let Some(f) = self.family.as_deref_mut() {
            f.poll();
            let notes = self.notes;
            for (child, root, how) in f.take_news(notes) {
                self.watcher.suspended(&mut || {
                    crate::note!(
                        notes,
                        "tp: process {child} (forked by {root} while the probes were in) {}",
                        how.sentence()
                    )
                });
            }
        }
        if let Some(libs) = self.libraries.as_deref_mut() {
            let pid = self.attached.pid;
            libs.check(pid, &mut Grown { attached: &mut *self.attached, watcher: &mut *self.watcher });
        }
        if !self.attached.still_installed() {
            return Ok(Some(End::Removed));
        }
        // An exec drops the probes with the old program; tp stops there
        // (the detach finds nothing to restore) and keeps the counts.
        if follow::change(self.attached.pid, &self.attached.region) != follow::Change::Same {
            return Ok(Some(End::TargetExited));
        }
        Ok(None)
    }

    fn check_every(&self) -> Duration {
        CHECK_EVERY
    }

    /// Waits until the next tick, or until a thread arrives at the
    /// rendezvous while it is armed, and answers it; ticks when it is time.
    fn step(&mut self) -> Result<()> {
        let left = self.next_tick.saturating_duration_since(Instant::now());
        // (Looked for among the probes only while libraries are followed.)
        let following = self.libraries.as_ref().is_some_and(|l| l.follow.is_some());
        let has_rendezvous = following && self.attached.has_rendezvous();
        match has_rendezvous.then_some(&self.attached.region).filter(|r| rendezvous_wait::armed(r)) {
            Some(region) => rendezvous_wait::wait_for_arrival(region, left),
            None => std::thread::sleep(left),
        }
        if has_rendezvous && let Some(libs) = self.libraries.as_deref_mut() {
            let pid = self.attached.pid;
            libs.serve(pid, &mut Grown { attached: &mut *self.attached, watcher: &mut *self.watcher });
        }
        if Instant::now() < self.next_tick {
            return Ok(());
        }
        let at = Instant::now();
        let ticked = self.watcher.tick(self.attached);
        self.next_tick = at + self.watcher.pause();
        ticked
    }
}

/// Live counts on stderr, and the events of a tracer if there is one.
pub struct LiveView<'t> {
    live: Option<Live>,
    tracer: Option<&'t mut Tracer>,
    next_draw: Instant,
}

impl<'t> LiveView<'t> {
    /// A live display of the probes of `attached`, draining `tracer` at every tick.
    pub fn new(attached: &Attached, tracer: Option<&'t mut Tracer>) -> LiveView<'t> {
        LiveView { live: Some(Live::new(attached.pid, &attached.names())), tracer, next_draw: Instant::now() }
    }
}

impl Watcher for LiveView<'_> {
    fn pause(&self) -> Duration {
        LIVE_TICK
    }

    fn tick(&mut self, attached: &Attached) -> Result<()> {
        let Some(live) = &mut self.live else { return Ok(()) };
        if let Some(t) = self.tracer.as_deref_mut()
            && let Err(e) = live.suspend(|| t.poll(attached))
            && !crate::streams::closed()
        {
            return Err(e.context("reading events"));
        }
        if Instant::now() >= self.next_draw {
            live.update(&attached.counted());
            self.next_draw = Instant::now() + DRAW_EVERY;
        }
        Ok(())
    }

    fn finish(&mut self) {
        if let Some(live) = self.live.take() {
            live.finish();
        }
    }

    fn suspended(&mut self, say: &mut dyn FnMut()) {
        match &self.live {
            Some(live) => live.suspend(say),
            None => say(),
        }
    }
}
