//! A session that asks for functions a process holds probes on already.
//!
//! Kept probes (`--keep`) and those of a session that died belong to no
//! running tp: a new session goes over them (`install::Options::take_over`:
//! its probe's patch replaces theirs, and its entry records theirs as the
//! bytes to put back), records what it asks for (`--args`, `--ret`, ...),
//! and at its end puts the kept probe back and adds the calls it counted to
//! the kept count, which so goes on without a gap. A `--keep` of a function
//! kept already leaves it as it is. Only the probes of a session that is
//! still running are refused: two sessions would own one site.

use std::collections::HashMap;

use anyhow::{Result, bail};

use crate::escape::text;
use crate::probe::Request;
use crate::probe::layout::{Entry, kind};
use crate::probe::region::Region;
use crate::process;

/// True if `owner` is a tp process that is still running (not this one).
pub fn session_is_running(owner: u32) -> bool {
    owner != 0
        && owner != std::process::id()
        && process::status(owner as i32).is_ok_and(|st| st.name == "tp" && st.state != 'Z')
}

/// What a session may do at the sites it asks for.
#[derive(Debug, Default)]
pub struct Vetted {
    /// The requests to install.
    pub requests: Vec<Request>,
    /// The sites among them that hold a kept probe, with the kept entry:
    /// the new probe goes over it.
    pub over: Vec<(u64, u32)>,
    /// Lines to say: the functions `--keep` found kept already.
    pub notes: Vec<String>,
}

/// Sorts `requests` by what `region` (the process's, if it has one) holds
/// at their sites; `keep` is true for `--keep`. Refuses, in one line, a
/// site a running session has probed.
pub fn vet(pid: i32, region: Option<&Region>, requests: Vec<Request>, keep: bool) -> Result<Vetted> {
    let Some(region) = region else { return Ok(Vetted { requests, ..Vetted::default() }) };
    // The probes in, by site (a probe-all asks for thousands).
    let mut at: HashMap<u64, Vec<(u32, Entry)>> = HashMap::new();
    for (i, e) in region.entries().into_iter().filter(|(_, e)| e.state().maybe_patched()) {
        at.entry(e.site).or_default().push((i, e));
    }
    let mut out = Vetted::default();
    for req in requests {
        // tp's own probes are planned with the region in view.
        let here: Vec<&(u32, Entry)> = at.get(&req.plan.site).map(|v| v.iter().collect()).unwrap_or_default();
        if here.is_empty() || req.kind & kind::OWN_ENTRY != 0 {
            out.requests.push(req);
            continue;
        }
        if let Some((_, e)) = here.iter().find(|(_, e)| session_is_running(e.owner)) {
            bail!(
                "`{}` is probed by tp session {} in process {pid}, still running: its counts are there; end that \
                 session first (Ctrl-C, or `kill -INT {}`), or take its probes out with `tp detach -p {pid} --force`",
                text(&req.function.name),
                e.owner,
                e.owner
            );
        }
        if keep && here.iter().any(|(_, e)| e.owner == 0) {
            out.notes.push(format!(
                "tp: `{}` is kept in process {pid} already; its count goes on (`tp status -p {pid}`)",
                text(&req.function.name)
            ));
            continue;
        }
        let &&(top, _) = here.iter().max_by_key(|(i, _)| *i).expect("a probe at the site");
        out.over.push((req.plan.site, top));
        out.requests.push(req);
    }
    Ok(out)
}

/// At the end of a session that went over kept probes: adds the calls each
/// of its probes counted (`counted`, by its entry) to the kept probe it
/// went over, if that is still in (the session's removal put it back).
pub fn give_back_counts(region: &Region, over: &[(u32, u32)], counted: impl Fn(u32) -> u64) {
    for &(mine, kept) in over {
        if region.state(kept).maybe_patched() {
            region.add_hits(kept, counted(mine));
        }
    }
}
