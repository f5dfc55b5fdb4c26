//! AArch64 only: every relocated instruction class counted exactly in a
//! real process, landing pads kept under an enforced BTI guard, the counter
//! the CPU's atomics allow, and refusals.

use crate::util::*;

/// The functions of targets/prologues_aarch64.S that the target calls,
/// each starting with a different instruction class.
const PROLOGUES: [&str; 20] = [
    "p_adr", "p_adrp", "p_ldr_x", "p_ldr_w", "p_ldrsw", "p_prfm", "p_ldr_d", "p_ldr_q", "p_b", "p_bl", "p_bcond",
    "p_cbz", "p_cbnz", "p_tbz", "p_tbnz", "p_blr", "p_ret", "p_bti", "p_pac", "p_self",
];

const BTI_C: u32 = 0xd503245f;
const PACIASP: u32 = 0xd503233f;

/// The A64 word at `addr` in the process.
fn word_at(pid: i32, addr: u64) -> u32 {
    u32::from_le_bytes(read_mem(pid, addr, 4).try_into().unwrap())
}

/// The target of the `b` at `addr`; panics if it is not a `b`.
fn branch_target(pid: i32, addr: u64) -> u64 {
    let w = word_at(pid, addr);
    assert_eq!(w >> 26, 0b000101, "expected a `b` at {addr:#x}, found {w:#010x}");
    let imm = ((w as i64) << 38) >> 38;
    addr.wrapping_add((imm * 4) as u64)
}

#[test]
fn counts_every_relocated_instruction_class_exactly() {
    let t = count_exactly_in("prologues", &PROLOGUES, 20_000, 2);
    assert!(t.quit().success());
}

#[test]
fn landing_pads_stay_in_place_under_an_enforced_bti_guard() {
    // The target guards its assembly pages with PROT_BTI and checked that an
    // indirect call to a function without a landing pad raises SIGILL there;
    // p_bti and p_pac are only ever called indirectly.
    let mut t = Target::start("prologues-bti");
    assert!(t.out.seen.iter().any(|l| l.starts_with("bti enforced")), "{:?}", t.out.seen);
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "-f", "p_bti", "-f", "p_pac", "-f", "p_adrp"]);
    let bti = entry_in_file(&t, "p_bti").0;
    let pac = entry_in_file(&t, "p_pac").0;
    assert_eq!(word_at(t.pid, bti), BTI_C, "bti c must stay at p_bti's entry");
    assert_eq!(word_at(t.pid, pac), PACIASP, "paciasp must stay at p_pac's entry");
    branch_target(t.pid, bti + 4);
    branch_target(t.pid, pac + 4);
    let own_bti = t.call("p_bti", 30_000, 2);
    let own_pac = t.call("p_pac", 30_000, 1);
    let own_adrp = t.call("p_adrp", 1_000, 1);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["p_bti"], hits["p_pac"], hits["p_adrp"]), (own_bti, own_pac, own_adrp));
    assert_code_is_original(&t, &["p_bti", "p_pac", "p_adrp"]);
    assert!(t.quit().success());
}

#[test]
fn the_counter_uses_the_atomics_the_cpu_has() {
    const HWCAP_ATOMICS: u64 = 1 << 8;
    const STADD_X17_X16: u32 = 0xf831021f;
    const LDXR_X17_X16: u32 = 0xc85f7e11;
    // SAFETY: getauxval only reads this process's auxiliary vector.
    let lse = unsafe { libc::getauxval(libc::AT_HWCAP) } & HWCAP_ATOMICS != 0;
    // The CI stage runs this suite on a CPU with LSE and on one without, and
    // says which it booted, so a VM that silently changed CPUs fails here.
    if let Ok(expected) = std::env::var("TP_TEST_ATOMICS") {
        assert_eq!(if lse { "lse" } else { "exclusive" }, expected, "the VM's CPU is not the one asked for");
    }
    let mut t = Target::start("counter");
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "-f", "foo"]);
    let detour = branch_target(t.pid, entry_in_file(&t, "foo").0);
    let words: Vec<u32> = (0..20).map(|k| word_at(t.pid, detour + 4 * k)).collect();
    let want = if lse { STADD_X17_X16 } else { LDXR_X17_X16 };
    assert!(words.contains(&want), "lse={lse}: {want:#010x} not in the detour {words:08x?}");
    let calls = t.call("foo", 100_000, 4);
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["foo"], calls);
    eprintln!("counter with {}: {calls} calls from 4 threads, all counted", if lse { "stadd" } else { "ldxr/stxr" });
    assert!(t.quit().success());
}

