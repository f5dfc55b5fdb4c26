//! `tp list-probes`: every function of a binary, or of every module of a
//! running process, with tp's verdict on it (`session::probeable` decides,
//! `output::listing` prints); `--lines FUNCTION` lists where each source
//! line of a function starts and the verdict there, `--usdt` the static
//! probes, `--blocks FUNCTION` the basic blocks.

use std::process::ExitCode;

use anyhow::Result;

use super::options::listed;
use crate::cli::ListProbesArgs;
use crate::output::listing;
use crate::session::probeable;

/// Runs `tp list-probes`.
pub fn run(args: ListProbesArgs) -> Result<ExitCode> {
    let source = listed(&args)?;
    if !args.blocks.is_empty() {
        let functions = probeable::blocks(source, &args.blocks)?;
        listing::blocks(&mut crate::streams::stdout(), &functions, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.lines.is_empty() || args.usdt {
        let rows = probeable::sites(source, &args.lines, args.usdt)?;
        let mut out = crate::streams::stdout();
        match args.json {
            true => listing::sites_json(&mut out, &rows, args.usdt)?,
            false => listing::sites_table(&mut out, &rows, args.usdt)?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    let modules = probeable::functions(source, args.verbose)?;
    let mut out = crate::streams::stdout();
    if args.summary {
        listing::summaries(&mut out, &modules, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<listing::FunctionRow> = modules.into_iter().flat_map(|(_, rows)| rows).collect();
    match args.json {
        true => listing::functions_json(&mut out, &rows)?,
        false => listing::functions_table(&mut out, &rows, args.pid.is_some())?,
    }
    Ok(ExitCode::SUCCESS)
}
