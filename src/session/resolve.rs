//! From what the user named (`-f` patterns, `--addr` addresses) to planned
//! probe requests, before anything in the target is stopped.

use anyhow::{Result, bail};

use crate::addr::RuntimeAddr;
use crate::arch::host_isa;
use crate::arch::{Abi, Arch, Host, Refusal, ShadowStack};
use crate::arch::{ArgLoc, Operand, OperandLoc, Operands, SitePlan};
use crate::notes::Notes;
use crate::probe::Request;
use crate::probe::layout::kind;
use crate::progress::Progress;
use crate::symbols::block_map::BlockMap;
use crate::symbols::verdict::{go_code, verdict, verdict_at};
use crate::symbols::{Found, Function, Module, ProcessModules, Site, Usdt};

use super::returns;

/// The outcome of resolving and planning.
#[derive(Debug)]
pub struct Resolved {
    /// Functions that will be probed.
    pub requests: Vec<Request>,
    /// Functions a glob matched that cannot be probed, with the reason.
    pub refused: Vec<(Function, Refusal)>,
    /// Lines to say once the probes are set up (what some of them do not record).
    pub notes: Vec<String>,
    /// The functions whose blocks are counted (`--blocks`), with their blocks.
    pub blocks: Vec<BlockMap>,
}

/// Plans the probe of function `f` of module `m`.
pub fn plan(m: &Module, f: &Function) -> Result<SitePlan, Refusal> {
    verdict(m, f, host_isa())
}

/// Plans the probe at `site` inside function `f` of `m`.
pub fn plan_site(m: &Module, f: &Function, site: &Site) -> Result<SitePlan, Refusal> {
    verdict_at(m, f, site.addr, host_isa())
}

/// What a probe at an interior site, or a static probe, records of
/// `records` (bits of `probe::layout::kind`), or why it cannot: no return
/// probe, no sampling and no stack (there is no return address at the
/// stack pointer; a static probe marks a point, not a call), no `--by`
/// but at a static probe;
/// arguments only at a static probe, from its note (elsewhere the argument
/// registers may hold anything by then: such a probe counts, and
/// `counted_only` says so).
pub fn interior_kind(records: u32, usdt: bool) -> Result<(u32, bool), Refusal> {
    if records & (kind::RET | kind::SAMPLE) != 0 {
        return Err(Refusal::Interior(
            "a return probe goes at a function's entry, where the return address is at the stack pointer; \
             inside the function it is not: probe the function itself with --ret",
        ));
    }
    if records & kind::STACK != 0 {
        return Err(Refusal::Interior(
            "a stack is taken at a function's entry, from its return address; probe the function itself with --stack",
        ));
    }
    if records & kind::BY != 0 && !usdt {
        return Err(Refusal::Interior(
            "--by counts by an argument, and inside a function the argument registers hold anything by then \
             (a static probe's arguments are arg0..arg5)",
        ));
    }
    if records & kind::ARGS != 0 && !usdt {
        return Ok((records & !kind::ARGS, true));
    }
    Ok((records, false))
}

/// The arguments of static probe `u` of `m`, loaded at its site: each as
/// its note says, a symbol resolved to its runtime address; one tp cannot
/// read is recorded as 0 and shown as unknown, and the lines say why.
pub fn operands_of(m: &Module, u: &Usdt) -> (Operands, Vec<String>) {
    let mut ops = Vec::new();
    let mut why = Vec::new();
    for (k, (_, arg)) in u.args.iter().enumerate() {
        let loc = match arg {
            Ok(spec) => match &spec.loc {
                ArgLoc::Register(r) => Ok(OperandLoc::Register(*r)),
                ArgLoc::Memory { base, index, disp } => {
                    Ok(OperandLoc::Memory { base: *base, index: *index, disp: *disp })
                }
                ArgLoc::Constant(v) => Ok(OperandLoc::Constant(*v)),
                ArgLoc::Symbol { name, offset } => match m.data_symbol(name) {
                    Some(a) => Ok(OperandLoc::Absolute(m.bias.runtime(a).0.wrapping_add(*offset as u64))),
                    None => Err(format!("no data symbol `{name}` in `{}`", m.name)),
                },
            },
            Err(e) => Err(e.clone()),
        };
        let (size, signed) = arg.as_ref().map_or((8, false), |a| (a.size, a.signed));
        let loc = loc.unwrap_or_else(|e| {
            why.push(format!("argument {k}: {e}"));
            OperandLoc::Unreadable
        });
        ops.push(Operand { size, signed, loc });
    }
    if ops.len() > crate::arch::operand::MAX_OPERANDS {
        why.push(format!(
            "it has {} arguments; events record the first {}",
            ops.len(),
            crate::arch::operand::MAX_OPERANDS
        ));
    }
    (Operands::new(&ops), why)
}

