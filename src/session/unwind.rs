//! tp's own probes where a thread starts unwinding its stack, which keep
//! return probes safe: the runtime puts back the return addresses that
//! return probes replaced before the unwinder reads them.

use anyhow::{Result, bail};

use super::resolve;
use crate::addr::RuntimeAddr;
use crate::arch::Abi;
use crate::probe::Request;
use crate::probe::layout::kind;
use crate::probe::region::Region;
use crate::symbols::ProcessModules;

/// Ways a thread starts unwinding its stack, and the functions where tp can
/// see each start. When one of them runs, tp's runtime puts back the return
/// addresses that return probes replaced (runtime.c, tp_unwind), so the
/// unwinder finds the real callers. A way is covered when the unwinder's own
/// entry point, or every one of the language-level starts, is probed.
const UNWIND_PATHS: &[UnwindPath] = &[
    UnwindPath {
        what: "C++ exceptions",
        present_if: "__cxa_throw",
        unwinder: "_Unwind_RaiseException",
        // std::rethrow_exception(std::exception_ptr)
        starts: &["__cxa_throw", "__cxa_rethrow", "_ZSt17rethrow_exceptionNSt15__exception_ptr13exception_ptrE"],
    },
    UnwindPath {
        what: "Rust panics",
        present_if: "*__rust_start_panic",
        unwinder: "_Unwind_RaiseException",
        starts: &["*__rust_start_panic"],
    },
    UnwindPath {
        what: "pthread_exit and thread cancellation",
        present_if: "__pthread_unwind",
        unwinder: "_Unwind_ForcedUnwind",
        starts: &["__pthread_unwind"],
    },
];

/// One way of starting to unwind.
struct UnwindPath {
    /// For messages.
    what: &'static str,
    /// A symbol (glob, as stored) that exists only where this way exists.
    present_if: &'static str,
    /// The unwinder entry point that covers it alone.
    unwinder: &'static str,
    /// The starts (symbols as stored) that cover it together.
    starts: &'static [&'static str],
}

/// The modules tp's unwinder probes may be in: the executable (static
/// runtimes, Rust's std) and the libraries that unwind (libgcc_s,
/// libunwind, libstdc++, libc).
pub(super) fn places(modules: &ProcessModules) -> Vec<usize> {
    (0..modules.len())
        .filter(|&i| {
            let n = modules.name(i);
            i == 0 || ["libgcc_s", "libunwind", "libstdc++", "libc.so"].iter().any(|p| n.starts_with(p))
        })
        .collect()
}

/// tp's own probes where unwinding starts (see [`UNWIND_PATHS`]), shared by
/// every session (owner 0). They are looked for in the executable (static
/// runtimes, Rust's std) and in the libraries that unwind: libgcc_s,
/// libunwind, libstdc++ and libc. Errs when a way of unwinding that exists in
/// the process cannot be covered: a return probe would crash it.
pub(super) fn unwinder_requests(modules: &ProcessModules, region: Option<&Region>) -> Result<Vec<Request>> {
    let places = places(modules);
    let find = |pattern: &str| -> Vec<(usize, crate::symbols::Function)> {
        places
            .iter()
            .filter_map(|&i| Some((i, modules.get(i).ok()?)))
            .flat_map(|(i, m)| m.matching_symbols(pattern).into_iter().map(move |f| (i, f)))
            .collect()
    };
    let already = |addr: RuntimeAddr| {
        region.is_some_and(|r| {
            r.entries().iter().any(|(_, e)| e.state().maybe_patched() && RuntimeAddr(e.function) == addr)
        })
    };
    let mut out: Vec<Request> = Vec::new();
    let mut hooked = |pattern: &str| -> bool {
        let found = find(pattern);
        !found.is_empty()
            && found.into_iter().all(|(i, f)| {
                if already(f.addr) || out.iter().any(|r| r.function.addr == f.addr) {
                    return true;
                }
                let Ok(m) = modules.get(i) else { return false };
                match resolve::plan(m, &f) {
                    Ok(plan) => {
                        let long = resolve::plan_long(m, &f);
                        out.push(Request {
                            span: m.span_of(&f),
                            function: f,
                            plan,
                            long,
                            kind: kind::UNWIND,
                            abi: Abi::C,
                            return_saved_below: None,
                            operands: None,
                            semaphore: None,
                            config: Default::default(),
                            exits: Vec::new(),
                            parent: None,
                            sp_below_entry: 0,
                            go_room: false,
                        });
                        true
                    }
                    Err(_) => false,
                }
            })
    };
    for path in UNWIND_PATHS {
        if find(path.present_if).is_empty() {
            continue;
        }
        if hooked(path.unwinder) {
            continue;
        }
        let missing: Vec<&str> = path.starts.iter().copied().filter(|s| !hooked(s)).collect();
        if !missing.is_empty() {
            bail!(
                "return probes are unsafe in this process: tp cannot probe `{}` (nor `{}`), so {} could unwind \
                 through a probed call and crash it; use --args without --ret",
                missing.join("`, `"),
                path.unwinder,
                path.what
            );
        }
    }
    Ok(out)
}
