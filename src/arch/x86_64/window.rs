//! Choosing an x86-64 patch window and proving it safe.
//!
//! The window is the shortest run of whole instructions, starting after an
//! `endbr64` landing pad, that covers the 5-byte `jmp rel32`. It is refused
//! when it would pass the function's end, when it holds an instruction that
//! cannot run elsewhere or a call/syscall before its last instruction (a
//! thread inside the callee would return into the overwritten bytes), and
//! when any direct branch of the whole function, or any extra target
//! (landing pads, jumps from split-off `.cold` parts), enters bytes 1..n-1
//! of the window; so does an address of the interior that the function
//! takes (`lea rax, [rip + x]`) or that relocated data holds.
//!
//! An indirect jump in the function refuses windows of more than one
//! instruction unless its possible targets inside the function are known:
//! with the module at hand, [`taken`] lists every code address the function
//! can form (RIP-relative references, switch tables, pointers stored in
//! data, absolute immediates in position-dependent code).

use super::decode::{Class, Insn, decode};
use super::{PATCH_LEN, exits, liveness, relocate, taken};
use crate::arch::{Image, Refusal, SitePlan, WindowInsn};

/// Plans the probe of the function `code` at `function` from its bytes alone;
/// see the module doc.
pub fn plan(code: &[u8], function: u64, extra_targets: &[u64]) -> Result<SitePlan, Refusal> {
    plan_with(code, function, None, extra_targets, None)
}

/// Plans the probe with the module around the function at hand.
pub fn plan_in(code: &[u8], function: u64, extra_targets: &[u64], image: &dyn Image) -> Result<SitePlan, Refusal> {
    plan_with(code, function, None, extra_targets, Some(image))
}

/// Plans the probe with the module at hand, its window reaching `end` at
/// least (see [`crate::arch::Arch::plan_to`]).
pub fn plan_to(
    code: &[u8],
    function: u64,
    extra_targets: &[u64],
    image: &dyn Image,
    end: u64,
) -> Result<SitePlan, Refusal> {
    plan_reaching(code, function, None, extra_targets, Some(image), end)
}

/// Plans a probe at `at` inside the function, with the module at hand: the
/// same window and checks as at the entry, from the instruction that starts
/// at `at` (after it, if it is an `endbr64`, which stays in place).
pub fn plan_at(
    code: &[u8],
    function: u64,
    at: u64,
    extra_targets: &[u64],
    image: &dyn Image,
) -> Result<SitePlan, Refusal> {
    plan_with(code, function, Some(at), extra_targets, Some(image))
}

fn plan_with(
    code: &[u8],
    function: u64,
    at: Option<u64>,
    extra_targets: &[u64],
    image: Option<&dyn Image>,
) -> Result<SitePlan, Refusal> {
    plan_reaching(code, function, at, extra_targets, image, 0)
}

