//! The x86-64 planner, detour builder and patch on arbitrary code bytes:
//! decoding, the window, the whole-function branch scan, relocation by
//! iced's BlockEncoder, for counting, event and sampling probes. Any panic
//! is a bug: a function tp cannot handle must be refused with a reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tp::arch::x86_64::X86_64;
use tp::arch::{Arch, DetourSpec, RuntimeAddrs};
use tp::probe::install::records_of;
use tp::probe::layout::{entry_word, kind};

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
    let Ok(plan) = X86_64::plan(code, function, &[]) else { return };
    let what = [kind::COUNT, kind::ARGS, kind::RET, kind::ARGS | kind::RET, kind::SAMPLE][(at >> 48) as usize % 5];
    let runtime = (what & (kind::ARGS | kind::RET) != 0).then(|| RuntimeAddrs {
        entry: detour.wrapping_add(0x100),
        trampoline: detour.wrapping_add(0x800),
        unwind: detour.wrapping_add(0x600),
        entry_ext: detour.wrapping_add(0x200),
        trampoline_ext: detour.wrapping_add(0x900),
        ctx: 0x7000_0100,
    });
    let spec = DetourSpec {
        probe_index: 3,
        records: records_of(what),
        entry_word: entry_word(3, what),
        runtime,
        flag_addr: 0x7000_0000,
        counters: 0x7000_1000,
        countdowns_from_counters: 0x8000,
        slot_bits: 6,
        stride_shift: 15,
        abi: tp::arch::Abi::C,
    };
    if let Ok(d) = X86_64::build_detour(&plan, detour, &spec) {
        assert!(!d.bytes.is_empty());
        let _ = X86_64::patch_bytes(&plan, detour);
    }
});
