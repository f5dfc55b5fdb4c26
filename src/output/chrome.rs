//! A Chrome trace event file (JSON), which the Perfetto UI and
//! chrome://tracing open: calls with a known duration become complete
//! (`"ph":"X"`) slices per thread, entries without one instant events.
//! Timestamps are microseconds. Each event is serialized by serde_json
//! ([`chrome_args::write`]) as it comes, inside the fixed envelope
//! `{"displayTimeUnit":"ns","traceEvents":[` … `]}`, one event per line.

use std::io::{self, Write};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value as Json;

use super::chrome_args::{self, ChromeArgs};

/// A trace file being written; [`ChromeTrace::finish`] closes the JSON.
pub struct ChromeTrace {
    out: Box<dyn Write>,
    pid: i32,
    first: bool,
}

/// One trace event: its keys in the order the trace writes them, `args` last.
struct Event<'a> {
    keys: Vec<(&'static str, Json)>,
    args: &'a ChromeArgs,
}

impl Serialize for Event<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.keys.len() + 1))?;
        for (key, v) in &self.keys {
            map.serialize_entry(key, v)?;
        }
        map.serialize_entry("args", self.args)?;
        map.end()
    }
}

/// Nanoseconds as the trace's microseconds.
fn micros(ns: u64) -> Json {
    Json::from(ns as f64 / 1e3)
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

    /// Writes `event`, after the separator from the one before.
    fn event(&mut self, event: &Event) -> io::Result<()> {
        if !self.first {
            write!(self.out, ",")?;
        }
        self.first = false;
        writeln!(self.out)?;
        chrome_args::write(&mut self.out, event)
    }

    /// A call of `name` on thread `tid` from `start_ns` for `dur_ns`, with `args`.
    pub fn slice(&mut self, name: &str, tid: u32, start_ns: u64, dur_ns: u64, args: &ChromeArgs) -> io::Result<()> {
        let keys = vec![
            ("name", Json::from(name)),
            ("cat", Json::from("tp")),
            ("ph", Json::from("X")),
            ("ts", micros(start_ns)),
            ("dur", micros(dur_ns)),
            ("pid", Json::from(self.pid)),
            ("tid", Json::from(tid)),
        ];
        self.event(&Event { keys, args })
    }

    /// An entry of `name` whose return is not recorded.
    pub fn instant(&mut self, name: &str, tid: u32, ts_ns: u64, args: &ChromeArgs) -> io::Result<()> {
        let keys = vec![
            ("name", Json::from(name)),
            ("cat", Json::from("tp")),
            ("ph", Json::from("i")),
            ("s", Json::from("t")),
            ("ts", micros(ts_ns)),
            ("pid", Json::from(self.pid)),
            ("tid", Json::from(tid)),
        ];
        self.event(&Event { keys, args })
    }

    /// Names thread `tid` in the UI.
    pub fn thread_name(&mut self, tid: u32, name: &str) -> io::Result<()> {
        let keys = vec![
            ("name", Json::from("thread_name")),
            ("ph", Json::from("M")),
            ("pid", Json::from(self.pid)),
            ("tid", Json::from(tid)),
        ];
        let mut args = ChromeArgs::default();
        args.push("name", Json::from(name));
        self.event(&Event { keys, args: &args })
    }

    /// Ends the JSON and flushes the file.
    pub fn finish(mut self) -> io::Result<()> {
        writeln!(self.out, "\n]}}")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    /// What the trace wrote before its events were serialized by serde_json.
    fn spliced(name: &str, pid: i32, tid: u32, start_ns: u64, dur_ns: u64, args: &str) -> String {
        format!(
            "{{\"name\":{},\"cat\":\"tp\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{pid},\"tid\":{tid},\"args\":{args}}}",
            json::string(name),
            start_ns as f64 / 1e3,
            dur_ns as f64 / 1e3,
        )
    }

    #[test]
    fn events_are_written_as_before() {
        let file = std::env::temp_dir().join(format!("tp-chrome-{}", std::process::id()));
        let out = std::fs::File::create(&file).unwrap();
        let mut t = ChromeTrace::new(Box::new(out), 42).unwrap();
        let mut args = ChromeArgs::default();
        args.push("n", Json::from(5));
        args.push("s", Json::from("a\"b\u{202e}"));
        let name = "ns::f<\u{1b}>";
        t.slice(name, 7, 1_234_567_891, 1, &args).unwrap();
        t.instant(name, 8, 0, &ChromeArgs::default()).unwrap();
        t.thread_name(9, "w\n").unwrap();
        t.finish().unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        let instant = format!(
            "{{\"name\":{},\"cat\":\"tp\",\"ph\":\"i\",\"s\":\"t\",\"ts\":0.000,\"pid\":42,\"tid\":8,\"args\":{{}}}}",
            json::string(name)
        );
        let expected = format!(
            "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n{},\n{instant},\n{}\n]}}\n",
            spliced(name, 42, 7, 1_234_567_891, 1, &args.to_json().unwrap()),
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":42,\"tid\":9,\"args\":{\"name\":\"w\\n\"}}",
        );
        assert_eq!(text, expected);
        assert!(text.contains("\"ts\":1234567.891,\"dur\":0.001,"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 3);
    }
}
