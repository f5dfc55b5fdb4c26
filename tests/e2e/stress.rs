//! Hot toggling: four threads call two probed functions as fast as they can,
//! each checking every result, while tp attaches and detaches again and
//! again. Every cycle counts: between attach and detach, four more threads
//! call a third probed function an exact number of times, and tp's count
//! must equal it; the hot counts must lie between what the hot threads
//! provably did while the probes were live and everything they did in the
//! cycle.
//!
//! `TP_STRESS_CYCLES` sets the number of cycles (default 200, as in CI;
//! `just stress` runs 1000; 20 in the arm64 test VM, whose CPU is emulated).

use std::time::Instant;

use crate::util::*;

const HOT_THREADS: u64 = 4;
/// Calls per batch in `targets/hammer.c`.
const BATCH: u64 = 1000;
const BURST_CALLS: u64 = 5_000;
const BURST_THREADS: u64 = 4;

#[cfg(target_arch = "x86_64")]
const DEFAULT_CYCLES: u64 = 200;
#[cfg(target_arch = "aarch64")]
const DEFAULT_CYCLES: u64 = 20;

fn cycles() -> u64 {
    std::env::var("TP_STRESS_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CYCLES)
}

/// (a, b): exact calls of hot_a and hot_b so far.
fn counts(t: &mut Target) -> (u64, u64) {
    let line = t.ask("counts", "counts");
    (field(&line, "a"), field(&line, "b"))
}

#[test]
fn hot_toggling_keeps_every_result_and_every_count_exact() {
    let cycles = cycles();
    let mut t = Target::start("hammer");
    t.ask(&format!("start {HOT_THREADS}"), "started 4");
    let pid = t.pid.to_string();
    let args = ["-p", pid.as_str(), "-f", "hot_a", "-f", "hot_b", "-f", "measured", "--json"];
    let started = Instant::now();
    for cycle in 1..=cycles {
        let (a0, b0) = counts(&mut t);
        let session = Session::start(&args);
        let burst = t.ask(&format!("burst {BURST_CALLS} {BURST_THREADS}"), "burst");
        assert!(burst.ends_with("checksum=ok"), "cycle {cycle}: {burst}");
        let (status, stdout, stderr) = session.interrupt();
        assert!(status.success(), "cycle {cycle}: tp failed: {stderr}");
        assert!(stderr.contains("code restored"), "cycle {cycle}: {stderr}");
        let (a1, b1) = counts(&mut t);
        let hits = hits_from_json(&stdout);

        assert_eq!(hits["measured"], BURST_CALLS * BURST_THREADS, "cycle {cycle}: measured");
        // Each hot thread finished a whole batch while the probes were live;
        // no probe can count a call the threads did not make (one call per
        // thread may be under way when the target reports its counts).
        for (name, hit, before, after) in [("hot_a", hits["hot_a"], a0, a1), ("hot_b", hits["hot_b"], b0, b1)] {
            assert!(hit >= HOT_THREADS * BATCH, "cycle {cycle}: {name} counted {hit}, less than one batch per thread");
            assert!(
                hit <= after - before + HOT_THREADS,
                "cycle {cycle}: {name} counted {hit}, more than the {} calls made",
                after - before
            );
        }
        let check = t.ask("check", "check");
        assert_eq!(field(&check, "errors"), 0, "cycle {cycle}: {:#?}", t.out.seen);
        // A detach that finds a hot thread inside a detour keeps tp's memory;
        // the next attach reuses it, so cycles never add mappings.
        let (regions, arenas) = tp_mappings(t.pid);
        assert!(regions <= 1 && arenas <= 1, "cycle {cycle}: {regions} regions, {arenas} code arenas");
    }
    assert_code_is_original(&t, &["hot_a", "hot_b", "measured"]);
    assert!(t.quit().success(), "the target must exit cleanly with every checksum intact");
    eprintln!(
        "stress: {cycles} attach/detach cycles under 4 hot threads in {:.1} s, 0 errors",
        started.elapsed().as_secs_f64()
    );
}

/// (data regions, anonymous executable mappings) in the process.
fn tp_mappings(pid: i32) -> (usize, usize) {
    let maps = tp::process::read_maps(pid).unwrap();
    let regions = maps.iter().filter(|m| m.path.starts_with("/memfd:tp-data")).count();
    let arenas = maps.iter().filter(|m| m.exec && m.path.is_empty()).count();
    (regions, arenas)
}
