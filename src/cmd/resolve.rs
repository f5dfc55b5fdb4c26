//! From what the user named (`-f` patterns, `--addr` addresses) to planned
//! probe requests, before anything in the target is stopped.

use anyhow::{Result, bail};

use crate::arch::{Arch, Host, Refusal};
use crate::output::progress::Progress;
use crate::probe::Request;
use crate::symbols::{Found, Function, ProcessModules};

/// The outcome of resolving and planning.
#[derive(Debug)]
pub struct Resolved {
    /// Functions that will be probed.
    pub requests: Vec<Request>,
    /// Functions a glob matched that cannot be probed, with the reason.
    pub refused: Vec<(Function, Refusal)>,
}

/// Resolves `patterns` and `addrs` in `modules` and plans each function.
/// A function named exactly that cannot be probed is an error; one matched
/// by a glob is skipped and reported in [`Resolved::refused`].
pub fn requests(modules: &ProcessModules, patterns: &[String], addrs: &[u64]) -> Result<Resolved> {
    let mut found = modules.resolve(patterns)?;
    for &a in addrs {
        let f = modules.at_address(a)?;
        if !found.iter().any(|x| x.function.addr == f.function.addr) {
            found.push(f);
        }
    }
    let progress = Progress::new(found.len() as u64, "planning probes");
    let mut requests = Vec::new();
    let mut refused = Vec::new();
    for Found { module, function, explicit } in found {
        progress.inc();
        let m = modules.get(module)?;
        let verdict = if function.ifunc {
            Err(Refusal::Unsupported("an IFUNC symbol: its address is the resolver, not the implementation"))
        } else if function.size == 0 {
            Err(Refusal::Unsupported("its symbol has no size, so tp cannot check its code"))
        } else {
            let code = m.code_of(&function)?;
            let extra = m.extra_targets(&function);
            Host::plan(code, function.addr, &extra).map(|plan| (plan, Host::plan_long(code, function.addr, &extra)))
        };
        match verdict {
            Ok((plan, long)) => requests.push(Request { function, plan, long, span: m.span }),
            Err(r) if explicit => bail!("cannot probe `{}`: {r}", function.name),
            Err(r) => refused.push((function, r)),
        }
    }
    progress.finish();
    if requests.is_empty() {
        match refused.first() {
            Some((f, r)) => bail!(
                "nothing to probe: the {} functions matched cannot be probed (e.g. `{}`: {r})",
                refused.len(),
                f.name
            ),
            None => bail!("nothing to probe"),
        }
    }
    Ok(Resolved { requests, refused })
}
