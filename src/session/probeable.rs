//! What tp could probe, decided from the files alone (and, in a process,
//! its threads' hardware shadow stacks), exactly as `attach` would decide:
//! the engine of `tp list-probes`. Every function of a binary, or of every
//! module of a running process, with tp's verdict on it, its symbol
//! version, where its name came from (symtab, debug file, dynsym,
//! eh_frame) and, in a process, every copy of its code mapped elsewhere. A
//! site that is a 5-byte `nop` (a patchable entry, `-mnop-mcount`, a
//! tracepoint macro) is marked: nothing is relocated there. Also where
//! each source line of a function starts and the verdict there, the
//! static probes, and a function's basic blocks. The rows are
//! `output::listing`'s, which prints them.

use std::path::Path;

use anyhow::{Result, bail};

use crate::arch::{Isa, Refusal, ShadowStack, SitePlan, machine_name};
use crate::arch::{host_isa, isa_for_machine};
use crate::escape::text;
use crate::notes::Notes;
use crate::output::listing::{
    BlockRow, BlockWindow, Exits, FunctionBlockRows, FunctionRow, NOP_NOTE, Refused, SiteRow, Verdict, Window,
};
use crate::process;
use crate::progress::Progress;
use crate::symbols::lines::{self, Query};
use crate::symbols::site;
use crate::symbols::verdict::{exits_widening, go_code, verdict as verdict_on, verdict_at};
use crate::symbols::{Function, Module, ProcessModules};

use super::resolve;

/// What to list: a binary (with the instruction set its header names) or
/// every module of a process (the host's).
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// An executable or shared library.
    Binary(&'a Path),
    /// A running process.
    Process(i32),
}

/// The rows of some modules, with each module's index and name.
type ModuleRows = Vec<(usize, String, Vec<FunctionRow>)>;

/// A verdict as `output::listing` shows it.
pub fn verdict(v: &Result<SitePlan, Refusal>) -> Verdict {
    match v {
        Ok(p) => Ok(Window {
            len: p.len(),
            site: p.site,
            offset: p.site.wrapping_sub(p.function),
            insns: p.summary(),
            nop: p.is_nop_site(),
        }),
        Err(why) => Err(Refused { kind: why.kind(), why: why.to_string() }),
    }
}

/// The verdict on every function of `source`, by module (each given by its
/// name), with each function's signature when `verbose`; a module of a
/// process that cannot be read is skipped, and said so to `notes`.
pub fn functions(notes: &dyn Notes, source: Source, verbose: bool) -> Result<Vec<(String, Vec<FunctionRow>)>> {
    let modules: ModuleRows = match source {
        Source::Binary(path) => {
            let module = Module::from_file(path)?;
            let Some(isa) = isa_for_machine(module.elf.machine) else {
                bail!("`{}` is {}; tp knows x86-64 and aarch64", path.display(), machine_name(module.elf.machine));
            };
            vec![(0, module.name.clone(), rows_of(&module, isa, verbose, None))]
        }
        Source::Process(pid) => process_rows(notes, pid, verbose)?,
    };
    Ok(modules.into_iter().map(|(_, name, rows)| (name, rows)).collect())
}

