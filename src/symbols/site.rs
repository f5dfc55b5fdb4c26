//! Probe sites beyond a function's entry, as users name them:
//!
//! - `foo+0x1a` (or `libc:malloc+16`): an instruction of `foo`, by its
//!   offset from the entry;
//! - `line:counter.c:42`, `line:foo:42` (what `--line` writes): every
//!   place where that line starts ([`super::lines`]), in the file, or in
//!   the function;
//! - `usdt:provider:name`, `usdt:name`, `usdt:module:provider:name`
//!   (globs in each part): static probes ([`super::sdt_notes`]), with their
//!   arguments and semaphores.
//!
//! Each resolves to functions with a [`Site`] inside them: the planner
//! checks the window there as at an entry ([`super::verdict::verdict_at`]).

use super::lines::{self, Query};
use super::pattern::{Pattern, glob, has_glob};
use super::sdt_notes::{self, SdtNote};
use super::{Function, Module};
use crate::addr::{FileAddr, RuntimeAddr};
use crate::arch::ArgSpec;
use crate::arch::isa_for_machine;

/// A probe site inside a function, past its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// Where the probe goes.
    pub addr: RuntimeAddr,
    /// How it is shown and named: `foo+0x1a`, `counter.c:42`,
    /// `usdt:tpsdt:tick` (with ` at foo+0x1a` when the name has several sites).
    pub label: String,
    /// What a static probe's note says, if the site is one.
    pub usdt: Option<Usdt>,
    /// True for the start of a basic block that `--blocks` counts
    /// ([`super::block_map`]).
    pub block: bool,
}

/// A static probe's site, as its note describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usdt {
    /// Its provider.
    pub provider: String,
    /// Its name.
    pub name: String,
    /// Each argument as its note writes it (`SIZE@OPERAND`), and where it is,
    /// or why tp cannot read it.
    pub args: Vec<(String, Result<ArgSpec, String>)>,
    /// Its semaphore, if it has one (a runtime address).
    pub semaphore: Option<RuntimeAddr>,
}

/// A pattern that names sites beyond functions' entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SitePattern {
    /// `[module:]function+offset`.
    Offset {
        /// The module part.
        module: Option<String>,
        /// The function's name (not a glob).
        function: String,
        /// Bytes from its entry.
        offset: u64,
    },
    /// `line:[module:]file:N` or `line:[module:]function:N`.
    Line {
        /// The module part.
        module: Option<String>,
        /// A file name (it has a `.` or a `/`) or a function's name.
        place: String,
        /// The line.
        line: u32,
    },
    /// `blocks:[module:]function`: the start of each basic block of the
    /// functions it names that a probe can count ([`super::block_map`]).
    Blocks {
        /// The module part.
        module: Option<String>,
        /// The function's name (or a glob).
        function: String,
    },
    /// `usdt:[[module:]provider:]name`.
    Usdt {
        /// The module part (a glob).
        module: Option<String>,
        /// The provider (a glob); `*` when not given.
        provider: String,
        /// The probe's name (a glob).
        name: String,
    },
}

impl SitePattern {
    /// The pattern `text` if it names sites beyond entries (None for a
    /// plain function pattern), or why it is malformed.
    pub fn parse(text: &str) -> Option<Result<SitePattern, String>> {
        if let Some(rest) = text.strip_prefix("usdt:") {
            let parts: Vec<&str> = rest.split(':').collect();
            let owned = |s: &str| s.to_string();
            return Some(match parts[..] {
                [name] if !name.is_empty() => {
                    Ok(SitePattern::Usdt { module: None, provider: "*".into(), name: owned(name) })
                }
                [p, n] if !p.is_empty() && !n.is_empty() => {
                    Ok(SitePattern::Usdt { module: None, provider: owned(p), name: owned(n) })
                }
                [m, p, n] if !m.is_empty() && !p.is_empty() && !n.is_empty() => {
                    Ok(SitePattern::Usdt { module: Some(owned(m)), provider: owned(p), name: owned(n) })
                }
                _ => Err(format!(
                    "`{text}`: write a static probe as usdt:NAME, usdt:PROVIDER:NAME or usdt:MODULE:PROVIDER:NAME"
                )),
            });
        }
        if let Some(rest) = text.strip_prefix("blocks:") {
            let p = Pattern::parse(rest);
            if p.function.is_empty() || split_offset(&p.function).is_some() {
                return Some(Err(format!("`{rest}`: --blocks counts the blocks of functions: name one (e.g. foo)")));
            }
            return Some(Ok(SitePattern::Blocks { module: p.module, function: p.function }));
        }
        if let Some(rest) = text.strip_prefix("line:") {
            let bad = || format!("`{rest}`: write a line as FILE:LINE or FUNCTION:LINE (e.g. counter.c:42)");
            let Some((place, line)) = rest.rsplit_once(':') else { return Some(Err(bad())) };
            let Some(line) = line.parse::<u32>().ok().filter(|&l| l > 0) else { return Some(Err(bad())) };
            let p = Pattern::parse(place);
            if p.function.is_empty() || has_glob(&p.function) {
                return Some(Err(bad()));
            }
            return Some(Ok(SitePattern::Line { module: p.module, place: p.function, line }));
        }
        let p = Pattern::parse(text);
        let (function, offset) = split_offset(&p.function)?;
        if has_glob(function) {
            return Some(Err(format!("`{text}`: an offset needs one function's name, not a glob")));
        }
        Some(Ok(SitePattern::Offset { module: p.module, function: function.to_string(), offset }))
    }

