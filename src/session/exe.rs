//! Every process of one file (`tp attach --exe PATH`): which processes run
//! it now, and whether a process that just exec'd will. A file is a
//! program (its processes run it: `/proc/PID/exe`) or a shared library
//! (its processes map it; a process starting now will if its program names
//! the library among the ones it needs, `DT_NEEDED`). Files are told apart
//! by device and inode, so a copy or a file of the same name elsewhere is
//! not the same program.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::escape::text;
use crate::process;
use crate::symbols::elf::Opened;

/// The most program headers tp reads of a file.
const MAX_PHDRS: usize = 256;

/// The most bytes of a dynamic section, and of its string table, tp reads.
const MAX_DYNAMIC: usize = 1 << 20;

/// One file whose processes a session follows.
#[derive(Debug, Clone)]
pub struct ExeFile {
    /// The path the user gave.
    pub path: PathBuf,
    dev: u64,
    ino: u64,
    /// For a shared library: the names programs need it by (its soname and
    /// its file name).
    library: Option<Vec<String>>,
}

impl ExeFile {
    /// The file at `path`: an ELF program or shared library.
    pub fn open(path: &Path) -> Result<ExeFile> {
        let shown = path.display().to_string();
        let shown = text(&shown);
        let meta = std::fs::metadata(path).with_context(|| format!("--exe {shown}"))?;
        if !meta.is_file() {
            bail!("--exe {shown}: not a file; name the program's file (`which NAME` finds it)");
        }
        let Some(dynamic) = Dynamic::of(path) else { bail!("--exe {shown}: not an ELF file tp can read") };
        let library = match dynamic.shared && (dynamic.soname.is_some() || !dynamic.interp) {
            true => {
                let mut names: Vec<String> = dynamic.soname.into_iter().collect();
                if let Some(name) = path.file_name() {
                    names.push(name.to_string_lossy().into_owned());
                }
                Some(names)
            }
            false => None,
        };
        Ok(ExeFile { path: path.to_path_buf(), dev: meta.dev(), ino: meta.ino(), library })
    }

    /// True if it is a shared library rather than a program.
    pub fn is_library(&self) -> bool {
        self.library.is_some()
    }

    /// True if process `pid` runs this program or maps this library now.
    pub fn in_process(&self, pid: i32) -> bool {
        if self.runs(pid) {
            return true;
        }
        self.is_library()
            && process::read_maps(pid).is_ok_and(|maps| maps.iter().any(|m| m.inode == self.ino && m.dev == self.dev))
    }

    /// True if process `pid`, which has just exec'd, runs this program, or
    /// runs a program that needs this library.
    pub fn in_new_process(&self, pid: i32) -> bool {
        if self.runs(pid) {
            return true;
        }
        let Some(names) = &self.library else { return false };
        let Some(program) = Dynamic::of(Path::new(&format!("/proc/{pid}/exe"))) else { return false };
        program.needed.iter().any(|l| names.contains(l))
    }

    fn runs(&self, pid: i32) -> bool {
        std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
    }

    /// The processes (but this one) that run or map it now, in PID order.
    pub fn processes(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = process::other_pids().into_iter().filter(|&p| self.in_process(p)).collect();
        pids.sort_unstable();
        pids
    }
}

/// What the dynamic section of an ELF file says of the libraries it
/// needs and is: read from its headers alone (the file may be a large
/// program of the target's; its bytes are untrusted and bounded).
#[derive(Debug, Default)]
struct Dynamic {
    /// ET_DYN: a shared library or a position-independent program.
    shared: bool,
    /// It names a dynamic linker (PT_INTERP): a program.
    interp: bool,
    soname: Option<String>,
    needed: Vec<String>,
}