/// [`plan_with`], the window reaching `end` at least.
fn plan_reaching(
    code: &[u8],
    function: u64,
    at: Option<u64>,
    extra_targets: &[u64],
    image: Option<&dyn Image>,
    end: u64,
) -> Result<SitePlan, Refusal> {
    let insns = decode(code, function);
    let func_end = function + code.len() as u64;
    let mut next = match at {
        None => 0,
        Some(at) => boundary(&insns, code, function, at)?,
    };
    let mut site = insns.get(next).map_or(function, |i| i.addr);
    if insns.get(next).is_some_and(|i| i.class == Class::LandingPad) {
        site = insns[next].end();
        next += 1;
    }
    // The entry's own site (after its `endbr64`) is the entry.
    let entry_pad = insns.first().filter(|i| i.class == Class::LandingPad).map(Insn::end);
    let interior = at.is_some_and(|a| a != function && Some(a) != entry_pad);
    let have = func_end - site;
    // A function shorter than the patch may take the padding after it, if
    // it never runs on past its end (see `padding_for`).
    let too_short = Refusal::TooShort { have, need: PATCH_LEN as u64 };
    let padding = match have < PATCH_LEN as u64 {
        true => padding_for(&insns, func_end, PATCH_LEN as u64 - have, image).ok_or(too_short)?,
        false => Vec::new(),
    };
    let padded: Vec<u8>;
    let (code, insns) = match padding.is_empty() {
        true => (code, insns),
        false => {
            padded = [code, &padding[..]].concat();
            let mut all = insns;
            all.extend(decode(&padding, func_end));
            (&padded[..], all)
        }
    };

    let mut window: Vec<&Insn> = Vec::new();
    let mut len = 0u64;
    let mut live = true;
    let need = (PATCH_LEN as u64).max(end.saturating_sub(site));
    while len < need {
        let Some(insn) = insns.get(next) else { return Err(cut_or_unknown(code, function, site + len)) };
        next += 1;
        if live {
            match insn.class {
                Class::Unsafe => return Err(Refusal::Unsafe { mnemonic: insn.mnemonic.clone(), at: insn.addr }),
                Class::LandingPad => {
                    return Err(Refusal::EntersWindow { at: insn.addr, from: "an indirect branch (`endbr64`)".into() });
                }
                Class::Call | Class::IndirectCall | Class::Syscall if len + (insn.len as u64) < need => {
                    return Err(Refusal::CallInWindow { mnemonic: insn.mnemonic.clone(), at: insn.addr });
                }
                Class::Ret | Class::Jump | Class::IndirectJump | Class::IndirectJumpRip => live = false,
                _ => {}
            }
        }
        window.push(insn);
        len += insn.len as u64;
    }

    // The whole function must decode, or the scan below could miss a branch.
    let decoded_end = insns.iter().take_while(|i| i.addr < func_end).last().map_or(function, Insn::end);
    if decoded_end < func_end {
        return Err(Refusal::Undecodable { at: decoded_end });
    }
    let inside = |t: u64| t > site && t < site + len;
    for insn in &insns {
        if let Some(t) = insn.target
            && inside(t)
        {
            return Err(Refusal::BranchIntoWindow { from: insn.addr });
        }
        if let Some(t) = insn.rip_target
            && inside(t)
        {
            return Err(Refusal::EntersWindow { at: t, from: format!("the code address taken at {:#x}", insn.addr) });
        }
    }
    if let Some(&t) = extra_targets.iter().find(|&&t| inside(t)) {
        return Err(Refusal::EntersWindow { at: t, from: "a jump from outside the function".into() });
    }
    if let Some(image) = image
        && let Some(&t) = image.stored_targets(site + 1, site + len).first()
    {
        return Err(Refusal::EntersWindow { at: t, from: "a code pointer stored in data".into() });
    }
    if let Some(jump) = insns.iter().find(|i| i.class == Class::IndirectJump)
        && window.len() > 1
    {
        let Some(image) = image else { return Err(Refusal::IndirectJump { at: jump.addr }) };
        if taken::code_addresses(&insns, function, func_end, image).into_iter().any(inside) {
            return Err(Refusal::IndirectJump { at: jump.addr });
        }
    }

    let parts = [(function, func_end)];
    let body: Vec<Insn> = insns.iter().take_while(|i| i.addr < func_end).cloned().collect();
    let exits = match image {
        Some(image) => exits::exits_in(&exits::Function::new(function, func_end, &parts, &body, image), &window, site),
        None => Vec::new(),
    };
    let start = (site - function) as usize;
    let plan = SitePlan {
        function,
        site,
        prefix: code[..start].to_vec(),
        window: code[start..start + len as usize].to_vec(),
        insns: window
            .iter()
            .map(|i| WindowInsn { offset: (i.addr - site) as u32, len: i.len, mnemonic: i.mnemonic.clone() })
            .collect(),
        dead: liveness::dead_at(&code[start..], site).bits(),
        interior,
        exits,
    };
    // Prove the window relocates, at a distance any detour may have; the real
    // detour address is checked again when the detour is built.
    relocate::relocate(&plan, site.wrapping_add(1 << 30))?;
    Ok(plan)
}

