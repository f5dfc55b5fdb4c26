//! What planning needs of one module beyond a function's bytes, read once
//! ([`Planner`], which the module keeps): the entries that only the whole
//! file shows (exception landing pads, direct branches from other
//! functions), the code facts (absolute code, stored code pointers) and Go's
//! function table; and the plans made with them, for a function's entry, a
//! place inside it, its exits and its basic blocks. `super::verdict` asks
//! it for a module's function.

use std::sync::{Arc, OnceLock};

use super::elf::ElfFile;
use super::entries::Entries;
use super::go_module::{self, GoModule};
use super::image::{CodeFacts, ElfImage};
use super::{Function, cold_parts, cold_targets};
use crate::addr::{Bias, RuntimeAddr};
use crate::arch::isa_for_machine;
use crate::arch::{Block, ExitPlan, Isa, Refusal, SitePlan};

/// A Go function, as planning found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoCode {
    /// Bytes of the stack-bound check at its entry (0 without one).
    pub stack_check: usize,
    /// True if Go may preempt it asynchronously, between any two
    /// instructions after its stack check: its window must then be one
    /// instruction.
    pub preemptible: bool,
}

/// What [`Planner`] is made of, as saved: the landing pads, every branch
/// target, the code facts (absolute code, the code addresses data holds)
/// and the Go function table (entries, unreadable, stack returns).
#[derive(Debug)]
pub struct PlannerParts {
    /// Landing pads.
    pub pads: super::eh::LandingPads,
    /// Every direct branch target, sorted.
    pub branch_targets: Vec<u64>,
    /// [`CodeFacts::parts`].
    pub facts: (bool, Vec<u64>),
    /// [`GoModule::parts`].
    pub go: Option<(Vec<u64>, bool, Vec<u64>)>,
}

/// What planning needs of one module beyond a function's bytes, read once.
#[derive(Debug)]
pub struct Planner {
    entries: Entries,
    facts: CodeFacts,
    go: Option<GoModule>,
}

impl Planner {
    /// Reads the entries and code facts of the module whose file is `elf`,
    /// or takes them from what the cache held (`saved`); `branch_targets`
    /// is where the module keeps every branch target of its code, shared.
    pub fn of(elf: &ElfFile, saved: Option<PlannerParts>, branch_targets: Arc<OnceLock<Vec<u64>>>) -> Planner {
        let isa = isa_for_machine(elf.machine);
        if let Some(p) = saved {
            return Planner {
                entries: Entries::from_parts(elf, isa, p.pads, p.branch_targets),
                facts: CodeFacts::from_parts(p.facts.0, p.facts.1),
                go: p.go.map(|(entries, all, returns)| GoModule::from_parts(entries, all, returns)),
            };
        }
        Planner {
            entries: Entries::sharing(elf, isa, branch_targets),
            facts: CodeFacts::of(elf, isa),
            go: GoModule::of(elf),
        }
    }

    /// The plan for `f` of `m`, whose bytes are `code`, or why it is refused.
    pub fn plan(&self, elf: &ElfFile, f: &Function, code: &[u8], isa: &dyn Isa) -> Result<SitePlan, Refusal> {
        if let Some(go) = &self.go
            && go.is_stack_return(f.bias.file(f.addr), &f.symbol)
        {
            return Err(Refusal::GoStackReturn);
        }
        let go = self.go_code(f, code, isa);
        let skip = match go {
            None => 0,
            Some(g) if !g.preemptible => g.stack_check,
            Some(g) => isa.go_one_instruction_site(code, f.addr.0, g.stack_check).ok_or(Refusal::GoPreemptible)?,
        };
        let extra = cold_targets(elf, f.bias, &f.symbol, f.addr, f.size, isa);
        let image = ElfImage { elf, bias: f.bias, facts: &self.facts, parts: cold_ranges(elf, f) };
        let mut plan = isa.plan_in(&code[skip..], f.addr.0 + skip as u64, &extra, &image)?;
        if go.is_some_and(|g| g.preemptible) && plan.insns.len() > 1 {
            return Err(Refusal::GoPreemptible);
        }
        plan.function = f.addr.0;
        self.entries.check(elf, &plan, f.bias)?;
        fits(plan)
    }

