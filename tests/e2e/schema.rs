//! The output schema (docs/output.md): every subcommand's JSON, for one
//! process and for several, checked line by line against the key lists the
//! document gives (read from it), with its rules: a `type` on every line,
//! the same keys in every object of a type, `pid` on every event,
//! `lost_events` in every process, an empty document for nothing, and
//! nothing but JSON on stdout.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::util::*;

/// The key lists of docs/output.md: `keys NAME: k1 k2 …` lines.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    // Built in: the AArch64 stage runs the tests in a VM without the tree.
    let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/output.md"));
    // In the fenced blocks only.
    let mut fenced = false;
    let lists: BTreeMap<String, BTreeSet<String>> = doc
        .lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
            }
            fenced
        })
        .filter_map(|l| l.strip_prefix("keys "))
        .map(|l| {
            let (name, keys) = l.split_once(':').unwrap_or_else(|| panic!("no `:` in {l}"));
            (name.to_string(), keys.split_whitespace().map(str::to_string).collect())
        })
        .collect();
    assert!(lists.len() >= 15, "docs/output.md lists {} key sets", lists.len());
    lists
}

/// Checks what tp's stdout holds.
struct Checker {
    keys: BTreeMap<String, BTreeSet<String>>,
    /// Objects checked, by the key list they matched.
    seen: BTreeMap<String, usize>,
}

impl Checker {
    fn new() -> Checker {
        Checker { keys: documented(), seen: BTreeMap::new() }
    }

    /// Asserts `v` has exactly the keys of list `name`.
    fn shape(&mut self, name: &str, v: &Value, what: &str) {
        let want = self.keys.get(name).unwrap_or_else(|| panic!("docs/output.md has no `keys {name}:`"));
        let have: BTreeSet<String> =
            v.as_object().unwrap_or_else(|| panic!("{what}: not an object: {v}")).keys().cloned().collect();
        assert_eq!(&have, want, "{what}: the keys of a `{name}` object: {v}");
        *self.seen.entry(name.to_string()).or_default() += 1;
    }

    fn each(&mut self, name: &str, list: &Value, what: &str) {
        for item in list.as_array().unwrap_or_else(|| panic!("{what}: `{name}`s are not an array: {list}")) {
            self.shape(name, item, what);
        }
    }

    /// Checks every line of `stdout`: JSON objects only, each of a known
    /// type with its keys, documents checked to the bottom. Returns the
    /// summary documents.
    fn stdout(&mut self, stdout: &str, what: &str) -> Vec<Value> {
        assert!(!stdout.trim().is_empty(), "{what}: nothing on stdout");
        let mut docs = Vec::new();
        for line in stdout.lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"));
            let ty = v["type"].as_str().unwrap_or_else(|| panic!("{what}: no type: {line}")).to_string();
            match ty.as_str() {
                "entry" | "exit" | "unwound" => {
                    // `--tree` adds each call's depth.
                    let tree = format!("tree {ty}");
                    self.shape(if v.get("depth").is_some() { &tree } else { &ty }, &v, what);
                    assert!(v["pid"].as_i64().is_some_and(|p| p > 0), "{what}: an event without its pid: {line}");
                    // A value that could not be read is the one object an argument may be.
                    for arg in v["args"].as_object().into_iter().flat_map(|a| a.values()) {
                        if arg.is_object() {
                            self.shape("unreadable", arg, what);
                        }
                    }
                }
                "summary" => {
                    self.summary(&v, what);
                    docs.push(v);
                }
                "function" => {
                    self.shape(&ty, &v, what);
                    if v["exits"].is_object() {
                        self.shape("exits", &v["exits"], what);
                    }
                }
                "line" | "usdt" | "block" => self.shape(&ty, &v, what),
                "module_summary" => {
                    self.shape(&ty, &v, what);
                    self.each("refusal", &v["refused"], what);
                }
                other => panic!("{what}: a type docs/output.md does not know: {other}: {line}"),
            }
        }
        docs
    }

    fn summary(&mut self, v: &Value, what: &str) {
        self.shape("summary", v, what);
        assert_eq!(v["schema"], 1, "{what}");
        let profile = v["command"] == "profile";
        let (process, probe) = if profile { ("profile process", "profile probe") } else { ("process", "probe") };
        for p in v["processes"].as_array().unwrap() {
            self.shape(process, p, what);
            assert!(p["lost_events"].as_u64().is_some(), "{what}: {p}");
            self.each(probe, &p["probes"], what);
            self.each("child", &p["children"], what);
            self.each("library", &p["libraries"], what);
            self.each("stacks", &p["stacks"], what);
            for s in p["stacks"].as_array().unwrap() {
                self.each("stack", &s["stacks"], what);
            }
            self.each("by", &p["by"], what);
            for b in p["by"].as_array().unwrap() {
                self.each("value", &b["values"], what);
            }
            if profile {
                continue;
            }
            self.each("aggregate", &p["aggregates"], what);
            for a in p["aggregates"].as_array().unwrap() {
                self.each("aggregate row", &a["rows"], what);
                for r in a["rows"].as_array().unwrap() {
                    self.each("bucket", &r["hist"], what);
                }
            }
            self.each("blocks", &p["blocks"], what);
            for b in p["blocks"].as_array().unwrap() {
                self.each("counted block", &b["blocks"], what);
                self.each("counted line", &b["lines"], what);
            }
            self.each("steps", &p["steps"], what);
            for s in p["steps"].as_array().unwrap() {
                self.each("step line", &s["lines"], what);
                self.each("step path", &s["paths"], what);
                self.each("unstepped", &s["unstepped"], what);
                self.each("executed", &s["executed"], what);
            }
        }
        self.each("total", &v["total"], what);
    }
}

