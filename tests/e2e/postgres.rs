//! The proof on a forking server: Debian's PostgreSQL, a private cluster
//! (initdb in a temporary directory, listening on 127.0.0.1 on a free
//! port, run by the `postgres` user, stopped at the end), under
//! `pgbench -C`, which opens a connection, so a forked backend, per
//! transaction. Return probes, events and tp profile on the postmaster: no
//! process of the server dies (its log says when one does), every call is
//! counted, every event is printed or counted lost, and nothing of tp
//! stays in any process of the server.
//! Needs postgresql-15 (tests/deps.txt: installed by need()).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// A cluster of our own.
struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    port: String,
    uid: u32,
    gid: u32,
    _lock: Held,
}

/// The uid and gid of a user.
fn user(name: &str) -> (u32, u32) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: getpwnam returns a pointer to static storage or null; read at once.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    assert!(!pw.is_null(), "no user {name}: the postgresql package creates it");
    // SAFETY: non-null, as checked.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

impl Postgres {
    fn start(name: &str) -> Postgres {
        need("postgresql");
        let lock = shared();
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max()
            .expect("a PostgreSQL server under /usr/lib/postgresql");
        let (uid, gid) = user("postgres");
        let dir = std::env::temp_dir().join(format!("tp-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        let pg = Postgres { bin, dir, port, uid, gid, _lock: lock };
        let data = pg.data();
        pg.run_as_postgres("initdb", &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"]);
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=20",
            pg.port,
            pg.dir.display()
        );
        let log = pg.dir.join("server.log");
        pg.run_as_postgres("pg_ctl", &["-D", &data, "-l", log.to_str().unwrap(), "-o", &opts, "-w", "start"]);
        pg.pgbench(&["-i", "-q"]);
        pg
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run_as_postgres(&self, tool: &str, args: &[&str]) {
        let out = run(Command::new(self.bin.join(tool)).args(args).uid(self.uid).gid(self.gid).current_dir(&self.dir));
        assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The postmaster's PID.
    fn postmaster(&self) -> i32 {
        let pid = std::fs::read_to_string(Path::new(&self.data()).join("postmaster.pid")).unwrap();
        pid.lines().next().unwrap().trim().parse().unwrap()
    }

    /// Runs pgbench with `args` against the cluster; its output.
    fn pgbench(&self, args: &[&str]) -> String {
        let out = run(Command::new(self.bin.join("pgbench"))
            .args(["-h", "127.0.0.1", "-p", &self.port, "-U", "postgres"])
            .args(args)
            .arg("postgres"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "pgbench {args:?}: {text}");
        text
    }

    /// `pgbench -C -c 2` for `secs` seconds, on a thread: a new backend per
    /// transaction. Returns the transactions done, and checks none failed.
    fn load(&self, secs: u32) -> std::thread::JoinHandle<u64> {
        let cmd = (self.bin.join("pgbench"), self.port.clone());
        std::thread::spawn(move || {
            let t = secs.to_string();
            let out = run(Command::new(&cmd.0).args([
                "-h",
                "127.0.0.1",
                "-p",
                &cmd.1,
                "-U",
                "postgres",
                "-C",
                "-c",
                "2",
                "-T",
                &t,
                "postgres",
            ]));
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "pgbench: {text}");
            assert!(text.contains("number of failed transactions: 0 "), "{text}");
            let done = text.lines().find_map(|l| l.strip_prefix("number of transactions actually processed: "));
            done.and_then(|d| d.trim().parse().ok()).unwrap_or_else(|| panic!("{text}"))
        })
    }

    /// The server's log lines that tell of a process that died.
    fn crashes(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("terminated by signal") || l.contains("server process") || l.contains("PANIC"))
            .map(str::to_string)
            .collect()
    }

    /// The postmaster and every process it forked (its children).
    fn processes(&self) -> Vec<i32> {
        let pm = self.postmaster();
        let mut all = vec![pm];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<i32>().ok());
            if ppid == Some(pm) {
                all.push(pid);
            }
        }
        all
    }

    /// Asserts that no process of the server maps anything of tp's; `said`
    /// is what tp printed, shown if one does.
    fn assert_nothing_of_tp(&self, said: &str) {
        for pid in self.processes() {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                !maps.contains("tp-data"),
                "process {pid} of the server ({}) still maps tp's region:\n{maps}\ntp said:\n{said}",
                cmdline.replace('\0', " ")
            );
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data();
        let _ = run(Command::new(self.bin.join("pg_ctl"))
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(&self.dir));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The summary line of a `--json` session.
fn summary(stdout: &str) -> serde_json::Value {
    one_process(stdout)
}

fn probe<'a>(v: &'a serde_json::Value, func: &str) -> &'a serde_json::Value {
    v["probes"].as_array().unwrap().iter().find(|p| p["func"] == func).unwrap_or_else(|| panic!("{func}: {v}"))
}

#[test]
fn return_probes_on_the_postmaster_survive_pgbench_connect_per_transaction() {
    let pg = Postgres::start("ret");
    let pm = pg.postmaster().to_string();
    let args = ["-p", &pm, "-f", "PortalRun", "-f", "fork_process", "-f", "libc:fork", "-f", "libc:_Fork", "--ret"];
    let mut args = args.to_vec();
    args.extend(["--json", "-q"]);
    let session = Session::start(&args);
    let transactions = pg.load(4).join().unwrap();
    // The last backends end with their connections.
    std::thread::sleep(Duration::from_millis(300));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(pg.crashes(), Vec::<String>::new(), "no process of the server died");
    let v = summary(&stdout);
    // Backends run PortalRun: each call entered returns. The postmaster
    // forks each backend inside the others: it returns from them, and so
    // does the backend. Every return is timed, or counted lost.
    let (mut returns, mut timed) = (0, 0);
    for (f, per_call) in [("PortalRun", 1), ("fork_process", 2), ("fork", 2), ("_Fork", 2)] {
        let p = probe(&v, f);
        let hits = p["hits"].as_u64().unwrap();
        assert!(hits >= transactions, "{p}");
        assert!(p["timed"].as_u64().unwrap() <= per_call * hits, "{p}");
        returns += per_call * hits;
        timed += p["timed"].as_u64().unwrap();
    }
    let lost = v["lost_events"].as_u64().unwrap();
    assert_eq!(timed + lost, returns, "every return timed or counted lost: {stderr}");
    assert!(lost * 100 <= returns, "{lost} of {returns} lost: {stderr}");
    let children = v["children"].as_array().unwrap();
    assert!(children.len() as u64 >= transactions, "every backend is a child: {}", children.len());
    pg.assert_nothing_of_tp(&stderr);
    pg.pgbench(&["-t", "5"]);
}

#[test]
fn arguments_on_the_postmaster_every_event_printed_or_counted_lost() {
    let pg = Postgres::start("args");
    let pm = pg.postmaster().to_string();
    let session = Session::start(&["-p", &pm, "-f", "PortalRun", "-f", "fork_process", "--args", "--json"]);
    let transactions = pg.load(3).join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(pg.crashes(), Vec::<String>::new());
    let v = summary(&stdout);
    let events = json_events(&stdout);
    let entries = |f: &str| events.iter().filter(|e| e["type"] == "entry" && e["func"] == f).count() as u64;
    let hits = |f: &str| probe(&v, f)["hits"].as_u64().unwrap();
    let lost = v["lost_events"].as_u64().unwrap();
    let calls = hits("PortalRun") + hits("fork_process");
    assert_eq!(entries("PortalRun") + entries("fork_process") + lost, calls, "every entry printed or counted lost");
    assert!(lost * 100 <= calls, "{lost} of {calls} lost: {stderr}");
    assert!(hits("fork_process") >= transactions);
    // Events of the backends carry their own PIDs.
    let pids: std::collections::BTreeSet<&str> =
        stdout.lines().filter_map(|l| l.split("\"pid\":").nth(1)?.split(',').next()).collect();
    assert!(pids.len() as u64 > transactions / 2, "{} processes", pids.len());
    pg.assert_nothing_of_tp(&stderr);
}

#[test]
fn tp_profile_on_the_postmaster_survives_pgbench_connect_per_transaction() {
    let pg = Postgres::start("profile");
    let pm = pg.postmaster().to_string();
    for pattern in [&["-f", "palloc*", "-f", "hash_search*", "-f", "PortalRun"][..], &["-f", "*"]] {
        let mut args = vec!["-p", pm.as_str(), "-d", "3", "--epoch", "20ms"];
        args.extend(pattern);
        let load = pg.load(3);
        let profile = Session::spawn("profile", &args, &[], None);
        let transactions = load.join().unwrap();
        let (status, stdout, stderr) = profile.wait();
        assert!(status.success(), "{pattern:?}: {stderr}");
        assert!(transactions > 0);
        assert!(stdout.contains("FUNCTION"), "{stdout}");
        assert_eq!(pg.crashes(), Vec::<String>::new(), "{pattern:?}");
        std::thread::sleep(Duration::from_millis(200));
        pg.assert_nothing_of_tp(&format!("{stderr}{stdout}"));
    }
    pg.pgbench(&["-t", "5"]);
}