    /// The plan for a probe at `at` inside `f` (in `elf`), whose bytes are
    /// `code`: as [`Planner::plan`], from the instruction at `at`. In Go
    /// code it must come after the stack check, and where Go preempts, the
    /// window must be one instruction.
    pub fn plan_at(
        &self,
        elf: &ElfFile,
        f: &Function,
        code: &[u8],
        at: RuntimeAddr,
        isa: &dyn Isa,
    ) -> Result<SitePlan, Refusal> {
        if let Some(go) = &self.go
            && go.is_stack_return(f.bias.file(f.addr), &f.symbol)
        {
            return Err(Refusal::GoStackReturn);
        }
        let go = self.go_code(f, code, isa);
        if go.is_some_and(|g| at.0 < f.addr.0 + g.stack_check as u64) {
            return Err(Refusal::Interior(
                "it is inside Go's stack check, which a call whose stack must grow runs twice",
            ));
        }
        let extra = cold_targets(elf, f.bias, &f.symbol, f.addr, f.size, isa);
        let image = ElfImage { elf, bias: f.bias, facts: &self.facts, parts: cold_ranges(elf, f) };
        let mut plan = isa.plan_at(code, f.addr.0, at.0, &extra, &image)?;
        if go.is_some_and(|g| g.preemptible) && plan.insns.len() > 1 {
            return Err(Refusal::GoPreemptible);
        }
        plan.function = f.addr.0;
        self.entries.check(elf, &plan, f.bias)?;
        fits(plan)
    }

    /// [`Planner::plan`] with a window reaching `end` at least: see [`super::verdict::verdict_to`].
    pub fn plan_to(
        &self,
        elf: &ElfFile,
        f: &Function,
        code: &[u8],
        isa: &dyn Isa,
        end: u64,
    ) -> Result<SitePlan, Refusal> {
        if self.go_code(f, code, isa).is_some() {
            return Err(Refusal::Unsupported("a longer window in Go code"));
        }
        let extra = cold_targets(elf, f.bias, &f.symbol, f.addr, f.size, isa);
        let image = ElfImage { elf, bias: f.bias, facts: &self.facts, parts: cold_ranges(elf, f) };
        let plan = isa.plan_to(code, f.addr.0, &extra, &image, end)?;
        self.entries.check(elf, &plan, f.bias)?;
        fits(plan)
    }

