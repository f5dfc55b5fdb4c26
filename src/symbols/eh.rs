//! What `.eh_frame` (read with gimli) tells about functions: the bounds of
//! each (one FDE per function, kept even in stripped files, so a stripped
//! file's functions can still be listed), and exception landing pads: FDEs
//! point to their function's LSDA in `.gcc_except_table`, whose call-site
//! table lists the landing pads the unwinder jumps to. A landing pad is a
//! branch target no instruction of the function names, so the planner must
//! know them.
//!
//! Reference: the LSDA layout of the Itanium C++ ABI's exception handling
//! (as GCC's `unwind-c.c`/`eh_personality.cc` parse it) and the DWARF
//! `DW_EH_PE_*` pointer encodings of the LSB.

use std::borrow::Cow;

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, Pointer, UnwindSection};

use super::ElfFile;
use crate::addr::FileAddr;

/// The landing pads of a file, at link-time addresses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LandingPads {
    /// Every landing pad, sorted.
    pads: Vec<u64>,
    /// Functions (FDE ranges) whose LSDA could not be read: their landing
    /// pads are unknown.
    unreadable: Vec<(u64, u64)>,
}

impl LandingPads {
    /// Reads the landing pads of every function of `elf` that has an LSDA.
    pub fn of(elf: &ElfFile) -> LandingPads {
        let mut out = LandingPads::default();
        let Some((eh_addr, eh_data)) = eh_frame(elf) else { return out };
        let eh = EhFrame::new(&eh_data, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(eh_addr);
        let mut entries = eh.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else { continue };
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else { continue };
            let Some(lsda) = fde.lsda() else { continue };
            let (start, len) = (fde.initial_address(), fde.len());
            let lsda = match lsda {
                Pointer::Direct(a) => Some(a),
                Pointer::Indirect(a) => read_u64(elf, a),
            };
            match lsda.and_then(|a| parse_lsda(elf, a, start)) {
                Some(pads) => out.pads.extend(pads),
                None => out.unreadable.push((start, start + len)),
            }
        }
        out.pads.sort_unstable();
        out.pads.dedup();
        out
    }

    /// Landing pads read before: `pads` sorted, and the ranges of the
    /// functions whose LSDA could not be read.
    pub fn from_parts(pads: Vec<u64>, unreadable: Vec<(u64, u64)>) -> LandingPads {
        LandingPads { pads, unreadable }
    }

    /// The ranges of the functions whose landing pads are unknown.
    pub fn unreadable_ranges(&self) -> &[(u64, u64)] {
        &self.unreadable
    }

    /// Landing pads in `(lo, hi)`, exclusive at both ends.
    pub fn strictly_inside(&self, lo: u64, hi: u64) -> impl Iterator<Item = u64> + '_ {
        let first = self.pads.partition_point(|&p| p <= lo);
        self.pads[first..].iter().copied().take_while(move |&p| p < hi)
    }

    /// True if `addr` lies in a function whose landing pads are unknown.
    pub fn unknown_at(&self, addr: u64) -> bool {
        self.unreadable.iter().any(|&(lo, hi)| lo <= addr && addr < hi)
    }

    /// Every landing pad found, sorted.
    pub fn pads(&self) -> &[u64] {
        &self.pads
    }

    /// Number of functions whose LSDA could not be read.
    pub fn unreadable(&self) -> usize {
        self.unreadable.len()
    }

    /// Number of landing pads found.
    pub fn len(&self) -> usize {
        self.pads.len()
    }

    /// True if none were found.
    pub fn is_empty(&self) -> bool {
        self.pads.is_empty()
    }
}

/// Adds a function `sub_<addr>` for every `.eh_frame` FDE of `elf` (a
/// function's bounds, which the unwinder needs even in a stripped file)
/// that no symbol covers: what a stripped file without a debug file still
/// tells ([`ElfFile::add_unwind_ranges`]).
pub fn add_unwind_functions(elf: &mut ElfFile) {
    let ranges = fde_ranges(elf);
    elf.add_unwind_ranges(&ranges);
}

