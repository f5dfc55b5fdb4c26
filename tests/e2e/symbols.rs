//! Finding the code a program really runs: the default version of a
//! versioned libc symbol, every copy of a Rust generic under one name, code
//! mapped twice (a bundled target doing what V8 does in node, and node
//! itself), functions of stripped binaries known only from `.eh_frame`
//! (bundled, busybox-static, ripgrep), and output that stays small when
//! names are long or probes many.

#[cfg(target_arch = "x86_64")] // Debian's binaries and the host-only targets
use std::io::{Read, Write};
#[cfg(target_arch = "x86_64")]
use std::process::{Command, Stdio};

use crate::util::*;

/// One probe of a JSON summary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probe {
    func: String,
    module: String,
    address: u64,
    hits: u64,
}

/// The probes of the last JSON summary in `stdout`.
fn probes(stdout: &str) -> Vec<Probe> {
    let v = one_process(stdout);
    v["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Probe {
            func: p["func"].as_str().unwrap().to_string(),
            module: p["module"].as_str().unwrap().to_string(),
            address: u64::from_str_radix(p["address"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap(),
            hits: p["hits"].as_u64().unwrap(),
        })
        .collect()
}

/// The line of `tp attach` that says how many probes went in.
#[cfg(target_arch = "x86_64")]
fn attached_line(stderr: &str) -> &str {
    stderr.lines().find(|l| l.starts_with("tp: attached ")).unwrap_or_else(|| panic!("{stderr}"))
}

/// `-f P` for each pattern.
fn functions<'a>(patterns: &[&'a str]) -> Vec<&'a str> {
    patterns.iter().flat_map(|p| ["-f", p]).collect()
}

/// Attaches to `t` with `selection` (`-f`/`--addr` arguments), has it
/// answer `commands`, detaches; returns (the probes with their hits, tp's
/// stderr, the target's answers).
fn count(
    t: &mut Target,
    selection: &[&str],
    commands: &[&str],
    env: &[(&str, &str)],
) -> (Vec<Probe>, String, Vec<String>) {
    let pid = t.pid.to_string();
    let mut args = vec!["-p", pid.as_str(), "--json"];
    args.extend(selection);
    let session = Session::spawn("attach", &args, env, Some("tp: attached"));
    let answers: Vec<String> = commands.iter().map(|c| t.ask(c, "done")).collect();
    for a in &answers {
        assert!(a.ends_with("checksum=ok"), "{a}");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert!(stderr.contains("code restored"), "{stderr}");
    (probes(&stdout), stderr, answers)
}

// ---- Symbol versions (Debian's libc on x86-64) ----

/// `pthread_cond_signal` has two versions in x86-64 glibc; the plain name
/// must count the default one, which the program calls, with libc's symbols
/// from its debug file (names `x@@GLIBC_2.3.2`) and from `.dynsym` alone
/// (`.gnu.version`); both spellings of a version are accepted.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_versioned_libc_function_counts_the_version_programs_call() {
    need("libc-dbg");
    let no_debug_files = std::env::temp_dir().join(format!("tp-no-debug-{}", std::process::id()));
    std::fs::create_dir_all(&no_debug_files).unwrap();
    for env in [vec![], vec![("TP_DEBUG_DIRS", no_debug_files.to_str().unwrap())]] {
        let mut t = Target::start("versions");
        let (got, stderr, _) = count(&mut t, &functions(&["libc:pthread_cond_signal"]), &["call signal 1789"], &env);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].func.as_str(), got[0].hits), ("pthread_cond_signal", 1789), "{env:?}: {stderr}");
        assert!(
            stderr.contains("default version @@GLIBC_2.3.2") && stderr.contains("@GLIBC_2.2.5"),
            "tp says which version it chose: {stderr}"
        );

        // Named with their versions, as written: the default one counts, the old one not.
        let patterns = ["pthread_cond_signal@@GLIBC_2.3.2", "libc:pthread_cond_signal@GLIBC_2.2.5"];
        let (got, stderr, _) = count(&mut t, &functions(&patterns), &["call signal 250", "call broadcast 10"], &env);
        let hits = |f: &str| got.iter().find(|p| p.func == f).unwrap_or_else(|| panic!("{f}: {got:?} {stderr}")).hits;
        assert_eq!(hits("pthread_cond_signal"), 250);
        assert_eq!(hits("pthread_cond_signal@GLIBC_2.2.5"), 0);

        // list-probes shows both, with their versions and where the names came from.
        let pid = t.pid.to_string();
        let args = ["list-probes", "-p", pid.as_str()];
        let out = tp_command().args(args).envs(env.iter().copied()).output().unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        let source = if env.is_empty() { "debug-file" } else { "dynsym" };
        for name in ["pthread_cond_signal@@GLIBC_2.3.2", "pthread_cond_signal@GLIBC_2.2.5"] {
            let row = listing.lines().find(|l| l.split_whitespace().nth(3) == Some(name));
            let row = row.unwrap_or_else(|| panic!("no row for {name}"));
            assert_eq!(row.split_whitespace().nth(4), Some(source), "{row}");
        }
        assert!(t.quit().success());
    }
    let _ = std::fs::remove_dir(&no_debug_files);
}

