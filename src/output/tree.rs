//! The call tree view (`--tree`): each thread's calls of probed functions
//! indented under their callers, as uftrace shows them. A call whose next
//! event on its thread is its own exit (no probed callee) takes one line
//! with its arguments, return value and duration; a call with probed
//! callees opens a line with `{` and its exit closes it with `}`. Depth is
//! the nesting among probed calls only.
//!
//! The events come from the target: an exit may arrive without its entry
//! (events lost, a call that began before the probes went in), so a
//! thread's open calls are kept as the probes they belong to, bounded, and
//! an exit closes the innermost open call of its probe, or none.

use std::collections::HashMap;
use std::io::{self, Write};

use super::events::duration;
use crate::escape::text;
use crate::events::values::{self, ProbeInfo, Value};

/// The deepest nesting a thread's open calls are kept for: deeper calls
/// are shown at this depth.
const MAX_DEPTH: usize = 256;

/// The most threads whose state is kept; past it, threads with no open
/// call are forgotten.
const MAX_THREADS: usize = 4096;

/// An entry not shown yet: it becomes one line with its exit if that is
/// its thread's next event.
struct Pending {
    probe: u32,
    call: String,
    ts_ns: u64,
}

#[derive(Default)]
struct Thread {
    /// The probes of the open calls, outermost first.
    open: Vec<u32>,
    /// Calls deeper than [`MAX_DEPTH`] still open.
    beyond: usize,
    pending: Option<Pending>,
}

impl Thread {
    fn depth(&self) -> usize {
        self.open.len() + self.beyond
    }
}

/// One process's call trees, one per thread.
#[derive(Default)]
pub struct Tree {
    threads: HashMap<(i32, u32), Thread>,
}

/// Where a line goes and how it starts: the session's start (`origin_ns`),
/// the process and whether lines show it.
#[derive(Debug, Clone, Copy)]
pub struct Columns {
    /// CLOCK_MONOTONIC ns of the session's start.
    pub origin_ns: u64,
    /// The process.
    pub pid: i32,
    /// True if lines have a PID column.
    pub show_pid: bool,
}

impl Columns {
    fn write(
        &self,
        out: &mut impl Write,
        ts_ns: u64,
        tid: u32,
        dur: Option<u64>,
        depth: usize,
        body: &str,
    ) -> io::Result<()> {
        let secs = ts_ns.saturating_sub(self.origin_ns) as f64 / 1e9;
        let pid = if self.show_pid { format!(" {:>7}", self.pid) } else { String::new() };
        let dur = dur.map(duration).unwrap_or_default();
        writeln!(out, "{secs:>12.6}{pid} {tid:>7} {dur:>9}  {:indent$}{body}", "", indent = 2 * depth)
    }
}

/// The header of tree lines.
pub fn header(with_pid: bool) -> String {
    let pid = if with_pid { format!(" {:>7}", "PID") } else { String::new() };
    format!("{:>12}{pid} {:>7} {:>9}  CALL", "TIME(s)", "TID", "DURATION")
}

impl Tree {
    /// The depth the next call of `tid` in `pid` starts at (for JSON lines),
    /// counting an entry not shown yet.
    pub fn depth(&self, pid: i32, tid: u32) -> usize {
        self.threads.get(&(pid, tid)).map_or(0, |t| t.depth() + usize::from(t.pending.is_some()))
    }

