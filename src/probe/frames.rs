//! Calls still live when the last probe goes: their return addresses point
//! at tp's return trampoline, so tp's memory could not go before they
//! return, and some never do (a worker forked inside a probed call, which
//! runs until it exits). With every thread stopped and no probe left,
//! [`give_back`] puts each such return address back, as the runtime's
//! `tp_unwind` does when an exception starts: the calls return straight
//! to their callers, untimed, and nothing refers to tp's code any more.
//!
//! The frames live in the process's private area (see
//! [`layout::ThreadState`]), read through the process's memory: every
//! value is the target's and is checked before use. A word is written only
//! if it still holds a trampoline of one of the region's arenas, which
//! only tp ever puts there: the frame's slot, or on AArch64 where the
//! function saved its link register ([`Arch::frame_home`]).

use anyhow::Result;

use super::layout::{self, Frame, ThreadState};
use super::region::Region;
use crate::arch::{Arch, FrameHome, Host};
use crate::process::memory::Memory;

/// The trampolines of the region's arenas: each runtime block has two, the
/// plain one and the one that calls `tp_exit_ext`.
pub fn trampolines(region: &Region) -> Vec<u64> {
    let h = region.header();
    let l = super::runtime::layout_of(&h);
    h.arenas[..h.arena_count as usize]
        .iter()
        .filter(|a| a.runtime != 0)
        .flat_map(|a| {
            let addrs = Host::build_runtime(a.runtime, &l, &super::runtime::blobs()).addrs;
            [addrs.trampoline, addrs.trampoline_ext]
        })
        .collect()
}

/// Puts back every return address a return probe replaced in the stopped
/// process `mem`, and empties its shadow stacks of all frames but those
/// whose return address tp cannot put back ([`FrameHome::Kept`]: kept in a
/// register, or signed with the process's key): those calls return through
/// the trampoline, which the stack scan of [`super::remove::check_unused`]
/// then finds, so tp's memory stays. Call it only with every thread
/// stopped, none of them in tp's code, and no probe left that records
/// returns. Returns how many calls will not report their return.
pub fn give_back(mem: &Memory, region: &Region) -> Result<u64> {
    let tramps = trampolines(region);
    if tramps.is_empty() {
        return Ok(0);
    }
    let h = region.header();
    let p = layout::private_geometry();
    let head = std::mem::size_of::<ThreadState>() as u64;
    let frame = std::mem::size_of::<Frame>() as u64;
    let depth_off = std::mem::offset_of!(ThreadState, depth) as u64;
    let mut given = 0;
    for i in 0..1u64 << layout::EVENT_SLOT_BITS {
        let at = h.ctx.private + layout::THREADS_OFF + i * p.thread_size;
        let Ok(bytes) = mem.read_vec(at, head as usize) else { continue };
        let t: ThreadState = layout::from_bytes(&bytes);
        if t.key == 0 || t.depth == 0 {
            continue;
        }
        let depth = t.depth.min(layout::SHADOW_LEN) as u64;
        let Ok(frames) = mem.read_vec(at + head, (depth * frame) as usize) else { continue };
        let read = |addr: u64, len: usize| mem.read_vec(addr, len).ok();
        let mut kept: Vec<&[u8]> = Vec::new();
        for raw in frames.chunks_exact(frame as usize) {
            let f: Frame = layout::from_bytes(raw);
            if !tramps.contains(&f.tramp) {
                continue;
            }
            match Host::frame_home(f.slot, f.ra_at, f.tramp, &read) {
                FrameHome::At(home) => {
                    if mem.write(home, &f.ret.to_le_bytes()).is_ok() {
                        given += 1;
                    }
                }
                FrameHome::Dead => {}
                FrameHome::Kept => kept.push(raw),
            }
        }
        // The frames kept move down, in their order, before the depth shrinks.
        for (k, raw) in kept.iter().enumerate() {
            mem.write(at + head + k as u64 * frame, raw)?;
        }
        mem.write(at + depth_off, &(kept.len() as u32).to_le_bytes())?;
    }
    Ok(given)
}
