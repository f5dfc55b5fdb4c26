//! End-to-end tests: the real `tp` binary against real target processes.
//! They need ptrace rights (root or CAP_SYS_PTRACE).

mod util;

// Attaching and counting: exact hit counts, checksums, restored code.
mod attach;
// --keep, status and detach, also after the tracer was killed.
mod keep;
// Bad input: one line, the fix, a non-zero exit, nothing touched.
mod errors;
// Shared libraries, globs, demangled names, separate debug info.
// (These two need host-only targets and Debian packages; the arm64 test VM
// has static targets only.)
#[cfg(target_arch = "x86_64")]
mod modules;
// redis-server from Debian, counted against INFO commandstats.
#[cfg(target_arch = "x86_64")]
mod redis;
// PostgreSQL from Debian under pgbench -C: return probes, events and tp
// profile on a postmaster that forks a backend per connection.
#[cfg(target_arch = "x86_64")]
mod postgres;
// nginx from Debian: return probes on a master that forks new workers at
// every reload, under load.
#[cfg(target_arch = "x86_64")]
mod nginx;
// Arguments, return values, latency, exceptions, lost events, Perfetto.
mod events;
// Struct fields by DWARF, copied in the target: --args 'req->uri.len', --if on fields.
mod fields;
// Stacks, predicates, counts by value and durations kept in the target.
mod stacks;
// Aggregates of arguments and fields kept in the target, by thread (--agg, --by tid).
mod agg;
// Calls keyed by their call site, the return address at entry (--by caller).
mod callers;
mod stack_keys;
// Frames in JIT code named by the process's perf map: a C target's copied code, node's functions.
mod jit_frames;
// list-probes on the bundled targets.
mod list_probes;
// The cache of module analyses: the same answers hit or miss, damaged,
// foreign and planted entries never used, concurrent tp processes.
#[cfg(target_arch = "x86_64")]
mod cache;
// Probes inside functions: by line, by offset, at nop sites.
mod sites;
// Basic blocks and lines counted by --blocks, against gcov's counts.
mod blocks;
// Calls stepped instruction by instruction (--steps).
mod steps;
// Calls traced in the target by the trap flag (--step-engine trap).
mod trap_steps;
// Static probes (USDT): the bundled target's, python3's and libstdc++'s; semaphores.
mod usdt;
// Debug files by build-id from Debian's debuginfod, their cache, bad servers.
#[cfg(target_arch = "x86_64")]
mod debuginfod;
// Hand-written x86-64 prologues: every rewrite counted, every refusal named.
#[cfg(target_arch = "x86_64")]
mod prologues;
// Every function of python3, perl and libsqlite3 (and libc) at once, under a real workload.
#[cfg(target_arch = "x86_64")]
mod probe_all;
// Every function of libLLVM while opt and llc compile: output unchanged.
#[cfg(target_arch = "x86_64")]
mod llvm;
// Coverage of list-probes on Debian's libc, python3, libstdc++, libsqlite3, libcrypto and perl.
#[cfg(target_arch = "x86_64")]
mod coverage;
// Runtimes that read return addresses (the JVM, LuaJIT) under return
// probes and tp profile over all of their code.
#[cfg(target_arch = "x86_64")]
mod runtimes;
// Exception landing pads of a C++ target and of libstdc++.
#[cfg(target_arch = "x86_64")]
mod landing_pads;
// Finding the code programs run: symbol versions, copies of generics, code
// mapped twice (node), stripped binaries (busybox-static, ripgrep), output
// that stays small.
mod symbols;
// enable/disable without stopping the target.
mod toggle;
// tp profile: sampled latency with exact call counts.
mod profile;
// AArch64: every relocated instruction class, BTI landing pads, atomics.
#[cfg(target_arch = "aarch64")]
mod aarch64;
// Reliability (issue 6). The arm64 test VM emulates its CPU (TCG), tens of
// times slower than a real one: the loops there are shorter (see each).
// Threads blocked in syscalls see nothing of an attach.
mod blocked;
// Hot toggling: attach/detach cycles under four hot threads, exact counts.
mod stress;
// The tracer, or the target, killed at each step of an attach and a detach.
mod faults;
// Two tp processes on one target.
mod contention;
// More bad input: zombies, 32-bit and foreign binaries, refusals, privilege.
mod bad_input;
// A process that forks while probes are in.
mod fork;
// Return probes, events and tp profile across fork, exec and death by a signal.
mod fork_events;
// Threads told apart on any runtime (a thread without glibc's TCB).
mod thread_key;
// Thread churn: threads created and exiting during attach and detach.
mod churn;
// Security: no writable code, the region behind ptrace checks, no temp files.
mod security;
// Fuzz-found inputs and damaged binaries, replayed through list-probes.
#[cfg(target_arch = "x86_64")]
mod fuzz_regressions;
// A target that attacks its tracer: crafted regions, escapes, descriptor swaps.
#[cfg(target_arch = "x86_64")]
mod hostile;
// tp run: programs started under tp, probed from their entry point,
// libraries they load later, their exit status; ripgrep and python3.
// (x86-64: libuser and the Debian programs are host-only.)
#[cfg(target_arch = "x86_64")]
mod run;

// Libraries loaded later, probed at the dynamic linker's rendezvous (targets built for the host only).
#[cfg(target_arch = "x86_64")]
mod rendezvous;
// Programs built with musl-gcc: musl's rendezvous, static and dynamic.
#[cfg(target_arch = "x86_64")]
mod musl;
// A Go program built with Debian's Go: goroutines, stack growth, GC.
#[cfg(target_arch = "x86_64")]
mod golang;
// Targets under their own seccomp filters: refused in one line, or attached.
mod seccomp;
// Hardware shadow stacks: return probes and copied calls refused in one
// line, counting kept. (x86-64: the hand-written prologues.)
#[cfg(target_arch = "x86_64")]
mod shadow_stack;
// Sessions over several processes (-p A,B, --name), and --follow-exec.
mod multi;
// tp in a pipeline: a reader that goes away, an output that fails.
mod pipes;
// The output schema of docs/output.md, over every subcommand's JSON.
mod schema;
// OpenMetrics: tp status --openmetrics, tp serve, a session's --listen,
// checked by promtool and scraped by a real Prometheus.
#[cfg(target_arch = "x86_64")]
mod metrics;
// Shell completions and the manual page, generated from the clap definitions.
#[cfg(target_arch = "x86_64")]
mod completions;
// Region images, shared with the `region` fuzz target.
#[cfg(target_arch = "x86_64")]
mod region_image;
