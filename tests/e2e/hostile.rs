//! A target that attacks its tracer (`targets/hostile.c`), run as `nobody`
//! while tp runs as root: it maps memfds named like tp's region with
//! contents of its choosing, rewrites a real region under a running
//! session, puts escape sequences in probe names, and swaps descriptors
//! while tp attaches. tp must never write a file the target could not,
//! never crash, panic or follow the target's claims with its memory, and
//! answer every bad region in one line naming the process and the problem.
//! (docs/security.md lists each guarantee with its test.)

use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Output};

use tp::probe::layout::{Entry, EventCtx, Header};

use crate::region_image::{self, Image};
use crate::util::*;

/// The uid and gid the targets run as.
const NOBODY: u32 = 65534;

/// Starts `hostile` as `nobody`.
fn hostile() -> Target {
    Target::start_with("hostile", |cmd| {
        cmd.uid(NOBODY).gid(NOBODY);
    })
}

/// Has `t` map `img` at [`region_image::ADDR`].
fn map(t: &mut Target, img: &Image) {
    let mut input = format!("{}\n", region_image::map_command(img)).into_bytes();
    input.extend_from_slice(&img.bytes);
    t.send(&input);
    let answer = t.out.wait_for("");
    assert_eq!(answer, "mapped", "the target could not map the image");
}

/// Runs tp with its address space limited to 4 GiB: memory that followed a
/// target's claims (hundreds of GiB for a crafted capacity) kills it, and
/// the tests see the signal.
fn tp_bounded(args: &[&str]) -> Output {
    let mut cmd = tp_command();
    cmd.args(args);
    // SAFETY: setrlimit(2) between fork and exec, no allocation.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 4 << 30, rlim_max: 4 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run(&mut cmd)
}

/// Asserts tp answered (exit 0 or 1, no signal, no panic), every stderr line
/// is a `tp:` line, and nothing a terminal would act on reached either
/// stream; returns stderr.
fn assert_answered(args: &[&str], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "tp {args:?}: {:?} (signal {:?}): {stderr}",
        out.status,
        out.status.signal()
    );
    assert!(!stderr.contains("panicked"), "tp {args:?}: {stderr}");
    assert!(stderr.lines().all(|l| l.starts_with("tp")), "tp {args:?}: {stderr}");
    for (what, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let s = String::from_utf8_lossy(text);
        let raw = s.chars().find(|&c| tp::escape::is_unsafe(c) && c != '\n');
        assert!(raw.is_none(), "tp {args:?} printed {raw:?} raw on {what}: {s:?}");
    }
    stderr
}

/// Maps `img` in a hostile target and runs every command that reads a
/// region against it: each answers (see [`assert_answered`]), and the
/// target's own code is untouched. `what` names the case in failures.
pub fn every_command_answers(img: &Image, what: &str) {
    let mut t = hostile();
    let pid = t.pid.to_string();
    map(&mut t, img);
    for args in every_reader(&pid) {
        let out = tp_bounded(&args);
        let stderr = assert_answered(&args, &out);
        assert!(out.status.success() || stderr.lines().count() == 1, "{what}: tp {args:?}: {stderr}");
    }
    assert_eq!(t.call("work", 100, 1), 100, "{what}");
    assert_code_is_original(&t, &["work"]);
}

/// The commands that read a region, run on `pid`.
fn every_reader(pid: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["status", "-p", pid],
        vec!["status", "-p", pid, "--json"],
        vec!["enable", "-p", pid, "--all"],
        vec!["attach", "-p", pid, "-f", "work", "--duration", "0.01"],
        vec!["detach", "-p", pid],
    ]
}

