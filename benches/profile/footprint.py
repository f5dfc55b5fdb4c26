#!/usr/bin/env python3
"""What a probe costs when the program calls many different functions.

targets/many.c's `spread N` mode calls N of its 10,000 functions in a random
order, one indirect call each, and prints its own ns per call every 5 million
calls. In one process this script measures: unprobed; every function counted
(`tp attach -f 'fn*' --keep`); every probe disabled (`tp disable --all`);
unprobed again after `tp detach`. The extra ns per call is the phase's
median minus the mean of the two unprobed medians. With N = 1 the probed
function, its detour and its counter stay in the L1 caches and the branch
predictors know both jumps; with N = 4096 they do not, as in a real program
whose calls spread over many functions.

    cargo build --release && chrt -f 20 python3 benches/profile/footprint.py
"""

import argparse
import os
import platform
import signal
import statistics
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TP = os.path.join(ROOT, "target", "release", "tp")
MANY = os.path.join(ROOT, "targets", "bin", platform.machine(), "many")


def tp(*args):
    out = subprocess.run([TP, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"tp {' '.join(args)} failed:\n{out.stderr}")
    return out


def one_round(span, phase_s):
    """One process through the four phases: {phase: median ns per call}."""
    proc = subprocess.Popen([MANY, "spread", str(span)], stdout=subprocess.PIPE, text=True)
    if not proc.stdout.readline().startswith("ready"):
        raise SystemExit("many did not start")
    lines, tail = [], []

    def read():
        for line in proc.stdout:
            if line.startswith("ns/call"):
                lines.append((time.monotonic(), float(line.split()[1])))
            else:
                tail.append(line)

    threading.Thread(target=read, daemon=True).start()
    pid = str(proc.pid)
    spans = {}

    def phase(name):
        start = time.monotonic() + 0.3  # let the change settle
        time.sleep(phase_s)
        spans[name] = (start, time.monotonic())

    phase("before")
    tp("attach", "-p", pid, "-f", "fn*", "--keep")
    phase("counted")
    tp("disable", "-p", pid, "--all")
    phase("disabled")
    tp("detach", "-p", pid)
    phase("after")
    proc.send_signal(signal.SIGUSR1)
    proc.wait(timeout=30)
    time.sleep(0.1)
    if proc.returncode != 0 or not any("checksum=ok" in t for t in tail):
        raise SystemExit(f"many spread {span}: exit {proc.returncode}, {tail}")
    out = {}
    for name, (a, b) in spans.items():
        values = [v for t, v in lines if a <= t <= b]
        if not values:
            raise SystemExit(f"no measurement in phase {name}; raise --phase")
        out[name] = statistics.median(values)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", default="1,64,4096", help="how many functions the calls spread over")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phase", type=float, default=2.0, help="seconds per phase")
    args = ap.parse_args()
    for path, fix in [(TP, "cargo build --release"), (MANY, "cargo build")]:
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run `{fix}` first")
    print("| functions called | unprobed ns/call | counted: extra | disabled: extra |")
    print("|---|---|---|---|")
    for span in [int(s) for s in args.spans.split(",")]:
        base, counted, disabled = [], [], []
        for _ in range(args.rounds):
            r = one_round(span, args.phase)
            b = (r["before"] + r["after"]) / 2
            base.append(b)
            counted.append(r["counted"] - b)
            disabled.append(r["disabled"] - b)
        show = lambda xs: f"{statistics.median(xs):+.2f} ns ({min(xs):+.2f} to {max(xs):+.2f})"
        print(f"| {span:,} | {statistics.median(base):.2f} | {show(counted)} | {show(disabled)} |", flush=True)


if __name__ == "__main__":
    main()
