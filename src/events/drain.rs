//! Reading the per-thread rings: each thread slot is a single-producer
//! single-consumer ring; the thread publishes `head` after writing an event,
//! the tracer publishes `tail` after reading. A slot belongs to one thread
//! of one process (its key: PID and TID), so every event read carries the
//! process that recorded it: the session's process or a child it forked
//! while the probes were in. The slots of processes that ended are freed
//! for others once drained ([`Drainer::free_ended`]).

use anyhow::Result;

use std::collections::HashMap;

use super::{Kind, RawEvent};
use crate::probe::layout::{self, Event, Header, SlotHead, event_kind};
use crate::probe::region::Region;

/// Offsets of `key`, `head` and `tail` in a slot.
const KEY: u64 = std::mem::offset_of!(SlotHead, key) as u64;
const HEAD: u64 = std::mem::offset_of!(SlotHead, head) as u64;
const TAIL: u64 = std::mem::offset_of!(SlotHead, tail) as u64;

/// The process (high 32 bits) that owns a slot with this key.
pub fn pid_of_key(key: u64) -> u32 {
    (key >> 32) as u32
}

/// Drains every thread's ring.
#[derive(Debug, Default)]
pub struct Drainer {
    /// Events read so far.
    pub read: u64,
    /// Per ring slot, the registers of an [`event_kind::ARGS_MORE`] event
    /// read last, waiting for the entry that follows it (which its thread
    /// may not have published yet): the slot's key, the probe, the
    /// timestamp, the two registers.
    more: HashMap<u64, (u64, u32, u64, [u64; layout::MORE_REGS])>,
}

impl Drainer {
    /// Appends every event published since the last call to `out`, in ring
    /// order per thread (threads one after another). A thread never has more
    /// than a ring's worth unread; a `head` further on (the target wrote it)
    /// gives the last ring's worth, so a drain is bounded by the rings.
    pub fn drain(&mut self, region: &Region, out: &mut Vec<RawEvent>) -> Result<()> {
        let mut words = Vec::new();
        self.drain_with_stacks(region, out, &mut words)
    }

    /// [`Drainer::drain`], and the stacks recorded after events: their words
    /// go to `words` (each event's [`RawEvent::stack`] says where). Stack
    /// records that follow no event of their ring, and words past
    /// [`super::stacks::MAX_WORDS`] for one event, are dropped.
    pub fn drain_with_stacks(&mut self, region: &Region, out: &mut Vec<RawEvent>, words: &mut Vec<u64>) -> Result<()> {
        let h = region.header();
        let ring_len = h.ctx.ring_mask as u64 + 1;
        for off in slots_in_use(&h) {
            let head = region.load_u64(off + HEAD);
            let tail = region.load_u64(off + TAIL);
            if head == tail {
                continue;
            }
            // After `head` (acquire): a slot's owner claims it before its
            // first event, and tp frees it only once drained and its
            // process has ended, so these events are the key's process's.
            let key = region.load_u64(off + KEY);
            let pid = pid_of_key(key);
            let unread = head.wrapping_sub(tail).min(ring_len);
            // The event of this ring that stack records belong to.
            let mut owner: Option<usize> = None;
            for k in head.wrapping_sub(unread)..head {
                let e: Event = region.get(h.event_off(off, k));
                let kind = (e.probe >> layout::KIND_SHIFT) as u8;
                if kind == event_kind::STACK {
                    let n = (e.probe & 0xff).min(layout::STACK_WORDS_PER_EVENT) as usize;
                    if let Some(ev) = owner.and_then(|i| out.get_mut(i))
                        && (ev.stack.1 as usize) + n <= super::stacks::MAX_WORDS
                    {
                        if ev.stack.1 == 0 {
                            ev.stack.0 = words.len() as u32;
                        }
                        let all = [e.tsc, e.v[0], e.v[1], e.v[2], e.v[3], e.v[4], e.v[5]];
                        words.extend_from_slice(&all[..n]);
                        ev.stack.1 += n as u32;
                    }
                    continue;
                }
                let probe = e.probe & layout::PROBE_MASK;
                if kind == event_kind::ARGS_MORE {
                    self.more.insert(off, (key, probe, e.tsc, [e.v[0], e.v[1], e.v[2]]));
                    continue;
                }
                owner = None;
                let more = self.more.remove(&off);
                if let Some(mut r) = RawEvent::decode(&e, pid) {
                    // The registers after the sixth come just before their
                    // entry, with its timestamp; if the entry was lost (its
                    // ring was full), they are dropped with it.
                    if let Some((k, p, tsc, regs)) = more
                        && (k, p, tsc, r.kind) == (key, probe, e.tsc, Kind::Entry)
                    {
                        r.v[6..].copy_from_slice(&regs);
                    }
                    out.push(r);
                    owner = Some(out.len() - 1);
                }
                self.read += 1;
            }
            region.store_u64(off + TAIL, head)?;
        }
        Ok(())
    }

