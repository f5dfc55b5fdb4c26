//! Saving module analyses ([`super::saved`]) in the background, so that
//! neither an attach nor tp's exit waits for the cache.
//!
//! A module that missed the cache is queued when it is read ([`enqueue`]).
//! Once the probes are live ([`start`]) one thread (`tp-cache`) at idle
//! priority computes each queued analysis (taking what the module already
//! computed), looks again at the places of the module's debug file, and
//! saves it (a temporary file renamed into place:
//! [`crate::cache::Store::save`]); the thread ends when the queue is. At
//! exit ([`finish`]) tp gives that thread normal priority and waits for it
//! at most [`WAIT_AT_EXIT`] (a listing, which computed everything already,
//! [`WAIT_AFTER_LISTING`]); past that, what is not saved is dropped and
//! computed again by the next tp that needs it. An entry being written
//! then is finished first (one write and a rename), and nothing is written
//! after: tp never exits with half an entry behind it.

use std::path::Path;
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::elf::ElfFile;
use super::saved::{Key, Known, Place, Saved, now, places, store};
use crate::cache::Store;

/// How long tp waits at its exit for the analyses still being saved: short
/// enough that nobody notices. A large binary's analysis takes longer the
/// first time; it is saved while tp runs, or by a later tp.
pub const WAIT_AT_EXIT: Duration = Duration::from_millis(250);

/// How long a listing (`list-probes`) waits at its exit for its analyses
/// to be saved: it computed them already, so what is left is to write
/// them, which takes a fraction of the listing's own time.
pub const WAIT_AFTER_LISTING: Duration = Duration::from_secs(10);

/// A cache entry to write: its name, key and payload.
struct Entry {
    name: String,
    key: Vec<u8>,
    payload: Vec<u8>,
}

/// Computes one queued module's entry; None if there is nothing to save.
type Job = Box<dyn FnOnce() -> Option<Entry> + Send>;

/// The queue of analyses to save and the thread that saves them.
struct Saver {
    queue: Mutex<Queue>,
    /// Held while an entry is written; true once nothing more may be
    /// written (tp stopped waiting and is exiting).
    closed: Mutex<bool>,
}

/// The jobs waiting, by entry name, and the state of the thread.
struct Queue {
    /// Each with whether it only encodes what the session made already
    /// ([`enqueue_entry`]: a module's plans), which go first.
    jobs: Vec<(String, bool, Job)>,
    /// True while the thread runs: it clears this, under the lock, when it
    /// finds the queue empty.
    running: bool,
    /// Says when the thread is done, for [`Saver::finish`].
    done: Option<Receiver<()>>,
    /// The running thread's ID once it has set its priority, to raise it
    /// when tp waits for it (0 before).
    tid: i32,
    /// True once tp waits at its exit: a thread that starts then keeps
    /// normal priority.
    waited: bool,
}