/// The padding after a function that ends at `end` (decoded as `insns`),
/// which a window may take: none (None) unless the function's last
/// instruction leaves it for good, so that nothing runs on into the padding
/// (a branch or symbol landing there is refused by the window's checks).
fn padding_for(insns: &[Insn], end: u64, need: u64, image: Option<&dyn Image>) -> Option<Vec<u8>> {
    let image = image?;
    let last = insns.iter().take_while(|i| i.addr < end).last()?;
    let transfer = matches!(last.class, Class::Ret | Class::Jump | Class::IndirectJump | Class::IndirectJumpRip);
    if last.end() != end || !transfer {
        return None;
    }
    let padding = image.bytes(end, exits::padding_after(end, image))?;
    // Whole instructions of it, as many as cover what the window needs.
    let mut len = 0;
    for i in decode(padding, end) {
        if len >= need {
            break;
        }
        len += i.len as u64;
    }
    (len >= need).then(|| padding[..len as usize].to_vec())
}

/// The index of the instruction that starts at `at`, or why there is none:
/// `at` outside the function, between two instructions' starts, or past
/// where the function decodes.
fn boundary(insns: &[Insn], code: &[u8], function: u64, at: u64) -> Result<usize, Refusal> {
    let end = function + code.len() as u64;
    if at < function || at >= end {
        return Err(Refusal::PastEnd { at });
    }
    let k = insns.partition_point(|i| i.addr < at);
    if insns.get(k).is_some_and(|i| i.addr == at) {
        return Ok(k);
    }
    let before = k.checked_sub(1).map(|b| insns[b].addr);
    let after = insns.get(k).map(|i| i.addr);
    if after.is_none() && insns.last().is_none_or(|i| i.end() <= at) {
        return Err(Refusal::Undecodable { at: insns.last().map_or(function, Insn::end) });
    }
    Err(Refusal::NotBoundary { at, around: (before, after) })
}

