//! Coverage on real binaries from Debian packages (tests/deps.txt; need() installs them):
//! `tp list-probes --summary` must find at least 95 % of the functions of
//! 5 bytes or more probeable, and `--json` must give a verdict for each.
//! The binaries are those of tests/coverage.txt; docs/coverage.md records
//! the figures and the refusal reasons.

use crate::util::*;

/// (path, its entry in tests/deps.txt), from tests/coverage.txt.
fn binaries() -> Vec<(&'static str, &'static str)> {
    include_str!("../coverage.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace();
            (words.next().unwrap(), words.next().unwrap_or_else(|| panic!("no deps.txt entry: {l}")))
        })
        .collect()
}

#[test]
fn docs_report_the_binaries_the_tests_check() {
    let doc = include_str!("../../docs/coverage.md");
    let reported: Vec<&str> =
        doc.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next()).filter(|p| p.starts_with('/')).collect();
    let listed: Vec<&str> = binaries().iter().map(|(p, _)| *p).collect();
    assert_eq!(reported, listed, "docs/coverage.md's table and tests/coverage.txt list other binaries");
}

/// (probeable, functions of at least 5 bytes) from a `--summary`.
fn probeable(summary: &str) -> (u64, u64) {
    let line = summary.lines().find(|l| l.starts_with("probeable: ")).unwrap_or_else(|| panic!("{summary}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

#[test]
fn at_least_95_percent_of_real_functions_are_probeable() {
    let mut report = Vec::new();
    for (path, dep) in binaries() {
        need(dep);
        let args = ["list-probes", path, "--summary"];
        let out = expect_success(&args, &tp(&args));
        let (ok, total) = probeable(&out);
        assert!(total >= 500, "{path}: only {total} functions\n{out}");
        let pct = 100.0 * ok as f64 / total as f64;
        report.push(format!("{path}: {ok} of {total} ({pct:.1}%)"));
        assert!(pct >= 95.0, "{path}: {pct:.1}% probeable\n{out}");
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn json_gives_every_function_of_a_real_library_a_verdict() {
    let path = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";
    need("sqlite3");
    let summary = expect_success(&["list-probes", path, "--summary"], &tp(&["list-probes", path, "--summary"]));
    let functions: usize = summary
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{summary}"));
    let args = ["list-probes", path, "--json"];
    let out = expect_success(&args, &tp(&args));
    let mut with_code = 0;
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let every = [
            "address",
            "exits",
            "func",
            "module",
            "note",
            "probeable",
            "reason",
            "signature",
            "site",
            "size",
            "source",
            "type",
        ];
        assert_eq!(keys, every, "{line}");
        assert_eq!(v["type"], "function", "{line}");
        // A probeable function's exits: how many, how many a return probe can patch.
        if v["probeable"] == true {
            let e = &v["exits"];
            assert!(e["known"] == false || e["patchable"].as_u64() <= e["total"].as_u64(), "{line}");
        }
        assert!(v["module"].as_str().unwrap().starts_with("libsqlite3.so.0"), "{line}");
        match v["probeable"].as_bool().unwrap() {
            true => assert!(v["reason"].is_null(), "{line}"),
            false => assert!(!v["reason"].as_str().unwrap().is_empty(), "{line}"),
        }
        if v["address"].is_string() {
            assert!(v["address"].as_str().unwrap().starts_with("0x"), "{line}");
            with_code += 1;
        }
    }
    assert_eq!(with_code, functions, "one JSON object per function with code");
}

/// Functions shorter than a jump take the alignment padding after them
/// (nothing reaches it): every one of libsqlite3's (getters such as
/// `sqlite3VdbeDb`: a load and a return) and of libc's is probeable.
#[test]
fn functions_shorter_than_a_jump_are_probed_over_their_padding() {
    for (path, dep) in
        [("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0", "sqlite3"), ("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc-dbg")]
    {
        need(dep);
        let args = ["list-probes", path, "--summary", "--json"];
        let out = expect_success(&args, &tp(&args));
        let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        let (short, ok) = (v["shorter_than_a_jump"].as_u64(), v["shorter_probeable"].as_u64());
        assert!(short.is_some_and(|n| n >= 40), "{path}: {v}");
        assert_eq!(ok, short, "{path}: {v}");
    }
}
