#!/usr/bin/env bash
# bench.sh [BENCH OPTIONS]: the AArch64 section of docs/benchmarks.md.
# Builds the benchmark (benches/tp) for aarch64, runs it in the arm64 VM
# (-cpu max: LSE, PAC, BTI; VM_CPU=cortex-a57 for the other) with
# `--emulated --only steps,hit --no-peers --reps 3` (plus BENCH OPTIONS),
# and writes its report between the AArch64 markers of docs/benchmarks.md.
# The instruction counts are exact; the times are the emulator's (TCG), and
# the report says so. Root, as stage.sh; about 15 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
export CARGO_TERM_COLOR=never
toolchain=$PWD/target/aarch64-toolchain
"$here/setup-host.sh" "$toolchain"
source "$here/env.sh" "$toolchain"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
VM_CPU=${VM_CPU:-max,pauth-impdef=on} VM_TIMEOUT=${VM_TIMEOUT:-3600} \
  $cargo bench "${target[@]}" --bench tp -- --emulated --only steps,hit --no-peers --reps 3 "$@" | tee "$out"
python3 - "$out" docs/benchmarks.md <<'PY'
import sys
log, doc = sys.argv[1], sys.argv[2]
text = open(log, encoding="utf-8", errors="replace").read().replace("\r", "")
b, e = "<!-- emulated results -->", "<!-- end of emulated results -->"
if b not in text or e not in text:
    sys.exit("bench.sh: the benchmark printed no report")
report = text[text.index(b) + len(b):text.index(e)].strip("\n")
# The VM's console may put kernel lines among the report's.
report = "\n".join(l for l in report.split("\n") if not l.startswith("["))
d = open(doc, encoding="utf-8").read()
db, de = "<!-- aarch64 results: written by .ci/aarch64/bench.sh -->", "<!-- end of aarch64 results -->"
if db not in d or de not in d:
    sys.exit(f"bench.sh: {doc} has no AArch64 result markers")
d = d[:d.index(db) + len(db)] + "\n\n" + report + "\n\n" + d[d.index(de):]
open(doc, "w", encoding="utf-8").write(d)
print(f"bench.sh: the AArch64 results are in {doc}", file=sys.stderr)
PY
