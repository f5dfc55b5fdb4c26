//! Getting hold of a region's memfd in a way the target cannot redirect.
//!
//! tp runs as root; the target may belong to anyone. Opening a path that
//! names something of the target's (`/proc/PID/fd/N`, `/proc/PID/map_files/…`)
//! opens the file *anew, with root's rights*, and the target's threads run
//! meanwhile: a thread that swaps descriptor N for a read-only root-owned
//! file between the target's `memfd_create` and tp's open would get root to
//! write tp's header into that file. So:
//!
//! - A region tp creates ([`take_new`]) is taken with `pidfd_getfd(2)`: a
//!   copy of the target's own descriptor, with the target's own access mode,
//!   never reopened. tp then checks by identity that it is a memfd named
//!   `tp-data` (only shmem answers `F_GET_SEALS`; a memfd has no links),
//!   sizes it and seals it against shrinking and growing (and against new
//!   seals) before it maps it, so no later `ftruncate` can make tp's
//!   accesses fault. After the target maps the descriptor, [`check_mapped`]
//!   checks that the target's mapping is that very inode.
//! - An existing region ([`open_existing`]) is opened only if its mapping is
//!   shared and writable by the target (so the target could write the file
//!   itself), the path opened with `O_PATH` is the mapping's inode, and the
//!   memfd is sealed against shrinking with at least the mapping's size.
//!   Otherwise tp does not map it and goes through `/proc/PID/mem`, which
//!   writes the target's memory only, with the target's own permissions.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use anyhow::{Context, Result, bail};

use super::layout::MEMFD_NAME;
use crate::process::{self, Mapping, files};

/// The seals a region carries: its size is fixed, and nothing more can be sealed.
pub const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Takes descriptor `fd` of process `pid`, which the target just got from
/// `memfd_create("tp-data", MFD_ALLOW_SEALING)`, checks that it is such a
/// memfd, sizes it to `len` bytes and seals it ([`SEALS`]).
pub fn take_new(pid: i32, fd: u64, len: u64) -> Result<File> {
    let swapped = |what: String| {
        anyhow::anyhow!(
            "descriptor {fd} of process {pid} is not the memfd tp had it create ({what}): something in the process \
             replaced it; tp refuses to use it"
        )
    };
    let file = match pidfd_getfd(pid, fd) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => return Err(swapped("it was closed".into())),
        Err(e) => return Err(getfd_error(e)),
        Ok(file) => file,
    };
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap_or_default();
    let name = name.to_string_lossy();
    if name != format!("/memfd:{MEMFD_NAME} (deleted)") {
        return Err(swapped(format!("it is `{name}`")));
    }
    let meta = file.metadata().context("fstat of tp's new memfd")?;
    if !meta.file_type().is_file() || meta.nlink() != 0 || seals(&file).is_none() {
        return Err(swapped("it is not a memfd".into()));
    }
    if meta.len() != 0 {
        return Err(swapped(format!("it already holds {} bytes", meta.len())));
    }
    file.set_len(len).map_err(|e| swapped(format!("it cannot be sized: {e}")))?;
    // SAFETY: fcntl(2) on a descriptor we own.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(swapped(format!("it cannot be sealed: {}", std::io::Error::last_os_error())));
    }
    let meta = file.metadata().context("fstat of tp's new memfd")?;
    if meta.len() != len || seals(&file).is_none_or(|s| s & SEALS != SEALS) {
        return Err(swapped("its size or seals changed".into()));
    }
    Ok(file)
}

/// Checks that process `pid` maps `file` (from [`take_new`]) at `addr`:
/// one shared, writable mapping of `len` bytes from offset 0 of that inode.
pub fn check_mapped(pid: i32, file: &File, addr: u64, len: u64) -> Result<()> {
    let meta = file.metadata().context("fstat of tp's memfd")?;
    let maps = process::read_maps(pid).context("reading the target's memory map")?;
    let ok = maps.iter().any(|m| {
        m.start == addr
            && m.len() == len
            && m.shared
            && m.read
            && m.write
            && m.offset == 0
            && (m.dev, m.inode) == (meta.dev(), meta.ino())
    });
    if !ok {
        bail!(
            "process {pid} does not map tp's memfd where tp had it mapped ({addr:#x}): something in the process \
             replaced its descriptor; tp refuses to use it"
        );
    }
    Ok(())
}

