//! Test plumbing: target processes driven over stdin/stdout, and runs of the
//! real `tp` binary, all with timeouts so no test can hang.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// How long any single wait in a test may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Path of a bundled target program. `TP_TEST_TARGETS` overrides the
/// directory the build put them in (the aarch64 VM has them elsewhere).
pub fn target_path(name: &str) -> PathBuf {
    built_or_env("TP_TEST_TARGETS", env!("TP_TARGETS_DIR")).join(name)
}

/// Path of the tp binary under test; `TP_TEST_TP` overrides it.
pub fn tp_path() -> PathBuf {
    built_or_env("TP_TEST_TP", env!("CARGO_BIN_EXE_tp"))
}

/// A command that runs tp, without the debuginfod servers of the
/// environment (a test that wants one names it): the tests never reach
/// outside the machine.
pub fn tp_command() -> Command {
    let mut cmd = Command::new(tp_path());
    cmd.env_remove("DEBUGINFOD_URLS");
    cmd
}

fn built_or_env(var: &str, built: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(built), PathBuf::from)
}

/// Makes sure something from outside the repository that a test uses is
/// there (an entry of tests/deps.txt, by name): tests/deps.sh installs it
/// when it is missing (apt or pip, as root), once per test run. When it
/// cannot, the test fails with the one line that says what to install.
/// (The tests that need outside packages run on x86-64 hosts only.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn need(name: &str) {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|d| d == name) {
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/deps.sh");
    let out = Command::new("bash").arg(&script).args(["need", name]).output().expect("run tests/deps.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", stderr.trim_end().lines().last().unwrap_or("tests/deps.sh need failed"));
    done.push(name.to_string());
}

