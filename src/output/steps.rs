//! What `--steps` reports of each stepped call: how many instructions it
//! executed and how long it took, why its trace ended, the path it took as
//! source lines, the count of each line, and its busiest instructions; as
//! text and as the `steps` objects of a process in JSON (docs/output.md).

use std::io::{self, Write};

use super::json::{self, Obj};
use super::thousands;
use crate::escape::text;

/// Instructions of a stepped call the text shows, the busiest first.
pub const TOP_INSTRUCTIONS: usize = 20;

/// One stepped call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteppedCall {
    /// The function called.
    pub func: String,
    /// Its module's file name.
    pub module: String,
    /// The thread that made the call.
    pub tid: i32,
    /// The instructions it executed (to the limit).
    pub instructions: u64,
    /// Microseconds from its first instruction to its end, stepped.
    pub micros: u64,
    /// Why the trace ended: `returned`, `limit` (it ran on free), `syscall
    /// N` (let go in a syscall that blocked), `exited`, `stopped` (tp
    /// ended), `missed` (the thread was not at the hand-over).
    pub end: String,
    /// Steps through tp's own code (other probes' detours), not counted.
    pub in_tp: u64,
    /// The path as source lines, repeats folded: `loop.c:5 (loop.c:6 loop.c:7)×1000 loop.c:8`.
    pub path: String,
    /// Each source line's instructions, in the order the call first reached them.
    pub lines: Vec<(String, u64)>,
    /// Each instruction executed: (address, `function+offset`, source line
    /// or "", times executed), the busiest first.
    pub hot: Vec<(u64, String, String, u64)>,
    /// The instructions by call path, outermost first (`chain;leaf`), in
    /// the order the call first reached each path.
    pub by_path: Vec<(Vec<String>, u64)>,
    /// `--step-depth`: how deep its calls were stepped (None: all).
    pub depth: Option<u32>,
    /// The calls deeper than that, which ran free: (function called,
    /// calls, their time in ns), in the order first called.
    pub unstepped: Vec<(String, u64, u64)>,
    /// Signals delivered during the call; their handlers ran free, not stepped.
    pub signals: u64,
    /// From the signals' stops until the thread was back where each found it, in ns.
    pub signal_ns: u64,
}

/// Writes each stepped call.
pub fn write_text(out: &mut impl Write, calls: &[SteppedCall]) -> io::Result<()> {
    for c in calls {
        writeln!(
            out,
            "\nstepped call of {} ({}) in thread {}: {} instructions in {} ({})",
            text(&c.func),
            text(&c.module),
            c.tid,
            thousands(c.instructions),
            super::events::duration(c.micros.saturating_mul(1000)),
            end_text(&c.end)
        )?;
        if let Some(depth) = c.depth {
            let calls: Vec<String> = c
                .unstepped
                .iter()
                .map(|(f, n, ns)| format!("{} ×{} ({})", text(f), thousands(*n), super::events::duration(*ns)))
                .collect();
            let calls = if calls.is_empty() { "none".to_string() } else { calls.join(", ") };
            writeln!(out, "  not stepped, run free (calls deeper than --step-depth {depth}): {calls}")?;
        }
        if c.signals > 0 {
            writeln!(
                out,
                "  signals: {} delivered, their handlers run free, not stepped ({})",
                thousands(c.signals),
                super::events::duration(c.signal_ns)
            )?;
        }
        if !c.path.is_empty() {
            writeln!(out, "  path: {}", text(&c.path))?;
        }
        if !c.lines.is_empty() {
            let w = c.lines.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(4).clamp(4, 48);
            writeln!(out, "  {:<w$}  {:>14}", "LINE", "INSTRUCTIONS")?;
            for (line, n) in &c.lines {
                writeln!(out, "  {:<w$}  {:>14}", text(line), thousands(*n))?;
            }
        }
        let shown = &c.hot[..c.hot.len().min(TOP_INSTRUCTIONS)];
        let w = shown.iter().map(|h| h.1.chars().count()).max().unwrap_or(11).clamp(11, 60);
        writeln!(out, "  {:<18}  {:<w$}  {:<20}  {:>12}", "ADDRESS", "INSTRUCTION", "LINE", "EXECUTED")?;
        for (addr, at, line, n) in shown {
            writeln!(
                out,
                "  {:<18}  {:<w$}  {:<20}  {:>12}",
                format!("{addr:#x}"),
                text(at),
                text(line),
                thousands(*n)
            )?;
        }
        if c.hot.len() > shown.len() {
            writeln!(out, "  ({} more instructions ran; --json lists every one)", c.hot.len() - shown.len())?;
        }
    }
    Ok(())
}

