//! The tools a user would pick instead of tp, driven as a user drives them,
//! against the same target and measured the same way (see hit.rs): Linux
//! uprobes through tracefs (the int3 path, and the path Linux >= 6.18 takes
//! for a 5-byte nop at the entry), gdb, and Frida when its Python package is
//! installed. Adapted from the peer survey that preceded tp.
//!
//! The uprobes this module adds live in the tracefs group `tpbench`; they are
//! removed after every run, and at start and exit of the benchmark.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::env::{Env, has};
use crate::hit::{Outcome, Records, Sizes, Tracer};
use crate::proc::{Proc, kv};

const TRACEFS: &str = "/sys/kernel/tracing";
const GROUP: &str = "tpbench";

/// Mounts tracefs if needed; Err says why uprobes cannot be used.
pub fn tracefs_ready() -> Result<()> {
    let events = Path::new(TRACEFS).join("uprobe_events");
    if !events.exists() {
        let _ = std::process::Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]).output();
    }
    if !events.exists() {
        bail!("no {} (tracefs cannot be mounted, or the kernel has no uprobe events)", events.display());
    }
    Ok(())
}

fn tracefs_write(file: &str, line: &str, append: bool) -> Result<()> {
    let path = Path::new(TRACEFS).join(file);
    let mut f = OpenOptions::new()
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    f.write_all(format!("{line}\n").as_bytes()).with_context(|| format!("write `{line}` to {}", path.display()))
}

/// Disables and removes every uprobe of the group `tpbench`.
pub fn tracefs_cleanup() {
    let group = Path::new(TRACEFS).join("events").join(GROUP);
    if group.is_dir() {
        let _ = tracefs_write(&format!("events/{GROUP}/enable"), "0", false);
    }
    let Ok(events) = std::fs::read_to_string(Path::new(TRACEFS).join("uprobe_events")) else { return };
    for l in events.lines() {
        let Some(name) = l.split_whitespace().next().and_then(|n| n.split_once(':')).map(|(_, n)| n) else {
            continue;
        };
        if name.starts_with(&format!("{GROUP}/")) {
            let _ = tracefs_write("uprobe_events", &format!("-:{name}"), true);
        }
    }
}

/// The file offset of `sym` in the ELF file `path` (what uprobe_events takes).
pub fn file_offset(path: &Path, sym: &str) -> Result<u64> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let elf = goblin::elf::Elf::parse(&bytes).with_context(|| format!("parse {}", path.display()))?;
    let vaddr = elf
        .syms
        .iter()
        .find(|s| elf.strtab.get_at(s.st_name) == Some(sym))
        .map(|s| s.st_value)
        .with_context(|| format!("no `{sym}` in {}", path.display()))?;
    elf.program_headers
        .iter()
        .find(|ph| ph.p_type == goblin::elf::program_header::PT_LOAD && ph.vm_range().contains(&(vaddr as usize)))
        .map(|ph| vaddr - ph.p_vaddr + ph.p_offset)
        .with_context(|| format!("no LOAD segment holds `{sym}`"))
}

/// Linux uprobes defined through `uprobe_events`, enabled with one write for
/// the group, counted from `uprobe_profile`.
pub struct Uprobe {
    label: &'static str,
    records: Records,
    binary: &'static str,
    sizes: Sizes,
    path: Option<PathBuf>,
}

impl Uprobe {
    /// A uprobe on `work()`'s first instruction (`imul`: single-stepped out of line).
    pub fn int3() -> Uprobe {
        Uprobe {
            label: "uprobe (int3)",
            records: Records::Count,
            binary: "hot",
            sizes: Sizes { bursts: 11, calls: 2_000, pause_us: 0 },
            path: None,
        }
    }

    /// A uprobe on a 5-byte nop, which Linux >= 6.18 turns into a call to a
    /// trampoline that makes a syscall.
    pub fn nop5() -> Uprobe {
        Uprobe {
            label: "uprobe on nop5 (optimized)",
            binary: "hot-nop5",
            sizes: Sizes { bursts: 11, calls: 20_000, pause_us: 0 },
            ..Uprobe::int3()
        }
    }

