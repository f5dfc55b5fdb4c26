//! A cached module analysis read back from arbitrary bytes
//! (`tp::symbols::saved::Saved::decode`): the cache directory is the
//! user's own, but what it holds was derived from files a target controls,
//! so tp reads it as untrusted input. Any panic is a bug; a decode that
//! succeeds must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::symbols::saved::Saved;

fuzz_target!(|data: &[u8]| {
    if let Ok(saved) = Saved::decode(data) {
        assert_eq!(Saved::decode(&saved.encode()), Ok(saved));
    }
});
