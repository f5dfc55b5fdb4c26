//! Ctrl-C and friends: a flag the command loops poll.
//!
//! The handlers are installed without SA_RESTART, so a blocking call returns
//! EINTR at once instead of hiding the signal until the next tracee event
//! (crates such as ctrlc and signal-hook set SA_RESTART). Once tp is
//! restoring code, further signals only set the flag again: a second Ctrl-C
//! cannot cut a detach short.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT, SIGTERM and SIGHUP to the flag.
pub fn install() {
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// True once one of those signals arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
