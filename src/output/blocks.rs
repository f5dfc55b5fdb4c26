//! What `--blocks` reports of a function: each basic block with its
//! address, source lines and count (its probe's, or what the flow between
//! the blocks gives), then each source line's count; as text tables and as
//! the `blocks` objects of a process in JSON (docs/output.md).

use std::io::{self, Write};

use super::json::{self, Obj};
use super::thousands;
use crate::escape::text;

/// The blocks and lines of one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionBlocks {
    /// The function.
    pub func: String,
    /// Its module's file name.
    pub module: String,
    /// Its address in the target.
    pub address: u64,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockCount>,
    /// Its lines, by file and line.
    pub lines: Vec<LineCount>,
}

/// One basic block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockCount {
    /// Bytes from the function's entry.
    pub offset: u64,
    /// Its address in the target.
    pub address: u64,
    /// Its bytes.
    pub size: u64,
    /// Its instructions.
    pub insns: u32,
    /// Its source lines in order (`blocks.c:20`).
    pub lines: Vec<String>,
    /// How often it ran: None if neither a probe nor the flow tells.
    pub count: Option<u64>,
    /// True if a probe of its own counted it (false: the flow gave it).
    pub probed: bool,
    /// Why it has no probe of its own.
    pub why: Option<String>,
}

/// One source line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineCount {
    /// The file, as the line table names it.
    pub file: String,
    /// The line.
    pub line: u32,
    /// How often execution entered it from another line; None if a count
    /// it needs is not known.
    pub count: Option<u64>,
}

/// `blocks.c:20-22` for lines 20, 21, 22 of one file in a row; else a list.
fn lines_text(lines: &[String]) -> String {
    if lines.is_empty() {
        return "-".into();
    }
    lines.join(", ")
}

/// Writes the blocks and lines of each function.
pub fn write_text(out: &mut impl Write, all: &[FunctionBlocks]) -> io::Result<()> {
    for f in all {
        writeln!(out, "\nblocks of {} ({}):", text(&f.func), text(&f.module))?;
        let labels: Vec<String> = f.blocks.iter().map(|b| format!("{}+{:#x}", f.func, b.offset)).collect();
        let lw = labels.iter().map(|l| l.chars().count()).max().unwrap_or(5).max(5);
        let lines: Vec<String> = f.blocks.iter().map(|b| lines_text(&b.lines)).collect();
        let nw = lines.iter().map(|l| l.chars().count()).max().unwrap_or(5).clamp(5, 40);
        writeln!(out, "{:<lw$}  {:<18}  {:>5}  {:<nw$}  {:>14}", "BLOCK", "ADDRESS", "INSNS", "LINES", "COUNT")?;
        for ((b, label), lines) in f.blocks.iter().zip(&labels).zip(&lines) {
            let count = b.count.map_or("?".to_string(), thousands);
            let how = match (&b.why, b.count) {
                (Some(why), None) => format!("  not counted: {}", text(why)),
                (Some(why), Some(_)) => format!("  from the blocks around it ({})", text(why)),
                (None, _) => String::new(),
            };
            writeln!(
                out,
                "{:<lw$}  {:<18}  {:>5}  {:<nw$}  {count:>14}{how}",
                text(label),
                format!("{:#x}", b.address),
                b.insns,
                text(lines)
            )?;
        }
        writeln!(out, "\nlines of {}:", text(&f.func))?;
        let names: Vec<String> =
            f.lines.iter().map(|l| format!("{}:{}", l.file.rsplit('/').next().unwrap_or(&l.file), l.line)).collect();
        let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(4).max(4);
        writeln!(out, "{:<w$}  {:>14}", "LINE", "COUNT")?;
        for (l, name) in f.lines.iter().zip(&names) {
            writeln!(out, "{:<w$}  {:>14}", text(name), l.count.map_or("?".to_string(), thousands))?;
        }
    }
    Ok(())
}

/// One function's `blocks` object.
pub fn to_json(f: &FunctionBlocks) -> String {
    let blocks = f.blocks.iter().map(|b| {
        Obj::new()
            .num("offset", b.offset)
            .str("address", &json::address(b.address))
            .num("size", b.size)
            .num("insns", b.insns)
            .list("lines", b.lines.iter().map(|l| json::string(l)))
            .opt("count", b.count)
            .num("probed", b.probed)
            .opt_str("why", b.why.as_deref())
            .finish()
    });
    let lines =
        f.lines.iter().map(|l| Obj::new().str("file", &l.file).num("line", l.line).opt("count", l.count).finish());
    Obj::new()
        .str("func", &f.func)
        .str("module", &f.module)
        .str("address", &json::address(f.address))
        .list("blocks", blocks)
        .list("lines", lines)
        .finish()
}
