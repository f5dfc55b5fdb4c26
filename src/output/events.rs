//! Event lines on stdout: `TIME TID foo(n=5, name="x")` and
//! `TIME TID foo → 42  1.23µs` for people, or one JSON object per event.

use std::io::{self, Write};

use super::json;
use crate::escape::text;
use crate::events::values::{self, ProbeInfo, Value};

/// A decoded event, ready to print.
#[derive(Debug, Clone)]
pub enum Line<'a> {
    /// A call began.
    Entry {
        /// The probe.
        info: &'a ProbeInfo,
        /// Thread.
        tid: u32,
        /// CLOCK_MONOTONIC ns.
        ts_ns: u64,
        /// Named arguments.
        args: &'a [(String, Value)],
        /// Its stack (`--stack`), one line per frame, the function first.
        stack: Option<&'a [String]>,
        /// Its depth among the thread's probed calls (`--tree`).
        depth: Option<usize>,
    },
    /// A call returned.
    Exit {
        /// The probe.
        info: &'a ProbeInfo,
        /// Thread.
        tid: u32,
        /// CLOCK_MONOTONIC ns.
        ts_ns: u64,
        /// Return value (None: void, or a tail call).
        ret: Option<&'a Value>,
        /// The call ended by jumping to another function (a tail call),
        /// whose own return goes to this call's caller: it has no return
        /// value of its own.
        tail_call: bool,
        /// Duration, ns.
        duration_ns: u64,
        /// Its depth among the thread's probed calls (`--tree`).
        depth: Option<usize>,
    },
    /// The call ended without a return tp saw: an exception or a longjmp
    /// passed through it (with return addresses replaced: an exception
    /// started unwinding while it was active, and it may have caught it).
    Unwound {
        /// The probe.
        info: &'a ProbeInfo,
        /// Thread.
        tid: u32,
        /// CLOCK_MONOTONIC ns.
        ts_ns: u64,
        /// Time from entry to the unwinding, ns.
        duration_ns: u64,
        /// Its depth among the thread's probed calls (`--tree`).
        depth: Option<usize>,
    },
}

/// `1.23µs`, `456ns`, `7.80ms`, `2.50s`.
pub fn duration(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{:.2}µs", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.2}ms", n as f64 / 1e6),
        n => format!("{:.2}s", n as f64 / 1e9),
    }
}

/// Writes `line` of process `pid` as a live line; `origin_ns` is the
/// session's start (the lines show seconds since it). The lines have a PID
/// column before the TID when `show_pid` (a session of several processes,
/// or one whose children recorded).
pub fn write_text(out: &mut dyn Write, origin_ns: u64, (pid, show_pid): (i32, bool), line: &Line) -> io::Result<()> {
    let secs = |ts: u64| ts.saturating_sub(origin_ns) as f64 / 1e9;
    let pid_col = if show_pid { format!(" {pid:>7}") } else { String::new() };
    match line {
        Line::Entry { info, tid, ts_ns, args, .. } => {
            writeln!(out, "{:>12.6}{pid_col} {tid:>7} {}", secs(*ts_ns), values::call_text(&info.name, args))
        }
        Line::Exit { info, tid, ts_ns, ret, tail_call, duration_ns, .. } => {
            let ret = match (ret, tail_call) {
                (_, true) => " ↷ tail call".to_string(),
                (Some(v), false) => format!(" → {}", v.text()),
                (None, false) => String::new(),
            };
            writeln!(
                out,
                "{:>12.6}{pid_col} {tid:>7} {}{ret}  {}",
                secs(*ts_ns),
                text(&info.name),
                duration(*duration_ns)
            )
        }
        Line::Unwound { info, tid, ts_ns, duration_ns, .. } => writeln!(
            out,
            "{:>12.6}{pid_col} {tid:>7} {} ↯ left without a return tp saw (an exception, a longjmp)  {}",
            secs(*ts_ns),
            text(&info.name),
            duration(*duration_ns)
        ),
    }
}