/// The exits of `f` of `m`, whose entry's window is `plan` (widened as a
/// return probe's would be); None where the architecture has no exit
/// windows.
fn exits_of(m: &Module, f: &Function, plan: &mut SitePlan, isa: &dyn Isa) -> Option<Result<Exits, String>> {
    let exits = match exits_widening(m, f, plan, isa) {
        Err(Refusal::Unsupported(_)) => return None,
        Err(why) => return Some(Err(why.to_string())),
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

/// The rows of every module of process `pid`, parsed on two threads; where
/// a thread runs with a hardware shadow stack, the functions whose detour
/// it would reject are refused, as attach refuses them.
fn process_rows(notes: &dyn Notes, pid: i32, verbose: bool) -> Result<ModuleRows> {
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
                            Ok(m) => out.push((i, m.name.clone(), rows_of(m, host_isa(), verbose, shadow))),
                            Err(e) => crate::note!(
                                notes,
                                "tp: skipping `{}`: {}",
                                text(&modules.name(i)),
                                text(&format!("{e:#}"))
                            ),
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
fn rows_of(m: &Module, isa: &dyn Isa, verbose: bool, shadow: Option<(i32, ShadowStack)>) -> Vec<FunctionRow> {
    let dwarf = m.dwarf();
    let mut rows: Vec<FunctionRow> = m
        .functions()
        .into_iter()
        .filter(|f| f.size > 0)
        .map(|f| {
            let plan = verdict_on(m, &f, isa).and_then(|p| resolve::balanced(p, shadow));
            let signature =
                verbose.then(|| dwarf.and_then(|d| d.at(f.bias.file(f.addr))).map(|d| d.signature())).flatten();
            let after_check = plan.is_ok() && go_code(m, &f, isa).is_some_and(|g| g.stack_check > 0);
            let nop = plan.as_ref().is_ok_and(|p| p.is_nop_site());
            let note = if nop { Some(NOP_NOTE) } else { after_check.then_some("after Go's stack check") };
            // Counted as a return probe would take them, which may widen
            // the entry's window to take in an exit (the verdict stays a
            // counting probe's).
            let exits = plan.as_ref().ok().and_then(|p| exits_of(m, &f, &mut p.clone(), isa));
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
            let verdict = verdict(&plan);
            FunctionRow { module: m.name.clone(), name, source, addr, size: f.size, verdict, signature, note, exits }
        })
        .collect();
    if let Some(d) = dwarf {
        rows.extend(d.inlined_only.iter().map(|name| FunctionRow {
            module: m.name.clone(),
            name: name.clone(),
            source: String::new(),
            addr: None,
            size: 0,
            verdict: verdict(&Err(Refusal::InlinedEverywhere)),
            signature: None,
            note: None,
            exits: None,
        }));
    }
    rows
}

/// Runs `each` on the binary `source` names (with its instruction set), or
/// on every module of the process it names (the host's); a module of the
/// process that cannot be read is skipped, and said so to `skipped` if given.
fn each_module(
    source: Source,
    skipped: Option<&dyn Notes>,
    each: &mut dyn FnMut(&Module, &dyn Isa) -> Result<()>,
) -> Result<()> {
    match source {
        Source::Binary(path) => {
            let m = Module::from_file(path)?;
            let Some(isa) = isa_for_machine(m.elf.machine) else {
                bail!("`{}` is {}; tp knows x86-64 and aarch64", path.display(), machine_name(m.elf.machine));
            };
            each(&m, isa)
        }
        Source::Process(pid) => {
            process::status(pid)?;
            process::check_readable(pid)?;
            let modules = ProcessModules::new(pid, &process::read_maps(pid)?)?;
            for i in 0..modules.len() {
                match modules.get(i) {
                    Ok(m) => each(m, host_isa())?,
                    Err(e) => {
                        if let Some(notes) = skipped {
                            crate::note!(
                                notes,
                                "tp: skipping `{}`: {}",
                                text(&modules.name(i)),
                                text(&format!("{e:#}"))
                            )
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// The static probes of `source` (with `usdt`) and where each source line
/// of the functions named `lines` starts, one row per site with the
/// verdict there. Naming functions of which none has lines with code is an
/// error. A module of a process that cannot be read is said to `notes`.
pub fn sites(notes: &dyn Notes, source: Source, lines: &[String], usdt: bool) -> Result<Vec<SiteRow>> {
    let in_process = matches!(source, Source::Process(_));
    let mut rows = Vec::new();
    let mut each = |m: &Module, isa: &dyn Isa| -> Result<()> {
        if usdt {
            rows.extend(usdt_rows(m, isa));
        }
        for name in lines {
            if m.has_function(name) || !in_process {
                rows.extend(line_rows(m, isa, name)?);
            }
        }
        Ok(())
    };
    each_module(source, Some(notes), &mut each)?;
    if !lines.is_empty() && rows.is_empty() {
        bail!("no function named {} has lines with code", lines.join(", "));
    }
    Ok(rows)
}

/// The basic blocks of each function named `names` in `source`, with their
/// lines and whether `--blocks` counts each (and why not). Naming no
/// function that exists is an error.
pub fn blocks(source: Source, names: &[String]) -> Result<Vec<FunctionBlockRows>> {
    let in_process = matches!(source, Source::Process(_));
    let mut out = Vec::new();
    let mut each = |m: &Module, isa: &dyn Isa| -> Result<()> {
        for name in names {
            if in_process && !m.has_function(name) {
                continue;
            }
            for f in m.named(name)?.functions {
                out.push(block_rows(m, &f, isa));
            }
        }
        Ok(())
    };
    each_module(source, None, &mut each)?;
    if out.is_empty() {
        bail!("no function named {} was found", names.join(", "));
    }
    Ok(out)
}

/// The blocks of `f` of `m` as rows, or why they cannot be known.
fn block_rows(m: &Module, f: &Function, isa: &dyn Isa) -> FunctionBlockRows {
    let map = match crate::symbols::block_map::map(m, f, isa) {
        Ok(map) => map,
        Err(why) => {
            return FunctionBlockRows::Refused {
                module: m.name.clone(),
                func: f.name.clone(),
                addr: f.addr.0,
                size: f.size,
                why: why.to_string(),
            };
        }
    };
    let f = &map.function;
    let blocks = map
        .blocks
        .iter()
        .map(|b| {
            let lines: Vec<String> = b
                .lines
                .iter()
                .map(|(file, line)| format!("{}:{line}", file.rsplit('/').next().unwrap_or(file)))
                .collect();
            BlockRow {
                label: b.label(f),
                start: b.start.0,
                end: b.end.0,
                insns: b.insns,
                lines: lines.join(", "),
                counted: b.probe.as_ref().map(|_| ()).map_err(String::clone),
                window: b.plan.as_ref().map(|p| BlockWindow {
                    reach: p.site.wrapping_sub(b.start.0).wrapping_add(p.len() as u64),
                    len: p.len(),
                    insns: p.summary(),
                }),
            }
        })
        .collect();
    FunctionBlockRows::Blocks { module: m.name.clone(), func: f.name.clone(), blocks }
}

/// The static probes of `m`, each with its verdict.
fn usdt_rows(m: &Module, isa: &dyn Isa) -> Vec<SiteRow> {
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
                    verdict: verdict(&verdict_at(m, &f, s.addr, isa)),
                    semaphore: u.semaphore.map(|a| a.0),
                    args,
                }
            }
            Err(n) => SiteRow {
                module: m.name.clone(),
                what: format!("usdt:{}:{}", n.provider, n.name),
                place: "-".into(),
                addr: m.bias.runtime(n.pc).0,
                verdict: verdict(&Err(Refusal::Unsupported("the site lies in no function tp knows"))),
                semaphore: n.semaphore.map(|a| m.bias.runtime(a).0),
                args: n.arg_texts().iter().map(|a| a.to_string()).collect(),
            },
        })
        .collect()
}

/// Where each line of the functions `name` of `m` starts, with the verdict
/// at each place.
fn line_rows(m: &Module, isa: &dyn Isa, name: &str) -> Result<Vec<SiteRow>> {
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
                verdict: verdict(&verdict_at(m, &f, addr, isa)),
                semaphore: None,
                args: Vec::new(),
            });
        }
    }
    Ok(rows)
}
