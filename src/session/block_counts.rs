//! `--blocks` in a session's results: the counts of each function's block
//! probes, read from the summary's rows, completed by the flow between the
//! blocks and turned into line counts ([`crate::symbols::block_map::solve`]).

use crate::output::Summary;
use crate::output::blocks::{BlockCount, FunctionBlocks, LineCount};
use crate::symbols::block_map::{BlockMap, solve};

/// The blocks and lines of each function of `maps`, with the counts of
/// `summary` (a process's rows).
pub fn report(maps: &[BlockMap], summary: &Summary) -> Vec<FunctionBlocks> {
    maps.iter().map(|map| one(map, summary)).collect()
}

fn one(map: &BlockMap, summary: &Summary) -> FunctionBlocks {
    let f = &map.function;
    let counted: Vec<Option<u64>> = map
        .blocks
        .iter()
        .map(|b| {
            let site = b.probe.as_ref().ok()?;
            let row = summary.probes.iter().find(|p| {
                p.module == f.module && (p.address == b.start.0 || (p.func == site.label && p.address < b.end.0))
            })?;
            Some(row.hits)
        })
        .collect();
    let solved = solve(map, &counted);
    let file_line = |file: &str, line: u32| format!("{}:{line}", file.rsplit('/').next().unwrap_or(file));
    let blocks = map
        .blocks
        .iter()
        .zip(&solved.blocks)
        .zip(&counted)
        .map(|((b, &count), probe)| BlockCount {
            offset: b.start.0 - f.addr.0,
            address: b.start.0,
            size: b.end.0 - b.start.0,
            insns: b.insns,
            lines: b.lines.iter().map(|(file, line)| file_line(file, *line)).collect(),
            count,
            probed: probe.is_some(),
            why: match (&b.probe, probe) {
                (Err(why), _) => Some(why.clone()),
                (Ok(_), None) => Some("its probe was not installed".into()),
                (Ok(_), Some(_)) => None,
            },
        })
        .collect();
    let lines =
        solved.lines.iter().map(|(file, line, count)| LineCount { file: file.to_string(), line: *line, count: *count });
    FunctionBlocks { func: f.name.clone(), module: f.module.clone(), address: f.addr.0, blocks, lines: lines.collect() }
}