/// The `[start, start + len)` of every FDE of `elf`'s `.eh_frame` (link-time
/// addresses), in file order; FDEs that do not parse are skipped.
pub fn fde_ranges(elf: &ElfFile) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Some((eh_addr, eh_data)) = eh_frame(elf) else { return out };
    let eh = EhFrame::new(&eh_data, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(eh_addr);
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
            out.push((fde.initial_address(), fde.len()));
        }
    }
    out
}

/// Where each function saves the register that holds its return address,
/// from the call frame information of `.eh_frame`: on architectures where a
/// call leaves the return address in a register (AArch64's link register),
/// a function that calls others saves it in its frame, at an offset from
/// the CFA (its stack pointer at entry) that its CFI rows give.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReturnSaves {
    /// `(start, end, bytes below the CFA)` per FDE, sorted by start; None
    /// where the function never saves the register, or not always at one
    /// offset.
    fdes: Vec<(u64, u64, Option<u32>)>,
}

impl ReturnSaves {
    /// Reads the CFI of every function of `elf`.
    pub fn of(elf: &ElfFile) -> ReturnSaves {
        match eh_frame(elf) {
            Some((eh_addr, eh_data)) => ReturnSaves::of_eh_frame(eh_addr, &eh_data),
            None => ReturnSaves::default(),
        }
    }

    /// Reads the CFI of the `.eh_frame` section `eh_data` at `eh_addr`
    /// (as [`readable`] made it).
    fn of_eh_frame(eh_addr: u64, eh_data: &[u8]) -> ReturnSaves {
        let mut out = ReturnSaves::default();
        let mut eh = EhFrame::new(eh_data, LittleEndian);
        // Opcode 0x2d is AArch64's negate_ra_state (pointer authentication)
        // and no other architecture tp reads uses it.
        eh.set_vendor(gimli::Vendor::AArch64);
        let bases = BaseAddresses::default().set_eh_frame(eh_addr);
        let mut ctx = gimli::UnwindContext::new();
        let mut entries = eh.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else { continue };
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else { continue };
            let start = fde.initial_address();
            let below = saved_below_cfa(&eh, &bases, &mut ctx, &fde);
            out.fdes.push((start, start.saturating_add(fde.len()), below));
        }
        out.fdes.sort_unstable();
        out
    }

    /// How far below its CFA the function at link-time address `addr`
    /// saves its return address register, if its CFI says so, always at
    /// one place.
    pub fn below_cfa(&self, addr: u64) -> Option<u32> {
        let i = self.fdes.partition_point(|f| f.0 <= addr).checked_sub(1)?;
        let (start, end, below) = self.fdes[i];
        (start <= addr && addr < end).then_some(below).flatten()
    }
}

/// The one offset below the CFA where `fde`'s rows save its return address
/// register, None if none does or they disagree (or the CFI does not parse).
fn saved_below_cfa<R: gimli::Reader<Offset = usize>>(
    eh: &EhFrame<R>,
    bases: &BaseAddresses,
    ctx: &mut gimli::UnwindContext<usize>,
    fde: &gimli::FrameDescriptionEntry<R>,
) -> Option<u32> {
    let ra = fde.cie().return_address_register();
    let mut table = fde.rows(eh, bases, ctx).ok()?;
    let mut found = None;
    let mut rows = 0;
    while let Ok(Some(row)) = table.next_row() {
        rows += 1;
        if rows > 4096 {
            return None;
        }
        match row.register(ra) {
            Some(gimli::RegisterRule::Offset(n)) => {
                let below = u32::try_from(n.checked_neg()?).ok().filter(|b| *b > 0 && b % 8 == 0)?;
                if found.is_some_and(|f| f != below) {
                    return None;
                }
                found = Some(below);
            }
            None | Some(gimli::RegisterRule::Undefined) | Some(gimli::RegisterRule::SameValue) => {}
            Some(_) => return None,
        }
    }
    found
}

/// The `.eh_frame` section: its address and bytes, as gimli reads them
/// ([`readable`]).
fn eh_frame(elf: &ElfFile) -> Option<(u64, Cow<'_, [u8]>)> {
    let s = elf.sections.iter().find(|s| s.name == ".eh_frame" && !s.nobits)?;
    let end = s.offset.checked_add(s.size)?;
    let bytes = elf.data().get(usize::try_from(s.offset).ok()?..usize::try_from(end).ok()?)?;
    Some((s.addr, readable(bytes)))
}