    /// A uprobe that fetches the first argument into the trace buffer.
    pub fn args() -> Uprobe {
        Uprobe { label: "uprobe (int3) + arg", records: Records::Args, ..Uprobe::int3() }
    }

    /// A uprobe and a uretprobe on `work()`.
    pub fn ret() -> Uprobe {
        Uprobe { label: "uprobe + uretprobe", records: Records::Ret, ..Uprobe::int3() }
    }
}

impl Tracer for Uprobe {
    fn name(&self) -> String {
        self.label.to_string()
    }

    fn records(&self) -> Records {
        self.records
    }

    fn binary(&self) -> &'static str {
        self.binary
    }

    fn sizes(&self) -> Sizes {
        self.sizes
    }

    fn hits_per_call(&self) -> u64 {
        if self.records == Records::Ret { 2 } else { 1 }
    }

    fn start(&mut self, _env: &Env, _pid: i32, binary: &Path) -> Result<()> {
        tracefs_cleanup();
        let off = file_offset(binary, "work")?;
        let at = format!("{}:{off:#x}", binary.display());
        match self.records {
            Records::Args => tracefs_write("uprobe_events", &format!("p:{GROUP}/work {at} x=%di:s32"), true)?,
            Records::Ret => {
                tracefs_write("uprobe_events", &format!("p:{GROUP}/work {at}"), true)?;
                tracefs_write("uprobe_events", &format!("r:{GROUP}/work_ret {at} ret=%ax:s32"), true)?;
            }
            _ => tracefs_write("uprobe_events", &format!("p:{GROUP}/work {at}"), true)?,
        }
        // One write enables the whole group, so an entry/return pair goes live together.
        tracefs_write(&format!("events/{GROUP}/enable"), "1", false)?;
        self.path = Some(binary.to_path_buf());
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let profile = std::fs::read_to_string(Path::new(TRACEFS).join("uprobe_profile")).unwrap_or_default();
        tracefs_cleanup();
        let path = self.path.take().context("uprobe was not started")?;
        let path = path.display().to_string();
        // Lines: "  PATH  EVENT  HITS" (the event without its group).
        let hits: u64 = profile
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[0] == path && f[1].starts_with("work")).then(|| f[2].parse::<u64>().ok())?
            })
            .sum();
        Ok(Outcome { hits: Some(hits), ..Outcome::default() })
    }
}

/// gdb: `break work` with `silent; continue`, attached with `gdb -p`; it
/// stops at `bench_done`, prints the hit count, detaches and quits.
pub struct Gdb {
    session: Option<Proc>,
    script: Option<PathBuf>,
}

impl Gdb {
    /// The gdb peer, or why it is unavailable.
    pub fn new() -> Result<Gdb> {
        if !has("gdb") {
            bail!("gdb is not installed");
        }
        Ok(Gdb { session: None, script: None })
    }
}

impl Tracer for Gdb {
    fn name(&self) -> String {
        "gdb break + silent, continue".into()
    }

    fn records(&self) -> Records {
        Records::Count
    }

    fn sizes(&self) -> Sizes {
        Sizes { bursts: 5, calls: 200, pause_us: 0 }
    }

    fn start(&mut self, _env: &Env, pid: i32, _binary: &Path) -> Result<()> {
        let script = std::env::temp_dir().join(format!("tp-bench-gdb-{}.gdb", std::process::id()));
        std::fs::write(
            &script,
            "set pagination off\nset confirm off\nset width 0\n\
             break work\ncommands\nsilent\ncontinue\nend\n\
             break bench_done\ncontinue\ninfo breakpoints\ndelete\ndetach\nquit\n",
        )?;
        let args: Vec<String> =
            ["-nx", "-batch", "-p", &pid.to_string(), "-x", &script.display().to_string()].map(String::from).into();
        self.session = Some(Proc::spawn("gdb", Path::new("gdb"), &args, false)?);
        self.script = Some(script);
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let mut p = self.session.take().context("gdb was not started")?;
        if p.wait_exit(Duration::from_secs(120)).is_none() {
            p.stop(libc::SIGINT, Duration::from_secs(30));
        }
        if let Some(s) = self.script.take() {
            let _ = std::fs::remove_file(s);
        }
        // "1  breakpoint  keep y  0x... in work at ..." then "\tbreakpoint already hit N times".
        let lines: Vec<&str> = p.seen.iter().map(|l| l.text.as_str()).collect();
        let first = lines.iter().position(|l| l.starts_with("1 ") && l.contains("breakpoint"));
        let hits = first.and_then(|i| {
            lines[i + 1..].iter().take(4).find_map(|l| {
                let l = l.trim();
                l.strip_prefix("breakpoint already hit ")?.split_whitespace().next()?.parse().ok()
            })
        });
        Ok(Outcome { hits, ..Outcome::default() })
    }
}

