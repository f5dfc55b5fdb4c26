//! Static probe notes on arbitrary bytes: the notes of one `.note.stapsdt`
//! section (sizes, owners, strings, the prelink shift), each argument string
//! parsed by both architectures' parsers, and the notes of an ELF file. The
//! notes come from the target's files: any panic is a bug.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tp::arch::{Isa, isa_for_machine};
use tp::symbols::{ElfFile, sdt_notes};

fuzz_target!(|data: &[u8]| {
    let isas: Vec<&dyn Isa> = [62u16, 183].iter().filter_map(|&m| isa_for_machine(m)).collect();
    let base = data.first().map(|&b| 0x1000 * b as u64);
    for note in sdt_notes::parse(data, base) {
        for arg in note.arg_texts() {
            for isa in &isas {
                let _ = isa.sdt_argument(arg);
            }
        }
    }
    // Each argument parser on the bytes as text.
    if let Ok(text) = std::str::from_utf8(data) {
        for isa in &isas {
            let _ = isa.sdt_argument(text);
        }
    }
    let path = Path::new("fuzz.elf");
    if let Ok(elf) = ElfFile::parse(data.to_vec(), path, path) {
        let _ = sdt_notes::notes(&elf);
    }
});
