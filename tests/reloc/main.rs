//! Differential execution of relocated x86-64 windows.
//!
//! For every rewrite class, the planner picks the window of a small function,
//! the relocator re-encodes it at another address, and `reloc_harness`
//! (targets/reloc_harness.c) runs the original bytes and the relocated bytes
//! from identical random register, flag, xmm and memory states, and compares
//! registers, flags, xmm, memory and where control ends up. Each case runs
//! with the code below 4 GiB and high in the address space (return addresses
//! that do not fit a sign-extended imm32), with the copy above and below it.
#![cfg(target_arch = "x86_64")]

use std::path::PathBuf;
use std::process::Command;

use tp::arch::x86_64::decode::disassemble;
use tp::arch::x86_64::{detour, relocate, window};
use tp::arch::{DetourSpec, Records, SitePlan};

/// Addresses of the original code; the data region is 1 MiB below each.
const ORIGINS: [u64; 2] = [0x1040_0000, 0x5555_5540_0000];
/// Where the relocated copy goes, relative to the original.
const DISTANCES: [i64; 2] = [0x7000_0000, -0x0800_0000];
const DATA_BELOW: u64 = 0x10_0000;
const TRIALS: &str = "32";

/// One window: its bytes, their disassembly at `ORIGINS[0]`, and registers
/// the comparison leaves out.
struct Case {
    asm: &'static str,
    bytes: &'static [u8],
    skip: &'static str,
}

const fn case(asm: &'static str, bytes: &'static [u8]) -> Case {
    Case { asm, bytes, skip: "" }
}

