#!/usr/bin/env python3
"""The cost of `tp profile` on real programs.

Each program does a fixed job, alternately unprofiled and under
`tp profile -f '*'` (every probeable function of the program, attached
before the job starts and detached when it ends). The job's cost is the CPU
time the program used for it (user + system), which a busy machine disturbs
less than wall time. Prints, per program, the median and min-max of each,
the slowdown, tp's own CPU time, the toggles and samples per second tp
reported, and whether the job's output was identical.

    python3 benches/profile/overhead.py [--runs 5] [--only python|redis]

Needs a release build of tp (cargo build --release), /usr/bin/python3.11
and redis-server / redis-benchmark (Debian packages python3.11, redis-server).
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TP = os.path.join(HERE, "..", "..", "target", "release", "tp")


class Counter:
    """Count-only probes on every function (`tp attach --keep`), for comparison."""

    def __init__(self, pid):
        self.pid = pid
        out = subprocess.run([TP, "attach", "-p", str(pid), "-f", "*", "--keep"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("tp attach failed:\n" + out.stderr)
        self.functions = int(re.search(r"attached (\d+) probes", out.stderr).group(1))

    def stop(self):
        status = subprocess.run([TP, "status", "-p", str(self.pid), "--json"], capture_output=True, text=True)
        subprocess.run([TP, "detach", "-p", str(self.pid)], capture_output=True)
        processes = json.loads(status.stdout)["processes"] if status.returncode == 0 else []
        probes = processes[0]["probes"] if processes else []
        table = json.dumps({"processes": [{"probes": [{"hits": p["hits"]} for p in probes]}]})
        return {"functions": self.functions, "cpu": 0.0, "toggles": 0, "samples": 0, "table": table, "counts": True}


def session(pid, extra):
    """What a profiled run attaches: `tp profile` with `extra`, or count-only probes."""
    return Counter(pid) if extra == "count" else Profiler(pid, extra)


class Profiler:
    """A `tp profile` session on one process."""

    def __init__(self, pid, extra):
        cmd = [TP, "profile", "-p", str(pid), "-f", "*", "--json"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        # Wait until the probes are live.
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("tp: profiling"):
                return
        raise SystemExit("tp profile failed:\n" + "".join(self.lines))

    def stop(self):
        """Stops tp (if the target has not ended it) and returns its report."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        out = self.proc.stdout.read()
        self.lines += self.proc.stderr.readlines()
        err = "".join(self.lines)
        if self.proc.returncode != 0:
            raise SystemExit("tp profile failed:\n" + err)
        m = re.search(r"profiling (\d+) functions", err)
        rate = re.search(r"([\d,]+) toggles/s, ([\d,]+) samples/s", err)
        return {
            "functions": int(m.group(1)),
            "cpu": usage.ru_utime + usage.ru_stime,
            "toggles": int(rate.group(1).replace(",", "")),
            "samples": int(rate.group(2).replace(",", "")),
            "table": out,
        }


def rows_of(table):
    """The function rows of tp's JSON summary document (docs/output.md)."""
    processes = json.loads(table)["processes"]
    return processes[0]["probes"] if processes else []


