//! A function's basic blocks as `--blocks` counts them: each block's
//! probe (a count-only probe at its first instruction, planned as any site
//! inside a function is, [`super::verdict::verdict_at`]) or why it has
//! none, its source lines, and how the counts of the blocks that have one
//! give the others' and each line's ([`solve`]).
//!
//! A block has no probe of its own where no window fits at its start, or
//! where the window of the block before it reaches over its start (a block
//! shorter than the patch that falls through: the earlier probe counts its
//! own block only). Its count then follows from the flow where the flow
//! tells it: every block is entered as often as it is left, so a block
//! whose every way in (or out) is known is known, and a way in or out that
//! is a block's only unknown one is its count less the others ([`solve`],
//! gcov's own method, here with every block counted that can be).
//!
//! A line's count is how often execution entered it from another line: at
//! the start of a block, each way in from a block that ended on another
//! line (or from outside the function); inside a block, each change of
//! line, once per run of the block. This is gcov's count of a line, but for
//! a loop that lies within one line, which gcov counts per iteration.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::lines::{self, LineRow};
use super::site::{Site, offset_label};
use super::verdict::verdict_at;
use super::{Function, Module};
use crate::addr::RuntimeAddr;
use crate::arch::{Isa, Refusal, SitePlan};

/// A function's blocks, as `--blocks` probes and reports them.
#[derive(Debug, Clone)]
pub struct BlockMap {
    /// The function.
    pub function: Function,
    /// Its blocks, in address order.
    pub blocks: Vec<MapBlock>,
}

/// One block of a [`BlockMap`].
#[derive(Debug, Clone)]
pub struct MapBlock {
    /// Its first instruction.
    pub start: RuntimeAddr,
    /// One past its last byte.
    pub end: RuntimeAddr,
    /// Its instructions.
    pub insns: u32,
    /// The blocks it may go on to (indexes).
    pub succs: Vec<usize>,
    /// True if it may leave the function.
    pub leaves: bool,
    /// True if it may be entered from outside the function's branches
    /// (the entry, a switch's table, a split-off part).
    pub entered: bool,
    /// The source lines of its code in order (a line again only after
    /// another): the first is the line its first instruction is.
    pub lines: Vec<(Rc<str>, u32)>,
    /// The probe that counts it, or why it has none.
    pub probe: Result<Site, String>,
    /// The probe's window, where it has one.
    pub plan: Option<SitePlan>,
}

impl MapBlock {
    /// `foo+0x1a` of function `f`.
    pub fn label(&self, f: &Function) -> String {
        offset_label(f, self.start)
    }
}

/// The blocks of function `f` of `m` and the probe of each, or why its
/// blocks cannot be known (code that does not decode, a jump tp cannot
/// follow).
pub fn map(m: &Module, f: &Function, isa: &dyn Isa) -> Result<BlockMap, Refusal> {
    if f.ifunc {
        return Err(Refusal::Unsupported("an IFUNC symbol: its address is the resolver, not the implementation"));
    }
    if f.size == 0 {
        return Err(Refusal::Unsupported("its symbol has no size, so tp cannot check its code"));
    }
    let code = m.code_of(f).map_err(|_| Refusal::Undecodable { at: f.addr.0 })?;
    let found = m.planner().blocks(&m.elf, f, code, isa)?;
    let index: BTreeMap<u64, usize> = found.iter().enumerate().map(|(k, b)| (b.start, k)).collect();
    let rows = m.dwarf_file().and_then(|d| {
        let lo = f.bias.file(f.addr).0;
        lines::rows(d, lo, lo + f.size).ok()
    });
    let mut blocks = Vec::with_capacity(found.len());
    // Where the window of the last probe ends, and that probe.
    let mut covered: Option<(u64, String)> = None;
    for b in &found {
        let start = RuntimeAddr(b.start);
        let mut window = None;
        let probe = match &covered {
            Some((end, by)) if b.start < *end => {
                Err(format!("inside the window of the probe at {by} (a block shorter than a branch)"))
            }
            _ => match verdict_at(m, f, start, isa) {
                Ok(plan) => {
                    let site = Site { addr: start, label: offset_label(f, start), usdt: None, block: true };
                    covered = Some((plan.site + plan.len() as u64, site.label.clone()));
                    window = Some(plan);
                    Ok(site)
                }
                // A block shorter than the patch whose window would take in
                // the next block's start, where a branch lands.
                Err(why @ (Refusal::BranchIntoWindow { .. } | Refusal::EntersWindow { .. }))
                    if b.end - b.start < isa.patch_len() as u64 =>
                {
                    Err(format!(
                        "a block of {} bytes, shorter than a probe ({} bytes), before a block that is jumped to ({why})",
                        b.end - b.start,
                        isa.patch_len()
                    ))
                }
                Err(why) => Err(why.to_string()),
            },
        };
        blocks.push(MapBlock {
            start,
            end: RuntimeAddr(b.end),
            insns: b.insns,
            succs: b.succs.iter().filter_map(|s| index.get(s).copied()).collect(),
            leaves: b.leaves,
            entered: b.entered,
            lines: rows.as_deref().map(|r| lines_of(r, f, b.start, b.end)).unwrap_or_default(),
            probe,
            plan: window,
        });
    }
    Ok(BlockMap { function: f.clone(), blocks })
}

