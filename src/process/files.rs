//! Opening files whose path a target chooses, without the side effects an
//! open can have.
//!
//! tp reads a target's modules through `/proc/PID/map_files/` and
//! `/proc/PID/exe`, separate debug files under `/proc/PID/root`, and any
//! path a user gives list-probes. Opening such a path for reading is not
//! harmless: a FIFO blocks the open, a device runs its driver's open (a
//! watchdog starts counting down), and `/dev/zero` or a sparse file of a
//! terabyte never ends. So a path is first opened with `O_PATH`, which
//! opens nothing, and its inode checked to be a regular file; only then is
//! that very inode (through `/proc/self/fd/N`, not the path again) opened
//! for real, and reads are bounded.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest file tp reads whole (a binary, a library, a debug file).
pub const MAX_FILE: u64 = 4 << 30;

/// What kind of file `meta` describes, for messages.
pub fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    match () {
        _ if t.is_file() => "regular file",
        _ if t.is_dir() => "directory",
        _ if t.is_fifo() => "FIFO",
        _ if t.is_char_device() => "character device",
        _ if t.is_block_device() => "block device",
        _ if t.is_socket() => "socket",
        _ => "special file",
    }
}

/// `path` opened with `O_PATH` (nothing is opened; symlinks are followed)
/// and its metadata.
pub fn open_path(path: &Path) -> io::Result<(File, Metadata)> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

/// Opens the inode `path` (from [`open_path`]) refers to, for reading, and
/// for writing too if `write`.
pub fn reopen(path: &File, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", path.as_raw_fd()))
}

/// Opens `path` for reading if it is a regular file of at most
/// [`MAX_FILE`] bytes; an error of kind `InvalidInput` says what it is
/// instead ("a FIFO, not a regular file", "5.0 GiB, more than ...").
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let (p, meta) = open_path(path)?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("is a {}, not a regular file", kind(&meta))));
    }
    if meta.len() > MAX_FILE {
        return Err(too_big(meta.len()));
    }
    Ok((reopen(&p, false)?, meta.len()))
}

/// The whole of a regular file of at most [`MAX_FILE`] bytes (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    Ok(read_identified(path)?.0)
}

/// What tells one version of a file from any other: the inode (device and
/// number), the size, and the times of the last change of its contents and
/// of its inode. The kernel sets the change time on every write and never
/// lets a user set it, so a file whose identity is unchanged has the same
/// bytes (but within one tick of the kernel's clock: see [`FileId::settled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Last modification: seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Last status change: seconds and nanoseconds.
    pub ctime: (i64, i64),
}

impl FileId {
    /// The identity `meta` describes.
    pub fn of(meta: &Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// True if the file has not changed for a while before `now` (seconds
    /// since the epoch): a change within the same tick of the kernel's
    /// coarse clock as a read would leave the times as they were, so a file
    /// changed a moment ago may hold other bytes than those read under the
    /// same identity.
    pub fn settled(&self, now: i64) -> bool {
        self.mtime.0.max(self.ctime.0) + 2 < now
    }
}

/// [`read_regular`], and the identity of the file read if it was the same
/// before and after the read (a file that changed meanwhile has none).
pub fn read_identified(path: &Path) -> io::Result<(Vec<u8>, Option<FileId>)> {
    let (file, len) = open_regular(path)?;
    let before = file.metadata().ok().map(|m| FileId::of(&m));
    let mut data = Vec::with_capacity(len as usize);
    (&file).take(MAX_FILE + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_FILE {
        return Err(too_big(data.len() as u64));
    }
    let after = file.metadata().ok().map(|m| FileId::of(&m));
    let id = before.filter(|b| Some(*b) == after && b.size == data.len() as u64);
    Ok((data, id))
}

fn too_big(len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {:.1} GiB, more than the {} GiB tp reads", len as f64 / (1u64 << 30) as f64, MAX_FILE >> 30),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened() {
        let exe = std::env::current_exe().unwrap();
        assert!(read_regular(&exe).unwrap().starts_with(b"\x7fELF"));
        for (path, what) in [("/dev/zero", "character device"), ("/", "directory"), ("/proc/self", "directory")] {
            let err = read_regular(Path::new(path)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{path}");
            assert!(err.to_string().contains(what), "{path}: {err}");
        }
        assert_eq!(read_regular(Path::new("/nonexistent/x")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_file_read_has_the_identity_stat_gives() {
        let exe = std::env::current_exe().unwrap();
        let (data, id) = read_identified(&exe).unwrap();
        let id = id.expect("the test binary does not change while it runs");
        assert_eq!(id, FileId::of(&std::fs::metadata(&exe).unwrap()));
        assert_eq!(id.size, data.len() as u64);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!(!id.settled(id.ctime.0) && id.settled(now.max(id.ctime.0 + 3)));
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("tp-fifo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        let err = read_regular(&fifo).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn sizes_are_bounded() {
        let dir = std::env::temp_dir().join(format!("tp-size-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("sparse");
        File::create(&big).unwrap().set_len(MAX_FILE + 1).unwrap();
        let err = read_regular(&big).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.to_string().contains("more than the 4 GiB"), "{err}");
    }
}
