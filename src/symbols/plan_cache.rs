//! The entry plans of a module's functions kept across sessions: planning
//! decodes every instruction of a function (to check that nothing branches
//! into its window), which is most of the time an attach to every function
//! of a large program takes; a later attach to the same file reads the plan
//! instead.
//!
//! **Key.** The entry belongs to the module's analysis ([`super::saved`]):
//! its key is that analysis's key (tp's own build and the file's identity)
//! followed by the places of the file's debug file, whose symbols planning
//! uses. A plan is kept with the hash and length of the function's bytes
//! it was made from and is used only for the same bytes, with its window
//! and prefix equal to those bytes where they lie in them.
//!
//! **Untrusted.** The entry is decoded as untrusted input: the index must be
//! strictly sorted and every record in bounds; a record is decoded when it
//! is asked for, with every count and offset bounded, and any flaw is a
//! miss (the function is planned again).
//!
//! **When.** The entry is read on the module's first plan; plans made in a
//! session are queued to be saved with what the entry held, in the
//! background ([`super::saving`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::Function;
use super::saved::{Key, Place, store};
use crate::arch::{ExitInsn, ExitKind, MAX_WINDOW, SitePlan, WindowInsn};
use crate::cache::{Bad, Reader, Writer, hash64, name_for};

/// The kind of entry, in its file name.
const KIND: &str = "plans";

/// The version of a plan's encoding: part of the key.
const VERSION: u32 = 2;

/// Instructions a window may hold (one byte each at least).
const MAX_INSNS: usize = MAX_WINDOW;

/// Exits a window may hold.
const MAX_EXITS: usize = MAX_WINDOW;

/// Bytes of a mnemonic.
const MAX_MNEMONIC: usize = 32;

/// Bytes of the prefix before a site (landing pads, a Go stack check).
const MAX_PREFIX: usize = 4096;

/// The plans of one module: those its entry held, and those made since.
#[derive(Debug)]
pub struct PlanCache {
    /// The entry's name and key; None for a module that is not cached.
    entry: Option<(String, Vec<u8>)>,
    /// The entry as read, on first use.
    held: OnceLock<Option<Held>>,
    /// Plans made in this session, by function (file address): encoded.
    made: Mutex<BTreeMap<u64, Vec<u8>>>,
    /// True while a save of `made` is queued and has not begun.
    queued: AtomicBool,
}

/// An entry as read: its records and, sorted, each function's record.
#[derive(Debug)]
struct Held {
    bytes: Vec<u8>,
    index: Vec<(u64, u32, u32)>,
}

impl PlanCache {
    /// The plans of the module whose analysis has key `key` (None: not
    /// cached) and whose debug file's places are `places`.
    pub fn new(key: Option<&Key>, places: &[Place]) -> PlanCache {
        let entry = key.filter(|k| k.settled).map(|k| {
            let mut w = Writer::new();
            w.str("tp entry plans").u32(VERSION).blob(&k.bytes);
            super::saved::write_places(&mut w, places);
            let bytes = w.into_bytes();
            (name_for(KIND, &bytes), bytes)
        });
        PlanCache { entry, held: OnceLock::new(), made: Mutex::new(BTreeMap::new()), queued: AtomicBool::new(false) }
    }

    /// A module that keeps no plans.
    pub fn none() -> PlanCache {
        PlanCache::new(None, &[])
    }

    /// The kept plan of `f`, whose bytes are `code`, if there is one for
    /// these very bytes.
    pub fn get(&self, f: &Function, code: &[u8]) -> Option<SitePlan> {
        self.entry.as_ref()?;
        let at = f.bias.file(f.addr).0;
        let held = self.held.get_or_init(|| self.read()).as_ref()?;
        let k = held.index.binary_search_by_key(&at, |&(a, _, _)| a).ok()?;
        let (_, lo, hi) = held.index[k];
        let record = held.bytes.get(lo as usize..hi as usize)?;
        decode(record, f.addr.0, code).ok()
    }

