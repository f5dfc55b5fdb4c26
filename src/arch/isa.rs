//! The instruction sets of files of any architecture: [`Isa`], the
//! functions of an [`Arch`] that work on bytes alone (list-probes inspects
//! files of other architectures), found by ELF machine; and the machines' names.

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

/// [`Arch::plan`] as a function pointer.
pub type PlanFn = fn(&[u8], u64, &[u64]) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_in`] as a function pointer.
pub type PlanInFn = fn(&[u8], u64, &[u64], &dyn Image) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_at`] as a function pointer.
pub type PlanAtFn = fn(&[u8], u64, u64, &[u64], &dyn Image) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_to`] as a function pointer.
pub type PlanToFn = fn(&[u8], u64, &[u64], &dyn Image, u64) -> Result<SitePlan, Refusal>;

/// [`Arch::plan_exits`] as a function pointer.
pub type PlanExitsFn =
    fn(&[u8], u64, &[(u64, u64)], &[u64], &[(u64, u64)], bool, &dyn Image) -> Result<Vec<ExitPlan>, Refusal>;

/// [`Arch::blocks`].
pub type BlocksFn = fn(&[u8], u64, &[u64], &dyn Image) -> Result<Vec<Block>, Refusal>;

/// The architecture-specific functions that work on bytes alone, for any
/// binary tp can read (list-probes inspects files of other architectures).
#[derive(Clone, Copy)]
pub struct Isa {
    /// Its name.
    pub name: &'static str,
    /// [`Arch::plan`].
    pub plan: PlanFn,
    /// [`Arch::branch_targets`].
    pub branch_targets: fn(&[u8], u64) -> Vec<u64>,
    /// [`Arch::branch_targets_into`].
    pub branch_targets_into: fn(&[u8], u64, u64, u64) -> Vec<u64>,
    /// [`Arch::plan_in`].
    pub plan_in: PlanInFn,
    /// [`Arch::PLANS_WITH_IMAGE`].
    pub plans_with_image: bool,
    /// [`Arch::stored_pointer`].
    pub stored_pointer: fn(u32) -> Option<StoredPointer>,
    /// [`Arch::go_stack_check`].
    pub go_stack_check: fn(&[u8], u64) -> Option<usize>,
    /// [`Arch::go_one_instruction_site`].
    pub go_one_instruction_site: fn(&[u8], u64, usize) -> Option<usize>,
    /// [`Arch::go_sp_below_entry`].
    pub go_sp_below_entry: fn(&[u8], u64, u64) -> Option<u32>,
    /// [`Arch::plan_at`].
    pub plan_at: PlanAtFn,
    /// [`Arch::plan_exits`].
    pub plan_exits: PlanExitsFn,
    /// [`Arch::plan_to`].
    pub plan_to: PlanToFn,
    /// [`Arch::sdt_argument`].
    pub sdt_argument: fn(&str) -> Result<ArgSpec, String>,
    /// [`Arch::blocks`].
    pub blocks: BlocksFn,
    /// [`Arch::PATCH_LEN`].
    pub patch_len: usize,
}

impl std::fmt::Debug for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Isa").field(&self.name).finish()
    }
}

impl Isa {
    fn of<A: Arch>() -> Isa {
        Isa {
            name: A::NAME,
            plan: A::plan,
            branch_targets: A::branch_targets,
            branch_targets_into: A::branch_targets_into,
            plan_in: A::plan_in,
            plans_with_image: A::PLANS_WITH_IMAGE,
            stored_pointer: A::stored_pointer,
            go_stack_check: A::go_stack_check,
            go_one_instruction_site: A::go_one_instruction_site,
            go_sp_below_entry: A::go_sp_below_entry,
            plan_at: A::plan_at,
            plan_exits: A::plan_exits,
            plan_to: A::plan_to,
            sdt_argument: A::sdt_argument,
            blocks: A::blocks,
            patch_len: A::PATCH_LEN,
        }
    }

    /// The functions for ELF machine `machine`, if tp knows it.
    pub fn for_machine(machine: u16) -> Option<Isa> {
        [Isa::of::<x86_64::X86_64>(), Isa::of::<aarch64::AArch64>()]
            .into_iter()
            .zip([x86_64::X86_64::ELF_MACHINE, aarch64::AArch64::ELF_MACHINE])
            .find(|(_, m)| *m == machine)
            .map(|(isa, _)| isa)
    }

    /// The host's functions.
    pub fn host() -> Isa {
        Isa::of::<Host>()
    }
}