/// Folded lines (flamegraph.pl, speedscope) of the stepped calls: each
/// call path, outermost first, weighted by the instructions executed there.
pub fn folded(calls: &[SteppedCall]) -> Vec<String> {
    let mut lines = Vec::new();
    for c in calls {
        for (path, n) in &c.by_path {
            let names: Vec<String> = path.iter().map(|n| text(n).replace(';', "_")).collect();
            lines.push(format!("{} {n}", names.join(";")));
        }
    }
    lines
}

/// Where an instruction of a stepped call is, for [`call_paths`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A function's first instruction.
    Entry,
    /// Further into a function.
    Body,
    /// In no function the symbols name (a PLT stub).
    Stub,
}

/// Where each instruction of a stepped call ran, as a call path: `names`
/// holds the function (or the stub's name) of each instruction, in order,
/// and its [`Place`]. A function's first instruction is a call from the
/// path so far (a recursion too); reaching a function already on the path
/// returns to it; entering a stub calls it; any other change of function
/// is a jump (the path's last function replaced).
pub fn call_paths(names: impl IntoIterator<Item = (String, Place)>) -> Vec<(Vec<String>, u64)> {
    let mut path: Vec<String> = Vec::new();
    let mut out: Vec<(Vec<String>, u64)> = Vec::new();
    let mut index: std::collections::HashMap<Vec<String>, usize> = std::collections::HashMap::new();
    for (name, place) in names {
        match place {
            Place::Entry => path.push(name),
            _ if path.last() == Some(&name) => {}
            _ => match path.iter().rposition(|n| *n == name) {
                Some(k) => path.truncate(k + 1),
                None if place == Place::Stub || path.is_empty() => path.push(name),
                None => *path.last_mut().expect("not empty") = name,
            },
        }
        let i = *index.entry(path.clone()).or_insert_with(|| {
            out.push((path.clone(), 0));
            out.len() - 1
        });
        out[i].1 += 1;
    }
    out
}

/// The end of a trace as the text says it.
fn end_text(end: &str) -> String {
    match end.split_once(' ') {
        _ if end == "returned" => "it returned".into(),
        _ if end == "limit" => "the limit of instructions: the call ran on free".into(),
        _ if end == "exited" => "the thread exited".into(),
        _ if end == "stopped" => "tp ended first: the call ran on free".into(),
        _ if end == "missed" => "the thread went on before tp took it".into(),
        _ if end == "stall" => "an exclusive load, which single steps cannot pass: the call ran on free".into(),
        Some(("syscall", nr)) => format!("let go in syscall {nr}, which blocked: the call ran on free"),
        Some(("masked", nr)) => {
            format!("at syscall {nr}, which could block SIGTRAP or replace tp's handler: the call ran on free")
        }
        _ => end.into(),
    }
}

/// One stepped call as a JSON object.
pub fn to_json(c: &SteppedCall) -> String {
    Obj::new()
        .str("func", &c.func)
        .str("module", &c.module)
        .num("tid", c.tid)
        .num("instructions", c.instructions)
        .num("us", c.micros)
        .str("end", &c.end)
        .num("steps_in_tp", c.in_tp)
        .opt("step_depth", c.depth)
        .list(
            "unstepped",
            c.unstepped.iter().map(|(f, n, ns)| Obj::new().str("func", f).num("calls", *n).num("ns", *ns).finish()),
        )
        .num("signals", c.signals)
        .num("signal_ns", c.signal_ns)
        .str("path", &c.path)
        .list("lines", c.lines.iter().map(|(l, n)| Obj::new().str("line", l).num("instructions", *n).finish()))
        .list(
            "paths",
            c.by_path.iter().map(|(p, n)| {
                Obj::new().list("path", p.iter().map(|f| json::string(f))).num("instructions", *n).finish()
            }),
        )
        .list(
            "executed",
            c.hot.iter().map(|(a, at, line, n)| {
                Obj::new().str("address", &format!("{a:#x}")).str("at", at).str("line", line).num("count", *n).finish()
            }),
        )
        .finish()
}

/// The longest run of lines [`fold_path`] folds as one repeat.
pub const FOLD_LEN: usize = 16;

