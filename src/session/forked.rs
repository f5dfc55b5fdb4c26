//! The processes a session's targets fork while the probes are in, and how
//! each process of the session ends.
//!
//! A child of a probed process runs the same probes (the fork copied the
//! patched code and the mappings): its events reach the session through
//! the shared rings, each marked with its PID, and the session's end
//! restores it (`probe::family`). What this module adds is what the
//! kernel says as it happens ([`crate::process::proc_events::Events`]): which process
//! forked which, which exec'd, and how each ended ("killed by SIGSEGV"),
//! which no look at `/proc` afterwards can tell for a process tp does not
//! trace. Where tp cannot listen (no CAP_NET_ADMIN, another namespace),
//! children are known by their events and by the memory they share at the
//! end, and an exit by its absence.

use std::collections::{BTreeMap, BTreeSet};

use crate::notes::Notes;
use crate::output::report::Child;
use crate::probe::family::{Outcome, Relative};
use crate::probe::remove::Kept;
use crate::process::proc_events::{Ended, Event, Events};

/// A process forked, directly or not, by one of the session's processes.
#[derive(Debug, Clone, Default)]
pub struct Kin {
    /// The session's process it descends from.
    pub root: i32,
    /// It exec'd (its probes went with its old program).
    pub execd: bool,
    /// How it ended, once it did.
    pub end: Option<Ended>,
    /// What the session's end did there, if it still held the probes.
    pub outcome: Option<Outcome>,
}

/// What the session knows of its processes' families.
#[derive(Debug, Default)]
pub struct Family {
    events: Option<Events>,
    /// Why tp cannot listen, if it cannot.
    pub unheard: Option<String>,
    roots: BTreeSet<i32>,
    /// Every descendant seen, by PID.
    pub kin: BTreeMap<i32, Kin>,
    /// How the session's own processes ended, when the kernel said.
    root_ends: BTreeMap<i32, Ended>,
    /// Children killed by a signal, not yet said.
    news: Vec<(i32, i32, Ended)>,
    /// The kernel dropped events (tp read too slowly), said once.
    overrun_said: bool,
    /// Processes that exec'd since [`Family::take_execs`], when asked to
    /// keep them ([`Family::keep_execs`]).
    execs: Option<Vec<i32>>,
}

/// The most exec'd processes [`Family`] keeps between two looks.
const MAX_EXECS: usize = 4096;

impl Family {
    /// Starts listening to the kernel (before the probes go in, so that no
    /// fork of the attach's moment is missed).
    pub fn start() -> Family {
        let (events, unheard) = match Events::open() {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Family { events, unheard, ..Family::default() }
    }

    /// True if tp hears the kernel's process events.
    pub fn hears(&self) -> bool {
        self.events.is_some()
    }

    /// From now on, keeps every process that exec'd for [`Family::take_execs`].
    pub fn keep_execs(&mut self) {
        self.execs.get_or_insert_with(Vec::new);
    }

    /// The processes that exec'd since the last call, in order.
    pub fn take_execs(&mut self) -> Vec<i32> {
        self.execs.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Waits until the kernel says something, or `d` (sleeps `d` where tp
    /// does not hear it).
    pub fn wait(&self, d: std::time::Duration) {
        match &self.events {
            Some(e) => e.wait(d),
            None => std::thread::sleep(d),
        }
    }

    /// A process of the session.
    pub fn add_root(&mut self, pid: i32) {
        self.roots.insert(pid);
    }

    fn root_of(&self, pid: i32) -> Option<i32> {
        if self.roots.contains(&pid) { Some(pid) } else { self.kin.get(&pid).map(|k| k.root) }
    }

    /// Takes in what the kernel reported since the last call.
    pub fn poll(&mut self) {
        let Some(events) = &mut self.events else { return };
        for ev in events.poll() {
            match ev {
                Event::Fork { parent, child } => {
                    if let Some(root) = self.root_of(parent) {
                        self.kin.insert(child, Kin { root, ..Kin::default() });
                    }
                }
                Event::Exec { pid } => {
                    if let Some(k) = self.kin.get_mut(&pid) {
                        k.execd = true;
                    }
                    if let Some(execs) = &mut self.execs
                        && execs.len() < MAX_EXECS
                    {
                        execs.push(pid);
                    }
                }
                Event::Exit { pid, how } => {
                    if self.roots.contains(&pid) {
                        self.root_ends.insert(pid, how);
                    } else if let Some(k) = self.kin.get_mut(&pid) {
                        k.end = Some(how);
                        if matches!(how, Ended::Signal { .. }) {
                            self.news.push((pid, k.root, how));
                        }
                    }
                }
            }
        }
    }

    /// Children killed by a signal since the last call: (child, root, how).
    /// Says to `notes`, once, that the kernel dropped events.
    pub fn take_news(&mut self, notes: &dyn Notes) -> Vec<(i32, i32, Ended)> {
        if !self.overrun_said && self.events.as_ref().is_some_and(|e| e.overrun) {
            self.overrun_said = true;
            crate::note!(
                notes,
                "tp: the kernel dropped process events (forks came faster than tp read them): some children \
                 may be missing from the summary, and how they ended"
            );
        }
        std::mem::take(&mut self.news)
    }

    /// A process that recorded events in `root`'s rings: one of its family.
    pub fn note(&mut self, root: i32, pid: i32) {
        if pid != root && pid > 0 && !self.roots.contains(&pid) {
            self.kin.entry(pid).or_insert_with(|| Kin { root, ..Kin::default() });
        }
    }

    /// What the end of the session did in `root`'s family ([`Relative`]s).
    pub fn restored(&mut self, root: i32, relatives: &[Relative]) {
        for r in relatives {
            self.kin.entry(r.pid).or_insert_with(|| Kin { root, ..Kin::default() }).outcome = Some(r.outcome.clone());
        }
    }

    /// How one of the session's processes ended: as the kernel said, or
    /// [`Ended::Unknown`].
    pub fn end_of(&mut self, pid: i32) -> Ended {
        self.poll();
        self.root_ends.get(&pid).copied().unwrap_or(Ended::Unknown)
    }

    /// The children of `root` for its summary, with the events each
    /// recorded (`events`: per PID), in PID order.
    pub fn children(&self, root: i32, events: &BTreeMap<u32, u64>) -> Vec<Child> {
        self.kin
            .iter()
            .filter(|(_, k)| k.root == root)
            .map(|(&pid, k)| Child { pid, events: events.get(&(pid as u32)).copied().unwrap_or(0), end: describe(k) })
            .collect()
    }
}

/// How a child came out: how it ended, or what the session's end did.
fn describe(k: &Kin) -> String {
    match (&k.outcome, k.end, k.execd) {
        (Some(Outcome::Restored), _, _) => "running; probes removed".into(),
        (Some(Outcome::Kept(Kept::InUse { tid, .. })), _, _) => {
            format!("running; probes removed, tp's memory kept (thread {tid} still uses it)")
        }
        (Some(Outcome::Kept(_)), _, _) => "running; probes removed, tp's memory kept (other probes)".into(),
        (Some(Outcome::Failed(why)), _, _) => format!("running; probes NOT removed: {why}"),
        (_, Some(end), _) => end.describe(),
        (_, None, true) => "exec'd another program".into(),
        (Some(Outcome::Gone), None, false) | (None, None, false) => "exited".into(),
    }
}
