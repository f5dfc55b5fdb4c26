//! The proof on a server that forks its workers again on every reload:
//! Debian's nginx with its own configuration (a prefix, pid file and logs
//! in a temporary directory, a loopback port), two workers, two clients
//! requesting without pause, return probes on the master and on the
//! request path, and `nginx -s reload` three times meanwhile (after a
//! first one that replaces the workers forked before the attach): no worker
//! dies (the master logs "exited on signal" when one does), no request
//! fails, every request is counted and timed, and nothing of tp stays in
//! the master or any worker.
//! Needs nginx (tests/deps.txt: installed by need()).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::util::*;

const BODY: &str = "hello from nginx under tp\n";

struct Nginx {
    dir: PathBuf,
    port: u16,
    master: KillOnDrop,
    _lock: Held,
}

impl Nginx {
    fn start() -> Nginx {
        need("nginx");
        let lock = shared();
        let dir = std::env::temp_dir().join(format!("tp-nginx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("html")).unwrap();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("html/index.html"), BODY).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let d = dir.display();
        let conf = format!(
            "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/logs/error.log info;\nevents {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{\n    listen 127.0.0.1:{port};\n    root {d}/html;\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new("nginx")
            .args(["-p", &dir.display().to_string(), "-c", &dir.join("nginx.conf").display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let n = Nginx { dir, port, master: KillOnDrop::child(child), _lock: lock };
        poll_until("nginx answers", Duration::from_millis(20), || n.get().is_ok());
        n
    }

    fn get(&self) -> Result<(), String> {
        get(self.port)
    }

    fn reload(&self) {
        let out = run(Command::new("nginx").args([
            "-p",
            &self.dir.display().to_string(),
            "-c",
            &self.dir.join("nginx.conf").display().to_string(),
            "-s",
            "reload",
        ]));
        assert!(out.status.success(), "nginx -s reload: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    /// The master and its workers.
    fn processes(&self) -> Vec<i32> {
        let master = self.master.id();
        let mut all = vec![master];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<i32>().ok());
            if ppid == Some(master) {
                all.push(pid);
            }
        }
        all
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory effects.
        unsafe { libc::kill(self.master.id(), libc::SIGQUIT) };
        let _ = wait_timeout(self.master.get_mut());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One request to the server on `port`: its body was right, or why not.
fn get(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    if answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with(BODY) { Ok(()) } else { Err(answer) }
}

/// Clients requesting without pause until `stop`: (answered, failures).
fn clients(port: u16, count: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<(u64, Vec<String>)>> {
    (0..count)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match get(port) {
                        Ok(()) => ok += 1,
                        Err(e) => failed.push(e),
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

#[test]
fn return_probes_on_the_master_survive_reloads_under_load() {
    let nginx = Nginx::start();
    let master = nginx.master.id().to_string();
    let funcs = ["ngx_spawn_process", "ngx_init_cycle", "ngx_http_process_request", "ngx_http_handler"];
    let mut args = vec!["-p", master.as_str(), "--ret", "--json", "-q", "--ring-size", "65536"];
    for f in funcs {
        args.extend(["-f", f]);
    }
    let first_workers = nginx.processes()[1..].to_vec();
    let session = Session::start(&args);
    // Workers forked before the attach run the code as it was: the first
    // reload replaces them with workers forked while the probes are in.
    nginx.reload();
    let reloads = AtomicU64::new(1);
    poll_until("the workers forked before the attach exit", Duration::from_millis(10), || {
        let now = nginx.processes();
        now.len() == 3 && !now.iter().any(|p| first_workers.contains(p))
    });
    let stop = Arc::new(AtomicBool::new(false));
    let running = clients(nginx.port, 2, &stop);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(400));
        nginx.reload();
        reloads.fetch_add(1, Ordering::Relaxed);
    }
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    let (mut answered, mut failures) = (0, Vec::new());
    for c in running {
        let (ok, failed) = c.join().unwrap();
        answered += ok;
        failures.extend(failed);
    }
    std::thread::sleep(Duration::from_millis(100));
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");

    let log = nginx.error_log();
    let died: Vec<&str> = log.lines().filter(|l| l.contains("exited on signal")).collect();
    assert_eq!(died, Vec::<&str>::new(), "no worker died");
    assert_eq!(failures, Vec::<String>::new(), "no request failed ({answered} answered)");
    assert!(answered > 100, "{answered}");

    let v = one_process(&stdout);
    let probe = |f: &str| v["probes"].as_array().unwrap().iter().find(|p| p["func"] == f).unwrap().clone();
    // Each request is processed once, by a worker, and returns: counted,
    // whichever generation of workers served it, and timed, or its exit
    // counted lost (a worker's ring full while tp was slow to read it).
    assert_eq!(probe("ngx_http_process_request")["hits"].as_u64(), Some(answered));
    let (mut hits, mut timed) = (0, 0);
    for f in funcs {
        let p = probe(f);
        hits += p["hits"].as_u64().unwrap();
        timed += p["timed"].as_u64().unwrap();
    }
    assert_eq!(timed + v["lost_events"].as_u64().unwrap(), hits, "every exit timed or counted lost: {stderr}");
    assert_eq!(probe("ngx_init_cycle")["hits"].as_u64(), Some(reloads.load(Ordering::Relaxed)));
    // The workers of four reloads, each a child of the master.
    let children = v["children"].as_array().unwrap();
    assert!(children.len() >= 8, "{children:?}");
    for pid in nginx.processes() {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        assert!(!maps.contains("tp-data"), "process {pid} of nginx still maps tp's region: {stderr}");
    }
    assert_eq!(nginx.get(), Ok(()));
}
