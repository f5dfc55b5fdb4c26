//! `tp completions SHELL`: the completion script for a shell, generated
//! from the command-line definitions ([`crate::cli`]) by clap_complete, so
//! it always knows every subcommand and option tp has. clap_complete offers
//! file names for every value; tp's scripts offer the running processes for
//! `-p`/`--pid` (with their names where the shell shows descriptions: zsh's
//! `_pids`, fish's `__fish_complete_pids`; bash continues a comma list)
//! and the processes' names for `--name`.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::{Cli, CompletionsArgs};

/// Runs `tp completions`.
pub fn run(args: CompletionsArgs) -> Result<ExitCode> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "tp", &mut script);
    let script = processes(args.shell, &String::from_utf8_lossy(&script));
    let mut out = crate::streams::stdout();
    out.write_all(script.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The bash functions the script calls for a PID (continuing a comma
/// list) and for a process name, from /proc.
const BASH_PROCESSES: &str = r#"
__tp_pids() {
    local cur=$1 head= d pids=()
    [[ $cur == *,* ]] && head=${cur%,*},
    for d in /proc/[0-9]*; do pids+=("${head}${d#/proc/}"); done
    compgen -W "${pids[*]}" -- "$cur"
}

__tp_names() {
    compgen -W "$(cat /proc/[0-9]*/comm 2>/dev/null | sort -u)" -- "$1"
}
"#;

/// `script` with the values of `-p`/`--pid` and `--name` completed from the
/// running processes instead of file names.
fn processes(shell: Shell, script: &str) -> String {
    match shell {
        Shell::Bash => {
            let files = "COMPREPLY=($(compgen -f \"${cur}\"))";
            let mut out = String::with_capacity(script.len() + BASH_PROCESSES.len());
            let mut option = "";
            for line in script.lines() {
                let t = line.trim();
                if t.ends_with(')') && !t.contains(' ') {
                    option = t;
                }
                let replaced = match option {
                    "--pid)" | "-p)" if t == files => line.replace(files, "COMPREPLY=($(__tp_pids \"${cur}\"))"),
                    "--name)" if t == files => line.replace(files, "COMPREPLY=($(__tp_names \"${cur}\"))"),
                    _ => line.to_string(),
                };
                out.push_str(&replaced);
                out.push('\n');
            }
            out + BASH_PROCESSES
        }
        Shell::Zsh => {
            script
                .lines()
                .map(|l| match () {
                    _ if l.starts_with("'*-p+[")
                        || l.starts_with("'*--pid=[")
                        || l.starts_with("'-p+[")
                        || l.starts_with("'--pid=[") =>
                    {
                        l.replace(":PID:_default'", ":PID:_pids'")
                    }
                    _ if l.starts_with("'--name=[") => l.replace(":NAME:_default'", ":NAME:_process_names'"),
                    _ => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        }
        Shell::Fish => {
            script
                .lines()
                .map(|l| match () {
                    _ if l.contains(" -s p -l pid ") => format!("{l} -f -a \"(__fish_complete_pids)\""),
                    _ if l.contains(" -l name ") => format!("{l} -f -a \"(__fish_complete_proc)\""),
                    _ => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        }
        _ => script.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: Shell) -> String {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "tp", &mut out);
        processes(shell, &String::from_utf8_lossy(&out))
    }

    #[test]
    fn every_pid_option_completes_processes() {
        let bash = script(Shell::Bash);
        assert!(!bash.contains("--pid)\n                    COMPREPLY=($(compgen -f"), "{bash}");
        assert!(bash.contains("COMPREPLY=($(__tp_pids \"${cur}\"))") && bash.contains("__tp_pids() {"));
        assert!(bash.contains("COMPREPLY=($(__tp_names \"${cur}\"))"));
        let zsh = script(Shell::Zsh);
        assert!(!zsh.contains(":PID:_default"), "{zsh}");
        assert!(zsh.contains(":PID:_pids'") && zsh.contains(":NAME:_process_names'"));
        let fish = script(Shell::Fish);
        assert!(fish.lines().filter(|l| l.contains(" -l pid ")).all(|l| l.ends_with("(__fish_complete_pids)\"")));
    }
}