// RIP-relative operands below use displacement -0xe0000 (00 00 f2 ff): 128 KiB
// into the data region, plus the instruction's end offset. Pointers for
// `jmp/call [rip + x]` are read from the data region's first words, which
// hold addresses in the original's trap region.
const CASES: &[Case] = &[
    // Plain instructions, copied, then a jmp back.
    case("push rbp; mov rbp, rsp; push rbx", &[0x55, 0x48, 0x89, 0xe5, 0x53]),
    case("nop word ptr cs:[rax + rax]", &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0]),
    case("mov rax, qword ptr fs:[0x28]", &[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]),
    case("rep stosb byte ptr [rdi], al; mov rax, rdi", &[0xf3, 0xaa, 0x48, 0x89, 0xf8]),
    // RIP-relative memory operands: new displacements.
    case("mov rax, qword ptr [rip - 0xe0000]", &[0x48, 0x8b, 0x05, 0x00, 0x00, 0xf2, 0xff]),
    case("mov qword ptr [rip - 0xe0000], rdi", &[0x48, 0x89, 0x3d, 0x00, 0x00, 0xf2, 0xff]),
    case("lea rdx, [rip - 0xe0000]", &[0x48, 0x8d, 0x15, 0x00, 0x00, 0xf2, 0xff]),
    case("cmp dword ptr [rip - 0xe0000], 5", &[0x83, 0x3d, 0x00, 0x00, 0xf2, 0xff, 0x05]),
    case("mov dword ptr [rip - 0xe0000], 0x12345678", &[0xc7, 0x05, 0x00, 0x00, 0xf2, 0xff, 0x78, 0x56, 0x34, 0x12]),
    case("lock add dword ptr [rip - 0xe0000], eax", &[0xf0, 0x01, 0x05, 0x00, 0x00, 0xf2, 0xff]),
    case("push qword ptr [rip - 0xe0000]", &[0xff, 0x35, 0x00, 0x00, 0xf2, 0xff]),
    case("movsd xmm0, qword ptr [rip - 0xe0000]", &[0xf2, 0x0f, 0x10, 0x05, 0x00, 0x00, 0xf2, 0xff]),
    case("movdqu xmm3, xmmword ptr [rip - 0xe0000]", &[0xf3, 0x0f, 0x6f, 0x1d, 0x00, 0x00, 0xf2, 0xff]),
    case("vpaddd xmm2, xmm1, xmmword ptr [rip - 0xe0000]", &[0xc5, 0xf1, 0xfe, 0x15, 0x00, 0x00, 0xf2, 0xff]),
    case("lea eax, [eip - 0xe0000]", &[0x67, 0x8d, 0x05, 0x00, 0x00, 0xf2, 0xff]),
    case("mov eax, dword ptr [eip - 0xe0000]", &[0x67, 0x8b, 0x05, 0x00, 0x00, 0xf2, 0xff]),
    case("mov rcx, rdi; lea rdx, [rip - 0xe0000]", &[0x48, 0x89, 0xf9, 0x48, 0x8d, 0x15, 0x00, 0x00, 0xf2, 0xff]),
    // RIP-relative data addresses inside the window: the function's own
    // address (a callback, a comparison) stays the original's, never the copy's.
    case("lea rax, [rip - 7]", &[0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff]),
    case("push rbx; lea rcx, [rip - 8]", &[0x53, 0x48, 0x8d, 0x0d, 0xf8, 0xff, 0xff, 0xff]),
    case("mov rdx, qword ptr [rip - 7]", &[0x48, 0x8b, 0x15, 0xf9, 0xff, 0xff, 0xff]),
    case("lea eax, [eip - 7]", &[0x67, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff]),
    case("cmp rdi, qword ptr [rip - 7]", &[0x48, 0x3b, 0x3d, 0xf9, 0xff, 0xff, 0xff]),
    // Conditional branches, rel8 (widened) and rel32.
    case("test edi, edi; jne 0x10400040; nop", &[0x85, 0xff, 0x75, 0x3c, 0x90]),
    case("cmp rdi, rsi; jb 0x10400109", &[0x48, 0x39, 0xf7, 0x0f, 0x82, 0x00, 0x01, 0x00, 0x00]),
    case("cmp esi, 3; jle 0x103fff85", &[0x83, 0xfe, 0x03, 0x7e, 0x80]),
    // jcc whose target is the window's end.
    case("test edi, edi; jne 0x10400005; nop", &[0x85, 0xff, 0x75, 0x01, 0x90]),
    // jmp ending the window (the bytes after it never run).
    case("mov eax, edi; jmp 0x10400024; int3", &[0x89, 0xf8, 0xeb, 0x20, 0xcc]),
    case("jmp 0x10401005", &[0xe9, 0x00, 0x10, 0x00, 0x00]),
    case("bnd jmp 0x10401006", &[0xf2, 0xe9, 0x00, 0x10, 0x00, 0x00]),
    case("jmp qword ptr [rip - 0xffffe]", &[0xff, 0x25, 0x02, 0x00, 0xf0, 0xff]),
    // ret ending the window.
    case("test edi, edi; jne 0x10400005; ret", &[0x85, 0xff, 0x75, 0x01, 0xc3]),
    case("ret 8; nop; nop", &[0xc2, 0x08, 0x00, 0x90, 0x90]),
    // A call as the last instruction: push the original return address, jmp.
    case("push rbx; call 0x10400206", &[0x53, 0xe8, 0x00, 0x02, 0x00, 0x00]),
    case("call 0x10400205", &[0xe8, 0x00, 0x02, 0x00, 0x00]),
    case("call 0x10400005", &[0xe8, 0x00, 0x00, 0x00, 0x00]),
    case("push rbx; push rbp; push r12; call rax", &[0x53, 0x55, 0x41, 0x54, 0xff, 0xd0]),
    // (r11 carries the target of a `call [mem]`.)
    Case {
        asm: "push rbx; mov rbx, rdi; call qword ptr [rbx]",
        bytes: &[0x53, 0x48, 0x89, 0xfb, 0xff, 0x13],
        skip: "r11",
    },
    Case {
        asm: "push rbx; call qword ptr [rip - 0xfffff]",
        bytes: &[0x53, 0xff, 0x15, 0x01, 0x00, 0xf0, 0xff],
        skip: "r11",
    },
    Case { asm: "push rbx; call qword ptr [rsp + 8]", bytes: &[0x53, 0xff, 0x54, 0x24, 0x08], skip: "r11" },
    // loop / jrcxz (rel8 only: rewritten into a short jump over a long one).
    case("loop 0x10400012; nop; nop; nop", &[0xe2, 0x10, 0x90, 0x90, 0x90]),
    case("loope 0x10400012; nop; nop; nop", &[0xe1, 0x10, 0x90, 0x90, 0x90]),
    case("loopne 0x10400012; nop; nop; nop", &[0xe0, 0x10, 0x90, 0x90, 0x90]),
    case("jrcxz 0x10400012; nop; nop; nop", &[0xe3, 0x10, 0x90, 0x90, 0x90]),
    case("jecxz 0x10400013; nop; nop", &[0x67, 0xe3, 0x10, 0x90, 0x90]),
    // A syscall as the last instruction (getpid); rcx holds the address after
    // the syscall, which differs by design.
    Case { asm: "push 0x27; pop rax; syscall", bytes: &[0x6a, 0x27, 0x58, 0x0f, 0x05], skip: "rcx" },
];

