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
//! Crate map:
//! - [`cli`]: the command-line definition (clap), declarative only.
//! - [`cmd`]: one thin module per subcommand: command line to options, results to output.
//! - [`session`]: the session engine that attach, profile and demo share.
//! - [`process`]: ptrace, /proc, remote memory and remote syscalls; no ISA.
//! - [`symbols`]: ELF (goblin) symbols and load biases.
//! - [`arch`]: everything that knows an instruction set, behind [`arch::Arch`].
//! - [`probe`]: the shared data region layout, code arenas, install and removal.
//! - [`output`]: tables, JSON and the live display.

#![deny(missing_docs)]

pub mod arch;
pub mod cli;
pub mod cmd;
pub mod events;
pub mod fault;
pub mod output;
pub mod probe;
pub mod process;
pub mod progress;
pub mod session;
pub mod symbols;
