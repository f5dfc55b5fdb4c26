//! rusty: Rust functions (a free function in a module, a method, a generic
//! instance), built with the legacy and the v0 symbol mangling, so that tp
//! must match demangled Rust paths (`rusty::geometry::area`).
//!
//! Commands, one per line on stdin (the same protocol as the C targets):
//!   call area N    N calls of rusty::geometry::area  -> "done area calls=N checksum=ok|BAD"
//!   call bump N    N calls of rusty::Counter::bump
//!   call scale N   N calls of rusty::scale::<u64>
//!   quit

use std::hint::black_box;
use std::io::{BufRead, Write};

pub mod geometry {
    /// The area of a square of side `s`.
    #[inline(never)]
    pub fn area(s: u64) -> u64 {
        std::hint::black_box(s) * s
    }
}

/// A counter with a method to probe.
pub struct Counter {
    total: u64,
}

impl Counter {
    /// Adds `x` and returns the new total.
    #[inline(never)]
    pub fn bump(&mut self, x: u64) -> u64 {
        self.total = black_box(self.total) + x;
        self.total
    }
}

/// A generic function, instantiated for u64.
#[inline(never)]
pub fn scale<T: Into<u64>>(x: T) -> u64 {
    black_box(x.into()) * 3 + 1
}

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    writeln!(out, "ready pid={}", std::process::id()).unwrap();
    let mut counter = Counter { total: 0 };
    let mut failed = false;
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["call", what, n] => {
                let n: u64 = n.parse().unwrap();
                let (mut got, mut want) = (0u64, 0u64);
                for i in 0..n {
                    match *what {
                        "area" => {
                            got = got.wrapping_add(geometry::area(i & 0xffff));
                            want = want.wrapping_add((i & 0xffff) * (i & 0xffff));
                        }
                        "bump" => {
                            let before = counter.total;
                            got = got.wrapping_add(counter.bump(i) - before);
                            want = want.wrapping_add(i);
                        }
                        _ => {
                            got = got.wrapping_add(scale(i));
                            want = want.wrapping_add(i * 3 + 1);
                        }
                    }
                }
                failed |= got != want;
                let verdict = if got == want { "ok" } else { "BAD" };
                writeln!(out, "done {what} calls={n} checksum={verdict}").unwrap();
            }
            ["quit"] => break,
            _ => writeln!(out, "error unknown command: {line}").unwrap(),
        }
    }
    std::process::exit(failed as i32);
}