#[test]
fn list_probes_skips_landing_pads_and_names_refusals() {
    let path = target_path("prologues");
    let args = ["list-probes", path.to_str().unwrap()];
    let stdout = expect_success(&args, &tp(&args));
    let verdict = |name: &str| {
        let line = stdout.lines().find(|l| l.split_whitespace().nth(2) == Some(name));
        let line = line.unwrap_or_else(|| panic!("no line for {name}:\n{stdout}"));
        line.split_once("  ok ").or_else(|| line.split_once("  refused: ")).unwrap().1.trim().to_string()
    };
    assert_eq!(verdict("p_adr"), "(4 bytes: adr)");
    assert_eq!(verdict("p_bti"), "(4 bytes: adrp)");
    assert_eq!(verdict("p_pac"), "(4 bytes: stp)");
    assert_eq!(verdict("p_bl"), "(4 bytes: bl)");
    assert!(verdict("p_ldxr").contains("`ldxr`") && verdict("p_ldxr").contains("exclusive"), "{}", verdict("p_ldxr"));
    assert!(verdict("p_mrs").starts_with("cannot relocate `mrs`"), "{}", verdict("p_mrs"));
    assert!(verdict("p_svc").starts_with("`svc`"), "{}", verdict("p_svc"));
}

#[test]
fn attaching_a_refused_function_touches_nothing() {
    let t = Target::start("prologues");
    let pid = t.pid.to_string();
    let line = expect_error(&["attach", "-p", &pid, "-f", "p_adr", "-f", "p_ldxr"], "cannot probe `p_ldxr`");
    assert!(line.contains("exclusive"), "{line}");
    assert!(!has_region(t.pid), "nothing may be injected when a function is refused");
    assert_code_is_original(&t, &["p_adr", "p_ldxr"]);
}

#[test]
fn long_form_when_no_arena_fits_within_branch_reach() {
    // With every free range within 129 MiB of the target reserved, tp's only
    // way in is `adrp x16; add x16; br x16` to an arena up to 4 GiB away.
    const ADRP_X16: (u32, u32) = (0x9f00_001f, 0x9000_0010);
    const ADD_X16_X16: (u32, u32) = (0xffc0_03ff, 0x9100_0210);
    const BR_X16: u32 = 0xd61f_0200;
    let mut t = Target::start("prologues");
    let crowded = t.ask("crowd", "crowded");
    assert!(!crowded.contains("kib=-"), "the target could not reserve its neighbourhood: {crowded}");
    assert!(field(&crowded, "kib") > 0, "{crowded}");
    let pid = t.pid.to_string();
    let funcs = ["p_adr", "p_adrp", "p_ldr_x", "p_bcond", "p_cbz", "p_tbz", "p_pac"];
    let mut args = vec!["-p", pid.as_str(), "--json"];
    for f in funcs {
        args.extend(["-f", f]);
    }
    let session = Session::start(&args);
    for f in funcs {
        let site = entry_in_file(&t, f).0 + if f == "p_pac" { 4 } else { 0 };
        let w: Vec<u32> = (0..3).map(|k| word_at(t.pid, site + 4 * k)).collect();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
        assert_eq!(w[0] & ADRP_X16.0, ADRP_X16.1, "{f}: {w:08x?} {site:#x}\n{maps}");
        assert_eq!(w[1] & ADD_X16_X16.0, ADD_X16_X16.1, "{f}: {w:08x?}");
        assert_eq!(w[2], BR_X16, "{f}: {w:08x?}");
        let imm = (((w[0] >> 29) & 3) | (((w[0] >> 5) & 0x7_ffff) << 2)) as i64;
        let detour = (site & !0xfff).wrapping_add(((imm << 43) >> 31) as u64) + ((w[1] >> 10) & 0xfff) as u64;
        let distance = detour.abs_diff(site);
        assert!(distance > 128 << 20 && distance < 4 << 30, "{f}: detour {detour:#x} is {distance:#x} away");
    }
    assert_eq!(word_at(t.pid, entry_in_file(&t, "p_pac").0), PACIASP);
    let mut own = std::collections::BTreeMap::new();
    for f in funcs {
        own.insert(f.to_string(), t.call(f, 20_000, 2));
    }
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "tp failed: {stderr}");
    assert_eq!(hits_from_json(&stdout), own, "tp's counts vs the target's own");
    assert_code_is_original(&t, &funcs);
    assert!(!has_region(t.pid));
    // p_b's first instruction branches to its third: the long form cannot take it.
    let line = expect_error(&["attach", "-p", &pid, "-f", "p_b"], "cannot probe `p_b`");
    assert!(line.contains("long form") && line.contains("branch into window"), "{line}");
    assert!(!has_region(t.pid), "nothing may be injected when the only form is refused");
    assert!(t.quit().success());
}

