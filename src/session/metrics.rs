//! The server of `/metrics`: `tp serve`'s ([`serve_installed`]), which
//! reads the counts of the probes installed in processes afresh at every
//! scrape, and the one a session's `--listen` starts (`tp attach`, `tp
//! run`: [`start_session_server`]), which serves what the session
//! publishes: its counts and, where it times calls, latency histograms.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::group::Published;
use super::installed;
use super::interrupt;
use super::targets::Which;
use crate::escape::text;
use crate::http::{self, Request, Response};
use crate::notes::Notes;
use crate::output::openmetrics::series_of;
use crate::output::openmetrics::{Series, content_type, negotiate, render};

/// The answer to `req`: the exposition of `series()` at /metrics, in the
/// format the scrape asks for.
fn answer(req: &Request, series: impl FnOnce() -> Vec<Series>) -> Response {
    match req.path.as_str() {
        "/metrics" => {
            let format = negotiate(req.accept.as_deref());
            Response { status: (200, "OK"), content_type: content_type(format), body: render(&series(), format) }
        }
        "/" => Response::text((200, "OK"), "tp: the metrics are at /metrics"),
        _ => Response::text((404, "Not Found"), "not found; the metrics are at /metrics"),
    }
}

/// A listener on `addr` (loopback only unless `any`), non-blocking.
fn bind(addr: &str, any: bool) -> Result<TcpListener> {
    let addrs = http::check_listen(addr, any).map_err(|e| anyhow!(e))?;
    let listener = TcpListener::bind(&addrs[..]).with_context(|| format!("cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Starts the server a session's `--listen` asks for, on a thread of its
/// own: it answers each scrape with the text the session last published.
pub fn start_session_server(notes: &dyn Notes, addr: &str, any: bool) -> Result<Published> {
    let listener = bind(addr, any)?;
    listener.set_nonblocking(false)?;
    let published: Published = Arc::new(Mutex::new(Vec::new()));
    let shared = published.clone();
    crate::note!(notes, "tp: serving this session's metrics at http://{}/metrics", listener.local_addr()?);
    std::thread::Builder::new().name("tp-metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream): std::io::Result<TcpStream> = stream else { continue };
            let body = || shared.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let _ = http::serve_one(stream, |req| answer(req, body));
        }
    })?;
    Ok(published)
}

/// `tp serve`: listens on `addr` (loopback only unless `any`) and answers
/// every scrape with the counts of the probes in the processes `which`
/// names (every process that holds tp probes when it names none), read
/// afresh from each process's data region, until a signal.
pub fn serve_installed(notes: &dyn Notes, addr: &str, any: bool, which: &Which) -> Result<()> {
    interrupt::install();
    let listener = bind(addr, any)?;
    if !which.is_empty() {
        // Name errors (no such process name) now, not at the first scrape.
        which.select()?;
    }
    crate::note!(
        notes,
        "tp: serving the counts of tp's probes at http://{}/metrics; Ctrl-C to stop",
        listener.local_addr()?
    );
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
        let _ = http::serve_one(stream, |req| answer(req, || exposition(notes, which, &mut warned)));
    }
    crate::note!(notes, "tp: stopped serving");
    Ok(())
}

/// The exposition of the probes in the processes `which` names (every
/// process with probes when it names none). A process that cannot be read
/// is left out, and said once in `notes`.
fn exposition(notes: &dyn Notes, which: &Which, warned: &mut Vec<i32>) -> Vec<Series> {
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
                crate::note!(notes, "tp: process {pid} left out of the metrics: {}", text(&format!("{e:#}")));
            }
            Err(_) => {}
        }
    }
    series
}
