//! Exception landing pads read from real binaries: a C++ target built here
//! and Debian's libstdc++.

use tp::arch::x86_64::decode::decode;
use tp::symbols::ElfFile;
use tp::symbols::eh::LandingPads;

use crate::util::*;

fn open(path: &std::path::Path) -> ElfFile {
    ElfFile::open(path, path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

#[test]
fn catch_blocks_are_landing_pads_on_instruction_boundaries() {
    let elf = open(&target_path("exceptions"));
    let pads = LandingPads::of(&elf);
    assert_eq!(pads.unreadable(), 0);
    // catcher() has a try/catch: its landing pad lies in catcher or its .cold part,
    // on an instruction boundary.
    let parts: Vec<_> = elf.functions.iter().filter(|f| f.name.starts_with("_Z7catcherl")).collect();
    assert!(!parts.is_empty(), "no catcher in {:?}", elf.functions.iter().map(|f| &f.name).collect::<Vec<_>>());
    let mut found = 0;
    for f in parts {
        let code = elf.bytes_at(f.addr, f.size).unwrap();
        let starts: Vec<u64> = decode(code, f.addr.0).iter().map(|i| i.addr).collect();
        for pad in pads.strictly_inside(f.addr.0.saturating_sub(1), f.addr.0 + f.size) {
            assert!(starts.contains(&pad), "pad {pad:#x} is not an instruction of {}", f.name);
            found += 1;
        }
    }
    assert!(found >= 1, "catcher's catch block was not found as a landing pad");
    // thrower() has no handler of its own.
    let thrower = elf.functions.iter().find(|f| f.name == "_Z7throwerl").unwrap();
    assert_eq!(pads.strictly_inside(thrower.addr.0.saturating_sub(1), thrower.addr.0 + thrower.size).count(), 0);
}

#[test]
fn libstdcxx_landing_pads_are_all_read_and_all_in_code() {
    let path = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    crate::util::need("libstdc++");
    let elf = open(path);
    let pads = LandingPads::of(&elf);
    assert_eq!(pads.unreadable(), 0, "every LSDA of libstdc++ should parse");
    assert!(pads.len() > 1000, "only {} landing pads", pads.len());
    for &p in pads.pads() {
        assert!(
            elf.segments.iter().any(|s| s.exec && s.vaddr <= p && p < s.vaddr + s.filesz),
            "pad {p:#x} not in code"
        );
    }
}
