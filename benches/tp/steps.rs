//! Instructions per hit, counted exactly: the benchmark single-steps one
//! call of `one_call()` → `work()` in the `hot step` target with ptrace,
//! unprobed and then under each kind of tp probe, and sorts the executed
//! instructions into the function's own, the detour's and the runtime's.
//! The counts do not depend on the machine's load, so they are the figure to
//! track from change to change, and the listing is the profile of the hit
//! path.
//!
//! (valgrind's callgrind cannot give this figure: it runs the guest's code
//! from its own translations and keeps its own map of the address space, so
//! it never sees tp's patch unless run with --smc-check=all, and then the
//! jump into tp's arena, which it did not map, ends in SIGSEGV.)

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::env::Env;
use crate::hit::{Records, open_region};
use crate::peers::file_offset;
use crate::proc::Proc;

/// What one call executed.
#[derive(Debug, Clone, Default)]
pub struct Count {
    /// Instructions from `one_call`'s first to its `ret`, inclusive.
    pub total: usize,
    /// Of those, in the target's own code.
    pub own: usize,
    /// In the probe's detour.
    pub detour: usize,
    /// In tp's runtime (event recording, the return trampoline).
    pub runtime: usize,
    /// The instructions outside the target's code, in order: `where  insn`.
    pub listing: Vec<String>,
}

/// Counts one call of `function` unprobed and one under `records` (None:
/// unprobed only), in the target build `build` (`hot`, or `hot-nop5`, whose
/// `work()` starts with a 5-byte nop).
pub fn count(env: &Env, build: &str, records: Option<Records>, function: &str) -> Result<(Count, Option<Count>)> {
    let binary = env.target(build);
    let mut target = Proc::spawn("hot step", &binary, &["step".into(), "120".into(), function.into()], false)?;
    target.wait_prefix("ready", Duration::from_secs(30))?;
    let pid = target.pid();
    let base = step_calls(pid, &binary, 0)?;
    let Some(records) = records else { return Ok((base, None)) };
    let mut args: Vec<String> =
        ["attach", "-p", &pid.to_string(), "-f", function, "-q", "--json"].map(String::from).into();
    let (extra, vars) = records.tp_args();
    args.extend(extra);
    let mut tp = Proc::spawn_env("tp", &env.tp, &args, false, &vars)?;
    tp.wait_prefix("tp: attached", Duration::from_secs(30))?;
    if records == Records::Disabled {
        crate::hit::set_enabled(pid, function, false)?;
    }
    let session = tp.pid() as u32;
    let probed = step_calls(pid, &binary, session);
    tp.stop(libc::SIGINT, Duration::from_secs(30));
    Ok((base, Some(probed?)))
}

/// Steps through three calls and returns the last, after checking that the
/// second and third executed the same number of instructions (the first
/// event of a thread also claims its slot in tp's region).
fn step_calls(pid: i32, binary: &Path, owner: u32) -> Result<Count> {
    let pid = Pid::from_raw(pid);
    ptrace::attach(pid).context("PTRACE_ATTACH")?;
    let result = (|| {
        wait_stop(pid)?;
        let entry = function_address(pid, binary, "one_call")?;
        let detours = detours(pid.as_raw(), owner);
        let mut counts = Vec::new();
        for _ in 0..3 {
            counts.push(one_call(pid, entry, binary, &detours)?);
        }
        if counts[1].total != counts[2].total {
            bail!("two calls executed {} and {} instructions", counts[1].total, counts[2].total);
        }
        Ok(counts.pop().expect("three counts"))
    })();
    let _ = ptrace::detach(pid, None);
    result
}

/// Waits for the next stop; a signal other than the trace trap is an error.
fn wait_stop(pid: Pid) -> Result<()> {
    match waitpid(pid, None)? {
        WaitStatus::Stopped(_, Signal::SIGTRAP | Signal::SIGSTOP) => Ok(()),
        other => bail!("unexpected stop while stepping: {other:?}"),
    }
}

fn step(pid: Pid) -> Result<u64> {
    ptrace::step(pid, None)?;
    wait_stop(pid)?;
    Ok(pc_of(&ptrace::getregs(pid)?))
}

