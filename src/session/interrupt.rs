//! Ctrl-C and friends: a flag the command loops poll.
//!
//! The handlers are installed without SA_RESTART, so a blocking call returns
//! EINTR at once instead of hiding the signal until the next tracee event
//! (crates such as ctrlc and signal-hook set SA_RESTART). Once tp is
//! restoring code, further signals only set the flag again: a second Ctrl-C
//! cannot cut a detach short.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

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

extern "C" fn forward(sig: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// For `tp run`, which waits for its program as a shell waits for a
/// foreground job: SIGINT and SIGQUIT, which the terminal sends to the
/// program too, are ignored by tp (the program decides; tp reports when it
/// ends), and SIGTERM and SIGHUP, which are sent to tp alone, are passed
/// on to the program `pid`.
pub fn forward_to(pid: i32) {
    FORWARD_TO.store(pid, Ordering::SeqCst);
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    let pass = SigAction::new(SigHandler::Handler(forward), SaFlags::SA_RESTART, SigSet::empty());
    for (sig, action) in
        [(Signal::SIGINT, &ignore), (Signal::SIGQUIT, &ignore), (Signal::SIGTERM, &pass), (Signal::SIGHUP, &pass)]
    {
        // SAFETY: the handler only calls kill, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, action) };
    }
}

/// True once one of those signals arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