/// Why decoding stopped at `at` inside the window: an instruction that the
/// function's end cuts short, or bytes the decoder does not know.
fn cut_or_unknown(code: &[u8], function: u64, at: u64) -> Refusal {
    let rest = &code[(at - function) as usize..];
    let mut padded = rest.to_vec();
    padded.extend([0u8; 15]);
    match decode(&padded, at).first() {
        Some(i) if i.len as usize > rest.len() => Refusal::PastEnd { at },
        _ => Refusal::Undecodable { at },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Image;

    const F: u64 = 0x401000;

    fn refusal(code: &[u8]) -> Refusal {
        plan(code, F, &[]).unwrap_err()
    }

    #[test]
    fn one_long_instruction_is_the_whole_window() {
        // movabs rax, 0x9e3779b97f4a7c15; imul rax, rdi; ret
        let code = [0x48, 0xb8, 0x15, 0x7c, 0x4a, 0x7f, 0xb9, 0x79, 0x37, 0x9e, 0x48, 0x0f, 0xaf, 0xc7, 0xc3];
        let p = plan(&code, F, &[]).unwrap();
        assert_eq!((p.site, p.len()), (F, 10));
        assert_eq!(p.summary(), "movabs");
        assert_eq!(p.interior_boundaries().count(), 0);
    }

    #[test]
    fn window_starts_after_endbr64() {
        // endbr64; push rbp; mov rbp, rsp; push rbx; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x53, 0xc3];
        let p = plan(&code, F, &[]).unwrap();
        assert_eq!(p.site, F + 4);
        assert_eq!(p.window, [0x55, 0x48, 0x89, 0xe5, 0x53]);
        assert_eq!(p.summary(), "push, mov, push");
        assert_eq!(p.interior_boundaries().collect::<Vec<_>>(), [F + 5, F + 8]);
    }

    #[test]
    fn too_short_functions_are_refused() {
        assert_eq!(refusal(&[0x31, 0xc0, 0xc3]), Refusal::TooShort { have: 3, need: 5 }); // xor eax,eax; ret
        assert_eq!(refusal(&[0xf3, 0x0f, 0x1e, 0xfa, 0x31, 0xc0, 0xc3]), Refusal::TooShort { have: 3, need: 5 });
    }

    #[test]
    fn call_before_the_window_end_is_refused() {
        // call +0; nop; nop; ...: the call ends at 5 = the window end, so it is the last and allowed.
        assert!(plan(&[0xe8, 0, 0, 0, 0, 0xc3], F, &[]).is_ok());
        // push rbp; call rax; ...: call ends at 3 < 5.
        let r = refusal(&[0x55, 0xff, 0xd0, 0x90, 0x90, 0xc3]);
        assert!(matches!(r, Refusal::CallInWindow { at, .. } if at == F + 1), "{r:?}");
        // mov eax, edi; syscall; ret: syscall ends at 4 < 5.
        assert!(matches!(refusal(&[0x89, 0xf8, 0x0f, 0x05, 0xc3]), Refusal::CallInWindow { .. }));
    }

    #[test]
    fn traps_are_refused() {
        let r = refusal(&[0xcc, 0x90, 0x90, 0x90, 0x90, 0xc3]);
        assert_eq!(r, Refusal::Unsafe { mnemonic: "int3".into(), at: F });
        assert!(matches!(refusal(&[0x90, 0x0f, 0x0b, 0x90, 0x90, 0xc3]), Refusal::Unsafe { .. }));
    }

    #[test]
    fn branch_into_the_window_is_refused() {
        // 0: push rbp; 1: mov rbp, rsp; 4: push rbx; 5: jne 1 (75 fa); 7: ret
        let r = refusal(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0x75, 0xfa, 0xc3]);
        assert_eq!(r, Refusal::BranchIntoWindow { from: F + 5 });
        // A branch back to the site itself is fine (it re-enters the probe).
        assert!(plan(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0x75, 0xf9, 0xc3], F, &[]).is_ok());
    }

    #[test]
    fn branch_inside_the_window_into_the_window_is_refused() {
        // 0: test edi, edi; 2: je 2 (74 fe: jumps to itself, inside the window); 4: nop; 5: ret
        let r = refusal(&[0x85, 0xff, 0x74, 0xfe, 0x90, 0xc3]);
        assert_eq!(r, Refusal::BranchIntoWindow { from: F + 2 });
    }

    #[test]
    fn indirect_jump_refuses_multi_instruction_windows_only() {
        // push rbp; mov rbp,rsp; push rbx; jmp rax
        assert_eq!(refusal(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0xff, 0xe0]), Refusal::IndirectJump { at: F + 5 });
        // mov eax, 1 (5 bytes, one instruction); jmp rax
        assert!(plan(&[0xb8, 1, 0, 0, 0, 0xff, 0xe0], F, &[]).is_ok());
        // A tail call through the GOT (jmp [rip+x]) is a single pointer, not a table.
        assert!(plan(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0xff, 0x25, 0, 0, 0, 0], F, &[]).is_ok());
    }

    #[test]
    fn extra_targets_inside_the_window_are_refused() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0xc3];
        let from = "a jump from outside the function".to_string();
        assert_eq!(plan(&code, F, &[F + 4]).unwrap_err(), Refusal::EntersWindow { at: F + 4, from });
        assert!(plan(&code, F, &[F, F + 5]).is_ok());
    }

    #[test]
    fn ret_ends_what_runs_but_the_window_still_covers_five_bytes() {
        // test edi,edi; je +2; ret; mov eax, 1; ret   (the je jumps over the ret, to offset 5)
        let code = [0x85, 0xff, 0x74, 0x01, 0xc3, 0xb8, 1, 0, 0, 0, 0xc3];
        let p = plan(&code, F, &[]).unwrap();
        assert_eq!(p.summary(), "test, je, ret");
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn undecodable_code_is_refused() {
        // push rbp; mov rbp, rsp; push rbx; then an invalid byte 0x06 in the body
        let r = refusal(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0x06, 0xc3]);
        assert_eq!(r, Refusal::Undecodable { at: F + 5 });
    }

    #[test]
    fn window_passing_the_function_end_is_refused() {
        // push rbx; then movabs rax, imm64 cut after 4 of its 10 bytes by the symbol size.
        let r = refusal(&[0x53, 0x48, 0xb8, 0x01, 0x02]);
        assert_eq!(r, Refusal::PastEnd { at: F + 1 });
    }

    #[test]
    fn endbr64_inside_the_window_is_refused() {
        // push rbx; endbr64; ret: an indirect branch may land at offset 1.
        let r = refusal(&[0x53, 0xf3, 0x0f, 0x1e, 0xfa, 0xc3]);
        assert!(matches!(r, Refusal::EntersWindow { at, .. } if at == F + 1), "{r:?}");
    }

    /// A module whose data holds a switch table at 0x8000 with `entries`
    /// (offsets from the table) and stores `pointers`.
    struct Module {
        table: Vec<u8>,
        pointers: Vec<u64>,
        absolute_code: bool,
    }

    impl Image for Module {
        fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
            let off = addr.checked_sub(0x8000)? as usize;
            self.table.get(off..off + len as usize)
        }
        fn is_code(&self, addr: u64) -> bool {
            (F..F + 0x1000).contains(&addr)
        }
        fn absolute_code(&self) -> bool {
            self.absolute_code
        }
        fn stored_targets(&self, lo: u64, hi: u64) -> Vec<u64> {
            self.pointers.iter().copied().filter(|&t| lo <= t && t < hi).collect()
        }
    }

    fn module(targets: &[u64]) -> Module {
        let mut table: Vec<u8> = targets.iter().flat_map(|&t| ((t as i64 - 0x8000) as i32).to_le_bytes()).collect();
        table.extend([0xff; 4]); // not code: ends the table
        Module { table, pointers: vec![], absolute_code: false }
    }

    // 0: push rbp; 1: mov rbp, rsp; 4: push rbx; 5: lea rdx, [rip + T]; 12: movsxd rax, [rdx + rdi*4];
    // 16: add rax, rdx; 19: jmp rax; 21: ret
    fn switch(table_at: u64) -> Vec<u8> {
        let disp = (table_at as i64 - (F as i64 + 12)) as i32;
        let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x8d, 0x15];
        code.extend(disp.to_le_bytes());
        code.extend([0x48, 0x63, 0x04, 0xba, 0x48, 0x01, 0xd0, 0xff, 0xe0, 0xc3]);
        code
    }

    #[test]
    fn switch_table_outside_the_window_is_accepted_with_the_module() {
        let code = switch(0x8000);
        assert_eq!(refusal(&code), Refusal::IndirectJump { at: F + 19 }, "bytes alone: targets unknown");
        let p = plan_in(&code, F, &[], &module(&[F + 21, F + 5, F])).unwrap();
        assert_eq!(p.summary(), "push, mov, push");
    }

    #[test]
    fn switch_table_into_the_window_is_refused() {
        let r = plan_in(&switch(0x8000), F, &[], &module(&[F + 21, F + 4])).unwrap_err();
        assert_eq!(r, Refusal::IndirectJump { at: F + 19 });
    }

    #[test]
    fn stored_pointers_and_absolute_immediates_into_the_window_are_refused() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0xc3];
        let mut m = module(&[]);
        m.pointers = vec![F + 1];
        let r = plan_in(&code, F, &[], &m).unwrap_err();
        assert!(matches!(r, Refusal::EntersWindow { at, .. } if at == F + 1), "{r:?}");
        // Position-dependent: mov eax, F + 4 forms an interior address; jmp rax may go there.
        let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53, 0xb8];
        code.extend(((F + 4) as u32).to_le_bytes());
        code.extend([0xff, 0xe0]);
        let mut m = module(&[]);
        assert!(plan_in(&code, F, &[], &m).is_ok(), "PIC: an immediate is not an address");
        m.absolute_code = true;
        assert_eq!(plan_in(&code, F, &[], &m).unwrap_err(), Refusal::IndirectJump { at: F + 10 });
    }

    /// A module with nothing stored in data.
    fn bare() -> Module {
        module(&[])
    }

    #[test]
    fn interior_sites_are_planned_from_their_instruction() {
        // 0: push rbp; 1: mov rbp, rsp; 4: push rbx; 5: mov eax, 7; 10: pop rbx; 11: pop rbp; 12: ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0xb8, 7, 0, 0, 0, 0x5b, 0x5d, 0xc3];
        let p = plan_at(&code, F, F + 5, &[], &bare()).unwrap();
        assert_eq!((p.site, p.len(), p.interior), (F + 5, 5, true));
        assert_eq!(p.summary(), "mov");
        let p = plan_at(&code, F, F + 1, &[], &bare()).unwrap();
        assert_eq!((p.summary().as_str(), p.interior), ("mov, push, mov", true));
        // The entry is the entry.
        let p = plan_at(&code, F, F, &[], &bare()).unwrap();
        assert!(!p.interior && p.site == F);
        // Between two instructions' starts, past the end, too close to the end.
        assert_eq!(
            plan_at(&code, F, F + 2, &[], &bare()).unwrap_err(),
            Refusal::NotBoundary { at: F + 2, around: (Some(F + 1), Some(F + 4)) }
        );
        assert!(matches!(plan_at(&code, F, F + 13, &[], &bare()).unwrap_err(), Refusal::PastEnd { .. }));
        assert_eq!(plan_at(&code, F, F + 10, &[], &bare()).unwrap_err(), Refusal::TooShort { have: 3, need: 5 });
    }

    #[test]
    fn interior_windows_get_the_same_checks() {
        // 0: test edi, edi; 2: je 9; 4: mov eax, 1; 9: add eax, 2; 12: nop; 13: ret
        let code = [0x85, 0xff, 0x74, 0x05, 0xb8, 1, 0, 0, 0, 0x83, 0xc0, 0x02, 0x90, 0xc3];
        // The je's target is the end of the window 2..9, not inside it.
        assert_eq!(plan_at(&code, F, F + 2, &[], &bare()).unwrap().summary(), "je, mov");
        assert_eq!(plan_at(&code, F, F + 9, &[], &bare()).unwrap().summary(), "add, nop, ret");
        // Extra targets refuse as at the entry: one at 12 is inside 9..14.
        assert!(matches!(plan_at(&code, F, F + 9, &[F + 12], &bare()).unwrap_err(), Refusal::EntersWindow { .. }));
        // 0: jmp 5; 2: nop; 3: push rbx; 4: push rbp; 5: push r12; 7: nop; 8: ret. The window 2..7
        // holds the jmp's target.
        let code = [0xeb, 0x03, 0x90, 0x53, 0x55, 0x41, 0x54, 0x90, 0xc3];
        assert_eq!(plan_at(&code, F, F + 2, &[], &bare()).unwrap_err(), Refusal::BranchIntoWindow { from: F });
        assert!(plan_at(&code, F, F + 5, &[], &bare()).is_err(), "too short: 4 bytes left");
    }

    #[test]
    fn an_endbr64_inside_stays_in_place() {
        // 0: push rbx; 1: endbr64; 5: mov eax, 1; 10: pop rbx; 11: ret
        let code = [0x53, 0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 1, 0, 0, 0, 0x5b, 0xc3];
        let p = plan_at(&code, F, F + 1, &[], &bare()).unwrap();
        assert_eq!((p.site, p.summary().as_str(), p.interior), (F + 5, "mov", true));
    }

    #[test]
    fn a_five_byte_nop_is_a_site_with_nothing_to_relocate() {
        // endbr64; nop dword [rax + rax]; push rbp; ret (-fpatchable-function-entry, -mnop-mcount)
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0xc3];
        let p = plan(&code, F, &[]).unwrap();
        assert!(p.is_nop_site());
        assert_eq!((p.site, p.len()), (F + 4, 5));
        assert!(!plan(&[0x55, 0x48, 0x89, 0xe5, 0x53, 0xc3], F, &[]).unwrap().is_nop_site());
    }

    #[test]
    fn taking_the_address_of_the_interior_is_refused() {
        // push rbp; mov rbp, rsp; push rbx; lea rax, [rip - 11] (-> F + 1); ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x8d, 0x05, 0xf5, 0xff, 0xff, 0xff, 0xc3];
        let r = refusal(&code);
        assert!(matches!(r, Refusal::EntersWindow { at, .. } if at == F + 1), "{r:?}");
    }

    /// A module with `after` at `end`, the function's end.
    struct Padded {
        end: u64,
        after: Vec<u8>,
    }

    impl Image for Padded {
        fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
            let off = addr.checked_sub(self.end)? as usize;
            self.after.get(off..off + len as usize)
        }
        fn is_code(&self, addr: u64) -> bool {
            (F..F + 0x1000).contains(&addr)
        }
        fn absolute_code(&self) -> bool {
            false
        }
        fn stored_targets(&self, _: u64, _: u64) -> Vec<u64> {
            Vec::new()
        }
    }

    #[test]
    fn a_function_shorter_than_the_patch_takes_the_padding_after_it() {
        use crate::arch::{ExitInsn, ExitKind};
        // xor eax, eax; ret, then a 4-byte nop and int3s: the window is the
        // function and the nop, and the ret is an exit of the window.
        let code = [0x31, 0xc0, 0xc3];
        let m = Padded { end: F + 3, after: vec![0x0f, 0x1f, 0x40, 0x00, 0xcc, 0xcc] };
        let p = plan_in(&code, F, &[], &m).unwrap();
        assert_eq!((p.site, p.len(), p.summary().as_str()), (F, 7, "xor, ret, nop"));
        assert_eq!(p.exits, [ExitInsn { offset: 2, kind: ExitKind::Return }]);
        // int3 padding, taken one instruction at a time.
        let m = Padded { end: F + 3, after: vec![0xcc; 12] };
        assert_eq!(plan_in(&code, F, &[], &m).unwrap().len(), 5);
        // Not past a function that may run on (its last instruction is no
        // ret or jmp), nor over bytes that are not padding.
        let m = Padded { end: F + 3, after: vec![0x55, 0x90, 0x90] };
        assert_eq!(plan_in(&code, F, &[], &m).unwrap_err(), Refusal::TooShort { have: 3, need: 5 });
        let m = Padded { end: F + 3, after: vec![0x90; 8] };
        let r = plan_in(&[0x31, 0xc0, 0x90], F, &[], &m).unwrap_err();
        assert_eq!(r, Refusal::TooShort { have: 3, need: 5 });
        // A branch into the window still refuses it: here one to the ret.
        let m = Padded { end: F + 3, after: vec![0x90; 8] };
        assert!(matches!(plan_in(&code, F, &[F + 2], &m).unwrap_err(), Refusal::EntersWindow { .. }));
    }

    #[test]
    fn exits_among_the_windows_instructions_are_named() {
        use crate::arch::{ExitInsn, ExitKind};
        // test edi, edi; jne F + 0x100 (a conditional tail call, out of the function); ret
        let code = [0x85, 0xff, 0x0f, 0x85, 0xfa, 0x00, 0x00, 0x00, 0xc3];
        let p = plan_in(&code, F, &[], &bare()).unwrap();
        assert_eq!(p.summary(), "test, jne");
        assert_eq!(p.exits, [ExitInsn { offset: 2, kind: ExitKind::CondJump }]);
        // A jne inside the function is no exit.
        let code = [0x85, 0xff, 0x0f, 0x85, 0x01, 0x00, 0x00, 0x00, 0xc3, 0xc3];
        assert!(plan_in(&code, F, &[], &bare()).unwrap().exits.is_empty());
    }
}
