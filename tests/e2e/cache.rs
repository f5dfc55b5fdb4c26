//! The cache of module analyses (src/cache, src/symbols/saved.rs): what tp
//! says and does is the same with a cache hit, a miss and no cache; a
//! damaged or foreign entry is a miss; an entry in a directory another user
//! can write is never read; a file changed in place is analysed again even
//! with its build-id and times unchanged; concurrent tp processes share one
//! directory; the directory keeps to its bound; analyses are saved while
//! tp is attached, and a tp ended at once leaves only whole entries; the
//! entry plans of an attach are kept for the next. Each test has a cache
//! directory of its own (XDG_CACHE_HOME).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use crate::util::*;

/// An empty directory for one test's cache (`XDG_CACHE_HOME`; entries go
/// in its `tp/`).
fn fresh(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cache").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tp ARGS` with the cache in `home` (None: no cache). HOME is `home`
/// too, so that a cache directory tp refuses leads to nothing outside the
/// test's own.
fn tp_cached(home: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(tp_path());
    cmd.args(args);
    match home {
        Some(h) => cmd.env("XDG_CACHE_HOME", h).env("HOME", h.join("home")),
        None => cmd.env("TP_CACHE", "off"),
    };
    run(&mut cmd)
}

/// `tp list-probes -v FILE`, which must succeed and print nothing on stderr.
fn listing(home: Option<&Path>, file: &Path) -> String {
    let args = ["list-probes", "-v", file.to_str().unwrap()];
    let out = tp_cached(home, &args);
    let stdout = expect_success(&args, &out);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The module analyses in a cache (`XDG_CACHE_HOME`), and any temporary
/// file, by name.
fn entries(home: &Path) -> Vec<PathBuf> {
    all_entries(home).into_iter().filter(|p| !is_plans(p)).collect()
}

/// Every file in a cache, by name.
fn all_entries(home: &Path) -> Vec<PathBuf> {
    let Ok(list) = std::fs::read_dir(home.join("tp")) else { return Vec::new() };
    let mut out: Vec<PathBuf> = list.map(|e| e.unwrap().path()).collect();
    out.sort();
    out
}

/// True for an entry of kept entry plans (src/symbols/plan_cache.rs).
fn is_plans(path: &Path) -> bool {
    path.file_name().unwrap().to_string_lossy().starts_with("plans-")
}

/// The only entry in a cache.
fn only_entry(home: &Path) -> PathBuf {
    let all = entries(home);
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].clone()
}

/// Sets `path`'s modification time an hour back.
fn age(path: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(path).unwrap().set_modified(old).unwrap();
}

/// True if `path` was used since [`age`]: a hit marks its entry as recently used.
fn was_read(path: &Path) -> bool {
    std::fs::metadata(path).unwrap().modified().unwrap() > SystemTime::now() - Duration::from_secs(600)
}

/// The libc this test binary runs with (Debian's; libc6-dbg has its DWARF).
fn libc() -> PathBuf {
    need("libc-dbg");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so"));
    PathBuf::from(libc.expect("libc is mapped"))
}

/// A copy of `target` in `dir`, old enough to be cached (a file written
/// within the last two seconds is not).
fn settled_copy(target: &str, dir: &Path) -> PathBuf {
    let path = dir.join(target);
    std::fs::copy(target_path(target), &path).unwrap();
    std::thread::sleep(Duration::from_millis(3100));
    path
}

/// Waits until tp `pid` has no thread saving analyses (`tp-cache`): the
/// thread ends when it has saved everything queued.
fn saved_while_attached(pid: u32) {
    let saving = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .any(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).is_ok_and(|c| c.trim() == "tp-cache"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while saving() {
        assert!(std::time::Instant::now() < deadline, "tp's saving thread still runs after 10 minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the analyses of counter and libc are both in `home`: tp's
/// saving thread may start after the test first looks for it, and runs at
/// idle priority.
fn both_saved(home: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let whole = || entries(home).iter().filter(|p| !p.to_string_lossy().contains("/.tmp-")).count();
    while whole() < 2 {
        assert!(std::time::Instant::now() < deadline, "tp saved {} analyses in 10 minutes", whole());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_hit_a_miss_and_no_cache_say_the_same() {
    let home = fresh("same");
    let libc = libc();
    let uncached = listing(None, &libc);
    assert!(uncached.contains("refused") && uncached.contains("size_t"), "signatures from DWARF");
    assert!(entries(&home).is_empty());
    let first = listing(Some(&home), &libc);
    let entry = only_entry(&home);
    age(&entry);
    let second = listing(Some(&home), &libc);
    assert!(was_read(&entry), "the second run used the entry");
    assert_eq!(first, uncached);
    assert_eq!(second, uncached);
}

#[test]
fn attach_records_the_same_events_from_the_cache() {
    // `bar(uint64_t x, uint64_t y)`: names and types from DWARF, read one
    // unit at a time on a miss and from the cache on a hit.
    let home = fresh("events");
    let dir = fresh("events-bin");
    let counter = settled_copy("counter", &dir);
    let mut lines = Vec::new();
    for cache in [None, Some(home.as_path()), Some(home.as_path())] {
        let mut t = Target::start_path(&counter);
        let pid = t.pid.to_string();
        let env: Vec<(&str, &str)> = match cache {
            Some(h) => vec![("XDG_CACHE_HOME", h.to_str().unwrap())],
            None => vec![("TP_CACHE", "off")],
        };
        // libc's analysis too: a function there.
        let args = ["-p", &pid, "-f", "bar", "-f", "libc:getpid", "--args", "--ret"];
        let session = Session::spawn("attach", &args, &env, Some("tp: attached"));
        assert_eq!(t.call("bar", 3, 1), 3);
        if let Some(home) = cache {
            // The analyses are saved while tp is attached, not at its exit
            // (which waits a quarter of a second at most).
            saved_while_attached(session.child.id());
            both_saved(home);
        }
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        let calls: Vec<String> =
            stdout.lines().filter(|l| l.contains("bar(")).map(|l| l.split_whitespace().skip(2).collect()).collect();
        assert_eq!(calls.len(), 3, "{stdout}");
        assert!(calls.iter().all(|c| c.starts_with("bar(x=") && c.contains(",y=")), "{calls:?}");
        lines.push(calls);
        assert_code_is_original(&t, &["bar"]);
    }
    assert!(lines.windows(2).all(|w| w[0] == w[1]), "{lines:?}");
    assert_eq!(entries(&home).len(), 2, "counter and libc were cached");
}

/// Checks that `path` is a whole entry: its header's lengths and hash agree
/// with its bytes, and its analysis decodes.
fn assert_whole(path: &Path) {
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(!name.starts_with(".tmp-"), "a temporary file was left: {name}");
    let bytes = std::fs::read(path).unwrap();
    let key_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 32 + key_len + len, "{name}: the lengths its header gives");
    let payload = &bytes[32 + key_len..];
    assert_eq!(tp::cache::hash64(payload), u64::from_le_bytes(bytes[24..32].try_into().unwrap()), "{name}: its hash");
    match is_plans(path) {
        true => assert!(tp::symbols::plan_cache::well_formed(payload), "{name}: plans that decode"),
        false => assert!(tp::symbols::saved::Saved::decode(payload).is_ok(), "{name}: decodes"),
    }
}

#[test]
fn an_attach_ended_at_once_leaves_only_whole_entries() {
    // Ended right after the calls, tp waits only briefly for the analyses
    // (libc's whole DWARF index takes longer): what is saved is whole, the
    // rest is dropped, and the next attach computes it again.
    let home = fresh("at-once");
    let dir = fresh("at-once-bin");
    let counter = settled_copy("counter", &dir);
    let env = [("XDG_CACHE_HOME", home.to_str().unwrap())];
    for _ in 0..2 {
        let mut t = Target::start_path(&counter);
        let pid = t.pid.to_string();
        // libc's analysis too: a function there.
        let args = ["-p", &pid, "-f", "bar", "-f", "libc:getpid", "--args", "--ret"];
        let session = Session::spawn("attach", &args, &env, Some("tp: attached"));
        assert_eq!(t.call("bar", 3, 1), 3);
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        assert_eq!(stdout.lines().filter(|l| l.contains("bar(x=")).count(), 3, "{stdout}");
        assert_code_is_original(&t, &["bar"]);
        assert!(entries(&home).len() <= 2, "{:?}", entries(&home));
        all_entries(&home).iter().for_each(|e| assert_whole(e));
    }
}

#[test]
fn concurrent_tp_processes_share_one_directory() {
    let home = fresh("concurrent");
    let libc = libc();
    let want = listing(None, &libc);
    let runs: Vec<std::thread::JoinHandle<String>> = (0..4)
        .map(|_| {
            let (home, libc) = (home.clone(), libc.clone());
            std::thread::spawn(move || listing(Some(&home), &libc))
        })
        .collect();
    for r in runs {
        assert_eq!(r.join().unwrap(), want);
    }
    // One entry, whole (the last rename won), and no temporary file left.
    let entry = only_entry(&home);
    age(&entry);
    assert_eq!(listing(Some(&home), &libc), want);
    assert!(was_read(&entry));
}

#[test]
fn a_damaged_entry_is_a_miss_and_is_saved_again() {
    let home = fresh("damaged");
    let libc = libc();
    let want = listing(Some(&home), &libc);
    let entry = only_entry(&home);
    let good = std::fs::read(&entry).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let mut noise = vec![0u8; good.len()];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut header_only = good[..32].to_vec();
    header_only.extend_from_slice(&good[32..40]);
    for (what, bytes) in [
        ("truncated", &good[..good.len() / 2]),
        ("a byte changed", &flipped[..]),
        ("noise", &noise[..]),
        ("empty", &[][..]),
        ("cut after the header", &header_only[..]),
    ] {
        std::fs::write(&entry, bytes).unwrap();
        assert_eq!(listing(Some(&home), &libc), want, "{what}");
        assert_eq!(std::fs::read(&entry).unwrap(), good, "{what}: saved again, whole");
    }
    // Not the user's own, writable by others, a symbolic link: not read,
    // and replaced (the link itself, not what it points to).
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(listing(Some(&home), &libc), want);
    assert_eq!(std::fs::metadata(&entry).unwrap().mode() & 0o777, 0o600, "replaced by a file of tp's own");
    std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
    assert_eq!(listing(Some(&home), &libc), want);
    assert_eq!(std::fs::metadata(&entry).unwrap().uid(), 0);
    let elsewhere = home.join("elsewhere");
    std::fs::write(&elsewhere, &good).unwrap();
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    assert_eq!(listing(Some(&home), &libc), want);
    assert!(!std::fs::symlink_metadata(&entry).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&elsewhere).unwrap(), good, "the file a link pointed to is left alone");
}

/// `entry` (a module entry tp wrote) with its analysis changed by `poison`
/// and its hash made to match, as only someone who can write the
/// directory could.
fn poisoned(entry: &[u8], poison: impl FnOnce(&mut tp::symbols::saved::Saved)) -> Vec<u8> {
    let key_len = u32::from_le_bytes(entry[12..16].try_into().unwrap()) as usize;
    let (head, payload) = entry.split_at(32 + key_len);
    let mut saved = tp::symbols::saved::Saved::decode(payload).unwrap();
    poison(&mut saved);
    let payload = saved.encode();
    let mut out = head.to_vec();
    out[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out[24..32].copy_from_slice(&tp::cache::hash64(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

#[test]
fn an_entry_in_a_directory_others_can_write_is_never_read() {
    // An entry that says libc has no direct branches would make tp accept
    // windows that code elsewhere jumps into (glibc's __mempcpy_* enter
    // __memmove_* after its first instruction).
    let libc = libc();
    let want = listing(None, &libc);
    let refused_for_a_branch = want.lines().filter(|l| l.contains("a direct branch")).count();
    assert!(refused_for_a_branch > 0, "libc has windows that direct branches enter");
    let trusted = fresh("trusted");
    listing(Some(&trusted), &libc);
    let entry = only_entry(&trusted);
    let bad = poisoned(&std::fs::read(&entry).unwrap(), |s| s.branch_targets.clear());
    // In the user's own directory the entry is trusted: the control, which
    // shows the poison would change verdicts.
    std::fs::write(&entry, &bad).unwrap();
    let fooled = listing(Some(&trusted), &libc);
    assert!(fooled.lines().filter(|l| l.contains("a direct branch")).count() < refused_for_a_branch);
    // The same entry where another user could have put it: never read.
    let nobody = fresh("nobody");
    let dir = nobody.join("tp");
    std::fs::create_dir_all(&dir).unwrap();
    let planted = dir.join(entry.file_name().unwrap());
    std::fs::write(&planted, &bad).unwrap();
    for (owner, mode) in [(65534, 0o700), (0, 0o777), (0, 0o770)] {
        std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).unwrap();
        std::os::unix::fs::chown(&planted, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(listing(Some(&nobody), &libc), want, "a cache directory of uid {owner}, mode {mode:o}");
        assert_eq!(std::fs::read(&planted).unwrap(), bad, "left alone");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "nothing written there");
        let fallback = entries(&nobody.join("home/.cache"));
        assert_eq!(fallback.len(), 1, "saved in $HOME/.cache/tp instead: {fallback:?}");
    }
}

#[test]
fn a_file_changed_in_place_is_analysed_again() {
    // The same path, inode, size, build-id and modification time, one
    // symbol's size changed: the change time tells.
    let home = fresh("changed");
    let dir = fresh("changed-bin");
    let prog = settled_copy("counter", &dir);
    let before = listing(Some(&home), &prog);
    let entry = only_entry(&home);
    let elf = tp::symbols::ElfFile::open(&prog, &prog).unwrap();
    let foo = elf.functions.iter().find(|f| f.name == "foo").unwrap();
    let (ino, mtime) = {
        let m = std::fs::metadata(&prog).unwrap();
        (m.ino(), m.modified().unwrap())
    };
    // foo's entry in .symtab: Elf64_Sym, 24 bytes, st_size at +16.
    let bytes = std::fs::read(&prog).unwrap();
    let parsed = goblin::elf::Elf::parse(&bytes).unwrap();
    let symtab = parsed.section_headers.iter().find(|s| s.sh_type == goblin::elf::section_header::SHT_SYMTAB).unwrap();
    let index = parsed.syms.iter().position(|s| parsed.strtab.get_at(s.st_name) == Some("foo")).unwrap();
    let at = symtab.sh_offset as usize + 24 * index + 16;
    assert_eq!(u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()), foo.size);
    let file = std::fs::File::options().write(true).open(&prog).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &(foo.size - 1).to_le_bytes(), at as u64).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    let m = std::fs::metadata(&prog).unwrap();
    assert_eq!((m.ino(), m.modified().unwrap(), m.len()), (ino, mtime, bytes.len() as u64));
    let after = listing(Some(&home), &prog);
    assert_ne!(after, before);
    assert_eq!(after, listing(None, &prog));
    assert!(after.contains(&format!("{:>7}  foo ", foo.size - 1)), "{after}");
    assert!(entry.exists(), "the old entry is left to eviction");
}

#[test]
fn another_file_at_the_same_path_is_analysed_again() {
    let home = fresh("replaced");
    let dir = fresh("replaced-bin");
    let prog = settled_copy("counter", &dir);
    let counter = listing(Some(&home), &prog);
    let entry = only_entry(&home);
    // Another program (another build-id) put where it was.
    std::fs::copy(target_path("shapes"), &prog).unwrap();
    let shapes = listing(Some(&home), &prog);
    assert_ne!(shapes, counter);
    assert_eq!(shapes, listing(None, &prog));
    // The old program's entry under the new program's name: not its key.
    std::thread::sleep(Duration::from_millis(3100));
    listing(Some(&home), &prog);
    let new_entry = entries(&home).into_iter().find(|e| *e != entry).expect("an entry for the new program");
    std::fs::copy(&entry, &new_entry).unwrap();
    assert_eq!(listing(Some(&home), &prog), shapes);
}

#[test]
fn the_directory_keeps_to_its_bound() {
    // Old entries of 300 MiB in all (sparse files): the next save evicts
    // the least recently used down to three quarters of 256 MiB.
    let home = fresh("bound");
    let dir = home.join("tp");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for i in 0..30u64 {
        let f = dir.join(format!("module-{i:016x}"));
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(10 << 20).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(7200 - i)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(dir.join("README"), b"not tp's").unwrap();
    let bins = fresh("bound-bin");
    let prog = settled_copy("counter", &bins);
    listing(Some(&home), &prog);
    let sizes: Vec<(String, u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len())
        })
        .collect();
    let total: u64 = sizes.iter().filter(|(n, _)| n.starts_with("module-")).map(|(_, s)| s).sum();
    assert!(total <= 256 << 20, "{total} bytes: {sizes:?}");
    assert!(!dir.join("module-0000000000000000").exists(), "the oldest went first");
    assert!(dir.join(format!("module-{:016x}", 29)).exists(), "the newest stayed");
    assert!(dir.join("README").exists(), "files tp did not make are left alone");
    assert!(sizes.iter().any(|(n, s)| n.starts_with("module-") && *s < 10 << 20), "the new entry is there");
}

#[test]
fn plans_are_kept_for_the_next_attach_which_probes_the_same() {
    // An attach to every function of `many` plans 10,000 windows; the next
    // attach to the same file reads them from the cache. Both count every
    // function and leave the code as it was.
    let home = fresh("plans");
    let dir = fresh("plans-bin");
    let many = settled_copy("many", &dir);
    let env = [("XDG_CACHE_HOME", home.to_str().unwrap())];
    let (mut tables, mut kept) = (Vec::new(), Vec::new());
    for round in 0..2 {
        let plans = all_entries(&home).into_iter().filter(|p| is_plans(p)).collect::<Vec<_>>();
        match round {
            0 => assert!(plans.is_empty(), "{plans:?}"),
            _ => {
                assert_eq!(plans.len(), 1, "one entry of plans: {plans:?}");
                assert_whole(&plans[0]);
                age(&plans[0]);
                kept = std::fs::read(&plans[0]).unwrap();
            }
        }
        let mut t = Target::start_path(&many);
        let pid = t.pid.to_string();
        let code = executable_code(t.pid);
        let session = Session::spawn("attach", &["-p", &pid, "-f", "fn*", "-q"], &env, Some("tp: attached"));
        std::thread::sleep(Duration::from_millis(100));
        saved_while_attached(session.child.id());
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "{stderr}");
        let rows: Vec<(String, u64)> = stdout
            .lines()
            .filter(|l| l.starts_with("fn"))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w[0].to_string(), w[w.len() - 1].replace(',', "").parse().unwrap())
            })
            .collect();
        assert_eq!(rows.len(), 10_000, "{stderr}");
        assert!(rows.iter().all(|(_, hits)| *hits > 0), "every function counted: {stdout}");
        let mut names: Vec<String> = rows.into_iter().map(|(n, _)| n).collect();
        names.sort();
        tables.push(names);
        assert_eq!(executable_code(t.pid), code, "the code after the detach");
        // SAFETY: plain kill(2).
        unsafe { libc::kill(t.pid, libc::SIGUSR1) };
        let exit = t.out.wait_for("exit");
        assert!(exit.ends_with("checksum=ok"), "{exit}");
        if round == 1 {
            assert!(was_read(&plans[0]), "the second attach read the plans");
            assert_eq!(std::fs::read(&plans[0]).unwrap(), kept, "and had none to add");
        }
    }
    assert_eq!(tables[0], tables[1]);
}