#[test]
fn crafted_regions_are_refused_in_one_line() {
    let window = offset_of!(Entry, window_len);
    let mut long_window = region_image::valid(&[("work", "hostile")]);
    region_image::put(&mut long_window, region_image::entry_field(0, window), &1000u32.to_le_bytes());
    let mut huge = region_image::valid(&[("work", "hostile")]);
    region_image::put(&mut huge, offset_of!(Header, capacity), &(1u32 << 31).to_le_bytes());
    region_image::put(&mut huge, offset_of!(Header, count), &(1u32 << 31).to_le_bytes());
    let mut many = region_image::valid(&[("work", "hostile")]);
    region_image::put(&mut many, offset_of!(Header, capacity), &(1u32 << 20).to_le_bytes());
    let mut short = region_image::valid(&[("work", "hostile")]);
    short.size = 8192;
    let mut ring = region_image::valid(&[("work", "hostile")]);
    let ring_mask = offset_of!(Header, ctx) + offset_of!(EventCtx, ring_mask);
    region_image::put(&mut ring, ring_mask, &u32::MAX.to_le_bytes());
    let mut bad_magic = region_image::valid(&[]);
    bad_magic.bytes[0] ^= 0xff;
    let cases = [
        ("a window of 1000 bytes", long_window, "entry 0: window length 1000"),
        ("capacity and count 2^31", huge, "capacity 2147483648"),
        ("capacity 2^20", many, "capacity 1048576"),
        ("a region shorter than its header says", short, "its mapping has 8192"),
        ("rings of 2^32 events", ring, "ring mask 0xffffffff"),
        ("not tp's", bad_magic, "not a tp data region"),
    ];
    for (what, img, needle) in cases {
        let mut t = hostile();
        let pid = t.pid.to_string();
        map(&mut t, &img);
        for args in every_reader(&pid) {
            let out = tp_bounded(&args);
            let stderr = assert_answered(&args, &out);
            assert_eq!(out.status.code(), Some(1), "{what}: tp {args:?} should refuse: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{what}: tp {args:?}: {stderr}");
            assert!(stderr.contains(&format!("process {pid}")) && stderr.contains(needle), "{what}: {stderr}");
        }
        assert_eq!(t.call("work", 1000, 1), 1000, "{what}: the target still works");
        assert_code_is_original(&t, &["work"]);
    }
}

#[test]
fn a_region_that_runs_past_its_memfd_never_faults_tp() {
    // The memfd is shrunk below the mapping after the target maps it: a
    // tracer that mapped it would die of SIGBUS reading past its end. tp
    // does not map an unsealed memfd: it reads through the target's memory,
    // where the missing bytes are an error, not a signal.
    let mut img = region_image::valid(&[("work", "hostile")]);
    img.sealed = false;
    img.shrunk = true;
    let mut t = hostile();
    let pid = t.pid.to_string();
    map(&mut t, &img);
    for args in every_reader(&pid) {
        assert_answered(&args, &tp_bounded(&args));
    }
    assert_eq!(t.call("work", 1000, 1), 1000);
    assert_code_is_original(&t, &["work"]);
}