    /// Frees the ring slots of processes that ended (`ended` says which),
    /// once their rings are drained, so that the processes a server keeps
    /// forking find slots: a slot is written only by the thread that
    /// claimed it, and a process that ended writes nothing more. Events
    /// and losses stay counted: the next owner goes on from the same
    /// `head` and adds to the same `lost`. Returns how many were freed.
    ///
    /// The ring is found drained only after its process is found ended:
    /// a process may write its last events between a check of the ring and
    /// its end, and a slot freed with them unread would hand them to its
    /// next owner (or to none, key 0).
    pub fn free_ended(region: &Region, ended: impl Fn(u32) -> bool) -> usize {
        let h = region.header();
        let mut freed = 0;
        let drained = |off: u64| region.load_u64(off + HEAD) == region.load_u64(off + TAIL);
        for off in slots_in_use(&h) {
            let key = region.load_u64(off + KEY);
            // The first look at the ring spares a live process's slot the
            // cost of asking whether it ended; the second is the one that
            // counts.
            if key == 0 || !drained(off) || !ended(pid_of_key(key)) || !drained(off) {
                continue;
            }
            if region.compare_exchange_u64(off + KEY, key, 0) {
                freed += 1;
            }
        }
        freed
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

    /// Events dropped so far: rings that were full, timed calls nested
    /// deeper than their frames hold, and events with no free thread slot.
    /// A freed slot's next owner adds to its count, so nothing counted is
    /// ever forgotten.
    pub fn lost(region: &Region) -> u64 {
        Drainer::lost_parts(region).total()
    }

    /// [`Drainer::lost`] by cause.
    pub fn lost_parts(region: &Region) -> Lost {
        let h: Header = region.header();
        let mut ring_full = 0u64;
        for off in slots_in_use(&h) {
            ring_full = ring_full.saturating_add(region.get::<SlotHead>(off).lost);
        }
        Lost { ring_full, no_ring: h.ctx.lost_no_slot, too_deep: h.ctx.lost_too_deep, no_room: h.ctx.lost_no_room }
    }
}

/// Events lost, by cause ([`Drainer::lost_parts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    /// A thread's ring was full.
    pub ring_full: u64,
    /// Threads found no ring free: more threads recording at once,
    /// children included, than the region has rings.
    pub no_ring: u64,
    /// Exits of timed calls nested deeper than their thread's (or
    /// goroutine's) frames hold.
    pub too_deep: u64,
    /// Entries of Go functions without a stack check whose goroutine had
    /// too little stack left for the runtime's call.
    pub no_room: u64,
}

impl Lost {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.ring_full.saturating_add(self.no_ring).saturating_add(self.too_deep).saturating_add(self.no_room)
    }

    /// What was lost since `start`.
    pub fn since(&self, start: &Lost) -> Lost {
        Lost {
            ring_full: self.ring_full.saturating_sub(start.ring_full),
            no_ring: self.no_ring.saturating_sub(start.no_ring),
            too_deep: self.too_deep.saturating_sub(start.too_deep),
            no_room: self.no_room.saturating_sub(start.no_room),
        }
    }
}

/// Offsets of the thread slots some thread has claimed, from the header's
/// bitmap. The others are not read (that would allocate their pages).
fn slots_in_use(h: &Header) -> impl Iterator<Item = u64> + '_ {
    (0..1u64 << h.ctx.slot_bits)
        .filter(|&i| h.ctx.claimed[(i / 64) as usize] & (1 << (i % 64)) != 0)
        .map(|i| h.slot_off(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region in a memfd of this process, with slot 0 claimed by `key`.
    fn region_with_slot(key: u64) -> (Region, u64) {
        let r = crate::probe::region::in_own_memfd();
        let mut h = r.header();
        h.ctx.claimed[0] = 1;
        r.set_header(&h).unwrap();
        let off = h.slot_off(0);
        r.store_u64(off + KEY, key).unwrap();
        (r, off)
    }

    #[test]
    fn a_slot_is_freed_only_once_its_process_ended_with_its_ring_drained() {
        let key = (77u64 << 32) | 78;
        let (r, off) = region_with_slot(key);
        assert_eq!(Drainer::free_ended(&r, |_| false), 0, "alive");
        assert_eq!(r.load_u64(off + KEY), key);
        // The process writes its last event and ends while tp asks whether
        // it ended: the event is unread, so the slot stays its own.
        let last_words = |pid: u32| {
            assert_eq!(pid, 77);
            r.store_u64(off + HEAD, r.load_u64(off + HEAD) + 1).unwrap();
            true
        };
        assert_eq!(Drainer::free_ended(&r, last_words), 0, "its last event is unread");
        assert_eq!(r.load_u64(off + KEY), key);
        let mut out = Vec::new();
        Drainer::default().drain(&r, &mut out).unwrap();
        assert_eq!(r.load_u64(off + TAIL), 1);
        assert_eq!(Drainer::free_ended(&r, |_| true), 1, "ended and drained");
        assert_eq!(r.load_u64(off + KEY), 0);
    }
}
