//! Struct fields by DWARF (`--args 'req->method, req->uri.len'`, `--if
//! 'req->len > 100'`), copied in the target at each call: checked against
//! the server target's own log line for every call, in text and in JSON;
//! null and unmapped pointers shown as `<unreadable>` with the target
//! finishing cleanly; what cannot be followed refused in one line.

use serde_json::Value;

use crate::util::*;

/// The fields and parameters the tests name, in this order.
const PICKS: &str = "path, req->method, req->uri.text, req->uri.len, req->len, req->kind, req->keep_alive, req->ids[2]";

/// One logged call of `handle`: its fields by the names `--args` gives
/// them, as text.
fn logged(lines: &[String]) -> Vec<Vec<(String, String)>> {
    let names = [
        ("path", "path"),
        ("method", "req->method"),
        ("uri.text", "req->uri.text"),
        ("uri.len", "req->uri.len"),
        ("len", "req->len"),
        ("kind", "req->kind"),
        ("keep", "req->keep_alive"),
        ("ids2", "req->ids[2]"),
    ];
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("log handle "))
        .map(|rest| {
            rest.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| {
                    let name = names.iter().find(|(n, _)| *n == k).map_or(k, |(_, p)| *p);
                    (name.to_string(), v.to_string())
                })
                .collect()
        })
        .collect()
}