#[test]
fn names_with_escape_sequences_are_printed_escaped() {
    let evil = "\x1b]0;owned\x07\x1b[2J\u{9b}31m\u{202e}work\nfake line";
    let img = region_image::valid(&[(evil, "\x1b[31mhostile")]);
    let mut t = hostile();
    let pid = t.pid.to_string();
    map(&mut t, &img);
    let args = ["status", "-p", pid.as_str(), "--all"];
    let out = tp_bounded(&args);
    let stderr = assert_answered(&args, &out);
    assert!(out.status.success(), "a valid region: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\\x1b]0;owned\\x07\\x1b[2J\\u{9b}31m\\u{202e}work\\x0afake line"), "{stdout}");
    assert!(stdout.contains("\\x1b[31mhostile"), "{stdout}");
    assert_eq!(stdout.lines().count(), 2, "one header line and one probe line: {stdout}");
    let args = ["status", "-p", pid.as_str(), "--json"];
    let out = tp_bounded(&args);
    assert_answered(&args, &out);
    let v = one_process(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["probes"][0]["func"], evil, "JSON escapes losslessly");

    // A real region, whose names the target rewrites. The first target goes
    // first: a thread holding one target's shared lock while it waits for
    // another's would deadlock with a test waiting for the exclusive one.
    drop(t);
    let mut t = hostile();
    let pid = t.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &pid, "-f", "work", "--keep"]));
    let name = offset_of!(Entry, name);
    let hex: String = b"\x1b[2J\x1b]2;root\x07work\0".iter().map(|b| format!("{b:02x}")).collect();
    t.ask(&format!("poke {:x} {hex}", region_image::entry_field(0, name)), "poked");
    assert_eq!(t.call("work", 500, 1), 500);
    for args in [vec!["status", "-p", pid.as_str()], vec!["disable", "-p", pid.as_str(), "--all"]] {
        let out = tp_bounded(&args);
        let stderr = assert_answered(&args, &out);
        assert!(out.status.success(), "{stderr}");
        let text = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
        assert!(text.contains("\\x1b[2J\\x1b]2;root\\x07work"), "{text}");
    }
    let args = ["detach", "-p", pid.as_str()];
    let out = tp_bounded(&args);
    let stderr = assert_answered(&args, &out);
    assert!(out.status.success() && stderr.contains("restored `\\x1b[2J\\x1b]2;root\\x07work` (500 hits)"), "{stderr}");
    assert_code_is_original(&t, &["work"]);
}

#[test]
fn a_region_changed_under_a_running_session_breaks_nothing() {
    let mut t = hostile();
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    // Every field tp reads its geometry from, set to what would send it
    // out of the region, make it allocate without bound or overflow.
    let ctx = offset_of!(Header, ctx);
    let pokes: Vec<(usize, Vec<u8>)> = vec![
        (offset_of!(Header, capacity), u32::MAX.to_le_bytes().to_vec()),
        (offset_of!(Header, count), u32::MAX.to_le_bytes().to_vec()),
        (offset_of!(Header, slot_bits), 63u32.to_le_bytes().to_vec()),
        (offset_of!(Header, stride_shift), 63u32.to_le_bytes().to_vec()),
        (offset_of!(Header, counters_off), (u64::MAX - 7).to_le_bytes().to_vec()),
        (offset_of!(Header, probes_off), (1u64 << 40).to_le_bytes().to_vec()),
        (offset_of!(Header, flags_off), u64::MAX.to_le_bytes().to_vec()),
        (offset_of!(Header, events_off), u64::MAX.to_le_bytes().to_vec()),
        (offset_of!(Header, generation), u64::MAX.to_le_bytes().to_vec()),
        (offset_of!(Header, arena_count), 1000u32.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, slot_size), u64::MAX.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, slot_bits), 63u32.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, ring_mask), u32::MAX.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, shadow_len), u32::MAX.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, lost_no_slot), u64::MAX.to_le_bytes().to_vec()),
        (ctx + offset_of!(EventCtx, claimed), [0xff; 16].to_vec()),
    ];
    for (off, bytes) in pokes {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        t.ask(&format!("poke {off:x} {hex}"), "poked");
    }
    let calls = t.call("work", 2000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], calls, "the counts come from the geometry tp validated");
    assert_code_is_original(&t, &["work"]);
    assert!(!has_region(t.pid), "tp's memory is unmapped: {stderr}");
    assert_eq!(t.call("work", 10, 1), 10);
}

