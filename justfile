# tp's tasks. `just --list` shows them. CI runs .ci/run, which calls the
# same cargo commands, so `just` itself is optional.

# Run the demo: start a target, attach, show live hits, detach, check.
[group('dev')]
demo:
    cargo run --release -- demo

# Run every test (as root: ptrace, and the tests install the Debian packages
# they need, listed in tests/deps.txt).
[group('test')]
test:
    cargo test

# What the build, tests, benchmarks and CI use from outside the repository,
# and whether this machine has it (tests/deps.txt).
[group('check')]
doctor:
    tests/deps.sh doctor

# Only the end-to-end tests against real processes.
[group('test')]
e2e:
    cargo test --test e2e

# Differential execution of relocated x86-64 windows (targets/reloc_harness.c).
[group('test')]
reloc:
    cargo test --test reloc

# Probe coverage of the Debian binaries of tests/coverage.txt (docs/coverage.md).
[group('check')]
coverage:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release
    tests/deps.sh need --group test
    tests/coverage.sh target/release/tp

# The AArch64 stage: installs Debian's cross toolchain and QEMU (apt, as
# root), runs the differential relocation tests under qemu-aarch64, then
# the unit and end-to-end tests inside an arm64 VM.
[group('test')]
aarch64:
    .ci/aarch64/stage.sh

# Formatting and lints, as CI checks them.
[group('check')]
lint:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings
    .ci/check-arch-boundary

# What CI runs.
[group('check')]
ci:
    .ci/run

# The hot-toggling stress test at full length: 1000 attach/detach cycles
# under four hot threads (CI runs 200).
[group('test')]
stress cycles="1000":
    TP_STRESS_CYCLES={{cycles}} cargo test --release --test e2e stress -- --nocapture

# The dated nightly of tests/fuzz/rust-toolchain.toml, which `just fuzz` builds with.
fuzz_toolchain := `sed -nE 's/^channel *= *"([^"]+)".*/\1/p' tests/fuzz/rust-toolchain.toml`

# Fuzz every target of tests/fuzz: the list-probes path, the x86-64 planner,
# the data region's reader, seccomp filters, cache entries, static probe
# notes, line tables, debuginfod answers, predicates, stack words and perf
# maps, for a bounded time each (needs cargo-fuzz and the nightly that
# tests/fuzz/rust-toolchain.toml pins, which tests/deps.sh installs). Crashes land in
# tests/fuzz/artifacts/; copy each into tests/fuzz/regressions/<target>/,
# where the e2e tests replay them.
[group('test')]
fuzz seconds="60":
    tests/deps.sh need --group fuzz
    mkdir -p tests/fuzz/corpus/list_probes tests/fuzz/corpus/plan_x86_64 tests/fuzz/corpus/region
    cargo build
    find "$(ls -td target/debug/build/tp-*/out/targets | head -1)" -maxdepth 1 -type f -exec cp {} tests/fuzz/corpus/list_probes/ +
    cp tests/fuzz/regressions/list_probes/* tests/fuzz/corpus/list_probes/ 2>/dev/null || true
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz list_probes tests/fuzz/corpus/list_probes -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz plan_x86_64 tests/fuzz/corpus/plan_x86_64 -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo test --test e2e write_fuzz_seeds -- --ignored
    cp tests/fuzz/regressions/region/* tests/fuzz/corpus/region/ 2>/dev/null || true
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz region tests/fuzz/corpus/region -- -max_total_time={{seconds}} -rss_limit_mb=4096
    mkdir -p tests/fuzz/corpus/seccomp_bpf
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz seccomp_bpf tests/fuzz/corpus/seccomp_bpf -- -max_total_time={{seconds}} -rss_limit_mb=4096
    mkdir -p tests/fuzz/corpus/cache_entry
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz cache_entry tests/fuzz/corpus/cache_entry -- -max_total_time={{seconds}} -rss_limit_mb=4096
    mkdir -p tests/fuzz/corpus/sdt_notes tests/fuzz/corpus/line_table tests/fuzz/corpus/http_response
    cp tests/fuzz/corpus/list_probes/sdt tests/fuzz/corpus/list_probes/lines tests/fuzz/corpus/line_table/
    cp tests/fuzz/corpus/list_probes/sdt tests/fuzz/corpus/sdt_notes/
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz sdt_notes tests/fuzz/corpus/sdt_notes -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz line_table tests/fuzz/corpus/line_table -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz http_response tests/fuzz/corpus/http_response -- -max_total_time={{seconds}} -rss_limit_mb=4096
    mkdir -p tests/fuzz/corpus/predicate tests/fuzz/corpus/stack_words tests/fuzz/corpus/perf_map
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz predicate tests/fuzz/corpus/predicate -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz stack_words tests/fuzz/corpus/stack_words -- -max_total_time={{seconds}} -rss_limit_mb=4096
    cargo +{{fuzz_toolchain}} fuzz run --fuzz-dir tests/fuzz perf_map tests/fuzz/corpus/perf_map -- -max_total_time={{seconds}} -rss_limit_mb=4096

# The benchmark: tp beside uprobes, gdb and Frida, a few minutes, root (`just bench --doc` updates docs/benchmarks.md).
[group('bench')]
bench *ARGS: bench-peers
    cargo bench --bench tp -- {{ARGS}}

# Install the peers the benchmark compares with, if missing (gdb: Debian; Frida: PyPI).
[group('bench')]
bench-peers:
    tests/deps.sh need --group bench || true
