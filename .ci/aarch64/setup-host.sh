#!/usr/bin/env bash
# setup-host.sh: install what tp's AArch64 stage needs, from Debian's apt only.
# Idempotent; about 1 minute and ~330 MB of downloads on a fresh machine.
#
#   rustc-web/cargo-web 1.96 (bookworm-security) + libstd-rust-web-dev:arm64
#       -> a Rust compiler with a prebuilt aarch64-unknown-linux-gnu std
#   rust-web-clippy          -> clippy for the aarch64 cfg paths
#   gcc-aarch64-linux-gnu, libc6-dev-arm64-cross -> linker + static glibc
#   qemu-user-static         -> run aarch64 binaries directly (no ptrace!)
#   qemu-system-arm          -> qemu-system-aarch64, a real arm64 kernel
#
# QEMU comes from bookworm-backports (10.0.2, the family of the image's own
# qemu-utils); with QEMU_FROM_BACKPORTS=0 bookworm's 7.2 is used instead,
# which also works but makes apt remove the image's qemu-utils 10.0.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
bp=/etc/apt/sources.list.d/bookworm-backports.sources
if [[ ${QEMU_FROM_BACKPORTS:-1} == 1 && ! -e $bp ]] &&
   ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # reuse the mirror this machine's apt already uses
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [[ -n $uri ]] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
  cat > "$bp" <<EOF
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi
apt-get update -qq
packages=(rustc-web cargo-web libstd-rust-web-dev:arm64 rust-web-clippy gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
# The first multiarch install on a fresh machine was seen to stop with
# "dpkg returned an error code (1)" and unmet arm64 dependencies (libc6:arm64
# not yet installed); `apt-get -f install` completed it, and a retry passed.
if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; then
  echo "setup-host: first install failed; completing it with apt-get -f install and retrying" >&2
  apt-get install -y -qq -f >/dev/null
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
if [[ ${QEMU_FROM_BACKPORTS:-1} == 1 ]]; then
  apt-get install -y -qq --no-install-recommends -t bookworm-backports \
    qemu-system-arm qemu-user-static >/dev/null
else
  apt-get install -y -qq --no-install-recommends qemu-system-arm qemu-user-static >/dev/null
fi
echo "setup-host: $(/usr/bin/rustc -V); $(qemu-system-aarch64 --version | head -1)"
