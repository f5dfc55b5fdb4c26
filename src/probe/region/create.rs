//! Creating the data region in a target: the memfd, sized, mapped shared
//! by the target and by tp, with its header written.

use anyhow::{Context, Result};

use super::Region;
use crate::arch::{Arch, Host};
use crate::probe::layout::{self, Header, MEMFD_NAME};
use crate::probe::{Request, arena, orphan};
use crate::process::Mapping;
use crate::process::memory::Memory;
use crate::process::remote::RemoteCaller;

/// Creates the data region: a code arena first (its bytes hold the memfd's
/// name, which memfd_create must read from the target's memory), then
/// memfd_create, ftruncate, mmap MAP_SHARED and close in the target.
pub fn create_region(
    caller: &mut RemoteCaller,
    mem: &Memory,
    maps: &[Mapping],
    requests: &[Request],
    ring_len: u32,
) -> Result<Region> {
    let g = layout::geometry(requests.len() as u32, ring_len);
    let first = requests.first().context("nothing to install")?;
    let kind = requests.iter().fold(0, |k, r| k | r.kind);
    let arena =
        arena::alloc_arena(caller, maps, first.span, arena::reach_of(first), arena::arena_size(requests.len(), kind))?;
    let name_at = arena.addr + arena.size - orphan::NAME_FROM_END;
    let mut name = MEMFD_NAME.as_bytes().to_vec();
    name.push(0);
    mem.write(name_at, &name).context("writing the memfd name")?;
    crate::fault::point("after-name-write");
    let sc = Host::SYSCALLS;
    let fd = caller.checked("memfd_create", sc.memfd_create, [name_at, libc::MFD_CLOEXEC as u64, 0, 0, 0, 0])?;
    crate::fault::point("after-memfd");
    let made = (|| -> Result<Region> {
        caller.checked("ftruncate", sc.ftruncate, [fd, g.total_size, 0, 0, 0, 0])?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/fd/{fd}", mem.pid()))
            .context("opening the target's memfd")?;
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let addr = caller.checked("mmap", sc.mmap, [0, g.total_size, prot, libc::MAP_SHARED as u64, fd, 0])?;
        let region = Region::from_file(file, addr, g.total_size)?;
        let mut h = Header::new(&g, Host::ELF_MACHINE as u32, addr);
        h.arenas[0] = arena;
        h.arena_count = 1;
        region.set_header(&h)?;
        Ok(region)
    })();
    caller.checked("close", sc.close, [fd, 0, 0, 0, 0, 0])?;
    made
}
