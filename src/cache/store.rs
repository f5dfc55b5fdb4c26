//! The cache directory and its files: where it is, the checks that make it
//! the running user's own, and entries read bounded and checked, written
//! whole (a temporary file renamed into place), and evicted oldest first
//! when the directory grows past its bound.
//!
//! tp runs as root against processes it does not trust, and what it caches
//! is derived from their files; so the directory must be one only the user
//! running tp can write: every directory on its path is opened without
//! following symbolic links and must belong to root or that user, and only
//! a sticky directory (such as `/tmp`) may be writable by others on the way;
//! the cache directory itself and every entry read must belong to the user,
//! be writable by nobody else, and be a regular file of one link. Anything
//! else is no cache at all, never an error: a cache only saves time.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::codec::hash64;

/// What an entry starts with.
const MAGIC: &[u8; 8] = b"tp-cache";
/// The version of the entry format (the header below).
const FORMAT: u32 = 1;
/// Bytes of the header: magic, format, key length, payload length, payload hash.
const HEADER: usize = 8 + 4 + 4 + 8 + 8;
/// The largest entry tp writes or reads.
pub const MAX_ENTRY: u64 = 64 << 20;
/// The directory's bound: past it, the least recently used entries go.
pub const MAX_TOTAL: u64 = 256 << 20;
/// A temporary file older than this was left by a tp that died.
const STALE_TEMP: Duration = Duration::from_secs(600);

/// A cache directory that passed the checks.
#[derive(Debug)]
pub struct Store {
    dir: OwnedFd,
    path: PathBuf,
    max_total: u64,
}