/// `.eh_frame` bytes with the CIE augmentations gimli does not know made
/// ones it does: AArch64's `B` (return addresses signed with key B) and
/// `G` (memory-tagged frames) carry no data, and neither changes a
/// function's bounds, landing pads or saved registers, so each becomes
/// `S`, which carries none either. gimli refuses an unknown augmentation,
/// and stops reading the section at the first one: without this, one
/// function built with `-mbranch-protection=pac-ret+b-key` would hide
/// every function after it.
fn readable(bytes: &[u8]) -> Cow<'_, [u8]> {
    let mut patched: Option<Vec<u8>> = None;
    let mut off = 0usize;
    while let Some(len) = bytes.get(off..off + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize) {
        if len == 0 || len == 0xffff_ffff {
            break; // the terminator, or a 64-bit entry (not in .eh_frame)
        }
        let entry = off + 4;
        let Some(next) = entry.checked_add(len).filter(|&n| n <= bytes.len()) else { break };
        let is_cie = bytes.get(entry..entry + 4) == Some(&[0, 0, 0, 0]);
        if is_cie && len > 5 {
            // CIE id, version, then the NUL-terminated augmentation string.
            let aug = entry + 5;
            for k in aug..next {
                match bytes[k] {
                    0 => break,
                    b'B' | b'G' => patched.get_or_insert_with(|| bytes.to_vec())[k] = b'S',
                    _ => {}
                }
            }
        }
        off = next;
    }
    patched.map_or(Cow::Borrowed(bytes), Cow::Owned)
}

fn read_u64(elf: &ElfFile, addr: u64) -> Option<u64> {
    Some(u64::from_le_bytes(elf.bytes_at(FileAddr(addr), 8)?.try_into().ok()?))
}

/// A cursor over LSDA bytes at a known address.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    addr: u64,
}

impl Cursor<'_> {
    fn u8(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn fixed(&mut self, n: usize) -> Option<u64> {
        let b = self.bytes.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(b.iter().rev().fold(0u64, |v, &x| (v << 8) | x as u64))
    }

    fn uleb(&mut self) -> Option<u64> {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= ((b & 0x7f) as u64) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
    }

    fn sleb(&mut self) -> Option<u64> {
        let (mut v, mut shift) = (0i64, 0);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= ((b & 0x7f) as i64) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v as u64);
            }
        }
    }

    /// A `DW_EH_PE_*` encoded value: absolute or PC-relative applications only.
    fn encoded(&mut self, enc: u8) -> Option<u64> {
        let field = self.addr + self.pos as u64;
        let sext = |v: u64, bits: u32| ((v << (64 - bits)) as i64 >> (64 - bits)) as u64;
        let v = match enc & 0x0f {
            0x00 | 0x04 | 0x0c => self.fixed(8)?,
            0x01 => self.uleb()?,
            0x02 => self.fixed(2)?,
            0x03 => self.fixed(4)?,
            0x09 => self.sleb()?,
            0x0a => sext(self.fixed(2)?, 16),
            0x0b => sext(self.fixed(4)?, 32),
            _ => return None,
        };
        match enc & 0x70 {
            0x00 => Some(v),
            0x10 => Some(field.wrapping_add(v)),
            _ => None,
        }
    }
}

const OMIT: u8 = 0xff;

