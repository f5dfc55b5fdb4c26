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
use tp::arch::aarch64::decode::{Class, classify};

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
    // Long enough for an emulated CPU under load, where tp's attach and
    // the stepping take minutes; the target is killed when dropped.
    let mut target = Proc::spawn("hot step", &binary, &["step".into(), "1200".into(), function.into()], false)?;
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

/// Executes the instruction at `pc`, or the whole of an exclusive sequence
/// that starts there ([`exclusive_exits`]); returns the new PC and how
/// many instructions ran (more than one only for a sequence, which runs
/// straight from `pc`).
fn advance(pid: Pid, mem: &std::fs::File, pc: u64) -> Result<(u64, usize)> {
    if cfg!(target_arch = "aarch64") {
        let mut bytes = [0u8; 4 * 18];
        let got = mem.read_at(&mut bytes, pc).unwrap_or(0);
        let words: Vec<u32> = bytes[..got].chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
        if let Some(exits) = exclusive_exits(&words, pc) {
            return run_to_exit(pid, mem, &exits);
        }
    }
    Ok((step(pid)?, 1))
}

/// The ways out of an AArch64 exclusive sequence starting at `pc` (`code`:
/// the words from there), each with how many instructions one pass that
/// leaves there executes and the branch that leaves (None: the fall
/// through, last); None unless `code` starts with a load-exclusive
/// followed within 16 instructions by a store-exclusive. Single-stepping
/// such a sequence may retry it for ever (the step's exception can clear
/// the exclusive monitor), so it runs at full speed to its first way out,
/// as debuggers do, and counts as one pass: the branch after the
/// store-exclusive that retries falls through, or a conditional branch
/// inside leaves (a compare-and-swap whose compare failed).
fn exclusive_exits(code: &[u32], pc: u64) -> Option<Vec<Exit>> {
    let exclusive = |w: u32| classify(w, 0) == Class::Exclusive;
    let load = |w: u32| (w >> 22) & 1 == 1;
    if !code.first().is_some_and(|&w| exclusive(w) && load(w)) {
        return None;
    }
    let store = code.iter().take(16).position(|&w| exclusive(w) && !load(w))?;
    let last = if code.get(store + 1).is_some_and(|&w| branch_target(w, 0).is_some()) { store + 1 } else { store };
    let at = |i: usize| pc + 4 * i as u64;
    let mut exits: Vec<Exit> = (0..=last)
        .filter_map(|i| Some((branch_target(code[i], at(i))?, i + 1, Some(code[i]))))
        .filter(|&(t, _, _)| t < pc || t > at(last))
        .collect();
    exits.push((at(last + 1), last + 1, None));
    Some(exits)
}

/// A way out of an exclusive sequence: its address, how many instructions
/// a pass that leaves there runs, and the branch that leaves (None: the
/// fall through).
type Exit = (u64, usize, Option<u32>);

/// True if the AArch64 conditional branch `w` is taken with the registers
/// `r` (those it tests are not written after it in a sequence).
#[cfg(target_arch = "aarch64")]
fn taken(w: u32, r: &libc::user_regs_struct) -> bool {
    let reg = |n: u32| if n == 31 { 0 } else { r.regs[n as usize] };
    if w & 0x7e00_0000 == 0x3400_0000 {
        // cbz / cbnz, on 32 or 64 bits
        let v = if w >> 31 == 1 { reg(w & 31) } else { reg(w & 31) & 0xffff_ffff };
        return (v != 0) == ((w >> 24) & 1 == 1);
    }
    if w & 0x7e00_0000 == 0x3600_0000 {
        // tbz / tbnz
        let bit = ((w >> 31) << 5) | ((w >> 19) & 31);
        return ((reg(w & 31) >> bit) & 1 == 1) == ((w >> 24) & 1 == 1);
    }
    let flag = |k: u32| (r.pstate >> k) & 1 == 1;
    let (n, z, c, v) = (flag(31), flag(30), flag(29), flag(28));
    let cond = w & 15;
    let base = match cond >> 1 {
        0 => z,
        1 => c,
        2 => n,
        3 => v,
        4 => c && !z,
        5 => n == v,
        6 => n == v && !z,
        _ => true,
    };
    if cond & 1 == 1 && cond != 15 { !base } else { base }
}
#[cfg(not(target_arch = "aarch64"))]
fn taken(_w: u32, _r: &libc::user_regs_struct) -> bool {
    false
}

/// The target of an AArch64 conditional branch (`b.cond`, `cbz`/`cbnz`,
/// `tbz`/`tbnz`) at `pc`.
fn branch_target(w: u32, pc: u64) -> Option<u64> {
    match classify(w, pc) {
        Class::CondBranch { target } => Some(target),
        _ => None,
    }
}

/// Runs the stopped thread until it reaches one of `exits` (a `brk` on
/// each, put back after): the exit's address and its count.
fn run_to_exit(pid: Pid, mem: &std::fs::File, exits: &[Exit]) -> Result<(u64, usize)> {
    const BRK: [u8; 4] = 0xd420_0000u32.to_le_bytes();
    let mut saved = Vec::new();
    for &(at, _, _) in exits {
        let mut word = [0u8; 4];
        mem.read_exact_at(&mut word, at)?;
        saved.push((at, word));
        mem.write_all_at(&BRK, at)?;
    }
    let ran = (|| {
        ptrace::cont(pid, None)?;
        wait_stop(pid)
    })();
    for (at, word) in saved.iter().rev() {
        mem.write_all_at(word, *at)?;
    }
    ran?;
    let regs = ptrace::getregs(pid)?;
    let pc = pc_of(&regs);
    // Two ways out may meet at one address: the first branch there that
    // is taken, else the fall through.
    let (_, count, _) = exits
        .iter()
        .find(|&&(at, _, branch)| at == pc && branch.is_none_or(|w| taken(w, &regs)))
        .with_context(|| format!("an exclusive sequence left at {pc:#x}"))?;
    Ok((pc, *count))
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
    let mem = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/mem"))?;
    let mut regs = ptrace::getregs(pid)?;
    let mut n = 0;
    while pc_of(&regs) != entry {
        advance(pid, &mem, pc_of(&regs))?;
        regs = ptrace::getregs(pid)?;
        n += 1;
        if n > 1_000_000 {
            bail!("one_call was not reached in {n} steps");
        }
    }
    let own = own_code(pid.as_raw(), binary)?;
    let sp = sp_of(&regs);
    let back = return_address(&mem, &regs)?;
    let mut c = Count::default();
    let mut pc = pc_of(&regs);
    loop {
        let (next, ran) = advance(pid, &mem, pc)?;
        for at in (0..ran as u64).map(|k| pc + 4 * k) {
            c.total += 1;
            if own.iter().any(|&(lo, hi)| (lo..hi).contains(&at)) {
                c.own += 1;
                continue;
            }
            let in_detour = detours.iter().any(|&(lo, hi)| (lo..hi).contains(&at));
            if in_detour {
                c.detour += 1;
            } else {
                c.runtime += 1;
            }
            let mut bytes = [0u8; 16];
            let got = mem.read_at(&mut bytes, at).unwrap_or(0);
            let insn = disassemble(&bytes[..got], at);
            let place = if in_detour { "detour " } else { "runtime" };
            c.listing.push(format!("{place}  {}", insn.unwrap_or_else(|| "?".into())));
        }
        pc = next;
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
