//! Region images: the bytes of a memfd named like tp's data region, as a
//! target maps them at [`ADDR`]. The hostile-target tests build them
//! (`targets/hostile.c` maps them), and the `region` fuzz target includes
//! this file (`#[path]`), so a saved fuzz input replays in the e2e tests
//! exactly as the fuzzer ran it.
//!
//! The fuzz input format: one byte of flags (bit 0: seal the memfd against
//! shrinking and growing, so tp maps it; bit 1: change the header page once
//! tp has validated it, using the input again; bit 2: shrink the memfd to
//! its bytes after mapping it, so the mapping runs past its end; only when
//! not sealed), two bytes
//! (little-endian) of size in pages (0: the bytes' length rounded up to a
//! page), then the bytes the memfd starts with.

#![allow(dead_code)]

use tp::arch::{Arch, Host};
use tp::probe::layout::{self, Arena, Entry, Header, State, kind};

/// Where the target maps the image.
pub const ADDR: u64 = 0x2000_0000_0000;
/// The code arena the images record (nothing is mapped there).
pub const ARENA: u64 = 0x2100_0000_0000;
/// The sites their entries record (nothing is mapped there either).
pub const SITES: u64 = 0x2200_0000_0000;
/// Where its private area is said to be (nothing tp reads is there).
pub const PRIVATE: u64 = 0x2300_0000_0000;

/// A memfd's contents as a target sets them up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The first bytes of the memfd (the rest reads as zeros).
    pub bytes: Vec<u8>,
    /// The memfd's size, and the mapping's.
    pub size: u64,
    /// Sealed against shrinking and growing.
    pub sealed: bool,
    /// Shrunk to its bytes (rounded up to a page) once mapped.
    pub shrunk: bool,
    /// Change the header page after tp validated it (fuzzing only).
    pub change_later: bool,
}

/// A region as tp writes one, at [`ADDR`]: one code arena and an Active
/// counting entry for each of `names` (function and module names).
pub fn valid(names: &[(&str, &str)]) -> Image {
    let g = layout::geometry(1, layout::DEFAULT_RING_LEN);
    let mut h = Header::new(&g, Host::ELF_MACHINE as u32, ADDR, PRIVATE);
    h.arenas[0] = Arena { addr: ARENA, size: 65536, used: 64 * names.len() as u64, runtime: 0 };
    h.arena_count = 1;
    h.count = names.len() as u32;
    let mut bytes = vec![0u8; (g.probes_off + names.len() as u64 * layout::ENTRY_SIZE) as usize];
    bytes[..std::mem::size_of::<Header>()].copy_from_slice(layout::bytes_of(&h));
    for (i, (name, module)) in names.iter().enumerate() {
        let mut e = Entry::free();
        e.state = State::Active as u32;
        e.kind = kind::COUNT;
        e.function = SITES + 64 * i as u64;
        e.site = e.function;
        e.detour = ARENA + 64 * i as u64;
        e.detour_len = 48;
        e.window_len = 5;
        e.original[..5].copy_from_slice(&[0x55, 0x48, 0x89, 0xe5, 0x90]);
        e.patch[..5].copy_from_slice(&[0xe9, 0, 0, 0, 0]);
        e.set_name(name);
        e.set_module(module);
        let at = h.entry_off(i as u32) as usize;
        bytes[at..at + layout::ENTRY_SIZE as usize].copy_from_slice(layout::bytes_of(&e));
    }
    Image { bytes, size: g.total_size, sealed: true, shrunk: false, change_later: false }
}

/// Offset of entry `i`'s field at `field` (from `offset_of!(Entry, ..)`).
pub fn entry_field(i: u32, field: usize) -> usize {
    4096 + i as usize * layout::ENTRY_SIZE as usize + field
}

