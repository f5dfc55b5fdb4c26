//! The vector state an AArch64 syscall discards, saved and written back
//! around the syscalls tp makes with a stopped thread of the target.
//!
//! Linux keeps only the low 128 bits of each SVE register (the V registers)
//! across a syscall: the rest of Z0..Z31, the predicates P0..P15 and FFR
//! become zero, and a thread in streaming mode (SME) leaves it
//! (Documentation/arch/arm64/sve.rst and sme.rst). A thread tp stops is
//! anywhere in its code, so it may be in the middle of an SVE `memcpy` with
//! the bytes it loaded in Z0 and its predicate in P0: the thread's own
//! syscalls never happen there, tp's would. Whichever of the two register
//! sets is live (NT_ARM_SSVE in streaming mode, else NT_ARM_SVE once the
//! thread has used SVE since its last syscall) is read whole and written
//! back after each syscall. ZA (SME's array) is kept by syscalls.

use std::io;

use crate::arch::RegisterSets;

const NT_ARM_SVE: u32 = 0x405;
const NT_ARM_SSVE: u32 = 0x40b;
/// `struct user_sve_header`: size, max_size (u32), vl, max_vl, flags,
/// reserved (u16).
const HEADER: usize = 16;
/// `flags` when the registers are live in their SVE form
/// (SVE_PT_REGS_SVE); otherwise the regset holds only the FPSIMD view,
/// which syscalls keep.
const REGS_SVE: u16 = 1;
/// The kernel takes these regsets in multiples of a quadword.
const QUADWORD: usize = 16;
/// More than the largest register set the architecture allows (2048-bit
/// vectors: 32 Z registers of 256 bytes, 17 predicates of 32, the header
/// and the status registers).
const MAX_SIZE: usize = 64 << 10;

/// The register set a syscall would discard, as the kernel gave it: which
/// one and its bytes. None when nothing live would be lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VectorState(Option<(u32, Vec<u8>)>);

/// Reads what a syscall of a stopped thread would discard from its register sets.
pub fn save(sets: &dyn RegisterSets) -> io::Result<VectorState> {
    // Streaming mode first: then NT_ARM_SVE shows nothing live.
    for nt in [NT_ARM_SSVE, NT_ARM_SVE] {
        if let Some(bytes) = live(sets, nt)? {
            return Ok(VectorState(Some((nt, bytes))));
        }
    }
    Ok(VectorState(None))
}

/// Writes back what [`save`] read.
pub fn restore(sets: &dyn RegisterSets, state: &VectorState) -> io::Result<()> {
    match &state.0 {
        Some((nt, bytes)) => sets.write(*nt, bytes),
        None => Ok(()),
    }
}

/// Register set `nt` of `sets`, whole, if its registers are live in their
/// SVE form; None if not, or if the kernel or the CPU has no such set.
fn live(sets: &dyn RegisterSets, nt: u32) -> io::Result<Option<Vec<u8>>> {
    let mut header = [0u8; HEADER];
    match sets.read(nt, &mut header) {
        Ok(n) if n == HEADER => {}
        Ok(_) => return Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENODEV | libc::EIO)) => return Ok(None),
        Err(e) => return Err(e),
    }
    let Some((size, flags)) = parse_header(&header) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("register set {nt:#x}: a header tp cannot use"),
        ));
    };
    if flags & REGS_SVE == 0 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; size.next_multiple_of(QUADWORD)];
    let n = sets.read(nt, &mut bytes)?;
    if n < size || parse_header(&bytes[..HEADER]) != Some((size, flags)) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("register set {nt:#x} changed while read")));
    }
    Ok(Some(bytes))
}

/// The size and flags of a `struct user_sve_header`, if the size is one a
/// register set can have.
fn parse_header(h: &[u8]) -> Option<(usize, u16)> {
    let size = u32::from_ne_bytes(h.get(..4)?.try_into().ok()?) as usize;
    let flags = u16::from_ne_bytes(h.get(12..14)?.try_into().ok()?);
    (HEADER..=MAX_SIZE).contains(&size).then_some((size, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(size: u32, flags: u16) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(&size.to_ne_bytes());
        h[8..10].copy_from_slice(&256u16.to_ne_bytes());
        h[12..14].copy_from_slice(&flags.to_ne_bytes());
        h
    }

    #[test]
    fn headers_are_read_and_bounded() {
        assert_eq!(parse_header(&header(8752, 1)), Some((8752, 1)));
        assert_eq!(parse_header(&header(528, 0)), Some((528, 0)));
        assert_eq!(parse_header(&header(8, 1)), None, "smaller than the header itself");
        assert_eq!(parse_header(&header(1 << 20, 1)), None, "beyond any vector length");
        assert_eq!(parse_header(&[0u8; 8]), None);
    }
}
