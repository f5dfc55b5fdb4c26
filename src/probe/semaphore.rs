//! Static probes' semaphores: a `u16` the program reads before it prepares
//! a probe's arguments (`if (tpsdt_tick_semaphore) STAP_PROBE...`), which
//! tracers increment while they trace the probe and decrement after.
//!
//! tp changes one with a read and a write through `/proc/PID/mem` while
//! every thread of the process is stopped, so the program never sees half
//! a change (another tracer, such as the kernel's uprobes, may write it
//! too: each only adds and takes back its own). The region records the
//! address in the probe's entry, and the rule is one increment per process
//! whose site holds the patch: incremented before the patch is written,
//! decremented after the original bytes are back ([`super::install`],
//! [`super::remove`]). A tracer killed between the two leaves one increment
//! behind (the program keeps preparing arguments nobody reads), never one
//! taken back twice. The address comes from the region, which the target
//! can write: it must be a 2-byte-aligned word of a private, writable
//! mapping of the process, else it is left alone.

use anyhow::{Result, bail};

use crate::process::Mapping;
use crate::process::memory::Memory;

/// True if `addr` may be a semaphore of a process whose mappings are
/// `maps`: aligned, inside a private writable mapping.
pub fn plausible(addr: u64, maps: &[Mapping]) -> bool {
    addr.is_multiple_of(2)
        && maps
            .iter()
            .any(|m| m.write && !m.shared && m.start <= addr && addr.checked_add(2).is_some_and(|e| e <= m.end))
}

/// Adds one to the semaphore at `addr`; refuses one at its maximum.
pub fn acquire(mem: &Memory, addr: u64) -> Result<()> {
    let now = read(mem, addr)?;
    let Some(next) = now.checked_add(1) else {
        bail!("the semaphore at {addr:#x} is at its maximum ({now})");
    };
    mem.write(addr, &next.to_le_bytes())?;
    Ok(())
}

/// Takes one back from the semaphore at `addr`; one at 0 (something reset
/// it) stays 0.
pub fn release(mem: &Memory, addr: u64) -> Result<()> {
    let now = read(mem, addr)?;
    if now > 0 {
        mem.write(addr, &(now - 1).to_le_bytes())?;
    }
    Ok(())
}

/// The semaphore's value.
pub fn read(mem: &Memory, addr: u64) -> Result<u16> {
    let b = mem.read_vec(addr, 2)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(start: u64, end: u64, write: bool, shared: bool) -> Mapping {
        Mapping { start, end, read: true, write, exec: false, shared, offset: 0, dev: 0, inode: 0, path: String::new() }
    }

    #[test]
    fn only_aligned_words_of_private_writable_memory() {
        let maps =
            [map(0x1000, 0x2000, true, false), map(0x2000, 0x3000, false, false), map(0x3000, 0x4000, true, true)];
        assert!(plausible(0x1000, &maps) && plausible(0x1ffe, &maps));
        assert!(!plausible(0x1001, &maps), "unaligned");
        assert!(!plausible(0x2000, &maps), "read-only");
        assert!(!plausible(0x3000, &maps), "shared");
        assert!(!plausible(0x5000, &maps) && !plausible(u64::MAX - 1, &maps));
    }

    #[test]
    fn a_semaphore_counts_in_this_process() {
        static SEMAPHORE: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let mem = Memory::open(std::process::id() as i32).unwrap();
        let addr = &SEMAPHORE as *const _ as u64;
        acquire(&mem, addr).unwrap();
        acquire(&mem, addr).unwrap();
        assert_eq!(read(&mem, addr).unwrap(), 2);
        release(&mem, addr).unwrap();
        release(&mem, addr).unwrap();
        release(&mem, addr).unwrap();
        assert_eq!(SEMAPHORE.load(std::sync::atomic::Ordering::SeqCst), 0, "never below 0");
    }
}
