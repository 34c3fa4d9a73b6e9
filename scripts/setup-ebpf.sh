#!/usr/bin/env bash
# eBPF prerequisites for scout-sys, as root, idempotently (called by `make ebpf` with the venv path).
#
#   1. distro packages: bcc and its Python module, and the running kernel's headers when it has none
#      (Debian/Ubuntu: bpfcc-tools python3-bpfcc, linux-headers-$(uname -r) where that package exists,
#      else the metapackage linux-headers-amd64/-arm64 (Debian) or linux-headers-generic (Ubuntu);
#      RHEL/Rocky/Alma/Fedora: bcc-tools python3-bcc kernel-devel-$(uname -r));
#   2. /lib/modules/$(uname -r)/{build,source} linked to the installed headers when the running kernel
#      has none (custom kernels, VMs): bcc compiles its programs against them;
#   3. debugfs at /sys/kernel/debug (bcc reads tracepoints there) and tracefs;
#   4. the venv sees the distro `bcc` module and nothing else of the system's dist-packages (an
#      installed scout-sys finds it by itself, the same way: scout_sys/probes/ebpf/distro.py).
#      Never `pip install bcc`: the PyPI package of that name is an unrelated project.
#
# Quiet on success; on failure one line that says what is wrong and how to fix it, exit status 1
# (make reports it and goes on: everything but the eBPF probes works without it).
# Checked afterwards by `scout-sys doctor`; docs/ebpf.md explains each step.
set -euo pipefail

VENV="${1:-.venv}"
KREL="$(uname -r)"
MOD="/lib/modules/$KREL"

die() { echo "scout-sys setup-ebpf: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (sudo make ebpf)"
[ -x "$VENV/bin/python" ] || die "no venv at $VENV (run make first)"

# The distro's bcc package directory (the same places as distro.py's SYSTEM_SITES).
system_bcc() {
  local d
  for d in /usr/lib/python3/dist-packages $(ls -d /usr/lib/python3.*/site-packages /usr/lib64/python3.*/site-packages \
           /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages 2>/dev/null | sort -rV); do
    [ -f "$d/bcc/__init__.py" ] && { echo "$d/bcc"; return 0; }
  done
  return 1
}

# ---- 1. packages (the package manager only when something is missing)
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  updated=0
  apt_update() { [ "$updated" = 1 ] || { apt-get update -qq || die "apt-get update failed"; updated=1; }; }
  installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed'; }
  known() { apt-cache show "$1" 2>/dev/null | grep -q '^Package:'; }
  need=()
  for p in bpfcc-tools python3-bpfcc; do installed "$p" || need+=("$p"); done
  if [ ! -e "$MOD/build/include" ]; then
    known "linux-headers-$KREL" || apt_update
    if known "linux-headers-$KREL"; then hdr_pkg="linux-headers-$KREL"
    elif grep -qE '^(ID|ID_LIKE)=.*ubuntu' /etc/os-release 2>/dev/null; then hdr_pkg=linux-headers-generic
    else hdr_pkg="linux-headers-$(dpkg --print-architecture)"; fi  # Debian: linux-headers-amd64 / -arm64
    installed "$hdr_pkg" || need+=("$hdr_pkg")
  fi
  if [ ${#need[@]} -gt 0 ]; then
    apt_update
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
      || die "apt-get install ${need[*]} failed"
  fi
elif command -v dnf >/dev/null; then
  need=()
  for p in bcc-tools python3-bcc; do rpm -q "$p" >/dev/null 2>&1 || need+=("$p"); done
  if [ ! -e "$MOD/build/include" ] && ! rpm -q "kernel-devel-$KREL" >/dev/null 2>&1; then
    if dnf -q list "kernel-devel-$KREL" >/dev/null 2>&1; then need+=("kernel-devel-$KREL"); else need+=(kernel-devel); fi
  fi
  if [ ${#need[@]} -gt 0 ]; then dnf install -y -q "${need[@]}" >/dev/null || die "dnf install ${need[*]} failed"; fi
else
  system_bcc >/dev/null || die "no apt-get or dnf here: install your distro's bcc with its Python module and kernel headers"
fi
BCC_PKG="$(system_bcc)" || die "the distro's bcc is installed but no python3 dist-packages holds its bcc module"

# ---- 2. kernel headers for the running kernel
if [ ! -e "$MOD/build/include" ]; then
  # The newest installed distro headers (the metapackage depends on exactly one): Debian's
  # linux-headers-*-amd64 / -arm64 (sources in ...-common), Ubuntu's linux-headers-*-generic.
  hdr="$(ls -d /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-arm64 /usr/src/linux-headers-*-generic \
         /usr/src/kernels/* 2>/dev/null | sort -V | tail -n 1 || true)"
  [ -n "$hdr" ] && [ -d "$hdr/include" ] || die "no kernel headers under /usr/src to link for kernel $KREL"
  case "$hdr" in
    *-amd64|*-arm64) common="$(echo "$hdr" | sed -E 's/-(amd64|arm64)$/-common/')" ;;
    *-generic) common="${hdr%-generic}" ;;
    *) common="" ;;
  esac
  mkdir -p "$MOD"
  # A dangling or stale link is replaced; a real directory without include/ is left to a person.
  if [ -L "$MOD/build" ] || [ ! -e "$MOD/build" ]; then ln -sfn "$hdr" "$MOD/build"; else
    die "$MOD/build exists but has no include/; remove it or install headers for $KREL"; fi
  if [ -n "$common" ] && [ -d "$common" ] && { [ -L "$MOD/source" ] || [ ! -e "$MOD/source" ]; }; then
    ln -sfn "$common" "$MOD/source"
  fi
fi

# ---- 3. debugfs and tracefs
mounted() { awk -v m="$1" '$2 == m { f = 1 } END { exit !f }' /proc/mounts; }
if ! mounted /sys/kernel/debug; then
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || die "cannot mount debugfs at /sys/kernel/debug (in a container: --privileged or -v /sys/kernel/debug:/sys/kernel/debug)"
fi
if [ ! -e /sys/kernel/debug/tracing/events ] && [ -d /sys/kernel/tracing ] && ! mounted /sys/kernel/tracing; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || die "cannot mount tracefs at /sys/kernel/tracing"
fi
[ -e /sys/kernel/debug/tracing/events ] || [ -e /sys/kernel/tracing/events ] || die "tracefs events not reachable after mounting"

# ---- 4. the distro bcc module, alone, on the venv's path
ONLY="$(cd "$VENV" && pwd)/bcc-only"
mkdir -p "$ONLY"
ln -sfn "$BCC_PKG" "$ONLY/bcc"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ONLY" > "$site/scout-sys-bcc.pth"
"$VENV/bin/python" -c 'import bcc, sys; assert bcc.__file__.startswith(sys.argv[1]), bcc.__file__' "$ONLY" 2>/dev/null \
  || die "the venv does not import the distro bcc from $ONLY (is a PyPI 'bcc' installed? pip uninstall bcc)"
