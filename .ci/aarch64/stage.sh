#!/usr/bin/env bash
# stage.sh: tp's AArch64 CI stage. Run from anywhere, as root, on Debian
# bookworm x86-64 with rustup's toolchain; installs the rest with apt.
#
#   1. setup-host.sh: Debian's rustc-web, qemu-user and qemu-system-aarch64
#      (apt), the prebuilt arm64 std and the aarch64 cross gcc (unpacked
#      into target/aarch64-toolchain)
#   2. differential relocation tests (x86-64 host, qemu-aarch64 user mode)
#   3. clippy for aarch64 (Debian's 1.96 toolchain)
#   4. unit and end-to-end tests for aarch64, each test binary in its own
#      arm64 VM (vm-runner.sh): first on `-cpu max` (LSE atomics, BTI, PAC),
#      then the counting e2e tests (attach::, aarch64::, and sites::,
#      usdt:: for the detours inside functions) again on a Cortex-A57
#      (ARMv8.0: no LSE, so the detours count with ldxr/stxr; no BTI, so
#      the BTI test is left out)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
export CARGO_TERM_COLOR=never
start=$(date +%s)
step() { echo "== aarch64: $* ($(( $(date +%s) - start )) s)"; }

step "setup"
toolchain=$PWD/target/aarch64-toolchain
"$here/setup-host.sh" "$toolchain"
export PATH=$toolchain/usr/bin:$PATH

step "differential relocation tests under qemu-aarch64"
cargo clippy --features qemu-tests --test reloc_aarch64 -- -D warnings
cargo test --features qemu-tests --test reloc_aarch64

# Debian's cargo, rustc, cargo-clippy and clippy-driver must all win over
# rustup's proxies in ~/.cargo/bin (else: E0514 "compiled by an incompatible
# version of rustc" when clippy-driver 1.95 meets deps built by rustc 1.96).
export PATH=$toolchain/usr/bin:/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="--sysroot $toolchain/usr -C target-feature=+crt-static"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$here/vm-runner.sh
export VM_PASS_ENV="RUST_BACKTRACE TP_TEST_ATOMICS"
cargo=/usr/bin/cargo
target=(--target aarch64-unknown-linux-gnu)

step "clippy for aarch64 ($($cargo -V))"
$cargo clippy "${target[@]}" --all-targets -- -D warnings

step "tests in the VM, -cpu max"
VM_CPU=max,pauth-impdef=on TP_TEST_ATOMICS=lse $cargo test "${target[@]}" --lib --test e2e

step "e2e tests in the VM, -cpu cortex-a57"
VM_CPU=cortex-a57 TP_TEST_ATOMICS=exclusive $cargo test "${target[@]}" --test e2e -- --skip bti attach:: aarch64:: sites:: usdt::

step "passed"
