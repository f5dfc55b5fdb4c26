//! A traced process's perf map, read as it grows: `/tmp/perf-NSPID.map`
//! in the process's own root (`/proc/PID/root`), NSPID its number in its
//! own PID namespace. The process writes the file and tp may run as root,
//! so it is reached without following a symbolic link (`tmp` and the map
//! itself opened with `O_NOFOLLOW`, the map first with `O_PATH`), read
//! only if it is a regular file of one link (no hard link to another
//! file) owned by the process's user or by root, and at most [`MAX_READ`] bytes of it in all. Reads are incremental,
//! from where the last one stopped, at most once per [`REREAD_EVERY`]; a
//! file replaced or rewritten (its inode changed, it shrank, or the bytes
//! before where the last read stopped differ) is read again from its
//! start. The lines are [`super::perf_map`]'s.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::perf_map::{JitNames, Lines, parse_line};

/// The most bytes read of one map, in all (node's grows for as long as it runs).
pub const MAX_READ: u64 = 64 << 20;

/// The shortest time between two reads of a map.
pub const REREAD_EVERY: Duration = Duration::from_millis(200);

/// Bytes before the read position compared again to tell a rewritten file.
const TAIL: usize = 64;

/// What became of the last attempt to read the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not tried yet.
    Unread,
    /// No such file: the process writes none.
    Missing,
    /// Not read, and why ("is a symbolic link", "is owned by uid 1001").
    Refused(String),
    /// Read (some of it, maybe none yet).
    Read,
}

/// The perf map of one process and the names read from it so far.
pub struct PerfMapFile {
    pid: i32,
    /// The map's name in the process's root: `/tmp/perf-NSPID.map`.
    shown: String,
    /// The users whose map tp reads: the process's real and effective, and root.
    owners: [u32; 3],
    names: JitNames,
    lines: Lines,
    /// The inode read: (device, number).
    inode: Option<(u64, u64)>,
    /// Where the next read starts.
    offset: u64,
    /// The last bytes before `offset`.
    tail: Vec<u8>,
    read_total: u64,
    next_read: Option<Instant>,
    state: State,
}

impl PerfMapFile {
    /// The perf map of process `pid`, not read yet.
    pub fn new(pid: i32) -> PerfMapFile {
        let st = crate::process::status(pid).ok();
        let ns_pid = st.as_ref().map_or(0, |s| s.ns_pid);
        let [uid, euid] = st.map_or([0, 0], |s| s.uids);
        PerfMapFile {
            pid,
            shown: format!("/tmp/perf-{}.map", if ns_pid > 0 { ns_pid } else { pid }),
            owners: [uid, euid, 0],
            names: JitNames::default(),
            lines: Lines::default(),
            inode: None,
            offset: 0,
            tail: Vec::new(),
            read_total: 0,
            next_read: None,
            state: State::Unread,
        }
    }

    /// The map's path in the process's root (`/tmp/perf-NSPID.map`).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// What became of the last read.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The name of the code at `addr` and the address it starts at.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        self.names.lookup(addr)
    }

    /// Reads what the process added to its map since the last read, unless
    /// that was less than [`REREAD_EVERY`] ago (`now`); true if it read.
    pub fn refresh(&mut self, now: Instant) -> bool {
        if self.next_read.is_some_and(|t| now < t) {
            return false;
        }
        self.next_read = Some(now + REREAD_EVERY);
        self.state = match self.read_more() {
            Ok(()) => State::Read,
            Err(e) if e.kind() == io::ErrorKind::NotFound => State::Missing,
            Err(e) => State::Refused(e.to_string()),
        };
        true
    }

    fn read_more(&mut self) -> io::Result<()> {
        let file = open_map(self.pid, &self.shown, &self.owners)?;
        let meta = file.metadata()?;
        let inode = (meta.dev(), meta.ino());
        if self.inode != Some(inode) || meta.len() < self.offset || !self.tail_unchanged(&file) {
            self.inode = Some(inode);
            self.offset = 0;
            self.tail.clear();
            self.lines = Lines::default();
        }
        let mut buf = vec![0u8; 64 << 10];
        while self.read_total < MAX_READ {
            let want = buf.len().min((MAX_READ - self.read_total) as usize);
            let n = file.read_at(&mut buf[..want], self.offset)?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            let names = &mut self.names;
            self.lines.feed(chunk, |line| {
                if let Some(e) = parse_line(line) {
                    names.insert(e);
                }
            });
            self.offset += n as u64;
            self.read_total += n as u64;
            self.tail.extend_from_slice(&chunk[n.saturating_sub(TAIL)..]);
            self.tail.drain(..self.tail.len().saturating_sub(TAIL));
        }
        Ok(())
    }

    /// True if the bytes before the read position are still those read.
    fn tail_unchanged(&self, file: &File) -> bool {
        let Some(at) = self.offset.checked_sub(self.tail.len() as u64) else { return false };
        let mut now = vec![0u8; self.tail.len()];
        file.read_exact_at(&mut now, at).is_ok() && now == self.tail
    }
}