impl Store {
    /// The cache of the user running tp: `$XDG_CACHE_HOME/tp`, else
    /// `$HOME/.cache/tp`, else under the home directory the password file
    /// gives the effective user; the first that passes the checks (missing
    /// directories are created, mode 0700). None when `TP_CACHE=off` or no
    /// candidate is safe.
    pub fn open() -> Option<Store> {
        if std::env::var_os("TP_CACHE").is_some_and(|v| v == "off") {
            return None;
        }
        let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        let mut candidates = Vec::new();
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").and_then(absolute) {
            candidates.push(x.join("tp"));
        }
        if let Some(h) = std::env::var_os("HOME").and_then(absolute) {
            candidates.push(h.join(".cache/tp"));
        }
        if let Some(h) = password_home() {
            candidates.push(h.join(".cache/tp"));
        }
        candidates.into_iter().find_map(|p| Store::at(&p).ok())
    }

    /// The cache directory `path` (absolute), created if missing, if it and
    /// the directories above it pass the checks (see the module doc).
    pub fn at(path: &Path) -> io::Result<Store> {
        let dir = secure_dir(path)?;
        Ok(Store { dir, path: path.to_path_buf(), max_total: MAX_TOTAL })
    }

    /// The same store with another bound on its total size (for tests).
    pub fn with_bound(mut self, max_total: u64) -> Store {
        self.max_total = max_total;
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The payload of entry `name` if it was saved under exactly `key` and
    /// is whole; None for a missing, foreign, damaged or oversized entry. A
    /// hit marks the entry as recently used.
    pub fn load(&self, name: &str, key: &[u8]) -> Option<Vec<u8>> {
        if !valid_name(name) {
            return None;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let fd = openat(&self.dir, name, flags, Mode::empty()).ok()?;
        let st = fstat(&fd).ok()?;
        if !owned_entry(&st) || st.st_size < HEADER as i64 || st.st_size as u64 > MAX_ENTRY {
            return None;
        }
        let mut data = Vec::with_capacity(st.st_size as usize);
        let file = File::from(fd);
        (&file).take(MAX_ENTRY + 1).read_to_end(&mut data).ok()?;
        let payload = unpack(&data, key)?;
        let now = TimeSpec::UTIME_NOW;
        let _ = futimens(&file, &now, &now);
        Some(payload.to_vec())
    }

    /// Saves `payload` as entry `name` under `key`: written to a temporary
    /// file of this directory and renamed over the entry, so that a reader
    /// sees the old entry or the new one, whole. Then evicts if the
    /// directory has grown past its bound.
    pub fn save(&self, name: &str, key: &[u8], payload: &[u8]) -> io::Result<()> {
        if !valid_name(name) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a cache entry name"));
        }
        let bytes = pack(key, payload);
        if bytes.len() as u64 > MAX_ENTRY {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "larger than a cache entry may be"));
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let tmp = format!(".tmp-{}-{}-{nanos}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.dir, tmp.as_str(), flags, Mode::from_bits_truncate(0o600))?;
        let written = File::from(fd).write_all(&bytes);
        let renamed = written.and_then(|()| Ok(renameat(&self.dir, tmp.as_str(), &self.dir, name)?));
        if renamed.is_err() {
            let _ = unlinkat(&self.dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        renamed?;
        self.evict();
        Ok(())
    }

    /// Removes temporary files that a dead tp left, and, while the entries
    /// add up to more than the bound, the least recently used ones, down to
    /// three quarters of it. Only names tp gives its files are touched.
    pub fn evict(&self) {
        let Ok(list) = std::fs::read_dir(format!("/proc/self/fd/{}", self.dir.as_raw_fd())) else { return };
        let now = SystemTime::now();
        let mut entries: Vec<(i64, u64, std::ffi::OsString)> = Vec::new();
        for e in list.flatten() {
            let name = e.file_name();
            let Ok(st) = fstatat(&self.dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
            if !owned_entry(&st) {
                continue;
            }
            if name.as_bytes().starts_with(b".tmp-") {
                let age = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64) - st.st_mtime;
                if age > STALE_TEMP.as_secs() as i64 {
                    let _ = unlinkat(&self.dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
                }
            } else if name.to_str().is_some_and(valid_name) {
                entries.push((st.st_mtime, st.st_size as u64, name));
            }
        }
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= self.max_total {
            return;
        }
        entries.sort();
        for (_, size, name) in entries {
            if total <= self.max_total / 4 * 3 {
                break;
            }
            if unlinkat(&self.dir, OsStr::new(&name), UnlinkatFlags::NoRemoveDir).is_ok() {
                total -= size;
            }
        }
    }
}

/// Entry names tp makes: `kind-0123456789abcdef` (lower-case letters, a
/// dash, 16 hex digits).
fn valid_name(name: &str) -> bool {
    let Some((kind, hex)) = name.split_once('-') else { return false };
    !kind.is_empty()
        && kind.len() <= 16
        && kind.bytes().all(|b| b.is_ascii_lowercase())
        && hex.len() == 16
        && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The entry name for `kind` and `key`.
pub fn name_for(kind: &str, key: &[u8]) -> String {
    format!("{kind}-{:016x}", hash64(key))
}

/// True for a regular file of one link that the effective user owns and
/// nobody else may write.
fn owned_entry(st: &FileStat) -> bool {
    let file = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG;
    file && st.st_nlink == 1 && st.st_uid == euid() && st.st_mode & 0o022 == 0
}

/// An entry's bytes: the header, the key, the payload.
fn pack(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + key.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&hash64(payload).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    out
}

/// The payload of entry bytes `data` saved under `key`: None unless the
/// header is tp's, the key is exactly `key`, the lengths add up to the
/// file's and the payload has the hash the header records.
fn unpack<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let (header, rest) = data.split_at_checked(HEADER)?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if &header[..8] != MAGIC || u32_at(8) != FORMAT || u32_at(12) as usize != key.len() {
        return None;
    }
    let (stored_key, payload) = rest.split_at_checked(key.len())?;
    if stored_key != key || payload.len() as u64 != u64_at(16) || hash64(payload) != u64_at(24) {
        return None;
    }
    Some(payload)
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The home directory the password file gives the effective user.
fn password_home() -> Option<PathBuf> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain old data; getpwuid_r writes into it and buf
    // (whose length it is given) and sets `found` to it or to null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let r = libc::getpwuid_r(euid(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found);
        if r != 0 || found.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr(pw.pw_dir);
        Some(PathBuf::from(OsStr::from_bytes(dir.to_bytes()))).filter(|p| p.is_absolute())
    }
}

/// Opens directory `path` component by component from `/`, never following
/// a symbolic link, creating missing directories (mode 0700): every
/// directory on the way must belong to root or the effective user and be
/// writable by no one else unless sticky; the last must belong to the
/// effective user and be writable by no one else at all.
fn secure_dir(path: &Path) -> io::Result<OwnedFd> {
    let refuse = |why: &str| io::Error::new(io::ErrorKind::PermissionDenied, format!("{}: {why}", path.display()));
    if !path.is_absolute() {
        return Err(refuse("not an absolute path"));
    }
    let names: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::ParentDir => Some(Err(())),
            _ => None,
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| refuse("has `..` in it"))?;
    let search = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir = nix::fcntl::open("/", search, Mode::empty())?;
    check_dir(&dir, false).map_err(|why| refuse(&format!("/ {why}")))?;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let next = match openat(&dir, *name, search, Mode::empty()) {
            Err(Errno::ENOENT) => {
                match mkdirat(&dir, *name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                openat(&dir, *name, search, Mode::empty())?
            }
            other => other?,
        };
        check_dir(&next, last).map_err(|why| refuse(&format!("{} {why}", name.to_string_lossy())))?;
        dir = next;
    }
    Ok(openat(&dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?)
}

/// Why directory `fd` may not be on the cache's path (`last`: be the cache).
fn check_dir(fd: &impl AsFd, last: bool) -> Result<(), String> {
    let st = fstat(fd).map_err(|e| e.to_string())?;
    let uid = euid();
    if last && st.st_uid != uid {
        return Err(format!("belongs to uid {}, not {uid}", st.st_uid));
    }
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(format!("belongs to uid {}", st.st_uid));
    }
    let others_write = st.st_mode & 0o022 != 0;
    let sticky = st.st_mode & 0o1000 != 0;
    if others_write && (last || !sticky) {
        return Err("is writable by other users".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tp-cache-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn an_entry_reads_back_only_under_its_key() {
        let dir = scratch("roundtrip");
        let store = Store::at(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let name = name_for("m", b"key one");
        store.save(&name, b"key one", b"the payload").unwrap();
        assert_eq!(store.load(&name, b"key one").as_deref(), Some(&b"the payload"[..]));
        assert_eq!(store.load(&name, b"key two"), None, "another key under the same name");
        assert_eq!(store.load(&name_for("m", b"absent"), b"absent"), None);
        assert_eq!(store.load("../../etc/passwd", b""), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_entries_are_misses() {
        let dir = scratch("damaged");
        let store = Store::at(&dir).unwrap();
        let name = name_for("m", b"k");
        store.save(&name, b"k", &[7u8; 1000]).unwrap();
        let path = dir.join(&name);
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        flipped[HEADER + 500] ^= 1;
        for bad in [&good[..good.len() - 1], &good[..10], &flipped[..], &[][..]] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(store.load(&name, b"k"), None, "{} bytes", bad.len());
        }
        std::fs::write(&path, &good).unwrap();
        assert!(store.load(&name, b"k").is_some());
        // Writable by others, or not a plain file: not read.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(store.load(&name, b"k"), None);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
        std::fs::write(dir.join("elsewhere"), &good).unwrap();
        assert_eq!(store.load(&name, b"k"), None, "a symbolic link is not followed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unsafe_directories_are_refused() {
        let dir = scratch("unsafe");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Store::at(&dir).is_err(), "writable by others");
        // Below a world-writable directory that is not sticky.
        assert!(Store::at(&dir.join("tp")).is_err());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(Store::at(&dir.join("tp")).is_ok(), "below a sticky directory, as in /tmp");
        let link = dir.join("link");
        std::os::unix::fs::symlink(dir.join("tp"), &link).unwrap();
        assert!(Store::at(&link).is_err(), "a symbolic link on the path");
        assert!(Store::at(Path::new("relative/tp")).is_err());
        assert!(Store::at(&dir.join("tp/../tp")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_directory_stays_within_its_bound() {
        let dir = scratch("bound");
        let store = Store::at(&dir).unwrap().with_bound(10_000);
        for i in 0..20u32 {
            let key = i.to_le_bytes();
            store.save(&name_for("m", &key), &key, &[0u8; 1000]).unwrap();
        }
        let total: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(total <= 10_000, "{total} bytes");
        // The newest entry survived.
        let key = 19u32.to_le_bytes();
        assert!(store.load(&name_for("m", &key), &key).is_some());
        // A file tp did not name is left alone.
        std::fs::write(dir.join("README"), [0u8; 20_000]).unwrap();
        store.evict();
        assert!(dir.join("README").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entry_names_are_tps_own() {
        assert!(valid_name(&name_for("module", b"x")));
        for bad in ["", "m", "m-", "M-0123456789abcdef", "m-0123456789abcdeg", ".tmp-1-2-3", "m-0123456789abcdef0"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