/// The memfd behind `mapping` (a region found in process `pid`), opened for
/// reading and writing, if it is safe to map: see the module's doc. None
/// means: read and write it through the target's memory instead.
pub fn open_existing(pid: i32, mapping: &Mapping) -> Option<File> {
    if !(mapping.shared && mapping.read && mapping.write && mapping.offset == 0) {
        return None;
    }
    let path = format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end);
    // Needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) besides ptrace access.
    let (handle, meta) = files::open_path(path.as_ref()).ok()?;
    if !meta.file_type().is_file() || (meta.dev(), meta.ino()) != (mapping.dev, mapping.inode) {
        return None;
    }
    let file = files::reopen(&handle, true).ok()?;
    let meta = file.metadata().ok()?;
    let sealed = seals(&file).is_some_and(|s| s & libc::F_SEAL_SHRINK != 0);
    let same = (meta.dev(), meta.ino()) == (mapping.dev, mapping.inode);
    (sealed && same && meta.len() >= mapping.len()).then_some(file)
}

/// The seals of `file`; None if it cannot have any (it is not shmem).
pub fn seals(file: &File) -> Option<libc::c_int> {
    // SAFETY: fcntl(2) on a descriptor we own.
    let s = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    (s >= 0).then_some(s)
}

/// A copy of descriptor `fd` of process `pid` (pidfd_open, pidfd_getfd).
fn pidfd_getfd(pid: i32, fd: u64) -> std::io::Result<File> {
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: raw syscalls with integer arguments; each result is checked
    // and owned exactly once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(File::from_raw_fd(got as i32))
    }
}

fn getfd_error(e: std::io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        return anyhow::anyhow!("tp needs Linux 5.6 or later (pidfd_getfd) to take its data region safely");
    }
    anyhow::Error::new(e).context("taking tp's memfd from the target (pidfd_getfd)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::memfd::{MFdFlags, memfd_create};

    fn own_fd(file: &File) -> u64 {
        file.as_raw_fd() as u64
    }

    #[test]
    fn a_fresh_memfd_is_taken_sized_and_sealed() {
        let me = std::process::id() as i32;
        let mine = File::from(memfd_create(c"tp-data", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap());
        let taken = take_new(me, own_fd(&mine), 1 << 20).unwrap();
        assert_eq!(taken.metadata().unwrap().len(), 1 << 20);
        assert_eq!(seals(&taken).unwrap() & SEALS, SEALS);
        assert!(mine.set_len(4096).is_err(), "sealed against shrinking");
        assert!(mine.set_len(2 << 20).is_err(), "sealed against growing");
    }

    #[test]
    fn anything_else_is_refused() {
        let me = std::process::id() as i32;
        let other = File::from(memfd_create(c"other", MFdFlags::MFD_ALLOW_SEALING).unwrap());
        assert!(take_new(me, own_fd(&other), 4096).unwrap_err().to_string().contains("`/memfd:other (deleted)`"));
        let unsealable = File::from(memfd_create(c"tp-data", MFdFlags::empty()).unwrap());
        assert!(take_new(me, own_fd(&unsealable), 4096).unwrap_err().to_string().contains("cannot be sealed"));
        let exe = File::open(std::env::current_exe().unwrap()).unwrap();
        let err = take_new(me, own_fd(&exe), 4096).unwrap_err().to_string();
        assert!(err.contains("is not the memfd tp had it create"), "{err}");
        assert_eq!(exe.metadata().unwrap().len(), std::fs::metadata(std::env::current_exe().unwrap()).unwrap().len());
        assert!(take_new(me, 99_999, 4096).unwrap_err().to_string().contains("it was closed"));
    }
}
