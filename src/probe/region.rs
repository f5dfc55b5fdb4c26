//! The tracer's handle on a target's data region.
//!
//! A region is found by its memfd name in `/proc/PID/maps`. tp maps the
//! memfd itself only when [`super::acquire`] got hold of it safely (it needs
//! CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE for `/proc/PID/map_files/`, and
//! a memfd sealed against shrinking); otherwise it reads and writes the
//! region through `/proc/PID/mem`, which only needs ptrace access.
//!
//! Every byte of a region is the target's to change. [`Region::open`]
//! accepts a region only if its header and every entry pass
//! [`super::validate`]; after that the region keeps the header it checked,
//! and every read of the header is rebuilt from it
//! ([`super::validate::sanitize`]), so no offset, size or count tp uses can
//! change under it. No accessor panics on an offset out of range: reads
//! give zeros, writes an error.

pub mod create;

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

use super::layout::{self, Entry, Header, MEMFD_NAME, Plain, State};
use super::{acquire, validate};
use crate::addr::{RegionOffset, RuntimeAddr};
use crate::process::Mapping;
use crate::process::memory::Memory;

/// How the tracer reaches the region's bytes.
#[derive(Debug)]
enum Backing {
    /// The memfd mapped into this process.
    Mapped { ptr: *mut u8, len: usize, _file: File },
    /// Through the target's `/proc/PID/mem`.
    Remote { mem: Memory, addr: u64 },
}

/// A target's data region.
#[derive(Debug)]
pub struct Region {
    backing: Backing,
    target_addr: u64,
    len: u64,
    inode: u64,
    /// The header as validated (or as tp wrote it on creation): the
    /// geometry every accessor uses.
    fixed: std::sync::OnceLock<Header>,
}

/// The header's fields that never change once it is written: read once, so
/// the per-probe accessors do not copy the header each time.
#[derive(Debug, Clone, Copy)]
struct Fixed {
    probes_off: u64,
    flags_off: u64,
    budgets_off: u64,
    periods_off: u64,
    counters_off: u64,
    countdowns_off: u64,
    slot_bits: u32,
    stride_shift: u32,
}

impl Fixed {
    fn of(h: &Header) -> Fixed {
        Fixed {
            probes_off: h.probes_off,
            flags_off: h.flags_off,
            budgets_off: h.budgets_off,
            periods_off: h.periods_off,
            counters_off: h.counters_off,
            countdowns_off: h.countdowns_off,
            slot_bits: h.slot_bits,
            stride_shift: h.stride_shift,
        }
    }

    fn counter_off(&self, row: u64, i: u32) -> u64 {
        self.counters_off + (row << self.stride_shift) + i as u64 * 8
    }
}

/// Finds tp's data region among a process's mappings. A tp tracer maps
/// regions too; [`Region::open`] and [`is_target_view`] tell the two apart.
pub fn find(maps: &[Mapping]) -> Option<&Mapping> {
    let prefix = format!("/memfd:{MEMFD_NAME}");
    maps.iter().find(|m| m.shared && (m.path == prefix || m.path.starts_with(&format!("{prefix} "))))
}

/// True if the region `mapping` of process `pid` is a target's (its header
/// records the mapping's own address), not a tp tracer's view of one. Reads
/// only the header, through `/proc/PID/mem`: nothing is mapped.
pub fn is_target_view(pid: i32, mapping: &Mapping) -> bool {
    let Ok(mem) = Memory::open(pid) else { return false };
    let mut buf = vec![0u8; std::mem::size_of::<Header>()];
    if buf.len() as u64 > mapping.len() || mem.read(mapping.start, &mut buf).is_err() {
        // Too short for a header: not a tracer's view; Region::open says what is wrong.
        return true;
    }
    let h: Header = layout::from_bytes(&buf);
    h.magic != layout::MAGIC || h.target_addr == mapping.start
}

