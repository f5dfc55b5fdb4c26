//! A tiny HTTP/1.1 server side for `/metrics`, on std::net alone: one
//! request per connection, read with a deadline into a bounded buffer,
//! parsed strictly, answered, and the connection closed. It exposes
//! process and function names, so tp listens on loopback unless told
//! otherwise ([`check_listen`]).
//!
//! Limits: the request head (request line and headers) may be 8 KiB; the
//! client has 5 s to send it and to take the answer; a body is never read
//! (GET and HEAD have none). Anything else is answered with the status
//! that says why (400, 404, 405, 408, 431, 505) and closed.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest request head tp reads.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request, and to take the answer.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// A request tp answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET` or `HEAD`.
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The Accept header, if any.
    pub accept: Option<String>,
}

/// Why a request is refused: its status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 400: not an HTTP request tp understands.
    BadRequest,
    /// 405: a method other than GET and HEAD.
    MethodNotAllowed,
    /// 408: the head did not arrive in time.
    Timeout,
    /// 431: the head is longer than [`MAX_HEAD`].
    TooLarge,
    /// 505: not HTTP/1.0 or HTTP/1.1.
    Version,
}

impl Refused {
    /// The status code and reason.
    pub fn status(self) -> (u16, &'static str) {
        match self {
            Refused::BadRequest => (400, "Bad Request"),
            Refused::MethodNotAllowed => (405, "Method Not Allowed"),
            Refused::Timeout => (408, "Request Timeout"),
            Refused::TooLarge => (431, "Request Header Fields Too Large"),
            Refused::Version => (505, "HTTP Version Not Supported"),
        }
    }
}

/// Parses a request head (everything before the blank line).
pub fn parse(head: &[u8]) -> Result<Request, Refused> {
    let head = std::str::from_utf8(head).map_err(|_| Refused::BadRequest)?;
    let mut lines = head.split("\r\n");
    let line = lines.next().ok_or(Refused::BadRequest)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refused::BadRequest);
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refused::BadRequest);
    }
    if !version.starts_with("HTTP/") {
        return Err(Refused::BadRequest);
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(Refused::Version);
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err(Refused::BadRequest);
    }
    let mut accept = None;
    for h in lines {
        // Header lines are `name: value`; obsolete line folding is refused.
        let Some((name, value)) = h.split_once(':') else { return Err(Refused::BadRequest) };
        if name.is_empty() || name.bytes().any(|b| !(b.is_ascii_graphic())) {
            return Err(Refused::BadRequest);
        }
        if name.eq_ignore_ascii_case("accept") {
            accept = Some(value.trim().to_string());
        }
    }
    if method != "GET" && method != "HEAD" {
        return Err(Refused::MethodNotAllowed);
    }
    let path = target.split(['?', '#']).next().unwrap_or(target).to_string();
    Ok(Request { method: method.to_string(), path, accept })
}

/// Reads a request head from `r` until the blank line, at most
/// [`MAX_HEAD`] bytes, by `deadline`.
pub fn read_head(r: &mut impl Read, deadline: Instant) -> Result<Vec<u8>, Refused> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_blank_line(&buf) {
            if end > MAX_HEAD {
                return Err(Refused::TooLarge);
            }
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > MAX_HEAD {
            return Err(Refused::TooLarge);
        }
        if Instant::now() >= deadline {
            return Err(Refused::Timeout);
        }
        match r.read(&mut chunk) {
            Ok(0) => return Err(Refused::BadRequest),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(Refused::Timeout);
            }
            Err(_) => return Err(Refused::BadRequest),
        }
    }
}

fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code and reason.
    pub status: (u16, &'static str),
    /// The Content-Type.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Response {
    /// A plain-text answer with `status`.
    pub fn text(status: (u16, &'static str), body: &str) -> Response {
        Response { status, content_type: "text/plain; charset=utf-8", body: format!("{body}\n") }
    }
}

/// Writes `resp` (its head only for HEAD) and closes the connection.
pub fn write_response(w: &mut impl Write, resp: &Response, head_only: bool) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        resp.status.0,
        resp.status.1,
        resp.content_type,
        resp.body.len()
    );
    if resp.status.0 == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&resp.body);
    }
    w.write_all(out.as_bytes())?;
    w.flush()
}