    fn thread(&mut self, pid: i32, tid: u32) -> &mut Thread {
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&(pid, tid)) {
            self.threads.retain(|_, t| t.depth() > 0 || t.pending.is_some());
        }
        self.threads.entry((pid, tid)).or_default()
    }

    /// Shows `t`'s pending entry, if any, as an open call.
    fn open_pending(t: &mut Thread, cols: &Columns, tid: u32, out: &mut impl Write) -> io::Result<()> {
        let Some(p) = t.pending.take() else { return Ok(()) };
        cols.write(out, p.ts_ns, tid, None, t.depth(), &format!("{} {{", p.call))?;
        match t.open.len() < MAX_DEPTH {
            true => t.open.push(p.probe),
            false => t.beyond += 1,
        }
        Ok(())
    }

    /// A call of `info` (probe `probe`) began on `tid` with `args`.
    #[allow(clippy::too_many_arguments)]
    pub fn entry(
        &mut self,
        out: &mut impl Write,
        cols: &Columns,
        tid: u32,
        ts_ns: u64,
        probe: u32,
        info: &ProbeInfo,
        args: &[(String, Value)],
    ) -> io::Result<()> {
        let t = self.thread(cols.pid, tid);
        Self::open_pending(t, cols, tid, out)?;
        t.pending = Some(Pending { probe, call: values::call_text(&info.name, args), ts_ns });
        Ok(())
    }

    /// A call of `info` (probe `probe`) ended on `tid`: returned `ret`,
    /// tail-called another function, or was unwound (`outcome`).
    #[allow(clippy::too_many_arguments)]
    pub fn exit(
        &mut self,
        out: &mut impl Write,
        cols: &Columns,
        tid: u32,
        ts_ns: u64,
        probe: u32,
        info: &ProbeInfo,
        outcome: Outcome,
        duration_ns: u64,
    ) -> io::Result<()> {
        let t = self.thread(cols.pid, tid);
        let end = match outcome {
            Outcome::Returned(Some(v)) => format!(" → {}", v.text()),
            Outcome::Returned(None) => String::new(),
            Outcome::TailCall => " ↷ tail call".into(),
            Outcome::Unwound => " ↯ unwound".into(),
        };
        if let Some(p) = t.pending.take_if(|p| p.probe == probe) {
            // No probed callee: one line.
            return cols.write(out, p.ts_ns, tid, Some(duration_ns), t.depth(), &format!("{}{end}", p.call));
        }
        Self::open_pending(t, cols, tid, out)?;
        // The innermost open call of this probe closes, and any opened
        // after it whose exits were not seen.
        match t.open.iter().rposition(|&p| p == probe) {
            Some(at) if t.beyond == 0 => t.open.truncate(at),
            Some(_) => t.beyond -= 1,
            None => {}
        }
        cols.write(out, ts_ns, tid, Some(duration_ns), t.depth(), &format!("}} {}{end}", text(&info.name)))
    }

    /// Shows every entry not shown yet as an open call (the session ends),
    /// with `cols` but each thread's own process.
    pub fn flush(&mut self, out: &mut impl Write, cols: &Columns) -> io::Result<()> {
        let mut keys: Vec<(i32, u32)> = self.threads.keys().copied().collect();
        keys.sort_unstable();
        for (pid, tid) in keys {
            if let Some(t) = self.threads.get_mut(&(pid, tid)) {
                Self::open_pending(t, &Columns { pid, ..*cols }, tid, out)?;
            }
        }
        Ok(())
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// It returned (the value, if it has one).
    Returned(Option<&'a Value>),
    /// It ended by jumping to another function.
    TailCall,
    /// An exception or a longjmp passed through it.
    Unwound,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str) -> ProbeInfo {
        ProbeInfo { name: name.into(), module: "m".into(), dwarf: None, operands: None, ..Default::default() }
    }

    #[test]
    fn nested_calls_indent_and_leaves_take_one_line() {
        let (fib, leaf) = (info("fib"), info("leaf"));
        let cols = Columns { origin_ns: 0, pid: 1, show_pid: false };
        let mut tree = Tree::default();
        let mut out = Vec::new();
        let n = |v: i64| vec![("n".to_string(), Value::Int(v))];
        tree.entry(&mut out, &cols, 7, 1_000, 1, &fib, &n(2)).unwrap();
        assert_eq!(tree.depth(1, 7), 1);
        tree.entry(&mut out, &cols, 7, 2_000, 1, &fib, &n(1)).unwrap();
        tree.entry(&mut out, &cols, 7, 3_000, 2, &leaf, &[]).unwrap();
        tree.exit(&mut out, &cols, 7, 3_500, 2, &leaf, Outcome::Returned(None), 500).unwrap();
        tree.exit(&mut out, &cols, 7, 4_000, 1, &fib, Outcome::Returned(Some(&Value::Int(1))), 2_000).unwrap();
        tree.entry(&mut out, &cols, 7, 5_000, 1, &fib, &n(0)).unwrap();
        tree.exit(&mut out, &cols, 7, 5_100, 1, &fib, Outcome::Returned(Some(&Value::Int(0))), 100).unwrap();
        tree.exit(&mut out, &cols, 7, 6_000, 1, &fib, Outcome::Returned(Some(&Value::Int(1))), 5_000).unwrap();
        let text = String::from_utf8(out).unwrap();
        let calls: Vec<String> = text.lines().map(|l| l.chars().skip(32).collect()).collect();
        assert_eq!(
            calls,
            ["fib(n=2) {", "  fib(n=1) {", "    leaf()", "  } fib → 1", "  fib(n=0) → 0", "} fib → 1"],
            "{text}"
        );
        assert!(text.lines().nth(2).unwrap().contains("    500ns"), "{text}");
        assert_eq!(tree.depth(1, 7), 0);
    }

    #[test]
    fn an_exit_without_its_entry_changes_nothing_and_lost_exits_are_closed() {
        let (a, b) = (info("a"), info("b"));
        let cols = Columns { origin_ns: 0, pid: 1, show_pid: true };
        let mut tree = Tree::default();
        let mut out = Vec::new();
        tree.exit(&mut out, &cols, 7, 10, 2, &b, Outcome::Unwound, 5).unwrap();
        assert_eq!(tree.depth(1, 7), 0);
        tree.entry(&mut out, &cols, 7, 20, 1, &a, &[]).unwrap();
        tree.entry(&mut out, &cols, 7, 30, 2, &b, &[]).unwrap();
        tree.entry(&mut out, &cols, 7, 40, 2, &b, &[]).unwrap();
        // The two exits of b were lost: a's exit closes them too.
        tree.exit(&mut out, &cols, 7, 50, 1, &a, Outcome::TailCall, 30).unwrap();
        assert_eq!(tree.depth(1, 7), 0);
        tree.flush(&mut out, &cols).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().last().unwrap().ends_with("} a ↷ tail call"), "{text}");
        assert!(text.lines().next().unwrap().contains("} b ↯ unwound"), "{text}");
    }

    #[test]
    fn depth_is_bounded() {
        let f = info("f");
        let cols = Columns { origin_ns: 0, pid: 1, show_pid: false };
        let mut tree = Tree::default();
        let mut out = Vec::new();
        for i in 0..MAX_DEPTH as u64 + 10 {
            tree.entry(&mut out, &cols, 1, i, 1, &f, &[]).unwrap();
        }
        tree.flush(&mut out, &cols).unwrap();
        assert_eq!(tree.depth(1, 1), MAX_DEPTH + 10);
        for i in 0..MAX_DEPTH as u64 + 10 {
            tree.exit(&mut out, &cols, 1, i, 1, &f, Outcome::Returned(None), 1).unwrap();
        }
        assert_eq!(tree.depth(1, 1), 0);
    }
}
