//! The proof on a real server: redis-server from Debian (stripped, with
//! jemalloc). tp counts the calls of `call`, the function that executes each
//! command, and the count equals what `INFO commandstats` reports for the
//! same window; redis answers correctly afterwards and keeps its data.
//! Needs redis-server and redis-tools (tests/deps.txt: installed by need()).

use std::net::TcpListener;
use std::process::{Command, Stdio};

use crate::util::*;

struct Redis {
    child: KillOnDrop,
    port: String,
}

impl Redis {
    fn start() -> Redis {
        need("redis");
        // A free port: bind one, release it, hand it to redis.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = Redis { child: KillOnDrop::child(child), port };
        // Ready when it answers PING.
        poll_until("redis-server answers PING", std::time::Duration::from_millis(20), || r.cli(&["ping"]) == "PONG");
        r
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli").args(["-p", &self.port]).args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Commands executed so far, summed over `INFO commandstats`.
    fn commands(&self) -> u64 {
        self.cli(&["info", "commandstats"])
            .lines()
            .filter(|l| l.starts_with("cmdstat_"))
            .map(|l| field(&l.replace([':', ','], " "), "calls"))
            .sum()
    }
}

#[test]
fn counts_every_redis_command_exactly() {
    let redis = Redis::start();
    let pid = redis.pid();
    assert_eq!(redis.cli(&["set", "tp:before", "kept"]), "OK");

    // list-probes finds the command executor in the stripped binary (.dynsym).
    let args = ["list-probes", "-p", pid.as_str()];
    let listing = expect_success(&args, &tp(&args));
    let call = listing.lines().find(|l| l.split_whitespace().nth(3) == Some("call")).expect("a row for `call`");
    assert!(call.contains(" ok ("), "{call}");

    let attach = ["attach", "-p", pid.as_str(), "-f", "call", "-f", "libjemalloc:malloc", "-f", "libc:malloc"];
    let mut attach = attach.to_vec();
    attach.extend(["-f", "libc:read", "--keep"]);
    expect_success(&attach, &tp(&attach));

    let before = redis.commands();
    let bench = Command::new("redis-benchmark")
        .args(["-p", &redis.port, "-n", "20000", "-c", "8", "-t", "set,get,incr,lpush", "-q"])
        .output()
        .expect("redis-benchmark");
    assert!(bench.status.success(), "{}", String::from_utf8_lossy(&bench.stderr));
    let status = expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]));
    let after = redis.commands();

    let v = one_process(&status);
    let hits = |module: &str, func: &str| {
        v["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["func"] == func && p["module"].as_str().unwrap().starts_with(module))
            .unwrap_or_else(|| panic!("no probe {module}:{func} in {status}"))["hits"]
            .as_u64()
            .unwrap()
    };
    // The window holds the first INFO (counted by redis only in the second
    // INFO's answer) and the benchmark's commands.
    assert_eq!(hits("redis", "call"), after - before, "tp's count vs INFO commandstats");
    assert!(after - before >= 80_000);
    assert!(hits("libjemalloc", "malloc") > 0, "redis allocates through jemalloc");
    assert!(hits("libc", "read") > 0, "redis reads requests with libc's read");
    // jemalloc interposes malloc, so libc's own malloc may see no calls at all.
    let _ = hits("libc", "malloc");

    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert_eq!(redis.cli(&["set", "tp:after", "hello"]), "OK");
    assert_eq!(redis.cli(&["get", "tp:after"]), "hello");
    assert_eq!(redis.cli(&["get", "tp:before"]), "kept", "data written before the attach survives");
    assert_eq!(redis.cli(&["ping"]), "PONG");
}

/// Debian's redis-server is a symlink to redis-check-rdb: the process
/// answers to the name it was started by, and to its file's name, and tp
/// shows the first.
#[test]
fn redis_server_answers_to_the_name_it_was_started_by() {
    let redis = Redis::start();
    let pid = redis.pid();
    let real = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(real.file_name().unwrap(), "redis-check-rdb", "Debian's redis-server is a symlink");
    for name in ["redis-server:call", "redis-check-rdb:call"] {
        let session = Session::start(&["-p", &pid, "--json", "-f", name]);
        let before = redis.commands();
        for i in 0..25 {
            assert_eq!(redis.cli(&["set", &format!("tp:{i}"), "x"]), "OK");
        }
        let after = redis.commands();
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        let line = summary_doc(&stdout).to_string();
        let v = one_process(&stdout);
        let probe = &v["probes"][0];
        assert_eq!(probe["module"], "redis-server", "{line}");
        // INFO counts a command once it ran: the second INFO's answer counts
        // the first INFO and the 25 SETs; tp counted the second INFO too.
        assert_eq!(probe["hits"].as_u64().unwrap(), after - before + 1, "{name}: {line}");
    }
}