/// Lines of a child's output, read on a thread so waits can time out.
pub struct Lines {
    rx: Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(r: impl std::io::Read + Send + 'static) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// The next line that starts with `prefix` (earlier lines are kept in `seen`).
    pub fn wait_for(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => panic!("waiting for a line starting with {prefix:?}: {e}; seen: {:#?}", self.seen),
            }
        }
    }

    /// Everything until the stream closes.
    pub fn rest(&mut self) -> Vec<String> {
        let deadline = Instant::now() + TIMEOUT;
        while let Ok(line) = self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

/// Tests that act on every process with probes (`tp detach` without a PID)
/// take this exclusively; every target holds it shared while it lives.
/// Within this test binary an RwLock orders the threads; across processes
/// (two checkouts' test runs on one machine) a lock on one file does.
static SYSTEM_WIDE: RwLock<()> = RwLock::new(());

/// The machine-wide side of [`SYSTEM_WIDE`].
const LOCK_FILE: &str = "/tmp/tp-e2e-tests.lock";

/// A hold on the test lock, shared or exclusive; released when dropped.
pub struct Held {
    _file: std::fs::File,
    here: Either,
}

enum Either {
    Read(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    /// A shared hold taken by a thread that holds one already: the RwLock
    /// is not read again, since a read behind a waiting writer would wait
    /// for the writer, which waits for this thread's first hold.
    Nested,
    Write(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

thread_local! {
    /// Shared holds of this thread, nested ones included.
    static READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Drop for Held {
    fn drop(&mut self) {
        if !matches!(self.here, Either::Write(_)) {
            READS.with(|r| r.set(r.get().saturating_sub(1)));
        }
    }
}

fn lock_file() -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(LOCK_FILE)
        .unwrap_or_else(|e| panic!("open {LOCK_FILE}: {e}"))
}

/// Held shared by a test whose processes get probes without a [`Target`]
/// (`tp run`'s programs), so that [`system_wide`] tests do not see them.
pub fn shared() -> Held {
    let here = match READS.with(|r| r.get()) {
        0 => Either::Read(SYSTEM_WIDE.read().unwrap_or_else(|e| e.into_inner())),
        _ => Either::Nested,
    };
    READS.with(|r| r.set(r.get() + 1));
    let file = lock_file();
    file.lock_shared().unwrap_or_else(|e| panic!("lock {LOCK_FILE}: {e}"));
    Held { _file: file, here }
}

/// Excludes all other targets, of this and any other test run, while held.
pub fn system_wide() -> Held {
    let here = Either::Write(SYSTEM_WIDE.write().unwrap_or_else(|e| e.into_inner()));
    let file = lock_file();
    file.lock().unwrap_or_else(|e| panic!("lock {LOCK_FILE}: {e}"));
    Held { _file: file, here }
}

/// A running target program. Killed on drop.
pub struct Target {
    pub child: Child,
    stdin: ChildStdin,
    pub out: Lines,
    pub pid: i32,
    _shared: Option<Held>,
}

impl Target {
    pub fn start(name: &str) -> Target {
        let guard = shared();
        let mut t = Self::start_unlocked(name);
        t._shared = Some(guard);
        t
    }

    /// Starts a target without the shared lock (for tests holding [`system_wide`]).
    pub fn start_unlocked(name: &str) -> Target {
        Self::start_path_unlocked(&target_path(name))
    }

    /// Starts the target program at `path` (one a test built itself).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn start_path(path: &std::path::Path) -> Target {
        let guard = shared();
        let mut t = Self::start_path_unlocked(path);
        t._shared = Some(guard);
        t
    }

    fn start_path_unlocked(path: &std::path::Path) -> Target {
        Self::spawn(Command::new(path))
    }

    /// Starts the bundled target `name` with `configure` applied to its
    /// command first (another user, descriptors it inherits).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn start_with(name: &str, configure: impl FnOnce(&mut Command)) -> Target {
        let guard = shared();
        let mut cmd = Command::new(target_path(name));
        configure(&mut cmd);
        let mut t = Self::spawn(cmd);
        t._shared = Some(guard);
        t
    }

    /// Starts `cmd` (a target program) without the shared lock.
    pub fn spawn(mut cmd: Command) -> Target {
        let path = PathBuf::from(cmd.get_program());
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        // A program a test has just copied may be open for writing in a
        // child another test forked meanwhile (it inherits the descriptor
        // until its exec): ETXTBSY until that child execs.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(26) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.unwrap_or_else(|e| panic!("start {}: {e}", path.display())),
            }
        };
        let stdin = child.stdin.take().unwrap();
        let mut out = Lines::new(child.stdout.take().unwrap());
        let ready = out.wait_for("ready pid=");
        let pid = ready.trim_start_matches("ready pid=").parse().unwrap();
        assert_eq!(pid, child.id() as i32);
        Target { child, stdin, out, pid, _shared: None }
    }

    /// Sends raw bytes on the target's stdin.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn send(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a command and returns the answer line starting with `answer`.
    pub fn ask(&mut self, cmd: &str, answer: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.out.wait_for(answer)
    }

    /// Calls `func` `n` times on each of `threads` threads; asserts the checksum held.
    pub fn call(&mut self, func: &str, n: u64, threads: u32) -> u64 {
        let line = self.ask(&format!("call {func} {n} {threads}"), "done");
        assert!(line.ends_with("checksum=ok"), "target checksum failed: {line}");
        field(&line, "calls")
    }

    /// Asks the target to exit and returns its status.
    pub fn quit(mut self) -> ExitStatus {
        writeln!(self.stdin, "quit").unwrap();
        let _ = self.stdin.flush();
        wait_timeout(&mut self.child)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Attaches to `funcs` of `target`, calls each `calls` times on `threads`
/// threads, detaches with Ctrl-C, and checks tp's counts against the
/// target's own, the restored code and the unmapped memory.
pub fn count_exactly_in(target: &str, funcs: &[&str], calls: u64, threads: u32) -> Target {
    let mut t = Target::start(target);
    let pid = t.pid.to_string();
    let mut args = vec!["-p", pid.as_str(), "--json"];
    for f in funcs {
        args.extend(["-f", f]);
    }
    let session = Session::start(&args);
    let mut own = std::collections::BTreeMap::new();
    for f in funcs {
        own.insert(f.to_string(), t.call(f, calls, threads));
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(stderr.contains("code restored"), "{stderr}");
    assert_eq!(hits_from_json(&stdout), own, "tp's counts vs the target's own");
    assert_code_is_original(&t, funcs);
    assert!(!has_region(t.pid), "tp's memory should be unmapped after a clean detach: {stderr}");
    t
}

/// The number after `key=` in a line.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// A process's state letter in /proc/PID/stat (`R`, `S`, `T`, `Z`...), or
/// None once it is gone.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by x86-64-only tests
pub fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls `cond` until it holds, panicking after [`TIMEOUT`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by x86-64-only tests
pub fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    poll_until(what, Duration::ZERO, cond)
}

/// [`wait_until`], sleeping `every` between polls (for polls that start a
/// process or read much).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by x86-64-only tests
pub fn poll_until(what: &str, every: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        if every.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(every);
        }
    }
}

/// Waits until `tp`, paused by a `pause:` fault (TP_FAULT), is stopped.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by x86-64-only tests
pub fn wait_paused(tp: &Child) {
    wait_until("tp pauses at its fault", || state_of(tp.id()) == Some('T'))
}

/// Compiles the Java program `targets/java/CLASS.java` into a directory of
/// its own under the temporary directory, and returns that directory (the
/// caller removes it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn compile_java(class: &str) -> PathBuf {
    need("java");
    let dir = std::env::temp_dir().join(format!("tp-java-{class}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("targets/java/{class}.java"));
    let javac = Command::new("javac").arg("-d").arg(&dir).arg(&src).status().unwrap();
    assert!(javac.success(), "javac {}", src.display());
    dir
}

/// Starts the Java program `class` compiled in `dir` ([`compile_java`])
/// with the JVM options `options`, its stdin and stdout piped, and waits
/// for its line `ready PID`: the JVM, its stdout's lines, and its PID.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn start_java(dir: &std::path::Path, class: &str, options: &[&str]) -> (KillOnDrop, Lines, String) {
    let mut java = KillOnDrop::child(
        Command::new("java")
            .args(options)
            .arg("-cp")
            .arg(dir)
            .arg(class)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = Lines::new(java.get_mut().stdout.take().unwrap());
    let pid = out.wait_for("ready ").trim_start_matches("ready ").to_string();
    (java, out, pid)
}

/// A process killed with SIGKILL when this guard drops, so a failing test
/// leaves none running or stopped; a child of the test is reaped too.
pub struct KillOnDrop {
    pid: i32,
    child: Option<Child>,
}

impl KillOnDrop {
    /// Guards a process the test started.
    pub fn child(child: Child) -> KillOnDrop {
        KillOnDrop { pid: child.id() as i32, child: Some(child) }
    }

    /// Guards a process the test did not start (a target's fork).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn pid(pid: i32) -> KillOnDrop {
        KillOnDrop { pid, child: None }
    }

    /// The guarded process.
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// The guarded child of the test.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn get_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("a child of the test")
    }

    /// Stops guarding: the test ends the process itself.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        match &mut self.child {
            Some(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            // SAFETY: kill(2) has no memory effects.
            None => unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            },
        }
    }
}

