//! How a probe that times calls (`--ret`, `tp profile`) sees each call end:
//! at the function's own exits (its returns and the jumps out of it, each
//! patched with a window of its own: nothing on the stack changes), or,
//! where some exit has no window, by replacing the call's return address
//! with a trampoline, which every stack walker then sees.
//!
//! Exits are the default wherever every exit has a window. A function with
//! an exit tp cannot patch keeps the return-address form in plain native
//! code, where that form is exact; in a process whose runtime reads return
//! addresses (the JVM's, LuaJIT's error unwinding) it takes the exits that
//! have windows, and a call that leaves by another is counted as unwound.
//! Go code takes its exits only: Go's runtime checks every return address
//! on goroutine stacks. `TP_RETURNS` (`exits`, `stack`) forces one form for
//! other code, for the tests.

use crate::arch::host_isa;
use crate::arch::{Refusal, ShadowStack, SitePlan};
use crate::escape as text;
use crate::probe::layout::kind;
use crate::symbols::verdict;
use crate::symbols::{Function, Module, ProcessModules};

/// Which form a session's return probes take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forms {
    /// Exits wherever every exit has a window; else the return address,
    /// unless the process's runtime reads return addresses (`partial`):
    /// then the exits that have windows.
    Auto {
        /// The process runs code that reads return addresses.
        partial: bool,
    },
    /// Always at the exits that have windows.
    Exits,
    /// Always the return address.
    Stack,
    /// Go code: at the exits that have windows, never the return address
    /// (Go's runtime checks every return address on goroutine stacks).
    Go,
}

impl Forms {
    /// The forms for a process with `modules`, as `TP_RETURNS` may force them.
    pub fn of(modules: &ProcessModules) -> Forms {
        match std::env::var("TP_RETURNS").ok().as_deref() {
            Some("exits") => Forms::Exits,
            Some("stack") => Forms::Stack,
            _ => Forms::Auto { partial: (0..modules.len()).any(|i| reads_return_addresses(&modules.name(i))) },
        }
    }
}

/// True for a module whose code reads the return addresses on its threads'
/// stacks: HotSpot (`libjvm.so`: its stack walks take the return address
/// below the last Java frame) and LuaJIT (errors unwind through the system
/// unwinder with a personality of its own, past frames tp's unwinder
/// probes do not see).
fn reads_return_addresses(module: &str) -> bool {
    module.starts_with("libjvm.so") || module.starts_with("libluajit") || module.starts_with("luajit")
}

/// What a timed probe of `f` of `m` (entry window `plan`, recording
/// `records`) becomes: its kind, with [`kind::AT_EXITS`] where its calls
/// are seen to end at the function's exits, and those exits' windows; and
/// a note on what it could not do there, for the line tp prints. An exit
/// right after the entry's window that has no window of its own may join
/// the entry's, which `plan` then becomes ([`verdict::exits_widening`]).
/// Where a thread runs with a hardware shadow stack (`shadow`), which
/// rejects a rewritten return address, only exits will do: the function is
/// refused if they cannot all be found.
pub fn choose(
    m: &Module,
    f: &Function,
    plan: &mut SitePlan,
    records: u32,
    forms: Forms,
    shadow: Option<(i32, ShadowStack)>,
) -> Result<Chosen, Refusal> {
    let returns_only = |records| Ok((records, Vec::new(), None));
    if records & (kind::RET | kind::SAMPLE) == 0 || plan.interior {
        return returns_only(records);
    }
    let forms = match (shadow, forms) {
        (_, Forms::Go) => Forms::Go,
        (Some(_), _) => Forms::Exits,
        (None, Forms::Stack) => return returns_only(records),
        (None, forms) => forms,
    };
    let no_exits = || match shadow {
        _ if forms == Forms::Go => Err(Refusal::GoReturns),
        Some((tid, stack)) => Err(Refusal::ShadowStack { tid, stack, why: REWRITTEN }),
        None => Ok(()),
    };
    let exits = match verdict::exits_widening(m, f, plan, host_isa()) {
        Ok(exits) => exits,
        // An architecture without exit windows: the return address, as ever.
        Err(Refusal::Unsupported(_)) => {
            no_exits()?;
            return returns_only(records);
        }
        Err(why) => {
            no_exits()?;
            let note = Note { function: f.name.clone(), why: format!("its exits cannot all be found: {why}") };
            return Ok(match forms {
                Forms::Auto { partial: false } => (records, Vec::new(), Some(note)),
                _ => (records | kind::AT_EXITS, Vec::new(), Some(note)),
            });
        }
    };
    let missing = exits.iter().find_map(|e| {
        let why = e.plan.as_ref().err()?;
        let off = e.at.wrapping_sub(f.addr.0);
        Some(Note { function: f.name.clone(), why: format!("the exit at {}+{off:#x}: {why}", f.name) })
    });
    let windows: Vec<SitePlan> = exits.into_iter().filter_map(|e| e.plan.ok()).collect();
    Ok(match (missing, forms) {
        (None, _) => (records | kind::AT_EXITS, windows, None),
        (Some(note), Forms::Auto { partial: false }) => (records, Vec::new(), Some(note)),
        (Some(note), _) => (records | kind::AT_EXITS, windows, Some(note)),
    })
}

/// What [`choose`] decides: the probe's kind, its exits' windows, and a
/// note on what it could not do.
pub type Chosen = (u32, Vec<SitePlan>, Option<Note>);

/// Why a shadow stack refuses a return probe that cannot use exits.
const REWRITTEN: &str = "its exits cannot all be found, and the shadow stack rejects a rewritten return address";

/// Why a function's calls are not all seen to end at its exits.
#[derive(Debug, Clone)]
pub struct Note {
    /// The function.
    pub function: String,
    /// The exit tp could not patch, and why.
    pub why: String,
}

/// The lines that say which functions took which form short of every exit,
/// from the notes of [`choose`] and the kinds the probes took.
pub fn lines(notes: &[(Note, u32)]) -> Vec<String> {
    let example = |n: &Note| format!("`{}`: {}", text::text(&n.function), text::text(&n.why));
    let count = |n: usize| if n == 1 { "1 function".to_string() } else { format!("{n} functions") };
    let mut out = Vec::new();
    for (at_exits, what) in [
        (false, "time their calls through the return address (the stack shows tp's trampoline until a call returns)"),
        (true, "count the calls that leave by an exit without a window as unwound, not timed"),
    ] {
        let these: Vec<&Note> =
            notes.iter().filter(|(_, k)| (k & kind::AT_EXITS != 0) == at_exits).map(|(n, _)| n).collect();
        if let Some(first) = these.first() {
            out.push(format!("tp: {} {what}; e.g. {}", count(these.len()), example(first)));
        }
    }
    out
}
