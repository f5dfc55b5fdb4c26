//! The HTTP/1.1 client side of debuginfod, on std::net alone: one GET per
//! connection (`Connection: close`), the answer's head read into a bounded
//! buffer and parsed strictly, the body read as its `Content-Length` or
//! `Transfer-Encoding: chunked` says (or to the end of the connection),
//! never more than the caller's limit, each read within the timeout.
//! Redirects to `http://` are followed (at most [`MAX_REDIRECTS`]).
//!
//! What a server sends is untrusted: every size is checked, nothing is
//! allocated from a number the server chose, a malformed answer is an error
//! (`tests/fuzz/fuzz_targets/http_response.rs` feeds it anything).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest answer head tp reads.
pub const MAX_HEAD: usize = 16 * 1024;
/// Redirects followed.
pub const MAX_REDIRECTS: usize = 3;

/// A server's address: `http://host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// The host as written (a name, an IPv4 address, or `[v6]`).
    pub host: String,
    /// The port (80 when not written).
    pub port: u16,
    /// The path, `/` when none.
    pub path: String,
}

impl Url {
    /// Parses an `http://` URL; `https://` and anything else are errors.
    pub fn parse(text: &str) -> Result<Url, String> {
        if text.starts_with("https://") {
            return Err("https:// is not supported (tp speaks plain http://)".into());
        }
        let rest = text.strip_prefix("http://").ok_or("not an http:// URL")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err("no host, or a user name in it".into());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').ok_or("an IPv6 address without `]`")?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| "a bad port")?,
                None if after.is_empty() => 80,
                None => return Err("junk after the IPv6 address".into()),
            };
            (format!("[{addr}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| "a bad port")?),
                None => (authority.to_string(), 80),
            }
        };
        if path.bytes().any(|b| b.is_ascii_control() || b == b' ') || host.bytes().any(|b| b.is_ascii_control()) {
            return Err("control characters or spaces in it".into());
        }
        Ok(Url { host, port, path: path.to_string() })
    }

    /// This server's `path` (the prefix and then `tail`, with one `/` between).
    pub fn join(&self, tail: &str) -> Url {
        let path = format!("{}/{}", self.path.trim_end_matches('/'), tail.trim_start_matches('/'));
        Url { path, ..self.clone() }
    }

    /// `http://host:port/path`, for messages.
    pub fn text(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// An answer's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// `Content-Length`, if given.
    pub length: Option<u64>,
    /// True for `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// `Location`, if given.
    pub location: Option<String>,
}

/// Parses an answer head (everything before the blank line).
pub fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the answer's head is not text")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(format!("not an HTTP/1.x answer: `{}`", status_line.chars().take(40).collect::<String>()));
    }
    let status: u16 = parts
        .next()
        .filter(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or("a status line without a status code")?;
    let mut out = Head { status, length: None, chunked: false, location: None };
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or("a header line without `:`")?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let n = value.parse::<u64>().map_err(|_| "a bad Content-Length")?;
                if out.length.is_some_and(|m| m != n) {
                    return Err("two different Content-Lengths".into());
                }
                out.length = Some(n);
            }
            "transfer-encoding" => {
                let last = value.rsplit(',').next().unwrap_or("").trim();
                if !last.eq_ignore_ascii_case("chunked") {
                    return Err(format!("a transfer encoding tp does not read: `{value}`"));
                }
                out.chunked = true;
            }
            "location" => out.location = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(out)
}

/// What a GET got.
#[derive(Debug)]
pub enum Got {
    /// 200: the body was written to the sink; this many bytes.
    Body(u64),
    /// 404.
    NotFound,
}

/// Limits and reports of one GET.
pub struct Limits<'a> {
    /// The longest any connect or read may wait.
    pub timeout: Duration,
    /// When the whole transfer must have ended, if ever.
    pub deadline: Option<Instant>,
    /// The most body bytes taken.
    pub max_body: u64,
    /// Called with the body's size when known, before it is read.
    pub on_size: &'a mut dyn FnMut(u64),
    /// Called with each piece of the body read.
    pub on_bytes: &'a mut dyn FnMut(u64),
}

