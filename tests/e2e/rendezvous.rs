//! Libraries a program loads after it started are probed at the dynamic
//! linker's rendezvous, before their initializers and their first call:
//! every call counted, through a thousand loads and unloads, in a JVM's
//! launcher, and a program whose tp is killed while it waits there goes
//! on by itself.

use std::io::Write;
use std::process::Stdio;

use crate::util::*;

/// Runs `tp run ARGS` to its end, with the summary as JSON in a file
/// named after `name`; (status, stdout, stderr, hits by function, the JSON).
fn run_json(
    name: &str,
    args: &[&str],
) -> (std::process::ExitStatus, String, String, std::collections::BTreeMap<String, u64>, String) {
    let _shared = shared();
    let summary = std::env::temp_dir().join(format!("tp-rendezvous-{name}-{}.json", std::process::id()));
    let mut child = tp_command()
        .args(["run", "--json", "-o", summary.to_str().unwrap()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tp");
    let mut out = Lines::new(child.stdout.take().unwrap());
    let mut err = Lines::new(child.stderr.take().unwrap());
    let status = wait_timeout(&mut child);
    let join = |l: Vec<String>| l.iter().map(|s| format!("{s}\n")).collect::<String>();
    let (stdout, stderr) = (join(out.rest()), join(err.rest()));
    let json = std::fs::read_to_string(&summary).unwrap_or_default();
    let _ = std::fs::remove_file(&summary);
    let hits = if json.is_empty() { Default::default() } else { hits_from_json(&json) };
    (status, stdout, stderr, hits, json)
}

#[test]
fn every_call_into_a_library_loaded_and_unloaded_a_thousand_times_is_counted() {
    let dlcycle = target_path("dlcycle");
    let (status, stdout, stderr, hits, json) =
        run_json("cycle", &["-f", "libloaded.so:loaded_work", "--", dlcycle.to_str().unwrap(), "1000"]);
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    // Its initializer's call and the one right after dlopen, every time.
    assert!(stdout.contains("calls=2000 checksum=ok "), "{stdout}\n{stderr}");
    assert_eq!(hits.get("loaded_work"), Some(&2000), "{stderr}");
    // A line for each of the first three loads, then at 10, 100 and 1000
    // loads in a row: the JSON summary counts them all.
    let probed = stderr
        .lines()
        .filter(|l| l.contains("loaded libloaded.so: probed 1 more function at the dynamic linker's rendezvous"))
        .count();
    assert_eq!(probed, 3, "{stderr}");
    let again: Vec<&str> = stderr.lines().filter(|l| l.contains("loaded libloaded.so again: ")).collect();
    assert_eq!(again.len(), 3, "{stderr}");
    for (line, n) in again.iter().zip([10, 100, 1000]) {
        assert!(
            line.contains(&format!(
                ": {n} loads in a row, each probed (1 function) at the dynamic linker's rendezvous"
            )),
            "{line}"
        );
    }
    // The same in the JSON summary: 1000 loads, each probed at the rendezvous.
    let libraries = one_process(&json)["libraries"].as_array().unwrap().clone();
    assert_eq!(libraries.len(), 1, "{json}");
    let l = &libraries[0];
    let want = (&"libloaded.so".into(), &1.into(), &"rendezvous".into(), &1000.into());
    assert_eq!((&l["modules"][0], &l["probes"], &l["at"], &l["loads"]), want, "{json}");
}

#[test]
fn the_jvm_launchers_one_call_of_jni_create_java_vm_is_counted() {
    need("java");
    let (status, stdout, stderr, hits, _) =
        run_json("jvm", &["-f", "libjvm.so:JNI_CreateJavaVM", "--", "java", "-version"]);
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert!(stderr.contains("openjdk version"), "{stderr}");
    assert_eq!(hits.get("JNI_CreateJavaVM"), Some(&1), "{stderr}");
    // libjvm.so comes with its dependencies, in one map.
    let probed =
        |l: &&str| l.contains("libjvm.so") && l.contains(": probed 1 more function at the dynamic linker's rendezvous");
    assert!(stderr.lines().any(|l| probed(&l)), "{stderr}");
}

#[test]
fn every_thread_yield_of_a_java_program_is_counted() {
    let dir = compile_java("Yield");
    let cp = dir.to_str().unwrap();
    let (status, stdout, stderr, hits, _) =
        run_json("yield", &["-f", "libjvm.so:JVM_Yield", "--", "java", "-cp", cp, "Yield", "600"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert!(stdout.contains("yields=600"), "{stdout}");
    assert_eq!(hits.get("JVM_Yield"), Some(&600), "{stderr}");
}

#[test]
fn a_program_whose_tp_is_killed_while_it_waits_at_the_rendezvous_goes_on() {
    let _shared = shared();
    let dlcycle = target_path("dlcycle");
    let mut tp = tp_command()
        .args(["run", "-f", "libloaded.so:loaded_work", "--"])
        .arg(&dlcycle)
        .arg("3")
        .env("TP_FAULT", "pause:at-rendezvous")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tp");
    // The program keeps tp's stdout: it ends when the program does.
    let mut out = Lines::new(tp.stdout.take().unwrap());
    let mut err = Lines::new(tp.stderr.take().unwrap());
    wait_paused(&tp);
    let started = err.wait_for("tp: started");
    let pid: i32 = started.split("as process ").nth(1).and_then(|s| s.split(';').next()).unwrap().parse().unwrap();
    let _target = KillOnDrop::pid(pid);
    tp.kill().unwrap();
    tp.wait().unwrap();
    let done = out.wait_for("calls=");
    assert!(done.starts_with("calls=6 checksum=ok "), "{done}");
    wait_until("the program exits", || !tp::process::is_alive(pid));
}

/// Runs `dlcycle N wait` under `tp run`; once the program has loaded,
/// called and unloaded the library N times, reads tp's memory in it: the
/// region's entries, its code arenas and the bytes used in them. Checks
/// the counts (the program's and tp's) on the way, and that the loading
/// thread waited twice per cycle: after the map and after the unmap, not
/// before them (the loader's state says which).
fn memory_after(cycles: u32) -> (u32, u32, u64) {
    let dlcycle = target_path("dlcycle");
    let mut tp = KillOnDrop::child(
        tp_command()
            .args(["run", "-f", "libloaded.so:loaded_work", "--"])
            .arg(&dlcycle)
            .args([&cycles.to_string(), "wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tp"),
    );
    let mut out = Lines::new(tp.get_mut().stdout.take().unwrap());
    let mut err = Lines::new(tp.get_mut().stderr.take().unwrap());
    let started = err.wait_for("tp: started");
    let pid: i32 = started.split("as process ").nth(1).and_then(|s| s.split(';').next()).unwrap().parse().unwrap();
    let done = out.wait_for("calls=");
    assert!(done.starts_with(&format!("calls={} checksum=ok ", 2 * cycles)), "{done}");
    let maps = tp::process::read_maps(pid).unwrap();
    let mapping = tp::probe::region::find(&maps).expect("the program maps tp's region");
    let region = tp::probe::region::Region::open(pid, mapping).unwrap();
    let h = region.header();
    let used: u64 = h.arenas[..h.arena_count as usize].iter().map(|a| a.used).sum();
    assert_eq!(tp::probe::rendezvous_wait::arrived(&region), 2 * cycles, "arrivals at the rendezvous");
    tp.get_mut().stdin.take().unwrap().write_all(b"end\n").unwrap();
    let status = wait_timeout(tp.get_mut());
    assert!(status.success(), "{status:?}");
    let summary = err.rest().join("\n");
    let row = summary.lines().find(|l| l.starts_with("loaded_work")).unwrap_or_default();
    assert!(row.ends_with(&format!(" {}", 2 * cycles)), "{summary}");
    (h.count, h.arena_count, used)
}

#[test]
fn loading_and_unloading_a_probed_library_again_and_again_does_not_grow_tps_memory() {
    let _shared = shared();
    let few = memory_after(3);
    let many = memory_after(300);
    // tp's probe at the rendezvous, and one for loaded_work that every load
    // took again with its detour.
    assert_eq!(few.0, 2, "entries after 3 loads");
    assert_eq!(many, few, "entries, arenas and bytes used in them after 300 loads, and after 3");
}

#[test]
fn a_python_extensions_init_function_calling_a_probed_library_is_counted() {
    need("python3");
    need("sqlite3");
    // `import sqlite3` loads the _sqlite3 extension and libsqlite3 with it;
    // the extension's init checks the library's version, once.
    let (status, stdout, stderr, hits, _) = run_json(
        "python",
        &[
            "-f",
            "libsqlite3.so.0:sqlite3_libversion_number",
            "--",
            "/usr/bin/python3",
            "-c",
            "import sqlite3; print(sqlite3.sqlite_version)",
        ],
    );
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert_eq!(hits.get("sqlite3_libversion_number"), Some(&1), "{stderr}");
    assert!(stderr.contains("probed 1 more function at the dynamic linker's rendezvous"), "{stderr}");
}

/// The first bytes of the dynamic loader's `_dl_debug_state` in process
/// `pid` now, and in its file.
fn debug_state_bytes(pid: i32) -> (Vec<u8>, Vec<u8>) {
    const AT_BASE: u64 = 7;
    let maps = tp::process::read_maps(pid).unwrap();
    let modules = tp::symbols::ProcessModules::new(pid, &maps).unwrap();
    let base = tp::process::auxv(pid, AT_BASE).expect("a dynamic loader");
    let loader = modules.get(modules.index_containing(base).unwrap()).unwrap();
    let f = loader.matching_symbols("_dl_debug_state").into_iter().next().expect("_dl_debug_state");
    let at = f.addr.0;
    let m = maps.iter().find(|m| m.start <= at && at < m.end).unwrap();
    let file = std::fs::read(&m.path).unwrap();
    let off = (at - m.start + m.offset) as usize;
    (read_mem(pid, at, 5), file[off..off + 5].to_vec())
}

/// A session that follows an exec probes the new program's rendezvous
/// while a pattern waits for a library there, and its end restores it.
#[test]
fn the_end_of_a_session_restores_the_loaders_rendezvous() {
    let mut t = Target::start("launched");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "-f", "foo", "-f", "only_here", "--follow-exec"]);
    t.send(format!("exec {}\n", target_path("counter").display()).as_bytes());
    t.out.wait_for("ready pid=");
    session.err.wait_for(&format!("tp: process {pid}: not in the new program"));
    let (now, file) = debug_state_bytes(t.pid);
    assert_eq!(now[0], 0xe9, "a jump to tp's detour at the rendezvous: {now:02x?} (file {file:02x?})");
    let (status, _, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let (now, file) = debug_state_bytes(t.pid);
    assert_eq!(now, file, "the loader's code is its file's again");
    assert_code_is_original(&t, &["foo"]);
}

/// `tp attach` with a pattern naming a library the process has not loaded
/// waits for it at the rendezvous, as `tp run` does: every call from the
/// first load on is counted, and a misspelt name beside it is still an
/// error that touches nothing.
#[test]
fn attach_waits_for_a_library_the_process_loads_later() {
    let mut t = Target::start_with("dlcycle", |c| {
        c.args(["300", "first"]);
    });
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "libloaded.so:loaded_work", "-f", "fooo_typo"], "fooo_typo");
    assert!(!line.contains("libloaded"), "{line}");
    assert!(!has_region(t.pid), "a refused attach leaves nothing");
    let session = Session::start(&["-p", &pid, "-f", "libloaded.so:loaded_work", "--json"]);
    t.send(b"\n");
    let line = t.out.wait_for("calls=");
    assert!(line.starts_with("calls=600 checksum=ok "), "{line}");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("tp probes it when the process loads it"), "{stderr}");
    assert_eq!(hits_from_json(&stdout).get("loaded_work"), Some(&600), "{stdout}\n{stderr}");
    let (now, file) = debug_state_bytes(t.pid);
    assert_eq!(now, file, "the rendezvous is restored");
    assert!(t.quit().success());
}

/// `tp profile -p PID` of `dlcycle 300 first` with `ARGS`, started before
/// the first load: the program's own line, then tp's (status, stdout,
/// stderr); the program's code at the rendezvous is its file's again after.
fn profile_cycles(args: &[&str]) -> (String, std::process::ExitStatus, String, String) {
    let mut t = Target::start_with("dlcycle", |c| {
        c.args(["300", "first"]);
    });
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str(), "-f", "libloaded.so:loaded_work"];
    full.extend_from_slice(args);
    let session = Session::spawn("profile", &full, &[], Some("tp: profiling"));
    t.send(b"\n");
    let line = t.out.wait_for("calls=");
    let (status, stdout, stderr) = session.interrupt();
    let (now, file) = debug_state_bytes(t.pid);
    assert_eq!(now, file, "the rendezvous is restored");
    assert!(t.quit().success(), "the program exits 0");
    (line, status, stdout, stderr)
}

