//! `tp run -f NAME… -- PROGRAM ARGS…`: start a program with probes in it from
//! its entry point, let it run untraced, and print the summary when it
//! exits; tp's exit status is the program's (128 + the signal that killed
//! it, as shells report it). The program keeps tp's stdin, stdout and
//! stderr; tp's own output goes to stderr, or to `-o FILE`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use super::attach::options;
use super::serve;
use crate::cli::RunArgs;
use crate::escape::text;
use crate::output::sink::Sink;
use crate::session::group::Behaviour;
use crate::session::run::{self, Ran};
use crate::session::tracer::{TraceOutput, open_chrome};

/// How often tp looks at the program: its exit ends the session, so a short
/// program's summary comes this soon after it.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// Runs `tp run`.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let opts = super::attach::settle(crate::session::Options {
        trace_file: args.chrome.clone(),
        ..options(0, &args.funcs, &[], &args.probe)
    });
    let sink = match &args.output {
        Some(path) => Sink::create(path).map_err(|e| anyhow::anyhow!("cannot create `{}`: {e}", path.display()))?,
        None => Sink::stderr(),
    };
    let chrome = opts.trace_file.as_deref().map(|p| open_chrome(p, 0)).transpose()?;
    let published = match &args.probe.listen {
        Some(addr) => Some(serve::start_session_server(addr, args.probe.listen_any)?),
        None => None,
    };
    let how = Behaviour {
        several: false,
        follow_exec: args.probe.follow_exec,
        check_every: CHECK_EVERY,
        live: false,
        announce: false,
    };
    match run::run(&opts, &args.command, TraceOutput::new(sink, chrome, false), how, published)? {
        Ran::Ended(exit) => Ok(ExitCode::from(exit.shell_status())),
        Ran::NotStarted(why, status) => {
            let program = args.command.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let why = why.strip_prefix(&format!("`{program}`: ")).unwrap_or(&why);
            crate::say!("tp: cannot run `{}`: {}", text(&program), text(why));
            Ok(ExitCode::from(status))
        }
    }
}