fn ok(args: &[&str]) -> (String, String) {
    let out = tp(args);
    let stdout = expect_success(args, &out);
    (stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_subcommands_json_has_the_documented_shape() {
    let mut check = Checker::new();

    // attach, one process: events with arguments and returns, a predicate,
    // a count by value.
    let mut t = Target::start("events");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "add", "-f", "fib", "-f", "greet", "--args", "--ret", "--json"]);
    t.ask("call 5", "done call");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach --args --ret");
    assert_eq!((docs.len(), docs[0]["command"].as_str()), (1, Some("attach")));
    assert_eq!(docs[0]["processes"].as_array().unwrap().len(), 1);
    let session = Session::start(&["-p", &pid, "-f", "add", "--if", "a < 0", "--by", "a", "-q", "--json"]);
    t.ask("call 5", "done call");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    check.stdout(&stdout, "attach --if --by");
    let session = Session::start(&["-p", &pid, "-f", "fib", "--tree", "--json"]);
    t.ask("fib 5", "done fib");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    check.stdout(&stdout, "attach --tree");
    drop(t);

    // attach --args with fields, some of them unreadable.
    let mut t = Target::start("server");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "handle", "--args", "path, req->len, req->uri.len", "--json"]);
    t.ask("serve 3", "done serve");
    t.ask("bad", "done bad");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    check.stdout(&stdout, "attach --args FIELDS");
    assert!(stdout.contains("\"unreadable\":"), "{stdout}");
    // attach --agg: aggregates of a field by thread, with a histogram.
    let session = Session::start(&[
        "-p",
        &pid,
        "-f",
        "handle",
        "--agg",
        "hist(req->len), avg(req->len)",
        "--by",
        "tid",
        "--json",
    ]);
    t.ask("serve 3", "done serve");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach --agg");
    assert!(!docs[0]["processes"][0]["aggregates"][0]["rows"][0]["hist"].as_array().unwrap().is_empty(), "{stdout}");
    drop(t);

    // attach --blocks: a function's blocks and lines.
    let mut t = Target::start("blocks");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--blocks", "-f", "shape", "--json"]);
    t.ask("run 100 2", "done run");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach --blocks");
    assert!(!docs[0]["processes"][0]["blocks"][0]["blocks"].as_array().unwrap().is_empty(), "{stdout}");
    drop(t);

    // attach --steps: a stepped call, its lines and instructions, its
    // calls of leaf run free.
    let mut t = Target::start("steps");
    let pid = t.pid.to_string();
    let mut session = Session::start(&["-p", &pid, "--steps", "--step-depth", "0", "-f", "chain", "--json"]);
    t.ask("chain 2", "done chain");
    session.err.wait_for("tp: stepped a call");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach --steps");
    assert!(!docs[0]["processes"][0]["steps"][0]["lines"].as_array().unwrap().is_empty(), "{stdout}");
    assert!(!docs[0]["processes"][0]["steps"][0]["unstepped"].as_array().unwrap().is_empty(), "{stdout}");
    drop(t);

    // attach, three processes, stacks: the same shapes, pid on every event.
    let mut targets: Vec<Target> = (0..3).map(|_| Target::start("stacks")).collect();
    let pids = targets.iter().map(|t| t.pid.to_string()).collect::<Vec<_>>().join(",");
    let mut session = Session::start(&["-p", &pids, "-f", "leaf", "--stack", "--json", "--ring-size", "65536"]);
    session.err.wait_for("tp: attached");
    session.err.wait_for("tp: attached");
    for t in &mut targets {
        t.ask("paths 5", "done paths");
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach, three processes");
    assert_eq!(docs[0]["processes"].as_array().unwrap().len(), 3);
    let event_pids: BTreeSet<i64> = json_events(&stdout).iter().map(|e| e["pid"].as_i64().unwrap()).collect();
    assert_eq!(event_pids.len(), 3, "{stdout}");
    drop(targets);

    // run, to a file.
    let dir = std::env::temp_dir().join(format!("tp-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.json");
    let launched = target_path("launched");
    let (program, stderr) = ok(&[
        "run",
        "-f",
        "foo",
        "--ret",
        "-o",
        file.to_str().unwrap(),
        "--",
        launched.to_str().unwrap(),
        "calls",
        "20",
    ]);
    assert_eq!(program, "foo calls=20 checksum=ok", "{stderr}");
    let docs = check.stdout(&std::fs::read_to_string(&file).unwrap(), "run -o FILE.json");
    assert_eq!(docs[0]["command"], "run");
    // run, a library loaded later (a target built for the host only).
    #[cfg(target_arch = "x86_64")]
    {
        let dlcycle = target_path("dlcycle");
        ok(&["run", "-f", "libloaded.so:loaded_work", "-o", file.to_str().unwrap(), "--", dlcycle.to_str().unwrap()]);
        let docs = check.stdout(&std::fs::read_to_string(&file).unwrap(), "run, a library loaded later");
        assert_eq!(docs[0]["processes"][0]["libraries"][0]["at"], "rendezvous");
    }

    // A child forked while the probes were in, in the process's `children`.
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "foo", "--args", "-q", "--json"]);
    let child = field(&t.ask("fork", "forked"), "pid") as i32;
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(child, libc::SIGTERM) };
    assert_eq!(field(&t.ask("reap", "reaped"), "status"), 0);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let docs = check.stdout(&stdout, "attach, a child forked");
    assert_eq!(docs[0]["processes"][0]["children"][0]["pid"], child, "{stdout}");

    // status of kept probes, and profile.
    ok(&["attach", "-p", &pid, "-f", "foo", "-f", "bar", "--keep"]);
    t.call("foo", 10, 1);
    let (stdout, _) = ok(&["status", "-p", &pid, "--json"]);
    let docs = check.stdout(&stdout, "status --json");
    assert!(docs[0]["seconds"].is_null());
    ok(&["detach", "-p", &pid]);
    let (stdout, _) = ok(&["profile", "-p", &pid, "-f", "foo", "-f", "bar", "-d", "0.3", "--json"]);
    let docs = check.stdout(&stdout, "profile --json");
    assert_eq!(docs[0]["command"], "profile");
    drop(t);

    // list-probes: functions, lines, static probes, summaries.
    let counter = target_path("counter");
    check.stdout(&ok(&["list-probes", counter.to_str().unwrap(), "--json"]).0, "list-probes --json");
    let prologues = target_path("prologues");
    check.stdout(&ok(&["list-probes", prologues.to_str().unwrap(), "--json", "--summary"]).0, "list-probes --summary");
    let lines = target_path("lines");
    check.stdout(&ok(&["list-probes", lines.to_str().unwrap(), "--json", "--lines", "work"]).0, "list-probes --lines");
    let blocks = target_path("blocks");
    check.stdout(
        &ok(&["list-probes", blocks.to_str().unwrap(), "--json", "--blocks", "shape"]).0,
        "list-probes --blocks",
    );
    let sdt = target_path("sdt");
    check.stdout(&ok(&["list-probes", sdt.to_str().unwrap(), "--json", "--usdt"]).0, "list-probes --usdt");
    let _ = std::fs::remove_dir_all(&dir);

    // Every documented list was met, but the event of an exception (and
    // where no target loads a library later, a library).
    #[cfg(target_arch = "x86_64")]
    const UNSEEN: &[&str] = &["unwound", "tree unwound"];
    #[cfg(not(target_arch = "x86_64"))]
    const UNSEEN: &[&str] = &["unwound", "tree unwound", "library"];
    let unmet: Vec<&String> =
        check.keys.keys().filter(|k| !check.seen.contains_key(*k) && !UNSEEN.contains(&k.as_str())).collect();
    assert!(unmet.is_empty(), "no output had these: {unmet:?}");
}

/// Nothing to report is an empty document, not nothing.
#[test]
fn status_without_probes_is_an_empty_document() {
    let _alone = system_wide();
    let out = tp(&["status", "--json"]);
    let stdout = expect_success(&["status", "--json"], &out);
    let docs = Checker::new().stdout(&stdout, "status --json, no probes");
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["processes"].as_array().map(Vec::len), Some(0), "{stdout}");
    assert_eq!(docs[0]["total"].as_array().map(Vec::len), Some(0), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process holds tp probes"), "{out:?}");
}
