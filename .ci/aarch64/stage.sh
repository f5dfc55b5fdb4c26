#!/usr/bin/env bash
# stage.sh: tp's AArch64 CI stage. Run from anywhere, as root, on Debian
# bookworm x86-64 with rustup's toolchain; installs the rest with apt.
#
#   1. setup-host.sh: Debian's rustc-web, qemu-user and qemu-system-aarch64
#      (apt), the prebuilt arm64 std and the aarch64 cross gcc and g++
#      (unpacked into target/aarch64-toolchain)
#   2. differential relocation tests (x86-64 host, qemu-aarch64 user mode):
#      every rewrite class, and the whole event detour after paciasp/pacibsp
#   3. clippy for aarch64 (Debian's 1.96 toolchain)
#   4. unit and end-to-end tests for aarch64, each test binary in its own
#      arm64 VM (vm-runner.sh), built with --release (the VM emulates its
#      CPU, tens of times slower than a real one; the debug build of tp ten
#      times slower again): first everything on `-cpu max` (LSE atomics,
#      BTI, PAC), then the suites of counting, events, returns, recursion,
#      exceptions, tp profile, stacks, fork and blocked threads again on a
#      Cortex-A57 (ARMv8.0: no LSE, so the detours count with ldxr/stxr; no
#      BTI, so the BTI test is left out; no PAC, so paciasp and autiasp are
#      NOPs); sites:: and usdt:: for the detours inside functions
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

source "$here/env.sh" "$toolchain"

step "clippy for aarch64 ($($cargo -V))"
$cargo clippy "${target[@]}" --all-targets -- -D warnings

step "build the aarch64 tests (release)"
$cargo test --release "${target[@]}" --lib --test e2e --no-run

step "tests in the VM, -cpu max"
# Left out here, run by the x86-64 stage: unit tests of the analysis cache
# and of reading DWARF one unit at a time that read Debian's libc with its
# debug file and the host-only targets (C++, Rust), which the statically
# linked arm64 test binaries and the VM do not have. The code they test
# reads files and is the same on both architectures.
host_files_tests=(
  symbols::dwarf_index::tests::one_unit_at_a_time_answers_as_the_whole_index
  symbols::dwarf_index::tests::one_unit_of_libc_answers_as_the_whole_index
  symbols::dwarf_index::tests::one_function_inflates_only_as_far_as_its_unit
  symbols::saved::tests::an_analysis_reads_back_as_computed
  symbols::saved::tests::libc_and_its_debug_file_read_back_as_computed
  symbols::saved::tests::the_key_names_the_file_and_the_places_its_debug_file
  symbols::entries::tests::scanning_for_one_window_finds_what_decoding_everything_finds
  session::exe::tests::a_library_is_told_from_a_program_and_found_among_what_a_program_needs
)
skips=()
for t in "${host_files_tests[@]}"; do skips+=(--skip "$t"); done
# The whole e2e suite takes about ten minutes in the VM: room for twice that.
VM_TIMEOUT=1500 VM_CPU=max,pauth-impdef=on TP_TEST_CPU=max TP_TEST_ATOMICS=lse \
  $cargo test --release "${target[@]}" --lib --test e2e -- "${skips[@]}"

step "e2e tests in the VM, -cpu cortex-a57"
# The suites named are run (libtest's filters), except tests with "bti" in
# their names.
a57_suites=(attach:: aarch64:: events:: profile:: fork_events:: blocked:: stacks:: sites:: usdt:: steps::)
VM_TIMEOUT=1200 VM_CPU=cortex-a57 TP_TEST_CPU=cortex-a57 TP_TEST_ATOMICS=exclusive $cargo test --release "${target[@]}" --test e2e -- \
  --skip bti "${a57_suites[@]}"

step "passed"
