//! Creating the data region in a target: the memfd, sized, sealed, mapped
//! shared by the target and by tp, with its header written; and the
//! target's private area beside it (anonymous private memory, which a fork
//! copies, its first pages wiped on fork: see [`layout::Proc`]). The
//! target's other threads run meanwhile, so tp gets hold of the memfd only
//! in a way they cannot redirect ([`acquire`]).

use anyhow::{Context, Result, bail};

use super::Region;
use crate::arch::{Arch, Host};
use crate::probe::layout::{self, Header, MEMFD_NAME};
use crate::probe::{Request, acquire, arena, orphan, runtime};
use crate::process::Mapping;
use crate::process::memory::Memory;
use crate::process::remote::RemoteCaller;

/// Creates the data region: a code arena first (its bytes hold the memfd's
/// name, which memfd_create must read from the target's memory), the
/// private area (`create_private`), then memfd_create in the target; tp
/// takes, sizes and seals the memfd
/// ([`acquire::take_new`]), the target maps it MAP_SHARED, tp checks that
/// mapping ([`acquire::check_mapped`]) and the target closes its descriptor.
/// On failure what was mapped stays in `caller`'s record, for the caller
/// to undo ([`RemoteCaller::unmap_mapped`]).
pub fn create_region(
    caller: &mut RemoteCaller,
    mem: &Memory,
    maps: &[Mapping],
    requests: &[Request],
    ring_len: u32,
) -> Result<Region> {
    if requests.len() > layout::MAX_CAPACITY as usize {
        bail!(
            "{} functions to probe; tp probes at most {} in one process: narrow the pattern",
            requests.len(),
            layout::MAX_CAPACITY
        );
    }
    let g = layout::geometry(requests.len() as u32, ring_len);
    let first = requests.first().context("nothing to install")?;
    let kind = requests.iter().fold(0, |k, r| k | r.kind);
    let sc = Host::SYSCALLS;
    let flags = (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    // What the worker's seccomp filters answer to the calls after the
    // arena's, before the arena is mapped (their arguments as far as they
    // are known now; each call is checked again when it is made).
    // The first arena holds the runtime block too, where a probe needs one:
    // a second arena beside it would split what `tp detach` finds of a
    // killed tp's memory by the name at the first one's end.
    let runtime = if requests.iter().any(runtime::needs_runtime) { runtime::block_len() } else { 0 };
    let size = (arena::arena_size(requests.len(), kind) + runtime).next_multiple_of(4096);
    let near = arena::candidates(maps, first.span, size, arena::reach_of(first)).first().copied().unwrap_or(0);
    caller.check(sc.memfd_create, [near + size - orphan::NAME_FROM_END, flags, 0, 0, 0, 0])?;
    caller.check(sc.mmap, [0, g.total_size, prot, libc::MAP_SHARED as u64, 0, 0])?;
    caller.check(sc.munmap, [0, g.total_size, 0, 0, 0, 0])?;
    let private_size = layout::private_geometry().size;
    let anonymous = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    caller.check(sc.mmap, [0, private_size, prot, anonymous, u64::MAX, 0])?;
    caller.check(sc.madvise, [0, layout::PROC_PAGE, libc::MADV_WIPEONFORK as u64, 0, 0, 0])?;
    let arena = arena::alloc_arena(caller, maps, first.span, arena::reach_of(first), size)?;
    let name_at = arena.addr + arena.size - orphan::NAME_FROM_END;
    let mut name = MEMFD_NAME.as_bytes().to_vec();
    name.push(0);
    mem.write(name_at, &name).context("writing the memfd name")?;
    crate::fault::point("after-name-write");
    let private = create_private(caller, mem)?;
    let fd = caller.checked("memfd_create", sc.memfd_create, [name_at, flags, 0, 0, 0, 0])?;
    crate::fault::point("after-memfd");
    let made = (|| -> Result<Region> {
        let file = acquire::take_new(mem.pid(), fd, g.total_size)?;
        let addr = caller.checked("mmap", sc.mmap, [0, g.total_size, prot, libc::MAP_SHARED as u64, fd, 0])?;
        acquire::check_mapped(mem.pid(), &file, addr, g.total_size)?;
        let region = Region::from_file(file, addr, g.total_size)?;
        let mut h = Header::new(&g, Host::ELF_MACHINE as u32, addr, private);
        h.arenas[0] = arena;
        h.arena_count = 1;
        region.set_header(&h)?;
        Ok(region)
    })();
    // The target may have closed or replaced the descriptor already: what
    // is there now is closed, and an error is no error.
    caller.syscall(sc.close, [fd, 0, 0, 0, 0, 0])?;
    made
}

/// Maps the private area ([`layout::private_geometry`]) in the target:
/// anonymous and private, so every process forked from it has its own
/// copy; its first pages MADV_WIPEONFORK, so a child finds zeros there and
/// takes its threads' states afresh. tp writes [`layout::PRIVATE_MAGIC`]
/// into the page after them, by which an area a killed tp did not record yet
/// is recognised ([`crate::probe::orphan`]). Returns its address; on
/// failure the area stays in `caller`'s record of what it mapped.
fn create_private(caller: &mut RemoteCaller, mem: &Memory) -> Result<u64> {
    let sc = Host::SYSCALLS;
    let size = layout::private_geometry().size;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let at = caller.checked("mmap", sc.mmap, [0, size, prot, flags, u64::MAX, 0])?;
    mem.write(at + layout::PRIVATE_MAGIC_OFF, &layout::PRIVATE_MAGIC.to_le_bytes())
        .context("marking tp's private area")?;
    caller
        .checked("madvise", sc.madvise, [at, layout::PROC_PAGE, libc::MADV_WIPEONFORK as u64, 0, 0, 0])
        .context("tp needs Linux 4.14 or later (MADV_WIPEONFORK)")?;
    crate::fault::point("after-private");
    Ok(at)
}
