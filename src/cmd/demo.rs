//! `tp demo`: the whole story on a bundled target. It starts `counter`,
//! lets two of its threads call `foo` and `bar`, attaches, shows live hits,
//! detaches, then checks the facts: tp's counts equal the target's own,
//! the target's checksum holds, its code is byte-identical to the file
//! again, and it exits 0. The target is built into tp (an installed tp has
//! no build directory): it is written to a directory of its own under the
//! temporary directory, mode 0700, and removed when the demo ends.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

use super::options::CommandLine;
use crate::cli::DemoArgs;
use crate::output::report::{self, ProcessReport, View};
use crate::output::thousands;
use crate::process;
use crate::session::observe::LiveView;
use crate::session::{Attached, End, Options, interrupt, observe};
use crate::symbols::ProcessModules;

/// The demo's target program, as the build made it.
const COUNTER: &[u8] = include_bytes!(concat!(env!("TP_TARGETS_DIR"), "/counter"));

/// A directory of the demo's own, removed with what it holds when dropped.
struct Scratch(PathBuf);

impl Scratch {
    /// A new directory under the temporary directory, only the user's
    /// (created here: one that exists already is someone else's).
    fn new() -> Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("tp-demo-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create a directory for the demo's program in `{}`", base.display()))?;
        Ok(Scratch(dir))
    }

    /// Writes the bundled `counter` there, executable by the user alone.
    fn counter(&self) -> Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.0.join("counter");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&path)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        f.write_all(COUNTER)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A target process driven through its stdin and stdout.
struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn start(path: &PathBuf) -> Result<Target> {
        let mut child = Command::new(path).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().with_context(|| {
            format!("cannot start the demo target `{}` (a directory mounted noexec?)", path.display())
        })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut t = Target { child, stdin, stdout };
        t.expect("ready")?;
        Ok(t)
    }

    fn expect(&mut self, prefix: &str) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if !line.starts_with(prefix) {
            bail!("the demo target said {line:?}, expected {prefix:?}");
        }
        Ok(line.trim_end().to_string())
    }

    fn ask(&mut self, cmd: &str, answer: &str) -> Result<String> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        self.expect(answer)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Runs `tp demo`.
pub fn run(args: DemoArgs) -> Result<ExitCode> {
    interrupt::install();
    let scratch = Scratch::new()?;
    let path = scratch.counter()?;
    let mut target = Target::start(&path)?;
    let pid = target.child.id() as i32;
    crate::say!("tp demo: started {} as process {pid}", path.display());

    let opts = Options::from_cli(CommandLine::Demo(&args, pid))?;
    let funcs = opts.selection.funcs.clone();
    let mut attached = Attached::attach(&opts)?;
    let mut guard = crate::session::guard::Restore::new(&mut attached, &*opts.notes);
    crate::say!(
        "tp demo: attached 2 probes in {:.1} ms (target stopped {} µs); two threads now call foo and bar",
        guard.get().attach_time.as_secs_f64() * 1e3,
        guard.get().stop_time.as_micros()
    );
    target.ask("spin 2", "spinning")?;
    let mut view = LiveView::new(guard.get(), None);
    let end = observe(guard.get_mut(), opts.duration, &mut view, None, None, &*opts.notes)?;
    let stopped = target.ask("stop", "stopped")?;
    let d = guard.detach()?;
    if end == End::Interrupted {
        crate::say!("tp demo: interrupted");
    }
    crate::say!("tp demo: detached, code restored (target stopped {} µs)", d.stop_time.as_micros());
    let mut out = crate::streams::stdout();
    report::write_text(&mut out, &[ProcessReport::counts(d.summary.clone())], View { all: true, top: None })?;

    // The facts.
    let own_foo = field(&stopped, "foo").context("target's foo count")?;
    let own_bar = field(&stopped, "bar").context("target's bar count")?;
    let hits = |name: &str| d.summary.probes.iter().find(|p| p.func == name).map_or(0, |p| p.hits);
    let checksum_ok = stopped.contains("checksum=ok");
    let code_ok = code_matches_file(pid, &funcs)?;
    target.ask("quit", "").ok();
    let status = target.child.wait()?;
    let checks = [
        (
            format!("foo: tp counted {}, the target counted {}", thousands(hits("foo")), thousands(own_foo)),
            hits("foo") == own_foo,
        ),
        (
            format!("bar: tp counted {}, the target counted {}", thousands(hits("bar")), thousands(own_bar)),
            hits("bar") == own_bar,
        ),
        ("the target's checksum of every result holds".to_string(), checksum_ok),
        ("foo and bar are byte-identical to the file again".to_string(), code_ok),
        (format!("the target exited with {status}"), status.success()),
    ];
    let mut all = true;
    for (what, ok) in &checks {
        crate::say!("tp demo: {} {what}", if *ok { "✓" } else { "✗" });
        all &= ok;
    }
    Ok(if all { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// True if the in-memory code of each function equals its bytes in the file.
fn code_matches_file(pid: i32, funcs: &[String]) -> Result<bool> {
    let maps = process::read_maps(pid)?;
    let modules = ProcessModules::new(pid, &maps)?;
    let module = modules.main()?;
    let mem = process::memory::Memory::open(pid)?;
    for name in funcs {
        let f = module.function(name)?;
        if mem.read_vec(f.addr.0, f.size as usize)? != module.code_of(&f)? {
            return Ok(false);
        }
    }
    Ok(true)
}