/// Waits for a child, killing it after [`TIMEOUT`] (three times that on an
/// emulated CPU).
pub fn wait_timeout(child: &mut Child) -> ExitStatus {
    // An emulated CPU (the arm64 VM's Cortex-A57 runs a session's drain
    // and detach of some 800,000 events in about a minute, more on a
    // loaded host) gets three times as long.
    let limit = if std::env::var_os("TP_TEST_CPU").is_some() { 3 * TIMEOUT } else { TIMEOUT };
    wait_within(child, limit)
}

/// Waits for a child, killing it after `limit`.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child {} did not exit in time", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs tp to completion.
pub fn tp(args: &[&str]) -> Output {
    run(tp_command().args(args))
}

/// Runs `cmd` with no input to completion (within [`TIMEOUT`]); its
/// output's lines joined by newlines.
pub fn run(cmd: &mut Command) -> Output {
    run_within(cmd, TIMEOUT)
}

/// [`run`], allowed `limit`.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_within(&mut child, limit);
    Output { status, stdout: out.rest().join("\n").into_bytes(), stderr: err.rest().join("\n").into_bytes() }
}

/// Asserts tp succeeded, showing everything it printed if not; returns stdout.
pub fn expect_success(args: &[&str], out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tp {args:?} failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

/// Asserts tp failed with exactly one line on stderr starting with "tp: "
/// and containing `needle`; returns that line.
pub fn expect_error(args: &[&str], needle: &str) -> String {
    let out = tp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "tp {args:?} should fail; stderr: {stderr}");
    assert!(out.status.code().is_some(), "tp {args:?} died of signal {:?}", out.status.signal());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "tp {args:?} should print one line, printed: {stderr}");
    assert!(lines[0].starts_with("tp: "), "{stderr}");
    assert!(lines[0].contains(needle), "tp {args:?}: {:?} does not contain {needle:?}", lines[0]);
    assert!(!stderr.contains("panicked"), "{stderr}");
    lines[0].to_string()
}

