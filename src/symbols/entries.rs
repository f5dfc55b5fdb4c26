//! Ways into a function that its own direct branches do not show: exception
//! landing pads, other symbols that start inside it, and direct branches
//! from the rest of the module (hand-written assembly such as glibc's
//! `__mempcpy_*` jumps into the second instruction of `__memmove_*`). A probe
//! whose window has one of these in its interior is refused, since a thread
//! arriving there would run the middle of the patched jump.
//!
//! The direct branches of the whole module are found by decoding all of
//! its code once, the first time more than a few windows are checked; the
//! first few are checked by a scan of the code for branches that could land
//! in that window alone ([`crate::arch::Arch::branch_targets_into`]), which
//! finds exactly the same branches without decoding code that cannot reach
//! there: attaching to one function of a large library does not decode it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use goblin::elf::section_header::SHF_EXECINSTR;

use super::ElfFile;
use super::eh::LandingPads;
use crate::addr::{Bias, FileAddr, RuntimeAddr};
use crate::arch::{Isa, Refusal, SitePlan};

/// Windows checked by a scan of the code before the whole module is decoded
/// (a scan reads every byte of code once, a decode several times over).
const SCANS: usize = 4;

/// The entry points of one file, at link-time addresses.
#[derive(Debug)]
pub struct Entries {
    pads: LandingPads,
    isa: Option<&'static dyn Isa>,
    /// The code, cut at every symbol start: `[lo, hi)` link-time addresses.
    chunks: Vec<(u64, u64)>,
    /// The target of every direct branch and call in the file's code,
    /// sorted; decoded on first need (shared with the module's analysis
    /// being saved, which then need not decode it again).
    branch_targets: Arc<OnceLock<Vec<u64>>>,
    /// Windows checked by scanning so far.
    scans: AtomicUsize,
}

impl Entries {
    /// The entry points of `elf`, whose code `isa` decodes.
    pub fn of(elf: &ElfFile, isa: Option<&'static dyn Isa>) -> Entries {
        Entries::sharing(elf, isa, Arc::default())
    }

    /// [`Entries::of`], its branch targets kept in `targets` (decoded there
    /// already, or to be).
    pub fn sharing(elf: &ElfFile, isa: Option<&'static dyn Isa>, targets: Arc<OnceLock<Vec<u64>>>) -> Entries {
        Entries {
            pads: LandingPads::of(elf),
            isa,
            chunks: code_chunks(elf),
            branch_targets: targets,
            scans: AtomicUsize::new(0),
        }
    }

    /// Entries from what was read before: the landing pads and every
    /// branch target, sorted.
    pub fn from_parts(
        elf: &ElfFile,
        isa: Option<&'static dyn Isa>,
        pads: LandingPads,
        branch_targets: Vec<u64>,
    ) -> Entries {
        Entries {
            pads,
            isa,
            chunks: code_chunks(elf),
            branch_targets: Arc::new(OnceLock::from(branch_targets)),
            scans: AtomicUsize::new(SCANS),
        }
    }

    /// The target of every direct branch and call in `elf`'s code (which
    /// this was made for), sorted: the whole module decoded once.
    pub fn branch_targets(&self, elf: &ElfFile) -> &[u64] {
        self.branch_targets.get_or_init(|| {
            let Some(isa) = self.isa else { return Vec::new() };
            let mut targets = Vec::new();
            for &(lo, hi) in &self.chunks {
                if let Some(code) = elf.bytes_at(FileAddr(lo), hi - lo) {
                    targets.extend(isa.branch_targets(code, lo));
                }
            }
            targets.sort_unstable();
            targets.dedup();
            targets
        })
    }

    /// The lowest target of a direct branch in `(lo, hi)`.
    fn branch_into(&self, elf: &ElfFile, lo: u64, hi: u64) -> Option<u64> {
        if self.branch_targets.get().is_none()
            && self.scans.load(Ordering::Relaxed) < SCANS
            && let Some(isa) = self.isa
        {
            self.scans.fetch_add(1, Ordering::Relaxed);
            return self
                .chunks
                .iter()
                .filter_map(|&(clo, chi)| elf.bytes_at(FileAddr(clo), chi - clo).map(|code| (clo, code)))
                .flat_map(|(at, code)| isa.branch_targets_into(code, at, lo, hi))
                .min();
        }
        let targets = self.branch_targets(elf);
        let first = targets.partition_point(|&t| t <= lo);
        targets[first..].first().copied().filter(|&t| t < hi)
    }

