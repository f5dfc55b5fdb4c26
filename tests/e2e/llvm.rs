//! Every function of Debian's libLLVM (about 94,000 probes) counted while
//! opt and llc compile a generated IR file of 800 functions: `tp run`
//! probes them all before the program's first instruction, the program's
//! output is byte-identical to a run without tp, its exit status 0, and
//! LLVM's calls are counted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// The most a run under tp may take (the debug build plans some 94,000
/// functions on a first attach).
const LIMIT: Duration = Duration::from_secs(300);

/// A directory of the test's own, removed at the end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An IR module of `n` functions, each a few blocks with a call of
/// another, so that the optimizer inlines, folds and lays out code.
fn generated_ir(n: u64) -> String {
    let mut out = String::new();
    for i in 0..n {
        let (mul, callee) = ((i * 2_654_435_761) % 1_000_003 + 1, (i * 7 + 3) % n);
        out += &format!(
            "define i64 @f{i}(i64 %x) {{\nentry:\n  %a = mul i64 %x, {mul}\n  %b = xor i64 %a, {i}\n  \
             %c = icmp sgt i64 %b, 100\n  br i1 %c, label %big, label %small\nbig:\n  %d = sdiv i64 %b, 7\n  \
             %g = call i64 @f{callee}(i64 %d)\n  ret i64 %g\nsmall:\n  %e = add i64 %b, 13\n  ret i64 %e\n}}\n"
        );
    }
    out
}

/// Runs `program args… -o OUT` alone and under `tp run -f
/// 'libLLVM-14.so.1:*'`: the same output, status 0; returns tp's summary.
fn alone_and_counted(dir: &Path, program: &str, args: &[&str]) -> String {
    let alone = dir.join(format!("{program}.alone"));
    let counted = dir.join(format!("{program}.counted"));
    let out = run_within(Command::new(program).args(args).arg("-o").arg(&alone), LIMIT);
    assert!(out.status.success(), "{program} alone: {}", String::from_utf8_lossy(&out.stderr));
    let summary = dir.join(format!("{program}.json"));
    let _shared = shared();
    let out = run_within(
        tp_command()
            .args(["run", "-f", "libLLVM-14.so.1:*", "-q", "--json", "-o"])
            .arg(&summary)
            .arg("--")
            .arg(program)
            .args(args)
            .arg("-o")
            .arg(&counted),
        LIMIT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tp run {program}: {:?}\n{stderr}", out.status);
    let probes: u64 = stderr
        .split_once(" probes in before its first instruction")
        .and_then(|(before, _)| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `probes in` line: {stderr}"));
    assert!(probes >= 90_000, "every function of libLLVM: {probes} probes\n{stderr}");
    assert!(
        std::fs::read(&alone).unwrap() == std::fs::read(&counted).unwrap(),
        "{program}'s output under tp differs from its output alone"
    );
    std::fs::read_to_string(&summary).unwrap()
}

/// The calls tp counted in libLLVM, and those of one function.
fn calls(summary: &str, function: &str) -> (u64, u64) {
    let hits = hits_from_json(summary);
    (hits.values().sum(), hits.get(function).copied().unwrap_or(0))
}

#[test]
fn opt_and_llc_compile_the_same_code_with_every_function_of_libllvm_counted() {
    need("llvm");
    let dir = Scratch(std::env::temp_dir().join(format!("tp-llvm-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let ir = dir.0.join("gen.ll");
    std::fs::write(&ir, generated_ir(800)).unwrap();
    let ir = ir.to_str().unwrap();
    for (program, args) in [("opt-14", vec!["-O2", "-S", ir]), ("llc-14", vec!["-O2", ir])] {
        let summary = alone_and_counted(&dir.0, program, &args);
        let (total, terminator) = calls(&summary, "llvm::BasicBlock::getTerminator() const");
        assert!(total > 1_000_000 && terminator > 1_000, "{program}: {total} calls, getTerminator {terminator}");
    }
}