/// Serves one connection: reads the request, asks `answer` for the
/// response to a well-formed one, writes it, and closes.
pub fn serve_one(mut stream: TcpStream, answer: impl FnOnce(&Request) -> Response) -> io::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    stream.set_read_timeout(Some(DEADLINE))?;
    stream.set_write_timeout(Some(DEADLINE))?;
    let request = read_head(&mut stream, deadline).and_then(|h| parse(&h));
    let (resp, head_only) = match request {
        Ok(req) => (answer(&req), req.method == "HEAD"),
        Err(refused) => (Response::text(refused.status(), refused.status().1), false),
    };
    write_response(&mut stream, &resp, head_only)?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// Resolves `addr` (`127.0.0.1:9464`, `[::1]:9464`, `localhost:9464`) and,
/// unless `any` allows it, refuses an address that is not loopback.
pub fn check_listen(addr: &str, any: bool) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("`{addr}` is not an address to listen on, like 127.0.0.1:9464 ({e})"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("`{addr}` resolves to no address"));
    }
    if !any && let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "{a} is not a loopback address, and the metrics name processes and functions; \
             listen on 127.0.0.1 (or add --listen-any)"
        ));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_prometheus_sends() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: Prometheus/2.42.0\r\n\
                     Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\
                     X-Prometheus-Scrape-Timeout-Seconds: 1";
        let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(
            parse(head),
            Ok(Request { method: "GET".into(), path: "/metrics".into(), accept: Some(accept.into()) })
        );
        assert_eq!(parse(b"HEAD /metrics?x=1 HTTP/1.0").unwrap().path, "/metrics");
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        assert_eq!(parse(b"POST /metrics HTTP/1.1"), Err(Refused::MethodNotAllowed));
        assert_eq!(parse(b"GET /metrics HTTP/2.0"), Err(Refused::Version));
        for bad in [
            &b"GET /metrics"[..],
            b"GET  /metrics HTTP/1.1",
            b"get /metrics HTTP/1.1",
            b"GET metrics HTTP/1.1",
            b"GET /metrics HTTP/1.1 extra",
            b"GET /metrics SPDY/1.1",
            b"GET /met\x01rics HTTP/1.1",
            b"GET /metrics HTTP/1.1\r\nno colon here",
            b"GET /metrics HTTP/1.1\r\n folded: header",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(parse(bad), Err(Refused::BadRequest), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn reads_heads_within_bounds() {
        let far = Instant::now() + Duration::from_secs(5);
        let mut ok: &[u8] = b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody ignored";
        assert_eq!(read_head(&mut ok, far).unwrap(), b"GET / HTTP/1.1\r\nA: b");
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD + 10));
        assert!(read_head(&mut big.as_bytes(), far) == Err(Refused::TooLarge), "a head over the limit");
        let mut cut: &[u8] = b"GET / HTTP/1.1\r\n";
        assert_eq!(read_head(&mut cut, far), Err(Refused::BadRequest), "closed before the blank line");
    }

    #[test]
    fn answers_with_length_and_close() {
        let mut out = Vec::new();
        write_response(&mut out, &Response::text((404, "Not Found"), "no"), false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\nConnection: close\r\n\r\nno\n"
        );
        let mut out = Vec::new();
        write_response(&mut out, &Response::text((405, "Method Not Allowed"), "x"), true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Allow: GET, HEAD\r\n") && text.ends_with("\r\n\r\n"), "{text}");
    }

    #[test]
    fn listens_on_loopback_unless_told() {
        assert!(check_listen("127.0.0.1:9464", false).is_ok());
        assert!(check_listen("[::1]:9464", false).is_ok());
        let e = check_listen("0.0.0.0:9464", false).unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
        assert!(check_listen("0.0.0.0:9464", true).is_ok());
        assert!(check_listen("nonsense", false).is_err());
    }
}
