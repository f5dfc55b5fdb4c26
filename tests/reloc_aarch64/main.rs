//! Differential relocation tests for AArch64: for every rewrite class, the
//! original instruction and tp's relocation of it run from identical states
//! under qemu-aarch64 (user mode), and their registers (x0-x30, SP, NZCV,
//! v0-v31), where control went next, and the memory they wrote must agree
//! over 64 random states (harness.c does the running and comparing). The
//! whole event detour runs the same way, with a runtime that clobbers every
//! register a C function may, after a function's `paciasp` or `pacibsp`:
//! only x16 and x17 may differ, and x30 must be signed as the function
//! signed it.
//!
//! Needs `aarch64-linux-gnu-gcc` and `qemu-aarch64-static` (installed by
//! `.ci/aarch64/setup-host.sh`); built only with `--features qemu-tests`,
//! which the AArch64 CI stage passes.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use tp::arch::aarch64::decode::disassemble;
use tp::arch::aarch64::reg::Reg;
use tp::arch::aarch64::relocate::{Exit, relocate_alone};
use tp::arch::aarch64::window;

/// Where the original instruction sits.
const ORIG: u64 = 0x5000_0100;
/// Where its relocation runs: 64 MiB away, within `b` reach as tp's arenas are.
const TRAMP: u64 = 0x5400_0000;

/// The harness, cross-compiled once per test run.
fn harness() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reloc_aarch64/harness.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reloc-harness-aarch64");
        let status = Command::new("aarch64-linux-gnu-gcc")
            .args(["-O1", "-static", "-Wall", "-Werror", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("aarch64-linux-gnu-gcc: {e} (run .ci/aarch64/setup-host.sh)"));
        assert!(status.success(), "building {}", src.display());
        out
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the harness; returns (all trials matched, its output).
fn differential(orig: &[u8], tramp: &[u8], scratch: &[&str]) -> (bool, String) {
    differential_at(TRAMP, orig, tramp, scratch)
}

/// Runs the harness with the relocation at `at`.
fn differential_at(at: u64, orig: &[u8], tramp: &[u8], scratch: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("qemu-aarch64-static");
    // Without SVE, signal frames carry v0-v31 where the harness edits them.
    cmd.args(["-cpu", "max,sve=off,sme=off"]).arg(harness()).args(["-n", "64"]);
    if !scratch.is_empty() {
        cmd.args(["-c", &scratch.join(",")]);
    }
    cmd.args([format!("{ORIG:#x}"), hex(orig), format!("{at:#x}"), hex(tramp)]);
    let out = cmd.output().unwrap_or_else(|e| panic!("qemu-aarch64-static: {e} (run .ci/aarch64/setup-host.sh)"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("trials matched"), "the harness did not run: {text}");
    (out.status.success(), text)
}

/// One original instruction, what capstone calls it at ORIG, and the scratch
/// registers its relocation may clobber (which the original leaves alone).
struct Case {
    asm: String,
    word: u32,
    scratch: &'static [&'static str],
}

fn case(asm: &str, word: u32, scratch: &'static [&'static str]) -> Case {
    Case { asm: asm.to_string(), word, scratch }
}