impl Region {
    /// Maps `file` (the region's memfd, at least `len` bytes long and sealed
    /// against shrinking: see [`acquire`]) into this process.
    pub fn from_file(file: File, target_addr: u64, len: u64) -> Result<Region> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we hold; nothing else in this
        // process aliases it, and it is unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("cannot map tp's data region: {}", std::io::Error::last_os_error());
        }
        use std::os::unix::fs::MetadataExt;
        let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
        Ok(Region {
            backing: Backing::Mapped { ptr: ptr as *mut u8, len: len as usize, _file: file },
            target_addr,
            len,
            inode,
            fixed: std::sync::OnceLock::new(),
        })
    }

    /// Opens the existing region `mapping` of process `pid` and checks its
    /// header and every entry ([`validate`]): a region that fails is an error
    /// naming the process and the problem, and is never used.
    pub fn open(pid: i32, mapping: &Mapping) -> Result<Region> {
        let region = match acquire::open_existing(pid, mapping) {
            Some(file) => Region::from_file(file, mapping.start, mapping.len())?,
            None => Region {
                backing: Backing::Remote { mem: Memory::open(pid)?, addr: mapping.start },
                target_addr: mapping.start,
                len: mapping.len(),
                inode: mapping.inode,
                fixed: std::sync::OnceLock::new(),
            },
        };
        let raw: Header = region.get(0);
        if raw.magic == layout::MAGIC && raw.version == layout::VERSION && raw.target_addr != mapping.start {
            // Tracers map the same memfd elsewhere: this is a tp, not a target.
            bail!("process {pid} is a tp tracer, not a target (its view of a region is at {:#x})", mapping.start);
        }
        validate::header(&raw, region.len).map_err(|e| anyhow::anyhow!("process {pid}: {e}"))?;
        let _ = region.fixed.set(raw);
        region.check_entries().map_err(|e| anyhow::anyhow!("process {pid}: tp's data region is corrupt: {e}"))?;
        Ok(region)
    }

    /// The inode of the memfd behind the region.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Checks every entry in use ([`validate::entry`]).
    pub fn check_entries(&self) -> Result<(), String> {
        let h = self.header();
        for i in 0..h.count {
            validate::entry(&self.entry(i), &h).map_err(|why| format!("entry {i}: {why}"))?;
        }
        Ok(())
    }

    /// True if `maps` (of the target) still show this region at its address.
    pub fn is_mapped_in(&self, maps: &[Mapping]) -> bool {
        maps.iter().any(|m| m.start == self.target_addr && m.inode == self.inode && m.shared)
    }

    /// The region's address in the target.
    pub fn target_addr(&self) -> u64 {
        self.target_addr
    }

    /// The region's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-sized region (never the case once created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if `len` bytes at offset `off` lie inside the region.
    fn inside(&self, off: u64, len: usize) -> bool {
        off.checked_add(len as u64).is_some_and(|end| end <= self.len)
    }

    /// Reads bytes at offset `off` of the region (zeros where it has none).
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        if !self.inside(off, buf.len()) {
            buf.fill(0);
            return;
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: in bounds (checked above) of a live mapping; the bytes
                // may change concurrently, which a byte copy tolerates.
                unsafe { std::ptr::copy_nonoverlapping(ptr.add(off as usize), buf.as_mut_ptr(), buf.len()) }
            }
            Backing::Remote { mem, addr } => {
                if mem.read(addr + off, buf).is_err() {
                    buf.fill(0);
                }
            }
        }
    }

    /// Writes bytes at offset `off` of the region.
    pub fn write(&self, off: u64, bytes: &[u8]) -> Result<()> {
        if !self.inside(off, bytes.len()) {
            bail!("a write at {off:#x} would pass the end of tp's data region ({:#x} bytes)", self.len);
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: in bounds of a live, writable mapping.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.add(off as usize), bytes.len()) }
            }
            Backing::Remote { mem, addr } => mem.write(addr + off, bytes).context("writing tp's data region")?,
        }
        Ok(())
    }

    /// A plain value at offset `off` (all zeros if the region has no such bytes).
    pub fn get<T: Plain>(&self, off: u64) -> T {
        let size = std::mem::size_of::<T>();
        match &self.backing {
            Backing::Mapped { .. } | Backing::Remote { .. } if !self.inside(off, size) => {
                layout::from_bytes(&vec![0u8; size])
            }
            Backing::Mapped { ptr, .. } => {
                // SAFETY: in bounds of a live mapping; T is Plain (valid for
                // any bits); the bytes may change concurrently, which a copy
                // of plain data tolerates.
                unsafe { std::ptr::read_unaligned(ptr.add(off as usize) as *const T) }
            }
            Backing::Remote { .. } => {
                let mut buf = vec![0u8; size];
                self.read(off, &mut buf);
                layout::from_bytes(&buf)
            }
        }
    }

    /// The header: its geometry as validated, and what changes (entries in
    /// use, arenas, the runtime's bookkeeping) as the region holds it now,
    /// clamped ([`validate::sanitize`]).
    pub fn header(&self) -> Header {
        let live: Header = self.get(0);
        match self.fixed.get() {
            Some(fixed) => validate::sanitize(&live, fixed),
            None => live,
        }
    }

    /// Replaces the header. The first header tp writes into a region it
    /// created is the geometry from then on.
    pub fn set_header(&self, h: &Header) -> Result<()> {
        if self.fixed.get().is_none() {
            validate::header(h, self.len).map_err(|e| anyhow::anyhow!("tp's own header: {e}"))?;
            let _ = self.fixed.set(*h);
        }
        self.write(0, layout::bytes_of(h))
    }

    /// The validated header's offsets (those of an empty geometry if there
    /// is none yet, which only a region being created has).
    fn fixed(&self) -> Fixed {
        match self.fixed.get() {
            Some(h) => Fixed::of(h),
            None => Fixed::of(&Header::new(&layout::geometry(0, layout::DEFAULT_RING_LEN), 0, self.target_addr, 0)),
        }
    }

    /// Entry `i`.
    pub fn entry(&self, i: u32) -> Entry {
        self.get(self.fixed().probes_off + i as u64 * layout::ENTRY_SIZE)
    }

    /// The state of entry `i` alone.
    pub fn state(&self, i: u32) -> State {
        let off = self.fixed().probes_off + i as u64 * layout::ENTRY_SIZE + std::mem::offset_of!(Entry, state) as u64;
        let mut b = [0; 4];
        self.read(off, &mut b);
        State::from_u32(u32::from_le_bytes(b))
    }

    /// Replaces entry `i` and bumps the generation.
    pub fn set_entry(&self, i: u32, e: &Entry) -> Result<()> {
        let (capacity, off) = self.geometry(|h| (h.capacity, h.entry_off(i)));
        if i >= capacity {
            bail!("entry {i} is past the capacity of tp's data region ({capacity})");
        }
        self.write(off, layout::bytes_of(e))?;
        let at = std::mem::offset_of!(Header, generation) as u64;
        let mut was = [0; 8];
        self.read(at, &mut was);
        let generation = u64::from_le_bytes(was).wrapping_add(1);
        self.write(at, &generation.to_le_bytes())
    }

    /// `f` of the header's geometry (as validated; the header as it is
    /// for a region being created), without copying the header: the
    /// per-probe writes of a large attach ask it for every probe.
    fn geometry<R>(&self, f: impl FnOnce(&Header) -> R) -> R {
        match self.fixed.get() {
            Some(h) => f(h),
            None => f(&self.header()),
        }
    }

    /// Probe `i`'s configuration ([`layout::ProbeConfig`]), as the target
    /// holds it now (its words are the target's to write); none past the
    /// capacity.
    pub fn config(&self, i: u32) -> Option<layout::ProbeConfig> {
        let (capacity, off) = self.geometry(|h| (h.capacity, h.config_off(i)));
        (i < capacity).then(|| self.get(off))
    }

    /// Writes probe `i`'s configuration ([`layout::ProbeConfig`]).
    pub fn set_config(&self, i: u32, c: &layout::ProbeConfig) -> Result<()> {
        let (capacity, off) = self.geometry(|h| (h.capacity, h.config_off(i)));
        if i >= capacity {
            bail!("entry {i} is past the capacity of tp's data region ({capacity})");
        }
        self.write(off, layout::bytes_of(c))
    }

    /// Adds `n` calls to probe `i`'s count, in the shared counter row (as
    /// the target's threads add to it: atomically): the calls a session
    /// counted for a kept probe it went over.
    pub fn add_hits(&self, i: u32, n: u64) {
        let off = self.fixed().counter_off(0, i);
        for _ in 0..64 {
            let now = self.load_u64(off);
            if self.compare_exchange_u64(off, now, now.wrapping_add(n)) {
                return;
            }
        }
    }

    /// `--if`: the calls of probe `i` that passed its predicates
    /// ([`layout::ProbeConfig::matched`]).
    pub fn matched(&self, i: u32) -> u64 {
        let h = self.header();
        if i >= h.capacity {
            return 0;
        }
        self.load_u64(h.config_off(i) + std::mem::offset_of!(layout::ProbeConfig, matched) as u64)
    }

    /// Sets only the state of entry `i`.
    pub fn set_state(&self, i: u32, s: State) -> Result<()> {
        let mut e = self.entry(i);
        e.state = s as u32;
        self.set_entry(i, &e)
    }

    /// Every entry in use that passes [`validate::entry`], with its index.
    /// An entry the target changed into something tp never writes is left
    /// out: tp never acts on it.
    pub fn entries(&self) -> Vec<(u32, Entry)> {
        let h = self.header();
        (0..h.count).map(|i| (i, self.entry(i))).filter(|(_, e)| validate::entry(e, &h).is_ok()).collect()
    }

    /// Turns probe `i`'s detour on or off.
    pub fn set_enabled(&self, i: u32, on: bool) -> Result<()> {
        let off = self.fixed().flags_off + i as u64;
        self.write(off, &[on as u8])
    }

    /// True if probe `i` is enabled.
    pub fn enabled(&self, i: u32) -> bool {
        let mut b = [0];
        self.read(self.fixed().flags_off + i as u64, &mut b);
        b[0] != 0
    }

    /// Sets probe `i`'s sample budget (tp profile).
    pub fn set_budget(&self, i: u32, n: i32) -> Result<()> {
        self.store_u32(self.fixed().budgets_off + 4 * i as u64, n as u32)
    }

    /// Sets probe `i`'s sampling period: one call in `period` is timed, on
    /// average (0 or 1: every call).
    pub fn set_period(&self, i: u32, period: u32) -> Result<()> {
        self.store_u32(self.fixed().periods_off + 4 * i as u64, period)
    }

    /// Probe `i`'s sampling period ([`Region::set_period`]; 0 until tp
    /// sets one, and again after an install of the probe).
    pub fn period(&self, i: u32) -> u32 {
        self.load_u32(self.fixed().periods_off + 4 * i as u64)
    }

    /// Sets probe `i`'s sampling countdown in every counter row a thread
    /// uses to a value from `value` (the target's threads update them too;
    /// a lost update only moves one sample).
    pub fn set_countdowns(&self, i: u32, mut value: impl FnMut() -> u64) -> Result<()> {
        let f = self.fixed();
        for r in self.rows_in_use(&f, i) {
            self.store_u64(f.counter_off(r, i) + f.countdowns_off - f.counters_off, value())?;
        }
        Ok(())
    }

    /// The sample budgets of `probes` (one header read for all).
    pub fn budgets_of(&self, probes: &[u32]) -> Vec<i32> {
        let off = self.fixed().budgets_off;
        probes
            .iter()
            .map(|&i| {
                let mut b = [0; 4];
                self.read(off + 4 * i as u64, &mut b);
                i32::from_le_bytes(b)
            })
            .collect()
    }

    /// The hits of each of `probes`: the sum over the counter rows.
    pub fn hits_of(&self, probes: &[u32]) -> Vec<u64> {
        let f = self.fixed();
        let resident = self.resident_counter_pages(&f);
        // Rows some thread wrote: most processes use a few of the 64.
        let row_pages = ((1u64 << f.stride_shift) / 4096).max(1) as usize;
        let rows: Vec<u64> = (0..1u64 << f.slot_bits)
            .filter(|&r| {
                resident.get(r as usize * row_pages..(r as usize + 1) * row_pages).is_some_and(|p| p.iter().any(|&p| p))
            })
            .collect();
        probes
            .iter()
            .map(|&i| {
                rows.iter()
                    .map(|&row| f.counter_off(row, i))
                    .filter(|&off| resident.get(((off - f.counters_off) / 4096) as usize) == Some(&true))
                    .map(|off| self.load_u64(off))
                    .fold(0u64, u64::wrapping_add)
            })
            .collect()
    }

    /// Where the region's byte `off` is in the target.
    pub fn addr_of(&self, off: RegionOffset) -> RuntimeAddr {
        RuntimeAddr(self.target_addr) + off
    }

    /// Address in the target of probe `i`'s enable flag.
    pub fn flag_addr(&self, i: u32) -> RuntimeAddr {
        self.addr_of(RegionOffset(self.fixed().flags_off + i as u64))
    }

    /// For each page of the counter rows, whether some thread has written
    /// it: one `mincore` for all. Pages never written are skipped: reading
    /// them would allocate memory for nothing.
    fn resident_counter_pages(&self, f: &Fixed) -> Vec<bool> {
        let pages = (((1u64 << f.slot_bits) << f.stride_shift) / 4096).max(1) as usize;
        if !self.inside(f.counters_off, pages * 4096) {
            return vec![false; pages];
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                let mut v = vec![0u8; pages];
                // SAFETY: the counter rows lie inside our mapping, page-aligned; one byte per page.
                let ok = unsafe {
                    let start = ptr.add(f.counters_off as usize) as *mut libc::c_void;
                    libc::mincore(start, pages * 4096, v.as_mut_ptr()) == 0
                };
                v.into_iter().map(|b| ok && b & 1 != 0).collect()
            }
            Backing::Remote { .. } => vec![true; pages],
        }
    }

    /// The counter rows in which probe `probe`'s counter page was written.
    fn rows_in_use(&self, f: &Fixed, probe: u32) -> Vec<u64> {
        let resident = self.resident_counter_pages(f);
        (0..1u64 << f.slot_bits)
            .filter(|&r| resident.get(((f.counter_off(r, probe) - f.counters_off) / 4096) as usize) == Some(&true))
            .collect()
    }

    /// Probe `i`'s hits: the sum over all counter rows.
    pub fn hits(&self, i: u32) -> u64 {
        self.hits_of(&[i])[0]
    }

    /// An 8-aligned u64 that the target updates concurrently, loaded
    /// atomically (acquire); 0 at an offset that is not one.
    pub fn load_u64(&self, off: u64) -> u64 {
        if !(off.is_multiple_of(8) && self.inside(off, 8)) {
            return 0;
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: 8-aligned, in bounds, shared with the target, which
                // updates it with locked instructions: an atomic load sees whole values.
                let a = unsafe { AtomicU64::from_ptr(ptr.add(off as usize) as *mut u64) };
                a.load(Ordering::Acquire)
            }
            Backing::Remote { mem, addr } => mem.read_u64(addr + off).unwrap_or(0),
        }
    }

    /// Stores an 8-aligned u64 that the target reads concurrently (release).
    pub fn store_u64(&self, off: u64, v: u64) -> Result<()> {
        if !(off.is_multiple_of(8) && self.inside(off, 8)) {
            bail!("bad u64 offset {off:#x} in tp's data region");
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: 8-aligned, in bounds, shared with the target.
                let a = unsafe { AtomicU64::from_ptr(ptr.add(off as usize) as *mut u64) };
                a.store(v, Ordering::Release);
                Ok(())
            }
            Backing::Remote { .. } => self.write(off, &v.to_le_bytes()),
        }
    }

    /// Replaces the 8-aligned u64 at `off` with `new` if it holds `old`
    /// (one compare-and-swap where the region is mapped); true if it did.
    pub fn compare_exchange_u64(&self, off: u64, old: u64, new: u64) -> bool {
        if !(off.is_multiple_of(8) && self.inside(off, 8)) {
            return false;
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: 8-aligned, in bounds, shared with the target, which
                // changes it with atomic instructions too.
                let a = unsafe { AtomicU64::from_ptr(ptr.add(off as usize) as *mut u64) };
                a.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            }
            // Through the target's memory there is no atomic access: a
            // compare and a write, which a target racing it can only spoil
            // for itself.
            Backing::Remote { .. } => self.load_u64(off) == old && self.write(off, &new.to_le_bytes()).is_ok(),
        }
    }

    /// Loads a 4-aligned u32 that the target changes with atomic
    /// instructions (acquire); 0 at an offset that is not one.
    pub fn load_u32(&self, off: u64) -> u32 {
        if !(off.is_multiple_of(4) && self.inside(off, 4)) {
            return 0;
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: 4-aligned, in bounds, shared with the target.
                let a = unsafe { std::sync::atomic::AtomicU32::from_ptr(ptr.add(off as usize) as *mut u32) };
                a.load(Ordering::Acquire)
            }
            Backing::Remote { .. } => {
                let mut b = [0; 4];
                self.read(off, &mut b);
                u32::from_le_bytes(b)
            }
        }
    }

    /// Waits at most `timeout` while the 4-aligned u32 at `off` holds
    /// `value` and nobody wakes it (a futex shared with the target, which
    /// maps the same memory); where tp reaches the region through the
    /// target's memory, sleeps `timeout`. Returns early on any wake.
    pub fn wait_u32(&self, off: u64, value: u32, timeout: std::time::Duration) {
        match &self.backing {
            Backing::Mapped { ptr, .. } if off.is_multiple_of(4) && self.inside(off, 4) => {
                let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
                // SAFETY: a futex wait on a 4-aligned word of a live
                // mapping, with a timeout on this stack; the kernel only reads both.
                unsafe {
                    libc::syscall(libc::SYS_futex, ptr.add(off as usize), libc::FUTEX_WAIT, value, &ts);
                }
            }
            _ => std::thread::sleep(timeout),
        }
    }

    /// Wakes every thread (of any process mapping the region) waiting on
    /// the 4-aligned u32 at `off`.
    pub fn wake_u32(&self, off: u64) {
        if let Backing::Mapped { ptr, .. } = &self.backing
            && off.is_multiple_of(4)
            && self.inside(off, 4)
        {
            // SAFETY: a futex wake on a 4-aligned word of a live mapping.
            unsafe {
                libc::syscall(libc::SYS_futex, ptr.add(off as usize), libc::FUTEX_WAKE, i32::MAX);
            }
        }
    }

    /// Stores a 4-aligned u32 that the target reads or changes with atomic
    /// instructions (relaxed: each value stands alone).
    pub fn store_u32(&self, off: u64, v: u32) -> Result<()> {
        if !(off.is_multiple_of(4) && self.inside(off, 4)) {
            bail!("bad u32 offset {off:#x} in tp's data region");
        }
        match &self.backing {
            Backing::Mapped { ptr, .. } => {
                // SAFETY: 4-aligned, in bounds, shared with the target.
                let a = unsafe { std::sync::atomic::AtomicU32::from_ptr(ptr.add(off as usize) as *mut u32) };
                a.store(v, Ordering::Relaxed);
                Ok(())
            }
            Backing::Remote { .. } => self.write(off, &v.to_le_bytes()),
        }
    }

    /// Sets probe `i`'s counters and sampling countdowns to zero in every
    /// row, and its period (the target is stopped).
    pub fn zero_hits(&self, i: u32) -> Result<()> {
        self.zero_hits_of(&[i])
    }

    /// [`Region::zero_hits`] for each of `probes`, with one `mincore` for
    /// all (one per probe costs seconds for thousands of probes).
    pub fn zero_hits_of(&self, probes: &[u32]) -> Result<()> {
        let f = self.fixed();
        let resident = self.resident_counter_pages(&f);
        let countdowns = f.countdowns_off - f.counters_off;
        for &i in probes {
            for r in 0..1u64 << f.slot_bits {
                let off = f.counter_off(r, i);
                if resident.get(((off - f.counters_off) / 4096) as usize) != Some(&true) {
                    continue;
                }
                for off in [off, off + countdowns] {
                    if self.load_u64(off) != 0 {
                        self.write(off, &0u64.to_le_bytes())?;
                    }
                }
            }
            self.set_period(i, 0)?;
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Mapped { ptr, len, .. } = self.backing {
            // SAFETY: unmapping the mapping made in from_file, exactly once.
            unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
        }
    }
}

