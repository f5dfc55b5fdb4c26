//! `tp list-probes`: every function of a binary, or of every module of a
//! running process, with tp's verdict on it, decided from the files alone
//! (and, in a process, its threads' hardware shadow stacks), exactly as
//! `attach` would decide; with its symbol version, where its name
//! came from (symtab, debug file, dynsym, eh_frame) and, in a process, every
//! copy of its code mapped elsewhere. A site that is a 5-byte `nop` (a
//! patchable entry, `-mnop-mcount`, a tracepoint macro) is marked: nothing
//! is relocated there. `--lines FUNCTION` lists where each source line of a
//! function starts and the verdict there; `--usdt` lists the static probes.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::arch::{Isa, Refusal, ShadowStack, SitePlan, machine_name};
use crate::cli::ListProbesArgs;
use crate::escape::text;
use crate::output::json::{self, Obj};
use crate::output::table::{MODULE_MAX, NAME_MAX, fit, width};
use crate::process;
use crate::progress::Progress;
use crate::session::resolve;
use crate::symbols::lines::{self, Query};
use crate::symbols::site;
use crate::symbols::verdict::{exits_widening, go_code, verdict, verdict_at};
use crate::symbols::{Function, Module, ProcessModules};

/// The rows of some modules, with each module's index and name.
type ModuleRows = Vec<(usize, String, Vec<Row>)>;

/// One function and its verdict.
struct Row {
    module: String,
    /// Its name as `-f` takes it, with its symbol version (`@@GLIBC_2.3.2`).
    name: String,
    /// Where the name came from (`symtab`, `dynsym`...), `+copy` for a copy
    /// of the code mapped elsewhere; empty for a function inlined everywhere.
    source: String,
    /// Link-time address for a file, runtime address for a process; None if inlined everywhere.
    addr: Option<u64>,
    size: u64,
    verdict: Result<SitePlan, Refusal>,
    signature: Option<String>,
    /// Where the probe goes when that is not the function's entry.
    note: Option<&'static str>,
    /// For a probeable function, its exits ([`Exits`]); None where the
    /// architecture has no exit windows.
    exits: Option<Result<Exits, Refusal>>,
}

/// The exits of a function and how many have a window: a return probe sees
/// a call end at them when all do (see `session::returns`).
struct Exits {
    total: usize,
    patchable: usize,
    /// The first exit without a window, and why.
    first_refused: Option<String>,
}

impl Exits {
    /// The exits of `f` of `m`, whose entry's window is `plan` (widened
    /// as a return probe's would be).
    fn of(m: &Module, f: &Function, plan: &mut SitePlan, isa: Isa) -> Option<Result<Exits, Refusal>> {
        let exits = match exits_widening(m, f, plan, isa) {
            Err(Refusal::Unsupported(_)) => return None,
            Err(why) => return Some(Err(why)),
            Ok(exits) => exits,
        };
        let in_entry = plan.exits.len();
        let first_refused = exits.iter().find_map(|e| {
            let why = e.plan.as_ref().err()?;
            Some(format!("+{:#x}: {why}", e.at.wrapping_sub(f.addr.0)))
        });
        let patchable = in_entry + exits.iter().filter(|e| e.plan.is_ok()).count();
        Some(Ok(Exits { total: in_entry + exits.len(), patchable, first_refused }))
    }

    /// `3/3`, `2/3`, `?` (not all known), `-`.
    fn text(e: &Option<Result<Exits, Refusal>>) -> String {
        match e {
            None => "-".into(),
            Some(Err(_)) => "?".into(),
            Some(Ok(e)) => format!("{}/{}", e.patchable, e.total),
        }
    }
}

/// What a row of a `--lines` or `--usdt` listing says.
struct SiteRow {
    module: String,
    /// `counter.c:42` or `usdt:provider:name`.
    what: String,
    /// The function and offset: `bar+0x1a`.
    place: String,
    addr: u64,
    verdict: Result<SitePlan, Refusal>,
    /// A static probe's semaphore and arguments.
    semaphore: Option<u64>,
    args: Vec<String>,
}