/// Writes `line` of process `pid` as one JSON object on a line (JSON
/// Lines), which always names the process.
pub fn write_json(out: &mut dyn Write, pid: i32, line: &Line) -> io::Result<()> {
    // The keys every event has, in order: type, pid, tid, ts_ns, func, module.
    // (`depth` after them with `--tree`.)
    let common = |kind: &str, info: &ProbeInfo, tid: u32, ts_ns: u64, depth: &Option<usize>| {
        let o = json::Obj::new()
            .str("type", kind)
            .num("pid", pid)
            .num("tid", tid)
            .num("ts_ns", ts_ns)
            .str("func", &info.name)
            .str("module", &info.module);
        match depth {
            Some(d) => o.num("depth", d),
            None => o,
        }
    };
    match line {
        Line::Entry { info, tid, ts_ns, args, stack, depth } => {
            let o = common("entry", info, *tid, *ts_ns, depth).raw("args", &json::args(args));
            let o = match stack {
                Some(frames) => o.list("stack", frames.iter().map(|f| json::string(f))),
                None => o.num("stack", "null"),
            };
            writeln!(out, "{}", o.finish())
        }
        Line::Exit { info, tid, ts_ns, ret, tail_call, duration_ns, depth } => {
            let ret = ret.map_or("null".to_string(), json::value);
            let o = common("exit", info, *tid, *ts_ns, depth).raw("ret", &ret).num("tail_call", tail_call);
            writeln!(out, "{}", o.num("duration_ns", duration_ns).finish())
        }
        Line::Unwound { info, tid, ts_ns, duration_ns, depth } => {
            writeln!(out, "{}", common("unwound", info, *tid, *ts_ns, depth).num("duration_ns", duration_ns).finish())
        }
    }
}

/// The header of text event lines.
pub fn header(with_pid: bool) -> String {
    if with_pid {
        format!("{:>12} {:>7} {:>7} CALL", "TIME(s)", "PID", "TID")
    } else {
        format!("{:>12} {:>7} CALL", "TIME(s)", "TID")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ProbeInfo {
        ProbeInfo { name: "foo".into(), module: "m".into(), dwarf: None, operands: None, ..Default::default() }
    }

    fn text(line: &Line) -> String {
        let mut v = Vec::new();
        write_text(&mut v, 1_000_000_000, (42, false), line).unwrap();
        String::from_utf8(v).unwrap()
    }

    fn json(line: &Line) -> String {
        let mut v = Vec::new();
        write_json(&mut v, 42, line).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn live_lines() {
        let i = info();
        let args = [("n".to_string(), Value::Int(5)), ("name".to_string(), Value::Str(1, Some("x".into())))];
        let entry = Line::Entry { info: &i, tid: 77, ts_ns: 2_500_000_000, args: &args, stack: None, depth: None };
        assert_eq!(text(&entry), "    1.500000      77 foo(n=5, name=\"x\")\n");
        let exit = Line::Exit {
            info: &i,
            tid: 77,
            ts_ns: 2_500_001_230,
            ret: Some(&Value::Int(42)),
            tail_call: false,
            duration_ns: 1230,
            depth: None,
        };
        assert_eq!(text(&exit), "    1.500001      77 foo → 42  1.23µs\n");
    }

    #[test]
    fn lines_of_several_processes_name_the_process() {
        let i = info();
        let exit = Line::Exit {
            info: &i,
            tid: 77,
            ts_ns: 2_500_001_230,
            ret: None,
            tail_call: false,
            duration_ns: 1230,
            depth: None,
        };
        let mut v = Vec::new();
        write_text(&mut v, 1_000_000_000, (4242, true), &exit).unwrap();
        assert_eq!(String::from_utf8(v).unwrap(), "    1.500001    4242      77 foo  1.23µs\n");
        let mut v = Vec::new();
        write_json(&mut v, 4242, &exit).unwrap();
        assert!(String::from_utf8(v).unwrap().starts_with("{\"type\":\"exit\",\"pid\":4242,\"tid\":77,"));
        assert_eq!(header(true), "     TIME(s)     PID     TID CALL");
    }

    #[test]
    fn json_lines() {
        let i = info();
        let args = [("n".to_string(), Value::Int(5))];
        let entry = Line::Entry { info: &i, tid: 7, ts_ns: 10, args: &args, stack: None, depth: None };
        assert_eq!(
            json(&entry),
            "{\"type\":\"entry\",\"pid\":42,\"tid\":7,\"ts_ns\":10,\"func\":\"foo\",\"module\":\"m\",\"args\":{\"n\":5},\"stack\":null}\n"
        );
        let exit =
            Line::Exit { info: &i, tid: 7, ts_ns: 20, ret: None, tail_call: false, duration_ns: 10, depth: None };
        assert_eq!(
            json(&exit),
            "{\"type\":\"exit\",\"pid\":42,\"tid\":7,\"ts_ns\":20,\"func\":\"foo\",\"module\":\"m\",\"ret\":null,\"tail_call\":false,\"duration_ns\":10}\n"
        );
        let tail = Line::Exit { info: &i, tid: 7, ts_ns: 20, ret: None, tail_call: true, duration_ns: 10, depth: None };
        assert!(json(&tail).contains("\"ret\":null,\"tail_call\":true,"));
        assert!(text(&tail).contains("foo ↷ tail call  10ns"), "{}", text(&tail));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(999), "999ns");
        assert_eq!(duration(1230), "1.23µs");
        assert_eq!(duration(7_800_000), "7.80ms");
        assert_eq!(duration(2_500_000_000), "2.50s");
    }
}