/// Frida through its Python bindings (benches/frida_probe.py): Interceptor
/// with a CModule callback, Frida's fastest native path.
pub struct Frida {
    records: Records,
    session: Option<Proc>,
}

impl Frida {
    /// The Frida peer recording `records`, or why it is unavailable.
    pub fn new(records: Records) -> Result<Frida> {
        let ok = std::process::Command::new("python3")
            .args(["-c", "import frida"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            bail!("the Python package `frida` is not installed (`pip install frida` adds it)");
        }
        Ok(Frida { records, session: None })
    }

    fn variant(&self) -> &'static str {
        match self.records {
            Records::Args => "cmod_args",
            Records::Ret => "cmod_enter_leave",
            _ => "cmod",
        }
    }
}

impl Tracer for Frida {
    fn name(&self) -> String {
        match self.records {
            Records::Args => "Frida CModule onEnter reading arg 0".into(),
            Records::Ret => "Frida CModule onEnter + onLeave".into(),
            _ => "Frida CModule onEnter count".into(),
        }
    }

    fn records(&self) -> Records {
        self.records
    }

    fn sizes(&self) -> Sizes {
        Sizes { bursts: 11, calls: 100_000, pause_us: 0 }
    }

    fn hits_per_call(&self) -> u64 {
        if self.records == Records::Ret { 2 } else { 1 }
    }

    fn start(&mut self, env: &Env, pid: i32, _binary: &Path) -> Result<()> {
        let script = env.root.join("benches/frida_probe.py");
        let args: Vec<String> = vec![
            script.display().to_string(),
            "--pid".into(),
            pid.to_string(),
            "--variant".into(),
            self.variant().into(),
        ];
        let mut p = Proc::spawn("frida", Path::new("python3"), &args, true)?;
        p.wait_for("`live` line", Duration::from_secs(60), |l| l.starts_with("live") || l.starts_with("error="))?;
        if let Some(e) = p.last("error=") {
            bail!("frida: {}", e.text);
        }
        self.session = Some(p);
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let mut p = self.session.take().context("frida was not started")?;
        let _ = p.send("stop\n");
        let done = p.wait_prefix("detached", Duration::from_secs(60));
        p.close_stdin();
        p.stop(libc::SIGINT, Duration::from_secs(10));
        let done = done?;
        let count = |k: &str| kv(&done.text, k).and_then(|v| v.parse::<i64>().ok()).filter(|&v| v >= 0);
        let hits = match self.records {
            Records::Ret => count("count").zip(count("leaves")).map(|(a, b)| (a + b) as u64),
            _ => count("count").map(|c| c as u64),
        };
        Ok(Outcome { hits, ..Outcome::default() })
    }
}

/// bpftrace counting `work()`'s user stacks, as its users write it:
/// `uprobe:BIN:work { @[ustack(N)] = count(); }` (frame pointers, walked in
/// the kernel). The map it prints at exit holds the hits.
pub struct Bpftrace {
    depth: u32,
    session: Option<Proc>,
}

impl Bpftrace {
    /// The bpftrace peer walking `depth` frames, or why it is unavailable.
    pub fn ustack(depth: u32) -> Result<Bpftrace> {
        if !has("bpftrace") {
            bail!("bpftrace is not installed (tests/deps.sh need bpftrace)");
        }
        Ok(Bpftrace { depth, session: None })
    }
}

