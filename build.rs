//! Builds the target programs in `targets/` into `OUT_DIR/targets/`, so
//! that `cargo build` and `cargo test` need no separate step. Their path
//! reaches the code as `TP_TARGETS_DIR`. Only sources are watched and
//! nothing is written where cargo looks, so a second build is a no-op.
//!
//! C targets are built PIE and non-PIE; among them, a program that maps
//! part of its own code a second time far away (as node does). Host builds
//! also get: a variant with Intel CET landing pads (`endbr64`), two shared
//! libraries with the same function names and a program using both, a C++
//! program, Rust programs with the legacy and the v0 symbol mangling (one
//! pair with a generic in two copies), and stripped copies of `counter`
//! whose symbols live only in separate debug files (found by build-id, or
//! by `.gnu_debuglink`). On x86-64: hand-written prologues (assembly) and
//! the relocation harness; on AArch64: hand-written prologues, also in a
//! BTI-guarded build, and the events and C++ exceptions targets with
//! pointer authentication (and BTI). Static probes (`sdt`) come from
//! targets/sdt.h, which writes the notes as <sys/sdt.h> does, so no package
//! is needed. Cross builds (aarch64) link statically (`-static-pie`
//! for PIE) so the binaries run in the test VM without a sysroot.

use std::path::{Path, PathBuf};
use std::process::Command;

// The region layout the in-target runtime shares: its one source, read here
// to write the runtime's C header (see `write_layout_header`).
#[allow(dead_code)]
#[path = "src/layout.rs"]
mod layout;

// The syscall numbers tp and its runtime use: their one source, read here
// to write the runtime's `syscalls.h` (see `write_syscalls_header`).
#[allow(dead_code)]
#[path = "src/arch/syscalls.rs"]
mod syscalls;

/// The language a target is written in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    C,
    Cpp,
    Rust,
}

/// One program or library to build.
struct Target {
    name: &'static str,
    lang: Lang,
    sources: &'static [&'static str],
    flags: &'static [&'static str],
    /// Built only when the target architecture is the host's.
    host_only: bool,
    /// Built only for this architecture.
    arch: Option<&'static str>,
}

