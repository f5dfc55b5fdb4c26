#!/usr/bin/env bash
# coverage.sh TP: prints `TP list-probes BINARY --summary` for every binary
# of tests/coverage.txt (docs/coverage.md records the figures).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tp=${1:?usage: tests/coverage.sh PATH-TO-TP}
grep -v '^[[:space:]]*\(#\|$\)' "$here/coverage.txt" | while read -r binary _; do
    "$tp" list-probes "$binary" --summary
done
