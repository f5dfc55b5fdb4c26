//! The x86-64 planner, detour builder and patch on arbitrary code bytes:
//! decoding, the window, the whole-function branch scan, relocation by
//! iced's BlockEncoder, for counting, event and sampling probes; at the
//! entry and inside the function (a static probe's operands loaded there);
//! the windows at the function's exits and their detours.
//! Any panic is a bug: a function tp cannot handle must be refused with a
//! reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::arch::x86_64::X86_64;
use tp::arch::{Arch, DetourSpec, ExitWords, Image, Operand, OperandLoc, Operands, Records, RuntimeAddrs, RuntimeLayout};
use tp::probe::install::records_of;
use tp::probe::layout::{entry_word, kind};

/// A module with nothing in it but the function.
struct Bare;

impl Image for Bare {
    fn bytes(&self, _: u64, _: u64) -> Option<&[u8]> {
        None
    }
    fn is_code(&self, _: u64) -> bool {
        false
    }
    fn absolute_code(&self) -> bool {
        false
    }
    fn stored_targets(&self, _: u64, _: u64) -> Vec<u64> {
        Vec::new()
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    // The first 8 bytes pick where the function and its detour are, within
    // and beyond rel32 reach, and what the probe records; the rest is code.
    let at = u64::from_le_bytes(data[..8].try_into().unwrap());
    let function = 0x5555_5555_0000u64 + (at & 0xffff);
    let detour = function.wrapping_add(((at >> 16) as i32 as i64 as u64) & !0xf);
    let code = &data[8..];
    // Bit 40 puts the site inside the function, bits 41.. say where.
    let plan = if at >> 40 & 1 == 0 {
        X86_64::plan(code, function, &[])
    } else {
        let site = function + (at >> 41) % code.len() as u64;
        X86_64::plan_at(code, function, site, &[], &Bare)
    };
    let Ok(plan) = plan else { return };
    // Every exit's window, and its detour, for a probe that times its calls there.
    let words = ExitWords { ret: 3, tail: 3 | 1 << 21, runtime: false };
    let taken = [(plan.site, plan.site + plan.len() as u64)];
    let end = function + code.len() as u64;
    if let Ok(exits) = X86_64::plan_exits(code, function, &[(function, end)], &[], &taken, false, &Bare) {
        for p in exits.iter().filter_map(|e| e.plan.as_ref().ok()) {
            let rt = RuntimeAddrs { entry: 0, trampoline: 0, unwind: 0, rendezvous: 0, step: 0, trap: 0, trap_return: 0, count: 0, entry_ext: 0, trampoline_ext: 0, exit: detour, exit_tail: detour, exit_runtime: detour, ctx: 0 };
            let spec = DetourSpec {
                probe_index: 4,
                records: Records { exit: true, ..Records::COUNT },
                entry_word: 0,
                runtime: Some(rt),
                flag_addr: 0,
                counters: 0,
                cache: 0,
                countdowns_from_counters: 0,
                slot_bits: 6,
                stride_shift: 15,
                abi: tp::arch::Abi::C,
                return_saved_below: None,
                operands: None,
                layout: None,
                exit_words: Some(words),
                sp_below_entry: 0,
                go_room_lost: None,
            };
            if let Ok(d) = X86_64::build_detour(p, detour.wrapping_add(0x1000), &spec) {
                assert!(!d.bytes.is_empty() && d.map_pc(p.exits[0].offset).is_some());
            }
        }
    }
    // Operands of every kind, from the code's bytes.
    let ops: Vec<Operand> = code
        .chunks(3)
        .take(7)
        .map(|c| {
            let r = c[0] & 15;
            let loc = match c.get(1).copied().unwrap_or(0) % 5 {
                0 => OperandLoc::Register(r),
                1 => OperandLoc::Memory {
                    base: (r != 5).then_some(r),
                    index: c.get(2).map(|&i| (i & 15, 1 << (i >> 6))),
                    disp: i64::from(c.get(2).copied().unwrap_or(0) as i8) << (at >> 56 & 31),
                },
                2 => OperandLoc::Absolute(at),
                3 => OperandLoc::Constant(at as i64),
                _ => OperandLoc::Unreadable,
            };
            Operand { size: 1 << (c[0] >> 6), signed: c[0] & 16 != 0, loc }
        })
        .collect();
    let what = [kind::COUNT, kind::ARGS, kind::RET, kind::ARGS | kind::RET, kind::SAMPLE][(at >> 48) as usize % 5];
    // Every x86-64 detour may call the runtime (counting calls tp_count).
    let runtime = Some(RuntimeAddrs {
        entry: detour.wrapping_add(0x100),
        trampoline: detour.wrapping_add(0x800),
        unwind: detour.wrapping_add(0x600),
        count: detour.wrapping_add(0x700),
        entry_ext: detour.wrapping_add(0x200),
        trampoline_ext: detour.wrapping_add(0x880),
        exit: detour.wrapping_add(0x900),
        exit_tail: detour.wrapping_add(0x900),
        exit_runtime: detour.wrapping_add(0x900),
        rendezvous: detour.wrapping_add(0xa00),
        step: detour.wrapping_add(0xa40),
        trap: 0,
        trap_return: 0,
        ctx: 0x7000_0100,
    });
    let spec = DetourSpec {
        probe_index: 3,
        records: records_of(what),
        entry_word: entry_word(3, what),
        runtime,
        flag_addr: 0x7000_0000,
        counters: 0x7000_1000,
        cache: 0x7100_0020,
        countdowns_from_counters: 0x8000,
        slot_bits: 6,
        stride_shift: 15,
        abi: tp::arch::Abi::C,
        return_saved_below: None,
        operands: (what & kind::ARGS != 0 && plan.interior).then(|| Operands::new(&ops)),
        layout: (at >> 40 & 1 == 1).then_some(RuntimeLayout { ring_mask: 0x7ff, event_size: 64, thread_shadow: 128, ..RuntimeLayout::default() }),
        // Bit 39: a probe that times its calls at the function's exits.
        exit_words: (at >> 39 & 1 == 1).then_some(words),
        sp_below_entry: 0,
        go_room_lost: None,
    };
    if let Ok(d) = X86_64::build_detour(&plan, detour, &spec) {
        assert!(!d.bytes.is_empty());
        let _ = X86_64::patch_bytes(&plan, detour);
    }
});