/// Plans the long form of the probe of `f` ([`Arch::plan_long`]), which
/// install uses when no code arena fits within branch reach of `m`.
pub fn plan_long(m: &Module, f: &Function) -> Result<SitePlan, Refusal> {
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    let plan = Host::plan_long(code, f.addr.0, &m.extra_targets(f))?;
    m.planner().check_entries(&m.elf, &plan, f.bias)?;
    crate::symbols::planner::fits(plan)
}

/// The calling convention of `f` of `m`, or why it cannot record `records`
/// (bits of `probe::layout::kind`) as Go code: no events or return probes
/// where no stack check guarantees room, and return probes and sampling
/// only where its calls end at exits tp patches (see [`returns::choose`]):
/// not in assembly, whose ABI wrappers keep Go's stack-based ABI.
pub fn abi_for(m: &Module, f: &Function, records: u32) -> Result<Abi, Refusal> {
    let Some(go) = go_code(m, f, host_isa()) else { return Ok(Abi::C) };
    let abi0 = f.symbol.ends_with(".abi0");
    let times = records & (kind::RET | kind::SAMPLE) != 0;
    if times && abi0 {
        return Err(Refusal::GoReturns);
    }
    // Without a stack check a call may have 128 bytes of stack left: its
    // returns are refused, its entries recorded where the detour checks
    // the goroutine's room first.
    if go.stack_check == 0 && (times || (records & kind::ARGS != 0 && !Host::CHECKS_GO_ROOM)) {
        return Err(Refusal::GoNoStackCheck);
    }
    Ok(if abi0 { Abi::GoStack } else { Abi::Go })
}

/// True for an event probe of Go code without a stack check, whose detour
/// checks its goroutine's room before calling the runtime ([`abi_for`]).
fn needs_room(m: &Module, f: &Function, abi: Abi, kind: u32) -> bool {
    abi != Abi::C && kind & kind::ARGS != 0 && go_code(m, f, host_isa()).is_some_and(|go| go.stack_check == 0)
}

/// How far below its entry stack pointer the site of `plan` (at the entry
/// of Go function `f` of `m`) is, for a probe timed at its exits; 0 for
/// other code and probes.
fn sp_below_entry(m: &Module, f: &Function, plan: &SitePlan, abi: Abi, kind: u32) -> Result<u32, Refusal> {
    if abi != Abi::Go || kind & kind::AT_EXITS == 0 {
        return Ok(0);
    }
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    host_isa().go_sp_below_entry(code, f.addr.0, plan.site).ok_or(Refusal::GoReturns)
}

/// `plan`, or why a thread's hardware shadow stack (`shadow`: the thread
/// and its kind, where one runs with one) would reject its detour.
pub fn balanced(plan: SitePlan, shadow: Option<(i32, ShadowStack)>) -> Result<SitePlan, Refusal> {
    let Some((tid, stack)) = shadow else { return Ok(plan) };
    match Host::unbalances_shadow_stack(&plan) {
        Some(why) => Err(Refusal::ShadowStack { tid, stack, why }),
        None => Ok(plan),
    }
}

/// Resolves `patterns` and `addrs` in `modules` and plans each function,
/// to record `kind` (bits of `probe::layout::kind`), in a process where
/// `shadow` names a thread that runs with a hardware shadow stack, if one
/// does. A function named exactly that cannot be probed is an error; one
/// matched by a glob is skipped and reported in [`Resolved::refused`].
/// What the look-up notes is said to `notes`.
pub fn requests(
    notes: &dyn Notes,
    modules: &ProcessModules,
    patterns: &[String],
    addrs: &[RuntimeAddr],
    kind: u32,
    shadow: Option<(i32, ShadowStack)>,
) -> Result<Resolved> {
    let resolution = modules.resolve_noted(patterns)?;
    for note in &resolution.notes {
        crate::note!(notes, "tp: {}", crate::escape::text(note));
    }
    let mut found = resolution.found;
    for &a in addrs {
        let f = modules.at_address(a)?;
        if !found.iter().any(|x| x.key() == f.key()) {
            found.push(f);
        }
    }
    plan_found(notes, modules, found, kind, shadow)
}

