"""A fixed job for the profiling overhead benchmark: json, regular
expressions, recursion, sorting with a key, classes and string formatting.
Waits for a line on stdin (so a profiler can attach first), then prints the
job's result, the seconds it took and the CPU seconds it used."""

import json
import re
import sys
import time


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def norm1(self):
        return abs(self.x) + abs(self.y)


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def job(rounds):
    acc = 0
    for i in range(rounds):
        d = {"k%d" % j: [j, str(j), j * 1.5] for j in range(200)}
        s = json.dumps(d, sort_keys=True)
        acc += len(json.loads(s))
        acc += len(re.findall(r"k\d+", s))
        acc += fib(16)
        acc += sum(sorted(range(2000), key=lambda x: -x)[:10])
        acc += sum(Point(j, -j).norm1() for j in range(300))
        acc += len(" ".join(f"{j:05d}" for j in range(300)).split())
    return acc


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
sys.stdin.readline()
start, cpu = time.perf_counter(), time.process_time()
result = job(rounds)
print(f"result {result} seconds {time.perf_counter() - start:.3f} cpu {time.process_time() - cpu:.3f}", flush=True)
