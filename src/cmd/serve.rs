//! `tp serve --listen ADDR`: the counts of the probes installed in
//! processes, in the OpenMetrics text format at `http://ADDR/metrics`, read
//! afresh from each process's data region at every scrape (`-p`/`--name`,
//! or every process that holds tp probes).

use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::{Result, anyhow};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::metrics::{answer, bind};
use super::options::which;
use crate::cli::ServeArgs;
use crate::escape::text;
use crate::http;
use crate::output::openmetrics::Series;
use crate::output::openmetrics::series_of;
use crate::session::installed;
use crate::session::interrupt;
use crate::session::targets::Which;

/// Runs `tp serve`.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    interrupt::install();
    let listener = bind(&args.listen, args.listen_any)?;
    let which = which(&args.targets);
    if !which.is_empty() {
        // Name errors (no such process name) now, not at the first scrape.
        which.select()?;
    }
    crate::say!("tp: serving the counts of tp's probes at http://{}/metrics; Ctrl-C to stop", listener.local_addr()?);
    let mut warned: Vec<i32> = Vec::new();
    while !interrupt::interrupted() {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(anyhow!("waiting for connections: {e}")),
        }
        let Ok((stream, _)) = listener.accept() else { continue };
        let _ = stream.set_nonblocking(false);
        let _ = http::serve_one(stream, |req| answer(req, || exposition(&which, &mut warned)));
    }
    crate::say!("tp: stopped serving");
    Ok(ExitCode::SUCCESS)
}

/// The exposition of the probes in the processes `which` names (every
/// process with probes when it names none). A process that cannot be read
/// is left out, and said once on stderr.
fn exposition(which: &Which, warned: &mut Vec<i32>) -> Vec<Series> {
    let pids = if which.is_empty() {
        installed::processes_with_probes()
    } else {
        which.select().map(|s| s.pids).unwrap_or_default()
    };
    let mut series = Vec::new();
    for pid in pids {
        match installed::report(pid) {
            Ok(r) => series.extend(series_of(&r)),
            Err(e) if !warned.contains(&pid) => {
                warned.push(pid);
                crate::say!("tp: process {pid} left out of the metrics: {}", text(&format!("{e:#}")));
            }
            Err(_) => {}
        }
    }
    series
}