/// A `tp attach` running in the foreground, stopped with SIGINT.
pub struct Session {
    pub child: Child,
    pub err: Lines,
    out: Lines,
}

impl Session {
    /// Starts `tp attach ARGS` and waits until it reports the probes live.
    pub fn start(args: &[&str]) -> Session {
        Self::start_with_env(args, &[])
    }

    /// [`Session::start`] with `env`; with a fault (`TP_FAULT`), tp may
    /// never report the probes live, and this returns at once.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Session {
        let fault = env.iter().any(|(k, _)| *k == "TP_FAULT");
        Self::spawn("attach", args, env, (!fault).then_some("tp: attached"))
    }

    /// Starts `tp SUBCOMMAND ARGS` and, given `ready`, waits for a line on
    /// stderr starting with it.
    pub fn spawn(sub: &str, args: &[&str], env: &[(&str, &str)], ready: Option<&str>) -> Session {
        let mut cmd = tp_command();
        cmd.arg(sub).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("run tp");
        let out = Lines::new(child.stdout.take().unwrap());
        let mut err = Lines::new(child.stderr.take().unwrap());
        if let Some(ready) = ready {
            err.wait_for(ready);
        }
        Session { child, err, out }
    }

    /// Starts `cmd` (tp, maybe behind a wrapper such as nsenter) and waits
    /// for a line on stderr starting with `ready`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn from_command(mut cmd: Command, ready: &str) -> Session {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run tp");
        let out = Lines::new(child.stdout.take().unwrap());
        let mut err = Lines::new(child.stderr.take().unwrap());
        err.wait_for(ready);
        Session { child, err, out }
    }

    /// Waits for a line on tp's stdout starting with `prefix` (every line
    /// stays in what [`Session::interrupt`] returns).
    pub fn wait_stdout(&mut self, prefix: &str) -> String {
        self.out.wait_for(prefix)
    }

    /// Sends SIGINT (as Ctrl-C does), waits for exit, returns (status, stdout, stderr).
    pub fn interrupt(mut self) -> (ExitStatus, String, String) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = wait_timeout(&mut self.child);
        (status, self.out.rest().join("\n"), self.err.rest().join("\n"))
    }

    /// Waits for tp to exit by itself; returns (status, stdout, stderr).
    pub fn wait(mut self) -> (ExitStatus, String, String) {
        let status = wait_timeout(&mut self.child);
        (status, self.out.rest().join("\n"), self.err.rest().join("\n"))
    }

    /// Kills tp with SIGKILL.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Session {
    /// A test that fails while tp runs (or is paused by a fault) must not
    /// leave it behind holding the target.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tp's JSON summary document in `stdout`: the last line of type `summary`
