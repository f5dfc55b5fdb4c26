//! Go code in a module: which functions are Go's (and so use Go's calling
//! convention, and run on goroutine stacks that the Go runtime walks), and
//! which ones the runtime uses as return addresses on goroutine stacks.
//!
//! A module is Go's when it has Go's function table (`.gopclntab`), build
//! information (`.go.buildinfo`), build id note (`.note.go.buildid`) or the
//! runtime's `runtime.goexit`. The function table lists every function the
//! Go toolchain compiled or assembled, stripped binaries included, and none
//! of the C functions a cgo program links in; tp reads it (bounded and
//! checked: it is read from the target's files) for each function's entry
//! and the few names it needs. A Go module whose table tp cannot read is
//! taken to be Go code throughout, which only refuses more.
//!
//! `runtime.goexit` is the bottom of every goroutine's stack: a new
//! goroutine's function returns to `goexit + 1` (amd64) or `+ 4` (arm64),
//! an address the runtime writes there itself (`newproc1`, `gostartcall`).
//! A parked goroutine's stack is no thread's stack, so no scan of threads
//! sees that address; a patch over goexit's first bytes would be entered in
//! its middle by the next goroutine that ends. It is never probed.

use super::elf::ElfFile;
use crate::addr::FileAddr;

/// True if Go may preempt the Go function `symbol` asynchronously (by a
/// signal) between two of its instructions: the Go runtime never does so
/// in its own packages nor in assembly (runtime/preempt.go,
/// `isAsyncSafePoint`), and not in functions without a stack check (Go
/// makes them unsafe points throughout; the caller checks that). A
/// goroutine preempted so is parked with its PC on its own stack.
pub fn preemptible(symbol: &str) -> bool {
    let runtime = ["runtime.", "runtime/internal/", "reflect."].iter().any(|p| symbol.starts_with(p));
    !runtime && !symbol.ends_with(".abi0")
}

/// Functions whose address (plus a little) the Go runtime keeps as a
/// return address on goroutine stacks.
pub const STACK_RETURN_FUNCTIONS: &[&str] = &["runtime.goexit", "runtime.goexit.abi0"];

/// Functions tp reads from the table at most (a Go binary of a few hundred
/// MiB has a few hundred thousand).
const MAX_FUNCS: usize = 4 << 20;

/// What tp knows of the Go code in one module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoModule {
    /// Entries of Go functions (file addresses), sorted; empty if unknown.
    entries: Vec<u64>,
    /// The function table could not be read: every function counts as Go's.
    all: bool,
    /// Entries of the [`STACK_RETURN_FUNCTIONS`] the table names.
    stack_returns: Vec<u64>,
}

impl GoModule {
    /// The Go code of `elf`, or None if it has none.
    pub fn of(elf: &ElfFile) -> Option<GoModule> {
        let marked = elf.sections.iter().any(|s| {
            matches!(s.name.as_str(), ".gopclntab" | ".data.rel.ro.gopclntab" | ".go.buildinfo" | ".note.go.buildid")
        }) || elf.functions.iter().any(|f| STACK_RETURN_FUNCTIONS.contains(&f.name.as_str()));
        if !marked {
            return None;
        }
        let table = [".gopclntab", ".data.rel.ro.gopclntab"]
            .iter()
            .find_map(|name| elf.section_data(name).ok().flatten())
            .and_then(|data| {
                let text = elf.sections.iter().find(|s| s.name == ".text").map_or(0, |s| s.addr);
                FuncTable::parse(&data, text)
            });
        Some(match table {
            Some(t) => GoModule { entries: t.entries, all: false, stack_returns: t.stack_returns },
            None => GoModule { all: true, ..GoModule::default() },
        })
    }

    /// What was read before: the Go functions' entries as the table lists
    /// them, whether the table could not be read, the stack returns.
    pub fn from_parts(entries: Vec<u64>, all: bool, stack_returns: Vec<u64>) -> GoModule {
        GoModule { entries, all, stack_returns }
    }