const fn c(name: &'static str, flags: &'static [&'static str]) -> Target {
    Target { name, lang: Lang::C, sources: &["counter.c"], flags, host_only: false, arch: None }
}

const TARGETS: &[Target] = &[
    c("counter", &["-fPIE", "-pie"]),
    // An object file, not linked: list-probes refuses it (tests/e2e/bad_input.rs).
    c("counter.o", &["-c"]),
    c("counter-nopie", &["-fno-pie", "-no-pie"]),
    Target { arch: Some("x86_64"), ..c("counter-cet", &["-fPIE", "-pie", "-fcf-protection=full"]) },
    // The differential-execution harness of tests/reloc, and hand-written
    // prologues for every x86-64 rewrite and refusal.
    Target {
        arch: Some("x86_64"),
        host_only: true,
        sources: &["reloc_harness.c"],
        ..c("reloc_harness", &["-fPIE", "-pie"])
    },
    Target {
        arch: Some("x86_64"),
        sources: &["prologues.c", "prologues_x86_64.S"],
        ..c("prologues", &["-fPIE", "-pie"])
    },
    Target { name: "events", sources: &["events.c"], ..c("", &["-fPIE", "-pie"]) },
    // AArch64: the same with pointer authentication and BTI landing pads,
    // its probed functions in pages it guards with PROT_BTI itself.
    Target {
        name: "events-pac",
        sources: &["events.c"],
        arch: Some("aarch64"),
        ..c("", &["-fPIE", "-pie", "-DTP_BTI", "-mbranch-protection=standard", "-fno-toplevel-reorder"])
    },
    // A call tree whose shape and sleeps are known: self times (tests/e2e/profile.rs).
    Target { name: "nested", sources: &["nested.c"], ..c("", &["-fPIE", "-pie"]) },
    // Struct fields by DWARF (tests/e2e/fields.rs).
    Target { name: "server", sources: &["server.c"], ..c("", &["-fPIE", "-pie"]) },
    // Lengths passed by several threads, with the target's own sums and
    // histograms (--agg, tests/e2e/agg.rs).
    Target { name: "agg", sources: &["agg.c"], ..c("", &["-fPIE", "-pie"]) },
    // A program for `tp run` and --follow-exec: its own count of calls, its exit status or signal.
    Target { name: "launched", sources: &["launched.c"], ..c("", &["-fPIE", "-pie"]) },
    // Forks while return probes are live: parent and child return through the same frames.
    Target { name: "forker", sources: &["forker.c"], ..c("", &["-fPIE", "-pie"]) },
    // Benchmark targets (benches/tp). `many` has 10,000 functions: -O0 keeps
    // its build to seconds and gives them the usual push/mov prologue.
    Target { name: "hot", sources: &["hot.c"], ..c("", &["-fPIE", "-pie"]) },
    // One function called from three call sites, with the return address
    // and calls of each (`--by caller`, tests/e2e/agg_callers.rs).
    Target { name: "callers", sources: &["callers.c"], ..c("", &["-fPIE", "-pie"]) },
    // Known call paths, with frame pointers and without (`--stack` fp and dwarf).
    Target { name: "stacks", sources: &["stacks.c"], ..c("", &["-fPIE", "-pie", "-fno-omit-frame-pointer"]) },
    Target { name: "stacks-nofp", sources: &["stacks.c"], ..c("", &["-fPIE", "-pie", "-fomit-frame-pointer"]) },
    // Calls from code in anonymous executable memory, named by a perf map (JIT frames).
    Target { name: "jitted", sources: &["jitted.c"], ..c("", &["-fPIE", "-pie", "-fno-omit-frame-pointer"]) },
    // The same with frame pointers (the benchmark's stack walks).
    Target { name: "hot-fp", sources: &["hot.c"], ..c("", &["-fPIE", "-pie", "-fno-omit-frame-pointer"]) },
    Target { name: "hot-nop5", sources: &["hot.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie", "-DNOP5"]) },
    Target { name: "many", sources: &["many.c"], ..c("", &["-fPIE", "-pie", "-O0"]) },
    Target { name: "floor", sources: &["floor.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie"]) },
    Target {
        name: "prologues",
        sources: &["prologues_aarch64.c", "prologues_aarch64.S"],
        arch: Some("aarch64"),
        ..c("", &["-fPIE", "-pie"])
    },
    // AArch64: a thread holding values in its NEON and SVE registers while
    // tp's syscalls run on it.
    Target { name: "vectors", sources: &["vectors.c"], arch: Some("aarch64"), ..c("", &["-fPIE", "-pie"]) },
    Target {
        name: "prologues-bti",
        sources: &["prologues_aarch64.c", "prologues_aarch64.S"],
        arch: Some("aarch64"),
        ..c("", &["-fno-pie", "-no-pie", "-DTP_BTI"])
    },
    Target {
        name: "libalpha.so",
        sources: &["libwork.c"],
        flags: &["-shared", "-fPIC", "-DLIBNAME=alpha", "-DLIBSEED=3"],
        host_only: true,
        ..c("", &[])
    },
    Target {
        name: "libbeta.so",
        sources: &["libwork.c"],
        flags: &["-shared", "-fPIC", "-DLIBNAME=beta", "-DLIBSEED=5"],
        host_only: true,
        ..c("", &[])
    },
    Target {
        name: "libgamma.so",
        sources: &["libwork.c"],
        flags: &["-shared", "-fPIC", "-DLIBNAME=gamma", "-DLIBSEED=7"],
        host_only: true,
        ..c("", &[])
    },
    Target {
        name: "libloaded.so",
        sources: &["libloaded.c"],
        flags: &["-shared", "-fPIC"],
        host_only: true,
        ..c("", &[])
    },
    Target {
        name: "dlcycle",
        sources: &["dlcycle.c"],
        flags: &["-fPIE", "-pie", "-ldl"],
        host_only: true,
        ..c("", &[])
    },
    Target {
        name: "libuser",
        sources: &["libuser.c"],
        flags: &["-fPIE", "-pie", "-L{out}", "-lalpha", "-lbeta", "-ldl", "-Wl,-rpath,$ORIGIN"],
        host_only: true,
        ..c("", &[])
    },
    Target { name: "shapes", lang: Lang::Cpp, sources: &["shapes.cpp"], flags: &[], host_only: true, arch: None },
    Target {
        name: "exceptions",
        lang: Lang::Cpp,
        sources: &["exceptions.cpp"],
        flags: &[],
        host_only: false,
        arch: None,
    },
    // AArch64: the same with return addresses signed (paciasp), which the
    // unwinder authenticates.
    Target {
        name: "exceptions-pac",
        lang: Lang::Cpp,
        sources: &["exceptions.cpp"],
        flags: &["-mbranch-protection=standard"],
        host_only: false,
        arch: Some("aarch64"),
    },
    Target {
        name: "rusty-legacy",
        lang: Lang::Rust,
        sources: &["rusty.rs"],
        // Stable rustc mangles the legacy way by default (naming it needs -Z).
        flags: &[],
        host_only: true,
        arch: None,
    },
    Target {
        name: "rusty-v0",
        lang: Lang::Rust,
        sources: &["rusty.rs"],
        flags: &["-C", "symbol-mangling-version=v0"],
        host_only: true,
        arch: None,
    },
    // Code mapped twice, as node maps V8's builtins (tests/e2e/symbols.rs); position-dependent as node.
    Target { name: "remapped", sources: &["remapped.c"], ..c("", &["-fPIE", "-pie"]) },
    Target { name: "remapped-nopie", sources: &["remapped.c"], ..c("", &["-fno-pie", "-no-pie"]) },
    // Calls of libc functions that have an old version beside the default (x86-64 glibc).
    Target { name: "versions", sources: &["versions.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie"]) },
    // One Rust name for two copies of a generic's code, in both manglings.
    Target {
        name: "generics-legacy",
        lang: Lang::Rust,
        sources: &["generics.rs"],
        flags: &[],
        host_only: true,
        arch: None,
    },
    Target {
        name: "generics-v0",
        lang: Lang::Rust,
        sources: &["generics.rs"],
        flags: &["-C", "symbol-mangling-version=v0"],
        host_only: true,
        arch: None,
    },
    // Reliability targets (tests/e2e/blocked.rs, stress.rs, churn.rs).
    Target { name: "hammer", sources: &["hammer.c"], ..c("", &["-fPIE", "-pie"]) },
    Target { name: "blocked", sources: &["blocked.c"], ..c("", &["-fPIE", "-pie"]) },
    Target { name: "churn", sources: &["churn.c"], ..c("", &["-fPIE", "-pie"]) },
    // A program under its own seccomp filter (tests/e2e/seccomp.rs).
    Target { name: "sandboxed", sources: &["sandboxed.c"], ..c("", &["-fPIE", "-pie"]) },
    // Static probes written as <sys/sdt.h> writes them (targets/sdt.h): arguments, a semaphore.
    Target { name: "sdt", sources: &["sdt.c"], ..c("", &["-fPIE", "-pie"]) },
    // Probes inside functions, by line and offset (-O0: every line a statement), and nop sites.
    Target { name: "lines", sources: &["lines.c"], ..c("", &["-fPIE", "-pie", "-O0"]) },
    // Basic blocks counted by --blocks, beside gcov's counts of the same source (-O0: a line a statement).
    Target { name: "blocks", sources: &["blocks.c"], ..c("", &["-fPIE", "-pie", "-O0"]) },
    // Calls stepped instruction by instruction (-O0: a line a statement).
    Target { name: "steps", sources: &["steps.c"], ..c("", &["-fPIE", "-pie", "-O0"]) },
    // The in-target stepping engine's floor: a single-step trap beside a signal (benches/tp/stepping.rs).
    Target { name: "trapcost", sources: &["trapcost.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie"]) },
    // A process that attacks its tracer (tests/e2e/hostile.rs).
    Target { name: "hostile", sources: &["hostile.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie"]) },
    // A thread held in a signal handler inside a function's first bytes (tests/e2e/sites.rs).
    Target { name: "interrupted", sources: &["interrupted.c"], arch: Some("x86_64"), ..c("", &["-fPIE", "-pie"]) },
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let cross = std::env::var("HOST").unwrap() != std::env::var("TARGET").unwrap();
    let src_dir = manifest.join("targets");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("targets");
    std::fs::create_dir_all(&out_dir).expect("create OUT_DIR/targets");
    // The sources only: `targets/` holds no build output.
    println!("cargo:rerun-if-changed=targets");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=TP_TARGETS_DIR={}", out_dir.display());

    for t in TARGETS {
        if (t.host_only && cross) || t.arch.is_some_and(|a| a != arch) {
            continue;
        }
        build_one(&src_dir, &out_dir, t, cross);
    }
    if !cross {
        split_debug_info(&out_dir);
    }
    strip_copy(&out_dir);
    build_runtime(&manifest, &arch);
}

