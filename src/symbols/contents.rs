//! The bytes of a file tp parses, read whole or a block at a time as they
//! are asked for. A module whose analysis comes from the cache needs only
//! its headers and the code of the functions it probes: reading those few
//! blocks of a 9 MB executable instead of all of it is most of what a
//! cached attach costs.
//!
//! Blocks land in an anonymous mapping of the file's size (untouched pages
//! cost nothing), each read once and never written again, so the slices
//! handed out stay valid while other blocks are read. The file is the
//! target's: after every read the descriptor's identity ([`FileId`]) must
//! still be the one the file had when opened, else the contents are
//! treated as changed and nothing more is handed out: what was derived from
//! the file before (a cached analysis) would not describe what is read now.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::process::files::FileId;

/// Bytes read at a time.
const BLOCK: usize = 64 << 10;

/// A file's bytes.
pub struct Contents {
    /// An anonymous mapping of `len` bytes (none when `len` is 0).
    ptr: *mut u8,
    len: usize,
    source: Option<Source>,
    /// Blocks read so far (all of them for contents made from bytes).
    loaded: Mutex<Vec<bool>>,
    /// True once every block is read.
    whole: AtomicBool,
    /// True once the file was seen to change: nothing more is handed out.
    changed: AtomicBool,
}

/// Where blocks not read yet come from.
struct Source {
    file: File,
    identity: FileId,
}

// SAFETY: the mapping is owned by this value; bytes of a block are written
// only before the block is marked loaded (under the mutex), and only the
// bytes of loaded blocks are ever handed out, so no reference aliases a write.
unsafe impl Send for Contents {}
// SAFETY: as above; the mutex orders every write and the loaded flags.
unsafe impl Sync for Contents {}

impl std::fmt::Debug for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contents").field("len", &self.len).field("whole", &self.whole).finish_non_exhaustive()
    }
}

impl Contents {
    /// Contents of `len` bytes with nothing read yet, or None if no memory.
    fn empty(len: usize) -> Option<Contents> {
        let ptr = if len == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: an anonymous private mapping; the result is checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            p.cast::<u8>()
        };
        Some(Contents {
            ptr,
            len,
            source: None,
            loaded: Mutex::new(vec![false; len.div_ceil(BLOCK)]),
            whole: AtomicBool::new(len == 0),
            changed: AtomicBool::new(false),
        })
    }

    /// Contents that are `data`.
    pub fn of(data: &[u8]) -> Contents {
        let c = Contents::empty(data.len()).expect("memory for a file's bytes");
        if !data.is_empty() {
            // SAFETY: the mapping is `len` bytes, nothing refers into it yet.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), c.ptr, data.len()) };
        }
        c.loaded.lock().unwrap_or_else(|e| e.into_inner()).fill(true);
        c.whole.store(true, Ordering::Release);
        c
    }

    /// The contents of `file`, `len` bytes long, whose identity was
    /// `identity` when it was opened; nothing read yet.
    pub fn lazy(file: File, identity: FileId, len: usize) -> std::io::Result<Contents> {
        let mut c = Contents::empty(len).ok_or_else(std::io::Error::last_os_error)?;
        c.source = Some(Source { file, identity });
        Ok(c)
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if the file changed after it was opened (see the module doc).
    pub fn changed(&self) -> bool {
        self.changed.load(Ordering::Acquire)
    }

    /// Reads the blocks holding `[off, off + len)` that are not read yet;
    /// false if they are not there or the file changed.
    pub fn ensure(&self, off: usize, len: usize) -> bool {
        let Some(end) = off.checked_add(len).filter(|&e| e <= self.len) else { return false };
        if self.changed() {
            return false;
        }
        if self.whole.load(Ordering::Acquire) || len == 0 {
            return true;
        }
        let Some(src) = &self.source else { return true };
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let (first, last) = (off / BLOCK, (end - 1) / BLOCK);
        let mut k = first;
        while k <= last {
            if loaded[k] {
                k += 1;
                continue;
            }
            // Runs of blocks not read yet, one read each.
            let run_end = (k..=last).find(|&j| loaded[j]).unwrap_or(last + 1);
            let (from, to) = (k * BLOCK, (run_end * BLOCK).min(self.len));
            // SAFETY: these blocks are not loaded, so nothing refers to
            // their bytes; the mutex is held; the range lies in the mapping.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(from), to - from) };
            let ok = src.file.read_exact_at(buf, from as u64).is_ok()
                && src.file.metadata().is_ok_and(|m| FileId::of(&m) == src.identity);
            if !ok {
                self.changed.store(true, Ordering::Release);
                return false;
            }
            loaded[k..run_end].fill(true);
            k = run_end;
        }
        if loaded.iter().all(|&l| l) {
            self.whole.store(true, Ordering::Release);
        }
        true
    }

    /// The bytes `[off, off + len)`, read if need be; None if they are not
    /// in the file or it changed.
    pub fn get(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.ensure(off, len) {
            return None;
        }
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: ensured: every block of the range is loaded and is never
        // written again while `self` lives.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) })
    }

    /// All of it, read if need be; empty if the file changed.
    pub fn all(&self) -> &[u8] {
        self.get(0, self.len).unwrap_or_default()
    }
}

impl Drop for Contents {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: the mapping made in `empty`, no longer referred to.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_read_as_asked_and_agree_with_the_file() {
        let exe = std::env::current_exe().unwrap();
        let whole = std::fs::read(&exe).unwrap();
        let file = File::open(&exe).unwrap();
        let id = FileId::of(&file.metadata().unwrap());
        let c = Contents::lazy(file, id, whole.len()).unwrap();
        assert_eq!(c.get(0, 4), Some(&whole[..4]));
        let mid = whole.len() / 2;
        assert_eq!(c.get(mid - 10, 3 * BLOCK), Some(&whole[mid - 10..mid - 10 + 3 * BLOCK]));
        let first = c.get(0, 64).unwrap();
        assert_eq!(c.get(whole.len() - 5, 5), Some(&whole[whole.len() - 5..]));
        assert_eq!(first, &whole[..64], "earlier slices stay valid");
        assert_eq!(c.get(whole.len(), 1), None);
        assert_eq!(c.get(usize::MAX, 2), None);
        assert_eq!(c.all(), &whole[..]);
        assert_eq!(Contents::of(b"abc").all(), b"abc");
        assert!(Contents::of(b"").all().is_empty());
    }

    #[test]
    fn a_file_that_changes_is_read_no_more() {
        let path = std::env::temp_dir().join(format!("tp-contents-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 4 * BLOCK]).unwrap();
        let file = File::open(&path).unwrap();
        let id = FileId::of(&file.metadata().unwrap());
        let c = Contents::lazy(file, id, 4 * BLOCK).unwrap();
        assert_eq!(c.get(0, 10), Some(&[7u8; 10][..]));
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[1], 3 * BLOCK as u64).unwrap();
        assert_eq!(c.get(3 * BLOCK, 10), None, "the identity moved on");
        assert!(c.changed());
        assert_eq!(c.get(0, 10), None, "nothing more is handed out");
        assert!(c.all().is_empty());
        std::fs::remove_file(&path).unwrap();
    }
}
