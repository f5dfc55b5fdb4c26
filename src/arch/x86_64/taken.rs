//! Code addresses a function can form, for deciding where its indirect
//! jumps may land inside it.
//!
//! A code address is the target of a RIP-relative operand (`lea rax, [rip +
//! label]`), a pointer stored in data (a computed-goto table, a function
//! pointer, a position-dependent switch table), an absolute immediate (only
//! in position-dependent code), or a RIP-relative base plus an offset read
//! from a table (a position-independent switch: `movsxd rax, [rdx + rax*4];
//! add rax, rdx; jmp rax`). This module lists the first three as the
//! [`Image`] and the instructions show them, and over-approximates the
//! fourth: every
//! address the function refers to is read as a table of 32-bit offsets,
//! relative to the table itself (a compiler's switch) and to every code
//! address of the function it refers to (a table of label differences,
//! `&&label - &&base`), for as long as the offsets land in code. A real
//! table's entries all land in code, so the scan reads the whole table; data
//! that merely looks like one only adds targets, which can only refuse more.

use super::decode::Insn;
use crate::arch::Image;

/// Entries read per table at most (a switch over 65536 cases is not seen).
const MAX_ENTRIES: u64 = 1 << 16;

/// The code addresses in `[lo, hi)` that the function `insns` (spanning
/// `[lo, hi)`) can form.
pub fn code_addresses(insns: &[Insn], lo: u64, hi: u64, image: &dyn Image) -> Vec<u64> {
    let mut refs: Vec<u64> = insns.iter().filter_map(|i| i.rip_target).collect();
    refs.sort_unstable();
    refs.dedup();
    let mut out: Vec<u64> = refs.iter().copied().filter(|&t| lo <= t && t < hi).collect();
    out.extend(image.stored_targets(lo, hi));
    if image.absolute_code() {
        out.extend(insns.iter().filter_map(|i| i.abs_ref).filter(|&t| lo <= t && t < hi));
    }
    let labels: Vec<u64> = refs.iter().copied().filter(|&t| lo <= t && t < hi).collect();
    for &table in &refs {
        for &base in std::iter::once(&table).chain(labels.iter().filter(|&&b| b != table)) {
            scan_table(image, table, base, lo, hi, &mut out);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Reads 32-bit offsets at `table`, added to `base`, while they land in code.
fn scan_table(image: &dyn Image, table: u64, base: u64, lo: u64, hi: u64, out: &mut Vec<u64>) {
    for k in 0..MAX_ENTRIES {
        let Some(b) = image.bytes(table + 4 * k, 4) else { return };
        let offset = i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64;
        let target = base.wrapping_add_signed(offset);
        if !image.is_code(target) {
            return;
        }
        if lo <= target && target < hi {
            out.push(target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::decode::decode;

    /// Code at 0x1000..0x2000, data at 0x8000.., relocated pointers listed.
    struct Fake {
        data: Vec<u8>,
        relocs: Vec<u64>,
    }

    impl Image for Fake {
        fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
            let off = addr.checked_sub(0x8000)? as usize;
            self.data.get(off..off + len as usize)
        }
        fn is_code(&self, addr: u64) -> bool {
            (0x1000..0x2000).contains(&addr)
        }
        fn absolute_code(&self) -> bool {
            false
        }
        fn stored_targets(&self, lo: u64, hi: u64) -> Vec<u64> {
            self.relocs.iter().copied().filter(|&t| lo <= t && t < hi).collect()
        }
    }

    fn table(base: u64, targets: &[u64]) -> Vec<u8> {
        let mut v: Vec<u8> = targets.iter().flat_map(|&t| ((t as i64 - base as i64) as i32).to_le_bytes()).collect();
        v.extend(b"not code"); // ends the scan
        v
    }

    #[test]
    fn switch_table_entries_are_targets() {
        // lea rdx, [rip + 0x6ff9] at 0x1000 -> 0x8000, the table.
        let insns = decode(&[0x48, 0x8d, 0x15, 0xf9, 0x6f, 0x00, 0x00], 0x1000);
        let image = Fake { data: table(0x8000, &[0x1010, 0x1002, 0x1f00]), relocs: vec![] };
        assert_eq!(code_addresses(&insns, 0x1000, 0x1100, &image), [0x1002, 0x1010]);
    }

    #[test]
    fn offsets_relative_to_another_reference_are_followed() {
        // lea rdx, [rip + 0x6ff9] -> 0x8000 (the table); lea rcx, [rip - 0x7] at 0x1007 -> 0x1007 (the base)
        let insns = decode(&[0x48, 0x8d, 0x15, 0xf9, 0x6f, 0, 0, 0x48, 0x8d, 0x0d, 0xf9, 0xff, 0xff, 0xff], 0x1000);
        assert_eq!(insns[1].rip_target, Some(0x1007));
        let image = Fake { data: table(0x1007, &[0x1003]), relocs: vec![] };
        assert!(code_addresses(&insns, 0x1000, 0x1100, &image).contains(&0x1003));
    }

    #[test]
    fn relocated_pointers_and_taken_addresses_are_targets() {
        // lea rax, [rip - 0x3] at 0x1000 -> 0x1004
        let insns = decode(&[0x48, 0x8d, 0x05, 0xfd, 0xff, 0xff, 0xff], 0x1000);
        let image = Fake { data: vec![], relocs: vec![0x1050, 0x1500] };
        assert_eq!(code_addresses(&insns, 0x1000, 0x1100, &image), [0x1004, 0x1050]);
    }
}
