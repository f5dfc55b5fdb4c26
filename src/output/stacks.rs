//! Call stacks at the end of a session (`--stack`): counted per distinct
//! stack in bpftrace's `@[ustack]` shape, as folded lines for
//! flamegraph.pl and speedscope (`--folded`), as a flame graph SVG drawn
//! with inferno (`-o FILE.svg`), and in the JSON summary.

use std::io::{self, Write};

use super::{json, thousands};
use crate::escape::text;
use crate::events::stacks::Frame;

/// The stacks of one probed function, each with its calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeStacks {
    /// The function.
    pub function: String,
    /// Its module.
    pub module: String,
    /// Each distinct stack (the function first, then its callers outwards)
    /// and its calls, the most frequent last.
    pub stacks: Vec<(Vec<Frame>, u64)>,
    /// Calls whose stack was cut at the depth or size asked for.
    pub truncated: u64,
    /// Calls on threads whose stack bounds were not known (only the caller was read).
    pub no_bounds: u64,
    /// Calls whose stack tp could not read, or kept no more of.
    pub unreadable: u64,
}

/// Writes each function's stacks as bpftrace prints `@[ustack] = count()`.
pub fn write_text(out: &mut impl Write, all: &[ProbeStacks]) -> io::Result<()> {
    for p in all.iter().filter(|p| !p.stacks.is_empty()) {
        writeln!(out, "\nstacks of {} ({}):", text(&p.function), text(&p.module))?;
        for (frames, n) in &p.stacks {
            writeln!(out, "@[")?;
            for line in frames.iter().flat_map(Frame::lines) {
                writeln!(out, "    {}", text(&line))?;
            }
            writeln!(out, "]: {}", thousands(*n))?;
        }
        let mut notes = Vec::new();
        if p.truncated > 0 {
            notes.push(format!("{} cut at the depth asked for", thousands(p.truncated)));
        }
        if p.no_bounds > 0 {
            notes.push(format!(
                "{} on a stack whose bounds the runtime could not tell (caller only)",
                thousands(p.no_bounds)
            ));
        }
        if p.unreadable > 0 {
            notes.push(format!("{} not read", thousands(p.unreadable)));
        }
        if !notes.is_empty() {
            writeln!(out, "({})", notes.join("; "))?;
        }
    }
    Ok(())
}

/// A name as a folded line shows it: no `;` (the separator), and escaped
/// for a terminal as everywhere else ([`text`]: no line breaks or escape
/// sequences; a JIT's perf map or a symbol table can hold any).
fn folded_name(name: &str) -> String {
    text(name).replace(';', "_")
}

/// Folded lines, `outermost;...;function count`, one per distinct stack.
pub fn folded(all: &[ProbeStacks]) -> Vec<String> {
    let mut lines = Vec::new();
    for p in all {
        for (frames, n) in &p.stacks {
            let names: Vec<String> =
                frames.iter().rev().flat_map(Frame::short_chain).map(|n| folded_name(&n)).collect();
            lines.push(format!("{} {n}", names.join(";")));
        }
    }
    lines
}

/// Writes the flame graph of `all` as an SVG to `out`.
pub fn flame_svg(out: &mut impl Write, all: &[ProbeStacks], title: &str) -> io::Result<()> {
    flame_svg_of(out, &folded(all), title, "calls")
}

/// Writes the flame graph of the folded `lines`, each weighted in
/// `count_name`, as an SVG to `out`.
pub fn flame_svg_of(out: &mut impl Write, lines: &[String], title: &str, count_name: &str) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.into();
    if lines.is_empty() {
        // inferno refuses an empty graph; an empty one says so.
        opts.title = format!("{title}: no stacks recorded");
        return inferno::flamegraph::from_lines(&mut opts, ["(none) 1"].iter().copied(), out).map_err(io::Error::other);
    }
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out).map_err(io::Error::other)
}

/// One function's stacks as JSON: `{"func":…,"module":…,"truncated":n,
/// "no_bounds":n,"unreadable":n,"stacks":[{"hits":n,"frames":[…]}]}`.
pub fn probe_json(p: &ProbeStacks) -> String {
    let stacks = p.stacks.iter().map(|(frames, n)| {
        let frames = frames.iter().flat_map(Frame::lines).map(|l| json::string(&l));
        json::Obj::new().num("hits", n).list("frames", frames).finish()
    });
    json::Obj::new()
        .str("func", &p.function)
        .str("module", &p.module)
        .num("truncated", p.truncated)
        .num("no_bounds", p.no_bounds)
        .num("unreadable", p.unreadable)
        .list("stacks", stacks)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(f: &str, off: u64) -> Frame {
        Frame {
            function: Some(f.into()),
            module: Some("prog".into()),
            offset: off,
            addr: 0x1000 + off,
            inlined: Vec::new(),
        }
    }

    fn sample() -> Vec<ProbeStacks> {
        vec![ProbeStacks {
            function: "leaf".into(),
            module: "prog".into(),
            stacks: vec![
                (vec![frame("leaf", 0), frame("b;c", 0x10), frame("main", 0x20)], 2),
                (vec![frame("leaf", 0), frame("a", 0x13), frame("main", 0x30)], 5),
            ],
            ..Default::default()
        }]
    }

    #[test]
    fn text_is_bpftraces_shape() {
        let mut out = Vec::new();
        write_text(&mut out, &sample()).unwrap();
        let s = String::from_utf8(out).unwrap();
        let want = "\nstacks of leaf (prog):\n@[\n    leaf+0x0 (prog)\n    b;c+0x10 (prog)\n    main+0x20 (prog)\n]: \
                    2\n@[\n    leaf+0x0 (prog)\n    a+0x13 (prog)\n    main+0x30 (prog)\n]: 5\n";
        assert_eq!(s, want);
    }

    #[test]
    fn folded_lines_start_at_the_root() {
        assert_eq!(folded(&sample()), ["main;b_c;leaf 2", "main;a;leaf 5"]);
    }

    #[test]
    fn folded_names_are_escaped_for_a_terminal() {
        assert_eq!(folded_name("JS:*f\x1b[2J;x\ny"), "JS:*f\\x1b[2J_x\\x0ay");
    }

    #[test]
    fn the_svg_is_a_flame_graph() {
        let mut out = Vec::new();
        flame_svg(&mut out, &sample(), "tp").unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("<?xml") && s.contains("<svg") && s.contains("main") && s.contains("leaf"), "{s}");
        let mut empty = Vec::new();
        flame_svg(&mut empty, &[], "tp").unwrap();
        assert!(String::from_utf8(empty).unwrap().contains("no stacks recorded"));
        assert!(probe_json(&sample()[0]).contains("\"hits\":5,\"frames\":[\"leaf+0x0 (prog)\",\"a+0x13 (prog)\""));
    }
}