/// The landing pads of the LSDA at `addr` of the function starting at
/// `func`, or `None` if it cannot be read.
fn parse_lsda(elf: &ElfFile, addr: u64, func: u64) -> Option<Vec<u64>> {
    let bytes = elf.bytes_from(addr)?;
    let mut c = Cursor { bytes, pos: 0, addr };
    let lp_enc = c.u8()?;
    let lp_start = if lp_enc == OMIT { func } else { c.encoded(lp_enc)? };
    if c.u8()? != OMIT {
        c.uleb()?; // offset of the type table: not needed
    }
    let cs_enc = c.u8()?;
    let cs_len = c.uleb()? as usize;
    let end = c.pos.checked_add(cs_len)?;
    if end > bytes.len() {
        return None;
    }
    let mut pads = Vec::new();
    while c.pos < end {
        let _start = c.encoded(cs_enc)?;
        let _len = c.encoded(cs_enc)?;
        let pad = c.encoded(cs_enc)?;
        c.uleb()?; // action
        if pad != 0 {
            pads.push(lp_start.wrapping_add(pad));
        }
    }
    (c.pos == end).then_some(pads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CIE with augmentation `zR` plus `extra`, for functions whose code
    /// aligns to 4 and whose return address is in register 30, then one FDE
    /// for 0x1000..0x1040: the return address signed (negate_ra_state), a
    /// 32-byte frame, registers 29 and 30 saved at cfa-32 and cfa-24.
    fn eh_frame_with(extra: &[u8]) -> Vec<u8> {
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R'];
        cie.extend(extra);
        cie.extend([0, 4, 0x78, 30, 1, 0x1b, 0x0c, 31, 0]); // code align 4, data -8, RA 30, pcrel sdata4; def_cfa sp+0
        while !(cie.len() + 4).is_multiple_of(8) {
            cie.push(0);
        }
        let mut out = (cie.len() as u32).to_le_bytes().to_vec();
        out.extend(&cie);
        let fde_at = out.len();
        let mut fde = ((fde_at + 4) as u32).to_le_bytes().to_vec(); // back to the CIE
        let pc = 0x1000i64 - (0x80 + fde_at as i64 + 8); // the section lies at 0x80
        fde.extend((pc as i32).to_le_bytes());
        fde.extend(0x40u32.to_le_bytes());
        fde.push(0); // no augmentation data
        fde.extend([0x41, 0x2d, 0x41, 0x0e, 32, 0x9d, 4, 0x9e, 3]);
        while !(fde.len() + 4).is_multiple_of(8) {
            fde.push(0);
        }
        out.extend((fde.len() as u32).to_le_bytes());
        out.extend(&fde);
        out.extend([0, 0, 0, 0]);
        out
    }

    #[test]
    fn where_a_function_saves_its_return_address_also_with_key_b() {
        for extra in [&b""[..], b"B", b"G"] {
            let bytes = eh_frame_with(extra);
            let saves = ReturnSaves::of_eh_frame(0x80, &readable(&bytes));
            assert_eq!(saves.below_cfa(0x1000), Some(24), "augmentation zR{}", String::from_utf8_lossy(extra));
            assert_eq!(saves.below_cfa(0x1040), None, "past the function");
        }
        // Without readable(), gimli stops at the B.
        let saves = ReturnSaves::of_eh_frame(0x80, &eh_frame_with(b"B"));
        assert_eq!(saves.below_cfa(0x1000), None);
    }

    #[test]
    fn leb128_and_encoded_values() {
        let bytes = [0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f, 0xfc, 0xff, 0xff, 0xff];
        let mut c = Cursor { bytes: &bytes, pos: 0, addr: 0x1000 };
        assert_eq!(c.uleb(), Some(624485));
        assert_eq!(c.sleb(), Some(-1i64 as u64));
        assert_eq!(c.sleb(), Some(-128i64 as u64));
        // pcrel sdata4 at 0x1006: -4 relative to the field.
        assert_eq!(c.encoded(0x1b), Some(0x1002));
        assert_eq!(c.encoded(0x1b), None, "past the end");
    }

    #[test]
    fn unknown_encodings_are_refused_not_guessed() {
        let mut c = Cursor { bytes: &[0; 8], pos: 0, addr: 0 };
        assert_eq!(c.encoded(0x33), None, "datarel");
        assert_eq!(c.encoded(0x05), None, "no such format");
    }

    #[test]
    fn pads_strictly_inside_a_range() {
        let lp = LandingPads { pads: vec![0x10, 0x12, 0x15, 0x20], unreadable: vec![(0x100, 0x140)] };
        assert_eq!(lp.strictly_inside(0x10, 0x15).collect::<Vec<_>>(), [0x12]);
        assert_eq!(lp.strictly_inside(0x0f, 0x16).collect::<Vec<_>>(), [0x10, 0x12, 0x15]);
        assert!(lp.unknown_at(0x100) && lp.unknown_at(0x13f) && !lp.unknown_at(0x140));
    }
}
