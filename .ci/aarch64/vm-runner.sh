#!/usr/bin/env bash
# vm-runner.sh BINARY [ARGS...]
#
# The cargo `runner` for aarch64-unknown-linux-gnu: runs each (static) test
# binary inside a real arm64 Linux VM (run-in-vm.sh) and exits with its
# status, so `cargo test --target aarch64-unknown-linux-gnu` runs the tests
# against a real kernel (ptrace does not work under qemu-user).
#
# Every test binary gets the target programs build.rs put in its OUT_DIR
# (the newest build/tp-*/out/targets of the binary's profile), also at the
# path the build compiled in (TP_TARGETS_DIR, for unit tests that read
# them), and the tp binary built next to it, also at its build path (the
# benchmark's CARGO_BIN_EXE_tp); the end-to-end tests (tests/e2e, named
# e2e-HASH) find both through TP_TEST_TP and TP_TEST_TARGETS. Binaries are
# copied without their DWARF (symbols stay, for backtraces) to keep the
# initramfs small.
# Variables named in VM_PASS_ENV (default: RUST_BACKTRACE) reach the guest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${1:?usage: vm-runner.sh BINARY [ARGS...]}
shift
payload=$(mktemp -d)
trap 'rm -rf "$payload"' EXIT
# /t in the guest takes this directory's mode: other users (the tests run
# tp as nobody) must reach the binaries.
chmod 755 "$payload"
name=$(basename "$bin")
aarch64-linux-gnu-strip --strip-debug -o "$payload/$name" "$bin"
profile_dir=$(dirname "$(dirname "$bin")")
targets=$(ls -td "$profile_dir"/build/tp-*/out/targets 2>/dev/null | head -1)
[[ -n $targets ]] || { echo "vm-runner: no targets under $profile_dir/build (cargo's build script makes them)" >&2; exit 2; }
cp -a "$targets" "$payload/targets"
env_lines=("mkdir -p '$(dirname "$targets")' && ln -s /t/targets '$targets'")
tp=$profile_dir/tp
if [[ $name == e2e-* && ! -x $tp ]]; then
  echo "vm-runner: $tp missing (cargo builds it for the e2e tests)" >&2; exit 2
fi
if [[ -x $tp ]]; then
  aarch64-linux-gnu-strip --strip-debug -o "$payload/tp" "$tp"
  env_lines+=("ln -sf /t/tp '$tp'" "export TP_TEST_TP=/t/tp TP_TEST_TARGETS=/t/targets")
fi
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
  for line in "${env_lines[@]}"; do echo "$line"; done
  for v in ${VM_PASS_ENV:-RUST_BACKTRACE}; do
    [[ -n ${!v:-} ]] && echo "export $v=$(q "${!v}")"
  done
  printf './%s' "$name"
  for a in "$@"; do printf ' %s' "$(q "$a")"; done
  echo
} > "$payload/test.sh"
export VM_CACHE=${VM_CACHE:-$repo/target/aarch64-vm}
# guest console -> our stdout; run-in-vm's own messages -> stderr
exec "$here/run-in-vm.sh" "$payload"
