//! `tp list-probes`: every function of a binary, or of every module of a
//! running process, with tp's verdict on it (`session::probeable` decides,
//! `output::listing` prints); `--lines FUNCTION` lists where each source
//! line of a function starts and the verdict there, `--usdt` the static
//! probes, `--blocks FUNCTION` the basic blocks.

use std::process::ExitCode;

use anyhow::Result;

use super::options::listed;
use crate::cli::ListProbesArgs;
use crate::notes::Stderr;
use crate::output::format::{self, Format};
use crate::output::listing;
use crate::session::probeable;

/// Runs `tp list-probes`.
pub fn run(args: ListProbesArgs) -> Result<ExitCode> {
    let source = listed(&args)?;
    let format = format::choose("list-probes", &[(args.json, Format::Json)], None, None, &[Format::Text, Format::Json])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !args.blocks.is_empty() {
        let functions = probeable::blocks(source, &args.blocks)?;
        listing::blocks(&mut crate::streams::stdout(), &functions, format)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.lines.is_empty() || args.usdt {
        let rows = probeable::sites(&Stderr, source, &args.lines, args.usdt)?;
        let mut out = crate::streams::stdout();
        listing::sites(&mut out, &rows, args.usdt, format)?;
        return Ok(ExitCode::SUCCESS);
    }
    let modules = probeable::functions(&Stderr, source, args.verbose)?;
    let mut out = crate::streams::stdout();
    if args.summary {
        listing::summaries(&mut out, &modules, format)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<listing::FunctionRow> = modules.into_iter().flat_map(|(_, rows)| rows).collect();
    listing::functions(&mut out, &rows, format, args.pid.is_some())?;
    Ok(ExitCode::SUCCESS)
}