fn harness() -> PathBuf {
    PathBuf::from(env!("TP_TARGETS_DIR")).join("reloc_harness")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The planner's window for `bytes` (followed by a `ret`) at `orig`.
fn plan_at(c: &Case, orig: u64) -> SitePlan {
    let mut code = c.bytes.to_vec();
    code.push(0xc3);
    let plan = window::plan(&code, orig, &[]).unwrap_or_else(|r| panic!("`{}` refused: {r}", c.asm));
    assert_eq!(plan.window, c.bytes, "`{}`: the planner chose another window", c.asm);
    plan
}

/// Runs the harness on `orig_bytes` at `orig` and `reloc` at `at`; returns (matched, output).
fn run_harness(orig: u64, orig_bytes: &[u8], at: u64, reloc: &[u8], skip: &str) -> (bool, String) {
    run_harness_below_sp(orig, orig_bytes, at, reloc, skip, 0)
}

/// Like [`run_harness`], leaving `below_sp` bytes under the stack pointer out.
fn run_harness_below_sp(
    orig: u64,
    orig_bytes: &[u8],
    at: u64,
    reloc: &[u8],
    skip: &str,
    below_sp: u64,
) -> (bool, String) {
    let extra: Vec<String> = if skip.is_empty() { vec![] } else { vec!["-c".into(), skip.into()] };
    run_harness_with(orig, orig_bytes, at, reloc, below_sp, &extra)
}

/// Runs the harness with the options `extra` besides the usual ones.
fn run_harness_with(
    orig: u64,
    orig_bytes: &[u8],
    at: u64,
    reloc: &[u8],
    below_sp: u64,
    extra: &[String],
) -> (bool, String) {
    let mut cmd = Command::new(harness());
    cmd.args(["-n", TRIALS, "-d", &format!("{:#x}", orig - DATA_BELOW), "-z", &below_sp.to_string()]);
    cmd.args(extra);
    cmd.args([format!("{orig:#x}"), hex(orig_bytes), format!("{at:#x}"), hex(reloc)]);
    let out = cmd.output().unwrap_or_else(|e| panic!("run {}: {e}", harness().display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.code().is_some_and(|c| c < 2), "harness misused or crashed: {text}");
    let matched = out.status.success() && text.contains(&format!("{TRIALS}/{TRIALS} trials matched"));
    (matched, text)
}

#[test]
fn case_table_disassembles_as_written() {
    for c in CASES {
        assert_eq!(disassemble(c.bytes, ORIGINS[0]).join("; "), c.asm, "{:02x?}", c.bytes);
    }
}

#[test]
fn every_rewrite_class_behaves_like_the_original() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for c in CASES {
        for orig in ORIGINS {
            let plan = plan_at(c, orig);
            for d in DISTANCES {
                let at = orig.wrapping_add_signed(d);
                let reloc = relocate::relocate(&plan, at).unwrap_or_else(|r| panic!("`{}` at {at:#x}: {r}", c.asm));
                let (ok, text) = run_harness(orig, &plan.window, at, &reloc.code, c.skip);
                runs += 1;
                if !ok {
                    let got = disassemble(&reloc.code, at).join("; ");
                    failures.push(format!("`{}` at {orig:#x} -> {at:#x} (`{got}`):\n{text}", c.asm));
                }
            }
        }
    }
    assert_eq!(runs, CASES.len() * 4);
    assert!(failures.is_empty(), "{} of {runs} runs differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn window_after_endbr64_behaves_like_the_original() {
    let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x53, 0xc3];
    let orig = ORIGINS[0];
    let plan = window::plan(&code, orig - 4, &[]).unwrap();
    assert_eq!(plan.site, orig);
    let at = orig + 0x7000_0000;
    let reloc = relocate::relocate(&plan, at).unwrap();
    let (ok, text) = run_harness(orig, &plan.window, at, &reloc.code, "");
    assert!(ok, "{text}");
}

/// The harness must catch the mistakes relocation exists to avoid.
#[test]
fn harness_detects_wrong_relocations() {
    let orig = ORIGINS[0];
    let at = orig + 0x7000_0000;
    // `jmp target` placed `pos` bytes into the copy.
    let jmp = |pos: u64, target: u64| -> Vec<u8> {
        let rel = target as i64 - (at + pos + 5) as i64;
        [&[0xe9][..], &(rel as i32).to_le_bytes()].concat()
    };
    // A RIP-relative load copied verbatim reads another address.
    let load = [0x48, 0x8b, 0x05, 0x00, 0x00, 0xf2, 0xff];
    let verbatim = [&load[..], &jmp(7, orig + 7)].concat();
    let (ok, text) = run_harness(orig, &load, at, &verbatim, "");
    assert!(!ok, "a verbatim RIP-relative copy went unnoticed: {text}");
    // A call re-encoded as a plain call returns into the copy, not the original.
    let call = [0x53, 0xe8, 0x00, 0x02, 0x00, 0x00];
    let rel = (orig + 0x206) as i64 - (at as i64 + 6);
    let wrong = [&[0x53, 0xe8][..], &(rel as i32).to_le_bytes()].concat();
    let (ok, text) = run_harness(orig, &call, at, &wrong, "");
    assert!(!ok, "a call pushing the copy's return address went unnoticed: {text}");
    // The jump back must land exactly at the window's end.
    let push = [0x55, 0x48, 0x89, 0xe5, 0x53];
    let short = [&push[..], &jmp(5, orig + 4)].concat();
    let (ok, text) = run_harness(orig, &push, at, &short, "");
    assert!(!ok, "a jump back to the wrong address went unnoticed: {text}");
}

/// The status flags (OF SF ZF AF PF CF) that `window`'s instructions leave
/// defined: the last instruction that touches each sets it to a defined
/// value, or none touches it. A counting detour may leave something else in
/// the others, which a program cannot rely on after the window.
fn defined_flags(window: &[u8], site: u64) -> u64 {
    use iced_x86::{Decoder, DecoderOptions, RflagsBits};
    // RflagsBits and EFLAGS put the six flags at different bits.
    let flags = [
        (RflagsBits::CF, 1 << 0),
        (RflagsBits::PF, 1 << 2),
        (RflagsBits::AF, 1 << 4),
        (RflagsBits::ZF, 1 << 6),
        (RflagsBits::SF, 1 << 7),
        (RflagsBits::OF, 1 << 11),
    ];
    let mut undefined = 0u32;
    for ins in Decoder::with_ip(64, window, site, DecoderOptions::NONE) {
        undefined = (undefined & !ins.rflags_modified()) | ins.rflags_undefined();
    }
    flags.iter().filter(|(r, _)| undefined & r == 0).map(|(_, e)| e).sum()
}

/// Inside a function the detour steps over the red zone: with every
/// register, the flags the window defines and the 128 bytes below the stack
/// pointer compared (only the words saved below those left out), it behaves
/// as the original, whether it counts in the thread's row or calls the
/// runtime's stub (a `ret` here); and an entry detour's saves would land in
/// the red zone, which the harness sees.
#[test]
fn an_interior_detour_keeps_the_red_zone() {
    let orig = ORIGINS[0];
    let at = orig.wrapping_add_signed(DISTANCES[0]);
    let data = orig - DATA_BELOW;
    let cache = data + 0x3_0000;
    let row = at + 0x2_0000 + 256;
    let stub = at + 0x800;
    let mut spec = DetourSpec {
        probe_index: 5,
        records: Records::COUNT,
        entry_word: 5,
        runtime: Some(tp::arch::RuntimeAddrs {
            entry: 0,
            trampoline: 0,
            unwind: 0,
            rendezvous: 0,
            step: 0,
            trap: 0,
            trap_return: 0,
            entry_ext: 0,
            trampoline_ext: 0,
            exit: 0,
            exit_tail: 0,
            exit_runtime: 0,
            count: stub,
            ctx: 0,
        }),
        flag_addr: orig + 0x2000,
        countdowns_from_counters: 0,
        counters: at + 0x2_0000,
        cache,
        slot_bits: 6,
        stride_shift: 8,
        abi: tp::arch::Abi::C,
        return_saved_below: None,
        operands: None,
        layout: None,
        exit_words: None,
        sp_below_entry: 0,
        go_room_lost: None,
    };
    let with_stub = |d: &tp::arch::Detour| {
        let mut code = d.bytes.clone();
        code.resize((stub - at) as usize, 0xcc);
        code.push(0xc3);
        code
    };
    let mut runs = 0;
    for c in CASES.iter().filter(|c| c.skip.is_empty()) {
        let interior = SitePlan { interior: true, ..plan_at(c, orig) };
        let flags = defined_flags(&interior.window, interior.site);
        for flag_addr in [orig + 0x2000, data + 7] {
            spec.flag_addr = flag_addr;
            let d = detour::build(&interior, at, &spec).unwrap_or_else(|r| panic!("`{}`: {r}", c.asm));
            for entry in [Some(0), None] {
                let mut cmd = vec!["-f".to_string(), format!("{flags:#x}"), "-o".into(), "128".into()];
                if let Some(way) = entry {
                    cmd.extend(["-k".to_string(), format!("{cache:#x},{row:#x},{way}")]);
                }
                let (ok, text) = run_harness_with(orig, &interior.window, at, &with_stub(&d), 48, &cmd);
                assert!(ok, "interior detour of `{}` (flag {flag_addr:#x}, cache entry {entry:?}):\n{text}", c.asm);
                runs += 1;
            }
        }
    }
    assert!(runs > 80, "{runs}");
    // An entry's detour saves into what would be the red zone: the harness sees it.
    let c = CASES.iter().find(|c| c.asm.starts_with("mov rax, qword ptr fs:")).expect("a case without stack writes");
    let entry = plan_at(c, orig);
    let flags = defined_flags(&entry.window, entry.site);
    let d = detour::build(&entry, at, &spec).unwrap();
    let cmd = ["-f".to_string(), format!("{flags:#x}"), "-o".into(), "128".into()];
    let (ok, _) = run_harness_with(orig, &entry.window, at, &with_stub(&d), 48, &cmd);
    assert!(!ok, "an entry detour writes below the stack pointer, and the harness must see it");
}

/// The whole detour (counting prefix, then the relocated window) leaves
/// every register and flag as the original does, whether the probe counts
/// in the thread's row (its entry in the thread cache is there), has the
/// runtime count it (no entry: the runtime's stub is a `ret` here, which
/// counts nothing) or is disabled. Its counters live in the copy's trap
/// region; the words it pushes below the stack pointer are left out of the
/// comparison, and so are the flags the window leaves undefined.
#[test]
fn the_whole_detour_preserves_every_register_and_flag() {
    let mut runs = 0;
    let mut fast = 0;
    for c in CASES.iter().filter(|c| c.skip.is_empty()) {
        for orig in ORIGINS {
            let plan = plan_at(c, orig);
            let at = orig.wrapping_add_signed(DISTANCES[0]);
            let data = orig - DATA_BELOW;
            let cache = data + 0x3_0000;
            let row = at + 0x2_0000 + 256;
            let stub = at + 0x800;
            let flags = defined_flags(&plan.window, plan.site);
            // A byte of int3 (enabled), then a zero byte of the data region (disabled).
            for flag_addr in [orig + 0x2000, data + 7] {
                let spec = DetourSpec {
                    probe_index: 5,
                    records: Records::COUNT,
                    entry_word: 5,
                    runtime: Some(tp::arch::RuntimeAddrs {
                        entry: 0,
                        trampoline: 0,
                        unwind: 0,
                        rendezvous: 0,
                        step: 0,
                        trap: 0,
                        trap_return: 0,
                        entry_ext: 0,
                        trampoline_ext: 0,
                        exit: 0,
                        exit_tail: 0,
                        exit_runtime: 0,
                        count: stub,
                        ctx: 0,
                    }),
                    flag_addr,
                    countdowns_from_counters: 0,
                    counters: at + 0x2_0000,
                    cache,
                    slot_bits: 6,
                    stride_shift: 8,
                    abi: tp::arch::Abi::C,
                    return_saved_below: None,
                    operands: None,
                    layout: None,
                    exit_words: None,
                    sp_below_entry: 0,
                    go_room_lost: None,
                };
                let d = detour::build(&plan, at, &spec).unwrap_or_else(|r| panic!("`{}`: {r}", c.asm));
                let mut code = d.bytes.clone();
                code.resize((stub - at) as usize, 0xcc);
                code.push(0xc3);
                for entry in [Some(0), Some(1), None] {
                    let mut cmd = vec!["-f".to_string(), format!("{flags:#x}")];
                    if let Some(way) = entry {
                        cmd.extend(["-k".to_string(), format!("{cache:#x},{row:#x},{way}")]);
                    }
                    let (ok, text) = run_harness_with(orig, &plan.window, at, &code, 48, &cmd);
                    assert!(
                        ok,
                        "detour of `{}` at {orig:#x} (flag {flag_addr:#x}, cache entry {entry:?}): `{}`\n{text}",
                        c.asm,
                        disassemble(&d.bytes, at).join("; ")
                    );
                    runs += 1;
                    fast += usize::from(entry.is_some() && flag_addr != data + 7);
                }
            }
        }
    }
    assert!(runs >= 300 && fast >= 100, "{runs} {fast}");
}

/// The counting detour of a window counts once per call in the thread's
/// row when the thread cache holds its entry, in either of the two places
/// it may be: the counter, in the data region, is compared after the
/// detour and the original ran from the same states.
#[test]
fn the_detour_counts_in_the_row_its_thread_finds_in_the_cache() {
    let c = &CASES[0];
    let orig = ORIGINS[0];
    let plan = plan_at(c, orig);
    let at = orig.wrapping_add_signed(DISTANCES[0]);
    let data = orig - DATA_BELOW;
    let counters = data + 0x3_8000;
    let spec = DetourSpec {
        probe_index: 5,
        records: Records::COUNT,
        entry_word: 5,
        runtime: Some(tp::arch::RuntimeAddrs {
            entry: 0,
            trampoline: 0,
            unwind: 0,
            rendezvous: 0,
            step: 0,
            trap: 0,
            trap_return: 0,
            entry_ext: 0,
            trampoline_ext: 0,
            exit: 0,
            exit_tail: 0,
            exit_runtime: 0,
            count: at + 0x800,
            ctx: 0,
        }),
        flag_addr: orig + 0x2000,
        countdowns_from_counters: 0,
        counters,
        cache: data + 0x3_0000,
        slot_bits: 6,
        stride_shift: 8,
        abi: tp::arch::Abi::C,
        operands: None,
        layout: None,
        exit_words: None,
        sp_below_entry: 0,
        go_room_lost: None,
        return_saved_below: None,
    };
    let d = detour::build(&plan, at, &spec).unwrap();
    for way in [0, 1] {
        let cmd = ["-k".to_string(), format!("{:#x},{:#x},{way}", data + 0x3_0000, counters + 256)];
        let (ok, text) = run_harness_with(orig, &plan.window, at, &d.bytes, 48, &cmd);
        // The original does not count: the data differs exactly at row 1's counter of probe 5.
        assert!(!ok, "{text}");
        assert!(text.contains(&format!("data@{:#x}", counters + 256 + 5 * 8)), "way {way}: {text}");
    }
}

/// A function's bytes and what follows them, as a planner reads a module.
struct Module {
    at: u64,
    bytes: Vec<u8>,
}

impl tp::arch::Image for Module {
    fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let off = addr.checked_sub(self.at)? as usize;
        self.bytes.get(off..off + len as usize)
    }
    fn is_code(&self, addr: u64) -> bool {
        addr >= self.at && addr < self.at + self.bytes.len() as u64
    }
    fn absolute_code(&self) -> bool {
        false
    }
    fn stored_targets(&self, _: u64, _: u64) -> Vec<u64> {
        Vec::new()
    }
}