    /// The entries, whether the table could not be read, the stack returns.
    pub fn parts(&self) -> (&[u64], bool, &[u64]) {
        (&self.entries, self.all, &self.stack_returns)
    }

    /// True if the function at `entry` is Go code.
    pub fn is_go(&self, entry: FileAddr) -> bool {
        self.all || self.entries.binary_search(&entry.0).is_ok()
    }

    /// True if the Go runtime keeps the function's address, or one inside
    /// its first instructions, as a return address on goroutine stacks.
    pub fn is_stack_return(&self, entry: FileAddr, name: &str) -> bool {
        STACK_RETURN_FUNCTIONS.contains(&name) || self.stack_returns.contains(&entry.0)
    }

    /// Number of Go functions the table lists (0 if it was not read).
    pub fn functions(&self) -> usize {
        self.entries.len()
    }
}

/// What tp reads of a `.gopclntab`.
#[derive(Debug, Default)]
struct FuncTable {
    entries: Vec<u64>,
    stack_returns: Vec<u64>,
}

/// Layouts of the table's header, by its magic number.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    /// Go 1.2 to 1.15: the function table right after the header.
    V12,
    /// Go 1.16 and 1.17: offsets in the header, absolute entries.
    V116,
    /// Go 1.18 and later: entries relative to the text start.
    V118,
}

impl FuncTable {
    /// Parses the table `data`, whose code starts at `text` if its header
    /// does not say; None if it is not a table tp knows.
    fn parse(data: &[u8], text: u64) -> Option<FuncTable> {
        let u32_at = |off: usize| data.get(off..off.checked_add(4)?).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
        let u64_at = |off: usize| data.get(off..off.checked_add(8)?).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        let version = match u32_at(0)? {
            0xffff_fffb => Version::V12,
            0xffff_fffa => Version::V116,
            0xffff_fff0 | 0xffff_fff1 => Version::V118,
            _ => return None,
        };
        // Two zero bytes, the PC quantum (1, 2 or 4), 8-byte pointers.
        if data.get(4..8)? != [0, 0, data[6], 8] || ![1, 2, 4].contains(&data[6]) {
            return None;
        }
        let word = |k: usize| u64_at(8 + 8 * k).and_then(|v| usize::try_from(v).ok());
        let nfunc = match version {
            Version::V12 => word(0)?,
            _ => word(0)?,
        };
        if nfunc == 0 || nfunc > MAX_FUNCS || nfunc > data.len() / 8 {
            return None;
        }
        // (function table, function name table, text start for relative entries, entry size)
        let (ftab, names, base, wide) = match version {
            Version::V12 => (16, 0, 0, true),
            Version::V116 => (word(6)?, word(2)?, 0, true),
            Version::V118 => {
                let start = u64_at(24)?;
                (word(7)?, word(3)?, if start != 0 { start } else { text }, false)
            }
        };
        let step = if wide { 16 } else { 8 };
        let table_end = ftab.checked_add(nfunc.checked_mul(step)?)?;
        if table_end > data.len() {
            return None;
        }
        // The _func records: at `pcln + funcoff` (1.16 on: after the header's
        // pcln offset; before: from the table's start).
        let funcs_at = match version {
            Version::V12 => 0,
            _ => ftab,
        };
        let mut out = FuncTable::default();
        out.entries.reserve(nfunc);
        for k in 0..nfunc {
            let at = ftab + k * step;
            let (entry, funcoff) = if wide {
                (u64_at(at)?, usize::try_from(u64_at(at + 8)?).ok()?)
            } else {
                (base.checked_add(u32_at(at)? as u64)?, u32_at(at + 4)? as usize)
            };
            out.entries.push(entry);
            // The name: nameoff is the _func's second field (after a
            // pointer-sized or 4-byte entry), an offset into the name table.
            let rec = funcs_at.checked_add(funcoff)?;
            let name_off = u32_at(rec + if wide { 8 } else { 4 })? as usize;
            let name = name_at(data, names.checked_add(name_off)?);
            if name.is_some_and(|n| STACK_RETURN_FUNCTIONS.contains(&n)) {
                out.stack_returns.push(entry);
            }
        }
        out.entries.sort_unstable();
        out.entries.dedup();
        Some(out)
    }
}