// ---- Several copies of one name (Rust generics) ----

/// `generics::work` is one generic in two copies (for u32 and u64): the
/// name means both, each counted exactly, in both symbol manglings; so does
/// the one name of the two copies of a generic trait method (legacy
/// mangling leaves the types out, as in ripgrep's `<StandardSink<M,W> as
/// Sink>::matched`).
#[cfg(target_arch = "x86_64")]
#[test]
fn one_name_means_every_copy_of_a_generic() {
    for target in ["generics-legacy", "generics-v0"] {
        let mut t = Target::start(target);
        let (got, stderr, _) = count(&mut t, &functions(&["generics::work"]), &["call work 500"], &[]);
        assert_eq!(attached_line(&stderr).split_whitespace().nth(2), Some("2"), "{stderr}");
        assert_eq!(got.len(), 2, "{target}: {got:?}");
        assert!(got.iter().all(|p| p.hits == 500), "{target}: each copy runs 500 of the 1,000 calls: {got:?}");
        assert_ne!(got[0].address, got[1].address);
        assert!(stderr.contains("`generics::work` names 2 functions"), "tp says what it picked: {stderr}");
        if target == "generics-legacy" {
            let name = "<generics::Sink<W> as generics::Matched>::matched";
            let (got, _, _) = count(&mut t, &functions(&[name]), &["call sink 300"], &[]);
            assert_eq!(got.iter().map(|p| p.hits).collect::<Vec<_>>(), [300, 300], "{got:?}");
        }
        assert!(t.quit().success());
    }
}

// ---- Code mapped twice (node's V8 does it; a bundled target does it too) ----

/// `remapped` maps the page holding `hop` a second time inside a 128 MiB
/// reservation far from the rest of its code (near the top of the address
/// space, or 64 GiB from a static-pie that lives there), as V8 maps node's
/// builtins: the attach must place its code near each probed site, not
/// near the whole module, and a probe on `hop` goes on both copies.
#[test]
fn code_mapped_twice_is_probed_where_it_runs() {
    for target in ["remapped", "remapped-nopie"] {
        let mut t = Target::start(target);
        let where_ = t.ask("where", "copy");
        let (copy, own) = (field(&where_, "at"), field(&where_, "of"));
        assert!(copy.abs_diff(own) > 8 << 30, "the copy lies far from the module: {where_}");
        let (got, stderr, answers) =
            count(&mut t, &functions(&["hop", "stay"]), &["call hop 1000", "call stay 700"], &[]);
        assert_eq!(field(&answers[0], "own"), 1000);
        let hits = |addr: u64| got.iter().find(|p| p.address == addr).unwrap_or_else(|| panic!("{got:?}")).hits;
        assert_eq!((hits(own), hits(copy)), (1000, 1000), "{target}: {stderr}");
        assert_eq!(got.iter().find(|p| p.func == "stay").unwrap().hits, 700);
        assert!(stderr.contains("also runs from a copy"), "{stderr}");
        // Both copies hold their original bytes again.
        let (_, file) = entry_in_file(&t, "hop");
        assert_eq!(read_mem(t.pid, own, file.len()), file);
        assert_eq!(read_mem(t.pid, copy, file.len()), file);

        // --addr in the copy is `hop` there; list-probes shows both.
        let pid = t.pid.to_string();
        let addr = format!("{copy:#x}");
        let (got, _, _) = count(&mut t, &["--addr", &addr], &["call hop 40"], &[]);
        assert_eq!(got, [Probe { func: "hop".into(), module: target.into(), address: copy, hits: 40 }]);
        let args = ["list-probes", "-p", pid.as_str()];
        let listing = expect_success(&args, &tp(&args));
        let rows: Vec<&str> = listing.lines().filter(|l| l.split_whitespace().nth(3) == Some("hop")).collect();
        assert_eq!(rows.len(), 2, "{listing}");
        assert!(rows.iter().any(|r| r.contains(" symtab+copy ") && r.contains(&addr)), "{rows:?}");
        assert!(t.quit().success());
    }
}

