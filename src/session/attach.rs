//! `tp attach`'s session: the processes named (`-p`, `--name`) and those
//! running a file (`--exe`, and each that starts running it), attached one
//! after another as one [`Group`], observed until Ctrl-C, the duration or
//! their end, restored, and summed up; or, with `--keep`, left probed.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use super::exe::ExeFile;
use super::group::{Behaviour, Group};
use super::targets::{Selected, Which};
use super::{Options, metrics, results};
use crate::output::sink::Sink;

/// Probes what `opts` selects in the processes `which` names and in those
/// that run `exe`, and runs the session: its exit status is
/// [`super::exit_status`]'s.
pub fn run(opts: Options, which: &Which, exe: Option<&Path>) -> Result<u8> {
    let notes = opts.notes.clone();
    let exe = exe.map(ExeFile::open).transpose()?;
    if which.is_empty() && exe.is_none() {
        bail!("name the processes to attach to with -p PID (repeat, or a comma list), --name NAME or --exe PATH");
    }
    let mut selected = match which.is_empty() {
        true => Selected { pids: Vec::new(), by_name: None },
        false => which.select()?,
    };
    let mut exe_line = None;
    if let Some(exe) = &exe {
        let running = exe.processes();
        exe_line = Some(format!(
            "tp: --exe {}: {} process{} run{} it now{}; tp probes each that starts (Ctrl-C to stop)",
            crate::escape::text(&exe.path.display().to_string()),
            running.len(),
            if running.len() == 1 { "" } else { "es" },
            if running.len() == 1 { "s" } else { "" },
            match running.is_empty() {
                true => String::new(),
                false => format!(" ({})", running.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")),
            }
        ));
        for p in running {
            if !selected.pids.contains(&p) {
                selected.pids.push(p);
            }
        }
    }
    if let (Some(n), Some(name)) = (selected.by_name, &which.name) {
        crate::note!(
            notes,
            "tp: --name {} matched {n} process{}: {}",
            crate::escape::text(name),
            if n == 1 { "" } else { "es" },
            selected.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    // Every process must exist before any is touched.
    for &pid in &selected.pids {
        crate::process::check_attachable(pid)?;
    }
    let several = selected.pids.len() > 1 || which.name.is_some() || exe.is_some();
    let published = match &opts.listen {
        Some(l) if !opts.keep => Some(metrics::start_session_server(&*notes, &l.addr, l.any)?),
        _ => None,
    };
    let output = results::open(&opts, Sink::stdout(), several)?;
    let how =
        Behaviour { several, check_every: Duration::from_millis(100), live: true, announce: true, command: "attach" };
    let duration = opts.duration;
    let keep = opts.keep;
    let mut group = Group::new(opts, output, how);
    if let Some(p) = published {
        group.publish(p);
    }
    if let Some(exe) = exe {
        // Listening before the running ones are probed: none that starts
        // meanwhile is missed.
        group.follow_exe(exe)?;
    }
    if let Some(line) = exe_line {
        crate::note!(notes, "{line}");
    }
    // One after another, each with its own stop; an error restores those
    // attached already (the group's guard) and is the one line.
    for &pid in &selected.pids {
        group.attach(pid)?;
    }
    if keep {
        std::mem::forget(group);
        return Ok(0);
    }
    let why = group.observe(duration)?;
    let reports = group.detach(why)?;
    group.write_reports(&reports)?;
    Ok(super::exit_status(group.killed_by()))
}
