//! tp's standard output and standard error: whether one of them failed.
//!
//! tp is used in pipelines (`tp attach … | head -1`) and with its output
//! redirected (`> /dev/full`). A write that fails with EPIPE (the reader
//! went away), ENOSPC or EIO means nobody will read what tp says next, so a
//! session ends there, as on Ctrl-C: every probe removed, one line on the
//! stream that still works, and a Unix exit status ([`Failure::code`]).
//! Every write of tp's to stdout goes through [`Stdout`], and every line
//! of `say!` to stderr is noted here, so the first failure of either is
//! known at once; [`check`] also finds a pipe whose reader is gone before
//! tp writes to it (a session that only counts writes at its end). It
//! imports nothing, so every layer that writes can use it.

use std::io::{self, Write};
use std::sync::atomic::{AtomicI32, Ordering};

/// Exit status when a reader of tp's output went away (EPIPE): what a
/// shell reports for a process killed by SIGPIPE (128 + 13).
pub const EXIT_PIPE: u8 = 141;
/// Exit status when tp's output cannot be written (ENOSPC, EIO, ...):
/// `EX_IOERR` of sysexits.h.
pub const EXIT_IO: u8 = 74;

/// One of tp's standard streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// File descriptor 1.
    Stdout,
    /// File descriptor 2.
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    fn fd(self) -> i32 {
        self.index() as i32 + 1
    }

    /// `standard output` or `standard error`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "standard output",
            Stream::Stderr => "standard error",
        }
    }
}

/// The errno of the first failed write to each stream (0: none yet; -1: a
/// failure without an errno).
static FAILED: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];

/// Notes the outcome of a write to `stream`: its first error is kept.
pub fn note<T>(stream: Stream, result: &io::Result<T>) {
    if let Err(e) = result {
        if e.kind() == io::ErrorKind::Interrupted {
            return;
        }
        let errno = e.raw_os_error().filter(|&n| n > 0).unwrap_or(-1);
        let _ = FAILED[stream.index()].compare_exchange(0, errno, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// How one stream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The stream.
    pub stream: Stream,
    /// Its errno (-1 when the error had none).
    pub errno: i32,
}

impl Failure {
    /// True if the reader went away (EPIPE).
    pub fn broken_pipe(self) -> bool {
        self.errno == libc::EPIPE
    }

    /// The exit status tp ends with: [`EXIT_PIPE`] or [`EXIT_IO`].
    pub fn code(self) -> u8 {
        if self.broken_pipe() { EXIT_PIPE } else { EXIT_IO }
    }

    /// `standard output is closed (Broken pipe)`, `standard error cannot be
    /// written (No space left on device)`.
    pub fn describe(self) -> String {
        let why = if self.errno > 0 {
            let s = io::Error::from_raw_os_error(self.errno).to_string();
            s.split(" (os error").next().unwrap_or(&s).to_string()
        } else {
            "write failed".to_string()
        };
        let what = if self.broken_pipe() { "is closed" } else { "cannot be written" };
        format!("{} {what} ({why})", self.stream.name())
    }
}

/// The first failure of stdout, else of stderr, if either failed.
pub fn failure() -> Option<Failure> {
    [Stream::Stdout, Stream::Stderr].into_iter().find_map(|stream| {
        let errno = FAILED[stream.index()].load(Ordering::SeqCst);
        (errno != 0).then_some(Failure { stream, errno })
    })
}

/// True once a write to stdout or stderr failed (or [`check`] found one closed).
pub fn closed() -> bool {
    failure().is_some()
}

/// Looks, without writing, whether stdout or stderr is a pipe or socket
/// whose reader is gone (poll reports an error or a hang-up on it), and
/// notes it as a broken pipe. Returns [`closed`].
pub fn check() -> bool {
    check_only(&[Stream::Stdout, Stream::Stderr])
}

/// [`check`] of `streams` alone (`tp run`'s stdout is its program's).
pub fn check_only(streams: &[Stream]) -> bool {
    for &stream in streams {
        let mut fd = libc::pollfd { fd: stream.fd(), events: 0, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        // A terminal that hangs up sends SIGHUP, which ends the session by
        // itself; a file never reports either.
        if n == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0 && fd.revents & libc::POLLNVAL == 0 {
            note::<()>(stream, &Err(io::Error::from_raw_os_error(libc::EPIPE)));
        }
    }
    closed()
}

/// Set once [`last_word`] said why tp stopped.
static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True once [`last_word`] was called.
pub fn said() -> bool {
    SAID.load(Ordering::SeqCst)
}

/// Writes `line` to whichever stream still works, stderr first: the one
/// line that says why tp stopped.
pub fn last_word(line: &str) {
    SAID.store(true, Ordering::SeqCst);
    let line = format!("{line}\n");
    let failed = |s: Stream| FAILED[s.index()].load(Ordering::SeqCst) != 0;
    if !failed(Stream::Stderr) {
        let r = io::stderr().lock().write_all(line.as_bytes());
        note(Stream::Stderr, &r);
        if r.is_ok() {
            return;
        }
    }
    if !failed(Stream::Stdout) {
        let mut out = io::stdout().lock();
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    }
}

/// tp's standard output: every failure is noted ([`note`]).
pub struct Stdout(io::Stdout);

/// Standard output, noted.
pub fn stdout() -> Stdout {
    Stdout(io::stdout())
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = self.0.write(buf);
        note(Stream::Stdout, &r);
        r
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let r = self.0.write_all(buf);
        note(Stream::Stdout, &r);
        r
    }

    fn flush(&mut self) -> io::Result<()> {
        let r = self.0.flush();
        note(Stream::Stdout, &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_a_user_would_say_them() {
        let pipe = Failure { stream: Stream::Stdout, errno: libc::EPIPE };
        assert_eq!(pipe.describe(), "standard output is closed (Broken pipe)");
        assert_eq!(pipe.code(), 141);
        let full = Failure { stream: Stream::Stderr, errno: libc::ENOSPC };
        assert_eq!(full.describe(), "standard error cannot be written (No space left on device)");
        assert_eq!(full.code(), 74);
    }
}
