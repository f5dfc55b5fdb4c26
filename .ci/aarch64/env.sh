# env.sh TOOLCHAIN_DIR: sourced by stage.sh and bench.sh, after
# setup-host.sh: builds for aarch64 with Debian's Rust and the unpacked
# cross toolchain, and runs test and bench binaries in the arm64 VM.
#
# Debian's cargo, rustc, cargo-clippy and clippy-driver must all win over
# rustup's proxies in ~/.cargo/bin (else: E0514 "compiled by an incompatible
# version of rustc" when clippy-driver 1.95 meets deps built by rustc 1.96).
toolchain=${1:?usage: source env.sh TOOLCHAIN_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$toolchain/usr/bin:/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="--sysroot $toolchain/usr -C target-feature=+crt-static"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$here/vm-runner.sh
export VM_PASS_ENV="RUST_BACKTRACE TP_TEST_ATOMICS TP_TEST_CPU TP_STRESS_CYCLES"
cargo=/usr/bin/cargo
target=(--target aarch64-unknown-linux-gnu)