/// Exit windows: a function whose last exit's window starts at its first
/// byte, and the bytes after it (padding, or the next function's).
const EXITS: &[(&str, &[u8], &[u8])] = &[
    ("add rsp, 8; pop rbx; pop rbp; ret", &[0x48, 0x83, 0xc4, 0x08, 0x5b, 0x5d, 0xc3], &[0x55]),
    ("mov eax, ebx; pop rbx; ret", &[0x89, 0xd8, 0x5b, 0xc3], &[0x90, 0x55]),
    ("leave; ret", &[0xc9, 0xc3], &[0xcc, 0xcc, 0xcc, 0x55]),
    ("ret 8", &[0xc2, 0x08, 0x00], &[0xcc, 0xcc, 0x55]),
    // A system call's wrapper: the ret between the jae and its target.
    (
        "cmp rax, -0xfff; jae 0x10400009; ret; neg eax; ret",
        &[0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01, 0xc3, 0xf7, 0xd8, 0xc3],
        &[0x55],
    ),
    // Tail calls: direct, through a pointer (the GOT), conditional.
    ("jmp 0x10401005", &[0xe9, 0x00, 0x10, 0x00, 0x00], &[0x55]),
    ("jmp qword ptr [rip - 0xffffe]", &[0xff, 0x25, 0x02, 0x00, 0xf0, 0xff], &[0x55]),
    ("jne 0x10401006; ret", &[0x0f, 0x85, 0x00, 0x10, 0x00, 0x00, 0xc3], &[0xcc, 0xcc, 0xcc, 0xcc]),
];

