//! The server of `/metrics` that commands share: `tp serve`'s, and the one
//! a session's `--listen` starts (`tp attach`, `tp run`), which serves what
//! the session publishes: its counts and, where it times calls, latency
//! histograms.

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};

use crate::http::{self, Request, Response};
use crate::output::openmetrics::{Series, content_type, negotiate, render};
use crate::session::group::Published;

/// The answer to `req`: the exposition of `series()` at /metrics, in the
/// format the scrape asks for.
pub fn answer(req: &Request, series: impl FnOnce() -> Vec<Series>) -> Response {
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
pub fn bind(addr: &str, any: bool) -> Result<TcpListener> {
    let addrs = http::check_listen(addr, any).map_err(|e| anyhow!(e))?;
    let listener = TcpListener::bind(&addrs[..]).with_context(|| format!("cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Starts the server a session's `--listen` asks for, on a thread of its
/// own: it answers each scrape with the text the session last published.
pub fn start_session_server(addr: &str, any: bool) -> Result<Published> {
    let listener = bind(addr, any)?;
    listener.set_nonblocking(false)?;
    let published: Published = Arc::new(Mutex::new(Vec::new()));
    let shared = published.clone();
    crate::say!("tp: serving this session's metrics at http://{}/metrics", listener.local_addr()?);
    std::thread::Builder::new().name("tp-metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream): std::io::Result<TcpStream> = stream else { continue };
            let body = || shared.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let _ = http::serve_one(stream, |req| answer(req, body));
        }
    })?;
    Ok(published)
}
