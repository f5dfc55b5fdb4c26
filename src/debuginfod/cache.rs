//! The cache of downloaded debug files: `$XDG_CACHE_HOME/tp/debuginfod/`
//! (`$HOME/.cache/...` without it), one `<build-id>.debug` per file.
//!
//! tp often runs as root, maybe with a `HOME` that a user owns, so the
//! cache is reached one directory at a time from `/` with `O_NOFOLLOW`
//! (a symlink anywhere on the way, planted or not, leaves the cache unused)
//! and every file in it is opened relative to the directory tp holds open.
//! The directory must belong to tp's effective user and be writable by
//! nobody else; what tp creates is mode 0700 (directories) and 0600
//! (files). A download goes to a temporary file created with `O_EXCL` and
//! is renamed over its name once whole, so concurrent tp processes never
//! see half a file (the last rename wins; both are the same file). A file
//! read back is a regular file of tp's user, of bounded size, and its
//! contents are checked by the caller (an ELF file with the build-id asked
//! for) before use; one that fails is deleted.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The largest debug file tp keeps.
pub const MAX_FILE: u64 = crate::debuginfod::MAX_BODY;
/// Temporary files older than this were left by a tp that died.
const STALE: Duration = Duration::from_secs(24 * 3600);

/// The cache directory, held open.
#[derive(Debug)]
pub struct Cache {
    dir: OwnedFd,
    /// Where it is, for messages.
    pub path: PathBuf,
}

/// The user's cache directory: `$XDG_CACHE_HOME` if it is absolute, else
/// `$HOME/.cache`.
pub fn base() -> Option<PathBuf> {
    match std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from) {
        Some(p) if p.is_absolute() => Some(p),
        _ => std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute()).map(|h| h.join(".cache")),
    }
}

fn c_name(name: &str) -> Result<CString, String> {
    CString::new(name).map_err(|_| "a NUL in a path".to_string())
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `openat(dir, name, flags, mode)` as an owned descriptor.
fn open_at(dir: &OwnedFd, name: &str, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let c = c_name(name).map_err(std::io::Error::other)?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW, mode) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: openat returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: fstat writes the struct it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a writable struct.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn euid() -> u32 {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() }
}

impl Cache {
    /// The cache under the user's cache directory ([`base`]), created if
    /// need be; or why there is none.
    pub fn open() -> Result<Cache, String> {
        let base = base().ok_or("neither XDG_CACHE_HOME nor HOME names a directory")?;
        Cache::open_in(&base)
    }

