//! Where things are and what the machine is: the tp binary, the target
//! programs, the peers that are installed, and the load average, which the
//! report prints beside the numbers (this machine is shared and noisy).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Paths and settings every section uses.
pub struct Env {
    /// The tp binary cargo built for this benchmark.
    pub tp: PathBuf,
    /// build.rs's `OUT_DIR/targets/`.
    pub targets: PathBuf,
    /// The repository root.
    pub root: PathBuf,
    /// Short runs that only check that everything works (CI).
    pub smoke: bool,
    /// Repetitions of every measurement.
    pub reps: usize,
}

impl Env {
    /// Paths from the build.
    pub fn new(smoke: bool, reps: usize) -> Env {
        Env {
            tp: PathBuf::from(env!("CARGO_BIN_EXE_tp")),
            targets: PathBuf::from(env!("TP_TARGETS_DIR")),
            root: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
            smoke,
            reps,
        }
    }

    /// A bundled target program.
    pub fn target(&self, name: &str) -> PathBuf {
        self.targets.join(name)
    }
}

/// The 1-, 5- and 15-minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The 1-minute load average as a number.
pub fn load1() -> f64 {
    load_average().split(' ').next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

/// First line of a command's output (stdout, else stderr), or None if it
/// cannot run.
pub fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = if out.stdout.is_empty() { out.stderr } else { out.stdout };
    String::from_utf8_lossy(&text).lines().next().map(str::to_string)
}

/// True if `program` is on PATH.
pub fn has(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(program))))
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// One line about the machine: CPU, cores, kernel.
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines().find(|l| l.starts_with(key)).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    };
    // An AArch64 kernel names no model: its implementer and part numbers
    // say which CPU it is, and its features what it has.
    let cpu = field("model name").unwrap_or_else(|| match (field("CPU implementer"), field("CPU part")) {
        (Some(i), Some(p)) => format!(
            "{} CPU (implementer {i}, part {p}{})",
            first_line("uname", &["-m"]).unwrap_or_default(),
            match field("Features") {
                Some(f) => {
                    let has = |x: &str| f.split_whitespace().any(|w| w == x);
                    format!("; LSE {}, PAC {}, BTI {}", yes(has("atomics")), yes(has("paca")), yes(has("bti")))
                }
                None => String::new(),
            }
        ),
        _ => "?".into(),
    });
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = first_line("uname", &["-r"]).unwrap_or_default();
    format!("{cpu}, {cores} CPUs, Linux {kernel}")
}

/// The CPU time of process `pid`'s threads so far, ns (their
/// `/proc/PID/task/*/schedstat`); NaN if the process is gone.
pub fn cpu_ns(pid: i32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return f64::NAN };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64
}
