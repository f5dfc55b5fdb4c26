//! Metrics for monitoring systems: `tp status --openmetrics/--prometheus`
//! (and `-o FILE`, written atomically), `tp serve`, and a session's
//! `--listen`. Checked by `promtool check metrics` and by a real Prometheus
//! (Debian's package) that scrapes tp on the loopback every second and is
//! then queried through its HTTP API: the values it stored, parsed as JSON,
//! equal tp's own counts and the targets' own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// A port nothing listens on now (the kernel's pick).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 request, raw; the whole answer.
fn http(port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(port: u16, path: &str, accept: Option<&str>) -> String {
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    http(port, format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}\r\n").as_bytes())
}

/// An HTTP/1.0 GET, which no server answers in chunks; the body.
fn get_body(port: u16, path: &str) -> Option<String> {
    TcpStream::connect(("127.0.0.1", port)).ok()?;
    let answer = http(port, format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes());
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

/// Waits until something accepts connections on `port`.
fn wait_listening(port: u16) {
    poll_until("tp listens", Duration::from_millis(20), || TcpStream::connect(("127.0.0.1", port)).is_ok());
}

/// The value of the sample `name{labels}` in an exposition.
fn sample(text: &str, name_and_labels: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name_and_labels} in:\n{text}"))
}

/// Runs `promtool check metrics` on `text`; its complaints, if any.
fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn status_exposes_counts_in_both_formats_and_writes_files_atomically() {
    need("prometheus");
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]));
    let foo = t.call("foo", 1234, 2);
    let labels = |f: &str| format!("tp_calls_total{{pid=\"{pid}\",module=\"counter\",function=\"{f}\"}}");

    let om = expect_success(&["status"], &tp(&["status", "-p", &pid, "--openmetrics"]));
    assert!(om.contains("# TYPE tp_calls counter\n"), "{om}");
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    assert_eq!((sample(&om, &labels("foo")), sample(&om, &labels("bar"))), (foo, 0));

    let text = expect_success(&["status"], &tp(&["status", "-p", &pid, "--prometheus"]));
    assert!(text.contains("# TYPE tp_calls_total counter\n"), "{text}");
    assert_eq!(sample(&text, &labels("foo")), foo);

    // -o: the file, and nothing else, in its directory.
    let dir = std::env::temp_dir().join(format!("tp-textfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tp.prom");
    for _ in 0..2 {
        expect_success(&["status"], &tp(&["status", "-p", &pid, "--prometheus", "-o", file.to_str().unwrap()]));
    }
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written.trim_end(), text, "the same exposition, in the file");
    promtool_check(&written).unwrap_or_else(|e| panic!("promtool: {e}\n{written}"));
    let names: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(names, std::slice::from_ref(&file), "no temporary file left");
    let _ = std::fs::remove_dir_all(&dir);
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
}

#[test]
fn serve_refuses_other_addresses_and_bad_requests() {
    let line = expect_error(&["serve", "--listen", "0.0.0.0:0"], "not a loopback address");
    assert!(line.contains("--listen-any"), "{line}");
    expect_error(&["serve", "--listen", "nonsense"], "not an address to listen on");

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut serve = Session::spawn("serve", &["--listen", &addr], &[], Some("tp: serving"));
    let status_line = |answer: &str| answer.lines().next().unwrap_or_default().to_string();
    assert_eq!(status_line(&http(port, b"POST /metrics HTTP/1.1\r\n\r\n")), "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(status_line(&get(port, "/nothing", None)), "HTTP/1.1 404 Not Found");
    assert_eq!(status_line(&http(port, b"\xff\xfe\xfd not text\r\n\r\n")), "HTTP/1.1 400 Bad Request");
    assert_eq!(status_line(&http(port, b"GET /metrics HTTP/2.0\r\n\r\n")), "HTTP/1.1 505 HTTP Version Not Supported");
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert_eq!(status_line(&http(port, huge.as_bytes())), "HTTP/1.1 431 Request Header Fields Too Large");
    // A client that sends half a request and waits is cut off.
    let started = Instant::now();
    assert_eq!(status_line(&http(port, b"GET /metrics HTTP/1.1\r\n")), "HTTP/1.1 408 Request Timeout");
    assert!(started.elapsed() < Duration::from_secs(15));
    // ... and tp still answers the next one, in the format it asks for.
    let ok = get(port, "/metrics", Some("application/openmetrics-text;version=1.0.0"));
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("Content-Type: application/openmetrics-text; version=1.0.0"), "{ok}");
    assert!(ok.trim_end().ends_with("# EOF"), "{ok}");
    let head = http(port, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"), "{head}");
    let (status, _, stderr) = {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(serve.child.id() as i32, libc::SIGINT) };
        let status = wait_timeout(&mut serve.child);
        (status, (), serve.err.rest().join("\n"))
    };
    assert!(status.success(), "{stderr}");
}

