//! tp's own probe at the dynamic linker's rendezvous, which probes a
//! library before its first call.
//!
//! The dynamic linker calls `_dl_debug_state` (the address debuggers find
//! in `_r_debug.r_brk`) after it maps a library and its dependencies, and
//! before it relocates them and runs their initializers; and before and
//! after it unmaps one. While a session waits for libraries, tp probes that
//! function (glibc's and musl's loaders both define it): its detour calls
//! the runtime's `tp_rendezvous`, where the thread wakes tp and waits,
//! bounded ([`crate::probe::rendezvous_wait`]), until tp has read the new
//! modules, installed what the waiting patterns match there, and released
//! it. If tp dies or stalls, the thread goes on after the bound, and later
//! rendezvous do not wait until tp arms it again.
//!
//! A program without a dynamic loader (static) has no rendezvous: there
//! tp finds libraries by polling, as everywhere the rendezvous is missing.

use std::time::Duration;

use crate::arch::Abi;
use crate::notes::Notes;
use crate::probe::Request;
use crate::probe::layout::kind;
use crate::probe::runtime_calls;
use crate::process::{self, seccomp};
use crate::symbols::{Found, ProcessModules};

use super::follow::Follow;
use super::resolve;

/// The loader's function the rendezvous calls.
const DEBUG_STATE: &str = "_dl_debug_state";

/// `AT_BASE`: where the kernel mapped the program's interpreter.
const AT_BASE: u64 = 7;

/// tp's own probes for a session over process `pid` (whose modules are
/// `modules`) whose patterns `follow` may wait for libraries, beside the
/// user's probes on `found`: the rendezvous, if some pattern waits and the
/// process has one; else nothing, and a line to `notes` that says
/// libraries are looked for every `check_every`.
pub fn own_probes(
    notes: &dyn Notes,
    pid: i32,
    modules: &ProcessModules,
    follow: &Follow,
    found: &[Found],
    check_every: Duration,
) -> Vec<Request> {
    if !follow.watching() {
        return Vec::new();
    }
    let not_the_users = |r: Request| match found.iter().any(|f| f.function.addr == r.function.addr) {
        true => Err(format!("`{DEBUG_STATE}` is among the functions to probe")),
        false => Ok(r),
    };
    match filters_allow(pid).and_then(|()| request(pid, modules)).and_then(not_the_users) {
        Ok(r) => vec![r],
        Err(why) => {
            crate::note!(
                notes,
                "tp: process {pid}: no rendezvous with the dynamic linker: {why}; tp looks for libraries it loads \
                 every {} ms, and their first calls may not be counted",
                check_every.as_millis()
            );
            Vec::new()
        }
    }
}

/// Why process `pid` (whose modules are `modules`) has no rendezvous tp
/// can probe, as the end of a sentence; None if it has one.
pub fn missing(pid: i32, modules: &ProcessModules) -> Option<String> {
    filters_allow(pid).and_then(|()| request(pid, modules)).err()
}

/// The address of `r_state` in process `pid`'s dynamic loader's `struct
/// r_debug` (`r_version`, `r_map`, `r_brk`, `r_state`, each a word apart;
/// musl's `struct debug` is laid out alike), if the loader's symbols say
/// where it is and its `r_brk` names `brk`, the function tp probes: glibc
/// names it `_r_debug`; musl keeps a pointer to it in `_dl_debug_addr`.
pub fn state_word(pid: i32, modules: &ProcessModules, brk: u64) -> Option<u64> {
    let i = modules.index_containing(brk)?;
    let m = modules.get(i).ok()?;
    let f = m.matching_symbols(DEBUG_STATE).into_iter().next()?;
    let mem = crate::process::memory::Memory::open(pid).ok()?;
    let r_debug = match m.data_symbol("_r_debug") {
        Some(at) => f.bias.runtime(at).0,
        None => mem.read_u64(f.bias.runtime(m.data_symbol("_dl_debug_addr")?).0).ok()?,
    };
    let word = std::mem::size_of::<u64>() as u64;
    (mem.read_u64(r_debug.checked_add(2 * word)?).ok()? == brk).then_some(r_debug + 3 * word)
}

/// Whether every thread of process `pid` lets the runtime make its calls
/// at the rendezvous (futex, `kill(tp, 0)`): a thread without a seccomp
/// filter does; one with filters only if tp can read them (a stopped
/// thread: `tp run`'s held main thread) and they do.
fn filters_allow(pid: i32) -> Result<(), String> {
    let refused = "a seccomp filter may refuse the calls tp's runtime makes there";
    for tid in process::threads(pid).map_err(|e| format!("cannot list its threads: {e}"))? {
        if seccomp::mode_of(pid, tid) == Some(0) {
            continue;
        }
        let filters = seccomp::Filters::read(pid, tid).map_err(|_| refused)?;
        if runtime_calls::refusal(&filters, kind::RENDEZVOUS, pid, tid.as_raw()).is_some() {
            return Err(refused.into());
        }
    }
    Ok(())
}

/// tp's probe at the rendezvous of process `pid` (whose modules are
/// `modules`), or why there is none, as the end of a sentence.
pub fn request(pid: i32, modules: &ProcessModules) -> Result<Request, String> {
    let base = process::auxv(pid, AT_BASE).filter(|&b| b != 0).ok_or("it has no dynamic loader (a static program)")?;
    let i = modules.index_containing(base).ok_or("its dynamic loader is not among its modules")?;
    let name = modules.name(i);
    let m = modules.get(i).map_err(|e| format!("cannot read its dynamic loader {name}: {e:#}"))?;
    let f = m
        .matching_symbols(DEBUG_STATE)
        .into_iter()
        .next()
        .ok_or_else(|| format!("its dynamic loader {name} has no `{DEBUG_STATE}`"))?;
    let plan = resolve::plan(m, &f).map_err(|r| format!("cannot probe `{DEBUG_STATE}` in {name}: {r}"))?;
    Ok(Request {
        span: m.span_of(&f),
        long: resolve::plan_long(m, &f),
        function: f,
        plan,
        kind: kind::RENDEZVOUS,
        abi: Abi::C,
        return_saved_below: None,
        operands: None,
        semaphore: None,
        config: Default::default(),
        exits: Vec::new(),
        parent: None,
        sp_below_entry: 0,
        go_room: false,
    })
}