    /// The module part.
    pub fn module(&self) -> Option<&str> {
        match self {
            SitePattern::Offset { module, .. }
            | SitePattern::Line { module, .. }
            | SitePattern::Blocks { module, .. }
            | SitePattern::Usdt { module, .. } => module.as_deref(),
        }
    }
}

/// `foo+0x1a` as (`foo`, 0x1a): a `+` followed by a number ends the name.
/// (C++'s `operator+` has no number after its `+`.)
pub fn split_offset(function: &str) -> Option<(&str, u64)> {
    let (name, off) = function.rsplit_once('+')?;
    let off = match off.strip_prefix("0x").or_else(|| off.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None if !off.is_empty() && off.bytes().all(|b| b.is_ascii_digit()) => off.parse().ok()?,
        None => return None,
    };
    (!name.is_empty()).then_some((name, off))
}

/// True if `place` of a line pattern names a file rather than a function.
pub fn is_file(place: &str) -> bool {
    place.contains(['.', '/'])
}

/// The function of `m` whose code holds runtime address `at`, if the
/// address is inside it.
fn function_at(m: &Module, at: RuntimeAddr) -> Option<Function> {
    m.function_containing(at).filter(|f| f.size > 0 && at.0 < f.addr.0 + f.size)
}

/// `foo+0x1a`.
pub fn offset_label(f: &Function, at: RuntimeAddr) -> String {
    format!("{}+{:#x}", f.name, at.0 - f.addr.0)
}

/// The site `offset` bytes into `f`, or why there is none.
pub fn at_offset(f: &Function, offset: u64) -> Result<Site, String> {
    if offset >= f.size {
        return Err(format!("`{}+{offset:#x}` is past the end of `{}` ({} bytes)", f.name, f.name, f.size));
    }
    let addr = RuntimeAddr(f.addr.0 + offset);
    Ok(Site { addr, label: offset_label(f, addr), usdt: None, block: false })
}

/// The static probes of `m` whose provider and name match the globs, each
/// in the function that holds it (`Err` with the note when none does).
pub fn usdt_in(m: &Module, provider: &str, name: &str) -> Vec<Result<(Function, Site), SdtNote>> {
    let isa = isa_for_machine(m.elf.machine);
    let notes: Vec<SdtNote> =
        sdt_notes::notes(&m.elf).into_iter().filter(|n| glob(provider, &n.provider) && glob(name, &n.name)).collect();
    let mut count: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    for n in &notes {
        *count.entry((&n.provider, &n.name)).or_default() += 1;
    }
    notes
        .iter()
        .map(|n| {
            let addr = m.bias.runtime(n.pc);
            let Some(f) = function_at(m, addr) else { return Err(n.clone()) };
            let mut label = format!("usdt:{}:{}", n.provider, n.name);
            if count[&(n.provider.as_str(), n.name.as_str())] > 1 {
                label += &format!(" at {}", offset_label(&f, addr));
            }
            let args = n
                .arg_texts()
                .into_iter()
                .map(|a| {
                    let spec = isa.map_or_else(|| Err("unknown architecture".to_string()), |isa| isa.sdt_argument(a));
                    (a.to_string(), spec)
                })
                .collect();
            let semaphore = n.semaphore.map(|s| m.bias.runtime(s));
            let usdt = Usdt { provider: n.provider.clone(), name: n.name.clone(), args, semaphore };
            Ok((f, Site { addr, label, usdt: Some(usdt), block: false }))
        })
        .collect()
}

/// Where `line` of the file `file` starts in `m`'s code, each in the
/// function that holds it; an error when `m` has no line table.
pub fn lines_in_file(m: &Module, file: &str, line: u32) -> anyhow::Result<Vec<(Function, Site)>> {
    let dwarf = m.dwarf_file().ok_or_else(|| no_line_table(m))?;
    let starts = lines::starts(dwarf, Query { file: Some(file), line: Some(line), range: None })?;
    let mut out = Vec::new();
    for s in &starts {
        let addr = m.bias.runtime(s.addr);
        if let Some(f) = function_at(m, addr) {
            out.push((f, addr));
        }
    }
    Ok(label_lines(&format!("{file}:{line}"), out))
}

