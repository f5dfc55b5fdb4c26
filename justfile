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

# Formatting and lints, as CI checks them.
[group('check')]
lint:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings

# What CI runs.
[group('check')]
ci:
    .ci/run

# The benchmark: tp beside uprobes, gdb and Frida, a few minutes, root (`just bench --doc` updates docs/benchmarks.md).
[group('bench')]
bench *ARGS: bench-peers
    cargo bench --bench tp -- {{ARGS}}

# Install the peers the benchmark compares with, if missing (gdb: Debian; Frida: PyPI).
[group('bench')]
bench-peers:
    command -v gdb >/dev/null || (apt-get update -qq && apt-get install -y -qq gdb) >/dev/null 2>&1 || echo "bench: gdb not installed"
    python3 -c 'import frida' 2>/dev/null || python3 -m pip install -q frida >/dev/null 2>&1 || echo "bench: Frida not installed (pip install frida)"
