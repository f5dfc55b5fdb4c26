//! A cached module analysis read back from arbitrary bytes
//! (`tp::symbols::saved::Saved::decode`): the cache directory is the
//! user's own, but what it holds was derived from files a target controls,
//! so tp reads it as untrusted input. Any panic is a bug; a decode that
//! succeeds must encode back to the same bytes, and its DWARF index (read
//! on first use) answers or says nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::addr::FileAddr;
use tp::symbols::saved::{Saved, SavedDwarf};

fuzz_target!(|data: &[u8]| {
    if let Ok(saved) = Saved::decode(data) {
        if let SavedDwarf::Index(dwarf) = &saved.dwarf {
            let entries: Vec<FileAddr> = dwarf.index().map(|i| i.functions.iter().map(|f| f.entry).collect()).unwrap_or_default();
            for e in entries.into_iter().chain([FileAddr(0), FileAddr(u64::MAX)]) {
                let _ = dwarf.at(e);
            }
        }
        assert_eq!(Saved::decode(&saved.encode()), Ok(saved));
    }
});