impl Tracer for Bpftrace {
    fn name(&self) -> String {
        format!("bpftrace @[ustack({})] = count()", self.depth)
    }

    fn records(&self) -> Records {
        Records::StackFp(self.depth)
    }

    fn sizes(&self) -> Sizes {
        Sizes { bursts: 11, calls: 2_000, pause_us: 0 }
    }

    fn start(&mut self, _env: &Env, pid: i32, binary: &Path) -> Result<()> {
        let program = format!("uprobe:{}:work {{ @[ustack({})] = count(); }}", binary.display(), self.depth);
        let args: Vec<String> = vec!["-p".into(), pid.to_string(), "-e".into(), program];
        let mut p = Proc::spawn("bpftrace", Path::new("bpftrace"), &args, false)?;
        p.wait_prefix("Attaching", Duration::from_secs(60))?;
        self.session = Some(p);
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let mut p = self.session.take().context("bpftrace was not started")?;
        p.stop(libc::SIGINT, Duration::from_secs(60));
        // Map entries end with "]: N".
        let hits = p.seen.iter().filter_map(|l| l.text.rsplit_once("]: ")?.1.trim().parse::<u64>().ok()).sum();
        Ok(Outcome { hits: Some(hits), ..Outcome::default() })
    }
}

/// perf recording every call of `work()` with its call graph, as its users
/// do: a uprobe event (`perf probe -x BIN tpbench:work=work`) and `perf
/// record -e tpbench:work --call-graph fp|dwarf,SIZE -p PID`; the samples
/// it wrote are the hits.
pub struct Perf {
    records: Records,
    session: Option<Proc>,
    data: PathBuf,
}

impl Perf {
    /// perf with frame pointers (`StackFp`) or a copy of the stack (`StackCopy`).
    pub fn call_graph(records: Records) -> Result<Perf> {
        if !has("perf") {
            bail!("perf is not installed (tests/deps.sh need linux-perf)");
        }
        let data = std::env::temp_dir().join(format!("tp-bench-perf-{}.data", std::process::id()));
        Ok(Perf { records, session: None, data })
    }

    fn mode(&self) -> String {
        match self.records {
            Records::StackCopy(bytes) => format!("dwarf,{bytes}"),
            _ => "fp".into(),
        }
    }
}

impl Tracer for Perf {
    fn name(&self) -> String {
        format!("perf record --call-graph {}", self.mode())
    }

    fn records(&self) -> Records {
        self.records
    }

    fn sizes(&self) -> Sizes {
        Sizes { bursts: 11, calls: 2_000, pause_us: 20_000 }
    }

    fn start(&mut self, _env: &Env, pid: i32, binary: &Path) -> Result<()> {
        tracefs_cleanup();
        let out = std::process::Command::new("perf")
            .args(["probe", "-q", "-x"])
            .arg(binary)
            .arg(format!("{GROUP}:work=work"))
            .output()
            .context("perf probe")?;
        if !out.status.success() {
            bail!("perf probe failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let args: Vec<String> = [
            "record",
            "-q",
            "-e",
            &format!("{GROUP}:work"),
            "--call-graph",
            &self.mode(),
            "-p",
            &pid.to_string(),
            "-o",
            &self.data.display().to_string(),
        ]
        .map(String::from)
        .into();
        self.session = Some(Proc::spawn("perf", Path::new("perf"), &args, false)?);
        Ok(())
    }

    fn stop(&mut self) -> Result<Outcome> {
        let mut p = self.session.take().context("perf was not started")?;
        p.stop(libc::SIGINT, Duration::from_secs(120));
        let out = std::process::Command::new("perf")
            .args(["report", "--stdio", "-q", "--no-children", "--sort", "comm", "-n", "-i"])
            .arg(&self.data)
            .output();
        let _ = std::fs::remove_file(&self.data);
        tracefs_cleanup();
        // "  100.00%  SAMPLES  hot": the sample counts per command.
        let hits = out.ok().map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        });
        Ok(Outcome { hits, ..Outcome::default() })
    }
}
