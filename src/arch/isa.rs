//! The instruction sets of files of any architecture: [`Isa`], the
//! object-safe part of an [`Arch`] that works on bytes alone (decoding,
//! planning, basic blocks; list-probes inspects files of other
//! architectures), found by ELF machine ([`isa_for_machine`]); and the
//! machines' names.

use std::fmt;

use super::{Arch, ArgSpec, Block, ExitPlan, Host, Image, Refusal, SitePlan, StoredPointer, aarch64, x86_64};

/// What a file of ELF machine `m` is, for messages: `an x86-64 binary`,
/// `a riscv binary`, `a binary for ELF machine 0, which tp does not know`.
pub fn machine_name(m: u16) -> String {
    let name = match m {
        3 => "i386",
        40 => "arm",
        62 => "x86-64",
        183 => "aarch64",
        243 => "riscv",
        _ => return format!("a binary for ELF machine {m}, which tp does not know"),
    };
    let article = if name.starts_with(['a', 'e', 'i', 'o', 'u', 'x']) { "an" } else { "a" };
    format!("{article} {name} binary")
}

/// The architecture-specific functions that work on bytes alone, for any
/// binary tp can read: each architecture's, through [`Arch`], as a trait
/// object ([`isa_for_machine`], [`host_isa`]).
pub trait Isa: Sync {
    /// Its name ([`Arch::NAME`]).
    fn name(&self) -> &'static str;
    /// [`Arch::plan`].
    fn plan(&self, code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal>;
    /// [`Arch::branch_targets`].
    fn branch_targets(&self, code: &[u8], addr: u64) -> Vec<u64>;
    /// [`Arch::branch_targets_into`].
    fn branch_targets_into(&self, code: &[u8], addr: u64, lo: u64, hi: u64) -> Vec<u64>;
    /// [`Arch::plan_in`].
    fn plan_in(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal>;
    /// [`Arch::PLANS_WITH_IMAGE`].
    fn plans_with_image(&self) -> bool;
    /// [`Arch::stored_pointer`].
    fn stored_pointer(&self, r_type: u32) -> Option<StoredPointer>;
    /// [`Arch::go_stack_check`].
    fn go_stack_check(&self, code: &[u8], addr: u64) -> Option<usize>;
    /// [`Arch::go_one_instruction_site`].
    fn go_one_instruction_site(&self, code: &[u8], addr: u64, from: usize) -> Option<usize>;
    /// [`Arch::go_sp_below_entry`].
    fn go_sp_below_entry(&self, code: &[u8], addr: u64, site: u64) -> Option<u32>;
    /// [`Arch::plan_at`].
    fn plan_at(
        &self,
        code: &[u8],
        function: u64,
        site: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal>;
    /// [`Arch::plan_exits`].
    #[allow(clippy::too_many_arguments)]
    fn plan_exits(
        &self,
        code: &[u8],
        addr: u64,
        parts: &[(u64, u64)],
        extra_targets: &[u64],
        taken: &[(u64, u64)],
        single: bool,
        image: &dyn Image,
    ) -> Result<Vec<ExitPlan>, Refusal>;
    /// [`Arch::plan_to`].
    fn plan_to(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
        end: u64,
    ) -> Result<SitePlan, Refusal>;
    /// [`Arch::sdt_argument`].
    fn sdt_argument(&self, arg: &str) -> Result<ArgSpec, String>;
    /// [`Arch::blocks`].
    fn blocks(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<Vec<Block>, Refusal>;
    /// [`Arch::PATCH_LEN`].
    fn patch_len(&self) -> usize;
}

impl<A: Arch + Sync> Isa for A {
    fn name(&self) -> &'static str {
        A::NAME
    }
    fn plan(&self, code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
        <A as Arch>::plan(code, function, extra_targets)
    }
    fn branch_targets(&self, code: &[u8], addr: u64) -> Vec<u64> {
        <A as Arch>::branch_targets(code, addr)
    }
    fn branch_targets_into(&self, code: &[u8], addr: u64, lo: u64, hi: u64) -> Vec<u64> {
        <A as Arch>::branch_targets_into(code, addr, lo, hi)
    }
    fn plan_in(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal> {
        <A as Arch>::plan_in(code, function, extra_targets, image)
    }
    fn plans_with_image(&self) -> bool {
        A::PLANS_WITH_IMAGE
    }
    fn stored_pointer(&self, r_type: u32) -> Option<StoredPointer> {
        <A as Arch>::stored_pointer(r_type)
    }
    fn go_stack_check(&self, code: &[u8], addr: u64) -> Option<usize> {
        <A as Arch>::go_stack_check(code, addr)
    }
    fn go_one_instruction_site(&self, code: &[u8], addr: u64, from: usize) -> Option<usize> {
        <A as Arch>::go_one_instruction_site(code, addr, from)
    }
    fn go_sp_below_entry(&self, code: &[u8], addr: u64, site: u64) -> Option<u32> {
        <A as Arch>::go_sp_below_entry(code, addr, site)
    }
    fn plan_at(
        &self,
        code: &[u8],
        function: u64,
        site: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<SitePlan, Refusal> {
        <A as Arch>::plan_at(code, function, site, extra_targets, image)
    }
    fn plan_exits(
        &self,
        code: &[u8],
        addr: u64,
        parts: &[(u64, u64)],
        extra_targets: &[u64],
        taken: &[(u64, u64)],
        single: bool,
        image: &dyn Image,
    ) -> Result<Vec<ExitPlan>, Refusal> {
        <A as Arch>::plan_exits(code, addr, parts, extra_targets, taken, single, image)
    }
    fn plan_to(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
        end: u64,
    ) -> Result<SitePlan, Refusal> {
        <A as Arch>::plan_to(code, function, extra_targets, image, end)
    }
    fn sdt_argument(&self, arg: &str) -> Result<ArgSpec, String> {
        <A as Arch>::sdt_argument(arg)
    }
    fn blocks(
        &self,
        code: &[u8],
        function: u64,
        extra_targets: &[u64],
        image: &dyn Image,
    ) -> Result<Vec<Block>, Refusal> {
        <A as Arch>::blocks(code, function, extra_targets, image)
    }
    fn patch_len(&self) -> usize {
        A::PATCH_LEN
    }
}

impl fmt::Debug for dyn Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Isa").field(&self.name()).finish()
    }
}

/// The instruction set of ELF machine `machine`, if tp knows it.
pub fn isa_for_machine(machine: u16) -> Option<&'static dyn Isa> {
    let known: [(&'static dyn Isa, u16); 2] =
        [(&x86_64::X86_64, x86_64::X86_64::ELF_MACHINE), (&aarch64::AArch64, aarch64::AArch64::ELF_MACHINE)];
    known.into_iter().find(|(_, m)| *m == machine).map(|(isa, _)| isa)
}

/// The host's instruction set.
pub fn host_isa() -> &'static dyn Isa {
    &Host {}
}
