//! Shell completions and the manual pages, generated from the clap
//! definitions: bash loads the script and completes tp's subcommands and
//! options, and `man -l` renders the pages.

use std::process::Command;

use crate::util::*;

#[test]
fn bash_loads_the_completion_script_and_completes() {
    let script = expect_success(&["completions", "bash"], &tp(&["completions", "bash"]));
    let dir = std::env::temp_dir().join(format!("tp-completions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tp.bash");
    std::fs::write(&file, &script).unwrap();
    // Source it, check the registration, and complete `tp r` and `tp run --fo`.
    let probe = format!(
        "source {} || exit 3\n\
         complete -p tp || exit 4\n\
         COMP_WORDS=(tp r); COMP_CWORD=1; COMP_LINE='tp r'; COMP_POINT=4; _tp tp r tp\n\
         echo \"subcommands: ${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(tp run --foll); COMP_CWORD=2; COMP_LINE='tp run --foll'; COMP_POINT=13; _tp tp --foll run\n\
         echo \"options: ${{COMPREPLY[*]}}\"\n",
        file.display()
    );
    let out = run(Command::new("bash").args(["--norc", "-c", &probe]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bash: {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let registered = stdout.lines().next().unwrap_or_default();
    assert!(registered.starts_with("complete ") && registered.ends_with(" -F _tp tp"), "{stdout}");
    let subs = stdout.lines().find_map(|l| l.strip_prefix("subcommands: ")).unwrap();
    assert_eq!(subs.split_whitespace().collect::<Vec<_>>(), ["run"], "{stdout}");
    let opts = stdout.lines().find_map(|l| l.strip_prefix("options: ")).unwrap();
    assert_eq!(opts.split_whitespace().collect::<Vec<_>>(), ["--follow-exec"], "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-p` completes the running processes' IDs (continuing a comma list),
/// `--name` their names: not file names.
#[test]
fn bash_completes_process_ids_and_names() {
    let t = Target::start("counter");
    let script = expect_success(&["completions", "bash"], &tp(&["completions", "bash"]));
    let dir = std::env::temp_dir().join(format!("tp-completions-pid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tp.bash");
    std::fs::write(&file, &script).unwrap();
    let pid = t.pid.to_string();
    let (head, first) = (&pid[..pid.len() - 1], &pid[..1]);
    let probe = format!(
        "source {} || exit 3\n\
         COMP_WORDS=(tp attach -p {head}); COMP_CWORD=3; COMP_LINE='tp attach -p {head}'; COMP_POINT=99; _tp tp {head} -p\n\
         echo \"pids: ${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(tp status --pid 1,{first}); COMP_CWORD=3; COMP_LINE='x'; COMP_POINT=99; _tp tp 1,{first} --pid\n\
         echo \"list: ${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(tp attach --name count); COMP_CWORD=3; COMP_LINE='x'; COMP_POINT=99; _tp tp count --name\n\
         echo \"names: ${{COMPREPLY[*]}}\"\n",
        file.display()
    );
    let out = run(Command::new("bash").args(["--norc", "-c", &probe]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bash: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let words = |key: &str| -> Vec<String> {
        let line = stdout.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{stdout}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let pids = words("pids: ");
    assert!(pids.contains(&pid) && pids.iter().all(|p| p.starts_with(head) && p.parse::<u32>().is_ok()), "{pids:?}");
    let list = words("list: ");
    assert!(
        list.contains(&format!("1,{pid}")) && list.iter().all(|p| p.starts_with(&format!("1,{first}"))),
        "{list:?}"
    );
    assert!(words("names: ").contains(&"counter".to_string()), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zsh_and_fish_scripts_name_every_subcommand() {
    for shell in ["zsh", "fish"] {
        let script = expect_success(&["completions", shell], &tp(&["completions", shell]));
        for sub in ["attach", "run", "status", "serve", "completions", "man"] {
            assert!(script.contains(sub), "{shell}: no `{sub}`");
        }
    }
    expect_error(&["completions", "tcsh"], "invalid value 'tcsh'");
}

#[test]
fn man_renders_the_pages() {
    need("man");
    let page = expect_success(&["man"], &tp(&["man"]));
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH tp 1"),
        "roff: {}",
        &page[..200.min(page.len())]
    );
    let dir = std::env::temp_dir().join(format!("tp-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tp.1"), &page).unwrap();
    let render = |file: &std::path::Path| {
        let out = run(Command::new("man").arg("-l").arg(file).env("MANPAGER", "cat").env("MANWIDTH", "100"));
        assert!(out.status.success(), "man -l {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = render(&dir.join("tp.1"));
    for want in
        ["NAME", "SYNOPSIS", "SUBCOMMANDS", "tp-run(1)", "tp-serve(1)", "EXAMPLES", "ENVIRONMENT", "EXIT STATUS"]
    {
        assert!(text.contains(want), "no {want} in:\n{text}");
    }
    for want in ["FILES", "TP_CACHE", "DEBUGINFOD_URLS", "TP_DEBUG_DIRS", "141", "tp attach -p 1234 -f foo -f bar"] {
        assert!(text.contains(want), "no {want} in:\n{text}");
    }
    // Every page, written by --dir; the run page lists its options.
    let out = tp(&["man", "--dir", dir.join("all").to_str().unwrap()]);
    expect_success(&["man", "--dir"], &out);
    let run_page = render(&dir.join("all/tp-run.1"));
    assert!(run_page.contains("--follow-exec") && run_page.contains("PROGRAM"), "{run_page}");
    assert!(run_page.contains("EXAMPLES") && run_page.contains("tp run -f foo -o calls.json -- ./prog"), "{run_page}");
    assert!(dir.join("all/tp-attach.1").exists() && dir.join("all/tp.1").exists());
    expect_error(&["man", "nosuch"], "tp has no subcommand `nosuch`");
    let _ = std::fs::remove_dir_all(&dir);
}
