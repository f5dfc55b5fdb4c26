//! The hand-over of a call tp steps, as tp sees it in the data region
//! ([`layout::StepHandoff`]): tp arms it for the calls it still wants,
//! learns which thread waits at a probe of kind [`layout::kind::STEP`]
//! (runtime.c, tp_step), answers it once it holds the thread, and frees
//! the hand-over for the next call when the stepped call is done. A
//! thread waits at most [`super::rendezvous_wait::WAIT`], whatever tp does.

use std::mem::offset_of;
use std::time::Duration;

use anyhow::Result;

use super::layout::{self, StepHandoff};
use super::region::Region;

fn off(field: usize) -> u64 {
    layout::STEP_OFF + field as u64
}

/// Makes the next `calls` calls of the stepped probes of process `pid`
/// wait for tp (one at a time), each at most [`super::rendezvous_wait::WAIT`].
pub fn arm(region: &Region, pid: i32, calls: u32) -> Result<()> {
    let wait = super::rendezvous_wait::WAIT.as_millis() as u32 / layout::RENDEZVOUS_SLICE_MS;
    region.store_u32(off(offset_of!(StepHandoff, slices)), wait.min(layout::RENDEZVOUS_MAX_SLICES))?;
    region.store_u32(off(offset_of!(StepHandoff, tracer)), super::rendezvous_wait::tracer_in(pid))?;
    // A session killed while a call was stepped left the hand-over held.
    region.store_u32(off(offset_of!(StepHandoff, busy)), 0)?;
    region.store_u32(off(offset_of!(StepHandoff, armed)), calls)
}

/// Calls tp still wants to step.
pub fn armed(region: &Region) -> u32 {
    region.load_u32(off(offset_of!(StepHandoff, armed)))
}

/// Stops calls from waiting, and lets a waiting one go.
pub fn disarm(region: &Region) -> Result<()> {
    region.store_u32(off(offset_of!(StepHandoff, armed)), 0)?;
    answer(region)?;
    region.store_u32(off(offset_of!(StepHandoff, busy)), 0)
}

/// The thread that waits for tp, as its PID namespace numbers it, and its
/// arrival; None if no thread waits.
pub fn waiting(region: &Region) -> Option<(u32, u32)> {
    let arrived = region.load_u32(off(offset_of!(StepHandoff, arrived)));
    let handled = region.load_u32(off(offset_of!(StepHandoff, handled)));
    let busy = region.load_u32(off(offset_of!(StepHandoff, busy)));
    (arrived != handled && busy != 0).then(|| (region.load_u32(off(offset_of!(StepHandoff, tid))), arrived))
}

/// Waits at most `timeout` for a thread to arrive, unless one waits already.
pub fn wait_for_arrival(region: &Region, timeout: Duration) {
    let seen = region.load_u32(off(offset_of!(StepHandoff, arrived)));
    if seen != region.load_u32(off(offset_of!(StepHandoff, handled))) {
        return;
    }
    region.wait_u32(off(offset_of!(StepHandoff, arrived)), seen, timeout);
}

/// Answers every arrival so far: the waiting thread goes on (tp holds it
/// by now, or lets it go).
pub fn answer(region: &Region) -> Result<()> {
    let arrived = region.load_u32(off(offset_of!(StepHandoff, arrived)));
    region.store_u32(off(offset_of!(StepHandoff, handled)), arrived)?;
    region.wake_u32(off(offset_of!(StepHandoff, handled)));
    Ok(())
}

/// Ends the hand-over of one call: `left` more calls to step.
pub fn done(region: &Region, left: u32) -> Result<()> {
    region.store_u32(off(offset_of!(StepHandoff, armed)), left)?;
    region.store_u32(off(offset_of!(StepHandoff, busy)), 0)
}

/// Threads that went on without tp's answer.
pub fn gave_up(region: &Region) -> u32 {
    region.load_u32(off(offset_of!(StepHandoff, gave_up)))
}
