//! Refusals in the user's terms. The planner speaks in runtime addresses
//! (`branch into window from 0x55675cf89330`); the user named a function, an
//! offset in one or a source line. So each address of the refusal inside a
//! function of the module becomes `function+0xoffset`, and a refused site
//! inside a function comes with the nearest places before and after it that
//! can be probed, found by planning them as the site itself was; a function
//! whose entry's window is refused, with the first place further in that
//! can be (a longer way round: it counts each time a call reaches it).

use crate::addr::RuntimeAddr;
use crate::arch::Refusal;
use crate::arch::host_isa;
use crate::symbols::verdict::verdict_at;
use crate::symbols::{Function, Module};

/// How far from the site tp looks for a place it can probe, in instructions.
const LOOK: usize = 64;

/// Why `f` (or the site `at` inside it, when `site` says so) cannot be
/// probed, in the user's terms.
pub fn refusal(m: &Module, f: &Function, at: RuntimeAddr, site: bool, r: &Refusal) -> String {
    let mut text = match r {
        // The places around it follow: the instruction starts are among them.
        Refusal::NotBoundary { at, .. } if site => {
            format!("`{}` is not where an instruction starts", offset_name(f, *at))
        }
        _ => named_addresses(&r.to_string(), m, f),
    };
    if site {
        let near: Vec<String> = nearest_sites(m, f, at).iter().map(|&a| format!("`{}`", offset_name(f, a))).collect();
        if !near.is_empty() {
            text += &format!("; the nearest places that can be probed: {}", near.join(" and "));
        }
    } else if about_the_window(r)
        && let Some(&after) = nearest_sites(m, f, at).iter().find(|&&a| a > at.0)
    {
        // A window further in, where the first one cannot be.
        text += &format!("; `{}` can be probed instead (it counts each time a call reaches it)", offset_name(f, after));
    }
    text
}

/// True if `r` is about the entry's window (its length, what it holds,
/// what jumps into it): a window further into the function may not have it.
fn about_the_window(r: &Refusal) -> bool {
    matches!(
        r,
        Refusal::TooShort { .. }
            | Refusal::Undecodable { .. }
            | Refusal::Unsafe { .. }
            | Refusal::CallInWindow { .. }
            | Refusal::BranchIntoWindow { .. }
            | Refusal::LandingPadInWindow { .. }
            | Refusal::EntersWindow { .. }
            | Refusal::PastEnd { .. }
            | Refusal::Unrelocatable { .. }
    )
}

/// `foo+0x1a`, or `foo` at its entry.
fn offset_name(f: &Function, at: u64) -> String {
    match at - f.addr.0 {
        0 => f.name.clone(),
        off => format!("{}+{off:#x}", f.name),
    }
}

/// `text` with each hexadecimal address that lies in a function of `m`
/// written as `function+0xoffset` (`f` first: it is the one asked for).
fn named_addresses(text: &str, m: &Module, f: &Function) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let digits = rest[i + 2..].chars().take_while(char::is_ascii_hexdigit).count();
        let word = &rest[i..i + 2 + digits];
        rest = &rest[i + 2 + digits..];
        let name = u64::from_str_radix(&word[2..], 16).ok().and_then(|a| name_of(m, f, a));
        match name {
            Some(n) => out.push_str(&format!("`{n}`")),
            None => out.push_str(word),
        }
    }
    out.push_str(rest);
    out
}

fn name_of(m: &Module, f: &Function, a: u64) -> Option<String> {
    let within = |g: &Function| g.size > 0 && a >= g.addr.0 && a < g.addr.0 + g.size;
    if within(f) {
        return Some(offset_name(f, a));
    }
    m.function_containing(RuntimeAddr(a)).filter(within).map(|g| offset_name(&g, a))
}

/// The closest instruction starts before and after `at` in `f` where a probe
/// can go, stepping over the instructions with the planner's own idea of
/// where they start (a refusal for an address that is none names them).
fn nearest_sites(m: &Module, f: &Function, at: RuntimeAddr) -> Vec<u64> {
    let end = f.addr.0 + f.size;
    let plans = |a: u64| verdict_at(m, f, RuntimeAddr(a), host_isa());
    // The instruction start before `a` and the one after it, as the planner sees them.
    let around = |a: u64| -> (Option<u64>, Option<u64>) {
        match plans(a) {
            Err(Refusal::NotBoundary { around, .. }) => around,
            _ => (Some(a), Some(a)),
        }
    };
    let mut found = Vec::new();
    // Before: the start below each address tried.
    let mut a = at.0;
    for _ in 0..LOOK {
        if a <= f.addr.0 {
            break;
        }
        let Some(before) = around(a - 1).0.filter(|&b| b < a) else { break };
        if plans(before).is_ok() {
            found.push(before);
            break;
        }
        a = before;
    }
    // After: the start above each address tried.
    let mut a = at.0;
    for _ in 0..LOOK {
        if a + 1 >= end {
            break;
        }
        let Some(after) = around(a + 1).1.filter(|&b| b > a && b < end) else { break };
        if plans(after).is_ok() {
            found.push(after);
            break;
        }
        a = after;
    }
    found
}

/// The functions a thread's stack begins with (C runtimes, thread
/// libraries, Go): a frame-pointer walk that reaches one is whole. glibc
/// keeps no frame pointers, so a walk ends in `__libc_start_call_main` or
/// `start_thread` at best.
const THREAD_ROOTS: &[&str] = &[
    "_start",
    "_start_c",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "thread_start",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__clone_internal",
    "runtime.goexit",
    "runtime.mstart",
    "runtime.main",
];

/// For frame-pointer stacks (`--stack`): when most calls' walks end before
/// a thread's first function, not at the depth asked for, the line that
/// says so and offers `--stack=dwarf`, which unwinds code built without
/// frame pointers.
pub fn stack_hint(p: &crate::output::stacks::ProbeStacks) -> Option<String> {
    let total: u64 = p.stacks.iter().map(|s| s.1).sum();
    let outermost = |frames: &[crate::events::stacks::Frame]| frames.last().and_then(|f| f.function.clone());
    let mut ended: Vec<(String, u64)> = Vec::new();
    for (frames, n) in &p.stacks {
        let name = outermost(frames).unwrap_or_else(|| "an unnamed address".into());
        if THREAD_ROOTS.contains(&name.as_str()) {
            continue;
        }
        match ended.iter_mut().find(|(f, _)| *f == name) {
            Some((_, m)) => *m += n,
            None => ended.push((name, *n)),
        }
    }
    let early: u64 = ended.iter().map(|e| e.1).sum();
    if total == 0 || early * 2 < total || p.truncated * 2 >= total {
        return None;
    }
    ended.sort_by_key(|e| std::cmp::Reverse(e.1));
    let at: Vec<String> = ended.iter().take(3).map(|(f, _)| format!("`{}`", crate::escape::text(f))).collect();
    Some(format!(
        "tp: {} of the {} stacks of `{}` end before a thread's first function (at {}): code without frame \
         pointers ends the walk; --stack=dwarf unwinds it from a copy of the stack",
        crate::output::thousands(early),
        crate::output::thousands(total),
        crate::escape::text(&p.function),
        at.join(", ")
    ))
}