/// Runs `tp list-probes`.
pub fn run(args: ListProbesArgs) -> Result<ExitCode> {
    if !args.blocks.is_empty() {
        return run_blocks(&args);
    }
    if !args.lines.is_empty() || args.usdt {
        return run_sites(&args);
    }
    let modules: ModuleRows = match (&args.binary, args.pid) {
        (Some(path), None) => {
            let module = Module::from_file(path)?;
            let Some(isa) = Isa::for_machine(module.elf.machine) else {
                bail!("`{}` is {}; tp knows x86-64 and aarch64", path.display(), machine_name(module.elf.machine));
            };
            vec![(0, module.name.clone(), rows_of(&module, isa, args.verbose, None))]
        }
        (None, Some(pid)) => process_rows(pid, args.verbose)?,
        _ => bail!("give either a binary or --pid, not both"),
    };
    let mut out = crate::streams::stdout();
    if args.summary {
        print_summary(&mut out, &modules, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Row> = modules.into_iter().flat_map(|(_, _, rows)| rows).collect();
    if args.json {
        print_json(&mut out, &rows)?;
    } else {
        print_table(&mut out, &rows, args.pid.is_some())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The rows of every module of process `pid`, parsed on two threads; where
/// a thread runs with a hardware shadow stack, the functions whose detour
/// it would reject are refused, as attach refuses them.
fn process_rows(pid: i32, verbose: bool) -> Result<ModuleRows> {
    process::status(pid)?;
    process::check_readable(pid)?;
    let maps = process::read_maps(pid)?;
    let shadow = crate::probe::shadow::first(&process::shadow_stacks(pid, &[]));
    let count = ProcessModules::new(pid, &maps)?.len();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(count).max(1);
    let progress = Progress::new(if count > 20 { count as u64 * 100 } else { 0 }, "reading modules");
    let results: Vec<Result<ModuleRows>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let maps = &maps;
                let progress = &progress;
                s.spawn(move || -> Result<ModuleRows> {
                    // Each thread parses its own modules: parsed modules are not shared.
                    let modules = ProcessModules::new(pid, maps)?;
                    let mut out = Vec::new();
                    for i in (w..modules.len()).step_by(workers) {
                        match modules.get(i) {
                            Ok(m) => out.push((i, m.name.clone(), rows_of(m, Isa::host(), verbose, shadow))),
                            Err(e) => {
                                crate::say!("tp: skipping `{}`: {}", text(&modules.name(i)), text(&format!("{e:#}")))
                            }
                        }
                        for _ in 0..100 {
                            progress.inc();
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("list-probes worker")).collect()
    });
    progress.finish();
    let mut by_module: ModuleRows = Vec::new();
    for r in results {
        by_module.extend(r?);
    }
    by_module.sort_by_key(|(i, _, _)| *i);
    Ok(by_module)
}

/// The verdict on every function of `m`, plus its functions inlined
/// everywhere; `shadow` as for [`resolve::balanced`].
fn rows_of(m: &Module, isa: Isa, verbose: bool, shadow: Option<(i32, ShadowStack)>) -> Vec<Row> {
    let dwarf = m.dwarf();
    let mut rows: Vec<Row> = m
        .functions()
        .into_iter()
        .filter(|f| f.size > 0)
        .map(|f| {
            let verdict = verdict(m, &f, isa).and_then(|p| resolve::balanced(p, shadow));
            let signature =
                verbose.then(|| dwarf.and_then(|d| d.at(f.bias.file(f.addr))).map(|d| d.signature())).flatten();
            let after_check = verdict.is_ok() && go_code(m, &f, isa).is_some_and(|g| g.stack_check > 0);
            let nop = verdict.as_ref().is_ok_and(|p| p.is_nop_site());
            let note = if nop { Some(NOP_NOTE) } else { after_check.then_some("after Go's stack check") };
            // Counted as a return probe would take them, which may widen
            // the entry's window to take in an exit (the verdict stays a
            // counting probe's).
            let exits = verdict.as_ref().ok().and_then(|p| Exits::of(m, &f, &mut p.clone(), isa));
            let mut source = f.source.label().to_string();
            if f.bias != m.bias {
                source += "+copy";
            }
            // A compat version is part of the name already (`realpath@GLIBC_2.2.5`).
            let name = match &f.version {
                Some(v) if v.default => format!("{}{v}", f.name),
                _ => f.name,
            };
            let addr = Some(f.addr.0);
            Row { module: m.name.clone(), name, source, addr, size: f.size, verdict, signature, note, exits }
        })
        .collect();
    if let Some(d) = dwarf {
        rows.extend(d.inlined_only.iter().map(|name| Row {
            module: m.name.clone(),
            name: name.clone(),
            source: String::new(),
            addr: None,
            size: 0,
            verdict: Err(Refusal::InlinedEverywhere),
            signature: None,
            note: None,
            exits: None,
        }));
    }
    rows
}

/// What list-probes says of a site whose window is all `nop`s.
pub const NOP_NOTE: &str = "a nop site: nothing to relocate";

/// `ok (N bytes: mov, push)`, `ok (N bytes at +6: sub, mov; after Go's
/// stack check)` or `refused: <reason>`.
pub fn verdict_text(v: &Result<SitePlan, Refusal>, note: Option<&str>) -> String {
    match v {
        Ok(p) if let Some(note) = note => {
            format!("ok ({} bytes at +{}: {}; {note})", p.len(), p.site - p.function, p.summary())
        }
        Ok(p) => format!("ok ({} bytes: {})", p.len(), p.summary()),
        Err(r) => format!("refused: {r}"),
    }
}

fn address_text(addr: Option<u64>) -> String {
    addr.map_or("-".to_string(), |a| format!("{a:#x}"))
}

fn print_table(out: &mut impl Write, rows: &[Row], with_module: bool) -> Result<()> {
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
        let exits = Exits::text(&r.exits);
        writeln!(out, "{:<18}  {:>7}  {name:<w$}  {source:<sw$}  {exits:>5}  {verdict}", address_text(r.addr), r.size)?;
        if let Some(sig) = &r.signature {
            writeln!(out, "{:20}{}", "", text(sig))?;
        }
    }
    Ok(())
}

fn print_json(out: &mut impl Write, rows: &[Row]) -> Result<()> {
    for r in rows {
        let reason = r.verdict.as_ref().err().map(|why| why.to_string());
        let site = match &r.verdict {
            Ok(p) if r.note.is_some() => Some(json::address(p.site)),
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
                    .str("why", &why.to_string()),
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

/// A summary of every module listed (one without functions too), then of
/// all of them together.
fn print_summary(out: &mut impl Write, modules: &ModuleRows, as_json: bool) -> Result<()> {
    let each = |out: &mut dyn Write, title: &str, rows: &[&Row]| match as_json {
        true => summary_json(out, title, rows),
        false => summarize(out, title, rows),
    };
    for (_, name, rows) in modules {
        each(out, name, &rows.iter().collect::<Vec<_>>())?;
    }
    if modules.len() > 1 {
        let all: Vec<&Row> = modules.iter().flat_map(|(_, _, rows)| rows).collect();
        each(out, "all modules", &all)?;
    }
    Ok(())
}

/// A module's summary as one JSON line (`"type":"module_summary"`).
fn summary_json(out: &mut dyn Write, title: &str, rows: &[&Row]) -> Result<()> {
    let with_code: Vec<&&Row> = rows.iter().filter(|r| r.addr.is_some()).collect();
    let big = with_code.iter().filter(|r| r.size >= 5).count();
    let ok = with_code.iter().filter(|r| r.size >= 5 && r.verdict.is_ok()).count();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &with_code {
        if let Err(why) = &r.verdict {
            *reasons.entry(why.kind()).or_default() += 1;
        }
    }
    let refused = reasons.iter().map(|(why, n)| Obj::new().str("reason", why).num("functions", n).finish());
    let o = Obj::new()
        .str("type", "module_summary")
        .str("module", title)
        .num("functions", with_code.len())
        .num("at_least_5_bytes", big)
        .num("probeable", ok)
        .num("nop_sites", with_code.iter().filter(|r| r.note == Some(NOP_NOTE)).count())
        .num("inlined", rows.len() - with_code.len())
        .list("refused", refused);
    writeln!(out, "{}", o.finish())?;
    Ok(())
}

fn summarize(out: &mut dyn Write, title: &str, rows: &[&Row]) -> Result<()> {
    let with_code: Vec<&&Row> = rows.iter().filter(|r| r.addr.is_some()).collect();
    let big: Vec<&&&Row> = with_code.iter().filter(|r| r.size >= 5).collect();
    let ok = big.iter().filter(|r| r.verdict.is_ok()).count();
    let inlined = rows.len() - with_code.len();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    let mut sources: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &with_code {
        if let Err(why) = &r.verdict {
            *reasons.entry(why.kind()).or_default() += 1;
        }
        *sources.entry(r.source.as_str()).or_default() += 1;
    }
    let pct = if big.is_empty() { 0.0 } else { 100.0 * ok as f64 / big.len() as f64 };
    writeln!(out, "{}: {} functions, {} of at least 5 bytes", text(title), with_code.len(), big.len())?;
    let sources: Vec<String> = sources.iter().map(|(s, n)| format!("{n} {s}")).collect();
    if !sources.is_empty() {
        writeln!(out, "names:     {}", sources.join(", "))?;
    }
    writeln!(out, "probeable: {ok} of {} ({pct:.1}%)", big.len())?;
    let nops = with_code.iter().filter(|r| r.note == Some(NOP_NOTE)).count();
    if nops > 0 {
        writeln!(out, "nop sites: {nops} (nops where the patch goes: nothing to relocate)")?;
    }
    let with_exits: Vec<&&&&Row> = big.iter().filter(|r| r.verdict.is_ok() && r.exits.is_some()).collect();
    if !with_exits.is_empty() {
        let all = with_exits.iter().filter(|r| matches!(&r.exits, Some(Ok(e)) if e.patchable == e.total)).count();
        let of = with_exits.len();
        let pct = 100.0 * all as f64 / of as f64;
        writeln!(out, "returns:   {all} of {of} probeable functions have every exit patchable ({pct:.1}%)")?;
    }
    writeln!(out, "refused:   {}", with_code.iter().filter(|r| r.verdict.is_err()).count())?;
    let mut top: Vec<(&str, usize)> = reasons.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (why, n) in top.iter().take(8) {
        writeln!(out, "  {n:>7}  {why}")?;
    }
    if inlined > 0 {
        writeln!(out, "inlined everywhere (no code of their own): {inlined}")?;
    }
    Ok(())
}

/// Runs `each` on the binary `args` names (with its instruction set), or
/// on every module of the process it names (the host's); a module of the
/// process that cannot be read is skipped, and said so when `say_skipped`.
fn each_module(
    args: &ListProbesArgs,
    say_skipped: bool,
    each: &mut dyn FnMut(&Module, Isa) -> Result<()>,
) -> Result<()> {
    match (&args.binary, args.pid) {
        (Some(path), None) => {
            let m = Module::from_file(path)?;
            let Some(isa) = Isa::for_machine(m.elf.machine) else {
                bail!("`{}` is {}; tp knows x86-64 and aarch64", path.display(), machine_name(m.elf.machine));
            };
            each(&m, isa)
        }
        (None, Some(pid)) => {
            process::status(pid)?;
            process::check_readable(pid)?;
            let modules = ProcessModules::new(pid, &process::read_maps(pid)?)?;
            for i in 0..modules.len() {
                match modules.get(i) {
                    Ok(m) => each(m, Isa::host())?,
                    Err(e) if say_skipped => {
                        crate::say!("tp: skipping `{}`: {}", text(&modules.name(i)), text(&format!("{e:#}")))
                    }
                    Err(_) => {}
                }
            }
            Ok(())
        }
        _ => bail!("give either a binary or --pid, not both"),
    }
}

/// `tp list-probes --lines FUNCTION…` and `--usdt`: one row per site.
fn run_sites(args: &ListProbesArgs) -> Result<ExitCode> {
    let mut rows = Vec::new();
    let mut each = |m: &Module, isa: Isa| -> Result<()> {
        if args.usdt {
            rows.extend(usdt_rows(m, isa));
        }
        for name in &args.lines {
            if m.has_function(name) || args.pid.is_none() {
                rows.extend(line_rows(m, isa, name)?);
            }
        }
        Ok(())
    };
    each_module(args, true, &mut each)?;
    if !args.lines.is_empty() && rows.is_empty() {
        bail!("no function named {} has lines with code", args.lines.join(", "));
    }
    let mut out = crate::streams::stdout();
    if args.json {
        for r in &rows {
            print_site_json(&mut out, r, args.usdt)?;
        }
    } else {
        print_site_table(&mut out, &rows, args.usdt)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `tp list-probes --blocks FUNCTION…`: the basic blocks of each function,
/// with their lines and whether `--blocks` counts each (and why not).
fn run_blocks(args: &ListProbesArgs) -> Result<ExitCode> {
    let mut maps = Vec::new();
    let mut each = |m: &Module, isa: Isa| -> Result<()> {
        for name in &args.blocks {
            if args.pid.is_some() && !m.has_function(name) {
                continue;
            }
            for f in m.named(name)?.functions {
                let map = crate::symbols::blocks::map(m, &f, isa).map_err(|why| (f.clone(), why.to_string()));
                maps.push((m.name.clone(), map));
            }
        }
        Ok(())
    };
    each_module(args, false, &mut each)?;
    if maps.is_empty() {
        bail!("no function named {} was found", args.blocks.join(", "));
    }
    let mut out = crate::streams::stdout();
    for (module, map) in &maps {
        let map = match map {
            Ok(map) => map,
            // The function as a whole: its blocks cannot be known.
            Err((f, why)) if args.json => {
                let o = Obj::new()
                    .str("type", "block")
                    .str("module", module)
                    .str("func", &f.name)
                    .str("block", &f.name)
                    .str("address", &json::address(f.addr.0))
                    .num("size", f.size)
                    .num("insns", 0)
                    .list("lines", std::iter::empty())
                    .num("probeable", false)
                    .num("window", "null")
                    .str("reason", why);
                writeln!(out, "{}", o.finish())?;
                continue;
            }
            Err((f, why)) => {
                writeln!(out, "{:<18}  {}  refused: {}", format!("{:#x}", f.addr.0), text(&f.name), text(why))?;
                continue;
            }
        };
        let f = &map.function;
        let labels: Vec<String> = map.blocks.iter().map(|b| b.label(f)).collect();
        let lines: Vec<String> = map
            .blocks
            .iter()
            .map(|b| {
                let l: Vec<String> = b
                    .lines
                    .iter()
                    .map(|(file, line)| format!("{}:{line}", file.rsplit('/').next().unwrap_or(file)))
                    .collect();
                l.join(", ")
            })
            .collect();
        if args.json {
            for ((b, label), l) in map.blocks.iter().zip(&labels).zip(&lines) {
                let o = Obj::new()
                    .str("type", "block")
                    .str("module", module)
                    .str("func", &f.name)
                    .str("block", label)
                    .str("address", &json::address(b.start.0))
                    .num("size", b.end.0 - b.start.0)
                    .num("insns", b.insns)
                    .list("lines", l.split(", ").filter(|s| !s.is_empty()).map(json::string))
                    .num("probeable", b.probe.is_ok())
                    .opt("window", b.plan.as_ref().map(|p| p.site - b.start.0 + p.len() as u64))
                    .opt_str("reason", b.probe.as_ref().err().map(String::as_str));
                writeln!(out, "{}", o.finish())?;
            }
            continue;
        }
        let bw = width(labels.iter().map(String::as_str), 5, NAME_MAX);
        let lw = width(lines.iter().map(String::as_str), 5, NAME_MAX);
        writeln!(out, "{:<18}  {:<bw$}  {:>5}  {:<lw$}  VERDICT", "ADDRESS", "BLOCK", "INSNS", "LINES")?;
        for ((b, label), l) in map.blocks.iter().zip(&labels).zip(&lines) {
            let verdict = match (&b.probe, &b.plan) {
                (Ok(_), Some(p)) => format!("counted ({} bytes: {})", p.len(), p.summary()),
                (Ok(_), None) => "counted".to_string(),
                (Err(why), _) => format!("not counted: {why}"),
            };
            let (label, l) = (fit(&text(label), bw), fit(&text(l), lw));
            writeln!(
                out,
                "{:<18}  {label:<bw$}  {:>5}  {l:<lw$}  {}",
                format!("{:#x}", b.start.0),
                b.insns,
                text(&verdict)
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The static probes of `m`, each with its verdict.
fn usdt_rows(m: &Module, isa: Isa) -> Vec<SiteRow> {
    site::usdt_in(m, "*", "*")
        .into_iter()
        .map(|hit| match hit {
            Ok((f, s)) => {
                let u = s.usdt.clone().expect("a static probe");
                let args = u
                    .args
                    .iter()
                    .map(|(t, a)| a.as_ref().map_or_else(|e| format!("{t} (not read: {e})"), |_| t.clone()))
                    .collect();
                SiteRow {
                    module: m.name.clone(),
                    what: format!("usdt:{}:{}", u.provider, u.name),
                    place: site::offset_label(&f, s.addr),
                    addr: s.addr.0,
                    verdict: verdict_at(m, &f, s.addr, isa),
                    semaphore: u.semaphore.map(|a| a.0),
                    args,
                }
            }
            Err(n) => SiteRow {
                module: m.name.clone(),
                what: format!("usdt:{}:{}", n.provider, n.name),
                place: "-".into(),
                addr: m.bias.runtime(n.pc).0,
                verdict: Err(Refusal::Unsupported("the site lies in no function tp knows")),
                semaphore: n.semaphore.map(|a| m.bias.runtime(a).0),
                args: n.arg_texts().iter().map(|a| a.to_string()).collect(),
            },
        })
        .collect()
}

/// Where each line of the functions `name` of `m` starts, with the verdict
/// at each place.
fn line_rows(m: &Module, isa: Isa, name: &str) -> Result<Vec<SiteRow>> {
    let functions: Vec<Function> = m.named(name)?.functions;
    let Some(dwarf) = m.dwarf_file() else {
        bail!("`{}` has no line table (no DWARF): build it with -g, or install its debug symbols", m.name);
    };
    let mut rows = Vec::new();
    for f in functions {
        let lo = f.bias.file(f.addr).0;
        for s in lines::starts(dwarf, Query { range: Some((lo, lo + f.size)), ..Query::default() })? {
            let addr = f.bias.runtime(s.addr);
            let file = s.file.rsplit('/').next().unwrap_or(&s.file);
            rows.push(SiteRow {
                module: m.name.clone(),
                what: format!("{file}:{}", s.line),
                place: site::offset_label(&f, addr),
                addr: addr.0,
                verdict: verdict_at(m, &f, addr, isa),
                semaphore: None,
                args: Vec::new(),
            });
        }
    }
    Ok(rows)
}

fn print_site_table(out: &mut impl Write, rows: &[SiteRow], usdt: bool) -> Result<()> {
    let ww = width(rows.iter().map(|r| r.what.as_str()), 8, NAME_MAX);
    let pw = width(rows.iter().map(|r| r.place.as_str()), 5, NAME_MAX);
    let first = if usdt { "PROBE" } else { "LINE" };
    writeln!(out, "{:<18}  {first:<ww$}  {:<pw$}  VERDICT", "ADDRESS", "WHERE")?;
    for r in rows {
        let verdict = match &r.verdict {
            Ok(p) if p.is_nop_site() => verdict_text(&r.verdict, Some(NOP_NOTE)),
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

fn print_site_json(out: &mut impl Write, r: &SiteRow, usdt: bool) -> Result<()> {
    let reason = r.verdict.as_ref().err().map(|why| why.to_string());
    let nop = r.verdict.as_ref().is_ok_and(|p| p.is_nop_site());
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
    Ok(())
}
