//! What `tp list-probes` prints: the verdict on every function of a binary
//! or process (a table, JSON lines, or a summary per module), on the sites
//! of `--lines` and `--usdt`, and on the basic blocks of `--blocks`. The
//! rows are plain values that `session::probeable` fills in; this file
//! only lays them out (docs/output.md).

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::format::Format;
use super::json::{self, Obj};
use super::table::{MODULE_MAX, NAME_MAX, fit, width};
use crate::escape::text;

/// What list-probes says of a site whose window is all `nop`s.
pub const NOP_NOTE: &str = "a nop site: nothing to relocate";

/// The window tp would patch at a probeable place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Its length in bytes.
    pub len: usize,
    /// Its address.
    pub site: u64,
    /// Its offset from the start of its function.
    pub offset: u64,
    /// The mnemonics of the instructions it displaces: `mov, push`.
    pub insns: String,
    /// True when they are all `nop`s.
    pub nop: bool,
}

/// Why a place cannot be probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The kind of reason, as the summaries count them (`too short`).
    pub kind: &'static str,
    /// The reason in full.
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// tp's verdict on one place: the window it would patch, or why not.
pub type Verdict = Result<Window, Refused>;

/// `ok (N bytes: mov, push)`, `ok (N bytes at +6: sub, mov; after Go's
/// stack check)` or `refused: <reason>`.
pub fn verdict_text(v: &Verdict, note: Option<&str>) -> String {
    match v {
        Ok(w) if let Some(note) = note => format!("ok ({} bytes at +{}: {}; {note})", w.len, w.offset, w.insns),
        Ok(w) => format!("ok ({} bytes: {})", w.len, w.insns),
        Err(r) => format!("refused: {r}"),
    }
}

/// One function and the verdict on it.
#[derive(Debug, Clone)]
pub struct FunctionRow {
    /// Its module's name.
    pub module: String,
    /// Its name as `-f` takes it, with its symbol version (`@@GLIBC_2.3.2`).
    pub name: String,
    /// Where the name came from (`symtab`, `dynsym`...), `+copy` for a copy
    /// of the code mapped elsewhere; empty for a function inlined everywhere.
    pub source: String,
    /// Link-time address for a file, runtime address for a process; None if inlined everywhere.
    pub addr: Option<u64>,
    /// Its size in bytes.
    pub size: u64,
    /// The verdict at its entry.
    pub verdict: Verdict,
    /// Its signature, from DWARF (`--verbose`).
    pub signature: Option<String>,
    /// Where the probe goes when that is not the function's entry.
    pub note: Option<&'static str>,
    /// For a probeable function, its exits ([`Exits`]), or why they are not
    /// all known; None where the architecture has no exit windows.
    pub exits: Option<Result<Exits, String>>,
}

/// The exits of a function and how many have a window: a return probe sees
/// a call end at them when all do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exits {
    /// Its exits.
    pub total: usize,
    /// Those with a window.
    pub patchable: usize,
    /// The first exit without a window, and why.
    pub first_refused: Option<String>,
}

/// `3/3`, `2/3`, `?` (not all known), `-`.
fn exits_text(e: &Option<Result<Exits, String>>) -> String {
    match e {
        None => "-".into(),
        Some(Err(_)) => "?".into(),
        Some(Ok(e)) => format!("{}/{}", e.patchable, e.total),
    }
}

fn address_text(addr: Option<u64>) -> String {
    addr.map_or("-".to_string(), |a| format!("{a:#x}"))
}

/// The functions in `format`: JSON lines, else a table with the module
/// column when `with_module`.
pub fn functions(out: &mut impl Write, rows: &[FunctionRow], format: Format, with_module: bool) -> io::Result<()> {
    match format {
        Format::Json => functions_json(out, rows),
        _ => functions_table(out, rows, with_module),
    }
}