/// Debian's node with its default flags: V8 maps its builtins a second time
/// near the top of the address space (short builtin calls, on with 4 GiB of
/// memory or more), so node's code spans terabytes; tp still attaches, and
/// counts libuv's `uv_accept` once per connection to an HTTP server on
/// loopback.
#[cfg(target_arch = "x86_64")]
#[test]
fn node_counts_accepted_connections_exactly() {
    need("nodejs");
    let _shared = shared();
    let script = "const s = require('http').createServer((q, r) => r.end('ok\\n'));\n\
                  s.listen(0, '127.0.0.1', () => console.log('port ' + s.address().port));";
    let mut child = KillOnDrop::child(
        Command::new("node").args(["-e", script]).stdin(Stdio::null()).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let mut out = Lines::new(child.get_mut().stdout.take().unwrap());
    let port: u16 = out.wait_for("port ").trim_start_matches("port ").parse().unwrap();
    let pid = child.id();

    // The case: a module whose executable mappings lie at two distances from their file offsets.
    let maps = tp::process::read_maps(pid).unwrap();
    let code: Vec<&tp::process::Mapping> = maps.iter().filter(|m| m.exec && m.inode != 0).collect();
    let remapped = code.iter().any(|a| {
        code.iter().any(|b| {
            (a.inode, &a.path) == (b.inode, &b.path) && a.start.wrapping_sub(a.offset) != b.start.wrapping_sub(b.offset)
        })
    });
    assert!(
        remapped,
        "node should map part of its code twice (V8's short builtin calls, with 4 GiB of memory or more)"
    );

    let pid_s = pid.to_string();
    let session = Session::start(&["-p", &pid_s, "--json", "-f", "uv_accept"]);
    let connections = 37;
    for _ in 0..connections {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.ends_with("ok\n"), "{answer}");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let got = probes(&stdout);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].hits, connections, "{stderr}");
}

// ---- Stripped binaries: functions from .eh_frame ----

/// `counter-stripped-id` has no symbols but its unwind table (its debug
/// file is not where tp looks): `foo` is `sub_<its file address>`, named or
/// at its address, and counts exactly.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_stripped_program_is_probed_by_its_unwind_table() {
    let unstripped = target_path("counter");
    let elf = tp::symbols::ElfFile::open(&unstripped, &unstripped).unwrap();
    let foo = elf.functions.iter().find(|f| f.name == "foo").unwrap();
    let name = format!("sub_{:x}", foo.addr.0);
    let mut t = Target::start("counter-stripped-id");
    let pid = t.pid.to_string();
    let args = ["list-probes", "-p", pid.as_str()];
    let listing = expect_success(&args, &tp(&args));
    let row =
        listing.lines().find(|l| l.split_whitespace().nth(3) == Some(&name)).unwrap_or_else(|| panic!("{listing}"));
    assert!(row.contains(" eh_frame ") && row.contains(" ok ("), "{row}");

    let (got, _, _) = count(&mut t, &functions(&[&name]), &["call foo 1234"], &[]);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].func.as_str(), got[0].hits), (name.as_str(), 1234));
    let addr = format!("{:#x}", got[0].address);
    let (got, _, _) = count(&mut t, &["--addr", &addr], &["call foo 99"], &[]);
    assert_eq!((got[0].func.as_str(), got[0].hits), (name.as_str(), 99));
    assert!(t.quit().success());
}

/// The write syscalls of a process so far (`syscw` of /proc/PID/io).
#[cfg(target_arch = "x86_64")]
fn writes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("syscw: ")).unwrap().trim().parse().unwrap()
}

