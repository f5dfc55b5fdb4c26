//! Debug information by build-id from debuginfod: Debian's `debuginfod`
//! serving a directory that holds the debug file of the bundled `counter`,
//! in a network namespace of its own whose only interface is loopback
//! (debuginfod 0.188 listens on every address; tp is run in that namespace
//! with nsenter). The stripped `counter-stripped-id` is then probed by the
//! names and lines only its debug file has, exactly counted; the file is
//! kept in the cache and used from there once the server is gone; a cached
//! file that is not the debug file is deleted, a symlink planted for the
//! cache is not followed, and servers that time out, answer nonsense or
//! speak https are said in one line each.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::util::*;

/// A scratch directory for one test.
fn scratch(what: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("tp-debuginfod-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// The build-id of the bundled `counter` (and of its stripped copies), in hex.
fn build_id() -> String {
    let path = target_path("counter");
    let elf = tp::symbols::ElfFile::open(&path, &path).unwrap();
    elf.build_id.unwrap().iter().map(|b| format!("{b:02x}")).collect()
}

/// `debuginfod -F dir` in a network namespace with loopback alone, port 8002.
struct Server {
    child: Child,
}

const PORT: u16 = 8002;

impl Server {
    fn start(dir: &Path, db: &Path) -> Server {
        need("debuginfod");
        need("iproute2");
        let script = format!(
            "ip link set lo up && exec debuginfod -F -p {PORT} -d {} -t 0 -g 0 {}",
            db.display(),
            dir.display()
        );
        let child = Command::new("unshare")
            .args(["--net", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run unshare");
        let server = Server { child };
        // Ready once it answers for the debug file it found.
        let ask = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{PORT} && printf 'GET /buildid/{}/debuginfo HTTP/1.0\\r\\n\\r\\n' >&3 && head -c 12 <&3",
            build_id()
        );
        poll_until("debuginfod serves the debug file", std::time::Duration::from_millis(100), || {
            let out = server.inside("bash").args(["-c", &ask]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).starts_with("HTTP/1.1 200")
        });
        server
    }

    /// `program`, run in the server's network namespace.
    fn inside(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-n", "-t", &self.child.id().to_string(), "--"]).arg(program);
        cmd
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that every executable mapping of the file `path` in process
/// `pid` holds the file's bytes.
fn assert_code_is_the_files(pid: i32, path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(path).unwrap().ino();
    let file = std::fs::read(path).unwrap();
    let maps = tp::process::read_maps(pid).unwrap();
    let code: Vec<_> = maps.iter().filter(|m| m.exec && m.inode == ino).collect();
    assert!(!code.is_empty());
    for m in code {
        let len = (m.end - m.start).min(file.len() as u64 - m.offset) as usize;
        let off = m.offset as usize;
        assert!(
            read_mem(pid, m.start, len) == file[off..off + len],
            "the code at {:#x} differs from the file",
            m.start
        );
    }
}

/// tp with `env`, in the namespace of `server` if given.
fn tp_with(server: Option<&Server>, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut cmd = match server {
        Some(s) => s.inside(tp_path()),
        None => tp_command(),
    };
    cmd.args(args).env_remove("DEBUGINFOD_URLS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

fn text(out: &std::process::Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The functions list-probes shows for the stripped counter.
fn listed(server: Option<&Server>, env: &[(&str, &str)]) -> (String, String) {
    let path = target_path("counter-stripped-id");
    text(&tp_with(server, env, &["list-probes", path.to_str().unwrap()]))
}

#[test]
fn a_stripped_program_is_probed_by_the_names_and_lines_its_debug_file_has() {
    let base = scratch("serve");
    let (served, cache) = (base.join("served"), base.join("cache"));
    std::fs::create_dir_all(&served).unwrap();
    std::fs::copy(target_path("counter-stripped.debug"), served.join("counter.debug")).unwrap();
    let server = Server::start(&served, &base.join("db.sqlite"));
    let urls = format!("http://127.0.0.1:{PORT}");
    let env = [
        ("DEBUGINFOD_URLS", urls.as_str()),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
        ("TP_DEBUG_DIRS", "/nonexistent"),
    ];

    // Without debuginfod, the stripped program has no `bar`.
    let mut t = Target::start("counter-stripped-id");
    let pid = t.pid.to_string();
    let out = tp_with(None, &[("TP_DEBUG_DIRS", "/nonexistent")], &["attach", "-p", &pid, "-f", "bar"]);
    assert!(!out.status.success() && text(&out).1.contains("stripped"), "{:?}", text(&out));

    // With it: probed by name and by line, counted exactly.
    let line = {
        let src = include_str!("../../targets/counter.c");
        src.lines().position(|l| l.contains("return leaf(x) + y * 3;")).unwrap() + 1
    };
    // bar's line is its entry (-O2): a name and a line.
    let line_arg = format!("counter.c:{line}");
    let mut cmd = server.inside(tp_path());
    cmd.args(["attach", "-p", &pid, "--json", "-f", "baz", "--line", &line_arg]).env_remove("DEBUGINFOD_URLS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let session = Session::from_command(cmd, "tp: attached");
    let session_err = session.err.seen.clone();
    let calls = t.call("bar", 100_000, 1);
    let baz = t.call("baz", 50_000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let fetched = format!("tp: the debug file of `counter-stripped-id` came from http://127.0.0.1:{PORT}/");
    let full_err = format!("{}\n{stderr}", session_err.join("\n"));
    assert!(full_err.contains(&fetched), "{full_err}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits[&line_arg], hits["baz"]), (calls, baz), "{hits:?}");
    assert_code_is_the_files(t.pid, &target_path("counter-stripped-id"));
    assert!(t.quit().success());

    // Kept in the cache, byte for byte.
    let kept = cache.join("tp/debuginfod").join(format!("{}.debug", build_id()));
    assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(served.join("counter.debug")).unwrap());
    let (_, err) = listed(Some(&server), &env);
    assert!(!err.contains("came from"), "a second look uses the cache: {err}");

    // The server gone, the cache still answers.
    drop(server);
    let gone = [("DEBUGINFOD_URLS", "http://127.0.0.1:9"), env[1], env[2]];
    let (out, err) = listed(None, &gone);
    assert!(out.lines().any(|l| l.contains(" bar ") && l.contains("debug-file")), "{out}\n{err}");

    // A cached file that is not the debug file (another build-id) is deleted, not used.
    std::fs::copy("/bin/true", &kept).unwrap();
    let (out, _) = listed(None, &gone);
    assert!(!out.lines().any(|l| l.contains(" bar ")), "{out}");
    assert!(!kept.exists(), "the bad file is deleted");
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_symlink_planted_for_the_cache_is_not_followed() {
    let base = scratch("link");
    let (served, cache, elsewhere) = (base.join("served"), base.join("cache"), base.join("elsewhere"));
    for d in [&served, &elsewhere, &cache.join("tp")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(target_path("counter-stripped.debug"), served.join("counter.debug")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, cache.join("tp/debuginfod")).unwrap();
    let server = Server::start(&served, &base.join("db.sqlite"));
    let urls = format!("http://127.0.0.1:{PORT}");
    let env = [
        ("DEBUGINFOD_URLS", urls.as_str()),
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
        ("TP_DEBUG_DIRS", "/nonexistent"),
    ];
    let (out, err) = listed(Some(&server), &env);
    // Still downloaded and used, but kept nowhere.
    assert!(out.lines().any(|l| l.contains(" bar ") && l.contains("debug-file")), "{out}\n{err}");
    assert!(err.contains("is not used") && err.contains("symlink"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("is not used")).count(), 1, "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing written through the link");
    std::fs::remove_dir_all(&base).unwrap();
}

/// A server on 127.0.0.1 that answers each connection with `answer`
/// (after reading the request), or never when `answer` is None.
fn fake_server(answer: Option<&'static [u8]>) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        match answer {
            Some(a) => {
                let _ = s.write_all(a);
            }
            None => std::thread::sleep(std::time::Duration::from_secs(4)),
        }
    });
    (port, handle)
}

#[test]
fn servers_that_hang_lie_or_speak_https_are_said_in_one_line_each() {
    let base = scratch("bad");
    let cache = base.join("cache");
    let cache_env = ("XDG_CACHE_HOME", cache.to_str().unwrap());
    let no_dirs = ("TP_DEBUG_DIRS", "/nonexistent");
    // A server that never answers: the timeout ends the wait.
    let (port, hang) = fake_server(None);
    let urls = format!("http://127.0.0.1:{port}");
    let (out, err) = listed(None, &[("DEBUGINFOD_URLS", &urls), ("DEBUGINFOD_TIMEOUT", "1"), cache_env, no_dirs]);
    assert!(err.contains(&format!("debuginfod server http://127.0.0.1:{port}/: timed out; not asked again")), "{err}");
    assert!(out.starts_with("ADDRESS") && !out.lines().any(|l| l.contains(" bar ")), "{out}");
    hang.join().unwrap();
    // A server that sends something else: not used, not kept.
    let (port, liar) = fake_server(Some(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot a elf"));
    let urls = format!("http://127.0.0.1:{port}");
    let (out, err) = listed(None, &[("DEBUGINFOD_URLS", &urls), cache_env, no_dirs]);
    assert!(err.contains("is not its debug file"), "{err}");
    assert!(!out.lines().any(|l| l.contains(" bar ")), "{out}");
    liar.join().unwrap();
    let kept = cache.join("tp/debuginfod").join(format!("{}.debug", build_id()));
    assert!(!kept.exists());
    // https: one line, and the program is still listed from what it has.
    let (out, err) = listed(None, &[("DEBUGINFOD_URLS", "https://debuginfod.example.org"), cache_env, no_dirs]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("https:// is not supported"), "{err}");
    assert!(out.starts_with("ADDRESS"), "{out}");
    std::fs::remove_dir_all(&base).unwrap();
}
