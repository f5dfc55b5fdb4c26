//! The words of a recorded stack as the target could write them: decoded
//! ([`tp::events::stacks::decode`]), and, as a copy of a stack's top,
//! unwound with this process's own modules' unwind tables, from an entry
//! in its own code. Every read of the copy is bounded; any panic or
//! runaway is a bug.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use tp::events::stacks::{self, Recorded};
use tp::symbols::stackwalk::StackWalker;

static WALKER: Mutex<Option<StackWalker>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let words: Vec<u64> =
        data.chunks(8).map(|c| c.iter().rev().fold(0u64, |w, &b| (w << 8) | b as u64)).take(stacks::MAX_WORDS).collect();
    let Some(stack) = stacks::decode(&words) else { return };
    if let Recorded::Copy { sp, fp, ra, words } = stack.recorded {
        let mut w = WALKER.lock().unwrap();
        let walker = w.get_or_insert_with(|| StackWalker::new(std::process::id() as i32));
        let pc = fuzz_target_entry as *const () as u64;
        let found = walker.unwind(pc, sp, fp, ra, &words, 127);
        assert!(found.len() <= 127);
    }
});

#[inline(never)]
fn fuzz_target_entry() {}
