#!/usr/bin/env bash
# eBPF prerequisites for scout-sys, as root, idempotently (called by `make ebpf` with the venv path).
#
#   1. Debian packages: bcc (bpfcc-tools, python3-bpfcc) and kernel headers (linux-headers-amd64);
#   2. /lib/modules/$(uname -r)/{build,source} linked to the installed headers when the running kernel
#      has none (custom kernels, VMs): bcc compiles its programs against them;
#   3. debugfs at /sys/kernel/debug (bcc reads tracepoints there) and tracefs;
#   4. the venv sees the distro `bcc` module and nothing else of /usr/lib/python3/dist-packages.
#      Never `pip install bcc`: the PyPI package of that name is an unrelated project.
#
# Quiet on success; on failure one line that says what is wrong and how to fix it, exit status 1.
# Checked afterwards by `scout-sys doctor`; docs/ebpf.md explains each step.
set -euo pipefail

VENV="${1:-.venv}"
DIST=/usr/lib/python3/dist-packages

die() { echo "scout-sys setup-ebpf: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (sudo make ebpf)"
[ -x "$VENV/bin/python" ] || die "no venv at $VENV (run make first)"

# ---- 1. packages (apt only when something is missing)
need=()
for p in bpfcc-tools python3-bpfcc linux-headers-amd64; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "need Debian packages ${need[*]} and there is no apt-get here"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
fi
[ -f "$DIST/bcc/__init__.py" ] || die "python3-bpfcc installed but $DIST/bcc is missing"

# ---- 2. kernel headers for the running kernel
KREL="$(uname -r)"
MOD="/lib/modules/$KREL"
if [ ! -e "$MOD/build/include" ]; then
  # The newest installed Debian headers (linux-headers-amd64 depends on exactly one).
  hdr="$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)"
  [ -n "$hdr" ] && [ -d "$hdr/include" ] || die "no /usr/src/linux-headers-*-amd64 to link for kernel $KREL"
  common="${hdr%-amd64}-common"
  [ -d "$common" ] || die "headers $hdr have no matching $common"
  mkdir -p "$MOD"
  # A dangling or stale link is replaced; a real directory without include/ is left to a person.
  if [ -L "$MOD/build" ] || [ ! -e "$MOD/build" ]; then ln -sfn "$hdr" "$MOD/build"; else
    die "$MOD/build exists but has no include/; remove it or install headers for $KREL"; fi
  if [ -L "$MOD/source" ] || [ ! -e "$MOD/source" ]; then ln -sfn "$common" "$MOD/source"; fi
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
ln -sfn "$DIST/bcc" "$ONLY/bcc"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ONLY" > "$site/scout-sys-bcc.pth"
"$VENV/bin/python" -c 'import bcc, sys; assert bcc.__file__.startswith(sys.argv[1]), bcc.__file__' "$ONLY" 2>/dev/null \
  || die "the venv does not import the distro bcc from $ONLY (is a PyPI 'bcc' installed? pip uninstall bcc)"