fn cases() -> Vec<Case> {
    let mut c = vec![
        case("adr x0, #0x50001100", 0x1000_8000, &[]),
        case("adr x5, #0x500000fd", 0x30ff_ffe5, &[]),
        // The window's own address (a function passing itself as a callback):
        // data, so the copy computes the original's address, not its own.
        case("adr x0, #0x50000100", 0x1000_0000, &[]),
        case("adrp x3, #0x50000000", 0x9000_0003, &[]),
        case("adrp x1, #0x50003000", 0xf000_0001, &[]),
        case("adrp x16, #0x10000000", 0x90e0_0010, &[]),
        case("adrp x30, #0x50001000", 0xb000_001e, &[]),
        case("ldr x2, #0x50000200", 0x5800_0802, &[]),
        case("ldr w3, #0x500000c0", 0x18ff_fe03, &[]),
        case("ldrsw x4, #0x50000180", 0x9800_0404, &[]),
        case("ldr x17, #0x50000108", 0x5800_0051, &[]),
        case("ldr wzr, #0x50000108", 0x1800_005f, &["x16"]),
        case("prfm pldl1keep, #0x50000120", 0xd800_0100, &["x16"]),
        case("ldr s1, #0x50000110", 0x1c00_0081, &["x16"]),
        case("ldr d2, #0x50000000", 0x5cff_f802, &["x16"]),
        case("ldr q3, #0x50000300", 0x9c00_1003, &["x16"]),
        case("b #0x50000140", 0x1400_0010, &[]),
        case("b #0x4d000100", 0x1740_0000, &[]),
        case("bl #0x50000140", 0x9400_0010, &[]),
        case("cbz x1, #0x50000140", 0xb400_0201, &[]),
        case("cbnz w2, #0x500000c0", 0x35ff_fe02, &[]),
        case("cbz x30, #0x50000140", 0xb400_021e, &[]),
        case("tbz w3, #0, #0x50000140", 0x3600_0203, &[]),
        case("tbnz w4, #5, #0x50000140", 0x3728_0204, &[]),
        case("tbz x5, #0x3f, #0x50000140", 0xb6f8_0205, &[]),
        case("tbnz x6, #0x21, #0x500000c0", 0xb70f_fe06, &[]),
        case("blr x7", 0xd63f_00e0, &["x17"]),
        case("blr x30", 0xd63f_03c0, &["x17"]),
        case("ret", 0xd65f_03c0, &[]),
        case("br x3", 0xd61f_0060, &[]),
        case("stp x29, x30, [sp, #-0x10]!", 0xa9bf_7bfd, &[]),
        case("add x0, x1, x2", 0x8b02_0020, &[]),
        case("str x1, [x2]", 0xf900_0041, &[]),
        case("adds x0, x1, #1", 0xb100_0420, &[]),
    ];
    let conds = ["eq", "ne", "hs", "lo", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt", "gt", "le", "al", "nv"];
    for (k, cond) in conds.iter().enumerate() {
        c.push(case(&format!("b.{cond} #0x50000140"), 0x5400_0200 | k as u32, &[]));
    }
    c
}

fn plan_of(word: u32) -> tp::arch::SitePlan {
    window::plan(&word.to_le_bytes(), ORIG, &[]).unwrap_or_else(|r| panic!("{word:#010x} refused: {r}"))
}

#[test]
fn every_rewrite_class_behaves_like_the_original() {
    let mut failed = Vec::new();
    for c in cases() {
        assert_eq!(disassemble(&c.word.to_le_bytes(), ORIG), [c.asm.as_str()], "{:#010x}", c.word);
        let relocated = relocate_alone(&plan_of(c.word), TRAMP, Exit::Branch).unwrap();
        let (ok, out) = differential(&c.word.to_le_bytes(), &relocated, c.scratch);
        eprintln!("{:<32} {}", c.asm, out.lines().last().unwrap_or(""));
        if !ok {
            failed.push(format!("{}: relocated as {:?}\n{out}", c.asm, disassemble(&relocated, TRAMP)));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn the_harness_catches_unrelocated_copies() {
    // A verbatim copy of a PC-relative instruction computes from the wrong PC.
    for c in cases().iter().filter(|c| {
        [
            "adr x0",
            "adrp x1",
            "adrp x3",
            "ldr x2",
            "ldrsw",
            "ldr d2",
            "b #0x50000140",
            "bl ",
            "b.ne",
            "cbz x1",
            "tbz x5",
        ]
        .iter()
        .any(|p| c.asm.starts_with(p))
    }) {
        let (ok, out) = differential(&c.word.to_le_bytes(), &c.word.to_le_bytes(), &[]);
        assert!(!ok, "a verbatim copy of `{}` should differ:\n{out}", c.asm);
    }
}

#[test]
fn the_harness_catches_a_wrong_rewrite() {
    // b.ne relocated with the condition inverted but the branches kept: the
    // shape of a plausible bug. It must differ whenever Z decides the branch.
    let wrong = {
        let mut w = tp::arch::aarch64::writer::Writer::new(TRAMP);
        w.put_cond_branch(0x5400_0000, TRAMP + 8); // b.eq (should be b.ne)
        w.put_b(ORIG + 4);
        w.put_b(ORIG + 0x40);
        w.finish().unwrap()
    };
    let (ok, _) = differential(&0x5400_0201u32.to_le_bytes(), &wrong, &[]);
    assert!(!ok);
    // ... and a position-independent instruction copied verbatim matches.
    let add = 0x8b02_0020u32.to_le_bytes();
    let mut w = tp::arch::aarch64::writer::Writer::new(TRAMP);
    w.put(0x8b02_0020);
    w.put_b(ORIG + 4);
    let (ok, out) = differential(&add, &w.finish().unwrap(), &[]);
    assert!(ok, "{out}");
}

/// The long form's detour sits 1 GiB away and leaves with `ret`.
const TRAMP_FAR: u64 = ORIG + (1 << 30);

#[test]
fn long_form_windows_behave_like_the_original() {
    use tp::arch::aarch64::long::{exit, plan_long};
    let windows: [(&str, [u32; 3]); 11] = [
        // Addresses inside the window itself stay the original's.
        ("adr x0, .; adr x1, .-4; adr x2, .-8", [0x1000_0000, 0x10ff_ffe1, 0x10ff_ffc2]),
        ("stp; adrp x0; add x0, #0x100 (the site)", [0xa9bf_7bfd, 0x9000_0000, 0x9104_0000]),
        ("stp; mov x29, sp; bl", [0xa9bf_7bfd, 0x9100_03fd, 0x9400_0010]),
        ("cbz x1; adr x0; ldr x2", [0xb400_0201, 0x1000_0800, 0x5800_0402]),
        ("b.ne; b.eq; add", [0x5400_0201, 0x5400_0400, 0x8b02_0020]),
        ("adrp x1; add x1; ldrsw x3", [0xb000_0001, 0x9100_4021, 0x9800_0103]),
        ("tbz; tbnz; blr x7", [0x3600_0203, 0x372f_fe04, 0xd63f_00e0]),
        ("add; b; (nop)", [0x9100_0400, 0x1400_0010, 0xd503_201f]),
        ("mov x0, #1; ret; (nop)", [0xd280_0020, 0xd65f_03c0, 0xd503_201f]),
        ("ldr q3; prfm; ldr d2", [0x9c00_1003, 0xd800_0100, 0x5cff_f802]),
        ("mov x16; add x0, x0, x16; adds", [0xd280_0030, 0x8b10_0000, 0xb100_0401]),
    ];
    let mut failed = Vec::new();
    for (name, words) in windows {
        let mut function: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        function.extend(0xd65f_03c0u32.to_le_bytes()); // ret
        let plan = plan_long(&function, ORIG, &[]).unwrap_or_else(|r| panic!("{name}: refused: {r}"));
        let relocated = relocate_alone(&plan, TRAMP_FAR, exit(&plan).unwrap()).unwrap();
        // x16 and x17 are scratch, unless the window itself uses them.
        let asm = disassemble(&function[..12], ORIG).join("; ");
        let scratch: Vec<&str> = ["x16", "x17"].into_iter().filter(|r| !asm.contains(r)).collect();
        let (ok, out) = differential_at(TRAMP_FAR, &function[..12], &relocated, &scratch);
        eprintln!("{asm:<60} {}", out.lines().last().unwrap_or(""));
        if !ok {
            failed.push(format!("{asm}: relocated as {:?}\n{out}", disassemble(&relocated, TRAMP_FAR)));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The runtime the whole-detour test calls: it clobbers every register a C
/// function may (x0-x18, NZCV) and returns, as tp_entry may.
fn clobbering_runtime(at: u64) -> Vec<u8> {
    let mut w = tp::arch::aarch64::writer::Writer::new(at);
    for r in (0..=18).filter(|&r| r != 16) {
        w.put_movz(Reg::x(r), 0xdead ^ r as u16);
    }
    w.put(0xd2a0_0000 | (0xf000 << 5) | 16); // movz x16, #0xf000, lsl #16: N, Z, C and V set
    w.put_msr_nzcv(Reg::X16);
    w.put_ret(Reg::LR);
    w.finish().unwrap()
}

#[test]
fn the_whole_event_detour_preserves_every_register_a_caller_may_keep() {
    // A function's first instructions, then the probe site: `stp x29, x30,
    // [sp, #-16]!`. With pointer authentication the function signs its
    // return address first (paciasp, pacibsp; x30 made a canonical address
    // first, as return addresses are): the detour must authenticate it, save
    // x0-x15, x18, NZCV and x30, call the runtime (which clobbers them),
    // restore them and sign x30 again exactly as the function did, so that
    // the relocated stp stores the same word. Only x16 and x17 may differ.
    use tp::arch::aarch64::detour::{Atomics, build};
    use tp::arch::{Abi, DetourSpec, Records, RuntimeAddrs, SitePlan, WindowInsn};
    const AND_X30_48_BITS: u32 = 0x9240_bfde;
    const STP: u32 = 0xa9bf_7bfd;
    let pads: [(&str, u32); 3] = [("nop", 0xd503_201f), ("paciasp", 0xd503_233f), ("pacibsp", 0xd503_237f)];
    let kinds = [
        (
            "entry and return",
            Records {
                args: true,
                ret: true,
                sample: false,
                unwind: false,
                exit: false,
                rendezvous: false,
                step: false,
            },
        ),
        (
            "sampled",
            Records {
                args: false,
                ret: true,
                sample: true,
                unwind: false,
                exit: false,
                rendezvous: false,
                step: false,
            },
        ),
        (
            "unwinder",
            Records {
                args: false,
                ret: false,
                sample: false,
                unwind: true,
                exit: false,
                rendezvous: false,
                step: false,
            },
        ),
    ];
    let mut failed = Vec::new();
    for (pad_name, pad) in pads {
        for (kind, records) in kinds {
            for atomics in [Atomics::Lse, Atomics::Exclusive] {
                let prefix: Vec<u8> = [AND_X30_48_BITS, pad].iter().flat_map(|w| w.to_le_bytes()).collect();
                let mut orig = prefix.clone();
                orig.extend(STP.to_le_bytes());
                assert_eq!(disassemble(&orig[..4], ORIG), ["and x30, x30, #0xffffffffffff"]);
                let site = ORIG + 8;
                let plan = SitePlan {
                    function: ORIG,
                    site,
                    prefix: prefix.clone(),
                    window: STP.to_le_bytes().to_vec(),
                    insns: vec![WindowInsn { offset: 0, len: 4, mnemonic: "stp".into() }],
                    interior: false,
                    exits: Vec::new(),
                    dead: 0,
                };
                // TRAMP: the two first instructions and a branch to the
                // detour; the detour; the runtime; counter and countdown
                // rows (zero: a sampling probe samples).
                let (detour_at, runtime_at, counters, countdowns) = (TRAMP + 0x40, TRAMP + 0x600, 0x800, 0x400);
                let rt = RuntimeAddrs {
                    entry: runtime_at,
                    trampoline: 0x1234_5670,
                    unwind: runtime_at,
                    rendezvous: runtime_at,
                    step: runtime_at,
                    trap: 0,
                    trap_return: 0,
                    entry_ext: runtime_at,
                    trampoline_ext: 0x1234_5670,
                    exit: 0,
                    exit_tail: 0,
                    exit_runtime: 0,
                    count: 0,
                    ctx: 0x5555,
                };
                let spec = DetourSpec {
                    probe_index: 0,
                    records,
                    entry_word: 7,
                    runtime: Some(rt),
                    // Byte 3 of a `brk` word of the harness's code region: 0xd4, enabled.
                    flag_addr: TRAMP + 0x2_0003,
                    counters: TRAMP + counters,
                    cache: 0,
                    countdowns_from_counters: countdowns,
                    slot_bits: 6,
                    stride_shift: 3,
                    abi: Abi::C,
                    return_saved_below: Some(16),
                    operands: None,
                    layout: None,
                    exit_words: None,
                    sp_below_entry: 0,
                    go_room_lost: None,
                };
                let detour = build(&plan, detour_at, &spec, atomics).unwrap();
                let mut w = tp::arch::aarch64::writer::Writer::new(TRAMP);
                w.put(AND_X30_48_BITS);
                w.put(pad);
                w.put_b(detour_at);
                let mut tramp = w.finish().unwrap();
                tramp.resize((detour_at - TRAMP) as usize, 0);
                tramp.extend(&detour.bytes);
                assert!(tramp.len() <= (runtime_at - TRAMP) as usize, "detour too long: {}", tramp.len());
                tramp.resize((runtime_at - TRAMP) as usize, 0);
                tramp.extend(clobbering_runtime(runtime_at));
                tramp.resize((counters + countdowns + 64 * 8) as usize, 0);
                // The detour's save area, and below it what each call of the
                // runtime clears (dead stack: no red zone on AArch64).
                let below = 160 + tp::arch::aarch64::CLEARED_BELOW;
                let (ok, out) = differential_below_sp(&orig, &tramp, &["x16", "x17"], below);
                let name = format!("{pad_name}, {kind}, {atomics:?}");
                eprintln!("{name:<40} {}", out.lines().last().unwrap_or(""));
                if !ok {
                    failed.push(format!("{name}:\n{out}\n{:#?}", disassemble(&detour.bytes, detour_at)));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// [`differential`], with `below` bytes under the initial SP left out of
/// the comparison (a detour saves registers there).
fn differential_below_sp(orig: &[u8], tramp: &[u8], scratch: &[&str], below: u32) -> (bool, String) {
    let mut cmd = Command::new("qemu-aarch64-static");
    cmd.args(["-cpu", "max,sve=off,sme=off"]).arg(harness()).args(["-n", "64", "-b", &below.to_string()]);
    cmd.args(["-c", &scratch.join(",")]);
    cmd.args([format!("{ORIG:#x}"), hex(orig), format!("{TRAMP:#x}"), hex(tramp)]);
    let out = cmd.output().unwrap_or_else(|e| panic!("qemu-aarch64-static: {e} (run .ci/aarch64/setup-host.sh)"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("trials matched"), "the harness did not run: {text}");
    (out.status.success(), text)
}

/// The detour at each kind of exit runs as the exit alone: the call's end
/// recorded by the runtime block's real exit routine, whose call of
/// tp_exit_at (here: code that clobbers every register a C function may)
/// it makes with everything kept; then the exit itself. Every register,
/// NZCV and where control goes agree, but x16 and x17 (dead at a
/// function's exit); a `br` whose target lies inside the function (a
/// switch) makes no call at all.
#[test]
fn exit_detours_leave_as_the_function_did() {
    use tp::arch::aarch64::detour::{Atomics, build};
    use tp::arch::aarch64::runtime_block;
    use tp::arch::{Abi, DetourSpec, ExitInsn, ExitKind, ExitWords, Records, RuntimeBlobs, SitePlan, WindowInsn};
    let b_out = 0x1400_0000 | (0x4000 / 4); // b ORIG + 0x4000
    let beq_out = 0x5400_0000 | ((0x400 / 4) << 5); // b.eq ORIG + 0x400
    let cases: [(&str, u32, ExitKind); 5] = [
        ("ret", 0xd65f_03c0, ExitKind::Return),
        ("ret x1", 0xd65f_0020, ExitKind::Return),
        ("b #0x50004100", b_out, ExitKind::Jump),
        ("b.eq #0x50000500", beq_out, ExitKind::CondJump),
        // Its target inside the function's bounds (ORIG - 0x100 ..) or not.
        ("br x1", 0xd61f_0020, ExitKind::MaybeJump { lo: ORIG - 0x100, hi: ORIG + 0x100 }),
    ];
    let mut failed = Vec::new();
    for (asm, word, kind) in cases {
        assert_eq!(disassemble(&word.to_le_bytes(), ORIG), [asm]);
        let plan = SitePlan {
            function: ORIG - 0x100,
            site: ORIG,
            prefix: Vec::new(),
            window: word.to_le_bytes().to_vec(),
            insns: vec![WindowInsn { offset: 0, len: 4, mnemonic: asm.into() }],
            dead: 0,
            interior: false,
            exits: vec![ExitInsn { offset: 0, kind }],
        };
        let (detour_at, runtime_at) = (TRAMP + 0x40, TRAMP + 0x800);
        let clobber: &'static [u8] = clobbering_runtime(0).leak();
        let blobs = RuntimeBlobs {
            entry: &[0; 4],
            exit: &[0; 4],
            unwind: &[0; 4],
            count: &[0; 4],
            entry_ext: &[0; 4],
            exit_ext: &[0; 4],
            exit_at: clobber,
            exit_at_ext: clobber,
            rendezvous: &[0; 4],
            step: &[0; 4],
            trap: &[0; 4],
        };
        let block = runtime_block::build(runtime_at, 0x5555, (1 << 29) | (1 << 30), &blobs);
        let spec = DetourSpec {
            probe_index: 0,
            records: Records { exit: true, ..Records::COUNT },
            entry_word: 0,
            runtime: Some(block.addrs),
            flag_addr: 0,
            counters: 0,
            cache: 0,
            countdowns_from_counters: 0,
            slot_bits: 6,
            stride_shift: 3,
            abi: Abi::C,
            return_saved_below: None,
            operands: None,
            layout: None,
            exit_words: Some(ExitWords { ret: 7, tail: 7 | 1 << 21, runtime: false }),
            sp_below_entry: 0,
            go_room_lost: None,
        };
        let detour = build(&plan, detour_at, &spec, Atomics::Lse).unwrap();
        let mut w = tp::arch::aarch64::writer::Writer::new(TRAMP);
        w.put_b(detour_at);
        let mut tramp = w.finish().unwrap();
        tramp.resize((detour_at - TRAMP) as usize, 0);
        tramp.extend(&detour.bytes);
        assert!(tramp.len() <= (runtime_at - TRAMP) as usize, "detour too long: {}", tramp.len());
        tramp.resize((runtime_at - TRAMP) as usize, 0);
        tramp.extend(&block.bytes);
        // The stub's 32 bytes, the routine's frame and what the call clears.
        let below = 32 + 160 + tp::arch::aarch64::CLEARED_BELOW;
        let (ok, out) = differential_below_sp(&word.to_le_bytes(), &tramp, &["x16", "x17"], below);
        eprintln!("{asm:<20} {}", out.lines().last().unwrap_or(""));
        if !ok {
            failed.push(format!("{asm}:\n{out}\n{:#?}", disassemble(&detour.bytes, detour_at)));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