    /// Checks that nothing enters `plan`'s window (runtime addresses; the
    /// file `elf`, which this was made for, was loaded at `bias`) anywhere
    /// but at its first byte.
    pub fn check(&self, elf: &ElfFile, plan: &SitePlan, bias: Bias) -> Result<(), Refusal> {
        let runtime = |a: u64| bias.runtime(FileAddr(a)).0;
        let FileAddr(lo) = bias.file(RuntimeAddr(plan.site));
        let hi = lo + plan.len() as u64;
        if self.pads.unknown_at(bias.file(RuntimeAddr(plan.function)).0) {
            return Err(Refusal::UnknownLandingPads { at: plan.function });
        }
        if let Some(pad) = self.pads.strictly_inside(lo, hi).next() {
            return Err(Refusal::LandingPadInWindow { at: runtime(pad) });
        }
        // The first symbol after `lo` (the symbols are sorted by address),
        // by the first of its names.
        let syms = &elf.functions;
        let first = syms.partition_point(|f| f.addr.0 <= lo);
        if let Some(a) = syms.get(first).map(|f| f.addr.0).filter(|&a| a < hi) {
            let name = syms[first..].iter().take_while(|f| f.addr.0 == a).map(|f| f.name.as_str()).min();
            return Err(Refusal::EntersWindow { at: runtime(a), from: format!("function `{}`", name.unwrap_or("")) });
        }
        if let Some(t) = self.branch_into(elf, lo, hi) {
            return Err(Refusal::EntersWindow { at: runtime(t), from: "a direct branch".into() });
        }
        Ok(())
    }

    /// The landing pads found.
    pub fn landing_pads(&self) -> &LandingPads {
        &self.pads
    }
}

/// The file's executable sections (or, without section headers, its
/// executable segments), cut at every symbol start so that each piece begins
/// on an instruction boundary and a decoder never runs out of step for long.
fn code_chunks(elf: &ElfFile) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = if elf.sections.is_empty() {
        elf.segments.iter().filter(|s| s.exec).map(|s| (s.vaddr, s.vaddr.saturating_add(s.filesz))).collect()
    } else {
        elf.sections
            .iter()
            .filter(|s| s.flags & SHF_EXECINSTR as u64 != 0 && !s.nobits)
            .map(|s| (s.addr, s.addr.saturating_add(s.size)))
            .collect()
    };
    ranges.sort_unstable();
    let mut starts: Vec<u64> = elf.functions.iter().map(|f| f.addr.0).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut out = Vec::new();
    for (lo, hi) in ranges {
        let mut at = lo;
        let first = starts.partition_point(|&a| a <= lo);
        for &s in starts[first..].iter().take_while(|&&a| a < hi) {
            if s > at {
                out.push((at, s));
                at = s;
            }
        }
        if hi > at {
            out.push((at, hi));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::isa_for_machine;
    use std::path::Path;

    /// Windows at every symbol and around every branch target: the scan
    /// finds what decoding the whole module finds.
    fn scans_agree(path: &Path, windows_wanted: usize) {
        let elf = ElfFile::open(path, path).unwrap();
        let isa = isa_for_machine(elf.machine);
        let decoded = Entries::of(&elf, isa);
        let all = decoded.branch_targets(&elf).to_vec();
        let mut windows: Vec<(u64, u64)> = Vec::new();
        let every = |n: usize| (n / windows_wanted).max(1);
        for f in elf.functions.iter().step_by(every(elf.functions.len() * 4)) {
            windows.extend([2u64, 5, 9, 15].map(|len| (f.addr.0, f.addr.0 + len)));
        }
        for &t in all.iter().step_by(every(all.len() * 3)) {
            windows.extend([(t - 1, t + 1), (t - 3, t + 2), (t, t + 6)]);
        }
        let scanning = Entries::of(&elf, isa);
        for (lo, hi) in windows {
            scanning.scans.store(0, Ordering::Relaxed);
            let first = all.partition_point(|&t| t <= lo);
            let want = all[first..].first().copied().filter(|&t| t < hi);
            assert_eq!(scanning.branch_into(&elf, lo, hi), want, "{} ({lo:#x}, {hi:#x})", path.display());
            assert!(scanning.branch_targets.get().is_none(), "a scan decodes no whole module");
        }
    }

    #[test]
    fn scanning_for_one_window_finds_what_decoding_everything_finds() {
        let dir = Path::new(env!("TP_TARGETS_DIR"));
        for (name, windows) in [("counter", 400), ("shapes", 400), ("prologues", 400), ("many", 60)] {
            scans_agree(&dir.join(name), windows);
        }
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).unwrap();
        scans_agree(Path::new(libc), 24);
    }

    #[test]
    fn after_a_few_windows_the_module_is_decoded_once() {
        let path = Path::new(env!("TP_TARGETS_DIR")).join("many");
        let elf = ElfFile::open(&path, &path).unwrap();
        let entries = Entries::of(&elf, isa_for_machine(elf.machine));
        for f in elf.functions.iter().take(SCANS) {
            entries.branch_into(&elf, f.addr.0, f.addr.0 + 5);
            assert!(entries.branch_targets.get().is_none());
        }
        entries.branch_into(&elf, 0, 5);
        assert!(entries.branch_targets.get().is_some());
    }
}