#[test]
fn a_private_area_that_is_not_tps_is_never_unmapped() {
    // A region image that says its private area is memory of the target's
    // own (no `tp-priv` mark): the detach unmaps the region, not that.
    let mut t = hostile();
    let size = tp::probe::layout::private_geometry().size;
    let anon = format!("{:x} {size}", region_image::PRIVATE);
    assert_eq!(t.ask(&format!("anon {anon}"), "anon"), "anon mapped");
    map(&mut t, &region_image::valid(&[]));
    let pid = t.pid.to_string();
    let out = tp_bounded(&["detach", "-p", &pid]);
    assert_answered(&["detach", "-p", &pid], &out);
    assert!(!has_region(t.pid), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(t.ask(&format!("anon check {anon}"), "anon"), "anon intact");
    assert_eq!(t.call("work", 10, 1), 10);
}

#[test]
fn plain_detach_reports_a_bad_region_and_cleans_the_others() {
    let _alone = system_wide();
    let mut bad = Target::spawn({
        let mut cmd = Command::new(target_path("hostile"));
        cmd.uid(NOBODY).gid(NOBODY);
        cmd
    });
    let mut img = region_image::valid(&[("work", "hostile")]);
    region_image::put(&mut img, region_image::entry_field(0, offset_of!(Entry, window_len)), &1000u32.to_le_bytes());
    map(&mut bad, &img);
    let good = Target::start_unlocked("counter");
    let good_pid = good.pid.to_string();
    expect_success(&["attach"], &tp(&["attach", "-p", &good_pid, "-f", "foo", "--keep"]));
    let out = tp_bounded(&["detach"]);
    let stderr = assert_answered(&["detach"], &out);
    assert_eq!(out.status.code(), Some(1), "a region it could not clean is a failure: {stderr}");
    let bad_line = format!("tp: process {}: tp's data region is corrupt: entry 0: window length 1000", bad.pid);
    assert!(stderr.lines().any(|l| l.starts_with(&bad_line)), "{stderr}");
    assert!(stderr.contains(&format!("detached from {good_pid}")), "the other process is cleaned: {stderr}");
    assert_code_is_original(&good, &["foo"]);
    assert_eq!(bad.call("work", 10, 1), 10);
}

/// Bytes of a file root owns and `nobody` may only read.
struct Victim {
    path: std::path::PathBuf,
    content: Vec<u8>,
}

impl Victim {
    fn new() -> Victim {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("victim-{}", std::process::id()));
        let content: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Victim { path, content }
    }

    fn untouched(&self) -> bool {
        std::fs::read(&self.path).unwrap() == self.content
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn a_descriptor_swap_never_gets_tp_to_write_another_file() {
    let victim = Victim::new();
    let file = std::fs::File::open(&victim.path).unwrap();
    let fd = file.as_raw_fd();
    // The target holds the root-owned file read-only, as descriptor 100,
    // and a thread of it keeps putting that file on descriptors 3 to 6,
    // then a writable memfd of its own, then freeing them: the memfd tp
    // has it create lands on one of them and is soon one of those two.
    let mut t = Target::start_with("hostile", |cmd| {
        cmd.uid(NOBODY).gid(NOBODY);
        // SAFETY: dup2(2) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 100) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    drop(file);
    let pid = t.pid.to_string();
    t.ask("swap 100 3 6", "swapping");
    let attaches = std::env::var("TP_SWAP_ATTACHES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let (mut attached, mut refused) = (0, 0);
    let mut reasons = std::collections::BTreeSet::new();
    for i in 0..attaches {
        let args = ["attach", "-p", pid.as_str(), "-f", "work", "--duration", "0"];
        let out = tp_bounded(&args);
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(victim.untouched(), "attach {i} ({:?}) wrote into the root-owned file: {text}", out.status);
        let stderr = assert_answered(&args, &out);
        if out.status.success() {
            attached += 1;
        } else {
            refused += 1;
            assert_eq!(stderr.lines().count(), 1, "attach {i}: {stderr}");
            reasons.insert(stderr.chars().filter(|c| !c.is_ascii_digit()).collect::<String>());
        }
    }
    eprintln!("descriptor swap: {attached} attaches went through, {refused} refused, the file untouched");
    for r in &reasons {
        eprintln!("  refused: {r}");
    }
    let calm = t.ask("calm", "calm");
    assert!(field(&calm, "rounds") > 0, "the swapping thread never ran: {calm}");
    // What refused attaches left (code arenas) goes with a detach; then
    // tp attaches and counts exactly.
    assert_answered(&["detach"], &tp(&["detach", "-p", &pid]));
    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    let calls = t.call("work", 3000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], calls);
    assert_code_is_original(&t, &["work"]);
    assert!(victim.untouched());
}

/// What `hostile`'s `hold` command takes: the word, masked.
fn hold(word: u64) -> String {
    format!("hold {:x}", word ^ 0x5a5a_5a5a_5a5a_5a5a)
}

/// The code arena of tp's in process `pid`: its one anonymous executable
/// mapping, as (start, end).
fn arena_of(pid: i32) -> (u64, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let arenas: Vec<(u64, u64)> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')) && l.split_whitespace().count() == 5)
        .filter_map(|l| {
            let (lo, hi) = l.split_whitespace().next()?.split_once('-')?;
            Some((u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?))
        })
        .collect();
    assert_eq!(arenas.len(), 1, "one code arena in {maps}");
    arenas[0]
}

/// A word on a thread's stack that points into tp's code keeps tp's memory
/// mapped at the detach (it may be a return address or a signal frame's
/// PC), and tp says which thread, which word and where; one that points
/// into the part of the arena tp never wrote code to does not. Once the
/// word is gone, `tp detach` unmaps the memory.
#[test]
fn a_stack_word_into_tps_code_keeps_its_memory_and_is_named() {
    let mut t = hostile();
    let pid = t.pid.to_string();

    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    assert_eq!(t.call("work", 1000, 1), 1000);
    let (_, end) = arena_of(t.pid);
    assert_eq!(t.ask(&hold(end - 16), "holding"), "holding");
    let (status, _, stderr) = session.interrupt();
    assert!(status.success() && stderr.contains("code restored"), "{stderr}");
    assert!(!has_region(t.pid), "no code was ever written at the end of the arena: {stderr}");
    assert_eq!(t.ask("unhold", "unheld"), "unheld");

    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    assert_eq!(t.call("work", 1000, 1), 1000);
    let (start, _) = arena_of(t.pid);
    assert_eq!(t.ask(&hold(start), "holding"), "holding");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success() && stderr.contains("code restored"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], 1000);
    assert_code_is_original(&t, &["work"]);
    assert!(has_region(t.pid), "the word into tp's code keeps its memory: {stderr}");
    let said = format!("still maps tp's memory: thread {}'s stack holds an address in tp's code ({start:#x}, at 0x", {
        let task = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let tids: Vec<i32> = task.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
        assert_eq!(tids.len(), 2, "the main thread and the holder");
        // Not the main thread (TIDs may wrap around: not the larger one).
        tids.into_iter().find(|&tid| tid != t.pid).unwrap()
    });
    assert!(stderr.contains(&said), "{said} in {stderr}");

    // The next session finds the memory still in use, and adds to it.
    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    assert_eq!(t.call("work", 300, 1), 300);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success() && !stderr.contains("unmapped the memory an ended session left"), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["work"], 300);
    assert!(has_region(t.pid), "{stderr}");
    // Once no thread is in it, the next session unmaps it first.
    assert_eq!(t.ask("unhold", "unheld"), "unheld");
    let session = Session::start(&["-p", &pid, "-f", "work", "--json"]);
    assert_eq!(t.call("work", 200, 1), 200);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("tp: process {pid}: unmapped the memory an ended session left there")),
        "{stderr}"
    );
    assert_eq!(hits_from_json(&stdout)["work"], 200);
    assert!(!has_region(t.pid), "{stderr}");

    // `tp detach` finds nothing left.
    let out = tp(&["detach", "-p", &pid]);
    expect_success(&["detach"], &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no tp probes"), "{stderr}");
    assert!(!has_region(t.pid), "{stderr}");
    assert_eq!(t.call("work", 10, 1), 10);
    assert!(t.quit().success());
}