/// The functions of tp's in-target runtime, each extracted as a blob: those
/// of the plain build, and the `_ext` ones of the build with the frame
/// pointer reserved (they walk the probed function's frame records, so no
/// code of the runtime may use that register).
const RUNTIME_FUNCTIONS: &[&str] =
    &["tp_entry", "tp_exit", "tp_unwind", "tp_count", "tp_exit_at", "tp_rendezvous", "tp_step", "tp_trap"];
const RUNTIME_EXT_FUNCTIONS: &[&str] = &["tp_entry_ext", "tp_exit_ext", "tp_exit_at_ext"];

/// Compiles src/probe/runtime/runtime.c for the target architecture into
/// position-independent blobs in OUT_DIR (`tp_entry.bin`, ...), and refuses
/// any blob with a relocation: blobs are copied into the target as they are.
fn build_runtime(manifest: &Path, arch: &str) {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=src/probe/runtime");
    println!("cargo:rerun-if-changed=src/layout.rs");
    println!("cargo:rerun-if-changed=src/arch/{arch}/runtime.h");
    println!("cargo:rerun-if-changed=src/arch/syscalls.rs");
    write_layout_header(&out.join("layout.h"));
    write_syscalls_header(&out.join("syscalls.h"), arch);
    let plain = compile_runtime(manifest, arch, &out, "runtime.o", &[], RUNTIME_FUNCTIONS);
    // The arch's runtime.h makes the frame register a global register
    // variable under this macro: that build never uses it otherwise.
    let ext =
        compile_runtime(manifest, arch, &out, "runtime_ext.o", &["-DTP_RESERVE_FRAME_POINTER"], RUNTIME_EXT_FUNCTIONS);
    // The most stack any of them uses: the calls of the runtime clear what
    // it leaves below the stack pointer (arch::RUNTIME_STACK).
    println!("cargo:rustc-env=TP_RUNTIME_STACK={}", plain.max(ext));
}

