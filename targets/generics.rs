//! generics: one generic function, instantiated for two types, so the
//! executable holds two copies of its code under one name
//! (`generics::work`, also with the legacy symbol mangling, whose names
//! leave the type out); and a generic method of a generic trait
//! implementation, as ripgrep's `<StandardSink<M,W> as Sink>::matched`.
//!
//! Commands, one per line on stdin (the same protocol as the C targets):
//!   call work N    N calls of work::<u32> and N of work::<u64>
//!                  -> "done work calls=2N checksum=ok|BAD"
//!   call sink N    N calls of <Sink<u16> as Matched>::matched and N of <Sink<u64> as Matched>::matched
//!   quit

use std::hint::black_box;
use std::io::{BufRead, Write};

/// Widens and mixes `x`; its two instances differ in how they widen.
#[inline(never)]
pub fn work<T: Into<u64>>(x: T) -> u64 {
    black_box(x.into()).wrapping_mul(7) + 1
}

/// Something that takes matches.
pub trait Matched {
    /// Takes one match; returns the total so far.
    fn matched(&mut self, at: u64) -> u64;
}

/// A sink of matches of some width.
pub struct Sink<W> {
    total: u64,
    last: W,
}

impl<W: Copy + Into<u64> + TryFrom<u64>> Matched for Sink<W> {
    #[inline(never)]
    fn matched(&mut self, at: u64) -> u64 {
        if let Ok(w) = W::try_from(black_box(at) & 0xff) {
            self.last = w;
        }
        self.total += self.last.into();
        self.total
    }
}

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    writeln!(out, "ready pid={}", std::process::id()).unwrap();
    let mut failed = false;
    let mut narrow = Sink::<u16> { total: 0, last: 0 };
    let mut wide = Sink::<u64> { total: 0, last: 0 };
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["call", what, n] => {
                let n: u64 = n.parse().unwrap();
                let (mut got, mut want) = (0u64, 0u64);
                for i in 0..n {
                    if *what == "work" {
                        got = got.wrapping_add(work(i as u32)).wrapping_add(work(i));
                        want = want.wrapping_add((i as u32 as u64) * 7 + 1).wrapping_add(i * 7 + 1);
                    } else {
                        let before = (narrow.total, wide.total);
                        got = got.wrapping_add(narrow.matched(i) - before.0).wrapping_add(wide.matched(i) - before.1);
                        want = want.wrapping_add(2 * (i & 0xff));
                    }
                }
                failed |= got != want;
                let verdict = if got == want { "ok" } else { "BAD" };
                writeln!(out, "done {what} calls={} checksum={verdict}", 2 * n).unwrap();
            }
            ["quit"] => break,
            _ => writeln!(out, "error unknown command: {line}").unwrap(),
        }
    }
    std::process::exit(failed as i32);
}
