//! Functions anywhere in the process: shared libraries (module-qualified,
//! ambiguous, loaded later by dlopen), globs, --addr, demangled C++ and Rust
//! names, and symbols that only separate debug information has.

use crate::util::*;

/// Attaches with `args`, makes `calls` calls with `cmd`, detaches, and
/// returns the hits per function.
fn count(t: &mut Target, args: &[&str], calls: &[(&str, u64)]) -> std::collections::BTreeMap<String, u64> {
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str(), "--json"];
    full.extend_from_slice(args);
    let session = Session::start(&full);
    for (what, n) in calls {
        let line = t.ask(&format!("call {what} {n}"), "done");
        assert!(line.ends_with("checksum=ok"), "{line}");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    hits_from_json(&stdout)
}

#[test]
fn module_qualified_names_pick_the_library() {
    let mut t = Target::start("libuser");
    let hits =
        count(&mut t, &["-f", "libalpha:lib_work", "-f", "libbeta.so:lib_work"], &[("alpha", 1000), ("beta", 300)]);
    // Both probes are `lib_work`; JSON keys collapse, so check via status-like table instead.
    assert_eq!(hits.len(), 1, "two probes with the same name: {hits:?}");
    drop(hits);
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "libalpha:lib_work", "--keep"]));
    t.call("alpha", 1234, 1);
    t.call("beta", 99, 1);
    let status = expect_success(&["status"], &tp(&["status", "-p", &pid, "--json"]));
    let v = one_process(&status);
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0]["module"], "libalpha.so");
    assert_eq!(probes[0]["hits"], 1234, "only libalpha's lib_work is probed");
    expect_success(&["detach"], &tp(&["detach", "-p", &pid]));
    assert!(t.quit().success());
}

#[test]
fn a_name_in_two_libraries_is_ambiguous() {
    let t = Target::start("libuser");
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "lib_work"], "defined in several modules");
    assert!(line.contains("`libalpha.so:lib_work`") && line.contains("`libbeta.so:lib_work`"), "{line}");
    // A name only one library has needs no module.
    let mut t = t;
    let hits = count(&mut t, &["-f", "alpha_only"], &[("only", 500)]);
    assert_eq!(hits["alpha_only"], 500);
}

#[test]
fn globs_match_across_libraries() {
    let mut t = Target::start("libuser");
    let hits = count(&mut t, &["-f", "*_only"], &[("only", 700)]);
    assert_eq!(hits.get("alpha_only"), Some(&700));
    assert_eq!(hits.get("beta_only"), Some(&700));
    let hits = count(&mut t, &["-f", "libbeta:*"], &[("beta", 10), ("only", 20)]);
    assert_eq!(hits.get("lib_work"), Some(&10));
    assert_eq!(hits.get("beta_only"), Some(&20));
    assert!(!hits.contains_key("alpha_only"));
    let pid = t.pid.to_string();
    expect_error(&["attach", "-p", &pid, "-f", "nomatch_*"], "no function matches `nomatch_*`");
    // A module the process has not loaded: tp waits for it, and says so.
    let out = tp(&["attach", "-p", &pid, "-f", "libnope:*", "-d", "0.2"]);
    expect_success(&["attach", "libnope:*"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no module `libnope`") && stderr.contains("tp probes it when the process loads it"),
        "{stderr}"
    );
    // With --keep tp does not stay to wait: an error.
    expect_error(&["attach", "-p", &pid, "-f", "libnope:*", "--keep"], "no module `libnope`");
}

#[test]
fn an_address_names_a_function() {
    let mut t = Target::start("libuser");
    let maps = tp::process::read_maps(t.pid).unwrap();
    let modules = tp::symbols::ProcessModules::new(t.pid, &maps).unwrap();
    let found = modules.resolve(&["libbeta:lib_work".to_string()]).unwrap();
    let addr = format!("{:#x}", found[0].function.addr);
    let hits = count(&mut t, &["--addr", &addr], &[("beta", 4321), ("alpha", 5)]);
    assert_eq!(hits["lib_work"], 4321);
    let pid = t.pid.to_string();
    // An address inside the function is a site of its own, if an instruction starts there.
    let inside = format!("{:#x}", found[0].function.addr.0 + 1);
    let line = expect_error(&["attach", "-p", &pid, "--addr", &inside], "is not where an instruction starts");
    assert!(line.contains("cannot probe `lib_work+0x1`: `lib_work+0x1` is not where an instruction starts"), "{line}");
    assert!(line.contains("the nearest places that can be probed: `lib_work`"), "{line}");
}

/// A session whose pattern names a library not loaded yet probes it once
/// the process loads it; a later attach finds it loaded.
#[test]
fn a_library_loaded_later_is_probed_when_it_loads() {
    let mut t = Target::start("libuser");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "libgamma:lib_work", "--json"]);
    assert_eq!(t.ask("load gamma", "loaded"), "loaded gamma");
    let line = t.ask("call gamma 700", "done");
    assert!(line.ends_with("checksum=ok"), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("no module `libgamma`"), "{stderr}");
    assert_eq!(hits_from_json(&stdout).get("lib_work"), Some(&700), "{stdout}\n{stderr}");
    let hits = count(&mut t, &["-f", "libgamma:lib_work"], &[("gamma", 2500)]);
    assert_eq!(hits["lib_work"], 2500);
    assert!(t.quit().success());
}