/// GETs `url`, following redirects, and writes the body into `sink`.
pub fn get(url: &Url, sink: &mut dyn Write, limits: &mut Limits) -> Result<Got, String> {
    let mut url = url.clone();
    for _ in 0..=MAX_REDIRECTS {
        let stream = connect(&url, limits.timeout)?;
        let mut reader = BufReader::new(Deadlined { stream, deadline: limits.deadline });
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: tp/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            url.path,
            url.host,
            url.port,
            env!("CARGO_PKG_VERSION")
        );
        reader.get_mut().stream.write_all(request.as_bytes()).map_err(|e| io_text(&e))?;
        let head = parse_head(&read_head(&mut reader)?)?;
        match head.status {
            200 => return body(&mut reader, &head, sink, limits).map(Got::Body),
            404 => return Ok(Got::NotFound),
            301 | 302 | 303 | 307 | 308 => {
                let to = head.location.ok_or("a redirect without a Location")?;
                url = if to.starts_with('/') { Url { path: to, ..url } } else { Url::parse(&to)? };
            }
            s => return Err(format!("the server answered {s}")),
        }
    }
    Err(format!("more than {MAX_REDIRECTS} redirects"))
}

/// The body of an answer whose head is `head`, from `reader` into `sink`.
pub fn body(reader: &mut impl BufRead, head: &Head, sink: &mut dyn Write, limits: &mut Limits) -> Result<u64, String> {
    let max = limits.max_body;
    let too_big = |n: u64| format!("the debug file is larger than tp takes ({n} bytes, at most {max})");
    if head.chunked {
        let mut total = 0u64;
        loop {
            let mut line = Vec::new();
            reader.by_ref().take(64).read_until(b'\n', &mut line).map_err(|e| io_text(&e))?;
            let line = std::str::from_utf8(&line).map_err(|_| "a bad chunk size")?.trim_end();
            let size = line.split(';').next().unwrap_or("").trim();
            let n = u64::from_str_radix(size, 16).map_err(|_| "a bad chunk size")?;
            if n == 0 {
                return Ok(total);
            }
            total = total.checked_add(n).filter(|&t| t <= max).ok_or_else(|| too_big(total.saturating_add(n)))?;
            copy(reader, n, sink, limits)?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf).map_err(|e| io_text(&e))?;
            if &crlf != b"\r\n" {
                return Err("a chunk not ended by CRLF".into());
            }
        }
    }
    match head.length {
        Some(n) if n > max => Err(too_big(n)),
        Some(n) => {
            (limits.on_size)(n);
            copy(reader, n, sink, limits)?;
            Ok(n)
        }
        None => {
            // To the end of the connection.
            let mut total = 0u64;
            let mut buf = [0u8; 64 * 1024];
            loop {
                let k = reader.read(&mut buf).map_err(|e| io_text(&e))?;
                if k == 0 {
                    return Ok(total);
                }
                total += k as u64;
                if total > max {
                    return Err(too_big(total));
                }
                sink.write_all(&buf[..k]).map_err(|e| format!("writing the debug file: {e}"))?;
                (limits.on_bytes)(k as u64);
            }
        }
    }
}

/// Copies exactly `n` bytes from `reader` to `sink`.
fn copy(reader: &mut impl Read, n: u64, sink: &mut dyn Write, limits: &mut Limits) -> Result<(), String> {
    let mut left = n;
    let mut buf = [0u8; 64 * 1024];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let k = reader.read(&mut buf[..want]).map_err(|e| io_text(&e))?;
        if k == 0 {
            return Err(format!("the answer ended {left} bytes early"));
        }
        sink.write_all(&buf[..k]).map_err(|e| format!("writing the debug file: {e}"))?;
        (limits.on_bytes)(k as u64);
        left -= k as u64;
    }
    Ok(())
}

/// Reads the answer's head, up to the blank line, at most [`MAX_HEAD`] bytes.
pub fn read_head(reader: &mut impl BufRead) -> Result<Vec<u8>, String> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = reader.by_ref().take((MAX_HEAD + 2 - head.len()) as u64).read_until(b'\n', &mut line);
        let n = n.map_err(|e| io_text(&e))?;
        if n == 0 {
            return Err("the server closed the connection without an answer".into());
        }
        if line == b"\r\n" || line == b"\n" {
            return Ok(head);
        }
        if !line.ends_with(b"\n") || head.len() + line.len() > MAX_HEAD {
            return Err(format!("the answer's head is longer than {MAX_HEAD} bytes"));
        }
        if !head.is_empty() {
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(line.strip_suffix(b"\r\n").or_else(|| line.strip_suffix(b"\n")).unwrap_or(&line));
    }
}

