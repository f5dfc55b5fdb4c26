//! Saving module analyses ([`super::saved`]) in the background: a module
//! that missed the cache is queued when it is read; once the probes are live
//! ([`start`]) one thread at idle priority computes each queued analysis
//! (taking what the module already computed) and saves it, after looking
//! again at the places of the module's debug file; tp waits for it before
//! it exits ([`finish`]), for at most [`WAIT_AT_EXIT`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::elf::ElfFile;
use super::saved::{Key, Known, Place, Saved, now, places, store};

/// A module whose analysis is to be saved.
struct Job {
    key: Key,
    elf: Arc<ElfFile>,
    debug: Option<Arc<ElfFile>>,
    /// The places of the debug file before it was read, and where to look again.
    places: Vec<Place>,
    known: Known,
    path: std::path::PathBuf,
    root: std::path::PathBuf,
}

/// The modules waiting, and the thread that saves them.
struct Queue {
    jobs: Vec<Job>,
    /// The worker: it says on the channel when it is done.
    worker: Option<std::sync::mpsc::Receiver<()>>,
    /// The worker's thread ID, to raise its priority when tp waits for it.
    worker_tid: i32,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { jobs: Vec::new(), worker: None, worker_tid: 0 });

/// How long tp waits at its exit for the analyses still being saved: one
/// binary of hundreds of megabytes takes seconds; past this, what is not
/// saved is saved the next time.
const WAIT_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(10);

fn queue() -> std::sync::MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
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
    let mut q = queue();
    if !q.jobs.iter().any(|j| j.key == key) {
        q.jobs.push(Job { key, elf, debug, places, known, path: path.to_path_buf(), root: root.to_path_buf() });
    }
}

/// Starts saving what is queued, on a thread of idle priority (it runs
/// only when nothing else wants the CPU). Call once the probes are live.
pub fn start() {
    let mut q = queue();
    let running = q.worker.as_ref().is_some_and(|w| matches!(w.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)));
    if q.jobs.is_empty() || running {
        return;
    }
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("tp-cache".into()).spawn(move || {
        // SAFETY: gettid has no preconditions; sched_setscheduler on the
        // calling thread with a valid policy and parameter.
        unsafe {
            queue().worker_tid = libc::gettid();
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
        loop {
            let Some(job) = queue().jobs.pop() else { break };
            let saved = Saved::compute(&job.elf, job.debug.as_deref(), job.places, &job.known);
            // A debug file installed, removed or changed meanwhile, or a
            // moment ago: what was read may not be what is there.
            let now = now();
            let places_now = places(&saved.headers, &job.path, &job.root);
            let settled = places_now.iter().all(|p| p.file.is_none_or(|f| f.settled(now)));
            if places_now == saved.places
                && settled
                && let Some(store) = store()
            {
                let _ = store.save(&job.key.name(), &job.key.bytes, &saved.encode());
            }
        }
        let _ = done.send(());
    });
    q.worker = spawned.ok().map(|_| finished);
}

/// Saves what is queued and waits until it is saved, for at most
/// [`WAIT_AT_EXIT`]: tp calls it before it exits. The saving thread gets
/// normal priority for it.
pub fn finish() {
    start();
    let (worker, tid) = {
        let mut q = queue();
        (q.worker.take(), q.worker_tid)
    };
    if let Some(w) = worker {
        if tid > 0 {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: a thread of this process, a valid policy and parameter.
            unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
        }
        let _ = w.recv_timeout(WAIT_AT_EXIT);
    }
}
