//! Ways into a function that its own direct branches do not show: exception
//! landing pads, other symbols that start inside it, and direct branches
//! from the rest of the module (hand-written assembly such as glibc's
//! `__mempcpy_*` jumps into the second instruction of `__memmove_*`). A probe
//! whose window has one of these in its interior is refused, since a thread
//! arriving there would run the middle of the patched jump.

use goblin::elf::section_header::SHF_EXECINSTR;

use super::ElfFile;
use super::eh::LandingPads;
use crate::addr::{Bias, FileAddr, RuntimeAddr};
use crate::arch::{Isa, Refusal, SitePlan};

/// The entry points of one file, at link-time addresses.
#[derive(Debug)]
pub struct Entries {
    pads: LandingPads,
    /// Every function symbol's start and name, sorted by address.
    starts: Vec<(u64, String)>,
    /// The target of every direct branch and call in the file's code, sorted.
    branch_targets: Vec<u64>,
}

impl Entries {
    /// Collects the entry points of `elf`, decoding its code with `isa`.
    pub fn of(elf: &ElfFile, isa: Option<Isa>) -> Entries {
        let mut starts: Vec<(u64, String)> = elf.functions.iter().map(|f| (f.addr.0, f.name.clone())).collect();
        starts.sort();
        let mut branch_targets = Vec::new();
        if let Some(isa) = isa {
            for (lo, hi) in code_chunks(elf, &starts) {
                if let Some(code) = elf.bytes_at(FileAddr(lo), hi - lo) {
                    branch_targets.extend((isa.branch_targets)(code, lo));
                }
            }
        }
        branch_targets.sort_unstable();
        branch_targets.dedup();
        Entries { pads: LandingPads::of(elf), starts, branch_targets }
    }

    /// Checks that nothing enters `plan`'s window (runtime addresses; the
    /// file was loaded at `bias`) anywhere but at its first byte.
    pub fn check(&self, plan: &SitePlan, bias: Bias) -> Result<(), Refusal> {
        let runtime = |a: u64| bias.runtime(FileAddr(a)).0;
        let FileAddr(lo) = bias.file(RuntimeAddr(plan.site));
        let hi = lo + plan.len() as u64;
        if self.pads.unknown_at(bias.file(RuntimeAddr(plan.function)).0) {
            return Err(Refusal::UnknownLandingPads { at: plan.function });
        }
        if let Some(pad) = self.pads.strictly_inside(lo, hi).next() {
            return Err(Refusal::LandingPadInWindow { at: runtime(pad) });
        }
        let first = self.starts.partition_point(|(a, _)| *a <= lo);
        if let Some((a, name)) = self.starts[first..].first().filter(|(a, _)| *a < hi) {
            return Err(Refusal::EntersWindow { at: runtime(*a), from: format!("function `{name}`") });
        }
        let first = self.branch_targets.partition_point(|&t| t <= lo);
        if let Some(&t) = self.branch_targets[first..].first().filter(|&&t| t < hi) {
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
fn code_chunks(elf: &ElfFile, starts: &[(u64, String)]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = match goblin::elf::Elf::parse(elf.data()) {
        Ok(p) if !p.section_headers.is_empty() => p
            .section_headers
            .iter()
            .filter(|s| s.sh_flags & SHF_EXECINSTR as u64 != 0 && s.sh_type != goblin::elf::section_header::SHT_NOBITS)
            .map(|s| (s.sh_addr, s.sh_addr + s.sh_size))
            .collect(),
        _ => elf.segments.iter().filter(|s| s.exec).map(|s| (s.vaddr, s.vaddr + s.filesz)).collect(),
    };
    ranges.sort_unstable();
    let mut out = Vec::new();
    for (lo, hi) in ranges {
        let mut at = lo;
        let first = starts.partition_point(|(a, _)| *a <= lo);
        for (s, _) in starts[first..].iter().take_while(|(a, _)| *a < hi) {
            if *s > at {
                out.push((at, *s));
                at = *s;
            }
        }
        if hi > at {
            out.push((at, hi));
        }
    }
    out
}