fn connect(url: &Url, timeout: Duration) -> Result<TcpStream, String> {
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<_> =
        (host, url.port).to_socket_addrs().map_err(|e| format!("cannot resolve `{}`: {e}", url.host))?.collect();
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_read_timeout(Some(timeout))
                    .and_then(|_| s.set_write_timeout(Some(timeout)))
                    .map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) => last = io_text(&e),
        }
    }
    Err(last)
}

/// A stream whose reads fail once the deadline has passed.
struct Deadlined {
    stream: TcpStream,
    deadline: Option<Instant>,
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "DEBUGINFOD_MAXTIME passed"));
        }
        self.stream.read(buf)
    }
}

fn io_text(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        let u = Url::parse("http://127.0.0.1:8002").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("127.0.0.1", 8002, "/"));
        assert_eq!(u.join("buildid/ab/debuginfo").path, "/buildid/ab/debuginfo");
        let u = Url::parse("http://debuginfod.example/prefix/").unwrap();
        assert_eq!((u.port, u.join("/buildid/x").path.as_str()), (80, "/prefix/buildid/x"));
        let u = Url::parse("http://[::1]:9000/x").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("[::1]", 9000));
        assert!(Url::parse("https://debuginfod.debian.net").unwrap_err().contains("https"));
        for bad in ["ftp://x", "http://", "http://a:b", "http://u@h/", "http://h/a b", "http://[::1", "http://[::1]x"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn heads_parse_strictly() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-Debuginfod-Size: 12").unwrap();
        assert_eq!(h, Head { status: 200, length: Some(12), chunked: false, location: None });
        let h = parse_head(b"HTTP/1.0 302 Found\r\nlocation: /elsewhere").unwrap();
        assert_eq!((h.status, h.location.as_deref()), (302, Some("/elsewhere")));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked").unwrap().chunked);
        for bad in [
            &b"SSH-2.0-OpenSSH"[..],
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip",
            b"HTTP/1.1 200 OK\r\nno colon",
            b"HTTP/1.1 200 \xff",
        ] {
            assert!(parse_head(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    fn limits<'a>(max: u64, size: &'a mut dyn FnMut(u64), bytes: &'a mut dyn FnMut(u64)) -> Limits<'a> {
        Limits { timeout: Duration::from_secs(1), deadline: None, max_body: max, on_size: size, on_bytes: bytes }
    }

    /// The body of `answer` (head and all) as [`get`] reads it.
    fn read_answer(answer: &[u8], max: u64) -> Result<Vec<u8>, String> {
        let mut reader = BufReader::new(answer);
        let head = parse_head(&read_head(&mut reader)?)?;
        let mut out = Vec::new();
        let (mut s, mut b) = (|_| {}, |_| {});
        body(&mut reader, &head, &mut out, &mut limits(max, &mut s, &mut b))?;
        Ok(out)
    }

    #[test]
    fn bodies_by_length_by_chunks_and_to_the_end() {
        assert_eq!(read_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 100).unwrap(), b"hello");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n";
        assert_eq!(read_answer(chunked, 100).unwrap(), b"hello");
        assert_eq!(read_answer(b"HTTP/1.0 200 OK\r\n\r\nto the end", 100).unwrap(), b"to the end");
    }

    #[test]
    fn bad_bodies_are_errors_never_allocations() {
        // Longer than allowed, by its length, its chunks, or its end.
        assert!(
            read_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", 100).unwrap_err().contains("larger")
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n";
        assert!(read_answer(chunked, 100).unwrap_err().contains("larger"));
        assert!(read_answer(b"HTTP/1.0 200 OK\r\n\r\n0123456789", 5).unwrap_err().contains("larger"));
        // Shorter than said, and malformed chunks.
        assert!(read_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", 100).unwrap_err().contains("early"));
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(read_answer(bad, 100).is_err());
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY";
        assert!(read_answer(bad, 100).is_err());
        // A head that never ends, or is too long.
        assert!(read_answer(b"HTTP/1.1 200 OK\r\nA: b", 100).is_err());
        let long = [b"HTTP/1.1 200 OK\r\nA: ".as_slice(), &vec![b'x'; MAX_HEAD], b"\r\n\r\n"].concat();
        assert!(read_answer(&long, 100).unwrap_err().contains("longer"));
    }
}