/// `guarded pac=P bti=B` of events-pac: whether the CPU signs return
/// addresses and guards the pages. The CI stage says which CPU it booted
/// (`TP_TEST_CPU`): `max` has both, a Cortex-A57 neither.
fn pac_and_bti(t: &Target) -> (bool, bool) {
    let line = t.out.seen.iter().find(|l| l.starts_with("guarded ")).unwrap_or_else(|| panic!("{:?}", t.out.seen));
    let (pac, bti) = (field(line, "pac") == 1, field(line, "bti") == 1);
    match std::env::var("TP_TEST_CPU").as_deref() {
        Ok("max") => assert!(pac && bti, "-cpu max has PAC and BTI: {line}"),
        Ok("cortex-a57") => assert!(!pac && !bti, "a Cortex-A57 has neither PAC nor BTI: {line}"),
        _ => {}
    }
    (pac, bti)
}

const PACIBSP: u32 = 0xd503237f;

/// A function of a variant calling convention (here the vector one; the
/// assembler marks SVE functions the same way) is counted exactly, and
/// recording in it is refused in one line before anything is injected: its
/// vector registers, which a syscall of the runtime could discard, may hold
/// its arguments or values its callers keep.
#[test]
fn a_variant_pcs_function_is_counted_and_recording_in_it_refused() {
    let mut t = Target::start("vectors");
    t.out.wait_for("spinning sve=");
    let pid = t.pid.to_string();
    for records in ["--args", "--ret", "--stack"] {
        let line = expect_error(&["attach", "-p", &pid, "-f", "vpcs_scale", records], "cannot probe `vpcs_scale`");
        assert!(line.contains("variant calling convention") && line.contains("count its calls"), "{line}");
        assert!(!has_region(t.pid), "{records}: nothing may be injected");
    }
    let session = Session::start(&["-p", &pid, "--json", "-f", "vpcs_scale"]);
    assert_eq!(t.ask("vpcs 1000", "done"), "done vpcs calls=1000 checksum=ok");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    assert_eq!(hits_from_json(&stdout)["vpcs_scale"], 1000);
    assert_code_is_original(&t, &["vpcs_scale"]);
    t.send(b"stop\n");
    assert!(t.out.wait_for("").starts_with("intact rounds="));
    assert!(t.quit().success());
}

/// A thread stopped in the middle of vector work (say an SVE `memcpy`, the
/// bytes it loaded in Z0, its predicate in P0) finishes it as it would have
/// without tp: a syscall discards the SVE registers beyond their low 128
/// bits and the predicates, and the syscalls tp makes with a stopped thread
/// give them back whole. The target checks NEON and SVE registers it loaded
/// once, in a loop that never calls or enters the kernel, while tp attaches
/// and detaches three times (its main thread makes tp's syscalls).
#[test]
fn tps_syscalls_leave_the_stopped_threads_vector_registers_whole() {
    let mut t = Target::start("vectors");
    let line = t.out.wait_for("spinning sve=");
    let sve: u64 = field(&line, "sve");
    match std::env::var("TP_TEST_CPU").as_deref() {
        Ok("max") => assert!(sve >= 16, "-cpu max has SVE: {line}"),
        Ok("cortex-a57") => assert_eq!(sve, 0, "a Cortex-A57 has no SVE: {line}"),
        _ => {}
    }
    let pid = t.pid.to_string();
    for _ in 0..3 {
        let args = ["attach", "-p", &pid, "-f", "idle", "-d", "0.2", "--json"];
        let stdout = expect_success(&args, &tp(&args));
        assert_eq!(hits_from_json(&stdout)["idle"], 0);
    }
    t.send(b"stop\n");
    let verdict = t.out.wait_for("");
    assert!(verdict.starts_with("intact rounds="), "sve={sve}: {verdict}");
    assert!(field(&verdict, "rounds") > 0, "{verdict}");
    assert!(!has_region(t.pid));
    assert!(t.quit().success());
}