/// busybox-static: no symbols at all, and only the C library linked into it
/// has unwind tables. Every function those list is probed at once in a
/// busybox shell that runs two loops of `echo`; the shell's output stays
/// right, and some function (libc's `write`) counts exactly the write
/// system calls the kernel counted, in both loops.
#[cfg(target_arch = "x86_64")]
#[test]
fn busybox_static_is_probed_whole_and_counts_exactly() {
    need("busybox");
    let _shared = shared();
    let mut child = KillOnDrop::child(
        Command::new("/bin/busybox").args(["sh", "-s"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let mut stdin = child.get_mut().stdin.take().unwrap();
    let mut out = Lines::new(child.get_mut().stdout.take().unwrap());
    let pid = child.id() as u32;
    let mut say = |line: &str| {
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    };
    say("echo ready");
    out.wait_for("ready");
    let args = ["list-probes", "-p", &pid.to_string(), "--summary"];
    let summary = expect_success(&args, &tp(&args));
    assert!(summary.starts_with("busybox: ") && summary.contains(" eh_frame"), "{summary}");

    let pid_s = pid.to_string();
    let session = Session::start(&["-p", &pid_s, "-f", "*", "--keep"]);
    let (status, _, stderr) = session.wait();
    assert!(status.success(), "{stderr}");
    let n: usize = attached_line(&stderr).split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(n >= 1500, "{stderr}");
    let counts = || probes(&expect_success(&["status"], &tp(&["status", "-p", &pid_s, "--json"])));
    let mut rounds = Vec::new();
    for loops in [700, 1300] {
        let (before, calls0) = (counts(), writes(pid));
        say(&format!("i=0; while [ $i -lt {loops} ]; do echo x$i; i=$((i+1)); done; echo loop-done"));
        let done = out.wait_for("loop-done");
        assert_eq!(done, "loop-done");
        let (after, calls1) = (counts(), writes(pid));
        let echoed: Vec<&String> = out.seen.iter().filter(|l| l.starts_with('x')).collect();
        assert_eq!(echoed.len(), loops + rounds.len() * 700, "the shell's output");
        let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a.hits - b.hits).collect();
        rounds.push((delta, calls1 - calls0));
    }
    let (calls1, calls2) = (rounds[0].1, rounds[1].1);
    assert!(calls1 > 700 && calls2 > 1300, "{calls1} {calls2}");
    let exact = (0..rounds[0].0.len()).filter(|&i| rounds[0].0[i] == calls1 && rounds[1].0[i] == calls2).count();
    assert!(exact >= 1, "no probe counted the {calls1} and {calls2} write calls");
    let detach = tp(&["detach", "-p", &pid_s]);
    let said = String::from_utf8_lossy(&detach.stderr).into_owned();
    assert!(detach.status.success(), "{said}");
    // Thousands of probes removed, reported in a few lines.
    assert!(said.lines().count() <= 3 && said.contains(&format!("restored {} probes", thousands(n))), "{said}");
    say("exit 0");
    assert!(wait_timeout(child.get_mut()).success());
}

/// `1234567` as `1,234,567`.
#[cfg(target_arch = "x86_64")]
fn thousands(n: usize) -> String {
    tp::output::thousands(n as u64)
}

/// Debian's ripgrep (stripped) run whole under `tp run` with every function
/// of its unwind table probed, twice: its output is what it prints alone,
/// and a function counts exactly the matching lines of each run.
#[cfg(target_arch = "x86_64")]
#[test]
fn ripgrep_stripped_is_probed_whole_and_counts_matches_exactly() {
    need("ripgrep");
    let dir = std::env::temp_dir().join(format!("tp-rg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut runs = Vec::new();
    for matches in [37u64, 91] {
        let file = dir.join(format!("hay{matches}.txt"));
        let text: String =
            (0..200).map(|i| if i < matches { format!("a needle {i}\n") } else { format!("hay {i}\n") }).collect();
        std::fs::write(&file, text).unwrap();
        let rg = ["rg", "--no-config", "-j1", "needle", file.to_str().unwrap()];
        let alone = Command::new(rg[0]).args(&rg[1..]).output().unwrap();
        let summary = dir.join(format!("summary{matches}.json"));
        let mut args = vec!["run", "-f", "rg:*", "--json", "-o", summary.to_str().unwrap(), "--"];
        args.extend(rg);
        let _shared = shared();
        let under = run(tp_command().args(&args));
        assert!(under.status.success(), "{}", String::from_utf8_lossy(&under.stderr));
        assert_eq!(under.stdout, String::from_utf8_lossy(&alone.stdout).trim_end().as_bytes(), "rg's output");
        let got = probes(&std::fs::read_to_string(&summary).unwrap());
        assert!(got.len() >= 5000 && got.iter().all(|p| p.func.starts_with("sub_")), "{} probes", got.len());
        runs.push((matches, got));
    }
    let ((m1, a), (m2, b)) = (&runs[0], &runs[1]);
    let exact = a.iter().filter(|p| p.hits == *m1 && b.iter().any(|q| q.func == p.func && q.hits == *m2)).count();
    assert!(exact >= 1, "no function counted the {m1} and {m2} matching lines");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Output that scales ----

/// A hundred probes kept, then `tp detach -p`: one line sums them up.
#[cfg(target_arch = "x86_64")]
#[test]
fn detach_sums_up_many_probes() {
    let t = Target::start("counter");
    let pid = t.pid.to_string();
    let out = tp(&["attach", "-p", &pid, "-f", "libc:str*", "--keep"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let n: usize = attached_line(&stderr).split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(n > 20, "{stderr}");
    let out = tp(&["detach", "-p", &pid]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(lines[0].starts_with(&format!("tp: {pid}: restored {n} probes, ")), "{said}");
    assert!(lines[1].starts_with(&format!("tp: detached from {pid}: {n} probes removed")), "{said}");
}