/// One build of the runtime into `object`, with `extra` flags, and the
/// blobs of `functions` extracted from it. Returns the most stack one of
/// them uses (GCC's -fstack-usage: each is a leaf of fixed frame).
fn compile_runtime(manifest: &Path, arch: &str, out: &Path, object: &str, extra: &[&str], functions: &[&str]) -> u64 {
    let src = manifest.join("src/probe/runtime/runtime.c");
    let cc = compiler(Lang::C);
    let tools = binutils_prefix(&cc);
    let object = out.join(object);
    let mut cmd = Command::new(&cc);
    cmd.args(["-O2", "-std=gnu11", "-Wall", "-Werror", "-fPIC", "-fno-plt", "-ffreestanding", "-fno-builtin"]);
    cmd.args(["-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fno-jump-tables"]);
    cmd.args(["-fomit-frame-pointer", "-mgeneral-regs-only", "-ffunction-sections", "-fstack-usage", "-c"]);
    cmd.args(extra);
    cmd.arg(match arch {
        "x86_64" => "-fcf-protection=none",
        _ => "-mbranch-protection=none",
    });
    if arch == "aarch64" {
        // Atomics inline (LL/SC, ARMv8.0), not calls to libgcc's outline helpers.
        cmd.arg("-mno-outline-atomics");
    }
    cmd.arg("-I").arg(manifest.join("src/arch").join(arch));
    cmd.arg("-I").arg(out);
    cmd.arg(&src).arg("-o").arg(&object);
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", cc.display()));
    assert!(status.success(), "building the runtime failed: {cmd:?}");

    let relocs = Command::new(format!("{tools}readelf")).arg("-rW").arg(&object).output().expect("run readelf");
    let relocs = String::from_utf8_lossy(&relocs.stdout).into_owned();
    assert!(
        relocs.contains("There are no relocations"),
        "tp's runtime must be position-independent without relocations:\n{relocs}"
    );
    for f in functions {
        let blob = out.join(format!("{f}.bin"));
        let status = Command::new(format!("{tools}objcopy"))
            .args(["-O", "binary", &format!("--only-section=.text.{f}")])
            .arg(&object)
            .arg(&blob)
            .status()
            .expect("run objcopy");
        assert!(status.success() && std::fs::metadata(&blob).map(|m| m.len() > 0).unwrap_or(false), "extract {f}");
    }
    stack_usage(&object.with_extension("su"), functions)
}