/// (docs/output.md).
pub fn summary_doc(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"type\":\"summary\""))
        .unwrap_or_else(|| panic!("no summary document in {stdout:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// The one process of the summary document in `stdout`: its `probes`,
/// `lost_events`, `children`, `stacks` and `by`.
pub fn one_process(stdout: &str) -> serde_json::Value {
    let v = summary_doc(stdout);
    let processes = v["processes"].as_array().unwrap_or_else(|| panic!("no processes in {v}"));
    assert_eq!(processes.len(), 1, "one process in {v}");
    processes[0].clone()
}

/// The steps objects (`--steps`) of the one process in a JSON summary.
pub fn steps_of(stdout: &str) -> Vec<serde_json::Value> {
    let p = one_process(stdout);
    p["steps"].as_array().unwrap_or_else(|| panic!("no steps in {p}")).clone()
}

/// The event lines (`entry`, `exit`, `unwound`) of tp's JSON output.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn json_events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{') && !l.starts_with("{\"type\":\"summary\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Parses tp's JSON summary of one process into (func -> hits).
pub fn hits_from_json(stdout: &str) -> std::collections::BTreeMap<String, u64> {
    one_process(stdout)["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["func"].as_str().unwrap().to_string(), p["hits"].as_u64().unwrap()))
        .collect()
}

/// Reads `len` bytes of a process's memory.
pub fn read_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// Asserts that each function's code in the process equals its bytes in the file.
pub fn assert_code_is_original(t: &Target, funcs: &[&str]) {
    let maps = tp::process::read_maps(t.pid).unwrap();
    let modules = tp::symbols::ProcessModules::new(t.pid, &maps).unwrap();
    let module = modules.main().unwrap();
    for name in funcs {
        let f = module.function(name).unwrap();
        let file = module.code_of(&f).unwrap();
        assert_eq!(read_mem(t.pid, f.addr.0, f.size as usize), file, "`{name}` differs from the file");
    }
}

/// The address of a function of the target's executable, and its first
/// bytes in the file (16, or all of a shorter function).
pub fn entry_in_file(t: &Target, func: &str) -> (u64, Vec<u8>) {
    let maps = tp::process::read_maps(t.pid).unwrap();
    let modules = tp::symbols::ProcessModules::new(t.pid, &maps).unwrap();
    let module = modules.main().unwrap();
    let f = module.function(func).unwrap();
    let code = module.code_of(&f).unwrap();
    (f.addr.0, code[..code.len().min(16)].to_vec())
}

/// The first bytes of a function as they are now in the process, and in the file.
pub fn entry_bytes(t: &Target, func: &str) -> (Vec<u8>, Vec<u8>) {
    let (addr, file) = entry_in_file(t, func);
    (read_mem(t.pid, addr, file.len()), file)
}

/// True if tp can hear the kernel's process events here (root in the
/// initial namespaces): it then says how a process ended ("was killed by
/// SIGKILL"), else only that it exited.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn hears_process_events() -> bool {
    tp::process::proc_events::Events::open().is_ok()
}

/// How tp says that process `pid` was killed by `signal`: with the signal
/// where it hears the kernel's process events, else as an exit.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn killed_line(pid: i32, signal: &str) -> String {
    if hears_process_events() {
        format!("process {pid} was killed by {signal}")
    } else {
        format!("process {pid} exited")
    }
}

/// True if the process has a tp data region mapped.
pub fn has_region(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().contains("/memfd:tp-data")
}

/// The executable code of process `pid`'s program (its executable mappings
/// of its own file), as the process holds it now.
pub fn executable_code(pid: i32) -> Vec<Vec<u8>> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let maps = tp::process::read_maps(pid).unwrap();
    let code: Vec<Vec<u8>> = maps
        .iter()
        .filter(|m| m.exec && std::path::Path::new(&m.path) == exe)
        .map(|m| read_mem(pid, m.start, (m.end - m.start) as usize))
        .collect();
    assert!(!code.is_empty(), "no executable mapping of {} in {pid}", exe.display());
    code
}
