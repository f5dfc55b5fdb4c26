//! CET user shadow stacks on x86-64 (Linux 6.6, CONFIG_X86_USER_SHADOW_STACK;
//! glibc turns them on with `GLIBC_TUNABLES=glibc.cpu.hwcaps=SHSTK`, for
//! programs and libraries built with `-fcf-protection`).
//!
//! The kernel shows a thread's enabled features in its
//! `/proc/PID/task/TID/status` (arch/x86/kernel/cpu/proc.c,
//! `arch_proc_pid_thread_features`): a line `x86_Thread_features:`, a tab,
//! then `shstk ` if the shadow stack is on and `wrss ` if the thread may
//! write it with WRSS; then `x86_Thread_features_locked:` with the features
//! whose state (on or off) the thread locked. A kernel built without
//! shadow stacks prints neither line. The status file needs no ptrace stop,
//! so every thread is checked as it runs.
//!
//! The detour of a window that ends in a call makes the call as a push of
//! the original return address and a jump (`relocate.rs`), which the shadow
//! stack does not record: the callee's `ret` would fault.

use super::decode::{self, Class};
use crate::arch::SitePlan;
use crate::arch::shadow_stack::{Shadow, ShadowStack};

/// x86-64's shadow stack.
pub const CET: ShadowStack = ShadowStack("x86 CET");

/// The shadow stack of a thread whose status file reads `status`.
pub fn from_status(status: &str) -> Shadow {
    let features = status.lines().find_map(|l| l.strip_prefix("x86_Thread_features:"));
    match features {
        Some(f) if f.split_whitespace().any(|w| w == "shstk") => Shadow::On(CET),
        _ => Shadow::Off,
    }
}

/// Why the detour of `plan` would make a call the shadow stack does not record.
pub fn unbalances(plan: &SitePlan) -> Option<&'static str> {
    decode::decode(&plan.window, plan.site)
        .iter()
        .any(|i| matches!(i.class, Class::Call | Class::IndirectCall))
        .then_some(
            "the probe's copy of the call in its patch window pushes the return address and jumps, a call the shadow \
         stack does not record, so the callee's return would fault",
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/PID/task/TID/status` from its `Seccomp:` line on, as Linux 6.6
    /// prints it (fs/proc/array.c, `proc_pid_status`, then
    /// `arch_proc_pid_thread_features`), with the two feature lists given.
    fn status(enabled: &str, locked: &str) -> String {
        format!(
            "Seccomp:\t0\nSeccomp_filters:\t0\nSpeculation_Store_Bypass:\tthread vulnerable\n\
             SpeculationIndirectBranch:\tconditional enabled\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n\
             Mems_allowed:\t00000000,00000001\nMems_allowed_list:\t0\nvoluntary_ctxt_switches:\t1\n\
             nonvoluntary_ctxt_switches:\t9\nx86_Thread_features:\t{enabled}\nx86_Thread_features_locked:\t{locked}\n"
        )
    }

    #[test]
    fn a_thread_runs_with_a_shadow_stack_when_its_features_say_shstk() {
        // dump_x86_features prints each feature followed by a space.
        assert_eq!(from_status(&status("shstk wrss ", "shstk wrss ")), Shadow::On(CET));
        assert_eq!(from_status(&status("shstk ", "")), Shadow::On(CET));
        // A kernel with shadow stacks, a thread without: empty lists, or
        // the feature locked off (the locked line says nothing of its state).
        assert_eq!(from_status(&status("", "")), Shadow::Off);
        assert_eq!(from_status(&status("", "shstk ")), Shadow::Off);
        assert_eq!(from_status(&status("wrss ", "")), Shadow::Off);
        // A kernel without them prints neither line; a file that could not be read.
        assert_eq!(
            from_status("Name:\tcat\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t0\n"),
            Shadow::Off
        );
        assert_eq!(from_status(""), Shadow::Off);
    }

    #[test]
    fn only_a_window_with_a_call_unbalances_the_shadow_stack() {
        let plan = |window: &[u8]| {
            let site = 0x40_1000;
            let insns = decode::decode(window, site);
            let insns = insns.iter().map(|i| crate::arch::WindowInsn {
                offset: (i.addr - site) as u32,
                len: i.len,
                mnemonic: i.mnemonic.clone(),
            });
            SitePlan {
                function: site,
                site,
                prefix: Vec::new(),
                window: window.to_vec(),
                insns: insns.collect(),
                dead: 0,
                interior: false,
                exits: Vec::new(),
            }
        };
        // push rbp; mov rbp, rsp; push rbx
        assert_eq!(unbalances(&plan(&[0x55, 0x48, 0x89, 0xe5, 0x53])), None);
        // sub rsp, 8; call +0x100
        assert!(unbalances(&plan(&[0x48, 0x83, 0xec, 0x08, 0xe8, 0x00, 0x01, 0x00, 0x00])).is_some());
        // push rbx; push rbp; push r12; call rax
        assert!(unbalances(&plan(&[0x53, 0x55, 0x41, 0x54, 0xff, 0xd0])).is_some());
        // jmp +0x100 (a tail call returns to the caller's own call)
        assert_eq!(unbalances(&plan(&[0xe9, 0x00, 0x01, 0x00, 0x00])), None);
    }
}