/// The most stack one of `functions` uses, from the compiler's
/// -fstack-usage report `su` ("file:line:column:function<TAB>bytes<TAB>
/// static"); each must be there, and of a fixed size.
fn stack_usage(su: &Path, functions: &[&str]) -> u64 {
    let text = std::fs::read_to_string(su).unwrap_or_else(|e| panic!("read {}: {e}", su.display()));
    functions
        .iter()
        .map(|f| {
            let line = text
                .lines()
                .find(|l| l.split('\t').next().is_some_and(|head| head.ends_with(&format!(":{f}"))))
                .unwrap_or_else(|| panic!("{f} is not in {}:\n{text}", su.display()));
            let fields: Vec<&str> = line.split('\t').collect();
            assert!(fields.len() == 3 && fields[2] == "static", "{f}'s stack is not of a fixed size: {line}");
            fields[1].parse::<u64>().unwrap_or_else(|e| panic!("{line}: {e}"))
        })
        .max()
        .unwrap_or(0)
}

/// Writes `layout.h`: the structs and constants of src/layout.rs
/// that runtime.c shares, generated from the Rust definitions, with
/// `_Static_assert`s that the C compiler lays each struct out as Rust does
/// (so a cross build checks the target's layout too).
fn write_layout_header(path: &Path) {
    let mut h = String::from(
        "/* Generated by build.rs from src/layout.rs, which documents each\n \
         * field: do not edit. */\n#ifndef TP_LAYOUT_H\n#define TP_LAYOUT_H\n\n\
         #include <stddef.h>\n#include <stdint.h>\n\n",
    );
    for (name, value) in layout::C_CONSTANTS {
        let suffix = if *value > u32::MAX as u64 { "ull" } else { "u" };
        let value = if *value < 1024 { value.to_string() } else { format!("{value:#x}") };
        h += &format!("#define {name} {value}{suffix}\n");
    }
    for s in layout::c_structs() {
        h += "\n";
        h += &s.to_c();
    }
    h += "\n#endif\n";
    std::fs::write(path, h).expect("write layout.h");
}

/// Writes `syscalls.h`: the numbers of the syscalls the runtime makes on
/// `arch`, from src/arch/syscalls.rs (`TP_SYS_*`).
fn write_syscalls_header(path: &Path, arch: &str) {
    let table = match arch {
        "x86_64" => syscalls::X86_64,
        "aarch64" => syscalls::AARCH64,
        _ => panic!("tp's runtime has no syscall table for {arch}"),
    };
    let mut h = String::from(
        "/* Generated by build.rs from src/arch/syscalls.rs: do not edit. */\n\
         #ifndef TP_SYSCALLS_H\n#define TP_SYSCALLS_H\n\n",
    );
    for (name, value) in table.c_defines() {
        let value = if value < 1024 { value.to_string() } else { format!("{value:#x}") };
        h += &format!("#define {name} {value}\n");
    }
    h += "\n#endif\n";
    std::fs::write(path, h).expect("write syscalls.h");
}

