//! Runtimes that read the return addresses on their threads' stacks:
//! HotSpot's stack walks (the JVM takes the return address below its last
//! Java frame), LuaJIT's errors (unwound through the system unwinder with
//! a personality of its own, past frames tp's unwinder probes do not see).
//! A return probe that replaced return addresses killed both; at the
//! functions' exits, nothing on a stack changes: `tp profile` and `--ret`
//! over every function of libjvm.so and of luajit leave them running, their
//! own checks passing.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util::*;

/// `tp ARGS` must succeed (a session with a duration). Planning and
/// installing some 100,000 probes (every function of libjvm.so and its
/// exits) takes the unoptimized build of the tests more than a minute.
fn session_succeeds(args: &[&str]) -> String {
    let out = run_within(tp_command().args(args), std::time::Duration::from_secs(400));
    expect_success(args, &out);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_jvm_lives_through_profiles_and_return_probes_of_all_of_libjvm() {
    let _shared = shared();
    let dir = compile_java("Churn");
    let (mut java, mut out, pid) = start_java(&dir, "Churn", &["-Xmx256m"]);
    let profile = session_succeeds(&["profile", "-p", &pid, "-f", "libjvm.so:*", "-d", "8"]);
    let ret = session_succeeds(&["attach", "-p", &pid, "-f", "libjvm.so:*", "--ret", "-q", "-d", "6"]);
    // The JVM ran on through both and checked every round.
    assert!(tp::process::is_alive(pid.parse().unwrap()), "{profile}\n{ret}");
    java.get_mut().stdin.take().unwrap().write_all(b"quit\n").unwrap();
    let end = out.wait_for("rounds ");
    assert!(end.ends_with(" ok"), "{end}");
    let status = wait_timeout(java.get_mut());
    assert!(status.success(), "java: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn luajit_lives_through_profiles_and_return_probes_while_its_errors_unwind() {
    need("luajit");
    let _shared = shared();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/workloads/pcall_errors.lua");
    let mut lua = KillOnDrop::child(
        Command::new("luajit").arg(&script).arg("40").stdin(Stdio::null()).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let mut out = Lines::new(lua.get_mut().stdout.take().unwrap());
    out.wait_for("ready");
    let pid = lua.id().to_string();
    session_succeeds(&["profile", "-p", &pid, "-f", "luajit:*", "-d", "4"]);
    session_succeeds(&["attach", "-p", &pid, "-f", "luajit:*", "--ret", "-q", "-d", "4"]);
    let end = out.wait_for("done ");
    assert!(end.ends_with(" bad=0"), "{end}");
    let status = wait_timeout(lua.get_mut());
    assert!(status.success(), "luajit: {status:?}");
    let _ = std::io::stdout().flush();
}