    /// The cache `base/tp/debuginfod`: each directory on the way opened
    /// without following a symlink, missing ones created (mode 0700).
    pub fn open_in(base: &Path) -> Result<Cache, String> {
        let path = base.join("tp").join("debuginfod");
        let fail = |what: String| format!("the cache `{}` is not used: {what}", path.display());
        // SAFETY: a NUL-terminated path.
        let root = unsafe { libc::open(c"/".as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC) };
        if root < 0 {
            return Err(fail(errno().to_string()));
        }
        // SAFETY: a new descriptor we own.
        let mut dir = unsafe { OwnedFd::from_raw_fd(root) };
        let mut walked = PathBuf::from("/");
        for c in path.components() {
            let name = match c {
                Component::RootDir => continue,
                Component::Normal(n) => n.to_str().ok_or_else(|| fail("a name that is not UTF-8".into()))?,
                _ => return Err(fail("`.` or `..` in it".into())),
            };
            walked.push(name);
            let flags = libc::O_DIRECTORY | libc::O_RDONLY;
            let next = match open_at(&dir, name, flags, 0) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let c = c_name(name).map_err(fail)?;
                    // SAFETY: a valid descriptor and a NUL-terminated name.
                    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o700) } != 0
                        && errno().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(fail(format!("cannot create `{}`: {}", walked.display(), errno())));
                    }
                    open_at(&dir, name, flags, 0).map_err(|e| fail(format!("`{}`: {e}", walked.display())))?
                }
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                    return Err(fail(format!("`{}` is a symlink or not a directory", walked.display())));
                }
                Err(e) => return Err(fail(format!("`{}`: {e}", walked.display()))),
            };
            dir = next;
        }
        let st = stat(&dir).map_err(|e| fail(e.to_string()))?;
        if st.st_uid != euid() {
            return Err(fail(format!("it belongs to user {}, not to user {}", st.st_uid, euid())));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(fail(format!("others may write it (mode {:o})", st.st_mode & 0o777)));
        }
        let cache = Cache { dir, path };
        cache.sweep();
        Ok(cache)
    }

    /// The file `name` of the cache, if it is a regular file of tp's user
    /// of at most [`MAX_FILE`] bytes.
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        let fd = open_at(&self.dir, name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0).ok()?;
        let st = stat(&fd).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != euid() || st.st_size as u64 > MAX_FILE {
            return None;
        }
        let mut data = Vec::with_capacity(st.st_size as usize);
        File::from(fd).take(MAX_FILE + 1).read_to_end(&mut data).ok()?;
        (data.len() as u64 <= MAX_FILE).then_some(data)
    }

    /// Deletes `name` (a file that failed its checks).
    pub fn remove(&self, name: &str) {
        if let Ok(c) = c_name(name) {
            // SAFETY: a valid descriptor and a NUL-terminated name.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    /// A new temporary file in the cache (created, never opened if it
    /// existed), and its name.
    pub fn temp(&self) -> Result<(File, String), String> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!(".tmp-{}-{nanos}-{k}", std::process::id());
        let fd = open_at(&self.dir, &name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
            .map_err(|e| format!("cannot create a file in `{}`: {e}", self.path.display()))?;
        Ok((File::from(fd), name))
    }

    /// Renames the temporary file `temp` to `name`, over any file of that name.
    pub fn commit(&self, temp: &str, name: &str) -> Result<(), String> {
        let (a, b) = (c_name(temp)?, c_name(name)?);
        let d = self.dir.as_raw_fd();
        // SAFETY: valid descriptors and NUL-terminated names.
        if unsafe { libc::renameat(d, a.as_ptr(), d, b.as_ptr()) } != 0 {
            let e = errno();
            self.remove(temp);
            return Err(format!("cannot keep the debug file in `{}`: {e}", self.path.display()));
        }
        Ok(())
    }

    /// Deletes temporary files that a tp which died left behind.
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", self.dir.as_raw_fd())) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str().filter(|n| n.starts_with(".tmp-")) else { continue };
            let old = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            if old.is_some_and(|age| age > STALE) {
                self.remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(what: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tp-cache-test-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn files_are_written_whole_and_read_back() {
        let base = scratch("rw");
        let cache = Cache::open_in(&base).unwrap();
        assert_eq!(cache.path, base.join("tp/debuginfod"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&cache.path).unwrap().permissions().mode() & 0o777, 0o700);
        let (mut f, temp) = cache.temp().unwrap();
        f.write_all(b"\x7fELF...").unwrap();
        assert_eq!(cache.get("ab.debug"), None, "nothing under its name before the rename");
        cache.commit(&temp, "ab.debug").unwrap();
        assert_eq!(cache.get("ab.debug").as_deref(), Some(&b"\x7fELF..."[..]));
        assert_eq!(cache.get(&temp), None);
        cache.remove("ab.debug");
        assert_eq!(cache.get("ab.debug"), None);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn symlinks_are_never_followed() {
        let base = scratch("links");
        let elsewhere = scratch("elsewhere");
        // A planted link for the cache's own directory...
        std::fs::create_dir_all(base.join("tp")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, base.join("tp/debuginfod")).unwrap();
        let err = Cache::open_in(&base).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        // ... and for a file in it.
        std::fs::remove_file(base.join("tp/debuginfod")).unwrap();
        let cache = Cache::open_in(&base).unwrap();
        std::fs::write(elsewhere.join("secret"), b"not for tp").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("secret"), cache.path.join("cd.debug")).unwrap();
        assert_eq!(cache.get("cd.debug"), None);
        // A link where a temporary file would go is not written through.
        std::os::unix::fs::symlink(elsewhere.join("target"), cache.path.join(".tmp-x")).unwrap();
        assert!(open_at(&cache.dir, ".tmp-x", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600).is_err());
        assert!(!elsewhere.join("target").exists());
        // A directory others may write is not used.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cache.path, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Cache::open_in(&base).unwrap_err().contains("others may write"));
        std::fs::remove_dir_all(&base).unwrap();
        std::fs::remove_dir_all(&elsewhere).unwrap();
    }
}
