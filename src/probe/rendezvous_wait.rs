//! The rendezvous with the dynamic linker, as tp sees it in the data
//! region ([`layout::Rendezvous`]): tp arms it while a session waits for
//! libraries, waits for a thread to arrive at its probe on
//! `_dl_debug_state` (runtime.c, tp_rendezvous), and releases the thread
//! once it has probed what the loader mapped. A thread waits at most
//! [`layout::RENDEZVOUS_MAX_SLICES`] slices of
//! [`layout::RENDEZVOUS_SLICE_MS`], whatever tp does.

use std::mem::offset_of;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use anyhow::Result;

use super::layout::{self, Rendezvous};
use super::region::Region;

/// How long a thread at the rendezvous waits for tp at most, while tp
/// runs (a tp that is gone is not waited for): reading a large library's
/// symbols and installing its probes takes tp milliseconds to seconds.
pub const WAIT: Duration = Duration::from_secs(30);

fn off(field: usize) -> u64 {
    layout::RENDEZVOUS_OFF + field as u64
}

/// Makes threads at the rendezvous of process `pid` wait for tp, at most
/// [`WAIT`], and not once tp is gone.
pub fn arm(region: &Region, pid: i32) -> Result<()> {
    let slices = (WAIT.as_millis() as u32 / layout::RENDEZVOUS_SLICE_MS).min(layout::RENDEZVOUS_MAX_SLICES);
    region.store_u32(off(offset_of!(Rendezvous, slices)), slices)?;
    region.store_u32(off(offset_of!(Rendezvous, tracer)), tracer_in(pid))?;
    region.store_u32(off(offset_of!(Rendezvous, armed)), 1)
}

/// This process's PID as process `pid`'s PID namespace numbers it: its own
/// where both share the namespace, else 0 (unknown).
pub(super) fn tracer_in(pid: i32) -> u32 {
    let ns = |p: &str| std::fs::metadata(format!("/proc/{p}/ns/pid")).ok().map(|m| (m.dev(), m.ino()));
    match (ns("self"), ns(&pid.to_string())) {
        (Some(a), Some(b)) if a == b => std::process::id(),
        _ => 0,
    }
}

/// Where the loader keeps `r_state` (see [`layout::Rendezvous::state`]):
/// 0 makes every call of the rendezvous wait.
pub fn set_state_word(region: &Region, addr: u64) -> Result<()> {
    region.store_u64(off(offset_of!(Rendezvous, state)), addr)
}

/// Stops threads from waiting at the rendezvous, and releases those that do.
pub fn disarm(region: &Region) -> Result<()> {
    region.store_u32(off(offset_of!(Rendezvous, armed)), 0)?;
    release(region, arrived(region))
}

/// True while threads at the rendezvous wait for tp.
pub fn armed(region: &Region) -> bool {
    region.load_u32(off(offset_of!(Rendezvous, armed))) != 0
}

/// Arrivals at the rendezvous so far (wrapping).
pub fn arrived(region: &Region) -> u32 {
    region.load_u32(off(offset_of!(Rendezvous, arrived)))
}

/// The last arrival tp released.
pub fn handled(region: &Region) -> u32 {
    region.load_u32(off(offset_of!(Rendezvous, handled)))
}

/// Threads that went on without tp's answer.
pub fn gave_up(region: &Region) -> u32 {
    region.load_u32(off(offset_of!(Rendezvous, gave_up)))
}

/// True if a thread waits for tp: it arrived after the last release.
pub fn waiting(region: &Region) -> bool {
    arrived(region) != handled(region)
}

/// Waits at most `timeout` for a thread to arrive, unless one waits already.
pub fn wait_for_arrival(region: &Region, timeout: Duration) {
    let seen = arrived(region);
    if seen != handled(region) {
        return;
    }
    region.wait_u32(off(offset_of!(Rendezvous, arrived)), seen, timeout);
}

/// Releases the threads that arrived up to arrival `upto`.
pub fn release(region: &Region, upto: u32) -> Result<()> {
    region.store_u32(off(offset_of!(Rendezvous, handled)), upto)?;
    region.wake_u32(off(offset_of!(Rendezvous, handled)));
    Ok(())
}
