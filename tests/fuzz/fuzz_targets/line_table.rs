//! DWARF line tables of arbitrary ELF files (gimli's line programs, the
//! file names they build, the queries `--line` and `list-probes --lines`
//! make), and a window planned inside each function. The tables come from
//! the target's files or their debug files: any panic is a bug.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tp::addr::Bias;
use tp::arch::isa_for_machine;
use tp::symbols::image::{CodeFacts, ElfImage};
use tp::symbols::lines::{self, Query};
use tp::symbols::{self, ElfFile};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.elf");
    let Ok(elf) = ElfFile::parse(data.to_vec(), path, path) else { return };
    if let Ok(all) = lines::starts(&elf, Query::default()) {
        if let Some(first) = all.first() {
            let _ = lines::starts(&elf, Query { file: Some(&first.file), line: Some(first.line), range: None });
        }
    }
    let _ = lines::starts(&elf, Query { file: Some("a.c"), line: Some(1), range: Some((0, u64::MAX)) });
    // A probe inside each function, as `foo+N` and `--line` plan it.
    let Some(isa) = isa_for_machine(elf.machine) else { return };
    let facts = CodeFacts::of(&elf, Some(isa));
    let image = ElfImage { elf: &elf, bias: Bias::ZERO, facts: &facts, parts: Vec::new() };
    for f in elf.unique_functions().into_iter().filter(|f| f.size > 1).take(200) {
        let Some(code) = elf.bytes_at(f.addr, f.size) else { continue };
        let at = Bias::ZERO.runtime(f.addr);
        let extra = symbols::cold_targets(&elf, Bias::ZERO, &f.name, at, f.size, isa);
        let _ = isa.plan_at(code, at.0, at.0 + f.size / 2, &extra, &image);
    }
});
