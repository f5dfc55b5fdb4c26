//! The verdict on one function, exactly as `attach` and `list-probes` both
//! decide it, by the module's [`super::planner::Planner`]: the
//! architecture's planner with the module at hand (its jump
//! tables, stored code pointers, split-off parts), then the entries that
//! only the whole file shows (exception landing pads, other symbols, direct
//! branches from other functions).
//!
//! In Go code ([`super::go_module`]) the probe goes after the function's
//! stack-bound check: a call whose check fails grows the stack and comes
//! back to the first instruction, so a probe there would count that call
//! twice. Where Go may preempt a goroutine asynchronously, the window is a
//! single instruction (after the frame's setup if need be), or none.
//! `runtime.goexit` is never probed.

use super::planner::GoCode;
use super::{Function, Module};
use crate::addr::RuntimeAddr;
use crate::arch::{ExitPlan, Isa, Refusal, SitePlan};

/// The verdict on function `f` of `m` for instruction set `isa`: its plan,
/// or why it cannot be probed. `attach` and `list-probes` both ask this.
pub fn verdict(m: &Module, f: &Function, isa: &dyn Isa) -> Result<SitePlan, Refusal> {
    if f.ifunc {
        return Err(Refusal::Unsupported("an IFUNC symbol: its address is the resolver, not the implementation"));
    }
    if f.size == 0 {
        return Err(Refusal::Unsupported("its symbol has no size, so tp cannot check its code"));
    }
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    if let Some(plan) = m.plans().get(f, code) {
        return Ok(plan);
    }
    let plan = m.planner().plan(&m.elf, f, code, isa)?;
    m.plans().note(f, code, &plan);
    Ok(plan)
}

/// The verdict on a probe at `at` inside function `f` of `m` (its entry's
/// verdict when `at` is the entry): the same checks over the whole function,
/// from the instruction that starts at `at`.
pub fn verdict_at(m: &Module, f: &Function, at: RuntimeAddr, isa: &dyn Isa) -> Result<SitePlan, Refusal> {
    if at == f.addr {
        return verdict(m, f, isa);
    }
    if f.ifunc {
        return Err(Refusal::Unsupported("an IFUNC symbol: its address is the resolver, not the implementation"));
    }
    if f.size == 0 {
        return Err(Refusal::Unsupported("its symbol has no size, so tp cannot check its code"));
    }
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    m.planner().plan_at(&m.elf, f, code, at, isa)
}

/// [`verdict`] with the entry's window reaching `end` at least
/// ([`crate::arch::Arch::plan_to`]). Not for Go code, whose windows follow
/// rules of their own.
pub fn verdict_to(m: &Module, f: &Function, isa: &dyn Isa, end: u64) -> Result<SitePlan, Refusal> {
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    m.planner().plan_to(&m.elf, f, code, isa, end)
}

/// The windows at the exits of function `f` of `m`, whose entry's window
/// is `entry` ([`crate::arch::Arch::plan_exits`], over its body and its
/// split-off parts, each window checked as an entry's is): for a return
/// probe that sees a call end where it ends. Err if its exits cannot all be
/// known (code that does not decode).
pub fn exits(m: &Module, f: &Function, entry: &SitePlan, isa: &dyn Isa) -> Result<Vec<ExitPlan>, Refusal> {
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    m.planner().plan_exits(&m.elf, f, code, entry, isa)
}

/// [`exits`] of `f` of `m` for a return probe whose entry's window is
/// `plan`; where an exit has no window of its own, the entry's window made
/// to reach as far as every such exit ([`verdict_to`]: a function of a few
/// instructions, without padding after it), if that leaves every exit a
/// window: then `plan` becomes that window.
pub fn exits_widening(m: &Module, f: &Function, plan: &mut SitePlan, isa: &dyn Isa) -> Result<Vec<ExitPlan>, Refusal> {
    let found = exits(m, f, plan, isa)?;
    let Some(end) = found.iter().filter(|e| e.plan.is_err()).map(|e| e.at + e.len as u64).max() else {
        return Ok(found);
    };
    let Ok(wide) = verdict_to(m, f, isa, end) else { return Ok(found) };
    match exits(m, f, &wide, isa) {
        Ok(again) if again.iter().all(|e| e.plan.is_ok()) => {
            *plan = wide;
            Ok(again)
        }
        _ => Ok(found),
    }
}

/// If `f` of `m` is Go code, what its plan was built on.
pub fn go_code(m: &Module, f: &Function, isa: &dyn Isa) -> Option<GoCode> {
    let code = m.code_of(f).ok()?;
    m.planner().go_code(f, code, isa)
}