    /// Keeps `plan`, made for `f` from its bytes `code`, to be saved.
    pub fn note(self: &Arc<Self>, f: &Function, code: &[u8], plan: &SitePlan) {
        if self.entry.is_none() {
            return;
        }
        let Some(record) = encode(plan, code) else { return };
        let at = f.bias.file(f.addr).0;
        self.made.lock().unwrap_or_else(|e| e.into_inner()).insert(at, record);
        if !self.queued.swap(true, Ordering::AcqRel) {
            let me = Arc::clone(self);
            let Some((name, _)) = &self.entry else { return };
            super::saving::enqueue_entry(name.clone(), Box::new(move || me.payload()));
        }
    }

    /// The entry to save: what was held and what was made, by function.
    fn payload(&self) -> Option<(String, Vec<u8>, Vec<u8>)> {
        self.queued.store(false, Ordering::Release);
        let (name, key) = self.entry.clone()?;
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut all: BTreeMap<u64, &[u8]> = BTreeMap::new();
        if let Some(held) = self.held.get_or_init(|| self.read()) {
            for &(at, lo, hi) in &held.index {
                all.insert(at, &held.bytes[lo as usize..hi as usize]);
            }
        }
        for (at, r) in &made {
            all.insert(*at, r);
        }
        let mut w = Writer::new();
        w.var(all.len() as u64);
        let mut last = 0;
        for (at, r) in &all {
            w.var(at - last).blob(r);
            last = *at;
        }
        Some((name, key, w.into_bytes()))
    }

    /// The entry as the cache holds it, if it is whole and well formed.
    fn read(&self) -> Option<Held> {
        let (name, key) = self.entry.as_ref()?;
        let bytes = store()?.load(name, key)?;
        Held::parse(bytes).ok()
    }
}

/// True if `payload` is an entry of plans as tp saves them (its index in
/// bounds and in order).
pub fn well_formed(payload: &[u8]) -> bool {
    Held::parse(payload.to_vec()).is_ok()
}

impl Held {
    /// The index of `bytes`: functions strictly increasing, each record in
    /// bounds (decoded only when asked for).
    fn parse(bytes: Vec<u8>) -> Result<Held, Bad> {
        let mut r = Reader::new(&bytes);
        let n = r.count(2)?;
        let mut index = Vec::with_capacity(n);
        let mut at = 0u64;
        for i in 0..n {
            let d = r.var()?;
            if i > 0 && d == 0 {
                return Err(Bad("plans out of order"));
            }
            at = at.checked_add(d).ok_or(Bad("a function out of range"))?;
            let len = r.count(1)?;
            let lo = bytes.len() - r.left();
            r.take(len)?;
            let pos = |p: usize| u32::try_from(p).map_err(|_| Bad("an entry too large"));
            index.push((at, pos(lo)?, pos(lo + len)?));
        }
        r.finish()?;
        Ok(Held { bytes, index })
    }
}

/// A plan as kept: the hash and length of the bytes it was made from, then
/// the plan with its addresses relative to the function.
fn encode(plan: &SitePlan, code: &[u8]) -> Option<Vec<u8>> {
    let mut w = Writer::new();
    w.u64(hash64(code)).var(code.len() as u64);
    w.var(plan.site.checked_sub(plan.function)?);
    w.blob(&plan.prefix).blob(&plan.window);
    w.var(plan.insns.len() as u64);
    for i in &plan.insns {
        w.var(i.offset as u64).var(i.len as u64).str(&i.mnemonic);
    }
    w.u32(plan.dead).bool(plan.interior);
    w.var(plan.exits.len() as u64);
    for e in &plan.exits {
        w.var(e.offset as u64);
        match e.kind {
            ExitKind::Return => w.u8(0),
            ExitKind::Jump => w.u8(1),
            ExitKind::CondJump => w.u8(2),
            ExitKind::IndirectJump => w.u8(3),
            ExitKind::MaybeJump { lo, hi } => {
                w.u8(4).u64(lo.wrapping_sub(plan.function)).u64(hi.wrapping_sub(plan.function))
            }
            ExitKind::Ahead { sp_above } => w.u8(5).u32(sp_above),
        };
    }
    Some(w.into_bytes())
}

