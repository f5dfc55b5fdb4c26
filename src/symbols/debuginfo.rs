//! Separate debug information: the `.debug` file that distributions ship in
//! `-dbg`/`-dbgsym` packages, found by build-id under
//! `/usr/lib/debug/.build-id/xx/yyyy.debug`, or by `.gnu_debuglink` next to
//! the file, in its `.debug/` directory, or under `/usr/lib/debug/<dir>/`.
//!
//! `TP_DEBUG_DIRS` (colon-separated) replaces `/usr/lib/debug` as the list of
//! global debug directories, as gdb's `debug-file-directory` does. When none
//! of those has it, the debuginfod servers of `DEBUGINFOD_URLS` are asked by
//! build-id ([`crate::debuginfod`]); what a server sends is used only if it
//! parses as ELF, has the same build-id, and has symbols or DWARF.

use std::path::{Path, PathBuf};

use super::elf::{ElfFile, crc32};

/// The global debug directories.
pub fn debug_dirs() -> Vec<PathBuf> {
    match std::env::var_os("TP_DEBUG_DIRS") {
        Some(v) => std::env::split_paths(&v).collect(),
        None => vec![PathBuf::from("/usr/lib/debug")],
    }
}

/// Finds and parses the separate debug file of `elf`, whose path is `path`
/// as the process sees it, reading files under `root` (`/`, or
/// `/proc/PID/root` to see the target's mount namespace).
pub fn find(elf: &ElfFile, path: &Path, root: &Path) -> Option<ElfFile> {
    candidates(elf, path, root)
        .into_iter()
        .find_map(|c| open_matching(&c.path, elf, c.crc))
        .or_else(|| fetch(elf, path))
}

/// A place the debug file of a file may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Where.
    pub path: PathBuf,
    /// The CRC-32 its contents must have (a `.gnu_debuglink` candidate of a
    /// file without build-id), or None (it must have the same build-id).
    pub crc: Option<u32>,
}

/// Where [`find`] looks for the debug file of `elf`, in order: by build-id
/// under each debug directory (in the target's root, then tp's), then by
/// `.gnu_debuglink` next to the file, in its `.debug/`, and under each
/// debug directory.
pub fn candidates(elf: &ElfFile, path: &Path, root: &Path) -> Vec<Candidate> {
    candidates_for(elf.build_id.as_deref(), elf.debuglink.as_ref(), path, root)
}

/// [`candidates`] for a file of build-id `build_id` and debuglink `debuglink`.
pub fn candidates_for(
    build_id: Option<&[u8]>,
    debuglink: Option<&(String, u32)>,
    path: &Path,
    root: &Path,
) -> Vec<Candidate> {
    let under_root = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let dirs = debug_dirs();
    let mut out = Vec::new();
    if let Some(id) = build_id
        && id.len() >= 2
    {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let rel = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        for d in &dirs {
            for path in [under_root(&d.join(&rel)), d.join(&rel)] {
                out.push(Candidate { path, crc: None });
            }
        }
    }
    if let Some((name, crc)) = debuglink {
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut paths = vec![under_root(&dir.join(name)), under_root(&dir.join(".debug").join(name))];
        for d in &dirs {
            let rel = dir.strip_prefix("/").unwrap_or(dir).join(name);
            paths.push(under_root(&d.join(&rel)));
            paths.push(d.join(&rel));
        }
        out.extend(
            paths.into_iter().filter(|c| *c != under_root(path)).map(|path| Candidate { path, crc: Some(*crc) }),
        );
    }
    out
}

/// The debug file of `elf` (the file `path`) from a debuginfod server.
fn fetch(elf: &ElfFile, path: &Path) -> Option<ElfFile> {
    let id = elf.build_id.as_ref()?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let from = PathBuf::from(format!("debuginfod:{name}"));
    let accept = |data: Vec<u8>| -> Result<ElfFile, String> {
        let dbg = ElfFile::parse(data, &from, &from).map_err(|e| format!("{e:#}"))?;
        if dbg.build_id.as_ref() != Some(id) {
            return Err("another build-id".into());
        }
        if !dbg.has_symtab && !dbg.has_dwarf() {
            return Err("neither symbols nor DWARF".into());
        }
        Ok(dbg)
    };
    crate::debuginfod::fetch(id, &name, &accept, &|dbg: &ElfFile| dbg.data())
}

/// Opens `candidate` if it is the debug file of `elf`: same build-id, or
/// (without build-ids) the CRC that the debuglink records.
fn open_matching(candidate: &Path, elf: &ElfFile, crc: Option<u32>) -> Option<ElfFile> {
    let data = crate::process::files::read_regular(candidate).ok()?;
    if let Some(want) = crc
        && elf.build_id.is_none()
        && crc32(&data) != want
    {
        return None;
    }
    let dbg = ElfFile::parse(data, candidate, candidate).ok()?;
    match (&elf.build_id, &dbg.build_id) {
        (Some(a), Some(b)) if a != b => None,
        _ => Some(dbg),
    }
}

// It reads the x86-64 libc and its libc6-dbg file.
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_debug_file_by_build_id() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let elf = ElfFile::open(libc, libc).unwrap();
        assert!(!elf.has_symtab, "Debian's libc is stripped");
        let dbg = find(&elf, libc, Path::new("/")).expect("libc6-dbg is installed (see .ci/run)");
        assert_eq!(dbg.build_id, elf.build_id);
        assert!(dbg.has_symtab && dbg.has_dwarf());
        // The debug file knows static functions the dynamic symbol table does not.
        assert!(dbg.functions.iter().any(|f| f.name == "_int_malloc"));
        assert!(!elf.functions.iter().any(|f| f.name == "_int_malloc"));
    }
}
