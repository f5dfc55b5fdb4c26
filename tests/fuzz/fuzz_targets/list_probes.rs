//! `tp list-probes` on arbitrary bytes: ELF parsing (goblin), symbol
//! extraction with versions, the functions of `.eh_frame` (gimli) a
//! stripped file lists, the bytes behind each symbol, split-off parts, planning a
//! window for each function with the ISA its header names, and the verdict
//! text. Any panic is a bug: list-probes must answer every file with a
//! table or one error line.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tp::addr::{Bias, RuntimeAddr};
use tp::arch::isa_for_machine;
use tp::output::listing::verdict_text;
use tp::session::probeable;
use tp::symbols::{self, ElfFile};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.elf");
    let Ok(mut elf) = ElfFile::parse(data.to_vec(), path, path) else { return };
    if !elf.has_symtab {
        tp::symbols::eh::add_unwind_functions(&mut elf);
    }
    let Some(isa) = isa_for_machine(elf.machine) else { return };
    // What list-probes' verdicts() does, row by row.
    for f in elf.unique_functions().into_iter().filter(|f| f.size > 0) {
        let verdict = match elf.bytes_at(f.addr, f.size) {
            None => continue,
            Some(code) => {
                // The file on its own: loaded at bias 0.
                let at = Bias::ZERO.runtime(f.addr);
                let extra = symbols::cold_targets(&elf, Bias::ZERO, &f.name, at, f.size, isa);
                isa.plan(code, at.0, &extra)
            }
        };
        let verdict = probeable::verdict(&verdict);
        let _ = verdict_text(&verdict, None);
        let _ = verdict_text(&verdict, Some("after Go's stack check"));
    }
    let _ = elf.bias_from(RuntimeAddr(0x5555_5555_4000), 0);
});
