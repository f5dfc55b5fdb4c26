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
    let (file, len) = open_regular(path)?;
    let mut data = Vec::with_capacity(len as usize);
    file.take(MAX_FILE + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_FILE {
        return Err(too_big(data.len() as u64));
    }
    Ok(data)
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
