//! An ELF file as the planner's [`Image`]: its bytes, which addresses are
//! code, and the code addresses its data may hold: the targets of its
//! dynamic relocations, or, in a position-dependent executable (whose data
//! holds absolute addresses without relocations), every 4- or 8-byte word of
//! its data segments, at any 4-byte offset, that is a code address.

use goblin::elf::dynamic::{DF_TEXTREL, DT_FLAGS, DT_TEXTREL};

use super::ElfFile;
use crate::addr::{Bias, FileAddr, RuntimeAddr};
use crate::arch::{Image, Isa, StoredPointer};

/// What one file's code and data say about code addresses, read once.
#[derive(Debug, Default)]
pub struct CodeFacts {
    absolute_code: bool,
    /// Link-time code addresses that data may hold, sorted.
    targets: Vec<u64>,
}

/// `elf` loaded at `bias`, with its [`CodeFacts`].
#[derive(Debug, Clone)]
pub struct ElfImage<'a> {
    /// The file.
    pub elf: &'a ElfFile,
    /// Its load bias.
    pub bias: Bias,
    /// What was read of it.
    pub facts: &'a CodeFacts,
    /// The other parts of the function being planned (`[lo, hi)`, runtime
    /// addresses): its `.cold` parts.
    pub parts: Vec<(u64, u64)>,
}

impl CodeFacts {
    /// Facts read before: whether code addresses may be absolute, and the
    /// code addresses data may hold, sorted.
    pub fn from_parts(absolute_code: bool, targets: Vec<u64>) -> CodeFacts {
        CodeFacts { absolute_code, targets }
    }

    /// Whether code addresses may be absolute, and the code addresses data may hold.
    pub fn parts(&self) -> (bool, &[u64]) {
        (self.absolute_code, &self.targets)
    }

    /// Reads the relocations (or, position-dependent, the data words) of
    /// `elf`, whose instruction set is `isa`. Only files whose planner reads
    /// the module ([`Isa::plans_with_image`]) are read.
    pub fn of(elf: &ElfFile, isa: Option<&'static dyn Isa>) -> CodeFacts {
        let mut facts = CodeFacts { absolute_code: true, targets: Vec::new() };
        let Some(isa) = isa.filter(|i| i.plans_with_image()) else { return facts };
        let Ok(parsed) = goblin::elf::Elf::parse(elf.data()) else { return facts };
        let textrel = parsed.dynamic.as_ref().is_some_and(|d| {
            d.dyns.iter().any(|e| e.d_tag == DT_TEXTREL || (e.d_tag == DT_FLAGS && e.d_val & DF_TEXTREL != 0))
        });
        facts.absolute_code = !elf.position_independent || textrel;
        if !elf.position_independent {
            facts.targets = data_words(elf);
            return facts;
        }
        let relocs = parsed.dynrelas.iter().chain(parsed.dynrels.iter()).chain(parsed.pltrelocs.iter());
        for r in relocs {
            let addend = r.r_addend.unwrap_or(0);
            let target = match isa.stored_pointer(r.r_type) {
                Some(StoredPointer::Addend) => addend as u64,
                Some(StoredPointer::Symbol) => match parsed.dynsyms.get(r.r_sym).filter(|s| s.st_shndx != 0) {
                    Some(sym) => sym.st_value.wrapping_add_signed(addend),
                    None => continue,
                },
                None => continue,
            };
            if in_code(elf, target) {
                facts.targets.push(target);
            }
        }
        facts.targets.sort_unstable();
        facts.targets.dedup();
        facts
    }
}

/// True if link-time address `a` lies in an executable segment's file bytes.
fn in_code(elf: &ElfFile, a: u64) -> bool {
    elf.segments.iter().any(|s| s.exec && s.vaddr <= a && a < s.vaddr + s.filesz)
}

/// Every word of the non-executable segments that is a code address.
fn data_words(elf: &ElfFile) -> Vec<u64> {
    let mut out = Vec::new();
    for seg in elf.segments.iter().filter(|s| !s.exec) {
        let Some(bytes) = elf.bytes_at(FileAddr(seg.vaddr), seg.filesz) else { continue };
        for off in (0..bytes.len().saturating_sub(3)).step_by(4) {
            let word4 = u32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes")) as u64;
            if in_code(elf, word4) {
                out.push(word4);
            }
            if let Some(b) = bytes.get(off..off + 8) {
                let word8 = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                if word8 != word4 && in_code(elf, word8) {
                    out.push(word8);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl Image for ElfImage<'_> {
    fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        self.elf.bytes_at(self.bias.file(RuntimeAddr(addr)), len)
    }

    fn is_code(&self, addr: u64) -> bool {
        in_code(self.elf, self.bias.file(RuntimeAddr(addr)).0)
    }

    fn absolute_code(&self) -> bool {
        self.facts.absolute_code
    }

    fn other_parts(&self) -> &[(u64, u64)] {
        &self.parts
    }

    fn stored_targets(&self, lo: u64, hi: u64) -> Vec<u64> {
        let file = |a: u64| self.bias.file(RuntimeAddr(a)).0;
        let (lo, hi) = (file(lo), file(hi));
        let targets = &self.facts.targets;
        let first = targets.partition_point(|&t| t < lo);
        targets[first..].iter().take_while(|&&t| t < hi).map(|&t| self.bias.runtime(FileAddr(t)).0).collect()
    }
}

// They read the test binary itself.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::isa_for_machine;

    #[test]
    fn a_pie_stores_code_addresses_through_relocations() {
        // The test binary itself: PIE, and its function pointers (e.g. in
        // .init_array and vtables of std) are RELATIVE relocations.
        let p = std::env::current_exe().unwrap();
        let elf = ElfFile::open(&p, &p).unwrap();
        let isa = isa_for_machine(elf.machine);
        let facts = CodeFacts::of(&elf, isa);
        let image = ElfImage { elf: &elf, bias: Bias::ZERO, facts: &facts, parts: Vec::new() };
        if !isa.unwrap().plans_with_image() {
            // The host's planner reads no module: nothing of it is read.
            assert!(image.absolute_code() && image.stored_targets(0, u64::MAX).is_empty());
            return;
        }
        assert!(!image.absolute_code());
        let stored = image.stored_targets(0, u64::MAX);
        assert!(stored.len() > 100, "{}", stored.len());
        assert!(stored.iter().all(|&t| image.is_code(t)));
        let main = elf.functions.iter().find(|f| f.name == "main").unwrap();
        assert!(image.is_code(main.addr.0) && !image.is_code(0));
    }
}
