//! The syscall numbers tp uses in a target, per architecture: those it
//! makes there remotely (mmap, memfd_create, ...) and those its in-target
//! runtime makes (getpid, gettid, kill, ...). This is their one source:
//! build.rs includes this file to write the runtime's `syscalls.h`
//! (`TP_SYS_*`), so the numbers tp checks against a target's seccomp
//! filters are the ones the runtime's code holds. It imports nothing.

/// Syscall numbers tp and its runtime make in the target, and the
/// architecture a seccomp filter sees them made from.
#[derive(Debug, Clone, Copy)]
pub struct Syscalls {
    /// The AUDIT_ARCH_* value of `struct seccomp_data`'s `arch`.
    pub audit_arch: u32,
    /// mmap.
    pub mmap: u64,
    /// munmap.
    pub munmap: u64,
    /// memfd_create.
    pub memfd_create: u64,
    /// ftruncate.
    pub ftruncate: u64,
    /// close.
    pub close: u64,
    /// madvise (tp's MADV_WIPEONFORK; the runtime's stack check).
    pub madvise: u64,
    /// getpid (the runtime: a process's PID on its first event).
    pub getpid: u64,
    /// gettid (the runtime: a thread's TID on its first event, and its key
    /// where it has no thread register).
    pub gettid: u64,
    /// kill (the runtime: `kill(pid, 0)`, whether a ring slot's owner is gone).
    pub kill: u64,
    /// tgkill (the runtime: ending a process whose return address is lost).
    pub tgkill: u64,
    /// rt_sigaction (the same).
    pub rt_sigaction: u64,
    /// rt_sigprocmask (the same).
    pub rt_sigprocmask: u64,
    /// exit_group (the same).
    pub exit_group: u64,
    /// rt_sigreturn (the return from the in-target stepping engine's
    /// SIGTRAP handler).
    pub rt_sigreturn: u64,
    /// futex (the runtime: a thread at the dynamic linker's rendezvous
    /// wakes tp and waits for it, bounded).
    pub futex: u64,
    /// process_vm_readv (the runtime: a predicate reading a string of the
    /// process's own memory, which fails instead of faulting on a bad
    /// pointer).
    pub process_vm_readv: u64,
    /// The call that reads the thread register, where the runtime may make
    /// one (a thread whose TCB does not show it, where the CPU gives no
    /// instruction to read it).
    pub thread_pointer: Option<ThreadPointerCall>,
}

/// A syscall that reads the calling thread's thread register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadPointerCall {
    /// The syscall's name.
    pub name: &'static str,
    /// Its number.
    pub nr: u64,
    /// Its first argument (what to read); the second is where to store it.
    pub arg0: u64,
}

/// `madvise`'s advice to fault pages in for reading (Linux 5.14), which
/// fails on memory that cannot be read: how a thread checks its stack.
pub const MADV_POPULATE_READ: u64 = 22;

/// futex's operations, shared between processes (no FUTEX_PRIVATE_FLAG):
/// the rendezvous's words lie in memory tp maps too.
pub const FUTEX_WAIT: u64 = 0;
/// See [`FUTEX_WAIT`].
pub const FUTEX_WAKE: u64 = 1;

/// x86-64.
pub const X86_64: Syscalls = Syscalls {
    // AUDIT_ARCH_X86_64
    audit_arch: 0xc000_003e,
    mmap: 9,
    munmap: 11,
    memfd_create: 319,
    ftruncate: 77,
    close: 3,
    madvise: 28,
    getpid: 39,
    gettid: 186,
    kill: 62,
    tgkill: 234,
    rt_sigaction: 13,
    rt_sigprocmask: 14,
    exit_group: 231,
    rt_sigreturn: 15,
    futex: 202,
    process_vm_readv: 310,
    // arch_prctl(ARCH_GET_FS, &v)
    thread_pointer: Some(ThreadPointerCall { name: "arch_prctl", nr: 158, arg0: 0x1003 }),
};

