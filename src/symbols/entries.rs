//! Ways into a function that its own direct branches do not show: exception
//! landing pads, and other symbols that start inside it. A probe whose window
//! has one of these in its interior is refused, since a thread arriving there
//! would run the middle of the patched jump.

use super::ElfFile;
use super::eh::LandingPads;
use crate::arch::{Refusal, SitePlan};

/// The entry points of one file, at link-time addresses.
#[derive(Debug)]
pub struct Entries {
    pads: LandingPads,
    /// Every function symbol's start and name, sorted by address.
    starts: Vec<(u64, String)>,
}

impl Entries {
    /// Collects the entry points of `elf`.
    pub fn of(elf: &ElfFile) -> Entries {
        let mut starts: Vec<(u64, String)> = elf.functions.iter().map(|f| (f.addr, f.name.clone())).collect();
        starts.sort();
        Entries { pads: LandingPads::of(elf), starts }
    }

    /// Checks that nothing enters `plan`'s window (runtime addresses; the
    /// file was loaded at `bias`) anywhere but at its first byte.
    pub fn check(&self, plan: &SitePlan, bias: u64) -> Result<(), Refusal> {
        let lo = plan.site.wrapping_sub(bias);
        let hi = lo + plan.len() as u64;
        if self.pads.unknown_at(plan.function.wrapping_sub(bias)) {
            return Err(Refusal::UnknownLandingPads { at: plan.function });
        }
        if let Some(pad) = self.pads.strictly_inside(lo, hi).next() {
            return Err(Refusal::LandingPadInWindow { at: pad.wrapping_add(bias) });
        }
        let first = self.starts.partition_point(|(a, _)| *a <= lo);
        if let Some((a, name)) = self.starts[first..].first().filter(|(a, _)| *a < hi) {
            return Err(Refusal::EntersWindow { at: a.wrapping_add(bias), from: format!("function `{name}`") });
        }
        Ok(())
    }

    /// The landing pads found.
    pub fn landing_pads(&self) -> &LandingPads {
        &self.pads
    }
}
