//! The Guarded Control Stack on AArch64 (FEAT_GCS, Linux 6.13,
//! CONFIG_ARM64_GCS; glibc 2.41 turns it on with the tunable
//! `glibc.cpu.aarch64_gcs`, by default only for binaries marked for it).
//!
//! The status file says nothing of it. A tracer reads a stopped thread's
//! GCS state with PTRACE_GETREGSET of `NT_ARM_GCS` (0x410,
//! include/uapi/linux/elf.h): `struct user_gcs { features_enabled,
//! features_locked, gcspr_el0 }`, three 64-bit words
//! (arch/arm64/include/uapi/asm/ptrace.h, filled by `gcs_get` in
//! arch/arm64/kernel/ptrace.c), with `PR_SHADOW_STACK_ENABLE` (bit 0) in
//! `features_enabled` when the GCS is on. A kernel or CPU without GCS
//! refuses the regset (EINVAL) and leaves `HWCAP_GCS` (bit 32) out of the
//! process's AT_HWCAP, so only a process whose AT_HWCAP has it needs its
//! threads stopped to tell.
//!
//! Three of tp's detours break the pairing of calls and returns the GCS
//! checks: a `bl` or `blr` relocated as a load of the link register and a
//! branch (`relocate.rs`: no entry pushed, so the callee's `ret` faults),
//! and the long form, whose detour goes back to the function with `ret xS`
//! (`long.rs`), a return to an address the GCS does not hold.

use super::decode::{Class, decode};
use super::long::LONG_PATCH_LEN;
use crate::arch::SitePlan;
use crate::arch::shadow_stack::{Shadow, ShadowStack};
use crate::arch::{RegisterSets, read_into};

/// AArch64's shadow stack.
pub const GCS: ShadowStack = ShadowStack("AArch64 GCS");

/// The regset of a thread's GCS state.
pub const NT_ARM_GCS: u32 = 0x410;

/// AT_HWCAP's bit for GCS.
pub const HWCAP_GCS: u64 = 1 << 32;

/// `features_enabled`'s bit for a GCS that is on.
const PR_SHADOW_STACK_ENABLE: u64 = 1;

/// The GCS of a thread of a process whose AT_HWCAP is `hwcap`, read from
/// its regset if it is stopped (`sets`, its register sets).
pub fn of_thread(hwcap: u64, sets: Option<&dyn RegisterSets>) -> Shadow {
    if hwcap & HWCAP_GCS == 0 {
        return Shadow::Off;
    }
    let Some(sets) = sets else {
        return Shadow::Unknown;
    };
    let mut words = [0u64; 3];
    match read_into(sets, NT_ARM_GCS, &mut words) {
        Ok(len) => from_regset(&words, len),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Shadow::Off,
        Err(_) => Shadow::Unknown,
    }
}

/// The GCS state `struct user_gcs` in `words`, of which the kernel wrote `len` bytes.
pub fn from_regset(words: &[u64; 3], len: usize) -> Shadow {
    match len {
        24 if words[0] & PR_SHADOW_STACK_ENABLE != 0 => Shadow::On(GCS),
        24 => Shadow::Off,
        _ => Shadow::Unknown,
    }
}

/// Why the detour of `plan` would make a call the GCS does not record, or
/// a return it does not hold.
pub fn unbalances(plan: &SitePlan) -> Option<&'static str> {
    if plan.len() == LONG_PATCH_LEN {
        return Some(
            "the long form of the probe (no code arena fits within branch reach of its module) goes back from its \
             detour with a return, to an address the guarded control stack does not hold",
        );
    }
    decode(&plan.window, plan.site)
        .iter()
        .any(|i| matches!(i.class, Class::Call { .. } | Class::CallRegister { .. }))
        .then_some(
            "the probe's copy of the call in its patch window loads the link register and branches, a call the \
         guarded control stack does not record, so the callee's return would fault",
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Register sets that cannot be read: a thread whose GCS is asked of
    /// only where the process may have one.
    struct Unreadable;

    impl RegisterSets for Unreadable {
        fn read(&self, _: u32, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("not a thread"))
        }
        fn write(&self, _: u32, _: &[u8]) -> std::io::Result<()> {
            Err(std::io::Error::other("not a thread"))
        }
        fn write_user(&self, _: usize, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("not a thread"))
        }
    }

    #[test]
    fn a_thread_runs_with_a_gcs_when_its_regset_says_enabled() {
        // features_enabled, features_locked, gcspr_el0 as gcs_get writes them.
        let gcspr = 0xffff_8a40_0ff8;
        assert_eq!(from_regset(&[1, 0, gcspr], 24), Shadow::On(GCS));
        // ENABLE | WRITE | PUSH, all locked.
        assert_eq!(from_regset(&[0b111, 0b111, gcspr], 24), Shadow::On(GCS));
        // Off: nothing enabled, whatever is locked (locked off).
        assert_eq!(from_regset(&[0, 0, 0], 24), Shadow::Off);
        assert_eq!(from_regset(&[0b110, 1, 0], 24), Shadow::Off);
        // A short answer is not read as either.
        assert_eq!(from_regset(&[1, 0, 0], 16), Shadow::Unknown);
        // Without HWCAP_GCS nothing needs reading; with it, a running thread is not known.
        assert_eq!(of_thread(1 << 31, Some(&Unreadable)), Shadow::Off);
        assert_eq!(of_thread(HWCAP_GCS, None), Shadow::Unknown);
    }

    #[test]
    fn calls_and_the_long_form_unbalance_the_gcs() {
        let plan = |words: &[u32]| {
            let window: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            SitePlan {
                function: 0x40_1000,
                site: 0x40_1000,
                prefix: Vec::new(),
                window,
                insns: Vec::new(),
                dead: 0,
                interior: false,
                exits: Vec::new(),
            }
        };
        // stp x29, x30, [sp, #-16]!
        assert_eq!(unbalances(&plan(&[0xa9bf7bfd])), None);
        // b +0x100: a tail call returns to the caller's own call.
        assert_eq!(unbalances(&plan(&[0x14000040])), None);
        // bl +0x100; blr x1
        assert!(unbalances(&plan(&[0x94000040])).is_some());
        assert!(unbalances(&plan(&[0xd63f0020])).is_some());
        // The long form's three instructions, whatever they are.
        assert!(unbalances(&plan(&[0xa9bf7bfd, 0x910003fd, 0xd503201f])).unwrap().contains("long form"));
    }
}