static SAVER: Saver = Saver::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Saver {
    const fn new() -> Saver {
        Saver {
            queue: Mutex::new(Queue { jobs: Vec::new(), running: false, done: None, tid: 0, waited: false }),
            closed: Mutex::new(false),
        }
    }

    /// Queues `job` for entry `name`, unless it is queued already; `ready`
    /// if it only encodes what is made already.
    fn add(&self, name: String, ready: bool, job: Job) {
        let mut q = lock(&self.queue);
        if !q.jobs.iter().any(|(n, ..)| *n == name) {
            q.jobs.push((name, ready, job));
        }
    }

    /// Starts the thread that saves what is queued into `store`, unless it
    /// runs or there is nothing to save.
    fn start(&'static self, store: &'static Store) {
        let mut q = lock(&self.queue);
        if q.jobs.is_empty() || q.running || *lock(&self.closed) {
            return;
        }
        let (done, finished) = channel();
        let spawned = std::thread::Builder::new().name("tp-cache".into()).spawn(move || {
            // Idle priority, unless tp waits for it already; under the lock
            // that `finish` takes to raise it, so that one of the two wins.
            let mut q = lock(&self.queue);
            if !q.waited {
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: the calling thread, a valid policy and parameter.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                // SAFETY: gettid has no preconditions.
                q.tid = unsafe { libc::gettid() };
            }
            drop(q);
            self.work(store);
            let _ = done.send(());
        });
        if spawned.is_ok() {
            q.running = true;
            q.done = Some(finished);
            q.tid = 0;
        }
    }

    /// The thread's loop: the jobs in the order they came, those that only
    /// encode first (a module's plans are a fraction of a second to write;
    /// its analysis may take seconds to compute, and a short session's
    /// wait at exit would end before the plans' turn), each computed, then
    /// written unless closed meanwhile.
    fn work(&self, store: &Store) {
        loop {
            let job = {
                let mut q = lock(&self.queue);
                if q.jobs.is_empty() || *lock(&self.closed) {
                    q.running = false;
                    return;
                }
                let at = q.jobs.iter().position(|(_, ready, _)| *ready).unwrap_or(0);
                q.jobs.remove(at).2
            };
            let Some(entry) = job() else { continue };
            let closed = lock(&self.closed);
            if !*closed {
                let _ = store.save(&entry.name, &entry.key, &entry.payload);
            }
        }
    }

    /// Starts saving what is queued and waits for it for at most `wait`;
    /// then closes: an entry being written is finished, none is started.
    /// True if everything queued was saved (or had nothing to save).
    fn finish(&'static self, store: &'static Store, wait: Duration) -> bool {
        self.start(store);
        let (done, tid) = {
            let mut q = lock(&self.queue);
            q.waited = true;
            (q.done.take(), q.tid)
        };
        let mut all = true;
        if let Some(done) = done {
            if tid > 0 {
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: a thread of this process (or one that ended: then
                // ESRCH), a valid policy and parameter.
                unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
            }
            all = done.recv_timeout(wait).is_ok();
        }
        *lock(&self.closed) = true;
        all && lock(&self.queue).jobs.is_empty()
    }
}

/// Queues the analysis of `elf` (symbols final; the process sees it at
/// `path`, its files under `root`) and its debug file, whose places were
/// `places` before it was read, to be saved under `key`, if the file is
/// settled and there is a cache.
pub fn enqueue(
    key: Key,
    elf: Arc<ElfFile>,
    debug: Option<Arc<ElfFile>>,
    places: Vec<Place>,
    known: Known,
    path: &Path,
    root: &Path,
) {
    if !key.settled || store().is_none() {
        return;
    }
    let (path, root) = (path.to_path_buf(), root.to_path_buf());
    let name = key.name();
    let entry_name = name.clone();
    let job = move || {
        // No debug file, but a debuginfod server failed: it may have one.
        if debug.is_none() && crate::debuginfod::unsure() {
            return None;
        }
        let saved = Saved::compute(&elf, debug.as_deref(), places, &known);
        // A debug file installed, removed or changed meanwhile, or a
        // moment ago: what was read may not be what is there.
        let now = now();
        let places_now = self::places(&saved.headers, &path, &root);
        let settled = places_now.iter().all(|p| p.file.is_none_or(|f| f.settled(now)));
        (places_now == saved.places && settled).then(|| Entry {
            name: entry_name,
            key: key.bytes,
            payload: saved.encode(),
        })
    };
    SAVER.add(name, false, Box::new(job));
}

/// What [`enqueue_entry`] computes when its turn comes: an entry's name,
/// key and payload, or None for nothing to save.
pub type EntryJob = Box<dyn FnOnce() -> Option<(String, Vec<u8>, Vec<u8>)> + Send>;

/// Queues another kind of entry, named `name`, which `job` computes when
/// its turn comes, if there is a cache.
pub fn enqueue_entry(name: String, job: EntryJob) {
    if store().is_none() {
        return;
    }
    SAVER.add(name, true, Box::new(move || job().map(|(name, key, payload)| Entry { name, key, payload })));
}

/// Starts saving what is queued, on a thread of idle priority (it runs
/// only when nothing else wants the CPU). Call once the probes are live.
pub fn start() {
    if let Some(store) = store() {
        SAVER.start(store);
    }
}

/// Starts saving what is queued if it has not started, and waits for it
/// for at most `wait`, at normal priority; what is not saved by then is
/// dropped. tp calls it before it exits: with [`WAIT_AT_EXIT`] after a
/// session (whose analyses were saved while it ran), with
/// [`WAIT_AFTER_LISTING`] after a listing (which computed them already).
pub fn finish(wait: Duration) {
    if let Some(store) = store() {
        SAVER.finish(store, wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An empty store of this test's own.
    fn scratch(name: &str) -> &'static Store {
        let d = std::env::temp_dir().join(format!("tp-saving-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Box::leak(Box::new(Store::at(&d).unwrap()))
    }

    fn files(store: &Store) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(store.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    fn entry(name: &str) -> Option<Entry> {
        Some(Entry { name: name.into(), key: b"key".to_vec(), payload: b"payload".to_vec() })
    }

    #[test]
    fn what_is_saved_in_time_is_whole_and_the_rest_is_never_written() {
        let store = scratch("bounded");
        let saver: &'static Saver = Box::leak(Box::new(Saver::new()));
        saver.add("module-0000000000000001".into(), false, Box::new(|| entry("module-0000000000000001")));
        saver.start(store);
        // A job that is still computing when tp stops waiting.
        let (release, held) = channel::<()>();
        let (finished, computed) = channel::<()>();
        saver.add(
            "module-0000000000000002".into(),
            false,
            Box::new(move || {
                let _ = held.recv();
                let _ = finished.send(());
                entry("module-0000000000000002")
            }),
        );
        let began = Instant::now();
        assert!(!saver.finish(store, Duration::from_millis(100)), "one analysis was not saved");
        assert!(began.elapsed() < Duration::from_secs(5), "finish waited {:?}", began.elapsed());
        // The job completes after tp stopped waiting: nothing is written.
        release.send(()).unwrap();
        computed.recv().unwrap();
        for _ in 0..100 {
            if !lock(&saver.queue).running {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!lock(&saver.queue).running, "the thread ended");
        assert_eq!(files(store), ["module-0000000000000001"], "the first entry whole, no temporary file, no second");
        assert_eq!(store.load("module-0000000000000001", b"key").as_deref(), Some(&b"payload"[..]));
        // Closed: a later start writes nothing either.
        saver.add("module-0000000000000003".into(), false, Box::new(|| entry("module-0000000000000003")));
        saver.start(store);
        assert!(!lock(&saver.queue).running);
        assert_eq!(files(store), ["module-0000000000000001"]);
    }

    #[test]
    fn everything_queued_is_saved_when_there_is_time() {
        let store = scratch("all");
        let saver: &'static Saver = Box::leak(Box::new(Saver::new()));
        for n in ["module-00000000000000a1", "module-00000000000000a2"] {
            saver.add(n.into(), false, Box::new(move || entry(n)));
        }
        saver.add("module-00000000000000a3".into(), false, Box::new(|| None));
        assert!(saver.finish(store, Duration::from_secs(600)));
        assert_eq!(files(store), ["module-00000000000000a1", "module-00000000000000a2"]);
    }

    #[test]
    fn entries_made_already_are_saved_before_analyses_to_compute() {
        let store = scratch("ready-first");
        let saver: &'static Saver = Box::leak(Box::new(Saver::new()));
        // An analysis that computes until tp has stopped waiting, queued
        // before a module's plans: the plans are written all the same.
        let (release, held) = channel::<()>();
        saver.add(
            "module-00000000000000b1".into(),
            false,
            Box::new(move || {
                let _ = held.recv();
                entry("module-00000000000000b1")
            }),
        );
        saver.add("plans-00000000000000b1".into(), true, Box::new(|| entry("plans-00000000000000b1")));
        saver.start(store);
        assert!(!saver.finish(store, Duration::from_secs(5)), "the analysis was not saved");
        release.send(()).unwrap();
        assert_eq!(files(store), ["plans-00000000000000b1"]);
    }
}
