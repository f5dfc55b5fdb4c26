//! From what the user named (`-f` patterns, `--addr` addresses) to planned
//! probe requests, before anything in the target is stopped.

use anyhow::{Result, bail};

use crate::addr::RuntimeAddr;
use crate::arch::SitePlan;
use crate::arch::{Abi, Arch, Host, Isa, Refusal};
use crate::probe::Request;
use crate::probe::layout::kind;
use crate::progress::Progress;
use crate::symbols::verdict::{go_code, verdict};
use crate::symbols::{Found, Function, Module, ProcessModules};

/// The outcome of resolving and planning.
#[derive(Debug)]
pub struct Resolved {
    /// Functions that will be probed.
    pub requests: Vec<Request>,
    /// Functions a glob matched that cannot be probed, with the reason.
    pub refused: Vec<(Function, Refusal)>,
}

/// Plans the probe of function `f` of module `m`.
pub fn plan(m: &Module, f: &Function) -> Result<SitePlan, Refusal> {
    verdict(m, f, Isa::host())
}

/// Plans the long form of the probe of `f` ([`Arch::plan_long`]), which
/// install uses when no code arena fits within branch reach of `m`.
pub fn plan_long(m: &Module, f: &Function) -> Result<SitePlan, Refusal> {
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    let plan = Host::plan_long(code, f.addr.0, &m.extra_targets(f))?;
    m.planner().check_entries(m, &plan, f.bias)?;
    Ok(plan)
}

/// The calling convention of `f` of `m`, or why it cannot record `records`
/// (bits of `probe::layout::kind`) as Go code: no return probe and no
/// sampling (the Go runtime walks goroutine stacks and checks every return
/// address on them), and no events where no stack check guarantees room.
pub fn abi_for(m: &Module, f: &Function, records: u32) -> Result<Abi, Refusal> {
    let Some(go) = go_code(m, f, Isa::host()) else { return Ok(Abi::C) };
    if records & (kind::RET | kind::SAMPLE) != 0 {
        return Err(Refusal::GoReturns);
    }
    if records & kind::ARGS != 0 && go.stack_check == 0 {
        return Err(Refusal::GoNoStackCheck);
    }
    // Assembly (and the ABI wrappers around it) keeps Go's stack-based ABI.
    Ok(if f.symbol.ends_with(".abi0") { Abi::GoStack } else { Abi::Go })
}

/// Resolves `patterns` and `addrs` in `modules` and plans each function,
/// to record `kind` (bits of `probe::layout::kind`). A function named
/// exactly that cannot be probed is an error; one matched by a glob is
/// skipped and reported in [`Resolved::refused`].
pub fn requests(modules: &ProcessModules, patterns: &[String], addrs: &[RuntimeAddr], kind: u32) -> Result<Resolved> {
    if kind != crate::probe::layout::kind::COUNT && !Host::RECORDS_EVENTS {
        bail!(
            "{} probes count calls but do not record arguments, return values or latency yet; \
             count them with `tp attach` without --args/--ret",
            Host::NAME
        );
    }
    let resolution = modules.resolve_noted(patterns)?;
    for note in &resolution.notes {
        crate::say!("tp: {}", crate::escape::text(note));
    }
    let mut found = resolution.found;
    for &a in addrs {
        let f = modules.at_address(a)?;
        if !found.iter().any(|x| x.function.addr == f.function.addr) {
            found.push(f);
        }
    }
    plan_found(modules, found, kind)
}

/// Plans each function of `found` (looked up in `modules`), to record
/// `kind`: [`requests`] once the names are resolved.
pub fn plan_found(modules: &ProcessModules, found: Vec<Found>, kind: u32) -> Result<Resolved> {
    if kind != crate::probe::layout::kind::COUNT && !Host::RECORDS_EVENTS {
        bail!(
            "{} probes count calls but do not record arguments, return values or latency yet; \
             count them with `tp attach` without --args/--ret",
            Host::NAME
        );
    }
    let progress = Progress::new(found.len() as u64, "planning probes");
    let mut requests = Vec::new();
    let mut refused = Vec::new();
    for Found { module, function, explicit } in found {
        progress.inc();
        let m = modules.get(module)?;
        match plan(m, &function).and_then(|plan| Ok((plan, abi_for(m, &function, kind)?))) {
            Ok((plan, abi)) => {
                // The long form goes at the entry, before Go's stack check,
                // and has an interior: not for Go code.
                let long = match abi {
                    Abi::Go | Abi::GoStack => Err(Refusal::GoPreemptible),
                    Abi::C => plan_long(m, &function),
                };
                let span = m.span_of(&function);
                requests.push(Request { long, function, plan, span, kind, abi, config: Default::default() })
            }
            Err(r) if explicit => bail!("cannot probe `{}`: {r}", function.name),
            Err(r) => refused.push((function, r)),
        }
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
    Ok(Resolved { requests, refused })
}