/// A function's plan (its site, calling convention and what it records),
/// the long form of its probe, and whether it is counted only.
type Planned = (Result<(SitePlan, Abi, u32), Refusal>, Option<Result<SitePlan, Refusal>>, bool);

/// Functions below this many are planned on one thread.
const PLAN_ALONE: usize = 1000;

/// [`plan_one`] for each of `found`, in order, on as many threads as the
/// machine has cores (each decodes with its own disassembler). A module
/// tp cannot read is the error of the first function in it.
fn plan_all(
    modules: &ProcessModules,
    found: &[Found],
    kind: u32,
    shadow: Option<(i32, ShadowStack)>,
    progress: &Progress,
) -> Result<Vec<Planned>> {
    let one = |f: &Found| -> Result<Planned> {
        progress.inc();
        Ok(plan_one(modules.get(f.module)?, f, kind, shadow))
    };
    if found.len() < PLAN_ALONE {
        return found.iter().map(one).collect();
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if threads < 2 {
        return found.iter().map(one).collect();
    }
    // Every module is read before the threads share them.
    for f in found {
        modules.get(f.module)?;
    }
    let chunk = found.len().div_ceil(threads);
    let parts: Vec<Result<Vec<Planned>>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            found.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(one).collect())).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut all = Vec::with_capacity(found.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// The plan of `f` (in `m`), to record `kind`, with `shadow` as in
/// [`requests`], and the long form of its probe if it has a plan.
fn plan_one(m: &Module, f: &Found, kind: u32, shadow: Option<(i32, ShadowStack)>) -> Planned {
    let balanced = |plan: SitePlan| balanced(plan, shadow);
    let function = &f.function;
    let mut counts_only = false;
    let planned = match &f.site {
        None => plan(m, function).and_then(balanced).and_then(|plan| Ok((plan, abi_for(m, function, kind)?, kind))),
        Some(s) => plan_site(m, function, s).and_then(balanced).and_then(|plan| {
            // A line or offset at the entry is the entry; a static probe is its note's.
            if !plan.interior && s.usdt.is_none() {
                return Ok((plan, abi_for(m, function, kind)?, kind));
            }
            let (k, counted) = interior_kind(kind, s.usdt.is_some())?;
            counts_only = counted;
            Ok((plan, Abi::C, k))
        }),
    };
    // Only counting in a function whose vector registers a syscall of the
    // runtime could discard.
    let planned = planned.and_then(|(plan, abi, k)| match k != kind::COUNT && m.variant_pcs(function) {
        true => Err(Refusal::VariantPcs),
        false => Ok((plan, abi, k)),
    });
    // The long form goes at the entry, before Go's stack check, and has an
    // interior: not for Go code, nor inside a function.
    let long = planned.as_ref().ok().map(|(plan, abi, _)| match abi {
        _ if plan.interior => Err(Refusal::Interior("the long form goes at a function's entry")),
        Abi::Go | Abi::GoStack => Err(Refusal::GoPreemptible),
        Abi::C => plan_long(m, function).and_then(balanced),
    });
    (planned, long, counts_only)
}

/// Plans each function of `found` (looked up in `modules`), to record
/// `kind`, with `shadow` as in [`requests`]: [`requests`] once the names
/// are resolved. Where a thread runs with a hardware shadow stack, a plan
/// whose detour would break the pairing of calls and returns is refused,
/// and so is such a long form. Operands that cannot be shown and two names
/// of one site are said to `notes`.
pub fn plan_found(
    notes: &dyn Notes,
    modules: &ProcessModules,
    found: Vec<Found>,
    kind: u32,
    shadow: Option<(i32, ShadowStack)>,
) -> Result<Resolved> {
    let progress = Progress::new(found.len() as u64, "planning probes");
    let forms = returns::Forms::of(modules);
    let mut requests: Vec<Request> = Vec::new();
    // Where each site's request is: a probe-all plans tens of thousands.
    let mut at_site: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut refused = Vec::new();
    let mut counted_only = Vec::new();
    let mut return_notes = Vec::new();
    // The functions whose blocks are counted, each once.
    let mut blocks: Vec<BlockMap> = Vec::new();
    for f in found.iter().filter(|f| f.site.as_ref().is_some_and(|s| s.block)) {
        let m = modules.get(f.module)?;
        if !blocks.iter().any(|b| b.function.addr == f.function.addr && b.function.module == f.function.module)
            && let Ok(map) = crate::symbols::block_map::map(m, &f.function, host_isa())
        {
            blocks.push(map);
        }
    }
    // Each function's plans, made on every core (the decoding is most of an
    // attach's time when it probes tens of thousands of functions).
    let plans = plan_all(modules, &found, kind, shadow, &progress)?;
    for (Found { module, function, explicit, site }, (planned, long, counts_only)) in found.into_iter().zip(plans) {
        let m = modules.get(module)?;
        if counts_only && let Some(s) = &site {
            counted_only.push(s.label.clone());
        }
        let label = site.as_ref().map_or(function.name.clone(), |s| s.label.clone());
        match planned {
            Ok((plan, abi, kind)) => {
                let long = long.expect("a long form planned with every plan");
                let span = m.span_of(&function);
                let usdt = site.as_ref().and_then(|s| s.usdt.as_ref());
                let operands = usdt.filter(|_| kind & crate::probe::layout::kind::ARGS != 0).map(|u| {
                    let (ops, why) = operands_of(m, u);
                    for w in why {
                        crate::note!(
                            notes,
                            "tp: `{}`: {}; shown as ?",
                            crate::escape::text(&label),
                            crate::escape::text(&w)
                        );
                    }
                    ops
                });
                let semaphore = usdt.and_then(|u| u.semaphore).map(|a| a.0);
                // Two names for one site (`foo` and `foo+4` after its
                // `endbr64`, a line that starts at an entry): one probe.
                if let Some(first) = at_site.get(&plan.site).map(|&k| &requests[k]) {
                    crate::note!(
                        notes,
                        "tp: `{}` is where `{}` is probed already",
                        crate::escape::text(&label),
                        crate::escape::text(&first.function.name)
                    );
                    continue;
                }
                let function = Function { name: label, ..function };
                let go_room = !plan.interior && needs_room(m, &function, abi, kind);
                let mut plan = plan;
                let forms = if abi == Abi::Go { returns::Forms::Go } else { forms };
                let chosen = returns::choose(m, &function, &mut plan, kind, forms, shadow).and_then(|c| {
                    let below = sp_below_entry(m, &function, &plan, abi, c.0)?;
                    Ok((c, below))
                });
                let ((kind, exits, note), sp_below_entry) = match chosen {
                    Ok(chosen) => chosen,
                    Err(r) if explicit => bail!("cannot probe `{}`: {r}", function.name),
                    Err(r) => {
                        refused.push((function, r));
                        continue;
                    }
                };
                if let Some(note) = note {
                    return_notes.push((note, kind));
                }
                let return_saved_below = if kind & (kind::RET | kind::SAMPLE) != 0 && kind & kind::AT_EXITS == 0 {
                    m.return_saved_below(&function)
                } else {
                    None
                };
                requests.push(Request {
                    long,
                    function,
                    plan,
                    span,
                    kind,
                    abi,
                    return_saved_below,
                    operands,
                    semaphore,
                    config: Default::default(),
                    exits,
                    parent: None,
                    sp_below_entry,
                    go_room,
                });
                at_site.insert(requests[requests.len() - 1].plan.site, requests.len() - 1);
            }
            Err(r) if explicit => {
                let at = site.as_ref().map_or(function.addr, |s| s.addr);
                bail!("cannot probe `{label}`: {}", super::explain::refusal(m, &function, at, site.is_some(), &r))
            }
            Err(r) => refused.push((Function { name: label, ..function }, r)),
        }
    }
    let mut notes = returns::lines(&return_notes);
    if !counted_only.is_empty() {
        let names: Vec<String> = counted_only.iter().take(4).map(|n| format!("`{}`", crate::escape::text(n))).collect();
        let more = if counted_only.len() > 4 { format!(" and {} more", counted_only.len() - 4) } else { String::new() };
        notes.push(format!(
            "tp: {}{more} inside functions: counted, without arguments (the argument registers hold them only at a \
             function's entry; static probes record their own)",
            names.join(", ")
        ));
    }
    progress.finish();
    if requests.is_empty() {
        match refused.first() {
            Some((f, r)) => bail!(
                "nothing to probe: the {} functions matched cannot be probed (e.g. `{}`: {r})",
                refused.len(),
                f.name
            ),
            None => bail!("nothing to probe"),
        }
    }
    Ok(Resolved { requests, refused, notes, blocks })
}