    /// The windows at the exits of `f` (in `elf`), whose bytes are `code` and
    /// whose entry's window is `entry`: see [`super::verdict::exits`].
    pub fn plan_exits(
        &self,
        elf: &ElfFile,
        f: &Function,
        code: &[u8],
        entry: &SitePlan,
        isa: &dyn Isa,
    ) -> Result<Vec<ExitPlan>, Refusal> {
        let image = ElfImage { elf, bias: f.bias, facts: &self.facts, parts: cold_ranges(elf, f) };
        let body = (f.addr.0, f.addr.0 + code.len() as u64);
        let cold = cold_parts(elf, f.bias, &f.symbol);
        let mut parts = vec![body];
        parts.extend(cold.iter().map(|&(at, c)| (at, at + c.len() as u64)));
        let taken = [(entry.site, entry.site + entry.len() as u64)];
        // Landing pads are where the unwinder enters: a window may not
        // take one past its first byte, as padding or otherwise.
        let pads = |(lo, hi): (u64, u64)| -> Vec<u64> {
            let file = |a: u64| f.bias.file(RuntimeAddr(a)).0;
            let pads = self.entries.landing_pads().strictly_inside(file(lo).saturating_sub(1), file(hi));
            pads.map(|p| f.bias.runtime(crate::addr::FileAddr(p)).0).collect()
        };
        let mut extra = cold_targets(elf, f.bias, &f.symbol, f.addr, f.size, isa);
        extra.extend(pads(body));
        // Where Go preempts between any two instructions, a window is one.
        let go = self.go_code(f, code, isa);
        let single = go.is_some_and(|g| g.preemptible);
        let mut exits = isa.plan_exits(code, body.0, &parts, &extra, &taken, single, &image)?;
        let from_body = isa.branch_targets(code, body.0);
        for &(at, c) in &cold {
            let end = at + c.len() as u64;
            let mut into: Vec<u64> = from_body.iter().copied().filter(|&t| t > at && t < end).collect();
            into.extend(pads((at, end)));
            exits.extend(isa.plan_exits(c, at, &parts, &into, &[], single, &image)?);
        }
        if go.is_some() {
            // Go jumps to its function's entry only after morestack grew
            // the stack: the same call again, whose probe (after the stack
            // check) has not run yet.
            exits.retain(|e| {
                let insn = usize::try_from(e.at - body.0).ok().and_then(|o| code.get(o..o + e.len as usize));
                insn.is_none_or(|b| isa.branch_targets(b, e.at) != [f.addr.0])
            });
        }
        for e in &mut exits {
            if let Ok(plan) = &mut e.plan {
                plan.function = f.addr.0;
                if let Err(why) = self.entries.check(elf, plan, f.bias).and_then(|_| fits(plan.clone())) {
                    e.plan = Err(why);
                }
            }
        }
        Ok(exits)
    }

    /// Checks that nothing from elsewhere in `elf` (the file of the module this
    /// was made for) enters `plan`'s window but at its first byte (for plans made
    /// outside [`Planner::plan`], such as the long form of a probe).
    pub fn check_entries(&self, elf: &ElfFile, plan: &SitePlan, bias: Bias) -> Result<(), Refusal> {
        self.entries.check(elf, plan, bias)
    }

    /// The module's Go code, if it has any.
    pub fn go(&self) -> Option<&GoModule> {
        self.go.as_ref()
    }

    /// The basic blocks of `f` (in `elf`), whose bytes are `code`
    /// ([`crate::arch::Arch::blocks`]): with the jumps into it from its
    /// split-off parts and the module's stored code pointers.
    pub fn blocks(&self, elf: &ElfFile, f: &Function, code: &[u8], isa: &dyn Isa) -> Result<Vec<Block>, Refusal> {
        let extra = cold_targets(elf, f.bias, &f.symbol, f.addr, f.size, isa);
        let image = ElfImage { elf, bias: f.bias, facts: &self.facts, parts: cold_ranges(elf, f) };
        isa.blocks(code, f.addr.0, &extra, &image)
    }

    /// If `f` (whose bytes are `code`) is Go code, what planning found.
    pub fn go_code(&self, f: &Function, code: &[u8], isa: &dyn Isa) -> Option<GoCode> {
        let go = self.go.as_ref()?;
        if !go.is_go(f.bias.file(f.addr)) {
            return None;
        }
        let stack_check = isa.go_stack_check(code, f.addr.0).unwrap_or(0);
        Some(GoCode { stack_check, preemptible: stack_check > 0 && go_module::preemptible(&f.symbol) })
    }
}

/// The `.cold` parts of `f` (in `elf`), `[lo, hi)` at run time.
fn cold_ranges(elf: &ElfFile, f: &Function) -> Vec<(u64, u64)> {
    cold_parts(elf, f.bias, &f.symbol).iter().map(|&(at, c)| (at, at + c.len() as u64)).collect()
}

/// `plan`, or why its window is longer than a site's entry keeps.
pub fn fits(plan: SitePlan) -> Result<SitePlan, Refusal> {
    match plan.len() {
        len if len > crate::arch::MAX_WINDOW => Err(Refusal::TooLong { len }),
        _ => Ok(plan),
    }
}