/// `aarch64-linux-gnu-` for `aarch64-linux-gnu-gcc`, "" for `cc` or `gcc`.
fn binutils_prefix(cc: &Path) -> String {
    let name = cc.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.rfind('-') {
        Some(i) if name[..i].contains('-') => name[..=i].to_string(),
        _ => String::new(),
    }
}

fn compiler(lang: Lang) -> PathBuf {
    match lang {
        Lang::C => cc::Build::new().cargo_metadata(false).get_compiler().path().to_path_buf(),
        Lang::Cpp => cc::Build::new().cargo_metadata(false).cpp(true).get_compiler().path().to_path_buf(),
        Lang::Rust => PathBuf::from(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())),
    }
}

fn build_one(src_dir: &Path, out_dir: &Path, t: &Target, cross: bool) {
    let out = out_dir.join(t.name);
    // Write to a temporary name and rename, so concurrent builds of several
    // profiles never leave a half-written file behind.
    let tmp = out_dir.join(format!(".{}.{}", t.name, std::process::id()));
    let tool = compiler(t.lang);
    let mut cmd = Command::new(&tool);
    match t.lang {
        Lang::C | Lang::Cpp => {
            cmd.args(["-O2", "-g", "-pthread", "-Wall", "-Werror"]);
            if cross {
                // A static executable can still be position-independent.
                cmd.arg(if t.flags.contains(&"-pie") { "-static-pie" } else { "-static" });
            }
            cmd.arg("-I").arg(src_dir);
            for s in t.sources {
                cmd.arg(src_dir.join(s));
            }
        }
        Lang::Rust => {
            cmd.args(["-O", "-g", "--edition", "2021"]);
            for s in t.sources {
                cmd.arg(src_dir.join(s));
            }
        }
    }
    for f in t.flags.iter().filter(|f| !(cross && **f == "-pie")) {
        cmd.arg(f.replace("{out}", &out_dir.display().to_string()));
    }
    cmd.arg("-o").arg(&tmp);
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()));
    assert!(status.success(), "building target {} failed: {cmd:?}", t.name);
    std::fs::rename(&tmp, &out).expect("rename target");
}

/// `counter-nosyms`: the counter without symbols and no debug file to find
/// them in, stripped with the target's own `strip` (the arm64 test VM has
/// none, so it is made here).
fn strip_copy(out_dir: &Path) {
    let strip = format!("{}strip", binutils_prefix(&compiler(Lang::C)));
    let tmp = format!(".counter-nosyms.{}", std::process::id());
    let status = Command::new(&strip)
        .args(["--strip-all", "-o", &tmp, "counter"])
        .current_dir(out_dir)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {strip}: {e}"));
    assert!(status.success(), "{strip} counter failed");
    std::fs::rename(out_dir.join(&tmp), out_dir.join("counter-nosyms")).expect("rename counter-nosyms");
}

/// `counter-stripped` finds its symbols through `.gnu_debuglink` (the debug
/// file lies next to it); `counter-stripped-id` only through its build-id,
/// under `debug/.build-id/`. Both debug files have zlib-compressed DWARF.
fn split_debug_info(out_dir: &Path) {
    let run = |args: &[&str]| {
        let status = Command::new("objcopy").args(args).current_dir(out_dir).status().expect("run objcopy");
        assert!(status.success(), "objcopy {args:?} failed");
    };
    run(&["--only-keep-debug", "--compress-debug-sections=zlib", "counter", "counter-stripped.debug"]);
    run(&["--strip-all", "--add-gnu-debuglink=counter-stripped.debug", "counter", "counter-stripped"]);
    run(&["--strip-all", "counter", "counter-stripped-id"]);
    let id = build_id(&out_dir.join("counter")).expect("counter has a build-id");
    let dir = out_dir.join("debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&dir).expect("create debug dir");
    std::fs::copy(out_dir.join("counter-stripped.debug"), dir.join(format!("{}.debug", &id[2..])))
        .expect("copy debug file");
}

/// The GNU build-id of an ELF file, in hex, read with readelf.
fn build_id(path: &Path) -> Option<String> {
    let out = Command::new("readelf").arg("-n").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
}