/// Puts `value` at `off` of the image's bytes.
pub fn put(img: &mut Image, off: usize, value: &[u8]) {
    if img.bytes.len() < off + value.len() {
        img.bytes.resize(off + value.len(), 0);
    }
    img.bytes[off..off + value.len()].copy_from_slice(value);
}

/// The image a fuzz input describes.
pub fn from_fuzz(data: &[u8]) -> Image {
    let flags = data.first().copied().unwrap_or(0);
    let pages = u16::from_le_bytes([data.get(1).copied().unwrap_or(0), data.get(2).copied().unwrap_or(0)]);
    let bytes = data.get(3..).unwrap_or(&[]).to_vec();
    let size = if pages == 0 { (bytes.len() as u64).next_multiple_of(4096).max(4096) } else { pages as u64 * 4096 };
    Image { bytes, size, sealed: flags & 1 != 0, change_later: flags & 2 != 0, shrunk: flags & 5 == 4 }
}

/// The fuzz input that describes `img`.
pub fn to_fuzz(img: &Image) -> Vec<u8> {
    let flags = img.sealed as u8 | (img.change_later as u8) << 1 | (img.shrunk as u8) << 2;
    let pages = (img.size / 4096) as u16;
    let mut out = vec![flags];
    out.extend_from_slice(&pages.to_le_bytes());
    out.extend_from_slice(&img.bytes);
    out
}

/// The command that makes `targets/hostile.c` map `img` (the bytes follow it).
pub fn map_command(img: &Image) -> String {
    let how = img.sealed as u8 | (img.shrunk as u8) << 1;
    format!("map {} {how} {ADDR:x} {}", img.size, img.bytes.len())
}

/// Writes the `region` fuzz target's seeds (regions as tp writes them,
/// sealed or not, changed later or shrunk) into tests/fuzz/corpus/region;
/// `just fuzz` runs it first.
#[test]
#[ignore = "run by `just fuzz`"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus/region");
    std::fs::create_dir_all(&dir).unwrap();
    let two = valid(&[("work", "hostile"), ("app::Stats::add(long)", "libapp.so")]);
    let seeds = [
        ("empty", valid(&[])),
        ("two-sealed", two.clone()),
        ("two-unsealed", Image { sealed: false, ..two.clone() }),
        ("two-changed-later", Image { change_later: true, ..two.clone() }),
        ("two-shrunk", Image { sealed: false, shrunk: true, ..two.clone() }),
        ("escapes", valid(&[("\x1b[2Jx\u{202e}", "\x1b]0;t\x07")])),
    ];
    for (name, img) in seeds {
        std::fs::write(dir.join(name), to_fuzz(&img)).unwrap();
    }
}

/// The crafted regions that crashed tp before it validated regions (issue
/// 14), as fuzz inputs: saved in tests/fuzz/regressions/region/ by
/// [`write_issue_crashes`] and replayed with the fuzzers' finds.
pub fn issue_crashes() -> Vec<(&'static str, Image)> {
    let base = || valid(&[("work", "hostile")]);
    let mut window = base();
    put(&mut window, entry_field(0, std::mem::offset_of!(Entry, window_len)), &1000u32.to_le_bytes());
    let mut huge = base();
    put(&mut huge, std::mem::offset_of!(Header, capacity), &(1u32 << 31).to_le_bytes());
    put(&mut huge, std::mem::offset_of!(Header, count), &(1u32 << 31).to_le_bytes());
    let short = Image { size: 8192, ..base() };
    let shrunk = Image { sealed: false, shrunk: true, ..base() };
    vec![
        ("window-len-1000", window),
        ("capacity-2-31", huge),
        ("shorter-than-its-header", short),
        ("mapping-past-its-memfd", shrunk),
    ]
}

#[test]
#[ignore = "writes tests/fuzz/regressions/region/ once"]
fn write_issue_crashes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/regressions/region");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, img) in issue_crashes() {
        std::fs::write(dir.join(format!("issue14-{name}")), to_fuzz(&img)).unwrap();
    }
}
