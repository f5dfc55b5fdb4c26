//! Probes as tp installs them: the shared data region ([`layout`],
//! [`region`]), code arenas near the probed modules ([`arena`]), the
//! target's threads while sites change ([`threads`]), the two
//! transactions that change a stopped target ([`install`], [`remove`]),
//! static probes' semaphores ([`semaphore`]), the processes forked
//! while probes were in, which hold them too ([`family`]), and whether a
//! target's seccomp filters let the runtime's syscalls run
//! ([`runtime_calls`]), what a thread's hardware shadow stack forbids
//! ([`shadow`]), and the rendezvous with the dynamic linker, where a thread
//! waits for tp ([`rendezvous_wait`]).

pub mod acquire;
pub mod arena;
pub mod family;
pub mod filter;
pub mod frames;
pub mod install;
pub mod orphan;
pub mod region;
pub mod remove;
pub mod rendezvous_wait;
pub mod runtime;
pub mod runtime_calls;
pub mod semaphore;
pub mod shadow;
pub mod step_handoff;
pub mod threads;
pub mod trap;
pub mod validate;

use crate::arch::{Abi, Operands, Refusal, SitePlan};
use crate::symbols::Function;

/// The layout of the shared data region, a module of its own below `arch`
/// (whose detours read it too); here under its old name.
pub use crate::layout;
pub use crate::process::maps::Span;
pub use region::Region;

/// A function to probe, with its patch plan and its module's address span.
#[derive(Debug, Clone)]
pub struct Request {
    /// The function.
    pub function: Function,
    /// Where and how to patch it.
    pub plan: SitePlan,
    /// The long form of the plan ([`crate::arch::Arch::plan_long`]), used
    /// when no arena fits within branch reach of the module; or why it has none.
    pub long: Result<SitePlan, Refusal>,
    /// The addresses of its module (detours must be within branch reach).
    pub span: Span,
    /// What to record: bits of [`layout::kind`].
    pub kind: u32,
    /// The function's calling convention: which registers an entry event records.
    pub abi: Abi,
    /// How far below its stack pointer at entry the function saves the
    /// register holding its return address, where a call leaves it in one
    /// (from the module's call frame information; see
    /// [`crate::arch::DetourSpec::return_saved_below`]).
    pub return_saved_below: Option<u32>,
    /// A static probe's arguments, which its entry events record instead.
    pub operands: Option<Operands>,
    /// A static probe's semaphore (runtime address of a u16 the program
    /// reads to know whether anything traces the probe), if it has one:
    /// incremented while the probe is in.
    pub semaphore: Option<u64>,
    /// What it records beyond its kind: predicates, the argument counted
    /// by, the stack (written to the region before the probe goes live).
    pub config: Config,
    /// For a probe that sees its calls end at the function's exits
    /// ([`layout::kind::AT_EXITS`]): the window at each exit the entry's
    /// window does not hold ([`crate::arch::Arch::plan_exits`]).
    pub exits: Vec<SitePlan>,
    /// For an exit's site (of kind [`layout::kind::EXIT`], made by the
    /// install from [`Request::exits`]): the position of its function's
    /// request among the sites installed together.
    pub parent: Option<usize>,
    /// How far the stack pointer at the entry's site lies below the
    /// function's entry stack pointer ([`crate::arch::DetourSpec::sp_below_entry`]).
    pub sp_below_entry: u32,
    /// Go code without a stack check recording its entries: the detour
    /// checks its goroutine's room first ([`crate::arch::DetourSpec::go_room_lost`]).
    pub go_room: bool,
}

/// A probe's configuration, allocated on its first change: most probes
/// only count, and a request is moved several times during an attach to
/// every function of a large program, so it holds a pointer instead of
/// the configuration's hundreds of bytes (`ProbeConfig`). Reads of one
/// never set give zeros.
#[derive(Debug, Clone, Default)]
pub struct Config(Option<Box<layout::ProbeConfig>>);

/// The configuration of a probe that records nothing beyond its kind.
static NO_CONFIG: std::sync::LazyLock<layout::ProbeConfig> = std::sync::LazyLock::new(Default::default);

impl std::ops::Deref for Config {
    type Target = layout::ProbeConfig;

    fn deref(&self) -> &layout::ProbeConfig {
        self.0.as_deref().unwrap_or(&NO_CONFIG)
    }
}

impl std::ops::DerefMut for Config {
    fn deref_mut(&mut self) -> &mut layout::ProbeConfig {
        self.0.get_or_insert_with(Default::default)
    }
}
