#!/usr/bin/env python3
"""What one call of a probed function costs, per probe state.

The counter target calls foo (a leaf of a few instructions) N times in a
loop; this times the loop with foo plain, counted (`tp attach --keep`),
switched off (`tp disable`), under `tp profile` with one sample per second
(nearly every call is counted and counted down, not timed), and under
`tp profile` timing every call. Rounds alternate through the states; each
loop's time is the best of three, and each figure the best and the median
over rounds, in ns per call (noise only ever adds time, so the best is the
steadier figure on a busy machine), with the extra over plain. Also times `tp disable` + `tp enable`
(two tp processes: the store itself is one byte).

The plain, counted and disabled states are also rows of `cargo bench --bench
tp` (benches/tp/hit.rs), which compares tp with its peers; here they are the
baselines of the profile states, measured in the same loop and rounds.

    python3 benches/profile/hit_cost.py [--rounds 5] [--calls 5000000]

On a busy machine, `chrt -f 20` in front keeps other work from preempting
the loops.

Needs a release build of tp (cargo build --release) and the bundled
targets (built by cargo build).
"""

import argparse
import os
import platform
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TP = os.path.join(ROOT, "target", "release", "tp")


class Target:
    def __init__(self):
        path = os.path.join(ROOT, "targets", "bin", platform.machine(), "counter")
        # On one CPU, so the loops do not migrate; tp runs elsewhere.
        self.proc = subprocess.Popen(["taskset", "-c", str(os.cpu_count() - 1), path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = int(self.proc.stdout.readline().split("=")[1])

    def ns_per_call(self, n):
        best = None
        for _ in range(3):
            start = time.perf_counter_ns()
            self.proc.stdin.write(f"call foo {n} 1\n")
            line = self.proc.stdout.readline()
            took = (time.perf_counter_ns() - start) / n
            if not line.endswith("checksum=ok\n"):
                raise SystemExit(f"counter: {line}")
            best = took if best is None else min(best, took)
        return best

    def quit(self):
        self.proc.stdin.write("quit\n")
        if self.proc.wait() != 0:
            raise SystemExit("counter exited with an error")


def tp(*args):
    out = subprocess.run([TP, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"tp {' '.join(args)}: {out.stderr}")


class Profile:
    def __init__(self, pid, *args):
        self.proc = subprocess.Popen([TP, "profile", "-p", str(pid), "-f", "foo", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("tp: profiling"):
                return
        raise SystemExit("tp profile failed")

    def stop(self):
        self.proc.send_signal(2)
        self.proc.stderr.read()
        if self.proc.wait() != 0:
            raise SystemExit("tp profile failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5_000_000)
    args = ap.parse_args()
    t = Target()
    pid = str(t.pid)
    n = args.calls
    states = ["plain", "counted", "disabled", "profile, call not sampled", "profile, every call timed"]
    results = {k: [] for k in states}
    toggles = []
    for _ in range(args.rounds):
        results["plain"].append(t.ns_per_call(n))
        tp("attach", "-p", pid, "-f", "foo", "--keep")
        results["counted"].append(t.ns_per_call(n))
        start = time.perf_counter()
        tp("disable", "-p", pid, "-f", "foo")
        tp("enable", "-p", pid, "-f", "foo")
        toggles.append((time.perf_counter() - start) / 2)
        tp("disable", "-p", pid, "-f", "foo")
        results["disabled"].append(t.ns_per_call(n))
        tp("detach", "-p", pid)
        p = Profile(t.pid, "--sample", "1", "--epoch", "1s")
        results["profile, call not sampled"].append(t.ns_per_call(n))
        p.stop()
        p = Profile(t.pid, "--sample", "500000", "--epoch", "1ms")
        results["profile, every call timed"].append(t.ns_per_call(n // 10))
        p.stop()
    t.quit()
    best, median = min(results["plain"]), statistics.median(results["plain"])
    print("| foo's state | ns per call: best, median | extra over plain: best, median |")
    print("|---|---|---|")
    for state, xs in results.items():
        b, m = min(xs), statistics.median(xs)
        extra = "" if state == "plain" else f"{b - best:+.2f} ns, {m - median:+.2f} ns"
        print(f"| {state} | {b:.2f}, {m:.2f} | {extra} |")
    print(f"\n`tp disable` or `tp enable`, the whole command: {statistics.median(toggles) * 1e3:.1f} ms (median)")


if __name__ == "__main__":
    main()
