//! Reading the per-thread rings: each thread slot is a single-producer
//! single-consumer ring; the thread publishes `head` after writing an event,
//! the tracer publishes `tail` after reading.

use anyhow::Result;

use super::RawEvent;
use crate::probe::layout::{Event, Header, SlotHead};
use crate::probe::region::Region;

/// Offsets of `head` and `tail` in a slot.
const HEAD: u64 = std::mem::offset_of!(SlotHead, head) as u64;
const TAIL: u64 = std::mem::offset_of!(SlotHead, tail) as u64;

/// Drains every thread's ring.
#[derive(Debug, Default)]
pub struct Drainer {
    /// Events read so far.
    pub read: u64,
}

impl Drainer {
    /// Appends every event published since the last call to `out`, in ring
    /// order per thread (threads one after another). A thread never has more
    /// than a ring's worth unread; a `head` further on (the target wrote it)
    /// gives the last ring's worth, so a drain is bounded by the rings.
    pub fn drain(&mut self, region: &Region, out: &mut Vec<RawEvent>) -> Result<()> {
        let h = region.header();
        let ring_len = h.ctx.ring_mask as u64 + 1;
        for off in slots_in_use(&h) {
            let head = region.load_u64(off + HEAD);
            let tail = region.load_u64(off + TAIL);
            if head == tail {
                continue;
            }
            let unread = head.wrapping_sub(tail).min(ring_len);
            for k in head.wrapping_sub(unread)..head {
                let e: Event = region.get(h.event_off(off, k));
                if let Some(r) = RawEvent::decode(&e) {
                    out.push(r);
                }
                self.read += 1;
            }
            region.store_u64(off + TAIL, head)?;
        }
        Ok(())
    }

    /// Drops every event not read yet (left by an earlier session), so a new
    /// session starts with empty rings. Call it with the target stopped.
    pub fn discard_unread(region: &Region) -> Result<()> {
        let h = region.header();
        for off in slots_in_use(&h) {
            region.store_u64(off + TAIL, region.load_u64(off + HEAD))?;
        }
        Ok(())
    }

    /// Events dropped so far: rings that were full, shadow stacks that were
    /// full, and events with no free thread slot.
    pub fn lost(region: &Region) -> u64 {
        let h: Header = region.header();
        let mut lost = h.ctx.lost_no_slot;
        for off in slots_in_use(&h) {
            lost = lost.saturating_add(region.get::<SlotHead>(off).lost);
        }
        lost
    }
}

/// Offsets of the thread slots some thread has claimed, from the header's
/// bitmap. The others are not read (that would allocate their pages).
fn slots_in_use(h: &Header) -> impl Iterator<Item = u64> + '_ {
    (0..1u64 << h.ctx.slot_bits)
        .filter(|&i| h.ctx.claimed[(i / 64) as usize] & (1 << (i % 64)) != 0)
        .map(|i| h.slot_off(i))
}