#[test]
fn cpp_methods_match_demangled_and_mangled() {
    let mut t = Target::start("shapes");
    for name in ["app::Stats::add", "app::Stats::add(long)", "_ZN3app5Stats3addEl"] {
        let hits = count(&mut t, &["-f", name], &[("add", 1111)]);
        assert_eq!(hits.get("app::Stats::add(long)"), Some(&1111), "{name}: {hits:?}");
    }
    let hits = count(&mut t, &["-f", "app::Square::area", "-f", "app::twice<long>"], &[("area", 300), ("twice", 40)]);
    assert_eq!(hits.get("app::Square::area() const"), Some(&300), "{hits:?}");
    assert_eq!(hits.get("long app::twice<long>(long)"), Some(&40), "{hits:?}");
    assert!(t.quit().success());
}

#[test]
fn rust_functions_match_with_both_manglings() {
    for target in ["rusty-legacy", "rusty-v0"] {
        let mut t = Target::start(target);
        let hits = count(
            &mut t,
            &["-f", "rusty::geometry::area", "-f", "rusty::Counter::bump", "-f", "rusty::scale"],
            &[("area", 2000), ("bump", 30), ("scale", 4)],
        );
        let get = |prefix: &str| hits.iter().find(|(k, _)| k.contains(prefix)).map(|(_, v)| *v);
        assert_eq!(get("geometry::area"), Some(2000), "{target}: {hits:?}");
        assert_eq!(get("Counter>::bump").or(get("Counter::bump")), Some(30), "{target}: {hits:?}");
        assert_eq!(get("rusty::scale"), Some(4), "{target}: {hits:?}");
        assert!(t.quit().success());
    }
}

#[test]
fn stripped_binaries_use_separate_debug_info() {
    // Found through .gnu_debuglink: the debug file lies next to the binary.
    let mut t = Target::start("counter-stripped");
    let hits = count(&mut t, &["-f", "foo", "-f", "run_calls"], &[("foo", 777)]);
    assert_eq!(hits["foo"], 777);
    assert_eq!(hits["run_calls"], 1, "one `call` command runs run_calls once");
    drop(t);

    // Found only by build-id, under TP_DEBUG_DIRS.
    let t = Target::start("counter-stripped-id");
    let pid = t.pid.to_string();
    expect_error(&["attach", "-p", &pid, "-f", "run_calls"], "stripped");
    let debug_dir = target_path("debug");
    let out = tp_command()
        .args(["attach", "-p", &pid, "-f", "run_calls", "--duration", "0.1", "--all"])
        .env("TP_DEBUG_DIRS", &debug_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("run_calls"));
}

#[test]
fn libc_static_functions_come_from_libc6_dbg() {
    let args = ["list-probes", "/usr/lib/x86_64-linux-gnu/libc.so.6"];
    let stdout = expect_success(&args, &tp(&args));
    let line = stdout.lines().find(|l| l.split_whitespace().nth(2) == Some("_int_malloc"));
    assert!(line.is_some_and(|l| l.contains(" ok (")), "libc6-dbg's .symtab should list _int_malloc: {line:?}");
    assert!(stdout.lines().any(|l| l.ends_with("refused: inlined everywhere")), "DWARF (compressed) is read");
}

#[test]
fn list_probes_of_a_process_covers_every_module() {
    let t = Target::start("libuser");
    let pid = t.pid.to_string();
    let args = ["list-probes", "-p", pid.as_str()];
    let stdout = expect_success(&args, &tp(&args));
    assert!(stdout.lines().next().unwrap().starts_with("MODULE"), "{stdout}");
    for (module, func) in
        [("libuser", "main"), ("libalpha.so", "lib_work"), ("libbeta.so", "beta_only"), ("libc.so.6", "malloc")]
    {
        assert!(
            stdout.lines().any(|l| l.starts_with(module) && l.split_whitespace().nth(3) == Some(func)),
            "no row for {module}:{func}"
        );
    }
    let args = ["list-probes", "-p", pid.as_str(), "--summary"];
    let stdout = expect_success(&args, &tp(&args));
    assert!(stdout.contains("all modules:"), "{stdout}");
}