/// Where `line` starts inside function `f` of `m`.
pub fn lines_in_function(m: &Module, f: &Function, line: u32) -> anyhow::Result<Vec<(Function, Site)>> {
    let dwarf = m.dwarf_file().ok_or_else(|| no_line_table(m))?;
    let FileAddr(lo) = f.bias.file(f.addr);
    let starts = lines::starts(dwarf, Query { file: None, line: Some(line), range: Some((lo, lo + f.size)) })?;
    let out = starts.iter().map(|s| (f.clone(), f.bias.runtime(s.addr))).collect();
    Ok(label_lines(&format!("{}:{line}", f.name), out))
}

/// The lines that start code in file `file` of `m`, or in function `f`
/// (one of them is given), sorted: what a line that starts none is near.
pub fn line_numbers(m: &Module, file: Option<&str>, f: Option<&Function>) -> anyhow::Result<Vec<u32>> {
    let Some(dwarf) = m.dwarf_file() else { return Ok(Vec::new()) };
    let range = f.map(|f| {
        let FileAddr(lo) = f.bias.file(f.addr);
        (lo, lo + f.size)
    });
    let mut lines: Vec<u32> =
        lines::starts(dwarf, Query { file, line: None, range })?.into_iter().map(|s| s.line).collect();
    lines.sort_unstable();
    lines.dedup();
    Ok(lines)
}

/// The lines of `lines` (sorted) closest to `line` below and above it.
pub fn nearest(lines: &[u32], line: u32) -> Vec<u32> {
    let at = lines.partition_point(|&l| l < line);
    let below = at.checked_sub(1).map(|i| lines[i]);
    let above = lines.get(at).copied();
    below.into_iter().chain(above).collect()
}

/// Sites named `what` (` at foo+0x1a` added when there are several).
fn label_lines(what: &str, places: Vec<(Function, RuntimeAddr)>) -> Vec<(Function, Site)> {
    let several = places.len() > 1;
    places
        .into_iter()
        .map(|(f, addr)| {
            let label = if several { format!("{what} at {}", offset_label(&f, addr)) } else { what.to_string() };
            (f, Site { addr, label, usdt: None, block: false })
        })
        .collect()
}

fn no_line_table(m: &Module) -> anyhow::Error {
    anyhow::anyhow!(
        "`{}` has no line table (no DWARF): build it with -g, or install its debug symbols (or serve them with \
         debuginfod: DEBUGINFOD_URLS)",
        m.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_lines_are_below_and_above() {
        assert_eq!(nearest(&[10, 12, 20], 15), [12, 20]);
        assert_eq!(nearest(&[10, 12, 20], 5), [10]);
        assert_eq!(nearest(&[10, 12, 20], 25), [20]);
        assert_eq!(nearest(&[], 25), Vec::<u32>::new());
    }

    #[test]
    fn offsets_end_function_names() {
        assert_eq!(split_offset("foo+0x1a"), Some(("foo", 0x1a)));
        assert_eq!(split_offset("foo+26"), Some(("foo", 26)));
        assert_eq!(split_offset("operator+"), None);
        assert_eq!(split_offset("ns::operator+=+0x4"), Some(("ns::operator+=", 4)));
        assert_eq!(split_offset("+4"), None);
        assert_eq!(split_offset("foo"), None);
    }

    #[test]
    fn site_patterns_parse() {
        let p = |t: &str| SitePattern::parse(t);
        assert_eq!(p("foo"), None);
        assert_eq!(p("libc:malloc"), None);
        assert_eq!(
            p("libc:malloc+0x10"),
            Some(Ok(SitePattern::Offset { module: Some("libc".into()), function: "malloc".into(), offset: 16 }))
        );
        assert!(p("mall*+4").unwrap().is_err());
        assert_eq!(
            p("line:counter.c:42"),
            Some(Ok(SitePattern::Line { module: None, place: "counter.c".into(), line: 42 }))
        );
        assert_eq!(
            p("line:app:bar:7"),
            Some(Ok(SitePattern::Line { module: Some("app".into()), place: "bar".into(), line: 7 }))
        );
        assert!(p("line:counter.c").unwrap().is_err() && p("line:x:0").unwrap().is_err());
        assert_eq!(
            p("usdt:libc:setjmp"),
            Some(Ok(SitePattern::Usdt { module: None, provider: "libc".into(), name: "setjmp".into() }))
        );
        assert_eq!(
            p("usdt:tick"),
            Some(Ok(SitePattern::Usdt { module: None, provider: "*".into(), name: "tick".into() }))
        );
        assert_eq!(
            p("usdt:sdt:tpsdt:*"),
            Some(Ok(SitePattern::Usdt { module: Some("sdt".into()), provider: "tpsdt".into(), name: "*".into() }))
        );
        assert!(p("usdt:").unwrap().is_err() && p("usdt:a:b:c:d").unwrap().is_err());
        assert_eq!(
            p("blocks:app:shape"),
            Some(Ok(SitePattern::Blocks { module: Some("app".into()), function: "shape".into() }))
        );
        assert!(p("blocks:shape+4").unwrap().is_err() && p("blocks:").unwrap().is_err());
        assert!(is_file("counter.c") && is_file("src/x") && !is_file("bar"));
    }
}