/// `tp profile` waits for a library as `tp attach` does, through the same
/// code (session/libraries.rs): tp's probe at the dynamic linker's
/// rendezvous, where each of 300 loads is probed before the library's
/// initializer and the call right after `dlopen`. Every call is counted,
/// those timed among them, the lines and the JSON's `libraries` as attach's.
#[test]
fn profile_shares_attachs_rendezvous_and_counts_every_call_after_each_dlopen() {
    let (line, status, stdout, stderr) = profile_cycles(&["--sample", "500000", "--epoch", "2ms", "--json"]);
    assert!(status.success(), "{stderr}");
    // The initializer's call and the one right after dlopen, every time.
    assert!(line.starts_with("calls=600 checksum=ok "), "{line}");
    assert!(stderr.contains("tp profiles it when the process loads it"), "{stderr}");
    let doc = one_process(&stdout);
    let row = doc["probes"].as_array().unwrap().iter().find(|r| r["func"] == "loaded_work").cloned();
    let row = row.unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(row["hits"], 600, "{row}\n{stderr}");
    // Once tp knows the rate (the end of the first epoch with calls), every
    // call is timed (--sample above the calls of an epoch: period 1), in
    // every load, its first call included: the period goes back in with the
    // probe before the loading thread goes on. Before, the calls are
    // sampled as those of a function whose rate tp does not know
    // (events/sampling.rs): at most the loads of that first epoch (2 ms;
    // 583 to 598 of 600 timed in runs on the 2-core test machine).
    let timed = row["timed"].as_u64().unwrap();
    assert!((560..=600).contains(&timed), "{timed} of 600 calls timed: {row}\n{stderr}");
    let probed = "loaded libloaded.so: probed 1 more function at the dynamic linker's rendezvous";
    assert_eq!(stderr.lines().filter(|l| l.contains(probed)).count(), 3, "{stderr}");
    let again: Vec<&str> = stderr.lines().filter(|l| l.contains("loaded libloaded.so again: ")).collect();
    assert_eq!(again.len(), 2, "{stderr}");
    for (line, n) in again.iter().zip([10, 100]) {
        let want = format!(": {n} loads in a row, each probed (1 function) at the dynamic linker's rendezvous");
        assert!(line.contains(&want), "{line}");
    }
    let libraries = doc["libraries"].as_array().unwrap().clone();
    assert_eq!(libraries.len(), 1, "{stdout}");
    let l = &libraries[0];
    let want = (&"libloaded.so".into(), &1.into(), &"rendezvous".into(), &300.into());
    assert_eq!((&l["modules"][0], &l["probes"], &l["at"], &l["loads"]), want, "{stdout}");
}

