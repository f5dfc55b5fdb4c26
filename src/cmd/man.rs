//! `tp man`: the manual pages, generated from the command-line definitions
//! ([`crate::cli`]) by clap_mangen: tp(1) lists the subcommands, and each
//! has a page of its own (tp-attach(1), ...), as git and cargo do.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::CommandFactory;
use clap_mangen::Man;

use crate::cli::{Cli, ManArgs};

/// Runs `tp man`.
pub fn run(args: ManArgs) -> Result<ExitCode> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    if let Some(dir) = &args.dir {
        write_all(cmd, dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    let page = match &args.subcommand {
        None => cmd,
        Some(name) => match cmd.find_subcommand(name) {
            Some(sub) => sub.clone(),
            None => {
                let names: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
                bail!("tp has no subcommand `{name}`; pages exist for: {}", names.join(", "))
            }
        },
    };
    let mut out = std::io::stdout().lock();
    Man::new(page).render(&mut out)?;
    std::io::Write::flush(&mut out)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes tp.1 and one page per subcommand into `dir`.
fn write_all(cmd: clap::Command, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    for sub in cmd.get_subcommands().cloned() {
        let page = Man::new(sub);
        page.generate_to(dir).with_context(|| format!("cannot write `{}`", dir.join(page.get_filename()).display()))?;
    }
    let page = Man::new(cmd);
    page.generate_to(dir).with_context(|| format!("cannot write `{}`", dir.join(page.get_filename()).display()))?;
    crate::say!("tp: wrote the manual pages into {}", dir.display());
    Ok(())
}
