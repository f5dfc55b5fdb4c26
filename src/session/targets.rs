//! Which processes a command works on: the PIDs the user gave (`-p`,
//! repeated or a comma list) and the processes `--name NAME` matches, as
//! `pgrep -x NAME` would, by command name or, since the kernel cuts command
//! names at 15 bytes, by the executable's file name.

use anyhow::{Result, bail};

use crate::escape::text;
use crate::process;

/// The processes the user named.
#[derive(Debug, Clone, Default)]
pub struct Which {
    /// By PID.
    pub pids: Vec<i32>,
    /// By name.
    pub name: Option<String>,
}

/// The processes selected, in the order given (by PID first, then the name's
/// matches in PID order), each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The PIDs.
    pub pids: Vec<i32>,
    /// How many processes the name matched, if a name was given.
    pub by_name: Option<usize>,
}

impl Which {
    /// True if nothing was named.
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.name.is_none()
    }

    /// Selects the processes; a name that matches nothing is an error.
    pub fn select(&self) -> Result<Selected> {
        let mut pids: Vec<i32> = Vec::new();
        for &p in &self.pids {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        let mut by_name = None;
        if let Some(name) = &self.name {
            if name.is_empty() {
                bail!("--name needs a process name, as `pgrep -x` takes it");
            }
            let matched = named(name);
            if matched.is_empty() {
                bail!(
                    "no process is named `{}` (by command name or executable file name); `pgrep -x {}` or `ps -e` lists them",
                    text(name),
                    text(name)
                );
            }
            by_name = Some(matched.len());
            for p in matched {
                if !pids.contains(&p) {
                    pids.push(p);
                }
            }
        }
        Ok(Selected { pids, by_name })
    }
}

/// Every process but this one whose command name or executable file name is
/// `name`, in PID order. Kernel threads (no memory map) and zombies are not
/// processes tp could trace, and are left out.
pub fn named(name: &str) -> Vec<i32> {
    let mut out: Vec<i32> = process::other_pids()
        .into_iter()
        .filter(|&pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let exe_name = exe.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
            let exe_name = exe_name.as_deref().map(|n| n.trim_end_matches(" (deleted)"));
            comm.trim_end_matches('\n') == name || exe_name == Some(name)
        })
        .filter(|&pid| process::is_alive(pid))
        .filter(|&pid| std::fs::read_to_string(format!("/proc/{pid}/maps")).map_or(true, |m| !m.is_empty()))
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_once_in_the_order_given() {
        let w = Which { pids: vec![30, 10, 30], name: None };
        assert_eq!(w.select().unwrap(), Selected { pids: vec![30, 10], by_name: None });
    }

    #[test]
    fn a_name_that_matches_nothing_is_an_error() {
        let w = Which { pids: vec![], name: Some("no-such-process-name-here".into()) };
        let e = w.select().unwrap_err().to_string();
        assert!(e.starts_with("no process is named `no-such-process-name-here`"), "{e}");
    }

    #[test]
    fn finds_a_child_by_its_name_but_never_itself() {
        // SAFETY: the child only waits in pause(2) until it is killed.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            loop {
                // SAFETY: async-signal-safe.
                unsafe { libc::pause() };
            }
        }
        // By the executable's file name: the child's command name is its
        // forking thread's, which the test harness named after the test.
        let exe = std::env::current_exe().unwrap();
        let found = named(exe.file_name().unwrap().to_str().unwrap());
        // SAFETY: kill and reap the child forked above.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert!(found.contains(&child), "{found:?}");
        assert!(!found.contains(&(std::process::id() as i32)));
    }
}
