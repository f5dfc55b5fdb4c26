//! Builds the C target programs in `targets/` into `targets/bin/<arch>/`,
//! so that `cargo build` and `cargo test` need no separate step.
//!
//! Every target is built PIE and non-PIE, plus one variant with Intel CET
//! landing pads (`endbr64`) on x86-64. Cross builds (aarch64) link statically
//! so the binaries run in the test VM without a sysroot.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One executable to build: output name, sources, extra compiler flags.
struct Target {
    name: &'static str,
    sources: &'static [&'static str],
    flags: &'static [&'static str],
}

const TARGETS: &[Target] = &[
    Target { name: "counter", sources: &["counter.c"], flags: &["-fPIE", "-pie"] },
    Target { name: "counter-nopie", sources: &["counter.c"], flags: &["-fno-pie", "-no-pie"] },
    // Reliability targets (tests/e2e/blocked.rs, stress.rs, churn.rs).
    Target { name: "hammer", sources: &["hammer.c"], flags: &["-fPIE", "-pie"] },
    Target { name: "blocked", sources: &["blocked.c"], flags: &["-fPIE", "-pie"] },
    Target { name: "churn", sources: &["churn.c"], flags: &["-fPIE", "-pie"] },
];

const X86_64_ONLY: &[Target] =
    &[Target { name: "counter-cet", sources: &["counter.c"], flags: &["-fPIE", "-pie", "-fcf-protection=full"] }];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let host = std::env::var("HOST").unwrap();
    let target = std::env::var("TARGET").unwrap();
    let src_dir = manifest.join("targets");
    let out_dir = src_dir.join("bin").join(&arch);
    std::fs::create_dir_all(&out_dir).expect("create targets/bin");
    println!("cargo:rerun-if-changed=targets");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=TP_TARGETS_DIR={}", out_dir.display());

    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let cross = host != target;
    let mut all: Vec<&Target> = TARGETS.iter().collect();
    if arch == "x86_64" {
        all.extend(X86_64_ONLY);
    }
    for t in all {
        build_one(compiler.path(), &src_dir, &out_dir, t, cross);
    }
}

fn build_one(cc: &Path, src_dir: &Path, out_dir: &Path, t: &Target, cross: bool) {
    let out = out_dir.join(t.name);
    // Write to a temporary name and rename, so concurrent builds of several
    // profiles never leave a half-written executable behind.
    let tmp = out_dir.join(format!(".{}.{}", t.name, std::process::id()));
    let mut cmd = Command::new(cc);
    cmd.args(["-O2", "-g", "-pthread", "-Wall", "-Werror"]);
    cmd.args(t.flags);
    if cross {
        cmd.arg("-static");
    }
    cmd.arg("-I").arg(src_dir);
    for s in t.sources {
        cmd.arg(src_dir.join(s));
    }
    cmd.arg("-o").arg(&tmp);
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", cc.display()));
    assert!(status.success(), "building target {} failed: {cmd:?}", t.name);
    std::fs::rename(&tmp, &out).expect("rename target");
}
