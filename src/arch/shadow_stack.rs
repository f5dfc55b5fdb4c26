//! Hardware shadow stacks: a second stack, which the CPU keeps and the
//! program cannot write with ordinary stores, of the return addresses of
//! the calls a thread made; every return checks the address it is about to
//! use against it. x86-64 has them as CET's user shadow stacks (Linux 6.6),
//! AArch64 as the Guarded Control Stack (GCS, Linux 6.13); the C library
//! turns them on per thread, and new threads inherit them.
//!
//! A thread that runs with one faults (SIGSEGV) at a return whose address
//! was rewritten on the ordinary stack, as a return probe's trampoline is,
//! and at the return of a call made without a call instruction (its return
//! address pushed or loaded by hand), as a relocated call is, or at a return
//! used as a jump. Each architecture says how a tracer learns that a thread
//! runs with one ([`crate::arch::Arch::shadow_stack`]) and which of its
//! detours would break the pairing of calls and returns
//! ([`crate::arch::Arch::unbalances_shadow_stack`]).

use std::fmt;

/// A kind of hardware shadow stack, by the name tp gives it in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShadowStack(pub &'static str);

impl fmt::Display for ShadowStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What tp can tell of one thread's hardware shadow stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shadow {
    /// It runs without one.
    Off,
    /// It runs with one.
    On(ShadowStack),
    /// Not known from what could be read: the kernel says it only in a
    /// register set of a thread in a ptrace stop, or that could not be read.
    Unknown,
}
