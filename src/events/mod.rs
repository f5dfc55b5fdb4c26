//! Events recorded by probes in the target, as the tracer sees them: drained
//! from the per-thread rings ([`drain`]), stamped with CLOCK_MONOTONIC time
//! ([`clock`]), given names and typed values ([`values`]), and summed into
//! latency statistics ([`stats`]).

pub mod aggregates;
pub mod clock;
pub mod drain;
pub mod predicate;
pub mod sampling;
pub mod stacks;
pub mod stats;
pub mod values;

use crate::probe::layout::{self, event_kind};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A call began.
    Entry,
    /// A call returned.
    Exit,
    /// An exception unwound through the call; its return was not seen.
    Unwound,
}

/// One event as the runtime wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// What happened.
    pub kind: Kind,
    /// The probe's entry index.
    pub probe: u32,
    /// The process that recorded it (the owner of its ring).
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// Counter value when it happened.
    pub tsc: u64,
    /// Entry: argument registers (those after the sixth only where the
    /// entry had an event of [`event_kind::ARGS_MORE`] before it, else 0:
    /// AArch64's seventh and eighth, Go's seventh to ninth on x86-64). Exit:
    /// return value, entry counter value, second return register, counter
    /// ticks tp spent inside the call, nonzero for a tail call (the
    /// call left by a jump to another function: no return value), and the
    /// ticks of the timed calls it made ([`RawEvent::self_from`]).
    pub v: [u64; ARG_WORDS],
    /// The words of the stack recorded with it (`--stack`): where they
    /// start in the drain's word buffer and how many there are.
    pub stack: (u32, u32),
}

/// Registers an entry can carry: the six of its event, and the three of
/// the record before it ([`event_kind::ARGS_MORE`]).
pub const ARG_WORDS: usize = layout::ENTRY_REGS + layout::MORE_REGS;

impl RawEvent {
    /// Decodes an event recorded by process `pid`; None for a kind this tp
    /// does not know (and for [`event_kind::ARGS_MORE`], which the drain
    /// joins to the entry it belongs to).
    pub fn decode(e: &layout::Event, pid: u32) -> Option<RawEvent> {
        let kind = match (e.probe >> layout::KIND_SHIFT) as u8 {
            event_kind::ENTRY => Kind::Entry,
            event_kind::EXIT => Kind::Exit,
            event_kind::UNWOUND => Kind::Unwound,
            _ => return None,
        };
        let mut v = [0; ARG_WORDS];
        v[..6].copy_from_slice(&e.v);
        Some(RawEvent { kind, probe: e.probe & layout::PROBE_MASK, pid, tid: e.tid, tsc: e.tsc, v, stack: (0, 0) })
    }

    /// True for an exit by a jump to another function (a tail call), which
    /// leaves no return value of its own.
    pub fn tail_call(&self) -> bool {
        self.kind == Kind::Exit && self.v[4] != 0
    }

    /// For exits and unwinds, the counter value at the call's entry.
    pub fn entry_tsc(&self) -> u64 {
        self.v[1]
    }

    /// For exits, the counter value at the call's entry moved later by the
    /// ticks tp's probes on the functions it called spent: from there to
    /// [`RawEvent::tsc`] is the call's own duration, without tp's work.
    pub fn timed_from(&self) -> u64 {
        match self.kind {
            Kind::Exit => self.v[1].saturating_add(self.v[3]).min(self.tsc),
            _ => self.v[1],
        }
    }

    /// For exits, [`RawEvent::timed_from`] moved later by the durations of
    /// the timed calls made while this call was the innermost timed call
    /// live on its thread (its timed callees, or deeper calls whose
    /// callers in between were not timed), never past the exit: from there
    /// to [`RawEvent::tsc`] is the call's self time. Each of those calls'
    /// own durations is in its own exit event, so the self times of a
    /// thread's timed calls add up to the durations of its outermost ones.
    pub fn self_from(&self) -> u64 {
        match self.kind {
            Kind::Exit => self.timed_from().saturating_add(self.v[5]).min(self.tsc),
            _ => self.timed_from(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_kind_and_probe() {
        let e = layout::Event { probe: (2 << 24) | 7, tid: 42, tsc: 100, v: [5, 90, 0, 0, 0, 0] };
        let r = RawEvent::decode(&e, 12).unwrap();
        assert_eq!((r.kind, r.probe, r.pid, r.tid, r.entry_tsc()), (Kind::Exit, 7, 12, 42, 90));
        let nested = RawEvent { v: [5, 90, 0, 4, 0, 0, 0, 0, 0], ..r };
        assert_eq!(nested.timed_from(), 94, "tp's own ticks inside the call do not count");
        assert_eq!(RawEvent { v: [5, 90, 0, 40, 0, 0, 0, 0, 0], ..r }.timed_from(), 100, "never after the exit");
        let parent = RawEvent { v: [5, 90, 0, 4, 0, 3, 0, 0, 0], ..r };
        assert_eq!(parent.self_from(), 97, "after tp's ticks and the timed callees' durations");
        assert_eq!(RawEvent { v: [5, 90, 0, 4, 0, 30, 0, 0, 0], ..r }.self_from(), 100, "never after the exit");
        assert_eq!(RawEvent { v: [5, 90, 0, 0, 0, u64::MAX, 0, 0, 0], ..r }.self_from(), 100, "untrusted words");
        assert!(RawEvent::decode(&layout::Event { probe: 9 << 24, ..e }, 12).is_none());
        assert!(RawEvent::decode(&layout::Event { probe: 4 << 24, ..e }, 12).is_none(), "joined by the drain");
    }
}
