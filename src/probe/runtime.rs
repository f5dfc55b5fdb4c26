//! The in-target runtime's machine code: `runtime/runtime.c`, compiled by
//! build.rs for the architecture tp is built for, one relocation-free blob
//! per function; and what an architecture's hand-written fast paths of it
//! need to know of the layout ([`layout_of`]).

use std::mem::{offset_of, size_of};

use super::Request;
use super::layout::kind;
use super::layout::{self, Event, EventCtx, Frame, Header, Proc, SlotHead, ThreadState, entry_flags, event_kind};
use crate::arch::{Arch, Host, RuntimeBlobs, RuntimeLayout};

/// True if the detour of `req` calls the arena's runtime block.
pub fn needs_runtime(req: &Request) -> bool {
    req.kind != kind::COUNT || Host::COUNTING_CALLS_RUNTIME
}

/// Bytes an arena's runtime block takes, rounded to 16 (detours start
/// 16-aligned), with 16 to spare: the same for every block this tp writes.
pub fn block_len() -> u64 {
    static LEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LEN.get_or_init(|| (Host::runtime_len(&RuntimeLayout::default(), &blobs()) + 16).next_multiple_of(16))
}

/// The runtime's functions for the host architecture.
pub fn blobs() -> RuntimeBlobs {
    RuntimeBlobs {
        entry: include_bytes!(concat!(env!("OUT_DIR"), "/tp_entry.bin")),
        exit: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit.bin")),
        unwind: include_bytes!(concat!(env!("OUT_DIR"), "/tp_unwind.bin")),
        count: include_bytes!(concat!(env!("OUT_DIR"), "/tp_count.bin")),
        entry_ext: include_bytes!(concat!(env!("OUT_DIR"), "/tp_entry_ext.bin")),
        exit_ext: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit_ext.bin")),
        exit_at: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit_at.bin")),
        exit_at_ext: include_bytes!(concat!(env!("OUT_DIR"), "/tp_exit_at_ext.bin")),
        rendezvous: include_bytes!(concat!(env!("OUT_DIR"), "/tp_rendezvous.bin")),
        step: include_bytes!(concat!(env!("OUT_DIR"), "/tp_step.bin")),
        trap: include_bytes!(concat!(env!("OUT_DIR"), "/tp_trap.bin")),
    }
}

/// What a runtime block's hand-written paths read and write, for the
/// region whose header is `h` (mapped in the target at `h.target_addr`).
pub fn layout_of(h: &Header) -> RuntimeLayout {
    let u = |n: usize| n as u32;
    RuntimeLayout {
        ctx: h.target_addr + Header::ctx_off(),
        cache: cache_of(h),
        ring_mask: h.ctx.ring_mask,
        thread_depth: u(offset_of!(ThreadState, depth)),
        thread_writing: u(offset_of!(ThreadState, writing)),
        ctx_tid_offset: u(offset_of!(EventCtx, tid_offset)),
        thread_overhead: u(offset_of!(ThreadState, overhead)),
        thread_shadow: u(size_of::<ThreadState>()),
        frame_slot: u(offset_of!(Frame, slot)),
        frame_ret: u(offset_of!(Frame, ret)),
        frame_tsc: u(offset_of!(Frame, tsc)),
        frame_probe: u(offset_of!(Frame, probe)),
        frame_tramp: u(offset_of!(Frame, tramp)),
        frame_overhead: u(offset_of!(Frame, overhead)),
        frame_children: u(offset_of!(Frame, children)),
        frame_size: u(size_of::<Frame>()),
        slot_head: u(offset_of!(SlotHead, head)),
        slot_limit: u(offset_of!(SlotHead, limit)),
        slot_ring: u(size_of::<SlotHead>()),
        event_probe: u(offset_of!(Event, probe)),
        event_tid: u(offset_of!(Event, tid)),
        event_tsc: u(offset_of!(Event, tsc)),
        event_v: u(offset_of!(Event, v)),
        event_size: u(size_of::<Event>()),
        probe_mask: layout::PROBE_MASK,
        record_entry: entry_flags::RECORD_ENTRY,
        hijack_return: entry_flags::HIJACK_RETURN,
        time_call: entry_flags::TIME_CALL,
        tail_call: entry_flags::TAIL_CALL,
        exit_ext: entry_flags::EXIT_EXT,
        go_frames: entry_flags::GO_FRAMES,
        stack_span: layout::STACK_SPAN,
        entry_kind: (event_kind::ENTRY as u32) << layout::KIND_SHIFT,
        exit_kind: (event_kind::EXIT as u32) << layout::KIND_SHIFT,
    }
}

/// Address in the target of the thread cache of the region whose header is `h`.
pub fn cache_of(h: &Header) -> u64 {
    h.ctx.private + offset_of!(Proc, cache) as u64
}

const _: () = assert!(size_of::<Frame>() == 64 && size_of::<Event>().is_power_of_two());
const _: () = assert!(offset_of!(EventCtx, ring_mask) < 4096);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_block_takes_what_its_length_says_and_fits_block_len() {
        let g = layout::geometry(4, 1024);
        let h = Header::new(&g, 62, 0x7f00_0000_0000, 0x7f10_0000_0000);
        for l in [RuntimeLayout::default(), layout_of(&h)] {
            for at in [0, 0x7f00_0010_0000] {
                let built = Host::build_runtime(at, &l, &blobs()).bytes.len() as u64;
                assert_eq!(Host::runtime_len(&l, &blobs()), built);
                assert!(built <= block_len());
            }
        }
    }

    #[test]
    fn the_layout_is_the_regions() {
        let g = layout::geometry(1, 1024);
        let h = Header::new(&g, 62, 0x7f00_0000_0000, 0x7f10_0000_0000);
        let l = layout_of(&h);
        assert_eq!(l.ctx, 0x7f00_0000_0000 + Header::ctx_off());
        assert_eq!(l.cache, 0x7f10_0000_0000 + 64);
        assert_eq!(l.ring_mask, 1023);
        assert_eq!((l.event_tsc, l.event_v, l.event_size), (8, 16, 64));
        assert_eq!((l.entry_kind, l.exit_kind), (1 << 24, 2 << 24));
    }
}