// The program counter and stack pointer of a register set, where a call
// that starts now returns to, and one instruction's text.
#[cfg(target_arch = "x86_64")]
fn pc_of(r: &libc::user_regs_struct) -> u64 {
    r.rip
}
#[cfg(target_arch = "x86_64")]
fn sp_of(r: &libc::user_regs_struct) -> u64 {
    r.rsp
}
/// At a function's first instruction: the return address the call pushed.
#[cfg(target_arch = "x86_64")]
fn return_address(mem: &std::fs::File, r: &libc::user_regs_struct) -> Result<u64> {
    let mut word = [0u8; 8];
    mem.read_exact_at(&mut word, r.rsp)?;
    Ok(u64::from_le_bytes(word))
}
#[cfg(target_arch = "x86_64")]
fn disassemble(bytes: &[u8], pc: u64) -> Option<String> {
    tp::arch::x86_64::decode::disassemble(bytes, pc).into_iter().next()
}
#[cfg(target_arch = "aarch64")]
fn pc_of(r: &libc::user_regs_struct) -> u64 {
    r.pc
}
#[cfg(target_arch = "aarch64")]
fn sp_of(r: &libc::user_regs_struct) -> u64 {
    r.sp
}
/// At a function's first instruction: the link register.
#[cfg(target_arch = "aarch64")]
fn return_address(_mem: &std::fs::File, r: &libc::user_regs_struct) -> Result<u64> {
    Ok(r.regs[30])
}
#[cfg(target_arch = "aarch64")]
fn disassemble(bytes: &[u8], pc: u64) -> Option<String> {
    tp::arch::aarch64::decode::disassemble(&bytes[..bytes.len().min(4)], pc).into_iter().next()
}

/// Steps to the next entry of `one_call` at `entry`, then through the call
/// until it has returned.
fn one_call(pid: Pid, entry: u64, binary: &Path, detours: &[(u64, u64)]) -> Result<Count> {
    let mut regs = ptrace::getregs(pid)?;
    let mut n = 0;
    while pc_of(&regs) != entry {
        step(pid)?;
        regs = ptrace::getregs(pid)?;
        n += 1;
        if n > 1_000_000 {
            bail!("one_call was not reached in {n} steps");
        }
    }
    let own = own_code(pid.as_raw(), binary)?;
    let sp = sp_of(&regs);
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let back = return_address(&mem, &regs)?;
    let mut c = Count::default();
    let mut pc = pc_of(&regs);
    loop {
        c.total += 1;
        if own.iter().any(|&(lo, hi)| (lo..hi).contains(&pc)) {
            c.own += 1;
        } else {
            let in_detour = detours.iter().any(|&(lo, hi)| (lo..hi).contains(&pc));
            if in_detour {
                c.detour += 1;
            } else {
                c.runtime += 1;
            }
            let mut bytes = [0u8; 16];
            let got = mem.read_at(&mut bytes, pc).unwrap_or(0);
            let insn = disassemble(&bytes[..got], pc);
            let place = if in_detour { "detour " } else { "runtime" };
            c.listing.push(format!("{place}  {}", insn.unwrap_or_else(|| "?".into())));
        }
        pc = step(pid)?;
        // Back in the caller, with the stack it called from (a return
        // through tp's trampoline passes its own address first).
        if pc == back && sp_of(&ptrace::getregs(pid)?) >= sp {
            return Ok(c);
        }
        if c.total > 100_000 {
            bail!("one_call did not return within {} instructions", c.total);
        }
    }
}

/// The executable mappings of `binary` in `pid`.
fn own_code(pid: i32, binary: &Path) -> Result<Vec<(u64, u64)>> {
    let path = binary.canonicalize()?;
    let maps = tp::process::read_maps(pid)?;
    Ok(maps.iter().filter(|m| m.exec && Path::new(&m.path) == path).map(|m| (m.start, m.end)).collect())
}

/// Address of `sym` in process `pid` (from its file offset and the mapping
/// of that offset).
fn function_address(pid: Pid, binary: &Path, sym: &str) -> Result<u64> {
    let off = file_offset(binary, sym)?;
    let path = binary.canonicalize()?;
    let maps = tp::process::read_maps(pid.as_raw())?;
    maps.iter()
        .find(|m| Path::new(&m.path) == path && (m.offset..m.offset + m.len()).contains(&off))
        .map(|m| m.start + off - m.offset)
        .with_context(|| format!("`{sym}` is not mapped in {pid}"))
}

/// The detours of the probes owned by `owner`, as address ranges.
fn detours(pid: i32, owner: u32) -> Vec<(u64, u64)> {
    let Ok(region) = open_region(pid) else { return Vec::new() };
    region
        .entries()
        .into_iter()
        .filter(|(_, e)| owner != 0 && e.owner == owner)
        .map(|(_, e)| (e.detour, e.detour + u64::from(e.detour_len)))
        .collect()
}

/// What `tp list-probes` says of each of `functions` of the `hot` target:
/// its window (`ok (6 bytes: imul)`).
pub fn windows(env: &Env, functions: &[&str]) -> Result<Vec<(String, String)>> {
    let out = std::process::Command::new(&env.tp).arg("list-probes").arg(env.target("hot")).output()?;
    if !out.status.success() {
        bail!("tp list-probes failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    functions
        .iter()
        .map(|&f| {
            // ADDRESS SIZE FUNCTION SOURCE VERDICT...
            let line = text
                .lines()
                .find(|l| l.split_whitespace().nth(2) == Some(f))
                .with_context(|| format!("`{f}` is not in tp list-probes' output"))?;
            let verdict = line.split_whitespace().skip(4).collect::<Vec<_>>().join(" ");
            Ok((f.to_string(), verdict))
        })
        .collect()
}