/// The functions as a table; `with_module` adds the module column (a process's listing).
fn functions_table(out: &mut impl Write, rows: &[FunctionRow], with_module: bool) -> io::Result<()> {
    let w = width(rows.iter().map(|r| r.name.as_str()), 8, NAME_MAX);
    let mw = width(rows.iter().map(|r| r.module.as_str()), 6, MODULE_MAX);
    let sw = rows.iter().map(|r| r.source.len()).max().unwrap_or(0).max(6);
    if with_module {
        write!(out, "{:<mw$}  ", "MODULE")?;
    }
    writeln!(out, "{:<18}  {:>7}  {:<w$}  {:<sw$}  {:>5}  VERDICT", "ADDRESS", "SIZE", "FUNCTION", "SOURCE", "EXITS")?;
    for r in rows {
        if with_module {
            write!(out, "{:<mw$}  ", fit(&r.module, mw))?;
        }
        let (name, source) = (fit(&r.name, w), if r.source.is_empty() { "-" } else { &r.source });
        let verdict = verdict_text(&r.verdict, r.note);
        let exits = exits_text(&r.exits);
        writeln!(out, "{:<18}  {:>7}  {name:<w$}  {source:<sw$}  {exits:>5}  {verdict}", address_text(r.addr), r.size)?;
        if let Some(sig) = &r.signature {
            writeln!(out, "{:20}{}", "", text(sig))?;
        }
    }
    Ok(())
}

/// The functions as JSON lines (`"type":"function"`).
fn functions_json(out: &mut impl Write, rows: &[FunctionRow]) -> io::Result<()> {
    for r in rows {
        let reason = r.verdict.as_ref().err().map(|why| why.to_string());
        let site = match &r.verdict {
            Ok(w) if r.note.is_some() => Some(json::address(w.site)),
            _ => None,
        };
        // Where a return probe goes: every key, whatever is known.
        let exits = r.exits.as_ref().map(|x| {
            let o = Obj::new();
            match x {
                Err(why) => o
                    .num("known", false)
                    .num("total", "null")
                    .num("patchable", "null")
                    .num("refused", "null")
                    .str("why", why),
                Ok(e) => o
                    .num("known", true)
                    .num("total", e.total)
                    .num("patchable", e.patchable)
                    .opt_str("refused", e.first_refused.as_deref())
                    .num("why", "null"),
            }
            .finish()
        });
        let o = Obj::new()
            .str("type", "function")
            .str("module", &r.module)
            .str("func", &r.name)
            .opt_str("address", r.addr.map(json::address).as_deref())
            .num("size", r.size)
            .opt_str("source", Some(r.source.as_str()).filter(|s| !s.is_empty()))
            .num("probeable", r.verdict.is_ok())
            .opt_str("reason", reason.as_deref())
            .opt_str("site", site.as_deref())
            .opt_str("note", r.note)
            .raw("exits", exits.as_deref().unwrap_or("null"))
            .opt_str("signature", r.signature.as_deref());
        writeln!(out, "{}", o.finish())?;
    }
    Ok(())
}

/// A summary of every module listed (one without functions too), each
/// given by its name and rows, then of all of them together.
pub fn summaries(out: &mut impl Write, modules: &[(String, Vec<FunctionRow>)], format: Format) -> io::Result<()> {
    let each = |out: &mut dyn Write, title: &str, rows: &[&FunctionRow]| match format {
        Format::Json => summary_json(out, title, rows),
        _ => summarize(out, title, rows),
    };
    for (name, rows) in modules {
        each(out, name, &rows.iter().collect::<Vec<_>>())?;
    }
    if modules.len() > 1 {
        let all: Vec<&FunctionRow> = modules.iter().flat_map(|(_, rows)| rows).collect();
        each(out, "all modules", &all)?;
    }
    Ok(())
}

