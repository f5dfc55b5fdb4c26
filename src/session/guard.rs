//! Restoring a session's probes when tp leaves a command early.
//!
//! Once `tp attach`, `tp profile` or `tp demo` has installed probes that
//! belong to this tp, every way out of the command must take them out
//! again: the normal end, an error returned by the code between attach and
//! detach (a trace file that cannot be created, a failed drain), and a panic
//! (a bug), which unwinds through [`Restore`]'s `Drop`. Probes kept with
//! `--keep` are meant to stay and get no guard. The guard restores quietly
//! (the error is the one line tp prints), and says so only if it cannot.

use anyhow::Result;

use super::attached::{Attached, Detached};
use crate::escape::text;
use crate::notes::Notes;

/// Detaches `attached` when dropped, unless [`Restore::detach`] did.
pub struct Restore<'a> {
    attached: Option<&'a mut Attached>,
    /// Where it says a restore that failed.
    notes: &'a dyn Notes,
}

impl<'a> Restore<'a> {
    /// Guards the probes of `attached` from here on; a restore that fails
    /// is said to `notes`.
    pub fn new(attached: &'a mut Attached, notes: &'a dyn Notes) -> Restore<'a> {
        Restore { attached: Some(attached), notes }
    }

    /// The guarded session.
    pub fn get(&self) -> &Attached {
        self.attached.as_deref().expect("a guard holds its session until it detaches")
    }

    /// The guarded session, to probe more functions in.
    pub fn get_mut(&mut self) -> &mut Attached {
        self.attached.as_deref_mut().expect("a guard holds its session until it detaches")
    }

    /// The normal end: detaches now, and the guard has nothing left to do.
    pub fn detach(mut self) -> Result<Detached> {
        let attached = self.attached.take().expect("a guard detaches once");
        attached.detach()
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let Some(attached) = self.attached.take() else { return };
        let pid = attached.pid;
        // Quiet when it works: the error (or the panic) is the one line.
        match attached.detach() {
            Ok(_) => {}
            Err(e) => crate::note!(
                self.notes,
                "tp: cannot restore the code of process {pid}: {}; run `tp detach -p {pid}`",
                text(&format!("{e:#}"))
            ),
        }
    }
}