/// Opens `/proc/PID/root` + `shown` (`/tmp/NAME`) for reading: `tmp` and
/// the map are not followed if they are symbolic links, and the map must
/// be a regular file owned by one of `owners`.
fn open_map(pid: i32, shown: &str, owners: &[u32]) -> io::Result<File> {
    let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let name = shown.strip_prefix("/tmp/").ok_or_else(|| refuse("not in /tmp".into()))?;
    let search = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let root = nix::fcntl::open(format!("/proc/{pid}/root").as_str(), search | OFlag::O_DIRECTORY, Mode::empty())?;
    let tmp = openat(&root, "tmp", search | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW, Mode::empty()).map_err(|e| {
        if e == nix::errno::Errno::ENOTDIR { refuse("/tmp is not a directory".into()) } else { e.into() }
    })?;
    let path = File::from(openat(&tmp, name, search | OFlag::O_NOFOLLOW, Mode::empty())?);
    let meta = path.metadata()?;
    if meta.file_type().is_symlink() {
        return Err(refuse("is a symbolic link".into()));
    }
    if !meta.file_type().is_file() {
        return Err(refuse(format!("is a {}, not a regular file", crate::process::files::kind(&meta))));
    }
    if !owners.contains(&meta.uid()) {
        return Err(refuse(format!("is owned by uid {}, not the process's user nor root", meta.uid())));
    }
    // A hard link to a file of root's (where the kernel lets users make them) is not the process's map.
    if meta.nlink() != 1 {
        return Err(refuse(format!("has {} links", meta.nlink())));
    }
    // The very inode checked, not the path again.
    crate::process::files::reopen(&path, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A map for this test process itself, in /tmp, removed when dropped.
    struct OwnMap(std::path::PathBuf);

    impl Drop for OwnMap {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A PerfMapFile for this process reading `path` instead (a name of its own in /tmp).
    fn reader(name: &str) -> (PerfMapFile, OwnMap) {
        let mut m = PerfMapFile::new(std::process::id() as i32);
        m.shown = format!("/tmp/{name}");
        let path = std::path::PathBuf::from(&m.shown);
        let _ = std::fs::remove_file(&path);
        (m, OwnMap(path))
    }

    fn append(path: &std::path::Path, text: &str) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn a_growing_map_is_read_from_where_the_last_read_stopped() {
        let (mut m, own) = reader(&format!("tp-test-perf-grow-{}.map", std::process::id()));
        let t0 = Instant::now();
        assert!(m.refresh(t0));
        assert_eq!(*m.state(), State::Missing);
        append(&own.0, "1000 10 first\n2000 10 sec");
        assert!(!m.refresh(t0 + REREAD_EVERY / 2), "not again so soon");
        assert!(m.refresh(t0 + REREAD_EVERY));
        assert_eq!((m.state(), m.lookup(0x1005)), (&State::Read, Some(("first", 0x1000))));
        assert_eq!(m.lookup(0x2005), None, "a line not finished yet");
        append(&own.0, "ond\n1000 8 replaced\n");
        assert!(m.refresh(t0 + REREAD_EVERY * 2));
        assert_eq!(m.lookup(0x2005), Some(("second", 0x2000)));
        assert_eq!(m.lookup(0x1005), Some(("replaced", 0x1000)));

        // Rewritten from the start (as `jcmd PID Compiler.perfmap` does): read again whole.
        std::fs::write(&own.0, "3000 10 rewritten and longer than before, by far, so it is not shorter\n").unwrap();
        assert!(m.refresh(t0 + REREAD_EVERY * 3));
        assert_eq!(m.lookup(0x3001), Some(("rewritten and longer than before, by far, so it is not shorter", 0x3000)));
    }

    #[test]
    fn links_and_other_files_are_refused() {
        let (mut m, own) = reader(&format!("tp-test-perf-link-{}.map", std::process::id()));
        let target = format!("{}.real", own.0.display());
        std::fs::write(&target, "1000 10 secret\n").unwrap();
        std::os::unix::fs::symlink(&target, &own.0).unwrap();
        m.refresh(Instant::now());
        let _ = std::fs::remove_file(&target);
        assert_eq!(*m.state(), State::Refused("is a symbolic link".into()), "{:?}", m.state());
        assert_eq!(m.lookup(0x1000), None);

        let (mut m, own) = reader(&format!("tp-test-perf-dir-{}.map", std::process::id()));
        std::fs::create_dir(&own.0).unwrap();
        m.refresh(Instant::now());
        let _ = std::fs::remove_dir(&own.0);
        assert_eq!(*m.state(), State::Refused("is a directory, not a regular file".into()));
    }

    #[test]
    fn a_hard_link_is_refused() {
        let (mut m, own) = reader(&format!("tp-test-perf-hard-{}.map", std::process::id()));
        let other = format!("{}.other", own.0.display());
        std::fs::write(&other, "1000 10 f\n").unwrap();
        std::fs::hard_link(&other, &own.0).unwrap();
        m.refresh(Instant::now());
        let _ = std::fs::remove_file(&other);
        assert_eq!(*m.state(), State::Refused("has 2 links".into()));
    }

    #[test]
    fn a_map_of_another_user_is_refused() {
        let (mut m, own) = reader(&format!("tp-test-perf-owner-{}.map", std::process::id()));
        append(&own.0, "1000 10 f\n");
        m.owners = [u32::MAX - 1; 3];
        m.refresh(Instant::now());
        assert!(matches!(m.state(), State::Refused(why) if why.starts_with("is owned by uid")), "{:?}", m.state());
    }

    #[test]
    fn reads_stop_at_the_bound() {
        let (mut m, own) = reader(&format!("tp-test-perf-bound-{}.map", std::process::id()));
        append(&own.0, "1000 10 f\n");
        m.read_total = MAX_READ - 4;
        m.refresh(Instant::now());
        assert_eq!((m.offset, m.lookup(0x1000)), (4, None));
    }
}
