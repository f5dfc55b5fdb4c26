//! The notes and warnings tp's layers say while they work (a process that
//! exited, probes another tp removed, events lost): the [`Notes`] sink the
//! session engine calls with each line, and [`Stderr`], the command line's,
//! which writes each as one line on stderr (its failures noted by
//! [`crate::streams`]), as [`crate::say!`] does. A layer says a note with
//! [`crate::note!`].

use std::fmt;
use std::io::Write;
use std::sync::Arc;

use crate::streams::{self, Stream};

/// Where a layer's notes go: one call per line, without its newline.
pub trait Notes: fmt::Debug + Send + Sync {
    /// Says one line.
    fn say(&self, line: fmt::Arguments);
}

/// A shared sink (a session's, held by each layer that says something).
impl<N: Notes + ?Sized> Notes for Arc<N> {
    fn say(&self, line: fmt::Arguments) {
        (**self).say(line);
    }
}

/// The command line's notes: each a line on stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Notes for Stderr {
    fn say(&self, line: fmt::Arguments) {
        let mut line = line.to_string();
        line.push('\n');
        let written = std::io::stderr().lock().write_all(line.as_bytes());
        streams::note(Stream::Stderr, &written);
    }
}

/// Says a line, `format!`-style, to a [`Notes`] sink: `note!(notes, "tp: …", …)`.
#[macro_export]
macro_rules! note {
    ($notes:expr, $($arg:tt)*) => {
        $crate::notes::Notes::say(&*$notes, format_args!($($arg)*))
    };
}
