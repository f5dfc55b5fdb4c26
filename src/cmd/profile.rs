//! `tp profile`: sampled latency of many functions at once, with exact call
//! counts ([`crate::session::profile`] says how).

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::options::CommandLine;
use crate::cli::ProfileArgs;
use crate::output;
use crate::output::format::Format;
use crate::output::sink::Sink;
use crate::session::profile;
use crate::session::{Options, interrupt};

/// Runs `tp profile`.
pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    interrupt::install();
    let opts = Options::from_cli(CommandLine::Profile(&args))?;
    let mut out = match &opts.output {
        Some(path) => Sink::create(path).with_context(|| format!("cannot create `{}`", path.display()))?,
        None => Sink::stdout(),
    };
    let trace = (opts.format == Format::Chrome).then(|| Box::new(out.clone()) as Box<dyn std::io::Write>);
    let profiled = profile::run(&opts, trace)?;
    if opts.format != Format::Chrome {
        output::profile::write(&profiled.report, opts.format, opts.view, &mut out)?;
    }
    std::io::Write::flush(&mut out)?;
    Ok(ExitCode::from(crate::session::exit_status(profiled.killed_by)))
}
