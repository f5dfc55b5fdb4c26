//! The verdict on one function, exactly as `attach` and `list-probes` both
//! decide it: the architecture's planner with the module at hand (its jump
//! tables, stored code pointers, split-off parts), then the entries that
//! only the whole file shows (exception landing pads, other symbols, direct
//! branches from other functions).

use super::entries::Entries;
use super::image::{CodeFacts, ElfImage};
use super::{Function, Module, cold_targets};
use crate::addr::Bias;
use crate::arch::{Isa, Refusal, SitePlan};

/// The verdict on function `f` of `m` for instruction set `isa`: its plan,
/// or why it cannot be probed. `attach` and `list-probes` both ask this.
pub fn verdict(m: &Module, f: &Function, isa: Isa) -> Result<SitePlan, Refusal> {
    if f.ifunc {
        return Err(Refusal::Unsupported("an IFUNC symbol: its address is the resolver, not the implementation"));
    }
    if f.size == 0 {
        return Err(Refusal::Unsupported("its symbol has no size, so tp cannot check its code"));
    }
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    m.planner().plan(m, f, code, isa)
}

/// What planning needs of one module beyond a function's bytes, read once.
#[derive(Debug)]
pub struct Planner {
    entries: Entries,
    facts: CodeFacts,
}

impl Planner {
    /// Reads the entries and code facts of `m`.
    pub fn of(m: &Module) -> Planner {
        let isa = Isa::for_machine(m.elf.machine);
        Planner { entries: Entries::of(&m.elf, isa), facts: CodeFacts::of(&m.elf, isa) }
    }

    /// The plan for `f` of `m`, whose bytes are `code`, or why it is refused.
    pub fn plan(&self, m: &Module, f: &Function, code: &[u8], isa: Isa) -> Result<SitePlan, Refusal> {
        let extra = cold_targets(&m.elf, f.bias, &f.symbol, f.addr, f.size, isa);
        let image = ElfImage { elf: &m.elf, bias: f.bias, facts: &self.facts };
        let plan = (isa.plan_in)(code, f.addr.0, &extra, &image)?;
        self.entries.check(&plan, f.bias)?;
        Ok(plan)
    }

    /// Checks that nothing from elsewhere in the module enters `plan`'s
    /// window but at its first byte (for plans made outside [`Planner::plan`],
    /// such as the long form of a probe).
    pub fn check_entries(&self, plan: &SitePlan, bias: Bias) -> Result<(), Refusal> {
        self.entries.check(plan, bias)
    }
}
