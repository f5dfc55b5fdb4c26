//! A data region with arbitrary bytes, opened and read as `tp status`,
//! `tp detach`, `tp enable` and a session read one: the input is a memfd
//! named `tp-data` as a target would set it up (tests/e2e/region_image.rs:
//! its size, whether it is sealed or shrunk below its mapping, its first
//! bytes), mapped in this process at the address the e2e tests use.
//! `Region::open` must refuse it in one line or accept it, and then every
//! read must stay inside the region and bounded, also after the header
//! changes under it (flag bit 1), the stacks drained with events and the
//! aggregates the threads keep included. Any panic, fault or runaway allocation
//! is a bug. Saved crashes in tests/fuzz/regressions/region/ replay in the
//! e2e tests against a real target.
#![no_main]

#[path = "../../e2e/region_image.rs"]
mod region_image;

use std::os::fd::AsRawFd;

use libfuzzer_sys::fuzz_target;
use nix::sys::memfd::{MFdFlags, memfd_create};
use tp::events::drain::Drainer;
use tp::escape;
use tp::probe::region::{self, Region};
use tp::process::Mapping;

fuzz_target!(|data: &[u8]| {
    let img = region_image::from_fuzz(data);
    let Ok(fd) = memfd_create(c"tp-data", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING) else { return };
    let file = std::fs::File::from(fd);
    if file.set_len(img.size).is_err() {
        return;
    }
    use std::os::unix::fs::FileExt;
    let n = img.bytes.len().min(img.size as usize);
    if file.write_all_at(&img.bytes[..n], 0).is_err() {
        return;
    }
    if img.sealed {
        // SAFETY: fcntl(2) on a descriptor we own.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
    }
    // SAFETY: a fixed shared mapping at an address nothing else in this
    // process uses (MAP_FIXED_NOREPLACE fails rather than replace anything).
    let at = unsafe {
        libc::mmap(
            region_image::ADDR as *mut libc::c_void,
            img.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
            file.as_raw_fd(),
            0,
        )
    };
    if at as u64 != region_image::ADDR {
        return;
    }
    if img.shrunk {
        let _ = file.set_len((img.bytes.len() as u64).next_multiple_of(4096));
    }
    // The mapping as /proc/self/maps shows it (built here: parsing the maps
    // every run would halve the runs per second).
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else { return };
    drop(file);
    let me = std::process::id() as i32;
    let m = Mapping {
        start: region_image::ADDR,
        end: region_image::ADDR + img.size,
        read: true,
        write: true,
        exec: false,
        shared: true,
        offset: 0,
        dev: meta.dev(),
        inode: meta.ino(),
        path: "/memfd:tp-data (deleted)".into(),
    };
    {
        let m = &m;
        let _ = region::is_target_view(me, m);
        match Region::open(me, m) {
            Ok(r) => {
                read_all(&r);
                if img.change_later {
                    // The target rewrites its header under tp: the input again, over the first page.
                    let page: Vec<u8> = data.iter().copied().cycle().take(4096).collect();
                    let _ = r.write(0, &page);
                    read_all(&r);
                }
            }
            Err(e) => {
                let _ = escape::text(&format!("{e:#}"));
            }
        }
    }
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(at, img.size as usize) };
});

/// What tp's commands read from a region they accepted.
fn read_all(r: &Region) {
    let h = r.header();
    let entries = r.entries();
    let idx: Vec<u32> = entries.iter().map(|(i, _)| *i).collect();
    for (i, e) in &entries {
        let _ = (escape::text(&e.name()), escape::text(&e.module()), e.original(), e.patch());
        let _ = (r.state(*i), r.enabled(*i), r.flag_addr(*i));
    }
    let _ = (r.hits_of(&idx), r.budgets_of(&idx), r.check_entries());
    let mut events = Vec::new();
    let mut words = Vec::new();
    let _ = Drainer::default().drain_with_stacks(r, &mut events, &mut words);
    for e in &events {
        let (start, len) = (e.stack.0 as usize, e.stack.1 as usize);
        assert!(start + len <= words.len() && len <= tp::events::stacks::MAX_WORDS);
        let _ = tp::events::stacks::decode(&words[start..start + len]);
    }
    let _ = Drainer::lost(r);
    let _ = tp::events::aggregates::latency(r, &tp::events::clock::Clock::start());
    let _ = tp::events::aggregates::by_value(r);
    let _ = (h.arena_count, h.count);
}