impl Dynamic {
    /// The dynamic facts of the 64-bit little-endian ELF file at `path`;
    /// None if it is not one or its headers do not hold.
    fn of(path: &Path) -> Option<Dynamic> {
        let opened = Opened::open(path, path).ok()?;
        let c = &opened.contents;
        let u16_at = |b: &[u8], o: usize| b.get(o..o + 2).map(|w| u16::from_le_bytes([w[0], w[1]]));
        let u32_at = |b: &[u8], o: usize| b.get(o..o + 4).map(|w| u32::from_le_bytes(w.try_into().unwrap()));
        let u64_at = |b: &[u8], o: usize| b.get(o..o + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap()));
        let h = c.get(0, 64)?;
        // ELFCLASS64, ELFDATA2LSB.
        if h[..4] != *b"\x7fELF" || h[4] != 2 || h[5] != 1 {
            return None;
        }
        let shared = u16_at(h, 16)? == goblin::elf::header::ET_DYN;
        let (phoff, phentsize, phnum) = (u64_at(h, 32)? as usize, u16_at(h, 54)? as usize, u16_at(h, 56)? as usize);
        if phentsize < 56 || phnum > MAX_PHDRS {
            return None;
        }
        let ph = c.get(phoff, phentsize.checked_mul(phnum)?)?;
        // (type, offset, vaddr, filesz) of each program header.
        let phdrs: Vec<(u32, u64, u64, u64)> = (0..phnum)
            .filter_map(|i| {
                let at = i * phentsize;
                Some((u32_at(ph, at)?, u64_at(ph, at + 8)?, u64_at(ph, at + 16)?, u64_at(ph, at + 32)?))
            })
            .collect();
        use goblin::elf::program_header::{PT_DYNAMIC, PT_INTERP, PT_LOAD};
        let interp = phdrs.iter().any(|p| p.0 == PT_INTERP);
        let mut out = Dynamic { shared, interp, ..Dynamic::default() };
        let Some(&(_, dyn_off, _, dyn_size)) = phdrs.iter().find(|p| p.0 == PT_DYNAMIC) else { return Some(out) };
        let dynamic = c.get(dyn_off as usize, (dyn_size as usize).min(MAX_DYNAMIC))?;
        let entries: Vec<(u64, u64)> = dynamic
            .chunks_exact(16)
            .map(|e| (u64_at(e, 0).unwrap_or(0), u64_at(e, 8).unwrap_or(0)))
            .take_while(|&(tag, _)| tag != goblin::elf::dynamic::DT_NULL)
            .collect();
        let value = |tag: u64| entries.iter().find(|e| e.0 == tag).map(|e| e.1);
        use goblin::elf::dynamic::{DT_NEEDED, DT_SONAME, DT_STRSZ, DT_STRTAB};
        let (Some(strtab), Some(strsz)) = (value(DT_STRTAB), value(DT_STRSZ)) else { return Some(out) };
        // The string table's address, as a file offset.
        let load = phdrs.iter().find(|p| p.0 == PT_LOAD && strtab >= p.2 && strtab - p.2 < p.3)?;
        let strings = c.get((strtab - load.2 + load.1) as usize, (strsz as usize).min(MAX_DYNAMIC))?;
        let name = |off: u64| {
            let s = strings.get(off as usize..)?;
            let end = s.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&s[..end]).into_owned())
        };
        out.soname = value(DT_SONAME).and_then(name);
        out.needed = entries.iter().filter(|e| e.0 == DT_NEEDED).filter_map(|e| name(e.1)).collect();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_program_runs_in_this_process_only() {
        let exe = std::env::current_exe().unwrap();
        let p = ExeFile::open(&exe).unwrap();
        assert!(!p.is_library());
        assert!(p.in_process(std::process::id() as i32));
        assert!(!p.processes().contains(&(std::process::id() as i32)));
    }

    #[test]
    fn not_an_elf_file_is_one_line() {
        let junk = std::env::temp_dir().join(format!("tp-exe-junk-{}", std::process::id()));
        std::fs::write(&junk, b"#!/bin/sh\necho not an ELF file\n").unwrap();
        let e = ExeFile::open(&junk);
        let _ = std::fs::remove_file(&junk);
        assert!(format!("{:#}", e.unwrap_err()).contains("not an ELF file"));
        let e = ExeFile::open(Path::new("/nonexistent/x")).unwrap_err();
        assert!(format!("{e:#}").starts_with("--exe /nonexistent/x"), "{e:#}");
    }

    /// (Reads the host's libc: the arm64 VM's static test programs have none.)
    #[test]
    fn a_library_is_told_from_a_program_and_found_among_what_a_program_needs() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("libc.so.6");
        let libc = ExeFile::open(Path::new(libc)).unwrap();
        assert!(libc.is_library());
        assert!(libc.in_new_process(std::process::id() as i32), "this test program needs libc.so.6");
        let d = Dynamic::of(&std::env::current_exe().unwrap()).unwrap();
        assert!(d.interp && d.needed.iter().any(|n| n == "libc.so.6"), "{d:?}");
    }
}