def python_job(profile_args, rounds):
    """The workload script under /usr/bin/python3.11: (CPU seconds, output, report)."""
    proc = subprocess.Popen(
        ["/usr/bin/python3.11", os.path.join(HERE, "workload.py"), str(rounds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    prof = session(proc.pid, profile_args) if profile_args is not None else None
    out, _ = proc.communicate("go\n")
    if proc.returncode != 0:
        raise SystemExit(f"python exited {proc.returncode}")
    report = prof.stop() if prof else None
    m = re.match(r"result (\d+) seconds ([\d.]+) cpu ([\d.]+)", out)
    return float(m.group(3)), m.group(1), report


def cpu_seconds(pid):
    """User and system CPU time a process has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_job(profile_args, requests):
    """redis-benchmark's fixed job against a fresh redis-server: (the server's CPU seconds, dataset digest, report)."""
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--enable-debug-command", "yes"],
        stdout=subprocess.DEVNULL,
    )
    cli = ["redis-cli", "-p", str(port)]
    for _ in range(500):
        if subprocess.run(cli + ["ping"], capture_output=True, text=True).stdout.strip() == "PONG":
            break
        time.sleep(0.01)
    prof = session(server.pid, profile_args) if profile_args is not None else None
    start = cpu_seconds(server.pid)
    subprocess.run(
        ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "10", "-q",
         "-t", "set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,lrange_100,mset"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = cpu_seconds(server.pid) - start
    digest = subprocess.run(cli + ["debug", "digest"], capture_output=True, text=True).stdout.strip()
    report = prof.stop() if prof else None
    subprocess.run(cli + ["shutdown", "nosave"], capture_output=True)
    server.wait()
    if server.returncode != 0:
        raise SystemExit(f"redis-server exited {server.returncode}")
    return seconds, digest, report


PROGRAMS = {
    "python": ("python3.11 running benches/profile/workload.py", python_job, 1500),
    "redis": ("redis-server under redis-benchmark (13 commands, 10 clients)", redis_job, 40000),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=sorted(PROGRAMS))
    ap.add_argument("--sample", default="10")
    ap.add_argument("--epoch", default="10ms")
    ap.add_argument("--size", type=int, help="rounds (python) or requests per command (redis)")
    ap.add_argument("--count-only", action="store_true", help="count every function instead of profiling")
    args = ap.parse_args()
    if not os.path.exists(TP):
        raise SystemExit("no release build of tp: run `cargo build --release` first")
    for tool in ["/usr/bin/python3.11", "redis-server", "redis-benchmark", "redis-cli"]:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing: apt-get install python3.11 redis-server")
    extra = "count" if args.count_only else ["--sample", args.sample, "--epoch", args.epoch]
    rows = []
    for name, (what, job, size) in PROGRAMS.items():
        if args.only and name != args.only:
            continue
        size = args.size or size
        base, prof, reports, outputs = [], [], [], set()
        for run in range(args.runs):
            # Alternate, so slow phases of a noisy machine hit both alike.
            for profiled in (False, True) if run % 2 == 0 else (True, False):
                secs, output, report = job(extra if profiled else None, size)
                (prof if profiled else base).append(secs)
                outputs.add(output)
                if report:
                    reports.append(report)
                print(f"{name} run {run + 1} {'profiled' if profiled else 'plain   '} {secs:.3f} s", file=sys.stderr)
        rows.append((name, what, base, prof, reports, len(outputs) == 1))
    for name, _, _, _, reports, _ in rows:
        if reports[-1].get("counts"):
            continue
        top = rows_of(reports[-1]["table"])[:8]
        print(f"\n{name}: the top functions of the last profiled run\n")
        print("| function | samples | calls | mean | p50 | p99 | time |")
        print("|---|---|---|---|---|---|---|")
        for f in top:
            ns = lambda v: "-" if v is None else f"{v / 1000:.2f} µs"
            print(f"| {f['func']} | {f['timed']:,} | {f['hits']:,} | {ns(f['avg_ns'])} | {ns(f['p50_ns'])} "
                  f"| {ns(f['p99_ns'])} | {100 * f['time_share']:.1f} % |")
    print()
    print("| program | functions | plain: CPU s (median, min-max) | profiled | slowdown | probed calls | extra per call | tp CPU | toggles/s | samples/s | output identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, what, base, prof, reports, same in rows:
        b, p = statistics.median(base), statistics.median(prof)
        span = lambda xs: f"{statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})"
        # Calls of probed functions in one job (exact: the counters), and
        # what the slowdown comes to per call.
        table = reports[-1]["table"]
        calls = sum(f["hits"] for f in rows_of(table)) if table else None
        per_call = f"{(p - b) / calls * 1e9:+.2f} ns" if calls else "-"
        print(
            f"| {what} | {reports[0]['functions']} | {span(base)} | {span(prof)} | {100 * (p / b - 1):+.1f} % "
            f"| {f'{calls:,}' if calls else '-'} | {per_call} "
            f"| {statistics.median(r['cpu'] for r in reports):.2f} s "
            f"| {statistics.median_low(r['toggles'] for r in reports):,} "
            f"| {statistics.median_low(r['samples'] for r in reports):,} "
            f"| {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