/// The path of a call through its source lines, `seq` (each line once per
/// run), with repeats of up to [`FOLD_LEN`] lines folded: `a (b c)×3 d`.
/// At most `max` items are shown, then `…`.
pub fn fold_path(seq: &[String], max: usize) -> String {
    let mut items: Vec<String> = Vec::new();
    let mut i = 0;
    while i < seq.len() {
        if items.len() >= max {
            items.push("…".into());
            break;
        }
        // The cycle that covers the most from here.
        let mut best = (1, 1);
        for len in 1..=FOLD_LEN.min(seq.len() - i) {
            let mut reps = 1;
            while i + (reps + 1) * len <= seq.len() && seq[i + reps * len..i + (reps + 1) * len] == seq[i..i + len] {
                reps += 1;
            }
            if reps > 1 && reps * len > best.0 * best.1 {
                best = (len, reps);
            }
        }
        let (len, reps) = best;
        items.push(match (len, reps) {
            (_, 1) => seq[i].clone(),
            (1, r) => format!("{}×{r}", seq[i]),
            (l, r) => format!("({})×{r}", seq[i..i + l].join(" ")),
        });
        i += len * reps;
    }
    items.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn paths_fold_repeats() {
        assert_eq!(fold_path(&seq("a b c b c b c d"), 40), "a (b c)×3 d");
        assert_eq!(fold_path(&seq("a a a b"), 40), "a×3 b");
        assert_eq!(fold_path(&seq("a b c d"), 40), "a b c d");
        assert_eq!(fold_path(&seq("a b c d"), 2), "a b …");
        assert_eq!(fold_path(&[], 40), "");
        // A cycle of four, twice, beats a cycle of one.
        assert_eq!(fold_path(&seq("x y x z x y x z"), 40), "(x y x z)×2");
    }

    #[test]
    fn call_paths_follow_calls_returns_and_jumps() {
        use Place::*;
        let steps = [
            ("main", Entry),
            ("main", Body),
            ("f", Entry), // a call
            ("plt", Stub),
            ("plt", Stub),
            ("g", Entry), // through a stub
            ("g", Body),
            ("main", Body), // back
            ("f", Entry),
            ("f", Entry), // recursion
            ("f", Body),
            ("h", Body), // a jump into h's body
            ("main", Body),
        ];
        let paths = call_paths(steps.iter().map(|(n, e)| (n.to_string(), *e)));
        let show: Vec<(String, u64)> = paths.iter().map(|(p, n)| (p.join(";"), *n)).collect();
        let want =
            [("main", 4), ("main;f", 2), ("main;f;plt", 2), ("main;f;plt;g", 2), ("main;f;f", 2), ("main;f;h", 1)];
        assert_eq!(show, want.map(|(p, n)| (p.to_string(), n)));
    }

    #[test]
    fn json_names_every_part() {
        let c = SteppedCall {
            func: "steploop".into(),
            module: "steps".into(),
            tid: 7,
            instructions: 5,
            micros: 12,
            end: "returned".into(),
            in_tp: 0,
            path: "a.c:1".into(),
            lines: vec![("a.c:1".into(), 5)],
            hot: vec![(0x1000, "steploop+0x0".into(), "a.c:1".into(), 5)],
            by_path: vec![(vec!["steploop".into()], 5)],
            depth: Some(0),
            unstepped: vec![("leaf".into(), 3, 1500)],
            signals: 2,
            signal_ns: 4000,
        };
        assert_eq!(folded(std::slice::from_ref(&c)), ["steploop 5"]);
        let j = to_json(&c);
        for part in [
            "\"instructions\":5",
            "\"end\":\"returned\"",
            "\"address\":\"0x1000\"",
            &json::string("a.c:1"),
            "\"step_depth\":0",
            "\"unstepped\":[{\"func\":\"leaf\",\"calls\":3,\"ns\":1500}]",
            "\"signals\":2",
        ] {
            assert!(j.contains(part), "{part} in {j}");
        }
        let mut out = Vec::new();
        write_text(&mut out, &[c]).unwrap();
        let t = String::from_utf8(out).unwrap();
        assert!(t.contains("stepped call of steploop (steps) in thread 7: 5 instructions"), "{t}");
        assert!(t.contains("calls deeper than --step-depth 0): leaf ×3 (1.50µs)"), "{t}");
        assert!(t.contains("signals: 2 delivered"), "{t}");
    }
}