/// The lines of the code in `[start, end)` (runtime addresses) of `f`,
/// from its rows: the line at `start`, then each line that follows another.
fn lines_of(rows: &[LineRow], f: &Function, start: u64, end: u64) -> Vec<(Rc<str>, u32)> {
    let (lo, hi) = (f.bias.file(RuntimeAddr(start)).0, f.bias.file(RuntimeAddr(end)).0);
    let from = rows.partition_point(|r| r.addr.0 <= lo).saturating_sub(1);
    let mut out: Vec<(Rc<str>, u32)> = Vec::new();
    for r in rows[from..].iter().take_while(|r| r.addr.0 < hi) {
        if out.last().is_none_or(|(file, line)| *file != r.file || *line != r.line) {
            out.push((r.file.clone(), r.line));
        }
    }
    out
}

/// The counts [`solve`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    /// Each block's count: its probe's, or what the flow gives, or None.
    pub blocks: Vec<Option<u64>>,
    /// Each line (file, line) of the function and how often it was
    /// entered, None where a count it needs is not known; by file and line.
    pub lines: Vec<(Rc<str>, u32, Option<u64>)>,
}

/// The counts of every block of `map` and of its lines, from `counted`:
/// each block's probe's count (None for a block without one). See the
/// module doc. Counts taken while calls were under way (the probes went in
/// or came out in the middle of one) may not balance: what does not is
/// left unknown.
pub fn solve(map: &BlockMap, counted: &[Option<u64>]) -> Solved {
    let n = map.blocks.len();
    // Edges: (from, to, count); None is outside the function.
    let mut edges: Vec<(Option<usize>, Option<usize>, Option<u64>)> = Vec::new();
    for (k, b) in map.blocks.iter().enumerate() {
        edges.extend(b.succs.iter().map(|&s| (Some(k), Some(s), None)));
        if b.leaves {
            edges.push((Some(k), None, None));
        }
        if b.entered {
            edges.push((None, Some(k), None));
        }
    }
    let mut count: Vec<Option<u64>> = (0..n).map(|k| counted.get(k).copied().flatten()).collect();
    let (mut ins, mut outs): (Vec<Vec<usize>>, Vec<Vec<usize>>) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for (e, &(from, to, _)) in edges.iter().enumerate() {
        if let Some(f) = from {
            outs[f].push(e);
        }
        if let Some(t) = to {
            ins[t].push(e);
        }
    }
    // A block nothing enters (the padding after a jump) never runs.
    for k in 0..n {
        if ins[k].is_empty() && count[k].is_none() {
            count[k] = Some(0);
        }
    }
    loop {
        let mut changed = false;
        for k in 0..n {
            for side in [&ins[k], &outs[k]] {
                if side.is_empty() {
                    continue;
                }
                let known: u64 = side.iter().filter_map(|&e| edges[e].2).sum();
                let unknown: Vec<usize> = side.iter().copied().filter(|&e| edges[e].2.is_none()).collect();
                match (count[k], unknown.as_slice()) {
                    (None, []) => {
                        count[k] = Some(known);
                        changed = true;
                    }
                    (Some(c), [e]) => {
                        if let Some(rest) = c.checked_sub(known) {
                            edges[*e].2 = Some(rest);
                            changed = true;
                        }
                    }
                    _ => {}
                }
            }
        }
        if !changed {
            break;
        }
    }
    // Lines: entries from other lines.
    let mut lines: BTreeMap<(Rc<str>, u32), Option<u64>> = BTreeMap::new();
    let mut add = |key: (Rc<str>, u32), v: Option<u64>| {
        let slot = lines.entry(key).or_insert(Some(0));
        *slot = slot.and_then(|s| v.map(|v| s + v));
    };
    for (k, b) in map.blocks.iter().enumerate() {
        let Some(first) = b.lines.first() else { continue };
        let mut entered = Some(0u64);
        for &e in &ins[k] {
            let from_same = edges[e].0.is_some_and(|p| map.blocks[p].lines.last() == Some(first));
            if !from_same {
                entered = entered.and_then(|s| edges[e].2.map(|c| s + c));
            }
        }
        add(first.clone(), entered);
        for l in &b.lines[1..] {
            add(l.clone(), count[k]);
        }
    }
    Solved { blocks: count, lines: lines.into_iter().map(|((f, l), c)| (f, l, c)).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Bias;
    use crate::symbols::Source;

    fn block(start: u64, succs: &[usize], lines: &[u32], counted: bool) -> MapBlock {
        let file: Rc<str> = "a.c".into();
        MapBlock {
            start: RuntimeAddr(start),
            end: RuntimeAddr(start + 8),
            insns: 2,
            succs: succs.to_vec(),
            leaves: false,
            entered: false,
            lines: lines.iter().map(|&l| (file.clone(), l)).collect(),
            probe: if counted {
                Ok(Site { addr: RuntimeAddr(start), label: String::new(), usdt: None, block: true })
            } else {
                Err("short".into())
            },
            plan: None,
        }
    }

    fn function() -> Function {
        Function {
            name: "f".into(),
            symbol: "f".into(),
            module: "m".into(),
            addr: RuntimeAddr(0),
            size: 64,
            ifunc: false,
            version: None,
            source: Source::Symtab,
            bias: Bias::ZERO,
        }
    }

    #[test]
    fn the_flow_gives_the_blocks_without_probes_and_the_lines() {
        // for (i = 0; i < n; i++) body; return:
        // 0: entry (lines 1, 2) -> 2; 1: body (3) + i++ (2) -> 2; 2: cond (2) -> 1, 3; 3: ret (4)
        let mut blocks = vec![
            block(0, &[2], &[1, 2], true),
            block(8, &[2], &[3, 2], true),
            block(16, &[1, 3], &[2], false),
            block(24, &[], &[4], true),
        ];
        blocks[0].entered = true;
        blocks[3].leaves = true;
        let map = BlockMap { function: function(), blocks };
        // 10 calls of 5 iterations.
        let s = solve(&map, &[Some(10), Some(50), None, Some(10)]);
        assert_eq!(s.blocks, [Some(10), Some(50), Some(60), Some(10)]);
        let lines: Vec<(u32, Option<u64>)> = s.lines.iter().map(|(_, l, c)| (*l, *c)).collect();
        // Line 2: entered from line 1 (10) and after the body (50); the
        // condition is entered from line 2 only.
        assert_eq!(lines, [(1, Some(10)), (2, Some(60)), (3, Some(50)), (4, Some(10))]);
        // Without the body's count, the flow cannot tell it.
        let s = solve(&map, &[Some(10), None, None, Some(10)]);
        assert_eq!(s.blocks, [Some(10), None, None, Some(10)]);
        assert_eq!(s.lines[2], ("a.c".into(), 3, None));
        // Counts that do not balance (probes that went in during a call):
        // a way out that would be negative stays unknown, and so does what
        // needs it.
        let s = solve(&map, &[Some(10), None, Some(5), None]);
        assert_eq!(s.blocks, [Some(10), None, Some(5), None]);
        assert_eq!(s.lines[1], ("a.c".into(), 2, None));
    }
}
