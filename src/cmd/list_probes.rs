//! `tp list-probes`: every function of a binary with tp's verdict on it,
//! decided from the file alone, exactly as `attach` would decide.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::arch::{Isa, Refusal, SitePlan};
use crate::cli::ListProbesArgs;
use crate::output::json;
use crate::symbols::{self, ElfFile, elf::machine_name, entries::Entries, image::ElfImage};

/// One function and its verdict.
struct Row {
    name: String,
    addr: u64,
    size: u64,
    verdict: Result<SitePlan, Refusal>,
}

/// Runs `tp list-probes`.
pub fn run(args: ListProbesArgs) -> Result<ExitCode> {
    let elf = ElfFile::open(&args.binary, &args.binary)?;
    let Some(isa) = Isa::for_machine(elf.machine) else {
        bail!("`{}` is a {} binary; tp knows x86-64 and aarch64", args.binary.display(), machine_name(elf.machine));
    };
    let module = args.binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let rows = verdicts(&elf, isa);
    let mut out = std::io::stdout().lock();
    if args.summary {
        print_summary(&mut out, &module, &rows)?;
    } else if args.json {
        for r in &rows {
            let (ok, reason) = match &r.verdict {
                Ok(_) => (true, "null".to_string()),
                Err(why) => (false, json::string(&why.to_string())),
            };
            writeln!(
                out,
                "{{\"module\":{},\"func\":{},\"address\":\"{:#x}\",\"size\":{},\"probeable\":{ok},\"reason\":{reason}}}",
                json::string(&module),
                json::string(&r.name),
                r.addr,
                r.size
            )?;
        }
    } else {
        let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(8).clamp(8, 40);
        writeln!(out, "{:<18}  {:>7}  {:<w$}  VERDICT", "ADDRESS", "SIZE", "FUNCTION")?;
        for r in &rows {
            writeln!(
                out,
                "{:<18}  {:>7}  {:<w$}  {}",
                format!("{:#x}", r.addr),
                r.size,
                r.name,
                verdict_text(&r.verdict)
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn verdicts(elf: &ElfFile, isa: Isa) -> Vec<Row> {
    let entries = Entries::of(elf);
    let image = ElfImage::new(elf, 0);
    elf.unique_functions()
        .into_iter()
        .filter(|f| f.size > 0)
        .map(|f| {
            let verdict = match elf.bytes_at(f.addr, f.size) {
                None => Err(Refusal::Undecodable { at: f.addr }),
                Some(code) => {
                    let extra = symbols::cold_targets(elf, 0, &f.name, f.addr, f.size, isa);
                    (isa.plan_in)(code, f.addr, &extra, &image).and_then(|p| entries.check(&p, 0).map(|()| p))
                }
            };
            Row { name: f.name.clone(), addr: f.addr, size: f.size, verdict }
        })
        .collect()
}

/// `ok (N bytes: mov, push)` or `refused: <reason>`.
pub fn verdict_text(v: &Result<SitePlan, Refusal>) -> String {
    match v {
        Ok(p) => format!("ok ({} bytes: {})", p.len(), p.summary()),
        Err(r) => format!("refused: {r}"),
    }
}

fn print_summary(out: &mut impl Write, module: &str, rows: &[Row]) -> Result<()> {
    let big: Vec<&Row> = rows.iter().filter(|r| r.size >= 5).collect();
    let ok = big.iter().filter(|r| r.verdict.is_ok()).count();
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        if let Err(why) = &r.verdict {
            *reasons.entry(why.kind()).or_default() += 1;
        }
    }
    let pct = if big.is_empty() { 0.0 } else { 100.0 * ok as f64 / big.len() as f64 };
    writeln!(out, "{module}: {} functions, {} of at least 5 bytes", rows.len(), big.len())?;
    writeln!(out, "probeable: {ok} of {} ({pct:.1}%)", big.len())?;
    writeln!(out, "refused:   {}", rows.iter().filter(|r| r.verdict.is_err()).count())?;
    let mut top: Vec<(&str, usize)> = reasons.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (why, n) in top.iter().take(8) {
        writeln!(out, "  {n:>7}  {why}")?;
    }
    Ok(())
}