/// The same in text, with the default sampling: the calls exact.
#[test]
fn profile_text_counts_every_call_into_a_library_loaded_300_times() {
    let (line, status, stdout, stderr) = profile_cycles(&[]);
    assert!(status.success(), "{stderr}");
    assert!(line.starts_with("calls=600 checksum=ok "), "{line}");
    let row = stdout.lines().find(|l| l.starts_with("loaded_work ")).unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[2], "600", "{row}");
}

/// A program whose `tp profile` is killed while a thread waits at the
/// rendezvous goes on by itself, as under `tp attach` and `tp run` (the
/// same wait in the runtime, answered by the same code in tp).
#[test]
fn a_program_whose_tp_profile_is_killed_while_it_waits_at_the_rendezvous_goes_on() {
    let mut t = Target::start_with("dlcycle", |c| {
        c.args(["3", "first"]);
    });
    let pid = t.pid.to_string();
    let session = Session::spawn(
        "profile",
        &["-p", &pid, "-f", "libloaded.so:loaded_work"],
        &[("TP_FAULT", "pause:at-rendezvous")],
        Some("tp: profiling"),
    );
    t.send(b"\n");
    wait_paused(&session.child);
    session.kill();
    let done = t.out.wait_for("calls=");
    assert!(done.starts_with("calls=6 checksum=ok "), "{done}");
    assert!(t.quit().success(), "the program exits 0");
}
