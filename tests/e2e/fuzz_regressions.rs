//! Inputs the fuzzers (tests/fuzz, `just fuzz`) found crashing, replayed
//! through the real binary: `tp list-probes` must answer each with a table
//! or one error line, never a panic. Hand-made damage to a real binary
//! (truncations, wild header offsets) runs the same way. Data regions (the
//! `region` target's inputs, and the crafted regions of issue 14) are mapped
//! by a real target (`targets/hostile.c`, as `nobody`) and every command
//! that reads a region runs against it.

use std::path::PathBuf;

use crate::util::*;

fn regressions(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/regressions").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// Runs list-probes on `path`: success, or exit 1 with one `tp:` line.
fn answers_without_panic(path: &std::path::Path) {
    let out = tp(&["list-probes", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{}: {stderr}", path.display());
    match out.status.code() {
        Some(0) => assert!(stderr.is_empty(), "{}: {stderr}", path.display()),
        Some(1) => assert!(stderr.lines().count() == 1 && stderr.starts_with("tp: "), "{}: {stderr}", path.display()),
        other => panic!("{}: exit {other:?}: {stderr}", path.display()),
    }
}

#[test]
fn saved_fuzz_crashes_are_answered() {
    let files = regressions("list_probes");
    assert!(!files.is_empty(), "the regression inputs are missing");
    for f in files {
        answers_without_panic(&f);
    }
}

#[test]
fn saved_region_crashes_are_answered() {
    let files = regressions("region");
    assert!(files.len() >= 4, "the regression inputs are missing");
    for f in files {
        let img = crate::region_image::from_fuzz(&std::fs::read(&f).unwrap());
        crate::hostile::every_command_answers(&img, &f.display().to_string());
    }
}

#[test]
fn damaged_binaries_are_answered() {
    let good = std::fs::read(target_path("counter")).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("damaged");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for len in [4, 16, 63, 64, 100, 0x40 + 56 * 3, good.len() / 2, good.len() - 1] {
        cases.push((format!("truncated-{len}"), good[..len].to_vec()));
    }
    // e_phoff, e_shoff, e_phnum, e_shnum, e_shstrndx set to extremes.
    for (name, off, bytes) in [
        ("phoff", 32, u64::MAX.to_le_bytes().to_vec()),
        ("shoff", 40, u64::MAX.to_le_bytes().to_vec()),
        ("phnum", 56, vec![0xff, 0xff]),
        ("shnum", 60, vec![0xff, 0xff]),
        ("shstrndx", 62, vec![0xfe, 0xff]),
    ] {
        let mut b = good.clone();
        b[off..off + bytes.len()].copy_from_slice(&bytes);
        cases.push((name.to_string(), b));
    }
    for (name, bytes) in cases {
        let path = dir.join(format!("{name}-{}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        answers_without_panic(&path);
        std::fs::remove_file(&path).unwrap();
    }
}
