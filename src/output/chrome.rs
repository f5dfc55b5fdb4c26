//! A Chrome trace event file (JSON), which the Perfetto UI and
//! chrome://tracing open: calls with a known duration become complete
//! (`"ph":"X"`) slices per thread, entries without one instant events.
//! Timestamps are microseconds.

use std::io::{self, Write};

use super::json;

/// A trace file being written; [`ChromeTrace::finish`] closes the JSON.
pub struct ChromeTrace {
    out: Box<dyn Write>,
    pid: i32,
    first: bool,
}

impl ChromeTrace {
    /// The process the next events belong to (a session of several
    /// processes writes them all into one trace).
    pub fn set_pid(&mut self, pid: i32) {
        self.pid = pid;
    }

    /// Starts the trace of process `pid` on `out` (a file, stdout).
    pub fn new(mut out: Box<dyn Write>, pid: i32) -> io::Result<ChromeTrace> {
        write!(out, "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        Ok(ChromeTrace { out, pid, first: true })
    }

    fn sep(&mut self) -> io::Result<()> {
        if !self.first {
            write!(self.out, ",")?;
        }
        self.first = false;
        writeln!(self.out)
    }

    /// A call of `name` on thread `tid` from `start_ns` for `dur_ns`, with `args` (a JSON object).
    pub fn slice(&mut self, name: &str, tid: u32, start_ns: u64, dur_ns: u64, args: &str) -> io::Result<()> {
        self.sep()?;
        write!(
            self.out,
            "{{\"name\":{},\"cat\":\"tp\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{},\"tid\":{tid},\"args\":{args}}}",
            json::string(name),
            start_ns as f64 / 1e3,
            dur_ns as f64 / 1e3,
            self.pid
        )
    }

    /// An entry of `name` whose return is not recorded.
    pub fn instant(&mut self, name: &str, tid: u32, ts_ns: u64, args: &str) -> io::Result<()> {
        self.sep()?;
        write!(
            self.out,
            "{{\"name\":{},\"cat\":\"tp\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{:.3},\"pid\":{},\"tid\":{tid},\"args\":{args}}}",
            json::string(name),
            ts_ns as f64 / 1e3,
            self.pid
        )
    }

    /// Names thread `tid` in the UI.
    pub fn thread_name(&mut self, tid: u32, name: &str) -> io::Result<()> {
        self.sep()?;
        write!(
            self.out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
            self.pid,
            json::string(name)
        )
    }

    /// Ends the JSON and flushes the file.
    pub fn finish(mut self) -> io::Result<()> {
        writeln!(self.out, "\n]}}")?;
        self.out.flush()
    }
}
