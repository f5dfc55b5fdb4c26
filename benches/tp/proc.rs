//! Processes the benchmark starts: their output lines, read on threads with
//! arrival times so waits can time out, and stopping them by their own PID
//! (SIGINT, then SIGTERM, then SIGKILL). A process still running when its
//! handle is dropped is killed, so no run leaves a target or tracer behind.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One line of output and when it arrived.
#[derive(Debug, Clone)]
pub struct Line {
    /// When the reader thread got it.
    pub at: Instant,
    /// Which stream: true for stderr.
    pub stderr: bool,
    /// The text, without the newline.
    pub text: String,
}

/// A started process.
pub struct Proc {
    /// A short name for messages.
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Line>,
    /// Every line read so far, in arrival order.
    pub seen: Vec<Line>,
    /// When it was started (just before the spawn).
    pub started: Instant,
    /// The exit status, once known.
    status: Option<ExitStatus>,
}

fn reader(r: impl Read + Send + 'static, stderr: bool, tx: Sender<Line>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(text) = line else { break };
            if tx.send(Line { at: Instant::now(), stderr, text }).is_err() {
                break;
            }
        }
    });
}

impl Proc {
    /// Starts `program` with `args`; with `stdin`, its standard input is a pipe.
    pub fn spawn(name: &str, program: &Path, args: &[String], stdin: bool) -> Result<Proc> {
        Proc::spawn_env(name, program, args, stdin, &[])
    }

    /// [`Proc::spawn`] with `vars` added to its environment.
    pub fn spawn_env(name: &str, program: &Path, args: &[String], stdin: bool, vars: &[(&str, &str)]) -> Result<Proc> {
        let mut cmd = Command::new(program);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.envs(vars.iter().copied());
        cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() });
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", program.display()))?;
        let (tx, rx) = channel();
        reader(child.stdout.take().expect("piped"), false, tx.clone());
        reader(child.stderr.take().expect("piped"), true, tx);
        let stdin = child.stdin.take();
        Ok(Proc { name: name.to_string(), child, stdin, rx, seen: Vec::new(), started, status: None })
    }

    /// The process ID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the next line (from where the last wait stopped) for which
    /// `pred` holds; fails at the timeout or when the output ends first.
    pub fn wait_for(&mut self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> Result<Line> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line.text) {
                        return Ok(line);
                    }
                }
                Err(e) => bail!(
                    "{}: no {what} after {:.1} s ({e}); its output:\n{}",
                    self.name,
                    timeout.as_secs_f64(),
                    self.text()
                ),
            }
        }
    }

    /// Waits for a line starting with `prefix`.
    pub fn wait_prefix(&mut self, prefix: &str, timeout: Duration) -> Result<Line> {
        self.wait_for(&format!("`{prefix}` line"), timeout, |l| l.starts_with(prefix))
    }

    /// Writes `text` to the process's standard input.
    pub fn send(&mut self, text: &str) -> Result<()> {
        use std::io::Write;
        let stdin = self.stdin.as_mut().context("no stdin pipe")?;
        stdin.write_all(text.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    /// Closes standard input.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `sig` to the process (not to its group).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits up to `timeout` for the exit; collects the remaining output.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.status.is_none() {
            match self.child.try_wait() {
                Ok(Some(s)) => self.status = Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                _ => break,
            }
        }
        if self.status.is_some() {
            // The readers end when the pipes close; give them a moment.
            let until = Instant::now() + Duration::from_secs(2);
            while let Ok(line) = self.rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                self.seen.push(line);
            }
        }
        self.status
    }

    /// Stops the process: `sig`, then SIGTERM, then SIGKILL, waiting after each.
    pub fn stop(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        for (s, t) in [(sig, timeout), (libc::SIGTERM, Duration::from_secs(5)), (libc::SIGKILL, Duration::from_secs(5))]
        {
            if self.status.is_some() || self.wait_exit(Duration::ZERO).is_some() {
                break;
            }
            self.signal(s);
            if self.wait_exit(t).is_some() {
                break;
            }
        }
        self.status
    }

    /// Everything read so far, one line each, stderr lines marked.
    pub fn text(&self) -> String {
        self.seen
            .iter()
            .map(|l| if l.stderr { format!("  ! {}", l.text) } else { format!("  | {}", l.text) })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The last line seen that starts with `prefix`.
    pub fn last(&self, prefix: &str) -> Option<&Line> {
        self.seen.iter().rev().find(|l| l.text.starts_with(prefix))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() && self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `key=value` tokens of a line, as the targets print them.
pub fn kv<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
}

/// A `key=value` token parsed as a number.
pub fn kv_f64(line: &str, key: &str) -> Option<f64> {
    kv(line, key)?.parse().ok()
}

/// The number before `unit` in `text` ("in 4.1 ms" → 4.1 for "ms"; the
/// first occurrence after `after`).
pub fn number_before(text: &str, after: &str, unit: &str) -> Option<f64> {
    let rest = &text[text.find(after)? + after.len()..];
    let end = rest.find(unit)?;
    rest[..end].trim().rsplit(' ').next()?.parse().ok()
}