#[test]
fn return_probes_on_functions_that_sign_their_return_address() {
    // fib, nap, jumper and pulse start with paciasp, greet with pacibsp, the
    // leaves with `bti c`; tp's detour authenticates the return address at
    // the entry stack pointer and signs the trampoline in its place.
    let t = Target::start("events-pac");
    let (pac, bti) = pac_and_bti(&t);
    eprintln!("events-pac: pac={pac} bti={bti}");
    for (f, pad) in [("fib", PACIASP), ("jumper", PACIASP), ("greet", PACIBSP), ("add", BTI_C), ("tail_inner", BTI_C)] {
        assert_eq!(word_at(t.pid, entry_in_file(&t, f).0), pad, "{f} starts with its landing pad");
    }
    assert!(t.quit().success());
    // Where each saves its link register, from its call frame information
    // (a CIE of key B included): the runtime's liveness checks and
    // tp_unwind's put-back read there.
    let m = tp::symbols::Module::from_file(&target_path("events-pac")).unwrap();
    for (f, below) in [("fib", Some(24)), ("greet", Some(8)), ("nap", Some(40)), ("add", None)] {
        assert_eq!(m.return_saved_below(&m.function(f).unwrap()), below, "{f}");
    }
    crate::events::arguments_and_returns_match_the_log_of("events-pac");
    crate::events::arguments_in_registers_of("events-pac");
    crate::events::recursion_in("events-pac");
}

#[test]
fn a_signed_call_still_running_when_the_session_ends_keeps_its_trampoline() {
    // Timed at its exits, the call's return address was never touched: it
    // returns to its caller and tp's memory goes. Timed by replacing its
    // return address, tp cannot sign the original with the process's key
    // from outside: the frame and tp's memory stay until the call returns.
    let t = Target::start("events-pac");
    let (pac, _) = pac_and_bti(&t);
    assert!(t.quit().success());
    assert!(!crate::events::call_live_at_the_end("events-pac", &[]), "exits leave no return address to give back");
    let kept = crate::events::call_live_at_the_end("events-pac", &[("TP_RETURNS", "stack")]);
    assert_eq!(kept, pac, "memory kept only where the address is signed");
}

#[test]
fn tail_calls_and_longjmp_through_signed_frames() {
    crate::events::tail_calls_in("events-pac");
    crate::events::longjmp_in("events-pac");
}

#[test]
fn cpp_exceptions_through_signed_frames() {
    // The unwinder authenticates each signed return address with the
    // frame's CFA: tp_unwind puts the original back signed alike.
    crate::events::exceptions_in("exceptions-pac");
}

#[test]
fn the_landing_pads_and_signing_stay_in_place_under_return_probes() {
    let mut t = Target::start("events-pac");
    pac_and_bti(&t);
    let pid = t.pid.to_string();
    let session = Session::start(&["-p", &pid, "--json", "--ret", "-f", "fib", "-f", "greet", "-f", "add"]);
    for (f, pad) in [("fib", PACIASP), ("greet", PACIBSP), ("add", BTI_C)] {
        let entry = entry_in_file(&t, f).0;
        assert_eq!(word_at(t.pid, entry), pad, "{f}");
        branch_target(t.pid, entry + 4);
    }
    let fib = t.ask("fib 12", "done fib");
    t.ask("call 30", "done call");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "{stderr}");
    let hits = hits_from_json(&stdout);
    assert_eq!((hits["fib"], hits["greet"], hits["add"]), (field(&fib, "calls"), 30, 30));
    assert_code_is_original(&t, &["fib", "greet", "add"]);
    assert!(t.quit().success());
}

/// Signal handlers that call a timed function while the interrupted code
/// is in that function's entry, exit or event write. Known defect: here,
/// and not on x86-64, about one call in a million interrupted this way
/// has its exit neither recorded nor counted lost (nor sent as unwound);
/// the count of calls stays exact. Up to 4 such exits are let pass until
/// the cause is found (docs/reliability.md). 400,000 calls: the VM's
/// Cortex-A57 takes over a minute to trace a million.
#[test]
fn a_signal_handler_that_calls_a_timed_function_mid_entry_is_survived() {
    crate::events::signal_handlers_in_timed_calls(400_000, 4);
}
