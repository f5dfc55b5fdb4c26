//! tp: a dynamic function tracer for running Linux processes.
//!
//! tp attaches to a process with ptrace, stops every thread for a moment,
//! injects a data region (a memfd shared with the tracer) and code pages
//! near the probed functions through syscalls made by a stopped thread, and
//! replaces each probed function's first instruction(s) with a branch into a
//! detour that counts the hit in shared memory, runs the displaced
//! instructions relocated and branches back. The tracer then lets go of the
//! process and reads the counts from shared memory: no trap, no syscall and
//! no lock per hit.
//!
//! Crate map, from the top layer down (docs/design.md's module map says
//! what each may import, and `.ci/check-arch-boundary` holds the code to it):
//! - [`cmd`]: one thin adapter per subcommand: command line to options, results to output.
//! - [`session`]: the session engine that attach, profile and demo share.
//! - [`output`]: tables, JSON, the live display, Chrome traces, histograms.
//! - [`events`]: event rings, clock, typed values, latency, sampling control.
//! - [`probe`]: the shared data region, code arenas, install and removal.
//! - [`symbols`]: ELF symbols, DWARF, modules and their load biases, verdicts.
//! - [`process`]: ptrace stops, /proc, remote memory and remote syscalls.
//! - [`arch`]: everything that knows an instruction set or an ABI, behind [`arch::Arch`].
//! - [`layout`]: the bytes of the data region and private area, the one source of
//!   the in-target runtime's C header, read by the detours and the probes alike.
//! - [`debuginfod`]: debug files by build-id from debuginfod servers, and their cache.
//! - [`addr`], [`cli`], [`escape`], [`fault`], [`http`], [`progress`], [`streams`]:
//!   runtime and file addresses and the bias between them, the command line
//!   (clap), text a target chose made safe for a terminal, fault injection
//!   for tests, the bounded HTTP/1.1 server side of `/metrics`, progress
//!   bars, whether tp's stdout or stderr failed.

#![deny(missing_docs)]

/// Writes one line to stderr with a single `write`, so that a line of tp's
/// is never cut by a line of the traced program, which `tp run` shares
/// stderr with (`eprintln!` writes each formatted piece separately).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let written = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        $crate::streams::note($crate::streams::Stream::Stderr, &written);
    }};
}

pub mod addr;
pub mod arch;
pub mod cache;
pub mod cli;
pub mod cmd;
pub mod debuginfod;
pub mod escape;
pub mod events;
pub mod fault;
pub mod http;
pub mod layout;
pub mod notes;
pub mod output;
pub mod probe;
pub mod process;
pub mod progress;
pub mod session;
pub mod streams;
pub mod symbols;