/// The NUL-terminated name at `off`, if it is one (at most 1 KiB, UTF-8).
fn name_at(data: &[u8], off: usize) -> Option<&str> {
    let rest = data.get(off..)?;
    let len = rest.iter().take(1024).position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..len]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Go 1.18-style table: header, function table of `funcs` (offset
    /// from text, name), the _func records and the name table.
    fn table(magic: u32, funcs: &[(u32, &str)]) -> Vec<u8> {
        let n = funcs.len();
        let header = 8 + 8 * 8;
        let names_at = header;
        let mut names = Vec::new();
        let mut name_offs = Vec::new();
        for (_, name) in funcs {
            name_offs.push(names.len() as u32);
            names.extend(name.as_bytes());
            names.push(0);
        }
        let pcln = names_at + names.len();
        // ftab (n + 1 entries), then one 8-byte _func per function.
        let funcs_start = 8 * (n + 1);
        let mut d = Vec::new();
        d.extend(magic.to_le_bytes());
        d.extend([0, 0, 1, 8]);
        for w in [n as u64, 1, 0x401000, names_at as u64, 0, 0, 0, pcln as u64] {
            d.extend(w.to_le_bytes());
        }
        d.extend(&names);
        for (k, (off, _)) in funcs.iter().enumerate() {
            d.extend(off.to_le_bytes());
            d.extend(((funcs_start + 8 * k) as u32).to_le_bytes());
        }
        d.extend([0u8; 8]); // the end entry
        for (k, (off, _)) in funcs.iter().enumerate() {
            d.extend(off.to_le_bytes());
            d.extend(name_offs[k].to_le_bytes());
        }
        d
    }

    #[test]
    fn reads_entries_and_names() {
        let d = table(0xffff_fff0, &[(0x100, "main.main"), (0x40, "runtime.goexit.abi0"), (0x200, "main.fib")]);
        let t = FuncTable::parse(&d, 0).unwrap();
        assert_eq!(t.entries, [0x401040, 0x401100, 0x401200]);
        assert_eq!(t.stack_returns, [0x401040]);
    }

    #[test]
    fn damaged_tables_are_not_read() {
        let good = table(0xffff_fff1, &[(0x100, "main.main"), (0x40, "runtime.goexit")]);
        assert!(FuncTable::parse(&good, 0).is_some());
        for cut in [0, 4, 20, 72, 80, good.len() - 12] {
            let _ = FuncTable::parse(&good[..cut], 0); // no panic, whatever it finds
        }
        let mut bad = good.clone();
        bad[0] = 0; // unknown magic
        assert!(FuncTable::parse(&bad, 0).is_none());
        let mut bad = good.clone();
        bad[7] = 4; // 4-byte pointers
        assert!(FuncTable::parse(&bad, 0).is_none());
        let mut bad = good.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // nfunc
        assert!(FuncTable::parse(&bad, 0).is_none());
        let mut bad = good;
        bad[64..72].copy_from_slice(&(u64::MAX - 3).to_le_bytes()); // the table's offset
        assert!(FuncTable::parse(&bad, 0).is_none());
        // Random bytes after a valid magic never panic.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut d = table(0xffff_fff0, &[(0x10, "a"), (0x20, "runtime.goexit")]);
            for _ in 0..8 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = 8 + (seed as usize % (d.len() - 8));
                d[at] = (seed >> 32) as u8;
            }
            let _ = FuncTable::parse(&d, 0);
        }
    }
}
