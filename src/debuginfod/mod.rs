//! Debug information by build-id from debuginfod servers: the servers
//! `DEBUGINFOD_URLS` names (space-separated, as gdb, perf and bpftrace read
//! it), asked in order for `/buildid/<hex>/debuginfo` over plain HTTP
//! ([`client`]); each answer kept in the user's cache ([`cache`]) once the
//! caller found it to be the debug file asked for.
//!
//! `DEBUGINFOD_TIMEOUT` (seconds, default 90) bounds each connect and each
//! read, `DEBUGINFOD_MAXTIME` (seconds) a whole download, and
//! `DEBUGINFOD_MAXSIZE` (bytes) its size, as elfutils' client reads them.
//! An `https://` server is passed over with one line: tp has no TLS. A
//! server that fails (refused, timed out, a bad answer) is said once and not
//! asked again by this tp.

pub mod cache;
pub mod client;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cache::Cache;
use client::{Got, Limits, Url};

use crate::escape::text;
use crate::progress::Progress;

/// The largest debug file tp downloads.
pub const MAX_BODY: u64 = 4 << 30;

/// Servers that failed (or that tp cannot speak to), said once each.
static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says `line` once per tp.
fn say_once(key: &str, line: impl FnOnce() -> String) {
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|k| k == key) {
        said.push(key.to_string());
        crate::say!("tp: {}", text(&line()));
    }
}

fn failed(url: &str) -> bool {
    SAID.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|k| k == url)
}

/// The servers `DEBUGINFOD_URLS` names, those tp can speak to.
pub fn servers() -> Vec<Url> {
    servers_saying(true)
}

/// [`servers`], saying why one is not used if `say`.
fn servers_saying(say: bool) -> Vec<Url> {
    let Some(urls) = std::env::var_os("DEBUGINFOD_URLS") else { return Vec::new() };
    let urls = urls.to_string_lossy().into_owned();
    urls.split_ascii_whitespace()
        .filter_map(|u| match Url::parse(u) {
            Ok(url) => Some(url),
            Err(why) => {
                if say {
                    say_once(u, || format!("debuginfod server `{u}` not used: {why}"));
                }
                None
            }
        })
        .collect()
}

fn seconds(var: &str) -> Option<Duration> {
    let v: f64 = std::env::var(var).ok()?.trim().parse().ok()?;
    Duration::try_from_secs_f64(v).ok().filter(|d| !d.is_zero())
}

/// The name the debug file with build-id `id` has in the cache.
fn kept_name(id: &[u8]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.debug")
}

/// True once a server failed, or sent a file that was not the one asked
/// for, in this tp: a module it found no debug file for may have one.
static UNSURE: AtomicBool = AtomicBool::new(false);

/// True if a server failed, or sent a file that was not the one asked for,
/// during this tp: that no server has a module's debug file is then not
/// known.
pub fn unsure() -> bool {
    UNSURE.load(Ordering::Relaxed)
}

/// What decides the debug file [`fetch`] finds for build-id `id`, if
/// `DEBUGINFOD_URLS` names a server tp asks (else None: tp asks none, and
/// uses nothing it kept): the servers, in order, and where the file is kept
/// once a server sent it.
pub fn asked(id: &[u8]) -> Option<(String, std::path::PathBuf)> {
    // Quietly: a server tp cannot use is said when tp would ask it.
    let servers = servers_saying(false);
    if id.is_empty() || servers.is_empty() {
        return None;
    }
    let names = servers.iter().map(Url::text).collect::<Vec<_>>().join(" ");
    Some((names, cache::base()?.join("tp").join("debuginfod").join(kept_name(id))))
}

/// The debug file with build-id `id`, for the module `what` (for
/// messages), from the cache or a server: the first `accept` takes (the
/// caller parses it and checks it is the ELF file with that build-id;
/// `bytes` gives its bytes back, for the cache). None if no server has it.
pub fn fetch<T>(
    id: &[u8],
    what: &str,
    accept: &dyn Fn(Vec<u8>) -> Result<T, String>,
    bytes: &dyn Fn(&T) -> &[u8],
) -> Option<T> {
    let servers = servers();
    if servers.is_empty() || id.is_empty() {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let name = kept_name(id);
    let cache = match Cache::open() {
        Ok(c) => Some(c),
        Err(why) => {
            say_once("cache", || why);
            None
        }
    };
    if let Some(c) = &cache
        && let Some(data) = c.get(&name)
    {
        match accept(data) {
            Ok(file) => return Some(file),
            Err(_) => c.remove(&name),
        }
    }
    let timeout = seconds("DEBUGINFOD_TIMEOUT").unwrap_or(Duration::from_secs(90));
    let max_body = std::env::var("DEBUGINFOD_MAXSIZE").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(MAX_BODY);
    for server in servers {
        let key = server.text();
        if failed(&key) {
            UNSURE.store(true, Ordering::Relaxed);
            continue;
        }
        let url = server.join(&format!("buildid/{hex}/debuginfo"));
        let mut data = Vec::new();
        let progress = std::cell::RefCell::new(Progress::bytes(0, ""));
        let label = format!("debug info of {what}");
        let (mut on_size, mut on_bytes) =
            (|n: u64| *progress.borrow_mut() = Progress::bytes(n, &label), |n: u64| progress.borrow().inc_by(n));
        let mut limits = Limits {
            timeout,
            deadline: seconds("DEBUGINFOD_MAXTIME").map(|d| Instant::now() + d),
            max_body: max_body.min(MAX_BODY),
            on_size: &mut on_size,
            on_bytes: &mut on_bytes,
        };
        let got = client::get(&url, &mut data, &mut limits);
        progress.borrow().finish();
        match got {
            Ok(Got::Body(_)) => {}
            Ok(Got::NotFound) => continue,
            Err(why) => {
                UNSURE.store(true, Ordering::Relaxed);
                say_once(&key, || format!("debuginfod server {key}: {why}; not asked again"));
                continue;
            }
        }
        let size = data.len();
        let file = match accept(data) {
            Ok(file) => file,
            Err(why) => {
                UNSURE.store(true, Ordering::Relaxed);
                crate::say!(
                    "tp: debuginfod server {}: the file it sent for `{}` is not its debug file: {}",
                    text(&key),
                    text(what),
                    text(&why)
                );
                continue;
            }
        };
        crate::say!("tp: the debug file of `{}` came from {} ({} KiB)", text(what), text(&key), size.div_ceil(1024));
        if let Some(c) = &cache {
            keep(c, &name, bytes(&file));
        }
        return Some(file);
    }
    None
}

/// Writes `data` into the cache as `name`: to a temporary file, renamed
/// once whole.
fn keep(cache: &Cache, name: &str, data: &[u8]) {
    use std::io::Write;
    let kept = cache.temp().and_then(|(mut f, temp)| {
        let written = f.write_all(data).and_then(|_| f.sync_all());
        drop(f);
        match written {
            Ok(()) => cache.commit(&temp, name),
            Err(e) => {
                cache.remove(&temp);
                Err(format!("cannot write into `{}`: {e}", cache.path.display()))
            }
        }
    });
    if let Err(why) = kept {
        say_once("cache-write", || why);
    }
}