/// The detour of each exit's window, the call's end recorded before the
/// exit (by a runtime that only returns, here), behaves as the original:
/// every register, the flags, where control goes and memory, but the words
/// the record leaves below the final stack pointer, in the stack the call
/// left.
#[test]
fn exit_windows_behave_like_the_original() {
    use tp::arch::{ExitWords, x86_64::exits};
    let mut failures = Vec::new();
    for &(asm, code, after) in EXITS {
        assert_eq!(disassemble(code, ORIGINS[0]).join("; "), asm, "{code:02x?}");
        for orig in ORIGINS {
            let image = Module { at: orig, bytes: [code, after].concat() };
            let end = orig + code.len() as u64;
            let planned = exits::plan_exits(code, orig, &[(orig, end)], &[], &[], false, &image)
                .unwrap_or_else(|r| panic!("`{asm}`: {r}"));
            let plan = planned
                .iter()
                .filter_map(|e| e.plan.as_ref().ok())
                .find(|p| p.site == orig)
                .unwrap_or_else(|| panic!("`{asm}`: no window at its start: {planned:?}"));
            for d in DISTANCES {
                let at = orig.wrapping_add_signed(d);
                let exit = at + 0x800;
                let spec = DetourSpec {
                    probe_index: 7,
                    records: Records { exit: true, ..Records::COUNT },
                    entry_word: 0,
                    runtime: Some(tp::arch::RuntimeAddrs {
                        entry: 0,
                        trampoline: 0,
                        unwind: 0,
                        rendezvous: 0,
                        step: 0,
                        trap: 0,
                        trap_return: 0,
                        entry_ext: 0,
                        trampoline_ext: 0,
                        exit,
                        exit_tail: exit,
                        exit_runtime: exit,
                        count: 0,
                        ctx: 0,
                    }),
                    flag_addr: 0,
                    countdowns_from_counters: 0,
                    counters: 0,
                    cache: 0,
                    slot_bits: 6,
                    stride_shift: 8,
                    abi: tp::arch::Abi::C,
                    return_saved_below: None,
                    operands: None,
                    layout: None,
                    exit_words: Some(ExitWords { ret: 3, tail: 3 | 1 << 21, runtime: false }),
                    sp_below_entry: 0,
                    go_room_lost: None,
                };
                let d = detour::build(plan, at, &spec).unwrap_or_else(|r| panic!("`{asm}` at {at:#x}: {r}"));
                let mut bytes = d.bytes.clone();
                bytes.resize((exit - at) as usize, 0xcc);
                // The exit routine returns with `ret 8`, the word dropped.
                bytes.extend_from_slice(&[0xc2, 0x08, 0x00]);
                let extra = ["-u".to_string(), "32".to_string()];
                let (ok, text) = run_harness_with(orig, &plan.window, at, &bytes, 0, &extra);
                if !ok {
                    let got = disassemble(&d.bytes, at).join("; ");
                    failures.push(format!("`{asm}` at {orig:#x} -> {at:#x} (`{got}`):\n{text}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} runs differ:\n{}", failures.len(), failures.join("\n"));
}