/// The plan kept in `record` for the function at `function` whose bytes
/// are `code`; Err unless it was made from these bytes and is well formed.
fn decode(record: &[u8], function: u64, code: &[u8]) -> Result<SitePlan, Bad> {
    let mut r = Reader::new(record);
    if r.u64()? != hash64(code) || r.var()? != code.len() as u64 {
        return Err(Bad("another function's bytes"));
    }
    let site_off = r.var()?;
    let (prefix, window) = (r.blob()?, r.blob()?);
    if prefix.len() > MAX_PREFIX || window.is_empty() || window.len() > MAX_WINDOW {
        return Err(Bad("a window out of bounds"));
    }
    // The prefix and the window are the function's bytes where they lie in it.
    let off = usize::try_from(site_off).map_err(|_| Bad("a site out of range"))?;
    let before = off.checked_sub(prefix.len()).ok_or(Bad("a prefix before the function"))?;
    let same = |at: usize, b: &[u8]| match code.get(at..) {
        Some(rest) => rest.iter().zip(b).all(|(x, y)| x == y),
        None => b.is_empty() || at == code.len(),
    };
    if !same(before, prefix) || !same(off, window) || off > code.len() {
        return Err(Bad("a window that is not the function's"));
    }
    let n = r.count(3)?;
    if n == 0 || n > MAX_INSNS {
        return Err(Bad("too many instructions"));
    }
    let mut insns = Vec::with_capacity(n);
    for _ in 0..n {
        let (offset, len) = (r.var32()?, r.var32()?);
        let mnemonic = r.str()?;
        if mnemonic.len() > MAX_MNEMONIC || offset as usize + len as usize > window.len() || len == 0 {
            return Err(Bad("an instruction out of bounds"));
        }
        insns.push(WindowInsn { offset, len, mnemonic: mnemonic.to_string() });
    }
    let (dead, interior) = (r.u32()?, r.bool()?);
    let n = r.count(2)?;
    if n > MAX_EXITS {
        return Err(Bad("too many exits"));
    }
    let mut exits = Vec::with_capacity(n);
    for _ in 0..n {
        let offset = r.var32()?;
        let kind = match r.u8()? {
            0 => ExitKind::Return,
            1 => ExitKind::Jump,
            2 => ExitKind::CondJump,
            3 => ExitKind::IndirectJump,
            4 => ExitKind::MaybeJump { lo: function.wrapping_add(r.u64()?), hi: function.wrapping_add(r.u64()?) },
            5 => ExitKind::Ahead { sp_above: r.u32()? },
            _ => return Err(Bad("an unknown exit")),
        };
        if offset as usize > window.len() {
            return Err(Bad("an exit out of bounds"));
        }
        exits.push(ExitInsn { offset, kind });
    }
    r.finish()?;
    Ok(SitePlan {
        function,
        site: function.checked_add(site_off).ok_or(Bad("a site out of range"))?,
        prefix: prefix.to_vec(),
        window: window.to_vec(),
        insns,
        dead,
        interior,
        exits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 0x5555_5555_1000;

    /// A function's bytes (a landing pad, then a window of four
    /// instructions, then padding) and its plan, with every kind of exit.
    fn code_and_plan() -> (Vec<u8>, SitePlan) {
        let code = [&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3][..], &[0x90; 6]].concat();
        let insns = vec![
            WindowInsn { offset: 0, len: 1, mnemonic: "push".into() },
            WindowInsn { offset: 1, len: 3, mnemonic: "mov".into() },
            WindowInsn { offset: 4, len: 1, mnemonic: "pop".into() },
            WindowInsn { offset: 5, len: 1, mnemonic: "ret".into() },
        ];
        let kinds = [
            ExitKind::Return,
            ExitKind::Jump,
            ExitKind::CondJump,
            ExitKind::IndirectJump,
            ExitKind::MaybeJump { lo: F, hi: F + 16 },
            ExitKind::Ahead { sp_above: 8 },
        ];
        let plan = SitePlan {
            function: F,
            site: F + 4,
            prefix: code[..4].to_vec(),
            window: code[4..10].to_vec(),
            insns,
            dead: 0x1_0001,
            interior: false,
            exits: kinds.iter().enumerate().map(|(k, &kind)| ExitInsn { offset: k as u32, kind }).collect(),
        };
        (code, plan)
    }

    #[test]
    fn a_kept_plan_reads_back_as_made_wherever_the_function_is() {
        let (code, plan) = code_and_plan();
        let record = encode(&plan, &code).unwrap();
        assert_eq!(decode(&record, F, &code), Ok(plan.clone()));
        let moved = decode(&record, F + 0x10_0000, &code).unwrap();
        assert_eq!((moved.function, moved.site), (F + 0x10_0000, F + 0x10_0004));
        assert_eq!(moved.exits[4].kind, ExitKind::MaybeJump { lo: F + 0x10_0000, hi: F + 0x10_0010 });
        // A window that takes the padding after a short function.
        let short = &code[..10];
        let mut padded = plan.clone();
        padded.window = [&code[4..10], &[0xcc, 0xcc][..]].concat();
        let record = encode(&padded, short).unwrap();
        assert_eq!(decode(&record, F, short), Ok(padded));
    }

    #[test]
    fn a_plan_is_never_used_for_other_bytes() {
        let (code, plan) = code_and_plan();
        let record = encode(&plan, &code).unwrap();
        let mut other = code.clone();
        other[12] ^= 1;
        assert!(decode(&record, F, &other).is_err(), "bytes past the window");
        assert!(decode(&record, F, &code[..code.len() - 1]).is_err(), "a shorter function");
        assert!(decode(&record, F, &[]).is_err());
    }

    #[test]
    fn damaged_records_and_entries_are_misses_never_panics() {
        let (code, plan) = code_and_plan();
        let record = encode(&plan, &code).unwrap();
        for cut in 0..record.len() {
            assert!(decode(&record[..cut], F, &code).is_err(), "cut at {cut}");
        }
        for i in 0..record.len() {
            for bit in 0..8 {
                let mut bad = record.clone();
                bad[i] ^= 1 << bit;
                if let Ok(p) = decode(&bad, F, &code) {
                    // Only what the bytes cannot tell (a mnemonic's letters,
                    // the dead registers, an exit's kind) may differ; the
                    // window is the function's.
                    assert!(p.window.len() <= MAX_WINDOW && p.insns.len() <= MAX_INSNS);
                    let off = (p.site - F) as usize;
                    assert!(code[off..].iter().zip(&p.window).all(|(a, b)| a == b), "the window is the code's");
                }
            }
        }
        let mut w = Writer::new();
        w.var(2).var(0x1000).blob(&record).var(0x10).blob(&record);
        let entry = w.into_bytes();
        let held = Held::parse(entry.clone()).unwrap();
        assert_eq!(held.index.iter().map(|i| i.0).collect::<Vec<_>>(), [0x1000, 0x1010]);
        for cut in 0..entry.len() {
            assert!(Held::parse(entry[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut w = Writer::new();
        w.var(2).var(0x1000).blob(&record).var(0).blob(&record);
        assert!(Held::parse(w.into_bytes()).is_err(), "out of order");
        for bytes in [vec![], vec![0xff; 9], vec![1, 5, 200]] {
            assert!(Held::parse(bytes).is_err());
        }
    }
}