/// Prometheus from Debian's package scrapes `tp serve` (kept probes) and a
/// session's `--listen` (counts and latency) every second; its query API
/// then answers with exactly the counts tp and the targets have.
#[test]
fn prometheus_scrapes_tp_and_stores_its_exact_counts() {
    need("prometheus");
    let mut kept = Target::start("counter");
    let mut timed = Target::start("counter");
    let (kept_pid, timed_pid) = (kept.pid.to_string(), timed.pid.to_string());
    expect_success(&["attach"], &tp(&["attach", "-p", &kept_pid, "-f", "foo", "--keep"]));
    let (serve_port, session_port, prom_port) = (free_port(), free_port(), free_port());
    let serve = Session::spawn(
        "serve",
        &["--listen", &format!("127.0.0.1:{serve_port}"), "-p", &kept_pid],
        &[],
        Some("tp: serving"),
    );
    let mut session = Session::spawn(
        "attach",
        &["-p", &timed_pid, "-f", "foo", "--ret", "-q", "--json", "--listen", &format!("127.0.0.1:{session_port}")],
        &[],
        Some("tp: serving this session's metrics"),
    );
    session.err.wait_for("tp: attached");
    let kept_calls = kept.call("foo", 4321, 2);
    let timed_calls = timed.call("foo", 321, 1);

    // The session's own exposition, in the text format, passes promtool too.
    wait_listening(session_port);
    poll_until("the session publishes its counts", Duration::from_millis(50), || {
        get(session_port, "/metrics", None).contains(&format!("function=\"foo\"}} {timed_calls}"))
    });
    let text = get(session_port, "/metrics", None);
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    promtool_check(body).unwrap_or_else(|e| panic!("promtool: {e}\n{body}"));

    let dir = std::env::temp_dir().join(format!("tp-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
             - job_name: kept\n    static_configs:\n      - targets: ['127.0.0.1:{serve_port}']\n  \
             - job_name: session\n    static_configs:\n      - targets: ['127.0.0.1:{session_port}']\n"
        ),
    )
    .unwrap();
    let prometheus = KillOnDrop::child(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let query = |q: &str| -> Option<Vec<serde_json::Value>> {
        let body = get_body(prom_port, &format!("/api/v1/query?query={}", urlencode(q)))?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (v["status"] == "success").then(|| v["data"]["result"].as_array().cloned()).flatten()
    };
    let number = |q: &str| -> Option<f64> {
        let r = query(q)?;
        let [one] = r.as_slice() else { return None };
        one["value"][1].as_str()?.parse().ok()
    };
    let value = |q: &str| -> Option<u64> { number(q).map(|v| v as u64) };
    let want = [
        (format!("tp_calls_total{{job=\"kept\",pid=\"{kept_pid}\",module=\"counter\",function=\"foo\"}}"), kept_calls),
        (format!("tp_calls_total{{job=\"session\",pid=\"{timed_pid}\",function=\"foo\"}}"), timed_calls),
        (format!("tp_latency_seconds_count{{job=\"session\",pid=\"{timed_pid}\",function=\"foo\"}}"), timed_calls),
        ("tp_latency_seconds_bucket{job=\"session\",function=\"foo\",le=\"+Inf\"}".to_string(), timed_calls),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<Option<u64>> = want.iter().map(|(q, _)| value(q)).collect();
        if got.iter().zip(&want).all(|(g, (_, w))| *g == Some(*w)) {
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus has {got:?}, tp counted {want:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Prometheus parsed both targets without error, and saw every bucket.
    let up = query("up").unwrap();
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");
    let buckets = query(&format!("tp_latency_seconds_bucket{{job=\"session\",pid=\"{timed_pid}\"}}")).unwrap();
    assert_eq!(buckets.len(), 29, "28 powers of two and +Inf");
    let sum = number("tp_latency_seconds_sum{job=\"session\"}").unwrap_or(0.0);
    assert!(sum > 0.0 && sum < 1.0, "the latency sum is stored, in seconds: {sum}");

    // tp's own counts agree: status for the kept probes, the session's summary.
    let status = expect_success(&["status"], &tp(&["status", "-p", &kept_pid, "--json"]));
    assert_eq!(hits_from_json(&status)["foo"], kept_calls);
    let (st, stdout, stderr) = session.interrupt();
    assert!(st.success(), "{stderr}");
    let v = one_process(&stdout);
    assert_eq!(v["probes"][0]["hits"].as_u64(), Some(timed_calls));
    assert_eq!(v["probes"][0]["timed"].as_u64(), Some(timed_calls));
    drop((prometheus, serve));
    expect_success(&["detach"], &tp(&["detach", "-p", &kept_pid]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Percent-encodes a query for a URL.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Without -p, `tp status` covers every process that holds tp probes: a
/// section each and their total, and the same series in OpenMetrics.
#[test]
fn status_without_a_pid_covers_every_process_with_probes() {
    let _alone = system_wide();
    let mut a = Target::start_unlocked("counter");
    let mut b = Target::start_unlocked("counter");
    for t in [&a, &b] {
        expect_success(&["attach"], &tp(&["attach", "-p", &t.pid.to_string(), "-f", "foo", "--keep"]));
    }
    let (fa, fb) = (a.call("foo", 40, 1), b.call("foo", 2, 1));
    let json = expect_success(&["status", "--json"], &tp(&["status", "--json"]));
    let v = summary_doc(&json);
    let hits_of = |pid: i32| {
        v["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap()["probes"][0]["hits"].as_u64()
    };
    assert_eq!((hits_of(a.pid), hits_of(b.pid)), (Some(fa), Some(fb)), "{json}");
    let total = v["total"].as_array().unwrap().iter().find(|t| t["func"] == "foo" && t["module"] == "counter").unwrap();
    assert_eq!(total["hits"].as_u64(), Some(fa + fb));
    let om = expect_success(&["status", "--openmetrics"], &tp(&["status", "--openmetrics"]));
    for (t, n) in [(&a, fa), (&b, fb)] {
        assert_eq!(sample(&om, &format!("tp_calls_total{{pid=\"{}\",module=\"counter\",function=\"foo\"}}", t.pid)), n);
    }
    expect_success(&["detach"], &tp(&["detach"]));
    let none = tp(&["status"]);
    assert!(none.status.success());
    assert_eq!(String::from_utf8_lossy(&none.stderr).trim(), "tp: no process holds tp probes");
}

/// A session's aggregates (`--agg`, `--by tid`) are published while it
/// runs: per thread of the agg target, the calls, sum, minimum and maximum
/// of an argument equal the thread's own books, and promtool accepts the
/// exposition.
#[test]
fn a_sessions_aggregates_are_published_per_thread() {
    need("prometheus");
    let mut t = Target::start("agg");
    let pid = t.pid.to_string();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["-p", &pid, "-f", "consume", "--agg", "sum(len), min(len), max(len)", "--by", "tid", "-q"];
    let mut session = Session::spawn(
        "attach",
        &[&args[..], &["--listen", &listen]].concat(),
        &[],
        Some("tp: serving this session's metrics"),
    );
    session.err.wait_for("tp: attached");
    let before = t.out.seen.len();
    t.ask("run 2 700", "done run");
    let threads: Vec<String> = t.out.seen[before..].iter().filter(|l| l.starts_with("thread ")).cloned().collect();
    assert_eq!(threads.len(), 2);
    wait_listening(port);
    let num = |line: &str, key: &str| -> i64 {
        let at = line.find(&format!(" {key}=")).unwrap() + key.len() + 2;
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    for l in &threads {
        let labels = format!("pid=\"{pid}\",module=\"agg\",function=\"consume\",key_tid=\"{}\"", num(l, "tid"));
        let calls = format!("tp_aggregate_calls_total{{{labels}}} {}", num(l, "calls"));
        poll_until("the session publishes the thread's calls", Duration::from_millis(50), || {
            get(port, "/metrics", None).lines().any(|x| x == calls)
        });
        let text = get(port, "/metrics", None);
        for f in ["sum", "min", "max"] {
            let want = format!("tp_aggregate_{f}_value{{{labels},value=\"len\"}} {}", num(l, f));
            assert!(text.lines().any(|x| x == want), "{want} not in:\n{text}");
        }
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        promtool_check(body).unwrap_or_else(|e| panic!("promtool: {e}\n{body}"));
    }
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(t.quit().success());
}