/// AArch64 (the generic syscall table).
pub const AARCH64: Syscalls = Syscalls {
    // AUDIT_ARCH_AARCH64
    audit_arch: 0xc000_00b7,
    mmap: 222,
    munmap: 215,
    memfd_create: 279,
    ftruncate: 46,
    close: 57,
    madvise: 233,
    getpid: 172,
    gettid: 178,
    kill: 129,
    tgkill: 131,
    rt_sigaction: 134,
    rt_sigprocmask: 135,
    exit_group: 94,
    rt_sigreturn: 139,
    futex: 98,
    process_vm_readv: 270,
    // TPIDR_EL0 is readable by an instruction on every thread.
    thread_pointer: None,
};

impl Syscalls {
    /// Every syscall by name, with its number.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        let mut all = vec![
            ("mmap", self.mmap),
            ("munmap", self.munmap),
            ("memfd_create", self.memfd_create),
            ("ftruncate", self.ftruncate),
            ("close", self.close),
            ("madvise", self.madvise),
            ("getpid", self.getpid),
            ("gettid", self.gettid),
            ("kill", self.kill),
            ("tgkill", self.tgkill),
            ("rt_sigaction", self.rt_sigaction),
            ("rt_sigprocmask", self.rt_sigprocmask),
            ("exit_group", self.exit_group),
            ("rt_sigreturn", self.rt_sigreturn),
            ("futex", self.futex),
            ("process_vm_readv", self.process_vm_readv),
        ];
        all.extend(self.thread_pointer.map(|t| (t.name, t.nr)));
        all
    }

    /// The name of syscall `nr`, if it is one of these.
    pub fn name(&self, nr: u64) -> Option<&'static str> {
        self.named().into_iter().find_map(|(name, n)| (n == nr).then_some(name))
    }

    /// The `#define`s of the runtime's `syscalls.h`: `TP_SYS_<NAME>` for
    /// each syscall, the thread-pointer call's first argument as
    /// `TP_SYS_<NAME>_ARG0`, and `TP_MADV_POPULATE_READ`.
    pub fn c_defines(&self) -> Vec<(String, u64)> {
        let mut defines: Vec<(String, u64)> =
            self.named().into_iter().map(|(name, nr)| (format!("TP_SYS_{}", name.to_uppercase()), nr)).collect();
        if let Some(t) = self.thread_pointer {
            defines.push((format!("TP_SYS_{}_ARG0", t.name.to_uppercase()), t.arg0));
        }
        defines.push(("TP_MADV_POPULATE_READ".into(), MADV_POPULATE_READ));
        defines.push(("TP_FUTEX_WAIT".into(), FUTEX_WAIT));
        defines.push(("TP_FUTEX_WAKE".into(), FUTEX_WAKE));
        defines
    }
}

/// The syscall a thread was blocked in, as `/proc/PID/task/TID/syscall`
/// shows it: its number, arguments, stack pointer and program counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedIn {
    /// The syscall number.
    pub nr: u64,
    /// Its six arguments.
    pub args: [u64; 6],
    /// The thread's stack pointer.
    pub sp: u64,
    /// Its program counter (after the syscall instruction).
    pub pc: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_distinct_and_named() {
        for sc in [X86_64, AARCH64] {
            let named = sc.named();
            for (i, (name, nr)) in named.iter().enumerate() {
                assert!(named[..i].iter().all(|(_, n)| n != nr), "{name} repeats a number");
                assert_eq!(sc.name(*nr), Some(*name));
            }
        }
        assert_eq!(X86_64.name(186), Some("gettid"));
        assert_eq!(AARCH64.name(178), Some("gettid"));
    }

    #[test]
    fn the_runtime_header_defines_each_call() {
        let x86: Vec<(String, u64)> = X86_64.c_defines();
        assert!(x86.contains(&("TP_SYS_GETTID".into(), 186)));
        assert!(x86.contains(&("TP_SYS_ARCH_PRCTL".into(), 158)));
        assert!(x86.contains(&("TP_SYS_ARCH_PRCTL_ARG0".into(), 0x1003)));
        let a64 = AARCH64.c_defines();
        assert!(a64.contains(&("TP_SYS_EXIT_GROUP".into(), 94)));
        assert!(a64.iter().all(|(name, _)| !name.contains("ARCH_PRCTL")));
    }
}
