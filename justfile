# tp's tasks. `just --list` shows them. CI runs .ci/run, which calls the
# same cargo commands, so `just` itself is optional.

# Run the demo: start a target, attach, show live hits, detach, check.
[group('dev')]
demo:
    cargo run --release -- demo

# Run every test (needs root or CAP_SYS_PTRACE for the end-to-end tests).
[group('test')]
test:
    cargo test

# Only the end-to-end tests against real processes.
[group('test')]
e2e:
    cargo test --test e2e

# Differential execution of relocated x86-64 windows (targets/reloc_harness.c).
[group('test')]
reloc:
    cargo test --test reloc

# Probe coverage of the Debian binaries docs/coverage.md lists.
[group('check')]
coverage:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release
    for b in /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/bin/python3 /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 /usr/lib/x86_64-linux-gnu/libcrypto.so.3 /usr/bin/perl; do
        target/release/tp list-probes "$b" --summary
    done

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

# What CI runs.
[group('check')]
ci:
    .ci/run
