//! list-probes on the bundled targets: every function with its verdict.

use crate::util::*;

#[test]
fn lists_every_function_with_a_verdict() {
    let path = target_path("counter");
    let args = ["list-probes", path.to_str().unwrap()];
    let stdout = expect_success(&args, &tp(&args));
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{stdout}"))
            .to_string()
    };
    for (func, verdict) in EXPECTED {
        assert!(line(func).ends_with(verdict), "{}", line(func));
    }
}

/// What gcc -O2 makes of counter.c's entries, and tp's verdicts on them.
#[cfg(target_arch = "x86_64")]
const EXPECTED: [(&str, &str); 3] =
    [("foo", "ok (10 bytes: movabs)"), ("bar", "ok (5 bytes: push, mov, push)"), ("baz", "ok (10 bytes: mov, lea)")];
#[cfg(target_arch = "aarch64")]
const EXPECTED: [(&str, &str); 3] =
    [("foo", "ok (4 bytes: mov)"), ("bar", "ok (4 bytes: stp)"), ("baz", "ok (4 bytes: and)")];

#[test]
fn json_has_one_object_per_function() {
    let path = target_path("counter-nopie");
    let args = ["list-probes", path.to_str().unwrap(), "--json"];
    let stdout = expect_success(&args, &tp(&args));
    let objs: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let foo = objs.iter().find(|o| o["func"] == "foo").expect("foo");
    assert_eq!(foo["module"], "counter-nopie");
    assert_eq!(foo["probeable"], true);
    assert!(foo["reason"].is_null());
    assert!(foo["address"].as_str().unwrap().starts_with("0x40"));
    assert!(foo["size"].as_u64().unwrap() >= 10);
}

#[test]
fn summary_counts_probeable_functions() {
    let path = target_path("counter");
    let args = ["list-probes", path.to_str().unwrap(), "--summary"];
    let stdout = expect_success(&args, &tp(&args));
    assert!(stdout.lines().any(|l| l.starts_with("probeable: ")), "{stdout}");
}

/// A file tp finds no function in (stripped, and its unwind table removed):
/// `--summary` still summarizes it, and the table says where names come from.
#[cfg(target_arch = "x86_64")] // objcopy is the host's
#[test]
fn summary_covers_a_file_without_functions() {
    let bare = std::env::temp_dir().join(format!("tp-bare-{}", std::process::id()));
    let status = std::process::Command::new("objcopy")
        .args(["--strip-all", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr"])
        .arg(target_path("counter"))
        .arg(&bare)
        .status()
        .unwrap();
    assert!(status.success());
    let args = ["list-probes", bare.to_str().unwrap(), "--summary"];
    let stdout = expect_success(&args, &tp(&args));
    let name = bare.file_name().unwrap().to_str().unwrap();
    assert!(stdout.starts_with(&format!("{name}: 0 functions, 0 of at least 5 bytes\n")), "{stdout}");
    assert!(stdout.contains("probeable: 0 of 0"), "{stdout}");
    let _ = std::fs::remove_file(&bare);

    // The stripped counter still has its unwind table: its functions are `sub_…`.
    let path = target_path("counter-stripped-id");
    let args = ["list-probes", path.to_str().unwrap()];
    let stdout = expect_success(&args, &tp(&args));
    let header = stdout.lines().next().unwrap();
    assert!(header.contains(" SOURCE ") && header.ends_with("VERDICT"), "{header}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert!(rows.len() > 5 && rows.iter().all(|r| r.contains(" sub_") && r.contains(" eh_frame ")), "{stdout}");
}
