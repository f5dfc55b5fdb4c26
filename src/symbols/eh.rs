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
        let eh = EhFrame::new(eh_data, LittleEndian);
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

/// The `[start, start + len)` of every FDE of `elf`'s `.eh_frame` (link-time
/// addresses), in file order; FDEs that do not parse are skipped.
pub fn fde_ranges(elf: &ElfFile) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Some((eh_addr, eh_data)) = eh_frame(elf) else { return out };
    let eh = EhFrame::new(eh_data, LittleEndian);
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

/// The `.eh_frame` section: its address and bytes.
fn eh_frame(elf: &ElfFile) -> Option<(u64, &[u8])> {
    let s = elf.sections.iter().find(|s| s.name == ".eh_frame" && !s.nobits)?;
    let end = s.offset.checked_add(s.size)?;
    let bytes = elf.data().get(usize::try_from(s.offset).ok()?..usize::try_from(end).ok()?)?;
    Some((s.addr, bytes))
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
