#!/usr/bin/env bash
# deps.sh: what tp's build, tests, benchmarks and CI use from outside the
# repository, as listed in tests/deps.txt.
#
#   tests/deps.sh doctor             every entry: present or missing, and how to get it
#   tests/deps.sh need NAME...       install what is missing (apt, pip, cargo or rustup, as root),
#                                    or say in one line what to install; exit 1
#   tests/deps.sh need --group G     the same for every entry of group G
#
# The test harness (tests/e2e/util.rs: need()) calls `need` before a test
# that uses something from here, so `cargo test` installs what it needs.
# Concurrent calls are serialized with a lock; installing twice is a no-op.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
table=$here/deps.txt

# Entries as "name group check install used-by...", comments dropped.
entries() { grep -v '^[[:space:]]*\(#\|$\)' "$table"; }

# The channel a rust-toolchain.toml names (`nightly-2026-05-20`).
channel() { sed -nE 's/^channel *= *"([^"]+)".*/\1/p' "$repo/$1"; }

present() { # CHECK
  case $1 in
    toolchain:*) rustup toolchain list 2>/dev/null | grep -q "^$(channel "${1#toolchain:}")-" ;;
    cmd:*) command -v "${1#cmd:}" >/dev/null 2>&1 ;;
    py:*) python3 -c "import ${1#py:}" >/dev/null 2>&1 ;;
    /*) [[ -e $1 ]] ;;
    *) [[ -e $repo/$1 ]] ;;
  esac
}

how() { # INSTALL -> the command a person would run
  case $1 in
    apt:*) echo "apt-get install -y ${1#apt:}" | tr ',' ' ' ;;
    pip:*) echo "python3 -m pip install ${1#pip:}" | tr ',' ' ' ;;
    cargo:*) echo "cargo install ${1#cargo:}" ;;
    rustup:*) echo "rustup toolchain install $(channel "${1#rustup:}") --profile minimal" ;;
    script:*) echo "${1#script:}" ;;
  esac
}

install() { # NAME INSTALL
  local name=$1 what=$2 log
  log=$(mktemp)
  case $what in
    apt:*)
      local pkgs
      read -ra pkgs <<<"$(echo "${what#apt:}" | tr ',' ' ')"
      export DEBIAN_FRONTEND=noninteractive
      # Package lists may be missing or stale on a fresh machine: update once on failure.
      apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >"$log" 2>&1 ||
        { apt-get update -qq >>"$log" 2>&1 && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >>"$log" 2>&1; } ;;
    pip:*) python3 -m pip install -q "${what#pip:}" >"$log" 2>&1 ;;
    cargo:*) cargo install -q "${what#cargo:}" >"$log" 2>&1 ;;
    rustup:*) rustup toolchain install "$(channel "${what#rustup:}")" --profile minimal >"$log" 2>&1 ;;
    *) false ;;
  esac || { echo "deps: installing $name failed: $(tail -1 "$log")" >&2; rm -f "$log"; return 1; }
  rm -f "$log"
}

need() { # NAME...
  local failed=0 name group check what used found
  for want in "$@"; do
    found=0
    while read -r name group check what used; do
      [[ $name == "$want" ]] || continue
      found=1
      present "$check" && continue
      if [[ $(id -u) == 0 && $what != script:* ]] && install "$name" "$what" && present "$check"; then
        echo "deps: installed $name ($(how "$what"))" >&2
        continue
      fi
      echo "tp tests: $name is missing (needed by $used): as root, run: $(how "$what")" >&2
      failed=1
    done < <(entries)
    [[ $found == 1 ]] || { echo "deps: no entry named $want in tests/deps.txt" >&2; failed=1; }
  done
  return $failed
}

case ${1:-doctor} in
  doctor)
    printf '%-12s %-8s %-8s %-44s %s\n' NAME GROUP STATUS "TO INSTALL" "USED BY"
    missing=0
    while read -r name group check what used; do
      if present "$check"; then status=ok; else status=missing; missing=$((missing + 1)); fi
      printf '%-12s %-8s %-8s %-44s %s\n' "$name" "$group" "$status" "$(how "$what")" "$used"
    done < <(entries)
    echo "$missing missing; \`tests/deps.sh need NAME\` installs one (the tests do it themselves)"
    ;;
  need)
    shift
    if [[ ${1:-} == --group ]]; then
      set -- $(entries | awk -v g="${2:?need --group GROUP}" '$2 == g { print $1 }')
    fi
    [[ $# -gt 0 ]] || { echo "usage: tests/deps.sh need NAME... | --group GROUP" >&2; exit 2; }
    # One installer at a time (parallel tests, several cargo runs).
    exec 9>"${TMPDIR:-/tmp}/tp-deps.lock"
    flock 9
    need "$@"
    ;;
  *) echo "usage: tests/deps.sh doctor | need NAME... | need --group GROUP" >&2; exit 2 ;;
esac