/// A region for one probe in a memfd of this process, as if mapped in a
/// target at 0x7000_0000, its header written: for tests of what reads and
/// writes a region.
#[cfg(test)]
pub(crate) fn in_own_memfd() -> Region {
    let g = layout::geometry(1, layout::DEFAULT_RING_LEN);
    let fd = nix::sys::memfd::memfd_create(c"tp-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    let file = File::from(fd);
    file.set_len(g.total_size).unwrap();
    let r = Region::from_file(file, 0x7000_0000, g.total_size).unwrap();
    let elf_machine = <crate::arch::Host as crate::arch::Arch>::ELF_MACHINE as u32;
    r.set_header(&Header::new(&g, elf_machine, 0x7000_0000, 0x7f00_0000_0000)).unwrap();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::maps;

    #[test]
    fn finds_the_memfd_by_name() {
        let m = maps::parse(
            "7f00-8f00 rw-s 00000000 00:01 1 /memfd:other (deleted)\n\
             9f00-af00 rw-s 00000000 00:01 2 /memfd:tp-data (deleted)\n",
        );
        assert_eq!(find(&m).unwrap().start, 0x9f00);
        assert!(find(&m[..1]).is_none());
    }

    #[test]
    fn a_region_in_our_own_memfd_counts_and_flags() {
        let r = in_own_memfd();
        let g = layout::geometry(1, layout::DEFAULT_RING_LEN);
        assert_eq!(validate::header(&r.header(), r.len()), Ok(()));
        assert_eq!(r.hits(5), 0);
        // Two rows hold counts for probe 5: the sum is the hit count.
        let h = r.header();
        r.write(h.counter_off(3, 5), &40u64.to_le_bytes()).unwrap();
        r.write(h.counter_off(60, 5), &2u64.to_le_bytes()).unwrap();
        assert_eq!(r.hits(5), 42);
        r.zero_hits(5).unwrap();
        assert_eq!(r.hits(5), 0);
        r.set_enabled(5, true).unwrap();
        assert!(r.enabled(5) && !r.enabled(4));
        assert_eq!(r.flag_addr(5), RuntimeAddr(0x7000_0000 + g.flags_off + 5));
    }
}