/// What a module's summary counts of its functions, for the text and the JSON.
struct Counts<'a> {
    /// The functions with code of their own.
    with_code: Vec<&'a FunctionRow>,
    /// Those of at least 5 bytes.
    big: usize,
    /// Those of them that are probeable.
    ok: usize,
    /// The functions under 5 bytes.
    short: usize,
    /// Those of them that are probeable (their window takes the padding after them).
    short_ok: usize,
    /// The functions whose site is a nop.
    nops: usize,
    /// The functions inlined everywhere (no code of their own).
    inlined: usize,
    /// The refused functions by reason.
    reasons: BTreeMap<&'a str, usize>,
}

impl<'a> Counts<'a> {
    fn of(rows: &[&'a FunctionRow]) -> Counts<'a> {
        let with_code: Vec<&FunctionRow> = rows.iter().copied().filter(|r| r.addr.is_some()).collect();
        let (big, short): (Vec<&FunctionRow>, Vec<&FunctionRow>) = with_code.iter().partition(|r| r.size >= 5);
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &with_code {
            if let Err(why) = &r.verdict {
                *reasons.entry(why.kind).or_default() += 1;
            }
        }
        Counts {
            big: big.len(),
            ok: big.iter().filter(|r| r.verdict.is_ok()).count(),
            short: short.len(),
            short_ok: short.iter().filter(|r| r.verdict.is_ok()).count(),
            nops: with_code.iter().filter(|r| r.note == Some(NOP_NOTE)).count(),
            inlined: rows.len() - with_code.len(),
            with_code,
            reasons,
        }
    }
}

/// A module's summary as one JSON line (`"type":"module_summary"`).
fn summary_json(out: &mut dyn Write, title: &str, rows: &[&FunctionRow]) -> io::Result<()> {
    let c = Counts::of(rows);
    let refused = c.reasons.iter().map(|(why, n)| Obj::new().str("reason", why).num("functions", n).finish());
    let o = Obj::new()
        .str("type", "module_summary")
        .str("module", title)
        .num("functions", c.with_code.len())
        .num("at_least_5_bytes", c.big)
        .num("probeable", c.ok)
        .num("shorter_than_a_jump", c.short)
        .num("shorter_probeable", c.short_ok)
        .num("nop_sites", c.nops)
        .num("inlined", c.inlined)
        .list("refused", refused);
    writeln!(out, "{}", o.finish())?;
    Ok(())
}

fn summarize(out: &mut dyn Write, title: &str, rows: &[&FunctionRow]) -> io::Result<()> {
    let c = Counts::of(rows);
    let mut sources: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &c.with_code {
        *sources.entry(r.source.as_str()).or_default() += 1;
    }
    let pct = if c.big == 0 { 0.0 } else { 100.0 * c.ok as f64 / c.big as f64 };
    writeln!(out, "{}: {} functions, {} of at least 5 bytes", text(title), c.with_code.len(), c.big)?;
    let sources: Vec<String> = sources.iter().map(|(s, n)| format!("{n} {s}")).collect();
    if !sources.is_empty() {
        writeln!(out, "names:     {}", sources.join(", "))?;
    }
    writeln!(out, "probeable: {} of {} ({pct:.1}%)", c.ok, c.big)?;
    if c.short > 0 {
        writeln!(
            out,
            "shorter:   {} of {} functions under 5 bytes probeable (the window takes the padding after them)",
            c.short_ok, c.short
        )?;
    }
    if c.nops > 0 {
        writeln!(out, "nop sites: {} (nops where the patch goes: nothing to relocate)", c.nops)?;
    }
    let with_exits: Vec<&&FunctionRow> =
        c.with_code.iter().filter(|r| r.size >= 5 && r.verdict.is_ok() && r.exits.is_some()).collect();
    if !with_exits.is_empty() {
        let all = with_exits.iter().filter(|r| matches!(&r.exits, Some(Ok(e)) if e.patchable == e.total)).count();
        let of = with_exits.len();
        let pct = 100.0 * all as f64 / of as f64;
        writeln!(out, "returns:   {all} of {of} probeable functions have every exit patchable ({pct:.1}%)")?;
    }
    writeln!(out, "refused:   {}", c.with_code.iter().filter(|r| r.verdict.is_err()).count())?;
    let mut top: Vec<(&str, usize)> = c.reasons.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (why, n) in top.iter().take(8) {
        writeln!(out, "  {n:>7}  {why}")?;
    }
    if c.inlined > 0 {
        writeln!(out, "inlined everywhere (no code of their own): {}", c.inlined)?;
    }
    Ok(())
}

/// A row of a `--lines` or `--usdt` listing.
#[derive(Debug, Clone)]
pub struct SiteRow {
    /// The module's name.
    pub module: String,
    /// `counter.c:42` or `usdt:provider:name`.
    pub what: String,
    /// The function and offset: `bar+0x1a`.
    pub place: String,
    /// The site's address.
    pub addr: u64,
    /// The verdict there.
    pub verdict: Verdict,
    /// A static probe's semaphore.
    pub semaphore: Option<u64>,
    /// A static probe's arguments.
    pub args: Vec<String>,
}

/// The sites in `format`: JSON lines, else a table; `usdt` for static probes.
pub fn sites(out: &mut impl Write, rows: &[SiteRow], usdt: bool, format: Format) -> io::Result<()> {
    match format {
        Format::Json => sites_json(out, rows, usdt),
        _ => sites_table(out, rows, usdt),
    }
}

/// The sites as a table; `usdt` for static probes (their semaphore and arguments under each).
fn sites_table(out: &mut impl Write, rows: &[SiteRow], usdt: bool) -> io::Result<()> {
    let ww = width(rows.iter().map(|r| r.what.as_str()), 8, NAME_MAX);
    let pw = width(rows.iter().map(|r| r.place.as_str()), 5, NAME_MAX);
    let first = if usdt { "PROBE" } else { "LINE" };
    writeln!(out, "{:<18}  {first:<ww$}  {:<pw$}  VERDICT", "ADDRESS", "WHERE")?;
    for r in rows {
        let verdict = match &r.verdict {
            Ok(w) if w.nop => verdict_text(&r.verdict, Some(NOP_NOTE)),
            v => verdict_text(v, None),
        };
        let (what, place) = (fit(&text(&r.what), ww), fit(&text(&r.place), pw));
        writeln!(out, "{:<18}  {what:<ww$}  {place:<pw$}  {verdict}", format!("{:#x}", r.addr))?;
        if usdt {
            let sem = r.semaphore.map_or("none".to_string(), |s| format!("{s:#x}"));
            let args = if r.args.is_empty() { "none".to_string() } else { r.args.join(", ") };
            writeln!(out, "{:20}module {}, semaphore {sem}, arguments: {}", "", text(&r.module), text(&args))?;
        }
    }
    Ok(())
}

/// The sites as JSON lines (`"type":"line"` or `"usdt"`).
fn sites_json(out: &mut impl Write, rows: &[SiteRow], usdt: bool) -> io::Result<()> {
    for r in rows {
        let reason = r.verdict.as_ref().err().map(|why| why.to_string());
        let nop = r.verdict.as_ref().is_ok_and(|w| w.nop);
        let o = Obj::new()
            .str("type", if usdt { "usdt" } else { "line" })
            .str("module", &r.module)
            .str("site", &r.what)
            .str("where", &r.place)
            .str("address", &json::address(r.addr))
            .num("probeable", r.verdict.is_ok())
            .opt_str("reason", reason.as_deref())
            .num("nop", nop)
            .opt_str("semaphore", r.semaphore.map(json::address).as_deref())
            .list("args", r.args.iter().map(|a| json::string(a)));
        writeln!(out, "{}", o.finish())?;
    }
    Ok(())
}

/// The basic blocks of one function (`--blocks`), or why they cannot be known.
#[derive(Debug, Clone)]
pub enum FunctionBlockRows {
    /// The function as a whole: its blocks cannot be known.
    Refused {
        /// Its module's name.
        module: String,
        /// The function.
        func: String,
        /// Its address.
        addr: u64,
        /// Its size.
        size: u64,
        /// Why.
        why: String,
    },
    /// Its blocks.
    Blocks {
        /// Its module's name.
        module: String,
        /// The function.
        func: String,
        /// One row per block, in address order.
        blocks: Vec<BlockRow>,
    },
}

/// One basic block and whether `--blocks` counts it.
#[derive(Debug, Clone)]
pub struct BlockRow {
    /// `bar` for the entry block, `bar+0x1a` for another.
    pub label: String,
    /// Its first byte.
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// Its instructions.
    pub insns: u32,
    /// Its source lines, `file.c:12, file.c:13`.
    pub lines: String,
    /// Whether it is counted, or why not.
    pub counted: Result<(), String>,
    /// The window of its probe, if it has one.
    pub window: Option<BlockWindow>,
}

/// The window of a block's probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockWindow {
    /// Its end, from the block's start.
    pub reach: u64,
    /// Its length in bytes.
    pub len: usize,
    /// The mnemonics of the instructions it displaces.
    pub insns: String,
}

/// The blocks of each function, as a table per function or as JSON lines (`"type":"block"`).
pub fn blocks(out: &mut impl Write, functions: &[FunctionBlockRows], format: Format) -> io::Result<()> {
    let as_json = format == Format::Json;
    for f in functions {
        let (module, func, blocks) = match f {
            FunctionBlockRows::Blocks { module, func, blocks } => (module, func, blocks),
            FunctionBlockRows::Refused { module, func, addr, size, why } if as_json => {
                let o = Obj::new()
                    .str("type", "block")
                    .str("module", module)
                    .str("func", func)
                    .str("block", func)
                    .str("address", &json::address(*addr))
                    .num("size", size)
                    .num("insns", 0)
                    .list("lines", std::iter::empty())
                    .num("probeable", false)
                    .num("window", "null")
                    .str("reason", why);
                writeln!(out, "{}", o.finish())?;
                continue;
            }
            FunctionBlockRows::Refused { func, addr, why, .. } => {
                writeln!(out, "{:<18}  {}  refused: {}", format!("{addr:#x}"), text(func), text(why))?;
                continue;
            }
        };
        if as_json {
            for b in blocks {
                let o = Obj::new()
                    .str("type", "block")
                    .str("module", module)
                    .str("func", func)
                    .str("block", &b.label)
                    .str("address", &json::address(b.start))
                    .num("size", b.end - b.start)
                    .num("insns", b.insns)
                    .list("lines", b.lines.split(", ").filter(|s| !s.is_empty()).map(json::string))
                    .num("probeable", b.counted.is_ok())
                    .opt("window", b.window.as_ref().map(|w| w.reach))
                    .opt_str("reason", b.counted.as_ref().err().map(String::as_str));
                writeln!(out, "{}", o.finish())?;
            }
            continue;
        }
        let bw = width(blocks.iter().map(|b| b.label.as_str()), 5, NAME_MAX);
        let lw = width(blocks.iter().map(|b| b.lines.as_str()), 5, NAME_MAX);
        writeln!(out, "{:<18}  {:<bw$}  {:>5}  {:<lw$}  VERDICT", "ADDRESS", "BLOCK", "INSNS", "LINES")?;
        for b in blocks {
            let verdict = match (&b.counted, &b.window) {
                (Ok(_), Some(w)) => format!("counted ({} bytes: {})", w.len, w.insns),
                (Ok(_), None) => "counted".to_string(),
                (Err(why), _) => format!("not counted: {why}"),
            };
            let (label, l) = (fit(&text(&b.label), bw), fit(&text(&b.lines), lw));
            writeln!(
                out,
                "{:<18}  {label:<bw$}  {:>5}  {l:<lw$}  {}",
                format!("{:#x}", b.start),
                b.insns,
                text(&verdict)
            )?;
        }
    }
    Ok(())
}
