#!/usr/bin/env bash
# setup-host.sh TOOLCHAIN_DIR: what tp's AArch64 stage needs, from Debian's
# apt only (bookworm x86-64, as root). Idempotent; about 1 minute and
# ~300 MB of downloads on a fresh machine, a few seconds afterwards.
#
# Installed with apt (none of them conflicts with anything):
#   rustc-web, cargo-web, rust-web-clippy 1.96 (bookworm-security), next to rustup
#   qemu-user-static   -> runs aarch64 binaries directly (no ptrace!)
#   qemu-system-arm    -> qemu-system-aarch64, to boot a real arm64 kernel
#   binutils-aarch64-linux-gnu -> the cross assembler and linker; installed
#     (also unpacked below, where the unpacked gcc looks for them) because
#     its programs load libbfd/libopcodes-2.40-arm64.so from the system's
#     library directory, which an unpacked copy is not on
# Downloaded and unpacked into TOOLCHAIN_DIR, not installed:
#   the aarch64 cross gcc, g++ and binutils with the static glibc, libgcc
#     and libstdc++ (the C++ targets: exceptions through return probes)
#     (Debian's gcc-multilib declares a conflict with gcc-12-aarch64-linux-gnu,
#     so installing one removes the other; unpacked, gcc finds everything
#     relative to its own directory)
#   libstd-rust-web-dev:arm64 of rustc-web's exact version: the prebuilt
#     aarch64 std, used with --sysroot (no arm64 package is installed, so
#     no multiarch libc6:arm64 has to match the host's)
#
# QEMU comes from bookworm-backports (10.0.2, the family of the image's own
# qemu-utils); with QEMU_FROM_BACKPORTS=0 bookworm's 7.2 is used instead,
# which also works but makes apt remove the image's qemu-utils 10.0.
set -euo pipefail
tc=${1:?usage: setup-host.sh TOOLCHAIN_DIR}
export DEBIAN_FRONTEND=noninteractive
# arm64 package lists: for the downloads here and the kernel in fetch-vm.sh
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
apt-get install -y -qq --no-install-recommends rustc-web cargo-web rust-web-clippy binutils-aarch64-linux-gnu >/dev/null
if [[ ${QEMU_FROM_BACKPORTS:-1} == 1 ]]; then
  apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-arm qemu-user-static >/dev/null
else
  apt-get install -y -qq --no-install-recommends qemu-system-arm qemu-user-static >/dev/null
fi

rust_version=$(dpkg-query -W -f='${Version}' rustc-web)
packages=(gcc-12-aarch64-linux-gnu cpp-12-aarch64-linux-gnu g++-12-aarch64-linux-gnu binutils-aarch64-linux-gnu
          libgcc-12-dev-arm64-cross libc6-dev-arm64-cross libc6-arm64-cross linux-libc-dev-arm64-cross
          libstdc++-12-dev-arm64-cross libstdc++6-arm64-cross
          "libstd-rust-web-dev:arm64=$rust_version")
stamp="${packages[*]}"
if [[ $(cat "$tc/.packages" 2>/dev/null) != "$stamp" ]]; then
  rm -rf "$tc"
  mkdir -p "$tc/debs"
  # apt's _apt user must be able to write the download directory
  chmod 777 "$tc/debs"
  (cd "$tc/debs" && apt-get download -qq "${packages[@]}")
  for deb in "$tc"/debs/*.deb; do dpkg-deb -x "$deb" "$tc"; done
  ln -sf aarch64-linux-gnu-gcc-12 "$tc/usr/bin/aarch64-linux-gnu-gcc"
  ln -sf aarch64-linux-gnu-g++-12 "$tc/usr/bin/aarch64-linux-gnu-g++"
  rm -rf "$tc/debs"
  echo "$stamp" > "$tc/.packages"
fi
[[ -d $tc/usr/lib/rustlib/aarch64-unknown-linux-gnu/lib ]] || { echo "setup-host: no aarch64 std in $tc" >&2; exit 1; }
echo "setup-host: $(/usr/bin/rustc -V); $("$tc/usr/bin/aarch64-linux-gnu-gcc" --version | head -1);" \
  "$(qemu-system-aarch64 --version | head -1)" >&2