/// A JSON value as the log writes it: strings bare, the rest as JSON.
fn as_logged(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// Runs `cmds` against the server while tp records with `args` (JSON on
/// stdout); returns the target's lines and tp's events and summary.
fn record(args: &[&str], cmds: &[(&str, &str)], json: bool) -> (Vec<String>, String, i32) {
    let mut t = Target::start("server");
    let pid = t.pid.to_string();
    let mut full = vec!["-p", pid.as_str()];
    if json {
        full.push("--json");
    }
    full.extend_from_slice(args);
    let session = Session::start(&full);
    let mut answers = Vec::new();
    for (cmd, done) in cmds {
        let before = t.out.seen.len();
        t.ask(cmd, done);
        answers.extend(t.out.seen[before..].iter().cloned());
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    let pid = t.pid;
    assert!(!has_region(pid), "tp's memory left in the target");
    assert!(t.quit().success(), "the target must exit 0");
    (answers, stdout, pid)
}

/// Every call's fields in JSON are the ones its own log line shows, and
/// the text lines show them in the order `--args` named them.
#[test]
fn fields_named_by_args_equal_the_targets_own_log() {
    let (lines, stdout, _) = record(&["-f", "handle", "--args", PICKS], &[("serve 40", "done serve")], true);
    let want = logged(&lines);
    assert_eq!(want.len(), 40, "{lines:?}");
    let events = json_events(&stdout);
    let entries: Vec<&Value> = events.iter().filter(|e| e["type"] == "entry").collect();
    assert_eq!(entries.len(), 40, "{stdout}");
    for (e, log) in entries.iter().zip(&want) {
        let args = e["args"].as_object().expect("args");
        // (serde_json keeps an object's keys sorted.)
        let mut shown: Vec<(String, String)> = args.iter().map(|(k, v)| (k.clone(), as_logged(v))).collect();
        let mut log = log.clone();
        shown.sort();
        log.sort();
        assert_eq!(shown, log, "{e}");
        // Integers as numbers, the enum by name, the bool as a boolean.
        assert!(args["req->uri.len"].is_u64() && args["req->len"].is_i64() && args["req->ids[2]"].is_i64(), "{e}");
        assert!(args["req->keep_alive"].is_boolean() && args["req->kind"].is_string(), "{e}");
    }
    // The text lines: `handle(path="/index.html", req->method="GET", …)`.
    let (lines, stdout, _) =
        record(&["-f", "handle", "--args", "path, req->method, req->uri.len"], &[("serve 8", "done serve")], false);
    let want: Vec<String> = logged(&lines)
        .iter()
        .map(|log| {
            let get = |k: &str| log.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            format!(
                "handle(path=\"{}\", req->method=\"{}\", req->uri.len={})",
                get("path"),
                get("req->method"),
                get("req->uri.len")
            )
        })
        .collect();
    let got: Vec<&str> = stdout.lines().filter_map(|l| l.find("handle(").map(|i| &l[i..])).collect();
    assert_eq!(got, want, "{stdout}");
}

/// `--if` on fields selects exactly the calls whose log line shows such
/// fields: an integer field, a nested one, a string behind a pointer, an
/// enum by name, an array element.
#[test]
fn predicates_on_fields_select_the_calls_the_log_shows() {
    type Selects = fn(&[(String, String)]) -> bool;
    let get = |log: &[(String, String)], k: &str| log.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let cases: [(&str, Selects); 5] = [
        ("req->len > 100", |l| l.iter().any(|(k, v)| k == "req->len" && v.parse::<i64>().unwrap() > 100)),
        ("str(req->method) == \"POST\" && req->uri.len < 16", |l| {
            l.iter().any(|(k, v)| k == "req->method" && v == "POST")
                && l.iter().any(|(k, v)| k == "req->uri.len" && v.parse::<u64>().unwrap() < 16)
        }),
        ("req->kind == KIND_UPLOAD || !req->keep_alive", |l| {
            l.iter().any(|(k, v)| (k == "req->kind" && v == "KIND_UPLOAD") || (k == "req->keep_alive" && v == "false"))
        }),
        ("req->ids[2] < 0", |l| l.iter().any(|(k, v)| k == "req->ids[2]" && v.parse::<i64>().unwrap() < 0)),
        ("str(req->uri.text, 5) == \"/api/\"", |l| {
            l.iter().any(|(k, v)| k == "req->uri.text" && v.starts_with("/api/"))
        }),
    ];
    for (expr, selects) in cases {
        let (lines, stdout, _) =
            record(&["-f", "handle", "--args", PICKS, "--if", expr], &[("serve 60", "done serve")], true);
        let log = logged(&lines);
        assert_eq!(log.len(), 60, "{lines:?}");
        let want: Vec<String> = log.iter().filter(|l| selects(l)).filter_map(|l| get(l, "req->uri.text")).collect();
        assert!(!want.is_empty() && want.len() < 60, "{expr}: a case that selects some calls, not all");
        let events = json_events(&stdout);
        let got: Vec<String> =
            events.iter().filter(|e| e["type"] == "entry").map(|e| as_logged(&e["args"]["req->uri.text"])).collect();
        assert_eq!(got, want, "{expr}");
        let summary = one_process(&stdout);
        let p = &summary["probes"][0];
        assert_eq!((p["hits"].as_u64(), p["hits_unfiltered"].as_u64()), (Some(want.len() as u64), Some(60)), "{p}");
    }
}

/// A null request, one at an unmapped page and a method pointing at one
/// are `<unreadable>` (in JSON with the address the read failed at),
/// never a crash: the target goes on and exits 0; a predicate on such a
/// field does not select the call.
#[test]
fn unreadable_fields_are_shown_as_such_and_the_target_lives() {
    let (lines, stdout, _) =
        record(&["-f", "handle", "--args", "path, req->len, req->method"], &[("bad", "done bad")], true);
    let gone = lines.iter().find_map(|l| l.strip_prefix("log bad path=/gone req=")).expect("the unmapped page");
    let gone = u64::from_str_radix(gone.trim_start_matches("0x"), 16).unwrap();
    let events = json_events(&stdout);
    let entries: Vec<&Value> = events.iter().filter(|e| e["type"] == "entry").collect();
    assert_eq!(entries.len(), 3, "{stdout}");
    let unreadable = |v: &Value| v["unreadable"].as_str().map(|a| u64::from_str_radix(&a[2..], 16).unwrap());
    // Null: the length's read fails at its offset (8 + 16), the method's at 0.
    assert_eq!(entries[0]["args"]["path"], "/null");
    assert_eq!(unreadable(&entries[0]["args"]["req->len"]), Some(24), "{}", entries[0]);
    assert_eq!(unreadable(&entries[0]["args"]["req->method"]), Some(0), "{}", entries[0]);
    assert_eq!(unreadable(&entries[1]["args"]["req->len"]), Some(gone + 24), "{}", entries[1]);
    assert_eq!(unreadable(&entries[1]["args"]["req->method"]), Some(gone), "{}", entries[1]);
    // The request is readable; the string its method points at is not.
    assert_eq!(entries[2]["args"]["req->len"], 1, "{}", entries[2]);
    assert_eq!(unreadable(&entries[2]["args"]["req->method"]), Some(gone), "{}", entries[2]);
    // In text.
    let (_, stdout, _) = record(&["-f", "handle", "--args", "path, req->len"], &[("bad", "done bad")], false);
    assert!(stdout.contains("handle(path=\"/null\", req->len=<unreadable>)"), "{stdout}");
    assert!(stdout.contains("handle(path=\"/method\", req->len=1)"), "{stdout}");
    // A predicate on an unreadable field selects nothing, even negated.
    let (_, stdout, _) =
        record(&["-f", "handle", "--args", "path", "--if", "!(req->len > 0)"], &[("bad", "done bad")], true);
    let paths: Vec<String> =
        json_events(&stdout).iter().filter(|e| e["type"] == "entry").map(|e| as_logged(&e["args"]["path"])).collect();
    assert!(paths.is_empty(), "{paths:?}");
}

/// What cannot be followed is one line naming the problem, before
/// anything is touched.
#[test]
fn fields_that_cannot_be_followed_are_refused_in_one_line() {
    let t = Target::start("server");
    let pid = t.pid.to_string();
    for (flag, expr, why) in [
        ("--args", "req->nope", "has no member `nope` (it has: method, uri, len, kind, keep_alive, ids)"),
        ("--args", "req->uri->len", "`req->uri` is not a pointer"),
        ("--args", "req.len", "`req` is a pointer: use `->`"),
        ("--args", "path->len", "is not a struct"),
        ("--args", "req->ids[4]", "has 4 elements: [4] is past its end"),
        ("--args", "req->uri", "name one of its members (it has: text, len)"),
        ("--args", "who->len", "has no parameter `who`"),
        ("--args", "arg1->len", "has no type to follow"),
        ("--args", "req->len +", "unexpected `+`"),
        ("--if", "req->nope == 1", "has no member `nope`"),
        ("--if", "req->len == \"x\"", "is not a C string"),
    ] {
        let line = expect_error(&["attach", "-p", &pid, "-f", "handle", flag, expr], why);
        assert!(line.contains(flag), "{line}");
    }
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}
