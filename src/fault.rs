//! Fault injection for reliability tests: when the environment variable
//! `TP_FAULT` names a step, tp kills itself with SIGKILL when it reaches that
//! step, so tests can prove the target survives a tracer dying anywhere.
//!
//! Steps: `after-seize`, `after-inject`, `after-detour`, `after-patch`
//! (after the first site is patched), `during-detach` (after the first site
//! is restored). Each step may carry a count: `after-patch:3` dies at the
//! third time the step is reached.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

static PLAN: OnceLock<Option<(String, u32)>> = OnceLock::new();
static SEEN: AtomicU32 = AtomicU32::new(0);

fn plan() -> &'static Option<(String, u32)> {
    PLAN.get_or_init(|| {
        let v = std::env::var("TP_FAULT").ok()?;
        let (name, n) = match v.split_once(':') {
            Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
            None => (v, 1),
        };
        Some((name, n.max(1)))
    })
}

/// Marks that tp reached `step`; dies here if `TP_FAULT` asks for it.
pub fn point(step: &str) {
    if let Some((name, n)) = plan()
        && name == step
        && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        // SAFETY: raising SIGKILL on ourselves; nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
