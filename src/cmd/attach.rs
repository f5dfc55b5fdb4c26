//! `tp attach`: probe functions of running processes (`-p`, repeated or a
//! comma list, and `--name`), show live counts (and events, with
//! `--args`/`--ret`), and on Ctrl-C, `--duration` or the targets' exit,
//! restore the code and print a summary (per process and in total when
//! there are several). With `--keep`, install and exit instead; with
//! `--listen`, serve the session's metrics over HTTP meanwhile.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};

use super::metrics;
use super::options::{CommandLine, which};
use crate::cli::AttachArgs;
use crate::output::sink::Sink;
use crate::session::exe::ExeFile;
use crate::session::group::{Behaviour, Group};
use crate::session::targets::Selected;
use crate::session::{Options, interrupt, results};

/// Runs `tp attach`.
pub fn run(args: AttachArgs) -> Result<ExitCode> {
    interrupt::install();
    // The command line first: a format that cannot be, before any process is looked at.
    let opts = Options::from_cli(CommandLine::Attach(&args))?;
    let which = which(&args.targets);
    let exe = args.exe.as_deref().map(ExeFile::open).transpose()?;
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
    if let (Some(n), Some(name)) = (selected.by_name, &args.targets.name) {
        crate::say!(
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
    let several = selected.pids.len() > 1 || args.targets.name.is_some() || exe.is_some();
    let published = match &args.probe.listen {
        Some(addr) if !opts.keep => Some(metrics::start_session_server(addr, args.probe.listen_any)?),
        _ => None,
    };
    let output = results::open(&opts, Sink::stdout(), several)?;
    let how = Behaviour {
        several,
        follow_exec: args.probe.follow_exec,
        check_every: Duration::from_millis(100),
        live: true,
        announce: true,
        command: "attach",
    };
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
        crate::say!("{line}");
    }
    // One after another, each with its own stop; an error restores those
    // attached already (the group's guard) and is the one line.
    for &pid in &selected.pids {
        group.attach(pid)?;
    }
    if keep {
        std::mem::forget(group);
        return Ok(ExitCode::SUCCESS);
    }
    let why = group.observe(duration)?;
    let reports = group.detach(why)?;
    group.write_reports(&reports)?;
    Ok(ExitCode::SUCCESS)
}
